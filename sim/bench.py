"""`make bench`: every benchmark of the project, run once, printed as tables.

Each benchmark is a function next to the code it measures that returns a list of
result rows (dicts); this module only runs them and prints the rows.  Speed is
reported as ratios and cycle counts here, never asserted in the test suite.
"""

import importlib
import sys
import time

__all__ = ["BENCHMARKS", "main"]

# title -> (module, function)
BENCHMARKS = {
    "Golden model: bit-exact MACs/s vs numpy matmul (M=N=64, K=256)":
        ("ptocube.sim.bench_model", "bench_model"),
    "img2col: destination elements per cycle (64 x 288 window) and ECP5 resources":
        ("ptocube.sim.bench_img2col", "bench_img2col"),
    "Systolic array: cycles and utilization (M=N=64, K=256 on 8 x 8)":
        ("ptocube.sim.bench_systolic", "bench_systolic"),
    "B.FPATR post-processing: elements per cycle and ECP5 resources":
        ("ptocube.hdl.postprocess", "bench_postprocess"),
    "Bundle decoder: instructions per cycle, ECP5 resources, post-route Fmax":
        ("ptocube.sim.bench_decoder", "bench_decoder"),
    "CUBE engine: cycles and utilization through the tile-store port":
        ("ptocube.sim.bench_cube", "bench_cube"),
    "Simulation speed: pysim vs Verilator (bundle decoder, same stream)":
        ("ptocube.sim.bench_verilator", "bench_verilator"),
    "Simulation speed: pysim vs Verilator (CUBE unit, example scenarios, ecp5-full)":
        ("ptocube.sim.bench_verilator", "bench_unit_verilator"),
    "FPGA: resources and post-route Fmax per board":
        ("ptocube.build.cli", "bench_fpga"),
    "FPGA: resources by component (ice40-tiny on iCE40, ecp5-int8 and ecp5-full on ECP5)":
        ("ptocube.build.breakdown", "bench_breakdown"),
    "FPGA: post-route Fmax by component (ecp5-int8 on the LFE5U-85F-6, 100 MHz)":
        ("ptocube.build.timing", "bench_timing"),
    "FPGA: estimated paths over 10 ns, whole unit before place and route (synth --paths)":
        ("ptocube.build.paths", "bench_paths"),
}


def _print_rows(rows):
    if isinstance(rows, dict):
        rows = [rows]
    keys = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    cells = [[_fmt(row.get(k, "")) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  " + "  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(c, widths)))


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def main(argv=None) -> int:
    """Run every benchmark (or those whose title contains an argument) and print the results."""
    argv = sys.argv[1:] if argv is None else argv
    for title, (module, function) in BENCHMARKS.items():
        if argv and not any(a.lower() in title.lower() for a in argv):
            continue
        print(f"\n== {title}")
        start = time.perf_counter()
        rows = getattr(importlib.import_module(module), function)()
        _print_rows(rows)
        print(f"  ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
