"""Bundle decode model: an instruction stream in, one :class:`BundleRecord` per bundle out.

:class:`BundleDecoder` is a per-instruction state machine; the hardware decoder
(``hdl/decoder.py``) mirrors it one-to-one, so every stream-level choice it makes
is written down in ``docs/decisions/decode.md``.  In short:

* Each word is decoded with :func:`ptocube.model.isa.match_form`; a word that
  decodes to no form or fails a constraint is ``Fault_IllegalInstruction``.
* Header commands and bindings are checked when they execute, as the spec's
  handlers do (placement, order and duplicates: ``Fault_BundleControl``; B.FPATR
  field consistency and PE-mask agreement: ``Fault_TileLegality``).
* At the boundary (a stop, or the next start) the commit-time rules that need no
  tile state run: B.CATR DR, the zero-participation no-op, missing B.FPATR, the
  TIMG2COL binding schema (ruling R13), and the Matrix binding bounds.  Everything
  else is left in the :class:`Bundle` descriptor for the preflight.
* After any fault the decoder discards words up to and including the next stop;
  a start ends the discarding and opens a new bundle.  A faulting stop is itself
  that boundary.
* A start whose transfer reads the retiring bundle's BPCN (IND, ICALL) is
  ``Fault_BundleControl`` before anything is committed: the retiring bundle is
  never a Standard or Floating one in this unit.
* Starts of bundles this unit does not execute (every start other than the twelve
  CUBE starts and TEPL TIMG2COL), other command forms and a B.CATR requesting a
  post-commit trap are an implementation limit reported as
  ``Fault_IllegalInstruction``.
* A caller that runs the preflight between steps (:class:`ptocube.model.machine.Machine`)
  calls :meth:`BundleDecoder.squash` when a commit the decoder passed fails; a
  start that ended that bundle then opens nothing, as when the decoder itself
  detects the fault.

The CLI ``ptocube decode FILE`` prints the records as JSON.
"""

import argparse
import enum
import json
import sys
from dataclasses import dataclass, field

from .asm import AsmError, InputError, assemble, format_word, read_input, read_words
from .bundle import Bundle, BundleRecord, Datr, Destination, Fpatr, Operation
from .faults import FaultClass, PTOFault
from .isa import (DATATYPE_NAMES, GPR_NAMES, HANDS, LOCAL_SIZE_BYTES, TEPL_OPERATIONS,
                  TIMG2COL_SELECTOR, Role, dim_lb_index, mask_text, match_form,
                  parcels_to_words, pe_mask_of_pemode, tepl_selector, word_and_length)

__all__ = ["BundleDecoder", "DecoderState", "decode_stream", "decode_parcels",
           "record_to_dict", "start_reads_retiring_bpcn", "INDIRECT_START_FORMS",
           "INDIRECT_BRTYPES", "MAX_IOT_WORDS", "MAX_SHARED", "MAX_MATRIX_LOCAL_SOURCES",
           "MAX_MATRIX_DESTINATIONS", "add_arguments", "run"]

#: Effective B.IOT words per bundle (the spec model's binding array); the 17th is
#: Fault_TileLegality at that B.IOT.
MAX_IOT_WORDS = 16
#: Effective B.IOS bindings per bundle; the fifth is Fault_BundleControl.
MAX_SHARED = 4
#: A Matrix bundle consumes at most 8 Local sources and 3 destinations; more is
#: Fault_TileLegality at commit (decided here so the descriptor has fixed bounds).
MAX_MATRIX_LOCAL_SOURCES = 8
MAX_MATRIX_DESTINATIONS = 3

_STARTS = (Role.MATRIX_START, Role.TEPL_START, Role.OTHER_START, Role.TRACE_START)

#: Start forms whose transfer is always indirect (IND) or indirect call (ICALL).
INDIRECT_START_FORMS = frozenset({"bstart_std_32_986b7ee2cf6a",      # BSTART.STD IND
                                  "bstart_fp_32_7978795a29a1",       # BSTART.FP IND
                                  "bstart_icall_32_50166001"})       # BSTART.ICALL
#: BrType codes whose transfer reads the retiring BPCN: 101 IND, 110 ICALL (the
#: spec's BundleTransferOfBranchType).  C.BSTART.STD/.FP accept only 001, 101 and
#: 111, so of these only IND reaches the start handler.
INDIRECT_BRTYPES = frozenset({0b101, 0b110})

