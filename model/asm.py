"""Assembler and disassembler for PTO bundle assembly (``ptocube asm`` / ``ptocube disasm``).

The syntax is the spec's (catalog assembly templates; see ``docs/assembly.md``): one
instruction per line, ``;`` separates instructions on a line, ``#`` starts a comment
(when it begins a line or follows white space, so ``M#1`` is a tile selector), and
``.2byte``/``.4byte``/``.6byte``/``.8byte`` emit raw words.  Mnemonics and names are
case-insensitive; the disassembler prints the canonical spelling, which assembles
back to the same word.

Every one of the 74 command forms of :mod:`ptocube.model.isa` has a spelling.  A
word the disassembler cannot express (it decodes to no form, fails a constraint,
uses a named encoding variant, or sets bits that the form ignores) is printed as a
raw directive with a comment saying why.
"""

import argparse
import re
import sys
from dataclasses import dataclass

from . import isa
from .faults import PTOFault
from .isa import (BRANCH_TYPE_NAMES, CMODE_NAMES, DATATYPE_NAMES, FORMS, FORMS_BY_ID,
                  GPR_NAMES, GROUP_N_COLUMNS, HANDS, HINT_TEMP_NAMES, LAYOUT_NAMES,
                  LOCAL_SIZE_BYTES, PAD_NAMES, PEMODE_OF_MASK, PREQUANT_MODES, REG5_NAMES,
                  RELU_NAMES, RMODE_NAMES, SHARED_SIZE_BYTES, TEPL_OPERATIONS, Role,
                  bytes_to_parcels, mask_text, match_form, parcels_to_bytes, parcels_to_words,
                  pe_mask_of_pemode, tepl_selector, words_to_parcels)

__all__ = ["Instr", "AsmError", "assemble", "disassemble_word", "disassemble",
           "format_word", "read_word_listing", "words_to_parcels", "parcels_to_words",
           "add_asm_arguments", "run_asm", "add_disasm_arguments", "run_disasm", "read_input",
           "read_words", "InputError"]


@dataclass(frozen=True)
class Instr:
    """One assembled instruction: its word, length in bits and where it came from."""
    word: int
    length: int
    line: int          # 1-based source line
    source: str = ""   # the statement text

    @property
    def value(self) -> int:
        return self.word

    @property
    def hex(self) -> str:
        return format_word(self.word, self.length)


class AsmError(ValueError):
    """Malformed assembly or word listing; ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(f"{line}:{column}: {message}")
        self.message = message
        self.line = line
        self.column = column

    def format(self, filename: str) -> str:
        """The ``FILE:LINE:COLUMN: message`` form used on the command line."""
        return f"{filename}:{self.line}:{self.column}: {self.message}"


def format_word(word: int, length: int) -> str:
    """``0x`` and exactly ``length / 4`` lowercase hex digits."""
    return f"0x{word:0{length // 4}x}"


# ---------------------------------------------------------------------------
# Tokens and statements
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tok:
    text: str
    col: int           # 1-based column of the first character


class _Stmt:
    """One statement being assembled: raises AsmError at a token or at its end."""

    def __init__(self, line: int, mnemonic: _Tok, operand_text: str, operand_col: int,
                 end_col: int):
        self.line = line
        self.mnemonic = mnemonic
        self.end_col = end_col
        self.ops = _split_operands(operand_text, operand_col, self)

    def fail(self, message: str, tok: _Tok | None = None):
        raise AsmError(message, self.line, tok.col if tok is not None else self.end_col)

    def expect(self, ops, count: int, what: str):
        """Check the operand count; ``what`` lists the operands for the message."""
        if len(ops) < count:
            self.fail(f"missing operand: {self.mnemonic.text} expects {what}")
        if len(ops) > count:
            self.fail(f"too many operands: {self.mnemonic.text} expects {what}", ops[count])


def _split_operands(text: str, col: int, stmt: _Stmt) -> list:
    """Split at commas outside braces/brackets, keeping each operand's column."""
    def piece(start, end):
        raw = text[start:end]
        if not raw.strip():
            raise AsmError("empty operand", stmt.line, col + start)
        return _Tok(raw.strip(), col + start + len(raw) - len(raw.lstrip()))

    ops, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            ops.append(piece(start, i))
            start = i + 1
    if ops or text.strip():
        ops.append(piece(start, len(text)))
    return ops


def _unwrap(stmt: _Stmt, ops: list, opener: str, closer: str) -> list:
    """Operands of ``{a, b}`` (or ``[a, b]``) given as one group; unbracketed input passes."""
    if len(ops) == 1 and ops[0].text.startswith(opener):
        tok = ops[0]
        if not tok.text.endswith(closer):
            stmt.fail(f"missing '{closer}'", tok)
        return _split_operands(tok.text[1:-1], tok.col + 1, stmt)
    return ops


