"""The PTO bundle-command ISA tables: the single source of truth for encodings.

Every instruction form that the bundle decoder must recognise is a :class:`Form`
row in :data:`FORMS`, transcribed from the specification's command catalog (74
forms, in catalog order): the twelve CUBE Matrix starts, the TEPL start that
carries TIMG2COL, the header commands (B.CATR, B.DATR, B.FPATR, B.DIM, C.B.DIMI,
B.HINT), the bindings (five B.IOT forms, B.IOS, B.IOR), every other bundle start
and stop, and the remaining command forms (which this unit does not execute but
must still recognise).

The tables are plain data so that the hardware decoder can generate its match
logic from them at elaboration time:

* a form matches a ``length``-bit word when ``word & encoding.mask ==
  encoding.match`` for one of its encodings (the primary one, or a named
  variant such as ``TMOV.L2S.INSERT``);
* a field is a tuple of :class:`Piece` ``(instruction_lsb, width, value_lsb)``:
  ``value |= ((word >> instruction_lsb) & (2**width - 1)) << value_lsb``;
* constraints are :class:`Constraint` rows (``one-of`` value lists or a
  ``not-equal`` value).

Decoding follows the catalog's priority order (:data:`DECODE_ORDER`: decreasing
mask popcount, ties broken by form id).  A word that matches a form whose
constraint fails is ``Fault_IllegalInstruction``; decoding never falls through
to a lower-priority form.  Instruction length comes from the first 16-bit
parcel (ruling R15, :func:`length_of`).
"""

import enum
from dataclasses import dataclass
from functools import cached_property

from .bundle import Operation, pe_mask_of_pemode, PEMODE_OF_MASK
from .datatype import DataType, DTYPE_NONE
from .faults import FaultClass, PTOFault

__all__ = [
    "Role", "Piece", "Field", "Constraint", "Encoding", "Form",
    "FORMS", "FORMS_BY_ID", "DECODE_ORDER", "LENGTHS",
    "length_of", "find_form", "match_form", "encode", "extract_field", "insert_field",
    "dim_lb_index", "word_and_length",
    "words_to_parcels", "parcels_to_words", "parcels_to_bytes", "bytes_to_parcels",
    "DATATYPE_NAMES", "START_DTYPES", "GPR_NAMES", "REG5_NAMES", "HANDS",
    "LOCAL_SIZE_BYTES", "SHARED_SIZE_BYTES", "LAYOUT_NAMES", "RMODE_NAMES", "CMODE_NAMES",
    "PAD_NAMES", "RELU_NAMES", "GROUP_N_COLUMNS", "PREQUANT_MODES", "BRANCH_TYPE_NAMES",
    "HINT_TEMP_NAMES", "TEPL_OPERATIONS", "TIMG2COL_SELECTOR", "tepl_selector",
    "pe_mask_of_pemode", "PEMODE_OF_MASK", "mask_text",
]


# ---------------------------------------------------------------------------
# Value tables (field codes and their assembly names)
# ---------------------------------------------------------------------------

#: DataType code -> assembly name (the DataType enum names, plus 31 = DTYPE_NONE).
DATATYPE_NAMES = {dt.value: dt.name for dt in DataType} | {DTYPE_NONE: "DTYPE_NONE"}

#: DataType codes a typed BSTART accepts (every concrete type; never DTYPE_NONE).
START_DTYPES = tuple(sorted(dt.value for dt in DataType))

