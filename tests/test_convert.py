"""Destination encoders (model/convert.py): spec vectors and independent references.

The reference encoders below work on exact rationals (fractions.Fraction) and
are written from the spec's *rules* (digest §5.7/§5.8, hardware numeric
profile), not from the model's algorithm: they bracket the value between two
representable neighbours and pick one by the rounding mode's definition, and
the narrow floats use a literal scan over all 256 codes.  They live in
``encode_reference.py``, which test_postprocess.py shares.
"""

from fractions import Fraction as Q

import ml_dtypes
import numpy as np
import pytest

from ptocube.model.convert import (ENCODABLE_TYPES, RMode, Special, encode,
                                   encode_special, fp8_value_table, raw_dtype,
                                   resolve_rmode, round_integral, round_to_int, signed_zero)
from ptocube.model.datatype import DataType as T

from encode_reference import FP8, IEEE, MODES, NV, NX, OF, UF, ref_encode, ref_round


def check_against_ref(values, dtype, mode, sat):
    raw, flags = encode(np.asarray(values, dtype=np.float64), dtype, mode, sat)
    assert raw.dtype == raw_dtype(dtype)
    for v, r, f in zip(values, raw.tolist(), flags.tolist()):
        exp_raw, exp_flags = ref_encode(Q(float(v)), dtype, mode, sat)
        assert (r, f) == (exp_raw, exp_flags), (dtype.name, mode.name, sat, float(v).hex())


def random_values(rng, n, lo_exp, hi_exp, mant_bits=35):
    """Exact float64 values with up to ``mant_bits`` significant bits, random signs."""
    mant = rng.integers(1 << (mant_bits - 1), 1 << mant_bits, size=n).astype(np.float64)
    exps = rng.integers(lo_exp, hi_exp + 1, size=n) - mant_bits
    signs = rng.choice([-1.0, 1.0], size=n)
    return signs * np.ldexp(mant, exps)


# --- hardware numeric vectors (pto-isa-0583-hardware-numeric-vectors.json) ----

ROUNDING_VECTORS = [  # group "rounding", destination S32
    ("RNE", 2.5, 2), ("RNE", 3.5, 4), ("RTZ", -1.9, -1), ("RDN", -1.1, -2), ("RUP", 1.1, 2),
    ("RNA", 2.1, 2), ("RNA", -2.1, -2), ("RNA", 2.5, 3), ("RNA", -2.5, -3),
    ("RTO", 2.0, 2), ("RTO", 2.25, 3), ("RTO", -2.25, -3), ("RHB", 2.5, 3), ("RHB", -2.5, -2),
]


@pytest.mark.parametrize("mode,value,expected", ROUNDING_VECTORS)
def test_hw_rounding_vectors(mode, value, expected):
    assert round_to_int([value], RMode[mode]).tolist() == [expected]
    raw, flags = encode([value], T.S32, RMode[mode], sat=0)
    assert int(raw[0]) == expected & 0xFFFFFFFF
    assert int(flags[0]) == (0 if value == expected else NX)


@pytest.mark.parametrize("value,rounded,expected", [(127.5, 128, 127), (-128.5, -129, -128)])
def test_hw_rounding_before_saturation(value, rounded, expected):
    # S8, RNA, Sat 1: round first, then clamp.
    assert round_to_int([value], RMode.RNA).tolist() == [rounded]
    raw, flags = encode([value], T.S8, RMode.RNA, sat=1)
    assert (int(raw[0]), int(flags[0])) == (expected & 0xFF, OF | NX)


def test_hw_saturation_vectors():
    assert encode([130.0], T.S8, RMode.NONE, 1)[0].tolist() == [127]
    assert encode([-129.0], T.S8, RMode.NONE, 1)[0].tolist() == [0x80]
    assert encode([-1.0], T.U8, RMode.NONE, 1)[0].tolist() == [0]
    assert encode_special(Special.POS_INF, T.FP16, sat=1) == (0x7BFF, OF | NX)
    assert encode_special(Special.QNAN, T.S32, sat=1) == (0, NV)


