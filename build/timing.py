"""Timing of the CUBE unit by component: each part placed and routed on its own.

A whole-unit place and route of ``ecp5-int8`` takes about an hour and a half here and its
critical path names auto-generated cells, so it says little about where to pipeline.  This
module takes the parts of :func:`~ptocube.build.breakdown.parts` one at a time, puts each
behind :class:`~ptocube.build.pnr.PinLightWrapper` (every input port driven from a register,
every output port captured by one), and places and routes it on the family's device at a
clock constraint.  Per part it reports the post-route Fmax and a summary of nextpnr's
critical path: the register it starts from and the one it ends at (``input port`` /
``output port`` when the path starts or ends at the part's boundary: a combinational path
through the port, which in the unit continues in the neighbouring part), its delay split into
logic and routing, and the cells along it by type.

A part's standalone Fmax is an upper bound of the unit's: paths between parts are not
seen (only their halves, ending at the ports), and the unit routes in a fuller device.

Figures are cached like :mod:`~ptocube.build.breakdown`'s, under the SHA-256 of the wrapped
part's RTLIL, the constraint, the seed and the router.
"""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .breakdown import FAMILIES, UNIT_EXPAND, Part, each_part, measure_cached, parts
from .pnr import PinLightWrapper, place_and_route

__all__ = ["CriticalPath", "PartTiming", "TimingReport", "critical_path", "time_part",
           "RoutedNet", "LateSignal", "RoutedReport", "routed_report",
           "timing", "unit_timing", "bench_timing", "BENCH_TIMINGS"]

# Yosys names a mapped cell after the net it drives plus its type and port
# (``core.rec_TRELLIS_FF_Q_12``); the signal's name is what comes before the type.
_CELL_SUFFIX = re.compile(r"_(TRELLIS_|SB_|DP16KD|MULT18X18D|LUT4|CCU2C|PFUMX|L6MUX21)")
# PinLightWrapper's own registers: the input shift chain and the output capture.  Yosys may
# name a register of the part that drives an output port after the capture's net, so a path
# that starts at "captured" starts at such a register.
_BOUNDARY = {("start", "chain"): "input port", ("start", "captured"): "output register",
             ("end", "captured"): "output port"}


def _signal_name(cell: str, role: str) -> str:
    # nextpnr's own suffixes (``$CCU2_COMB0``) go; a name Amaranth generated
    # (``fill.$signal$229``) stays whole.
    head = cell.split("$", 1)[0]
    name = cell if not head or head.endswith(".") else head
    match = _CELL_SUFFIX.search(name)
    name = name[:match.start()] if match else name
    if (role, name) in _BOUNDARY:
        return _BOUNDARY[role, name]
    return name[len("core."):] if name.startswith("core.") else name


def _cell_type(cell: str, types: dict) -> str:
    for name in (cell, cell.split("$", 1)[0]):
        if name in types:
            return types[name]
    made = re.match(r"\$nextpnr_(.+?)_\d+", cell)       # $nextpnr_CCU2C_7$CCU2_COMB0
    if made:
        return made.group(1)
    # iCE40: nextpnr packs a LUT, its carry and its flip-flop into one logic cell "<lut>_LC".
    return "ICESTORM_LC" if cell.endswith("_LC") else "other"


@dataclass
class CriticalPath:
    """nextpnr's critical path of one clock, summarized.

    start, end: the signal of the launching and capturing cell (``input port`` / ``output
        port`` at the wrapper's registers; ``output register``: a register of the part that
        drives an output port); ns: the whole path (clock-to-out, logic, routing,
        setup); logic_ns, routing_ns: its two parts; cells: the cells along it by type
        (a carry chain counts each CCU2C / SB_CARRY it passes).
    """

    start: str
    end: str
    ns: float
    logic_ns: float
    routing_ns: float
    cells: dict


def critical_path(report: dict, netlist: dict | None = None) -> CriticalPath | None:
    """The first critical path of nextpnr's ``--report`` JSON (``None`` without one).

    ``netlist``: yosys' JSON netlist of the design, for the cell types; without it, or for
    cells nextpnr made itself, the type is read from the cell's name.
    """
    paths = report.get("critical_paths") or []
    if not paths:
        return None
    types = {}
    for module in (netlist or {}).get("modules", {}).values():
        types.update({name: cell["type"] for name, cell in module.get("cells", {}).items()})
    steps = paths[0]["path"]
    logic = routing = total = 0.0
    cells = {}
    for step in steps:
        total += step["delay"]
        if step["type"] == "routing":
            routing += step["delay"]
            continue
        logic += step["delay"]
        if step["type"] in ("logic", "source"):
            name = step["to"]["cell"] if step["type"] == "logic" else step["from"]["cell"]
            kind = _cell_type(name, types)
            cells[kind] = cells.get(kind, 0) + 1
    return CriticalPath(start=_signal_name(steps[0]["from"]["cell"], "start"),
                        end=_signal_name(steps[-1]["to"]["cell"], "end"), ns=round(total, 2),
                        logic_ns=round(logic, 2), routing_ns=round(routing, 2),
                        cells=dict(sorted(cells.items(), key=lambda kv: -kv[1])))


