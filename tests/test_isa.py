"""ISA tables: the form catalog, the length rule, priority decode, fields and parcels."""

import itertools
import json
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from ptocube.model import isa
from ptocube.model.bundle import Operation
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.isa import FORMS, FORMS_BY_ID, Role

VECTORS = json.loads((pathlib.Path(__file__).parent / "data" / "encoding_vectors.json").read_text())


# -- the form table against our transcription of the catalog --------------------------

def test_seventy_four_forms_in_catalog_order():
    assert len(FORMS) == 74
    assert [f.form_id for f in FORMS] == [row["form_id"] for row in VECTORS["forms"]]
    assert len(FORMS_BY_ID) == 74


@pytest.mark.parametrize("row", VECTORS["forms"], ids=lambda row: row["form_id"])
def test_form_matches_transcription(row):
    form = FORMS_BY_ID[row["form_id"]]
    assert form.mnemonic == row["mnemonic"]
    assert form.length == row["length_bits"] and form.kind == row["kind"]
    assert [(e.mask, e.match, e.name or None, e.function) for e in form.encodings] == [
        (int(e["mask"], 16), int(e["match"], 16), e.get("name"), e.get("function"))
        for e in row["encodings"]]
    assert [(f.name, f.width, f.signed, [[p.instruction_lsb, p.width, p.value_lsb]
                                         for p in f.pieces]) for f in form.fields] == [
        (f["name"], f["width"], f["signed"], f["pieces"]) for f in row["fields"]]
    assert [(c.field, c.op, list(c.values)) for c in form.constraints] == [
        (c["field"], c["op"], c["values"]) for c in row["constraints"]]
    assert isa.DECODE_ORDER.index(form) == row["decode_priority_rank"]


def test_fields_lie_outside_the_mask_except_fixed_subfields():
    # A field is either free (outside the mask) or, like B.FPATR's Func/Opc1, fixed by
    # the mask and then constrained to exactly the value the match holds.
    for form in FORMS:
        for f in form.fields:
            if f.word_mask & form.mask:
                assert f.word_mask & form.mask == f.word_mask, (form, f.name)
                fixed = [c for c in form.constraints if c.field == f.name]
                assert fixed and fixed[0].values == (f.extract(form.match),), (form, f.name)


def test_roles_and_operations():
    by_role = {role: [f for f in FORMS if f.role is role] for role in Role}
    assert len(by_role[Role.MATRIX_START]) == 12
    assert {f.operation for f in by_role[Role.MATRIX_START]} == {
        op for op in Operation if op.is_matrix}
    for f in by_role[Role.MATRIX_START]:
        # The CUBE function number sits in bits 24:20 of the start word.
        assert (f.match >> 20) & 0x1F == f.operation.value
        assert f.mnemonic == f.operation.mnemonic
    assert [f.mnemonic for f in by_role[Role.TEPL_START]] == ["BSTART.TEPL"]
    assert len(by_role[Role.IOT]) == 5
    assert {f.mnemonic for f in by_role[Role.STOP]} == {"BSTOP", "C.BSTOP", "L.BSTOP"}
    assert [f.mnemonic for f in by_role[Role.TRACE_START]] == ["B.HINT"]
    assert sorted(isa.dim_lb_index(f) for f in by_role[Role.DIM]) == [0, 1, 2]
    with pytest.raises(ValueError):
        isa.dim_lb_index(by_role[Role.DIMI][0])


def test_only_the_reviewed_overlaps_exist():
    # Any two same-length encodings that some word could match at once.
    overlaps = set()
    for a, b in itertools.combinations(FORMS, 2):
        if a.length != b.length:
            continue
        for ea, eb in itertools.product(a.encodings, b.encodings):
            common = ea.mask & eb.mask
            if ea.match & common == eb.match & common:
                overlaps.add(frozenset((a.form_id, b.form_id)))
    assert overlaps == {
        frozenset(("b_iot_32_10db6db84f5d", "b_iot_32_c11eb189dd83")),
        frozenset(("b_iot_32_8b8bce6bffe8", "b_iot_32_2c07e7177fad")),
        frozenset(("c_bstart_std_16_8b40f078c14a", "c_bstop_16_ca4743d8a95e")),
    }


def test_decode_order_is_popcount_then_form_id():
    keys = [(-f.popcount, f.form_id) for f in isa.DECODE_ORDER]
    assert keys == sorted(keys)
    assert isa.DECODE_ORDER[0].mnemonic == "L.BSTOP"          # 64 fixed bits


