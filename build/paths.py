"""Long paths of a synthesized ECP5 netlist, estimated before place and route.

A place and route of the whole unit takes 20-90 minutes and nextpnr reports one critical path
per clock: it says what limits the clock, not how much else would limit it next.  This module
reads yosys's JSON netlist after ``synth_ecp5`` and estimates, for every input of a register,
block RAM, DSP or LUT RAM (and every output port of the top), the arrival time of its longest
combinational path, with a per-cell delay model (:class:`DelayModel`) and one routing hop per
net.  Endpoints whose estimate exceeds the clock period are grouped by the component that
holds them, so one synthesis run (about 5 minutes for the 8 x 8 unit) lists every part that
stands between the unit and a clock target, with the worst path of each.

The estimate ranks paths; it does not predict nextpnr's figure.  Routing in a congested device
is longer than the model's hop: on the routed 8 x 8 unit (session 13, 32.95 MHz) the critical
path took 30.3 ns where the model gives 23.1 ns for the same path.  The delays are those of
ECP5 speed grade 6 as nextpnr reported them on this project's routes (``docs/fpga.md``).
"""

import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["DelayModel", "Endpoint", "StartPaths", "WideNet", "PathsReport", "Netlist", "analyse",
           "part_of", "launching_signal", "unit_paths", "preset_paths", "bench_paths",
           "BENCH_PATHS"]

# Yosys names a mapped cell after the net it drives plus its type and port
# (``store.read_word_TRELLIS_FF_Q_50``); the signal is what comes before the type.
_CELL_SUFFIX = re.compile(r"_(TRELLIS_|DP16KD|MULT18X18D|LUT4|CCU2C|PFUMX|L6MUX21)")


@dataclass(frozen=True)
class DelayModel:
    """Delays in ns of the ECP5 cells ``synth_ecp5`` maps to, and of one routing hop.

    route:      one net between two cells (none along a carry chain, or from a LUT into the
                PFUMX / L6MUX21 of its slice).
    lut:        LUT4 input to output.  mux, mux_select: PFUMX / L6MUX21 from a data input,
                from the select input.
    carry_in:   CCU2C from a LUT input to its sum or carry out; carry_hop: carry in to carry
                out (one CCU2C, two bits); carry_sum: carry in to a sum output.
    ff_out:     flip-flop clock to output; ff_data, ff_control: setup of the data input and
                of the enable / set-reset inputs.
    bram_out:   DP16KD clock to output without its output register (REGMODE ``NOREG``);
                bram_outreg: with it; bram_setup: address, data, enable inputs.
    dsp:        MULT18X18D without input and output registers, input to output;
                dsp_out: clock to output with them; dsp_setup: registered inputs.
    lutram_read: TRELLIS_DPR16X4 read address to data; lutram_setup: its write inputs.
    """

    route: float = 0.95
    lut: float = 0.42
    mux: float = 0.25
    mux_select: float = 0.45
    carry_in: float = 0.45
    carry_hop: float = 0.06
    carry_sum: float = 0.30
    ff_out: float = 0.45
    ff_data: float = 0.10
    ff_control: float = 0.30
    bram_out: float = 5.80
    bram_outreg: float = 1.20
    bram_setup: float = 0.60
    dsp: float = 4.50
    dsp_out: float = 1.00
    dsp_setup: float = 0.30
    lutram_read: float = 0.45
    lutram_setup: float = 0.50

    def launch(self, cell: dict, port: str) -> float | None:
        """The arrival time at output ``port`` of ``cell`` if a clock launches it, else
        ``None`` (the output is combinational)."""
        kind, params = cell["type"], cell.get("parameters", {})
        if kind == "TRELLIS_FF":
            return self.ff_out
        if kind == "DP16KD":
            registered = params.get(f"REGMODE_{port[2]}", "NOREG") != "NOREG"
            return self.bram_outreg if registered else self.bram_out
        if kind == "MULT18X18D":
            return self.dsp_out if _dsp_registered(params)[1] else None
        if kind in ("LUT4", "PFUMX", "L6MUX21", "CCU2C", "TRELLIS_DPR16X4"):
            return None
        return 0.0       # I/O buffers, PLLs, clock buffers: where paths begin

    def through(self, cell: dict, inport: str, outport: str) -> float | None:
        """Delay from input ``inport`` to output ``outport`` of a combinational cell, or
        ``None`` when no path joins them."""
        kind = cell["type"]
        if kind == "LUT4":
            return self.lut
        if kind in ("PFUMX", "L6MUX21"):
            return self.mux_select if inport in ("C0", "SD") else self.mux
        if kind == "CCU2C":
            if inport == "CIN":
                return self.carry_hop if outport == "COUT" else self.carry_sum
            if inport.endswith("1") and outport == "S0":
                return None         # the upper bit's inputs do not reach the lower sum
            return self.carry_in
        if kind == "TRELLIS_DPR16X4":
            return self.lutram_read if inport.startswith("RAD") else None
        if kind == "MULT18X18D":
            return None if any(_dsp_registered(cell.get("parameters", {}))) else self.dsp
        return None

    def capture(self, cell: dict, port: str) -> float | None:
        """The setup time of input ``port`` of ``cell`` if a clock captures it, else
        ``None``."""
        kind = cell["type"]
        if kind == "TRELLIS_FF":
            return self.ff_data if port == "DI" else (
                self.ff_control if port in ("CE", "LSR") else None)
        if kind == "DP16KD":
            return self.bram_setup if port[:2] in ("AD", "DI", "WE", "CE", "CS") else None
        if kind == "MULT18X18D":
            inputs, _ = _dsp_registered(cell.get("parameters", {}))
            return self.dsp_setup if inputs and port[0] in "ABC" else None
        if kind == "TRELLIS_DPR16X4":
            return self.lutram_setup if port[:2] in ("DI", "WA", "WR") else None
        return None