@pytest.mark.parametrize("dtype,kind,expected", [
    (T.S64, Special.QNAN, 0x8000000000000000), (T.S32, Special.POS_INF, 0x80000000),
    (T.S4X2, Special.QNAN, 0x8), (T.U64, Special.QNAN, 0xFFFFFFFFFFFFFFFF),
    (T.U8, Special.NEG_INF, 0xFF), (T.U4X2, Special.QNAN, 0xF),
])
def test_hw_invalid_float_to_integer(dtype, kind, expected):
    # Sat 0: signed destinations give their minimum, unsigned their maximum.
    assert encode_special(kind, dtype, sat=0) == (expected, NV)


@pytest.mark.parametrize("dtype,raw,value", [
    (T.HiF8, 0x00, 0.0), (T.HiF8, 0x01, 2.0 ** -22), (T.HiF8, 0x07, 2.0 ** -16),
    (T.HiF8, 0x08, 1.0), (T.HiF8, 0x6E, 32768.0),
    (T.E4M3, 0x01, 2.0 ** -9), (T.E4M3, 0x7E, 448.0),
])
def test_hw_low_precision_encoding_finite(dtype, raw, value):
    assert fp8_value_table(dtype)[raw] == value
    for mode in MODES:
        assert encode([value], dtype, mode, 0)[0].tolist() == [raw]
        assert encode([value], dtype, mode, 0)[1].tolist() == [0]


def test_hw_low_precision_encoding_specials():
    assert encode_special(Special.POS_INF, T.HiF8, 0) == (0x6F, 0)
    assert encode_special(Special.NEG_INF, T.HiF8, 0) == (0xEF, 0)
    assert encode_special(Special.QNAN, T.HiF8, 0) == (0x80, 0)
    assert encode_special(Special.QNAN, T.E4M3, 0) == (0x7F, 0)
    table = fp8_value_table(T.HiF8)
    assert np.isnan(table[0x80]) and table[0x6F] == np.inf and table[0xEF] == -np.inf
    assert np.isnan(fp8_value_table(T.E4M3)[0x7F])


@pytest.mark.parametrize("dtype,expected", [
    (T.FP32, 0x7FC00000), (T.FP16, 0x7E00), (T.BF16, 0x7FC0), (T.HiF8, 0x80), (T.E4M3, 0x7F)])
def test_hw_canonical_nan(dtype, expected):
    assert encode_special(Special.QNAN, dtype, 0) == (expected, 0)
    assert encode_special(Special.SNAN, dtype, 0) == (expected, NV)


def test_hw_signed_zero_exact_cancellation():
    # (+1) + (-1) under RNE is an exact real 0, which encodes as +0.
    assert encode([1.0 + -1.0], T.FP32, RMode.RNE, 0)[0].tolist() == [0]


# --- the spec's own ASL tests (arch-exec-matrix-quantization-001) ---------------

def test_asl_matrix_quantization_helpers():
    raw, flags = encode([130.0], T.S8, RMode.NONE, 0)
    assert (raw.tolist(), flags.tolist()) == ([0x82], [OF | NX])
    for dtype, expected in ((T.FP16, 0x3E00), (T.E4M3, 0x3C), (T.HiF8, 0x0C)):
        raw, flags = encode([1.5], dtype, RMode.NONE, 0)
        assert (raw.tolist(), flags.tolist()) == ([expected], [0])
    raw, flags = encode([-1.00390625], T.BF16, RMode.RHB, 0)
    assert (raw.tolist(), flags.tolist()) == ([0xBF80], [NX])


# --- rounding -----------------------------------------------------------------