#: Absolute GPR selector 0..23 -> name (codes 24..31 are reserved in bundle commands).
GPR_NAMES = ("zero", "sp", "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "ra",
             "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "x0", "x1", "x2", "x3")

#: Reg5 selector 0..31 of the scalar-style commands: the GPRs, then the T and U queue heads.
REG5_NAMES = GPR_NAMES + ("t#1", "t#2", "t#3", "t#4", "u#1", "u#2", "u#3", "u#4")

#: Tile hand code -> letter (a 6-bit tile selector is hand * 16 + n - 1 for X#n).
HANDS = ("T", "U", "M", "N")

#: B.IOT destination SizeCode -> bytes per participating PE.
LOCAL_SIZE_BYTES = {code: 128 << (code - 1) for code in range(1, 11)}

#: B.IOS destination SizeCode -> bytes per participating PE (0 marks a Shared source).
SHARED_SIZE_BYTES = {code: 128 << (code - 1) for code in range(1, 13)}

#: B.DATR Layout code -> name; codes not listed are reserved.
LAYOUT_NAMES = {0: "NORM", 1: "ND2DN", 3: "ND2ZN", 4: "ND2NZ", 6: "DN2ND", 8: "DN2ZN",
                9: "DN2NZ", 17: "ZN2ND", 18: "ZN2DN", 20: "ZN2NZ", 21: "ND2M32", 22: "ND2M16",
                23: "ND2N8", 24: "M322ND", 25: "M162ND", 26: "N82ND", 27: "NZ2ND",
                28: "NZ2DN", 30: "NZ2ZN"}

#: B.DATR RMode code -> name (0 is the operation default, also spelled None).
RMODE_NAMES = {0: "Default", 1: "RNE", 2: "RTZ", 3: "RTM", 4: "RTP", 5: "RNA", 6: "RTO",
               7: "RHB"}

#: B.DATR CMode code -> name; 6 and 7 are reserved.
CMODE_NAMES = {0: "EQ", 1: "NE", 2: "LT", 3: "GT", 4: "LE", 5: "GE"}

#: B.DATR PadValueOrByteId code -> name.
PAD_NAMES = {0: "Zero", 1: "Max", 2: "Min", 3: "Null"}

#: B.FPATR ReluMode code -> name; 4..7 are reserved.
RELU_NAMES = {0: "None", 1: "ReLU", 2: "LReLU", 3: "PReLU"}

#: B.FPATR GroupNCode -> group width in columns; 10..15 are reserved.
GROUP_N_COLUMNS = {0: 0, 1: 8, 2: 16, 3: 32, 4: 48, 5: 64, 6: 80, 7: 96, 8: 112, 9: 128}

#: Legal B.FPATR PreQuantMode codes (all others are reserved).
PREQUANT_MODES = frozenset({0, 1, 2, 3, 4, 5, 12, 13, 16, 17, 18, 19, 20, 23, 24, 25, 26,
                            27, 28, 32, 33, 34, 35, 36, 37, 38, 39})

#: C.BSTART.STD / C.BSTART.FP BrType code -> keyword (other codes are not legal).
BRANCH_TYPE_NAMES = {1: "FALL", 5: "IND", 7: "RET"}

#: B.HINT temp code -> keyword.
HINT_TEMP_NAMES = {0: "none", 1: "cool", 2: "warm", 3: "hot"}

#: Assigned TEPL selectors (Mode * 32 + Function) -> (operation name, engine).  Every other
#: selector is a hole: the start decodes as BSTART.TEPL but the start handler rejects it.
TEPL_OPERATIONS = {
    0x00: ("TADD", "VEC"), 0x01: ("TSUB", "VEC"), 0x02: ("TMUL", "VEC"), 0x03: ("TDIV", "SFU"),
    0x04: ("TREM", "SFU"), 0x06: ("TAND", "VEC"), 0x07: ("TOR", "VEC"), 0x08: ("TXOR", "VEC"),
    0x09: ("TSHL", "VEC"), 0x0a: ("TSHR", "VEC"), 0x0b: ("TMAX", "VEC"), 0x0c: ("TMIN", "VEC"),
    0x0d: ("TCMP", "VEC"), 0x0f: ("TABS", "VEC"), 0x10: ("TNOT", "VEC"), 0x11: ("TNEG", "VEC"),
    0x12: ("TEXP", "SFU"), 0x13: ("TLOG", "SFU"), 0x14: ("TRECIP", "SFU"), 0x15: ("TSQRT", "SFU"),
    0x16: ("TRSQRT", "SFU"), 0x17: ("TRELU", "VEC"), 0x1a: ("TSEL", "VEC"), 0x1b: ("TCVT", "VEC"),
    0x1c: ("TFMA", "VEC"), 0x20: ("TADDS", "VEC"), 0x21: ("TSUBS", "VEC"), 0x22: ("TMULS", "VEC"),
    0x23: ("TDIVS", "SFU"), 0x24: ("TREMS", "SFU"), 0x26: ("TANDS", "VEC"), 0x27: ("TORS", "VEC"),
    0x28: ("TXORS", "VEC"), 0x29: ("TSHLS", "VEC"), 0x2a: ("TSHRS", "VEC"), 0x2b: ("TMAXS", "VEC"),
    0x2c: ("TMINS", "VEC"), 0x2d: ("TCMPS", "VEC"), 0x3a: ("TSELS", "VEC"),
    0x3b: ("TEXPANDS", "VEC"), 0x40: ("TROWSUM", "SFU"), 0x41: ("TROWMAX", "SFU"),
    0x42: ("TROWMIN", "SFU"), 0x43: ("TROWPROD", "SFU"), 0x44: ("TROWEXPAND", "SFU"),
    0x45: ("TROWEXPANDADD", "SFU"), 0x46: ("TROWEXPANDSUB", "SFU"), 0x47: ("TROWEXPANDMUL", "SFU"),
    0x48: ("TROWEXPANDDIV", "SFU"), 0x49: ("TROWEXPANDMAX", "SFU"), 0x4a: ("TROWEXPANDMIN", "SFU"),
    0x4b: ("TROWEXPANDEXPDIF", "SFU"), 0x4c: ("TROWARGMAX", "SFU"), 0x4d: ("TROWARGMIN", "SFU"),
    0x50: ("TCOLSUM", "SFU"), 0x51: ("TCOLMAX", "SFU"), 0x52: ("TCOLMIN", "SFU"),
    0x53: ("TCOLPROD", "SFU"), 0x54: ("TCOLEXPAND", "SFU"), 0x55: ("TCOLEXPANDADD", "SFU"),
    0x56: ("TCOLEXPANDSUB", "SFU"), 0x57: ("TCOLEXPANDMUL", "SFU"), 0x58: ("TCOLEXPANDDIV", "SFU"),
    0x59: ("TCOLEXPANDMAX", "SFU"), 0x5a: ("TCOLEXPANDMIN", "SFU"),
    0x5b: ("TCOLEXPANDEXPDIF", "SFU"), 0x5c: ("TCOLARGMAX", "SFU"), 0x5d: ("TCOLARGMIN", "SFU"),
    0x60: ("TCONCAT", "SFU"), 0x62: ("TEXTRACT", "SFU"), 0x63: ("TINSERT", "SFU"),
    0x64: ("TIMG2COL", "SFU"), 0x65: ("TFILLPAD", "SFU"), 0x66: ("TCI", "SFU"),
    0x67: ("TTRI", "SFU"), 0x68: ("THISTOGRAM", "SFU"), 0x6a: ("TQUANT", "SFU"),
    0x6b: ("TDEQUANT", "SFU"), 0x6c: ("TSORT", "SFU"), 0x6d: ("TMRGSORT", "SFU"),
    0x6e: ("TTRANS", "SFU"), 0x6f: ("TGATHER", "SFU"), 0x70: ("TSCATTER", "SFU"),
    0x71: ("TPARTADD", "SFU"), 0x72: ("TPARTMUL", "SFU"), 0x73: ("TPARTMAX", "SFU"),
    0x74: ("TPARTMIN", "SFU"),
}


def tepl_selector(mode: int, function: int) -> int:
    """The 7-bit TEPL selector of a BSTART.TEPL Mode/Function pair."""
    return (mode << 5) | function


#: TIMG2COL is TEPL Mode 3, Function 4.
TIMG2COL_SELECTOR = tepl_selector(3, 4)


def mask_text(pe_mask: int) -> str:
    """A 4-bit PE mask as written in assembly: PE0 first (PE0 is bit 3)."""
    return format(pe_mask, "04b")


# ---------------------------------------------------------------------------
# Form records
# ---------------------------------------------------------------------------

class Role(enum.Enum):
    """What the bundle decoder does with a form (derived from its catalog handler)."""

    MATRIX_START = "matrix-start"      # one of the twelve CUBE starts
    TEPL_START = "tepl-start"          # BSTART.TEPL (TIMG2COL is one of its selectors)
    OTHER_START = "other-start"        # every other bundle start (a boundary)
    TRACE_START = "trace-start"        # B.HINT TRACE: commits, then opens a standard bundle
    STOP = "stop"                      # BSTOP, C.BSTOP, L.BSTOP
    CATR = "catr"
    HINT = "hint"
    DATR = "datr"
    FPATR = "fpatr"
    DIM = "dim"                        # B.DIM (the LB index is fixed by the form)
    DIMI = "dimi"                      # C.B.DIMI (the LB index is the LoopNest field)
    IOT = "iot"
    IOS = "ios"
    IOR = "ior"
    OTHER_COMMAND = "other-command"    # command forms that are not part of CUBE bundles


@dataclass(frozen=True)
class Piece:
    """One contiguous slice of a field: ``width`` bits at ``instruction_lsb`` of the word
    hold value bits ``value_lsb .. value_lsb + width - 1``."""
    instruction_lsb: int
    width: int
    value_lsb: int


@dataclass(frozen=True)
class Field:
    """A named instruction field made of one or more pieces.

    Values are handled as raw unsigned bit patterns; ``signed`` marks fields the
    assembly writes as two's-complement numbers (branch offsets).
    """
    name: str
    width: int
    pieces: tuple
    signed: bool = False

    @cached_property
    def value_mask(self) -> int:
        """The value bits the pieces can represent."""
        bits = 0
        for p in self.pieces:
            bits |= ((1 << p.width) - 1) << p.value_lsb
        return bits

    @cached_property
    def word_mask(self) -> int:
        """The instruction bits the field occupies."""
        bits = 0
        for p in self.pieces:
            bits |= ((1 << p.width) - 1) << p.instruction_lsb
        return bits

    def extract(self, word: int) -> int:
        """The raw field value held in ``word``."""
        value = 0
        for p in self.pieces:
            value |= ((word >> p.instruction_lsb) & ((1 << p.width) - 1)) << p.value_lsb
        return value

    def insert(self, word: int, value: int) -> int:
        """``word`` with this field replaced by ``value``.

        ``value`` is the raw pattern; a signed field also takes a negative number.
        Raises ValueError when the value cannot be represented (out of range, or
        bits that no piece holds, e.g. a frame size that is not a multiple of 8).
        """
        if self.signed and value < 0:
            # Negative numbers are written in two's complement; raw patterns pass as is.
            if value < -(1 << (self.width - 1)):
                raise ValueError(f"{self.name} = {value} is out of range "
                                 f"({-(1 << (self.width - 1))}..{(1 << (self.width - 1)) - 1})")
            value += 1 << self.width
        if value < 0 or value & ~self.value_mask:
            raise ValueError(f"{self.name} = {value} is not encodable "
                             f"(representable values: {self.describe_range()})")
        word &= ~self.word_mask
        for p in self.pieces:
            word |= ((value >> p.value_lsb) & ((1 << p.width) - 1)) << p.instruction_lsb
        return word

    def to_signed(self, raw: int) -> int:
        """Interpret a raw value of a signed field as a two's-complement number."""
        if self.signed and raw >> (self.width - 1):
            return raw - (1 << self.width)
        return raw

    def describe_range(self) -> str:
        """Human-readable range of encodable values, for error messages."""
        low_bit = min(p.value_lsb for p in self.pieces)
        top = self.value_mask
        if low_bit:
            return f"multiples of {1 << low_bit} from 0 to {top}"
        return f"0..{top}"


@dataclass(frozen=True)
class Constraint:
    """A catalog constraint on a field's value: ``one-of`` a list, or ``not-equal`` a value."""
    field: str
    op: str
    values: tuple

    def holds(self, value: int) -> bool:
        if self.op == "one-of":
            return value in self.values
        return value not in self.values      # not-equal


@dataclass(frozen=True)
class Encoding:
    """One way to encode a form: ``word & mask == match``.

    ``name`` and ``function`` identify a named encoding variant (e.g. TMOV.L2S.INSERT
    with function 9); both are empty for the form's primary encoding.
    """
    mask: int
    match: int
    name: str = ""
    function: int | None = None


@dataclass(frozen=True)
class Form:
    """One instruction form of the command catalog."""
    form_id: str
    mnemonic: str
    kind: str                      # C16, L32, HL48 or L64
    length: int                    # bits
    encodings: tuple               # the primary Encoding first, then named variants
    role: Role
    fields: tuple = ()
    constraints: tuple = ()
    operation: Operation | None = None   # the CUBE operation of a Matrix start
    asm: str = ""                  # the catalog's assembly template (documentation)

    @property
    def mask(self) -> int:
        """Mask of the primary encoding."""
        return self.encodings[0].mask

    @property
    def match(self) -> int:
        """Match value of the primary encoding."""
        return self.encodings[0].match

    @property
    def popcount(self) -> int:
        """Decode priority key: the number of fixed bits of the primary encoding."""
        return self.mask.bit_count()

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.mnemonic} ({self.form_id}) has no field {name!r}")

    @cached_property
    def field_names(self) -> tuple:
        return tuple(f.name for f in self.fields)

    def variant_of(self, word: int) -> int | None:
        """Index into :attr:`encodings` of the encoding ``word`` matches, or None."""
        for i, enc in enumerate(self.encodings):
            if word & enc.mask == enc.match:
                return i
        return None

    def extract(self, word: int) -> dict:
        """All field values of ``word`` (raw), in catalog field order."""
        return {f.name: f.extract(word) for f in self.fields}

    def constraint_failure(self, fields: dict) -> str | None:
        """None when every constraint holds, else a message naming the first failure."""
        for c in self.constraints:
            value = fields[c.field]
            if not c.holds(value):
                return f"{self.mnemonic} {c.field} = {value} is reserved"
        return None

    def __repr__(self):
        return f"<Form {self.mnemonic} {self.form_id}>"


