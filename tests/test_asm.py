"""Assembler and disassembler: worked examples, accepted spellings, errors, round trips."""

import json
import pathlib
import random

import pytest
from hypothesis import assume, given, settings, strategies as st

from ptocube.model import isa
from ptocube.model.asm import AsmError, Instr, assemble, disassemble, disassemble_word, \
    read_word_listing
from ptocube.model.isa import FORMS

VECTORS = json.loads((pathlib.Path(__file__).parent / "data" / "encoding_vectors.json").read_text())


def words(text):
    return [i.hex for i in assemble(text)]


def one(text):
    (instr,) = assemble(text)
    return instr.hex


# -- worked examples ------------------------------------------------------------------

@pytest.mark.parametrize("ex", VECTORS["worked_examples"], ids=lambda ex: ex["id"])
def test_worked_example_assembles_and_disassembles(ex):
    program = "\n".join(line["asm"] for line in ex["lines"])
    instrs = assemble(program)
    assert [i.hex for i in instrs] == [line["hex"] for line in ex["lines"]]
    assert [i.length for i in instrs] == [line["length_bits"] for line in ex["lines"]]
    assert [i.line for i in instrs] == list(range(1, len(ex["lines"]) + 1))
    assert [disassemble_word(i.word, i.length) for i in instrs] == [
        line["asm"] for line in ex["lines"]]
    # The same program on one line with ';' separators.
    assert words("; ".join(line["asm"] for line in ex["lines"])) == [
        line["hex"] for line in ex["lines"]]


def test_instr_fields():
    (instr,) = assemble("  C.B.DIMI 64, ->LB1   # N")
    assert instr == Instr(0x503c, 16, 1, "C.B.DIMI 64, ->LB1")
    assert instr.value == 0x503c and instr.hex == "0x503c"


# -- accepted alternative spellings -----------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("bstart.tmatmul fp16", "0x20031181"),
    ("BSTART.TEPL 3, 4, FP16", "0x26419181"),
    ("bstart.sfu timg2col, fp16", "0x26419181"),
    ("B.IOT T#1, T#2, mask=1111, <last>, ->M<1>", "0x0408cf13"),
    ("B.IOT T#1, T#2, mask=1111, ->M<1>, last", "0x0408cf13"),
    ("b.iot t#1, t#2, MASK=1111, last, ->m<128B>", "0x0408cf13"),
    ("B.IOT M#1, N#1, mask=1111, ->T<1KiB>", "0xc2024e13"),
    ("B.IOT M#1, N#1, mask=1111, ->T<1kib>", "0xc2024e13"),
    ("B.DIM R0, 16, ->LB0", "0x01000043"),
    ("B.DIM zero, 0x10, ->lb0", "0x01000043"),
    ("B.IOR R2, R3", "0x00310013"),
    ("B.IOR a0, a1, zero, ->zero", "0x00310013"),
    ("B.DATR {NORM, S8, Zero, EQ, RNE, 1, 0}", "0x05309023"),
    ("B.DATR NORM, S8, Zero, EQ, RNE, 1, 0", "0x05309023"),
    ("B.DATR {norm, e5m2, zero, eq, None, 0, 0}", "0x00801023"),
    ("B.DATR {0, E5M2, 0, 0, 0, 0, 0}", "0x00801023"),
    ("B.DATR {NORM, DTYPE_NONE, Zero, EQ, Default, 0, 0}", "0x01f01023"),
    ("B.FPATR 3, 2, 2, 1, 1, 0, 1, 0, 0", "0x0d16a023"),
    ("B.FPATR 0, 0, 0, 0, 0, 0, 0, 0, 0", "0x00002023"),
    ("B.IOS S77, mask=1111", "0x04d01e13"),
    ("B.IOS mask=1111, ->s7<128B>", "0x00709e13"),
    ("B.IOS mask=1111, ->S7<0001>", "0x00709e13"),
    (".4byte 0x20031181", "0x20031181"),
    (".2BYTE 0x503c", "0x503c"),
    (".8byte 0x000000010000000f", "0x000000010000000f"),
])
def test_accepted_spellings(text, expected):
    assert one(text) == expected


