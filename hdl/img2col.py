"""TIMG2COL address generator: destination window in, source element addresses out.

:class:`Img2ColAddressGenerator` walks the ValidRow x ValidCol window of the im2col matrix at
(posM, posK) in destination row-major order and yields, for every destination element, the
source storage index of the feature-map element it copies or a padding marker.  It follows
the index mathematics of :func:`ptocube.model.img2col.gather_indices` exactly and the
counters-and-adders scheme of :func:`ptocube.model.img2col.walk`.

How it works (``docs/hdl-img2col.md`` has the full design notes):

* **Setup**, once per window: a short fixed program (:class:`SerialProgram`) runs on one
  multiply-add unit and one serial restoring divider.  It forms the loop-invariant strides,
  the address deltas applied when a counter wraps and the wrap points, and seeds the walk
  from posM/posK by division.  56 cycles at the default radix, whatever the window size.
* **Stream**, one element per cycle.  Row state: the input coordinates ih0 = oh*SH - PT and
  iw0 = ow*SW - PL and the row address.  Column state: c0, kw*DW, kh*DH, the channels left
  before LC (LC - c1*C0) and the column address.  ow, oh, kw and kh need no counters of
  their own: each wraps when its running coordinate reaches its last value, computed in
  setup; an "at its last value" flag per counter, set one step ahead, makes the wrap
  decision a register.  Advancing uses adds of precomputed steps and deltas and equality
  compares only - no multiplier, no divider.  Two register stages follow the walk: the
  element's coordinates and index, then the padding test and the output.  The element's
  index is row address + column address; it is padding when ih = ih0 + kh*DH or
  iw = iw0 + kw*DW falls outside the map or c0 is not below LC - c1*C0.

Address arithmetic is modular.  Every real source index is below P = N*D*C1*H*W*C0, which
preflight bounds by the source tile's element count (at most ``2**index_width``), so all
address terms are kept modulo ``2**index_width``: intermediate terms of padding positions may
be "negative" or huge, but a real element's sum is exact.  The coordinates that the padding
test compares are exact in ``arith_width`` bits (see :func:`arith_width`).

Preconditions (the TIMG2COL engine's preflight guarantees them; see ``img2col_engine``):
the descriptor passed ``check_descriptor`` with a source of at most ``2**index_width``
elements, ``out_height``/``out_width`` are the model's ``output_shape``, and the window
passed ``check_window``.  A zero ValidRow or ValidCol yields no element.
"""

import math
import operator
from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..model.img2col import FeatureMapDescriptor, FeatureMapLayout
from .config import CubeConfig
from .logic import or_tree

__all__ = ["FeatureMapDescriptorLayout", "FEATURE_MAP_DESCRIPTOR", "FM_PARTS",
           "FeatureMapPartLayout", "feature_map_parts", "EXTENT_WIDTH",
           "AddressJobLayout", "AddressLayout", "MulAdd", "DivMod", "SerialProgram",
           "source_index_width", "arith_width", "Img2ColAddressGenerator"]

#: Width of outH / outW: at most H + PT + PB = 3 * 65535 < 2**18.
EXTENT_WIDTH = 18

_FIELD_WIDTH = 16
_DIMENSION_FIELDS = ("batches", "depth", "channel_groups", "height", "width",
                     "channels_per_group", "filter_height", "filter_width", "stride_height",
                     "stride_width", "dilation_height", "dilation_width", "pad_left",
                     "pad_right", "pad_top", "pad_bottom", "logical_channels")


class FeatureMapDescriptorLayout(data.StructLayout):
    """The feature-map descriptor register of a tile, field for field the model's dataclass.

    Field widths are the register's: ``layout`` 2 bits (codes 0 NC1HWC0, 1 NDC1HWC0; 2 and 3
    are illegal values a host may write), every dimension, filter, stride, dilation, padding
    count and ``logical_channels`` 16 bits, ``padding`` the 64-bit word, ``transposed`` and
    ``valid`` one bit each.  Values the model's checks reject but the register can hold (zero
    dimensions, layout 2/3, ``transposed``, ``valid`` clear) are the preflight's to reject.
    """

    def __init__(self):
        fields = {"layout": 2}
        fields.update({name: _FIELD_WIDTH for name in _DIMENSION_FIELDS})
        fields.update({"padding": 64, "transposed": 1, "valid": 1})
        super().__init__(fields)

    def encode(self, fm: FeatureMapDescriptor) -> int:
        """The register's bit pattern for a model descriptor.

        Raises ValueError for a value the register cannot hold (a dimension above 65535 or
        negative, a layout code above 3, a padding word outside 64 bits): such a descriptor
        cannot be written through the hardware descriptor port at all.
        """
        values = {"layout": int(fm.layout), "padding": fm.padding,
                  "transposed": int(bool(fm.transposed)), "valid": int(bool(fm.valid))}
        values.update({name: getattr(fm, name) for name in _DIMENSION_FIELDS})
        for name, value in values.items():
            width = self.members[name]
            try:
                values[name] = operator.index(value)     # ints, numpy ints; not floats
            except TypeError:
                values[name] = None
            if values[name] is None or not 0 <= values[name] < 1 << width:
                raise ValueError(f"feature-map {name}={value!r} does not fit the {width}-bit "
                                 f"descriptor register field")
        return self.const(values).as_bits()

    def decode(self, bits: int) -> FeatureMapDescriptor:
        """The model descriptor of a register bit pattern (``layout`` stays an int if illegal)."""
        v = data.Const(self, bits)
        layout = int(v.layout)
        return FeatureMapDescriptor(
            layout=FeatureMapLayout(layout) if layout in tuple(FeatureMapLayout) else layout,
            padding=int(v.padding), transposed=bool(v.transposed), valid=bool(v.valid),
            **{name: int(getattr(v, name)) for name in _DIMENSION_FIELDS})


