"""Simulation speed of Amaranth's simulator and of Verilator on the same stimulus (``make bench``).

:func:`bench_verilator`: the bundle decoder (:class:`DecoderBench`: the decoder with its GPR
port served from an input) decoding a random parcel stream.  :func:`bench_unit_verilator`: the
whole CUBE unit running the example scenarios through the host port.  Both simulators must
produce the golden model's results, and the same cycle counts, for the figures to count.
Times are CPU times, so the figures hold on a loaded machine.
"""

import random
import resource
import time

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.decoder import BundleDecoder, ParcelBeat
from ptocube.model import isa
from ptocube.model.decode import decode_stream
from ptocube.sim.harness import Drain, Feed, run_streams
from ptocube.sim.verilator import VerilatorMissing, VerilatorModel

__all__ = ["DecoderBench", "parcel_beats", "random_instruction_stream", "bench_verilator",
           "bench_unit_verilator"]


class DecoderBench(wiring.Component):
    """:class:`BundleDecoder` with its combinational GPR read port served from an input.

    ``gprs`` (32 x 16 bits, static during a run) holds the low 16 bits of each GPR, which is
    what B.DIM reads, so one build serves every register file (:meth:`gpr_bits`).
    """

    def __init__(self, config: CubeConfig = CubeConfig(), parcels_per_beat: int = 2):
        self.decoder = BundleDecoder(config, parcels_per_beat=parcels_per_beat)
        super().__init__({"i": In(stream.Signature(ParcelBeat(parcels_per_beat))),
                          "o": Out(stream.Signature(self.decoder.record_layout)),
                          "gprs": In(data.ArrayLayout(16, 32))})

    @staticmethod
    def gpr_bits(gprs) -> int:
        """The ``gprs`` input's bit pattern for a list of up to 32 GPR values."""
        if len(gprs) > 32:
            raise ValueError("the decoder addresses 32 GPRs")
        return sum((int(v) & 0xFFFF) << (16 * k) for k, v in enumerate(gprs))

    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = decoder = self.decoder
        wiring.connect(m, wiring.flipped(self.i), decoder.i)
        wiring.connect(m, decoder.o, wiring.flipped(self.o))
        m.d.comb += decoder.gpr_value.eq(self.gprs[decoder.gpr_index])
        return m


def parcel_beats(streams, per_beat=2):
    """Full input beats for instruction streams (``(word, bits)`` lists), each ending ``last``."""
    beats = []
    for words in streams:
        parcels = isa.words_to_parcels(words)
        chunks = [parcels[i:i + per_beat] for i in range(0, len(parcels), per_beat)] or [[]]
        for n, chunk in enumerate(chunks):
            beats.append({"parcels": chunk + [0] * (per_beat - len(chunk)), "count": len(chunk),
                          "last": int(n == len(chunks) - 1)})
    return beats


def random_instruction_stream(rng, instructions):
    """Random instructions: any first parcel, the rest of the word random (ruling R15)."""
    words = []
    for _ in range(instructions):
        first = rng.getrandbits(16)
        bits = isa.length_of(first)
        words.append((first | (rng.getrandbits(bits - 16) << 16 if bits > 16 else 0), bits))
    return words