def test_comments_separators_and_blank_lines():
    text = """
    # a comment line
    BSTART.TMATMUL FP16 ; B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0   # trailing comment
    B.IOT M#1, N#1, mask=1111, last, ->T<1>;BSTOP;
    """
    instrs = assemble(text)
    assert [i.hex for i in instrs] == ["0x20031181", "0x00002023", "0xc208ce13", "0x00000001"]
    assert [i.line for i in instrs] == [3, 3, 4, 4]


def test_raw_directive_respects_the_length_rule():
    with pytest.raises(AsmError, match="length rule"):
        assemble(".4byte 0x00000000")
    with pytest.raises(AsmError, match="out of range"):
        assemble(".2byte 0x12345")


# -- errors: FILE:LINE:COLUMN material ---------------------------------------------------

@pytest.mark.parametrize("text,line,column,message", [
    ("BSTART.TMATMUL FP16\nFOO 1", 2, 1, "unknown mnemonic 'FOO'"),
    ("BSTART.TMATMUL", 1, 15, "missing operand"),
    ("B.FPATR None, None, 0, 0, 0, 0, 0, 0", 1, 37, "missing operand"),
    ("BSTOP 1", 1, 7, "too many operands"),
    ("C.B.DIMI 256, ->LB1", 1, 10, "value 256 out of range for imm8 (0..255)"),
    ("B.DIM zero, 131072, ->LB0", 1, 13, "out of range for uimm17"),
    ("B.IOT T#1, mask=0011, last", 1, 12, "unencodable PE mask 0011"),
    ("B.IOT T#1, mask=11", 1, 12, "expected mask=PPPP"),
    ("B.IOT T#17, mask=1111", 1, 7, "out of range (#1..#16)"),
    ("B.IOT T#1, T#2, T#3, mask=1111", 1, 17, "at most two source tiles"),
    ("B.IOT T#1, mask=1111, ->T<11>", 1, 23, "SizeCode 11 out of range"),
    ("B.IOT T#1, mask=1111, ->T<100B>", 1, 23, "not encodable"),
    ("B.IOT T#1", 1, 10, "expects mask=PPPP"),
    ("B.IOT mask=1111", 1, 16, "needs a source tile or a destination"),
    ("B.IOS S256, mask=1111", 1, 7, "out of range (S0..S255)"),
    ("B.IOS mask=1111, ->S1<13>", 1, 18, "SizeCode 13 out of range"),
    ("BSTART.TMATMUL FP17", 1, 16, "expected a DataType"),
    ("BSTART.TMATMUL DTYPE_NONE", 1, 16, "expected a DataType"),
    ("B.FPATR 6, None, 0, 0, 0, 0, 0, 0, 0", 1, 9, "PreQuantMode 6 is reserved"),
    ("B.FPATR None, 4, 0, 0, 0, 0, 0, 0, 0", 1, 15, "ReluMode 4 is reserved"),
    ("B.FPATR None, None, 0, 2, 0, 0, 0, 0, 0", 1, 24, "out of range for RowMaxEn"),
    ("B.DATR {ND2XX, FP16, Zero, EQ, Default, 0, 0}", 1, 9, "expected a Layout"),
    ("B.DATR {NORM, FP16, Zero, EQ, Default, 0, 0", 1, 8, "missing '}'"),
    ("B.IOR a0, a1, a2, a3", 1, 19, "at most three source registers"),
    ("B.IOR R24", 1, 7, "register R24 out of range"),
    ("B.DIM a9, 1, ->LB0", 1, 7, "expected a register"),
    ("B.DIM zero, 1, ->LB3", 1, 16, "expected ->LB0, ->LB1 or ->LB2"),
    ("BSTART.VEC TIMG2COL, FP16", 1, 12, "runs on the SFU engine"),
    ("BSTART.SFU TFOO, FP16", 1, 12, "expected a TEPL operation name"),
    ("BSTART.STD SIDEWAYS", 1, 12, "expected one of"),
    ("FENTRY [a0 ~ s1], sp!, 12", 1, 24, "not encodable"),
    ("FENTRY [zero ~ s1], sp!, 8", 1, 1, "SrcBegin = 0 is reserved"),
    ("HL.QMT.SI a0, ->a1", 1, 1, "bad HL.QMT suffix"),
    ("B.IOT T#1,, mask=1111", 1, 11, "empty operand"),
    ("  B.IOT T#1 , mask=1111 , last , ->Q<1>", 1, 34, "expected a destination"),
])
def test_errors_name_line_column_and_what_was_expected(text, line, column, message):
    with pytest.raises(AsmError) as err:
        assemble(text)
    assert (err.value.line, err.value.column) == (line, column), err.value
    assert message in err.value.message
    assert err.value.format("prog.s") == f"prog.s:{line}:{column}: {err.value.message}"


