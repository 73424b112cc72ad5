"""The output-stationary systolic MAC array of the CUBE unit.

An R x C grid of :class:`~ptocube.hdl.pe.ProcessingElement` computes, for up
to ``slots`` output blocks of R x C elements at once, the K-ordered chains

    acc[i][j] = RNE_fp32(acc[i][j] + a[i][k] * b[k][j])   k = 0, 1, ..., K-1

(floats; integers wrap modulo 2**32), each starting from zero or from an
initial value loaded into the array (ACC forms).  The dataflow, the
interleaving of output blocks, the exchange of results and initial values
and the timing are described in ``docs/hdl-systolic.md``; in short:

* **feed** (stream in): one *beat* per transfer: one column of A (R raw
  elements) and one row of B (C raw elements) for one term k of one slot,
  their data types, MX scales, and the flags ``first``/``load``/``null``.
  A beat for slot ``s`` is accepted only in a cycle whose ``phase`` is
  ``s``, so a sequencer that issues slots 0, 1, ..., L-1, 0, 1, ... keeps the
  array busy every cycle.  The operands are decoded once at the array edge
  (one :class:`~ptocube.hdl.input_decoder.InputDecoder` per row and per
  column) and travel decoded: A to the right, B downwards.
* A **group** is ``slots`` chains started together: its first beats (one with
  ``first`` per slot, a ``null`` one for an unused slot) *swap* each slot's
  finished chain from the previous group out of the accumulator pipeline into
  the PE's chain register, and take that register's content as the new
  chain's initial value if ``load`` is set.
* **fill** (stream in) / **drain** (stream out): after a group's swaps have
  reached every PE, the array *exchanges* the chain registers: R x slots
  shifts, each taking one row of C initial values for the next group and
  giving one row of C results of the previous group.  The exchange runs
  while the group computes; the next group's first beats wait for it.
"""

from dataclasses import replace

from amaranth.hdl import Array, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .config import CubeConfig
from .input_decoder import InputDecoder
from .numeric_types import NumericConfig
from .pe import ProcessingElement, control_layout, delay_line, operand_layout

__all__ = ["SystolicArray", "feed_layout", "drain_layout", "fill_layout"]

#: Exchanges after reset that drain no results (they would carry the reset
#: content of the chain registers, then of the accumulator pipelines) and so
#: present nothing on ``drain``.
_RESET_EXCHANGES = 2


def _field(count: int) -> unsigned:
    """An unsigned shape holding 0..count-1 (at least one bit)."""
    return unsigned(max(1, (count - 1).bit_length()))


def feed_layout(numeric: NumericConfig, rows: int, cols: int, slots: int) -> data.StructLayout:
    """Payload of one feed beat (see :class:`SystolicArray`)."""
    fields = {
        "a": data.ArrayLayout(numeric.raw_width, rows),
        "b": data.ArrayLayout(numeric.raw_width, cols),
        "a_type": 5, "b_type": 5,
    }
    if numeric.has_scale:
        fields.update({
            "a_scale": data.ArrayLayout(8, rows), "b_scale": data.ArrayLayout(8, cols),
            "a_scale_en": 1, "b_scale_en": 1,
        })
    fields.update({"slot": _field(slots), "first": 1, "load": 1, "null": 1})
    return data.StructLayout(fields)


def fill_layout(cols: int) -> data.StructLayout:
    """Payload of one fill row: C initial accumulator bit patterns."""
    return data.StructLayout({"data": data.ArrayLayout(32, cols)})


def drain_layout(rows: int, cols: int, slots: int) -> data.StructLayout:
    """Payload of one drain row: C result bit patterns, their array row and slot."""
    return data.StructLayout({"data": data.ArrayLayout(32, cols),
                              "row": _field(rows), "slot": _field(slots)})


