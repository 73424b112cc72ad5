"""Exact numeric core of the golden model: element decoding and the CUBE arithmetic.

Everything here is bit-exact and vectorised (a Python loop runs over K, never over
elements).  Nothing reads the specification at run time; the format tables are
built from the format definitions at import.

Element formats
---------------
``decode(dtype, raw) -> ndarray``
    ``raw`` holds one unsigned bit pattern per *logical* element (packed X2 types:
    one 4-bit lane value 0..15 per element).  Floating types give float64 (exact,
    NaN as NaN, infinities as infinities); integer types give int64 (U64: uint64,
    the only way to keep every U64 value exact).  Must-be-zero carrier bits of
    TF32/HF32 (low fraction bits) and E3M2/E2M3 (bits 7:6) are ignored (ruling R10).
``encode_exact(dtype, values) -> ndarray``
    The inverse for exactly representable values (any NaN gives the canonical NaN);
    raises ``ValueError`` naming the first value that is not representable.
``canonical_nan(dtype) -> int``
    The canonical NaN bit pattern of a floating type that has one.
``unpack_nibbles(data, count)`` / ``pack_nibbles(lanes)``
    Packed 4-bit storage (R11): lane 2i is the low nibble of byte i.

FP32 accumulation (rulings R1 and R3)
-------------------------------------
``fma_f32(acc, prod) -> float32``
    ``RNE_fp32(acc + prod)`` with one rounding; ``prod`` is an exact float64 product.
``matmul_float(a, b, acc0=None, a_scale=None, b_scale=None) -> float32[M, N]``
    Sequential per-term fused multiply-add over increasing K; +0 start (or the ACC
    snapshot ``acc0``); optional MX E8M0 scales (block of 32 K elements).
``add_bias_f32(acc, bias) -> float32``
    The one extra RNE add of the BIAS forms.
``f32_to_bits(x) -> uint32`` (every NaN becomes 0x7FC00000) and ``bits_to_f32``.

Integer accumulation (ruling R2)
--------------------------------
``matmul_int(a, b, acc0=None, signed=True) -> uint32[M, N]`` and
``add_bias_int(acc_bits, bias) -> uint32``: exact products, sums modulo 2^32.

The ``pto-v0`` raw-carrier profile (test-only, to replay the spec's own tests)
-----------------------------------------------------------------------------
``pto_v0_carrier(dtype, raw) -> uint64``, ``matmul_pto_v0(a, b, acc0=None,
a_scale=None, b_scale=None) -> uint64`` and ``add_bias_pto_v0(value, bias)``:
the executable spec's reference hooks, which multiply and add raw 64-bit
carrier words modulo 2^64.  Not floating-point arithmetic.

No function here produces numeric status flags: accumulation and bias raise
none (ruling R4).

Why the FP32 chain is exact
---------------------------
*Products.*  Every floating input type decodes to a value that FP32 can hold
(significand <= 24 bits, magnitude in [2^-149, 2^128)); ``matmul_float`` checks
this.  An E8M0 scale multiplies by 2^(raw-127), raw in 0..254, so a scaled input
lies in [2^-276, 2^255] with the same significand.  The product of two such
values has at most 48 significand bits and lies in [2^-552, 2^510]: far inside
float64's normal range with 53 bits, so float64 multiplication is exact.  A
0 * inf or a NaN gives NaN, as IEEE requires; a 0xFF scale is a NaN factor, so
its term, and from then on its accumulator lane, is NaN.

*Sums.*  ``float32(float64(acc + prod))`` rounds twice and is wrong in general
(acc = 1, prod = 2^-24 + 2^-70 gives 1 instead of 1 + 2^-23).  The exact path
computes s = fl64(acc + prod) and its exact error e with TwoSum, replaces s by
its round-to-odd neighbour when e != 0, and only then rounds to FP32.  Rounding
to odd at 53 bits followed by RNE at 24 bits equals one RNE at 24 bits because
53 >= 24 + 2 (Boldo & Melquiond); the exact sum is never in float64's subnormal
range (every term is a multiple of 2^-552), so the 53 bits are really there.

*Fast path.*  Double rounding can only go wrong when s lands exactly on an FP32
rounding boundary (a midpoint, or 2^128 - 2^103) while the exact sum
x = acc + prod is not a float64.
Write m for that boundary, 2^e <= |m| < 2^(e+1).  Every FP32 value is at least
2^(e-24) away from m, and the float64 rounding error is at most 2^(e-53).  If acc
is a multiple of 2^(e-52), then prod = x - acc must have a bit below 2^(e-52)
and a magnitude above 2^(e-25): at least 29 significand bits.  Otherwise
|acc| < 2^(e-29), so prod lies within 2^(e-28) of m without being m (m needs 25
bits), while a prod of <= 24 bits that close to m is a multiple of 2^(e-23) and
so at least 2^(e-24) away: impossible.  So when the two factors' widest
significands add up to at most 24 bits, the plain float64 sum and cast are
already correctly rounded (true for every pair of FP16/BF16/TF32/HF32/8-bit/4-bit
inputs; FP32 inputs need the exact path).

*Native path.*  When, moreover, both factors and every product of a K step are
FP32 values (significands within 24 bits, lowest set bit >= 2^-149, magnitude
< 2^128: always so for FP16 x FP16), float32 multiplication is exact and IEEE
float32 addition is itself the one RNE rounding of acc + prod, with gradual
underflow, overflow to infinity and IEEE signed zeros.

``matmul_float`` chooses among the three per K step from the data.
"""

