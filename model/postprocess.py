"""B.FPATR post-processing: the last stage of every CUBE Matrix operation.

Given the raw accumulator P (FP32, S32 or U32 bit patterns, after ACC/bias),
this module produces D, RowMaxOut, GroupMaxOut and the numeric-status flags
exactly as the spec's bit-exact reference does (spec digest §5; ASL
``asl/tile/model/execution/postprocess.asl``,
``asl/arch/profile/matrix-postprocess.asl``,
``asl/arch/profile/matrix-quantization.asl``, ``asl/block/attributes/B.FPATR.asl``).

Layout of the module:

* :data:`PREQUANT_MODES` - the 27 PreQuantModes as data.  The hardware imports
  this table; it is the single source of truth for codes, types, parameters,
  offsets, rounding and the B.DATR rule.
* parameter words - FP19 decoding and the legality checks of B.IOR scalars
  and the U64 vector-parameter tiles.
* reductions - RowMax/GroupMax on the raw accumulator.
* :func:`postprocess` - the whole stage, vectorised over the M x N matrix.

Choices between conflicting spec texts are recorded in
``docs/decisions/postprocess.md``.
"""

import enum
from dataclasses import dataclass

import numpy as np

from .bundle import Fpatr
from .convert import (Flag, RMode, Special, encode, encode_special, raw_dtype,
                      resolve_rmode, round_integral, signed_zero)
from .datatype import DataType, NumClass
from .faults import FaultClass, PTOFault

__all__ = ["ParamKind", "PreQuantMode", "PREQUANT_MODES", "prequant_mode", "d_dtype",
           "check_acc_type", "effective_rounding", "check_rmode_sat", "check_fpatr",
           "group_n", "group_count", "scalar_param_slots", "vector_param_sources",
           "needs_scalar_param", "needs_vector_param", "fp19_value", "check_quant_word",
           "check_alpha_word", "quant_scale", "quant_offset", "quant_shift",
           "intermediate_round_clamp", "shift_s32_to_s16", "row_max", "group_max",
           "PostResult", "postprocess"]

_ACC_TYPES = (DataType.FP32, DataType.S32, DataType.U32)


def _legality(reason: str) -> PTOFault:
    return PTOFault(FaultClass.TILE_LEGALITY, reason)


# --- the PreQuantMode table -------------------------------------------------

class ParamKind(enum.Enum):
    """Where a mode's quantization parameter comes from."""

    NONE = "none"        # scale 1.0, offset 0
    SCALAR = "scalar"    # one 64-bit word from a B.IOR GPR
    VECTOR = "vector"    # one 64-bit word per output column, from a Local 1 x N U64 tile


@dataclass(frozen=True)
class PreQuantMode:
    """One B.FPATR PreQuantMode.

    ``source`` is the accumulator type the mode accepts (None for mode 0,
    which accepts FP32, S32 or U32) and ``d_dtype`` the D element type (None:
    D keeps the accumulator type).  ``offset_width`` is both the width of the
    signed offset field and of the intermediate S5/S9/S17 clamp (0: none).
    ``fixed_rounding`` is the rounding the mode forces (RNE, or RHB for the
    HiF8 modes); None means the B.DATR RMode, resolved.  ``rmode_free`` and
    ``sat_free`` say whether B.DATR may carry a nonzero RMode / Sat.
    """

    code: int
    name: str
    source: DataType | None
    d_dtype: DataType | None
    param: ParamKind
    offset_width: int
    fixed_rounding: RMode | None
    shift: bool
    rmode_free: bool
    sat_free: bool


