"""``ptocube build``, ``ptocube synth`` and ``ptocube verilog``.

* ``build --board NAME [--preset NAME] [--design unit|array] [--force] [--out DIR]``: the
  board's self-test bitstream (:class:`~ptocube.build.selftest.SelfTest` of the preset's unit,
  or of its systolic array alone, :mod:`~ptocube.build.array_selftest`), reports and a
  summary.
* ``synth --board NAME [--preset NAME] [--design unit|systolic|decoder]``: the design alone
  (behind :class:`~ptocube.build.pnr.PinLightWrapper`) placed and routed on the board's FPGA:
  resources as a share of the device and post-route Fmax, as a table and as JSON.
* ``synth --breakdown --preset NAME --family ecp5|ice40 [--parts P,...]``: every component of
  the unit synthesized and packed on its own (:mod:`~ptocube.build.breakdown`), as a table.
* ``synth --timing --preset NAME --family ecp5|ice40 [--parts P,...] [--freq MHZ]``: every
  component placed and routed on its own: Fmax and critical path (:mod:`~ptocube.build.timing`).
* ``synth --paths [--preset NAME] [--freq MHZ] [--netlist JSON]``: the design synthesized for
  the ECP5-85F, or a given netlist, and its estimated paths longer than the clock period, by
  component and by launching signal (:mod:`~ptocube.build.paths`); no place and route.
* ``synth --placed JSON [--far TILES]``: a netlist nextpnr wrote after placement, its nets by
  the distance from driver to farthest sink and its densest window
  (:mod:`~ptocube.build.placement`); ``synth --congestion CSV|DIR``: router2's overuse by
  component and signal; ``synth --routed REPORT``: a finished route's long wires.
* ``verilog --preset NAME -o FILE.v``: the unit's Verilog.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

from ..hdl.config import PRESETS, preset
from .boards import BOARDS, SELFTEST_DESIGNS, board
from .pnr import STALL_ITERATIONS

__all__ = ["add_build_arguments", "run_build", "add_synth_arguments", "run_synth",
           "add_verilog_arguments", "run_verilog", "design", "bench_fpga",
           "BENCH_CASES", "BenchCase"]

#: ``--design`` choices: what ``synth`` and ``verilog`` elaborate for a preset.
DESIGNS = ("unit", "systolic", "decoder")


def design(name: str, config):
    """The elaboratable ``name`` (one of :data:`DESIGNS`) of ``config``."""
    if name == "unit":
        from ..hdl.top import CubeUnit
        return CubeUnit(config)
    if name == "systolic":
        from ..hdl.systolic import SystolicArray
        return SystolicArray(config)
    if name == "decoder":
        from ..hdl.decoder import BundleDecoder
        return BundleDecoder(config)
    raise ValueError(f"unknown design {name!r}; known designs: {', '.join(DESIGNS)}")


def _board_arguments(parser, board_required=True):
    parser.add_argument("--board", required=board_required, choices=sorted(BOARDS),
                        help="target board")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="configuration preset (default: the board's; build --design "
                             "unit: the board's unit preset, ecp5-full on the ECP5 boards)")
    # The boards' seeds are read from BOARDS, so the help cannot fall behind a new route.
    unit_seeds = ", ".join(f"{','.join(map(str, b.unit_seeds))} on the {name}"
                           for name, b in sorted(BOARDS.items()) if b.unit_seeds != (1,))
    parser.add_argument("--seed", type=_seed_list, metavar="N[,N...]",
                        help="nextpnr placer seed (default 1); build: seeds tried in order "
                             "while router2 stalls, A-B for a range (default for the "
                             f"board's unit: the board's, {unit_seeds})")
    parser.add_argument("--stall", type=int, default=STALL_ITERATIONS, metavar="ITERATIONS",
                        help="stop router2 after this many iterations (or 30 minutes) "
                             "without progress, 5 %% fewer overused wires (default "
                             f"{STALL_ITERATIONS}; 0: never)")
    parser.add_argument("--router", choices=("router1", "router2"),
                        help="nextpnr router (default: nextpnr's, router1; build --design "
                             "unit: the board's, router1 on the ECP5 boards)")
    parser.add_argument("--placer", choices=("heap", "static", "sa"),
                        help="nextpnr placer (default: nextpnr's, heap; build --design "
                             "unit: the board's, static on the ECP5 boards)")


def _seed_list(text: str) -> tuple:
    """``--seed``: one seed or a comma-separated list of seeds and ranges ``A-B``."""
    seeds = []
    try:
        for part in text.split(","):
            first, dash, last = part.partition("-")
            if dash and int(first) > int(last):
                raise ValueError(part)
            seeds += range(int(first), int(last) + 1) if dash else [int(part)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers or ranges A-B (A <= B) "
                                         f"separated by commas, not {text!r}") from None
    return tuple(seeds)


def _positive(text: str) -> int:
    """``--jobs``, ``--abc-wire-ps``: a whole number from 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number from 1, not {text!r}")
    return value