import math
import numbers

import ml_dtypes
import numpy as np

from .datatype import DataType, NumClass

__all__ = [
    "decode", "encode_exact", "canonical_nan", "unpack_nibbles", "pack_nibbles",
    "CANONICAL_NAN_F32", "MX_BLOCK", "f32_to_bits", "bits_to_f32", "fma_f32",
    "matmul_float", "add_bias_f32", "matmul_int", "add_bias_int",
    "pto_v0_carrier", "matmul_pto_v0", "add_bias_pto_v0",
]

#: The canonical FP32 quiet NaN every produced NaN becomes (ruling R1).
CANONICAL_NAN_F32 = 0x7FC00000

#: Logical K elements per MX scale block (ruling R3).
MX_BLOCK = 32

_CANONICAL_NAN = {
    DataType.FP64: 0x7FF8000000000000,
    DataType.FP32: 0x7FC00000, DataType.TF32: 0x7FC00000, DataType.HF32: 0x7FC00000,
    DataType.FP16: 0x7E00, DataType.BF16: 0x7FC0, DataType.HiF8: 0x80,
    DataType.E4M3: 0x7F, DataType.E5M2: 0x7E, DataType.E8M0: 0xFF,
}

# Bits of a 32-bit carrier that hold the value (R10: the rest is ignored on input).
_CARRIER_MASK = {DataType.FP32: 0xFFFFFFFF, DataType.TF32: 0xFFFFE000,
                 DataType.HF32: 0xFFFFF000}


def _as_dtype(dtype) -> DataType:
    try:
        return DataType(dtype)
    except ValueError:
        raise ValueError(f"{dtype!r} is not a DataType code") from None


def _unsigned_storage(bits: int):
    return {4: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]


# ---------------------------------------------------------------------------
# Element decoding
# ---------------------------------------------------------------------------

def _hif8_value(code: int) -> float:
    """Value of one HiF8 code (sign, dot prefix, exponent, mantissa)."""
    if code == 0x80:
        return float("nan")
    if code in (0x6F, 0xEF):
        return float("-inf") if code & 0x80 else float("inf")
    sign = -1.0 if code & 0x80 else 1.0
    b = code & 0x7F
    if b <= 7:                                   # dot 0000: denormal (or +0)
        return sign * 2.0 ** (b - 23) if b else 0.0
    if b >> 3 == 0b0001:                         # D0: exponent 0, 3 mantissa bits
        exponent, mantissa, mbits = 0, b & 7, 3
    elif b >> 4 == 0b001:                        # D1: exponent +-1
        exponent, mantissa, mbits = (-1 if b & 8 else 1), b & 7, 3
    elif b >> 5 == 0b01:                         # D2: exponent +-(2 + bit3)
        magnitude = 2 + ((b >> 3) & 1)
        exponent, mantissa, mbits = (-magnitude if b & 16 else magnitude), b & 7, 3
    elif b >> 5 == 0b10:                         # D3: exponent +-(4 + bits3:2)
        magnitude = 4 + ((b >> 2) & 3)
        exponent, mantissa, mbits = (-magnitude if b & 16 else magnitude), b & 3, 2
    else:                                        # D4: exponent +-(8 + bits3:1)
        magnitude = 8 + ((b >> 1) & 7)
        exponent, mantissa, mbits = (-magnitude if b & 16 else magnitude), b & 1, 1
    return sign * (1.0 + mantissa / 2.0 ** mbits) * 2.0 ** exponent


def _e1m2_value(lane: int) -> float:
    """Value of one E1M2 (and HiF4) lane: 1 sign, 1 exponent (bias 1), 2 fraction bits."""
    sign = -1.0 if lane & 8 else 1.0
    fraction = lane & 3
    significand = fraction / 4.0 if not lane & 4 else 1.0 + fraction / 4.0
    return sign * significand


def _ml_table(ml_type, codes: int, mask: int | None = None) -> np.ndarray:
    raw = np.arange(codes, dtype=np.uint8)
    if mask is not None:
        raw &= mask
    return raw.view(ml_type).astype(np.float64)