@dataclass
class RoutedNet:
    """A net driven by a flip-flop in a routed design, by its longest route.

    signal: the driving flip-flop's signal; net: nextpnr's net name; ns: the time from the
    clock edge to its farthest sink (the flip-flop's clock-to-out, about 0.5 ns on ECP5,
    plus that route); sinks: how many sinks it has; far: the signal of that sink.
    """

    signal: str
    net: str
    ns: float
    sinks: int
    far: str


@dataclass
class LateSignal:
    """A signal of a routed design captured later than a clock period allows.

    nextpnr names one critical path per clock; every other input that would fail the same
    period is here, by the signal that captures it (a register's name, a block RAM's or a
    DSP's cell): signal; ns: its latest input's arrival after the clock edge, setup included
    (the critical path's figure for its end); endpoints: its inputs over the period.
    """

    signal: str
    ns: float
    endpoints: int


@dataclass
class RoutedReport:
    """What a finished place and route spent its time on: nextpnr's critical path, the
    nets with the longest routes, and the signals captured later than ``budget_ns``
    (:func:`routed_report`)."""

    fmax_mhz: dict
    critical: CriticalPath | None
    nets: list
    nets_over: dict
    timed: bool = True
    budget_ns: float = 10.0
    late: list = field(default_factory=list)     # LateSignal, latest first

    @property
    def late_endpoints(self) -> int:
        """Captured inputs over the budget."""
        return sum(s.endpoints for s in self.late)

    def table(self, rows: int = 25) -> str:
        clocks = ", ".join(f"{clock}: {mhz:.2f} MHz" for clock, mhz in self.fmax_mhz.items())
        lines = [f"Fmax {clocks or 'not reported'}"]
        if self.critical is not None:
            c = self.critical
            lines.append(f"critical path {c.ns} ns ({c.logic_ns} logic, {c.routing_ns} "
                         f"routing): {c.start} -> {c.end}")
        if not self.nets:
            lines.append("no flip-flop outputs (ECP5 TRELLIS_FF Q) in the report's net timings"
                         if self.timed else
                         "no net timings in the report (nextpnr --detailed-timing-report)")
            return "\n".join(lines)
        lines.append("flip-flop outputs by clock to farthest sink: " + ", ".join(
            f"{n:,} over {ns:g} ns" for ns, n in self.nets_over.items()))
        lines.append(f"{'ns':>6} {'sinks':>6}  driver -> farthest sink")
        for net in self.nets[:rows]:
            lines.append(f"{net.ns:6.2f} {net.sinks:6d}  {net.signal} -> {net.far}")
        lines += ["", f"inputs captured after {self.budget_ns:g} ns "
                      f"({1000 / self.budget_ns:.0f} MHz): {self.late_endpoints:,} inputs of "
                      f"{len(self.late):,} signals"]
        if self.late:
            lines.append(f"{'ns':>6} {'inputs':>6}  signal")
            lines += [f"{s.ns:6.2f} {s.endpoints:6d}  {s.signal}" for s in self.late[:rows]]
            if len(self.late) > rows:
                lines.append(f"... {len(self.late) - rows} more signals (JSON has them all)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"fmax_mhz": self.fmax_mhz,
                "critical": asdict(self.critical) if self.critical else None,
                "nets_over": {str(ns): n for ns, n in self.nets_over.items()},
                "nets": [asdict(n) for n in self.nets],
                "budget_ns": self.budget_ns, "late_endpoints": self.late_endpoints,
                "late": [asdict(s) for s in self.late]}


