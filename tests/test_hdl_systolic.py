"""SystolicArray (hdl/systolic.py, hdl/pe.py) against the golden model, word for word.

Every test drives whole M x N x K products through the array with the
simulation sequencer of ``ptocube.sim.bench_systolic`` (tiling, slot
interleaving, fill/drain exchanges, random stalls on all three streams) and
compares each result bit pattern with ``ptocube.model.numeric.matmul_float``
/ ``matmul_int`` on the same raw inputs, scales and initial accumulators.
Operands are heavy in special values (signed zeros, infinities, NaNs with
payloads, subnormals, extremes, must-be-zero carrier bits set).

pysim runs a 2 x 2 full-type array at a few hundred cycles per second, so the
default suite uses 2 x 2 float arrays, small shapes and K up to 40; the
``slow`` tests sweep every MX pair, larger arrays and the issue's 64 x 64 x 256
utilization targets.
"""

import gc
import json
import warnings

import numpy as np
import pytest
from amaranth.hdl import (Fragment, Instance, Module, Signal, UnusedElaboratable, Value,
                          signed)
from amaranth.sim import Simulator

from ptocube.build.pnr import DEVICES, synthesize
from ptocube.hdl.config import CubeConfig
from ptocube.hdl.fma import Fma32
from ptocube.hdl.input_decoder import InputDecoder
from ptocube.hdl.int_mac import Ecp5Multiplier, IntMac
from ptocube.hdl.numeric_types import NumericConfig
from ptocube.hdl.pe import ProcessingElement
from ptocube.hdl.systolic import SystolicArray
from ptocube.model.datatype import DataType, MX_MATRIX_TYPES, MX_SCALED_TYPES, NumClass
from ptocube.model.numeric import MX_BLOCK, decode
from ptocube.sim.bench_systolic import (MatmulJob, pack_layout, predict_cycles,
                                        run_matmuls)

D = DataType
FLOAT_TYPES = [D.FP32, D.TF32, D.HF32, D.FP16, D.BF16, D.HiF8, D.E4M3, D.E5M2, D.E3M2,
               D.E2M3, D.E2M1X2, D.E1M2X2]
SIGNED_TYPES = [D.S16, D.S8, D.S4X2]
UNSIGNED_TYPES = [D.U16, D.U8, D.U4X2]
MX_TYPES = sorted(MX_MATRIX_TYPES)

INT_ONLY = dict(float_types=False, mx_types=False)

# Special bit patterns of the wide float types: signed zeros, infinities,
# quiet and signalling NaNs with payloads, extremes, subnormals, 1.0.
WIDE_SPECIALS = {
    D.FP32: [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
             0xFFC12345, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x807FFFFF, 0x00800000,
             0x3F800000],
    D.FP16: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x7BFF, 0xFBFF, 0x0001,
             0x83FF, 0x0400, 0x3C00],
    D.BF16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x7F7F, 0xFF7F, 0x0001,
             0x807F, 0x0080, 0x3F80],
}
WIDE_SPECIALS[D.TF32] = WIDE_SPECIALS[D.HF32] = WIDE_SPECIALS[D.FP32]


# ---------------------------------------------------------------------------
# Operand generators
# ---------------------------------------------------------------------------

def float_operand(rng, dtype, shape, special=0.15, wild=0.1):
    """Raw patterns: mostly moderate values, some specials, some random codes."""
    size = int(np.prod(shape))
    if dtype.bits <= 8:
        codes = np.arange(1 << dtype.bits)
        values = decode(dtype, codes)
        finite = np.isfinite(values)
        magnitude = np.abs(np.where(finite, values, 0))
        nonzero = magnitude[magnitude > 0]
        special_mask = ~finite | (values == 0) | (magnitude == nonzero.max()) \
            | (magnitude == nonzero.min())
        moderate = codes[finite & (magnitude >= 2.0 ** -4) & (magnitude <= 2.0 ** 4)]
        specials = codes[special_mask]
        base = rng.choice(moderate, size)
    else:
        normal = rng.normal(0.0, 3.0, size)
        if dtype is D.FP16:
            base = normal.astype(np.float16).view(np.uint16).astype(np.int64)
        elif dtype is D.BF16:
            base = (normal.astype(np.float32).view(np.uint32) >> 16).astype(np.int64)
        else:
            # FP32 bits; TF32/HF32 keep their must-be-zero low bits random (R10).
            base = normal.astype(np.float32).view(np.uint32).astype(np.int64)
        specials = np.array(WIDE_SPECIALS[dtype])
    pick = rng.random(size)
    raw = np.where(pick < special, rng.choice(specials, size), base)
    raw = np.where(pick > 1 - wild, rng.integers(0, 1 << dtype.bits, size), raw)
    return raw.reshape(shape)