# Value of every raw code of every floating type of at most 8 bits (indexed by code).
_FLOAT_TABLES = {
    DataType.HiF8: np.array([_hif8_value(c) for c in range(256)]),
    DataType.E4M3: _ml_table(ml_dtypes.float8_e4m3fn, 256),
    DataType.E5M2: _ml_table(ml_dtypes.float8_e5m2, 256),
    DataType.E3M2: _ml_table(ml_dtypes.float6_e3m2fn, 256, mask=0x3F),
    DataType.E2M3: _ml_table(ml_dtypes.float6_e2m3fn, 256, mask=0x3F),
    DataType.E2M1X2: _ml_table(ml_dtypes.float4_e2m1fn, 16),
    DataType.E1M2X2: np.array([_e1m2_value(c) for c in range(16)]),
    DataType.HiF4X2: np.array([_e1m2_value(c) for c in range(16)]),
    DataType.E8M0: _ml_table(ml_dtypes.float8_e8m0fnu, 256),
}
for _table in _FLOAT_TABLES.values():
    _table.setflags(write=False)


def _raw_array(dtype: DataType, raw) -> np.ndarray:
    """``raw`` as an integer array, checked to hold bit patterns of ``dtype``."""
    arr = np.asarray(raw)
    if arr.dtype.kind not in "ui":
        raise ValueError(f"raw bit patterns for {dtype.name} must be integers, "
                         f"got an array of {arr.dtype}")
    if arr.size:
        bad = arr < 0 if arr.dtype.kind == "i" else np.zeros(arr.shape, dtype=bool)
        limit = 1 << dtype.bits
        if limit <= np.iinfo(arr.dtype).max:
            bad |= arr >= limit
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"raw value {int(arr[where])} at index {where} is not a "
                             f"{dtype.bits}-bit {dtype.name} pattern")
    return arr


def _require_gradual_underflow():
    """Refuse to compute if this thread flushes subnormals (FTZ/DAZ).

    The FP32 paths below use the CPU's float32/float64 arithmetic, which obeys the
    thread's flush-to-zero and denormals-are-zero modes.  Code elsewhere in the
    process (an extension built with -ffast-math, say) can switch them on; the
    results would then silently break ruling R1, so fail loudly instead.
    """
    if (np.float32(_SMALLEST_SUBNORMAL_F32) * np.float32(1.0) == 0
            or np.array([1], np.uint32).view(np.float32).astype(np.float64)[0] == 0):
        raise RuntimeError("this thread flushes subnormal floats to zero (FTZ/DAZ is on); "
                           "the golden model's FP32 arithmetic needs gradual underflow")


_SMALLEST_SUBNORMAL_F32 = 2.0 ** -149


def decode(dtype, raw) -> np.ndarray:
    """Exact values of raw element bit patterns.

    ``raw``: integer array, one bit pattern per logical element (a 4-bit lane value
    for the packed X2 types).  Returns float64 for floating types, int64 for integer
    types (uint64 for U64).  Out-of-range patterns raise ``ValueError``.
    """
    dtype = _as_dtype(dtype)
    arr = _raw_array(dtype, raw)
    if dtype in _CARRIER_MASK:
        _require_gradual_underflow()
    if dtype in _FLOAT_TABLES:
        return _FLOAT_TABLES[dtype][arr.astype(np.intp)]
    if dtype is DataType.FP64:
        return arr.astype(np.uint64).view(np.float64)
    with np.errstate(invalid="ignore"):          # widening a signalling NaN is fine here
        if dtype in _CARRIER_MASK:
            return (arr.astype(np.uint32) & np.uint32(_CARRIER_MASK[dtype])) \
                .view(np.float32).astype(np.float64)
        if dtype is DataType.FP16:
            return arr.astype(np.uint16).view(np.float16).astype(np.float64)
        if dtype is DataType.BF16:
            return arr.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    if dtype is DataType.S64:
        return arr.astype(np.uint64).view(np.int64)
    if dtype is DataType.U64:
        return arr.astype(np.uint64)
    values = arr.astype(np.int64)
    if dtype.num_class is NumClass.SIGNED:
        sign = np.int64(1 << (dtype.bits - 1))
        values = (values ^ sign) - sign          # sign-extend the two's complement pattern
    return values


def canonical_nan(dtype) -> int:
    """The canonical NaN bit pattern of ``dtype``; ``ValueError`` if it has no NaN."""
    dtype = _as_dtype(dtype)
    try:
        return _CANONICAL_NAN[dtype]
    except KeyError:
        raise ValueError(f"{dtype.name} has no NaN encoding") from None


def _canonical_codes(dtype: DataType) -> np.ndarray:
    """The codes ``encode_exact`` may produce for a table-decoded type."""
    if dtype in (DataType.E3M2, DataType.E2M3):
        return np.arange(64)                       # bits 7:6 are never produced (R10)
    return np.arange(len(_FLOAT_TABLES[dtype]))