_BC = FaultClass.BUNDLE_CONTROL
_TL = FaultClass.TILE_LEGALITY
_II = FaultClass.ILLEGAL_INSTRUCTION


def start_reads_retiring_bpcn(form, fields) -> bool:
    """True when the start's transfer takes its target from the retiring bundle's BPCN.

    That is BSTART.STD IND, BSTART.FP IND, BSTART.ICALL, and C.BSTART.STD/.FP with
    BrType IND (``asl/block/model/dispatch/start.asl``: transfer Indirect or
    IndirectCall; the transfer comes from BrType when the form has one, else from
    the form).
    """
    if "BrType" in fields:
        return fields["BrType"] in INDIRECT_BRTYPES
    return form.form_id in INDIRECT_START_FORMS


class DecoderState(enum.Enum):
    """Where the decoder is between instructions."""
    IDLE = "idle"    # no bundle open
    OPEN = "open"    # a CUBE or TIMG2COL bundle is collecting its header
    SKIP = "skip"    # after a fault: discard up to and including the next stop


class _Fault(Exception):
    def __init__(self, fault: FaultClass, reason: str):
        super().__init__(reason)
        self.fault = fault
        self.reason = reason


@dataclass
class _OpenBundle:
    """Header state collected for the open bundle."""
    op: Operation
    a_type: int
    start_index: int
    words: list
    datr: Datr | None = None
    fpatr: Fpatr | None = None
    catr_present: bool = False
    catr_dr: bool = False
    hint_present: bool = False
    dims: list = field(default_factory=lambda: [None, None, None])
    local_sources: list = field(default_factory=list)
    destinations: list = field(default_factory=list)
    iot_shapes: list = field(default_factory=list)   # (sources, has destination, L) per word
    iot_mask: int | None = None
    terminated: bool = False
    shared: list = field(default_factory=list)       # (SharedTID, SizeCode)
    ios_mask: int | None = None
    ior: tuple | None = None
    zero_seen: bool = False

    @property
    def effective_bindings(self) -> bool:
        return bool(self.iot_shapes or self.shared)


