"""The buffered operand feed of the CUBE engine: A and B read once per PE, reused from RAM.

:class:`PanelFeed` produces the same beats as :class:`~ptocube.hdl.operand_feed.OperandFeed`
(a null group, the real groups k-major and slot-minor, a null group) for runs whose A and B
are Local CUBE tiles without MX scales or a floating Bias term (:func:`panel_feed_usable`).
Instead of re-reading payload words for every block, it copies each operand word from the
tile store once into one of two block RAMs and feeds every block from there:

* **A buffer**: one entry per (output row, 64-bit word along K) - R lanes of 64 bits, lane
  i holding the rows ``i mod R``; row-major walks put block row p's word e (K elements
  ``e * 64/w`` ...) at entry ``p * wpr + e`` (``wpr`` = words per row), column-outer walks
  at ``p + e * P`` (P block rows).  A CUBE_M16 row slice is a whole word; two CUBE_M32 row
  slices (CELLs 2e and 2e + 1) share one entry, and one store word (two rows of one CELL)
  fills two lanes at once (32-bit write granularity).
* **B buffer**: C lanes, lane j holding the columns ``j mod C``; entry ``q * wpc + e`` holds
  block column q's word e of its CUBE_N8 column (``wpc`` words per column).

Both buffers hold the whole operand, so they are filled exactly once per run, in the order
of first use, word column by word column, A and B word columns alternating by the k they
cover:

* **row-major** (:func:`~ptocube.hdl.cube_run.block_walker`): A panel p when block row p
  starts, B panel q during the first block row; A and B entries then complete in address
  order and one completed-entry count per buffer says what a beat may read;
* **block columns outer**: the first column's groups of L blocks in turn (*phases*): each
  phase fills its A panels word column by word column across the panels, together with
  the B panels its group needs (B0 with the first, B1 with the last when P is not a
  multiple of L); the later B panels when their column starts.  B entries still complete
  in address order; for A, the panels below the current phase are whole and the phase's
  panels hold their first ``a_cols`` words.

So every group streams behind exactly the reads it needs, and the later groups run from the
buffers at one beat per cycle.  Beats leave through a one-stage pipeline whose register
matches the buffers' synchronous read ports (block RAM).  ``docs/hdl-cube.md`` section 3
gives the figures.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import fifo
from amaranth.lib.memory import Memory

from ..model.layout import LOCAL_MAX_CAPACITY_BYTES
from .cell_address import extract, n8_column_cells
from .config import CubeConfig
from .cube_run import block_walker, column_outer
from .operand_feed import FeedComponent

__all__ = ["PanelFeed", "panel_feed_usable", "a_buffer_depth", "b_buffer_depth"]

#: Reads of the fill that may be outstanding (the read arbiter allows 4).
_FILL_DEPTH = 8


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _operand_bytes(config: CubeConfig) -> int:
    """The largest Local operand of the build: it fits one PE's memory and one register."""
    return min(config.tile_bytes_per_pe, LOCAL_MAX_CAPACITY_BYTES)


