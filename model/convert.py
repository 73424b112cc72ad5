"""Destination encoders: exact real values -> element bit patterns, with flags.

These are the conversions at the end of B.FPATR post-processing (spec digest
§5.7/§5.8; ASL ``asl/arch/profile/matrix-quantization.asl`` and
``reference-quantization.asl``, bit-exact in the spec's ``pto-v0`` profile).

Every post-process input value is exactly representable in float64 (an S32 or
FP32 value times an FP19 scale has at most 43 significant bits and a binary
exponent within [-275, 256]), so the encoders take float64 arrays that hold
*exact* real values and round exactly once.  NaN and infinity never reach
:func:`encode`: the post-process routes them through :func:`encode_special`.

Raw results use the narrowest unsigned numpy dtype holding one element
(uint8 for 4- and 8-bit types, one 4-bit lane per element; uint16; uint32;
uint64).  Flags are 5-bit vectors in the ASL's order (:class:`Flag`).
"""

import enum

import numpy as np

from .datatype import DataType, NumClass

__all__ = ["RMode", "Flag", "Special", "resolve_rmode", "round_integral", "round_to_int", "encode",
           "encode_special", "signed_zero", "fp8_value_table", "ENCODABLE_TYPES",
           "raw_dtype"]


class RMode(enum.IntEnum):
    """B.DATR RMode codes (3 bits).  ``NONE`` asks for the operation default."""

    NONE = 0
    RNE = 1     # nearest, ties to even
    RTZ = 2     # toward zero
    RDN = 3     # toward -inf (also called RTM)
    RUP = 4     # toward +inf (also called RTP)
    RNA = 5     # nearest, ties away from zero
    RTO = 6     # round to odd when inexact
    RHB = 7     # nearest, ties toward +inf ("numerically greater")
    RTM = 3
    RTP = 4


class Flag(enum.IntFlag):
    """Numeric status flags, as the ASL's 5-bit vectors (CORE_STATE[36:32])."""

    NV = 0x01
    DZ = 0x02
    OF = 0x04
    UF = 0x08
    NX = 0x10

    @classmethod
    def names(cls, value: int) -> list[str]:
        """The set flags of ``value`` as names, in bit order (e.g. ``['OF', 'NX']``)."""
        return [flag.name for flag in cls if value & flag]


class Special(enum.Enum):
    """Non-finite FP32 source classes that take the special-value path (§5.8)."""

    QNAN = "qNaN"
    SNAN = "sNaN"
    POS_INF = "+inf"
    NEG_INF = "-inf"


def resolve_rmode(code: int) -> RMode:
    """Resolve a B.DATR RMode code to the rounding actually used.

    Code 0 (NONE) selects the operation default, which for the Matrix
    post-process is RNE (ASL ``ResolveTileNumericExecutionControl``; only TCVT
    float-to-integer defaults to RTZ, and that is not a Matrix operation).
    """
    try:
        mode = RMode(int(code))
    except ValueError:
        raise ValueError(f"RMode code {code!r} is not a 3-bit B.DATR RMode") from None
    return RMode.RNE if mode is RMode.NONE else mode


_OF_NX = int(Flag.OF | Flag.NX)
_UF_NX = int(Flag.UF | Flag.NX)
_NX = int(Flag.NX)


def _round_integral(x: np.ndarray, mode: RMode) -> np.ndarray:
    """Round exact float64 values to integral float64 values (no range limit).

    ``x - floor(x)`` is exact in float64, so the tie and inexact tests are exact.
    """
    fl = np.floor(x)
    frac = x - fl
    if mode is RMode.RTZ:
        return np.trunc(x)
    if mode is RMode.RDN:
        return fl
    if mode is RMode.RUP:
        return np.ceil(x)
    odd_floor = np.fmod(fl, 2.0) != 0
    if mode is RMode.RNE:
        up = (frac > 0.5) | ((frac == 0.5) & odd_floor)
    elif mode is RMode.RNA:
        up = (frac > 0.5) | ((frac == 0.5) & (x >= 0))
    elif mode is RMode.RTO:
        up = (frac != 0) & ~odd_floor
    elif mode is RMode.RHB:
        up = frac >= 0.5
    else:
        raise ValueError(f"rounding mode {mode!r} must be resolved first (see resolve_rmode)")
    return fl + up