class BundleDecoder:
    """Per-instruction bundle decode state machine.

    ``step(index, word, length)`` consumes one instruction and returns the records
    it completes (usually none; a boundary returns the closed bundle's record, and
    an unsupported start after a successful commit returns two).  ``finish(index)``
    ends the stream.  ``gprs`` (24 ints; GPR 0 always reads 0) supplies the values
    B.DIM reads when it executes.

    A caller that completes each record before the next step calls ``squash()``
    when a record the decoder passed then fails its commit (decisions D9, D29).
    """

    def __init__(self, gprs=None):
        if gprs is None:
            gprs = [0] * 24
        gprs = list(gprs)
        if len(gprs) != 24:
            raise ValueError(f"gprs must hold 24 values, got {len(gprs)}")
        self._gprs = gprs
        self.state = DecoderState.IDLE
        self._bundle = None

    # -- stream entry points ---------------------------------------------------------

    def step(self, index: int, word: int, length: int) -> list:
        """Consume instruction ``index``; return the records it completes."""
        entry = (index, length, word)
        try:
            form, fields = match_form(word, length)
        except PTOFault as err:
            if self.state is DecoderState.SKIP:
                return []
            return self._abort(entry, err.fault, err.reason)
        role = form.role
        if self.state is DecoderState.SKIP:
            if role not in _STARTS:
                if role is Role.STOP:
                    self.state = DecoderState.IDLE
                return []
            self.state = DecoderState.IDLE
        if role in _STARTS:
            return self._start(entry, form, fields)
        if role is Role.STOP:
            return self._stop(entry)
        if role is Role.OTHER_COMMAND:
            return self._abort(entry, _II, f"implementation limit: {form.mnemonic} is not "
                                           f"executed by the CUBE unit")
        if role in (Role.IOT, Role.IOS) and fields["PEMode"] == 0:
            # Zero-mask bindings are strict no-ops, legal anywhere; they only mark
            # zero participation of the open bundle.
            if self._bundle is not None:
                self._bundle.zero_seen = True
                self._bundle.words.append(entry)
            return []
        if self._bundle is None:
            return self._abort(entry, _BC, f"{form.mnemonic} with no active bundle")
        try:
            _HEADER_HANDLERS[role](self, form, fields)
        except _Fault as err:
            return self._abort(entry, err.fault, err.reason)
        self._bundle.words.append(entry)
        return []

    def finish(self, index: int) -> list:
        """End of the stream at instruction ``index``: an open bundle never completed."""
        records = []
        if self._bundle is not None:
            records.append(self._record(_BC, index, "the stream ended inside an open bundle "
                                                    "(no boundary)", self._bundle.words))
        self._bundle = None
        self.state = DecoderState.IDLE
        return records

    def squash(self):
        """The commit of the record the last step returned failed after decode.

        Call it before the next step, when the preflight (or allocation) rejected
        a record this decoder passed.  If a start ended that bundle, the start
        opens nothing (``start.asl``: a failed commit returns before
        ``BeginBundleAt``): the bundle it opened is dropped and the decoder skips to
        the next stop, exactly as when the decoder detects the commit fault itself
        (D9).  A record of an unsupported start returned by the same step (D11)
        belongs to that unopened bundle and must be discarded by the caller.  If a
        stop ended the bundle the decoder is already idle and nothing changes.
        """
        if self.state is not DecoderState.IDLE:
            self._bundle = None
            self.state = DecoderState.SKIP

    # -- boundaries ------------------------------------------------------------------

    def _start(self, entry, form, fields) -> list:
        index = entry[0]
        if form.role is Role.TEPL_START:
            selector = tepl_selector(fields["Mode"], fields["Function"])
            if selector not in TEPL_OPERATIONS:
                # The start handler rejects a selector hole before committing anything.
                return self._abort(entry, _II, f"reserved TEPL selector {selector:#04x} "
                                               f"(Mode {fields['Mode']}, Function "
                                               f"{fields['Function']})")
        if start_reads_retiring_bpcn(form, fields):
            # Also before the commit.  The retiring bundle is a CUBE or TIMG2COL
            # one, or there is none: never a Standard or Floating bundle with a BPCN
            # to read, so this always faults (D10).
            return self._abort(entry, _BC, f"{form.mnemonic} reads the retiring bundle's BPCN, "
                                           f"but no Standard or Floating bundle is retiring")
        records = []
        if self._bundle is not None:
            record = self._commit(index, self._bundle.words)
            records.append(record)
            self._bundle = None
            if not record.ok:
                # The failed commit is reported at this start, which opens nothing.
                self.state = DecoderState.SKIP
                return records
        if form.role is Role.MATRIX_START:
            self._bundle = _OpenBundle(form.operation, fields["DataType"], index, [entry])
            self.state = DecoderState.OPEN
        elif form.role is Role.TEPL_START and selector == TIMG2COL_SELECTOR:
            self._bundle = _OpenBundle(Operation.TIMG2COL, fields["DataType"], index, [entry])
            self.state = DecoderState.OPEN
        else:
            what = (TEPL_OPERATIONS[selector][0] if form.role is Role.TEPL_START
                    else form.mnemonic)
            records.append(self._record(_II, index, f"implementation limit: {what} bundles "
                                                    f"are not executed by the CUBE unit",
                                        [entry]))
            self.state = DecoderState.SKIP
        return records

    def _stop(self, entry) -> list:
        if self._bundle is None:
            return [self._record(_BC, entry[0], "bundle stop with no active bundle", [entry])]
        record = self._commit(entry[0], self._bundle.words + [entry])
        self._bundle = None
        self.state = DecoderState.IDLE
        return [record]

    def _abort(self, entry, fault: FaultClass, reason: str) -> list:
        words = (self._bundle.words if self._bundle is not None else []) + [entry]
        self._bundle = None
        self.state = DecoderState.SKIP
        return [self._record(fault, entry[0], reason, words)]

    @staticmethod
    def _record(fault, index, reason, words) -> BundleRecord:
        return BundleRecord(fault=fault, fault_index=index, reason=reason, words=tuple(words))

    # -- commit-time rules that need no tile state -------------------------------------

    def _commit(self, index: int, words: list) -> BundleRecord:
        b = self._bundle
        try:
            if b.op.is_matrix:
                noop = self._commit_matrix(b)
            else:
                noop = self._commit_timg2col(b)
        except _Fault as err:
            return self._record(err.fault, index, err.reason, words)
        return BundleRecord(bundle=self._descriptor(b, index), noop=noop, words=tuple(words))

    @staticmethod
    def _commit_matrix(b: _OpenBundle) -> bool:
        if b.catr_dr:
            raise _Fault(_BC, "B.CATR DR = 1 in a CUBE bundle")
        if b.zero_seen and not b.effective_bindings:
            return True
        if b.fpatr is None:
            raise _Fault(_BC, "Matrix bundle without B.FPATR")
        if any(size for _, size in b.shared):
            raise _Fault(_TL, "a Matrix bundle takes Shared sources only (B.IOS SizeCode 0)")
        if b.iot_mask is not None and b.ios_mask is not None and b.iot_mask != b.ios_mask:
            raise _Fault(_TL, f"B.IOT mask {mask_text(b.iot_mask)} differs from B.IOS mask "
                              f"{mask_text(b.ios_mask)}")
        if len(b.local_sources) > MAX_MATRIX_LOCAL_SOURCES:
            raise _Fault(_TL, f"{len(b.local_sources)} Local sources (a Matrix bundle takes at "
                              f"most {MAX_MATRIX_LOCAL_SOURCES})")
        if len(b.destinations) > MAX_MATRIX_DESTINATIONS:
            raise _Fault(_TL, f"{len(b.destinations)} destinations (a Matrix bundle takes at "
                              f"most {MAX_MATRIX_DESTINATIONS})")
        return False

    @staticmethod
    def _commit_timg2col(b: _OpenBundle) -> bool:
        if b.zero_seen and not b.effective_bindings:
            return True
        if b.shared:
            raise _Fault(_TL, "TIMG2COL takes no Shared binding (unconsumed B.IOS)")
        if b.iot_shapes != [(1, True, 1)]:
            raise _Fault(_BC, "TIMG2COL needs exactly one effective B.IOT, with one source, "
                              "one destination and last")
        if b.ior is not None and (b.ior[2] or b.ior[3]):
            raise _Fault(_BC, "TIMG2COL B.IOR RegSrc2 and RegDst must be zero")
        return False

    @staticmethod
    def _descriptor(b: _OpenBundle, boundary_index: int) -> Bundle:
        pe_mask = b.iot_mask if b.iot_mask is not None else (b.ios_mask or 0)
        return Bundle(op=b.op, a_type=b.a_type, start_index=b.start_index,
                      boundary_index=boundary_index, datr=b.datr, fpatr=b.fpatr,
                      dims=tuple(b.dims), local_sources=tuple(b.local_sources),
                      destinations=tuple(b.destinations),
                      shared_sources=tuple(tid for tid, _ in b.shared),
                      terminated=b.terminated, ior=b.ior, pe_mask=pe_mask, catr_dr=b.catr_dr)

    # -- header commands and bindings (the open bundle exists; masks are nonzero) -------

    def _catr(self, form, f):
        b = self._bundle
        if b.catr_present:
            raise _Fault(_BC, "second B.CATR")
        if f["trap"]:
            raise _Fault(_II, "implementation limit: B.CATR trap (post-commit trap request) is "
                              "not supported by the CUBE unit")
        b.catr_present = True
        b.catr_dr = bool(f["DR"])

    def _hint(self, form, f):
        if self._bundle.hint_present:
            raise _Fault(_BC, "second B.HINT")
        self._bundle.hint_present = True

    def _datr(self, form, f):
        b = self._bundle
        if b.datr is not None:
            raise _Fault(_BC, "second B.DATR")
        b.datr = Datr(layout=f["Layout"], dtype=f["DataType"], pad=f["PadValueOrByteId"],
                      cmode=f["CMode"], rmode=f["RMode"], sat=f["Sat"],
                      canonicalize=f["Canonicalize"])

    def _fpatr(self, form, f):
        b = self._bundle
        if b.fpatr is not None:
            raise _Fault(_BC, "second B.FPATR")
        if not b.op.is_matrix:
            raise _Fault(_BC, "B.FPATR in a TIMG2COL bundle")
        if b.ior is not None or b.effective_bindings:
            raise _Fault(_BC, "B.FPATR after a B.IOR or an effective B.IOT/B.IOS")
        if f["RowMaxInit"] and not f["RowMaxEn"]:
            raise _Fault(_TL, "B.FPATR RowMaxInit requires RowMaxEn")
        if bool(f["GroupMaxEn"]) != bool(f["GroupNCode"]):
            raise _Fault(_TL, "B.FPATR GroupMaxEn must be set exactly when GroupNCode != 0")
        if f["MaxAbsEn"] and not (f["RowMaxEn"] or f["GroupMaxEn"]):
            raise _Fault(_TL, "B.FPATR MaxAbsEn requires RowMaxEn or GroupMaxEn")
        b.fpatr = Fpatr(pre_quant_mode=f["PreQuantMode"], relu_mode=f["ReluMode"],
                        group_n_code=f["GroupNCode"], row_max_en=bool(f["RowMaxEn"]),
                        group_max_en=bool(f["GroupMaxEn"]), row_max_init=bool(f["RowMaxInit"]),
                        max_abs_en=bool(f["MaxAbsEn"]), trans_a=bool(f["TransA"]),
                        trans_b=bool(f["TransB"]))

    def _set_dim(self, lb: int, value: int):
        b = self._bundle
        if b.dims[lb] is not None:
            raise _Fault(_BC, f"second write to LB{lb}")
        b.dims[lb] = value

    def _dim(self, form, f):
        reg = f["RegSrc"]
        gpr = 0 if reg == 0 else self._gprs[reg]
        self._set_dim(dim_lb_index(form), (gpr + f["uimm17"]) & 0xFFFF)

    def _dimi(self, form, f):
        self._set_dim(f["LoopNest"], f["imm8"])

    def _iot(self, form, f):
        b = self._bundle
        if b.terminated:
            raise _Fault(_BC, "effective B.IOT after the Local stream was closed (L = 1)")
        mask = pe_mask_of_pemode(f["PEMode"])
        if b.iot_mask is not None and mask != b.iot_mask:
            raise _Fault(_TL, f"B.IOT mask {mask_text(mask)} differs from the earlier "
                              f"B.IOT mask {mask_text(b.iot_mask)}")
        if len(b.iot_shapes) == MAX_IOT_WORDS:
            raise _Fault(_TL, f"more than {MAX_IOT_WORDS} effective B.IOT words")
        sources = [f[name] for name in ("SrcTile0", "SrcTile1") if name in f]
        has_destination = "DstTile" in f
        b.iot_mask = mask
        b.local_sources += sources
        if has_destination:
            b.destinations.append(Destination(hand=f["DstTile"], size_code=f["SizeCode"]))
        b.iot_shapes.append((len(sources), has_destination, f["L"]))
        b.terminated = bool(f["L"])

    def _ios(self, form, f):
        b = self._bundle
        mask = pe_mask_of_pemode(f["PEMode"])
        for other, what in ((b.iot_mask, "B.IOT"), (b.ios_mask, "B.IOS")):
            if other is not None and mask != other:
                raise _Fault(_TL, f"B.IOS mask {mask_text(mask)} differs from the earlier "
                                  f"{what} mask {mask_text(other)}")
        if any(tid == f["SharedTID"] for tid, _ in b.shared):
            raise _Fault(_BC, f"Shared tile S{f['SharedTID']} bound twice")
        if len(b.shared) == MAX_SHARED:
            raise _Fault(_BC, f"more than {MAX_SHARED} effective B.IOS bindings")
        b.ios_mask = mask
        b.shared.append((f["SharedTID"], f["SizeCode"]))

    def _ior(self, form, f):
        b = self._bundle
        if b.ior is not None:
            raise _Fault(_BC, "second B.IOR")
        b.ior = (f["RegSrc0"], f["RegSrc1"], f["RegSrc2"], f["RegDst"])


