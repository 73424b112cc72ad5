"""Cross-simulation on Verilator (``ptocube.sim.verilator``) against pysim and the golden model.

The pure-Python parts (tool check and its error, port discovery, Verilator's name mangling,
the request/answer encoding) always run.  The Verilator runs need ``verilator``, ``g++`` and
``make``: the default suite runs short ones (each build takes seconds) when the tools are
present; ``make regress`` (``-m slow``) requires them (installing them as root).
"""

import pathlib
import random
import re
import shutil
import subprocess

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ptocube.hdl.config import PRESETS
from ptocube.model.asm import assemble
from ptocube.model.bundle import Fpatr, pe_mask_of_pemode
from ptocube.model.decode import decode_stream
from ptocube.model.isa import DATATYPE_NAMES, GPR_NAMES, HANDS
from ptocube.model.scenario import Scenario
from ptocube.model.state import selector_name
from ptocube.sim.hw_run import architectural, run_scenarios_hw
from ptocube.sim.run import run_scenario
from ptocube.sim.bench_verilator import DecoderBench, parcel_beats, random_instruction_stream
from ptocube.sim.harness import Drain, Feed, run_streams
from ptocube.sim.verilator import (REQUIRED_TOOLS, VerilatorMissing, VerilatorModel,
                                   component_ports, decode_response, encode_request,
                                   ensure_verilator, run_scenarios_verilator,
                                   run_streams_verilator, source_fingerprint, stall_counts,
                                   verilator_name)

from cube_cases import random_case
from decoder_streams import beats_of, random_gprs, random_streams
from img2col_scenarios import random_img2col
from model_helpers import matrix_bundle

HAVE_VERILATOR = all(shutil.which(tool) for tool in REQUIRED_TOOLS)
needs_verilator = pytest.mark.skipif(
    not HAVE_VERILATOR, reason="verilator, g++ and make are not installed (apt-get install -y "
                               "verilator g++ make); make regress installs them")


# ---------------------------------------------------------------------------
# A small component with the awkward cases: nested names, wide payloads, a static input
# ---------------------------------------------------------------------------

SUM = data.StructLayout({"sum": 101, "n": 16})