def _dsp_registered(params: dict) -> tuple[bool, bool]:
    """Whether a MULT18X18D registers its inputs, and its output."""
    def clocked(name):
        return params.get(name, "NONE") != "NONE"
    return (clocked("REG_INPUTA_CLK") or clocked("REG_INPUTB_CLK"),
            clocked("REG_OUTPUT_CLK") or clocked("REG_PIPELINE_CLK"))


@dataclass
class Endpoint:
    """The longest estimated path into one captured input.

    ns: the estimate (launch, cells, routing hops, setup); signal: the captured signal (a
    register's name, or ``memory.port``); part: the component holding it; path: the nets from
    the launching signal to the captured input, each with its arrival time.
    """

    ns: float
    signal: str
    part: str
    path: list = field(default_factory=list)     # [(net name, arrival ns)]

    @property
    def start(self) -> str:
        """The launching signal."""
        return self.path[0][0] if self.path else "?"

    @property
    def levels(self) -> int:
        """Cells between the launching and the capturing one."""
        return max(0, len(self.path) - 1)


class Netlist:
    """Drivers, loads and readable names of one flattened module's bits (yosys's JSON, or
    nextpnr's, which keeps the same names)."""

    def __init__(self, module: dict):
        self.cells = module["cells"]
        self.driver = {}
        self.names = {}
        for net, info in module["netnames"].items():
            public = not info.get("hide_name", 0)
            for i, bit in enumerate(info["bits"]):
                if not isinstance(bit, int):
                    continue
                name = net if len(info["bits"]) == 1 else f"{net}[{i}]"
                known = self.names.get(bit)
                # A public name over a generated one; among public names, the shortest.
                if known is None or (public, -len(name)) > known[0]:
                    self.names[bit] = ((public, -len(name)), name)
        for cell_name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                if cell["port_directions"].get(port) == "output":
                    for bit in bits:
                        if isinstance(bit, int):
                            self.driver[bit] = (cell_name, port)
        self.outputs = [(name, bit) for name, port in module.get("ports", {}).items()
                        if port["direction"] == "output"
                        for bit in port["bits"] if isinstance(bit, int)]

    def name(self, bit: int) -> str:
        known = self.names.get(bit)
        return known[1] if known else f"${bit}"