def routed_report(report: dict, netlist: dict | None = None, *,
                  thresholds=(5.0, 7.5, 10.0), budget_ns: float = 10.0) -> RoutedReport:
    """Summarize nextpnr's ``--report`` JSON of a routed design: each clock's Fmax, the
    critical path, the nets that flip-flops drive, by the time from the clock edge to
    their farthest sink, longest first, and the signals with inputs that arrive after
    ``budget_ns`` (:class:`LateSignal`), latest first: what stands between the route and
    that clock period, not only its critical path.

    nextpnr's detailed net timings give each sink's arrival time, so only for a net driven
    by a flip-flop is that time its route (plus the clock-to-out): those are the long wires
    that a register closer to the sinks, or a copy per group of sinks, would shorten.  They
    need nextpnr's ``--detailed-timing-report`` (``ptocube build`` passes it); without it
    the list is empty.  On iCE40 a flip-flop is packed into a logic cell whose one output
    does not say whether it is registered, so the list is empty there too.  ``thresholds``:
    count the nets over each of these (ns).
    """
    nets = []
    late = {}
    for entry in report.get("detailed_net_timings") or []:
        ends = entry.get("endpoints") or []
        for end in ends:
            arrival = max(end["delay"])
            if arrival > budget_ns:
                signal = _signal_name(end["cell"], "end")
                ns, count = late.get(signal, (0.0, 0))
                late[signal] = (max(ns, arrival), count + 1)
        if entry.get("port") != "Q" or not ends:
            continue
        far = max(ends, key=lambda e: max(e["delay"]))
        nets.append(RoutedNet(signal=_signal_name(entry["driver"], "start"), net=entry["net"],
                              ns=round(max(far["delay"]), 2), sinks=len(ends),
                              far=_signal_name(far["cell"], "end")))
    nets.sort(key=lambda n: (-n.ns, n.net))
    fmax = {clock: round(v["achieved"], 2) for clock, v in (report.get("fmax") or {}).items()}
    late_signals = sorted((LateSignal(signal, round(ns, 2), count)
                           for signal, (ns, count) in late.items()),
                          key=lambda s: (-s.ns, s.signal))
    return RoutedReport(fmax_mhz=fmax, critical=critical_path(report, netlist), nets=nets,
                        nets_over={ns: sum(n.ns > ns for n in nets) for ns in thresholds},
                        timed=bool(report.get("detailed_net_timings")), budget_ns=budget_ns,
                        late=late_signals)


@dataclass
class PartTiming:
    """Post-route timing of one part on its own.

    fmax_mhz: the slowest clock's achieved Fmax; logic: placed logic cells (TRELLIS_COMB /
    ICESTORM_LC, wrapper included); critical: its critical path (a :class:`CriticalPath` as a
    dictionary); digest: SHA-256 of the wrapped part's RTLIL; seconds: the run's wall time.
    """

    path: str
    kind: str
    count: int
    depth: int
    family: str
    device: str
    constraint_mhz: float
    fmax_mhz: float | None
    logic: int
    critical: dict | None
    digest: str
    seconds: float
    measured: str

    @property
    def met(self) -> bool:
        """The part alone reaches the constraint."""
        return self.fmax_mhz is not None and self.fmax_mhz >= self.constraint_mhz


def time_part(part: Part, family: str, out, *, freq_mhz: float = 100.0, seed: int = 1,
              router: str | None = "router2", timeout: float | None = None) -> PartTiming:
    """Place and route one instance of ``part`` behind the pin wrapper in ``out/<path>/``.

    A cached ``out/<path>.timing.json`` of the same RTLIL, constraint, seed and router is
    returned as it is.  Raises :class:`~ptocube.build.pnr.ToolError` when a tool fails.
    """
    from amaranth.back import rtlil
    if family not in FAMILIES:
        raise ValueError(f"unknown FPGA family {family!r}; known: {', '.join(FAMILIES)}")
    device = FAMILIES[family]

    def run(work):
        result = place_and_route(work / "part.il", device, freq_mhz=freq_mhz, seed=seed,
                                 workdir=work, router=router, timeout=timeout)
        report = json.loads((work / "top.report.json").read_text())
        path = critical_path(report, json.loads((work / "top.json").read_text()))
        return {"device": str(device), "constraint_mhz": freq_mhz,
                "fmax_mhz": (round(result.min_fmax, 2) if result.min_fmax is not None
                             else None),
                "logic": result.utilization.get("logic", (0, 0))[0],
                "critical": asdict(path) if path is not None else None}
    return measure_cached(part, family, out,
                          rtlil.convert(PinLightWrapper(part.component), name="top",
                                        platform=device),
                          ".timing.json", PartTiming, run, key=f"\n{freq_mhz:g} {seed} {router}")