def test_resolve_rmode_default_is_rne():
    assert resolve_rmode(0) is RMode.RNE
    assert [resolve_rmode(c) for c in range(1, 8)] == MODES
    assert RMode.RTM is RMode.RDN and RMode.RTP is RMode.RUP
    with pytest.raises(ValueError):
        resolve_rmode(8)


def test_round_to_int_every_mode_vs_fractions():
    rng = np.random.default_rng(1)
    ties = np.arange(-40, 41) / 4.0                        # every quarter: ties and non-ties
    odd = np.array([2.0 ** 52 + 1, -(2.0 ** 52) - 1, 2.0 ** 60, 0.5 - 2 ** -54, -0.0])
    values = np.concatenate([ties, odd, random_values(rng, 400, -8, 40, 53)])
    for mode in MODES:
        got = round_integral(values, mode)
        for v, g in zip(values, got):
            assert g == ref_round(Q(float(v)), mode), (mode.name, float(v).hex())
        small = np.abs(values) < 2.0 ** 62
        assert round_to_int(values[small], mode).tolist() == [int(g) for g in got[small]]


def test_round_to_int_rejects_bad_input():
    with pytest.raises(ValueError):
        round_to_int([np.nan], RMode.RNE)
    with pytest.raises(ValueError):
        round_to_int([2.0 ** 63], RMode.RNE)
    with pytest.raises(ValueError):
        encode([np.inf], T.FP16, RMode.RNE, 0)
    with pytest.raises(ValueError):
        encode([1.0], T.E5M2, RMode.RNE, 0)


# --- differential checks against numpy / ml_dtypes ---------------------------------

def _ieee_sample(rng, dtype):
    p, emin, emax, _ = IEEE[dtype]
    vals = [random_values(rng, 1500, emin - p - 2, emax + 2, 35),
            random_values(rng, 300, emin - p - 2, emin + 1, 35)]     # subnormal range
    # Exact midpoints between neighbours, and values one unit of 2^-40 off them.
    mids = random_values(rng, 300, emin, emax, p + 2)
    vals += [mids, mids * (1 + 2.0 ** -40), mids * (1 - 2.0 ** -40)]
    return np.concatenate(vals)


def test_ml_dtypes_rounds_float64_once():
    # The differential tests below rely on single rounding from float64: this
    # value is just above a bfloat16/E4M3 midpoint, and a float32 detour would
    # turn it into an exact tie that rounds down.
    assert np.array([1 + 2 ** -8 + 2 ** -40]).astype(ml_dtypes.bfloat16).view(np.uint16)[0] == 0x3F81
    assert np.array([1 + 2 ** -4 + 2 ** -40]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0] == 0x39
    assert np.array([1 + 2 ** -11 + 2 ** -40]).astype(np.float16).view(np.uint16)[0] == 0x3C01


@pytest.mark.parametrize("dtype,np_type", [(T.FP32, np.float32), (T.FP16, np.float16),
                                           (T.BF16, ml_dtypes.bfloat16)])
def test_ieee_rne_matches_numpy_casts(dtype, np_type):
    rng = np.random.default_rng(2)
    values = _ieee_sample(rng, dtype)
    raw, flags = encode(values, dtype, RMode.RNE, 0)
    with np.errstate(over="ignore"):                      # overflow to inf is part of the check
        expected = values.astype(np_type).view(raw.dtype)
    np.testing.assert_array_equal(raw, expected)
    back = expected.view(np_type).astype(np.float64)
    finite = np.isfinite(back)
    # NX exactly when the value changed; OF exactly when it overflowed to inf.
    np.testing.assert_array_equal((flags & NX) != 0, ~finite | (back != values))
    np.testing.assert_array_equal((flags & OF) != 0, ~finite)


def test_e4m3_rne_matches_ml_dtypes_in_range():
    rng = np.random.default_rng(3)
    values = np.concatenate([random_values(rng, 3000, -14, 9, 30), np.arange(-448, 449) / 8.0])
    values = values[np.abs(values) <= 448]
    raw, _ = encode(values, T.E4M3, RMode.RNE, 0)
    expected = values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    # The spec's search has one zero: negatives that round to zero give +0, not -0.
    expected = np.where(expected == 0x80, 0x00, expected)
    np.testing.assert_array_equal(raw, expected)