def _arrivals(net: Netlist, model: DelayModel):
    """Arrival time and predecessor of every driven bit, by a depth-first walk that treats a
    combinational loop's back edge as a path start (synthesis should leave none)."""
    arrival, previous, visiting = {}, {}, set()

    def inputs_of(bit):
        cell_name, port = net.driver[bit]
        cell = net.cells[cell_name]
        for inport, bits in cell["connections"].items():
            if cell["port_directions"].get(inport) != "input":
                continue
            delay = model.through(cell, inport, port)
            if delay is None:
                continue
            for source in bits:
                if isinstance(source, int):
                    yield source, delay + _hop(net, model, cell, source)

    def resolve(root):
        stack = [root]
        while stack:
            bit = stack[-1]
            if bit in arrival:
                stack.pop()
                continue
            if bit not in net.driver:
                arrival[bit], previous[bit] = 0.0, None      # an input port or a constant
                stack.pop()
                continue
            cell_name, port = net.driver[bit]
            launch = model.launch(net.cells[cell_name], port)
            if launch is not None:
                arrival[bit], previous[bit] = launch, None
                stack.pop()
                continue
            visiting.add(bit)
            pending = [s for s, _ in inputs_of(bit) if s not in arrival and s not in visiting]
            if pending:
                stack.extend(pending)
                continue
            best, via = 0.0, None
            for source, delay in inputs_of(bit):
                time = arrival.get(source, 0.0) + delay
                if time > best:
                    best, via = time, source
            arrival[bit], previous[bit] = best, via
            visiting.discard(bit)
            stack.pop()

    return arrival, previous, resolve


def _hop(net: Netlist, model: DelayModel, cell: dict, source: int) -> float:
    """The routing delay from ``source``'s driver into ``cell``."""
    driver = net.driver.get(source)
    if driver is None:
        return model.route
    kind, port = net.cells[driver[0]]["type"], driver[1]
    if cell["type"] == "CCU2C" and kind == "CCU2C" and port == "COUT":
        return 0.0                      # the dedicated carry chain
    if cell["type"] in ("PFUMX", "L6MUX21") and kind in ("LUT4", "PFUMX"):
        return 0.0                      # inside the slice
    return model.route


def part_of(signal: str, depth: int | None = None) -> str:
    """The component of a signal's dotted name: the name without its last part, cut to
    ``depth`` parts (``(top)`` for a port of the top module)."""
    parts = signal.split(".")[:-1] or ["(top)"]
    return ".".join(parts[:depth] if depth else parts)


def _signal(net: "Netlist", cell_name: str, cell: dict, port: str) -> str:
    """The captured signal: a flip-flop's output net, or ``memory:PORT`` for the input
    ``PORT`` of a block RAM, DSP or LUT RAM (its bit and block indices dropped)."""
    if cell["type"] == "TRELLIS_FF":
        q = cell["connections"]["Q"][0]
        return re.sub(r"\[\d+\]$", "", net.name(q))
    match = _CELL_SUFFIX.search(cell_name)
    parts = (cell_name[:match.start()] if match else cell_name).split(".")
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return ".".join(parts) + ":" + re.sub(r"\d+$", "", port)


@dataclass
class PartPaths:
    """The endpoints of one component over the budget: how many, and the worst."""

    part: str
    over: int
    worst: Endpoint


@dataclass
class StartPaths:
    """The endpoints over the budget whose worst path begins at one launching signal: a
    register (or block-RAM output) that many long paths share is one place to cut them."""

    start: str
    over: int
    worst: Endpoint


def launching_signal(net_name: str) -> str:
    """A launching net's signal: its name without the bit index and the cell suffixes
    ``synth_ecp5`` appends (``core.flag_TRELLIS_FF_Q`` and ``core.flag[3]`` are
    ``core.flag``)."""
    match = _CELL_SUFFIX.search(net_name)
    return re.sub(r"\[.*$", "", net_name[:match.start()] if match else net_name)


@dataclass
class WideNet:
    """A net driven by logic (a LUT, slice mux, carry or LUT-RAM output) with many sinks.

    The model charges every net one routing hop, but on a routed device a net with hundreds
    of sinks spreads across it: on the 8 x 8 unit (session 17) a 290-sink clock enable driven
    by a LUT took 6.7 ns of wire.  Such a net is best driven by a flip-flop, which leaves it
    the whole cycle.  ns: the estimated arrival at the driver's output; driver: its cell type.
    """

    net: str
    sinks: int
    driver: str
    ns: float