_HEADER_HANDLERS = {
    Role.CATR: BundleDecoder._catr, Role.HINT: BundleDecoder._hint,
    Role.DATR: BundleDecoder._datr, Role.FPATR: BundleDecoder._fpatr,
    Role.DIM: BundleDecoder._dim, Role.DIMI: BundleDecoder._dimi,
    Role.IOT: BundleDecoder._iot, Role.IOS: BundleDecoder._ios, Role.IOR: BundleDecoder._ior,
}


def decode_stream(words, gprs=None) -> list:
    """Decode ``(word, length)`` pairs (or objects with .word/.length) into bundle records."""
    decoder = BundleDecoder(gprs)
    records = []
    count = 0
    for index, item in enumerate(words):
        records += decoder.step(index, *word_and_length(item))
        count = index + 1
    return records + decoder.finish(count)


def decode_parcels(parcels, gprs=None) -> list:
    """Decode a 16-bit parcel stream (split with the length rule, ruling R15)."""
    return decode_stream(parcels_to_words(parcels), gprs)


# ---------------------------------------------------------------------------
# JSON form of a record (``ptocube decode``)
# ---------------------------------------------------------------------------

def _code_name(code: int) -> str:
    return DATATYPE_NAMES.get(code, f"reserved-{code}")


def _bundle_to_dict(b: Bundle) -> dict:
    return {
        "op": b.op.name,
        "start_index": b.start_index,
        "boundary_index": b.boundary_index,
        "a_type": _code_name(b.a_type),
        "b_type": _code_name(b.b_type),
        "datr": None if b.datr is None else {
            "layout": b.datr.layout, "dtype": _code_name(b.datr.dtype), "pad": b.datr.pad,
            "cmode": b.datr.cmode, "rmode": b.datr.rmode, "sat": b.datr.sat,
            "canonicalize": b.datr.canonicalize},
        "fpatr": None if b.fpatr is None else {
            "pre_quant_mode": b.fpatr.pre_quant_mode, "relu_mode": b.fpatr.relu_mode,
            "group_n_code": b.fpatr.group_n_code, "row_max_en": b.fpatr.row_max_en,
            "group_max_en": b.fpatr.group_max_en, "row_max_init": b.fpatr.row_max_init,
            "max_abs_en": b.fpatr.max_abs_en, "trans_a": b.fpatr.trans_a,
            "trans_b": b.fpatr.trans_b},
        "dims": list(b.dims),
        "local_sources": [f"{HANDS[s >> 4]}#{(s & 0xF) + 1}" for s in b.local_sources],
        "destinations": [{"hand": HANDS[d.hand], "size_code": d.size_code,
                          "bytes_per_pe": LOCAL_SIZE_BYTES[d.size_code]}
                         for d in b.destinations],
        "shared_sources": [f"S{tid}" for tid in b.shared_sources],
        "terminated": b.terminated,
        "ior": None if b.ior is None else dict(zip(("RegSrc0", "RegSrc1", "RegSrc2", "RegDst"),
                                                   (GPR_NAMES[r] for r in b.ior))),
        "pe_mask": mask_text(b.pe_mask),
        "catr_dr": b.catr_dr,
    }


