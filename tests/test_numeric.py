"""The numeric core: element decoding, exact FP32 FMA chains, integer and pto-v0 products.

Decoders are checked code by code against the independent formulas of
``exact_reference`` and against the specification's listed check values; the
arithmetic is checked against the exact (Fraction) reference on seeded random
inputs that lean on subnormals, overflow, NaN, infinities, signed zeros and
cancellation.  The slow sweeps run under ``make regress``.
"""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import exact_reference as ref
from ptocube.model.datatype import DataType as D
from ptocube.model.numeric import (
    CANONICAL_NAN_F32, add_bias_f32, add_bias_int, add_bias_pto_v0, bits_to_f32,
    canonical_nan, decode, encode_exact, f32_to_bits, fma_f32, matmul_float, matmul_int,
    matmul_pto_v0, pack_nibbles, pto_v0_carrier, unpack_nibbles)

FLOAT_INPUTS = [D.FP32, D.TF32, D.HF32, D.FP16, D.BF16, D.HiF8, D.E4M3, D.E5M2,
                D.E3M2, D.E2M3, D.E2M1X2, D.E1M2X2]
MX_SIDES = [D.FP16, D.BF16, D.E4M3, D.E5M2, D.E2M1X2, D.E1M2X2]
MX_SCALED = {D.E4M3, D.E5M2, D.E2M1X2, D.E1M2X2}
SMALL_FLOATS = [D.HiF8, D.E4M3, D.E5M2, D.E3M2, D.E2M3, D.E2M1X2, D.E1M2X2, D.HiF4X2, D.E8M0]
INTEGERS = [D.S64, D.S32, D.S16, D.S8, D.S4X2, D.U64, D.U32, D.U16, D.U8, D.U4X2]


def same_value(got: float, want: ref.Val) -> bool:
    """A decoded float64 equals an exact reference value, sign of zero included."""
    if want.kind == "nan":
        return math.isnan(got)
    if want.kind == "inf":
        return got == (-math.inf if want.neg else math.inf)
    return Fraction(got) == want.signed and math.copysign(1.0, got) == (-1.0 if want.neg else 1.0)


def assert_decodes_like_reference(dtype, codes):
    got = decode(dtype, np.asarray(codes, dtype=np.uint64))
    for code, value in zip(codes, got.tolist()):
        want = ref.ref_decode(dtype, int(code))
        assert same_value(value, want), f"{dtype.name} 0x{int(code):X}: {value} != {want}"


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", SMALL_FLOATS, ids=lambda t: t.name)
def test_every_code_of_small_floats_matches_the_formula(dtype):
    assert_decodes_like_reference(dtype, range(1 << dtype.bits))


def ieee_formula(codes, ebits, mbits, bias):
    """Vectorised IEEE-style field formula (every step exact in float64)."""
    sign = np.where(codes >> (ebits + mbits) & 1, -1.0, 1.0)
    e = codes >> mbits & ((1 << ebits) - 1)
    f = (codes & ((1 << mbits) - 1)).astype(np.float64)
    top = (1 << ebits) - 1
    finite = np.where(e == 0, np.ldexp(f, 1 - bias - mbits),
                      np.ldexp(f + (1 << mbits), e - bias - mbits))
    special = np.where(f == 0, np.inf, np.nan)
    return sign * np.where(e == top, special, finite)


def assert_same_values(got, want):
    same = (got == want) & (np.signbit(got) == np.signbit(want))
    same |= np.isnan(got) & np.isnan(want)
    assert same.all(), f"first mismatch at code 0x{int(np.argmin(same)):X}"


FIELDS_16 = {D.FP16: (5, 10, 15), D.BF16: (8, 7, 127)}


@pytest.mark.parametrize("dtype", [D.FP16, D.BF16], ids=lambda t: t.name)
def test_every_code_of_16_bit_floats_matches_the_formula(dtype):
    codes = np.arange(1 << 16)
    assert_same_values(decode(dtype, codes), ieee_formula(codes, *FIELDS_16[dtype]))
    # Spot-check the vectorised formula itself against the exact reference.
    assert_decodes_like_reference(dtype, range(0, 1 << 16, 97))


@pytest.mark.parametrize("dtype", [D.FP32, D.TF32, D.HF32, D.FP64], ids=lambda t: t.name)
def test_wide_floats_match_the_formula(dtype):
    rng = np.random.default_rng(1)
    bits = dtype.bits
    codes = [int(c) for c in rng.integers(0, 1 << 62, 3000, dtype=np.uint64)]
    codes = [c % (1 << bits) for c in codes]
    exp_shift = 23 if bits == 32 else 52
    top = 0xFF if bits == 32 else 0x7FF
    for sign in (0, 1):                               # zeros, subnormals, extremes, specials
        for exponent in (0, 1, top - 1, top):
            for fraction in (0, 1, 2, 0x1000, 0x2000, (1 << exp_shift) - 1):
                codes.append(sign << (bits - 1) | exponent << exp_shift | fraction)
    assert_decodes_like_reference(dtype, codes)


def test_ml_dtypes_bfloat16_matches_the_spec_format_bit_for_bit():
    codes = np.arange(1 << 16)
    with np.errstate(invalid="ignore"):                  # signalling NaNs
        values = codes.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    assert_same_values(values, ieee_formula(codes, *FIELDS_16[D.BF16]))


@pytest.mark.parametrize("dtype,ml_type,codes", [
    (D.E4M3, ml_dtypes.float8_e4m3fn, 256),
    (D.E5M2, ml_dtypes.float8_e5m2, 256), (D.E3M2, ml_dtypes.float6_e3m2fn, 64),
    (D.E2M3, ml_dtypes.float6_e2m3fn, 64), (D.E2M1X2, ml_dtypes.float4_e2m1fn, 16),
    (D.E8M0, ml_dtypes.float8_e8m0fnu, 256),
], ids=lambda x: getattr(x, "name", None) or str(x))
def test_ml_dtypes_matches_the_spec_formats_bit_for_bit(dtype, ml_type, codes):
    # The decoder relies on these ml_dtypes types; confirm each against the formula.
    values = np.arange(codes, dtype=np.uint8).view(ml_type).astype(np.float64)
    for code, value in enumerate(values.tolist()):
        assert same_value(value, ref.ref_decode(dtype, code)), f"{dtype.name} 0x{code:X}"


