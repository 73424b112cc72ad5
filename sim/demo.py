"""``ptocube demo``: a small workload on the golden model, checked end to end.

The program:

1. a 3x3 convolution: TIMG2COL turns a 4x4, 3-channel S8 feature map (padding
   1) into its 16 x 36 im2col window; the host lays the window out as a
   CUBE_M16 operand (what a TLOAD ND2M16 does; not a CUBE bundle) and a
   TMATMUL.BIAS with ReLU and REQ8 quantisation (PreQuantMode 3, Sat)
   produces the S8 output feature map, with RowMax of the raw accumulator;
2. a TGEMV.ACC chain in FP16: three bundles, each D the next bundle's C;
3. an MX operation: TMATMULMX with E4M3 x E2M1X2 inputs and E8M0 scales.

Every input is chosen so that a plain numpy computation is exact.  The program
runs on the golden model, where each published result is checked against that
computation; every bundle is then replayed on the simulated hardware
(:class:`~ptocube.hdl.top.CubeUnit`, loaded through its host port with the
state the model had before the bundle) and its results are compared word for
word with the model's.  The demo prints one row per bundle (cycles and array
utilization from the simulation) and a final verdict.
"""

import sys
import time

import numpy as np

from ptocube.model.datatype import DataType
from ptocube.model.img2col import FeatureMapDescriptor
from ptocube.model.layout import Layout
from ptocube.model.machine import Machine, Outcome
from ptocube.model.numeric import decode, encode_exact
from ptocube.model.scenario import Scenario
from ptocube.model.state import Location, Tile

__all__ = ["build_and_run", "add_arguments", "run"]

_FPATR_NONE = "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0"
# REQ8 word: FP19 scale 1/16 (FP32 0x3D800000) in bits[31:13], S9 offset -2 in bits[45:37].
_REQ8_SCALE, _REQ8_OFFSET = 1 / 16, -2
_REQ8_WORD = 0x3D800000 | (_REQ8_OFFSET & 0x1FF) << 37


class _RecordingMachine(Machine):
    """A :class:`Machine` that keeps every program it runs with the state it started from,
    as a :class:`Scenario`, so the same steps can be replayed on the hardware."""

    def __init__(self):
        super().__init__()
        self.scenarios = []

    def run(self, program):
        self.scenarios.append(Scenario(name=f"demo step {len(self.scenarios)}", description="",
                                       state=self.state.snapshot(), program=program))
        return super().run(program)


def _tile(dtype, layout, values, tsize, **kw) -> Tile:
    raw = encode_exact(dtype, np.asarray(values, dtype=np.float64 if DataType(dtype).num_class.value
                                         == "float" else np.int64))
    return Tile.from_raw(dtype, layout, raw, tsize, **kw)


def _values(tile: Tile) -> np.ndarray:
    return decode(tile.dtype, tile.raw())


def _convolution(machine: Machine, rng) -> list:
    """TIMG2COL, host re-layout, TMATMUL.BIAS + ReLU + REQ8 + RowMax; returns check rows."""
    state = machine.state
    fmap = rng.integers(-8, 8, size=(4, 4, 4))                    # H, W, C0 (channel 3 unused)
    fm = FeatureMapDescriptor(height=4, width=4, channels_per_group=4, filter_height=3,
                              filter_width=3, pad_left=1, pad_right=1, pad_top=1,
                              pad_bottom=1, logical_channels=3, padding=0)
    src = _tile(DataType.S8, Layout.ROW_MAJOR, fmap.reshape(1, 64), 128,
                location=Location.MATRIX, feature_map=fm)
    weights = rng.integers(-4, 5, size=(36, 8))
    bias = rng.integers(-50, 50, size=(1, 8))
    for pe in range(4):
        state.set_tile(pe, 32, src)                                               # M#1
        state.set_tile(pe, 48, _tile(DataType.S8, Layout.CUBE_N8, weights, 512))  # N#1
        state.set_tile(pe, 16, _tile(DataType.S32, Layout.ROW_MAJOR, bias, 128))  # U#1
    state.write_gpr(2, _REQ8_WORD)                                                # a0
    im2col, = machine.run("BSTART.SFU TIMG2COL, S8\nB.DIM zero, 36, ->LB0\n"
                          "B.DIM zero, 16, ->LB1\nB.DIM zero, 64, ->LB2\n"
                          "B.IOT M#1, mask=1111, last, ->M<1KiB>\nBSTOP\n")
    rows = [("TIMG2COL", "16x36", "S8", im2col)]
    padded = np.pad(fmap[:, :, :3], ((1, 1), (1, 1), (0, 0)))
    expected_window = np.zeros((16, 36), dtype=np.int64)
    for oh in range(4):
        for ow in range(4):
            patch = np.zeros((3, 3, 4), dtype=np.int64)
            patch[:, :, :3] = padded[oh:oh + 3, ow:ow + 3]
            expected_window[oh * 4 + ow] = patch.reshape(36)
    window_ok = im2col.outcome == Outcome.SUCCESS and all(
        np.array_equal(_values(p.tile), expected_window) for p in im2col.published)
    # Host step: lay the row-major window out as a CUBE_M16 A operand in M#3.
    if im2col.outcome == Outcome.SUCCESS:
        for p in im2col.published:
            state.set_tile(p.pe, 34, Tile.from_raw(DataType.S8, Layout.CUBE_M16, p.tile.raw(),
                                                   1024))
    conv, = machine.run("BSTART.TMATMUL.BIAS S8\nB.DATR {NORM, S8, Zero, EQ, Default, 1, 0}\n"
                        "B.FPATR 3, ReLU, 0, 1, 0, 0, 0, 0, 0\nB.DIM zero, 16, ->LB0\n"
                        "B.DIM zero, 8, ->LB1\nB.DIM zero, 36, ->LB2\n"
                        "B.IOT M#3, N#1, mask=1111, ->T<128B>\n"
                        "B.IOT U#1, mask=1111, last, ->U<128B>\nB.IOR a0\nBSTOP\n")
    p = expected_window @ weights + bias
    q = np.clip(np.rint(np.maximum(p, 0) * _REQ8_SCALE), -256, 255) + _REQ8_OFFSET
    expected_d, expected_rowmax = np.clip(q, -128, 127), p.max(axis=1, keepdims=True)
    conv_ok = conv.outcome == Outcome.SUCCESS and all(
        np.array_equal(_values(t.tile), want) for t, want in
        zip(conv.published, [expected_d, expected_rowmax] * 4))
    rows[0] += (window_ok,)
    rows.append(("BSTART.TMATMUL.BIAS", "16x8x36", "S8 x S8 -> S8 (ReLU, REQ8, RowMax)", conv,
                 conv_ok))
    return rows


