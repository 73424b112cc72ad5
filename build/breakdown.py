"""Resources of the CUBE unit by component: each part synthesized and packed on its own.

:func:`breakdown` walks the elaborated hierarchy of a design (``Fragment.get``), takes the
:class:`~amaranth.lib.wiring.Component` children of the nodes named in ``expand`` as its
parts, and runs yosys (``synth_ecp5`` / ``synth_ice40 -dsp -spram``, the script of
:func:`~ptocube.build.pnr.synthesize`) and nextpnr ``--pack-only`` on each, ports left
unconstrained.  It reports per part the yosys cells (LUT4, FF, carry, DSP, block RAM,
distributed RAM / SPRAM) and the logic cells nextpnr packs them into (TRELLIS_COMB /
ICESTORM_LC, the figure the device's capacity is counted in), and their sum over the unit.

Children of one parent whose names differ only in trailing indices (``img2col0`` ...
``img2col3``, ``pe_0_0`` ... ``pe_7_7``) and whose class is the same are one part with a
count; the first instance is measured (they are built from the same parameters).  A part's
own children appear as indented rows, included in their parent's figures and not added to
the sum again.  Logic of a parent outside its component children (the top level's FSM and
wiring) is not measured.

Each part's figures are cached in ``out`` under the SHA-256 of its RTLIL, so a part whose
source did not change is not synthesized again, and the digest says which version a
figure belongs to; parts left out of a run (``select``) are reported from the cache as last
measured.  ``docs/fpga.md`` ("Breakdown by component") has the measured tables.
"""

import hashlib
import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from amaranth.hdl import Fragment
from amaranth.lib import wiring

from .pnr import DEVICES, ToolError, cell_counts, synthesize, tool

__all__ = ["FAMILIES", "UNIT_EXPAND", "Part", "PartFigures", "Breakdown",
           "parts", "each_part", "cached_figures", "measure_cached", "measure", "breakdown", "unit_breakdown", "bench_breakdown",
           "BENCH_BREAKDOWNS"]

#: The device each family's parts are packed for (synthesis does not depend on the part).
FAMILIES = {"ecp5": DEVICES["LFE5U-85F-6BG381"], "ice40": DEVICES["iCE40UP5K-SG48"]}

#: The nodes of :class:`~ptocube.hdl.top.CubeUnit` whose component children are parts: the
#: unit itself, the CUBE engine, its systolic array (PEs, input decoders) and result path
#: (post-processing, reductions).
UNIT_EXPAND = ("", "cube", "cube.array", "cube.result")

# Resource columns: yosys cell types (a name ending in "*" is a prefix), per family.
_COLUMNS = {
    "ecp5": {"LUT4": ("LUT4",), "FF": ("TRELLIS_FF",), "carry": ("CCU2C",),
             "DSP": ("MULT18X18D", "ALU54B"), "BRAM": ("DP16KD",),
             "LUTRAM": ("TRELLIS_DPR16X4",), "MUX": ("PFUMX", "L6MUX21")},
    "ice40": {"LUT4": ("SB_LUT4",), "FF": ("SB_DFF*",), "carry": ("SB_CARRY",),
              "DSP": ("SB_MAC16",), "BRAM": ("SB_RAM40_4K",), "SPRAM": ("SB_SPRAM256KA",)},
}
# nextpnr BELs giving the device capacity of the columns that have one.
_CAPACITY = {
    "ecp5": {"logic": "TRELLIS_COMB", "FF": "TRELLIS_FF", "DSP": "MULT18X18D",
             "BRAM": "DP16KD", "LUTRAM": "TRELLIS_RAMW"},
    "ice40": {"logic": "ICESTORM_LC", "FF": "ICESTORM_LC", "DSP": "ICESTORM_DSP",
              "BRAM": "ICESTORM_RAM", "SPRAM": "ICESTORM_SPRAM"},
}


@dataclass
class Part:
    """One part of a design: ``component`` stands for ``count`` instances at ``path``."""

    path: str
    component: wiring.Component
    count: int
    depth: int

    @property
    def kind(self) -> str:
        """The component's class name."""
        return type(self.component).__name__


@dataclass
class PartFigures:
    """Figures of one instance of a part.

    cells: yosys cell census; logic: (packed logic cells, device capacity); capacity: the
    device's BELs of each column (``_CAPACITY``); digest: SHA-256 of the part's RTLIL;
    seconds: RTLIL + synthesis + packing, CPU-bound wall time; measured: UTC time.
    """

    path: str
    kind: str
    count: int
    depth: int
    family: str
    cells: dict
    logic: int
    capacity: dict
    digest: str
    seconds: float
    measured: str

    def resources(self) -> dict:
        """Column -> count for one instance (``logic`` = packed logic cells)."""
        return {**_columns(self.family, self.cells), "logic": self.logic}