#: ``build --sweep`` without ``--seed`` places these seeds and the board's own.
SWEEP_SEEDS = tuple(range(1, 9))


def _seeds(args, brd, unit_preset=None) -> tuple:
    """The ``--seed`` list given, else the board's unit seeds for a build of its default
    unit (``unit_preset`` names the unit preset being built), else seed 1; a ``--sweep``
    without ``--seed`` adds :data:`SWEEP_SEEDS`."""
    if args.seed is not None:
        return args.seed
    seeds = brd.unit_seeds if unit_preset and unit_preset == brd.unit_preset else (1,)
    if args.sweep:
        seeds = tuple(sorted({*seeds, *SWEEP_SEEDS}))
    return seeds


def _one_seed(args) -> int:
    """``synth``'s seed: it places and routes once (checked by :func:`run_synth`)."""
    return args.seed[0] if args.seed else 1


def _report_stall(seed, error):
    print(f"seed {seed}: {error}; stopped", file=sys.stderr, flush=True)


def _report_placement(seed, wirelength):
    print(f"seed {seed}: placed, wirelength {wirelength}", file=sys.stderr, flush=True)


def _out_dir(args, brd):
    return Path(args.out) if args.out else Path("build") / "out" / brd.name


def add_build_arguments(parser):
    """Arguments of ``ptocube build``."""
    _board_arguments(parser)
    parser.add_argument("--out", help="output directory (default build/out/BOARD/)")
    parser.add_argument("--unit-mhz", type=float,
                        help="ECP5 boards: the self-test's clock, made by a PLL at this "
                             "frequency or just below (default: the board's, "
                             "docs/fpga.md)")
    parser.add_argument("--design", choices=SELFTEST_DESIGNS,
                        help="what the self-test checks: the whole unit, or the preset's "
                             "systolic array alone (default: the board's, the unit on the "
                             "ECP5 boards, the array on the iCEBreaker)")
    parser.add_argument("--timeout", type=float, metavar="MINUTES",
                        help="stop the tools after this long and fail (default: no limit)")
    parser.add_argument("--force", action="store_true",
                        help="build --design unit even where the unit does not fit the "
                             "board's FPGA")
    parser.add_argument("--heatmap", action="store_true",
                        help="router2 writes its congestion of every iteration into "
                             "OUT/heat/seedN/ (read them with ptocube synth --congestion); "
                             "the option changes nextpnr's placement, so a seed's result "
                             "with it does not carry over to a build without it")
    parser.add_argument("--sweep", action="store_true",
                        help="place every --seed first without routing (about 5 minutes "
                             "each for the unit, --jobs at once), then route them in order "
                             "of wirelength, lowest first: the lowest placements are the "
                             "ones router2 finishes (docs/fpga-history.md); without --seed, "
                             f"seeds {SWEEP_SEEDS[0]}-{SWEEP_SEEDS[-1]} and the board's")
    parser.add_argument("--jobs", type=_positive, default=1, metavar="N",
                        help="place and route up to N of the --seed list at once (after "
                             "one synthesis); the first to finish gives the bitstream "
                             "(default 1: in turn)")
    parser.add_argument("--abc-wire-ps", type=_positive, metavar="PS",
                        help="ECP5: ABC maps the netlist to LUTs assuming this wire delay "
                             "per connection instead of synth_ecp5's 300 ps; 1000 gives "
                             "fewer logic levels for a few more LUTs (decision F46)")