@dataclass
class PathsReport:
    """Every captured input's estimate, summarized against one clock period."""

    budget_ns: float
    endpoints: int
    worst: Endpoint | None
    histogram: dict                     # estimate rounded down to 2 ns -> endpoints
    parts: list = field(default_factory=list)   # PartPaths, worst first
    traced: Endpoint | None = None      # the worst endpoint analyse() was asked to trace
    wide: list = field(default_factory=list)    # WideNet, latest first
    fanout: int = 0                     # the sinks that make a net wide
    starts: list = field(default_factory=list)  # StartPaths, most endpoints first

    @property
    def over(self) -> int:
        """Endpoints whose estimate exceeds the budget."""
        return sum(p.over for p in self.parts)

    def table(self, rows: int = 25) -> str:
        """The components with endpoints over the budget, worst first, and their worst path."""
        lines = [f"{self.endpoints} endpoints, {self.over} over {self.budget_ns:g} ns "
                 f"({1000 / self.budget_ns:.0f} MHz); worst estimate "
                 f"{self.worst.ns if self.worst else 0:.1f} ns",
                 "estimate by 2 ns: " + ", ".join(f"{k}-{k + 2}: {v}"
                                                  for k, v in sorted(self.histogram.items())),
                 "",
                 f"{'ns':>6} {'over':>6} {'levels':>6}  part: start -> end"]
        for p in self.parts[:rows]:
            w = p.worst
            lines.append(f"{w.ns:6.1f} {p.over:6d} {w.levels:6d}  {p.part}: {w.start} -> "
                         f"{w.signal}")
        if len(self.parts) > rows:
            lines.append(f"... {len(self.parts) - rows} more parts (JSON has them all)")
        if self.starts:
            lines += ["", f"where they begin ({len(self.starts)} launching signals), "
                          "most first:", f"{'ns':>6} {'over':>6}  launching signal"]
            lines += [f"{s.worst.ns:6.1f} {s.over:6d}  {s.start}" for s in self.starts[:rows]]
        if self.wide:
            lines += ["", f"{len(self.wide)} nets driven by logic with >= {self.fanout} sinks, "
                          "latest first:", f"{'ns':>6} {'sinks':>6}  driver  net"]
            lines += [f"{w.ns:6.1f} {w.sinks:6d}  {w.driver:7s} {w.net}"
                      for w in self.wide[:rows]]
        if self.traced is not None:
            lines += ["", f"worst path into {self.traced.signal} ({self.traced.ns:.1f} ns):"]
            lines += [f"{ns:6.1f}  {name}" for name, ns in self.traced.path]
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The report as plain data."""
        return {"budget_ns": self.budget_ns, "endpoints": self.endpoints, "over": self.over,
                "worst": asdict(self.worst) if self.worst else None,
                "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "parts": [asdict(p) for p in self.parts],
                "traced": asdict(self.traced) if self.traced else None,
                "fanout": self.fanout, "wide": [asdict(w) for w in self.wide],
                "starts": [asdict(s) for s in self.starts]}


def analyse(netlist: dict, *, budget_ns: float = 10.0, depth: int | None = None,
            model: DelayModel = DelayModel(), top: str | None = None,
            trace: str | None = None, fanout: int = 64) -> PathsReport:
    """Estimate every captured input of ``netlist`` (yosys JSON after ``synth_ecp5``, flat).

    budget_ns: the clock period endpoints are measured against.
    depth:     group endpoints by the first ``depth`` parts of their component's name (all
               of it if ``None``).
    top:       the module to read (the one with the ``top`` attribute if ``None``).
    trace:     keep the worst endpoint whose signal contains this text, net by net
               (:attr:`PathsReport.traced`).
    fanout:    list the nets driven by logic with at least this many sinks
               (:attr:`PathsReport.wide`; none if 0).
    """
    modules = netlist["modules"]
    if top is None:
        tops = [n for n, m in modules.items() if int(m.get("attributes", {}).get("top", 0) or 0)]
        top = tops[0] if tops else next(iter(modules))
    net = Netlist(modules[top])
    arrival, previous, resolve = _arrivals(net, model)

    def endpoint(bit, setup, signal):
        resolve(bit)
        path, b = [], bit
        while b is not None:
            path.append((net.name(b), round(arrival[b], 2)))
            b = previous.get(b)
        ns = round(arrival[bit] + model.route + setup, 2)
        return Endpoint(ns, signal, part_of(signal, depth), path[::-1])

    found = []
    for cell_name, cell in net.cells.items():
        for port, bits in cell["connections"].items():
            if cell["port_directions"].get(port) != "input":
                continue
            setup = model.capture(cell, port)
            if setup is None:
                continue
            signal = _signal(net, cell_name, cell, port)
            found += [endpoint(bit, setup, signal) for bit in bits if isinstance(bit, int)]
    found += [endpoint(bit, 0.0, name) for name, bit in net.outputs]
    histogram = Counter(int(e.ns // 2) * 2 for e in found)
    over, by_start = defaultdict(list), defaultdict(list)
    for e in found:
        if e.ns > budget_ns:
            over[e.part].append(e)
            by_start[launching_signal(e.start)].append(e)
    parts = [PartPaths(part, len(es), max(es, key=lambda e: e.ns)) for part, es in over.items()]
    parts.sort(key=lambda p: (-p.worst.ns, p.part))
    starts = [StartPaths(start, len(es), max(es, key=lambda e: e.ns))
              for start, es in by_start.items()]
    starts.sort(key=lambda s: (-s.over, -s.worst.ns, s.start))
    traced = max((e for e in found if trace and trace in e.signal), key=lambda e: e.ns,
                 default=None)
    return PathsReport(budget_ns, len(found), max(found, key=lambda e: e.ns, default=None),
                       dict(histogram), parts, traced,
                       _wide_nets(net, model, arrival, resolve, fanout) if fanout else [],
                       fanout, starts)


def _wide_nets(net: Netlist, model: DelayModel, arrival: dict, resolve, fanout: int) -> list:
    """The nets driven by a combinational cell output with at least ``fanout`` sinks."""
    sinks = Counter(bit for cell in net.cells.values()
                    for port, bits in cell["connections"].items()
                    if cell["port_directions"].get(port) == "input"
                    for bit in bits if isinstance(bit, int))
    wide = []
    for bit, count in sinks.items():
        if count < fanout or bit not in net.driver:
            continue
        cell_name, port = net.driver[bit]
        cell = net.cells[cell_name]
        if model.launch(cell, port) is not None:
            continue
        resolve(bit)
        wide.append(WideNet(net.name(bit), count, cell["type"], round(arrival[bit], 2)))
    wide.sort(key=lambda w: (-w.ns, -w.sinks, w.net))
    return wide


def unit_paths(design, out, *, budget_ns: float = 10.0, depth: int | None = None,
               trace: str | None = None, fanout: int = 64,
               timeout: float | None = None) -> PathsReport:
    """Synthesize ``design`` (an elaboratable, or an RTLIL/Verilog path) for the ECP5-85F in
    ``out`` and estimate its paths (:func:`analyse`); also writes ``out/paths.json``."""
    from .breakdown import FAMILIES
    from .pnr import synthesize
    out = Path(out)
    netlist = synthesize(design, FAMILIES["ecp5"], out, timeout=timeout)
    report = analyse(json.loads(netlist.read_text()), budget_ns=budget_ns, depth=depth,
                     trace=trace, fanout=fanout)
    (out / "paths.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return report


def preset_paths(name: str, out=None, *, design_name: str = "unit", **kwargs) -> PathsReport:
    """:func:`unit_paths` of a preset's design on the ECP5, in ``out`` (default
    ``build/out/paths/PRESET-DESIGN``)."""
    from ..hdl.config import preset
    from .cli import design
    out = Path(out) if out else Path("build") / "out" / "paths" / f"{name}-{design_name}"
    return unit_paths(design(design_name, preset(name)), out, **kwargs)


#: ``make bench``: the presets whose whole unit is estimated, at 100 MHz.
BENCH_PATHS = ("ecp5-int8", "ecp5-full")


def bench_paths(cases=BENCH_PATHS, rows: int = 8) -> list:
    """Per preset, the whole unit's estimate at 100 MHz: a summary row, then its ``rows``
    worst components (grouped two names deep) with their worst path."""
    found = []
    for name in cases:
        report = preset_paths(name, depth=2)
        found.append({"preset": name, "part": "(unit)", "worst_ns": report.worst.ns,
                      "over_10ns": report.over, "endpoints": report.endpoints,
                      "path": f"{report.worst.start} -> {report.worst.signal}"})
        found += [{"preset": name, "part": p.part, "worst_ns": p.worst.ns, "over_10ns": p.over,
                   "levels": p.worst.levels, "path": f"{p.worst.start} -> {p.worst.signal}"}
                  for p in report.parts[:rows]]
    return found