class WideAdder(wiring.Component):
    """``ch.b`` = ``ch.a`` + ``offset`` with a running count, through one register stage;
    ``mon`` (always ready) reports the low byte of each accepted input."""

    def __init__(self):
        super().__init__({
            "ch": Out(wiring.Signature({"a": In(stream.Signature(100)),
                                        "b": Out(stream.Signature(SUM))})),
            "mon": Out(stream.Signature(8, always_ready=True)),
            "offset": In(100, init=5),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        a, b = self.ch.a, self.ch.b
        m.d.comb += a.ready.eq(~b.valid | b.ready)
        with m.If(b.valid & b.ready):
            m.d.sync += b.valid.eq(0)
        with m.If(a.valid & a.ready):
            m.d.sync += [b.valid.eq(1), b.p.sum.eq(a.payload + self.offset),
                         b.p.n.eq(b.p.n + 1)]
        m.d.sync += [self.mon.valid.eq(a.valid & a.ready), self.mon.payload.eq(a.payload[:8])]
        m.d.comb += self.idle.eq(~b.valid)
        return m


def test_component_ports_and_verilator_names():
    dut = WideAdder()
    ports = component_ports(dut)
    streams, statics = ports.streams, ports.statics
    assert [(p.name, p.direction, p.width) for p in streams] == [
        ("ch__a", "in", 100), ("ch__b", "out", 117), ("mon", "out", 8)]
    assert [p.words for p in streams] == [4, 4, 1]
    assert not streams[2].has_ready and streams[2].has_valid
    assert [(p.name, p.width, p.init) for p in statics] == [("offset", 100, 5)]
    assert [(p.name, p.direction, p.width) for p in ports.probes] == [("idle", "out", 1)]
    # The constant `mon.ready` is no port; everything else is, under Amaranth's names.
    assert sorted(ports.verilog) == sorted(["ch__a__payload", "ch__a__valid", "ch__a__ready",
                                    "ch__b__payload", "ch__b__valid", "ch__b__ready",
                                    "mon__payload", "mon__valid", "offset", "idle"])
    assert ports.stream(dut.ch.b) is streams[1] and ports.stream("mon") is streams[2]
    text = verilog.convert(dut, name="wide_adder", ports=ports.verilog, emit_src=False)
    declared = set(re.findall(r"^\s*(?:input|output)\s+(?:\[\d+:0\]\s+)?(\w+);", text, re.M))
    assert declared == set(ports.verilog) | {"clk", "rst"}
    assert verilator_name("ch__a__payload") == "ch___05Fa___05Fpayload"
    assert verilator_name("x___y") == "x___05F_y"
    assert verilator_name("arr__0") == "arr___05F0"
    assert verilator_name("a$b") == "a__024b"


def test_request_encoding_and_answer_decoding():
    wide = (1 << 341) | 0xDEADBEEF
    text = encode_request(feeds=[(0, [wide, 0, 5], [0, 2, 1])], drains=[(1, [0, 3])],
                          statics=[(0, 1 << 99)], max_cycles=77, settle=4, reset=2)
    assert text.splitlines() == [
        f"static 0 {1 << 99:x}", "reset 2", "feed 0 3", f"0 {wide:x}", "2 0", "1 5",
        "drain 1 2", "0", "3", "go 77 4 0"]
    assert encode_request(monitors=[(2, True)], min_cycles=9).splitlines() == [
        "monitor 2 1", "go 100000 8 9"]
    answer = decode_response([
        "done 12 16 3500\n", "fed 0 3\n", "drain 1 2\n", f"5 {wide:x}\n", "12 0\n",
        "extra 1 1\n", "14 ff\n", "monitor 0 1\n", "3 a\n", "end\n"])
    assert (answer.timeout, answer.cycles, answer.total) == (False, 12, 16)
    assert answer.seconds == pytest.approx(3.5e-6)
    assert answer.fed == {0: 3}
    assert answer.transfers == {1: [(5, wide), (12, 0)]} and answer.extra == {1: [(14, 0xFF)]}
    assert answer.monitored == {0: [(3, 0xA)]}
    with pytest.raises(ValueError, match="one idle count per payload"):
        encode_request(feeds=[(0, [1, 2], [0])])


def test_stall_counts_follow_the_probability():
    assert stall_counts(random.Random(1), 0.0, 50) == [0] * 50
    counts = stall_counts(random.Random(1), 0.5, 4000)
    assert 0.9 < sum(counts) / len(counts) < 1.1        # geometric: mean p / (1 - p) = 1


def _fake_machine(present):
    """A ``which`` that finds the tools in ``present`` (a set the fake apt-get fills)."""
    def which(tool):
        return f"/usr/bin/{tool}" if tool in present else None
    return which


def test_missing_tools_error_says_what_to_install():
    which = _fake_machine({"g++", "apt-get"})
    with pytest.raises(VerilatorMissing) as error:
        ensure_verilator(which=which, is_root=False)
    message = str(error.value)
    assert "verilator, make" in message
    assert "sudo apt-get install -y verilator make" in message


def test_missing_tools_are_installed_as_root():
    present = {"g++", "apt-get"}
    commands = []

    def runner(command, **kwargs):
        commands.append(command)
        if command[:2] == ["apt-get", "install"]:
            present.update(command[4:])
        out = "Verilator 5.006" if command[0] == "verilator" else ""
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    version = ensure_verilator(which=_fake_machine(present), is_root=True, runner=runner)
    assert version == "Verilator 5.006"
    assert commands == [["apt-get", "update", "-q"],
                        ["apt-get", "install", "-y", "-q", "verilator", "make"],
                        ["verilator", "--version"]]


def test_failed_install_is_reported():
    def runner(command, **kwargs):
        return subprocess.CompletedProcess(command, 100, stdout="", stderr="E: no network")

    with pytest.raises(VerilatorMissing, match="no network"):
        ensure_verilator(which=_fake_machine({"apt-get"}), is_root=True, runner=runner)


# ---------------------------------------------------------------------------
# Verilator runs
# ---------------------------------------------------------------------------

def _adder_expectation(values, offset):
    return [SUM.const({"sum": v + offset, "n": (k + 1) & 0xFFFF}).as_value().value
            for k, v in enumerate(values)]


@needs_verilator
def test_wide_streams_match_pysim_cycle_for_cycle():
    rng = random.Random(3)
    values = [rng.getrandbits(100) for _ in range(300)]
    offset = rng.getrandbits(100)
    dut = WideAdder()
    want = _adder_expectation(values, offset)

    async def set_offset(ctx):
        ctx.set(dut.offset, offset)

    # Without a value set, the static input starts at its init (5) in both simulators.
    kwargs = dict(feeds=[Feed(dut.ch.a, values[:20])], drains=[Drain(dut.ch.b, 20)])
    assert (run_streams_verilator(dut, **kwargs).outputs == run_streams(dut, **kwargs).outputs
            == [_adder_expectation(values[:20], 5)])
    for stall in (0.0, (0.3, 0.5)):
        kwargs = dict(feeds=[Feed(dut.ch.a, values)], drains=[Drain(dut.ch.b, len(values))],
                      stall=stall, seed=4)
        verilated = run_streams_verilator(dut, static={"offset": offset}, **kwargs)
        assert verilated.outputs == [want] and verilated.extra == [[]]
        pysim = run_streams(dut, testbenches=[set_offset], **kwargs)
        assert pysim.outputs == [want]
        if not stall:
            # Without stalls both simulators see the same stimulus cycle by cycle.
            assert verilated.cycles == pysim.cycles == len(values) + 1
            assert verilated.transfer_cycles == pysim.transfer_cycles


@needs_verilator
def test_session_phases_static_inputs_reset_and_timeouts():
    dut = WideAdder()
    model = VerilatorModel.build(dut)
    assert model.build_seconds < 60
    again = VerilatorModel.build(dut)
    assert again.cached and again.executable == model.executable
    values = list(range(1, 41))
    with model.session() as session:
        # State persists across runs: the count continues; static inputs keep their value.
        first = session.run(feeds=[Feed("ch__a", values[:25])], drains=[Drain("ch__b", 25)],
                            static={"offset": 1000}, stall=0.3, seed=1)
        second = session.run(feeds=[Feed(dut.ch.a, values[25:])], drains=[Drain(dut.ch.b, 15)])
        assert first.outputs[0] + second.outputs[0] == _adder_expectation(values, 1000)
        # The always-ready monitor stream: one item per accepted input, never stalled.
        mon = session.run(feeds=[Feed(dut.ch.a, [0x1AB, 0x2CD])],
                          drains=[Drain(dut.mon, 2), Drain(dut.ch.b, 2)], stall=0.5, seed=2)
        assert mon.outputs[0] == [0xAB, 0xCD]
        assert session.cycles >= 40 + 2
        # A monitored stream is ready in every cycle and logged with session-wide cycles.
        session.monitor(dut.mon)
        start = session.cycles
        session.run(feeds=[Feed(dut.ch.a, [0x311, 0x322])], drains=[Drain(dut.ch.b, 2)],
                    settle=0)
        session.run(feeds=[Feed(dut.ch.a, [0x344])])     # ends with the input transfer
        session.run(min_cycles=5)                         # mon reports it a cycle later
        assert session.cycles == start + 3 + 1 + 5
        assert [(c - start, p) for c, p in session.monitored["mon"]] == [
            (2, 0x11), (3, 0x22), (5, 0x44)]
        assert session.run(drains=[Drain(dut.ch.b, 1)]).outputs[0] == [
            SUM.const({"sum": 0x344 + 1000, "n": 45}).as_value().value]
        # Nothing drains ch.b: the adder stalls with its register full.
        with pytest.raises(TimeoutError, match="feed 0 consumed 1"):
            session.run(feeds=[Feed(dut.ch.a, [1, 2, 3])], max_cycles=50)
        # A reset empties the register and restarts the count.
        after = session.run(feeds=[Feed(dut.ch.a, [7])], drains=[Drain(dut.ch.b, 1)], reset=1)
        assert after.outputs[0] == _adder_expectation([7], 1000)
        assert session.probes == {"idle": 1}
        # A run that waits for a plain output to stay low: `idle` is low while ch.b is full.
        session.run(feeds=[Feed(dut.ch.a, [9])], settle=0)
        before = session.cycles
        session.run(quiet={"idle": 3})
        assert session.cycles == before + 3 and session.probes == {"idle": 0}
        with pytest.raises(TimeoutError, match="waiting"):
            session.run(quiet={"idle": 1}, max_cycles=0)
        with pytest.raises(ValueError, match="does not fit"):
            session.run(feeds=[Feed(dut.ch.a, [1 << 100])])
        with pytest.raises(KeyError, match="no static input"):
            session.run(static={"idle": 1})
        with pytest.raises(KeyError, match="no probe"):
            session.run(quiet={"offset": 1})


def _decoder_streams(seed, bundles):
    rng = random.Random(seed)
    return random_streams(rng, bundles), random_gprs(rng)


def _cross_check(seed, bundles, stall, per_beat_rng=True):
    """One random parcel stream through pysim and Verilator: both equal the model."""
    streams, gprs = _decoder_streams(seed, bundles)
    expected = [r for words in streams for r in decode_stream(words, gprs)]
    dut = DecoderBench()
    want = [dut.decoder.record_layout.encode(r) for r in expected]
    beats = beats_of(streams, 2, random.Random(seed) if per_beat_rng else None)
    kwargs = dict(feeds=[Feed(dut.i, beats)], drains=[Drain(dut.o, len(want))], stall=stall,
                  seed=seed, max_cycles=50 * len(beats) + 1000)
    verilated = run_streams_verilator(dut, static={"gprs": DecoderBench.gpr_bits(gprs)},
                                      **kwargs)

    async def load_gprs(ctx):
        ctx.set(dut.gprs.as_value(), DecoderBench.gpr_bits(gprs))

    pysim = run_streams(dut, testbenches=[load_gprs], **kwargs)
    assert verilated.outputs == pysim.outputs == [want]
    assert verilated.extra == pysim.extra == [[]]
    return verilated, pysim


@needs_verilator
def test_decoder_records_equal_pysim_and_model():
    verilated, pysim = _cross_check(seed=21, bundles=120, stall=0.0)
    assert verilated.cycles == pysim.cycles
    assert verilated.transfer_cycles == pysim.transfer_cycles
    _cross_check(seed=22, bundles=120, stall=(0.3, 0.5))


@needs_verilator
def test_decoder_on_random_instruction_words():
    # Arbitrary words (any first parcel): mostly illegal-instruction records.
    rng = random.Random(5)
    gprs = random_gprs(rng)
    streams = [random_instruction_stream(rng, 50) for _ in range(8)]
    expected = [r for words in streams for r in decode_stream(words, gprs)]
    dut = DecoderBench()
    result = run_streams_verilator(dut, feeds=[Feed(dut.i, parcel_beats(streams))],
                                   drains=[Drain(dut.o, len(expected))],
                                   static={"gprs": DecoderBench.gpr_bits(gprs)})
    assert result.outputs[0] == [dut.decoder.record_layout.encode(r) for r in expected]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(30, 34))
def test_decoder_cross_simulation_regression(seed):
    ensure_verilator()
    _cross_check(seed=seed, bundles=1500, stall=(0.0, 0.2, 0.5, (0.1, 0.6))[seed % 4])


def test_source_fingerprint_follows_the_source(tmp_path, monkeypatch):
    package = tmp_path / "fp_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = source_fingerprint("fp_pkg", extra="config-1")
    assert source_fingerprint("fp_pkg", extra="config-1") == first
    assert source_fingerprint("fp_pkg", extra="config-2") != first
    (package / "a.py").write_text("X = 2\n")
    assert source_fingerprint("fp_pkg", extra="config-1") != first


# ---------------------------------------------------------------------------
# The CUBE unit on Verilator (make regress): scenarios against the model and pysim
# ---------------------------------------------------------------------------

#: The Verilated build: the ECP5 boards' unit, all type classes on a 2 x 2 array, 16 KiB
#: per PE (the smaller memories keep the Verilog export and the C++ build to minutes).
UNIT_CONFIG = PRESETS["ecp5-full"]


def matrix_program(bundle) -> str:
    """Assembly of a model :class:`~ptocube.model.bundle.Bundle` (Matrix), ending BSTOP."""
    fp = bundle.fpatr or Fpatr()
    fpatr = ["None" if not fp.pre_quant_mode else fp.pre_quant_mode, fp.relu_mode,
             fp.group_n_code] + [int(v) for v in (fp.row_max_en, fp.group_max_en,
                                                  fp.row_max_init, fp.max_abs_en,
                                                  fp.trans_a, fp.trans_b)]
    d = bundle.datr
    datr = None if d is None else (f"{d.layout}, {DATATYPE_NAMES[d.dtype]}, {d.pad}, "
                                   f"{d.cmode}, {d.rmode}, {d.sat}, {d.canonicalize}")
    ior = None
    if bundle.ior is not None:
        *sources, dst = bundle.ior
        while sources and not sources[-1]:
            sources.pop()
        ior = ", ".join([GPR_NAMES[r] for r in sources] + ([f"->{GPR_NAMES[dst]}"] if dst
                                                          else []))
    return matrix_bundle(
        bundle.op, DATATYPE_NAMES[bundle.a_type], fpatr=fpatr if bundle.fpatr else None,
        datr=None if datr is None else "{" + datr + "}", dims=bundle.dims,
        sources=[selector_name(i) for i in bundle.local_sources],
        destinations=[(HANDS[d.hand], d.size_code) for d in bundle.destinations],
        shared=bundle.shared_sources, mask=f"{bundle.pe_mask:04b}", ior=ior)


#: PE masks a B.IOT PEMode can encode.
ENCODABLE_MASKS = {pe_mask_of_pemode(mode) for mode in range(8)}


def encodable_case(nprng):
    """:func:`cube_cases.random_case` with a PE mask that a program can express."""
    while True:
        state, plan = random_case(nprng, UNIT_CONFIG)
        if plan.bundle.pe_mask in ENCODABLE_MASKS:
            return state, plan


def random_scenarios(seed, count):
    """``count`` random scenarios: legal Matrix bundles of every function and type pair
    (``tests/cube_cases.py``), some with a wrong PE mask or a missing operand (faults), and
    TIMG2COL windows (``tests/img2col_scenarios.py``, some illegal)."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    scenarios = []
    for k in range(count):
        if rng.random() < 0.3:
            scenarios.append(random_img2col(rng, k))
            continue
        state, plan = encodable_case(nprng)
        program = matrix_program(plan.bundle)
        sources = plan.bundle.local_sources
        if sources and rng.random() < 0.1:      # a source register nobody holds: a fault
            first = selector_name(sources[0])
            program = program.replace(f"B.IOT {first}", "B.IOT T#16", 1)
        scenarios.append(Scenario(f"random-matrix-{k}", "", state, program))
    return scenarios


def test_matrix_program_round_trips_through_the_decoder():
    # The generator's programs decode to the bundles the cases were built from.
    nprng = np.random.default_rng(1)
    for _ in range(40):
        state, plan = encodable_case(nprng)
        (record,) = decode_stream(assemble(matrix_program(plan.bundle)), state.gprs)
        got, want = record.bundle, plan.bundle
        assert record.ok and (got.op, got.a_type, got.b_type, got.dims, got.local_sources,
                              got.destinations, got.shared_sources, got.pe_mask, got.ior) == \
            (want.op, want.a_type, want.b_type, want.dims, want.local_sources,
             want.destinations, want.shared_sources, want.pe_mask, want.ior)


@pytest.mark.slow
def test_unit_examples_cycle_for_cycle_with_pysim():
    # The same host-port stimulus on both simulators: identical results, cycles included.
    ensure_verilator()
    examples = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.json"))
    verilated = run_scenarios_verilator(examples, UNIT_CONFIG)
    pysim = run_scenarios_hw(examples, UNIT_CONFIG)
    for path, v, p in zip(examples, verilated, pysim):
        assert not isinstance(v, Exception), v
        assert v["engine"] == "verilator"
        assert dict(v, engine="sim") == p, path.name
        assert architectural(v) == architectural(run_scenario(path)), path.name


@pytest.mark.slow
def test_unit_random_scenarios_match_the_model():
    ensure_verilator()
    scenarios = random_scenarios(seed=2026, count=240)
    results = run_scenarios_verilator(scenarios, UNIT_CONFIG)
    outcomes = {}
    ran = 0
    for scenario, result in zip(scenarios, results):
        if isinstance(result, Exception):
            continue                    # does not fit the build's memory: reported, not run
        ran += 1
        assert architectural(result) == architectural(run_scenario(scenario)), scenario.name
        for b in result["bundles"]:
            key = b.get("fault", b["outcome"])
            outcomes[key] = outcomes.get(key, 0) + 1
    assert ran >= 200
    assert outcomes.get("success", 0) >= 100 and "Fault_TileLegality" in outcomes