def _finite_f64(values) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("encoders take finite exact values; NaN/inf use encode_special")
    return x


def round_integral(values, rounding: int) -> np.ndarray:
    """Round exact finite real values to integral float64 values (no range limit).

    Same rules as :func:`round_to_int`; use this one when results may exceed int64.
    """
    return _round_integral(_finite_f64(values), resolve_rmode(rounding))


def round_to_int(values, rounding: int) -> np.ndarray:
    """Round exact real values to int64 with a B.DATR rounding mode.

    RNE ties to even, RNA ties away from zero, RHB ties toward +inf, RTO keeps
    an exact integer and otherwise picks the odd neighbour, RTZ/RDN/RUP are
    directed.  ``rounding`` may be ``RMode.NONE`` (resolved to RNE).
    """
    r = round_integral(values, rounding)
    if np.any(np.abs(r) >= 2.0 ** 63):
        raise ValueError("rounded value does not fit in int64")
    return r.astype(np.int64)


# --- integer destinations ---------------------------------------------------

_INT_TYPES = (DataType.S4X2, DataType.S8, DataType.S16, DataType.S32, DataType.S64,
              DataType.U4X2, DataType.U8, DataType.U16, DataType.U32, DataType.U64)


def _int_range(dtype: DataType) -> tuple[int, int]:
    w = dtype.bits
    if dtype.num_class is NumClass.SIGNED:
        return -(1 << (w - 1)), (1 << (w - 1)) - 1
    return 0, (1 << w) - 1


def raw_dtype(dtype: DataType) -> np.dtype:
    """numpy dtype of one raw element of ``dtype`` (4-bit lanes: uint8)."""
    return np.dtype({4: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32,
                     64: np.uint64}[dtype.bits])


def _wrap_to_raw(r: np.ndarray, dtype: DataType) -> np.ndarray:
    """Two's-complement truncation of integral float64 values to the lane width."""
    small = np.abs(r) < 2.0 ** 63
    # Small values go through int64 exactly; huge ones (only reached when a
    # wrapping conversion overflows) are reduced modulo 2^64 first.  Both fmod
    # and the +2^64 correction are exact: |r| >= 2^63 makes r a multiple of 2^11.
    big = np.fmod(np.where(small, 0.0, r), 2.0 ** 64)
    big = np.where(big < 0, big + 2.0 ** 64, big)
    high = big >= 2.0 ** 63
    big_u = np.where(high, big - 2.0 ** 63, big).astype(np.uint64) | \
        np.where(high, np.uint64(1 << 63), np.uint64(0))
    small_u = np.where(small, r, 0.0).astype(np.int64).view(np.uint64)
    u = np.where(small, small_u, big_u)
    return (u & np.uint64((1 << dtype.bits) - 1)).astype(raw_dtype(dtype))


def _encode_integer(x, dtype, mode, sat):
    r = _round_integral(x, mode)
    lo, hi = _int_range(dtype)
    # Compare against exact powers of two: hi itself is not a float64 for 64-bit types.
    too_low = r < float(lo)
    too_high = r >= float(hi + 1)
    over = too_low | too_high
    flags = np.where(over, _OF_NX, np.where(r != x, _NX, 0)).astype(np.uint8)
    raw = _wrap_to_raw(r, dtype)
    if sat:
        lo_raw, hi_raw = _int_const_raw(lo, dtype), _int_const_raw(hi, dtype)
        raw = np.where(too_low, lo_raw, np.where(too_high, hi_raw, raw)).astype(raw.dtype)
    return raw, flags


def _int_const_raw(value: int, dtype: DataType) -> int:
    return value & ((1 << dtype.bits) - 1)


# --- IEEE-style floating destinations (FP32, FP16, BF16) --------------------

#: fraction bits, minimum normal exponent, maximum exponent (= bias)
_IEEE = {
    DataType.FP32: (23, -126, 127),
    DataType.FP16: (10, -14, 15),
    DataType.BF16: (7, -126, 127),
}


