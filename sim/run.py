"""``ptocube run SCENARIO``: run a scenario file and report what every bundle did.

``--engine model`` runs the golden model; ``--engine sim`` runs the simulated
:class:`~ptocube.hdl.top.CubeUnit` (:mod:`ptocube.sim.hw_run`, build ``--preset``,
default ``sim-small``; ``--vcd FILE`` also writes a waveform and a GTKWave save
file); ``--engine verilator`` runs the same unit's exported Verilog built with
Verilator (:mod:`ptocube.sim.verilator`).  All return the same JSON result; the hardware's adds ``cycles`` to every
bundle (record out of the decoder to its status) and to the whole program, and
has empty fault ``reason`` texts (only the class and index are architectural).

Result format (``--json``)::

    {"scenario": NAME, "engine": "model", "arithmetic": "ieee",
     "bundles": [{"bundle": 0, "operation": "BSTART.TMATMUL", "outcome": "success",
                  "published": [{"pe": 0, "hand": "T", "n": 1, "selector": "T#1",
                                 "dtype": "S32", "layout": "CUBE_M16", "location": "Matrix",
                                 "tsize": 128, "shape": [2, 2],
                                 "data": [["0x00000013", "0x00000016"], ...]}]},
                 {"bundle": 1, "operation": "...", "outcome": "fault",
                  "fault": "Fault_TileLegality", "fault_index": 12, "reason": "..."}],
     "status": {"flags": ["OF", "NX"], "value": "0x14"}}

``data`` holds every valid element as a raw hex bit pattern, in logical
row-major order.  ``reason`` is informative only (not architectural).
Exit status: 0 when the scenario ran (whatever its bundles did), 2 for a
malformed scenario or an unavailable engine.
"""

import argparse
import json
import sys

import numpy as np

from ptocube.model.datatype import DataType
from ptocube.model.machine import Machine, Outcome
from ptocube.model.numeric import decode
from ptocube.model.scenario import Scenario, ScenarioError, load_scenario
from ptocube.model.state import StatusFlag

__all__ = ["ENGINES", "EngineUnavailable", "run_scenario", "format_table",
           "add_run_arguments", "run_run"]

#: Engines ``--engine`` accepts.
ENGINES = ("model", "sim", "verilator")


class EngineUnavailable(RuntimeError):
    """The requested engine cannot run scenarios (yet)."""


def _hex(value: int, bits: int) -> str:
    return f"0x{int(value):0{max(bits // 4, 1)}x}"


def _tile_record(published) -> dict:
    t = published.tile
    raw = t.raw()
    return {"pe": published.pe, "hand": published.hand, "n": published.n,
            "selector": published.name, "dtype": t.dtype.name, "layout": t.layout.name,
            "location": t.location.value, "tsize": t.capacity, "shape": list(t.shape),
            "data": [[_hex(v, t.dtype.bits) for v in row] for row in raw.tolist()]}


def _bundle_record(result) -> dict:
    record = {"bundle": result.number,
              "operation": None if result.operation is None else result.operation.mnemonic,
              "outcome": result.outcome}
    if result.outcome == Outcome.FAULT:
        record.update(fault=result.fault.spec_name, fault_index=result.fault_index,
                      reason=result.reason)
    else:
        record["published"] = [_tile_record(p) for p in result.published]
        record["flags"] = StatusFlag.names(result.flags)
    return record