def int_operand(rng, dtype, shape, extreme=0.2):
    """Random patterns with the type's extremes (most negative, largest) mixed in."""
    size = int(np.prod(shape))
    bits = dtype.bits
    extremes = [0, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1]
    raw = rng.integers(0, 1 << bits, size)
    raw = np.where(rng.random(size) < extreme, rng.choice(extremes, size), raw)
    return raw.reshape(shape)


def fp32_acc(rng, shape):
    return float_operand(rng, D.FP32, shape, special=0.25).astype(np.uint32)


def scales(rng, shape):
    """E8M0 scales near 1 with the extremes 0x00, 0xFE and the NaN 0xFF mixed in."""
    size = int(np.prod(shape))
    raw = rng.integers(0x70, 0x90, size)
    pick = rng.random(size)
    raw = np.where(pick < 0.08, 0x00, raw)
    raw = np.where((pick >= 0.08) & (pick < 0.16), 0xFE, raw)
    raw = np.where((pick >= 0.16) & (pick < 0.22), 0xFF, raw)
    return raw.reshape(shape)


def make_job(rng, a_type, b_type, m, n, k, acc=False, mx=False):
    gen = float_operand if a_type.num_class is NumClass.FLOAT else int_operand
    a = gen(rng, a_type, (m, k))
    b = gen(rng, b_type, (k, n))
    blocks = -(-k // MX_BLOCK)
    a_scale = scales(rng, (m, blocks)) if mx and a_type in MX_SCALED_TYPES else None
    b_scale = scales(rng, (blocks, n)) if mx and b_type in MX_SCALED_TYPES else None
    acc0 = None
    if acc:
        acc0 = (fp32_acc(rng, (m, n)) if a_type.num_class is NumClass.FLOAT
                else rng.integers(0, 1 << 32, (m, n), dtype=np.uint64).astype(np.uint32))
    return MatmulJob(a_type, b_type, a, b, a_scale, b_scale, acc0)


def check(array, jobs, **stalls):
    """Run ``jobs`` and compare every result word with the golden model."""
    results, stats = run_matmuls(array, jobs, **stalls)
    for index, (job, got) in enumerate(zip(jobs, results)):
        want = job.reference()
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)[0]
            pytest.fail(f"job {index} ({job.a_type.name} x {job.b_type.name}, shape "
                        f"{job.shape}, acc={job.acc0 is not None}): element {tuple(bad)} "
                        f"is {int(got[tuple(bad)]):#010x}, model {int(want[tuple(bad)]):#010x}")
    return stats


# ---------------------------------------------------------------------------
# Integer products
# ---------------------------------------------------------------------------

def test_integer_pairs_on_4x4():
    """Every signed and unsigned type pair; K = 1, 2, 7, 33; ACC; stalls everywhere."""
    rng = np.random.default_rng(11)
    array = SystolicArray(CubeConfig(rows=4, cols=4, **INT_ONLY))
    assert array.slots == 1
    jobs = []
    for types in (SIGNED_TYPES, UNSIGNED_TYPES):
        for index, a_type in enumerate(types):
            for offset, b_type in enumerate(types):
                k = (1, 2, 7, 33)[(index + offset) % 4]
                m, n = rng.integers(1, 7, 2)
                jobs.append(make_job(rng, a_type, b_type, m, n, k, acc=bool(offset % 2)))
    check(array, jobs, feed_gap=0.2, fill_gap=0.2, drain_stall=0.2, seed=1)