# ---------------------------------------------------------------------------
# The catalog (transcribed; catalog order)
# ---------------------------------------------------------------------------

_KIND_LENGTH = {"C16": 16, "L32": 32, "HL48": 48, "L64": 64}
_GPR_CODES = tuple(range(24))
_RING_CODES = tuple(range(2, 24))       # FENTRY/FEXIT/FRET ring registers R2..R23


def _f(name, lsb, width=1, signed=False):
    return Field(name, width, (Piece(lsb, width, 0),), signed)


def _fp(name, width, pieces, signed=False):
    return Field(name, width, tuple(Piece(*p) for p in pieces), signed)


def _one_of(field, *values):
    return Constraint(field, "one-of", tuple(values))


def _not_equal(field, value):
    return Constraint(field, "not-equal", (value,))


def _form(form_id, mnemonic, kind, mask, match, role, *, fields=(), constraints=(),
          operation=None, variants=(), asm=""):
    encodings = (Encoding(mask, match),) + tuple(
        Encoding(mask, vmatch, name, function) for name, function, vmatch in variants)
    return Form(form_id, mnemonic, kind, _KIND_LENGTH[kind], encodings, role, tuple(fields),
                tuple(constraints), operation, asm)


_START_DT = (_one_of("DataType", *START_DTYPES),)
_DT_FIELD = (_f("DataType", 27, 5),)
_PEMODES = _one_of("PEMode", *range(8))
_LOCAL_SIZES = _one_of("SizeCode", *LOCAL_SIZE_BYTES)
_DST_HANDS = _one_of("DstTile", 0, 1, 2, 3)
_UIMM17 = _fp("uimm17", 17, ((20, 12, 0), (7, 5, 12)))
_FRAME = _fp("uimm", 15, ((25, 7, 3), (7, 5, 10)))
_SIMM17 = (_f("simm17", 15, 17, signed=True),)
_REG3 = (_f("RegSrc0", 15, 5), _f("RegSrc1", 20, 5), _f("RegSrc2", 27, 5))
_REG3_GPR = tuple(_one_of(f"RegSrc{i}", *_GPR_CODES) for i in range(3))