# Check values listed by the hardware numeric vectors (low_precision_encoding).
@pytest.mark.parametrize("dtype,raw,value", [
    (D.HiF8, 0x00, 0.0), (D.HiF8, 0x01, 2.0 ** -22), (D.HiF8, 0x07, 2.0 ** -16),
    (D.HiF8, 0x08, 1.0), (D.HiF8, 0x6E, 32768.0), (D.HiF8, 0x6F, math.inf),
    (D.HiF8, 0x80, math.nan), (D.HiF8, 0xEF, -math.inf),
    (D.E4M3, 0x01, 2.0 ** -9), (D.E4M3, 0x7E, 448.0), (D.E4M3, 0x7F, math.nan),
    (D.E5M2, 0x01, 2.0 ** -16), (D.E5M2, 0x7B, 57344.0), (D.E5M2, 0x7C, math.inf),
    (D.E5M2, 0x7E, math.nan),
    (D.E3M2, 0x01, 0.0625), (D.E3M2, 0x1F, 28.0), (D.E2M3, 0x01, 0.125), (D.E2M3, 0x1F, 7.5),
    (D.E8M0, 0x00, 2.0 ** -127), (D.E8M0, 0x7F, 1.0), (D.E8M0, 0x80, 2.0),
    (D.E8M0, 0xFE, 2.0 ** 127), (D.E8M0, 0xFF, math.nan),
    # Further table values of spec-cube-semantics §1.2.
    (D.FP16, 0x7BFF, 65504.0), (D.BF16, 0x7F7F, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
    (D.TF32, 0x7F7FE000, float(np.uint32(0x7F7FE000).view(np.float32))),
    (D.HiF8, 0x0C, 1.5),
])
def test_spec_check_values(dtype, raw, value):
    got = float(decode(dtype, np.array([raw]))[0])
    assert got == value or (math.isnan(value) and math.isnan(got))


@pytest.mark.parametrize("dtype,lanes", [
    (D.E2M1X2, [0.5, -0.5]), (D.E1M2X2, [0.25, -0.25]), (D.HiF4X2, [0.25, -0.25]),
])
def test_packed_byte_0x91_low_nibble_is_the_even_lane(dtype, lanes):
    assert decode(dtype, unpack_nibbles(np.array([0x91], np.uint8), 2)).tolist() == lanes


def test_lane_tables_of_the_profile():
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6]
    e1m2 = [0, .25, .5, .75, 1, 1.25, 1.5, 1.75]
    assert decode(D.E2M1X2, np.arange(16)).tolist() == e2m1 + [-v for v in e2m1]
    assert decode(D.E1M2X2, np.arange(16)).tolist() == e1m2 + [-v for v in e1m2]
    assert math.copysign(1, decode(D.E2M1X2, np.array([8]))[0]) == -1      # 0x8 is -0


def test_must_be_zero_carrier_bits_are_ignored():
    # R10: TF32/HF32 drop their low fraction bits, E3M2/E2M3 their bits 7:6.
    assert decode(D.TF32, np.array([0x3F801FFF]))[0] == 1.0
    assert decode(D.HF32, np.array([0x3F801FFF]))[0] == 1.0 + 2.0 ** -11
    assert decode(D.E3M2, np.array([0xC1]))[0] == 0.0625
    assert decode(D.E2M3, np.array([0x5F]))[0] == 7.5


@pytest.mark.parametrize("dtype", [D.S8, D.U8, D.S4X2, D.U4X2], ids=lambda t: t.name)
def test_every_code_of_small_integers(dtype):
    codes = np.arange(1 << dtype.bits)
    got = decode(dtype, codes)
    assert got.dtype == np.int64
    assert got.tolist() == [ref.ref_int_decode(dtype, int(c)) for c in codes]


@pytest.mark.parametrize("dtype", [D.S16, D.U16, D.S32, D.U32, D.S64, D.U64],
                         ids=lambda t: t.name)
def test_wide_integers(dtype):
    rng = np.random.default_rng(2)
    top = (1 << dtype.bits) - 1
    codes = [0, 1, top, top >> 1, (top >> 1) + 1] + \
        [int(c) & top for c in rng.integers(0, 1 << 63, 500, dtype=np.uint64)]
    got = decode(dtype, np.array(codes, dtype=np.uint64))
    assert got.dtype == (np.uint64 if dtype is D.U64 else np.int64)
    assert [int(v) for v in got] == [ref.ref_int_decode(dtype, c) for c in codes]


@pytest.mark.parametrize("dtype,raw", [(D.E4M3, 256), (D.E2M1X2, 16), (D.FP16, -1),
                                       (D.S4X2, 0x10), (D.FP32, 1 << 32)])
def test_decode_rejects_out_of_range_patterns(dtype, raw):
    with pytest.raises(ValueError, match=dtype.name):
        decode(dtype, np.array([0, raw], dtype=np.int64))


def test_decode_rejects_non_integer_patterns_and_bad_codes():
    with pytest.raises(ValueError, match="integers"):
        decode(D.FP16, np.array([1.0]))
    with pytest.raises(ValueError, match="DataType"):
        decode(15, np.array([0]))


# ---------------------------------------------------------------------------
# Encoding and canonical NaNs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", SMALL_FLOATS + [D.FP16, D.BF16], ids=lambda t: t.name)
def test_encode_exact_round_trips_every_code(dtype):
    codes = np.arange(64 if dtype in (D.E3M2, D.E2M3) else 1 << dtype.bits)
    values = decode(dtype, codes)
    nan = np.isnan(values)
    back = encode_exact(dtype, values)
    assert (back[~nan] == codes[~nan]).all()
    if nan.any():
        assert (back[nan] == canonical_nan(dtype)).all()


