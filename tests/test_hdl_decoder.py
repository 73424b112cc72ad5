"""The hardware bundle decoder against the golden model's decoder, record for record.

Every stimulus is decoded twice: by :func:`ptocube.model.decode.decode_stream` and by the
simulated :class:`ptocube.hdl.decoder.BundleDecoder`; the hardware's output records must equal
the model's bit for bit (:meth:`RecordLayout.encode`).  Many independent streams share one
simulation: each stream ends with a ``last`` beat, which returns the decoder to its idle state
and restarts the instruction index, exactly as a fresh ``decode_stream`` call.
"""

import json
import pathlib
import random

import pytest
from amaranth.hdl import Array, Const, Elaboratable, Module
from amaranth.lib import data
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.decoder import BundleDecoder, InstructionMatcher, ParcelAligner, ParcelBeat
from ptocube.hdl.skid_buffer import SkidBuffer
from ptocube.hdl.descriptor import BoundExceeded, RecordLayout
from ptocube.model import isa
from ptocube.model.asm import assemble
from ptocube.model.bundle import BundleRecord, Operation
from ptocube.model.decode import BundleDecoder as ModelDecoder
from ptocube.model.decode import decode_stream
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.machine import Machine, Outcome
from ptocube.sim.bench_decoder import BSTOP, C_BSTOP, FORMS_BY_ROLE as _BY_ROLE, L_BSTOP
from ptocube.sim.bench_decoder import legal_stream, random_word, well_formed_bundle
from ptocube.sim.harness import Drain, Feed, run_streams

from decoder_streams import beats_of, random_bundle, random_gprs, random_raw_word, random_streams
from model_helpers import make_state, matrix_bundle, value_tile

VECTORS = json.loads((pathlib.Path(__file__).parent / "data" / "encoding_vectors.json").read_text())

# Instruction words used to build contexts (and BSTOP, C_BSTOP, L_BSTOP from the benchmark).
BSTART_TMATMUL_FP16 = (0x20031181, 32)
FPATR_NONE = (0x00002023, 32)
TIMG2COL_FP16 = (0x26419181, 32)


# ---------------------------------------------------------------------------
# The bench: decoder + a constant GPR file, and the comparison with the model
# ---------------------------------------------------------------------------

class DecoderBench(Elaboratable):
    """The decoder with a read-only GPR file holding ``gprs`` (low 16 bits) on its read port."""

    def __init__(self, gprs=None, **kwargs):
        self.gprs = list(gprs or [0] * 24)
        self.dut = BundleDecoder(**kwargs)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        table = Array(Const(v & 0xFFFF, 16) for v in self.gprs + [0] * (32 - len(self.gprs)))
        m.d.comb += dut.gpr_value.eq(table[dut.gpr_index])
        return m


def run_decoder(streams, *, gprs=None, stall=0.0, seed=0, per_beat=2, config=CubeConfig(),
                index_width=32, expected=None):
    """Decode ``streams`` on the model and the hardware; return (hw bits, expected bits, run).

    ``expected`` overrides the model records (a flat list over all streams).
    """
    bench = DecoderBench(gprs, config=config, parcels_per_beat=per_beat, index_width=index_width)
    layout = bench.dut.record_layout
    if expected is None:
        expected = [r for words in streams for r in decode_stream(words, gprs)]
    rng = random.Random(seed) if stall else None
    result = run_streams(bench, feeds=[Feed(bench.dut.i, beats_of(streams, per_beat, rng))],
                         drains=[Drain(bench.dut.o, len(expected))], stall=stall, seed=seed,
                         max_cycles=50 * sum(len(w) + 4 for w in streams) + 1000)
    return result.outputs[0], [layout.encode(r) for r in expected], result, layout