# --- differential checks against the exact reference ----------------------------------

@pytest.mark.parametrize("dtype", [T.FP32, T.FP16, T.BF16])
def test_ieee_every_mode_and_sat_vs_reference(dtype):
    rng = np.random.default_rng(4)
    values = _ieee_sample(rng, dtype)[::8]
    p, emin, emax, _ = IEEE[dtype]
    edges = [2.0 ** (emax + 1) * (1 - 2.0 ** -(p + 3)), 2.0 ** (emax + 1), 2.0 ** emin,
             2.0 ** emin * (1 - 2.0 ** -(p + 2)), 2.0 ** (emin - p - 1), 2.0 ** (emin - p - 2),
             1.5 * 2.0 ** (emin - p), 0.0]
    values = np.concatenate([values, edges, [-e for e in edges]])
    for mode in MODES:
        for sat in (0, 1):
            check_against_ref(values, dtype, mode, sat)


@pytest.mark.parametrize("dtype", [T.E4M3, T.HiF8])
def test_fp8_every_mode_and_sat_vs_code_search(dtype):
    rng = np.random.default_rng(5)
    table = fp8_value_table(dtype)
    finite = table[np.isfinite(table)]
    pos = np.unique(np.abs(finite))
    mids = (pos[1:] + pos[:-1]) / 2                           # ties between neighbours
    top = 448.0 if dtype is T.E4M3 else 32768.0
    values = np.concatenate([
        random_values(rng, 60, -26 if dtype is T.HiF8 else -12, 16, 20),
        rng.choice(mids, 40), -rng.choice(mids, 20), rng.choice(finite, 10),
        [top, top * (1 + 2 ** -20), 2.0 ** -30, -2.0 ** -30, 2.0 ** -23, -(2.0 ** -10)]])
    for mode in MODES:
        for sat in (0, 1):
            check_against_ref(values, dtype, mode, sat)


def test_fp8_tables_match_independent_decoders():
    for dtype in (T.E4M3, T.HiF8):
        ref = FP8[dtype][0]
        table = fp8_value_table(dtype)
        for code in range(256):
            if isinstance(ref[code], Q):
                assert Q(float(table[code])) == ref[code], (dtype.name, hex(code))
            else:
                assert not np.isfinite(table[code]), (dtype.name, hex(code))


@pytest.mark.parametrize("dtype", [T.S4X2, T.S8, T.S16, T.S32, T.U32, T.U8, T.S64, T.U64])
def test_integer_every_mode_and_sat_vs_reference(dtype):
    rng = np.random.default_rng(6)
    top = dtype.bits + 2
    values = np.concatenate([random_values(rng, 120, -2, top, 40),
                             random_values(rng, 40, top, 80, 20),     # wrapping overflow
                             np.arange(-20, 21) / 2.0])
    for mode in MODES:
        for sat in (0, 1):
            check_against_ref(values, dtype, mode, sat)


def test_every_destination_type_is_covered():
    tested = {T.FP32, T.FP16, T.BF16, T.E4M3, T.HiF8, T.S4X2, T.S8, T.S16, T.S32, T.U32,
              T.U8, T.S64, T.U64}
    assert tested <= ENCODABLE_TYPES


# --- the special-value table (digest §5.8) ------------------------------------------