def test_integer_interleaved_slots_heavy_stalls():
    """Three interleaved slots on a 3 x 2 array, half of all stream cycles stalled."""
    rng = np.random.default_rng(12)
    array = SystolicArray(CubeConfig(rows=3, cols=2, **INT_ONLY), slots=3)
    jobs = [make_job(rng, D.S16, D.S16, 7, 5, 9, acc=True),
            make_job(rng, D.U4X2, D.U16, 4, 3, 1),
            make_job(rng, D.S8, D.S4X2, 2, 7, 3, acc=True),
            make_job(rng, D.U8, D.U8, 6, 6, 2)]
    check(array, jobs, feed_gap=0.5, fill_gap=0.5, drain_stall=0.5, seed=2)


def test_integer_wraps_modulo_2_32():
    """Sums that overflow 32 bits wrap (S16 extremes, U16 maxima, huge ACC values)."""
    array = SystolicArray(CubeConfig(rows=2, cols=2, **INT_ONLY))
    k = 40
    s_min = np.full((2, k), 0x8000)                       # -32768
    u_max = np.full((2, k), 0xFFFF)
    jobs = [MatmulJob(D.S16, D.S16, s_min, s_min.T.copy()),
            MatmulJob(D.U16, D.U16, u_max, u_max.T.copy(),
                      acc0=np.full((2, 2), 0xFFFFFFFF, dtype=np.uint32))]
    results, _ = run_matmuls(array, jobs)
    assert (results[0] == (40 * 2 ** 30) % 2 ** 32).all()
    assert (results[1] == (40 * 0xFFFF ** 2 + 0xFFFFFFFF) % 2 ** 32).all()
    for job, got in zip(jobs, results):
        assert np.array_equal(got, job.reference())


# ---------------------------------------------------------------------------
# The ECP5 forms of the integer MAC (ecp5-int8): product register, DSP primitive
# ---------------------------------------------------------------------------

def test_integer_product_register_forms():
    """ecp5-int8's MAC pipeline (product registered, L = 1) with the fabric multiplier and
    with the DSP primitive's registers (and its edge register): both exact under stalls.
    Against the plain array (sum registered only) the swap distance grows by the product
    register and the edge registers, and a run of beat-bound groups by as many cycles."""
    rng = np.random.default_rng(13)
    jobs = [make_job(rng, D.S16, D.S16, 5, 7, 9, acc=True),
            make_job(rng, D.U16, D.U8, 3, 4, 1),
            make_job(rng, D.S8, D.S4X2, 7, 5, 30, acc=True),
            make_job(rng, D.U4X2, D.U16, 2, 9, 3)]
    plain = SystolicArray(CubeConfig(rows=3, cols=4, **INT_ONLY))
    cycles = {None: check(plain, jobs[2:3]).cycles}
    for dsp in (None, "ecp5"):
        array = SystolicArray(CubeConfig(rows=3, cols=4, int_product_register=True,
                                         dsp_primitives=dsp, **INT_ONLY))
        extra = 1 + (dsp is not None)
        assert array.edge_stages == (dsp is not None)
        assert (array.slots, array.swap_distance) == (1, plain.swap_distance + extra)
        check(array, jobs, feed_gap=0.3, fill_gap=0.3, drain_stall=0.3, seed=13)
        assert check(array, jobs[2:3]).cycles == cycles[None] + extra, dsp