@dataclass
class TimingReport:
    """The timed parts of one design, slowest first in :meth:`table`."""

    family: str
    title: str
    constraint_mhz: float
    rows: list = field(default_factory=list)       # PartTiming, hierarchy order
    missing: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)

    def slowest(self) -> PartTiming | None:
        """The part with the lowest Fmax: the bound on the whole design."""
        timed = [row for row in self.rows if row.fmax_mhz is not None]
        return min(timed, key=lambda row: row.fmax_mhz, default=None)

    def table(self) -> str:
        """A fixed-width text table, one part a line, then each critical path."""
        lines = [self.title,
                 f"{'part':<30} {'logic':>6} {'Fmax MHz':>9} {'path ns':>8} {'logic':>6} "
                 f"{'route':>6}  start -> end"]
        for row in self.rows:
            name = "  " * row.depth + row.path.rsplit(".", 1)[-1] + f" ({row.kind})"
            cp = row.critical or {}
            fmax = f"{row.fmax_mhz:.1f}" if row.fmax_mhz is not None else "-"
            lines.append(f"{name:<30} {row.logic:>6} {fmax:>9} {cp.get('ns', 0):>8.1f} "
                         f"{cp.get('logic_ns', 0):>6.1f} {cp.get('routing_ns', 0):>6.1f}  "
                         f"{cp.get('start', '-')} -> {cp.get('end', '-')}")
        lines.append("cells along each critical path:")
        for row in self.rows:
            cells = (row.critical or {}).get("cells", {})
            lines.append(f"  {row.path}: " + ", ".join(f"{n} {k}" for k, n in cells.items()))
        slowest = self.slowest()
        if slowest is not None:
            verdict = "meets" if slowest.fmax_mhz >= self.constraint_mhz else "misses"
            lines.append(f"slowest: {slowest.path} at {slowest.fmax_mhz:.1f} MHz ({verdict} "
                         f"{self.constraint_mhz:g} MHz)")
        if self.missing:
            lines.append("not timed: " + ", ".join(self.missing))
        for path, error in self.failed.items():
            lines.append(f"failed: {path}: {error}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A plain dictionary of every row."""
        slowest = self.slowest()
        return {"family": self.family, "title": self.title,
                "constraint_mhz": self.constraint_mhz,
                "parts": [asdict(row) for row in self.rows],
                "slowest": slowest.path if slowest else None,
                "missing": self.missing, "failed": self.failed}


def timing(design, family: str, out, *, expand=UNIT_EXPAND, select=None,
           freq_mhz: float = 100.0, seed: int = 1, router: str | None = "router2", title="",
           timeout: float | None = None, progress=None) -> TimingReport:
    """Time the parts of ``design`` on ``family``'s device (see :func:`time_part`).

    select: part paths to time (a path also selects its sub-parts; ``None``: every part);
    cached figures of unselected parts are still reported.  progress: called with each
    :class:`PartTiming` as it is measured (sub-parts first).  A part whose tools fail
    is in ``failed``.
    """
    found = parts(design, expand)
    if family not in FAMILIES:
        raise ValueError(f"unknown FPGA family {family!r}; known: {', '.join(FAMILIES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = TimingReport(family, title, freq_mhz)
    result.rows, result.missing, result.failed = each_part(
        found, select, out, ".timing.json", PartTiming,
        lambda part: time_part(part, family, out, freq_mhz=freq_mhz, seed=seed, router=router,
                               timeout=timeout), progress)
    return result


def unit_timing(preset_name: str, family: str, out=None, **kwargs) -> TimingReport:
    """:func:`timing` of ``CubeUnit(preset)``; ``out`` defaults to
    ``build/out/timing/PRESET-FAMILY``."""
    from ..hdl.config import preset
    from ..hdl.top import CubeUnit
    config = preset(preset_name)
    out = Path(out) if out is not None else Path("build/out/timing") / f"{preset_name}-{family}"
    freq = kwargs.get("freq_mhz", 100.0)
    title = (f"CubeUnit {preset_name} ({config.rows} x {config.cols}), each part alone behind "
             f"PinLightWrapper on {FAMILIES[family]}, {freq:g} MHz constraint, post-route")
    return timing(CubeUnit(config), family, out, title=title, **kwargs)


#: ``make bench`` timing runs: (preset, family).
BENCH_TIMINGS = (("ecp5-int8", "ecp5"),)


def bench_timing(cases=BENCH_TIMINGS) -> list:
    """One row per part: standalone post-route Fmax at 100 MHz (``make bench``; cached parts
    are not placed and routed again)."""
    rows = []
    for preset_name, family in cases:
        result = unit_timing(preset_name, family)
        for row in result.rows:
            cp = row.critical or {}
            rows.append({"preset": preset_name, "part": row.path, "fmax_mhz": row.fmax_mhz,
                         "path_ns": cp.get("ns"), "routing_ns": cp.get("routing_ns"),
                         "start": cp.get("start"), "end": cp.get("end"),
                         "seconds": row.seconds})
        for path, error in result.failed.items():
            rows.append({"preset": preset_name, "part": path, "fmax_mhz": None, "start": error})
    return rows