def _columns(family: str, cells: dict) -> dict:
    out = {}
    for column, names in _COLUMNS[family].items():
        total = 0
        for name in names:
            if name.endswith("*"):
                total += sum(n for t, n in cells.items() if t.startswith(name[:-1]))
            else:
                total += cells.get(name, 0)
        out[column] = total
    return out


def _group(name: str) -> str:
    # img2col3 -> img2col, pe_2_7 -> pe, dec_a0 -> dec_a
    return re.sub(r"[_\d]+$", "", name) or name


def parts(design, expand=UNIT_EXPAND) -> list[Part]:
    """The parts of ``design`` (elaborated once, no platform), depth first.

    ``expand``: paths (``""`` the design itself, ``"cube.array"``, ...) whose component
    children are parts.  Raises ``ValueError`` when a path in ``expand`` names no part.
    """
    found = []
    seen = {""}

    def walk(fragment, path, depth):
        groups = {}
        for sub, name, _src in fragment.subfragments:
            origin = sub.origins[0] if sub.origins else None
            if name is None or not isinstance(origin, wiring.Component):
                continue
            key = (_group(name), type(origin))
            if key in groups:
                groups[key][1] += 1
            else:
                groups[key] = [sub, 1, origin]
        for (group, _cls), (sub, count, origin) in groups.items():
            child = f"{path}.{group}" if path else group
            seen.add(child)
            found.append(Part(child, origin, count, depth))
            if child in expand:
                walk(sub, child, depth + 1)

    walk(Fragment.get(design, None), "", 0)
    missing = [p for p in expand if p not in seen]
    if missing:
        raise ValueError(f"no part at {', '.join(map(repr, missing))} "
                         f"(parts: {', '.join(p.path for p in found)})")
    return found