def _build_modes() -> dict:
    T, P = DataType, ParamKind
    # code, name, source, D, parameter, offset width, fixed rounding, shift
    rows = [
        (0, "NoQuant", None, None, P.NONE, 0, None, False),
        (1, "F322F16", T.FP32, T.FP16, P.NONE, 0, RMode.RNE, False),
        (2, "VREQ8", T.S32, T.S8, P.VECTOR, 9, None, False),
        (3, "REQ8", T.S32, T.S8, P.SCALAR, 9, None, False),
        (4, "VDEQF16", T.S32, T.FP16, P.VECTOR, 0, None, False),
        (5, "DEQF16", T.S32, T.FP16, P.SCALAR, 0, None, False),
        (12, "VSHIFTS322S16", T.S32, T.S16, P.VECTOR, 0, None, True),
        (13, "SHIFTS322S16", T.S32, T.S16, P.SCALAR, 0, None, True),
        (16, "F322BF16", T.FP32, T.BF16, P.NONE, 0, RMode.RNE, False),
        (17, "REQ4", T.S32, T.S4X2, P.SCALAR, 5, None, False),
        (18, "VREQ4", T.S32, T.S4X2, P.VECTOR, 5, None, False),
        (19, "DEQS16", T.S32, T.S16, P.SCALAR, 17, None, False),
        (20, "VDEQS16", T.S32, T.S16, P.VECTOR, 17, None, False),
        (23, "VQF322B8_PRE", T.FP32, T.S8, P.VECTOR, 9, None, False),
        (24, "QF322B8_PRE", T.FP32, T.S8, P.SCALAR, 9, None, False),
        (25, "QF322HIF8_PRE", T.FP32, T.HiF8, P.SCALAR, 0, RMode.RHB, False),
        (26, "QF322FP8_PRE", T.FP32, T.E4M3, P.SCALAR, 0, RMode.RNE, False),
        (27, "QF322F32_PRE", T.FP32, T.FP32, P.SCALAR, 0, None, False),
        (28, "VQF322HIF8_PRE", T.FP32, T.HiF8, P.VECTOR, 0, RMode.RHB, False),
        (32, "QF322F16_PRE", T.FP32, T.FP16, P.SCALAR, 0, RMode.RNE, False),
        (33, "VQF322F16_PRE", T.FP32, T.FP16, P.VECTOR, 0, RMode.RNE, False),
        (34, "QF322BF16_PRE", T.FP32, T.BF16, P.SCALAR, 0, RMode.RNE, False),
        (35, "QS322BF16_PRE", T.S32, T.BF16, P.SCALAR, 0, None, False),
        (36, "VQF322BF16_PRE", T.FP32, T.BF16, P.VECTOR, 0, RMode.RNE, False),
        (37, "VQF322FP8_PRE", T.FP32, T.E4M3, P.VECTOR, 0, RMode.RNE, False),
        (38, "VQF322F32_PRE", T.FP32, T.FP32, P.VECTOR, 0, None, False),
        (39, "VQS322BF16_PRE", T.S32, T.BF16, P.VECTOR, 0, None, False),
    ]
    modes = {}
    for code, name, source, d, param, width, fixed, shift in rows:
        # B.DATR rule (B.FPATR page, ruling R8): mode 0 and the shift modes
        # take neither RMode nor Sat; fixed-rounding modes take Sat only.
        no_controls = code == 0 or shift
        modes[code] = PreQuantMode(code, name, source, d, param, width, fixed, shift,
                                   rmode_free=not no_controls and fixed is None,
                                   sat_free=not no_controls)
    return modes


#: code -> :class:`PreQuantMode`, for the 27 assigned codes (every other code is reserved).
PREQUANT_MODES = _build_modes()


def prequant_mode(code: int) -> PreQuantMode:
    """The table row of a PreQuantMode code; a reserved code does not decode."""
    try:
        return PREQUANT_MODES[int(code)]
    except KeyError:
        raise PTOFault(FaultClass.ILLEGAL_INSTRUCTION,
                       f"PreQuantMode {code} is reserved") from None


def check_acc_type(mode: int, acc_type: DataType) -> None:
    """PreQuantMode vs accumulator class (mode 0: FP32/S32/U32; else its own source)."""
    m = prequant_mode(mode)
    accepted = _ACC_TYPES if m.source is None else (m.source,)
    if DataType(acc_type) not in accepted:
        raise _legality(f"PreQuantMode {m.code} ({m.name}) does not accept a "
                        f"{DataType(acc_type).name} accumulator")


def d_dtype(mode: int, acc_type: DataType) -> DataType:
    """D's element type: the accumulator type for mode 0, else the mode's output."""
    check_acc_type(mode, acc_type)
    m = prequant_mode(mode)
    return DataType(acc_type) if m.d_dtype is None else m.d_dtype