def _gemv_chain(machine: Machine, rng) -> list:
    """Three TGEMV.ACC bundles in FP16: y <- y + x_i W_i, each D the next C."""
    state = machine.state
    y = rng.integers(-4, 5, size=(1, 8)).astype(np.float64)
    for pe in range(4):
        state.set_tile(pe, 0, _tile(DataType.FP32, Layout.CUBE_M16, y, 512))     # T#1
    rows, c_name = [], "T#1"
    for step in range(3):
        x = rng.integers(-3, 4, size=(1, 16)) / 4
        w = rng.integers(-3, 4, size=(16, 8)) / 2
        for pe in range(4):
            state.set_tile(pe, 33 + step, _tile(DataType.FP16, Layout.CUBE_M16, x, 512))
            state.set_tile(pe, 49 + step, _tile(DataType.FP16, Layout.CUBE_N8, w, 256))
        result, = machine.run(f"BSTART.TGEMV.ACC FP16\n{_FPATR_NONE}\nB.DIM zero, 8, ->LB1\n"
                              f"B.DIM zero, 16, ->LB2\nB.IOT {c_name}, M#{2 + step}, mask=1111\n"
                              f"B.IOT N#{2 + step}, mask=1111, last, ->U<512B>\nBSTOP\n")
        y = y + x @ w
        ok = result.outcome == Outcome.SUCCESS and all(
            np.array_equal(_values(p.tile), y) for p in result.published)
        rows.append(("BSTART.TGEMV.ACC", "1x8x16", "FP16 x FP16 -> FP32", result, ok))
        if result.outcome != Outcome.SUCCESS:
            break
        c_name = result.published[0].name
    return rows


def _mx(machine: Machine, rng) -> list:
    """TMATMULMX: E4M3 x E2M1X2 with per-32-element E8M0 scales (K = 64)."""
    state = machine.state
    a = rng.integers(-6, 7, size=(4, 64)) / 2                     # exact in E4M3
    b = rng.choice([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0], size=(64, 4))
    sa = rng.integers(124, 130, size=(4, 2))
    sb = rng.integers(124, 130, size=(2, 4))
    for pe in range(4):
        state.set_tile(pe, 36, _tile(DataType.E4M3, Layout.CUBE_M16, a, 1024))         # M#5
        state.set_tile(pe, 52, _tile(DataType.E2M1X2, Layout.CUBE_N8, b, 256))        # N#5
        state.set_tile(pe, 8, Tile.from_raw(DataType.E8M0, Layout.ROW_MAJOR, sa, 128))  # T#9
        state.set_tile(pe, 9, Tile.from_raw(DataType.E8M0, Layout.ROW_MAJOR, sb, 128))  # T#10
    result, = machine.run("BSTART.TMATMULMX E4M3\nB.DATR {NORM, E2M1X2, Zero, EQ, Default, 0, 0}\n"
                          f"{_FPATR_NONE}\nB.DIM zero, 4, ->LB0\nB.DIM zero, 4, ->LB1\n"
                          "B.DIM zero, 64, ->LB2\nB.IOT M#5, T#9, mask=1111\n"
                          "B.IOT N#5, T#10, mask=1111, last, ->N<256B>\nBSTOP\n")
    scaled_a = a * np.repeat(2.0 ** (sa - 127), 32, axis=1)
    scaled_b = b * np.repeat(2.0 ** (sb - 127), 32, axis=0)
    ok = result.outcome == Outcome.SUCCESS and all(
        np.array_equal(_values(p.tile), scaled_a @ scaled_b) for p in result.published)
    return [("BSTART.TMATMULMX", "4x4x64", "E4M3 x E2M1X2 (E8M0 scales) -> FP32", result, ok)]