def _encode_ieee(x, dtype, mode, sat):
    p, emin, emax = _IEEE[dtype]
    bits = dtype.bits
    neg = x < 0
    a = np.abs(x)
    zero = a == 0
    _, e = np.frexp(np.where(zero, 1.0, a))
    exp = e.astype(np.int64) - 1                       # a = 1.f * 2^exp
    qexp = np.maximum(exp, emin)                       # subnormals share the emin quantum
    scaled = np.ldexp(np.where(zero, 0.0, a), (p - qexp).astype(np.int32))   # exact
    # Round the signed value: directed modes mirror for negatives, and RHB ties
    # go toward +inf, i.e. toward the smaller magnitude for negatives.
    n = np.abs(_round_integral(np.where(neg, -scaled, scaled), mode))
    inexact = n != scaled
    inf_raw = ((2 * emax + 1) << p)
    # For the subnormal quantum (qexp = emin) the exponent term is zero, and a
    # carry out of the fraction lands naturally on the next exponent code.
    mag = (qexp + emax - 1) * (1 << p) + n.astype(np.int64)
    # An exponent above emax, or a rounding carry into exponent code 2*emax+1,
    # overflows in every rounding mode (RTZ/RDN included).
    over = mag >= inf_raw
    tiny = exp < emin
    flags = np.where(over, _OF_NX,
                     np.where(inexact, np.where(tiny, _UF_NX, _NX), 0)).astype(np.uint8)
    mag = np.where(over, inf_raw - 1 if sat else inf_raw, mag)
    mag = np.where(zero, 0, mag)
    flags = np.where(zero, 0, flags).astype(np.uint8)
    sign = np.where(neg, 1 << (bits - 1), 0)
    return (mag | sign).astype(raw_dtype(dtype)), flags


# --- narrow floats by nearest-code search (E4M3, HiF8) ----------------------

def _e4m3_value(code: int) -> float:
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 15 and m == 7:
        return float("nan")
    mag = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if code & 0x80 else mag


def _hif8_value(code: int) -> float:
    if code == 0x80:
        return float("nan")
    if code in (0x6F, 0xEF):
        return float("-inf") if code & 0x80 else float("inf")
    b = code & 0x7F
    if b <= 7:                                  # denormal: 2^(m-23); b = 0 is zero
        mag = 0.0 if b == 0 else 2.0 ** (b - 23)
    elif b <= 15:                               # D0: exponent 0, 3 mantissa bits
        mag = 1 + (b & 7) / 8
    elif b <= 31:                               # D1: exponent +-1
        mag = (1 + (b & 7) / 8) * 2.0 ** (-1 if b & 0x8 else 1)
    elif b <= 63:                               # D2: exponent +-(2..3)
        ex = 2 + ((b >> 3) & 1)
        mag = (1 + (b & 7) / 8) * 2.0 ** (-ex if b & 0x10 else ex)
    elif b <= 95:                               # D3: exponent +-(4..7), 2 mantissa bits
        ex = 4 + ((b >> 2) & 3)
        mag = (1 + (b & 3) / 4) * 2.0 ** (-ex if b & 0x10 else ex)
    else:                                       # D4: exponent +-(8..15), 1 mantissa bit
        ex = 8 + ((b >> 1) & 7)
        mag = (1 + (b & 1) / 2) * 2.0 ** (-ex if b & 0x10 else ex)
    return -mag if code & 0x80 else mag


def fp8_value_table(dtype: DataType) -> np.ndarray:
    """Values of the 256 codes of E4M3 or HiF8 (NaN for NaN codes, +-inf for HiF8 inf)."""
    decode = {DataType.E4M3: _e4m3_value, DataType.HiF8: _hif8_value}[dtype]
    return np.array([decode(c) for c in range(256)], dtype=np.float64)