def test_value_tables():
    assert len(isa.TEPL_OPERATIONS) == 87
    assert isa.TEPL_OPERATIONS[isa.TIMG2COL_SELECTOR] == ("TIMG2COL", "SFU")
    assert isa.TIMG2COL_SELECTOR == 0x64
    assert isa.DATATYPE_NAMES[31] == "DTYPE_NONE" and isa.DATATYPE_NAMES[4] == "FP16"
    assert 31 not in isa.START_DTYPES and len(isa.START_DTYPES) == 25
    assert isa.GPR_NAMES[2] == "a0" and isa.GPR_NAMES[23] == "x3" and len(isa.GPR_NAMES) == 24
    assert isa.REG5_NAMES[24] == "t#1" and isa.REG5_NAMES[31] == "u#4"
    assert isa.LOCAL_SIZE_BYTES[1] == 128 and isa.LOCAL_SIZE_BYTES[10] == 65536
    assert max(isa.SHARED_SIZE_BYTES) == 12 and isa.SHARED_SIZE_BYTES[12] == 256 * 1024
    assert set(isa.LAYOUT_NAMES) == {0, 1, 3, 4, 6, 8, 9, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27,
                                     28, 30}
    assert isa.GROUP_N_COLUMNS[9] == 128 and len(isa.PREQUANT_MODES) == 27
    assert isa.mask_text(0b1000) == "1000"


# -- length rule (R15) --------------------------------------------------------------

def test_length_rule_on_every_parcel():
    for parcel in range(1 << 16):
        low = parcel & 0xF
        expected = 48 if low == 0xE else 64 if low == 0xF else 32 if parcel & 1 else 16
        assert isa.length_of(parcel) == expected


def test_length_rule_agrees_with_every_form_except_fused_call():
    for form in FORMS:
        if form.mnemonic == "BSTART.CALL":
            # The fused pair looks like C.BSTART DIRECT + a second parcel (ruling R15 note).
            assert isa.length_of(form.match & 0xFFFF) == 16
            continue
        assert isa.length_of(form.match & 0xFFFF) == form.length, form


def test_length_of_rejects_non_parcels():
    with pytest.raises(ValueError):
        isa.length_of(0x10000)


# -- spec vectors ----------------------------------------------------------------------

@pytest.mark.parametrize("w", VECTORS["witnesses"], ids=lambda w: w["word"])
def test_witness_words_decode_to_their_form_and_fields(w):
    word = int(w["word"], 16)
    form = isa.find_form(word, w["length_bits"])
    assert form.form_id == w["form_id"]
    assert form.extract(word) == w["fields"]
    # Witnesses of reserved values (C.B.DIMI LoopNest 3) decode but fail the constraint.
    if form.constraint_failure(w["fields"]) is None:
        assert isa.match_form(word, w["length_bits"]) == (form, w["fields"])
    else:
        with pytest.raises(PTOFault):
            isa.match_form(word, w["length_bits"])


def test_there_are_126_witnesses_and_31_negative_vectors():
    assert len(VECTORS["witnesses"]) == 126
    assert len(VECTORS["negative_vectors"]) == 31


@pytest.mark.parametrize("v", VECTORS["negative_vectors"], ids=lambda v: v["word"])
def test_negative_vectors(v):
    word, length = int(v["word"], 16), v["length_bits"]
    if v["stage"] == "decode":
        with pytest.raises(PTOFault) as err:
            isa.match_form(word, length)
        assert err.value.fault is FaultClass.ILLEGAL_INSTRUCTION
        matched = isa.find_form(word, length)
        assert (matched is None) == (v["decode"] == "no-form")
    else:
        form, _ = isa.match_form(word, length)
        assert form.form_id == v["decode"]


@pytest.mark.parametrize("ex", VECTORS["worked_examples"], ids=lambda ex: ex["id"])
def test_worked_example_words_encode_from_their_fields(ex):
    for line in ex["lines"]:
        form = FORMS_BY_ID[line["form_id"]]
        assert isa.encode(form, line["fields"]) == int(line["hex"], 16)


# -- decode, encode and fields ---------------------------------------------------------

def test_priority_decode_of_the_reviewed_overlaps():
    iot_src = FORMS_BY_ID["b_iot_32_c11eb189dd83"]
    iot_dst = FORMS_BY_ID["b_iot_32_10db6db84f5d"]
    assert isa.find_form(0x00085e13, 32) is iot_src            # SizeCode 0: source only
    assert isa.find_form(0x0008de13, 32) is iot_dst            # SizeCode 1: destination
    assert isa.find_form(0x0000, 16).mnemonic == "C.BSTOP"
    assert isa.find_form(0x0800, 16).mnemonic == "C.BSTART.STD"
    with pytest.raises(PTOFault, match="SizeCode = 11 is reserved"):
        isa.match_form(0x0005d013, 32)                         # no fall-through