def test_dsp_primitive_instance():
    """For an ECP5, the MULT18X18D's configuration and pins: operand bits k on A<k>/B<k>,
    product bits on P<k>, signed, input and output registers on the sync clock, always
    enabled."""
    mult = Ecp5Multiplier()
    (inst, name, _), = Fragment.get(mult, DEVICES["LFE5U-85F-6BG381"]).subfragments
    assert isinstance(inst, Instance) and inst.type == "MULT18X18D"
    params = {key: str(value) for key, value in inst.parameters.items()}
    assert {key: params.get(key, "NONE") for key in (
        "REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_PIPELINE_CLK", "REG_OUTPUT_CLK",
        "REG_INPUTA_CE", "REG_OUTPUT_CE", "REG_INPUTA_RST", "REG_OUTPUT_RST")} == {
        "REG_INPUTA_CLK": "CLK0", "REG_INPUTB_CLK": "CLK0", "REG_PIPELINE_CLK": "NONE",
        "REG_OUTPUT_CLK": "CLK0", "REG_INPUTA_CE": "CE0", "REG_OUTPUT_CE": "CE0",
        "REG_INPUTA_RST": "RST0", "REG_OUTPUT_RST": "RST0"}
    ports = {key: value for key, (value, _) in inst.ports.items()}
    assert repr(ports.pop("CLK0")) == "(clk sync)"
    assert {key: ports.pop(key).value for key in ("CE0", "RST0", "SIGNEDA", "SIGNEDB")} == {
        "CE0": 1, "RST0": 0, "SIGNEDA": 1, "SIGNEDB": 1}
    for port, signal, width in (("A", mult.a, 18), ("B", mult.b, 18), ("P", mult.p, 36)):
        for k in range(width):
            bit = ports.pop(f"{port}{k}")
            assert bit.value is Value.cast(signal) and (bit.start, bit.stop) == (k, k + 1)
    assert not ports                                  # SRIA/SRIB, C, SOURCE*: tied off
    assert Ecp5Multiplier.latency == 2


@pytest.mark.parametrize("platform", [None, DEVICES["iCE40UP5K-SG48"]], ids=["none", "ice40"])
def test_dsp_primitive_model(platform):
    """Anywhere but on an ECP5 the primitive is its behavioural model: no Instance, and
    ``p`` is the signed product of the ``a``, ``b`` of two cycles earlier (the extremes
    included), as the MULT18X18D with its input and output registers gives it (F47)."""
    mult = Ecp5Multiplier()
    assert not any(isinstance(sub, Instance)
                   for sub, *_ in Fragment.get(mult, platform).subfragments)
    rng = np.random.default_rng(47)
    pairs = [(-2 ** 17, -2 ** 17), (2 ** 17 - 1, -2 ** 17), (-1, 1), (0, 5)]
    pairs += [tuple(int(v) for v in rng.integers(-2 ** 17, 2 ** 17, 2)) for _ in range(40)]
    seen = []

    async def bench(ctx):
        for a, b in pairs + [(0, 0)] * Ecp5Multiplier.latency:
            ctx.set(mult.a, a)
            ctx.set(mult.b, b)
            await ctx.tick()
            seen.append(ctx.get(mult.p))

    sim = Simulator(mult)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen[Ecp5Multiplier.latency - 1:-1] == [a * b for a, b in pairs]