def run_build(args) -> int:
    """Build the self-test bitstream; exit status 1 if its clock was not met, 2 for a
    refused request (among them the whole unit on a board it does not fit, without
    ``--force``)."""
    from . import array_selftest, selftest
    from .boards import BoardTop, build_bitstream
    from .pnr import RouterStalled, ToolError
    brd = board(args.board)
    design_name = args.design or brd.design
    unit = design_name == "unit"
    name = args.preset or (unit and brd.unit_preset) or brd.preset
    if unit and not brd.unit_fits and not args.force:
        print(f"error: the whole {name} unit does not fit the {brd.name}'s FPGA "
              f"({brd.device}; docs/fpga.md, \"Breakdown by component\" and \"The array "
              f"self-test\"): build --design array (the board's default), or add --force to "
              f"run the tools anyway", file=sys.stderr)
        return 2
    if args.abc_wire_ps is not None and brd.device.family != "ecp5":
        print(f"error: --abc-wire-ps sets an option of synth_ecp5; the {brd.name} has an "
              f"{brd.device.family.upper()}", file=sys.stderr)
        return 2
    if args.sweep and args.heatmap:
        print("error: --sweep places without router2's heatmap, which changes the "
              "placement: give one of --sweep and --heatmap", file=sys.stderr)
        return 2
    placer = args.placer or (brd.unit_placer if unit else None)
    router = args.router or (brd.unit_router if unit else None)
    if args.heatmap and router != "router2":
        routed_by = router or "router1, nextpnr's default"
        print(f"error: --heatmap writes router2's congestion maps; this build routes with "
              f"{routed_by}: add --router router2", file=sys.stderr)
        return 2
    out = _out_dir(args, brd)
    unit_mhz = args.unit_mhz or brd.unit_mhz
    make = {"unit": selftest.unit_selftest,
            "array": array_selftest.array_selftest}[design_name]
    try:
        clk_hz = brd.unit_hz(unit_mhz)
        top = BoardTop(brd, make(preset(name), clk_hz=clk_hz, baud=brd.baud),
                       unit_mhz=unit_mhz)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        result = build_bitstream(brd, top, out, seeds=_seeds(args, brd, unit and name),
                                 router=router, stall=args.stall or None,
                                 jobs=args.jobs, heatmap=args.heatmap, sweep=args.sweep,
                                 progress=_report_stall, placed=_report_placement,
                                 placer=placer, design=design_name, preset=name,
                                 abc_wire_ps=args.abc_wire_ps,
                                 timeout=args.timeout * 60 if args.timeout else None)
    except RouterStalled as error:
        # Which seeds route changes with the netlist: point to the sweep.
        print(f"error: every seed stalled (the last: {error}); try more seeds, in order "
              f"of their placements: --seed 1-12 --sweep --jobs 2", file=sys.stderr)
        return 1
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{brd.description}, preset {name}, {design_name} self-test at "
          f"{clk_hz / 1e6:g} MHz, seed {result.figures.seed}: {result.bitstream} "
          f"({result.bitstream.stat().st_size} bytes, {result.seconds:.1f} s)")
    print(result.figures.table())
    if not result.figures.timing_met:
        print(f"error: the {clk_hz / 1e6:g} MHz self-test clock is not met", file=sys.stderr)
        return 1
    return 0


