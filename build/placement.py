"""Where a placement puts the unit's wires: long nets and congestion, before routing.

nextpnr's static placer places the 8 x 8 unit in about five minutes; router2 then takes 30-90
minutes, and on a congested placement never finishes.  The placement alone already says
which registers drive wires across the device (the routed critical paths of sessions 17-22
were 80-90 % wire) and where the wires crowd.  nextpnr writes it with ``--no-route --write
placed.json`` (or ``--write`` after routing): the netlist with a ``NEXTPNR_BEL`` attribute,
``X<x>/Y<y>/<site>``, on every placed cell.

This module reads such a netlist and gives

* **wirelength**: the sum of the nets' half-perimeters, the figure nextpnr's placer
  minimizes (its log's ``wirelen``); across seeds of one netlist, the placements that
  router2 finished had the lower figures;
* **far nets**: for every net, the Manhattan distance in tiles from its driver to its
  farthest sink, grouped by the driving signal (the bits of one register together);
* **congestion**: the RUDY estimate (rectangular uniform wire density: each net spreads its
  half-perimeter evenly over its bounding box), the densest window of the device and the
  components whose nets load it.

Both rank; neither predicts nextpnr's delays.  What router2 itself finds crowded it writes with
``--router2-heatmap PREFIX`` (``ptocube build --heatmap``): per iteration, the overuse of every
net (``PREFIX_congestion_by_net_N.csv``); :func:`congestion` ranks its components and signals.  Names follow :mod:`~ptocube.build.paths`: a
net is named after its shortest public name, a component is its dotted name without the
last part.
"""

import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from .paths import Netlist, part_of

__all__ = ["FarSignal", "PlacementReport", "is_placed", "analyse", "CongestionReport",
           "congestion"]

_BEL = re.compile(r"X(\d+)/Y(\d+)/")
# A net's bit index, and the suffix yosys gives a net it named after a mapped cell
# (``store.cmd_TRELLIS_FF_Q_3_DI``): both dropped to group a register's bits.
_BIT = re.compile(r"\[\d+\]$")
_CELL_NET = re.compile(r"_(TRELLIS_|DP16KD|MULT18X18D|LUT4|CCU2C|PFUMX|L6MUX21).*$")
# A block RAM's port net (``store.payload0.0.7_ADB7``: memory, block, port and bit) is
# grouped as ``store.payload0:ADB``.
_RAM_PORT = re.compile(r"(\.\d+)+_([A-Z]+?)\d*(_\d+)?$")
# Nets with more sinks than this (clock, reset) are not wires the design's logic chooses,
# nor are the packer's constant nets.
_GLOBAL_SINKS = 2000


@dataclass
class FarSignal:
    """The nets of one signal whose farthest sink is at least the report's ``far`` tiles
    from the driver: ``tiles`` the longest of them, ``bits`` how many, ``sinks`` the most
    sinks of one of them, ``driver`` the cell type that drives the longest."""

    signal: str
    tiles: int
    bits: int
    sinks: int
    driver: str