def assert_same(streams, **kwargs):
    """The hardware's records equal the model's, with nothing extra; returns the run."""
    got, want, result, layout = run_decoder(streams, **kwargs)
    assert result.extra == [[]], f"surplus records: {[layout.decode(b) for b in result.extra[0]]}"
    mismatches = [(k, layout.decode(g), layout.decode(w))
                  for k, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not mismatches, "first mismatches (index, hardware, model):\n" + "\n".join(
        f"{k}: {g}\n   {w}" for k, g, w in mismatches[:3])
    return result


# ---------------------------------------------------------------------------
# Spec vectors and the project's decoder cases
# ---------------------------------------------------------------------------

def _lines(example):
    return [(int(line["hex"], 16), line["length_bits"]) for line in example["lines"]]


def _assembled(lines):
    return [(i.word, i.length) for i in assemble("\n".join(lines))]


def _case_gprs(case):
    gprs = [0] * 24
    for name, value in (case.get("gprs") or {}).items():
        gprs[isa.GPR_NAMES.index(name)] = value
    return gprs


def test_worked_examples_and_bundle_cases():
    streams = [_lines(ex) for ex in VECTORS["worked_examples"]]
    streams += [_assembled(case["asm"]) for case in VECTORS["bundle_cases"]]
    assert_same(streams)


def test_bundle_cases_report_their_decode_faults():
    # Independently of the model: the decode-layer cases end in the recorded fault class at
    # the recorded line.
    cases = [c for c in VECTORS["bundle_cases"] if c["layer"] == "decode" and c["outcome"] != "ok"]
    got, _, _, layout = run_decoder([_assembled(c["asm"]) for c in cases])
    faults = {(r.fault.spec_name, r.fault_index) for r in map(layout.decode, got) if not r.ok}
    # Streams restart their indices, so each case's (class, index) must appear.
    for case in cases:
        assert (case["outcome"], case["at"]) in faults, case["id"]


def test_decoder_cases():
    # The project's stream-level cases, all in one simulation (each is its own stream): the
    # hardware equals the model, and both give the records the case lists.
    cases = VECTORS["decoder_cases"]
    layout = RecordLayout()
    for gprs in {tuple(_case_gprs(c)) for c in cases}:
        group = [c for c in cases if tuple(_case_gprs(c)) == gprs]
        result = assert_same([_assembled(c["asm"]) for c in group], gprs=list(gprs))
        records = iter(layout.decode(bits) for bits in result.outputs[0])
        for case in group:
            for want in case["records"]:
                record = next(records)
                if want["outcome"] in ("ok", "noop"):
                    assert record.ok and record.noop == (want["outcome"] == "noop"), case["id"]
                    assert record.bundle.boundary_index == want["at"], case["id"]
                    if "dims" in want:
                        assert list(record.bundle.dims) == want["dims"], case["id"]
                else:
                    got = (record.fault.spec_name, record.fault_index)
                    assert got == (want["outcome"], want["at"]), case["id"]
        assert next(records, None) is None


def test_worked_examples_under_random_stalls():
    streams = [_lines(ex) for ex in VECTORS["worked_examples"]] * 2
    assert_same(streams, stall=0.4, seed=3)


def test_witness_words():
    # Each spec witness word alone, and as the third instruction of a TMATMUL bundle.
    streams = []
    for w in VECTORS["witnesses"]:
        word = (int(w["word"], 16), w["length_bits"])
        if isa.length_of(word[0] & 0xFFFF) != word[1]:
            continue        # BSTART.CALL: not reachable through a parcel stream (R15)
        streams += [[word], [BSTART_TMATMUL_FP16, FPATR_NONE, word, BSTOP]]
    assert len(streams) >= 2 * 120
    assert_same(streams)


def per_stream(streams, outputs, gprs=None):
    """The hardware's records (decoded) grouped by stream, using the model's record counts."""
    layout = RecordLayout()
    records = iter(layout.decode(bits) for bits in outputs)
    return [[next(records) for _ in decode_stream(words, gprs)] for words in streams]


def test_negative_vectors():
    vectors = VECTORS["negative_vectors"]
    streams = [[(int(v["word"], 16), v["length_bits"])] for v in vectors]
    streams += [[TIMG2COL_FP16, words[0], BSTOP] for words in streams]
    result = assert_same(streams)
    # Alone, a word that decode or the start handler rejects is Fault_IllegalInstruction at 0.
    ii_at_0 = BundleRecord(fault=FaultClass.ILLEGAL_INSTRUCTION, fault_index=0)
    alone = per_stream(streams, result.outputs[0])[:len(vectors)]
    rejected = [records for v, records in zip(vectors, alone) if v["stage"] in ("decode", "start")]
    assert len(rejected) > 20 and all(records == [ii_at_0] for records in rejected)


# ---------------------------------------------------------------------------
# Every 16-bit parcel as the first parcel of an instruction
# ---------------------------------------------------------------------------

def parcel_streams(parcels):
    """Each parcel as one instruction (padded to its length), in one of three contexts."""
    streams = []
    for p in parcels:
        length = isa.length_of(p)
        rng = random.Random(p)
        word = p | (rng.getrandbits(length - 16) << 16 if length > 16 else 0)
        context = p % 3
        if context == 0:
            streams.append([(word, length)])
        elif context == 1:
            streams.append([BSTART_TMATMUL_FP16, FPATR_NONE, (word, length), BSTOP])
        else:
            streams.append([TIMG2COL_FP16, (word, length), C_BSTOP])
    return streams


def test_parcels_strided():
    # Every 127th parcel (all low nibbles and contexts occur); the full sweep is slow.
    assert_same(parcel_streams(range(0, 1 << 16, 127)))


@pytest.mark.slow
def test_parcels_exhaustive():
    for start in range(0, 1 << 16, 1 << 12):
        assert_same(parcel_streams(range(start, start + (1 << 12))))


# ---------------------------------------------------------------------------
# Random bundles (legal, nearly legal and chaotic), with random stalls
# ---------------------------------------------------------------------------

def _random_run(seed, bundles, stall):
    rng = random.Random(seed)
    streams = random_streams(rng, bundles)
    gprs = random_gprs(rng)
    return assert_same(streams, gprs=gprs, stall=stall, seed=seed)


def test_random_bundles():
    _random_run(seed=1, bundles=100, stall=0.0)
    _random_run(seed=2, bundles=100, stall=(0.3, 0.5))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 20))
