"""Run a scenario on the simulated :class:`~ptocube.hdl.top.CubeUnit` (``--engine sim``).

:func:`run_scenario_hw` builds the unit for a config (default ``sim-small``), loads the
scenario's state through the host port (:func:`ptocube.sim.host.load_state`), streams the
program's parcels, collects one ``status`` item per bundle and, once the program has drained,
reads every published register and the sticky flags back through the host port (decision T6:
results are read at the end - bundles never release registers, so what a bundle published is
still there).  The result has the format of ``ptocube run --json`` (:mod:`ptocube.sim.run`)
with ``engine: "sim"`` and ``cycles`` per bundle.  Faults carry no ``reason`` text from the
hardware (only the class and index are architectural).

``vcd=PATH`` also writes a waveform and a GTKWave save file ``PATH`` with ``.gtkw`` (signals
grouped: host port, parcels/status, decoder, preflight, engines, tile store).
"""

import pathlib

from amaranth.hdl import Value
from amaranth.sim import Simulator

from ..hdl.config import CubeConfig, preset
from ..hdl.host import StatusOutcome, decode_response, decode_status, encode_command
from ..hdl.top import CubeUnit
from ..model import isa
from ..model.asm import assemble
from ..model.bundle import Operation
from ..model.scenario import Scenario, load_scenario
from ..model.state import StatusFlag, pes_of_mask
from .host import (DoesNotFit, clear_state, load_state, read_status, read_tile, run_async,
                   stream_request)

__all__ = ["HardwareUnavailable", "run_scenario_hw", "run_scenarios_hw", "run_one",
           "program_beats", "SimUnit", "architectural"]

#: Cycles ``busy`` must stay low after the last parcel beat before the program counts as
#: finished: twice the decoder's progress bound (8 cycles, docs/hdl-decoder.md).
DRAIN_CYCLES = 16


class HardwareUnavailable(ValueError):
    """The scenario cannot run on this build (arithmetic, or it does not fit the memory)."""


def program_beats(program, per_beat: int = 2) -> list[dict]:
    """The ``parcels`` stream of a program (assembly text or words): full beats, then a
    ``last`` beat."""
    words = assemble(program) if isinstance(program, str) else list(program)
    parcels = isa.words_to_parcels(words)
    beats = []
    for i in range(0, len(parcels), per_beat):
        chunk = parcels[i:i + per_beat]
        beats.append({"parcels": chunk + [0] * (per_beat - len(chunk)), "count": len(chunk),
                      "last": 0})
    beats.append({"parcels": [0] * per_beat, "count": 0, "last": 1})
    return beats


class SimUnit:
    """A simulated CubeUnit with async helpers for testbenches (host transactions, beats)."""

    def __init__(self, config: CubeConfig, *, cube: bool | None = None):
        self.config = config
        self.unit = CubeUnit(config, cube=cube)
        self.sim = Simulator(self.unit)
        self.sim.add_clock(1e-8)
        self.cycle = 0
        self.statuses = []

        async def count(ctx):
            u = self.unit
            async for _, _, valid, payload in ctx.tick().sample(u.status.valid,
                                                                 Value.cast(u.status.payload)):
                self.cycle += 1
                if valid:
                    self.statuses.append(decode_status(payload))

        self.sim.add_testbench(count, background=True)

    async def setup(self, ctx):
        """Hold the response and status streams ready (call first in the main testbench)."""
        ctx.set(self.unit.host_rsp.ready, 1)
        ctx.set(self.unit.status.ready, 1)

    async def transact(self, ctx, cmd):
        """Send one host command and return its decoded response."""
        u = self.unit
        return decode_response(await stream_request(ctx, u.host_cmd, encode_command(cmd),
                                                    u.host_rsp))

    async def drive(self, ctx, gen):
        """Run a :mod:`ptocube.sim.host` driver generator; returns its result."""
        return await run_async(gen, lambda cmd: self.transact(ctx, cmd))

    async def send_beats(self, ctx, beats):
        """Stream parcel beats (no stalls)."""
        u = self.unit
        layout = u.parcels.payload.shape()
        for beat in beats:
            ctx.set(u.parcels.valid, 1)
            ctx.set(Value.cast(u.parcels.payload), layout.const(beat).as_bits())
            while True:
                _, _, ready = await ctx.tick().sample(u.parcels.ready)
                if ready:
                    break
        ctx.set(u.parcels.valid, 0)

    async def drain(self, ctx):
        """Wait until every bundle of the program has its status: ``busy`` low for
        DRAIN_CYCLES cycles in a row (the decoder's progress bound is 8 cycles)."""
        quiet = 0
        while quiet < DRAIN_CYCLES:
            _, _, busy = await ctx.tick().sample(self.unit.busy)
            quiet = 0 if busy else quiet + 1

    def run(self, testbench, vcd=None):
        """Run ``testbench(ctx)`` to completion (optionally writing a VCD and .gtkw)."""
        self.sim.add_testbench(testbench)
        if vcd:
            gtkw = pathlib.Path(vcd).with_suffix(".gtkw")
            with self.sim.write_vcd(str(vcd), gtkw_file=str(gtkw),
                                    traces=_trace_groups(self.unit)):
                self.sim.run()
        else:
            self.sim.run()


