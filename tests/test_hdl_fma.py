"""Fma32 (hdl/fma.py) and IntMac (hdl/int_mac.py), driven through two InputDecoders.

The reference is exact: the decoded inputs (``ptocube.model.numeric.decode``
times the E8M0 scale) are multiplied and added to the accumulator as
``fractions.Fraction`` and the sum is rounded once to FP32, nearest-even, in
this file.  The vectors are heavy in zeros of both signs, infinities, NaNs,
subnormals, overflow and cancellation (accumulators placed at minus the
rounded product, give or take a few ulps), and cover every ordered pair of
floating input types, the MX pairs with random scales, and narrower builds.
One vector enters the pipeline per clock.
"""

import random
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ptocube.hdl.fma import Fma32
from ptocube.hdl.input_decoder import InputDecoder
from ptocube.hdl.int_mac import IntMac
from ptocube.hdl.numeric_types import FLOAT_FORMATS, NumericConfig
from ptocube.model.datatype import DataType, MX_MATRIX_TYPES
from ptocube.model.numeric import decode, f32_to_bits, fma_f32

from hdl_numeric_helpers import (Flat, construction_error, operand_values, simulate,
                                 special_heavy_raws, unused)

CANONICAL_NAN = 0x7FC00000
FLOAT_TYPES = sorted(FLOAT_FORMATS)
FP8_TYPES = {DataType.HiF8, DataType.E4M3, DataType.E5M2, DataType.E3M2, DataType.E2M3,
             DataType.E2M1X2, DataType.E1M2X2}


class MacHarness(wiring.Component):
    """Two InputDecoders feeding one Fma32 (or, with ``integer``, one IntMac)."""

    def __init__(self, config: NumericConfig, integer: bool = False):
        self.config = config
        self.unit = IntMac(config) if integer else Fma32(config)
        self.integer = integer
        members = {}
        for side in "ab":
            members[f"dtype_{side}"] = In(5)
            members[f"raw_{side}"] = In(config.raw_width)
            if config.has_scale:
                members[f"scale_{side}"] = In(8)
                members[f"scale_en_{side}"] = In(1)
        members["acc_in"] = In(32)
        members["acc_out"] = Out(32)
        super().__init__(members)

    @property
    def latency(self):
        return self.unit.latency + getattr(self.unit, "input_lag", 0)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = self.unit
        for side in "ab":
            dec = m.submodules[f"dec_{side}"] = InputDecoder(self.config)
            m.d.comb += [dec.dtype.eq(getattr(self, f"dtype_{side}")),
                         dec.raw.eq(getattr(self, f"raw_{side}"))]
            if self.config.has_scale:
                m.d.comb += [dec.scale.eq(getattr(self, f"scale_{side}")),
                             dec.scale_en.eq(getattr(self, f"scale_en_{side}"))]
            operand = dec.int_value if self.integer else dec.fp
            m.d.comb += getattr(self.unit, side).eq(operand)
        # acc_in joins a registered product one cycle after the operands.
        acc_in = self.acc_in
        for _ in range(getattr(self.unit, "input_lag", 0)):
            delayed = Signal(32)
            m.d.sync += delayed.eq(acc_in)
            acc_in = delayed
        m.d.comb += [self.unit.acc_in.eq(acc_in), self.acc_out.eq(self.unit.acc_out)]
        return m


# ---------------------------------------------------------------------------
# Exact reference
# ---------------------------------------------------------------------------

def f32_bits_value(bits: int) -> float:
    return float(np.uint32(bits).view(np.float32))


def round_to_f32(x: Fraction) -> int:
    """FP32 bits of the nonzero rational ``x``, rounded once to nearest-even."""
    sign = 1 if x < 0 else 0
    num, den = abs(x.numerator), x.denominator
    exp = num.bit_length() - den.bit_length()          # 2**exp <= |x| < 2**(exp+2)
    if (num << max(0, -exp)) < (den << max(0, exp)):
        exp -= 1                                        # now 2**exp <= |x| < 2**(exp+1)
    lsb = max(exp - 23, -149)
    # |x| / 2**lsb = q + r/den2 exactly
    if lsb >= 0:
        q, r = divmod(num, den << lsb)
        den2 = den << lsb
    else:
        q, r = divmod(num << -lsb, den)
        den2 = den
    if 2 * r > den2 or (2 * r == den2 and q & 1):
        q += 1
    bits = ((lsb + 149) << 23) + q                      # hidden bit carries into the exponent
    return (sign << 31) | min(bits, 0x7F800000)