def test_random_bundles_regression(seed):
    _random_run(seed=seed, bundles=1000, stall=(0.0, 0.2, 0.5)[seed % 3])


def test_random_bundles_cover_every_outcome():
    # The generator reaches descriptors, no-ops and all three decoder fault classes.
    rng = random.Random(1)
    records = [r for words in random_streams(rng, 150) for r in decode_stream(words)]
    outcomes = {(r.fault, r.noop) for r in records}
    assert {(FaultClass.NONE, False), (FaultClass.NONE, True), (FaultClass.ILLEGAL_INSTRUCTION,
            False), (FaultClass.BUNDLE_CONTROL, False), (FaultClass.TILE_LEGALITY,
            False)} <= outcomes


# ---------------------------------------------------------------------------
# Stream mechanics: beats, stream ends, indices, throughput
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("per_beat", [1, 4])
def test_other_beat_widths(per_beat):
    rng = random.Random(per_beat)
    streams = [_lines(ex) for ex in VECTORS["worked_examples"]] + random_streams(rng, 10)
    assert_same(streams, per_beat=per_beat, stall=0.3, seed=per_beat)


def test_index_width_wraps():
    # Instruction indices count modulo 2**index_width in every record field.
    rng = random.Random(5)
    streams = [[w for _ in range(8) for w in well_formed_bundle(rng)] for _ in range(3)]
    assert max(len(s) for s in streams) > 16
    assert_same(streams, index_width=4)