#: The one instance every component uses.
FEATURE_MAP_DESCRIPTOR = FeatureMapDescriptorLayout()

#: 64-bit parts of a feature-map descriptor register: the words of the host port's
#: READ_FM / WRITE_FM and the beats that load the TIMG2COL engine's copy.
FM_PARTS = -(-FEATURE_MAP_DESCRIPTOR.size // 64)

#: One beat of a feature map on its way from the tile store to the TIMG2COL engine: bits
#: 64*part to 64*part+63 of the register, which are zero instead when ``unset`` (the part
#: was not written since the register was allocated: the store sends its memory's word and
#: that bit, read from two block RAMs, and the engine applies it after its beat register,
#: decisions T20, T33, E23).
FeatureMapPartLayout = data.StructLayout({"part": range(FM_PARTS), "data": 64, "unset": 1})


def feature_map_parts(fm: FeatureMapDescriptor) -> list[int]:
    """The register bits of a model descriptor as :data:`FM_PARTS` 64-bit words, part 0
    first."""
    bits = FEATURE_MAP_DESCRIPTOR.encode(fm)
    return [(bits >> (64 * part)) & ((1 << 64) - 1) for part in range(FM_PARTS)]


#: Address generator command: the output extents and the window (the descriptor is the
#: generator's ``fm`` input, held for the whole walk).
AddressJobLayout = data.StructLayout({
    "out_height": EXTENT_WIDTH,
    "out_width": EXTENT_WIDTH,
    "valid_row": 16,
    "valid_col": 16,
    "pos_m": 16,
    "pos_k": 16,
})


def AddressLayout(index_width: int) -> data.StructLayout:
    """One generated element: source ``index`` (meaningless when ``pad``), ``pad``,
    ``row_last`` (last element of a destination row) and ``last`` (last of the window)."""
    return data.StructLayout({"index": index_width, "pad": 1, "row_last": 1, "last": 1})


def source_index_width(config: CubeConfig) -> int:
    """Bits of a TIMG2COL source storage index for ``config``.

    The largest source is a whole PE's tile memory of 8-bit elements (the narrowest TIMG2COL
    type), so an index is below ``tile_bytes_per_pe``.
    """
    return max(1, (config.tile_bytes_per_pe - 1).bit_length())


def arith_width(index_width: int) -> int:
    """Bits of the generator's coordinate arithmetic (see the module docstring).

    A used input coordinate ih = oh*SH + kh*DH - PT lies in [-65535, H + PB - 1], inside
    [-2**17, 2**17): 19 signed bits.  The channels left before LC, LC - c1*C0, lie in
    (-P, 65535] with P <= 2**index_width: index_width + 1 signed bits.
    """
    return max(index_width + 1, 19)


# ---------------------------------------------------------------------------
# Setup program: one multiply-add unit, one serial divider
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MulAdd:
    """One program step: ``dst <- x*y + z``, or ``dst <- x*y - z`` when ``sub``.

    ``x`` is up to the program width, ``y`` up to its ``y_width``; constants are allowed.
    """

    dst: Value
    x: object
    y: object = 1
    z: object = 0
    sub: bool = False


@dataclass(frozen=True)
class DivMod:
    """One program step: ``quotient, remainder <- divmod(dividend, divisor)``.

    ``remainder`` may be None.  A zero divisor gives a meaningless result but still ends.
    """

    quotient: Value
    remainder: Value | None
    dividend: object
    divisor: object


class SerialProgram:
    """A fixed sequence of :class:`MulAdd` / :class:`DivMod` steps on one pipelined
    multiply-add unit and one serial divider, scheduled when the hardware is built.

    The steps are Python objects naming the caller's signals; :meth:`emit` builds the
    hardware into the caller's module so that the steps can write the caller's registers.

    Both units are pipelined for clock speed, and the schedule is static (:attr:`schedule`):
    each step issues in the earliest cycle that keeps the program's meaning (a step reads
    its operands when it issues, after every program-earlier step that writes one of them
    has written it), so independent steps overlap and may pass a step that waits.  A one-hot
    phase register marks the cycle; every issue and every write-back happens at a cycle
    fixed at elaboration time, and the controls are decoded from the phase a cycle ahead
    into registers, each an OR of phase bits.  Cycle 0 only decodes.

    * A multiply-add registers its operands in its issue cycle, the product in the next,
      the sum in the third and writes ``dst`` in the fourth (:attr:`muladd_latency` = 4
      cycles until ``dst`` can be read).  An independent step can issue in every cycle.
    * A division loads its operands in its issue cycle, finds ``radix_bits`` quotient bits
      per cycle (restoring division) for ``ceil(dividend_width / radix_bits)`` cycles and
      writes its results in the cycle after.  Multiply-adds that do not need its results
      run meanwhile.

    Arithmetic is modulo ``2**width``, or with ``saturate`` unsigned and clamped at
    ``2**width - 1`` (then ``sub`` is not allowed): a clamped value stands for "at least
    that", which keeps range checks on products of 16-bit fields exact.

    Operand file: a register that a multiply-add writes and a later multiply-add reads back
    as ``x`` or ``z`` is also written, as its register holds it, into a small LUT RAM per
    port, and those reads come from the RAM.  The ``x`` and ``z`` multiplexers then choose
    only among the inputs, constants and division results, instead of among every register
    of the program (their wide AND-OR cones were the most congested logic of the TIMG2COL
    engine on the ECP5, issue #9).

    Input queues (``queue_inputs``): an operand that no step writes and that is not a
    constant (an input of the program, such as a descriptor field) is then read from a
    queue of registers per operand port, loaded in cycle 0 with that port's input reads in
    issue order and shifted by one at each of them.  The selects then choose only among
    the values the program computes and constants; every input bit feeds queue stages,
    whose wires the placer can spread, instead of one wide AND-OR per port (the setup of
    the address generator was the last congested knot of the 8 x 8 unit, issue #9).  The
    inputs are sampled in cycle 0 only: they must be valid in the cycle after
    :meth:`start`, and may change afterwards.

    Use ``m.d.sync += program.start()`` to run it from cycle 0; :attr:`busy` is high until
    the last step has written its result; ``program.stop()`` abandons it (nothing is
    written after that).
    """

    def __init__(self, steps, *, width: int, y_width: int, dividend_width: int,
                 divisor_width: int, saturate: bool = False, radix_bits: int = 2,
                 queue_inputs: bool = False):
        self.steps = tuple(steps)
        self.queue_inputs = queue_inputs
        if saturate and any(isinstance(s, MulAdd) and s.sub for s in self.steps):
            raise ValueError("a saturating program cannot subtract")
        if radix_bits < 1:
            raise ValueError(f"radix_bits must be at least 1, not {radix_bits}")
        self.width, self.y_width = width, y_width
        self.dividend_width, self.divisor_width = dividend_width, divisor_width
        self.saturate, self.radix_bits = saturate, radix_bits
        self.iterations = math.ceil(dividend_width / radix_bits)
        #: Cycles from a multiply-add's issue until a step can read its result.
        self.muladd_latency = 4
        self.schedule = self._schedule()
        self._enables = []         # write-back enables, filled by emit()
        # Bit c is high in cycle c: a decode of the cycle is an OR of bits, not a compare
        # chain on a counter (issue #9, decision E21).
        self.phase = Signal(self.cycles, name="program_phase")
        self._busy = Signal(name="program_busy")

    def _latency(self, step) -> int:
        """Cycles from a step's issue to its write-back."""
        return self.muladd_latency - 1 if isinstance(step, MulAdd) else self.iterations + 1

    @staticmethod
    def _operands(step) -> tuple:
        if isinstance(step, MulAdd):
            return step.x, step.y, step.z
        return step.dividend, step.divisor

    @staticmethod
    def _destinations(step) -> tuple:
        if isinstance(step, MulAdd):
            return (step.dst,)
        return tuple(d for d in (step.quotient, step.remainder) if d is not None)

    def _schedule(self) -> tuple:
        """(issue cycle, write-back cycle) of every step.

        Steps are placed in program order, each in the earliest free issue cycle that keeps
        the program's meaning: it reads its operands after the program-earlier steps that
        write them have written them, writes its registers after the program-earlier steps
        have read and written them, and uses the divider only while no other division
        does.  So a step may issue before a program-earlier one that waits for data.
        """
        def signals(values):
            # Keyed by identity: a step depends on the registers, not on their values.
            return {id(s) for v in values for s in Value.cast(v)._rhs_signals()}

        readable, last_write, last_read = {}, {}, {}    # register -> cycle
        issued, divisions, plan = set(), [], []
        for step in self.steps:
            latency = self._latency(step)
            reads = signals(self._operands(step))
            dsts = signals(self._destinations(step))
            # Cycle 0 decodes the first step's controls.
            t = max([1] + [readable.get(k, 0) for k in reads]
                    + [last_write.get(k, -1) + 1 - latency for k in dsts]
                    + [last_read.get(k, 0) - latency for k in dsts])
            while t in issued or (isinstance(step, DivMod) and any(
                    t < end and t + latency > begin for begin, end in divisions)):
                t += 1
            issued.add(t)
            if isinstance(step, DivMod):
                # The next division may load in the cycle this one's results are taken.
                divisions.append((t, t + latency))
            for k in reads:
                last_read[k] = max(last_read.get(k, 0), t)
            for k in dsts:
                readable[k], last_write[k] = t + latency + 1, t + latency
            plan.append((t, t + latency))
        return tuple(plan)

    @property
    def busy(self) -> Value:
        """High while a step is still to run or to write back."""
        return self._busy

    @property
    def cycles(self) -> int:
        """Cycles from :meth:`start` until :attr:`busy` falls."""
        return max((write + 1 for _, write in self.schedule), default=0)

    def start(self) -> list:
        """Statements (for ``m.d.sync``) that restart the program at cycle 0."""
        return [self.phase.eq(1), self._busy.eq(1)]

    def stop(self) -> list:
        """Statements (for ``m.d.sync``) that abandon the program."""
        return [self.phase.eq(0), self._busy.eq(0),
                *(enable.eq(0) for enable in self._enables)]

    def emit(self, m: Module) -> None:
        """Add the program's datapath and sequencing to ``m``."""
        w = self.width
        m.d.sync += [self.phase.eq(self.phase << 1),
                     self._busy.eq(self._busy & ~self.phase[-1])]

        def ahead(cycles, name):
            """A register that is high in each of ``cycles``: decoded from the phase one
            cycle before, so that no wide decode sits in front of the datapath."""
            flag = Signal(name=name)
            m.d.sync += flag.eq(Cat(self.phase[c - 1] for c in cycles).any())
            return flag

        def ahead_value(values, shape, name):
            """A register that holds ``values[c]`` in each cycle c of that table (zero in
            the others), decoded like :func:`ahead`: bit by bit an OR of phase bits."""
            reg = Signal(shape, name=name)
            m.d.sync += reg.eq(Cat(
                Cat(self.phase[c - 1] for c, v in values.items() if v >> bit & 1).any()
                for bit in range(len(reg))))
            return reg

        def select(operands, width, name):
            """The operand of the step issuing now, as an AND-OR of its sources, each
            enabled by a flag decoded ahead.  ``operands`` is a list of (cycle, value)."""
            sources = {}
            for cycle, value in operands:
                value = Value.cast(value)
                sources.setdefault(repr(value), (value, []))[1].append(cycle)
            terms = []
            for n, (value, cycles) in enumerate(sources.values()):
                if isinstance(value, Const) and value.value == 0:
                    continue
                source = Signal(width, name=f"{name}_src{n}")
                m.d.comb += source.eq(value)       # truncated or extended as by .eq()
                terms.append(source & ahead(cycles, f"{name}_sel{n}").replicate(width))
            return or_tree(terms) if terms else Const(0, width)

        muladds = [(issue, step) for step, (issue, _) in zip(self.steps, self.schedule)
                   if isinstance(step, MulAdd)]
        divisions = [(issue, step) for step, (issue, _) in zip(self.steps, self.schedule)
                     if isinstance(step, DivMod)]
        file_reads, slots = self._operand_file_reads()
        files = []          # the operand files port() makes, written after the datapath

        written = {id(sig) for step in self.steps for dst in self._destinations(step)
                   for sig in Value.cast(dst)._rhs_signals()}

        def is_input(value):
            value = Value.cast(value)
            return (self.queue_inputs and not isinstance(value, Const)
                    and not any(id(sig) in written for sig in value._rhs_signals()))

        def queue(reads, width, name):
            """The input reads ``reads`` ((cycle, value)) of one port from a queue: loaded
            in cycle 0, its head read and the rest shifted up in each of those cycles."""
            reads = sorted(reads, key=lambda read: read[0])
            values = [Value.cast(value) for _, value in reads]
            if any(value.shape().signed for value in values):
                shape = width       # extended to the port as it is read, as by .eq()
            else:
                shape = min(width, max(len(value) for value in values))
            stages = [Signal(shape, name=f"{name}_queue{n}") for n in range(len(reads))]
            read = ahead([cycle for cycle, _ in reads], f"{name}_queue_read")
            with m.If(self.phase[0]):
                m.d.sync += [stage.eq(value) for stage, value in zip(stages, values)]
            with m.Elif(read):
                m.d.sync += [stage.eq(after) for stage, after in zip(stages, stages[1:])]
            return stages[0] & read.replicate(shape)

        def port(steps, field, width, name, file=False):
            """The operand ``field`` of ``steps`` ((issue, step) of one unit): from the
            operand file where ``file`` and the step reads it from there, from the input
            queue for inputs, else from the AND-OR of the other sources."""
            direct, queued, cycles = [], [], {}
            for k, (issue, step) in enumerate(steps):
                value = getattr(step, field)
                if file and (k, field) in file_reads:
                    cycles[issue] = slots[id(value)]
                elif is_input(value):
                    queued.append((issue, value))
                else:
                    direct.append((issue, value))
            value = select(direct, width, name)
            if queued:
                value = value | queue(queued, width, name)
            if not cycles:
                return value
            memory = m.submodules[f"{name}_file"] = Memory(shape=width, depth=len(slots),
                                                           init=[])
            read = memory.read_port(domain="comb")
            files.append(memory)
            # The slot is decoded a cycle ahead, like the selects.
            m.d.comb += read.addr.eq(ahead_value(cycles, range(len(slots)), f"{name}_file_addr"))
            return value | (read.data & ahead(list(cycles), f"{name}_file_sel").replicate(width))

        # Multiply-add: operands, then product, then sum - one register stage each.
        x = Signal(w, name="mul_x")
        y = Signal(self.y_width, name="mul_y")
        z = Signal(w, name="mul_z")
        sub = Signal(name="mul_sub")
        m.d.sync += [
            x.eq(port(muladds, "x", w, "mul_x", file=True)),
            y.eq(port(muladds, "y", self.y_width, "mul_y")),
            z.eq(port(muladds, "z", w, "mul_z", file=True)),
        ]
        m.d.sync += sub.eq(ahead([i for i, s in muladds if s.sub], "mul_sub_sel"))
        product = Signal(w + self.y_width if self.saturate else w, name="mul_product")
        addend, carry = Signal(w, name="mul_addend"), Signal(name="mul_carry")
        # x*y - z = x*y + ~z + 1 modulo 2**width.
        m.d.sync += [product.eq(x * y), addend.eq(z ^ sub.replicate(w)), carry.eq(sub)]
        # The sum is a register of its own: the write-back's selects and the operand files'
        # conversions start from flip-flops, not from the end of the carry chain (E21).
        result = Signal(w, name="mul_result")
        if self.saturate:
            low = product[:w] + addend
            m.d.sync += result.eq(Mux(product[w:].any() | low[w], (1 << w) - 1, low[:w]))
        else:
            m.d.sync += result.eq(product + addend + carry)

        # Restoring division, radix_bits quotient bits per cycle.  The quotient register
        # holds the not yet consumed dividend bits below the quotient bits found so far.
        # The partial remainder stays below the dividend's range as well as the divisor's,
        # so a divisor at or above 2**len(trial) never fits: one flag, found at the load,
        # stands for its high bits and the subtracts stay as short as the remainder.
        quo = Signal(self.iterations * self.radix_bits, name="div_quo")
        rem = Signal(min(self.divisor_width, len(quo)), name="div_rem")
        trial_width = len(rem) + 1
        divisor = Signal(min(self.divisor_width, trial_width), name="div_divisor")
        too_big = Signal(name="div_divisor_big")
        next_rem, next_quo = rem, quo
        for _ in range(self.radix_bits):
            trial = Cat(next_quo[-1], next_rem)
            diff = trial - divisor
            fits = ~too_big & ~diff[-1]         # no borrow
            next_rem = Mux(fits, diff, trial)[:len(rem)]
            next_quo = Cat(fits, next_quo[:-1])
        load = ahead([i for i, _ in divisions], "div_load")
        dividend = port(divisions, "dividend", self.dividend_width, "div_dividend")
        full_divisor = port(divisions, "divisor", self.divisor_width, "div_divisor")
        with m.If(load):
            m.d.sync += [quo.eq(dividend), rem.eq(0), divisor.eq(full_divisor),
                         too_big.eq(full_divisor[len(divisor):].any())]
        with m.Else():
            m.d.sync += [quo.eq(next_quo), rem.eq(next_rem)]

        # Write-back: per destination register, an enable decoded ahead.
        writes = {}        # register -> {source: [cycles]}
        for step, (_, write) in zip(self.steps, self.schedule):
            if isinstance(step, MulAdd):
                pairs = [(step.dst, result)]
            else:
                pairs = [(step.quotient, quo), (step.remainder, rem)]
            for dst, value in pairs:
                if dst is not None:
                    entry = writes.setdefault(id(dst), (dst, {}))[1]
                    entry.setdefault(id(value), (value, []))[1].append(write)
        for n, (dst, sources) in enumerate(writes.values()):
            for k, (value, cycles) in enumerate(sources.values()):
                enable = ahead(cycles, f"write{n}_{k}")
                self._enables.append(enable)
                with m.If(enable):
                    m.d.sync += dst.eq(value)
        if files:
            self._emit_file_writes(m, files, slots, result, ahead, ahead_value)

    def _operand_file_reads(self):
        """Which x and z reads the operand file serves, and the file's slot per register.

        A read is served when the register's last writer before it, in program order, is a
        multiply-add (the file holds what multiply-adds wrote): ``(k, "x")`` for the x
        operand of the k-th multiply-add.  Returns (reads, {id(register): slot}).
        """
        last_writer, reads, slots, k = {}, set(), {}, 0
        for step in self.steps:
            if isinstance(step, MulAdd):
                for field in ("x", "z"):
                    value = getattr(step, field)
                    if isinstance(value, Signal) and last_writer.get(id(value)) is MulAdd:
                        reads.add((k, field))
                        slots.setdefault(id(value), len(slots))
                k += 1
            for dst in self._destinations(step):
                last_writer[id(dst)] = type(step)
        return reads, slots

    def _emit_file_writes(self, m, files, slots, result, ahead, ahead_value):
        """Write every multiply-add result whose register has a slot into the operand files,
        converted as that register holds it (its width and signedness)."""
        by_shape, addresses = {}, {}        # shape -> write cycles; cycle -> slot
        for step, (_, write) in zip(self.steps, self.schedule):
            if isinstance(step, MulAdd) and id(step.dst) in slots:
                shape = Shape.cast(step.dst.shape())
                by_shape.setdefault((shape.width, shape.signed), []).append(write)
                addresses[write] = slots[id(step.dst)]
        data = []
        for (width, is_signed), cycles in by_shape.items():
            held = Signal(Shape(width, is_signed), name=f"file_held{len(data)}")
            widened = Signal(self.width, name=f"file_data{len(data)}")
            m.d.comb += [held.eq(result), widened.eq(held)]
            data.append(widened & ahead(cycles, f"file_shape{len(data)}").replicate(self.width))
        enable = ahead(list(addresses), "file_write")
        self._enables.append(enable)
        address = ahead_value(addresses, range(len(slots)), "file_write_addr")
        for memory in files:
            port = memory.write_port()
            m.d.comb += [port.en.eq(enable), port.addr.eq(address),
                         port.data.eq(or_tree(data))]


# ---------------------------------------------------------------------------
# The address generator
# ---------------------------------------------------------------------------

def _reached(value, pen):
    """``value == pen`` for a walk coordinate compared only while it is below its last
    value, so at most the last-but-one ``pen`` (both exact, see :func:`arith_width`): the
    absence of a borrow in ``value - pen``, which ends one carry chain, where an equality
    test of ~20 bits became a chain of LUTs (issue #9, decision E21)."""
    return ~(value - pen)[-1]


class Img2ColAddressGenerator(wiring.Component):
    """Source element address (or padding marker) of every destination element of a window.

    Parameters
    ----------
    config : CubeConfig
        ``tile_bytes_per_pe`` fixes the source index width (:func:`source_index_width`).
    radix_bits : int
        Quotient bits per cycle of the setup divider (the default 2 needs 10 cycles per
        16-bit division, load and write-back included; any value >= 1 works, but more
        than 2 lengthens the clock's critical path).

    Members
    -------
    cmd : In(stream.Signature(AddressJobLayout))
        One window to walk; accepted when idle and the previous window's elements have
        left the first output stage.  The payload is copied on acceptance.
    fm : In(FEATURE_MAP_DESCRIPTOR)
        The window's feature-map descriptor, held from the command's acceptance until
        ``busy`` falls.  The generator copies it every cycle it is idle, so its setup
        program and walk read a register of their own (decision E18).
    out : Out(stream.Signature(AddressLayout(index_width)))
        The window's elements in destination row-major order, at most one per cycle; the
        payload is registered.  ``index`` is the source storage index (the feature map's
        linear index N, D, C1, H, W, C0 with C0 innermost); it is meaningless when ``pad``.
    abort : In(1)
        Abandon the current window at once (drops the element on ``out``); no command is
        accepted while it is high.
    busy : Out(1)
        A window is being set up or walked, or an element is waiting on ``out``.

    Attributes
    ----------
    setup_cycles : int
        Cycles of the setup program (set when the component is elaborated).  The first
        element appears ``setup_cycles + 5`` cycles after the command is accepted.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), *, radix_bits: int = 2):
        self.config = config
        self.radix_bits = radix_bits
        self.index_width = source_index_width(config)
        self.arith_width = arith_width(self.index_width)
        super().__init__({
            "cmd": In(stream.Signature(AddressJobLayout)),
            "fm": In(FEATURE_MAP_DESCRIPTOR),
            "out": Out(stream.Signature(AddressLayout(self.index_width))),
            "abort": In(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        a_w, b_w = self.index_width, self.arith_width

        job = Signal(AddressJobLayout, name="job")
        # The engine's register would otherwise feed both setup programs and the walk:
        # with a copy of its own the generator's readers need not gather at that register
        # (decision E18).
        fm = Signal(FEATURE_MAP_DESCRIPTOR, name="fm_held")
        c0_n, kw_n, kh_n = fm.channels_per_group, fm.filter_width, fm.filter_height

        def registers(shape, *names):
            return tuple(Signal(shape, name=n) for n in names)

        # Loop invariants, modulo 2**a_w: the source-index stride of one input row (ws),
        # one channel group (c1s), one (n, d) image (nds); the steps of ow, oh, kw and kh;
        # and the address deltas applied when a counter wraps (see the program below).
        ws, c1s, nds = registers(a_w, "w_stride", "c1_stride", "nd_stride")
        ow_step, oh_step, kw_step, kh_step = registers(
            a_w, "ow_step", "oh_step", "kw_step", "kh_step")
        oh_delta, image_delta, kw_delta, kh_delta, c1_delta = registers(
            a_w, "oh_delta", "image_delta", "kw_delta", "kh_delta", "c1_delta")
        # The coordinate counters' first, last and last-but-one values, exact: ow runs
        # iw0 = -PL .. (outW - 1)*SW - PL in steps of SW, oh runs ih0 = -PT .. (outH - 1)*SH
        # - PT, kw runs kw*DW = 0 .. (KW - 1)*DW, kh runs kh*DH = 0 .. (KH - 1)*DH and c0
        # 0 .. C0 - 1.  So ow, oh, kw and kh need no counters of their own, and a flag per
        # counter, "at its last value", set one step ahead, tells the walk where it wraps.
        iw0_first, iw0_last, iw0_pen, ih0_first, ih0_last, ih0_pen = registers(
            signed(b_w), "iw0_first", "iw0_last", "iw0_pen", "ih0_first", "ih0_last",
            "ih0_pen")
        c0_last, c0_pen, kw_last, kw_pen, kh_last, kh_pen = registers(
            b_w, "c0_last", "c0_pen", "kw_off_last", "kw_off_pen", "kh_off_last",
            "kh_off_pen")
        tw, th, u0, u1, u2, u3, u4, u5, col_part = registers(
            b_w, "tw", "th", "u0", "u1", "u2", "u3", "u4", "u5", "col_part")
        q_m, image, q_k, q_k2, c1, ow_r, oh_r, kw_r, kh_r = registers(
            16, "pos_m_quotient", "image", "pos_k_quotient", "pos_k_quotient2", "c1_seed",
            "ow_seed", "oh_seed", "kw_seed", "kh_seed")

        # Row state: ih0 = oh*SH - PT, iw0 = ow*SW - PL and the row's address.
        ih0, iw0 = Signal(signed(b_w), name="ih0"), Signal(signed(b_w), name="iw0")
        row_addr = Signal(a_w, name="row_addr")
        row_part = Signal(b_w, name="row_part")

        def column_registers(suffix):
            return {
                "c0": Signal(16, name="c0" + suffix),
                "kw_off": Signal(b_w, name="kw_off" + suffix),     # kw * DW
                "kh_off": Signal(b_w, name="kh_off" + suffix),     # kh * DH
                "lc_left": Signal(signed(b_w), name="lc_left" + suffix),   # LC - c1*C0
                "col_addr": Signal(a_w, name="col_addr" + suffix),
            }
        # Column state: the seed every row starts from, and the running copy.
        seed, col = column_registers("_seed"), column_registers("")

        # Independent steps first where they can wait for nothing; the scheduler overlaps
        # the multiply-adds with the five divisions, which set the pace.
        program = SerialProgram([
            # Seeds: posM -> (image, oh, ow) (n*D + d is the image number), posK -> (c1,
            # kh, kw, c0).
            DivMod(q_m, ow_r, job.pos_m, job.out_width),
            DivMod(q_k, seed["c0"], job.pos_k, c0_n),
            DivMod(image, oh_r, q_m, job.out_height),
            DivMod(q_k2, kw_r, q_k, kw_n),
            DivMod(c1, kh_r, q_k2, kh_n),
            # Strides and the counters' ends.
            MulAdd(ws, fm.width, c0_n),
            MulAdd(ow_step, c0_n, fm.stride_width),
            MulAdd(kw_step, c0_n, fm.dilation_width),
            MulAdd(c0_last, c0_n, 1, 1, sub=True),
            MulAdd(kw_last, kw_n, fm.dilation_width, fm.dilation_width, sub=True),
            MulAdd(kh_last, kh_n, fm.dilation_height, fm.dilation_height, sub=True),
            MulAdd(iw0_first, 0, 0, fm.pad_left, sub=True),
            MulAdd(ih0_first, 0, 0, fm.pad_top, sub=True),
            MulAdd(tw, job.out_width, fm.stride_width, fm.stride_width, sub=True),
            MulAdd(th, job.out_height, fm.stride_height, fm.stride_height, sub=True),
            MulAdd(c1s, ws, fm.height),
            MulAdd(oh_step, ws, fm.stride_height),
            MulAdd(kh_step, ws, fm.dilation_height),
            MulAdd(nds, c1s, fm.channel_groups),
            MulAdd(c0_pen, c0_last, 1, 1, sub=True),
            MulAdd(kw_pen, kw_last, 1, fm.dilation_width, sub=True),
            MulAdd(kh_pen, kh_last, 1, fm.dilation_height, sub=True),
            MulAdd(iw0_last, tw, 1, fm.pad_left, sub=True),
            MulAdd(ih0_last, th, 1, fm.pad_top, sub=True),
            MulAdd(iw0_pen, iw0_last, 1, fm.stride_width, sub=True),
            MulAdd(ih0_pen, ih0_last, 1, fm.stride_height, sub=True),
            # Row deltas.  ow wraps: ow_step - outW*SW*C0 + oh_step = oh_step - tw*C0; oh
            # wraps too: that - outH*SH*W*C0 + nds = nds - oh_step - (th*W*C0 - oh_delta).
            MulAdd(u0, tw, c0_n),
            MulAdd(oh_delta, oh_step, 1, u0, sub=True),
            MulAdd(u1, th, fm.width),
            MulAdd(u1, u1, c0_n, oh_delta, sub=True),
            MulAdd(u3, nds, 1, oh_step, sub=True),
            MulAdd(image_delta, u3, 1, u1, sub=True),
            # Column deltas.  c0 wraps: 1 - C0 + kw_step; kw wraps too: kw_delta
            # - KW*kw_step + kh_step; kh wraps too: kh_delta - KH*kh_step + c1s.
            MulAdd(kw_delta, kw_step, 1, c0_last, sub=True),
            MulAdd(u2, kw_step, kw_n, kw_delta, sub=True),
            MulAdd(kh_delta, kh_step, 1, u2, sub=True),
            MulAdd(u4, kh_step, kh_n, kh_delta, sub=True),
            MulAdd(c1_delta, c1s, 1, u4, sub=True),
            # Row seed: iw0 = ow*SW - PL, ih0 = oh*SH - PT, row address image*nds
            # + (ih0*W + iw0)*C0.
            MulAdd(iw0, ow_r, fm.stride_width, fm.pad_left, sub=True),
            MulAdd(ih0, oh_r, fm.stride_height, fm.pad_top, sub=True),
            MulAdd(row_part, ih0, fm.width, iw0),
            MulAdd(row_part, row_part, c0_n),
            MulAdd(row_addr, nds, image, row_part),
            # Column seed: kw*DW, kh*DH, LC - c1*C0 and the column address
            # c1*c1s + kh*kh_step + kw*kw_step + c0.
            MulAdd(seed["kw_off"], kw_r, fm.dilation_width),
            MulAdd(col_part, kw_step, kw_r, seed["c0"]),
            MulAdd(seed["kh_off"], kh_r, fm.dilation_height),
            MulAdd(u5, c1, c0_n, fm.logical_channels, sub=True),
            MulAdd(seed["lc_left"], 0, 0, u5, sub=True),
            MulAdd(col_part, kh_step, kh_r, col_part),
            MulAdd(seed["col_addr"], c1s, c1, col_part),
        ], width=b_w, y_width=16, dividend_width=16, divisor_width=EXTENT_WIDTH,
            radix_bits=self.radix_bits, queue_inputs=True)
        self.setup_cycles = program.cycles
        program.emit(m)

        # Facts of the setup results the walk starts from or wraps to, registered: they
        # settle in the cycle after the program ends, and the walk starts a cycle later.
        fact = {name: Signal(name=name) for name in (
            "c0_single", "kw_single", "kh_single", "ow_single", "oh_single", "seed_c0_last",
            "seed_kw_last", "seed_kh_last", "start_ow_last", "start_oh_last", "one_col",
            "one_row", "empty")}
        m.d.sync += [
            fact["c0_single"].eq(c0_last == 0), fact["kw_single"].eq(kw_last == 0),
            fact["kh_single"].eq(kh_last == 0), fact["ow_single"].eq(iw0_last == iw0_first),
            fact["oh_single"].eq(ih0_last == ih0_first),
            fact["seed_c0_last"].eq(seed["c0"] == c0_last),
            fact["seed_kw_last"].eq(seed["kw_off"] == kw_last),
            fact["seed_kh_last"].eq(seed["kh_off"] == kh_last),
            fact["start_ow_last"].eq(iw0 == iw0_last), fact["start_oh_last"].eq(ih0 == ih0_last),
            fact["one_col"].eq(job.valid_col == 1), fact["one_row"].eq(job.valid_row == 1),
            fact["empty"].eq((job.valid_row == 0) | (job.valid_col == 0)),
        ]

        # Walk state besides the coordinates: the remaining columns and rows, and the
        # "at its last value" flags of c0, kw, kh, ow, oh, the row and the window.
        cols_left, rows_left = Signal(16, name="cols_left"), Signal(16, name="rows_left")
        at_last = {name: Signal(name=name + "_at_last") for name in (
            "c0", "kw", "kh", "ow", "oh", "col", "row")}
        walk = (seed, col, cols_left, rows_left, at_last, fact)
        # The address steps, chosen by the flags alone (not by the walk's state or its
        # handshake), so that those reach the address registers' enables and not the
        # adders' inputs (issue #9, decision E21).
        col_delta = Signal(a_w, name="col_delta")
        row_delta = Signal(a_w, name="row_delta")
        m.d.comb += [
            col_delta.eq(Mux(~at_last["c0"], 1, Mux(~at_last["kw"], kw_delta,
                                                     Mux(~at_last["kh"], kh_delta, c1_delta)))),
            row_delta.eq(Mux(~at_last["ow"], ow_step, Mux(~at_last["oh"], oh_delta,
                                                          image_delta))),
        ]

        # Two register stages after the walk: the element's coordinates and index, then
        # the output payload with the padding test.  All stages advance together.
        out_valid, element_valid = Signal(name="out_valid"), Signal(name="element_valid")
        ih, iw = Signal(signed(b_w), name="ih"), Signal(signed(b_w), name="iw")
        channel_real = Signal(name="channel_real")
        element = Signal(AddressLayout(a_w), name="element")    # its pad is found later
        payload = Signal(AddressLayout(a_w), name="out_payload")
        advance = Signal(name="advance")
        idle = Signal(name="idle")
        m.d.comb += [self.out.valid.eq(out_valid), self.out.payload.eq(payload),
                     advance.eq(~out_valid | self.out.ready),
                     self.busy.eq(~idle | element_valid | out_valid)]
        with m.If(advance):
            m.d.sync += [out_valid.eq(element_valid), element_valid.eq(0),
                         payload.eq(element),
                         payload.pad.eq(~((ih >= 0) & (ih < fm.height) & (iw >= 0)
                                          & (iw < fm.width) & channel_real))]

        with m.FSM(name="walk"):
            with m.State("IDLE"):
                # An element still in the first stage needs this job's map size.
                m.d.comb += [idle.eq(1), self.cmd.ready.eq(~self.abort & ~element_valid)]
                m.d.sync += fm.eq(self.fm)
                with m.If(self.cmd.valid & self.cmd.ready):
                    m.d.sync += [job.eq(self.cmd.payload), *program.start()]
                    m.next = "SETUP"
            with m.State("SETUP"):
                with m.If(~program.busy):
                    m.next = "START"
                with m.If(self.abort):
                    m.next = "IDLE"
            with m.State("START"):
                m.d.sync += [col[k].eq(seed[k]) for k in col]
                m.d.sync += [cols_left.eq(job.valid_col), rows_left.eq(job.valid_row),
                             at_last["c0"].eq(fact["seed_c0_last"]),
                             at_last["kw"].eq(fact["seed_kw_last"]),
                             at_last["kh"].eq(fact["seed_kh_last"]),
                             at_last["ow"].eq(fact["start_ow_last"]),
                             at_last["oh"].eq(fact["start_oh_last"]),
                             at_last["col"].eq(fact["one_col"]),
                             at_last["row"].eq(fact["one_row"])]
                with m.If(fact["empty"] | self.abort):
                    m.next = "IDLE"
                with m.Else():
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(advance):
                    m.d.sync += [element_valid.eq(1),
                                 ih.eq(ih0 + col["kh_off"]), iw.eq(iw0 + col["kw_off"]),
                                 channel_real.eq(col["c0"] < col["lc_left"]),
                                 element.index.eq(row_addr + col["col_addr"]),
                                 element.row_last.eq(at_last["col"]),
                                 element.last.eq(at_last["col"] & at_last["row"])]
                    with m.If(at_last["col"]):
                        self._next_row(m, job, fm, walk, (ih0, iw0, row_addr),
                                       (iw0_first, iw0_pen, ih0_first, ih0_pen), row_delta)
                    with m.Else():
                        self._next_column(m, fm, walk, (c0_pen, kw_pen, kh_pen), col_delta)
                    with m.If(at_last["col"] & at_last["row"]):
                        m.next = "IDLE"
                with m.If(self.abort):
                    m.next = "IDLE"
        # Last, so that it overrides everything above.
        with m.If(self.abort):
            m.d.sync += [out_valid.eq(0), element_valid.eq(0), *program.stop()]
        return m

    @staticmethod
    def _next_column(m, fm, walk, pens, delta):
        """Advance (c1, kh, kw, c0) by one: c0 fastest, then kw, kh, c1.

        A counter's "at last" flag is set when it steps onto its last value (its value
        now equals the last-but-one) or wraps to a first value that is also the last.
        ``delta`` is the column address's step, which the wrap pattern picks.
        """
        _, col, cols_left, _, at_last, fact = walk
        c0_pen, kw_pen, kh_pen = pens
        m.d.sync += [cols_left.eq(cols_left - 1), at_last["col"].eq(cols_left == 2),
                     col["col_addr"].eq(col["col_addr"] + delta)]
        with m.If(~at_last["c0"]):
            m.d.sync += [col["c0"].eq(col["c0"] + 1), at_last["c0"].eq(_reached(col["c0"], c0_pen))]
        with m.Else():
            m.d.sync += [col["c0"].eq(0), at_last["c0"].eq(fact["c0_single"])]
            with m.If(~at_last["kw"]):
                m.d.sync += [col["kw_off"].eq(col["kw_off"] + fm.dilation_width),
                             at_last["kw"].eq(_reached(col["kw_off"], kw_pen))]
            with m.Else():
                m.d.sync += [col["kw_off"].eq(0), at_last["kw"].eq(fact["kw_single"])]
                with m.If(~at_last["kh"]):
                    m.d.sync += [col["kh_off"].eq(col["kh_off"] + fm.dilation_height),
                                 at_last["kh"].eq(_reached(col["kh_off"], kh_pen))]
                with m.Else():
                    m.d.sync += [col["kh_off"].eq(0), at_last["kh"].eq(fact["kh_single"]),
                                 col["lc_left"].eq(col["lc_left"] - fm.channels_per_group)]

    @staticmethod
    def _next_row(m, job, fm, walk, row, ends, delta):
        """Restart the columns from their seed and advance (image, oh, ow) by one;
        ``delta`` is the row address's step, which the wrap pattern picks."""
        seed, col, cols_left, rows_left, at_last, fact = walk
        ih0, iw0, row_addr = row
        iw0_first, iw0_pen, ih0_first, ih0_pen = ends
        m.d.sync += [col[k].eq(seed[k]) for k in col]
        m.d.sync += [cols_left.eq(job.valid_col), rows_left.eq(rows_left - 1),
                     at_last["c0"].eq(fact["seed_c0_last"]),
                     at_last["kw"].eq(fact["seed_kw_last"]),
                     at_last["kh"].eq(fact["seed_kh_last"]),
                     at_last["col"].eq(fact["one_col"]), at_last["row"].eq(rows_left == 2),
                     row_addr.eq(row_addr + delta)]
        with m.If(~at_last["ow"]):
            m.d.sync += [iw0.eq(iw0 + fm.stride_width), at_last["ow"].eq(_reached(iw0, iw0_pen))]
        with m.Else():
            m.d.sync += [iw0.eq(iw0_first), at_last["ow"].eq(fact["ow_single"])]
            with m.If(~at_last["oh"]):
                m.d.sync += [ih0.eq(ih0 + fm.stride_height),
                             at_last["oh"].eq(_reached(ih0, ih0_pen))]
            with m.Else():
                m.d.sync += [ih0.eq(ih0_first), at_last["oh"].eq(fact["oh_single"])]