def build_and_run(seed: int = 2026) -> tuple[list, list]:
    """Run the demo program on the golden model.

    Returns rows ``(operation, shape, types, BundleResult, ok)`` and the scenarios (one per
    bundle, in the same order: the program and the state before it) to replay elsewhere.
    """
    rng = np.random.default_rng(seed)
    machine = _RecordingMachine()
    rows = _convolution(machine, rng) + _gemv_chain(machine, rng) + _mx(machine, rng)
    return rows, machine.scenarios


def _macs(operation: str, shape: str, pes: int = 4) -> int:
    """Useful multiply-accumulates of a bundle of ``shape`` "MxNxK" on ``pes`` PEs."""
    if shape.count("x") != 2:                     # TIMG2COL: a window, no MACs
        return 0
    m, n, k = (int(v) for v in shape.split("x"))
    return pes * m * n * k


def run_on_hardware(scenarios, preset_name: str, progress=None) -> list:
    """Replay ``scenarios`` on the simulated unit; one result per scenario, compared with the
    model: ``(hardware result dict, matches the model word for word)``."""
    from ptocube.sim.hw_run import architectural, run_scenarios_hw
    from ptocube.sim.run import run_scenario
    results = run_scenarios_hw(scenarios, preset_name, progress=progress)
    checked = []
    for scenario, hw in zip(scenarios, results):
        if isinstance(hw, Exception):
            raise hw
        model = run_scenario(scenario, "model")
        checked.append((hw, architectural(hw) == architectural(model)))
    return checked


def add_arguments(parser) -> None:
    """``ptocube demo`` options."""
    parser.add_argument("--seed", type=int, default=2026, help="seed of the demo's data")
    parser.add_argument("--preset", default="sim-small",
                        help="hardware build the bundles are replayed on (default: sim-small)")
    parser.add_argument("--model-only", action="store_true",
                        help="run the golden model only (no hardware simulation)")


def run(args) -> int:
    """Print one row per bundle and the verdict; exit status 0 on PASS, 1 on FAIL."""
    from ptocube.hdl.config import preset
    rows, scenarios = build_and_run(args.seed)
    config = preset(args.preset)
    hardware = [(None, True)] * len(rows)
    if not args.model_only:
        started = time.perf_counter()

        def progress(done, total):
            print(f"\r  simulating {args.preset} ({config.rows}x{config.cols} array): bundle "
                  f"{done}/{total}, {time.perf_counter() - started:.0f} s", end="",
                  file=sys.stderr, flush=True)

        progress(0, len(scenarios))
        hardware = run_on_hardware(scenarios, args.preset, progress)
        print(file=sys.stderr)
    engines = "golden model" + ("" if args.model_only else f" and simulated hardware "
                                f"({args.preset}, {config.rows}x{config.cols} array)")
    print(f"ptocube demo: {engines}, ieee arithmetic")
    print(f"{'#':>2}  {'operation':<20} {'shape':<8} {'types':<38} {'outcome':<8} "
          f"{'cycles':>6} {'util':>6}  check")
    passes = 0
    for number, ((operation, shape, types, result, ok), (hw, same)) in enumerate(
            zip(rows, hardware)):
        outcome = result.outcome if result.outcome != Outcome.FAULT else result.fault.spec_name
        cycles = util = "-"
        if hw is not None:
            cycles = hw["bundles"][0]["cycles"]
            macs = _macs(operation, shape)
            util = f"{macs / (config.rows * config.cols * cycles):.1%}" if macs else "-"
        checks = ["exact" if ok else "MODEL MISMATCH"]
        if hw is not None:
            checks.append("hw = model" if same else "HW MISMATCH")
        passes += ok and same
        print(f"{number:>2}  {operation:<20} {shape:<8} {types:<38} {outcome:<8} "
              f"{cycles:>6} {util:>6}  {', '.join(checks)}")
    passed = passes == len(rows)
    against = "an exact numpy computation" + ("" if args.model_only else
                                              ", and the hardware matches the model bit for bit")
    print(f"verdict: {'PASS' if passed else 'FAIL'} ({passes} of {len(rows)} bundles match "
          f"{against})")
    return 0 if passed else 1


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(prog="ptocube demo")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
