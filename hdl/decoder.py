"""The hardware bundle decoder: parcel beats in, one bundle record per bundle out.

:class:`BundleDecoder` mirrors the golden model's per-instruction state machine
(:class:`ptocube.model.decode.BundleDecoder`) one-to-one; ``docs/hdl-decoder.md`` describes the
design and ``docs/decisions/hdl-decoder.md`` the choices it makes.  A pipeline that takes one
instruction per cycle:

1. :class:`ParcelAligner` buffers parcels and presents the next whole instruction (length from
   its first parcel, ruling R15); a :class:`~ptocube.hdl.skid_buffer.SkidBuffer` registers it.  B.DIM reads its GPR
   as it leaves the skid buffer.
2. Stage M: :class:`InstructionMatcher` compares it with every form of the ISA table of
   :mod:`ptocube.model.isa` (logic generated from the table's masks, matches, field pieces and
   constraints) and registers the results.
3. Stage D: the winning form's role and fields become the decoded instruction register, with
   the header checks that compare against the open bundle's masks and Shared list.
4. Stage E: the bundle state machine applies the header and commit rules (as the model does)
   and registers the record of a completed bundle, the output stream's payload.  A record
   that a start ended waits for the consumer's verdict; ``squash`` drops the bundle that
   start opened (the model's ``squash()``).
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Assert, Cat, Const, Elaboratable, Module, Mux, Signal
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model import isa
from ..model.bundle import Operation, pe_mask_of_pemode
from ..model.datatype import DTYPE_NONE
from ..model.decode import (INDIRECT_BRTYPES, INDIRECT_START_FORMS, MAX_IOT_WORDS,
                            MAX_MATRIX_DESTINATIONS, MAX_MATRIX_LOCAL_SOURCES, MAX_SHARED)
from ..model.faults import FaultClass
from .config import CubeConfig
from .descriptor import (DatrLayout, DestinationLayout, DimLayout, FpatrLayout, IorLayout,
                         RecordLayout)
from .logic import load_in_shares, or_tree, register_copies
from .skid_buffer import SkidBuffer

__all__ = ["ParcelBeat", "ParcelAligner", "InstructionMatcher", "BundleDecoder", "PROGRESS_BOUND"]

#: With ``o.ready`` held high, a C.BSTOP that enters an empty aligner is executed within this
#: many cycles (checked by the formal proof).
PROGRESS_BOUND = 9


def ParcelBeat(parcels_per_beat: int = 2) -> data.StructLayout:
    """Payload of the decoder's input stream.

    ``parcels[0 .. count-1]`` are the next parcels in memory order (little-endian 16-bit
    units, ruling R15).  ``last`` ends the instruction stream after them: the decoder then
    reports a bundle left open (as the model's ``finish``), returns to its idle state and
    numbers the next instruction 0.  A beat may carry no parcels (``count == 0``); a count
    above ``parcels_per_beat`` (which the field can encode) is taken as ``parcels_per_beat``.
    """
    return data.StructLayout({
        "parcels": data.ArrayLayout(16, parcels_per_beat),
        "count": range(parcels_per_beat + 1),
        "last": 1,
    })


def _length_code(first_parcel):
    """Number of parcels minus one of the instruction that starts with ``first_parcel``."""
    low = first_parcel[:4]
    return Mux(low == 0xE, 2, Mux(low == 0xF, 3, Mux(first_parcel[0], 1, 0)))


class ParcelAligner(wiring.Component):
    """Turn a stream of parcel beats into a stream of whole instructions.

    A shift buffer holds up to ``capacity`` parcels, the oldest in slot 0, and at most two
    parcels leave it per cycle.  A 16- or 32-bit head instruction leaves in one step when all
    its parcels are present (its length comes from its first parcel, ruling R15).  A 48- or
    64-bit one takes two: its first two parcels move into a holding register (``part``), and
    the instruction leaves with its remaining one or two parcels.  So the shift logic only
    chooses among three shifts, whatever the instruction lengths.  After a beat with ``last``
    the aligner takes no more input until the stream's parcels have left, followed by an
    ``end`` item; parcels of an instruction that the end cuts short are dropped (the model
    rejects such a stream).

    ``i.ready`` is a function of registers only.  With ``capacity = parcels_per_beat + 3`` (at
    least 4) one 16- or 32-bit instruction leaves per cycle when ``parcels_per_beat >= 2``; a
    48- or 64-bit one every second cycle.

    Members
    -------
    i : In(stream.Signature(ParcelBeat(parcels_per_beat)))
    o : Out(stream.Signature(...)), payload ``word`` (64 bits, parcel 0 in bits 15:0; bits past
        the instruction's length undefined), ``length`` (parcels minus one), ``end`` (the end
        of the stream, no instruction) and ``index`` (instruction index in the stream, modulo
        ``2**index_width``).

    Attributes
    ----------
    fill : Signal, read-only -- parcels held in the shift buffer.
    part : Signal, read-only -- the first half of a 48/64-bit instruction is held.
    ending : Signal, read-only -- the stream's last beat is in and its end has not left.
    """

    def __init__(self, parcels_per_beat: int = 2, index_width: int = 32):
        if parcels_per_beat < 1:
            raise ValueError(f"a beat carries at least one parcel, not {parcels_per_beat}")
        self.parcels_per_beat = parcels_per_beat
        self.capacity = max(4, parcels_per_beat + 3)
        self.fill = Signal(range(self.capacity + 1))
        self.part = Signal()
        self.ending = Signal()
        super().__init__({
            "i": In(stream.Signature(ParcelBeat(parcels_per_beat))),
            "o": Out(stream.Signature(data.StructLayout({
                "word": 64, "length": 2, "end": 1, "index": index_width}))),
        })

    def elaborate(self, platform):
        m = Module()
        cap, per_beat = self.capacity, self.parcels_per_beat
        # Each slot keeps, next to its parcel, the length code the parcel would give as the
        # head of an instruction (computed as it enters), so the head's length is a register.
        parcel = [Signal(16, name=f"parcel{k}") for k in range(cap)]
        code = [Signal(2, name=f"code{k}") for k in range(cap)]
        part, ending = self.part, self.ending
        first = Signal(32)              # the first two parcels of a 48/64-bit instruction
        first_code = Signal(2)          # and its length code
        # The fill level as a thermometer code (``level[n - 1]``: at least n parcels), so that
        # every comparison with it is one bit.
        level = Signal(cap)

        def at_least(n):
            return Const(1) if n <= 0 else Const(0) if n > cap else level[n - 1]

        def exactly(n):
            return at_least(n) & ~at_least(n + 1)

        m.d.comb += self.fill.eq(_select(Cat(exactly(n) for n in range(1, cap + 1)),
                                         range(1, cap + 1)))

        head = code[0]
        has1, has2 = at_least(1), at_least(2)
        # Whether the buffer holds the rest of the instruction: all of a 16/32-bit head, or the
        # one (48-bit) or two (64-bit) parcels after a held first half.
        rest_two = Mux(part, first_code[0], head[0])
        complete = Mux(rest_two, has2, has1)
        short = ~head[1]
        ready_item = complete & (part | short)
        end_item = ending & ~has1 & ~part
        m.d.comb += self.i.ready.eq(~at_least(cap - per_beat + 1) & ~ending)
        # The output is a register, so the consumer's handshake stays out of the shift logic.
        emit = ~self.o.valid | self.o.ready
        index = Signal.like(self.o.p.index)
        with m.If(emit):
            m.d.sync += [
                self.o.valid.eq(ready_item | end_item),
                self.o.p.word.eq(Cat(Mux(part, first, Cat(parcel[0], parcel[1])),
                                     parcel[0], parcel[1])),
                self.o.p.length.eq(Mux(part, first_code, head)),
                self.o.p.end.eq(end_item),
                self.o.p.index.eq(index),
            ]
        take = (ready_item | end_item) & emit
        with m.If(take):
            m.d.sync += index.eq(Mux(end_item, 0, index + 1))
        instruction = ready_item & emit
        # The first half of a long head moves out whenever it is there.
        hold = ~part & ~short & has2
        # The stream ended inside the head instruction: its parcels are dropped (the buffer is
        # emptied, whatever the shift logic does).
        cut = ending & ~Mux(part | short, complete, has2) & (part | has1)
        # How many parcels leave, one-hot: ``leave[c]`` for c parcels.
        leave = Signal(3)
        two = (instruction & rest_two) | hold
        one = instruction & ~rest_two
        m.d.comb += leave.eq(Cat(~one & ~two, one, two))

        accept = self.i.valid & self.i.ready
        with m.If(accept & self.i.p.last):
            m.d.sync += ending.eq(1)
        with m.If(take & end_item):
            m.d.sync += ending.eq(0)
        with m.If(hold):
            m.d.sync += [first.eq(Cat(parcel[0], parcel[1])), first_code.eq(head), part.eq(1)]
        with m.If(instruction | cut):
            m.d.sync += part.eq(0)

        # The next fill level for each number of leaving parcels is prepared from the level
        # and the input alone; the late ``leave`` only picks one.
        # A count above ``parcels_per_beat`` (outside the beat's contract) counts as a full beat.
        arrive = [accept & (self.i.p.count == n) for n in range(per_beat)]
        arrive[0] = ~accept | (self.i.p.count == 0)
        arrive.append(accept & (self.i.p.count >= per_beat))
        levels = [Cat(or_tree(arrive[n] & at_least(k + 1 + c - n) for n in range(per_beat + 1))
                      for k in range(cap)) for c in range(3)]
        m.d.sync += level.eq(or_tree(Mux(leave[c], levels[c], 0) for c in range(3)))
        with m.If(cut):
            m.d.sync += level.eq(0)

        # Slot k's next content is slot k + c of the current buffer followed by the incoming
        # parcels, for the c parcels that leave.  Likewise prepared for every c.
        incoming = [(self.i.p.parcels[j], _length_code(self.i.p.parcels[j]))
                    for j in range(per_beat)]
        for k in range(cap):
            candidates = []
            for c in range(3):
                src = k + c
                option = (Const(0, 16), Const(0, 2))
                for j, slot in reversed(list(enumerate(incoming))):
                    # Incoming parcel j lands at buffer position fill + j.
                    if src >= j:
                        option = tuple(Mux(exactly(src - j), a, b) for a, b in zip(slot, option))
                if src < cap:
                    option = tuple(Mux(at_least(src + 1), a, b)
                                   for a, b in zip((parcel[src], code[src]), option))
                candidates.append(option)
            m.d.sync += [
                parcel[k].eq(or_tree(Mux(leave[c], o[0], 0) for c, o in enumerate(candidates))),
                code[k].eq(or_tree(Mux(leave[c], o[1], 0) for c, o in enumerate(candidates))),
            ]
        return m


class InstructionMatcher(Elaboratable):
    """Decode of one instruction word, generated from :mod:`ptocube.model.isa`.

    Each form of :data:`isa.DECODE_ORDER` matches when the length agrees and
    ``word & mask == match`` for one of its encodings; the first match in decode priority
    wins and its catalog constraints decide ``legal`` (no fall-through, as in
    :func:`isa.match_form`).  Priority is only resolved between forms that can match the same
    word (found from the table at elaboration time), which keeps the logic shallow.

    Parameters
    ----------
    field_names : iterable of str
        Fields to extract: ``fields[name]`` is the winning form's raw value, 0 when it has no
        such field, and ``has[name]`` says whether it has one.
    form_values : dict of name -> (width, function)
        Per-form constants: ``values[name]`` is ``function(form)`` of the winning form, or 0
        when the function returns None for it.
    registered : bool
        Register the per-form match and constraint results (and the word) between the
        comparisons and the selection: the outputs then describe the word presented at the
        last clock edge with ``en`` high.

    Attributes
    ----------
    word : Signal(64), in
    length : Signal(2), in -- parcels minus one.
    en : Signal(), in -- load the pipeline register (``registered`` only).
    stage_word : Signal(64), out -- the word the outputs describe.
    matched, legal : Signal(), out -- some form matches; it matches and its constraints hold.
    form : Signal, out -- catalog index (:data:`isa.FORMS`) of the winning form.
    role : dict of :class:`isa.Role` -> Signal(), out -- the winning form's role.
    win, ok : Signal(len(isa.DECODE_ORDER)), out -- per form of :data:`isa.DECODE_ORDER`: it
        wins (at most one bit is set); its constraints hold.
    """

    def __init__(self, field_names=(), form_values=None, *, registered=False):
        self.registered = registered
        self.word = Signal(64)
        self.length = Signal(2)
        self.en = Signal(init=1)
        self.stage_word = Signal(64)
        self.matched = Signal()
        self.legal = Signal()
        self.form = Signal(range(len(isa.FORMS)))
        self.role = {role: Signal(name=f"role_{role.name.lower()}") for role in isa.Role}
        self.win = Signal(len(isa.DECODE_ORDER))
        self.ok = Signal(len(isa.DECODE_ORDER))
        widths = {}
        for form in isa.FORMS:
            for f in form.fields:
                widths[f.name] = max(widths.get(f.name, 0), f.width)
        unknown = set(field_names) - set(widths)
        if unknown:
            raise ValueError(f"no form has field(s) {', '.join(sorted(unknown))}")
        self.fields = {n: Signal(widths[n], name=f"field_{_ident(n)}") for n in field_names}
        self.has = {n: Signal(name=f"has_{_ident(n)}") for n in field_names}
        self._form_values = dict(form_values or {})
        self.values = {n: Signal(w, name=f"value_{_ident(n)}")
                       for n, (w, _) in self._form_values.items()}

    def elaborate(self, platform):
        m = Module()
        order = isa.DECODE_ORDER
        # Bit k of each vector belongs to form ``order[k]``.
        hit = Signal(len(order))
        ok = self.ok
        hit_now = Cat((self.length == form.length // 16 - 1) &
                      _any((self.word[:form.length] & enc.mask) == enc.match
                           for enc in form.encodings)
                      for form in order)
        ok_now = Cat(_constraints_hold(self.word, form) for form in order)
        if self.registered:
            with m.If(self.en):
                m.d.sync += [hit.eq(hit_now), ok.eq(ok_now), self.stage_word.eq(self.word)]
        else:
            m.d.comb += [hit.eq(hit_now), ok.eq(ok_now), self.stage_word.eq(self.word)]
        word = self.stage_word

        # A form wins when it hits and no earlier form that can match the same word does.
        win = self.win
        m.d.comb += win.eq(Cat(
            hit[k] & ~_any(hit[j] for j in range(k) if _overlap(order[j], form))
            for k, form in enumerate(order)))
        m.d.comb += [
            self.matched.eq(hit.any()),
            self.legal.eq((win & ok).any()),
            self.form.eq(_select(win, [isa.FORMS.index(f) for f in order])),
        ]

        def winner_among(forms):
            """Whether the winner is one of ``forms`` (a one-hot test against a constant)."""
            return (win & sum(1 << order.index(f) for f in forms)).any()

        for role, sig in self.role.items():
            m.d.comb += sig.eq(winner_among(f for f in order if f.role is role))
        for name, (_, function) in self._form_values.items():
            m.d.comb += self.values[name].eq(_select(win, [function(f) or 0 for f in order]))
        for name, sig in self.fields.items():
            # Forms that place the field identically share one extractor.
            by_pieces = {}
            for form in order:
                for f in form.fields:
                    if f.name == name:
                        by_pieces.setdefault(f.pieces, []).append(form)
            present = {pieces: winner_among(forms) for pieces, forms in by_pieces.items()}
            m.d.comb += [
                sig.eq(or_tree(Mux(sel, _extract(word, pieces), 0)
                           for pieces, sel in present.items())),
                self.has[name].eq(_any(present.values())),
            ]
        return m

    def legal_winner(self, forms, condition=None):
        """Whether the winner is one of ``forms``, its constraints hold and, if given,
        ``condition(form)`` (an expression of :attr:`stage_word`) holds for it.

        A flat OR of per-form terms: each form's fields are taken from its own pieces, so no
        term waits for the selected role or fields (a shallower path than combining
        :attr:`legal`, :attr:`role` and :attr:`fields`; the result is the same because at most
        one form wins).
        """
        order = isa.DECODE_ORDER
        terms = []
        for form in forms:
            k = order.index(form)
            term = self.win[k] & self.ok[k]
            if condition is not None:
                term = term & condition(form)
            terms.append(term)
        return _any(terms)

    def field_of(self, form, name):
        """Field ``name`` of the stage word as ``form`` places it."""
        field = form.field(name)
        return _extract(self.stage_word, field.pieces)[:field.width]


def _overlap(a, b) -> bool:
    """Whether some word of one length matches both forms (their fixed bits agree)."""
    return a.length == b.length and any(
        not ((ea.match ^ eb.match) & ea.mask & eb.mask)
        for ea in a.encodings for eb in b.encodings)


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).lower()


def _any(bits):
    bits = list(bits)
    return Cat(*bits).any() if bits else Const(0, 1)


def _select(one_hot, constants):
    """The constant at the set bit of ``one_hot`` (0 when none is set)."""
    width = max(1, max(constants).bit_length())
    return or_tree(Mux(one_hot[k], Const(c, width), 0) for k, c in enumerate(constants) if c)


def _extract(word, pieces):
    value = Const(0, 1)
    for p in pieces:
        value = value | (word[p.instruction_lsb:p.instruction_lsb + p.width] << p.value_lsb)
    return value


def _table_lookup(allowed, index, width):
    """Whether ``index`` (``width`` bits) is in the set ``allowed``: one constant bit table."""
    table = sum(1 << v for v in allowed if v < 1 << width)
    return Const(table, 1 << width).bit_select(index, 1)


def _constraints_hold(word, form):
    """Whether every catalog constraint of ``form`` holds for ``word`` (combinational)."""
    terms = []
    for c in form.constraints:
        f = form.field(c.field)
        value = _extract(word, f.pieces)
        if f.width <= 8:
            allowed = [v for v in range(1 << f.width) if c.holds(v)]
            if len(allowed) < 1 << f.width:
                terms.append(_table_lookup(allowed, value, f.width))
        elif c.op == "one-of":
            terms.append(_any(value == v for v in c.values))
        else:
            terms.append(~_any(value == v for v in c.values))
    return Cat(*terms).all() if terms else Const(1, 1)


class _State(enum.Enum, shape=2):
    """Where the bundle state machine is between instructions (the model's DecoderState)."""
    IDLE = 0    # no bundle open
    OPEN = 1    # a CUBE or TIMG2COL bundle is collecting its header
    SKIP = 2    # after a fault: discard up to and including the next stop


def _pe_mask_table():
    """The PE mask of each PEMode, indexable by a signal."""
    return Array(Const(pe_mask_of_pemode(mode), 4) for mode in range(8))


#: Copies of each output entry's empty flag, each enabling a share of the entry (issue #9).
_ENTRY_ENABLES = 4


class _HeldKind(enum.Enum, shape=2):
    """What a squash does to the record the state machine holds while a verdict is pending.

    The record was completed speculatively inside the bundle that the squashed record's start
    opened; after the squash that start opens nothing and the model skips from there (D29).
    """
    DROP = 0          # nothing is reported from SKIP (a header fault, a stop, the stream end)
    KEEP = 1          # a start refused before any commit (TEPL hole, IND/ICALL): reported anyway
    REOPEN = 2        # a commit at a CUBE/TIMG2COL start: dropped, and that start opens its bundle
    TO_ILLEGAL = 3    # a commit at an unsupported start: becomes that start's own fault record


def _decoded_layout(index_width):
    """One decoded instruction, as registered between the matcher and the state machine."""
    return data.StructLayout({
        "index": index_width,
        # What the instruction is: exactly one of the kinds below is set.
        "end": 1,              # end of the stream (no instruction)
        "reject": 1,           # no form matches, a constraint fails, or a command form this
                               # unit does not execute (Fault_IllegalInstruction unless skipping)
        "hole": 1,             # BSTART.TEPL with an unassigned selector
        "indirect": 1,         # a start whose transfer reads the retiring bundle's BPCN
        "open_matrix": 1,      # one of the twelve CUBE starts
        "open_timg2col": 1,    # BSTART.TEPL Mode 3 Function 4
        "other_start": 1,      # a legal start of a bundle this unit does not execute
        "stop": 1,
        "zero": 1,             # B.IOT/B.IOS with PEMode 0: a strict no-op
        "header": 1,           # a header command or an effective binding; one of:
        "catr": 1, "hint": 1, "datr": 1, "fpatr": 1, "dim": 1, "iot": 1, "ios": 1, "ior": 1,
        # Operands.
        "op": Operation,
        "dtype": 5,            # start AType or B.DATR DataType
        "datr_f": DatrLayout,
        "fpatr_f": FpatrLayout,
        "fpatr_bad": 1,        # a B.FPATR whose fields break a consistency rule
        "dim_lb": 3,           # one-hot: the LB register a B.DIM/C.B.DIMI writes, with the value
        "dim_gpr": 16,         # the GPR port's value, used when
        "dim_reads_gpr": 1,    # the instruction is a B.DIM with RegSrc != 0; plus
        "dim_imm": 16,         # uimm17 (B.DIM; bit 16 cannot reach the 16-bit sum) or imm8
        "src0": 6, "src1": 6, "has_src0": 1, "has_src1": 1, "has_dst": 1,
        "dst_hand": 2, "size_code": 4, "last": 1, "mask": 4,
        "tid": 8,
        # Header checks against the open bundle as it will be when the instruction executes.
        # Computed from the binding fields whatever the instruction is (the state machine
        # combines them with ``iot``/``ios``), so they do not wait for the match.
        "iot_differs": 1,      # the mask differs from the bundle's B.IOT mask
        "ios_differs": 1,      # the mask differs from the bundle's B.IOS mask
        "duplicate": 1,        # the SharedTID is already bound in the bundle
        "catr_trap": 1,        # a B.CATR requesting a post-commit trap
        "ior_f": IorLayout,
        "dr": 1,
    })


_MATCHED_FIELDS = (
    "DataType",
    "CMode", "PadValueOrByteId", "Sat", "Canonicalize", "RMode", "Layout",
    "PreQuantMode", "ReluMode", "GroupNCode", "RowMaxEn", "GroupMaxEn", "RowMaxInit",
    "MaxAbsEn", "TransA", "TransB",
    "uimm17", "imm8",
    "SrcTile0", "SrcTile1", "L", "SizeCode", "PEMode", "DstTile", "SharedTID",
    "RegSrc0", "RegSrc1", "RegSrc2", "RegDst", "DR",
)


class BundleDecoder(wiring.Component):
    """Decode a parcel stream into bundle records, exactly as the golden model does.

    Parameters
    ----------
    config : CubeConfig
        ``max_local_sources``, ``max_destinations``, ``max_shared`` size the descriptor's
        lists and ``max_iot_words`` bounds the effective B.IOT words.  The defaults are the
        spec's own limits; a smaller bound is an implementation limit reported as a fault
        (``docs/decisions/hdl-decoder.md``), never a truncation.
    parcels_per_beat : int
        Parcels per input beat; 2 (the default) sustains one 16/32-bit instruction per cycle.
    index_width : int
        Width of the instruction indices (counted modulo ``2**index_width``).
    checks : None, ``"contract"`` or ``"all"``
        Add ``Assert`` statements for formal verification and simulation (see
        :meth:`_add_checks`); none by default.

    Members
    -------
    i : In(stream.Signature(ParcelBeat(parcels_per_beat)))
        Instruction parcels in memory order.
    o : Out(stream.Signature(RecordLayout(config, index_width)))
        One record per completed bundle (or per rejected instruction): a descriptor, or a
        fault class with the index of the reporting instruction.
    gpr_index : Out(5), gpr_value : In(16), gpr_read : Out(1)
        Read port of the scalar register file for B.DIM: ``gpr_value`` must hold the low 16
        bits of GPR ``gpr_index`` combinationally, in the same cycle.  ``gpr_read`` marks the
        cycle in which a B.DIM takes the value (GPR 0 reads as zero and is not read).
    squash : In(1)
        The commit of the last record taken from ``o`` failed after decode (preflight or
        allocation), the model's ``BundleDecoder.squash()`` (decision D29).  A descriptor record
        whose boundary was a start waits for its verdict after it is taken: the first later
        cycle with ``squash`` or ``o.ready`` high settles it (``squash`` wins; ``o.ready`` alone
        means committed).  A consumer that may squash therefore keeps ``o.ready`` low after
        taking a record until it knows the verdict, and asserts ``squash`` (one cycle is enough)
        at the latest in the cycle it raises ``o.ready`` again.  Until then the decoder keeps
        decoding the bundle that start opened but holds back (``o.valid`` low) the first record
        it completes there.  On ``squash`` that start opens nothing: the decoder drops its
        bundle and skips to the next stop, and fixes up the held record as the model would have
        decoded it from there; no accepted parcel is lost or refetched.  ``squash`` is ignored
        after any other record (fault, or a bundle ended by a stop: the model's ``squash()``
        changes nothing there either).

    Latency: without stalls, the record of a bundle is on ``o`` six cycles after the beat
    with the boundary instruction's last parcel is accepted (aligner buffer and output, skid
    buffer, stages M, D and E).  Throughput: one 16- or 32-bit instruction per cycle with two
    parcels per beat; a 48- or 64-bit instruction takes two cycles in the aligner.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), *, parcels_per_beat: int = 2,
                 index_width: int = 32, checks=None):
        problems = [f"{name} must be at least 1, not {getattr(config, name)}"
                    for name in ("max_local_sources", "max_destinations", "max_shared",
                                 "max_iot_words") if getattr(config, name) < 1]
        if index_width < 1:
            problems.append(f"index_width must be positive, not {index_width}")
        if checks not in (None, "contract", "all"):
            problems.append(f"checks must be None, 'contract' or 'all', not {checks!r}")
        if problems:
            self._MustUse__silence = True       # no "created but never used" warning
            raise ValueError("; ".join(problems))
        self.config = config
        self.parcels_per_beat = parcels_per_beat
        self.index_width = index_width
        self.checks = checks
        self.record_layout = RecordLayout(config, index_width)
        super().__init__({
            "i": In(stream.Signature(ParcelBeat(parcels_per_beat))),
            "o": Out(stream.Signature(self.record_layout)),
            "gpr_index": Out(5),
            "gpr_value": In(16),
            "gpr_read": Out(1),
            "squash": In(1),
        })

    # Thresholds of the counting rules: the model's limits, or a smaller elaborated bound.
    @property
    def local_limit(self):
        return min(MAX_MATRIX_LOCAL_SOURCES, self.config.max_local_sources)

    @property
    def destination_limit(self):
        return min(MAX_MATRIX_DESTINATIONS, self.config.max_destinations)

    @property
    def shared_limit(self):
        return min(MAX_SHARED, self.config.max_shared)

    @property
    def iot_limit(self):
        return min(MAX_IOT_WORDS, self.config.max_iot_words)

    def elaborate(self, platform):
        m = Module()
        m.submodules.aligner = aligner = ParcelAligner(self.parcels_per_beat, self.index_width)
        wiring.connect(m, wiring.flipped(self.i), aligner.i)

        # A skid buffer after the aligner, so that stalls of the later stages do not reach
        # back into the aligner's shift logic.
        m.submodules.fetched = fetched = SkidBuffer(aligner.o.payload.shape())
        wiring.connect(m, aligner.o, fetched.i)

        # Stage M: the matcher's per-form comparisons, registered (inside the matcher) with
        # the instruction's index and end flag.  Stage D: the decoded instruction ``d``.
        matcher = m.submodules.matcher = InstructionMatcher(_MATCHED_FIELDS, {
            "op": (6, lambda f: f.operation.value if f.role is isa.Role.MATRIX_START else None),
        }, registered=True)
        m_valid, m_index, m_end = Signal(), Signal(self.index_width), Signal()
        d = Signal(_decoded_layout(self.index_width))
        d_valid = Signal()
        consume = Signal()       # the state machine is done with ``d`` this cycle
        d_free = ~d_valid | consume
        m_free = ~m_valid | d_free
        m.d.comb += [
            fetched.o.ready.eq(m_free),
            matcher.en.eq(m_free),
            matcher.word.eq(fetched.o.p.word),
            matcher.length.eq(fetched.o.p.length),
        ]
        # B.DIM reads its GPR as it enters stage M, straight from the instruction bits (every
        # B.DIM form places RegSrc alike), so the register file's read path ends in a register.
        word = fetched.o.p.word
        dims = [form for form in isa.FORMS if form.role is isa.Role.DIM]
        (reg_src_pieces,) = {form.field("RegSrc").pieces for form in dims}
        reg_src = _extract(word, reg_src_pieces)
        is_dim = (~fetched.o.p.end & (fetched.o.p.length == 1) &
                  _any(((word[:32] & enc.mask) == enc.match) & _constraints_hold(word, form)
                       for form in dims for enc in form.encodings))
        m_gpr = Signal(16)
        m.d.comb += [
            self.gpr_index.eq(reg_src),
            self.gpr_read.eq(fetched.o.valid & m_free & is_dim & (reg_src != 0)),
        ]
        with m.If(m_free):
            m.d.sync += [m_valid.eq(fetched.o.valid), m_index.eq(fetched.o.p.index),
                         m_end.eq(fetched.o.p.end), m_gpr.eq(self.gpr_value)]
        with m.If(d_free):
            m.d.sync += d_valid.eq(m_valid)
        b = _BundleRegisters(self)
        self._decode(m, matcher, m_valid & d_free, m_index, m_end, m_gpr, d, b, consume)

        step = self._bundle_state_machine(m, d, d_valid, consume, b)
        if self.checks is not None:
            self._add_checks(m, aligner, fetched, m_valid, d, d_valid, b, step)
        return m

    # -- stage D: decode ---------------------------------------------------------------

    def _decode(self, m, matcher, load, index, end, gpr, out, b, consume):
        """Turn the matcher's result into the decoded-instruction register ``out``.

        ``load`` marks the cycle the instruction moves into ``out``; ``gpr`` is the GPR value a
        B.DIM read as it entered stage M.  ``b`` are the bundle registers and ``consume`` says
        the state machine takes the current ``out`` in this cycle: the checks against the
        bundle's masks and Shared list are made here, against the bundle as it will be when the
        instruction reaches the state machine.
        """
        role, f, has = matcher.role, matcher.fields, matcher.has

        (reg_src_pieces,) = {form.field("RegSrc").pieces for form in isa.FORMS
                             if form.role is isa.Role.DIM}
        reg_src = _extract(matcher.stage_word, reg_src_pieces)

        # The kind flags are flat ORs over the forms of one role, each form's term testing its
        # own fields (``matcher.legal_winner``), not the selected role and fields in series.
        field_of = matcher.field_of

        def legal_as(roles, condition=None):
            return ~end & matcher.legal_winner(
                [form for form in isa.DECODE_ORDER if form.role in roles], condition)

        def selector(form):
            return Cat(field_of(form, "Function"), field_of(form, "Mode"))

        def hole(form):
            """BSTART.TEPL with an unassigned selector."""
            if form.role is not isa.Role.TEPL_START:
                return Const(0)
            return ~_table_lookup(isa.TEPL_OPERATIONS, selector(form), 7)

        def indirect(form):
            """A start whose transfer reads the retiring bundle's BPCN (unless a hole)."""
            if form.form_id in INDIRECT_START_FORMS:
                return Const(1)
            if "BrType" in form.field_names:
                return _table_lookup(INDIRECT_BRTYPES, field_of(form, "BrType"), 3)
            return Const(0)

        def regular(form):
            return ~hole(form) & ~indirect(form)

        def timg2col(form):
            return selector(form) == isa.TIMG2COL_SELECTOR

        def zero(form):
            """A binding with PEMode 0 (a strict no-op)."""
            if form.role not in (isa.Role.IOT, isa.Role.IOS):
                return Const(0)
            return field_of(form, "PEMode") == 0

        def fpatr_bad(form):
            """B.FPATR field consistency (Fault_TileLegality at the B.FPATR) needs no state."""
            row_max, group_max = field_of(form, "RowMaxEn"), field_of(form, "GroupMaxEn")
            return ((field_of(form, "RowMaxInit") & ~row_max) |
                    (group_max != (field_of(form, "GroupNCode") != 0)) |
                    (field_of(form, "MaxAbsEn") & ~(row_max | group_max)))

        tepl = role[isa.Role.TEPL_START]
        pe_mask = _pe_mask_table()[f["PEMode"]]

        # The header checks that compare with the open bundle's lists and masks are made here,
        # against the bundle as it will be when this instruction reaches the state machine:
        # the instruction the state machine takes now (``consume``) is forwarded - a start
        # that opens a bundle clears it, a binding records its mask and SharedTID.  Each check
        # is prepared both ways and the late ``consume`` only picks one.
        iot = legal_as([isa.Role.IOT], lambda form: ~zero(form))
        # The PEMode and SharedTID bits of the binding forms (one placement each), taken before
        # the match is known.
        (pemode_pieces,) = {form.field("PEMode").pieces for form in isa.FORMS
                            if form.role in (isa.Role.IOT, isa.Role.IOS)}
        early_mask = _pe_mask_table()[_extract(matcher.stage_word, pemode_pieces)]
        (tid_pieces,) = {form.field("SharedTID").pieces for form in isa.FORMS
                         if form.role is isa.Role.IOS}
        tid = _extract(matcher.stage_word, tid_pieces)
        stored = _any(valid & (slot == tid) for valid, slot in zip(b.shared_valid, b.shared))
        iot_differs_now = b.iot_any & (b.iot_mask != early_mask)
        ios_differs_now = b.ios_any & (b.ios_mask != early_mask)
        new_bundle = out.open_matrix | out.open_timg2col
        differs_from_out = out.mask != early_mask
        iot_differs = Mux(consume, ~new_bundle & Mux(out.iot, differs_from_out, iot_differs_now),
                          iot_differs_now)
        ios_differs = Mux(consume, ~new_bundle & Mux(out.ios, differs_from_out, ios_differs_now),
                          ios_differs_now)
        duplicate = Mux(consume, ~new_bundle & (stored | (out.ios & (out.tid == tid))), stored)

        start_roles = (isa.Role.MATRIX_START, isa.Role.TEPL_START, isa.Role.OTHER_START,
                       isa.Role.TRACE_START)
        ios = legal_as([isa.Role.IOS], lambda form: ~zero(form))
        dim = legal_as([isa.Role.DIM, isa.Role.DIMI])
        # The LB register a B.DIM (one per form) or C.B.DIMI (its LoopNest) writes, one-hot.
        def writes_lb(k):
            return (legal_as([isa.Role.DIM], lambda form: Const(int(isa.dim_lb_index(form) == k))) |
                    legal_as([isa.Role.DIMI], lambda form: field_of(form, "LoopNest") == k))

        dim_lb = Cat(writes_lb(k) for k in range(3))
        header_roles = (isa.Role.CATR, isa.Role.HINT, isa.Role.DATR, isa.Role.FPATR,
                        isa.Role.DIM, isa.Role.DIMI, isa.Role.IOT, isa.Role.IOS, isa.Role.IOR)
        with m.If(load):
            m.d.sync += [
                out.index.eq(index),
                out.end.eq(end),
                out.reject.eq(~end & ~legal_as(set(isa.Role) - {isa.Role.OTHER_COMMAND})),
                out.hole.eq(legal_as([isa.Role.TEPL_START], hole)),
                out.indirect.eq(legal_as(start_roles, lambda form: ~hole(form) & indirect(form))),
                out.open_matrix.eq(legal_as([isa.Role.MATRIX_START], regular)),
                out.open_timg2col.eq(legal_as([isa.Role.TEPL_START],
                                              lambda form: regular(form) & timg2col(form))),
                out.other_start.eq(legal_as([isa.Role.OTHER_START, isa.Role.TRACE_START],
                                            regular) |
                                   legal_as([isa.Role.TEPL_START],
                                            lambda form: regular(form) & ~timg2col(form))),
                out.stop.eq(legal_as([isa.Role.STOP])),
                out.zero.eq(legal_as([isa.Role.IOT, isa.Role.IOS], zero)),
                out.header.eq(legal_as(header_roles, lambda form: ~zero(form))),
                out.catr.eq(legal_as([isa.Role.CATR])),
                out.hint.eq(legal_as([isa.Role.HINT])),
                out.datr.eq(legal_as([isa.Role.DATR])),
                out.fpatr.eq(legal_as([isa.Role.FPATR])),
                out.dim.eq(dim),
                out.iot.eq(iot),
                out.ios.eq(ios),
                out.ior.eq(legal_as([isa.Role.IOR])),

                out.op.eq(Mux(tepl, Operation.TIMG2COL, matcher.values["op"])),
                out.dtype.eq(f["DataType"]),
                out.datr_f.eq(Cat(f["Layout"], f["DataType"], f["PadValueOrByteId"], f["CMode"],
                                  f["RMode"], f["Sat"], f["Canonicalize"])),
                out.fpatr_f.eq(Cat(f["PreQuantMode"], f["ReluMode"], f["GroupNCode"],
                                   f["RowMaxEn"], f["GroupMaxEn"], f["RowMaxInit"], f["MaxAbsEn"],
                                   f["TransA"], f["TransB"])),
                out.fpatr_bad.eq(legal_as([isa.Role.FPATR], fpatr_bad)),
                out.dim_lb.eq(dim_lb),
                out.dim_gpr.eq(gpr),
                out.dim_reads_gpr.eq(role[isa.Role.DIM] & (reg_src != 0)),
                out.dim_imm.eq(Mux(role[isa.Role.DIMI], f["imm8"], f["uimm17"][:16])),
                out.src0.eq(f["SrcTile0"]), out.has_src0.eq(has["SrcTile0"]),
                out.src1.eq(f["SrcTile1"]), out.has_src1.eq(has["SrcTile1"]),
                out.has_dst.eq(has["DstTile"]), out.dst_hand.eq(f["DstTile"]),
                out.size_code.eq(f["SizeCode"]), out.last.eq(f["L"]), out.mask.eq(pe_mask),
                out.tid.eq(f["SharedTID"]),
                out.iot_differs.eq(iot_differs),
                out.ios_differs.eq(ios_differs),
                out.duplicate.eq(duplicate),
                out.catr_trap.eq(legal_as([isa.Role.CATR],
                                          lambda form: field_of(form, "trap"))),
                out.ior_f.eq(Cat(f["RegSrc0"], f["RegSrc1"], f["RegSrc2"], f["RegDst"])),
                out.dr.eq(f["DR"]),
            ]

    # -- stage E: the bundle state machine -----------------------------------------------

    def _bundle_state_machine(self, m, d, d_valid, consume, b):
        """The model's state machine, the output record and the squash protocol.

        Every rule is written as a flat sum of products of the decoded instruction's kind
        flags, the state and the bundle registers' flags (which are mutually exclusive where
        they are ORed), so that the fault code and the next state are two or three LUT levels
        deep.
        """
        state = Signal(_State)
        # OPEN and SKIP each have a bit of their own (state 3 is never reached), so every test
        # of the state is one flip-flop, not a decode of two (decision H18).
        open_, skip = state.as_value()[0], state.as_value()[1]
        idle = ~open_ & ~skip

        # -- commit-time rules: a function of flags kept up to date by the header updates --
        noop = b.zero_seen & ~b.iot_any & ~b.ios_any
        matrix, timg2col = ~b.timg2col, b.timg2col
        commit_bc = ((matrix & (b.catr_dr | (~noop & ~b.fpatr_valid))) |
                     (timg2col & ~noop & ~b.ios_any &
                      (~b.timg2col_shape | (b.ior_valid & b.ior_extra))))
        commit_tl = ((matrix & ~b.catr_dr & ~noop & b.fpatr_valid &
                      (b.shared_dest | b.mask_conflict | b.local_over | b.dest_over)) |
                     (timg2col & ~noop & b.ios_any))
        commit_noop = noop & ~(matrix & b.catr_dr)

        # -- header-time rules of the instruction in ``d`` (meaningful when a bundle is open) --
        dim_written = _any(d.dim_lb[k] & b.dims[k].written for k in range(3))
        header_ii = d.catr_trap & ~b.catr_seen           # implementation limit: no post-commit trap
        header_bc = ((d.catr & b.catr_seen) | (d.hint & b.hint_seen) | (d.datr & b.datr_valid) |
                     dim_written | (d.ior & b.ior_valid) | (d.iot & b.terminated) |
                     (d.fpatr & b.fpatr_closed) |
                     (d.ios & ~d.iot_differs & ~d.ios_differs & (d.duplicate | b.ios_full)))
        header_tl = ((d.fpatr_bad & ~b.fpatr_closed) |
                     (d.iot & ~b.terminated & (d.iot_differs | b.iot_full)) |
                     (d.ios & (d.iot_differs | d.ios_differs)))

        # -- the step: which record the instruction completes, and the next state --
        starts = d.open_matrix | d.open_timg2col | d.other_start
        commit = open_ & (starts | d.stop)      # the open bundle ends here
        emit_ii = ((d.reject & ~skip) | d.hole | (d.other_start & ~open_) |
                   (d.header & open_ & header_ii))
        emit_bc = ((d.end & open_) | d.indirect | (commit & commit_bc) | (d.stop & idle) |
                   (d.header & idle) | (d.header & open_ & header_bc))
        emit_tl = (commit & commit_tl) | (d.header & open_ & header_tl)
        emit = Signal()
        emit_fault = Signal(2)
        m.d.comb += [
            emit.eq(emit_ii | emit_bc | emit_tl | commit),
            emit_fault.eq(Cat(emit_ii | emit_tl, emit_bc | emit_tl)),
        ]
        commit_ok = ~commit_bc & ~commit_tl
        next_open = (((d.open_matrix | d.open_timg2col) & ~(open_ & ~commit_ok)) |
                     (open_ & (d.zero | (d.header & ~header_ii & ~header_bc & ~header_tl))))
        next_idle = d.end | d.stop | (d.zero & idle)
        next_state = Mux(next_open, _State.OPEN, Mux(next_idle, _State.IDLE, _State.SKIP))

        # -- the output registers and the verdict of records that a start ended --
        # A descriptor record whose boundary was a start is *pending* from its transfer until
        # the consumer settles it: ``squash`` (the commit failed after decode) or ``o.ready``
        # without ``squash`` (committed), whichever comes first.  Meanwhile the state machine
        # runs on inside the bundle that start opened; the first record it completes there is
        # held (``o.valid`` low) and the state machine waits.  A squash is applied one cycle
        # later (``squashing``): it drops that bundle as the model's ``squash()`` does, fixing
        # up the held record by its ``kind``.
        # The records leave through two entries in a ring (``head`` is the older one, ``out``;
        # the other, ``spare``, catches a record completed while ``out`` stalls), so that the
        # state machine's enable is a function of registers and the consumer's late
        # ``o.ready`` reaches only the entries' valid bits, ``head`` and the verdict (decision
        # H16).  A record is loaded into every empty entry, so an entry's wide enable is its
        # own valid flip-flop and a take moves no record (decision H19).  A pending verdict
        # keeps ``spare`` empty: the held record is always in ``out``.
        entry = data.StructLayout({
            "fault": 2,                 # the decoder reports fault classes 1..3 only
            "index": self.index_width,
            "bundle": self.record_layout.descriptor,
            "needs_verdict": 1,
            "kind": _HeldKind,
        })
        entries = [Signal(entry, name=f"out{k}") for k in range(2)]
        held = [Signal(name=f"out{k}_valid") for k in range(2)]
        head = Signal()
        out, out_valid, spare_valid = Signal(entry), Signal(), Signal()
        m.d.comb += [out.eq(Mux(head, entries[1], entries[0])),
                     out_valid.eq(Mux(head, held[1], held[0])),
                     spare_valid.eq(Mux(head, held[0], held[1]))]
        pending = Signal()
        squashing = Signal()
        m.d.comb += self.o.valid.eq(out_valid & ~pending)
        taken = self.o.valid & self.o.ready
        # The state machine may complete a record: the spare entry is free and no record is
        # held for a verdict.
        room = ~spare_valid & ~(pending & out_valid)
        # An unsupported start that closes a bundle completes two records (the model returns
        # both from one step): the commit record, then Fault_IllegalInstruction at the start,
        # which waits here for one cycle.
        second = Signal()
        # ``busy`` is set whenever ``second`` or ``squashing`` will be (and at every commit at
        # an unsupported start, even a failed one: a one-cycle bubble there is harmless), so
        # the state machine's enable needs one register less.
        busy = Signal()
        go = d_valid & room & ~busy
        m.d.comb += consume.eq(go)
        squash_now = pending & self.squash & ~squashing
        m.d.sync += busy.eq((go & commit & d.other_start) | (second & ~room) | squash_now)

        with m.If(go):
            m.d.sync += state.eq(next_state)
            with m.If(commit & d.other_start & commit_ok):
                m.d.sync += second.eq(1)
        # The bundle registers follow the instruction whatever the state and the checks say:
        # a start clears them (the new bundle opens only if the state machine says so), a
        # header command records itself (a rejected one moves to SKIP, and the registers of a
        # bundle that is not open are never read).  This keeps the checks off their enables.
        with m.If(go & (d.open_matrix | d.open_timg2col)):
            b.open(m, d)
        with m.Elif(go):
            b.record(m, d)

        # The record completed in this cycle, raw: the fault code, the index and the
        # descriptor snapshot (meaningful at a boundary, the only place a descriptor record
        # is completed); the record's conventions (zero descriptor in a fault record, zero
        # index in a descriptor record) are applied combinationally at the port.
        record = Signal(entry)
        record_valid = Signal()
        step_index = Signal(self.index_width)   # the start's index, for its second record
        with m.If(go):
            m.d.sync += step_index.eq(d.index)
        m.d.comb += b.descriptor_statements(record.bundle, d.index, commit_noop)
        with m.If(second):
            m.d.comb += [record_valid.eq(1), record.fault.eq(FaultClass.ILLEGAL_INSTRUCTION),
                         record.index.eq(step_index), record.kind.eq(_HeldKind.DROP)]
        with m.Else():
            m.d.comb += [
                record_valid.eq(go & emit), record.fault.eq(emit_fault),
                record.index.eq(d.index),
                record.needs_verdict.eq(commit & starts & commit_ok),
                record.kind.eq(Mux(d.hole | d.indirect, _HeldKind.KEEP,
                                   Mux(d.other_start, _HeldKind.TO_ILLEGAL,
                                       Mux(d.open_matrix | d.open_timg2col, _HeldKind.REOPEN,
                                           _HeldKind.DROP)))),
            ]
        with m.If(second & room):
            m.d.sync += second.eq(0)
        new = record_valid & room       # ``room`` also holds back ``second``'s record
        # A new record is held by the entry behind the head's (the head's own when the ring is
        # empty; while a take frees the head, the other entry is empty).
        tail = head ^ out_valid
        with m.If(taken):
            m.d.sync += head.eq(~head)
        # Each valid bit is registered from ``held_next`` together with copies of its
        # inverse, each the enable of a share of its entry: one flip-flop's 307 enables
        # spanned the device (8.95 ns in session 25's route, issue #9).
        held_next = [Signal(name=f"out{k}_valid_next") for k in range(2)]
        empties = []
        for k, (slot, valid, nxt) in enumerate(zip(entries, held, held_next)):
            m.d.comb += nxt.eq(valid)
            with m.If(new & (tail == k)):
                m.d.comb += nxt.eq(1)
            with m.If(taken & (head == k)):
                m.d.comb += nxt.eq(0)
            m.d.sync += valid.eq(nxt)
            # An empty entry follows the record whatever happens (as in ``SkidBuffer``).
            empty = register_copies(m, ~nxt, _ENTRY_ENABLES, f"out{k}_empty", init=1)
            empties.append((valid, empty))
            load_in_shares(m, slot, record, empty)

        # The fix-up is tested first: it depends on registers only, so the late ``o.ready`` and
        # ``squash`` stay off the enables of the state and the output registers (while
        # ``squashing``, nothing is taken and no verdict is due).
        with m.If(squashing):
            m.d.sync += [pending.eq(0), squashing.eq(0)]
            # The start that ended the squashed record opens nothing: what the state machine
            # did since is redone as the model does it from SKIP.
            with m.If(~out_valid):
                m.d.sync += [state.eq(_State.SKIP), second.eq(0)]
            with m.Elif((out.kind == _HeldKind.DROP) | (out.kind == _HeldKind.REOPEN)):
                for k, nxt in enumerate(held_next):
                    with m.If(head == k):
                        m.d.comb += nxt.eq(0)
                with m.If(out.kind == _HeldKind.REOPEN):
                    m.d.sync += state.eq(_State.OPEN)
            with m.Elif(out.kind == _HeldKind.TO_ILLEGAL):
                m.d.sync += second.eq(0)
                for k, slot in enumerate(entries):
                    with m.If(head == k):
                        m.d.sync += [slot.fault.eq(FaultClass.ILLEGAL_INSTRUCTION),
                                     slot.needs_verdict.eq(0)]
        with m.Elif(taken & out.needs_verdict):
            m.d.sync += pending.eq(1)
        with m.Elif(squash_now | (pending & self.o.ready)):
            m.d.sync += [pending.eq(self.squash), squashing.eq(self.squash)]

        is_fault = out.fault != FaultClass.NONE
        m.d.comb += [
            self.o.p.fault.eq(out.fault),
            self.o.p.fault_index.eq(Mux(is_fault, out.index, 0)),
            self.o.p.bundle.eq(Mux(is_fault, 0, out.bundle)),
        ]
        return SimpleNamespace(state=state, go=go, emit=emit, second=second, pending=pending,
                               squashing=squashing, busy=busy, out_valid=out_valid,
                               spare_valid=spare_valid, empties=empties)

    # -- checks (formal verification and simulation) -----------------------------------

    def _add_checks(self, m, aligner, fetched, m_valid, d, d_valid, b, step):
        """``Assert`` the decoder's output contract and, with ``checks="all"``, more.

        The assertions sit in the ``sync`` domain: they check settled values at each clock
        edge, so the simulator does not trip over transient values between delta cycles.

        ``"contract"`` (inductive: k-induction proves it at depth 2 from any register state):
        every record is a descriptor or exactly one fault class - a fault record
        has an all-zero descriptor, a descriptor record a zero index - the output holds a
        record until it is taken, and a squash only changes records that are not offered.

        ``"all"`` adds what holds in the reachable states (checked from reset): descriptors are
        well formed (a known operation, lists within the bounds, a no-op has no bindings, a
        TIMG2COL descriptor has its one source, destination and L = 1), invariants of the
        bundle registers, and progress: while ``o.ready`` stays high the state machine never
        waits for its output, and a C.BSTOP that enters an empty aligner is executed within
        ``PROGRESS_BOUND`` cycles and completes a record unless the decoder is skipping.
        """
        o, rec = self.o, self.o.p
        desc = rec.bundle
        ops = [op.value for op in Operation]
        is_descriptor = o.valid & (rec.fault == FaultClass.NONE)
        m.d.sync += [
            Assert(~o.valid | (rec.fault <= FaultClass.TILE_LEGALITY), "unknown fault class"),
            Assert(~o.valid | (rec.fault == FaultClass.NONE) | (desc.as_value() == 0),
                   "a fault record carries a descriptor"),
            Assert(~is_descriptor | (rec.fault_index == 0),
                   "a descriptor record carries a fault index"),
        ]
        # The output holds still while it waits.
        held = Signal()
        held_record = Signal.like(o.payload)
        m.d.sync += [held.eq(o.valid & ~o.ready), held_record.eq(o.payload)]
        with m.If(held):
            m.d.sync += Assert(o.valid & (o.payload.as_value() == held_record.as_value()),
                               "the output record changed before it was taken")
        # A squash is applied only while its record's verdict is pending (o.valid is low).
        m.d.sync += [
            Assert(~step.squashing | step.pending, "a squash without a pending verdict"),
            Assert(step.busy | ~(step.second | step.squashing), "the state machine is not held"),
            Assert(~(step.pending & step.spare_valid), "a record behind a pending verdict"),
            Assert(step.out_valid | ~step.spare_valid, "a second output entry without a first"),
            *(Assert(copy == ~valid, "an entry's enable copy differs from its valid bit")
              for valid, empty in step.empties for copy in empty),
        ]
        if self.checks != "all":
            return

        with m.If(is_descriptor):
            m.d.sync += [
                Assert(_any(desc.op == v for v in ops), "unknown operation"),
                Assert(desc.local_count <= self.local_limit, "too many Local sources"),
                Assert(desc.dest_count <= self.destination_limit, "too many destinations"),
                Assert(desc.shared_count <= self.shared_limit, "too many Shared sources"),
            ]
            with m.If(desc.noop):
                m.d.sync += Assert((desc.local_count == 0) & (desc.dest_count == 0) &
                                   (desc.shared_count == 0) & (desc.pe_mask == 0),
                                   "a no-op with bindings")
            with m.Elif(desc.op == Operation.TIMG2COL):
                m.d.sync += Assert((desc.local_count == 1) & (desc.dest_count == 1) &
                                   (desc.shared_count == 0) & desc.terminated,
                                   "a TIMG2COL descriptor without its one binding")
        # Invariants of the bundle registers (they make the checks provable by induction).
        with m.If(step.state == _State.OPEN):
            m.d.sync += Assert((b.shared_count <= self.shared_limit) &
                               (b.iot_count <= self.iot_limit), "binding counts out of range")
        m.d.sync += [
            Assert(step.state.as_value() != 3, "unknown state"),
            Assert(_any(d.op == v for v in ops) & _any(b.op == v for v in ops),
                   "unknown operation inside"),
            Assert(b.timg2col == (b.op == Operation.TIMG2COL), "TIMG2COL flag"),
            Assert((b.local_count <= self.local_limit) &
                   (b.dest_count <= self.destination_limit), "list counts out of range"),
            Assert(b.iot_any | ((b.iot_count == 0) & (b.local_count == 0) &
                                (b.dest_count == 0) & ~b.timg2col_shape),
                   "B.IOT state without a B.IOT"),
            Assert(b.ios_any | ((b.shared_count == 0) & ~b.shared_dest),
                   "B.IOS state without a B.IOS"),
            Assert(~b.timg2col_shape | ((b.iot_count == 1) & (b.local_count == 1) &
                                        (b.dest_count == 1) & b.terminated),
                   "TIMG2COL shape flag"),
        ]

        # Progress, while the consumer keeps ``o.ready`` high.
        waited = Signal()
        m.d.sync += waited.eq(d_valid & ~step.go & o.ready & ~step.pending & ~step.squashing)
        with m.If(waited & o.ready & ~step.pending & ~step.squashing):
            m.d.sync += Assert(step.go | step.second, "the state machine stalls with o.ready")
        # Follow one C.BSTOP from the input: count the items ahead of it in the pipeline,
        # then the state machine's steps until its own.
        tracking = Signal()
        ahead = Signal(range(6))
        age = Signal(range(PROGRESS_BOUND + 1))
        accepted_stop = (self.i.valid & self.i.ready & (self.i.p.count != 0) &
                         (self.i.p.parcels[0] == 0) & (aligner.fill == 0) & ~aligner.part &
                         ~aligner.ending)
        with m.If(tracking):
            # The C.BSTOP is still in the pipeline behind ``ahead`` items.
            m.d.sync += Assert(ahead < aligner.o.valid + fetched.level + m_valid + d_valid +
                               ((aligner.fill != 0) | aligner.part),
                               "the tracked C.BSTOP is lost")
        with m.If(~o.ready | self.squash):
            m.d.sync += tracking.eq(0)
        with m.Elif(tracking):
            m.d.sync += age.eq(age + 1)
            m.d.sync += Assert(age < PROGRESS_BOUND, "a C.BSTOP waits too long")
            with m.If(step.go):
                with m.If(ahead == 0):
                    m.d.sync += Assert(d.stop & (step.emit == (step.state != _State.SKIP)),
                                       "a C.BSTOP executed without its record")
                    m.d.sync += tracking.eq(0)
                with m.Else():
                    m.d.sync += ahead.eq(ahead - 1)
        with m.Elif(accepted_stop):
            # Items ahead: those in the pipeline, less the one the state machine takes now.
            m.d.sync += [tracking.eq(1), age.eq(0),
                         ahead.eq(aligner.o.valid + fetched.level + m_valid + d_valid -
                                  step.go)]


class _BundleRegisters:
    """The header state of the open bundle (the model's ``_OpenBundle``) as registers.

    Besides the descriptor's fields it keeps flags that the header and commit rules test, so
    that no rule has to compare counts: ``iot_any``/``ios_any`` (an effective B.IOT/B.IOS
    was recorded), ``iot_full``/``ios_full`` (the next one is over the limit), ``local_over``
    / ``dest_over`` (more sources/destinations than a Matrix bundle takes), ``mask_conflict``
    (a B.IOT mask differs from an earlier B.IOS mask), ``fpatr_closed`` (a B.FPATR is out of
    place), ``timg2col_shape`` (the B.IOT words so
    far are exactly one word with one source, a destination and L = 1) and ``ior_extra``
    (B.IOR RegSrc2 or RegDst is nonzero).
    """

    def __init__(self, decoder: "BundleDecoder"):
        cfg, index_width = decoder.config, decoder.index_width
        self.local_limit = decoder.local_limit
        self.destination_limit = decoder.destination_limit
        self.shared_limit = decoder.shared_limit
        self.iot_limit = decoder.iot_limit
        self.op = Signal(Operation)
        self.timg2col = Signal()
        self.a_type = Signal(5)
        self.start_index = Signal(index_width)
        self.datr_valid, self.datr = Signal(), Signal(DatrLayout)
        self.fpatr_valid, self.fpatr = Signal(), Signal(FpatrLayout)
        self.catr_seen, self.catr_dr, self.hint_seen = Signal(), Signal(), Signal()
        self.dims = [Signal(DimLayout, name=f"dim{k}", init={"value": 1}) for k in range(3)]
        self.local = [Signal(6, name=f"local{k}") for k in range(cfg.max_local_sources)]
        self.local_count = Signal(range(cfg.max_local_sources + 1))
        self.local_over = Signal()
        self.dests = [Signal(DestinationLayout, name=f"dest{k}")
                      for k in range(cfg.max_destinations)]
        self.dest_count = Signal(range(cfg.max_destinations + 1))
        self.dest_over = Signal()
        self.shared = [Signal(8, name=f"shared{k}") for k in range(cfg.max_shared)]
        self.shared_valid = [Signal(name=f"shared_valid{k}") for k in range(cfg.max_shared)]
        self.shared_count = Signal(range(cfg.max_shared + 1))
        self.shared_dest = Signal()       # a B.IOS with a nonzero SizeCode (Shared destination)
        self.iot_count = Signal(range(decoder.iot_limit + 1))
        self.iot_any, self.iot_full = Signal(), Signal()
        self.ios_any, self.ios_full = Signal(), Signal()
        self.iot_mask, self.ios_mask = Signal(4), Signal(4)
        self.mask_conflict = Signal()
        self.terminated = Signal()
        self.timg2col_shape = Signal()
        self.ior_valid, self.ior = Signal(), Signal(IorLayout)
        self.ior_extra = Signal()
        self.zero_seen = Signal()
        # A B.FPATR is out of place: one was recorded, a B.IOR or an effective binding came
        # first, or the bundle is a TIMG2COL one.
        self.fpatr_closed = Signal()

    def open(self, m, d):
        """Start a new bundle for the start instruction ``d`` (every field cleared)."""
        m.d.sync += [
            self.op.eq(d.op), self.timg2col.eq(d.open_timg2col), self.a_type.eq(d.dtype),
            self.start_index.eq(d.index),
            self.datr_valid.eq(0), self.datr.eq(0), self.fpatr_valid.eq(0), self.fpatr.eq(0),
            self.catr_seen.eq(0), self.catr_dr.eq(0), self.hint_seen.eq(0),
            self.local_count.eq(0), self.local_over.eq(0), self.dest_count.eq(0),
            self.dest_over.eq(0), self.shared_count.eq(0), self.shared_dest.eq(0),
            self.iot_count.eq(0), self.iot_any.eq(0), self.iot_full.eq(0),
            self.ios_any.eq(0), self.ios_full.eq(0), self.iot_mask.eq(0), self.ios_mask.eq(0),
            self.mask_conflict.eq(0), self.terminated.eq(0), self.timg2col_shape.eq(0),
            self.ior_valid.eq(0), self.ior.eq(0), self.ior_extra.eq(0), self.zero_seen.eq(0),
            self.fpatr_closed.eq(d.open_timg2col),
        ]
        m.d.sync += [dim.eq(DimLayout.const({"value": 1})) for dim in self.dims]
        m.d.sync += [sig.eq(0) for sig in self.local + self.dests + self.shared +
                     self.shared_valid]

    def record(self, m, d):
        """Record the header command ``d``."""
        with m.If(d.zero):
            m.d.sync += self.zero_seen.eq(1)
        with m.If(d.catr):
            m.d.sync += [self.catr_seen.eq(1), self.catr_dr.eq(d.dr)]
        with m.If(d.hint):
            m.d.sync += self.hint_seen.eq(1)
        with m.If(d.datr):
            m.d.sync += [self.datr_valid.eq(1), self.datr.eq(d.datr_f)]
        with m.If(d.fpatr):
            m.d.sync += [self.fpatr_valid.eq(1), self.fpatr.eq(d.fpatr_f)]
        with m.If(d.fpatr | d.ior | d.iot | d.ios):
            m.d.sync += self.fpatr_closed.eq(1)
        for k, dim in enumerate(self.dims):
            with m.If(d.dim_lb[k]):
                gpr = Mux(d.dim_reads_gpr, d.dim_gpr, 0)
                m.d.sync += [dim.value.eq(gpr + d.dim_imm), dim.written.eq(1)]
        with m.If(d.iot):
            self._record_iot(m, d)
        with m.If(d.ios):
            for k, (slot, valid) in enumerate(zip(self.shared, self.shared_valid)):
                with m.If(self.shared_count == k):
                    m.d.sync += [slot.eq(d.tid), valid.eq(1)]
            count = self.shared_count + 1
            m.d.sync += [self.shared_count.eq(count), self.ios_any.eq(1),
                         self.ios_mask.eq(d.mask), self.ios_full.eq(count >= self.shared_limit)]
            with m.If(d.size_code != 0):
                m.d.sync += self.shared_dest.eq(1)
        with m.If(d.ior):
            m.d.sync += [self.ior_valid.eq(1), self.ior.eq(d.ior_f),
                         self.ior_extra.eq((d.ior_f.reg_src2 != 0) | (d.ior_f.reg_dst != 0))]

    def _record_iot(self, m, d):
        # Sources append in stream order (SrcTile0, then SrcTile1), destinations likewise;
        # past the list sizes only the overflow flags change.
        for k, slot in enumerate(self.local):
            with m.If(d.has_src0 & (self.local_count == k)):
                m.d.sync += slot.eq(d.src0)
            with m.If(d.has_src1 & (self.local_count + 1 == k)):
                m.d.sync += slot.eq(d.src1)
        local = self.local_count + d.has_src0 + d.has_src1
        with m.If(local > self.local_limit):
            m.d.sync += self.local_over.eq(1)
        with m.Else():
            m.d.sync += self.local_count.eq(local)
        with m.If(d.has_dst):
            for k, slot in enumerate(self.dests):
                with m.If(self.dest_count == k):
                    m.d.sync += [slot.hand.eq(d.dst_hand), slot.size_code.eq(d.size_code)]
            with m.If(self.dest_count == self.destination_limit):
                m.d.sync += self.dest_over.eq(1)
            with m.Else():
                m.d.sync += self.dest_count.eq(self.dest_count + 1)
        count = self.iot_count + 1
        m.d.sync += [
            self.iot_count.eq(count), self.iot_any.eq(1),
            self.iot_full.eq(count >= self.iot_limit),
            self.iot_mask.eq(d.mask), self.terminated.eq(d.last),
            self.timg2col_shape.eq(~self.iot_any & d.has_src0 & ~d.has_src1 & d.has_dst &
                                   d.last),
        ]
        with m.If(self.ios_any & (d.mask != self.ios_mask)):
            m.d.sync += self.mask_conflict.eq(1)

    def descriptor_statements(self, desc, boundary_index, noop):
        """Assignments of the open bundle's descriptor to ``desc`` (a DescriptorLayout view)."""
        yield from [
            desc.op.eq(self.op),
            desc.a_type.eq(self.a_type),
            desc.b_type.eq(Mux(self.datr_valid & (self.datr.dtype != DTYPE_NONE),
                               self.datr.dtype, self.a_type)),
            desc.start_index.eq(self.start_index),
            desc.boundary_index.eq(boundary_index),
            desc.datr_valid.eq(self.datr_valid), desc.datr.eq(self.datr),
            desc.fpatr_valid.eq(self.fpatr_valid), desc.fpatr.eq(self.fpatr),
            desc.local_count.eq(self.local_count),
            desc.dest_count.eq(self.dest_count),
            desc.shared_count.eq(self.shared_count),
            desc.terminated.eq(self.terminated),
            desc.ior_valid.eq(self.ior_valid), desc.ior.eq(self.ior),
            desc.pe_mask.eq(Mux(self.iot_any, self.iot_mask,
                                Mux(self.ios_any, self.ios_mask, 0))),
            desc.catr_dr.eq(self.catr_dr),
            desc.noop.eq(noop),
        ]
        for k in range(3):
            yield desc.dims[k].eq(self.dims[k])
        for k, sig in enumerate(self.local):
            yield desc.local_sources[k].eq(sig)
        for k, sig in enumerate(self.dests):
            yield desc.destinations[k].eq(sig)
        for k, sig in enumerate(self.shared):
            yield desc.shared_sources[k].eq(sig)