# -- disassembler ---------------------------------------------------------------------

def test_illegal_words_disassemble_to_raw_directives_naming_the_fault():
    text = disassemble_word(0x78031181, 32)
    assert text.startswith(".4byte 0x78031181  # Fault_IllegalInstruction")
    assert "DataType = 15 is reserved" in text
    assert disassemble_word(0x00007013, 32).startswith(".4byte 0x00007013  # Fault_Illegal")
    assert disassemble_word(0xfffc, 16).startswith(".2byte 0xfffc  # Fault_IllegalInstruction")
    for word, length in ((0x78031181, 32), (0x00007013, 32), (0xfffc, 16)):
        assert one(disassemble_word(word, length)) == isa_hex(word, length)


def isa_hex(word, length):
    return f"0x{word:0{length // 4}x}"


def test_words_without_a_spelling_disassemble_to_raw_directives():
    # Source-only B.IOT bits 8:7 are don't-care; TMOV variants and a B.HINT with L/UL
    # but no valid branch hint have no spelling.
    for word, reason in ((0xfff84193, "bits 8:7"), (0x20911181, "TMOV.L2S.INSERT"),
                         (0x00010033, "L/UL = 1")):
        text = disassemble_word(word, 32)
        assert text.startswith(f".4byte 0x{word:08x}  # ") and reason in text
        assert one(text) == isa_hex(word, 32)


def test_reserved_tepl_selector_is_spelled_as_bstart_tepl():
    text = disassemble_word(0x26919181, 32)
    assert text.startswith("BSTART.TEPL 3, 9, FP16  # reserved TEPL selector")
    assert one(text) == "0x26919181"
    assert disassemble_word(0x20019181, 32) == "BSTART.VEC TADD, FP16"


def test_canonical_spellings_of_other_forms():
    cases = {
        "BSTART.STD FALL": None, "BSTART.STD DIRECT, -8": None, "BSTART COND, 100": None,
        "BSTART.FP RET": None, "BSTART.SYS FALL": None, "BSTART.CALL -3, 5, ->ra": None,
        "BSTART.ICALL 7, ->ra": None, "C.BSTART DIRECT, -1": None, "C.BSTART.FP IND": None,
        "C.BSTART.STD RET": None, "C.BSTART.SYS FALL": None, "BSTART.TMOV DTYPE_NONE": None,
        "BSTART.TLOAD U8": None, "B.CATR {trap, atomic, aqrl, far, dr}": None,
        "B.CATR {}": None, "B.CATR {rl}": None, "B.HINT {BR.likely, TEMP.hot, 64}": None,
        "B.HINT {}": None, "B.HINT TRACE.end": None, "MCOPY [a0, a1, a2]": None,
        "ESAVE [t#1, u#4, zero]": None, "FENTRY [a0 ~ s1], sp!, 64": None,
        "FRET.STK [ra ~ s8], sp!, 0": None, "HL.QMT.IE t#1, u#1, ->t#2": None,
        "HL.QMT a0, ->a1": None, "HL.QPOP.ER sp, ->a0, a1": None,
        "HL.QPUSH.HER a0, a1, ->a2": None, "XB 1023, 127": None, "L.BSTOP": None,
        "B.IOR ->a0": None, "B.IOR": None, "B.IOR zero, zero, a2": None,
    }
    for text in cases:
        (instr,) = assemble(text)
        assert disassemble_word(instr.word, instr.length) == text