def a_buffer_depth(config: CubeConfig) -> int:
    """Entries of the A buffer: ceil(rows/R) block rows x words per row, for the largest A.

    A CUBE_M16 A of T bytes has at most T/128 CELLs along K (one word per row each) and 16
    rows; a CUBE_M32 one at most ceil(T/256) entries per row (two CELLs each) and 32 rows.
    """
    t = _operand_bytes(config)
    return max(_ceil_div(16, config.rows) * (t // 128),
               _ceil_div(32, config.rows) * _ceil_div(t, 256))


def b_buffer_depth(config: CubeConfig) -> int:
    """Entries of the B buffer: ceil(N/C) block columns x words per column, for the largest B.

    A CUBE_N8 B of T bytes has ceil(N/8) x K_repeat <= T/128 CELLs and at most 2 K_repeat
    words per column; ceil(N/C) <= ceil(N/8) x ceil(8/C).
    """
    return _ceil_div(8, config.cols) * (_operand_bytes(config) // 64)


def panel_feed_usable(run) -> Value:
    """Whether :class:`PanelFeed` can run ``run`` (a :func:`RunLayout` view): Local A and B
    (CUBE layouts), no MX scales, no floating Bias term."""
    return ~run.a_shared & ~run.b_shared & ~run.a_scaled & ~run.b_scaled & ~run.float_bias


def _ceil_words(k: Value, shift: Value) -> Value:
    """ceil(k / 2**shift)."""
    return ((k + ((Const(1, 1) << shift) - 1)[:16]) >> shift)[:16]


class PanelFeed(FeedComponent):
    """Beats for one PE's run from the A and B buffers (see the module docstring).

    Parameters
    ----------
    config : CubeConfig
    feed_shape : the array's feed payload layout; ``slots`` : the array's L;
    has_scale : the payload carries MX scales (sent disabled).

    Members
    -------
    run : In(RunLayout(config))
        The PE's run context (``panel_feed_usable(run)`` must hold), still from ``start`` to
        ``done``.
    start : In(1)
        Begin a run (strobe, while idle).
    done : Out(1)
        High while idle (after reset, and once the run's last beat is taken).
    feed : Out(stream.Signature(feed_shape))
    rd : Out(stream.Signature(ReadReqLayout)), rsp : In(ReadRspLayout)
        The buffer fill's payload reads (through the engine's read arbiter).
    """

    def elaborate(self, platform):
        m = Module()
        cfg, run, beat = self.config, self.run, self.feed.payload
        rows, cols, slots = cfg.rows, cfg.cols, self.slots

        m.submodules.a_mem = a_mem = Memory(shape=64 * rows, depth=a_buffer_depth(cfg),
                                            init=[])
        m.submodules.b_mem = b_mem = Memory(shape=64 * cols, depth=b_buffer_depth(cfg),
                                            init=[])
        a_wr, a_rd = a_mem.write_port(granularity=32), a_mem.read_port()
        b_wr, b_rd = b_mem.write_port(granularity=64), b_mem.read_port()
        a_aw, b_aw = len(a_rd.addr), len(b_rd.addr)

        # Words per A row / B column: K elements of 2**log2w bits, 64 bits per word.
        a_shift = (6 - run.a_log2w)[:3]
        b_shift = (6 - run.b_log2w)[:3]
        wpr, wpc = Signal(16), Signal(16)
        a_cells32 = Signal(16)             # CUBE_M32 CELLs along K
        m.d.comb += [wpr.eq(_ceil_words(run.k, a_shift)), wpc.eq(_ceil_words(run.k, b_shift)),
                     a_cells32.eq(_ceil_words(run.k, (5 - run.a_log2w)[:3]))]

        # Entries of each buffer written so far, in fill (= address) order.
        a_complete = Signal(a_aw + 1)
        b_complete = Signal(b_aw + 1)

        # Block columns outer (decision C14): A entry p + e * P (P block rows): a phase's
        # panels' word e are neighbours, and the beats' e * P is one running sum (C12).
        col_outer = Signal()
        panels = Signal(range(33))
        m.d.comb += col_outer.eq(column_outer(cols, run.m, run.n))
        with m.Switch(run.m):
            for rows_m in range(1, 33):
                with m.Case(rows_m):
                    m.d.comb += panels.eq(_ceil_div(rows_m, rows))

        # ------------------------------------------------------------------
        # Fill: blocks row-major; A panel at each block row's start, B panels in row 0
        # ------------------------------------------------------------------
        f_restart, f_step = Signal(), Signal()
        (f_block,), f_walk_done = block_walker(m, "pfill", rows, cols, 1, run.m, run.n,
                                               f_restart, f_step, strides=(wpr, wpc))
        f_row0, f_col0, _, _, f_bbase = f_block
        fea, feb = Signal(16), Signal(16)           # next word along K of A / of B
        a_row0 = Signal(16)                         # first row of the A panel being filled
        fa_entry = Signal(16)                       # row-major: next A entry (entry order)
        # Block columns outer: A is filled in phases of L block rows (the first column's
        # groups), each word column by word column across its panels.
        phase_row0 = Signal(16)                     # first row of the phase
        phase_p = Signal(16)                        # its first panel
        fpp = Signal(range(max(2, slots)))          # panel within the phase
        fa_eofs = Signal(16)                        # fea x P
        # The B panel being filled (column, entry base); column-outer: its first block's
        # index in the walk (q x P) and the blocks of the groups the A phases cover so far
        # (the B panels those groups need are filled with the phase).
        b_col0, b_ebase, b_qblk, ph_end = Signal(16), Signal(16), Signal(16), Signal(16)
        b_done_col = Signal(16)                     # columns below are in the B buffer
        a_left, b_left = Signal(), Signal()         # the block still fills A / B
        fi = Signal(range(max(rows, cols) + 2))
        fh = Signal()
        f_is_b = Signal()
        f_active = Signal()

        dest_bank_bits = max(1, (max(rows, cols) - 1).bit_length())
        # Destination of each outstanding read: buffer, lane, CUBE_M32 row parity / upper
        # row / CELL half, entry, and whether it completes its entry.
        dest_fields = [("is_b", 1), ("bank", dest_bank_bits), ("odd", 1), ("upper", 1),
                       ("half", 1), ("entry", max(a_aw, b_aw)), ("last", 1)]

        row = (a_row0 + fi)[:16]
        col = (b_col0 + fi)[:16]
        # CUBE_M32: one store word holds rows 2p and 2p + 1 of one CELL; an odd row starts a
        # panel only when R is odd, and then only its upper half is this panel's.
        a_next_i = Mux(run.m32, fi + 2 - row[0], fi + 1)
        rows_end = (a_next_i >= rows) | (a_row0 + a_next_i >= run.m)
        second_half = run.m32 & (fh == 0) & ((fea << 1) + 1 < a_cells32)
        a_last = rows_end & ~second_half
        more_panels = col_outer & (a_row0 + rows < run.m) & (fpp != slots - 1)
        phase_more = col_outer & (phase_row0 + rows * slots < run.m)
        a_upper = (fi + 1 - row[0] < rows) & ((row | 1) < run.m)
        a_cell = Mux(run.m32, (fea << 1) | fh, fea)
        a_addr = ((run.a.base << 4) + (a_cell << 4) + Mux(run.m32, row >> 1, row))
        cols_end = (fi + 1 >= cols) | (col + 1 >= run.n)
        b_cell = n8_column_cells(run.b_k_repeat, col) + (feb >> 1)
        b_addr = (run.b.base << 4) + (b_cell << 4) + (col[:3] << 1) + feb[0]

        a_col_end = ~f_is_b & a_last & ~more_panels         # A word column of the phase
        a_phase_end = a_col_end & (fea + 1 == wpr)
        dest_fields += [("col_end", 1), ("phase_end", 1)]
        m.submodules.dests = dests = fifo.SyncFIFO(
            width=sum(w for _, w in dest_fields), depth=_FILL_DEPTH)
        dest = Cat(f_is_b, fi[:dest_bank_bits], row[0], a_upper, fh,
                   Mux(f_is_b, b_ebase + feb,
                       Mux(col_outer, phase_p + fpp + fa_eofs, fa_entry))[:max(a_aw, b_aw)],
                   Mux(f_is_b, cols_end, a_last), a_col_end, a_phase_end)
        m.d.comb += [
            self.rd.valid.eq(f_active & dests.w_rdy),
            self.rd.payload.space.eq(Mux(f_is_b, run.b.space.as_value(),
                                         run.a.space.as_value())),
            self.rd.payload.addr.eq(Mux(f_is_b, b_addr, a_addr)),
            self.rd.payload.tag.eq(0),
            dests.w_data.eq(dest),
            dests.w_en.eq(self.rd.valid & self.rd.ready),
        ]
        issued = self.rd.valid & self.rd.ready
        # After a word column of one operand, the next read goes to the operand whose words
        # cover fewer k so far: a block that starts both an A and a B panel (block (0, 0))
        # gets them in the order its beats consume them.
        word_end = Mux(f_is_b, cols_end, a_last & ~more_panels)
        next_phase = ~f_is_b & (fea + 1 == wpr) & phase_more
        next_fea = Mux(next_phase, 0, fea + ~f_is_b)
        b_panel_end = f_is_b & (feb + 1 == wpc)
        next_feb = Mux(b_panel_end, 0, feb + f_is_b)
        next_a_left = a_left & ~(~f_is_b & (fea + 1 == wpr) & ~phase_more)
        b_pending = col_outer & (b_col0 + cols < run.n) & (b_qblk + panels < ph_end)
        b_phase = col_outer & (b_col0 < run.n) & (b_qblk < ph_end + slots)
        next_b_left = Mux(b_panel_end, b_pending, b_left | (next_phase & b_phase))
        pick_a = next_a_left & (~next_b_left | (~next_phase & ((next_fea << a_shift)
                                                                <= (next_feb << b_shift))))

        fill_idle = Signal()
        with m.FSM(name="fill"):
            with m.State("IDLE"):
                m.d.comb += fill_idle.eq(1)
                with m.If(self.start):
                    m.d.comb += f_restart.eq(1)
                    m.d.sync += [fa_entry.eq(0), b_done_col.eq(0)]
                    m.next = "BLOCK"
            with m.State("BLOCK"):
                with m.If(f_walk_done):
                    m.next = "IDLE"
                with m.Elif((f_row0 == 0) & ((f_col0 == 0) | (f_col0 >= b_done_col))
                            | ~col_outer & (f_col0 == 0)):
                    m.d.sync += [fea.eq(0), feb.eq(0), fi.eq(0), fh.eq(0), a_row0.eq(f_row0),
                                 phase_row0.eq(0), phase_p.eq(0), fpp.eq(0), fa_eofs.eq(0),
                                 b_col0.eq(f_col0), b_ebase.eq(f_bbase), b_qblk.eq(0),
                                 ph_end.eq(Mux(f_col0 == 0, slots, 0)),
                                 a_left.eq(f_col0 == 0),
                                 b_left.eq((f_row0 == 0) & (f_col0 >= b_done_col)),
                                 f_is_b.eq(f_col0 != 0)]
                    m.next = "READ"
                with m.Else():
                    m.d.comb += f_step.eq(1)
            with m.State("READ"):
                m.d.comb += f_active.eq(1)
                with m.If(issued):
                    with m.If(f_is_b):
                        m.d.sync += fi.eq(Mux(cols_end, 0, fi + 1))
                    with m.Elif(~rows_end):
                        m.d.sync += fi.eq(a_next_i)
                    with m.Elif(second_half):
                        m.d.sync += [fi.eq(0), fh.eq(1)]
                    with m.Elif(more_panels):
                        m.d.sync += [fi.eq(0), fh.eq(0), a_row0.eq(a_row0 + rows),
                                     fpp.eq(fpp + 1)]
                    with m.If(~f_is_b & a_last):
                        m.d.sync += fa_entry.eq(fa_entry + 1)
                    with m.If(word_end):
                        m.d.sync += [fi.eq(0), fh.eq(0), fea.eq(next_fea), feb.eq(next_feb),
                                     a_row0.eq(Mux(col_outer, phase_row0, f_row0)), fpp.eq(0),
                                     a_left.eq(next_a_left), b_left.eq(next_b_left),
                                     f_is_b.eq(~pick_a)]
                        with m.If(a_col_end):
                            m.d.sync += fa_eofs.eq(fa_eofs + panels)
                        with m.If(next_phase):
                            m.d.sync += [phase_row0.eq(phase_row0 + rows * slots),
                                         a_row0.eq(phase_row0 + rows * slots),
                                         phase_p.eq(phase_p + slots), fa_eofs.eq(0),
                                         ph_end.eq(ph_end + slots)]
                        with m.If(b_panel_end):
                            m.d.sync += [b_done_col.eq(b_col0 + cols), b_col0.eq(b_col0 + cols),
                                         b_ebase.eq(b_ebase + wpc),
                                         b_qblk.eq(b_qblk + panels)]
                        with m.If(~next_a_left & ~next_b_left):
                            m.d.comb += f_step.eq(1)
                            m.next = "BLOCK"

        # Responses: write the lane(s) of the entry; count completed entries.
        got = Signal.like(dests.r_data)
        m.d.comb += [got.eq(dests.r_data), dests.r_en.eq(self.rsp.valid)]
        fields, offset = {}, 0
        for name, width in dest_fields:
            fields[name] = got[offset:offset + width]
            offset += width
        word = self.rsp.data
        lo, hi = word[:32], word[32:]
        a_en, a_data = [], []
        for x in range(rows):
            is_lo = ~fields["odd"] & (fields["bank"] == x)
            is_hi = ((fields["odd"] & (fields["bank"] == x))
                     | (~fields["odd"] & fields["upper"] & (fields["bank"] + 1 == x)))
            half_en = Mux(fields["half"], 0b10, 0b01)
            a_en.append(Mux(run.m32, Mux(is_lo | is_hi, half_en, 0),
                            Mux(fields["bank"] == x, 0b11, 0)))
            half = Mux(is_lo, lo, hi)
            a_data.append(Mux(run.m32, Cat(half, half), word))
        write = self.rsp.valid
        m.d.comb += [
            a_wr.addr.eq(fields["entry"]), a_wr.data.eq(Cat(*a_data)),
            a_wr.en.eq(Mux(write & ~fields["is_b"], Cat(*a_en), 0)),
            b_wr.addr.eq(fields["entry"]), b_wr.data.eq(Cat(*([word] * cols))),
            b_wr.en.eq(Mux(write & fields["is_b"], 1 << fields["bank"], 0)),
        ]
        with m.If(write & fields["last"]):
            with m.If(fields["is_b"]):
                m.d.sync += b_complete.eq(fields["entry"] + 1)
            with m.Else():
                m.d.sync += a_complete.eq(fields["entry"] + 1)
        # Column-outer A: panels below a_lo are whole, those of the phase from a_lo have
        # their first a_cols words.
        a_lo, a_cols = Signal(16), Signal(16)
        with m.If(write & fields["col_end"]):
            m.d.sync += a_cols.eq(a_cols + 1)
        with m.If(write & fields["phase_end"]):
            m.d.sync += [a_cols.eq(0), a_lo.eq(a_lo + slots)]
        with m.If(self.start):
            m.d.sync += [a_complete.eq(0), b_complete.eq(0), a_lo.eq(0), a_cols.eq(0)]

        # ------------------------------------------------------------------
        # Beats: a null group, the real groups, a null group
        # ------------------------------------------------------------------
        k = Signal(16)
        s = Signal(range(max(2, slots)))
        restart, step_group = Signal(), Signal()
        blocks, walk_done = block_walker(m, "pbeat", rows, cols, slots, run.m, run.n,
                                         restart, step_group,
                                         strides=(Mux(col_outer, 1, wpr), wpc))
        a_kofs = Signal(16)             # column-outer: (k's word along K) x P
        row0, col0, used = Signal(16), Signal(16), Signal()
        a_base, b_base = Signal(16), Signal(16)
        for index, (r, c, u, rb, cb) in enumerate(blocks):
            with m.If(s == index):
                m.d.comb += [row0.eq(r), col0.eq(c), used.eq(u), a_base.eq(rb),
                             b_base.eq(cb)]
        a_entry = (a_base + Mux(col_outer, a_kofs, k >> a_shift))[:a_aw + 1]
        b_entry = (b_base + (k >> b_shift))[:b_aw + 1]
        a_word = k >> a_shift
        a_present = Mux(col_outer,
                        (a_base < a_lo) | ((a_base < a_lo + slots) & (a_word < a_cols)),
                        a_entry < a_complete)
        present = a_present & (b_entry < b_complete)
        last_term = k + 1 == run.k

        k_low = k[:4]
        swapped = Cat(k_low[:2], k_low[3], k_low[2])
        a_index = Mux(~run.m32 & (run.a_log2w == 2), swapped,
                      k & ((Const(1, 1) << a_shift) - 1)[:6])
        a_off = (a_index << run.a_log2w)[:6]
        b_off = ((k & ((Const(1, 1) << b_shift) - 1)[:6]) << run.b_log2w)[:6]

        want, null, first = Signal(), Signal(), Signal()
        taken = self.feed.valid & self.feed.ready
        advance = want & (~self.feed.valid | taken)
        next_slot = Signal()
        with m.If(next_slot):
            m.d.sync += s.eq(Mux(s == slots - 1, 0, s + 1))

        with m.FSM(name="beats"):
            with m.State("IDLE"):
                m.d.comb += self.done.eq(~self.feed.valid & fill_idle)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [s.eq(0), k.eq(0), a_kofs.eq(0)]
                    m.next = "NULL_FIRST"
            with m.State("NULL_FIRST"):
                m.d.comb += [want.eq(1), null.eq(1), first.eq(1), next_slot.eq(advance)]
                with m.If(advance & (s == slots - 1)):
                    m.next = "REAL"
            with m.State("REAL"):
                with m.If(walk_done):
                    m.next = "NULL_LAST"
                with m.Elif(~used & (k != 0)):
                    m.d.comb += next_slot.eq(1)        # no beat: the slot has no block
                with m.Else():
                    m.d.comb += [want.eq(~used | present), null.eq(~used),
                                 first.eq(k == 0), next_slot.eq(advance)]
                with m.If(next_slot & (s == slots - 1)):
                    word_done = ((k + 1) & ((Const(1, 1) << a_shift) - 1)[:6]) == 0
                    m.d.sync += [k.eq(Mux(last_term, 0, k + 1)),
                                 a_kofs.eq(Mux(last_term, 0,
                                               Mux(word_done, a_kofs + panels, a_kofs)))]
                    m.d.comb += step_group.eq(last_term)
            with m.State("NULL_LAST"):
                m.d.comb += [want.eq(1), null.eq(1), first.eq(1), next_slot.eq(advance)]
                with m.If(advance & (s == slots - 1)):
                    m.next = "IDLE"

        # Output stage: its register and the buffers' read ports advance together.
        out_slot = Signal.like(beat.slot)
        out_first, out_null = Signal(), Signal()
        out_a_off, out_b_off = Signal(6), Signal(6)
        row_ok = Signal(rows)
        col_ok = Signal(cols)
        m.d.comb += [a_rd.addr.eq(a_entry), a_rd.en.eq(advance),
                     b_rd.addr.eq(b_entry), b_rd.en.eq(advance)]
        with m.If(advance):
            m.d.sync += [
                self.feed.valid.eq(1), out_slot.eq(s), out_first.eq(first),
                out_null.eq(null), out_a_off.eq(a_off), out_b_off.eq(b_off),
                row_ok.eq(Mux(null, 0, Cat(*(row0 + i < run.m for i in range(rows))))),
                col_ok.eq(Mux(null, 0, Cat(*(col0 + j < run.n for j in range(cols))))),
            ]
        with m.Elif(taken):
            m.d.sync += self.feed.valid.eq(0)

        for i in range(rows):
            lane = a_rd.data[64 * i:64 * (i + 1)]
            m.d.comb += beat.a[i].eq(Mux(row_ok[i], extract(lane, out_a_off, run.a_log2w, 32),
                                         0))
        for j in range(cols):
            lane = b_rd.data[64 * j:64 * (j + 1)]
            m.d.comb += beat.b[j].eq(Mux(col_ok[j], extract(lane, out_b_off, run.b_log2w, 32),
                                         0))
        m.d.comb += [beat.a_type.eq(run.a_type), beat.b_type.eq(run.b_type),
                     beat.slot.eq(out_slot), beat.first.eq(out_first),
                     beat.load.eq(run.acc | run.int_bias), beat.null.eq(out_null)]
        if self.has_scale:
            m.d.comb += [beat.a_scale_en.eq(0), beat.b_scale_en.eq(0)]
        return m