def bench_verilator(instructions=3000, seed=1):
    """Cycles per CPU second of pysim and Verilator decoding the same random stream (both
    must give the model's records): end to end (request, model process, answer) and the
    Verilated model's cycle loop alone."""
    rng = random.Random(seed)
    gprs = [0] + [rng.getrandbits(32) for _ in range(23)]
    streams = [random_instruction_stream(rng, 100) for _ in range(instructions // 100)]
    expected = [r for words in streams for r in decode_stream(words, gprs)]
    dut = DecoderBench()
    want = [dut.decoder.record_layout.encode(r) for r in expected]
    layout = ParcelBeat(2)
    # Bit patterns up front: both simulators then spend their time simulating.
    beats = [layout.const(beat).as_value().value for beat in parcel_beats(streams)]
    kwargs = dict(feeds=[Feed(dut.i, beats)], drains=[Drain(dut.o, len(want))],
                  max_cycles=20 * len(beats) + 1000)

    async def load_gprs(ctx):
        ctx.set(dut.gprs.as_value(), DecoderBench.gpr_bits(gprs))

    # CPU time, not wall time: the figures hold on a loaded machine.
    start = time.process_time()
    pysim = run_streams(dut, testbenches=[load_gprs], **kwargs)
    pysim_s = time.process_time() - start
    rows = [{"simulator": "Amaranth pysim", "cycles": pysim.cycles, "cpu s": pysim_s,
             "cycles/s": pysim.cycles / pysim_s, "build": "-",
             "matches model": pysim.outputs[0] == want}]
    try:
        model = VerilatorModel.build(dut, name="decoder_bench")
    except VerilatorMissing as exc:
        rows.append({"simulator": "Verilator", "matches model": f"not run: {exc}"})
        return rows
    children = _children_cpu()
    start = time.process_time()
    with model.session() as session:
        verilated = session.run(static={"gprs": DecoderBench.gpr_bits(gprs)}, **kwargs)
    seconds = time.process_time() - start + _children_cpu() - children
    rows.append({"simulator": "Verilator (end to end)", "cycles": verilated.cycles,
                 "cpu s": seconds, "cycles/s": verilated.cycles / seconds,
                 "build": f"{model.build_seconds:.1f} s{' (cached)' if model.cached else ''}",
                 "matches model": verilated.outputs[0] == want})
    rows.append({"simulator": "Verilator (model loop only)", "cycles": verilated.cycles,
                 "cpu s": session.model_seconds,
                 "cycles/s": verilated.cycles / session.model_seconds})
    rows.append({"simulator": "ratio end to end / pysim",
                 "cycles/s": rows[1]["cycles/s"] / rows[0]["cycles/s"]})
    rows.append({"simulator": "ratio model loop / pysim",
                 "cycles/s": rows[2]["cycles/s"] / rows[0]["cycles/s"]})
    return rows


def _children_cpu() -> float:
    """CPU seconds of the finished child processes (the Verilated model's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_unit_verilator(config="ecp5-full"):
    """Cycles per CPU second of pysim and Verilator running every example scenario on the
    CUBE unit (host loading, program, read-back): one unit per simulator, same stimulus."""
    import pathlib

    from ptocube.hdl.config import preset
    from ptocube.model.scenario import load_scenario
    from ptocube.sim.host import clear_state
    from ptocube.sim.hw_run import SimUnit, architectural, run_one
    from ptocube.sim.run import run_scenario
    from ptocube.sim.verilator import VerilatorUnit

    config = preset(config) if isinstance(config, str) else config
    examples = sorted((pathlib.Path(__file__).resolve().parent.parent / "examples")
                      .glob("*.json"))
    scenarios = [load_scenario(path) for path in examples]
    expected = [architectural(run_scenario(s)) for s in scenarios]

    def run(unit):
        results = []

        async def main(ctx):
            await unit.setup(ctx)
            for k, scenario in enumerate(scenarios):
                if k:
                    await unit.drive(ctx, clear_state(scenarios[k - 1].state))
                results.append(await run_one(ctx, unit, scenario, skip_zero=k == 0))

        unit.run(main)
        return results

    rows = []
    try:
        start = time.perf_counter()
        verilated_unit = VerilatorUnit(config)
        build = time.perf_counter() - start
    except VerilatorMissing as exc:
        return [{"simulator": "Verilator", "matches model": f"not run: {exc}"}]
    children = _children_cpu()
    start = time.process_time()
    try:
        verilated = run(verilated_unit)
    finally:
        verilated_unit.close()
    verilator_s = time.process_time() - start + _children_cpu() - children
    sim_unit = SimUnit(config)            # elaboration is not simulation: not timed
    start = time.process_time()
    pysim = run(sim_unit)
    pysim_s = time.process_time() - start
    same = [dict(v, engine="sim") == p for v, p in zip(verilated, pysim)]
    for name, results, cycles, seconds, extra in (
            ("Amaranth pysim", pysim, sim_unit.cycle, pysim_s, "-"),
            ("Verilator (end to end)", verilated, verilated_unit.cycle, verilator_s,
             f"{build:.1f} s{' (cached)' if verilated_unit.model.cached else ''}")):
        rows.append({"simulator": name, "scenarios": len(scenarios), "cycles": cycles,
                     "cpu s": seconds, "cycles/s": cycles / seconds, "build": extra,
                     "matches model": all(isinstance(r, dict) and architectural(r) == e
                                          for r, e in zip(results, expected)),
                     "same as pysim": all(same)})
    rows.append({"simulator": "ratio Verilator / pysim",
                 "cycles/s": rows[1]["cycles/s"] / rows[0]["cycles/s"]})
    return rows