def add_synth_arguments(parser):
    """Arguments of ``ptocube synth``."""
    # --breakdown needs a preset and a family, not a board.
    _board_arguments(parser, board_required=False)
    parser.add_argument("--design", choices=DESIGNS, default="unit",
                        help="what to place and route (default: the whole unit)")
    parser.add_argument("--freq", type=float,
                        help="clock constraint in MHz (default: the board clock)")
    parser.add_argument("--out", help="where the JSON and the tool logs go "
                                      "(default build/out/BOARD/)")
    parser.add_argument("--json", action="store_true",
                        help="print the JSON instead of the table")
    parser.add_argument("--breakdown", action="store_true",
                        help="synthesize each component of the unit on its own (no place and "
                             "route) and print resources per component")
    parser.add_argument("--timing", action="store_true",
                        help="place and route each component of the unit on its own and "
                             "print its Fmax and critical path")
    parser.add_argument("--paths", action="store_true",
                        help="synthesize for the ECP5-85F (no place and route) and list, by "
                             "component and by launching signal, the estimated paths longer "
                             "than the --freq period (default 100 MHz)")
    parser.add_argument("--netlist", metavar="JSON",
                        help="--paths: read this yosys JSON netlist (e.g. a build's top.json) "
                             "instead of synthesizing")
    parser.add_argument("--depth", type=int, metavar="N",
                        help="--paths: group by the first N parts of the component names")
    parser.add_argument("--rows", type=int, default=25, metavar="N",
                        help="--paths: components shown in the table (default 25)")
    parser.add_argument("--trace", metavar="TEXT",
                        help="--paths: print net by net the worst path into a signal whose "
                             "name contains TEXT")
    parser.add_argument("--fanout", type=int, default=64, metavar="N",
                        help="--paths: also list the nets driven by logic with at least N "
                             "sinks (default 64; 0: none)")
    parser.add_argument("--routed", metavar="REPORT",
                        help="read a finished place and route's nextpnr --report JSON (e.g. a "
                             "build's top.report.json): its Fmax, critical path, the "
                             "flip-flop outputs with the longest routes and the signals "
                             "captured later than the --freq period (default 100 MHz), "
                             "--rows of each")
    parser.add_argument("--placed", metavar="JSON",
                        help="read a netlist nextpnr wrote after placement (--no-route "
                             "--write placed.json): the signals whose nets reach --far tiles "
                             "or more (--rows of them) and the components of the densest "
                             "window (--depth parts of their names, default 4); a netlist "
                             "not placed yet (a build's top.json) is placed first on "
                             "--board's FPGA with --seed (placed-seedN.json beside it)")
    parser.add_argument("--congestion", metavar="CSV|DIR",
                        help="read a router2 heatmap of the overuse by net (a build's "
                             "heat/seedN/h_congestion_by_net_I.csv, or its directory for the "
                             "last iteration): components (--depth) and signals, most first")
    parser.add_argument("--far", type=int, default=60, metavar="TILES",
                        help="--placed: list nets whose farthest sink is at least this many "
                             "tiles from the driver (default 60)")
    parser.add_argument("--family", choices=("ecp5", "ice40"),
                        help="FPGA family of --breakdown / --timing (default: the board's)")
    parser.add_argument("--parts", help="--breakdown / --timing: comma-separated part paths "
                                        "to measure (e.g. decoder,cube.array); others are "
                                        "reported from the cache when there")


def run_synth(args) -> int:
    """Place and route a design on the board's FPGA and report resources and Fmax; exit
    status 1 when a tool fails or router2 stalls."""
    from .pnr import ToolError, place_and_route
    if args.seed is not None and len(args.seed) > 1:
        print("error: synth places and routes once: give one --seed", file=sys.stderr)
        return 2
    if args.routed:
        return _run_routed(args)
    if args.placed:
        return _run_placed(args)
    if args.congestion:
        return _run_congestion(args)
    if args.paths:
        return _run_paths(args)
    if args.breakdown or args.timing:
        return _run_by_part(args)
    if args.board is None:
        print("error: synth needs --board (or --breakdown / --timing with --preset and "
              "--family)",
              file=sys.stderr)
        return 2
    brd = board(args.board)
    name = args.preset or brd.preset
    freq = args.freq or brd.clock_hz / 1e6
    out = _out_dir(args, brd)
    work = out / f"synth-{name}-{args.design}"
    config = preset(name)
    try:
        result = place_and_route(design(args.design, config), brd.device, freq_mhz=freq,
                                 seed=_one_seed(args), workdir=work, wrap=True,
                                 router=args.router, placer=args.placer,
                                 stall=args.stall or None)
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    # The primitives the netlist has: the preset's, where they are the device's (F47).
    primitives = config.dsp_primitives if config.dsp_primitives == brd.device.family else None
    report = {"board": brd.name, "preset": name, "design": args.design, "placer": args.placer,
              "dsp_primitives": primitives, **result.to_json()}
    json_path = out / f"synth-{name}-{args.design}.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{brd.description}, preset {name}, design {args.design} "
              f"({result.seconds:.1f} s; JSON: {json_path})")
        print(result.table())
    return 0