def test_match_form_reports_no_form():
    with pytest.raises(PTOFault) as err:
        isa.match_form(0x00007013, 32)
    assert err.value.fault is FaultClass.ILLEGAL_INSTRUCTION
    assert "no instruction form" in err.value.reason


def test_variants_decode_to_their_form():
    tmov = FORMS_BY_ID["bstart_tmov_32_211446509efb"]
    assert isa.find_form(0x20911181, 32) is tmov
    assert tmov.variant_of(0x20911181) == 1 and tmov.encodings[1].name == "TMOV.L2S.INSERT"
    assert tmov.variant_of(0x20211181) == 0
    assert isa.match_form(0xf8211181, 32)[1] == {"DataType": 31}   # TMOV accepts DTYPE_NONE


def test_words_must_fit_their_length():
    with pytest.raises(ValueError):
        isa.find_form(0x10000, 16)
    with pytest.raises(ValueError):
        isa.find_form(0, 24)


def test_split_field_insert_and_extract():
    dim = FORMS_BY_ID["b_dim_32_27602ab68929"]
    word = isa.encode(dim, {"RegSrc": 3, "uimm17": 0x1ABCD})
    assert isa.extract_field(dim, "uimm17", word) == 0x1ABCD
    assert (word >> 20) == 0xBCD and (word >> 7) & 0x1F == 0x1A
    assert isa.insert_field(dim, "uimm17", word, 5) == isa.encode(dim, {"RegSrc": 3, "uimm17": 5})


def test_field_range_errors():
    frame = FORMS_BY_ID["fentry_32_a47584ec13b6"]
    assert isa.encode(frame, {"SrcBegin": 2, "SrcEnd": 3, "uimm": 32760})
    with pytest.raises(ValueError, match="multiples of 8"):
        isa.encode(frame, {"SrcBegin": 2, "SrcEnd": 3, "uimm": 12})
    with pytest.raises(ValueError, match="out of range"):
        isa.encode(FORMS_BY_ID["bstart_32_7eb93b649748"], {"simm25": -(1 << 24) - 1})
    with pytest.raises(ValueError, match="not encodable"):
        isa.encode(FORMS_BY_ID["bstart_32_7eb93b649748"], {"simm25": 1 << 25})
    start = FORMS_BY_ID["bstart_32_7eb93b649748"]
    word = isa.encode(start, {"simm25": -2})
    assert start.field("simm25").to_signed(start.field("simm25").extract(word)) == -2
    with pytest.raises(ValueError, match="is reserved"):
        isa.encode(FORMS_BY_ID["b_ior_32_c3ea71404eb3"], {"RegSrc0": 24})
    with pytest.raises(ValueError, match="no field"):
        isa.encode(FORMS_BY_ID["bstop_32_d25b09fdd59c"], {"DataType": 1})
    with pytest.raises(ValueError, match="fixed bits"):
        isa.encode(FORMS_BY_ID["b_fpatr_32_30c307e06d4a"], {"Func": 3}, check=False)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(FORMS), st.data())
def test_encode_extract_round_trip(form, data):
    fields = {f.name: data.draw(st.integers(0, f.value_mask).map(lambda v, f=f: v & f.value_mask))
              for f in form.fields if not f.word_mask & form.mask}
    word = isa.encode(form, fields, check=False)
    assert word & form.mask == form.match
    extracted = form.extract(word)
    assert all(extracted[name] == value for name, value in fields.items())


# -- parcels ----------------------------------------------------------------------

def test_parcels_round_trip_and_byte_images():
    for ex in VECTORS["worked_examples"]:
        words = [(int(line["hex"], 16), line["length_bits"]) for line in ex["lines"]]
        parcels = isa.words_to_parcels(words)
        assert isa.parcels_to_words(parcels) == words
        image = isa.parcels_to_bytes(parcels)
        assert image.hex(" ") == ex["byte_image_le"]
        assert isa.bytes_to_parcels(image) == parcels


def test_parcel_errors():
    with pytest.raises(ValueError, match="ends inside"):
        isa.parcels_to_words([0x1181])                      # first half of a 32-bit word
    with pytest.raises(ValueError, match="length rule"):
        isa.words_to_parcels([(0x00000000, 32)])            # low parcel implies 16 bits
    with pytest.raises(ValueError, match="even number"):
        isa.bytes_to_parcels(b"\x01")
    assert isa.words_to_parcels([(0x000000010000000F, 64)]) == [0x000F, 0, 1, 0]
