"""Bundle decode model: spec bundle cases, worked examples, stream-level decisions, fuzzing."""

import json
import pathlib
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from ptocube.model import isa
from ptocube.model.asm import assemble
from ptocube.model.bundle import Datr, Destination, Fpatr, Operation
from ptocube.model.faults import FaultClass
from ptocube.model.decode import (BundleDecoder, DecoderState, MAX_MATRIX_DESTINATIONS,
                                  MAX_MATRIX_LOCAL_SOURCES, MAX_SHARED, decode_parcels,
                                  decode_stream, record_to_dict)

VECTORS = json.loads((pathlib.Path(__file__).parent / "data" / "encoding_vectors.json").read_text())


def decode_text(text, gprs=None):
    return decode_stream(assemble(text), gprs)


def outcome(record):
    if not record.ok:
        return record.fault.spec_name, record.fault_index
    return ("noop" if record.noop else "ok"), record.bundle.boundary_index


# -- the spec's bundle cases and worked examples ---------------------------------------

@pytest.mark.parametrize("case", VECTORS["bundle_cases"], ids=lambda c: c["id"])
def test_bundle_case(case):
    records = decode_text("\n".join(case["asm"]))
    assert len(records) == 1
    (record,) = records
    last = len(case["asm"]) - 1
    if case["layer"] == "preflight":
        # The decoder passes the bundle; the preflight reports the fault at the boundary.
        assert outcome(record) == ("ok", case["at"])
    elif case["outcome"] == "ok":
        assert case["at"] == last + 1                      # the digest's convention for ok
        assert outcome(record) == ("noop", last)
    else:
        assert outcome(record) == (case["outcome"], case["at"])


def test_there_are_21_bundle_cases():
    assert len(VECTORS["bundle_cases"]) == 21


@pytest.mark.parametrize("ex", VECTORS["worked_examples"], ids=lambda ex: ex["id"])
def test_worked_example_decodes_to_one_bundle(ex):
    words = [(int(line["hex"], 16), line["length_bits"]) for line in ex["lines"]]
    (record,) = decode_stream(words)
    last = len(words) - 1
    assert outcome(record) == ("ok", last)
    if ex["outcome"] != "ok":
        assert ex["layer"] == "preflight" and ex["at"] == last
    assert record.bundle.start_index == 0
    assert record.words == tuple((i, n, w) for i, (w, n) in enumerate(words))


def test_ex5_descriptor():
    ex = next(e for e in VECTORS["worked_examples"] if e["id"].startswith("EX5"))
    (record,) = decode_text("\n".join(line["asm"] for line in ex["lines"]))
    b = record.bundle
    assert b.op is Operation.TMATMUL and b.a_type == 19 and b.b_type == 19
    assert b.datr == Datr(dtype=19, rmode=1, sat=1)
    assert b.fpatr == Fpatr(pre_quant_mode=3, relu_mode=2, group_n_code=2, row_max_en=True,
                            group_max_en=True, max_abs_en=True)
    assert b.dims == (16, 64, 256)
    assert b.local_sources == (32, 48)
    assert b.destinations == (Destination(0, 4), Destination(1, 1), Destination(3, 2))
    assert b.terminated and b.pe_mask == 0b1111 and b.ior == (2, 3, 0, 0)
    assert b.shared_sources == () and not b.catr_dr and not record.noop


def test_ex6_ex7_ex9_descriptors():
    by_id = {e["id"][:3]: e for e in VECTORS["worked_examples"]}

    def bundle(key):
        (record,) = decode_text("\n".join(line["asm"] for line in by_id[key]["lines"]))
        return record.bundle

    ex6 = bundle("EX6")
    assert ex6.op is Operation.TGEMV_MX_ACC and (ex6.a_type, ex6.b_type) == (7, 8)
    assert ex6.dims == (None, 32, 64) and (ex6.dim(0), ex6.dim(1)) == (1, 32)
    assert ex6.local_sources == (33, 32, 0, 48, 1) and ex6.destinations == (Destination(2, 1),)
    ex7 = bundle("EX7")
    assert ex7.shared_sources == (3, 4) and ex7.local_sources == ()
    assert ex7.fpatr.trans_a and ex7.fpatr.trans_b and ex7.dims == (16, 32, 64)
    ex9 = bundle("EX9")
    assert ex9.op is Operation.TIMG2COL and ex9.a_type == 4 and ex9.fpatr is None
    assert ex9.dims == (64, 16, None) and ex9.local_sources == (32,)
    assert ex9.destinations == (Destination(2, 4),) and ex9.terminated