def record_to_dict(record: BundleRecord) -> dict:
    """A JSON-ready dict of one record (what ``ptocube decode`` prints)."""
    if not record.ok:
        outcome = record.fault.spec_name
    else:
        outcome = "noop" if record.noop else "ok"
    return {
        "outcome": outcome,
        "fault_index": record.fault_index,
        "reason": record.reason,
        "bundle": None if record.bundle is None else _bundle_to_dict(record.bundle),
        "words": [[i, n, format_word(w, n)] for i, n, w in record.words],
    }


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

_GPR_INDEX = {name: code for code, name in enumerate(GPR_NAMES)}


def _parse_gpr(text: str) -> tuple:
    name, sep, value = text.partition("=")
    key = name.strip().lower()
    if key.startswith("r") and key[1:].isdigit():
        index = int(key[1:])
    else:
        index = _GPR_INDEX.get(key, -1)
    if not sep or not 1 <= index <= 23:
        raise argparse.ArgumentTypeError(f"expected REG=VALUE with REG one of sp, a0-a7, ra, "
                                         f"s0-s8, x0-x3 or R1-R23, got {text!r}")
    try:
        return index, int(value.strip(), 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer value in {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("file", help="instruction words (the `ptocube asm` format), or -")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--bin", action="store_true",
                      help="the input is a little-endian 16-bit parcel image")
    form.add_argument("--asm", action="store_true", help="the input is assembly source")
    parser.add_argument("--gpr", action="append", default=[], type=_parse_gpr,
                        metavar="REG=VALUE", help="a GPR value B.DIM reads (repeatable)")
    parser.add_argument("-o", "--output", help="write to this file instead of standard output")


def run(args) -> int:
    gprs = [0] * 24
    for index, value in args.gpr:
        gprs[index] = value
    try:
        if args.asm:
            name, text = read_input(args.file)
            try:
                words = assemble(text)
            except AsmError as err:
                raise InputError(err.format(name)) from None
        else:
            words = read_words(args.file, args.bin)
    except InputError as err:
        print(err, file=sys.stderr)
        return 2
    text = json.dumps([record_to_dict(r) for r in decode_stream(words, gprs)], indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as fh:
            fh.write(text)
    return 0