def run_scenario(scenario, engine: str = "model", *, preset: str = "sim-small",
                 vcd=None) -> dict:
    """Run a scenario (a :class:`Scenario` or a path) and return the JSON-able result.

    ``preset`` (the hardware build) applies to ``engine="sim"`` and ``"verilator"``, ``vcd``
    (waveform file) to ``"sim"``.
    Raises :class:`ScenarioError` for a malformed scenario and
    :class:`EngineUnavailable` for an engine that cannot run it.
    """
    if engine not in ENGINES:
        raise EngineUnavailable(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    if engine == "sim":
        from .hw_run import HardwareUnavailable, run_scenario_hw
        from ..hdl.config import preset as lookup
        try:
            return run_scenario_hw(scenario, lookup(preset), vcd=vcd)
        except (HardwareUnavailable, ValueError) as exc:
            raise EngineUnavailable(str(exc)) from None
    if engine == "verilator":
        from .hw_run import HardwareUnavailable
        from .verilator import VerilatorMissing, run_scenario_verilator
        from ..hdl.config import preset as lookup
        try:
            return run_scenario_verilator(
                scenario, lookup(preset),
                log=lambda message: print(f"ptocube run: {message}", file=sys.stderr))
        except (HardwareUnavailable, VerilatorMissing, ValueError) as exc:
            raise EngineUnavailable(str(exc)) from None
    # A snapshot: the scenario's initial state stays reusable.
    machine = Machine(scenario.state.snapshot(), scenario.arithmetic)
    results = machine.run(scenario.program)
    return {"scenario": scenario.name, "engine": engine, "arithmetic": scenario.arithmetic,
            "bundles": [_bundle_record(r) for r in results],
            "status": {"flags": StatusFlag.names(machine.state.flags),
                       "value": _hex(machine.state.flags, 8)}}


def _values(record: dict, limit: int = 16) -> list[str]:
    """A tile's rows as decoded values, at most ``limit`` rows and columns."""
    dtype = DataType[record["dtype"]]
    raw = np.array([[int(v, 16) for v in row[:limit]] for row in record["data"][:limit]],
                   dtype=np.uint64)
    values = decode(dtype, raw)
    lines = []
    for row, full in zip(values.tolist(), record["data"]):
        text = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in row)
        lines.append(f"  [{text}{', ...' if len(full) > limit else ''}]")
    if len(record["data"]) > limit:
        lines.append(f"  ... {len(record['data']) - limit} more rows")
    return lines


def format_table(result: dict) -> str:
    """The human-readable report of a :func:`run_scenario` result."""
    out = [f"scenario {result['scenario']}  (engine {result['engine']}, "
           f"arithmetic {result['arithmetic']})",
           f"{'#':>3}  {'operation':<24} {'outcome':<22} published"]
    for b in result["bundles"]:
        if b["outcome"] == "fault":
            outcome = f"{b['fault']} @{b['fault_index']}"
            published = b["reason"]
        else:
            outcome = b["outcome"]
            if "cycles" in b:
                outcome += f" ({b['cycles']} cyc)"
            names = {}
            for t in b["published"]:
                key = f"{t['selector']} {t['dtype']} {t['layout']} {t['shape'][0]}x{t['shape'][1]}"
                names.setdefault(key, []).append(str(t["pe"]))
            published = "; ".join(f"PE{','.join(pes)} {key}" for key, pes in names.items())
            if b["flags"]:
                published += f"  flags {' '.join(b['flags'])}"
        out.append(f"{b['bundle']:>3}  {b['operation'] or '-':<24} {outcome:<22} {published}")
    for b in result["bundles"]:
        shown = {}
        for t in b.get("published", []):
            # PEs that published the same tile contents are listed once.
            key = (t["selector"], t["dtype"], t["layout"], str(t["data"]))
            if key in shown:
                shown[key][0].append(str(t["pe"]))
                continue
            shown[key] = ([str(t["pe"])], t)
        for pes, t in shown.values():
            out.append(f"bundle {b['bundle']}: PE{','.join(pes)} {t['selector']} "
                       f"({t['dtype']} {t['layout']} {t['shape'][0]}x{t['shape'][1]})")
            out += _values(t)
    flags = result["status"]
    out.append(f"status: {' '.join(flags['flags']) or 'none'} ({flags['value']})")
    return "\n".join(out)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``ptocube run``."""
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario file (JSON)")
    parser.add_argument("--engine", choices=ENGINES, default="model",
                        help="what executes the program (default: the golden model)")
    parser.add_argument("--json", action="store_true",
                        help="print the machine-readable result instead of the table")
    parser.add_argument("--preset", default="sim-small",
                        help="hardware build of --engine sim/verilator (default: sim-small)")
    parser.add_argument("--vcd", metavar="FILE",
                        help="with --engine sim: write a waveform to FILE and a GTKWave save "
                             "file next to it (.gtkw)")


def run_run(args) -> int:
    """Entry point of ``ptocube run``."""
    if args.vcd and args.engine != "sim":
        print("ptocube run: error: --vcd needs --engine sim", file=sys.stderr)
        return 2
    try:
        result = run_scenario(args.scenario, args.engine, preset=args.preset, vcd=args.vcd)
    except (ScenarioError, EngineUnavailable) as exc:
        print(f"ptocube run: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0