def _run_paths(args) -> int:
    """``synth --paths``: the estimated long paths of a design, or of a given netlist."""
    from .paths import analyse, preset_paths
    from .pnr import ToolError
    brd = board(args.board) if args.board else None
    if (args.family or (brd.device.family if brd else "ecp5")) != "ecp5":
        print("error: synth --paths estimates ECP5 netlists only", file=sys.stderr)
        return 2
    budget = 1000.0 / (args.freq or 100.0)
    name = args.preset or (brd.preset if brd else "ecp5-int8")
    if args.netlist:
        path = Path(args.netlist)
        if not path.is_file():
            print(f"error: no netlist at {path}", file=sys.stderr)
            return 2
        report = analyse(json.loads(path.read_text()), budget_ns=budget, depth=args.depth,
                         trace=args.trace, fanout=args.fanout)
        title = str(path)
    else:
        out = Path(args.out) if args.out else Path("build") / "out" / "paths" / \
            f"{name}-{args.design}"
        try:
            report = preset_paths(name, out, design_name=args.design, budget_ns=budget,
                                  depth=args.depth, trace=args.trace, fanout=args.fanout)
        except ToolError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        title = f"preset {name}, design {args.design} (JSON: {out / 'paths.json'})"
    return _print_report(args, report, title)


def _print_report(args, report, title) -> int:
    """Print ``report`` as JSON (``--json``) or as its table of ``--rows`` under ``title``."""
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(title)
        print(report.table(args.rows))
    return 0


def _run_routed(args) -> int:
    """``synth --routed``: what a finished place and route spent its time on."""
    from .timing import routed_report
    path = Path(args.routed)
    if not path.is_file():
        print(f"error: no nextpnr report at {path}", file=sys.stderr)
        return 2
    netlist = path.with_name("top.json")
    report = routed_report(json.loads(path.read_text()),
                           json.loads(netlist.read_text()) if netlist.is_file() else None,
                           budget_ns=1000.0 / (args.freq or 100.0))
    return _print_report(args, report, str(path))


def _run_placed(args) -> int:
    """``synth --placed``: where a placement puts the long wires and the crowded ones.  A
    netlist not yet placed (a build's ``top.json``) is placed first on ``--board``'s FPGA,
    with the pin constraints beside it, ``--seed`` and the unit's placer (or ``--placer``)."""
    from .placement import analyse, is_placed
    from .pnr import ToolError, place_only
    path = Path(args.placed)
    if not path.is_file():
        print(f"error: no netlist at {path}", file=sys.stderr)
        return 2
    netlist = json.loads(path.read_text())
    if not is_placed(netlist):
        if args.board is None:
            print(f"error: {path} is not placed: give --board to place it (or a netlist "
                  "nextpnr wrote with --no-route --write)", file=sys.stderr)
            return 2
        brd = board(args.board)
        seed = args.seed[0] if args.seed else 1
        pins = path.with_name(f"top.{brd.device.pin_constraints}")
        try:
            path = place_only(path, brd.device, seed=seed,
                              placer=args.placer or brd.unit_placer,
                              constraints=pins if pins.is_file() else None)
        except ToolError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        netlist = json.loads(path.read_text())
    report = analyse(netlist, far=args.far, depth=4 if args.depth is None else args.depth)
    return _print_report(args, report, str(path))


def _run_congestion(args) -> int:
    """``synth --congestion``: what router2 found crowded in one iteration."""
    from .placement import congestion
    path = Path(args.congestion)
    if path.is_dir():
        # The last iteration written (a running router may have opened the next one).
        maps = sorted((p for p in path.glob("*_congestion_by_net_*.csv") if p.stat().st_size),
                      key=lambda p: int(p.stem.rpartition("_")[2]))
        if not maps:
            print(f"error: no router2 heatmap (*_congestion_by_net_*.csv) in {path}",
                  file=sys.stderr)
            return 2
        path = maps[-1]
    if not path.is_file():
        print(f"error: no heatmap at {path}", file=sys.stderr)
        return 2
    report = congestion(path.read_text(), depth=4 if args.depth is None else args.depth,
                        name=path.name)
    return _print_report(args, report, str(path))