def effective_rounding(mode: int, rmode: int) -> RMode:
    """Rounding the conversion uses: the mode's fixed rounding, else B.DATR RMode resolved.

    This mirrors the ASL, which overrides RMode in fixed modes even if B.DATR
    asked for another one; :func:`check_rmode_sat` rejects that request first.
    """
    m = prequant_mode(mode)
    return m.fixed_rounding if m.fixed_rounding is not None else resolve_rmode(rmode)


def check_rmode_sat(mode: int, rmode: int, sat) -> None:
    """The documented B.DATR RMode/Sat rule for a PreQuantMode (ruling R8).

    Mode 0 and the shift modes need RMode NONE and Sat 0; fixed-rounding
    modes need RMode NONE; every other mode accepts any RMode and Sat.
    """
    m = prequant_mode(mode)
    rmode = RMode(int(rmode))
    if sat not in (0, 1, False, True):
        raise ValueError(f"Sat must be 0 or 1, not {sat!r}")
    if rmode is not RMode.NONE and not m.rmode_free:
        raise _legality(f"PreQuantMode {m.code} ({m.name}) requires B.DATR RMode NONE, "
                        f"not {rmode.name}")
    if sat and not m.sat_free:
        raise _legality(f"PreQuantMode {m.code} ({m.name}) requires B.DATR Sat 0")


_GROUP_N = (0, 8, 16, 32, 48, 64, 80, 96, 112, 128)


def group_n(code: int) -> int:
    """GroupN for a GroupNCode (0..9); codes 10..15 are reserved."""
    if not 0 <= int(code) < len(_GROUP_N):
        raise PTOFault(FaultClass.ILLEGAL_INSTRUCTION, f"GroupNCode {code} is reserved")
    return _GROUP_N[int(code)]