def _build_encode_table(dtype: DataType):
    """Sorted float64 bit keys of every non-NaN value, and the code of each."""
    codes = _canonical_codes(dtype)
    values = _FLOAT_TABLES[dtype][codes]
    keep = ~np.isnan(values)
    keys = values[keep].view(np.uint64)
    order = np.argsort(keys, kind="stable")
    return keys[order], codes[keep][order].astype(np.uint8)


_ENCODE_TABLES = {dtype: _build_encode_table(dtype) for dtype in _FLOAT_TABLES}


def _float_values(dtype: DataType, values) -> np.ndarray:
    """``values`` as float64, refusing any input that float64 would round."""
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        return arr.astype(np.float64)
    if arr.dtype.kind in "iu" and (not arr.size or np.abs(arr).max() < 2 ** 53):
        return arr.astype(np.float64)            # every such integer is a float64
    items = arr.astype(object).ravel()
    floats = [_exact_float(item) for item in items]
    for index, value in enumerate(floats):
        if value is None:
            raise ValueError(f"value {items[index]!r} at index "
                             f"{np.unravel_index(index, arr.shape)} is not exactly "
                             f"representable in {dtype.name}")
    return np.array(floats, dtype=np.float64).reshape(arr.shape)


def _exact_float(item) -> float | None:
    """``item`` as a float if it is a real number float64 holds exactly, else None."""
    if not isinstance(item, numbers.Real) or isinstance(item, (bool, np.bool_)):
        return None
    try:
        value = float(item)
    except OverflowError:
        return None
    # Python compares int/Fraction with float exactly, so this catches rounding.
    return value if value == item or math.isnan(value) else None


def _raise_first(dtype: DataType, values: np.ndarray, bad: np.ndarray):
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = values[where]
        value = value.item() if isinstance(value, np.generic) else value
        raise ValueError(f"value {value!r} at index {where} is not exactly "
                         f"representable in {dtype.name}")


def _encode_float(dtype: DataType, values) -> np.ndarray:
    v = _float_values(dtype, values)
    nan = np.isnan(v)
    if dtype in _ENCODE_TABLES:
        keys, codes = _ENCODE_TABLES[dtype]
        key = v.view(np.uint64)
        if dtype is DataType.HiF8:
            key = np.where(v == 0, np.uint64(0), key)   # one zero: -0 encodes as 0x00
        idx = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        found = keys[idx] == key
        if dtype in _CANONICAL_NAN:
            _raise_first(dtype, v, ~found & ~nan)
            return np.where(nan, np.uint8(_CANONICAL_NAN[dtype]), codes[idx])
        _raise_first(dtype, v, ~found)
        return codes[idx]
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype is DataType.FP64:
            bits = v.view(np.uint64)
        elif dtype is DataType.FP16:
            narrow = v.astype(np.float16)
            _raise_first(dtype, v, (narrow != v) & ~nan)
            bits = narrow.view(np.uint16)
        elif dtype is DataType.BF16:
            narrow = v.astype(ml_dtypes.bfloat16)
            _raise_first(dtype, v, (narrow.astype(np.float64) != v) & ~nan)
            bits = narrow.view(np.uint16)
        else:                                      # FP32 and its TF32/HF32 carriers
            narrow = v.astype(np.float32)
            bits = narrow.view(np.uint32)
            dropped = bits & np.uint32(~_CARRIER_MASK[dtype] & 0xFFFFFFFF)
            _raise_first(dtype, v, ((narrow != v) | (dropped != 0)) & ~nan)
    return np.where(nan, bits.dtype.type(_CANONICAL_NAN[dtype]), bits)


def _exact_int(item) -> int | None:
    """``item`` as a Python int if it is an integral real number, else None."""
    if not isinstance(item, numbers.Real) or isinstance(item, (bool, np.bool_)):
        return None
    try:
        value = int(item)
    except (OverflowError, ValueError):          # infinities and NaN
        return None
    return value if value == item else None