def test_empty_streams_and_stream_end_inside_an_instruction():
    rng = random.Random(6)
    beats, expected = [], []
    for k in range(12):
        words = random_bundle(rng)
        tail = [L_BSTOP, BSTART_TMATMUL_FP16, (0x9abe_1234_567E, 48)][k % 3]
        parcels = isa.words_to_parcels(words + [tail])
        parcels = parcels[:len(parcels) - 1 - k % (tail[1] // 16 - 1)]   # cut the tail short
        for i in range(0, len(parcels), 2):
            chunk = parcels[i:i + 2]
            beats.append({"parcels": chunk + [0] * (2 - len(chunk)), "count": len(chunk),
                          "last": 0})
        beats[-1]["last"] = 1
        beats.append({"parcels": [0, 0], "count": 0, "last": 1})     # an empty stream
        expected += decode_stream(words)                              # the cut word is lost
    bench = DecoderBench()
    layout = bench.dut.record_layout
    result = run_streams(bench, feeds=[Feed(bench.dut.i, beats)],
                         drains=[Drain(bench.dut.o, len(expected))], stall=0.3, seed=6)
    assert result.outputs[0] == [layout.encode(r) for r in expected]
    assert result.extra == [[]]


def test_one_instruction_per_cycle():
    # A long legal stream of 16/32-bit instructions, no stalls: the decoder takes one
    # instruction per cycle (pipeline fill and stream end are the only overhead).
    rng = random.Random(7)
    words = legal_stream(rng, 1000)
    result = assert_same([words])
    ipc = len(words) / result.cycles
    assert ipc > 0.97, f"{ipc:.3f} instructions per cycle"


# ---------------------------------------------------------------------------
# The GPR read port
# ---------------------------------------------------------------------------

def test_gpr_port_reads_for_b_dim_only():
    # gpr_read pulses once per B.DIM with RegSrc != 0 that reaches the state machine's input,
    # with that RegSrc on gpr_index; the values wrap at 16 bits (GPR 65535 + 1 -> 0).
    gprs = [0] + [(k * 0x1234567) & 0xFFFFFFFF for k in range(1, 23)] + [0xFFFF]
    dims = [isa.encode(f, {"RegSrc": r, "uimm17": u})
            for f, r, u in zip(_BY_ROLE[isa.Role.DIM], (23, 0, 5), (1, 7, 0x1FFFF))]
    words = [BSTART_TMATMUL_FP16, FPATR_NONE] + [(w, 32) for w in dims] + [BSTOP]
    words += [(dims[0], 32), C_BSTOP]               # a stray B.DIM still reads its GPR
    bench = DecoderBench(gprs)
    dut = bench.dut
    reads = []

    async def monitor(ctx):
        async for _, _, strobe, index in ctx.tick().sample(dut.gpr_read, dut.gpr_index):
            if strobe:
                reads.append(index)

    expected = decode_stream(words, gprs)
    result = run_streams(bench, feeds=[Feed(dut.i, beats_of([words], 2))],
                         drains=[Drain(dut.o, len(expected))], testbenches=[monitor])
    layout = dut.record_layout
    assert result.outputs[0] == [layout.encode(r) for r in expected]
    assert reads == [23, 5, 23]
    assert expected[0].bundle.dims[isa.dim_lb_index(_BY_ROLE[isa.Role.DIM][0])] == 0


# ---------------------------------------------------------------------------
# Elaborated bounds below the spec's: implementation limits, never truncation
# ---------------------------------------------------------------------------

def _iot(sources, last=0, destination=None):
    fields = {"PEMode": 7, "L": last}
    names = ("SrcTile0", "SrcTile1")[:len(sources)]
    fields.update(zip(names, sources))
    if destination is not None:
        fields.update(DstTile=destination, SizeCode=1)
    form = next(f for f in _BY_ROLE[isa.Role.IOT]
                if set(f.field_names) == set(fields) | ({"SizeCode"} if destination is not None
                                                         else set()))
    return isa.encode(form, fields), 32


def _ios(tid):
    return isa.encode(_BY_ROLE[isa.Role.IOS][0], {"SharedTID": tid, "SizeCode": 0, "PEMode": 7}), 32


def test_smaller_bounds_are_reported_as_faults():
    config = CubeConfig(max_local_sources=3, max_destinations=1, max_shared=2, max_iot_words=3)
    head = [BSTART_TMATMUL_FP16, FPATR_NONE]
    streams = [
        head + [_iot([1, 2]), _iot([3], last=1, destination=0), BSTOP],       # 3 sources: fits
        head + [_iot([1, 2]), _iot([3, 4], last=1, destination=0), BSTOP],    # 4 sources
        head + [_iot([1], destination=0), _iot([2], last=1, destination=1), BSTOP],  # 2 dests
        head + [_ios(1), _ios(2), _ios(3), _iot([1], last=1, destination=0), BSTOP],
        head + [_iot([1]), _iot([2]), _iot([3]), _iot([4], last=1, destination=0), BSTOP],
    ]
    model = [decode_stream(words) for words in streams]
    assert all(len(records) == 1 and records[0].ok for records in model)   # legal in the spec
    tl, bc = FaultClass.TILE_LEGALITY, FaultClass.BUNDLE_CONTROL
    expected = [
        model[0][0],
        BundleRecord(fault=tl, fault_index=4),     # at the boundary, as the spec's 9th source
        BundleRecord(fault=tl, fault_index=4),     # likewise a destination over the bound
        BundleRecord(fault=bc, fault_index=4),     # at the B.IOS, as the spec's 5th binding
        BundleRecord(fault=tl, fault_index=5),     # at the B.IOT, as the spec's 17th word
    ]
    assert_same(streams, config=config, expected=expected)
    layout = RecordLayout(config)
    with pytest.raises(BoundExceeded):
        layout.encode(model[1][0])


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="max_shared"):
        BundleDecoder(CubeConfig(max_shared=0))


# ---------------------------------------------------------------------------
# Building blocks: matcher, aligner, skid buffer, record layout
# ---------------------------------------------------------------------------

def _matcher_agrees(words):
    """Run ``(word, length)`` pairs through the combinational matcher; return mismatches."""
    dut = InstructionMatcher(["SrcTile0", "DataType", "uimm17", "BrType"])
    bad = []

    async def testbench(ctx):
        for word, length in words:
            ctx.set(dut.word, word)
            ctx.set(dut.length, length // 16 - 1)
            form = isa.find_form(word, length)
            try:
                isa.match_form(word, length)
                legal = True
            except PTOFault:
                legal = False
            got = (ctx.get(dut.matched), ctx.get(dut.legal),
                   isa.FORMS[ctx.get(dut.form)] if ctx.get(dut.matched) else None)
            want = (form is not None, legal, form)
            fields = {n: ctx.get(dut.fields[n]) for n in dut.fields if form and n in
                      form.field_names}
            if got != want or fields != {n: form.extract(word)[n] for n in fields}:
                bad.append((hex(word), length, got, want))

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    return bad


def _random_form_words(rng, count):
    forms = [f for f in isa.FORMS]
    words = []
    for _ in range(count):
        form = rng.choice(forms)
        words.append(random_word(form, rng, legal=0.8))
        words.append(random_raw_word(rng))
    return words


def test_matcher_on_random_words():
    assert not _matcher_agrees(_random_form_words(random.Random(8), 600))


@pytest.mark.slow
def test_matcher_on_every_parcel():
    assert not _matcher_agrees([(p, 16) for p in range(1 << 16)])


def test_aligner_splits_parcels_by_the_length_rule():
    rng = random.Random(9)
    words = [random_raw_word(rng) for _ in range(300)]
    for per_beat in (1, 2, 3):
        dut = ParcelAligner(per_beat)
        beats = beats_of([words], per_beat, random.Random(per_beat))
        result = run_streams(dut, feeds=[Feed(dut.i, beats)],
                             drains=[Drain(dut.o, len(words) + 1)], stall=0.3, seed=per_beat)
        items = [data_view(dut.o.payload.shape(), bits) for bits in result.outputs[0]]
        got = [(i.word & ((1 << (16 * (i.length + 1))) - 1), 16 * (i.length + 1), i.index)
               for i in items[:-1]]
        assert got == [(w, n, k) for k, (w, n) in enumerate(words)]
        assert items[-1].end and result.extra == [[]]


def data_view(layout, bits):
    return data.Const(layout, bits)


def test_skid_buffer_keeps_order_under_stalls():
    dut = SkidBuffer(16)
    values = list(range(1000, 1400))
    result = run_streams(dut, feeds=[Feed(dut.i, values)], drains=[Drain(dut.o, len(values))],
                         stall=(0.3, 0.5), seed=10)
    assert result.outputs[0] == values and result.extra == [[]]


def test_record_layout_round_trip_and_conventions():
    layout = RecordLayout()
    rng = random.Random(11)
    records = [r for words in random_streams(rng, 60) for r in decode_stream(words)]
    for record in records:
        bits = layout.encode(record)
        assert layout.decode(bits) == RecordLayout.normalized(record)
        view = data_view(layout, bits)
        if record.ok:
            assert view.fault == 0 and view.fault_index == 0
        else:
            assert view.bundle.as_value().value == 0 and view.fault == record.fault


# ---------------------------------------------------------------------------
# The squash input: a commit that fails after decode (model decision D29)
# ---------------------------------------------------------------------------

def model_with_verdicts(streams, squash_of, gprs=None):
    """The model decoder's records, each with its commit verdict ``squash_of(record)``.

    Like ``Machine.run``: after a squashed record the decoder's ``squash()`` is called and the
    rest of that step's records (a D11 record of the same start) are discarded.  Squashing a
    fault or a bundle that a stop ended changes nothing in the model, so any record may get
    either verdict.
    """
    expected = []
    for words in streams:
        decoder = ModelDecoder(gprs)
        for index, item in enumerate(words):
            for record in decoder.step(index, *isa.word_and_length(item)):
                squash = squash_of(record)
                expected.append((record, squash))
                if squash:
                    decoder.squash()
                    break
        expected += [(record, False) for record in decoder.finish(len(words))]
    return expected


def run_with_verdicts(streams, expected, *, gprs=None, seed=0, stall=0.3,
                      delays=(0, 0, 1, 2, 6, 30), settle=40):
    """Decode ``streams`` on the hardware with a consumer that gives each record its verdict.

    ``expected`` is a list of (model record, squash).  The consumer takes a record, keeps
    ``o.ready`` low for a random delay (the decoder runs ahead into the next bundle meanwhile)
    and then either raises ``o.ready`` (committed) or pulses ``squash`` (sometimes together
    with ``o.ready``).  Returns the hardware's records and any surplus records, as bits.
    """
    bench = DecoderBench(gprs)
    dut = bench.dut
    rng = random.Random(seed)
    beats = [ParcelBeat().const(b).as_bits() for b in beats_of(streams, 2, rng if stall
                                                                  else None)]
    got, extra = [], []
    limit = 60 * sum(len(w) + 4 for w in streams) + 40 * len(expected) + 1000
    cycles = [0]

    async def producer(ctx):
        for bits in beats:
            while stall and rng.random() < stall:
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.as_value(), bits)
            while not (await ctx.tick().sample(dut.i.ready))[2]:
                pass
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        payload = dut.o.payload.as_value()
        with_ready = False          # the last squash is up together with o.ready
        for _, squash in expected:
            while stall and not with_ready and rng.random() < stall:
                await ctx.tick()
            ctx.set(dut.o.ready, 1)
            while True:
                _, _, valid, bits = await ctx.tick().sample(dut.o.valid, payload)
                ctx.set(dut.squash, 0)
                cycles[0] += 1
                if valid:
                    break
                if cycles[0] > limit:
                    raise TimeoutError(f"{len(got)} of {len(expected)} records after {limit} "
                                       f"cycles")
            got.append(bits)
            ctx.set(dut.o.ready, 0)
            for _ in range(rng.choice(delays)):
                await ctx.tick()
            with_ready = False
            if squash:
                ctx.set(dut.squash, 1)
                with_ready = rng.random() < 0.5
                if not with_ready:
                    await ctx.tick()
                    ctx.set(dut.squash, 0)
        ctx.set(dut.o.ready, 1)
        for _ in range(settle):
            _, _, valid, bits = await ctx.tick().sample(dut.o.valid, payload)
            ctx.set(dut.squash, 0)
            if valid:
                extra.append(bits)

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer)
    sim.run()
    return got, extra