def _matrix_start(form_id, mnemonic, match, operation):
    return _form(form_id, mnemonic, "L32", 0x07ffffff, match, Role.MATRIX_START,
                 fields=_DT_FIELD, constraints=_START_DT, operation=operation,
                 asm=f"{mnemonic} DataType")


def _typed_start(form_id, mnemonic, match, constraints=_START_DT, variants=()):
    return _form(form_id, mnemonic, "L32", 0x07ffffff, match, Role.OTHER_START,
                 fields=_DT_FIELD, constraints=constraints, variants=variants,
                 asm=f"{mnemonic} DataType")


def _frame_form(form_id, mnemonic, match, begin, end, asm, begin_codes=_RING_CODES):
    return _form(form_id, mnemonic, "L32", 0x0000707f, match, Role.OTHER_COMMAND,
                 fields=(_f(begin, 15, 5), _f(end, 20, 5), _FRAME),
                 constraints=(_one_of(begin, *begin_codes), _one_of(end, *_RING_CODES)),
                 asm=asm)


#: All 74 command forms, in catalog order.
FORMS = (
    _form("b_catr_32_e90bd52fa480", "B.CATR", "L32", 0xfbf07fff, 0x00000023, Role.CATR,
          fields=(_f("DR", 26), _f("trap", 19), _f("far", 18), _f("atom", 17), _f("aq", 16),
                  _f("rl", 15)),
          asm="B.CATR {trap, atomic, <aq, rl, aqrl>, far, dr}"),
    _form("b_datr_32_c161a042ff38", "B.DATR", "L32", 0x000c707f, 0x00001023, Role.DATR,
          fields=(_f("CMode", 29, 3), _f("PadValueOrByteId", 27, 2), _f("Sat", 26),
                  _f("Canonicalize", 25), _f("DataType", 20, 5), _f("RMode", 15, 3),
                  _f("Layout", 7, 5)),
          constraints=(_one_of("CMode", *CMODE_NAMES),
                       _one_of("DataType", *START_DTYPES, DTYPE_NONE),
                       _one_of("Layout", *LAYOUT_NAMES)),
          asm="B.DATR {layout, datatype, padvalue_or_byteid, cmode, rmode, sat, canonicalize}"),
    _form("b_dim_32_1caa1aa2944a", "B.DIM", "L32", 0x0000707f, 0x00002043, Role.DIM,
          fields=(_f("RegSrc", 15, 5), _UIMM17), constraints=(_one_of("RegSrc", *_GPR_CODES),),
          asm="B.DIM RegSrc, uimm, ->LB2"),
    _form("b_dim_32_27602ab68929", "B.DIM", "L32", 0x0000707f, 0x00000043, Role.DIM,
          fields=(_f("RegSrc", 15, 5), _UIMM17), constraints=(_one_of("RegSrc", *_GPR_CODES),),
          asm="B.DIM RegSrc, uimm, ->LB0"),
    _form("b_dim_32_4191099a5f4d", "B.DIM", "L32", 0x0000707f, 0x00001043, Role.DIM,
          fields=(_f("RegSrc", 15, 5), _UIMM17), constraints=(_one_of("RegSrc", *_GPR_CODES),),
          asm="B.DIM RegSrc, uimm, ->LB1"),
    _form("b_hint_32_69d942ff1583", "B.HINT", "L32", 0x00087fff, 0x00000033, Role.HINT,
          fields=(_f("L/UL", 16), _f("V", 15), _f("prefetch_size", 20, 12), _f("temp", 17, 2)),
          asm="B.HINT {BR.{likely, unlikely}, TEMP.{hot, warm, cool, none}, PRFSIZE}"),
    _form("b_hint_32_f7d01d734925", "B.HINT", "L32", 0xffff7fff, 0x00001033, Role.TRACE_START,
          fields=(_f("B/E", 15),),
          asm="B.HINT TRACE.{begin, end}"),
    _form("b_ior_32_c3ea71404eb3", "B.IOR", "L32", 0x0600707f, 0x00000013, Role.IOR,
          fields=(_f("RegDst", 7, 5),) + _REG3,
          constraints=(_one_of("RegDst", *_GPR_CODES),) + _REG3_GPR,
          asm="B.IOR [<gpr>[, <gpr>[, <gpr>]]][, -><gpr>]"),
    _form("b_iot_32_10db6db84f5d", "B.IOT", "L32", 0xfc00707f, 0x00005013, Role.IOT,
          fields=(_f("SrcTile0", 20, 6), _f("L", 19), _f("SizeCode", 15, 4), _f("PEMode", 9, 3),
                  _f("DstTile", 7, 2)),
          constraints=(_LOCAL_SIZES, _PEMODES, _DST_HANDS),
          asm="B.IOT SrcTile0, mask=PE_MASK, <last>, ->DstTile<SizeCode>"),
    _form("b_iot_32_2c07e7177fad", "B.IOT", "L32", 0x0007f07f, 0x00004013, Role.IOT,
          fields=(_f("SrcTile1", 26, 6), _f("SrcTile0", 20, 6), _f("L", 19), _f("PEMode", 9, 3)),
          constraints=(_PEMODES,),
          asm="B.IOT SrcTile0, SrcTile1, mask=PE_MASK, <last>"),
    _form("b_iot_32_8b8bce6bffe8", "B.IOT", "L32", 0x0000707f, 0x00004013, Role.IOT,
          fields=(_f("SrcTile1", 26, 6), _f("SrcTile0", 20, 6), _f("L", 19), _f("SizeCode", 15, 4),
                  _f("PEMode", 9, 3), _f("DstTile", 7, 2)),
          constraints=(_LOCAL_SIZES, _PEMODES, _DST_HANDS),
          asm="B.IOT SrcTile0, SrcTile1, mask=PE_MASK, <last>, ->DstTile<SizeCode>"),
    _form("b_iot_32_c11eb189dd83", "B.IOT", "L32", 0xfc07f07f, 0x00005013, Role.IOT,
          fields=(_f("SrcTile0", 20, 6), _f("L", 19), _f("PEMode", 9, 3)),
          constraints=(_PEMODES,),
          asm="B.IOT SrcTile0, mask=PE_MASK, <last>"),
    _form("b_iot_32_efa0fe3fe49a", "B.IOT", "L32", 0xfff0707f, 0x00006013, Role.IOT,
          fields=(_f("L", 19), _f("SizeCode", 15, 4), _f("PEMode", 9, 3), _f("DstTile", 7, 2)),
          constraints=(_LOCAL_SIZES, _PEMODES, _DST_HANDS),
          asm="B.IOT mask=PE_MASK, <last>, ->DstTile<SizeCode>"),
    _form("bstart_32_7eb93b649748", "BSTART", "L32", 0x0000007f, 0x00000011, Role.OTHER_START,
          fields=(_f("simm25", 7, 25, signed=True),), asm="BSTART DIRECT, <label>"),
    _form("bstart_32_e11e678a32ac", "BSTART", "L32", 0x0000007f, 0x00000021, Role.OTHER_START,
          fields=(_f("simm25", 7, 25, signed=True),), asm="BSTART COND, <label>"),
    _form("bstart_call_32_9404418d1ae5", "BSTART.CALL", "L32", 0xf83f000f, 0x50160002,
          Role.OTHER_START, fields=(_f("simm12", 4, 12, signed=True), _f("uimm5", 22, 5)),
          asm="BSTART.CALL <br_label>, <rt_label>, ->ra"),
    _form("bstart_icall_32_50166001", "BSTART.ICALL", "L32", 0xf83fffff, 0x50166001,
          Role.OTHER_START, fields=(_f("uimm5", 22, 5),), asm="BSTART.ICALL <rt_label>, ->ra"),
    _form("bstart_fp_32_0c671a644214", "BSTART.FP", "L32", 0xffffffff, 0x00007101,
          Role.OTHER_START, asm="BSTART.FP RET"),
    _form("bstart_fp_32_58ad7954fb49", "BSTART.FP", "L32", 0x00007fff, 0x00003101,
          Role.OTHER_START, fields=_SIMM17, asm="BSTART.FP COND, <label>"),
    _form("bstart_fp_32_7978795a29a1", "BSTART.FP", "L32", 0xffffffff, 0x00005101,
          Role.OTHER_START, asm="BSTART.FP IND"),
    _form("bstart_fp_32_d00a708a81f0", "BSTART.FP", "L32", 0x00007fff, 0x00002101,
          Role.OTHER_START, fields=_SIMM17, asm="BSTART.FP DIRECT, <label>"),
    _form("bstart_fp_32_face4f238d84", "BSTART.FP", "L32", 0x00007fff, 0x00001101,
          Role.OTHER_START, fields=_SIMM17, constraints=(_one_of("simm17", 0),),
          asm="BSTART.FP FALL"),
    _typed_start("bstart_mgather_32_c9defbf18276", "BSTART.MGATHER", 0x00411181),
    _typed_start("bstart_mgather_cas_32_fd8c8a3b720a", "BSTART.MGATHER.CAS", 0x00811181),
    _typed_start("bstart_mgather_mask_32_5573241cd944", "BSTART.MGATHER.MASK", 0x00611181),
    _typed_start("bstart_mscatter_mask_32_2a33eed646f7", "BSTART.MSCATTER.MASK", 0x00711181),
    _typed_start("bstart_mscatter_32_0f0ba08bd798", "BSTART.MSCATTER", 0x00511181),
    _form("bstart_std_32_1ef99c4cedcb", "BSTART.STD", "L32", 0x00007fff, 0x00003001,
          Role.OTHER_START, fields=_SIMM17, asm="BSTART.STD COND, <label>"),
    _form("bstart_std_32_441ad677fffe", "BSTART.STD", "L32", 0x00007fff, 0x00001001,
          Role.OTHER_START, fields=_SIMM17, constraints=(_one_of("simm17", 0),),
          asm="BSTART.STD FALL"),
    _form("bstart_std_32_816dfa76cc4a", "BSTART.STD", "L32", 0xffffffff, 0x00007001,
          Role.OTHER_START, asm="BSTART.STD RET"),
    _form("bstart_std_32_986b7ee2cf6a", "BSTART.STD", "L32", 0xffffffff, 0x00005001,
          Role.OTHER_START, asm="BSTART.STD IND"),
    _form("bstart_std_32_c1de85e06878", "BSTART.STD", "L32", 0x00007fff, 0x00002001,
          Role.OTHER_START, fields=_SIMM17, asm="BSTART.STD DIRECT, <label>"),
    _form("bstart_sys_32_762d9d84a6d8", "BSTART.SYS", "L32", 0x00007fff, 0x00001081,
          Role.OTHER_START, fields=_SIMM17, constraints=(_one_of("simm17", 0),),
          asm="BSTART.SYS FALL"),
    _form("bstart_tepl_32_d022db6dacb3", "BSTART.TEPL", "L32", 0x000fffff, 0x00019181,
          Role.TEPL_START,
          fields=(_f("DataType", 27, 5), _f("Mode", 25, 2), _f("Function", 20, 5)),
          constraints=_START_DT, asm="BSTART.TEPL Mode, Function, DataType"),
    _matrix_start("bstart_tgemv_32_ae19f5b678f5", "BSTART.TGEMV", 0x01031181, Operation.TGEMV),
    _matrix_start("bstart_tgemv_acc_32_9a471b21913e", "BSTART.TGEMV.ACC", 0x01231181,
                  Operation.TGEMV_ACC),
    _matrix_start("bstart_tgemv_bias_32_186ee96c0a8b", "BSTART.TGEMV.BIAS", 0x01131181,
                  Operation.TGEMV_BIAS),
    _matrix_start("bstart_tgemvmx_32_ae5e005f6589", "BSTART.TGEMVMX", 0x01431181,
                  Operation.TGEMV_MX),
    _matrix_start("bstart_tgemvmx_acc_32_368647b04bb0", "BSTART.TGEMVMX.ACC", 0x01631181,
                  Operation.TGEMV_MX_ACC),
    _matrix_start("bstart_tgemvmx_bias_32_d23011f15171", "BSTART.TGEMVMX.BIAS", 0x01531181,
                  Operation.TGEMV_MX_BIAS),
    _typed_start("bstart_tload_32_d0c18bb0ab15", "BSTART.TLOAD", 0x00011181),
    _matrix_start("bstart_tmatmul_32_f9da70e4e0ad", "BSTART.TMATMUL", 0x00031181,
                  Operation.TMATMUL),
    _matrix_start("bstart_tmatmul_acc_32_0c8c62e5f00a", "BSTART.TMATMUL.ACC", 0x00231181,
                  Operation.TMATMUL_ACC),
    _matrix_start("bstart_tmatmul_bias_32_4d5a498d12f3", "BSTART.TMATMUL.BIAS", 0x00131181,
                  Operation.TMATMUL_BIAS),
    _matrix_start("bstart_tmatmulmx_32_e26cb3874648", "BSTART.TMATMULMX", 0x00431181,
                  Operation.TMATMUL_MX),
    _matrix_start("bstart_tmatmulmx_acc_32_70fa59b0ab4c", "BSTART.TMATMULMX.ACC", 0x00631181,
                  Operation.TMATMUL_MX_ACC),
    _matrix_start("bstart_tmatmulmx_bias_32_098c7efa51b0", "BSTART.TMATMULMX.BIAS", 0x00531181,
                  Operation.TMATMUL_MX_BIAS),
    _typed_start("bstart_tmov_32_211446509efb", "BSTART.TMOV", 0x00211181,
                 constraints=(_one_of("DataType", *START_DTYPES, DTYPE_NONE),),
                 variants=(("TMOV.L2S.INSERT", 9, 0x00911181),
                           ("TMOV.L2S.PUBLISH", 10, 0x00a11181),
                           ("TMOV.S2L.BROADCAST", 11, 0x00b11181),
                           ("TMOV.S2L.EXTRACT", 12, 0x00c11181))),
    _typed_start("bstart_gmov_32_6c21e223eaa7", "BSTART.GMOV", 0x00d11181),
    _typed_start("bstart_tprefetch_32_d5f83e5aadf6", "BSTART.TPREFETCH", 0x00311181),
    _typed_start("bstart_tstore_32_4048b6e8b0f4", "BSTART.TSTORE", 0x00111181,
                 variants=(("TSTORE.SPART", 14, 0x00e11181),)),
    _form("bstop_32_d25b09fdd59c", "BSTOP", "L32", 0xffffffff, 0x00000001, Role.STOP,
          asm="BSTOP"),
    _form("b_ios_32_4ba5ef98fdaa", "B.IOS", "L32", 0xf00871ff, 0x00001013, Role.IOS,
          fields=(_f("SharedTID", 20, 8), _f("SizeCode", 15, 4), _f("PEMode", 9, 3)),
          constraints=(_one_of("SizeCode", 0, *SHARED_SIZE_BYTES), _PEMODES),
          asm="B.IOS S<SharedTID>, mask=<PE_MASK> | B.IOS mask=<PE_MASK>, ->S<SharedTID><SizeCode>"),
    _form("c_b_dimi_16_3f1b113c76ce", "C.B.DIMI", "C16", 0x003f, 0x003c, Role.DIMI,
          fields=(_f("LoopNest", 14, 2), _f("imm8", 6, 8)),
          constraints=(_not_equal("LoopNest", 3),),
          asm="C.B.DIMI imm, ->{LB0, LB1, LB2}"),
    _form("c_bstart_16_c4e238a9227a", "C.BSTART", "C16", 0x000f, 0x0004, Role.OTHER_START,
          fields=(_f("simm12", 4, 12, signed=True),), asm="C.BSTART COND, label"),
    _form("c_bstart_16_f833d2a4753c", "C.BSTART", "C16", 0x000f, 0x0002, Role.OTHER_START,
          fields=(_f("simm12", 4, 12, signed=True),), asm="C.BSTART DIRECT, label"),
    _form("c_bstart_fp_16_9dcef7e3a85b", "C.BSTART.FP", "C16", 0xc7ff, 0x0080, Role.OTHER_START,
          fields=(_f("BrType", 11, 3),), constraints=(_one_of("BrType", *BRANCH_TYPE_NAMES),),
          asm="C.BSTART.FP {FALL, IND, RET}"),
    _form("c_bstart_std_16_8b40f078c14a", "C.BSTART.STD", "C16", 0xc7ff, 0x0000,
          Role.OTHER_START,
          fields=(_f("BrType", 11, 3),), constraints=(_one_of("BrType", *BRANCH_TYPE_NAMES),),
          asm="C.BSTART.STD {FALL, IND, RET}"),
    _form("c_bstart_sys_16_ec213ce96eb7", "C.BSTART.SYS", "C16", 0xffff, 0x0840,
          Role.OTHER_START, asm="C.BSTART.SYS FALL"),
    _form("c_bstop_16_ca4743d8a95e", "C.BSTOP", "C16", 0xffff, 0x0000, Role.STOP,
          asm="C.BSTOP"),
    _form("ercov_32_dc0be14a2d8b", "ERCOV", "L32", 0x06007fff, 0x00003031, Role.OTHER_COMMAND,
          fields=_REG3, asm="ERCOV [RegSrc0=BasePtr, RegSrc1=LenBytes, RegSrc2=Kind]"),
    _form("esave_32_4c4f79fe3171", "ESAVE", "L32", 0x06007fff, 0x00002031, Role.OTHER_COMMAND,
          fields=_REG3, asm="ESAVE [RegSrc0=BasePtr, RegSrc1=LenBytes, RegSrc2=Kind]"),
    _frame_form("fentry_32_a47584ec13b6", "FENTRY", 0x00000041, "SrcBegin", "SrcEnd",
                "FENTRY [RegSrc0 ~ RegSrcn], sp!, uimm"),
    _frame_form("fexit_32_37b663f2a34d", "FEXIT", 0x00001041, "DstBegin", "DstEnd",
                "FEXIT [RegDst0 ~ RegDstn], sp!, uimm"),
    _frame_form("fret_ra_32_659c886221c1", "FRET.RA", 0x00002041, "DstBegin", "DstEnd",
                "FRET.RA [RegDst0 ~ RegDstn], sp!, uimm"),
    _frame_form("fret_stk_32_4fe246bd8241", "FRET.STK", 0x00003041, "DstBegin", "DstEnd",
                "FRET.STK [ra ~ RegDstn], sp!, uimm", begin_codes=(10,)),
    _form("hl_qmt_48_eb9e41958045", "HL.QMT", "HL48", 0xe000707fffff, 0x0000007d000e,
          Role.OTHER_COMMAND,
          fields=(_f("RegDst", 23, 5), _f("SrcL", 31, 5), _f("SrcR", 36, 5), _f("e", 41),
                  _f("i", 44), _f("r", 42), _f("s", 43)),
          asm="hl.qmt[.{i,e,s,r,ie,is,ir,es,er,ies,ier}] SrcL[, SrcR when i], ->RegDst"),
    _form("hl_qpop_48_a2c57f5bc27b", "HL.QPOP", "HL48", 0xf9f0707f07ff, 0x0000207d000e,
          Role.OTHER_COMMAND,
          fields=(_f("RegDst0", 23, 5), _f("RegDst1", 11, 5), _f("SrcL", 31, 5), _f("e", 41),
                  _f("r", 42)),
          asm="hl.qpop[.{e,r,er}] SrcL, ->RegDst0, RegDst1"),
    _form("hl_qpush_48_3eab8e05d61a", "HL.QPUSH", "HL48", 0xf000707fffff, 0x0000107d000e,
          Role.OTHER_COMMAND,
          fields=(_f("RegDst", 23, 5), _f("SrcL", 31, 5), _f("SrcR", 36, 5), _f("e", 41),
                  _f("h", 43), _f("r", 42)),
          asm="hl.qpush[.{h,e,r,he,hr,er,her}] SrcL, SrcR, ->RegDst"),
    _form("mcopy_32_4fc4a803e995", "MCOPY", "L32", 0x06007fff, 0x00000031, Role.OTHER_COMMAND,
          fields=_REG3, constraints=_REG3_GPR, asm="MCOPY [RegSrc0, RegSrc1, RegSrc2]"),
    _form("mset_32_0b932f291932", "MSET", "L32", 0x06007fff, 0x00001031, Role.OTHER_COMMAND,
          fields=_REG3, constraints=_REG3_GPR,
          asm="MSET [RegSrc0=Destination, RegSrc1=FillByte, RegSrc2=LengthBytes]"),
    _form("xb_32_40ad190a0a7f", "XB", "L32", 0x00007fff, 0x00006f81, Role.OTHER_COMMAND,
          fields=(_f("ACR-ID", 15, 10), _f("CROSS-BID", 25, 7)), asm="XB ACR-ID, C-ID"),
    # The catalog gives L.BSTOP as two 32-bit words; word i sits at bits 32i..32i+31.
    _form("l_bstop_64_94c7f0a5e8b3", "L.BSTOP", "L64", 0xffffffffffffffff, 0x000000010000000f,
          Role.STOP, asm="L.BSTOP"),
    _form("b_fpatr_32_30c307e06d4a", "B.FPATR", "L32", 0x00007e7f, 0x00002023, Role.FPATR,
          fields=(_f("PreQuantMode", 26, 6), _f("ReluMode", 23, 3), _f("GroupNCode", 19, 4),
                  _f("RowMaxEn", 18), _f("GroupMaxEn", 17), _f("RowMaxInit", 16),
                  _f("MaxAbsEn", 15), _f("Func", 12, 3), _f("ElementWiseEn", 11),
                  _f("TransA", 7), _f("TransB", 8), _f("Reserved", 9, 2), _f("Opc1", 4, 3),
                  _f("Opcode", 1, 3), _f("W", 0)),
          # The catalog also lists the fixed sub-fields (Func .. W) with their only value.
          constraints=(_one_of("PreQuantMode", *sorted(PREQUANT_MODES)),
                       _one_of("ReluMode", *RELU_NAMES),
                       _one_of("GroupNCode", *GROUP_N_COLUMNS),
                       _one_of("RowMaxEn", 0, 1), _one_of("GroupMaxEn", 0, 1),
                       _one_of("RowMaxInit", 0, 1), _one_of("MaxAbsEn", 0, 1),
                       _one_of("Func", 2), _one_of("ElementWiseEn", 0), _one_of("TransA", 0, 1),
                       _one_of("TransB", 0, 1), _one_of("Reserved", 0), _one_of("Opc1", 2),
                       _one_of("Opcode", 1), _one_of("W", 1)),
          asm="B.FPATR PreQuantMode, ReluMode, GroupNCode, RowMaxEn, GroupMaxEn, RowMaxInit, "
              "MaxAbsEn, TransA, TransB"),
)

