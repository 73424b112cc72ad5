"""Cycle counts and MAC utilization of the CUBE engine (``hdl/cube.py``) with a realistic
tile store: one 64-bit payload read per cycle answered one cycle later, writes always taken.

Cases (each one Matrix bundle; M is at most 32 per PE - CUBE_M32 - so the issue's
64 x 64 x 256 product is two PEs of 32 x 64 x 256, ``pes`` = 2):

* ``S8``: S8 x S8 on the integer-only build (``ecp5-int8``'s array and MAC pipeline:
  8 x 8, product registered in the DSP blocks, L = 1);
* ``FP16 schedule``: the full-type build's schedule (L = ``fma_stages`` = 3) and FP16's
  memory traffic: S16 x S16 (the same 16-bit elements and layouts) on an integer array
  padded to 3 slots - the full-type array is too slow to simulate at this size in pysim,
  and the engine's timing depends only on R, C, L, the element widths and the shape;
* ``FP16 schedule, M = 16``: the same on one PE of 16 x 64 x 256 (the shape of the
  first version's table; no target: B alone is 4 reads per beat of the first block row);
* ``FP16``: real FP16 x FP16 on a full-type 2 x 2 array, a smaller shape (no target);
* ``overhead``: a 1 x 1 x 1 bundle on one PE: the fixed cost of a bundle;
* ``S8, Shared B``: a Shared row-major B, which the operand buffers cannot take, so the beats
  come from the lane path: every lane at once (``OperandFeed``), then one lane at a time
  (``serial_lane_feed``, as ``ecp5-int8`` and ``ecp5-full`` build it: ``SerialFeed``);
  ``serial / parallel`` in the second row is the ratio of their cycles.

Every case is checked bit for bit against the model.  ``bench_cube()`` returns one dict
per case (``case``, ``array`` (R, C, L), ``shape``, ``pes``, ``cycles``, ``macs``,
``utilization`` = MACs / (R x C x cycles), ``reads``, ``target``, ``meets_target``,
``bit_exact``, ``sim_cycles_per_s``) and, with ``synthesize``, the ECP5 resources of the
engine for ``ecp5-int8`` and ``ecp5-full`` (per PE of the array: divided by R x C).
"""

import os
import sys
from pathlib import Path

import numpy as np

from ..hdl.config import CubeConfig, preset
from ..hdl.cube import CubeEngine
from ..model.bundle import Operation
from ..model.datatype import DataType
from ..model.layout import Layout

__all__ = ["bench_cube", "engine_resources"]


def _helpers():
    """The testbench store and case builder live with the tests (one copy of each)."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import cube_bench_store
    import cube_cases
    return cube_bench_store, cube_cases


def _case(name, config, slots, a_type, shape, pes, target, seed, shared=None):
    store, cases = _helpers()
    rng = np.random.default_rng(seed)
    m, n, k = shape
    mask = (0b1111 << (4 - pes)) & 0b1111
    state, plan = cases.make_case(rng, config, op=Operation.TMATMUL, a_type=a_type,
                                  b_type=a_type, m=m, n=n, k=k, mask=mask, mode=0, relu=0,
                                  gcode=0, row_max=False, shared=shared, trans_b=False,
                                  m_layout=Layout.CUBE_M32 if m > 16 else Layout.CUBE_M16)
    engine = CubeEngine(config, slots)
    run, = store.run_engine(engine, [(state, plan)])
    try:
        store.check_against_model(state, plan, run)
        exact = True
    except AssertionError:
        exact = False
    rows, cols = config.rows, config.cols
    macs = m * n * k * pes
    utilization = macs / (rows * cols * run.cycles)
    return {"case": name, "array": (rows, cols, engine.array.slots), "shape": shape,
            "pes": pes, "cycles": run.cycles, "macs": macs, "utilization": utilization,
            "reads": run.reads, "target": target,
            "meets_target": None if target is None else utilization >= target,
            "bit_exact": exact, "sim_cycles_per_s": run.cycles / max(run.cpu_s, 1e-9)}


def engine_resources(name: str) -> dict:
    """ECP5 cells of the engine for a preset, and per processing element of its array."""
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    from ..build.synth import ecp5_resources
    config = preset(name)
    cells = ecp5_resources(CubeEngine(config), "cube_engine")
    pes = config.rows * config.cols
    return {"preset": name, "total": cells,
            "per_pe": {key: round(value / pes, 1) for key, value in cells.items()}}


def bench_cube(m: int = 32, n: int = 64, k: int = 256, size: int = 8, pes: int = 2,
               seed: int = 0, synthesize: bool = False) -> list:
    """Run the cases of the module docstring; see there for the returned dicts."""
    big = dict(tile_bytes_per_pe=128 * 1024, shared_bytes=64 * 1024)
    int8 = preset("ecp5-int8")
    int_build = CubeConfig(rows=size, cols=size, float_types=False, mx_types=False,
                           int_product_register=int8.int_product_register,
                           dsp_primitives=int8.dsp_primitives, **big)
    full_small = CubeConfig(rows=2, cols=2, **big)
    report = [
        _case("S8", int_build, None, DataType.S8, (m, n, k), pes, 0.90, seed),
        _case("FP16 schedule", int_build, CubeConfig().fma_stages, DataType.S16,
              (m, n, k), pes, 0.80, seed),
        _case("FP16 schedule, M = 16", int_build, CubeConfig().fma_stages, DataType.S16,
              (max(1, m // 2), n, k), 1, None, seed),
        _case("FP16", full_small, None, DataType.FP16,
              (max(1, m // 4), max(1, n // 8), max(1, k // 8)), 1, None, seed),
        _case("overhead", int_build, None, DataType.S8, (1, 1, 1), 1, None, seed),
    ]
    lane_shape = (16, 16, 64)
    parallel, serial = (
        _case(f"S8, Shared B, {kind} lanes", int_build.with_(serial_lane_feed=serial),
              None, DataType.S8, lane_shape, 1, None, seed, shared="right")
        for kind, serial in (("parallel", False), ("serial", True)))
    serial["serial / parallel"] = round(serial["cycles"] / parallel["cycles"], 2)
    report += [parallel, serial]
    if synthesize:
        report += [engine_resources("ecp5-int8"), engine_resources("ecp5-full")]
    return report


if __name__ == "__main__":
    for row in bench_cube(*(int(a) for a in sys.argv[1:])):
        print(row)
