"""The CUBE execution engine (hdl/cube.py) against the golden model, word for word.

Every case is a model State and a bundle that passed the model's preflight
(:mod:`cube_cases`); the plan is encoded with :meth:`PlanLayout.encode`, the state is laid
out in a testbench tile store full of garbage (:mod:`cube_bench_store`), and the engine's
output payloads - D's whole CELLs and the row-major outputs' rows, padding included - and
its flags are compared with :func:`ptocube.model.execute.execute_matrix`.  Cases of one test
run back to back in one simulation, so the engine also goes from plan to plan as it would
in the unit.  ``slow`` tests add thousands of random plans.
"""

import re

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from ptocube.build.outreg import FABRIC_ATTRIBUTE
from ptocube.hdl.config import PRESETS, CubeConfig
from ptocube.hdl.cube import CubeEngine
from ptocube.hdl.cube_run import block_walker
from ptocube.hdl.numeric_types import NumericConfig
from ptocube.hdl.panel_feed import PanelFeed
from ptocube.hdl.pe import ProcessingElement
from ptocube.hdl.systolic import feed_layout
from ptocube.model.bundle import Operation
from ptocube.model.datatype import DataType
from ptocube.model.layout import Layout, element_offsets
from ptocube.model.postprocess import PREQUANT_MODES

from cube_bench_store import check_against_model, run_engine
from cube_cases import MATRIX_OPS, make_case, random_case, random_raw

FULL = CubeConfig(rows=2, cols=2, tile_bytes_per_pe=64 * 1024, shared_bytes=64 * 1024)
INT = CubeConfig(rows=2, cols=2, float_types=False, mx_types=False,
                 tile_bytes_per_pe=64 * 1024, shared_bytes=64 * 1024)
ODD = CubeConfig(rows=3, cols=2, float_types=False, mx_types=False,
                 tile_bytes_per_pe=64 * 1024, shared_bytes=64 * 1024)
T = DataType


def check(config, jobs, **kw):
    """Run ``jobs`` (``(state, plan)`` pairs) on one engine and compare each with the model."""
    runs = run_engine(CubeEngine(config), jobs, **kw)
    for index, ((state, plan), run) in enumerate(zip(jobs, runs)):
        try:
            check_against_model(state, plan, run)
        except AssertionError as error:
            f = plan.bundle.fpatr
            raise AssertionError(
                f"case {index}: {plan.op.name} {plan.a_type.name} x {plan.b_type.name} "
                f"{plan.m}x{plan.n}x{plan.k} mask {plan.bundle.pe_mask:04b} shared "
                f"{plan.shared} {f}: {error}") from None
    return runs


def cases(seed, config, specs):
    rng = np.random.default_rng(seed)
    return [make_case(rng, config, **spec) for spec in specs]


def test_each_function():
    """All twelve Matrix functions, random types and post-processing, small shapes."""
    check(FULL, cases(1, FULL, [{"op": op, "max_mnk": (5, 5, 9)} for op in MATRIX_OPS]))