# -- single words ----------------------------------------------------------------------

@pytest.mark.parametrize("v", [v for v in VECTORS["negative_vectors"] if v["stage"] != "none"],
                         ids=lambda v: v["word"])
def test_negative_vector_faults_at_its_word(v):
    (record,) = decode_stream([(int(v["word"], 16), v["length_bits"])])
    assert outcome(record) == (v["fault"], 0)


def test_reserved_tepl_selector_is_rejected_before_commit():
    (record,) = decode_text("BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                            "BSTART.TEPL 0, 5, FP16")
    assert outcome(record) == ("Fault_IllegalInstruction", 2)
    assert "reserved TEPL selector 0x05" in record.reason
    assert [w[0] for w in record.words] == [0, 1, 2]


# -- our stream-level decisions (shared with the hardware decoder tests) ------------------

@pytest.mark.parametrize("case", VECTORS["decoder_cases"], ids=lambda c: c["id"])
def test_decoder_case(case):
    gprs = [0] * 24
    for name, value in case.get("gprs", {}).items():
        gprs[isa.GPR_NAMES.index(name)] = value
    records = decode_text("\n".join(case["asm"]), gprs)
    assert [outcome(r) for r in records] == [(e["outcome"], e["at"]) for e in case["records"]]
    for expected, record in zip(case["records"], records):
        if "dims" in expected:
            assert list(record.bundle.dims) == expected["dims"]


def test_step_by_step_states():
    decoder = BundleDecoder()
    words = assemble("BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                     "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\nB.IOT T#1, mask=1111, last\nBSTOP\n"
                     "BSTOP")
    assert decoder.state is DecoderState.IDLE
    assert decoder.step(0, words[0].word, 32) == [] and decoder.state is DecoderState.OPEN
    assert decoder.step(1, words[1].word, 32) == []
    (fault,) = decoder.step(2, words[2].word, 32)
    assert outcome(fault) == ("Fault_BundleControl", 2) and decoder.state is DecoderState.SKIP
    assert decoder.step(3, words[3].word, 32) == []
    assert decoder.step(4, words[4].word, 32) == [] and decoder.state is DecoderState.IDLE
    (stray,) = decoder.step(5, words[5].word, 32)
    assert outcome(stray) == ("Fault_BundleControl", 5)
    assert decoder.finish(6) == []


def test_unsupported_start_after_open_bundle_returns_two_records():
    decoder = BundleDecoder()
    for index, instr in enumerate(assemble("BSTART.TMATMUL FP16\n"
                                           "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0")):
        assert decoder.step(index, instr.word, instr.length) == []
    (start,) = assemble("BSTART.STD FALL")
    records = decoder.step(2, start.word, 32)
    assert [outcome(r) for r in records] == [("ok", 2), ("Fault_IllegalInstruction", 2)]
    assert "implementation limit" in records[1].reason


# -- starts that read the retiring bundle's BPCN (audit finding 1) ------------------------

_OPEN_TMATMUL = ("BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                 "B.IOT M#1, N#1, mask=1111, last, ->T<1>\n")


def _unsupported_start_words():
    """A word of every start the unit does not execute, once per legal BrType."""
    for form in isa.FORMS:
        if form.role is not isa.Role.OTHER_START:
            continue
        brtypes = next((c.values for c in form.constraints if c.field == "BrType"), (None,))
        for brtype in brtypes:
            fields = {f.name: 0 for f in form.fields if not f.word_mask & form.mask}
            if brtype is not None:
                fields["BrType"] = brtype
            name = form.mnemonic + ("" if brtype is None else
                                    " " + isa.BRANCH_TYPE_NAMES[brtype])
            if "IND" in form.asm and brtype is None:
                name += " IND"
            yield name, (isa.encode(form, fields), form.length)


def test_only_indirect_starts_fault_before_the_commit():
    bundle = [(i.word, i.length) for i in assemble(_OPEN_TMATMUL)]
    indirect = set()
    for name, start in _unsupported_start_words():
        records = decode_stream(bundle + [start])
        if outcome(records[0]) == ("Fault_BundleControl", 3):
            # Nothing committed: the open bundle is dropped with the start.
            assert len(records) == 1 and [w[0] for w in records[0].words] == [0, 1, 2, 3]
            assert "BPCN" in records[0].reason
            indirect.add(name)
        else:
            assert [outcome(r) for r in records] == [("ok", 3), ("Fault_IllegalInstruction", 3)]
    assert indirect == {"BSTART.STD IND", "BSTART.FP IND", "BSTART.ICALL",
                        "C.BSTART.STD IND", "C.BSTART.FP IND"}


def test_indirect_start_with_no_bundle_faults_and_skips():
    decoder = BundleDecoder()
    (start,) = assemble("BSTART.STD IND")
    (record,) = decoder.step(0, start.word, start.length)
    assert outcome(record) == ("Fault_BundleControl", 0) and decoder.state is DecoderState.SKIP


# -- B.CATR trap (audit finding 3) ---------------------------------------------------------

@pytest.mark.parametrize("start", ["BSTART.TMATMUL FP16", "BSTART.SFU TIMG2COL, FP16"])
def test_catr_trap_is_an_implementation_limit_at_the_catr(start):
    (record,) = decode_text(f"{start}\nB.DIM zero, 4, ->LB0\nB.CATR {{trap}}\n"
                            "B.IOT M#1, mask=1111, last, ->M<1>\nBSTOP")
    assert outcome(record) == ("Fault_IllegalInstruction", 2)
    assert "implementation limit" in record.reason and "trap" in record.reason
    # Every other B.CATR bit is accepted (DR is a commit-time matter, D18/D20).
    (record,) = decode_text(f"{start}\nB.CATR {{atomic, aqrl, far}}\nBSTOP")
    assert record.fault is not FaultClass.ILLEGAL_INSTRUCTION


# -- squash(): a commit that fails after decode (audit finding 2) --------------------------

def _decode_with_squash(text, failing):
    """Step through ``text`` as the Machine does, failing the commit of record ``failing``."""
    decoder = BundleDecoder()
    instrs = assemble(text)
    records = []
    for index, instr in enumerate(instrs):
        for record in decoder.step(index, instr.word, instr.length):
            records.append(record)
            if len(records) - 1 == failing:
                decoder.squash()
                break
    return records + decoder.finish(len(instrs))


_GOOD = _OPEN_TMATMUL + "BSTOP\n"
_BOUNDARIES = {
    "matrix-start": "BSTART.TMATMUL.ACC FP16\nB.IOT T#1, mask=1111, last\nBSTOP\n" + _GOOD,
    "timg2col-start": "BSTART.SFU TIMG2COL, FP16\nB.DIM zero, 4, ->LB0\nBSTOP\n" + _GOOD,
    "unsupported-start": "BSTART.STD FALL\nBSTOP\n" + _GOOD,
    "trace-hint": "B.HINT TRACE.begin\nBSTOP\n" + _GOOD,
    "stop": "BSTOP\n" + _GOOD,
}


@pytest.mark.parametrize("boundary", sorted(_BOUNDARIES))
def test_squash_gives_the_records_of_a_fault_the_decoder_detects(boundary):
    rest = _BOUNDARIES[boundary]
    squashed = _decode_with_squash(_OPEN_TMATMUL + rest, failing=0)
    # The same bundle without its B.FPATR fails at the same boundary in the decoder.
    detected = decode_text(_OPEN_TMATMUL.replace("B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n", "")
                           + rest)
    assert outcome(squashed[0]) == ("ok", 3) and detected[0].fault_index == 2
    # Every later record is the same, one instruction later (the B.FPATR line).
    assert [outcome(r) for r in squashed[1:]] == [(o, i + 1) for o, i in map(outcome,
                                                                                 detected[1:])]
    assert [outcome(r) for r in squashed[1:]] == [("ok", len(assemble(rest)) + 2)]


def test_squash_state():
    decoder = BundleDecoder()
    instrs = assemble(_OPEN_TMATMUL + "BSTART.TMATMUL FP16\nBSTOP\n" + _GOOD)
    results = [decoder.step(i, w.word, w.length) for i, w in enumerate(instrs[:4])]
    assert [outcome(r) for r in results[3]] == [("ok", 3)]
    assert decoder.state is DecoderState.OPEN
    decoder.squash()
    assert decoder.state is DecoderState.SKIP
    assert decoder.step(4, instrs[4].word, instrs[4].length) == []     # the unopened stop
    assert decoder.state is DecoderState.IDLE
    decoder.squash()                                                   # idle: no effect
    assert decoder.state is DecoderState.IDLE


def test_gprs_must_be_24_values():
    with pytest.raises(ValueError, match="24"):
        BundleDecoder([0] * 23)
    # GPR 0 reads zero whatever value is supplied for it.
    (record,) = decode_text("BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                            "B.DIM zero, 3, ->LB0\nBSTOP", [99] + [0] * 23)
    assert record.bundle.dims[0] == 3


def test_decode_parcels_matches_decode_stream():
    text = "\n".join(line["asm"] for e in VECTORS["worked_examples"] for line in e["lines"])
    instrs = assemble(text)
    assert decode_parcels(isa.words_to_parcels(instrs)) == decode_stream(instrs)
    with pytest.raises(ValueError):
        decode_parcels([0x1181])


def test_record_to_dict():
    ex = next(e for e in VECTORS["worked_examples"] if e["id"].startswith("EX5"))
    (record,) = decode_text("\n".join(line["asm"] for line in ex["lines"]))
    d = record_to_dict(record)
    assert d["outcome"] == "ok" and d["fault_index"] is None
    b = d["bundle"]
    assert b["op"] == "TMATMUL" and b["a_type"] == "S8" and b["dims"] == [16, 64, 256]
    assert b["local_sources"] == ["M#1", "N#1"] and b["pe_mask"] == "1111"
    assert b["destinations"][0] == {"hand": "T", "size_code": 4, "bytes_per_pe": 1024}
    assert b["ior"] == {"RegSrc0": "a0", "RegSrc1": "a1", "RegSrc2": "zero", "RegDst": "zero"}
    assert d["words"][4] == [4, 16, "0x503c"]
    (fault,) = decode_text("BSTOP")
    assert record_to_dict(fault)["outcome"] == "Fault_BundleControl"
    assert record_to_dict(fault)["bundle"] is None


# -- fuzzing: any word stream decodes to well-formed records --------------------------------
#
# Streams are built from a seeded random.Random (fast, reproducible): plausible bundles
# (a start, usually B.FPATR, legal header words that mostly share one PE mask, usually a
# stop) mixed with noise words that sit on a real form's match value with random other bits.

def _by(*mnemonics):
    return [f for f in isa.FORMS if f.mnemonic in mnemonics]


_STARTS = [f for f in isa.FORMS if f.role is isa.Role.MATRIX_START] + _by("BSTART.TEPL")
_HEADER = _by("B.IOT") * 4 + _by("B.DIM", "C.B.DIMI", "B.DATR", "B.IOR", "B.IOS", "B.CATR")
_STOPS = _by("BSTOP") * 4 + _by("C.BSTOP", "L.BSTOP")
_FPATR = _by("B.FPATR")[0]
_NOISE_FORMS = [f for f in isa.FORMS if f.mnemonic != "BSTART.CALL"]


def _legal_word(rng, form, **fixed):
    fields = {}
    for f in form.fields:
        if f.word_mask & form.mask:
            continue                                        # fixed sub-field
        constraint = next((c for c in form.constraints if c.field == f.name), None)
        if f.name in fixed:
            fields[f.name] = fixed[f.name]
        elif constraint is not None and constraint.op == "one-of":
            fields[f.name] = rng.choice(constraint.values)
        else:
            value = rng.getrandbits(f.width + 3) & f.value_mask
            while constraint is not None and not constraint.holds(value):
                value = rng.getrandbits(f.width + 3) & f.value_mask
            fields[f.name] = value
    return isa.encode(form, fields), form.length


def _random_bundle(rng):
    start = rng.choice(_STARTS)
    tepl = {"Mode": 3, "Function": 4} if start.role is isa.Role.TEPL_START else {}
    words = [_legal_word(rng, start, **tepl)]
    if rng.random() < 0.8:
        quiet = {"PreQuantMode": 0, "ReluMode": 0} if rng.random() < 0.5 else {}
        words.append(_legal_word(rng, _FPATR, RowMaxInit=0, GroupMaxEn=0, GroupNCode=0,
                                 MaxAbsEn=0, **quiet))
    pe_mode = rng.choice([7, 7, 7, 0, 1, 5])
    for _ in range(rng.randrange(9)):
        form = rng.choice(_HEADER)
        fixed = {}
        if "PEMode" in form.field_names and rng.random() < 0.85:
            fixed["PEMode"] = pe_mode
        if form.mnemonic == "B.IOS" and rng.random() < 0.75:
            fixed["SizeCode"] = 0
        if form.mnemonic == "B.CATR" and rng.random() < 0.75:
            fixed["DR"] = 0
        words.append(_legal_word(rng, form, **fixed))
    if rng.random() < 0.85:
        words.append(_legal_word(rng, rng.choice(_STOPS)))
    return words


def _noise_word(rng):
    form = rng.choice(_NOISE_FORMS)
    return form.match | (rng.getrandbits(form.length) & ~form.mask), form.length


def random_stream(seed: int, groups: int = 8) -> list:
    rng = random.Random(seed)
    words = []
    for _ in range(rng.randrange(groups + 1)):
        words += _random_bundle(rng) if rng.random() < 0.7 else [_noise_word(rng)]
    return words


def _check_stream(words):
    records = decode_stream(words)
    indices = []
    for record in records:
        assert (record.bundle is not None) == record.ok
        if record.ok:
            b = record.bundle
            assert record.fault_index is None
            assert 0 <= b.start_index < b.boundary_index <= len(words)
            assert b.op.is_matrix or b.op is Operation.TIMG2COL
            assert b.pe_mask in isa.PEMODE_OF_MASK
            assert all(d is None or 0 <= d <= 0xFFFF for d in b.dims)
            assert len(b.shared_sources) <= MAX_SHARED
            if b.op.is_matrix and not record.noop:
                assert b.fpatr is not None and not b.catr_dr
                assert len(b.local_sources) <= MAX_MATRIX_LOCAL_SOURCES
                assert len(b.destinations) <= MAX_MATRIX_DESTINATIONS
            indices.append(b.boundary_index)
        else:
            assert not record.noop
            assert 0 <= record.fault_index <= len(words) and record.reason
            indices.append(record.fault_index)
        assert [w[0] for w in record.words] == sorted(w[0] for w in record.words)
    assert indices == sorted(indices)
    assert decode_parcels(isa.words_to_parcels(words)) == records
    return records


def test_random_streams_reach_every_outcome():
    seen = Counter()
    for seed in range(300):
        for record in _check_stream(random_stream(seed)):
            seen[("noop" if record.noop else "ok") if record.ok else record.fault.spec_name] += 1
    assert set(seen) == {"ok", "noop", "Fault_IllegalInstruction", "Fault_BundleControl",
                         "Fault_TileLegality"}
    assert seen["ok"] >= 50


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_random_streams_decode_to_well_formed_records(seed):
    _check_stream(random_stream(seed))


@pytest.mark.slow
def test_random_streams_sweep():
    for seed in range(10000):
        _check_stream(random_stream(seed, groups=16))