@pytest.mark.parametrize("dtype", [D.FP32, D.TF32, D.HF32, D.FP64], ids=lambda t: t.name)
def test_encode_exact_round_trips_wide_floats(dtype):
    rng = np.random.default_rng(3)
    mask = {D.FP32: 0xFFFFFFFF, D.TF32: 0xFFFFE000, D.HF32: 0xFFFFF000,
            D.FP64: (1 << 64) - 1}[dtype]
    codes = rng.integers(0, 1 << 63, 2000, dtype=np.uint64) * np.uint64(2) & np.uint64(mask)
    if dtype.bits == 32:
        codes = codes.astype(np.uint32)
    values = decode(dtype, codes)
    nan = np.isnan(values)
    back = encode_exact(dtype, values)
    assert (back[~nan] == codes[~nan]).all()
    assert (back[nan] == canonical_nan(dtype)).all()


def test_encode_exact_keeps_signed_zero_and_maps_nan_to_canonical():
    assert encode_exact(D.FP16, [-0.0, math.nan, -math.inf]).tolist() == [0x8000, 0x7E00, 0xFC00]
    assert encode_exact(D.E2M1X2, [-0.0, 6.0]).tolist() == [0x8, 0x7]
    assert encode_exact(D.HiF8, [-0.0]).tolist() == [0x00]
    assert encode_exact(D.E4M3, [math.nan, -448.0]).tolist() == [0x7F, 0xFE]
    assert encode_exact(D.E8M0, [2.0 ** -127, 1.0]).tolist() == [0x00, 0x7F]
    assert encode_exact(D.FP32, [Fraction(3, 4), 1 << 100]).tolist() == [0x3F400000, 0x71800000]


@pytest.mark.parametrize("dtype,values,bad", [
    (D.FP16, [1.0, 0.1], "0.1"), (D.FP32, [2 ** 60 + 1], str(2 ** 60 + 1)),
    (D.E4M3, [math.inf], "inf"), (D.E3M2, [math.nan], "nan"), (D.E8M0, [0.0], "0.0"),
    (D.E8M0, [-1.0], "-1.0"), (D.TF32, [1.0 + 2.0 ** -23], "1.0000001"),
    (D.E2M1X2, [5.0], "5.0"), (D.FP32, [Fraction(1, 3)], "Fraction"),
    (D.S8, [127, 128], "128"), (D.U16, [-1], "-1"), (D.S4X2, [7.5], "7.5"),
    (D.U64, [1 << 64], str(1 << 64)), (D.FP16, ["1.0"], "'1.0'"),
])
def test_encode_exact_names_the_first_unrepresentable_value(dtype, values, bad):
    with pytest.raises(ValueError, match=f"{bad}.*{dtype.name}"):
        encode_exact(dtype, values)


def test_encode_exact_integers():
    assert encode_exact(D.S8, [-128, -1, 127]).tolist() == [0x80, 0xFF, 0x7F]
    assert encode_exact(D.S4X2, [-8, -1, 7.0]).tolist() == [0x8, 0xF, 0x7]
    assert encode_exact(D.U64, [(1 << 64) - 1]).tolist() == [(1 << 64) - 1]
    assert encode_exact(D.S64, [-(1 << 63)]).tolist() == [1 << 63]
    codes = np.arange(1 << 16)
    assert (encode_exact(D.S16, decode(D.S16, codes)) == codes).all()


@pytest.mark.parametrize("dtype,bits", [
    (D.FP64, 0x7FF8000000000000), (D.FP32, 0x7FC00000), (D.TF32, 0x7FC00000),
    (D.HF32, 0x7FC00000), (D.FP16, 0x7E00), (D.BF16, 0x7FC0), (D.HiF8, 0x80),
    (D.E4M3, 0x7F), (D.E5M2, 0x7E), (D.E8M0, 0xFF),
])
def test_canonical_nan_vectors(dtype, bits):
    assert canonical_nan(dtype) == bits
    assert math.isnan(decode(dtype, np.array([bits], dtype=np.uint64))[0])


@pytest.mark.parametrize("dtype", [D.E3M2, D.E2M3, D.E2M1X2, D.E1M2X2, D.HiF4X2, D.S8, D.U32])
def test_types_without_nan_have_no_canonical_nan(dtype):
    with pytest.raises(ValueError, match="no NaN"):
        canonical_nan(dtype)


def test_nibble_packing():
    assert unpack_nibbles(np.array([0x91, 0x0F], np.uint8), 3).tolist() == [1, 9, 0xF]
    assert pack_nibbles([1, 9, 0xF]).tolist() == [0x91, 0x0F]   # odd: high nibble zero
    with pytest.raises(ValueError):
        pack_nibbles([16])
    with pytest.raises(ValueError):
        unpack_nibbles(np.array([0], np.uint8), 3)


# ---------------------------------------------------------------------------
# FP32 bit conversion and the single FMA step
# ---------------------------------------------------------------------------

def test_f32_bits_canonicalise_every_nan():
    raw = np.array([0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x3F800000, 0x80000000],
                   dtype=np.uint32)
    assert f32_to_bits(bits_to_f32(raw)).tolist() == [CANONICAL_NAN_F32] * 4 + [0x3F800000,
                                                                                 0x80000000]


def test_fma_single_rounding_where_float64_rounds_twice():
    # 1 + 2^-24 + 2^-57: float64 drops 2^-57 and lands on the FP32 midpoint, whose
    # tie-to-even would give 1.0; the exact sum lies above it.
    prod = 2.0 ** -24 + 2.0 ** -57
    assert np.float32(np.float64(1.0) + prod) == np.float32(1.0)
    assert fma_f32(np.float32(1.0), prod) == np.float32(1.0 + 2.0 ** -23)
    assert fma_f32(np.float32(1.0), -(2.0 ** -25 + 2.0 ** -60)) == np.float32(1.0 - 2.0 ** -24)