def fma_reference(a: float, b: float, acc_bits: int) -> int:
    """RNE_fp32(acc + a*b) with one rounding and the IEEE special cases (ruling R1)."""
    acc = f32_bits_value(acc_bits)
    if np.isnan(a) or np.isnan(b) or np.isnan(acc):
        return CANONICAL_NAN
    prod_sign = int(np.signbit(a)) ^ int(np.signbit(b))
    acc_sign = acc_bits >> 31
    if np.isinf(a) or np.isinf(b):
        if a == 0 or b == 0:
            return CANONICAL_NAN                        # 0 * inf
        if np.isinf(acc) and acc_sign != prod_sign:
            return CANONICAL_NAN                        # inf - inf
        return (prod_sign << 31) | 0x7F800000
    if np.isinf(acc):
        return acc_bits
    total = Fraction(a) * Fraction(b) + Fraction(acc)
    if total == 0:
        both_negative_zeros = a * b == 0 and acc == 0 and prod_sign and acc_sign
        return 0x80000000 if both_negative_zeros else 0
    return round_to_f32(total)


def test_reference_rounding_examples():
    # The reference itself, on values worked out by hand.
    assert round_to_f32(Fraction(1)) == 0x3F800000
    assert round_to_f32(1 + Fraction(1, 2 ** 24)) == 0x3F800000                 # tie, even
    assert round_to_f32(1 + Fraction(3, 2 ** 24)) == 0x3F800002                 # tie, even up
    assert round_to_f32(1 + Fraction(1, 2 ** 24) + Fraction(1, 2 ** 70)) == 0x3F800001
    assert round_to_f32(Fraction(1, 2 ** 150)) == 0                            # tie to +0
    assert round_to_f32(-Fraction(3, 2 ** 151)) == 0x80000001
    assert round_to_f32(Fraction(2 ** 128)) == 0x7F800000
    assert round_to_f32(Fraction(2 ** 128 - 2 ** 103)) == 0x7F800000           # tie -> inf
    assert round_to_f32(Fraction(2 ** 128 - 2 ** 103 - 1)) == 0x7F7FFFFF
    assert round_to_f32(Fraction(2 ** 126 - 1, 2 ** 252)) == 0x00800000        # subnormal -> normal


# ---------------------------------------------------------------------------
# Vector generation and the test driver
# ---------------------------------------------------------------------------

ACC_SPECIALS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
                0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000]


def random_raw(dtype: DataType, rng: random.Random) -> int:
    if dtype.bits >= 16:
        return special_heavy_raws(dtype, rng, 1)[0]
    return rng.getrandbits(8)     # lanes: the ignored upper nibble is random too