def assert_same_with_verdicts(streams, expected, **kwargs):
    layout = RecordLayout()
    got, extra = run_with_verdicts(streams, expected, **kwargs)
    assert extra == [], f"surplus records: {[layout.decode(b) for b in extra]}"
    want = [layout.encode(record) for record, _ in expected]
    mismatches = [(k, layout.decode(g), layout.decode(w))
                  for k, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not mismatches, "first mismatches (index, hardware, model):\n" + "\n".join(
        f"{k}: {g}\n   {w}" for k, g, w in mismatches[:3])


def _without_stop(text):
    """A bundle's assembly without its final stop: the next start is its boundary."""
    lines = text.rstrip("\n").split("\n")
    assert lines[-1] == "BSTOP"
    return "\n".join(lines[:-1]) + "\n"


def test_squash_follows_the_machine():
    # Bundles that pass and fail the model's preflight, ended by every kind of start; the
    # consumer squashes exactly where Machine.run calls squash().
    state = make_state({"M#1": value_tile("FP16", "CUBE_M16", [[1.5, 2.0]]),
                        "N#1": value_tile("FP16", "CUBE_N8", [[2.0], [0.25]])})
    good = matrix_bundle(Operation.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"],
                         destinations=[("N", 2)])
    bad = matrix_bundle(Operation.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#7", "N#1"],
                        destinations=[("N", 3)])       # M#7 does not exist: preflight faults
    program = "".join([
        _without_stop(good), bad,                     # committed at a start; squash at a stop
        _without_stop(bad), good,                     # squash at a CUBE start
        _without_stop(bad), "BSTART.STD FALL\nBSTOP\n",           # ... an unsupported start
        _without_stop(bad), "B.HINT TRACE.begin\nB.DIM zero, 3, ->LB0\nBSTOP\n",
        _without_stop(bad), "BSTART.SFU TIMG2COL, FP16\nB.IOT M#1, mask=1111, last\nBSTOP\n",
        _without_stop(bad), _without_stop(good), good,     # the dropped bundle ends at a start
        _without_stop(bad), _without_stop(good), "B.IOT M#1, mask=1111\nC.BSTOP\n",  # a fault
        good,
    ])
    words = [(i.word, i.length) for i in assemble(program)]
    results = Machine(state).run(words)
    expected = [(r.record, r.record.ok and not r.ok) for r in results]
    squashed = [k for k, (_, squash) in enumerate(expected) if squash]
    assert len(squashed) == 7 and sum(r.outcome == Outcome.SUCCESS for r in results) >= 3
    for seed, stall in ((1, 0.0), (2, 0.4)):
        assert_same_with_verdicts([words], expected, gprs=state.gprs, seed=seed, stall=stall)


def test_squash_while_the_next_record_is_in_flight():
    # The verdict comes 30 cycles after the record: by then the decoder has completed the next
    # record (of the bundle the squashed start opened, or a fault in it) and holds it back.
    rng = random.Random(12)
    head = [BSTART_TMATMUL_FP16, FPATR_NONE, _iot([1, 2], last=1, destination=0)]
    tails = [[BSTOP], [C_BSTOP, BSTART_TMATMUL_FP16, FPATR_NONE, BSTOP], [(0xFFFF_FFF1, 32)],
             [TIMG2COL_FP16, _iot([1], last=1, destination=0), BSTOP],
             [random_word(_BY_ROLE[isa.Role.OTHER_START][0], rng), BSTOP],
             [FPATR_NONE, BSTOP], []]
    streams = [head + head + tail for tail in tails]
    expected = []
    for words in streams:
        # Squash the first record (a start ended it); the rest follow from the model.
        assert decode_stream(words)[0].ok
        expected += model_with_verdicts([words], lambda r, first=iter([True]): next(first, False))
    assert_same_with_verdicts(streams, expected, delays=(30,), stall=0.0)


@pytest.mark.parametrize("p_squash", [0.3, 1.0])
def test_squash_random_programs(p_squash):
    rng = random.Random(13 + int(10 * p_squash))
    streams = random_streams(rng, 80)
    gprs = random_gprs(rng)
    expected = model_with_verdicts(streams, lambda r: rng.random() < p_squash, gprs)
    assert sum(squash and r.ok for r, squash in expected) > 10
    assert_same_with_verdicts(streams, expected, gprs=gprs, seed=int(10 * p_squash))


def test_squash_random_programs_on_the_machine():
    # Machine.run as the oracle on random programs: with no tiles every descriptor that is not
    # a no-op fails its preflight, so the consumer squashes each one.
    rng = random.Random(14)
    streams = random_streams(rng, 60)
    expected = []
    for words in streams:
        expected += [(r.record, r.record.ok and not r.ok) for r in Machine().run(words)]
    assert sum(squash for _, squash in expected) > 10
    assert_same_with_verdicts(streams, expected, seed=14)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(30, 34))
def test_squash_random_programs_regression(seed):
    rng = random.Random(seed)
    streams = random_streams(rng, 600)
    gprs = random_gprs(rng)
    expected = model_with_verdicts(streams, lambda r: rng.random() < 0.4, gprs)
    assert_same_with_verdicts(streams, expected, gprs=gprs, seed=seed,
                              stall=(0.0, 0.2, 0.5, 0.3)[seed % 4])