F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("acc,prod,want", [
    (0.0, -0.0, 0x00000000), (-0.0, -0.0, 0x80000000), (-0.0, 0.0, 0x00000000),
    (1.0, -1.0, 0x00000000),                                    # exact cancellation: +0
    (-0.0, 2.0, 0x40000000),
    (math.inf, -math.inf, CANONICAL_NAN_F32), (math.inf, 1e300, 0x7F800000),
    (-math.inf, -math.inf, 0xFF800000), (math.nan, 1.0, CANONICAL_NAN_F32),
    (1.0, math.nan, CANONICAL_NAN_F32), (0.0, math.inf * 0.0, CANONICAL_NAN_F32),
    (F32_MAX, 2.0 ** 103, 0x7F800000),                          # tie at the overflow edge
    (F32_MAX, 2.0 ** 103 - 2.0 ** 60, 0x7F7FFFFF),
    (-F32_MAX, -(2.0 ** 104), 0xFF800000),
    (2.0 ** -149, -(2.0 ** -150), 0x00000000),                  # tie to the even zero
    (2.0 ** -149, 2.0 ** -150, 0x00000002),                     # tie to even 2 * 2^-149
    (0.0, 2.0 ** -151, 0x00000000), (-0.0, -(2.0 ** -150 + 2.0 ** -200), 0x80000001),
    (2.0 ** -126, -(2.0 ** -149), 0x007FFFFF),                  # gradual underflow
    (0.0, 2.0 ** -149, 0x00000001), (1.0, 1e308, 0x7F800000),
])
def test_fma_special_values(acc, prod, want):
    got = f32_to_bits(fma_f32(np.float32(acc), prod))
    assert int(got) == want, f"{acc} + {prod}: 0x{int(got):08X} != 0x{want:08X}"


def random_f32_bits(rng, size, spice=0.3):
    """FP32 patterns leaning on zeros, subnormals, extremes, infinities and NaN."""
    bits = rng.integers(0, 1 << 32, size, dtype=np.uint64).astype(np.uint32)
    exponent = rng.choice(np.array([0, 0, 1, 2, 100, 126, 127, 128, 150, 253, 254, 255]),
                          size).astype(np.uint32)
    spicy = rng.random(size) < spice
    bits[spicy] = (bits[spicy] & np.uint32(0x807FFFFF)) | (exponent[spicy] << np.uint32(23))
    # Sparse significands (one or two fraction bits) make products whose sums land
    # exactly on FP32 midpoints with a tail far below: the double-rounding trap.
    sparse = rng.random(size) < 0.3
    one_bit = np.uint32(1) << rng.integers(0, 23, size).astype(np.uint32)
    two_bit = np.where(rng.random(size) < 0.5, np.uint32(1) << rng.integers(
        0, 23, size).astype(np.uint32), np.uint32(0))
    bits[sparse] = (bits[sparse] & np.uint32(0xFF800000)) | one_bit[sparse] | two_bit[sparse]
    zero = rng.random(size) < 0.03
    bits[zero] &= np.uint32(0x80000000)
    return bits


def fma_cases(rng, count):
    acc_bits = random_f32_bits(rng, count)
    x = decode(D.FP32, random_f32_bits(rng, count))
    y = decode(D.FP32, random_f32_bits(rng, count))
    # Near-cancellations: make some products close to -acc.
    near = rng.random(count) < 0.2
    acc_vals = decode(D.FP32, acc_bits)
    y[near] = -decode(D.FP32, encode_exact(D.FP32, acc_vals[near].astype(np.float32)))
    x[near] = 1.0 + rng.choice([0.0, 2.0 ** -23, -(2.0 ** -24), 2.0 ** -12], near.sum())
    with np.errstate(invalid="ignore", over="ignore"):
        prod = x * y
    return acc_bits, x, y, prod


def trap_cases(rng, count):
    """FP32 (acc, x, y) with x * y = +-2^e (1 + 2^-3p): acc + x * y sits on an FP32
    midpoint plus a tail below float64's reach, where a float64 sum rounds twice."""
    p = rng.choice([10, 11], count)
    e = rng.integers(-120, 100, count)
    x = (1.0 + np.ldexp(1.0, -p)) * np.where(rng.random(count) < 0.5, -1.0, 1.0)
    y = np.ldexp(1.0 - np.ldexp(1.0, -p) + np.ldexp(1.0, -2 * p), e)
    significand = 1.0 + rng.integers(0, 1 << 23, count) * 2.0 ** -23
    acc = np.ldexp(significand, e + 24) * np.where(rng.random(count) < 0.5, -1.0, 1.0)
    return acc.astype(np.float32), x, y


def check_fma(seed, count):
    rng = np.random.default_rng(seed)
    acc_bits, x, y, prod = fma_cases(rng, count)
    traps = rng.random(count) < 0.15
    trap_acc, x[traps], y[traps] = trap_cases(rng, int(traps.sum()))
    acc_bits[traps] = f32_to_bits(trap_acc)
    prod[traps] = x[traps] * y[traps]
    got = f32_to_bits(fma_f32(bits_to_f32(acc_bits), prod))
    for i in range(count):
        p = ref.ref_mul(ref.ref_decode(D.FP32, int(encode_exact(D.FP32, [x[i]])[0])),
                        ref.ref_decode(D.FP32, int(encode_exact(D.FP32, [y[i]])[0])))
        want = ref.f32_bits_of_val(ref.ref_fma(ref.val_of_f32_bits(int(acc_bits[i])), p))
        assert int(got[i]) == want, \
            f"case {i}: 0x{int(acc_bits[i]):08X} + {x[i]!r} * {y[i]!r}: " \
            f"0x{int(got[i]):08X} != 0x{want:08X}"


def test_fma_random_against_exact_reference():
    check_fma(seed=10, count=3000)


@pytest.mark.slow
def test_fma_random_against_exact_reference_sweep():
    for seed in range(100, 110):
        check_fma(seed, count=20000)