def _encode_int(dtype: DataType, values) -> np.ndarray:
    arr = np.asarray(values)
    lo = -(1 << (dtype.bits - 1)) if dtype.num_class is NumClass.SIGNED else 0
    hi = lo + (1 << dtype.bits) - 1
    storage = _unsigned_storage(dtype.bits)
    if arr.dtype.kind == "f" and dtype.bits < 64:   # lo and hi are exact float64 here
        with np.errstate(invalid="ignore"):
            _raise_first(dtype, arr, ~np.isfinite(arr) | (np.floor(arr) != arr)
                         | (arr < lo) | (arr > hi))
        arr = arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        _raise_first(dtype, arr, (arr < lo) | (arr > hi))
        raw = arr.astype(storage)                # casts to unsigned wrap: two's complement
        return raw & storage((1 << dtype.bits) - 1) if dtype.packed else raw
    # Python objects (and floats for the 64-bit types): exact, item by item.
    items = arr.astype(object).ravel()
    ints = [_exact_int(item) for item in items]
    for index, value in enumerate(ints):
        if value is None or not lo <= value <= hi:
            raise ValueError(f"value {items[index]!r} at index "
                             f"{np.unravel_index(index, arr.shape)} is not exactly "
                             f"representable in {dtype.name}")
    return np.array([value & ((1 << dtype.bits) - 1) for value in ints],
                    dtype=storage).reshape(arr.shape)


def encode_exact(dtype, values) -> np.ndarray:
    """Bit patterns of exactly representable ``values`` (lane values for X2 types).

    Any NaN encodes as the canonical NaN; -0 keeps its sign where the format has
    one (HiF8 has a single zero, 0x00).  A value that is not exactly representable
    (or out of range, or a NaN/infinity the format lacks) raises ``ValueError``
    naming the first such value.  Returns an unsigned array of the carrier width.
    """
    dtype = _as_dtype(dtype)
    if dtype.num_class is NumClass.FLOAT:
        return _encode_float(dtype, values)
    return _encode_int(dtype, values)


def unpack_nibbles(data, count: int) -> np.ndarray:
    """The first ``count`` 4-bit lanes of packed bytes: lane 2i = low nibble of byte i."""
    data = np.asarray(data, dtype=np.uint8).ravel()
    if not 0 <= count <= 2 * data.size:
        raise ValueError(f"{data.size} bytes hold at most {2 * data.size} lanes, not {count}")
    lanes = np.empty(2 * data.size, dtype=np.uint8)
    lanes[0::2] = data & 0x0F
    lanes[1::2] = data >> 4
    return lanes[:count]


def pack_nibbles(lanes) -> np.ndarray:
    """Pack 4-bit lanes into bytes (lane 2i low); an odd count leaves the last high nibble 0."""
    lanes = np.asarray(lanes).ravel()
    if lanes.size and (lanes.min() < 0 or lanes.max() > 15):
        raise ValueError("packed lanes must be 4-bit values 0..15")
    padded = np.zeros(lanes.size + (lanes.size & 1), dtype=np.uint8)
    padded[:lanes.size] = lanes
    return (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8)


# ---------------------------------------------------------------------------
# FP32 accumulation
# ---------------------------------------------------------------------------