class _Fp8Format:
    """Sorted finite code table of one narrow float, with the RTO odd-neighbour links."""

    def __init__(self, dtype: DataType, max_finite: float, min_normal: float,
                 max_code: int, overflow_codes: tuple[int, int]):
        table = fp8_value_table(dtype)
        codes = [c for c in range(256) if np.isfinite(table[c])]
        # The ASL scans codes upward and keeps the first of equal candidates,
        # so the value 0 is always code 0x00 (E4M3 0x80 never wins).
        by_value = {}
        for c in codes:
            by_value.setdefault(table[c], c)
        order = sorted(by_value)
        self.values = np.array(order, dtype=np.float64)
        self.codes = np.array([by_value[v] for v in order], dtype=np.int64)
        odd = (self.codes & 1) == 1
        # Neighbouring values always have codes of opposite parity in both
        # formats, so an RNE tie has exactly one even candidate.
        assert np.all(odd[1:] != odd[:-1]), f"{dtype.name}: equal-parity neighbours"
        k = len(order)
        # next_odd_up[i]: nearest index above i with an odd code (or i itself if none).
        self.next_odd_up = np.arange(k)
        self.next_odd_down = np.arange(k)
        nearest = None
        for i in range(k - 1, -1, -1):
            self.next_odd_up[i] = nearest if nearest is not None else i
            if odd[i]:
                nearest = i
        nearest = None
        for i in range(k):
            self.next_odd_down[i] = nearest if nearest is not None else i
            if odd[i]:
                nearest = i
        self.max_finite = max_finite
        self.min_normal = min_normal
        self.max_code = max_code
        self.overflow_codes = overflow_codes    # (positive, negative) result with Sat = 0


_FP8 = {
    DataType.E4M3: _Fp8Format(DataType.E4M3, 448.0, 2.0 ** -6, 0x7E, (0x7F, 0x7F)),
    DataType.HiF8: _Fp8Format(DataType.HiF8, 32768.0, 2.0 ** -15, 0x6E, (0x6F, 0xEF)),
}


def _encode_fp8(x, dtype, mode, sat):
    f = _FP8[dtype]
    neg = x < 0
    a = np.abs(x)
    zero = a == 0
    over = a > f.max_finite                   # overflow before any rounding
    xc = np.where(over | zero, 0.0, x)        # keep the search in range
    hi = np.searchsorted(f.values, xc, side="left")
    exact = f.values[hi] == xc
    lo = np.where(exact, hi, hi - 1)
    v_lo, v_hi = f.values[lo], f.values[hi]
    c_hi = f.codes[hi]
    if mode is RMode.RUP:
        idx = hi
    elif mode is RMode.RDN:
        idx = lo
    elif mode in (RMode.RTZ, RMode.RTO):
        idx = np.where(neg, hi, lo)
        if mode is RMode.RTO:
            even = (f.codes[idx] & 1) == 0
            away = np.where(neg, f.next_odd_down[idx], f.next_odd_up[idx])
            idx = np.where(~exact & even, away, idx)
    else:
        mid = (v_lo + v_hi) / 2                # exact: table values have <= 4 bits
        if mode is RMode.RNE:
            tie_hi = (c_hi & 1) == 0
        elif mode is RMode.RNA:
            tie_hi = np.abs(v_hi) > np.abs(v_lo)
        elif mode is RMode.RHB:
            tie_hi = np.ones_like(exact)
        else:
            raise ValueError(f"rounding mode {mode!r} must be resolved first")
        idx = np.where(xc < mid, lo, np.where(xc > mid, hi, np.where(tie_hi, hi, lo)))
    code = f.codes[idx]
    inexact = f.values[idx] != xc
    flags = np.where(inexact, np.where(a < f.min_normal, _UF_NX, _NX), 0)
    if sat:
        over_code = np.where(neg, f.max_code | 0x80, f.max_code)
    else:
        over_code = np.where(neg, f.overflow_codes[1], f.overflow_codes[0])
    code = np.where(over, over_code, np.where(zero, 0, code))
    flags = np.where(over, _OF_NX, np.where(zero, 0, flags))
    return code.astype(np.uint8), flags.astype(np.uint8)


#: Destination types :func:`encode` supports.
ENCODABLE_TYPES = frozenset(_INT_TYPES) | frozenset(_IEEE) | frozenset(_FP8)


