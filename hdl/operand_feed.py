"""The operand feed of the CUBE engine: systolic-array beats from the tile store.

:class:`OperandFeed` walks one PE's output blocks group by group (``hdl/cube_run.py``,
:func:`~ptocube.hdl.cube_run.block_walker`) and, for each term k of each slot, reads the
A column (R elements), the B row (C elements) and, for MX forms, their E8M0 scales from
their CELL or row-major payloads, and offers the beat to the array
(``docs/hdl-systolic.md`` section 7).  Every lane (one per array row or column and
operand) keeps the last payload word it read, so a lane reads a new word only when its
element moves out of the one it holds.  This *lane path* serves the runs that
:class:`~ptocube.hdl.panel_feed.PanelFeed` does not (Shared or transposed primaries, MX
scales, the floating Bias term); the engine starts one of the two per run.

A run is: one group of null first beats (the chains' initial values for the first real
group are loaded by the exchange it triggers), the real groups, then one more null group
that pushes the last results out.  A floating BIAS form adds one term after the K loop:
a = FP32 1.0, b = Bias[j], so that the FMA computes RNE(acc + Bias[j]) exactly as the
model's separate bias step does.
"""

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from .cell_address import (cube_m_bits, cube_n8_bits, extract, n8_column_cells,
                           row_major_bits, word_and_offset)
from .config import CubeConfig
from .cube_run import RunLayout, block_walker, select_block
from .read_arbiter import ReadReqLayout, ReadRspLayout, lane_cache
from .tile_port import word_addr_width

__all__ = ["OperandFeed", "FeedComponent"]


class FeedComponent(wiring.Component):
    """The ports and parameters every operand feed has, so the engine swaps feeds without
    rewiring: ``run``, ``start``/``done``, the ``feed`` beats and the ``rd``/``rsp`` reads."""

    def __init__(self, config: CubeConfig, feed_shape, slots: int, has_scale: bool):
        self.config = config
        self.slots = slots
        self.has_scale = has_scale
        super().__init__({
            "run": In(RunLayout(config)),
            "start": In(1), "done": Out(1),
            "feed": Out(stream.Signature(feed_shape)),
            "rd": Out(stream.Signature(ReadReqLayout(config))),
            "rsp": In(ReadRspLayout),
        })


_FP32_ONE = 0x3F800000