def f32_to_bits(x) -> np.ndarray:
    """FP32 bit patterns of ``x`` (float32-valued); every NaN becomes 0x7FC00000."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = _as_f32_exact(x, "x")
    bits = x.view(np.uint32).copy()
    bits[np.isnan(x)] = CANONICAL_NAN_F32
    return bits


def bits_to_f32(bits) -> np.ndarray:
    """float32 values of 32-bit patterns."""
    return _raw_array(DataType.FP32, bits).astype(np.uint32).view(np.float32)


def _as_f32_exact(x, name: str) -> np.ndarray:
    """``x`` as float32, refusing values float32 cannot hold exactly (NaN is fine)."""
    arr = np.asarray(x)
    if arr.dtype == np.float32:
        return arr
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a numeric array, got {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = arr.astype(np.float32)
        bad = (narrow.astype(np.float64) != arr) & ~np.isnan(narrow)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}[{where}] = {arr[where]!r} is not an FP32 value")
    return narrow


def _canonicalize_nan_f32(x: np.ndarray) -> np.ndarray:
    nan = np.isnan(x)
    if nan.any():
        x[nan] = np.uint32(CANONICAL_NAN_F32).view(np.float32)
    return x


class _ExactFMA:
    """acc <- RNE_fp32(acc + prod) by TwoSum and round-to-odd, with reusable buffers."""

    def __init__(self, shape):
        self.s = np.empty(shape)
        self.t = np.empty(shape)
        self.u = np.empty(shape)
        self.inexact = np.empty(shape, dtype=bool)
        self.toward_zero = np.empty(shape, dtype=bool)

    def __call__(self, acc: np.ndarray, prod: np.ndarray) -> None:
        """Update float32 ``acc`` in place; float64 ``prod`` is overwritten."""
        s, t, u = self.s, self.t, self.u
        np.add(acc, prod, out=s)                 # s = fl64(acc + prod)
        # TwoSum (Knuth): err = (acc + prod) - s exactly, left in prod.
        np.subtract(s, acc, out=t)               # the share of s that came from prod
        np.subtract(s, t, out=u)                 # the share that came from acc
        np.subtract(acc, u, out=u)               # acc's part of the error
        np.subtract(prod, t, out=prod)           # prod's part of the error
        err = np.add(prod, u, out=prod)
        # Round s to odd: where inexact, step one unit toward zero if the exact sum
        # is smaller in magnitude (s and err differ in sign), then set the last bit.
        # A NaN err (an infinite or NaN operand) compares false: s is kept.
        np.greater(np.abs(err, out=t), 0.0, out=self.inexact)
        bits = s.view(np.int64)
        np.bitwise_xor(bits, err.view(np.int64), out=u.view(np.int64))
        np.less(u.view(np.int64), 0, out=self.toward_zero)
        np.logical_and(self.toward_zero, self.inexact, out=self.toward_zero)
        np.subtract(bits, self.toward_zero, out=bits, casting="unsafe")
        np.bitwise_or(bits, self.inexact, out=bits, casting="unsafe")
        np.copyto(acc, s, casting="same_kind")   # the one rounding to FP32 (RNE)


def fma_f32(acc, prod) -> np.ndarray:
    """``RNE_fp32(acc + prod)`` with a single rounding, elementwise.

    ``acc``: FP32 values (float32, or anything float32 holds exactly); ``prod``: the
    exact product as float64 (any float64 works: the sum is rounded once from
    its exact value).  IEEE specials: inf - inf gives NaN, NaN propagates,
    gradual underflow, no FTZ/DAZ, exact cancellation gives +0 (both operands -0:
    -0).  Returns float32 with every NaN canonical.
    """
    _require_gradual_underflow()
    acc = _as_f32_exact(acc, "acc")
    prod = np.asarray(prod, dtype=np.float64)
    acc, prod = np.broadcast_arrays(acc, prod)
    out = np.array(acc, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        _ExactFMA(out.shape)(out, np.array(prod, dtype=np.float64))
    return _canonicalize_nan_f32(out)


def add_bias_f32(acc, bias) -> np.ndarray:
    """BIAS forms: ``RNE_fp32(acc[i, j] + bias[j])``, one more rounding after K."""
    acc = _as_f32_exact(acc, "acc")
    bias = _as_f32_exact(bias, "bias")
    if acc.ndim != 2 or bias.shape != (acc.shape[1],):
        raise ValueError(f"bias must be one row of {acc.shape[1:]} values, got {bias.shape}")
    with np.errstate(invalid="ignore"):             # widening a signalling NaN
        wide = bias.astype(np.float64)
    return fma_f32(acc, wide[None, :])


class _StepProfile:
    """Per K step, the extremes of one operand's values that choose the sum path.

    ``width``: widest significand in bits (zeros, infinities and NaN count as 1:
    overestimating only sends a step to a slower exact path); ``low_exp``: lowest
    exponent of any set significand bit; ``max_abs``: largest finite magnitude.
    Valid for normal float64 values, which every (scaled) input value is.
    """

    def __init__(self, x: np.ndarray, axis: int):
        bits = x.view(np.uint64)
        biased = (bits >> np.uint64(52)) & np.uint64(0x7FF)
        significand = (bits & np.uint64((1 << 52) - 1)) | np.uint64(1 << 52)
        lowest = significand & (~significand + np.uint64(1))       # lowest set bit
        trailing = np.frexp(lowest.astype(np.float64))[1] - 1
        ordinary = np.isfinite(x) & (x != 0)
        self.width = 53 - trailing.min(axis=axis, initial=52)
        # x = significand * 2^(biased - 1075), so its lowest set bit is 2^low_exp.
        low_exp = biased.astype(np.int64) - 1075 + trailing
        self.low_exp = low_exp.min(axis=axis, where=ordinary, initial=1 << 20)
        self.max_abs = np.abs(x).max(axis=axis, where=ordinary, initial=0.0)

    def fp32_exact(self) -> np.ndarray:
        """Steps whose every (finite) value is itself an FP32 value."""
        return (self.width <= 24) & (self.low_exp >= -149) & (self.max_abs < 2.0 ** 128)


def _scale_factors(scale, shape, name: str) -> np.ndarray:
    """2^(raw-127) per E8M0 scale (NaN for 0xFF), shape-checked."""
    arr = np.asarray(scale)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (nb = ceil(K/{MX_BLOCK})), "
                         f"got {arr.shape}")
    return decode(DataType.E8M0, arr)


#: Products held at once by matmul_float (float64 elements).
_PRODUCT_CHUNK_ELEMENTS = 1 << 16


def _check_operands(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"operands must be [M, K] and [K, N], got {a.shape} and {b.shape}")


def matmul_float(a, b, acc0=None, a_scale=None, b_scale=None) -> np.ndarray:
    """Floating CUBE product: ``acc <- RNE_fp32(acc + a[i,k] * b[k,j])`` for k = 0..K-1.

    ``a``: [M, K] and ``b``: [K, N] decoded input values (float64, each an FP32
    value or NaN).  ``acc0``: the ACC form's snapshot of C ([M, N] FP32), or None
    to start from +0.  ``a_scale``: [M, nb] and ``b_scale``: [nb, N] raw E8M0 scales
    (nb = ceil(K/32)) for MX forms, or None for an unscaled side; term k uses
    ``a_scale[i, k // 32]`` and ``b_scale[k // 32, j]``.  Returns float32 [M, N]
    with every NaN canonical.  Bias is a separate step (:func:`add_bias_f32`).
    """
    _require_gradual_underflow()
    # NaN/infinity arithmetic below is intended; numpy must not warn about it.
    with np.errstate(over="ignore", invalid="ignore"):
        a = _as_f32_exact(a, "a").astype(np.float64)
        b = _as_f32_exact(b, "b").astype(np.float64)
        _check_operands(a, b)
        (m, k), n = a.shape, b.shape[1]
        blocks = -(-k // MX_BLOCK)
        if a_scale is not None:
            factors = _scale_factors(a_scale, (m, blocks), "a_scale")
            a = a * np.repeat(factors, MX_BLOCK, axis=1)[:, :k]
        if b_scale is not None:
            factors = _scale_factors(b_scale, (blocks, n), "b_scale")
            b = b * np.repeat(factors, MX_BLOCK, axis=0)[:k, :]
        if acc0 is None:
            acc = np.zeros((m, n), dtype=np.float32)
        else:
            acc = np.array(_as_f32_exact(acc0, "acc0"), dtype=np.float32)
            if acc.shape != (m, n):
                raise ValueError(f"acc0 must have shape {(m, n)}, got {acc.shape}")
        # Choose each K step's path (see "Why the FP32 chain is exact").
        a_prof, b_prof = _StepProfile(a, axis=0), _StepProfile(b, axis=1)
        narrow = a_prof.width + b_prof.width <= 24
        native = (narrow & a_prof.fp32_exact() & b_prof.fp32_exact()
                  & (a_prof.low_exp + b_prof.low_exp >= -149)
                  & (a_prof.max_abs * b_prof.max_abs < 2.0 ** 128))
        exact_step = None if narrow.all() else _ExactFMA((m, n))
        # Products are formed a chunk of K steps at a time (fewer numpy calls);
        # a chunk holds about half a megabyte.
        chunk = max(1, min(_PRODUCT_CHUNK_ELEMENTS // max(m * n, 1), 64, k))
        a_t = np.ascontiguousarray(a.T)[:, :, None]
        b_rows = b[:, None, :]
        # FP32 copies, exact on the native steps (the only ones that read them).
        a_t32, b_rows32 = a_t.astype(np.float32), b_rows.astype(np.float32)
        products = np.empty((chunk, m, n))
        products32 = np.empty((chunk, m, n), dtype=np.float32)
        for k0 in range(0, k, chunk):
            k1 = min(k0 + chunk, k)
            if native[k0:k1].all():
                # Exact FP32 products; float32 addition is the one RNE rounding.
                block = products32[:k1 - k0]
                np.multiply(a_t32[k0:k1], b_rows32[k0:k1], out=block)
                for prod in block:
                    np.add(acc, prod, out=acc)
                continue
            block = products[:k1 - k0]
            np.multiply(a_t[k0:k1], b_rows[k0:k1], out=block)
            for kk, prod in zip(range(k0, k1), block):
                if narrow[kk]:
                    # float32(float64(acc) + prod): one rounding, by the fast-path rule.
                    np.add(acc, prod, out=acc, casting="same_kind")
                else:
                    exact_step(acc, prod)
    return _canonicalize_nan_f32(acc)


# ---------------------------------------------------------------------------
# Integer accumulation
# ---------------------------------------------------------------------------

def _int_operand(x, name: str, signed: bool) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer values, got {arr.dtype}")
    lo, hi = (-(1 << 15), (1 << 15) - 1) if signed else (0, (1 << 16) - 1)
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise ValueError(f"{name} values must lie in [{lo}, {hi}] for "
                         f"{'signed' if signed else 'unsigned'} inputs")
    return arr.astype(np.int64)


def _word32_operand(x, name: str) -> np.ndarray:
    """An S32 value, U32 value or raw 32-bit pattern (all agree modulo 2^32) as int64."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got {arr.dtype}")
    if arr.size and (arr.min() < -(1 << 31) or arr.max() > 0xFFFFFFFF):
        raise ValueError(f"{name} values must lie in [-2^31, 2^32)")
    return arr.astype(np.int64)