def encode(values, dtype: DataType, rounding: int, sat) -> tuple[np.ndarray, np.ndarray]:
    """Encode exact finite real values into ``dtype`` bit patterns.

    ``rounding`` is a B.DATR RMode (``NONE`` resolves to RNE); ``sat`` is the
    B.DATR Sat bit.  Rules (ASL reference encoders, spec digest §5.7):

    * integers: round, then on overflow clamp (Sat) or wrap to the lane
      width; OF|NX on overflow, else NX when inexact;
    * FP32/FP16/BF16: one rounding; overflow gives +-inf in *every* rounding
      mode (Sat: +-max finite) with OF|NX; UF|NX when an inexact result lies
      in the subnormal range (including one that rounds up to the minimum
      normal), NX otherwise;
    * E4M3/HiF8: |v| above the largest finite value (448, 32768) overflows
      before rounding (Sat: +-max finite, otherwise E4M3 0x7F / HiF8 +-inf);
      else the nearest-code search, whose zero is always +0 (a tiny negative
      value rounding to zero gives 0x00); UF|NX when inexact below the
      minimum normal, NX otherwise.

    A zero value encodes as +0 whatever its float64 sign: the encoders see
    real numbers; the post-process handles an FP32 -0 source itself.
    Returns ``(raw, flags)`` arrays of the input's shape.
    """
    dtype = DataType(dtype)
    x = _finite_f64(values)
    mode = resolve_rmode(rounding)
    sat = bool(sat)
    if dtype in _IEEE:
        return _encode_ieee(x, dtype, mode, sat)
    if dtype in _FP8:
        return _encode_fp8(x, dtype, mode, sat)
    if dtype in _INT_TYPES:
        return _encode_integer(x, dtype, mode, sat)
    raise ValueError(f"{dtype.name} is not a destination type the encoders support")


# --- special values -----------------------------------------------------------

_CANONICAL_NAN = {DataType.FP32: 0x7FC00000, DataType.FP16: 0x7E00, DataType.BF16: 0x7FC0,
                  DataType.E4M3: 0x7F, DataType.HiF8: 0x80}
_INFINITY = {DataType.FP32: 0x7F800000, DataType.FP16: 0x7C00, DataType.BF16: 0x7F80,
             DataType.HiF8: 0x6F}
_MAX_FINITE = {DataType.FP32: 0x7F7FFFFF, DataType.FP16: 0x7BFF, DataType.BF16: 0x7F7F,
               DataType.E4M3: 0x7E, DataType.HiF8: 0x6E}
_SIGN = {DataType.FP32: 0x80000000, DataType.FP16: 0x8000, DataType.BF16: 0x8000,
         DataType.E4M3: 0x80, DataType.HiF8: 0x80}


def encode_special(kind: Special, dtype: DataType, sat) -> tuple[int, int]:
    """Result ``(raw, flags)`` of a NaN/infinity source converted to ``dtype`` (§5.8).

    Integers: NaN gives the indefinite value (signed minimum, unsigned maximum)
    with NV, or 0 with NV under Sat; +-inf gives the indefinite value with NV,
    or the clamped endpoint with OF|NX under Sat.  Floats: NaN gives the
    canonical NaN (NV only for a signaling NaN), or +0 under Sat; +-inf stays
    +-inf without flags (E4M3 has none: canonical NaN with OF|NX), or +-max
    finite with OF|NX under Sat.
    """
    dtype = DataType(dtype)
    kind = Special(kind)
    sat = bool(sat)
    nan = kind in (Special.QNAN, Special.SNAN)
    negative = kind is Special.NEG_INF
    if dtype in _INT_TYPES:
        lo, hi = _int_range(dtype)
        indefinite = lo if dtype.num_class is NumClass.SIGNED else hi
        if nan:
            return (0 if sat else _int_const_raw(indefinite, dtype)), int(Flag.NV)
        if sat:
            return _int_const_raw(lo if negative else hi, dtype), _OF_NX
        return _int_const_raw(indefinite, dtype), int(Flag.NV)
    if dtype not in _CANONICAL_NAN:
        raise ValueError(f"{dtype.name} is not a destination type the encoders support")
    sign = _SIGN[dtype] if negative else 0
    if nan:
        flags = int(Flag.NV) if kind is Special.SNAN else 0
        return (0 if sat else _CANONICAL_NAN[dtype]), flags
    if sat:
        return sign | _MAX_FINITE[dtype], _OF_NX
    if dtype is DataType.E4M3:
        return _CANONICAL_NAN[dtype], _OF_NX
    return sign | _INFINITY[dtype], 0


def signed_zero(dtype: DataType) -> int:
    """Raw -0 of a floating destination; HiF8 has a single zero, so 0x00."""
    dtype = DataType(dtype)
    if dtype is DataType.HiF8:
        return 0
    return _SIGN[dtype]