def _trace_groups(unit: CubeUnit):
    """Signals worth looking at, by group (the GTKWave save file shows one group each)."""
    def stream(port):
        return [port.valid, port.ready, Value.cast(port.payload)]
    dec, pf, st = unit.decoder, unit.preflight, unit.store
    eng = unit.img2col
    engines = [unit.img2col_pe, eng.busy, eng.done, eng.commit, eng.fault] + stream(eng.dst)
    if unit.cube is not None:
        engines += [unit.cube.start, unit.cube.busy, unit.cube.done, unit.cube.commit]
    return {
        "host port": stream(unit.host_cmd) + stream(unit.host_rsp),
        "parcels / status": stream(unit.parcels) + stream(unit.status),
        "decoder": stream(dec.o),
        "preflight": [pf.phase, pf.busy, pf.commit_enable, pf.exec_done] + stream(pf.verdict),
        "engines": [unit.phase] + engines,
        "tile store": [st.idle, st.req, st.req_valid, st.req_done, st.req_ok,
                       st.status_flags, st.tile_capacity],
    }


def _prepare(scenario) -> Scenario:
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    if scenario.arithmetic != "ieee":
        raise HardwareUnavailable(f"the hardware implements the ieee arithmetic only; "
                                  f"scenario {scenario.name!r} asks for {scenario.arithmetic!r}")
    return scenario


def run_scenarios_hw(scenarios, config: CubeConfig | str = "sim-small", *, vcd=None,
                     cube: bool | None = None, progress=None) -> list:
    """Run several scenarios one after the other on one simulated unit (one elaboration).

    Between scenarios every register is freed and the next state is loaded in full (zero
    payload words too).  Returns one item per scenario: its result dict (as
    :func:`run_scenario_hw`), or the :class:`HardwareUnavailable` it raised.
    ``progress(done, total)`` is called after each scenario.
    """
    scenarios = [_prepare(s) for s in scenarios]
    if isinstance(config, str):
        config = preset(config)
    su = SimUnit(config, cube=cube)
    results = []

    async def main(ctx):
        await su.setup(ctx)
        for k, scenario in enumerate(scenarios):
            if k:
                await su.drive(ctx, clear_state(scenarios[k - 1].state))
            results.append(await run_one(ctx, su, scenario, skip_zero=k == 0))
            if progress is not None:
                progress(k + 1, len(scenarios))

    su.run(main, vcd=vcd)
    return results


async def run_one(ctx, su, scenario, *, skip_zero):
    """Testbench step: load ``scenario`` into ``su`` (a :class:`SimUnit`), run its program
    and read its results; returns the result dict or a :class:`HardwareUnavailable`."""
    config = su.config
    try:
        await su.drive(ctx, load_state(scenario.state, config, skip_zero=skip_zero))
    except DoesNotFit as exc:
        return HardwareUnavailable(
            f"scenario {scenario.name!r} does not fit the tile memory of this build "
            f"({config.tile_bytes_per_pe} B per PE, {config.shared_bytes} B Shared): {exc}")
    first, start = len(su.statuses), su.cycle
    await su.send_beats(ctx, program_beats(scenario.program))
    await su.drain(ctx)
    statuses = su.statuses[first:]
    bundles = []
    for number, status in enumerate(statuses):
        op = None if status.op is None else Operation(status.op).mnemonic
        record = {"bundle": number, "operation": op, "outcome": status.outcome.name.lower()}
        if status.outcome is StatusOutcome.FAULT:
            record.update(fault=status.fault.spec_name, fault_index=status.fault_index,
                          reason="")
        else:
            published = []
            if status.outcome is StatusOutcome.SUCCESS:
                for pe in pes_of_mask(status.pe_mask):
                    for index in status.outputs:
                        published.append(await su.drive(ctx, read_tile(pe, index)))
            record["published"] = published
            record["flags"] = StatusFlag.names(status.flags)
        record["cycles"] = status.cycles
        bundles.append(record)
    cycles = su.cycle - start
    flags = await su.drive(ctx, read_status())
    return {"scenario": scenario.name, "engine": "sim", "arithmetic": scenario.arithmetic,
            "bundles": bundles,
            "status": {"flags": StatusFlag.names(flags), "value": f"0x{flags:02x}"},
            "cycles": cycles}


def run_scenario_hw(scenario, config: CubeConfig | str = "sim-small", *, vcd=None,
                    cube: bool | None = None) -> dict:
    """Run a scenario on the simulated unit; the :func:`ptocube.sim.run.run_scenario` result
    format with ``engine: "sim"``, ``cycles`` per bundle (record out of the decoder to status)
    and ``cycles`` for the whole program (first parcel to the last status).

    Raises :class:`HardwareUnavailable` when the scenario needs the ``pto-v0`` arithmetic or
    does not fit the build's tile memory.  ``cube`` is :class:`CubeUnit`'s (build the CUBE
    engine; default: when it exists).
    """
    result = run_scenarios_hw([scenario], config, vcd=vcd, cube=cube)[0]
    if isinstance(result, HardwareUnavailable):
        raise result
    return result


#: Result keys that are informative only (not compared): the fault text and timing.
INFORMATIVE = ("reason", "cycles")


def architectural(result: dict) -> dict:
    """A run result without its informative parts, for a word-for-word comparison; a decode
    fault's ``operation`` is dropped too (the hardware's fault record names none)."""
    bundles = []
    for b in result["bundles"]:
        b = {k: v for k, v in b.items() if k not in INFORMATIVE}
        if b["outcome"] == "fault":
            b.pop("operation", None)
        bundles.append(b)
    return {"bundles": bundles, "status": result["status"]}