FORMS_BY_ID = {form.form_id: form for form in FORMS}

#: The catalog's decode priority: decreasing mask popcount, ties broken by form id.
DECODE_ORDER = tuple(sorted(FORMS, key=lambda form: (-form.popcount, form.form_id)))

#: Instruction lengths in bits.
LENGTHS = (16, 32, 48, 64)

# (mask, match, form) of every encoding, per length, in decode priority: the match loop.
_MATCH_TABLE = {n: tuple((enc.mask, enc.match, form) for form in DECODE_ORDER
                         if form.length == n for enc in form.encodings) for n in LENGTHS}


# ---------------------------------------------------------------------------
# Length, decode and encode
# ---------------------------------------------------------------------------

def length_of(first_parcel: int) -> int:
    """Instruction length in bits from its first 16-bit parcel (ruling R15).

    Low nibble 0xE: 48 bits; 0xF: 64 bits; otherwise bit 0 clear: 16, set: 32.
    """
    if not 0 <= first_parcel <= 0xFFFF:
        raise ValueError(f"a parcel is 16 bits, got {first_parcel:#x}")
    low = first_parcel & 0xF
    if low == 0xE:
        return 48
    if low == 0xF:
        return 64
    return 32 if first_parcel & 1 else 16


def _check_word(word: int, length: int):
    if length not in LENGTHS:
        raise ValueError(f"instruction length must be one of {LENGTHS}, got {length}")
    if not 0 <= word < 1 << length:
        raise ValueError(f"{word:#x} does not fit in {length} bits")