def _statements(text: str):
    """Yield (line number, statement text, column of its first character)."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        code = line[:_comment_start(line)]
        start = 0
        for part in code.split(";"):
            if part.strip():
                lead = len(part) - len(part.lstrip())
                yield line_no, part.strip(), start + lead + 1
            start += len(part) + 1


def _comment_start(line: str) -> int:
    # '#' inside a selector such as M#1 follows a letter; a comment follows a blank.
    for i, ch in enumerate(line):
        if ch == "#" and (i == 0 or line[i - 1] in " \t;"):
            return i
    return len(line)


# ---------------------------------------------------------------------------
# Operand parsers
# ---------------------------------------------------------------------------

_NUMBER = re.compile(r"([+-]?)(0[xX][0-9a-fA-F]+|0[bB][01]+|[0-9]+)$")


def _number(stmt, tok, what: str, lo: int, hi: int) -> int:
    m = _NUMBER.match(tok.text)
    if not m:
        stmt.fail(f"expected a number for {what}, got {tok.text!r}", tok)
    digits = m.group(2).lower()
    base = 16 if digits.startswith("0x") else 2 if digits.startswith("0b") else 10
    value = int(digits[2:] if base != 10 else digits, base)
    if m.group(1) == "-":
        value = -value
    if not lo <= value <= hi:
        stmt.fail(f"value {tok.text} out of range for {what} ({lo}..{hi})", tok)
    return value


def _field_number(stmt, tok, form, name) -> int:
    """A number for field ``name``: its full range (signed fields two's complement)."""
    f = form.field(name)
    if f.signed:
        return _number(stmt, tok, name, -(1 << (f.width - 1)), (1 << (f.width - 1)) - 1)
    value = _number(stmt, tok, name, 0, f.value_mask)
    if value & ~f.value_mask:
        stmt.fail(f"value {tok.text} is not encodable for {name} ({f.describe_range()})", tok)
    return value


def _name(stmt, tok, table: dict, what: str, *, numbers: bool = False, aliases=None) -> int:
    """A code from ``table`` (code -> name) by case-insensitive name (or number)."""
    key = tok.text.lower()
    for code, name in table.items():
        if name.lower() == key:
            return code
    if aliases and key in aliases:
        return aliases[key]
    if numbers and _NUMBER.match(tok.text):
        value = _number(stmt, tok, what, -(1 << 30), 1 << 30)
        if value in table:
            return value
        stmt.fail(f"{what} {value} is reserved (legal: {', '.join(map(str, table))})", tok)
    names = ", ".join(table.values())
    stmt.fail(f"expected {what} ({names}), got {tok.text!r}", tok)


_GPR_BY_NAME = {name: code for code, name in enumerate(GPR_NAMES)}
_REG5_BY_NAME = {name: code for code, name in enumerate(REG5_NAMES)}


def _register(stmt, tok, limit: int = 24) -> int:
    """A GPR (``zero``, ``sp``, ``a0``.., or ``R0``..) or, with limit 32, a Reg5 selector."""
    key = tok.text.lower()
    table = _REG5_BY_NAME if limit == 32 else _GPR_BY_NAME
    if key in table:
        return table[key]
    m = re.fullmatch(r"r(\d+)", key)
    if m:
        value = int(m.group(1))
        if value < limit:
            return value
        stmt.fail(f"register {tok.text} out of range (R0..R{limit - 1})", tok)
    extra = ", t#1-t#4, u#1-u#4" if limit == 32 else ""
    stmt.fail(f"expected a register (zero, sp, a0-a7, ra, s0-s8, x0-x3{extra} or "
              f"R0-R{limit - 1}), got {tok.text!r}", tok)


def _gpr_name(code: int) -> str:
    return GPR_NAMES[code]


def _selector(stmt, tok) -> int:
    m = re.fullmatch(r"([TUMN])#(\d+)", tok.text, re.IGNORECASE)
    if not m:
        stmt.fail(f"expected a tile selector (T#n, U#n, M#n or N#n), got {tok.text!r}", tok)
    n = int(m.group(2))
    if not 1 <= n <= 16:
        stmt.fail(f"tile selector {tok.text} out of range (#1..#16)", tok)
    return HANDS.index(m.group(1).upper()) * 16 + n - 1


def _selector_text(code: int) -> str:
    return f"{HANDS[code >> 4]}#{(code & 0xF) + 1}"


_ENCODABLE_MASKS = ", ".join(mask_text(pe_mask_of_pemode(m)) for m in range(8))


def _pe_mode(stmt, tok) -> int:
    m = re.fullmatch(r"mask\s*=\s*(\S*)", tok.text, re.IGNORECASE)
    if not m or not re.fullmatch(r"[01]{4}", m.group(1)):
        stmt.fail(f"expected mask=PPPP (four binary digits, PE0 first), got {tok.text!r}", tok)
    mask = int(m.group(1), 2)
    if mask not in PEMODE_OF_MASK:
        stmt.fail(f"unencodable PE mask {m.group(1)} (encodable masks: {_ENCODABLE_MASKS})", tok)
    return PEMODE_OF_MASK[mask]


_SIZE_UNITS = {"b": 1, "kib": 1024}


def _size_code(stmt, tok, text: str, table: dict) -> int:
    """A SizeCode written as ``<code>`` (decimal) or as bytes (``<256B>``, ``<1KiB>``)."""
    m = re.fullmatch(r"\s*(\d+)\s*(b|kib)?\s*", text, re.IGNORECASE)
    if not m:
        stmt.fail(f"expected <SizeCode> or <bytes> such as <256B> or <1KiB>, got <{text}>", tok)
    if m.group(2) is None:
        code = int(m.group(1), 10)
        if code not in table:
            stmt.fail(f"SizeCode {code} out of range (1..{max(table)})", tok)
        return code
    size = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    for code, nbytes in table.items():
        if nbytes == size:
            return code
    stmt.fail(f"size {text} is not encodable (128B .. {table[max(table)] // 1024}KiB, "
              f"powers of two)", tok)


def _data_type(stmt, tok, form) -> int:
    allowed = next((c.values for c in form.constraints if c.field == "DataType"), ())
    table = {code: name for code, name in DATATYPE_NAMES.items() if code in allowed}
    return _name(stmt, tok, table, "a DataType")


def _flag(stmt, tok, what: str) -> int:
    return _number(stmt, tok, what, 0, 1)


def _lb_target(stmt, tok) -> int:
    m = re.fullmatch(r"->\s*LB([0-9]+)", tok.text, re.IGNORECASE)
    if not m or int(m.group(1)) > 2:
        stmt.fail(f"expected ->LB0, ->LB1 or ->LB2, got {tok.text!r}", tok)
    return int(m.group(1))


# ---------------------------------------------------------------------------
# Syntax table: mnemonic -> parser, form id -> formatter
# ---------------------------------------------------------------------------

_PARSERS = {}      # upper-case mnemonic -> fn(stmt, ops) -> (form, fields)
_FORMATTERS = {}   # form id -> fn(form, fields, word) -> text


class _Unprintable(Exception):
    """The word decodes but has no assembly spelling; the message says why."""


def _forms_named(mnemonic: str) -> list:
    return [f for f in FORMS if f.mnemonic == mnemonic]


def _parser(*mnemonics):
    def register(fn):
        for m in mnemonics:
            _PARSERS[m] = fn
        return fn
    return register


def _formatter(*mnemonics):
    def register(fn):
        for m in mnemonics:
            for form in _forms_named(m):
                _FORMATTERS[form.form_id] = fn
        return fn
    return register


# -- typed starts: BSTART.TMATMUL FP16, BSTART.TLOAD U8, ... -----------------

_TYPED_STARTS = [f.mnemonic for f in FORMS
                 if f.field_names == ("DataType",) and f.mnemonic.startswith("BSTART.")]


@_parser(*_TYPED_STARTS)
def _parse_typed_start(stmt, ops):
    form = _forms_named(stmt.mnemonic.text.upper())[0]
    stmt.expect(ops, 1, "a DataType")
    return form, {"DataType": _data_type(stmt, ops[0], form)}


@_formatter(*_TYPED_STARTS)
def _format_typed_start(form, fields, word):
    variant = form.encodings[form.variant_of(word)]
    if variant.name:
        raise _Unprintable(f"{form.mnemonic} encoding variant {variant.name} (function "
                           f"{variant.function}) has no assembly spelling")
    return f"{form.mnemonic} {DATATYPE_NAMES[fields['DataType']]}"


# -- TEPL: BSTART.SFU TIMG2COL, FP16 / BSTART.TEPL 3, 4, FP16 ----------------

_TEPL = FORMS_BY_ID["bstart_tepl_32_d022db6dacb3"]
_TEPL_BY_NAME = {name: (sel, engine) for sel, (name, engine) in TEPL_OPERATIONS.items()}


@_parser("BSTART.TEPL")
def _parse_tepl(stmt, ops):
    stmt.expect(ops, 3, "Mode, Function, DataType")
    mode = _number(stmt, ops[0], "Mode", 0, 3)
    function = _number(stmt, ops[1], "Function", 0, 31)
    return _TEPL, {"Mode": mode, "Function": function,
                   "DataType": _data_type(stmt, ops[2], _TEPL)}


@_parser("BSTART.SFU", "BSTART.VEC")
def _parse_tepl_alias(stmt, ops):
    engine = stmt.mnemonic.text.upper().split(".")[1]
    stmt.expect(ops, 2, "a TileOp name and a DataType")
    entry = _TEPL_BY_NAME.get(ops[0].text.upper())
    if entry is None:
        stmt.fail(f"expected a TEPL operation name such as TIMG2COL, got {ops[0].text!r}", ops[0])
    selector, op_engine = entry
    if op_engine != engine:
        stmt.fail(f"{ops[0].text.upper()} runs on the {op_engine} engine: write "
                  f"BSTART.{op_engine}", ops[0])
    return _TEPL, {"Mode": selector >> 5, "Function": selector & 0x1F,
                   "DataType": _data_type(stmt, ops[1], _TEPL)}


@_formatter("BSTART.TEPL")
def _format_tepl(form, fields, word):
    dtype = DATATYPE_NAMES[fields["DataType"]]
    selector = tepl_selector(fields["Mode"], fields["Function"])
    if selector in TEPL_OPERATIONS:
        name, engine = TEPL_OPERATIONS[selector]
        return f"BSTART.{engine} {name}, {dtype}"
    return f"BSTART.TEPL {fields['Mode']}, {fields['Function']}, {dtype}"


# -- branch-style starts: BSTART.STD FALL, BSTART DIRECT, -8, C.BSTART.FP RET, ... --

_KEYWORD_STARTS = ("BSTART", "BSTART.STD", "BSTART.FP", "BSTART.SYS", "C.BSTART")


def _keyword_of(form) -> str:
    return form.asm.split()[1].rstrip(",")


def _offset_field(form):
    """The branch offset field written as an operand (FALL forms fix it to 0)."""
    if form.fields and not form.constraints:
        return form.fields[0]
    return None


@_parser(*_KEYWORD_STARTS)
def _parse_keyword_start(stmt, ops):
    mnemonic = stmt.mnemonic.text.upper()
    forms = {_keyword_of(f): f for f in _forms_named(mnemonic)}
    if not ops:
        stmt.fail(f"missing operand: {mnemonic} expects one of {', '.join(forms)}")
    form = forms.get(ops[0].text.upper())
    if form is None:
        stmt.fail(f"expected one of {', '.join(forms)} after {mnemonic}, got {ops[0].text!r}",
                  ops[0])
    offset = _offset_field(form)
    if offset is None:
        stmt.expect(ops, 1, _keyword_of(form))
        return form, {}
    stmt.expect(ops, 2, f"{_keyword_of(form)}, <{offset.name}>")
    return form, {offset.name: _field_number(stmt, ops[1], form, offset.name)}


@_formatter(*_KEYWORD_STARTS)
def _format_keyword_start(form, fields, word):
    offset = _offset_field(form)
    text = f"{form.mnemonic} {_keyword_of(form)}"
    if offset is not None:
        text += f", {offset.to_signed(fields[offset.name])}"
    return text


@_parser("C.BSTART.STD", "C.BSTART.FP")
def _parse_compressed_start(stmt, ops):
    form = _forms_named(stmt.mnemonic.text.upper())[0]
    stmt.expect(ops, 1, "FALL, IND or RET")
    return form, {"BrType": _name(stmt, ops[0], BRANCH_TYPE_NAMES, "a branch type")}


@_formatter("C.BSTART.STD", "C.BSTART.FP")
def _format_compressed_start(form, fields, word):
    return f"{form.mnemonic} {BRANCH_TYPE_NAMES[fields['BrType']]}"


@_parser("C.BSTART.SYS")
def _parse_compressed_sys(stmt, ops):
    stmt.expect(ops, 1, "FALL")
    if ops[0].text.upper() != "FALL":
        stmt.fail(f"expected FALL, got {ops[0].text!r}", ops[0])
    return _forms_named("C.BSTART.SYS")[0], {}


@_formatter("C.BSTART.SYS")
def _format_compressed_sys(form, fields, word):
    return "C.BSTART.SYS FALL"


def _arrow_ra(stmt, tok):
    if tok.text.replace(" ", "").lower() != "->ra":
        stmt.fail(f"expected ->ra, got {tok.text!r}", tok)


@_parser("BSTART.CALL")
def _parse_call(stmt, ops):
    form = _forms_named("BSTART.CALL")[0]
    stmt.expect(ops, 3, "<simm12>, <uimm5>, ->ra")
    _arrow_ra(stmt, ops[2])
    return form, {"simm12": _field_number(stmt, ops[0], form, "simm12"),
                  "uimm5": _field_number(stmt, ops[1], form, "uimm5")}


@_formatter("BSTART.CALL")
def _format_call(form, fields, word):
    return (f"BSTART.CALL {form.field('simm12').to_signed(fields['simm12'])}, "
            f"{fields['uimm5']}, ->ra")


@_parser("BSTART.ICALL")
def _parse_icall(stmt, ops):
    form = _forms_named("BSTART.ICALL")[0]
    stmt.expect(ops, 2, "<uimm5>, ->ra")
    _arrow_ra(stmt, ops[1])
    return form, {"uimm5": _field_number(stmt, ops[0], form, "uimm5")}


@_formatter("BSTART.ICALL")
def _format_icall(form, fields, word):
    return f"BSTART.ICALL {fields['uimm5']}, ->ra"


# -- stops ---------------------------------------------------------------------

@_parser("BSTOP", "C.BSTOP", "L.BSTOP")
def _parse_stop(stmt, ops):
    stmt.expect(ops, 0, "no operands")
    return _forms_named(stmt.mnemonic.text.upper())[0], {}


@_formatter("BSTOP", "C.BSTOP", "L.BSTOP")
def _format_stop(form, fields, word):
    return form.mnemonic


# -- B.CATR {trap, atomic, aqrl, far, dr} ----------------------------------------

_CATR_FLAGS = {"trap": ("trap",), "atomic": ("atom",), "atom": ("atom",), "aq": ("aq",),
               "rl": ("rl",), "aqrl": ("aq", "rl"), "far": ("far",), "dr": ("DR",)}


@_parser("B.CATR")
def _parse_catr(stmt, ops):
    ops = _unwrap(stmt, ops, "{", "}")
    fields = {}
    for tok in ops:
        names = _CATR_FLAGS.get(tok.text.lower())
        if names is None:
            stmt.fail(f"expected a B.CATR flag (trap, atomic, aq, rl, aqrl, far, dr), "
                      f"got {tok.text!r}", tok)
        for name in names:
            if name in fields:
                stmt.fail(f"B.CATR flag {tok.text} given twice", tok)
            fields[name] = 1
    return _forms_named("B.CATR")[0], fields


@_formatter("B.CATR")
def _format_catr(form, fields, word):
    flags = [name for name, key in (("trap", "trap"), ("atomic", "atom")) if fields[key]]
    if fields["aq"] and fields["rl"]:
        flags.append("aqrl")
    else:
        flags += [key for key in ("aq", "rl") if fields[key]]
    flags += [name for name, key in (("far", "far"), ("dr", "DR")) if fields[key]]
    return "B.CATR {" + ", ".join(flags) + "}"


# -- B.HINT {BR.likely, TEMP.hot, 64} / B.HINT TRACE.begin -----------------------

@_parser("B.HINT")
def _parse_hint(stmt, ops):
    if len(ops) == 1 and ops[0].text.upper() in ("TRACE.BEGIN", "TRACE.END"):
        return _forms_named("B.HINT")[1], {"B/E": int(ops[0].text.upper() == "TRACE.END")}
    fields = {}
    for tok in _unwrap(stmt, ops, "{", "}"):
        key = tok.text.lower()
        if key in ("br.likely", "br.unlikely"):
            slot, values = "V", {"V": 1, "L/UL": int(key == "br.likely")}
        elif key.startswith("temp."):
            slot, values = "temp", {"temp": _name(stmt, _Tok(key[5:], tok.col + 5),
                                                  HINT_TEMP_NAMES, "a temperature")}
        elif _NUMBER.match(tok.text):
            slot, values = "prefetch_size", {"prefetch_size": _number(stmt, tok, "PRFSIZE",
                                                                      0, 4095)}
        else:
            stmt.fail(f"expected BR.likely, BR.unlikely, TEMP.<hot|warm|cool|none>, a prefetch "
                      f"size or TRACE.begin/TRACE.end, got {tok.text!r}", tok)
        if slot in fields:
            stmt.fail(f"B.HINT item {tok.text} given twice", tok)
        fields.update(values)
    return _forms_named("B.HINT")[0], fields


@_formatter("B.HINT")
def _format_hint(form, fields, word):
    if form.role is Role.TRACE_START:
        return "B.HINT TRACE.end" if fields["B/E"] else "B.HINT TRACE.begin"
    items = []
    if fields["V"]:
        items.append("BR.likely" if fields["L/UL"] else "BR.unlikely")
    elif fields["L/UL"]:
        raise _Unprintable("B.HINT with L/UL = 1 but no valid branch hint (V = 0) has no "
                           "assembly spelling")
    if fields["temp"]:
        items.append("TEMP." + HINT_TEMP_NAMES[fields["temp"]])
    if fields["prefetch_size"]:
        items.append(str(fields["prefetch_size"]))
    return "B.HINT {" + ", ".join(items) + "}"


# -- B.DATR {NORM, BF16, Zero, EQ, Default, 0, 0} --------------------------------

_DATR = _forms_named("B.DATR")[0]


@_parser("B.DATR")
def _parse_datr(stmt, ops):
    ops = _unwrap(stmt, ops, "{", "}")
    stmt.expect(ops, 7, "{Layout, DataType, PadValueOrByteId, CMode, RMode, Sat, Canonicalize}")
    return _DATR, {
        "Layout": _name(stmt, ops[0], LAYOUT_NAMES, "a Layout", numbers=True),
        "DataType": _data_type(stmt, ops[1], _DATR),
        "PadValueOrByteId": _name(stmt, ops[2], PAD_NAMES, "a PadValueOrByteId", numbers=True),
        "CMode": _name(stmt, ops[3], CMODE_NAMES, "a CMode", numbers=True),
        "RMode": _name(stmt, ops[4], RMODE_NAMES, "an RMode", numbers=True,
                       aliases={"none": 0}),
        "Sat": _flag(stmt, ops[5], "Sat"),
        "Canonicalize": _flag(stmt, ops[6], "Canonicalize"),
    }


@_formatter("B.DATR")
def _format_datr(form, fields, word):
    return (f"B.DATR {{{LAYOUT_NAMES[fields['Layout']]}, {DATATYPE_NAMES[fields['DataType']]}, "
            f"{PAD_NAMES[fields['PadValueOrByteId']]}, {CMODE_NAMES[fields['CMode']]}, "
            f"{RMODE_NAMES[fields['RMode']]}, {fields['Sat']}, {fields['Canonicalize']}}}")


# -- B.FPATR PreQuantMode, ReluMode, GroupNCode, RowMaxEn, GroupMaxEn, RowMaxInit, MaxAbsEn,
#    TransA, TransB ---------------------------------------------------------------------

_FPATR = _forms_named("B.FPATR")[0]
_FPATR_FLAGS = ("RowMaxEn", "GroupMaxEn", "RowMaxInit", "MaxAbsEn", "TransA", "TransB")


@_parser("B.FPATR")
def _parse_fpatr(stmt, ops):
    stmt.expect(ops, 9, "PreQuantMode, ReluMode, GroupNCode, RowMaxEn, GroupMaxEn, "
                        "RowMaxInit, MaxAbsEn, TransA, TransB")
    if ops[0].text.lower() == "none":
        pq = 0
    else:
        pq = _number(stmt, ops[0], "PreQuantMode", 0, 63)
        if pq not in PREQUANT_MODES:
            stmt.fail(f"PreQuantMode {pq} is reserved (legal: "
                      f"{', '.join(map(str, sorted(PREQUANT_MODES)))})", ops[0])
    fields = {"PreQuantMode": pq,
              "ReluMode": _name(stmt, ops[1], RELU_NAMES, "a ReluMode", numbers=True),
              "GroupNCode": _number(stmt, ops[2], "GroupNCode", 0, max(GROUP_N_COLUMNS))}
    for name, tok in zip(_FPATR_FLAGS, ops[3:]):
        fields[name] = _flag(stmt, tok, name)
    return _FPATR, fields


@_formatter("B.FPATR")
def _format_fpatr(form, fields, word):
    pq = "None" if fields["PreQuantMode"] == 0 else str(fields["PreQuantMode"])
    flags = ", ".join(str(fields[name]) for name in _FPATR_FLAGS)
    return (f"B.FPATR {pq}, {RELU_NAMES[fields['ReluMode']]}, {fields['GroupNCode']}, "
            f"{flags}")


# -- B.DIM zero, 256, ->LB2 / C.B.DIMI 64, ->LB1 --------------------------------------

_DIM_BY_LB = {isa.dim_lb_index(f): f for f in _forms_named("B.DIM")}


@_parser("B.DIM")
def _parse_dim(stmt, ops):
    stmt.expect(ops, 3, "RegSrc, uimm17, ->LBn")
    form = _DIM_BY_LB[_lb_target(stmt, ops[2])]
    return form, {"RegSrc": _register(stmt, ops[0]),
                  "uimm17": _number(stmt, ops[1], "uimm17", 0, (1 << 17) - 1)}


@_formatter("B.DIM")
def _format_dim(form, fields, word):
    return (f"B.DIM {_gpr_name(fields['RegSrc'])}, {fields['uimm17']}, "
            f"->LB{isa.dim_lb_index(form)}")


@_parser("C.B.DIMI")
def _parse_dimi(stmt, ops):
    stmt.expect(ops, 2, "imm8, ->LBn")
    return _forms_named("C.B.DIMI")[0], {"imm8": _number(stmt, ops[0], "imm8", 0, 255),
                                         "LoopNest": _lb_target(stmt, ops[1])}


@_formatter("C.B.DIMI")
def _format_dimi(form, fields, word):
    return f"C.B.DIMI {fields['imm8']}, ->LB{fields['LoopNest']}"


# -- B.IOT M#1, N#1, mask=1111, last, ->T<2> -----------------------------------------

_IOT_FORMS = {(f.field_names.count("SrcTile0") + f.field_names.count("SrcTile1"),
               "DstTile" in f.field_names): f for f in _forms_named("B.IOT")}


@_parser("B.IOT")
def _parse_iot(stmt, ops):
    sources, pe_mode, last, dest = [], None, None, None
    for tok in ops:
        low = tok.text.lower()
        if low.startswith("mask"):
            if pe_mode is not None:
                stmt.fail("mask= given twice", tok)
            pe_mode = _pe_mode(stmt, tok)
        elif low in ("last", "<last>"):
            if last is not None:
                stmt.fail("last given twice", tok)
            last = tok
        elif low.startswith("->"):
            if dest is not None:
                stmt.fail("B.IOT takes one destination", tok)
            m = re.fullmatch(r"->\s*([TUMN])\s*<([^>]*)>", tok.text, re.IGNORECASE)
            if not m:
                stmt.fail(f"expected a destination ->H<SizeCode> (H = T, U, M or N), "
                          f"got {tok.text!r}", tok)
            dest = (HANDS.index(m.group(1).upper()),
                    _size_code(stmt, tok, m.group(2), LOCAL_SIZE_BYTES))
        else:
            if pe_mode is not None or last is not None or dest is not None:
                stmt.fail(f"unexpected operand {tok.text!r}: source tiles come first", tok)
            if len(sources) == 2:
                stmt.fail("B.IOT takes at most two source tiles", tok)
            sources.append(_selector(stmt, tok))
    if pe_mode is None:
        stmt.fail("missing operand: B.IOT expects mask=PPPP")
    if not sources and dest is None:
        stmt.fail("B.IOT needs a source tile or a destination ->H<SizeCode>")
    form = _IOT_FORMS[(len(sources), dest is not None)]
    fields = {"PEMode": pe_mode, "L": int(last is not None)}
    for name, code in zip(("SrcTile0", "SrcTile1"), sources):
        fields[name] = code
    if dest is not None:
        fields["DstTile"], fields["SizeCode"] = dest
    return form, fields


@_formatter("B.IOT")
def _format_iot(form, fields, word):
    if "DstTile" not in fields and (word >> 7) & 0b11:
        raise _Unprintable("bits 8:7 of a source-only B.IOT are not part of its encoding "
                           "(ignored when decoding) and have no assembly spelling")
    parts = [_selector_text(fields[name]) for name in ("SrcTile0", "SrcTile1") if name in fields]
    parts.append("mask=" + mask_text(pe_mask_of_pemode(fields["PEMode"])))
    if fields["L"]:
        parts.append("last")
    if "DstTile" in fields:
        parts.append(f"->{HANDS[fields['DstTile']]}<{fields['SizeCode']}>")
    return "B.IOT " + ", ".join(parts)


# -- B.IOS S77, mask=1111 / B.IOS mask=1111, ->S5<3> --------------------------------

_IOS = _forms_named("B.IOS")[0]


def _shared_id(stmt, tok, text: str) -> int:
    m = re.fullmatch(r"S(\d+)", text, re.IGNORECASE)
    if not m:
        stmt.fail(f"expected a Shared tile S0..S255, got {text!r}", tok)
    value = int(m.group(1))
    if value > 255:
        stmt.fail(f"Shared tile {text} out of range (S0..S255)", tok)
    return value


@_parser("B.IOS")
def _parse_ios(stmt, ops):
    stmt.expect(ops, 2, "S<id>, mask=PPPP or mask=PPPP, ->S<id><SizeCode>")
    if ops[0].text.lower().startswith("mask"):
        pe_mode = _pe_mode(stmt, ops[0])
        m = re.fullmatch(r"->\s*(S\d+)\s*<([^>]*)>", ops[1].text, re.IGNORECASE)
        if not m:
            stmt.fail(f"expected a Shared destination ->S<id><SizeCode>, got {ops[1].text!r}",
                      ops[1])
        return _IOS, {"PEMode": pe_mode, "SharedTID": _shared_id(stmt, ops[1], m.group(1)),
                      "SizeCode": _size_code(stmt, ops[1], m.group(2), SHARED_SIZE_BYTES)}
    return _IOS, {"SharedTID": _shared_id(stmt, ops[0], ops[0].text), "SizeCode": 0,
                  "PEMode": _pe_mode(stmt, ops[1])}


@_formatter("B.IOS")
def _format_ios(form, fields, word):
    mask = "mask=" + mask_text(pe_mask_of_pemode(fields["PEMode"]))
    if fields["SizeCode"] == 0:
        return f"B.IOS S{fields['SharedTID']}, {mask}"
    return f"B.IOS {mask}, ->S{fields['SharedTID']}<{fields['SizeCode']}>"


# -- B.IOR a0, a1[, a2][, ->rd] ------------------------------------------------------

_IOR = _forms_named("B.IOR")[0]


@_parser("B.IOR")
def _parse_ior(stmt, ops):
    fields = {"RegSrc0": 0, "RegSrc1": 0, "RegSrc2": 0, "RegDst": 0}
    sources = ops
    if ops and ops[-1].text.startswith("->"):
        sources = ops[:-1]
        tok = ops[-1]
        fields["RegDst"] = _register(stmt, _Tok(tok.text[2:].strip(), tok.col + 2))
    if len(sources) > 3:
        stmt.fail("B.IOR takes at most three source registers", sources[3])
    for i, tok in enumerate(sources):
        if tok.text.startswith("->"):
            stmt.fail("the destination ->reg comes last", tok)
        fields[f"RegSrc{i}"] = _register(stmt, tok)
    return _IOR, fields


@_formatter("B.IOR")
def _format_ior(form, fields, word):
    sources = [fields[f"RegSrc{i}"] for i in range(3)]
    while sources and sources[-1] == 0:
        sources.pop()
    parts = [_gpr_name(code) for code in sources]
    if fields["RegDst"]:
        parts.append("->" + _gpr_name(fields["RegDst"]))
    return ("B.IOR " + ", ".join(parts)) if parts else "B.IOR"


# -- other commands (recognised, not executed by the CUBE unit) ----------------------

@_parser("ERCOV", "ESAVE", "MCOPY", "MSET")
def _parse_reg3(stmt, ops):
    form = _forms_named(stmt.mnemonic.text.upper())[0]
    ops = _unwrap(stmt, ops, "[", "]")
    stmt.expect(ops, 3, "[RegSrc0, RegSrc1, RegSrc2]")
    return form, {f"RegSrc{i}": _register(stmt, tok, 32) for i, tok in enumerate(ops)}


@_formatter("ERCOV", "ESAVE", "MCOPY", "MSET")
def _format_reg3(form, fields, word):
    regs = ", ".join(REG5_NAMES[fields[f"RegSrc{i}"]] for i in range(3))
    return f"{form.mnemonic} [{regs}]"


_FRAME_FORMS = ("FENTRY", "FEXIT", "FRET.RA", "FRET.STK")


@_parser(*_FRAME_FORMS)
def _parse_frame(stmt, ops):
    form = _forms_named(stmt.mnemonic.text.upper())[0]
    begin, end = form.field_names[:2]
    stmt.expect(ops, 3, "[first ~ last], sp!, <bytes>")
    m = re.fullmatch(r"\[\s*([^\s~]+)\s*~\s*([^\s\]]+)\s*\]", ops[0].text)
    if not m:
        stmt.fail(f"expected a register range [first ~ last], got {ops[0].text!r}", ops[0])
    if ops[1].text.replace(" ", "").lower() != "sp!":
        stmt.fail(f"expected sp!, got {ops[1].text!r}", ops[1])
    col = ops[0].col
    return form, {begin: _register(stmt, _Tok(m.group(1), col + m.start(1))),
                  end: _register(stmt, _Tok(m.group(2), col + m.start(2))),
                  "uimm": _field_number(stmt, ops[2], form, "uimm")}


@_formatter(*_FRAME_FORMS)
def _format_frame(form, fields, word):
    begin, end = form.field_names[:2]
    return (f"{form.mnemonic} [{_gpr_name(fields[begin])} ~ {_gpr_name(fields[end])}], sp!, "
            f"{fields['uimm']}")


# HL queue commands carry their flag bits as a mnemonic suffix, in this letter order.
_HL_FLAG_ORDER = {"HL.QMT": "iesr", "HL.QPOP": "er", "HL.QPUSH": "her"}


def _parse_hl_suffix(stmt, base: str, suffix: str) -> dict:
    order = _HL_FLAG_ORDER[base]
    if any(ch not in order for ch in suffix) or len(set(suffix)) != len(suffix) \
            or sorted(suffix, key=order.index) != list(suffix):
        stmt.fail(f"bad {base} suffix .{suffix}: use the letters {', '.join(order)} in that "
                  f"order, each at most once", stmt.mnemonic)
    return {ch: int(ch in suffix) for ch in order}


def _hl_mnemonic(form, fields) -> str:
    suffix = "".join(ch for ch in _HL_FLAG_ORDER[form.mnemonic] if fields[ch])
    return form.mnemonic + ("." + suffix.upper() if suffix else "")


def _hl_dest(stmt, tok) -> int:
    if not tok.text.startswith("->"):
        stmt.fail(f"expected ->register, got {tok.text!r}", tok)
    return _register(stmt, _Tok(tok.text[2:].strip(), tok.col + 2), 32)


@_parser(*_HL_FLAG_ORDER)
def _parse_hl(stmt, ops):
    base, _, suffix = stmt.mnemonic.text.upper().partition(".")[2].partition(".")
    base = "HL." + base
    flags = _parse_hl_suffix(stmt, base, suffix.lower()) if suffix else \
        {ch: 0 for ch in _HL_FLAG_ORDER[base]}
    form = _forms_named(base)[0]
    if base == "HL.QPOP":
        stmt.expect(ops, 3, "SrcL, ->RegDst0, RegDst1")
        return form, {**flags, "SrcL": _register(stmt, ops[0], 32),
                      "RegDst0": _hl_dest(stmt, ops[1]), "RegDst1": _register(stmt, ops[2], 32)}
    if base == "HL.QPUSH":
        stmt.expect(ops, 3, "SrcL, SrcR, ->RegDst")
        return form, {**flags, "SrcL": _register(stmt, ops[0], 32),
                      "SrcR": _register(stmt, ops[1], 32), "RegDst": _hl_dest(stmt, ops[2])}
    if len(ops) not in (2, 3):
        stmt.expect(ops, 2 if len(ops) < 2 else 3, "SrcL[, SrcR], ->RegDst")
    fields = {**flags, "SrcL": _register(stmt, ops[0], 32), "RegDst": _hl_dest(stmt, ops[-1])}
    fields["SrcR"] = _register(stmt, ops[1], 32) if len(ops) == 3 else 0
    return form, fields


@_formatter("HL.QMT", "HL.QPOP", "HL.QPUSH")
def _format_hl(form, fields, word):
    mnemonic = _hl_mnemonic(form, fields)
    src_l = REG5_NAMES[fields["SrcL"]]
    if form.mnemonic == "HL.QPOP":
        return (f"{mnemonic} {src_l}, ->{REG5_NAMES[fields['RegDst0']]}, "
                f"{REG5_NAMES[fields['RegDst1']]}")
    if form.mnemonic == "HL.QPUSH" or fields["i"] or fields["SrcR"]:
        src_l += ", " + REG5_NAMES[fields["SrcR"]]
    return f"{mnemonic} {src_l}, ->{REG5_NAMES[fields['RegDst']]}"


@_parser("XB")
def _parse_xb(stmt, ops):
    form = _forms_named("XB")[0]
    stmt.expect(ops, 2, "ACR-ID, C-ID")
    return form, {"ACR-ID": _field_number(stmt, ops[0], form, "ACR-ID"),
                  "CROSS-BID": _field_number(stmt, ops[1], form, "CROSS-BID")}


@_formatter("XB")
def _format_xb(form, fields, word):
    return f"XB {fields['ACR-ID']}, {fields['CROSS-BID']}"



_RAW_DIRECTIVES = {".2byte": 16, ".4byte": 32, ".6byte": 48, ".8byte": 64}
_RAW_OF_LENGTH = {length: name for name, length in _RAW_DIRECTIVES.items()}


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------

def assemble(text: str) -> list:
    """Assemble source text into a list of :class:`Instr`.

    Raises :class:`AsmError` (line and column of the offending token) on bad input.
    """
    out = []
    for line_no, stmt_text, col in _statements(text):
        m = re.match(r"\S+", stmt_text)
        mnemonic = _Tok(m.group(0), col)
        rest = stmt_text[m.end():]
        lead = len(rest) - len(rest.lstrip())
        stmt = _Stmt(line_no, mnemonic, rest.strip(), col + m.end() + lead,
                     col + len(stmt_text))
        word, length = _assemble_statement(stmt)
        out.append(Instr(word, length, line_no, stmt_text))
    return out


def _assemble_statement(stmt: _Stmt) -> tuple:
    key = stmt.mnemonic.text.upper()
    if key.lower() in _RAW_DIRECTIVES:
        return _assemble_raw(stmt, _RAW_DIRECTIVES[key.lower()])
    parser = _PARSERS.get(key)
    if parser is None and key.count(".") == 2 and key.rpartition(".")[0] in _HL_FLAG_ORDER:
        parser = _PARSERS[key.rpartition(".")[0]]        # HL queue command with flag suffix
    if parser is None:
        stmt.fail(f"unknown mnemonic {stmt.mnemonic.text!r}", stmt.mnemonic)
    form, fields = parser(stmt, stmt.ops)
    try:
        return isa.encode(form, fields), form.length
    except ValueError as err:
        stmt.fail(str(err), stmt.mnemonic)


def _assemble_raw(stmt: _Stmt, length: int) -> tuple:
    stmt.expect(stmt.ops, 1, "one value")
    tok = stmt.ops[0]
    value = _number(stmt, tok, stmt.mnemonic.text, 0, (1 << length) - 1)
    implied = isa.length_of(value & 0xFFFF)
    if implied != length:
        stmt.fail(f"{stmt.mnemonic.text} {tok.text} breaks the length rule: its first parcel "
                  f"implies a {implied}-bit instruction", tok)
    return value, length


def disassemble_word(word: int, length: int) -> str:
    """Canonical assembly of one instruction word.

    Words that decode to no form, fail a constraint, or have no spelling come out
    as a raw directive with a trailing comment (e.g. naming ``Fault_IllegalInstruction``).
    """
    raw = f"{_RAW_OF_LENGTH[length]} {format_word(word, length)}"
    try:
        form, fields = match_form(word, length)
    except PTOFault as fault:
        return f"{raw}  # {fault.fault.spec_name}: {fault.reason}"
    try:
        text = _FORMATTERS[form.form_id](form, fields, word)
    except _Unprintable as why:
        return f"{raw}  # {why}"
    if form.role is Role.TEPL_START and \
            tepl_selector(fields["Mode"], fields["Function"]) not in TEPL_OPERATIONS:
        text += "  # reserved TEPL selector: Fault_IllegalInstruction when executed"
    return text


def disassemble(words) -> list:
    """Disassemble ``(word, length)`` pairs (or Instr objects) into text lines."""
    return [disassemble_word(*isa.word_and_length(item)) for item in words]


def read_word_listing(text: str) -> list:
    """Parse the ``ptocube asm`` output format into :class:`Instr` objects.

    One ``0x`` word per line with 4, 8, 12 or 16 hex digits (the digit count gives
    the length); blank lines and ``#`` comments are ignored.
    """
    out = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        code = line[:_comment_start(line)]
        tokens = [(m.group(0), m.start() + 1) for m in re.finditer(r"\S+", code)]
        if not tokens:
            continue
        if len(tokens) > 1:
            raise AsmError("expected one instruction word per line", line_no, tokens[1][1])
        tok, col = tokens[0]
        m = re.fullmatch(r"0[xX]([0-9a-fA-F]+)", tok)
        if not m or len(m.group(1)) not in (4, 8, 12, 16):
            raise AsmError(f"expected 0x and 4, 8, 12 or 16 hex digits, got {tok!r}",
                           line_no, col)
        length = len(m.group(1)) * 4
        word = int(m.group(1), 16)
        implied = isa.length_of(word & 0xFFFF)
        if implied != length:
            raise AsmError(f"{tok} breaks the length rule: its first parcel implies a "
                           f"{implied}-bit instruction", line_no, col)
        out.append(Instr(word, length, line_no, tok))
    return out


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

class InputError(Exception):
    """An input file that cannot be read or parsed; the message is ready for the user."""


def read_input(path: str, binary: bool = False):
    """Read a file (``-`` for stdin) as text or bytes; returns (display name, contents)."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            return name, (sys.stdin.buffer.read() if binary else sys.stdin.read())
        with open(path, "rb" if binary else "r") as fh:
            return name, fh.read()
    except OSError as err:
        raise InputError(f"{name}: cannot read: {err.strerror}") from None


def _write_output(path: str | None, data):
    if path is None:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        else:
            sys.stdout.write(data)
        return
    with open(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)


def read_words(path: str, binary: bool) -> list:
    """Instruction words from a word listing or (``binary``) a little-endian parcel image.

    Raises AsmError (listing) or ValueError (image) with a message for the user.
    """
    name, data = read_input(path, binary)
    if binary:
        try:
            return [Instr(w, n, 0) for w, n in parcels_to_words(bytes_to_parcels(data))]
        except ValueError as err:
            raise InputError(f"{name}: {err}") from None
    try:
        return read_word_listing(data)
    except AsmError as err:
        raise InputError(err.format(name)) from None


def add_asm_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("file", help="assembly source file, or - for standard input")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")
    parser.add_argument("--bin", action="store_true",
                        help="write the little-endian 16-bit parcel image instead of hex words")


def run_asm(args) -> int:
    try:
        name, text = read_input(args.file)
        instrs = assemble(text)
    except InputError as err:
        print(err, file=sys.stderr)
        return 2
    except AsmError as err:
        print(err.format(name), file=sys.stderr)
        return 2
    if args.bin:
        _write_output(args.output, parcels_to_bytes(words_to_parcels(instrs)))
    else:
        _write_output(args.output, "".join(i.hex + "\n" for i in instrs))
    return 0


def add_disasm_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("file", help="instruction words (the `ptocube asm` format), or -")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")
    parser.add_argument("--bin", action="store_true",
                        help="the input is a little-endian 16-bit parcel image")


def run_disasm(args) -> int:
    try:
        instrs = read_words(args.file, args.bin)
    except InputError as err:
        print(err, file=sys.stderr)
        return 2
    _write_output(args.output, "".join(disassemble_word(i.word, i.length) + "\n"
                                       for i in instrs))
    return 0