def matmul_int(a, b, acc0=None, signed: bool = True) -> np.ndarray:
    """Integer CUBE product: exact products, sums wrap modulo 2^32 (ruling R2).

    ``a``: [M, K], ``b``: [K, N] decoded integer inputs (S16/S8/S4 values in
    [-2^15, 2^15) when ``signed``, U16/U8/U4 values in [0, 2^16) otherwise).
    ``acc0``: None (start from 0) or C's [M, N] S32/U32 values or raw 32-bit
    patterns.  Returns the uint32 bit patterns of the S32/U32 result.  The
    order of the terms cannot matter: wrapping addition is associative.
    """
    a = _int_operand(a, "a", signed)
    b = _int_operand(b, "b", signed)
    _check_operands(a, b)
    m, n = a.shape[0], b.shape[1]
    # Residues modulo 2^32 in uint32: a product of residues is the residue of the
    # exact product, and unsigned sums wrap modulo 2^32 -- the S32/U32 result bits.
    # (einsum runs its own integer loops: no BLAS threads to stall on a busy host.)
    result = np.einsum("ik,kj->ij", a.astype(np.uint32), b.astype(np.uint32))
    if acc0 is not None:
        c = _word32_operand(acc0, "acc0")
        if c.shape != (m, n):
            raise ValueError(f"acc0 must have shape {(m, n)}, got {c.shape}")
        result += c.astype(np.uint32)
    return result