class SystolicArray(wiring.Component):
    """R x C output-stationary MAC array with interleaved accumulator slots.

    Parameters
    ----------
    config : CubeConfig
        ``rows``/``cols`` size the grid; ``int_types``/``float_types``/
        ``mx_types``/``fma_stages`` give the
        :class:`~ptocube.hdl.numeric_types.NumericConfig` of every PE (an
        integer-only build contains no float logic at all).  In a build with
        both classes the integer MAC registers its product too
        (``int_mac_stages`` = 2 when ``fma_stages`` >= 2): its loop is padded
        to the FMA's length anyway.  ``int_product_register`` (integer-only
        builds) adds a register after each multiplier: a PE then swaps one
        cycle later (:attr:`swap_distance`).
    slots : int or None
        Output chains interleaved per PE (``L``); ``None`` chooses the
        smallest that hides the MAC latency
        (:meth:`ProcessingElement.minimum_slots`).  A larger value pads the
        MAC pipelines; it is mainly useful to reproduce another build's
        schedule cheaply.

    Members
    -------
    feed : In(stream.Signature(feed_layout(...)))
        Beats.  ``a[i]``/``b[j]``: raw elements (a 4-bit lane right-aligned);
        ``a_type``/``b_type``: their DataType codes; ``a_scale[i]``/
        ``b_scale[j]`` and ``a_scale_en``/``b_scale_en``: E8M0 scales (MX
        builds); ``slot``: the chain the term belongs to; ``first``: the term
        is k = 0 of a new chain; ``load``: with ``first``, start from the
        slot's filled initial value instead of zero; ``null``: the beat adds
        no term (its operands are ignored), used for a group's unused slots.
        ``feed.ready`` depends on ``slot`` and ``first`` (the phase must equal
        ``slot``; a first beat waits until its slot's previous chain may be
        swapped out).
    fill : In(stream.Signature(fill_layout(cols)))
        Initial values for the group after the current one, R x L rows per
        group, in the order (row 0, slot 0), (row 0, slot 1), ..., (R-1, L-1).
        Must not wait for ``drain.valid`` (a transfer on either stream needs
        both ``fill.valid`` and ``drain.ready``).
    drain : Out(stream.Signature(drain_layout(...)))
        Results, R x L rows per group in the same order, tagged with their
        array row and slot.  A group's results are swapped out by the next
        group's first beats and drained while that next group computes (the
        last group needs a following group, e.g. one of null beats).  The two
        exchanges after reset carry no results and are not drained.  See
        ``docs/hdl-systolic.md`` for the schedule.
    """

    def __init__(self, config: CubeConfig, slots: int | None = None):
        if not isinstance(config, CubeConfig):
            raise TypeError(f"config must be a CubeConfig, not {config!r}")
        numeric = NumericConfig.from_cube_config(config)
        if numeric.has_float and numeric.has_int:
            # The integer loop is padded to the FMA's length anyway: spend one
            # of the pad registers inside IntMac, after its multiplier.
            numeric = replace(numeric, int_mac_stages=min(2, max(1, numeric.fma_stages)))
        minimum = ProcessingElement.minimum_slots(numeric)
        if slots is None:
            slots = minimum
        if slots < minimum:
            raise ValueError(f"slots must be at least {minimum} (the MAC latency) for this "
                             f"build, not {slots}")
        self.config = config
        self.numeric = numeric
        self.rows = config.rows
        self.cols = config.cols
        self.slots = slots
        super().__init__({
            "feed": In(stream.Signature(feed_layout(numeric, self.rows, self.cols, slots))),
            "fill": In(stream.Signature(fill_layout(self.cols))),
            "drain": Out(stream.Signature(drain_layout(self.rows, self.cols, slots))),
        })

    @property
    def edge_stages(self) -> int:
        """Registers after the edge decoders (1 with ``dsp_primitives``: PE(0, 0)'s
        operands would otherwise go from the decoders straight into its DSP's input
        registers, wherever the placer put that DSP)."""
        return int(self.numeric.dsp_primitives is not None)

    @property
    def swap_distance(self) -> int:
        """Cycles from accepting a beat to the end of the cycle in which the
        last PE (R-1, C-1) uses it: one entry register, the edge registers if
        any, one operand register per PE, R-1 + C-1 hops, and the product
        register if there is one."""
        return (self.rows + self.cols + self.edge_stages
                + int(self.numeric.int_product_register))

    @property
    def exchange_rows(self) -> int:
        """Fill and drain rows per group (R x slots)."""
        return self.rows * self.slots

    def elaborate(self, platform):
        m = Module()
        cfg = self.numeric
        rows, cols, slots = self.rows, self.cols, self.slots
        operand = operand_layout(cfg)
        control = control_layout(cfg, slots)
        beat = self.feed.payload

        # ------------------------------------------------------------------
        # Slot phase, chain-register state and beat acceptance
        # ------------------------------------------------------------------
        phase = Signal(_field(slots))
        m.d.sync += phase.eq(Mux(phase == slots - 1, 0, phase + 1))

        # READY: the chain registers hold the next group's initial values;
        # first beats may swap.  WINDOW: every slot has swapped; waiting for
        # the last swap to reach PE(R-1, C-1).  EXCHANGE: shifting.  Reset
        # starts in EXCHANGE: group 1's initial values must come in first.
        swapped = Signal(slots)
        window = Signal(range(self.swap_distance + 1))
        exchanged = Signal(range(self.exchange_rows + 1))
        drain_row = Signal(_field(rows))
        drain_slot = Signal(_field(slots))
        skip_drain = Signal(range(_RESET_EXCHANGES + 1), init=_RESET_EXCHANGES)

        swap_allowed = Signal()
        accept = Signal()
        # The group's last swap is registered (``closing``) and the window starts a cycle
        # later, one shorter: the acceptance (from the beat and the phase) reaches one
        # flip-flop instead of the state and the window counter.  Meanwhile every slot has
        # swapped, so no first beat is accepted in that cycle.
        closing = Signal()
        with m.FSM(init="EXCHANGE") as fsm:
            with m.State("READY"):
                m.d.comb += swap_allowed.eq(~swapped.bit_select(phase, 1))
                m.d.sync += closing.eq(
                    accept & beat.first & ((swapped | (1 << phase)) == (1 << slots) - 1))
                with m.If(closing):
                    m.d.sync += window.eq(self.swap_distance - 2)
                    m.next = "WINDOW"
            with m.State("WINDOW"):
                m.d.sync += window.eq(window - 1)
                with m.If(window == 0):
                    m.next = "EXCHANGE"
            with m.State("EXCHANGE"):
                with m.If(self.fill.valid & self.fill.ready):
                    m.d.sync += [exchanged.eq(exchanged + 1), drain_slot.eq(drain_slot + 1)]
                    with m.If(drain_slot == slots - 1):
                        m.d.sync += [drain_slot.eq(0), drain_row.eq(drain_row + 1)]
                    with m.If(exchanged == self.exchange_rows - 1):
                        m.d.sync += [exchanged.eq(0), drain_row.eq(0), swapped.eq(0)]
                        with m.If(skip_drain != 0):
                            m.d.sync += skip_drain.eq(skip_drain - 1)
                        m.next = "READY"

        m.d.comb += [
            self.feed.ready.eq((beat.slot == phase) & (~beat.first | swap_allowed)),
            accept.eq(self.feed.valid & self.feed.ready),
        ]
        with m.If(accept & beat.first):
            m.d.sync += swapped.bit_select(phase, 1).eq(1)

        # ------------------------------------------------------------------
        # Exchange: the chain registers of each column shift towards row 0
        # ------------------------------------------------------------------
        exchanging = fsm.ongoing("EXCHANGE")
        skipping = skip_drain != 0
        m.d.comb += [
            self.drain.valid.eq(exchanging & ~skipping & self.fill.valid),
            self.fill.ready.eq(exchanging & (skipping | self.drain.ready)),
            self.drain.payload.row.eq(drain_row),
            self.drain.payload.slot.eq(drain_slot),
        ]
        # The chains shift in the cycle after the transfer, from a register with the
        # filled row: the handshake (from outside the array) reaches one flip-flop, not
        # the enables of every chain register.  Meanwhile the drain shows the chain
        # position behind the top one (see below), so transfers may follow each other
        # in every cycle; the last shift is done long before the next swap.
        shift = Signal()
        fill_row = Signal.like(self.fill.payload.data, name="fill_row", reset_less=True)
        m.d.sync += [shift.eq(self.fill.valid & self.fill.ready),
                     fill_row.eq(self.fill.payload.data)]

        # ------------------------------------------------------------------
        # Entry register: the accepted beat, or a bubble
        # ------------------------------------------------------------------
        # The operands are taken every cycle, accepted or not: `entry_valid` masks them at
        # the decoders, so `accept` (a long path from the state through `feed.ready`)
        # reaches a few control flip-flops instead of the enable of the whole beat.
        entry = Signal(beat.shape(), name="entry", reset_less=True)
        entry_valid = Signal()
        entry_ctl = Signal(control)
        m.d.sync += [entry_valid.eq(accept & ~beat.null), entry.eq(beat)]
        m.d.sync += [
            entry_ctl.first.eq(accept & beat.first),
            entry_ctl.load.eq(beat.load),
            entry_ctl.slot.eq(phase),
        ]
        if cfg.has_float and cfg.has_int:
            # The class (integer: type codes 16..31) of each slot's current
            # chain; a bubble takes its slot's class so it cannot disturb it.
            slot_is_int = Array(Signal(name=f"slot{s}_is_int") for s in range(slots))
            with m.If(accept & beat.first):
                m.d.sync += slot_is_int[phase].eq(beat.a_type[4])
            m.d.sync += entry_ctl.is_int.eq(Mux(accept, beat.a_type[4], slot_is_int[phase]))

        # ------------------------------------------------------------------
        # Edge decoders: one per row of A and per column of B
        # ------------------------------------------------------------------
        def decode(side, index, raw, scale, identity_fp):
            dec = m.submodules[f"dec_{side}{index}"] = InputDecoder(cfg)
            edge = m.submodules[f"edge_{side}{index}"] = Module()
            edge.d.comb += [dec.dtype.eq(getattr(entry, f"{side}_type")), dec.raw.eq(raw)]
            if cfg.has_scale:
                edge.d.comb += [dec.scale.eq(scale),
                                dec.scale_en.eq(getattr(entry, f"{side}_scale_en"))]
            value = Signal(operand, name=f"{side}{index}_decoded")
            # A bubble or null beat multiplies -0 by +0: no change to any sum.
            if cfg.has_float:
                edge.d.comb += value.fp.eq(Mux(entry_valid, dec.fp.as_value(), identity_fp))
            if cfg.has_int:
                edge.d.comb += value.int.eq(Mux(entry_valid, dec.int_value, 0))
            return delay_line(edge, value, self.edge_stages, f"{side}{index}_edge", True)

        edge_ctl = delay_line(m, entry_ctl, self.edge_stages, "edge_ctl")
        fp_zero = {}
        if cfg.has_float:
            layout = cfg.float_layout
            fp_zero = {"a": layout.pack(sign=1, is_zero=1), "b": layout.pack(is_zero=1)}
        a_edge = [decode("a", i, entry.a[i], entry.a_scale[i] if cfg.has_scale else None,
                         fp_zero.get("a")) for i in range(rows)]
        b_edge = [decode("b", j, entry.b[j], entry.b_scale[j] if cfg.has_scale else None,
                         fp_zero.get("b")) for j in range(cols)]

        # ------------------------------------------------------------------
        # Skew (row i and column j start i and j cycles late) and the grid
        # ------------------------------------------------------------------
        pes = [[ProcessingElement(cfg, slots) for _ in range(cols)] for _ in range(rows)]
        # Wiring and skew registers live in small per-lane modules: pysim
        # re-runs a whole module whenever one of its inputs changes, so one
        # big module would be re-evaluated for every operand that moves.
        for i in range(rows):
            lane = m.submodules[f"row_skew{i}"] = Module()
            a_val, ctl_val = a_edge[i], edge_ctl
            for stage in range(i):
                a_reg = Signal(operand, name=f"skew_a{i}_{stage}", reset_less=True)
                ctl_reg = Signal(control, name=f"skew_ctl{i}_{stage}")
                lane.d.sync += [a_reg.eq(a_val), ctl_reg.eq(ctl_val)]
                a_val, ctl_val = a_reg, ctl_reg
            lane.d.comb += [pes[i][0].a_in.eq(a_val), pes[i][0].ctl_in.eq(ctl_val)]
        for j in range(cols):
            lane = m.submodules[f"col_skew{j}"] = Module()
            b_val = b_edge[j]
            for stage in range(j):
                b_reg = Signal(operand, name=f"skew_b{j}_{stage}", reset_less=True)
                lane.d.sync += b_reg.eq(b_val)
                b_val = b_reg
            lane.d.comb += pes[0][j].b_in.eq(b_val)
        for i in range(rows):
            for j in range(cols):
                pe = m.submodules[f"pe_{i}_{j}"] = pes[i][j]
                link = m.submodules[f"link_{i}_{j}"] = Module()
                link.d.comb += pe.shift.eq(shift)
                if j > 0:
                    link.d.comb += [pe.a_in.eq(pes[i][j - 1].a_out),
                                    pe.ctl_in.eq(pes[i][j - 1].ctl_out)]
                if i > 0:
                    link.d.comb += pe.b_in.eq(pes[i - 1][j].b_out)
                if i + 1 < rows:
                    link.d.comb += pe.chain_in.eq(pes[i + 1][j].chain_out)
                else:
                    link.d.comb += pe.chain_in.eq(fill_row[j])
        for j in range(cols):
            # While a shift is pending, the row after it is the one behind the top.
            m.d.comb += self.drain.payload.data[j].eq(
                Mux(shift, pes[0][j].chain_next, pes[0][j].chain_out))
        return m