def find_form(word: int, length: int) -> Form | None:
    """The first form in decode priority whose encoding matches, constraints ignored."""
    _check_word(word, length)
    for mask, match, form in _MATCH_TABLE[length]:
        if word & mask == match:
            return form
    return None


def match_form(word: int, length: int) -> tuple:
    """Decode one instruction word: ``(form, fields)`` with raw field values.

    Raises PTOFault(ILLEGAL_INSTRUCTION) when no form matches or when the matching
    form's constraint fails (the spec never falls through to another form).
    """
    form = find_form(word, length)
    if form is None:
        raise PTOFault(FaultClass.ILLEGAL_INSTRUCTION,
                       f"no instruction form matches the {length}-bit word "
                       f"0x{word:0{length // 4}x}")
    fields = form.extract(word)
    reason = form.constraint_failure(fields)
    if reason is not None:
        raise PTOFault(FaultClass.ILLEGAL_INSTRUCTION, reason)
    return form, fields


def encode(form: Form, fields: dict, *, check: bool = True) -> int:
    """The primary encoding of ``form`` with the given field values.

    Fields not given keep the bits of the form's match value (0 for free fields).
    Values are raw patterns; signed fields also accept negative numbers.  Raises ValueError for unknown fields,
    unencodable values, values that contradict fixed bits, and (when ``check``)
    values that fail a catalog constraint.
    """
    unknown = set(fields) - set(form.field_names)
    if unknown:
        raise ValueError(f"{form.mnemonic} ({form.form_id}) has no field(s) "
                         f"{', '.join(sorted(unknown))}")
    word = form.match
    for f in form.fields:
        if f.name in fields:
            word = f.insert(word, fields[f.name])
    if word & form.mask != form.match:
        raise ValueError(f"{form.mnemonic}: field values contradict the form's fixed bits")
    if check:
        reason = form.constraint_failure(form.extract(word))
        if reason is not None:
            raise ValueError(reason)
    return word