@dataclass
class PlacementReport:
    """Far nets and the densest window of one placement."""

    cells: int                          # placed cells
    nets: int                           # nets measured (two or more placed pins)
    wirelength: int                     # their half-perimeters, in tiles
    far: int                            # the distance, in tiles, that makes a net far
    histogram: dict                     # distance rounded down to 20 tiles -> nets
    signals: list = field(default_factory=list)    # FarSignal, longest first
    window: dict = field(default_factory=dict)     # x, y, size, demand of the densest window
    parts: list = field(default_factory=list)      # (component, share of that window's demand)

    @property
    def far_nets(self) -> int:
        """Nets whose farthest sink is at least ``far`` tiles away."""
        return sum(s.bits for s in self.signals)

    def table(self, rows: int = 25) -> str:
        """The far signals, longest first, then the densest window's components."""
        w = self.window
        lines = [f"{self.cells} placed cells, {self.nets} nets, wirelength {self.wirelength} "
                 f"tiles; {self.far_nets} nets reach {self.far} tiles or more from their "
                 "driver",
                 "nets by farthest sink (tiles): " + ", ".join(
                     f"{k}-{k + 19}: {v}" for k, v in sorted(self.histogram.items())),
                 "", f"{'tiles':>5} {'bits':>5} {'sinks':>6}  driver      signal"]
        lines += [f"{s.tiles:5d} {s.bits:5d} {s.sinks:6d}  {s.driver:11s} {s.signal}"
                  for s in self.signals[:rows]]
        if len(self.signals) > rows:
            lines.append(f"... {len(self.signals) - rows} more signals (JSON has them all)")
        if w:
            lines += ["", f"densest {w['size']} x {w['size']} window: X {w['x']}-"
                          f"{w['x'] + w['size'] - 1}, Y {w['y']}-{w['y'] + w['size'] - 1} "
                          f"(RUDY demand {w['demand']:.0f}, device mean per window "
                          f"{w['mean']:.0f}); its components:"]
            lines += [f"{100 * share:5.1f} %  {part}" for part, share in self.parts[:rows]]
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The report as plain data."""
        return {"cells": self.cells, "nets": self.nets, "wirelength": self.wirelength,
                "far": self.far,
                "far_nets": self.far_nets,
                "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                "signals": [asdict(s) for s in self.signals], "window": self.window,
                "parts": [{"part": p, "share": round(s, 4)} for p, s in self.parts]}


def is_placed(netlist: dict) -> bool:
    """Whether nextpnr placed the cells of ``netlist`` (it marks each with its site)."""
    return any(_BEL.match(cell.get("attributes", {}).get("NEXTPNR_BEL", ""))
               for module in netlist["modules"].values()
               for cell in module.get("cells", {}).values())


def _signal_of(name: str) -> str:
    return _RAM_PORT.sub(r":\2", _CELL_NET.sub("", _BIT.sub("", name)))


def analyse(netlist: dict, *, far: int = 60, window: int = 16, depth: int | None = 4,
            top: str | None = None) -> PlacementReport:
    """Measure the placement in ``netlist`` (nextpnr's ``--write`` JSON).

    far:    the driver-to-farthest-sink distance, in tiles, from which a net is listed.
    window: the side, in tiles, of the windows searched for the densest one (in steps of a
            quarter of it).
    depth:  group the densest window's nets by the first ``depth`` parts of their component.
    top:    the module to read (the one with the ``top`` attribute if ``None``).
    """
    modules = netlist["modules"]
    if top is None:
        top = next((n for n, m in modules.items() if m.get("attributes", {}).get("top")),
                   next(iter(modules)))
    net = Netlist(modules[top])
    where = {}
    for cell_name, cell in net.cells.items():
        match = _BEL.match(cell.get("attributes", {}).get("NEXTPNR_BEL", ""))
        if match:
            where[cell_name] = (int(match[1]), int(match[2]))
    if not where:
        raise ValueError("no placed cells: write the netlist with nextpnr --write after "
                         "placement (e.g. --no-route --write placed.json)")
    sinks = defaultdict(list)
    for cell_name, xy in where.items():
        cell = net.cells[cell_name]
        for port, bits in cell["connections"].items():
            if cell["port_directions"].get(port) != "output":
                for bit in bits:
                    if isinstance(bit, int):
                        sinks[bit].append(xy)
    width = max(x for x, _ in where.values()) + 1
    height = max(y for _, y in where.values()) + 1
    demand = [[0.0] * height for _ in range(width)]
    histogram, measured, wirelength = Counter(), 0, 0
    longest = {}
    boxes = []
    for bit, points in sinks.items():
        cell_name, _ = net.driver.get(bit, (None, None))
        if cell_name not in where or len(points) > _GLOBAL_SINKS or \
                net.name(bit).startswith("$PACKER_"):
            continue
        x0, y0 = where[cell_name]
        measured += 1
        distance = max(abs(x - x0) + abs(y - y0) for x, y in points)
        histogram[distance // 20 * 20] += 1
        xs, ys = [x0, *(x for x, _ in points)], [y0, *(y for _, y in points)]
        box = (min(xs), max(xs), min(ys), max(ys))
        boxes.append((bit, box))
        wirelength += box[1] - box[0] + box[3] - box[2]
        # RUDY: the net's half-perimeter spread over its bounding box.
        area = (box[1] - box[0] + 1) * (box[3] - box[2] + 1)
        density = (box[1] - box[0] + box[3] - box[2] + 1) / area
        for x in range(box[0], box[1] + 1):
            column = demand[x]
            for y in range(box[2], box[3] + 1):
                column[y] += density
        if distance >= far:
            signal = _signal_of(net.name(bit))
            entry = longest.setdefault(signal, [0, 0, 0, ""])
            entry[1] += 1
            entry[2] = max(entry[2], len(points))
            if distance > entry[0]:
                entry[0], entry[3] = distance, net.cells[cell_name]["type"]
    signals = sorted((FarSignal(s, t, b, k, d) for s, (t, b, k, d) in longest.items()),
                     key=lambda s: (-s.tiles, -s.bits, s.signal))
    best = _densest(demand, width, height, window)
    parts = []
    if best:
        x, y = best["x"], best["y"]
        load = Counter()
        for bit, (bx0, bx1, by0, by1) in boxes:
            ox = min(bx1, x + window - 1) - max(bx0, x) + 1
            oy = min(by1, y + window - 1) - max(by0, y) + 1
            if ox > 0 and oy > 0:
                area = (bx1 - bx0 + 1) * (by1 - by0 + 1)
                load[part_of(net.name(bit), depth)] += \
                    (bx1 - bx0 + by1 - by0 + 1) / area * ox * oy
        total = sum(load.values())
        parts = [(p, v / total) for p, v in load.most_common()]
    return PlacementReport(len(where), measured, wirelength, far, dict(histogram), signals, best,
                           parts)


def _densest(demand, width: int, height: int, size: int) -> dict:
    """The window of ``size`` x ``size`` tiles with the most demand (searched in steps of a
    quarter of it), and the mean over all such windows."""
    step = max(1, size // 4)
    best, sums = None, []
    for x in range(0, max(1, width - size + 1), step):
        strip = [sum(demand[i][y] for i in range(x, min(width, x + size)))
                 for y in range(height)]
        for y in range(0, max(1, height - size + 1), step):
            total = sum(strip[y:y + size])
            sums.append(total)
            if best is None or total > best[0]:
                best = (total, x, y)
    if best is None:
        return {}
    return {"x": best[1], "y": best[2], "size": size, "demand": round(best[0], 1),
            "mean": round(sum(sums) / len(sums), 1)}


@dataclass
class CongestionReport:
    """router2's overuse in one iteration, by component and by signal, most first."""

    iteration: int | None
    overuse: int                        # the sum over all nets
    nets: int                           # nets with some overuse
    parts: list = field(default_factory=list)      # (component, overuse)
    signals: list = field(default_factory=list)    # (signal, overuse)

    def table(self, rows: int = 25) -> str:
        """The components, then the signals, with their overuse and share."""
        total = max(1, self.overuse)
        at = "" if self.iteration is None else f" at iteration {self.iteration}"
        lines = [f"router2 overuse{at}: {self.overuse} on {self.nets} nets", "",
                 f"{'overuse':>8} {'share':>7}  component"]
        lines += [f"{v:8d} {100 * v / total:6.1f} %  {p}" for p, v in self.parts[:rows]]
        lines += ["", f"{'overuse':>8} {'share':>7}  signal"]
        lines += [f"{v:8d} {100 * v / total:6.1f} %  {s}" for s, v in self.signals[:rows]]
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The report as plain data."""
        return {"iteration": self.iteration, "overuse": self.overuse, "nets": self.nets,
                "parts": [{"part": p, "overuse": v} for p, v in self.parts],
                "signals": [{"signal": s, "overuse": v} for s, v in self.signals]}


_ITERATION = re.compile(r"_congestion_by_net_(\d+)\.csv$")


def congestion(text: str, *, depth: int | None = 4, name: str = "") -> CongestionReport:
    """Rank the nets of one router2 heatmap, ``text`` of ``PREFIX_congestion_by_net_N.csv``
    (lines ``net,overuse``), by component (the first ``depth`` parts of the net's name)
    and by signal (bits and mapped-cell suffixes dropped, as :func:`analyse` does).
    ``name``: the file's name, for the iteration it holds."""
    parts, signals, total, nets = Counter(), Counter(), 0, 0
    for line in text.splitlines():
        net_name, _, count = line.rpartition(",")
        if not net_name or not count.strip().isdigit():
            continue
        overuse = int(count)
        total += overuse
        nets += 1
        parts[part_of(net_name, depth)] += overuse
        signals[_signal_of(net_name)] += overuse
    match = _ITERATION.search(name)
    return CongestionReport(int(match[1]) if match else None, total, nets,
                            parts.most_common(), signals.most_common())