def _run_by_part(args) -> int:
    """``synth --breakdown`` (resources) or ``synth --timing`` (Fmax), one part at a time."""
    from .breakdown import unit_breakdown
    from .timing import unit_timing
    brd = board(args.board) if args.board else None
    name = args.preset or (brd.preset if brd else None)
    family = args.family or (brd.device.family if brd else None)
    flag = "--timing" if args.timing else "--breakdown"
    if name is None or family is None:
        print(f"error: synth {flag} needs --preset and --family (or --board)", file=sys.stderr)
        return 2
    kind = "timing" if args.timing else "breakdown"
    out = Path(args.out) if args.out else Path("build") / "out" / kind / f"{name}-{family}"
    select = [p.strip() for p in args.parts.split(",") if p.strip()] if args.parts else None

    def progress(figures):
        shown = (f"{figures.fmax_mhz} MHz" if args.timing else figures.resources())
        print(f"  {figures.path}: {shown} ({figures.seconds:.0f} s)", file=sys.stderr,
              flush=True)
    try:
        if args.timing:
            result = unit_timing(name, family, out, select=select, progress=progress,
                                 freq_mhz=args.freq or 100.0, seed=_one_seed(args),
                                 router=args.router or "router2")
        else:
            result = unit_breakdown(name, family, out, select=select, progress=progress)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    (out / f"{kind}.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    print(json.dumps(result.to_json(), indent=1) if args.json else result.table())
    return 1 if result.failed else 0


def add_verilog_arguments(parser):
    """Arguments of ``ptocube verilog``."""
    parser.add_argument("--preset", default="sim-small", choices=sorted(PRESETS),
                        help="configuration preset (default sim-small)")
    parser.add_argument("--design", choices=DESIGNS, default="unit",
                        help="which design (default: the whole unit)")
    parser.add_argument("--name", default="ptocube", help="Verilog module name")
    parser.add_argument("-o", "--output", required=True, help="Verilog file to write")


def run_verilog(args) -> int:
    """Write the design's Verilog."""
    from amaranth.back import verilog
    text = verilog.convert(design(args.design, preset(args.preset)), name=args.name)
    Path(args.output).write_text(text)
    print(f"{args.output}: module {args.name}, preset {args.preset} ({len(text)} bytes)")
    return 0


class BenchCase(NamedTuple):
    """One ``make bench`` FPGA row: a design of a preset placed and routed on a board's FPGA."""

    board: str
    preset: str
    design: str
    freq_mhz: float             # the clock constraint
    router: str | None = None   # nextpnr's, as in place_and_route
    placer: str | None = None


#: ``make bench`` cases. The whole units use the boards' unit flow: the static placer and
#: router1 (decisions F26, F49); a case whose router stalls is stopped (F31) and reported
#: with its error.
BENCH_CASES = (
    BenchCase("ulx3s-85f", "ecp5-int8", "systolic", 100, "router2"),
    BenchCase("ulx3s-85f", "ecp5-int4", "unit", 100, "router1", "static"),
    BenchCase("ulx3s-85f", "ecp5-int8", "unit", 100, "router1", "static"),
    BenchCase("ulx3s-85f", "ecp5-full", "unit", 100, "router1", "static"),
    BenchCase("icebreaker", "ice40-tiny", "systolic", 12),
    BenchCase("icebreaker", "ice40-tiny", "unit", 12),
)

#: Time limit of one bench case (synthesis, placement and routing), beside the stall watch
#: (F31): router2 does not give up by itself on a design it cannot route.
BENCH_TIMEOUT_S = 90 * 60


def bench_fpga(cases=BENCH_CASES, out="build/out/bench", timeout=BENCH_TIMEOUT_S) -> list:
    """Post-route figures of the presets on their boards' FPGAs (``make bench``): one row per
    case with the device shares and Fmax; a design that does not fit, or does not route
    within ``timeout`` seconds, gets its error."""
    from .pnr import ToolError, place_and_route
    rows = []
    for case in (BenchCase(*case) for case in cases):
        brd = board(case.board)
        row = {"board": case.board, "preset": case.preset, "design": case.design,
               "target_mhz": case.freq_mhz}
        try:
            r = place_and_route(design(case.design, preset(case.preset)), brd.device,
                                freq_mhz=case.freq_mhz, wrap=True, router=case.router,
                                placer=case.placer, timeout=timeout,
                                workdir=Path(out) / f"{case.board}-{case.preset}-{case.design}")
        except ToolError as error:
            rows.append({**row, "error": str(error).splitlines()[-1]})
            continue
        rows.append({**row, "LUT4": r.lut4, "FF": r.ff, "DSP": r.dsp, "BRAM": r.bram,
                     "logic_%": 100 * r.share("logic"), "DSP_%": 100 * r.share("dsp"),
                     "BRAM_%": 100 * r.share("bram"), "fmax_mhz": r.min_fmax,
                     "met": r.timing_met, "seconds": r.seconds})
    return rows