def test_shapes():
    """1 x 1 x 1, TGEMV, and sizes that are not multiples of R, C or 32."""
    specs = [
        {"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16, "m": 1, "n": 1, "k": 1},
        {"op": Operation.TMATMUL, "a_type": T.S8, "b_type": T.S8, "m": 1, "n": 1, "k": 1},
        {"op": Operation.TGEMV, "a_type": T.BF16, "b_type": T.BF16, "n": 5, "k": 33},
        {"op": Operation.TGEMV_MX, "a_type": T.E4M3, "b_type": T.E2M1X2, "n": 3, "k": 65},
        {"op": Operation.TMATMUL, "a_type": T.E5M2, "b_type": T.E4M3, "m": 3, "n": 5,
         "k": 33},
        {"op": Operation.TMATMUL_MX_ACC, "a_type": T.E1M2X2, "b_type": T.FP16, "m": 5,
         "n": 3, "k": 31},
        {"op": Operation.TMATMUL_BIAS, "a_type": T.S4X2, "b_type": T.S8, "m": 17, "n": 3,
         "k": 7, "m_layout": Layout.CUBE_M32},
    ]
    check(FULL, cases(2, FULL, specs))


FLOAT_PAIRS = [(T.FP16, T.FP16), (T.BF16, T.BF16), (T.FP32, T.FP32), (T.TF32, T.TF32),
               (T.HF32, T.FP32), (T.HiF8, T.E4M3), (T.E5M2, T.E3M2), (T.E2M3, T.E2M1X2),
               (T.E1M2X2, T.E2M1X2)]
MX_PAIRS = [(T.FP16, T.BF16), (T.E4M3, T.E5M2), (T.E2M1X2, T.E1M2X2), (T.E4M3, T.FP16),
            (T.BF16, T.E2M1X2)]
INT_PAIRS = [(T.S16, T.S16), (T.S8, T.S4X2), (T.S4X2, T.S4X2), (T.U16, T.U8),
             (T.U4X2, T.U16), (T.U8, T.U8)]


def test_float_and_mx_type_pairs():
    specs = [{"op": Operation.TMATMUL, "a_type": a, "b_type": b, "max_mnk": (3, 3, 12)}
             for a, b in FLOAT_PAIRS]
    specs += [{"op": Operation.TMATMUL_MX, "a_type": a, "b_type": b, "max_mnk": (3, 3, 40)}
              for a, b in MX_PAIRS]
    check(FULL, cases(3, FULL, specs))


def test_integer_type_pairs():
    """Integer pairs on the integer-only build and on the full build."""
    specs = [{"op": op, "a_type": a, "b_type": b, "max_mnk": (4, 5, 20)}
             for op in (Operation.TMATMUL, Operation.TMATMUL_BIAS)
             for a, b in INT_PAIRS]
    check(INT, cases(4, INT, specs))
    check(FULL, cases(5, FULL, specs[:4]))


def _extreme(rng, role, dtype, shape):
    """Operands that overflow, underflow, cancel and carry NaN/infinity."""
    raw = random_raw(rng, dtype, shape, special=0.3)
    if dtype.bits < 16 or role in ("quant", "alpha"):
        return raw
    bits = dtype.bits
    exp_bits = 5 if dtype is T.FP16 else 8
    frac = bits - 1 - exp_bits
    top = (1 << exp_bits) - 1
    pick = rng.integers(0, 4, shape)
    exp = np.where(pick == 0, top - 1, np.where(pick == 1, 0, np.where(pick == 2, 1, top)))
    sign = rng.integers(0, 2, shape, dtype=np.uint64)
    extreme = (sign << (bits - 1)) | (exp.astype(np.uint64) << frac) | \
        (raw & ((1 << frac) - 1))
    return np.where(rng.random(shape) < 0.5, extreme, raw).astype(np.uint64)


def test_fp_specials_subnormals_overflow_cancellation():
    specs = [{"op": op, "a_type": a, "b_type": a, "max_mnk": (3, 3, 10), "payload": _extreme}
             for op in (Operation.TMATMUL, Operation.TMATMUL_ACC, Operation.TMATMUL_BIAS)
             for a in (T.FP32, T.FP16, T.BF16)]
    specs += [{"op": Operation.TMATMUL_MX_BIAS, "a_type": T.FP16, "b_type": T.E4M3,
               "max_mnk": (3, 3, 40), "payload": _extreme}]
    # Exact cancellation: B column = -A row, so sums are exactly zero.
    def cancel(rng, role, dtype, shape):
        if role == "a":
            return np.full(shape, 0x3C00, dtype=np.uint64)       # FP16 1.0
        if role == "b":
            column = np.where(np.arange(shape[0]) % 2 == 0, 0x4000, 0xC000)   # +2, -2
            return np.repeat(column[:, None], shape[1], axis=1).astype(np.uint64)
        return random_raw(rng, dtype, shape)
    specs.append({"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16, "m": 2,
                  "n": 3, "k": 6, "payload": cancel, "mode": 0, "relu": 0})
    check(FULL, cases(6, FULL, specs))


def test_every_prequant_mode():
    """Every PreQuantMode with a random ReLU mode, on its accumulator's class."""
    specs = []
    for code, row in PREQUANT_MODES.items():
        if row.source is T.FP32 or row.source is None:
            specs.append({"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16,
                          "mode": code, "max_mnk": (3, 5, 6)})
        if row.source in (T.S32, None):
            specs.append({"op": Operation.TMATMUL, "a_type": T.S8, "b_type": T.S8,
                          "mode": code, "max_mnk": (3, 5, 6)})
    check(FULL, cases(7, FULL, specs))


def test_relu_and_reductions():
    """ReLU 0-3, RowMax (with RowMaxInit) and GroupMax, with and without MaxAbs."""
    specs = []
    for relu in range(4):
        for row_max, init, gcode, max_abs in ((True, True, 0, False), (True, False, 1, True),
                                              (False, False, 2, False), (True, True, 5, True)):
            specs.append({"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16,
                          "relu": relu, "row_max": row_max, "row_max_init": init,
                          "gcode": gcode, "max_abs": max_abs, "m": 3,
                          "n": 9 if gcode in (0, 1, 2) else 80, "k": 3, "mask": 0b0010})
    specs += [{"op": Operation.TMATMUL, "a_type": T.S16, "b_type": T.S16, "row_max": True,
               "row_max_init": True, "gcode": 1, "max_abs": True, "m": 3, "n": 16, "k": 2},
              {"op": Operation.TMATMUL, "a_type": T.U16, "b_type": T.U8, "row_max": True,
               "gcode": 2, "m": 4, "n": 32, "k": 2}]
    check(FULL, cases(8, FULL, specs))


def test_acc_masks_and_shared_operands():
    specs = [{"op": Operation.TMATMUL_ACC, "mask": mask, "max_mnk": (3, 3, 8)}
             for mask in (0b1000, 0b0001, 0b0110, 0b1111)]
    specs += [{"op": op, "shared": shared, "trans_a": ta, "trans_b": tb,
               "max_mnk": (4, 4, 64)}
              for op in (Operation.TMATMUL, Operation.TMATMUL_MX_ACC)
              for shared, ta, tb in (("right", False, False), ("right", False, True),
                                     ("both", True, False), ("both", False, True))]
    check(FULL, cases(9, FULL, specs))


def test_random_plans():
    rng = np.random.default_rng(10)
    check(FULL, [random_case(rng, FULL, (6, 7, 20)) for _ in range(16)])
    check(INT, [random_case(rng, INT, (9, 9, 40)) for _ in range(16)])


@pytest.mark.parametrize("dsp", [None, "ecp5"])
def test_integer_build_with_registered_product(dsp):
    # ecp5-int8's MAC pipeline: the product registered, the accumulation loop still one
    # cycle (L = 1), every PE swapping a cycle later; with the DSP primitive's registers
    # (simulated as its model, F47) the operands enter a cycle earlier still.
    config = INT.with_(int_product_register=True, dsp_primitives=dsp)
    assert ProcessingElement.minimum_slots(NumericConfig.from_cube_config(config)) == 1
    rng = np.random.default_rng(12)
    check(config, [random_case(rng, config, (9, 9, 40)) for _ in range(10)])


@pytest.mark.parametrize("preset", ["sim-small", "ecp5-int8"])
def test_panel_words_fabric_attribute(preset):
    # ecp5-int8 keeps the panel feed's word registers out of the block RAMs (F48): they carry
    # the attribute build/outreg.py refuses; elsewhere they may become output registers.
    config = PRESETS[preset]
    numeric = NumericConfig.from_cube_config(config)
    text = rtlil.convert(PanelFeed(config, feed_layout(numeric, config.rows, config.cols, 1), 1,
                                   numeric.has_scale))
    marked = {name for name in ("a_words", "b_words")
              if re.search(rf"attribute \\{FABRIC_ATTRIBUTE} [^\n]*\n"
                           rf"(\s*attribute [^\n]*\n)*\s*wire width \d+ \\{name}\b", text)}
    assert re.search(r"wire width \d+ \\a_words\b", text)
    assert marked == (set() if config.panel_words_outreg else {"a_words", "b_words"})
    assert PRESETS["ecp5-int8"].panel_words_outreg is False


def _lane_path_specs(ops, max_mnk):
    """Runs only the lane path takes: Shared B, Shared A and B, with and without TransA or
    TransB."""
    return [{"op": op, "shared": shared, "trans_a": ta, "trans_b": tb, "max_mnk": max_mnk}
            for op in ops
            for shared, ta, tb in (("right", False, False), ("right", False, True),
                                   ("both", True, False), ("both", False, True))]


def test_serial_lane_feed():
    """``serial_lane_feed``: the lane path one lane at a time gives the model's results on
    the integer, full-type (MX scales, floating BIAS) and odd (3 x 2, slow and stalling
    store) builds, and is the slower feed: the same runs take more cycles than with every
    lane at once."""
    specs = _lane_path_specs((Operation.TMATMUL, Operation.TMATMUL_ACC), (5, 6, 40))
    jobs = cases(21, INT, specs)
    parallel = check(INT, jobs)
    serial = check(INT.with_(serial_lane_feed=True), jobs)
    for p, s in zip(parallel, serial):
        assert s.cycles > p.cycles, (p.cycles, s.cycles)
    full = FULL.with_(serial_lane_feed=True)
    check(full, cases(22, full, _lane_path_specs(
        (Operation.TMATMUL_MX_ACC, Operation.TMATMUL_BIAS, Operation.TMATMUL_MX_BIAS),
        (4, 4, 64))))
    odd = ODD.with_(serial_lane_feed=True)
    rng = np.random.default_rng(23)
    check(odd, [random_case(rng, odd, (9, 7, 40)) for _ in range(10)],
          latency=3, write_stall=0.3, seed=2)


def _walk(rows, cols, slots, m, n):
    """The groups :func:`block_walker` visits, as lists of (row0, col0) per used slot."""
    mod = Module()
    m_dim, n_dim, restart, step = Signal(16), Signal(16), Signal(), Signal()
    blocks, done = block_walker(mod, "w", rows, cols, slots, m_dim, n_dim, restart, step,
                                strides=(Signal(16, init=3), Signal(16, init=5)))
    groups = []

    async def bench(ctx):
        ctx.set(m_dim, m)
        ctx.set(n_dim, n)
        ctx.set(restart, 1)
        await ctx.tick()
        ctx.set(restart, 0)
        ctx.set(step, 1)
        while not ctx.get(done):
            group = []
            for r, c, used, rb, cb in blocks:
                if ctx.get(used):
                    r, c = ctx.get(r), ctx.get(c)
                    # The buffer bases are the block indices times the strides.
                    assert (ctx.get(rb), ctx.get(cb)) == (r // rows * 3, c // cols * 5)
                    group.append((r, c))
            groups.append(group)
            await ctx.tick()

    sim = Simulator(mod)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return groups


@pytest.mark.parametrize("rows, cols, slots, m, n", [
    (2, 2, 3, 5, 9), (2, 2, 3, 9, 5), (2, 2, 1, 4, 4), (3, 2, 2, 7, 8), (3, 3, 3, 4, 10),
    (8, 8, 3, 32, 64)])
def test_block_walker_order(rows, cols, slots, m, n):
    """Block columns outer when N > M on an even number of array columns (decision C14),
    row-major otherwise; L blocks per group, every block once."""
    col_outer = cols % 2 == 0 and n > m
    order = [(r, c) for r in range(0, m, rows) for c in range(0, n, cols)]
    if col_outer:
        order.sort(key=lambda rc: (rc[1], rc[0]))
    expected = [order[i:i + slots] for i in range(0, len(order), slots)]
    assert _walk(rows, cols, slots, m, n) == expected


def test_reductions_across_block_columns():
    """RowMax / GroupMax folded per output row while block columns run outer: output rows
    interleave in each array row's bank (several block rows), groups span block columns
    (GroupN > C) or end inside them, CUBE_M32 with M = 32, 4-bit D words (REQ4) that the
    block columns write in pieces, on the 2 x 2 full build (L = 3), the integer build and a
    3 x 2 array; one row-major plan (N <= M) for contrast."""
    full = [
        {"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16, "m": 5, "n": 16,
         "k": 5, "row_max": True, "row_max_init": True, "gcode": 1, "max_abs": False,
         "m_layout": Layout.CUBE_M16},
        {"op": Operation.TMATMUL_ACC, "a_type": T.S8, "b_type": T.S8, "m": 5, "n": 32,
         "k": 9, "row_max": True, "row_max_init": False, "gcode": 1, "max_abs": True,
         "mode": 17, "m_layout": Layout.CUBE_M16},
        {"op": Operation.TMATMUL, "a_type": T.BF16, "b_type": T.BF16, "m": 9, "n": 7,
         "k": 4, "row_max": True, "row_max_init": True, "gcode": 0,
         "m_layout": Layout.CUBE_M16},
    ]
    check(FULL, cases(15, FULL, full))
    check(INT, cases(16, INT, [
        {"op": Operation.TMATMUL, "a_type": T.S16, "b_type": T.S8, "m": 32, "n": 34,
         "k": 3, "row_max": True, "row_max_init": True, "gcode": 3, "max_abs": False,
         "m_layout": Layout.CUBE_M32}]))
    odd = [
        {"op": Operation.TMATMUL_BIAS, "a_type": T.S8, "b_type": T.S4X2, "m": 7, "n": 48,
         "k": 6, "row_max": True, "row_max_init": True, "gcode": 4, "max_abs": False,
         "mode": 18, "m_layout": Layout.CUBE_M32},
        {"op": Operation.TMATMUL, "a_type": T.S16, "b_type": T.S16, "m": 4, "n": 17,
         "k": 3, "row_max": True, "row_max_init": False, "gcode": 2, "max_abs": True,
         "m_layout": Layout.CUBE_M16},
    ]
    check(ODD, cases(17, ODD, odd), latency=2, write_stall=0.2, seed=3)


def test_odd_array_slow_store_and_write_stalls():
    """A 3 x 2 array; reads answered 3 cycles late, writes refused at random."""
    rng = np.random.default_rng(11)
    jobs = [random_case(rng, ODD, (9, 7, 20)) for _ in range(10)]
    check(ODD, jobs, latency=3, write_stall=0.3, seed=1)


def _operand_words(layout, dtype, rows, cols) -> int:
    """Distinct 64-bit payload words holding the valid elements of a CUBE tile."""
    bits = element_offsets(layout, dtype, rows, cols) * dtype.bits
    return len(np.unique(bits // 64))


def test_operand_buffers_read_each_word_once():
    """Buffered runs (Local A and B) on an even array read every A and B word exactly once
    per PE: several block rows and columns, K not a multiple of 32 or of a word, N not a
    multiple of C, M = 1, both M layouts, 4-bit lanes, two PEs, both block orders."""
    specs = [
        {"a_type": T.S8, "b_type": T.S8, "m": 9, "n": 7, "k": 100, "mask": 0b1010,
         "m_layout": Layout.CUBE_M32},
        {"a_type": T.S4X2, "b_type": T.S8, "m": 16, "n": 5, "k": 67,
         "m_layout": Layout.CUBE_M16},
        {"a_type": T.U16, "b_type": T.U4X2, "m": 1, "n": 9, "k": 45, "m_layout": Layout.CUBE_M16},
        {"a_type": T.S16, "b_type": T.S16, "m": 23, "n": 4, "k": 3, "m_layout": Layout.CUBE_M32},
        {"a_type": T.S8, "b_type": T.S8, "m": 5, "n": 13, "k": 70, "m_layout": Layout.CUBE_M16},
    ]
    jobs = cases(12, INT, [dict(spec, op=Operation.TMATMUL, mode=0, relu=0, gcode=0,
                                row_max=False) for spec in specs])
    runs = check(INT, jobs)
    for spec, (state, plan), run in zip(specs, jobs, runs):
        words = _operand_words(spec["m_layout"], plan.a_type, plan.m, plan.k) + \
            _operand_words(Layout.CUBE_N8, plan.b_type, plan.k, plan.n)
        assert run.reads == words * bin(plan.bundle.pe_mask).count("1"), \
            (plan.m, plan.n, plan.k, run.reads, words)


def test_operand_buffers_forms_and_switching():
    """The buffers with ACC and integer BIAS, an odd array (CUBE_M32 row pairs that straddle
    block rows), groups of three slots spanning block rows, and runs that alternate between
    the buffers and the lane path (Shared, TransA/TransB, MX, floating BIAS), and block
    columns outer with A filled in phases."""
    odd = [{"op": op, "a_type": a, "b_type": b, "m": m, "n": n, "k": k,
            "m_layout": Layout.CUBE_M32}
           for op, a, b, m, n, k in ((Operation.TMATMUL, T.S8, T.S8, 20, 5, 70),
                                     (Operation.TMATMUL_ACC, T.S16, T.S8, 31, 3, 9),
                                     (Operation.TMATMUL_BIAS, T.S4X2, T.S4X2, 7, 4, 65))]
    check(ODD, cases(13, ODD, odd), latency=2)
    full = [
        {"op": Operation.TMATMUL, "a_type": T.FP16, "b_type": T.FP16, "m": 7, "n": 2,
         "k": 40},
        {"op": Operation.TMATMUL_ACC, "a_type": T.BF16, "b_type": T.BF16, "m": 5, "n": 5,
         "k": 50, "mask": 0b0110},
        {"op": Operation.TMATMUL, "shared": "both", "trans_a": True, "trans_b": False,
         "max_mnk": (4, 4, 32)},
        {"op": Operation.TMATMUL, "a_type": T.FP32, "b_type": T.FP32, "m": 3, "n": 7,
         "k": 5},
        {"op": Operation.TMATMUL, "shared": "right", "trans_b": True, "max_mnk": (4, 4, 32)},
        {"op": Operation.TMATMUL, "a_type": T.E2M1X2, "b_type": T.E4M3, "m": 4, "n": 3,
         "k": 37, "m_layout": Layout.CUBE_M16},
        {"op": Operation.TMATMUL_BIAS, "a_type": T.FP16, "b_type": T.FP16, "m": 3, "n": 3,
         "k": 9},
        {"op": Operation.TMATMUL_MX, "a_type": T.E4M3, "b_type": T.E5M2, "m": 3, "n": 3,
         "k": 33},
        {"op": Operation.TMATMUL_ACC, "a_type": T.S8, "b_type": T.S8, "m": 1, "n": 6,
         "k": 64},
        # Block columns outer, P = 4 block rows in phases of L = 3: B1 fills with the
        # second phase; CUBE_M32 and ACC.
        {"op": Operation.TMATMUL_ACC, "a_type": T.FP16, "b_type": T.FP16, "m": 7, "n": 10,
         "k": 20, "m_layout": Layout.CUBE_M32},
    ]
    check(FULL, cases(14, FULL, full))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_random_plans_regression(seed):
    """3,000 random plans: 25 full-build, 150 integer-build and 75 odd-array ones per seed."""
    rng = np.random.default_rng(100 + seed)
    check(FULL, [random_case(rng, FULL, (17, 17, 70)) for _ in range(25)])
    check(INT, [random_case(rng, INT, (32, 24, 100)) for _ in range(150)])
    check(ODD, [random_case(rng, ODD, (20, 20, 70)) for _ in range(75)],
          latency=1 + seed % 3, write_stall=0.1 * (seed % 4), seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_random_plans_serial_lane_feed_regression(seed):
    """The serial lane path on 70 random plans per seed: full build, 8 x 8 and odd integer
    builds (``ecp5-int8`` has it)."""
    rng = np.random.default_rng(200 + seed)
    for config, count, mnk in ((FULL, 20, (17, 17, 70)), (INT.with_(rows=8, cols=8), 15,
                                                          (16, 16, 64)), (ODD, 35, (20, 20, 70))):
        config = config.with_(serial_lane_feed=True)
        check(config, [random_case(rng, config, mnk) for _ in range(count)],
              latency=1 + seed % 3, write_stall=0.1 * (seed % 4), seed=seed)