def dim_lb_index(form: Form) -> int:
    """The LB register a B.DIM form writes: its funct3 (bits 14:12)."""
    if form.role is not Role.DIM:
        raise ValueError(f"{form.mnemonic} is not a B.DIM form")
    return (form.match >> 12) & 0b111


def extract_field(form: Form, name: str, word: int) -> int:
    """The raw value of field ``name`` of ``form`` in ``word``."""
    return form.field(name).extract(word)


def insert_field(form: Form, name: str, word: int, value: int) -> int:
    """``word`` with field ``name`` of ``form`` set to ``value``."""
    return form.field(name).insert(word, value)


# ---------------------------------------------------------------------------
# Parcels (16-bit little-endian units, parcel 0 = low 16 bits of a word)
# ---------------------------------------------------------------------------

def words_to_parcels(words) -> list:
    """Split ``(word, length)`` pairs (or objects with .word/.length) into 16-bit parcels.

    Raises ValueError when a word's length disagrees with the length rule of its
    first parcel, since such a stream could not be split back into the same words.
    """
    parcels = []
    for item in words:
        word, length = word_and_length(item)
        _check_word(word, length)
        if length_of(word & 0xFFFF) != length:
            raise ValueError(f"the {length}-bit word 0x{word:0{length // 4}x} breaks the length "
                             f"rule: its first parcel implies {length_of(word & 0xFFFF)} bits")
        parcels.extend((word >> (16 * i)) & 0xFFFF for i in range(length // 16))
    return parcels


def parcels_to_words(parcels) -> list:
    """Group 16-bit parcels into ``(word, length)`` pairs with the length rule (R15)."""
    parcels = list(parcels)
    words = []
    i = 0
    while i < len(parcels):
        length = length_of(parcels[i])
        count = length // 16
        if i + count > len(parcels):
            raise ValueError(f"the parcel stream ends inside a {length}-bit instruction "
                             f"starting at parcel {i}")
        word = 0
        for k in range(count):
            if not 0 <= parcels[i + k] <= 0xFFFF:
                raise ValueError(f"a parcel is 16 bits, got {parcels[i + k]:#x}")
            word |= parcels[i + k] << (16 * k)
        words.append((word, length))
        i += count
    return words


def parcels_to_bytes(parcels) -> bytes:
    """The memory image of a parcel stream (each parcel little-endian)."""
    return b"".join(p.to_bytes(2, "little") for p in parcels)


def bytes_to_parcels(data: bytes) -> list:
    """Inverse of :func:`parcels_to_bytes`; the image must hold whole parcels."""
    if len(data) % 2:
        raise ValueError(f"a parcel image has an even number of bytes, got {len(data)}")
    return [int.from_bytes(data[i:i + 2], "little") for i in range(0, len(data), 2)]


def word_and_length(item) -> tuple:
    """``(word, length)`` from a pair or from an object with .word and .length."""
    if hasattr(item, "word"):
        return item.word, item.length
    word, length = item
    return word, length