def random_scale(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.15:
        return rng.choice([0x00, 0x01, 0x7F, 0xFE, 0xFF])
    if pick < 0.6:
        return 127 + rng.randint(-20, 20)
    return rng.randrange(255)


def fp32_near(exp: int, rng: random.Random) -> int:
    """A random FP32 with magnitude about 2**exp (subnormal or clamped when out of range)."""
    sign = rng.getrandbits(1) << 31
    if exp > 127:
        return sign | 0x7F7FFFFF
    if exp < -126:
        return sign | (rng.getrandbits(23) >> min(23, -126 - exp))
    return sign | ((exp + 127) << 23) | rng.getrandbits(23)


def accumulator_for(product: float, rng: random.Random) -> int:
    """An accumulator that stresses the adder against ``product``."""
    pick = rng.random()
    finite = np.isfinite(product) and product != 0
    if pick < 0.15 or (not finite and pick < 0.6):
        return rng.choice(ACC_SPECIALS)
    if pick < 0.5 and finite:
        # Cancellation: minus the rounded product, nudged by a few ulps.
        bits = round_to_f32(-Fraction(product))
        if bits & 0x7F800000 != 0x7F800000:
            nudged = bits + rng.randint(-3, 3)
            if nudged >> 31 == bits >> 31:
                return nudged & 0xFFFFFFFF
        return bits
    if pick < 0.8 and finite:
        return fp32_near(int(np.frexp(product)[1]) + rng.randint(-40, 30), rng)
    return special_heavy_raws(DataType.FP32, rng, 1)[0]


def make_vectors(config: NumericConfig, pairs, per_pair: int, rng: random.Random,
                 scaled: bool = True) -> list:
    """Random vectors (dict of harness inputs) for each (dtype_a, dtype_b) pair."""
    vectors = []
    for dtype_a, dtype_b in pairs:
        for _ in range(per_pair):
            vec = {"dtype_a": dtype_a, "dtype_b": dtype_b}
            for side, dtype in (("a", dtype_a), ("b", dtype_b)):
                vec[f"raw_{side}"] = random_raw(dtype, rng)
                if config.has_scale:
                    vec[f"scale_{side}"] = random_scale(rng)
                    vec[f"scale_en_{side}"] = int(scaled and rng.random() < 0.9)
            vectors.append(vec)
    values = decoded_operands(config, vectors)
    for vec, a, b in zip(vectors, *values):
        with np.errstate(invalid="ignore", over="ignore"):
            vec["acc_in"] = accumulator_for(a * b, rng)
    return vectors


def decoded_operands(config: NumericConfig, vectors):
    """Exact float64 values of the A and B operands of every vector."""
    out = []
    for side in "ab":
        column = np.empty(len(vectors))
        for dtype in {v[f"dtype_{side}"] for v in vectors}:
            idx = [i for i, v in enumerate(vectors) if v[f"dtype_{side}"] == dtype]
            raws = [vectors[i][f"raw_{side}"] for i in idx]
            if config.has_scale:
                scales = [vectors[i].get(f"scale_{side}", 0x7F) for i in idx]
                enables = [vectors[i].get(f"scale_en_{side}", 0) for i in idx]
                column[idx] = operand_values(dtype, raws, scales, enables)
            else:
                column[idx] = operand_values(dtype, raws)
        out.append(column)
    return out


def run_harness(config: NumericConfig, vectors, integer: bool = False) -> list:
    """acc_out of every vector, one vector per clock through the pipeline."""
    harness = MacHarness(config, integer)
    flat = Flat(harness)
    words = [flat.pack(**{k: int(v) for k, v in vec.items()}) for vec in vectors]
    return [flat.unpack(w)["acc_out"] for w in simulate(flat, words, harness.latency)]


def check_fma(config: NumericConfig, vectors, got=None) -> list:
    """Compare the hardware results ``got`` (run now if None) with the exact reference."""
    if got is None:
        got = run_harness(config, vectors)
    a_values, b_values = decoded_operands(config, vectors)
    failures = []
    for vec, a, b, out in zip(vectors, a_values, b_values, got):
        want = fma_reference(a, b, vec["acc_in"])
        if out != want:
            failures.append(f"{vec['dtype_a'].name} {vec['raw_a']:#x} * {vec['dtype_b'].name} "
                            f"{vec['raw_b']:#x} (a={a!r}, b={b!r}) + {vec['acc_in']:#010x}: "
                            f"got {out:#010x}, want {want:#010x}")
    assert not failures, f"{len(failures)} of {len(vectors)} wrong, e.g.\n" + "\n".join(failures[:8])
    return got


FULL = NumericConfig()
FP8 = NumericConfig(input_types=FP8_TYPES, fma_stages=1)
HALF = NumericConfig(input_types={DataType.FP16, DataType.BF16, DataType.E5M2},
                     mx_scales=False, fma_stages=4)


# ---------------------------------------------------------------------------
# Fma32 tests
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("stages", [0, 2, 5])
def test_fp32_times_fp32(stages):
    rng = random.Random(100 + stages)
    config = replace(FULL, fma_stages=stages)
    check_fma(config, make_vectors(config, [(DataType.FP32, DataType.FP32)], 700, rng))


def _fp32(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


F = DataType.FP32
DIRECTED = [
    # (dtype_a, raw_a, dtype_b, raw_b, acc, expected, what)
    (F, 0x80000000, F, _fp32(1), 0x00000000, 0x00000000, "+0 + (-0) = +0"),
    (F, 0x80000000, F, _fp32(1), 0x80000000, 0x80000000, "-0 + (-0) = -0"),
    (F, 0x00000000, F, _fp32(1), 0x80000000, 0x00000000, "-0 + (+0) = +0"),
    (F, _fp32(-1), F, _fp32(1), _fp32(1), 0x00000000, "1 - 1 = +0"),
    (F, 0x00000000, F, 0x7F800000, _fp32(1), CANONICAL_NAN, "0 * inf"),
    (F, 0x7F800000, F, _fp32(1), 0xFF800000, CANONICAL_NAN, "inf - inf"),
    (F, 0x7F800000, F, _fp32(-2), _fp32(5), 0xFF800000, "-inf product"),
    (F, _fp32(3), F, _fp32(1), 0x7F800001, CANONICAL_NAN, "signaling NaN accumulator"),
    (F, 0xFFC12345, F, _fp32(1), _fp32(1), CANONICAL_NAN, "NaN payload is not kept"),
    (F, 0x7F7FFFFF, F, _fp32(2), _fp32(1), 0x7F800000, "overflow to +inf"),
    (F, 0x7F7FFFFF, F, _fp32(2), 0xFF7FFFFF, 0x7F7FFFFF, "huge product, exact result"),
    (F, 0x00000001, F, _fp32(0.5), 0x00000000, 0x00000000, "half min subnormal: tie to +0"),
    (F, 0x00000001, F, _fp32(0.75), 0x00000000, 0x00000001, "0.75 min subnormal rounds up"),
    (F, 0x00000001, F, _fp32(1.5), 0x00000000, 0x00000002, "1.5 min subnormal: tie to even"),
    (F, _fp32(-1), F, 0x00800000, 0x00800001, 0x00000001, "normal - normal = subnormal"),
    (F, 0x00000003, F, _fp32(2 ** -30), 0x00000000, 0x00000000, "far below the last place"),
    (F, 0x33800001, F, 0x3F800001, _fp32(1), 0x3F800001, "just above a tie: one rounding"),
    (F, _fp32(2 ** -24), F, _fp32(1), _fp32(1), _fp32(1), "exact tie to even"),
    (F, _fp32(2 ** -100), F, _fp32(2 ** -100), _fp32(2 ** 100), _fp32(2 ** 100),
     "product only sticky"),
    (DataType.E4M3, 0x00, DataType.E4M3, 0x38, 0x80000000, 0x00000000, "E4M3 +0 * 1 + -0"),
    (DataType.HiF8, 0x80, DataType.FP16, 0x3C00, _fp32(1), CANONICAL_NAN, "HiF8 NaN"),
    (DataType.E5M2, 0x7C, DataType.E2M1X2, 0x0, _fp32(1), CANONICAL_NAN, "E5M2 inf * E2M1 +0"),
]

#: A 0xFF (NaN) scale makes the term NaN even when the element is zero (R3).
NAN_SCALE = dict(dtype_a=DataType.E4M3, raw_a=0x00, scale_a=0xFF, scale_en_a=1,
                 dtype_b=DataType.E5M2, raw_b=0x3C, scale_b=0x7F, scale_en_b=1, acc_in=_fp32(7))


@pytest.fixture(scope="module")
def full_build():
    """One simulation of the full build (3 stages) for several vector groups.

    Returns {group: (vectors, hardware results)}; building the simulator once
    keeps the default suite fast.
    """
    rng = random.Random(2)
    groups = {
        # Every ordered pair of floating input types, unscaled.
        "pairs": make_vectors(FULL, [(a, b) for a in FLOAT_TYPES for b in FLOAT_TYPES],
                              8, rng, scaled=False),
        # Every ordered MX pair; scaled sides get random scales incl. 0x00/0xFE/0xFF.
        "mx": make_vectors(FULL, [(a, b) for a in sorted(MX_MATRIX_TYPES)
                                  for b in sorted(MX_MATRIX_TYPES)], 16, rng),
        "directed": [dict(dtype_a=da, raw_a=ra, dtype_b=db, raw_b=rb, acc_in=acc)
                     for da, ra, db, rb, acc, _, _ in DIRECTED],
        "nan_scale": [NAN_SCALE],
    }
    vectors = [v for group in groups.values() for v in group]
    got = run_harness(FULL, vectors)
    out, start = {}, 0
    for name, group in groups.items():
        out[name] = (group, got[start:start + len(group)])
        start += len(group)
    return out


def test_every_ordered_pair_of_float_types(full_build):
    check_fma(FULL, *full_build["pairs"])


def test_mx_pairs_with_scales(full_build):
    check_fma(FULL, *full_build["mx"])


def test_directed_cases(full_build):
    got = check_fma(FULL, *full_build["directed"])
    for (*_, expected, what), out in zip(DIRECTED, got):
        assert out == expected, f"{what}: got {out:#010x}, want {expected:#010x}"


def test_mx_nan_scale_poisons_even_a_zero_term(full_build):
    assert full_build["nan_scale"][1] == [CANONICAL_NAN]


def test_hardware_matches_the_golden_model(full_build):
    # The same vectors through ptocube.model.numeric.fma_f32: bit-identical.
    vectors = full_build["pairs"][0] + full_build["mx"][0]
    got = full_build["pairs"][1] + full_build["mx"][1]
    a_values, b_values = decoded_operands(FULL, vectors)
    acc = np.array([v["acc_in"] for v in vectors], dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        golden = f32_to_bits(fma_f32(acc, a_values * b_values))
    mismatches = [i for i, (g, h) in enumerate(zip(golden, got)) if g != h]
    assert not mismatches, f"{len(mismatches)} differ, first {vectors[mismatches[0]]}"


def test_fp8_build():
    # A 4-bit significand build: the narrow product needs extra window bits
    # below it (Fma32.guard_bits) to stay exact.
    rng = random.Random(4)
    types = sorted(FP8_TYPES)
    assert unused(Fma32(FP8)).guard_bits == 19
    check_fma(FP8, make_vectors(FP8, [(a, b) for a in types for b in types], 12, rng))


def test_half_precision_build():
    rng = random.Random(5)
    types = sorted(HALF.float_types)
    check_fma(HALF, make_vectors(HALF, [(a, b) for a in types for b in types], 60, rng))


def sequential_dots(config: NumericConfig, dots) -> list:
    """For each (terms, acc0): acc <- FMA(acc, a_k, b_k) over the terms in order,
    feeding acc_out back to acc_in as a processing element does."""
    harness = MacHarness(config)
    flat = Flat(harness)
    results = []

    async def bench(ctx):
        for terms, acc in dots:
            for term in terms:
                ctx.set(flat.vec_in, flat.pack(acc_in=acc, **{k: int(v) for k, v in term.items()}))
                if harness.latency:
                    await ctx.tick().repeat(harness.latency)
                acc = flat.unpack(ctx.get(flat.vec_out))["acc_out"]
            results.append(acc)

    sim = Simulator(flat)
    if harness.latency:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def _fp32_terms(a_row, b_col):
    return [dict(dtype_a=F, raw_a=_fp32(a), dtype_b=F, raw_b=_fp32(b))
            for a, b in zip(a_row, b_col)]


# mx-k-block-33: E4M3 x E5M2, K = 33, all ones; sA = [0x7F, 0x80], sB = [0x7F, 0x81].
_MX_K33 = [dict(dtype_a=DataType.E4M3, raw_a=0x38, scale_a=0x7F if k < 32 else 0x80,
                scale_en_a=1, dtype_b=DataType.E5M2, raw_b=0x3C,
                scale_b=0x7F if k < 32 else 0x81, scale_en_b=1) for k in range(33)]

#: (terms, initial accumulator, expected result): the spec's matrix vectors.
SPEC_DOTS = [
    # fp32-matmul-2x2: [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]
    (_fp32_terms([1, 2], [5, 7]), 0, _fp32(19)),
    (_fp32_terms([1, 2], [6, 8]), 0, _fp32(22)),
    (_fp32_terms([3, 4], [5, 7]), 0, _fp32(43)),
    (_fp32_terms([3, 4], [6, 8]), 0, _fp32(50)),
    # fp32-matmul-acc: dots [19, 22] on prior C [10, 20] -> [29, 42]
    (_fp32_terms([1, 2], [5, 7]), _fp32(10), _fp32(29)),
    (_fp32_terms([1, 2], [6, 8]), _fp32(20), _fp32(42)),
    # mx-k-block-33: 32 * 1 + (1 * 2) * (1 * 4) = 40; with prior C 3: 43;
    # fp32-matmul-bias: the bias is one more RNE add, here as bias * 1.0.
    (_MX_K33, 0, _fp32(40)),
    (_MX_K33, _fp32(3), _fp32(43)),
    (_fp32_terms([2], [1]), _fp32(40), _fp32(42)),
    # An all -0 product dot product from +0 stays +0.
    (_fp32_terms([-0.0, 0.0, -1.0], [1.0, -1.0, 0.0]), 0, 0),
]


@pytest.mark.parametrize("stages", [0, 3])
def test_spec_matrix_vectors(stages):
    config = replace(FULL, fma_stages=stages)
    got = sequential_dots(config, [(terms, acc0) for terms, acc0, _ in SPEC_DOTS])
    assert got == [expected for *_, expected in SPEC_DOTS]


def test_fma_needs_a_float_build():
    construction_error(ValueError, "floating", lambda: Fma32(NumericConfig(input_types={DataType.S8})))


@pytest.mark.slow
@pytest.mark.parametrize("stages", [0, 1, 3, 4, 5])
def test_fp32_sweep(stages):
    rng = random.Random(1000 + stages)
    config = replace(FULL, fma_stages=stages)
    check_fma(config, make_vectors(config, [(DataType.FP32, DataType.FP32)], 20_000, rng))


@pytest.mark.slow
def test_all_pairs_sweep():
    rng = random.Random(1001)
    pairs = [(a, b) for a in FLOAT_TYPES for b in FLOAT_TYPES]
    check_fma(FULL, make_vectors(FULL, pairs, 250, rng))


@pytest.mark.slow
@pytest.mark.parametrize("config", [FP8, HALF], ids=["fp8", "half"])
def test_narrow_builds_sweep(config):
    rng = random.Random(1002)
    types = sorted(config.float_types)
    check_fma(config, make_vectors(config, [(a, b) for a in types for b in types], 800, rng))


# ---------------------------------------------------------------------------
# IntMac tests
# ---------------------------------------------------------------------------

INT_EXTREMES = [0, 1, 0x7, 0x8, 0xF, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF]


def int_vectors(config, count, rng):
    signed = [t for t in sorted(config.int_types) if t.name.startswith("S")]
    unsigned = [t for t in sorted(config.int_types) if t.name.startswith("U")]
    vectors = []
    for cls in (signed, unsigned):
        for dtype_a in cls:
            for dtype_b in cls:
                for _ in range(count):
                    raw = [rng.choice(INT_EXTREMES) if rng.random() < 0.3 else rng.getrandbits(16)
                           for _ in "ab"]
                    acc = rng.choice([0, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, rng.getrandbits(32)])
                    vectors.append(dict(dtype_a=dtype_a, raw_a=raw[0], dtype_b=dtype_b,
                                        raw_b=raw[1], acc_in=acc))
    return vectors


def check_int_mac(config, vectors):
    got = run_harness(config, vectors, integer=True)
    for vec, out in zip(vectors, got):
        a, b = (int(decode(vec[f"dtype_{s}"], [vec[f"raw_{s}"] & ((1 << vec[f"dtype_{s}"].bits) - 1)])[0])
                for s in "ab")
        want = (vec["acc_in"] + a * b) % (1 << 32)
        assert out == want, f"{vec}: got {out:#x}, want {want:#x}"


INT_ALL = NumericConfig(input_types={DataType.S16, DataType.S8, DataType.S4X2,
                                     DataType.U16, DataType.U8, DataType.U4X2})


@pytest.mark.parametrize("product_register", [False, True])
@pytest.mark.parametrize("stages", [0, 1, 2])
def test_int_mac_wraps_modulo_2_32(stages, product_register):
    rng = random.Random(7 + stages + 3 * product_register)
    config = NumericConfig(input_types=INT_ALL.input_types, int_mac_stages=stages,
                           int_product_register=product_register)
    check_int_mac(config, int_vectors(config, 40, rng))


def test_int_product_register_needs_an_integer_only_build():
    construction_error(ValueError, "integer-only",
                       lambda: NumericConfig(int_product_register=True))


def test_int_mac_in_a_full_build():
    # The decoder's integer port also works next to the float logic.
    rng = random.Random(9)
    check_int_mac(FULL, int_vectors(FULL, 10, rng))


def test_int_mac_extremes():
    # S16 * S16 at -32768^2 = 2^30 and U16 * U16 at 65535^2, both wrapping the accumulator.
    vectors = [dict(dtype_a=DataType.S16, raw_a=0x8000, dtype_b=DataType.S16, raw_b=0x8000,
                    acc_in=0x7FFFFFFF),
               dict(dtype_a=DataType.U16, raw_a=0xFFFF, dtype_b=DataType.U16, raw_b=0xFFFF,
                    acc_in=0x0001FFFF)]
    assert run_harness(INT_ALL, vectors, integer=True) == [0xBFFFFFFF, 0x00000000]


def test_int_mac_needs_an_integer_build():
    construction_error(ValueError, "integer", lambda: IntMac(NumericConfig(input_types={DataType.FP16})))