class OperandFeed(FeedComponent):
    """Beats for one PE's run of a Matrix plan.

    Parameters
    ----------
    config : CubeConfig
    feed_shape : the array's feed payload layout; ``slots`` : the array's L.

    Members
    -------
    run : In(RunLayout(config))
        The PE's run context, still from ``start`` to ``done``.
    start : In(1)
        Begin a run (strobe, while idle).
    done : Out(1)
        High while idle (after reset, and once the run's last beat is taken).
    feed : Out(stream.Signature(feed_shape))
        Beats for the array.
    rd : Out(stream.Signature(ReadReqLayout)), rsp : In(ReadRspLayout)
        Payload reads through the engine's read arbiter.
    """

    def elaborate(self, platform):
        m = Module()
        cfg, run, beat = self.config, self.run, self.feed.payload
        rows, cols, slots = cfg.rows, cfg.cols, self.slots
        aw = word_addr_width(cfg)

        k = Signal(16)
        s = Signal(range(max(2, slots)))
        terms = (run.k + run.float_bias)[:17]
        last_term = k + 1 == terms
        step_group = Signal()
        restart = Signal()
        blocks, walk_done = block_walker(m, "feed", rows, cols, slots, run.m, run.n,
                                         restart, step_group)
        row0, col0, used = select_block(m, blocks, s)

        in_real = Signal()
        bias_term = Signal()
        m.d.comb += bias_term.eq(run.float_bias & (k == run.k))
        real_beat = in_real & used

        # Lanes: A rows, B columns, then the scales.
        lanes, extractors = [], []
        # Every lane is per slot (array row or column, operand and slot), so that each
        # slot's words survive the other slots' beats.  The address is computed once, for
        # the slot on offer.
        # Each lane reads ahead the word holding its next elements along K: the first k of
        # the next word of that lane (a row of a CELL holds 64 or 32 bits of A; a CUBE_N8
        # column and a row-major row hold 64 bits per word; a transposed Shared primary
        # moves to another row every k; a scale changes every 32 k).
        def next_k(log2_run):
            return ((k | ((Value.cast(1) << log2_run) - 1)[:16]) + 1)[:17]

        a_run = Mux(run.a_shared, Mux(run.trans_a, 0, 6 - run.a_log2w),
                    Mux(run.m32, 5, 6) - run.a_log2w)[:4]
        b_run = Mux(run.b_shared & run.trans_b, 0, 6 - run.b_log2w)[:4]
        a_next, b_next = next_k(a_run), next_k(b_run)
        scale_next = next_k(5)
        ahead_ok = real_beat & ~bias_term

        def a_bits(row, kk):
            local = cube_m_bits(run.m32, run.a_log2w, row, kk)
            shared = Mux(run.trans_a, row_major_bits(run.a_log2w, run.a.log2p, kk, row),
                         row_major_bits(run.a_log2w, run.a.log2p, row, kk))
            return Mux(run.a_shared, shared, local)

        # A CUBE_M32 word holds two rows: with R even, blocks start on an even row, so an
        # odd array row takes its element from the even row's word (read once).
        pairs = rows % 2 == 0
        paired = run.m32 & ~run.a_shared
        for i in range(rows):
            gi = row0 + i
            addr, off = word_and_offset(run.a.base, a_bits(gi, k), aw)
            ahead, _ = word_and_offset(run.a.base, a_bits(gi, a_next), aw)
            for lane_slot in range(slots):
                need = real_beat & (gi < run.m) & ~bias_term & (s == lane_slot)
                own = need & ~paired if pairs and i % 2 else need
                lanes.append((own, run.a.space, addr, own & ahead_ok & (a_next < run.k),
                              ahead))
                extractors.append((need, off, run.a_log2w))
        def b_bits(column_cells, kk, col):
            local = cube_n8_bits(run.b_log2w, column_cells, kk, col)
            shared = Mux(run.trans_b, row_major_bits(run.b_log2w, run.b.log2p, col, kk),
                         row_major_bits(run.b_log2w, run.b.log2p, kk, col))
            return Mux(run.b_shared, shared, local)

        for j in range(cols):
            gj = col0 + j
            column_cells = n8_column_cells(run.b_k_repeat, gj)
            b_addr, b_off = word_and_offset(run.b.base, b_bits(column_cells, k, gj), aw)
            b_ahead, _ = word_and_offset(run.b.base, b_bits(column_cells, b_next, gj), aw)
            bias_addr, bias_off = word_and_offset(run.bias.base, gj << 5, aw)
            for lane_slot in range(slots):
                need = real_beat & (gj < run.n) & (s == lane_slot)
                lanes.append((need, Mux(bias_term, run.bias.space, run.b.space),
                              Mux(bias_term, bias_addr, b_addr),
                              need & ahead_ok & (b_next < run.k), b_ahead))
                extractors.append((need, Mux(bias_term, bias_off, b_off),
                                   Mux(bias_term, 5, run.b_log2w)))
        if self.has_scale:
            for i in range(rows):
                gi = row0 + i
                addr, off = word_and_offset(
                    run.a_scale.base, row_major_bits(3, run.a_scale.log2p, gi, k >> 5), aw)
                ahead, _ = word_and_offset(
                    run.a_scale.base,
                    row_major_bits(3, run.a_scale.log2p, gi, scale_next >> 5), aw)
                for lane_slot in range(slots):
                    need = real_beat & (gi < run.m) & ~bias_term & run.a_scaled \
                        & (s == lane_slot)
                    lanes.append((need, run.a_scale.space, addr,
                                  need & (scale_next < run.k), ahead))
                    extractors.append((need, off, 3))
            for j in range(cols):
                gj = col0 + j
                addr, off = word_and_offset(
                    run.b_scale.base, row_major_bits(3, run.b_scale.log2p, k >> 5, gj), aw)
                ahead, _ = word_and_offset(
                    run.b_scale.base,
                    row_major_bits(3, run.b_scale.log2p, scale_next >> 5, gj), aw)
                for lane_slot in range(slots):
                    need = real_beat & (gj < run.n) & ~bias_term & run.b_scaled \
                        & (s == lane_slot)
                    lanes.append((need, run.b_scale.space, addr,
                                  need & (scale_next < run.k), ahead))
                    extractors.append((need, off, 3))

        all_hit, words = lane_cache(m, "lane", lanes, self.rd, self.rsp, self.start)
        for i in range(1, rows if pairs else 0, 2):
            for lane_slot in range(slots):
                lane = i * slots + lane_slot             # A lanes come first, row-major
                words[lane] = Mux(paired, words[lane - slots], words[lane])
        values = [Mux(need, extract(word, off, log2w, 32), 0)
                  for word, (need, off, log2w) in zip(words, extractors)]

        def per_slot(group, count):
            """The value of each row or column from the lane of the slot on offer."""
            merged = []
            for j in range(count):
                value = group[j * slots]
                for lane_slot in range(1, slots):
                    value = Mux(s == lane_slot, group[j * slots + lane_slot], value)
                merged.append(value)
            return merged

        a_values = per_slot(values[:rows * slots], rows)
        b_values = per_slot(values[rows * slots:(rows + cols) * slots], cols)
        m.d.comb += [beat.a[i].eq(Mux(bias_term, _FP32_ONE, a_values[i])) for i in range(rows)]
        m.d.comb += [beat.b[j].eq(b_values[j]) for j in range(cols)]
        m.d.comb += [beat.a_type.eq(Mux(bias_term, int(DataType.FP32), run.a_type)),
                     beat.b_type.eq(Mux(bias_term, int(DataType.FP32), run.b_type)),
                     beat.slot.eq(s), beat.first.eq(k == 0),
                     beat.load.eq(run.acc | run.int_bias), beat.null.eq(~real_beat)]
        if self.has_scale:
            scales = values[(rows + cols) * slots:]
            a_scales = per_slot(scales[:rows * slots], rows)
            b_scales = per_slot(scales[rows * slots:], cols)
            m.d.comb += [beat.a_scale[i].eq(a_scales[i]) for i in range(rows)]
            m.d.comb += [beat.b_scale[j].eq(b_scales[j]) for j in range(cols)]
            m.d.comb += [beat.a_scale_en.eq(run.a_scaled & ~bias_term),
                         beat.b_scale_en.eq(run.b_scaled & ~bias_term)]

        # Sequencer: a null group, the real groups, a null group.
        taken = self.feed.valid & self.feed.ready
        next_slot = Signal()
        with m.If(next_slot):
            m.d.sync += s.eq(Mux(s == slots - 1, 0, s + 1))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [s.eq(0), k.eq(0)]
                    m.next = "NULL_FIRST"
            with m.State("NULL_FIRST"):
                m.d.comb += self.feed.valid.eq(1)
                with m.If(taken):
                    m.d.comb += next_slot.eq(1)
                    with m.If(s == slots - 1):
                        m.next = "REAL"
            with m.State("REAL"):
                m.d.comb += in_real.eq(1)
                with m.If(walk_done):
                    m.d.comb += in_real.eq(0)
                    m.next = "NULL_LAST"
                with m.Elif(~used & (k != 0)):
                    m.d.comb += next_slot.eq(1)        # no beat: the slot has no block
                with m.Else():
                    m.d.comb += self.feed.valid.eq(all_hit)
                    m.d.comb += next_slot.eq(taken)
                with m.If(next_slot & (s == slots - 1)):
                    m.d.sync += k.eq(Mux(last_term, 0, k + 1))
                    m.d.comb += step_group.eq(last_term)
            with m.State("NULL_LAST"):
                m.d.comb += self.feed.valid.eq(1)
                with m.If(taken):
                    m.d.comb += next_slot.eq(1)
                    with m.If(s == slots - 1):
                        m.next = "IDLE"
        return m