def _tool_run(args, workdir: Path, log: str, timeout):
    try:
        done = subprocess.run(args, cwd=workdir, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolError(f"{Path(args[0]).name} did not finish within {timeout} s") from None
    if done.returncode != 0:
        path = workdir / log
        text = path.read_text() if path.exists() else done.stderr
        tail = "\n".join(text.splitlines()[-15:])
        raise ToolError(f"{Path(args[0]).name} failed (exit {done.returncode}):\n{tail}")


def _pack(family: str, workdir: Path, timeout):
    """nextpnr ``--pack-only`` of ``top.json``: its utilization report."""
    device = FAMILIES[family]
    pins = "--lpf-allow-unconstrained" if family == "ecp5" else "--pcf-allow-unconstrained"
    args = [tool(f"yowasp-nextpnr-{family}"), *device.nextpnr_args, "--json", "top.json",
            "--pack-only", pins, "--report", "pack.json", "--log", "pack.log", "--quiet"]
    _tool_run(args, workdir, "pack.log", timeout)
    return json.loads((workdir / "pack.json").read_text())["utilization"]


def cached_figures(cache: Path, figures_type, part: Part, *, digest=None, family=None):
    """The figures of ``part`` cached in ``cache``, or ``None`` (no file, or with ``digest``:
    another digest or family).  Keys the class no longer has (an older version's) are
    dropped."""
    if not cache.exists():
        return None
    cached = json.loads(cache.read_text())
    if digest is not None and (cached.get("digest"), cached.get("family")) != (digest, family):
        return None
    known = {f.name for f in fields(figures_type)}
    cached = {key: value for key, value in cached.items() if key in known}
    cached.update(path=part.path, count=part.count, depth=part.depth)
    return figures_type(**cached)


def measure_cached(part: Part, family: str, out, text: str, suffix: str, figures_type,
                   run, key: str = ""):
    """The frame of one part's measurement, shared with :mod:`~ptocube.build.timing`.

    ``text`` is the part's RTLIL (written to ``out/<path>/part.il``); its SHA-256 (with
    ``key``: other inputs of the measurement) is the digest under which the figures are
    cached in ``out/<path><suffix>``.  A cached figure of the same digest and family is
    returned as it is; otherwise ``run(work_dir)`` returns the type-specific fields of
    ``figures_type``, which are completed, cached and returned.
    """
    out = Path(out)
    start = time.monotonic()
    digest = hashlib.sha256((text + key).encode()).hexdigest()[:16]
    cache = out / f"{part.path}{suffix}"
    cached = cached_figures(cache, figures_type, part, digest=digest, family=family)
    if cached is not None:
        return cached
    work = out / part.path
    work.mkdir(parents=True, exist_ok=True)
    (work / "part.il").write_text(text)
    specific = run(work)
    figures = figures_type(path=part.path, kind=part.kind, count=part.count, depth=part.depth,
                           family=family, digest=digest,
                           seconds=round(time.monotonic() - start, 1),
                           measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           **specific)
    cache.write_text(json.dumps(asdict(figures), indent=1) + "\n")
    return figures


def measure(part: Part, family: str, out, *, timeout: float | None = None) -> PartFigures:
    """Synthesize and pack one instance of ``part`` for ``family`` in ``out/<path>/``.

    A cached ``out/<path>.json`` with the same RTLIL digest is returned as it is.
    """
    from amaranth.back import rtlil
    if family not in FAMILIES:
        raise ValueError(f"unknown FPGA family {family!r}; known: {', '.join(FAMILIES)}")

    def run(work):
        synthesize(work / "part.il", FAMILIES[family], work, top_name="top", timeout=timeout)
        cells = cell_counts(json.loads((work / "top.stat.json").read_text()))
        placed = _pack(family, work, timeout)
        capacity = {col: placed[bel]["available"] for col, bel in _CAPACITY[family].items()
                    if bel in placed}
        logic = placed.get(_CAPACITY[family]["logic"], {}).get("used", 0)
        return {"cells": cells, "logic": logic, "capacity": capacity}
    return measure_cached(part, family, out,
                          rtlil.convert(part.component, name="top", platform=FAMILIES[family]),
                          ".json", PartFigures, run)


@dataclass
class Breakdown:
    """The measured parts of one design for one family, and their sum."""

    family: str
    title: str
    rows: list = field(default_factory=list)       # PartFigures, depth first
    missing: list = field(default_factory=list)    # paths neither selected nor cached
    failed: dict = field(default_factory=dict)     # path -> the tool's error

    def columns(self) -> list[str]:
        """The resource columns of this family, ``logic`` last."""
        return [*_COLUMNS[self.family], "logic"]

    def total(self) -> dict:
        """Sum over the top-level parts (depth 0), each times its count."""
        total = dict.fromkeys(self.columns(), 0)
        for row in self.rows:
            if row.depth == 0:
                for col, value in row.resources().items():
                    total[col] += row.count * value
        return total

    def capacity(self) -> dict:
        """The device's capacity of each column that has one (from nextpnr)."""
        return next((row.capacity for row in self.rows), {})

    def per_pe(self, array="cube.array", pe="cube.array.pe") -> dict:
        """Per processing element: the PE alone and the array divided by its PE count."""
        rows = {row.path: row for row in self.rows}
        result = {}
        if pe in rows:
            result["pe"] = rows[pe].resources()
            if array in rows:
                result["array_per_pe"] = {col: round(value / rows[pe].count, 1)
                                          for col, value in rows[array].resources().items()}
        return result

    def table(self) -> str:
        """The breakdown as a fixed-width text table."""
        cols = self.columns()
        head = f"{'part':<28} {'n':>3} " + " ".join(f"{c:>7}" for c in cols) + "  digest"
        lines = [self.title, head]
        for row in self.rows:
            name = "  " * row.depth + row.path.rsplit(".", 1)[-1] + f" ({row.kind})"
            res = row.resources()
            lines.append(f"{name:<28} {row.count:>3} " + " ".join(f"{res[c]:>7}" for c in cols)
                         + f"  {row.digest[:8]}")
        total, capacity = self.total(), self.capacity()
        lines.append(f"{'sum (parts x n)':<28} {'':>3} "
                     + " ".join(f"{total[c]:>7}" for c in cols))
        lines.append(f"{'device':<28} {'':>3} "
                     + " ".join(f"{capacity[c] if c in capacity else '':>7}" for c in cols))
        shares = [f"{100 * total[c] / capacity[c]:.1f}" if capacity.get(c) else "" for c in cols]
        lines.append(f"{'share %':<28} {'':>3} " + " ".join(f"{s:>7}" for s in shares))
        for name, figures in self.per_pe().items():
            lines.append(f"{name}: " + ", ".join(f"{c} {figures[c]}"
                                                 for c in ("LUT4", "FF", "carry", "DSP",
                                                           "logic")))
        if self.missing:
            lines.append("not measured: " + ", ".join(self.missing))
        for path, error in self.failed.items():
            lines.append(f"failed: {path}: {error}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A plain dictionary: every row's resources and cells, the sum, capacity, per PE."""
        return {"family": self.family, "title": self.title,
                "parts": [{**asdict(row), "resources": row.resources()} for row in self.rows],
                "total": self.total(), "capacity": self.capacity(), "per_pe": self.per_pe(),
                "missing": self.missing, "failed": self.failed}


def each_part(found: list, select, out: Path, suffix: str, figures_type, run,
              progress=None) -> tuple:
    """Measure the ``select``-ed parts of ``found`` with ``run(part)``, deepest first.

    Shared by :func:`breakdown` and :func:`~ptocube.build.timing.timing`.  Parts not selected
    come from their cache file ``out/<path><suffix>`` (``figures_type(**json)``) when there.
    Returns ``(rows, missing, failed)``: the figures in ``found``'s order, the paths neither
    measured nor cached, and path -> first line of the ``ToolError`` of a failed part.
    Raises ``ValueError`` for a selected path that is not a part.
    """
    if select is not None:
        known = {p.path for p in found}
        unknown = [s for s in select if s not in known]
        if unknown:
            raise ValueError(f"unknown part {', '.join(map(repr, unknown))}; "
                             f"parts: {', '.join(sorted(known))}")
    figures, failed = {}, {}
    # Sub-parts first: a parent (the whole CUBE engine) is the longest run of all.
    for part in sorted(found, key=lambda p: -p.depth):
        chosen = select is None or any(part.path == s or part.path.startswith(s + ".")
                                       for s in select)
        if not chosen:
            cached = cached_figures(out / f"{part.path}{suffix}", figures_type, part)
            if cached is not None:
                figures[part.path] = cached
            continue
        try:
            figures[part.path] = run(part)
        except ToolError as error:
            failed[part.path] = str(error).splitlines()[0]
            continue
        if progress is not None:
            progress(figures[part.path])
    rows = [figures[p.path] for p in found if p.path in figures]
    missing = [p.path for p in found if p.path not in figures and p.path not in failed]
    return rows, missing, failed


def breakdown(design, family: str, out, *, expand=UNIT_EXPAND, select=None, title="",
              timeout: float | None = None, progress=None) -> Breakdown:
    """Measure the parts of ``design`` for ``family`` (``"ecp5"`` or ``"ice40"``).

    select:   part paths to measure (a path also selects its sub-parts; ``None``: every part);
              cached figures of unselected parts are still reported.
    progress: called with each :class:`PartFigures` as it is measured (sub-parts first).
    A part whose synthesis fails (``ToolError``) is in ``failed`` with the error's first line.
    """
    found = parts(design, expand)
    if family not in FAMILIES:
        raise ValueError(f"unknown FPGA family {family!r}; known: {', '.join(FAMILIES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = Breakdown(family, title)
    result.rows, result.missing, result.failed = each_part(
        found, select, out, ".json", PartFigures,
        lambda part: measure(part, family, out, timeout=timeout), progress)
    return result


def unit_breakdown(preset_name: str, family: str, out=None, **kwargs) -> Breakdown:
    """:func:`breakdown` of ``CubeUnit(preset)``; ``out`` defaults to
    ``build/out/breakdown/PRESET-FAMILY``."""
    from ..hdl.config import preset
    from ..hdl.top import CubeUnit
    config = preset(preset_name)
    out = Path(out) if out is not None else Path("build/out/breakdown") / f"{preset_name}-{family}"
    title = (f"CubeUnit {preset_name} ({config.rows} x {config.cols}), {family} "
             f"({FAMILIES[family]}), yosys cells per instance, logic = nextpnr --pack-only")
    return breakdown(CubeUnit(config), family, out, title=title, **kwargs)


#: ``make bench`` breakdowns: (preset, family).
BENCH_BREAKDOWNS = (("ice40-tiny", "ice40"), ("ecp5-int8", "ecp5"), ("ecp5-full", "ecp5"))


def bench_breakdown(cases=BENCH_BREAKDOWNS) -> list:
    """One row per part and preset (``make bench``; cached parts are not synthesized again)."""
    rows = []
    for preset_name, family in cases:
        result = unit_breakdown(preset_name, family)
        for row in result.rows:
            rows.append({"preset": preset_name, "family": family, "part": row.path,
                         "n": row.count, **row.resources(), "seconds": row.seconds})
        rows.append({"preset": preset_name, "family": family, "part": "sum", "n": "",
                     **result.total()})
    return rows