def test_fma_broadcasts_and_validates():
    out = fma_f32(np.zeros((2, 3), np.float32), np.array([1.0, 2.0, 3.0]))
    assert out.dtype == np.float32 and out.tolist() == [[1, 2, 3], [1, 2, 3]]
    with pytest.raises(ValueError, match="not an FP32 value"):
        fma_f32(np.array([0.1]), 1.0)


# ---------------------------------------------------------------------------
# Whole FMA chains: matmul_float against the exact reference
# ---------------------------------------------------------------------------

def random_raw(rng, dtype, shape):
    """Raw patterns of ``dtype``, biased toward special and extreme encodings."""
    if dtype.bits == 32:
        bits = random_f32_bits(rng, shape)
        if dtype is not D.FP32 and rng.random() < 0.5:
            return bits                                   # junk in must-be-zero bits (R10)
        keep = {D.FP32: 0xFFFFFFFF, D.TF32: 0xFFFFE000, D.HF32: 0xFFFFF000}[dtype]
        return bits & np.uint32(keep)
    if dtype.bits == 16:
        raw = rng.integers(0, 1 << 16, shape)
        exp_shift, exp_top = (10, 31) if dtype is D.FP16 else (7, 255)
        exponent = rng.choice(np.array([0, 0, 1, exp_top // 2, exp_top - 1, exp_top]), shape)
        spicy = rng.random(shape) < 0.3
        raw[spicy] = (raw[spicy] & ~(exp_top << exp_shift)) | (exponent[spicy] << exp_shift)
        return raw.astype(np.uint16)
    codes = 1 << dtype.bits
    raw = rng.integers(0, codes, shape)
    if dtype in (D.E3M2, D.E2M3):
        # Mostly clean 6-bit lanes, sometimes junk in bits 7:6 (R10).
        raw = np.where(rng.random(shape) < 0.8, raw & 0x3F, raw)
    return raw.astype(np.uint8)


def add_cancellations(rng, a_raw, b_raw, b_type):
    """Let some term pairs cancel exactly: repeat an A column, negate the B row."""
    k = a_raw.shape[1]
    sign = 1 << (b_type.bits - 1) if b_type.bits > 4 else 8
    for kk in range(0, k - 1, 2):
        if rng.random() < 0.25:
            a_raw[:, kk + 1] = a_raw[:, kk]
            b_raw[kk + 1, :] = b_raw[kk, :] ^ sign


def random_scales(rng, shape):
    scales = rng.integers(97, 158, shape)                 # around 2^0, so sums interact
    extreme = rng.random(shape)
    scales[extreme < 0.1] = 0x00
    scales[(extreme >= 0.1) & (extreme < 0.2)] = 0xFE
    scales[(extreme >= 0.2) & (extreme < 0.24)] = 0xFF
    return scales.astype(np.uint8)


def check_chain(rng, a_type, b_type, m, n, k, *, acc=False, bias=False, mx=False):
    a_raw = random_raw(rng, a_type, (m, k))
    b_raw = random_raw(rng, b_type, (k, n))
    add_cancellations(rng, a_raw, b_raw, b_type)
    blocks = -(-k // 32)
    a_scale = random_scales(rng, (m, blocks)) if mx and a_type in MX_SCALED else None
    b_scale = random_scales(rng, (blocks, n)) if mx and b_type in MX_SCALED else None
    acc0 = random_f32_bits(rng, (m, n)) if acc else None
    bias_bits = random_f32_bits(rng, n) if bias else None

    got = matmul_float(decode(a_type, a_raw), decode(b_type, b_raw),
                       None if acc0 is None else bits_to_f32(acc0), a_scale, b_scale)
    if bias:
        got = add_bias_f32(got, bits_to_f32(bias_bits))
    got = f32_to_bits(got)

    def tolist(x):
        return None if x is None else x.astype(np.int64).tolist()

    want = ref.ref_matmul_float(tolist(a_raw), a_type, tolist(b_raw), b_type, tolist(acc0),
                                tolist(a_scale), tolist(b_scale))
    if bias:
        want = ref.ref_add_bias(want, tolist(bias_bits))
    want = np.array(want, dtype=np.uint32).reshape(m, n)
    bad = np.argwhere(got != want)
    assert not bad.size, (
        f"{a_type.name} x {b_type.name} (acc={acc}, bias={bias}, mx={mx}) at {bad[0]}: "
        f"0x{int(got[tuple(bad[0])]):08X} != 0x{int(want[tuple(bad[0])]):08X}")


def test_chain_every_ordinary_float_pair():
    rng = np.random.default_rng(20)
    for a_type in FLOAT_INPUTS:
        for b_type in FLOAT_INPUTS:
            variant = int(rng.integers(0, 3))
            check_chain(rng, a_type, b_type, 3, 3, int(rng.integers(1, 30)),
                        acc=variant == 1, bias=variant == 2)


def test_chain_every_mx_pair_with_scales():
    rng = np.random.default_rng(21)
    for a_type in MX_SIDES:
        for b_type in MX_SIDES:
            variant = int(rng.integers(0, 3))
            check_chain(rng, a_type, b_type, 2, 3, int(rng.integers(30, 80)), mx=True,
                        acc=variant == 1, bias=variant == 2)


def test_chain_fp32_heavy():
    # FP32 products are up to 48 bits wide: this exercises the TwoSum/round-to-odd path.
    rng = np.random.default_rng(22)
    for case in range(12):
        check_chain(rng, D.FP32, D.FP32, 4, 4, 40, acc=case % 2 == 1, bias=case % 3 == 2)


@pytest.mark.slow
def test_chain_sweep():
    rng = np.random.default_rng(23)
    for _ in range(10):
        for a_type in FLOAT_INPUTS:
            for b_type in FLOAT_INPUTS:
                variant = int(rng.integers(0, 3))
                check_chain(rng, a_type, b_type, 4, 4, int(rng.integers(1, 70)),
                            acc=variant == 1, bias=variant == 2)
        for a_type in MX_SIDES:
            for b_type in MX_SIDES:
                check_chain(rng, a_type, b_type, 3, 3, int(rng.integers(1, 130)), mx=True,
                            acc=bool(rng.integers(0, 2)))
        for _ in range(20):
            check_chain(rng, D.FP32, D.FP32, 6, 6, 64, acc=True, bias=True)


def test_chain_double_rounding_traps():
    # Step k=0 of every lane is a trap (see trap_cases); later steps are random FP32.
    rng = np.random.default_rng(24)
    m = n = 6
    for _ in range(4):
        a_raw = random_f32_bits(rng, (m, 5))
        b_raw = random_f32_bits(rng, (5, n))
        acc, x, y = trap_cases(rng, m * n)
        a_raw[:, 0] = f32_to_bits(x[:m].astype(np.float32))
        b_raw[0, :] = f32_to_bits(y[:n].astype(np.float32))
        # Give every lane an accumulator matched to its own product's binade.
        prod_exp = np.frexp(x[:m, None] * y[None, :n])[1] - 1
        acc_sig = np.frexp(acc.reshape(m, n))[0] * 2
        acc0 = f32_to_bits(np.ldexp(acc_sig, prod_exp + 24).astype(np.float32))
        got = f32_to_bits(matmul_float(decode(D.FP32, a_raw), decode(D.FP32, b_raw),
                                       bits_to_f32(acc0)))
        want = ref.ref_matmul_float(a_raw.astype(np.int64).tolist(), D.FP32,
                                    b_raw.astype(np.int64).tolist(), D.FP32,
                                    acc0.astype(np.int64).tolist())
        assert got.tolist() == want


def test_products_beyond_fp32_range_are_not_rounded_first():
    # BF16 2^64 * 2^64 = 2^128 is no FP32 value, yet -FLT_MAX + 2^128 = 2^104 is.
    big = decode(D.BF16, encode_exact(D.BF16, [[2.0 ** 64]]))
    got = matmul_float(big, big.copy(), acc0=np.float32([[-F32_MAX]]))
    assert got.tolist() == [[2.0 ** 104]]
    # 3 * 2^-150 lies below FP32's grid: rounding it first (to 2^-148) and then
    # adding 2^-149 gives 3 * 2^-149; the one rounding of 2.5 * 2^-149 gives 2^-148.
    tiny = decode(D.BF16, np.array([[0x0003]]))                # 3 * 2^-133
    got = matmul_float(tiny, np.array([[2.0 ** -17]]), acc0=np.float32([[2.0 ** -149]]))
    assert got.tolist() == [[2.0 ** -148]]


def test_double_rounding_trap_inside_a_chain():
    # A 12-bit times a 23-bit significand: the step must take the exact path.
    x = 1.0 + 2.0 ** -11
    y = (1.0 - 2.0 ** -11 + 2.0 ** -22) * 2.0 ** -24          # x * y = 2^-24 + 2^-57
    got = matmul_float(np.array([[1.0, x]]), np.array([[1.0], [y]]))
    assert int(f32_to_bits(got)[0, 0]) == 0x3F800001


# ---------------------------------------------------------------------------
# The hardware numeric vectors of the matrix group, and signed zeros
# ---------------------------------------------------------------------------

def test_vector_fp32_matmul_2x2_bias_and_acc():
    a = decode(D.FP32, encode_exact(D.FP32, [[1, 2], [3, 4]]))
    b = decode(D.FP32, encode_exact(D.FP32, [[5, 6], [7, 8]]))
    dots = matmul_float(a, b)
    assert dots.tolist() == [[19, 22], [43, 50]]
    assert add_bias_f32(dots[:1], np.float32([1, -2])).tolist() == [[20, 20]]
    assert matmul_float(a[:1], b, acc0=np.float32([[10, 20]])).tolist() == [[29, 42]]


def test_vector_mx_e8m0_scale():
    assert decode(D.E4M3, encode_exact(D.E4M3, [1.5]))[0] * decode(D.E8M0, [0x80])[0] == 3.0
    got = matmul_float(decode(D.E4M3, encode_exact(D.E4M3, [[1.5]])),
                       decode(D.E5M2, encode_exact(D.E5M2, [[1.0]])),
                       a_scale=np.array([[0x80]]), b_scale=np.array([[0x7F]]))
    assert got.tolist() == [[3.0]]


def test_vector_mx_k_block_33():
    a = decode(D.E4M3, encode_exact(D.E4M3, np.ones((1, 33))))
    b = decode(D.E5M2, encode_exact(D.E5M2, np.ones((33, 1))))
    scales = dict(a_scale=np.array([[0x7F, 0x80]]), b_scale=np.array([[0x7F], [0x81]]))
    dot = matmul_float(a, b, **scales)
    assert dot.tolist() == [[40.0]]
    assert add_bias_f32(dot, np.float32([2])).tolist() == [[42.0]]
    assert matmul_float(a, b, acc0=np.float32([[3]]), **scales).tolist() == [[43.0]]


def test_nan_scale_makes_the_lane_canonical_nan():
    a = np.ones((2, 40))
    b = np.zeros((40, 2))                                  # 0xFF wins even over zero inputs
    a_scale = np.array([[0x7F, 0x7F], [0x7F, 0xFF]])
    b_scale = np.array([[0x7F, 0x7F], [0x7F, 0x7F]])
    bits = f32_to_bits(matmul_float(a, b, a_scale=a_scale, b_scale=b_scale))
    assert bits.tolist() == [[0, 0], [CANONICAL_NAN_F32, CANONICAL_NAN_F32]]


def test_signed_zero_rules():
    neg = np.array([[-0.0, -0.0]])
    pos = np.array([[2.0], [2.0]])
    assert int(f32_to_bits(matmul_float(neg, pos))[0, 0]) == 0           # +0 start
    acc0 = bits_to_f32(np.array([[0x80000000]]))
    assert int(f32_to_bits(matmul_float(neg, pos, acc0=acc0))[0, 0]) == 0x80000000
    ones = np.array([[1.0, -1.0]])
    assert int(f32_to_bits(matmul_float(ones, np.array([[1.0], [1.0]])))[0, 0]) == 0


def test_inf_minus_inf_and_zero_times_inf_give_canonical_nan():
    got = matmul_float(np.array([[math.inf, math.inf], [0.0, 1.0]]),
                       np.array([[1.0], [-1.0]]))
    assert f32_to_bits(got).ravel().tolist() == [CANONICAL_NAN_F32, 0xBF800000]
    got = matmul_float(np.array([[0.0]]), np.array([[math.inf]]))
    assert int(f32_to_bits(got)[0, 0]) == CANONICAL_NAN_F32


def test_k_order_matters_and_is_increasing():
    # 2^24 + 1 - 2^24: in order k = 0, 1, 2 the 1 is lost (RNE to even) -> 0.
    a = np.array([[2.0 ** 24, 1.0, -(2.0 ** 24)]])
    assert matmul_float(a, np.ones((3, 1))).tolist() == [[0.0]]
    assert matmul_float(a[:, ::-1].copy(), np.ones((3, 1))).tolist() == [[1.0]]


def test_matmul_float_validates_its_inputs():
    with pytest.raises(ValueError, match="not an FP32 value"):
        matmul_float(np.array([[0.1]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        matmul_float(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="a_scale"):
        matmul_float(np.ones((2, 33)), np.ones((33, 1)), a_scale=np.ones((2, 1), np.uint8))
    with pytest.raises(ValueError, match="acc0"):
        matmul_float(np.ones((2, 3)), np.ones((3, 1)), acc0=np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="E8M0"):
        matmul_float(np.ones((1, 3)), np.ones((3, 1)), b_scale=np.array([[256]]))


# ---------------------------------------------------------------------------
# Integer products
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("a_type,b_type", [
    (D.S8, D.S8), (D.S16, D.S16), (D.S4X2, D.S4X2), (D.S8, D.S4X2), (D.S16, D.S8),
    (D.U8, D.U8), (D.U16, D.U16), (D.U4X2, D.U4X2), (D.U16, D.U4X2),
], ids=lambda t: t.name)
def test_integer_products_wrap_like_big_integers(a_type, b_type):
    rng = np.random.default_rng(30 + a_type.value * 32 + b_type.value)
    signed = a_type.name.startswith("S")
    for m, n, k in [(3, 4, 1), (4, 3, 37), (5, 5, 300)]:
        a_raw = rng.integers(0, 1 << a_type.bits, (m, k))
        b_raw = rng.integers(0, 1 << b_type.bits, (k, n))
        extreme = rng.random((m, k)) < 0.5                # push sums past 2^31
        a_raw[extreme] = (1 << (a_type.bits - 1)) if signed else (1 << a_type.bits) - 1
        a, b = decode(a_type, a_raw), decode(b_type, b_raw)
        acc0 = rng.integers(-(1 << 31), 1 << 32, (m, n))
        bias = rng.integers(0, 1 << 32, n)
        got = add_bias_int(matmul_int(a, b, acc0=acc0, signed=signed), bias)
        want = ref.ref_matmul_int(a.tolist(), b.tolist(), acc0.tolist(), bias.tolist())
        assert got.dtype == np.uint32
        assert got.tolist() == want
        assert matmul_int(a, b, signed=signed).tolist() == ref.ref_matmul_int(a.tolist(),
                                                                               b.tolist())


def test_integer_product_wraps_over_a_long_k():
    k = 1 << 21                                            # the exact sum is ~2^53
    a = np.full((1, k), 65535)
    got = matmul_int(a, a.T.copy(), signed=False)
    assert int(got[0, 0]) == (65535 * 65535 * k) % (1 << 32)


def test_integer_validation():
    with pytest.raises(ValueError, match="signed"):
        matmul_int(np.array([[40000]]), np.array([[1]]), signed=True)
    with pytest.raises(ValueError, match="unsigned"):
        matmul_int(np.array([[-1]]), np.array([[1]]), signed=False)
    with pytest.raises(ValueError, match="integer"):
        matmul_int(np.array([[1.0]]), np.array([[1]]))
    with pytest.raises(ValueError, match="acc0"):
        matmul_int(np.array([[1]]), np.array([[1]]), acc0=np.array([[1 << 32]]))


# ---------------------------------------------------------------------------
# The pto-v0 raw-carrier profile (replays of the spec's own tests)
# ---------------------------------------------------------------------------

def test_pto_v0_replays_the_asl_examples():
    fp16 = lambda rows: pto_v0_carrier(D.FP16, np.array(rows))
    # TMATMUL / TGEMV FP16 raw 2 x raw 3 -> 6; ACC C=5 -> 11; BIAS 5 -> 11.
    assert matmul_pto_v0(fp16([[2]]), fp16([[3]])).tolist() == [[6]]
    assert matmul_pto_v0(fp16([[2]]), fp16([[3]]), acc0=[[5]]).tolist() == [[11]]
    assert add_bias_pto_v0(matmul_pto_v0(fp16([[2]]), fp16([[3]])), [5]).tolist() == [[11]]
    # ACC reuse: D1 = 11 becomes C of a second block -> 17.
    assert matmul_pto_v0(fp16([[2]]), fp16([[3]]), acc0=[[11]]).tolist() == [[17]]
    # TMATMUL defaults: raw 6 x raw 7 -> 42.
    assert matmul_pto_v0(fp16([[6]]), fp16([[7]])).tolist() == [[42]]
    # TGEMV, N=10, K=9, all raw 1 -> 9 everywhere.
    assert (matmul_pto_v0(np.ones((1, 9), np.uint64), np.ones((9, 10), np.uint64)) == 9).all()
    # FP16 2x3 x 3x2 -> [[22, 28], [49, 64]]; 2x2 -> [[19, 22], [43, 50]].
    assert matmul_pto_v0(fp16([[1, 2, 3], [4, 5, 6]]),
                         fp16([[1, 2], [3, 4], [5, 6]])).tolist() == [[22, 28], [49, 64]]
    assert matmul_pto_v0(fp16([[1, 2], [3, 4]]),
                         fp16([[5, 6], [7, 8]])).tolist() == [[19, 22], [43, 50]]
    # MX shared-both: E4M3 all 2, E5M2 all 3, E8M0 scales raw 1, K=32 -> 192.
    mx = dict(a_scale=pto_v0_carrier(D.E8M0, [[1]]), b_scale=pto_v0_carrier(D.E8M0, [[1]]))
    a = pto_v0_carrier(D.E4M3, np.full((1, 32), 2))
    b = pto_v0_carrier(D.E5M2, np.full((32, 1), 3))
    assert matmul_pto_v0(a, b, **mx).tolist() == [[192]]
    # Numeric-contract legality test: all-1 inputs, scales raw 1 -> 32, ACC with C=32 -> 64.
    ones_a, ones_b = np.ones((1, 32), np.uint64), np.ones((32, 1), np.uint64)
    assert matmul_pto_v0(ones_a, ones_b, **mx).tolist() == [[32]]
    assert matmul_pto_v0(ones_a, ones_b, acc0=[[32]], **mx).tolist() == [[64]]
    # E4M3 raw 2 x raw 3 + FP32 raw bias 1 -> 7.
    assert add_bias_pto_v0(matmul_pto_v0([[2]], [[3]]), [1]).tolist() == [[7]]


def test_pto_v0_integer_carriers_give_the_wrapped_s32_result():
    a = pto_v0_carrier(D.S8, encode_exact(D.S8, [[-2, 100]]))
    b = pto_v0_carrier(D.S8, encode_exact(D.S8, [[3], [-128]]))
    word = int(matmul_pto_v0(a, b)[0, 0])
    assert word == (-6 - 12800) % (1 << 64)
    s32 = matmul_int(np.array([[-2, 100]]), np.array([[3], [-128]]))
    assert word & 0xFFFFFFFF == int(s32[0, 0])


def test_pto_v0_carriers():
    assert pto_v0_carrier(D.S8, [0xFF]).tolist() == [(1 << 64) - 1]
    assert pto_v0_carrier(D.S32, [0x80000000]).tolist() == [(1 << 64) - (1 << 31)]
    assert pto_v0_carrier(D.S4X2, [0xF]).tolist() == [0xF]       # TLOAD zero-extends nibbles
    assert pto_v0_carrier(D.FP16, [0x8000]).tolist() == [0x8000]
    assert pto_v0_carrier(D.U16, [0xFFFF]).tolist() == [0xFFFF]


def test_pto_v0_random_against_big_integers():
    rng = np.random.default_rng(40)
    for m, n, k in [(2, 3, 5), (3, 2, 70)]:
        a = rng.integers(0, 1 << 63, (m, k), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        b = rng.integers(0, 1 << 63, (k, n), dtype=np.uint64)
        acc0 = rng.integers(0, 1 << 63, (m, n), dtype=np.uint64)
        sa = rng.integers(0, 1 << 63, (m, -(-k // 32)), dtype=np.uint64)
        sb = rng.integers(0, 256, (-(-k // 32), n), dtype=np.uint64)
        got = matmul_pto_v0(a, b, acc0, sa, sb)
        want = ref.ref_matmul_pto_v0(*(x.astype(object).tolist() for x in (a, b, acc0, sa, sb)))
        assert got.dtype == np.uint64 and got.astype(object).tolist() == want
    with pytest.raises(ValueError, match="unsigned"):
        matmul_pto_v0(np.array([[-1]]), np.array([[1]]))


# ---------------------------------------------------------------------------
# The model benchmark
# ---------------------------------------------------------------------------

def test_bench_model_reports_every_case():
    from ptocube.sim.bench_model import bench_model
    results = bench_model(m=8, n=8, k=40, repeats=1)
    assert [r["case"] for r in results] == ["S8", "FP16", "MX E4M3xE5M2"]
    for r in results:
        assert r["shape"] == (8, 8, 40) and r["macs"] == 8 * 8 * 40
        assert r["model_s"] > 0 and r["numpy_s"] > 0
        assert r["ratio"] == pytest.approx(r["model_s"] / r["numpy_s"])
        assert r["model_macs_per_s"] == pytest.approx(r["macs"] / r["model_s"])
        assert (r["meets_target"] is None) == (r["target_ratio"] is None)



# ---------------------------------------------------------------------------
# Flush-to-zero guard (ruling R1: gradual underflow, never FTZ/DAZ)
# ---------------------------------------------------------------------------

@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"),
                    reason="sets FTZ/DAZ through the x86 MXCSR register")
def test_model_refuses_to_compute_when_the_thread_flushes_subnormals(tmp_path):
    # The MXCSR is per thread, so the check runs in a child process of its own.
    import subprocess
    import sys
    source = tmp_path / "ftz.c"
    source.write_text("#include <xmmintrin.h>\n"
                      "void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | 0x8040); }\n")
    library = tmp_path / "libftz.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    script = f"""
import ctypes, numpy as np
from ptocube.model.datatype import DataType
from ptocube.model.numeric import decode, matmul_float, fma_f32
assert decode(DataType.FP32, np.array([1], np.uint32))[0] == 2.0 ** -149
ctypes.CDLL({str(library)!r}).set_ftz_daz()
for call in (lambda: decode(DataType.FP32, np.array([1], np.uint32)),
             lambda: matmul_float(np.array([[2.0 ** -75]]), np.array([[2.0 ** -70]])),
             lambda: fma_f32(np.float32(0), np.float64(2.0 ** -149))):
    try:
        call()
    except RuntimeError as err:
        assert "FTZ/DAZ" in str(err)
    else:
        raise SystemExit("computed with FTZ/DAZ on")
print("refused")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