def group_count(n: int, gn: int) -> int:
    """Number of GroupMax columns: ceil(N / GroupN) (the last group may be partial)."""
    return -(-int(n) // int(gn))


def check_fpatr(fpatr: Fpatr) -> None:
    """The B.FPATR field rules (spec digest §5.1-5.2).

    Reserved PreQuantMode, ReluMode or GroupNCode values do not decode
    (Fault_IllegalInstruction); inconsistent enables are Fault_TileLegality.
    """
    prequant_mode(fpatr.pre_quant_mode)
    if not 0 <= fpatr.relu_mode <= 3:
        raise PTOFault(FaultClass.ILLEGAL_INSTRUCTION, f"ReluMode {fpatr.relu_mode} is reserved")
    group_n(fpatr.group_n_code)
    if fpatr.row_max_init and not fpatr.row_max_en:
        raise _legality("RowMaxInit requires RowMaxEn")
    if fpatr.group_max_en != (fpatr.group_n_code != 0):
        raise _legality("GroupMaxEn and a nonzero GroupNCode require each other")
    if fpatr.max_abs_en and not (fpatr.row_max_en or fpatr.group_max_en):
        raise _legality("MaxAbsEn requires RowMaxEn or GroupMaxEn")


def scalar_param_slots(fpatr: Fpatr) -> tuple:
    """The dense B.IOR scalar slots the bundle consumes, in RegSrc order.

    ``"quant"`` (a scalar-parameter PreQuantMode) comes first, then
    ``"alpha"`` (ReluMode 2); LReLU alone therefore uses RegSrc0.
    """
    slots = []
    if prequant_mode(fpatr.pre_quant_mode).param is ParamKind.SCALAR:
        slots.append("quant")
    if fpatr.relu_mode == 2:
        slots.append("alpha")
    return tuple(slots)


def vector_param_sources(fpatr: Fpatr) -> tuple:
    """The U64 1 x N parameter tiles the bundle consumes, in Local source order.

    They follow the mathematical sources and the optional RowMaxIn:
    ``"quant"`` for a vector PreQuantMode, then ``"alpha"`` for ReluMode 3.
    """
    sources = []
    if prequant_mode(fpatr.pre_quant_mode).param is ParamKind.VECTOR:
        sources.append("quant")
    if fpatr.relu_mode == 3:
        sources.append("alpha")
    return tuple(sources)


def needs_scalar_param(fpatr: Fpatr) -> bool:
    """True when the bundle needs a B.IOR scalar parameter (quant word and/or alpha)."""
    return bool(scalar_param_slots(fpatr))


def needs_vector_param(fpatr: Fpatr) -> bool:
    """True when the bundle needs at least one U64 vector-parameter source tile."""
    return bool(vector_param_sources(fpatr))


# --- parameter words ----------------------------------------------------------

def fp19_value(bits):
    """Exact value(s) of FP19 carriers (sign 1, exponent 8 bias 127, fraction 10).

    Accepts an int or an integer array of 19-bit patterns; NaN and infinity
    carriers raise ValueError (legality checks keep them out of the datapath).
    """
    b = np.asarray(bits, dtype=np.int64) & 0x7FFFF
    exp, frac = (b >> 10) & 0xFF, b & 0x3FF
    if np.any(exp == 0xFF):
        raise ValueError("FP19 NaN/infinity has no finite value")
    mant = np.where(exp > 0, frac + 1024, frac).astype(np.float64)
    mag = np.ldexp(mant, (np.maximum(exp, 1) - 137).astype(np.int32))
    value = np.where(b >> 18, -mag, mag)
    return float(value) if value.ndim == 0 else value


def _fp19_class_ok(bits: int, allow_zero: bool) -> bool:
    sign, exp, frac = (bits >> 18) & 1, (bits >> 10) & 0xFF, bits & 0x3FF
    if sign:
        return False
    if exp == 0:
        return allow_zero and frac == 0
    return exp != 0xFF


def _word(word) -> int:
    w = int(word)
    if not 0 <= w < 1 << 64:
        raise ValueError(f"parameter word {word!r} is not a 64-bit value")
    return w


def check_quant_word(mode: int, word: int) -> None:
    """Legality of a quantization parameter word for ``mode`` (digest §5.4).

    Shift modes: only bits[35:32] may be set.  Scale modes: bits[31:13] a
    positive normal FP19, bits[12:0] zero, the mode's signed offset field
    (S5 bits[41:37], S9 [45:37], S17 [53:37]) free, every other bit zero.
    Raises ``PTOFault(TILE_LEGALITY)``.
    """
    m = prequant_mode(mode)
    w = _word(word)
    if m.param is ParamKind.NONE:
        raise _legality(f"PreQuantMode {m.code} ({m.name}) takes no parameter")
    if m.shift:
        if w & ~(0xF << 32):
            raise _legality(f"shift parameter {w:#x} has bits outside [35:32]")
        return
    allowed = (0x7FFFF << 13) | (((1 << m.offset_width) - 1) << 37)
    if w & ~allowed:
        raise _legality(f"quantization word {w:#x} sets reserved bits for "
                        f"PreQuantMode {m.code} ({m.name})")
    if not _fp19_class_ok((w >> 13) & 0x7FFFF, allow_zero=False):
        raise _legality(f"quantization scale FP19 {(w >> 13) & 0x7FFFF:#x} is not positive normal")


def check_alpha_word(word: int) -> None:
    """Legality of an LReLU/PReLU word: bits[18:0] +0 or positive normal FP19, rest zero."""
    w = _word(word)
    if w >> 19:
        raise _legality(f"activation word {w:#x} sets bits above [18:0]")
    if not _fp19_class_ok(w, allow_zero=True):
        raise _legality(f"activation FP19 {w:#x} is not +0 or positive normal")


def quant_scale(words):
    """FP19 scale(s) in bits[31:13] of quantization word(s), as exact float64."""
    return fp19_value(np.asarray(words, dtype=np.uint64) >> np.uint64(13))


def quant_offset(mode: int, words):
    """Signed offset(s) of quantization word(s) for ``mode`` (0 for modes without one)."""
    width = prequant_mode(mode).offset_width
    w = np.asarray(words, dtype=np.uint64)
    if width == 0:
        return np.zeros(w.shape, dtype=np.int64)
    field = ((w >> np.uint64(37)) & np.uint64((1 << width) - 1)).astype(np.int64)
    return np.where(field >= 1 << (width - 1), field - (1 << width), field)


def quant_shift(words):
    """Arithmetic right-shift amount(s) of shift-mode word(s): bits[35:32] + 1 (1..16)."""
    w = np.asarray(words, dtype=np.uint64)
    return ((w >> np.uint64(32)) & np.uint64(0xF)).astype(np.int64) + 1


# --- numeric stages -----------------------------------------------------------

def intermediate_round_clamp(values, width: int, rounding: int):
    """Round exact values and clamp them to a signed ``width``-bit intermediate.

    The S5/S9/S17 clamp happens whatever Sat says.  Flags: OF|NX when the
    rounded value had to be clamped, otherwise NX when rounding was inexact.
    Returns ``(int64 values, uint8 flags)``.
    """
    x = np.asarray(values, dtype=np.float64)
    t = round_integral(x, rounding)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    clamped = (t < lo) | (t > hi)
    flags = np.where(clamped, int(Flag.OF | Flag.NX),
                     np.where(t != x, int(Flag.NX), 0)).astype(np.uint8)
    return np.clip(t, lo, hi).astype(np.int64), flags


def shift_s32_to_s16(values, shift):
    """Shift modes: ASR of the S32 value by 1..16, saturated to S16 (OF|NX), no NX otherwise.

    Returns ``(uint16 raw, uint8 flags)``.
    """
    v = np.asarray(values, dtype=np.int64) >> np.asarray(shift, dtype=np.int64)
    sat = (v < -32768) | (v > 32767)
    flags = np.where(sat, int(Flag.OF | Flag.NX), 0).astype(np.uint8)
    return (np.clip(v, -32768, 32767) & 0xFFFF).astype(np.uint16), flags


# --- RowMax / GroupMax ---------------------------------------------------------

_INT_MIN = -(1 << 31)
_CANONICAL_NAN32 = 0x7FC00000


def _fold_max(vals: np.ndarray, valid: np.ndarray, acc_type: DataType, max_abs: bool):
    """The MAX fold of each row of ``vals`` (uint32, R x K) over its ``valid`` entries.

    Equivalent to the ASL's left fold ``v = MAX(v, x)`` (with |.| on both
    operands when MaxAbsEn, and one |.| step on the first element): for
    non-NaN operands MAX keeps the larger total-order key (equal keys mean
    equal bits, so fold order does not matter), one NaN yields the other
    operand, two NaNs the canonical NaN.  A row of one element and no MaxAbsEn
    takes no step at all and keeps its raw bits.
    """
    count = valid.sum(axis=1)
    stepped = max_abs | (count > 1)
    if acc_type is DataType.U32:
        return np.where(valid, vals, 0).max(axis=1).astype(np.uint32), 0
    if acc_type is DataType.S32:
        v = vals.view(np.int32).astype(np.int64)
        flags = 0
        if max_abs:
            if np.any(valid & (v == _INT_MIN)):
                flags = int(Flag.OF)        # |INT_MIN| saturates to INT_MAX; OF without NX
            v = np.where(v == _INT_MIN, (1 << 31) - 1, np.abs(v))
        best = np.where(valid, v, _INT_MIN).max(axis=1)
        return (best & 0xFFFFFFFF).astype(np.uint32), flags
    bits = vals & np.uint32(0x7FFFFFFF) if max_abs else vals
    exp_all_ones = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    nan = exp_all_ones & ((bits & np.uint32(0x007FFFFF)) != 0)
    snan = nan & ((bits & np.uint32(0x00400000)) == 0)
    numeric = valid & ~nan
    negative = (bits >> np.uint32(31)) == 1
    key = np.where(negative, ~bits, bits ^ np.uint32(0x80000000))
    kmax = np.where(numeric, key, np.uint32(0)).max(axis=1)   # key 0 is a NaN pattern: never numeric
    best = np.where(kmax >> np.uint32(31) == 1, kmax ^ np.uint32(0x80000000), ~kmax)
    all_nan = ~numeric.any(axis=1)
    first = vals[np.arange(len(vals)), np.argmax(valid, axis=1)]
    best = np.where(all_nan, np.where(stepped, np.uint32(_CANONICAL_NAN32), first), best)
    flags = int(Flag.NV) if np.any(snan & valid & stepped[:, None]) else 0
    return best.astype(np.uint32), flags


def _check_acc(acc_type) -> DataType:
    acc_type = DataType(acc_type)
    if acc_type not in _ACC_TYPES:
        raise ValueError(f"{acc_type.name} is not an accumulator type (FP32, S32, U32)")
    return acc_type


def row_max(p_raw, acc_type: DataType, max_abs: bool = False, rowmax_in=None):
    """RowMax of the raw accumulator: ``(uint32 (M,), flags)``.

    ``rowmax_in`` (raw accumulator-type values, length M) is folded in last,
    as the left operand (RowMaxInit).
    """
    acc_type = _check_acc(acc_type)
    p = _as_u32(p_raw, 2, "P")
    vals, valid = p, np.ones(p.shape, dtype=bool)
    if rowmax_in is not None:
        seed = _as_u32(rowmax_in, 1, "RowMaxIn")
        if seed.shape != (p.shape[0],):
            raise _legality(f"RowMaxIn must be M x 1 = {p.shape[0]} x 1")
        vals = np.concatenate([seed[:, None], p], axis=1)
        valid = np.ones(vals.shape, dtype=bool)
    return _fold_max(vals, valid, acc_type, bool(max_abs))


def group_max(p_raw, acc_type: DataType, gn: int, max_abs: bool = False):
    """GroupMax of the raw accumulator: ``(uint32 (M, ceil(N/gn)), flags)``.

    Group g covers columns [g*gn, min(N, (g+1)*gn)); no seed input.
    """
    acc_type = _check_acc(acc_type)
    if int(gn) <= 0:
        raise ValueError(f"GroupN must be positive, not {gn}")
    p = _as_u32(p_raw, 2, "P")
    m, n = p.shape
    g = group_count(n, gn)
    padded = np.zeros((m, g * gn), dtype=np.uint32)
    padded[:, :n] = p
    valid = np.zeros((m, g * gn), dtype=bool)
    valid[:, :n] = True
    best, flags = _fold_max(padded.reshape(m * g, gn), valid.reshape(m * g, gn),
                            acc_type, bool(max_abs))
    return best.reshape(m, g), flags


# --- the complete stage -------------------------------------------------------

@dataclass(frozen=True)
class PostResult:
    """Outputs of B.FPATR post-processing, published together at commit.

    ``d``: raw D bit patterns, M x N, in the narrowest unsigned dtype of D's
    element (one 4-bit lane per element for S4X2).  ``rowmax`` (M,) and
    ``groupmax`` (M, G): raw accumulator-type values (uint32), or None when
    disabled.  ``flags``: the OR of every element's, RowMax's and GroupMax's
    flags (:class:`~ptocube.model.convert.Flag` bits).
    """

    d: np.ndarray
    d_dtype: DataType
    rowmax: np.ndarray | None
    groupmax: np.ndarray | None
    flags: int


def _as_u32(a, ndim: int, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integer bit patterns, not {arr.dtype}")
    if arr.ndim != ndim or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty {ndim}-D array, got shape {arr.shape}")
    if (arr.dtype.kind == "i" and arr.min() < -(1 << 31)) or arr.max() >= 1 << 32:
        raise ValueError(f"{what} holds values that are not 32-bit patterns")
    return (arr.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _vector_words(words, n: int, what: str) -> np.ndarray:
    arr = np.asarray(words)
    if arr.dtype.kind not in "iu" or arr.shape != (n,):
        raise _legality(f"{what} must be a 1 x N = 1 x {n} U64 tile")
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError(f"{what} holds negative values; U64 words are unsigned")
    return arr.astype(np.uint64)


def _resolve_scalar(word, needed: bool, slot: str, check, omitted_ior_reads_zero: bool):
    """A B.IOR scalar slot: a checked word, or None when the bundle does not use it."""
    if not needed:
        if word is not None:
            raise _legality(f"a {slot} scalar was supplied but B.FPATR does not use one")
        return None
    if word is None:
        if omitted_ior_reads_zero:
            return 0        # the ASL: an omitted B.IOR reads the zero GPR, unchecked
        raise _legality(f"B.FPATR needs a {slot} scalar but no B.IOR supplies it (ruling R8)")
    check(word)
    return _word(word)


def postprocess(p_raw, acc_type: DataType, fpatr: Fpatr, rmode: int, sat,
                quant_scalar=None, alpha_scalar=None, quant_vector=None,
                alpha_vector=None, rowmax_in=None, *,
                omitted_ior_reads_zero: bool = False) -> PostResult:
    """Apply B.FPATR post-processing to the raw accumulator P.

    ``p_raw``: M x N raw accumulator bit patterns (FP32, S32 or U32 as given by
    ``acc_type``).  ``rmode``/``sat``: the B.DATR fields (0 when B.DATR is
    absent).  Scalar parameters are the 64-bit B.IOR words (None: not
    supplied); ``quant_vector``/``alpha_vector`` are the N U64 words of the
    vector-parameter tiles; ``rowmax_in`` the M raw RowMaxIn values.

    Every rule a bundle could break raises ``PTOFault`` before any result is
    produced: reserved B.FPATR fields (IllegalInstruction), inconsistent
    enables, a mode/accumulator mismatch, the B.DATR RMode/Sat rule, a missing
    or superfluous parameter or RowMaxIn, and illegal parameter words
    (TileLegality).  A needed scalar that is None is rejected (ruling R8);
    ``omitted_ior_reads_zero=True`` instead reproduces the ASL, where an
    omitted B.IOR reads the zero GPR without a legality check.
    """
    acc_type = _check_acc(acc_type)
    check_fpatr(fpatr)
    check_acc_type(fpatr.pre_quant_mode, acc_type)
    check_rmode_sat(fpatr.pre_quant_mode, rmode, sat)
    p = _as_u32(p_raw, 2, "P")
    m_rows, n_cols = p.shape
    mode = prequant_mode(fpatr.pre_quant_mode)
    relu = fpatr.relu_mode
    slots, vectors = scalar_param_slots(fpatr), vector_param_sources(fpatr)

    quant_word = _resolve_scalar(quant_scalar, "quant" in slots, "quantization",
                                 lambda w: check_quant_word(mode.code, w),
                                 omitted_ior_reads_zero)
    alpha_word = _resolve_scalar(alpha_scalar, "alpha" in slots, "LReLU alpha",
                                 check_alpha_word, omitted_ior_reads_zero)
    qvec = avec = None
    for name, given in (("quant", quant_vector), ("alpha", alpha_vector)):
        if (name in vectors) != (given is not None):
            raise _legality(f"the {name} vector-parameter tile is "
                            f"{'missing' if given is None else 'not used by this B.FPATR'}")
    if quant_vector is not None:
        qvec = _vector_words(quant_vector, n_cols, "quantization vector")
        for w in np.unique(qvec):
            check_quant_word(mode.code, int(w))
    if alpha_vector is not None:
        avec = _vector_words(alpha_vector, n_cols, "PReLU vector")
        for w in np.unique(avec):
            check_alpha_word(int(w))
    seeded = fpatr.row_max_en and fpatr.row_max_init
    if seeded != (rowmax_in is not None):
        raise _legality("RowMaxIn is " + ("missing" if seeded else "supplied but not used"))

    rowmax = groupmax = None
    flags = 0
    if fpatr.row_max_en:
        rowmax, f = row_max(p, acc_type, fpatr.max_abs_en, rowmax_in)
        flags |= f
    if fpatr.group_max_en:
        groupmax, f = group_max(p, acc_type, group_n(fpatr.group_n_code), fpatr.max_abs_en)
        flags |= f

    # One parameter word per column, whatever the parameter's source.
    if mode.param is ParamKind.VECTOR:
        words = qvec
    elif mode.param is ParamKind.SCALAR:
        words = np.full(n_cols, quant_word, dtype=np.uint64)
    else:
        words = None
    out_type = d_dtype(mode.code, acc_type)
    if mode.code == 0 and relu == 0:
        d, d_flags = p.copy(), np.zeros(p.shape, dtype=np.uint8)
    elif mode.shift:
        # Shift modes return before activation: ReluMode has no effect.
        d, d_flags = shift_s32_to_s16(p.view(np.int32), quant_shift(words)[None, :])
    else:
        alpha = (fp19_value(avec & np.uint64(0x7FFFF)) if relu == 3
                 else np.full(n_cols, fp19_value(alpha_word) if relu == 2 else 0.0))
        d, d_flags = _convert(p, acc_type, mode, out_type, relu, words, alpha,
                              effective_rounding(mode.code, rmode), bool(sat))
    flags |= int(np.bitwise_or.reduce(d_flags, axis=None))
    return PostResult(d=d, d_dtype=out_type, rowmax=rowmax, groupmax=groupmax, flags=flags)


def _convert(p, acc_type, mode, out_type, relu, words, alpha, rounding, sat):
    """Per-element activation, special values, intermediate clamp, offset and encode."""
    n_cols = p.shape[1]
    source = acc_type if mode.source is None else mode.source
    is_float_out = out_type.num_class is NumClass.FLOAT
    scale = np.ones(n_cols) if words is None else quant_scale(words)
    offset = (np.zeros(n_cols, dtype=np.int64) if words is None
              else quant_offset(mode.code, words))

    zeros = np.zeros(p.shape, dtype=bool)
    special = neg_zero = zeros
    if source is DataType.FP32:
        exp = ((p >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)
        frac = (p & np.uint32(0x7FFFFF)).astype(np.int64)
        sign = (p >> np.uint32(31)) == 1
        nan = (exp == 255) & (frac != 0)
        inf = (exp == 255) & (frac == 0)
        negative = sign & ~nan                    # -normal, -subnormal, -inf and -0
        mag = np.ldexp(np.where(exp > 0, frac | (1 << 23), frac).astype(np.float64),
                       (np.maximum(exp, 1) - 150).astype(np.int32))
        x = np.where(exp == 255, 0.0, np.where(sign, -mag, mag))
        neg_zero = sign & (exp == 0) & (frac == 0)
    elif source is DataType.S32:
        x = p.view(np.int32).astype(np.float64)
        negative = x < 0
    else:
        x = p.astype(np.float64)
        negative = zeros

    # Activation chooses the multiplier before conversion: alpha replaces the
    # scale for negative inputs, it does not multiply it.
    if relu == 0:
        mult = np.broadcast_to(scale, p.shape)
    else:
        neg_mult = np.zeros(n_cols) if relu == 1 else alpha
        mult = np.where(negative, neg_mult[None, :], scale[None, :])
    if source is DataType.FP32:
        # -inf whose multiplier is 0 (ReLU, alpha +0, scale 0) is the finite value 0.
        special = (nan | inf) & ~(inf & sign & (mult == 0))
    activated = x * mult                           # exact in float64
    off = np.broadcast_to(offset[None, :], p.shape)

    if mode.offset_width:
        t, f1 = intermediate_round_clamp(activated, mode.offset_width, rounding)
        d, f2 = encode((t + off).astype(np.float64), out_type, rounding, sat)
        d_flags = f1 | f2
    else:
        d, d_flags = encode(activated + off, out_type, rounding, sat)

    if is_float_out:
        keep_sign = neg_zero & (mult != 0) & (off == 0)
        d = np.where(keep_sign, signed_zero(out_type), d).astype(d.dtype)
        d_flags = np.where(keep_sign, 0, d_flags).astype(np.uint8)
    if np.any(special):
        quiet = (frac & (1 << 22)) != 0
        for kind, where in ((Special.QNAN, nan & quiet), (Special.SNAN, nan & ~quiet),
                            (Special.POS_INF, inf & ~sign), (Special.NEG_INF, inf & sign)):
            where = where & special
            raw, f = encode_special(kind, out_type, sat)
            d = np.where(where, raw, d).astype(raw_dtype(out_type))
            d_flags = np.where(where, f, d_flags).astype(np.uint8)
    return d, d_flags