def add_bias_int(acc_bits, bias) -> np.ndarray:
    """BIAS forms, integer: ``(acc[i, j] + bias[j]) mod 2^32`` as uint32 patterns."""
    acc = _word32_operand(acc_bits, "acc_bits")
    bias = _word32_operand(bias, "bias")
    if acc.ndim != 2 or bias.shape != (acc.shape[1],):
        raise ValueError(f"bias must be one row of {acc.shape[1:]} values, got {bias.shape}")
    return acc.astype(np.uint32) + bias.astype(np.uint32)[None, :]


# ---------------------------------------------------------------------------
# The pto-v0 raw-carrier reference profile
# ---------------------------------------------------------------------------

def pto_v0_carrier(dtype, raw) -> np.ndarray:
    """The 64-bit carrier word the ASL's TLOAD puts in a tile element.

    S8/S16/S32 patterns are sign-extended; every other type, 4-bit lanes included
    (also S4X2), is zero-extended; 64-bit patterns are taken as they are.
    """
    dtype = _as_dtype(dtype)
    arr = _raw_array(dtype, raw).astype(np.uint64)
    if dtype in (DataType.S8, DataType.S16, DataType.S32):
        return decode(dtype, arr).view(np.uint64)
    return arr


def _word64(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold 64-bit carrier words (integers), got {arr.dtype}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        raise ValueError(f"{name} carrier words must be unsigned 64-bit values")
    return arr.astype(np.uint64)


def matmul_pto_v0(a, b, acc0=None, a_scale=None, b_scale=None) -> np.ndarray:
    """The ``pto-v0`` profile's matrix hooks: ``acc + left * right`` modulo 2^64 on words.

    ``a``: [M, K], ``b``: [K, N] carrier words; ``acc0``: [M, N] words of C or None
    (start from 0); ``a_scale``/``b_scale``: [M, nb]/[nb, N] raw scale words of the
    MX forms (a present scale multiplies its input's raw word first).  Returns
    uint64 [M, N] result words (consumers of an S32/U32/FP32 tile read bits 31:0).
    """
    a = _word64(a, "a")
    b = _word64(b, "b")
    _check_operands(a, b)
    (m, k), n = a.shape, b.shape[1]
    blocks = -(-k // MX_BLOCK)
    if a_scale is not None:
        scale = _word64(a_scale, "a_scale")
        if scale.shape != (m, blocks):
            raise ValueError(f"a_scale must have shape {(m, blocks)}, got {scale.shape}")
        a = a * np.repeat(scale, MX_BLOCK, axis=1)[:, :k]
    if b_scale is not None:
        scale = _word64(b_scale, "b_scale")
        if scale.shape != (blocks, n):
            raise ValueError(f"b_scale must have shape {(blocks, n)}, got {scale.shape}")
        b = b * np.repeat(scale, MX_BLOCK, axis=0)[:k, :]
    result = a @ b                               # unsigned numpy arithmetic wraps mod 2^64
    if acc0 is not None:
        c = _word64(acc0, "acc0")
        if c.shape != (m, n):
            raise ValueError(f"acc0 must have shape {(m, n)}, got {c.shape}")
        result = result + c
    return result


def add_bias_pto_v0(value, bias) -> np.ndarray:
    """The ``pto-v0`` bias hook: ``value[i, j] + bias[j]`` modulo 2^64 on words."""
    value = _word64(value, "value")
    bias = _word64(bias, "bias")
    if value.ndim != 2 or bias.shape != (value.shape[1],):
        raise ValueError(f"bias must be one row of {value.shape[1:]} words, got {bias.shape}")
    return value + bias[None, :]