def test_disassemble_list_and_word_listing():
    instrs = assemble("BSTART.TMATMUL FP16\nC.BSTOP")
    assert disassemble(instrs) == ["BSTART.TMATMUL FP16", "C.BSTOP"]
    assert disassemble([(0x0000, 16)]) == ["C.BSTOP"]
    listing = "# words\n0x20031181\n\n  0x0000   # stop\n"
    assert [(i.word, i.length, i.line) for i in read_word_listing(listing)] == [
        (0x20031181, 32, 2), (0x0000, 16, 4)]


@pytest.mark.parametrize("text,column,message", [
    ("0x123", 1, "4, 8, 12 or 16 hex digits"),
    ("  20031181", 3, "expected 0x"),
    ("0x20031181 0x0000", 12, "one instruction word per line"),
    ("0x00000000", 1, "length rule"),
])
def test_word_listing_errors(text, column, message):
    with pytest.raises(AsmError) as err:
        read_word_listing(text)
    assert err.value.column == column and message in err.value.message


# -- round trips ------------------------------------------------------------------------

def _legal_value(field, form):
    constraint = next((c for c in form.constraints if c.field == field.name), None)
    if constraint is not None and constraint.op == "one-of":
        return st.sampled_from(constraint.values)
    values = st.integers(0, field.value_mask).map(lambda v: v & field.value_mask)
    if constraint is not None:
        values = values.filter(constraint.holds)
    return values


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.form_id)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_legal_field_assignment_round_trips(form, data):
    fields = {f.name: data.draw(_legal_value(f, form), label=f.name)
              for f in form.fields if not f.word_mask & form.mask}
    word = isa.encode(form, fields)
    assume(isa.find_form(word, form.length) is form)      # not captured by a narrower form
    text = disassemble_word(word, form.length)
    hint_without_branch = form.mnemonic == "B.HINT" and fields.get("V") == 0 \
        and fields.get("L/UL") == 1
    assert text.startswith(".") == hint_without_branch, text
    (instr,) = assemble(text)
    assert (instr.word, instr.length) == (word, form.length), text


_LENGTH_OF_LOW = st.sampled_from([16, 32, 48, 64])


@st.composite
def r15_words(draw):
    """A random word whose first parcel agrees with its length (rule R15)."""
    length = draw(_LENGTH_OF_LOW)
    word = draw(st.integers(0, (1 << length) - 1))
    low = {16: 0x0, 32: 0x1, 48: 0xE, 64: 0xF}[length]
    if length == 16:
        word &= ~1
        if word & 0xF == 0xE:
            word ^= 0x2
    elif length == 32:
        word |= 1
        if word & 0xF == 0xF:
            word ^= 0x2
    else:
        word = (word & ~0xF) | low
    return word, length


def _words_hitting_forms():
    # Random fields on top of a real form's match value reach every decoder path.
    return st.builds(lambda form, noise: (form.match | (noise & ~form.mask & ((1 << form.length) - 1)),
                                          form.length),
                     st.sampled_from([f for f in FORMS if f.mnemonic != "BSTART.CALL"]),
                     st.integers(0, (1 << 64) - 1))


@settings(max_examples=200, deadline=None)
@given(st.one_of(r15_words(), _words_hitting_forms()))
def test_any_word_round_trips_through_text(item):
    word, length = item
    assert isa.length_of(word & 0xFFFF) == length
    (instr,) = assemble(disassemble_word(word, length))
    assert (instr.word, instr.length) == (word, length)


def _parcel_round_trip(parcels):
    for parcel in parcels:
        if isa.length_of(parcel) != 16:
            continue
        (instr,) = assemble(disassemble_word(parcel, 16))
        assert instr.word == parcel


def test_sixteen_bit_parcels_round_trip_strided():
    _parcel_round_trip(range(0, 1 << 16, 7))


@pytest.mark.slow
def test_every_sixteen_bit_parcel_round_trips():
    _parcel_round_trip(range(1 << 16))


@pytest.mark.slow
def test_any_word_round_trips_through_text_sweep():
    rng = random.Random(2024)
    forms = [f for f in FORMS if f.mnemonic != "BSTART.CALL"]
    for _ in range(100000):
        form = rng.choice(forms)
        word = form.match | (rng.getrandbits(form.length) & ~form.mask)
        (instr,) = assemble(disassemble_word(word, form.length))
        assert (instr.word, instr.length) == (word, form.length)