@pytest.mark.parametrize("dtype", [T.S8, T.S16, T.S4X2])
def test_special_values_integer(dtype):
    lo, hi = 1 << (dtype.bits - 1), (1 << (dtype.bits - 1)) - 1
    assert encode_special(Special.QNAN, dtype, 0) == (lo, NV)
    assert encode_special(Special.SNAN, dtype, 0) == (lo, NV)
    assert encode_special(Special.QNAN, dtype, 1) == (0, NV)
    assert encode_special(Special.POS_INF, dtype, 0) == (lo, NV)
    assert encode_special(Special.NEG_INF, dtype, 0) == (lo, NV)
    assert encode_special(Special.POS_INF, dtype, 1) == (hi, OF | NX)
    assert encode_special(Special.NEG_INF, dtype, 1) == (lo, OF | NX)


@pytest.mark.parametrize("dtype,pinf,ninf,pmax,nmax,negzero", [
    (T.FP32, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000),
    (T.FP16, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x8000),
    (T.BF16, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x8000),
    (T.HiF8, 0x6F, 0xEF, 0x6E, 0xEE, 0x00),
    (T.E4M3, 0x7F, 0x7F, 0x7E, 0xFE, 0x80),
])
def test_special_values_float(dtype, pinf, ninf, pmax, nmax, negzero):
    no_inf_flags = OF | NX if dtype is T.E4M3 else 0     # E4M3 has no infinity: NaN, OF|NX
    assert encode_special(Special.POS_INF, dtype, 0) == (pinf, no_inf_flags)
    assert encode_special(Special.NEG_INF, dtype, 0) == (ninf, no_inf_flags)
    assert encode_special(Special.POS_INF, dtype, 1) == (pmax, OF | NX)
    assert encode_special(Special.NEG_INF, dtype, 1) == (nmax, OF | NX)
    assert encode_special(Special.QNAN, dtype, 1) == (0, 0)
    assert encode_special(Special.SNAN, dtype, 1) == (0, NV)
    assert signed_zero(dtype) == negzero


def test_narrow_float_overflow_is_not_ieee():
    # 449 overflows E4M3 before rounding, even though RNE would give 448.
    raw, flags = encode([449.0, -449.0, 448.0], T.E4M3, RMode.RNE, 0)
    assert raw.tolist() == [0x7F, 0x7F, 0x7E] and flags.tolist() == [OF | NX, OF | NX, 0]
    raw, flags = encode([32769.0, -32769.0], T.HiF8, RMode.RHB, 0)
    assert raw.tolist() == [0x6F, 0xEF] and flags.tolist() == [OF | NX] * 2
    raw, _ = encode([449.0, -32769.0], T.E4M3, RMode.RTZ, 1)
    assert raw.tolist() == [0x7E, 0xFE]
    # IEEE destinations overflow to infinity even under RTZ / RDN.
    raw, flags = encode([2.0 ** 16, -(2.0 ** 16)], T.FP16, RMode.RTZ, 0)
    assert raw.tolist() == [0x7C00, 0xFC00] and flags.tolist() == [OF | NX] * 2


def test_tiny_negative_rounds_to_positive_zero():
    for dtype in (T.E4M3, T.HiF8):
        raw, flags = encode([-(2.0 ** -40)], dtype, RMode.RNE, 0)
        assert raw.tolist() == [0x00] and flags.tolist() == [UF | NX]
    # IEEE formats keep the sign of an underflowed result.
    raw, flags = encode([-(2.0 ** -40)], T.FP16, RMode.RNE, 0)
    assert raw.tolist() == [0x8000] and flags.tolist() == [UF | NX]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [T.FP32, T.FP16, T.BF16, T.E4M3, T.HiF8, T.S4X2, T.S8,
                                   T.S16, T.S32, T.U32])
def test_every_mode_large_sweep(dtype):
    rng = np.random.default_rng(100 + int(dtype))
    if dtype in IEEE:
        values = _ieee_sample(rng, dtype)
    elif dtype in FP8:
        values = random_values(rng, 2000, -26, 17, 24)
    else:
        values = random_values(rng, 2000, -2, dtype.bits + 4, 40)
    for mode in MODES:
        for sat in (0, 1):
            check_against_ref(values, dtype, mode, sat)