def test_dsp_primitive_synthesized(tmp_path):
    """yosys keeps the configured MULT18X18D, and the MAC's only fabric flip-flops are
    the 32-bit sum: the operand and product registers are the DSP's."""
    numeric = NumericConfig.from_cube_config(
        CubeConfig(int_product_register=True, dsp_primitives="ecp5", **INT_ONLY))
    netlist = json.loads(synthesize(IntMac(numeric), DEVICES["LFE5U-85F-6BG381"],
                                    tmp_path).read_text())
    cells = [c for module in netlist["modules"].values() for c in module["cells"].values()]
    dsps = [c for c in cells if c["type"] == "MULT18X18D"]
    assert len(dsps) == 1
    assert {k: dsps[0]["parameters"][k] for k in
            ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_OUTPUT_CLK")} == dict.fromkeys(
        ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_OUTPUT_CLK"), "CLK0")
    assert sum(c["type"] == "TRELLIS_FF" for c in cells) == 32


def test_dsp_primitive_configuration_errors():
    construction_error(ValueError, "needs int_product_register", lambda: SystolicArray(
        CubeConfig(dsp_primitives="ecp5", **INT_ONLY)))
    construction_error(ValueError, "None or 'ecp5'", lambda: SystolicArray(
        CubeConfig(int_product_register=True, dsp_primitives="ice40", **INT_ONLY)))


# ---------------------------------------------------------------------------
# Floating-point products (full-type build, fma_stages = 3, so L = 3)
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_2x2():
    return SystolicArray(CubeConfig(rows=2, cols=2))


def test_float_pairs_mixed_within_class(full_2x2):
    """Each of the 12 float types on each side, specials, ACC, K = 1/4/9, and
    integer products in between (the slot class changes from one group to the next)."""
    rng = np.random.default_rng(21)
    assert full_2x2.slots == 3
    jobs = []
    for index, a_type in enumerate(FLOAT_TYPES):
        for offset in (1, 5):
            b_type = FLOAT_TYPES[(index + offset) % len(FLOAT_TYPES)]
            k = (1, 4, 9)[(index + offset) % 3]
            m, n = rng.integers(1, 4, 2)
            jobs.append(make_job(rng, a_type, b_type, m, n, k, acc=offset == 5))
        if index % 4 == 3:
            jobs.append(make_job(rng, D.S8, D.S4X2, 3, 2, 3, acc=True))
    check(full_2x2, jobs, feed_gap=0.15, fill_gap=0.15, drain_stall=0.15, seed=3)


def test_mx_pairs_with_scales(full_2x2):
    """MX pairs, scales incl. 0x00 / 0xFE / 0xFF, K across one and two 32-blocks."""
    rng = np.random.default_rng(22)
    jobs = []
    for index, a_type in enumerate(MX_TYPES):
        b_type = MX_TYPES[(index + 2) % len(MX_TYPES)]
        k = (33, 40, 5)[index % 3]
        jobs.append(make_job(rng, a_type, b_type, 2, 3, k, acc=index % 2 == 1, mx=True))
    # The spec's K-block vector: 32 * 1 + (1 * 2) * (1 * 4) = 40, then with C = 3.
    one_e4m3, one_e5m2 = 0x38, 0x3C
    jobs.append(MatmulJob(D.E4M3, D.E5M2, np.full((1, 33), one_e4m3), np.full((33, 1), one_e5m2),
                          a_scale=np.array([[0x7F, 0x80]]), b_scale=np.array([[0x7F], [0x81]])))
    jobs.append(MatmulJob(D.E4M3, D.E5M2, np.full((1, 33), one_e4m3), np.full((33, 1), one_e5m2),
                          a_scale=np.array([[0x7F, 0x80]]), b_scale=np.array([[0x7F], [0x81]]),
                          acc0=np.array([[0x40400000]], dtype=np.uint32)))
    results, _ = run_matmuls(full_2x2, jobs, feed_gap=0.1, drain_stall=0.1, seed=4)
    assert results[-2][0, 0] == 0x42200000                       # 40.0
    assert results[-1][0, 0] == 0x422C0000                       # 43.0
    for index, (job, got) in enumerate(zip(jobs, results)):
        assert np.array_equal(got, job.reference()), f"job {index}"


def test_special_accumulators_survive_bubbles(full_2x2):
    """Initial values NaN (with payload), +-inf, -0, subnormal; an all -0 chain; and
    integer sums whose bits look like FP32 NaNs, which the idle cycles between a
    chain's last term and its swap must not touch (bubbles keep the slot's class)."""
    acc0 = np.array([[0x7F800001, 0xFF800000], [0x80000000, 0x00000001]], dtype=np.uint32)
    neg_zero = np.full((2, 3), 0x8000)                    # FP16 -0
    one = np.full((3, 2), 0x3C00)
    int_nans = np.array([[0x7F800001, 0xFFC00001], [0x7FFFFFFF, 0x80000000]], dtype=np.uint32)
    jobs = [MatmulJob(D.FP16, D.FP16, neg_zero, one, acc0=acc0),
            MatmulJob(D.FP16, D.FP16, neg_zero, one),
            MatmulJob(D.FP16, D.FP16, neg_zero, one,
                      acc0=np.full((2, 2), 0x80000000, dtype=np.uint32)),
            MatmulJob(D.U8, D.U8, np.zeros((2, 3), int), np.full((3, 2), 0xFF), acc0=int_nans)]
    results, stats = run_matmuls(full_2x2, jobs)
    # Without stalls the float array keeps the documented schedule.
    assert stats.cycles == predict_cycles(full_2x2, jobs)
    assert results[0].tolist() == [[0x7FC00000, 0xFF800000], [0x80000000, 0x00000001]]
    assert (results[1] == 0).all()              # +0 + (-0) ... = +0
    assert (results[2] == 0x80000000).all()     # -0 + (-0) ... = -0
    assert np.array_equal(results[3], int_nans)
    for job, got in zip(jobs, results):
        assert np.array_equal(got, job.reference())


@pytest.mark.parametrize("fma_stages", [0, 5])
def test_float_only_builds_other_fma_latencies(fma_stages):
    """L = 1 (combinational FMA, padded by one register) and L = 5."""
    rng = np.random.default_rng(30 + fma_stages)
    array = SystolicArray(CubeConfig(rows=2, cols=2, int_types=False, fma_stages=fma_stages))
    assert array.slots == max(1, fma_stages)
    jobs = [make_job(rng, D.FP32, D.E2M3, 3, 2, 5, acc=True),
            make_job(rng, D.E2M1X2, D.BF16, 2, 3, 3),
            make_job(rng, D.E5M2, D.E4M3, 2, 2, 34, acc=True, mx=True)]
    check(array, jobs, feed_gap=0.2, fill_gap=0.2, drain_stall=0.2, seed=5)


# ---------------------------------------------------------------------------
# Structure, protocol and cycle counts
# ---------------------------------------------------------------------------

def _origins(fragment):
    """Every elaboratable of a design hierarchy."""
    found = list(fragment.origins or ())
    for sub, _, _ in fragment.subfragments:
        found += _origins(sub)
    return found


def test_integer_build_has_no_float_logic():
    array = SystolicArray(CubeConfig(rows=2, cols=3, **INT_ONLY))
    origins = _origins(Fragment.get(array, None))
    assert not any(isinstance(o, Fma32) for o in origins)
    assert sum(isinstance(o, IntMac) for o in origins) == 6
    decoders = [o for o in origins if isinstance(o, InputDecoder)]
    assert len(decoders) == 5                         # one per row + one per column
    assert all(not hasattr(d, "fp") for d in decoders)
    assert "a_scale" not in dict(array.feed.payload.shape())


def test_full_build_has_both_units_and_edge_decoders():
    array = SystolicArray(CubeConfig(rows=2, cols=3))
    origins = _origins(Fragment.get(array, None))
    assert sum(isinstance(o, Fma32) for o in origins) == 6
    assert sum(isinstance(o, IntMac) for o in origins) == 6
    assert sum(isinstance(o, InputDecoder) for o in origins) == 5


def construction_error(exc_type, match, factory):
    """Assert that ``factory()`` raises; hide the half-built component's unused warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc_type, match=match):
            factory()
        gc.collect()


def test_configuration_errors():
    construction_error(TypeError, "CubeConfig", lambda: SystolicArray(object()))
    construction_error(ValueError, "at least 3",
                       lambda: SystolicArray(CubeConfig(rows=2, cols=2), slots=2))
    int_numeric = NumericConfig.from_cube_config(CubeConfig(**INT_ONLY))
    construction_error(ValueError, "at least 1",
                       lambda: ProcessingElement(int_numeric, slots=0))
    construction_error(TypeError, "NumericConfig", lambda: ProcessingElement(None, slots=1))
    with pytest.raises(ValueError, match=r"\[M, K\] and \[K, N\]"):
        MatmulJob(D.S8, D.S8, np.zeros((2, 3), int), np.zeros((2, 3), int))
    with pytest.raises(ValueError, match="K must be at least 1"):
        MatmulJob(D.S8, D.S8, np.zeros((2, 0), int), np.zeros((0, 3), int))
    with pytest.raises(ValueError, match="not a scaled MX type"):
        MatmulJob(D.FP16, D.E4M3, np.zeros((1, 1), int), np.zeros((1, 1), int),
                  a_scale=np.zeros((1, 1), int))


def test_feed_protocol_directed():
    """Phase gating, first beats waiting for the exchange, drain skip after reset."""
    array = SystolicArray(CubeConfig(rows=2, cols=2, **INT_ONLY), slots=2)
    feed_shape = array.feed.payload.shape()
    fill_shape = array.fill.payload.shape()
    log = {}

    def beat(slot, first, a=(0, 0), b=(0, 0), null=0):
        return pack_layout(feed_shape, {"a": a, "b": b, "a_type": D.S8, "b_type": D.S8,
                                        "slot": slot, "first": first, "null": null})

    async def bench(ctx):
        feed, fill, drain = array.feed, array.fill, array.drain

        async def send(word):
            ctx.set(feed.payload.as_value(), word)
            ctx.set(feed.valid, 1)
            waited = 0
            while not ctx.get(feed.ready):
                await ctx.tick()
                waited += 1
            await ctx.tick()
            ctx.set(feed.valid, 0)
            return waited

        async def exchange(rows, drained):
            ctx.set(fill.valid, 1)
            ctx.set(drain.ready, 1)
            for row in rows:
                ctx.set(fill.payload.as_value(), pack_layout(fill_shape, {"data": row}))
                while not ctx.get(fill.ready):
                    await ctx.tick()
                if ctx.get(drain.valid):
                    word = ctx.get(drain.payload.as_value())
                    drained.append([(word >> (32 * j)) & 0xFFFFFFFF for j in range(2)])
                await ctx.tick()
            ctx.set(fill.valid, 0)

        # Right after reset the chain registers need their first exchange:
        # a first beat is refused, whatever the phase.
        ctx.set(feed.payload.as_value(), beat(0, 1))
        ctx.set(feed.valid, 1)
        refused = []
        for _ in range(4):
            refused.append(ctx.get(feed.ready))
            await ctx.tick()
        log["refused_before_fill"] = refused
        ctx.set(feed.valid, 0)
        drained = []
        # Initial values of group 1: row 0 slot 0, row 0 slot 1, row 1 slot 0, row 1 slot 1.
        await exchange([[100, 101], [200, 201], [110, 111], [210, 211]], drained)
        log["drained_after_reset"] = list(drained)
        # A beat for slot 1 offered in a phase-0 cycle waits exactly one cycle at most.
        waits = [await send(beat(1, 1, a=(1, 2), b=(3, 4)))]
        waits.append(await send(beat(0, 1, a=(1, 1), b=(1, 1), null=0)))
        # Slot 0 starting again before the exchange is refused until it ends.
        ctx.set(feed.payload.as_value(), beat(0, 1, null=1))
        ctx.set(feed.valid, 1)
        stalled = 0
        for _ in range(12):
            stalled += 1 - ctx.get(feed.ready)
            await ctx.tick()
        log["second_first_refused"] = stalled
        ctx.set(feed.valid, 0)
        await exchange([[0, 0]] * 4, drained)   # drains nothing: second exchange after reset
        log["drained_second"] = list(drained)
        log["waits"] = waits

    sim = Simulator(array)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert log["refused_before_fill"] == [0, 0, 0, 0]
    assert log["drained_after_reset"] == []
    assert log["drained_second"] == []
    assert all(w <= 1 for w in log["waits"])
    assert log["second_first_refused"] == 12


def test_group_results_and_load_through_exchange():
    """Load flags pick the filled values per (row, slot); results come back tagged."""
    array = SystolicArray(CubeConfig(rows=2, cols=2, **INT_ONLY), slots=2)
    # Two jobs with ACC on the same array: slot order and row order must line up.
    rng = np.random.default_rng(40)
    jobs = [make_job(rng, D.S8, D.S8, 4, 2, 3, acc=True), make_job(rng, D.U8, D.U8, 2, 4, 2)]
    check(array, jobs)


@pytest.mark.parametrize("rows,cols,slots,product_register",
                         [(2, 3, 1, False), (3, 2, 3, False), (4, 4, 2, False), (3, 2, 1, True)])
def test_cycle_counts_match_formula(rows, cols, slots, product_register):
    """Beat-bound (large K) and exchange-bound (small K) schedules, several jobs in a row;
    the product register (``ecp5-int8``) lengthens the swap distance by one."""
    rng = np.random.default_rng(rows * 10 + cols)
    array = SystolicArray(CubeConfig(rows=rows, cols=cols, int_product_register=product_register,
                                     **INT_ONLY), slots=slots)
    for shapes in ([(5, 4, 1)], [(7, 9, 20)], [(8, 3, 2), (3, 3, 30), (1, 1, 1)]):
        jobs = [make_job(rng, D.S8, D.S8, *shape) for shape in shapes]
        stats = check(array, jobs)
        assert stats.cycles == predict_cycles(array, jobs), shapes


def test_utilization_small_arrays():
    """Near-full use on a 4 x 4 array with the slot count of the float build too."""
    rng = np.random.default_rng(50)
    job = make_job(rng, D.S8, D.S8, 12, 8, 64)          # 6 output blocks
    for slots, target in ((1, 0.95), (3, 0.90)):
        array = SystolicArray(CubeConfig(rows=4, cols=4, **INT_ONLY), slots=slots)
        stats = check(array, [job])
        assert stats.cycles == predict_cycles(array, [job])
        assert stats.utilization >= target, stats.utilization


# ---------------------------------------------------------------------------
# Slow: larger sweeps and the issue's utilization targets
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_slow_all_mx_pairs():
    rng = np.random.default_rng(60)
    array = SystolicArray(CubeConfig(rows=2, cols=2))
    jobs = [make_job(rng, a, b, 3, 3, (33, 64, 70)[(i + j) % 3], acc=(i + j) % 2 == 0, mx=True)
            for i, a in enumerate(MX_TYPES) for j, b in enumerate(MX_TYPES)]
    check(array, jobs, feed_gap=0.1, fill_gap=0.1, drain_stall=0.1, seed=6)


@pytest.mark.slow
def test_slow_all_float_pairs_4x4():
    rng = np.random.default_rng(61)
    array = SystolicArray(CubeConfig(rows=4, cols=4))
    jobs = [make_job(rng, a, b, 5, 6, (1, 9, 40)[(i + j) % 3], acc=(i * j) % 2 == 1)
            for i, a in enumerate(FLOAT_TYPES) for j, b in enumerate(FLOAT_TYPES)]
    check(array, jobs, feed_gap=0.1, fill_gap=0.1, drain_stall=0.1, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("fma_stages", [1, 2, 4])
def test_slow_full_builds_other_latencies(fma_stages):
    rng = np.random.default_rng(70 + fma_stages)
    array = SystolicArray(CubeConfig(rows=3, cols=2, fma_stages=fma_stages))
    jobs = [make_job(rng, a, b, 4, 3, 35, acc=True, mx=a in MX_SCALED_TYPES)
            for a, b in ((D.FP32, D.FP16), (D.E4M3, D.E2M1X2), (D.S16, D.S4X2),
                         (D.HiF8, D.TF32), (D.U4X2, D.U16))]
    check(array, jobs, feed_gap=0.3, fill_gap=0.3, drain_stall=0.3, seed=8)


@pytest.mark.slow
def test_slow_integer_sweep_8x8():
    rng = np.random.default_rng(80)
    array = SystolicArray(CubeConfig(rows=8, cols=8, **INT_ONLY))
    jobs = [make_job(rng, a, b, 17, 13, 45, acc=True)
            for types in (SIGNED_TYPES, UNSIGNED_TYPES) for a in types for b in types]
    check(array, jobs, feed_gap=0.2, fill_gap=0.2, drain_stall=0.2, seed=9)


@pytest.mark.slow
@pytest.mark.parametrize("slots,target", [(1, 0.90), (3, 0.80)])
def test_slow_issue_utilization_targets(slots, target):
    """S8 (L = 1) and the FP16 build's schedule (L = 3) at M = N = 64, K = 256 on 8 x 8."""
    rng = np.random.default_rng(90)
    job = make_job(rng, D.S8, D.S8, 64, 64, 256)
    array = SystolicArray(CubeConfig(rows=8, cols=8, **INT_ONLY), slots=slots)
    stats = check(array, [job])
    assert stats.cycles == predict_cycles(array, [job])
    assert stats.utilization >= target
