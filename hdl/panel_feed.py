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
buffers at one beat per cycle.

Every decision is made from registers (decision C20 in ``docs/decisions/hdl-cube.md``):
per-run facts are registered from the run context, the fill's choice after a word column
is registered while the column is read, reads leave from a request register, and beats
pass a position register (with "operands present" registered), the buffers' synchronous
read ports (block RAM) and a register of the words read.  ``docs/hdl-cube.md`` section 3
gives the figures.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import fifo
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from ..model.layout import LOCAL_MAX_CAPACITY_BYTES
from .cell_address import extract, n8_column_cells
from .config import CubeConfig
from .cube_run import block_walker, column_outer
from .logic import FABRIC_REGISTER, KEEP, NO_COLLISION, BlockReadPort, registered
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


def _word_mask(log2w: Value, log2_bits: int) -> Value:
    """``2**((log2_bits - log2w) mod 8) - 1``: elements of 2**log2w bits in 2**log2_bits,
    less one (a table of the 3-bit ``log2w``, one LUT level)."""
    return Array(Const((1 << ((log2_bits - w) % 8)) - 1, 7) for w in range(8))[log2w]


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
        ``feed.ready`` must not wait for ``feed.valid``: it is also the output stages'
        enable (decision 30).
    go : In(rows + cols + 1)
        Copies of ``feed.ready``, each loaded like it in a register of its own: bit ``i``
        enables A lane ``i``'s output stages, bit ``rows + j`` B lane ``j``'s, the last bit
        the rest, so that no one net reaches all ~2,000 of them (issue #9).
    rd : Out(stream.Signature(ReadReqLayout)), rsp : In(ReadRspLayout)
        The buffer fill's payload reads (through the engine's read arbiter).
    """

    def __init__(self, config: CubeConfig, feed_shape, slots: int, has_scale: bool):
        super().__init__(config, feed_shape, slots, has_scale,
                         {"go": In(config.rows + config.cols + 1)})

    def elaborate(self, platform):
        m = Module()
        cfg, run, beat = self.config, self.run, self.feed.payload
        rows, cols, slots = cfg.rows, cfg.cols, self.slots

        # A beat reads an entry at least a cycle after its last write (``p_ok`` is registered
        # from the completion counts) and no entry is written twice in a run, so a read whose
        # words are used never meets a write to its entry in one cycle: yosys need not
        # emulate the collision (``no_rw_check``), and the block RAMs' outputs reach the word
        # registers directly (decision 48).
        m.submodules.a_mem = a_mem = Memory(shape=64 * rows, depth=a_buffer_depth(cfg),
                                            init=[], attrs=NO_COLLISION)
        m.submodules.b_mem = b_mem = Memory(shape=64 * cols, depth=b_buffer_depth(cfg),
                                            init=[], attrs=NO_COLLISION)
        a_wr, a_rd = a_mem.write_port(granularity=32), BlockReadPort(m, a_mem, "a_mem")
        b_wr, b_rd = b_mem.write_port(granularity=64), BlockReadPort(m, b_mem, "b_mem")
        a_aw, b_aw = len(a_rd.addr), len(b_rd.addr)

        # Per-run facts (decision C20): registers loaded every cycle from the run context,
        # each one level of logic from it or from other facts.  The context holds still
        # from ``start`` to ``done``, so the facts of facts are valid two cycles after
        # ``start``; the fill and the beats wait a cycle (``SETTLE``) before they use them.
        def fact(name, value, width=16):
            return registered(m, value, width, name)

        # Words per A row / B column: K elements of 2**log2w bits, 64 bits per word; the
        # shifts are facts, so that no subtraction sits in front of a shifter.
        a_sh = fact("a_sh", (6 - run.a_log2w)[:3], 3)
        b_sh = fact("b_sh", (6 - run.b_log2w)[:3], 3)
        a_sh_cells = fact("a_sh_cells", (5 - run.a_log2w)[:3], 3)
        # Elements per word less one (a mask of k) and elements per word, for each
        # log2w: tables, one LUT level.
        a_kmask = fact("a_kmask", _word_mask(run.a_log2w, 6), 7)
        b_kmask = fact("b_kmask", _word_mask(run.b_log2w, 6), 7)
        a_cells_mask = fact("a_cells_mask", _word_mask(run.a_log2w, 5), 7)
        a_mask, b_mask = a_kmask[:6], b_kmask[:6]
        a_epw = fact("a_epw", a_kmask + 1, 7)                # elements per word
        b_epw = fact("b_epw", b_kmask + 1, 7)
        wpr = fact("wpr", ((run.k + a_kmask) >> a_sh)[:16])
        wpc = fact("wpc", ((run.k + b_kmask) >> b_sh)[:16])
        wpr_m1 = fact("wpr_m1", (run.k - 1) >> a_sh)
        wpc_m1 = fact("wpc_m1", (run.k - 1) >> b_sh)
        # CUBE_M32: an entry holds CELLs 2e and 2e + 1; word e has a second CELL when
        # 2e + 1 < (CELLs along K), i.e. e < half of them.
        a_half = fact("a_half", ((run.k + a_cells_mask) >> a_sh_cells)[:16] >> 1)
        # Block columns outer (decision C14): A entry p + e * P (P block rows): a phase's
        # panels' word e are neighbours, and the beats' e * P is one running sum (C12).
        col_outer = fact("col_outer", column_outer(cols, run.m, run.n), 1)
        a_stride = fact("a_stride", Mux(col_outer, 1, wpr))
        panels = Signal(6)                  # P: block rows
        with m.Switch(run.m):
            for rows_m in range(1, 33):
                with m.Case(rows_m):
                    m.d.sync += panels.eq(_ceil_div(rows_m, rows))
            with m.Default():
                m.d.sync += panels.eq(0)
        m_dim, n_dim = fact("m_dim", run.m), fact("n_dim", run.n)
        m_m1, n_m1 = fact("m_m1", run.m - 1), fact("n_m1", run.n - 1)
        k_m1, k_is1 = fact("k_m1", run.k - 1), fact("k_is1", run.k == 1, 1)
        # x + d < y as x < y - d, with y - d clamped at 0.
        m_less_rows = fact("m_less_rows", Mux(run.m > rows, run.m - rows, 0))
        m_less_phase = fact("m_less_phase", Mux(run.m > rows * slots, run.m - rows * slots, 0))
        n_less_cols = fact("n_less_cols", Mux(run.n > cols, run.n - cols, 0))
        a_swap = fact("a_swap", ~run.m32 & (run.a_log2w == 2), 1)
        # Whether a word column of the fill may be a single read (decision C28): an A
        # column of a panel of one row (CUBE_M32: of one row pair), always when R <= 2 (the
        # second CELL half is not counted: at most the one-read case is overstated), or a
        # B column of a block column of one column ((N - 1) mod C = 0; always when C is not
        # a power of two).  Only such a column needs the registered decision in its first
        # cycle; the others run their first read while it settles.
        a_one = Signal(name="a_one_read")
        if rows <= 2:
            m.d.sync += a_one.eq(1)
        else:
            with m.Switch(run.m):
                for rows_m in range(1, 33):
                    last_rows = rows_m - (_ceil_div(rows_m, rows) - 1) * rows
                    with m.Case(rows_m):
                        m.d.sync += a_one.eq(int(last_rows <= 2))
                with m.Default():
                    m.d.sync += a_one.eq(1)
        if cols & (cols - 1):
            b_one = Const(1, 1)
        else:
            b_one = ((run.n - 1)[:max(1, (cols - 1).bit_length())] == 0) if cols > 1 else Const(1, 1)
        one_read = fact("one_read", a_one | b_one, 1)

        # Entries of each buffer written so far, in fill (= address) order.
        a_complete = Signal(a_aw + 1)
        b_complete = Signal(b_aw + 1)

        # ------------------------------------------------------------------
        # Fill: blocks row-major; A panel at each block row's start, B panels in row 0
        # ------------------------------------------------------------------
        f_restart, f_step = Signal(), Signal()
        (f_block,), f_walk_done = block_walker(m, "pfill", rows, cols, 1, m_dim, n_dim,
                                               f_restart, f_step, strides=(wpr, wpc),
                                               outer=col_outer,
                                               limits=(m_less_rows, n_less_cols))
        f_row0, f_col0, _, _, f_bbase = f_block
        fea, feb = Signal(16), Signal(16)           # next word along K of A / of B
        fka, fkb = Signal(18), Signal(18)           # the same in k: fea << a_shift, ...
        a_row0 = Signal(16)                         # first row of the A panel being filled
        row = Signal(16)                            # a_row0 + fi: the row being read
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
        b_qnext, ph_end2 = Signal(16), Signal(16)   # b_qblk + P, ph_end + L
        b_done_col = Signal(16)                     # columns below are in the B buffer
        col = Signal(16)                            # b_col0 + fi: the column being read
        # CELLs before the CUBE_N8 column of b_col0 / of col: (c // 8) x K_repeat, stepped
        # with the column instead of multiplied per read.
        b_cells0, b_cells = Signal(16), Signal(16)
        a_left, b_left = Signal(), Signal()         # the block still fills A / B
        fi = Signal(range(max(rows, cols) + 2))
        fh = Signal()
        # Whether the word column being read is B's, as four equal flip-flops, each with a
        # share of the fan-out (291 paths over 8 ns began at the single one, session 31):
        # the fill's decision, the request's address and space, the response's destination,
        # and the fill's moves.
        f_is_b, f_is_b_req, f_is_b_dest, f_is_b_mv = (
            Signal(name=f"f_is_b{suffix}", attrs=KEEP) for suffix in ("", "_req", "_dest", "_mv"))

        def set_is_b(v):
            return [copy.eq(v) for copy in (f_is_b, f_is_b_req, f_is_b_dest, f_is_b_mv)]

        f_active = Signal()     # in READ: a flip-flop beside the state, not a decode of it

        dest_bank_bits = max(1, (max(rows, cols) - 1).bit_length())
        # Destination of each outstanding read: buffer, lane, CUBE_M32 row parity / upper
        # row / CELL half, entry, whether it completes its entry, and whether it ends a word
        # column / a phase of column-outer A.
        dest_fields = [("is_b", 1), ("bank", dest_bank_bits), ("odd", 1), ("upper", 1),
                       ("half", 1), ("entry", max(a_aw, b_aw)), ("last", 1),
                       ("col_end", 1), ("phase_end", 1)]

        # Compares of these registers with per-run facts, registered with them (C20).
        fea_halved = Signal()       # CUBE_M32 and fea < a_half
        # Where a read stands in its word column, registered with the position it reads
        # (decision 30), so that the fill's moves decide from these flip-flops, one LUT
        # from ``word_end``: the A read is its panel's last row (``rows_end``) and, without
        # a second CELL half to read, its entry's last (``a_last``); a column-outer phase
        # has a panel after this one (``more_panels``); the B read is its column's last
        # (``cols_end``).
        rows_end, a_last, more_panels, cols_end = Signal(), Signal(), Signal(), Signal()

        def set_a_pos(i, v, fh_v, halved):
            """fi = i, row = v (= a_row0 + i), fh = fh_v; ``halved``: fea_halved then."""
            # a_row0 + the next fi >= M: fi + 2 - row[0] for CUBE_M32, else fi + 1.
            end = (Mux(v[0] | ~run.m32, i + 1 >= rows, i + 2 >= rows)
                   | Mux(run.m32, (v | 1) >= m_m1, v >= m_m1))
            return [fi.eq(i), row.eq(v), fh.eq(fh_v), rows_end.eq(end),
                    a_last.eq(end & (fh_v | ~halved))]

        def set_b_pos(i, v):
            """fi = i, col = v (= b_col0 + i)."""
            return [fi.eq(i), col.eq(v), cols_end.eq((i + 1 >= cols) | (v >= n_m1))]

        def set_panel(v, p):
            """a_row0 = v, fpp = p."""
            return [a_row0.eq(v), fpp.eq(p),
                    more_panels.eq(col_outer & (v < m_less_rows) & (p != slots - 1))]

        fea_last, feb_last = Signal(), Signal()      # fea = wpr - 1, feb = wpc - 1
        fka_ahead, fkb_ahead = Signal(18), Signal(18)  # fka + a_epw, fkb + b_epw
        phase_more = Signal()       # column-outer and phase_row0 + R x L < M
        b_more, b_in = Signal(), Signal()           # b_col0 + C < N, b_col0 < N

        def set_fea(v):
            return [fea.eq(v), fea_halved.eq(run.m32 & (v < a_half)), fea_last.eq(v == wpr_m1)]

        def set_feb(v):
            return [feb.eq(v), feb_last.eq(v == wpc_m1)]

        def set_fka(v):
            return [fka.eq(v), fka_ahead.eq(v + a_epw)]

        def set_fkb(v):
            return [fkb.eq(v), fkb_ahead.eq(v + b_epw)]

        def set_phase_row0(v):
            return [phase_row0.eq(v), phase_more.eq(col_outer & (v < m_less_phase))]

        def set_b_col0(v):
            return [b_col0.eq(v), b_more.eq(v < n_less_cols), b_in.eq(v < n_dim)]

        # CUBE_M32: one store word holds rows 2p and 2p + 1 of one CELL; an odd row starts a
        # panel only when R is odd, and then only its upper half is this panel's.
        a_next_i = Mux(run.m32, fi + 2 - row[0], fi + 1)
        second_half = ~fh & fea_halved
        a_upper = (fi + 1 - row[0] < rows) & ((row | 1) < m_dim)
        a_cell = Mux(run.m32, Cat(fh, fea), fea)
        a_addr = (run.a.base << 4) + (a_cell << 4) + Mux(run.m32, row >> 1, row)
        b_cells_next = b_cells + Mux(col[:3] == 7, run.b_k_repeat, 0)
        b_addr = Cat(feb[0], col[:3], run.b.base + b_cells + (feb >> 1))

        # The fill's next-state decision after a word column (decision C20): a function of
        # registers that change only at a word column's end, so it is registered every
        # cycle and valid from the second cycle of each word column.  Whether a read
        # issues does not depend on whether it ends its word column (decision C24): a word
        # column that may be a single read (``one_read``) waits a cycle for the decision
        # (``fresh``); any other runs its first read meanwhile, since only its last read
        # uses the decision (decision C28).
        next_phase = ~f_is_b & fea_last & phase_more
        next_fea = Mux(next_phase, 0, fea + ~f_is_b)
        next_fka = Mux(next_phase, 0, Mux(f_is_b, fka, fka_ahead))
        b_panel_end = f_is_b & feb_last
        next_feb = Mux(b_panel_end, 0, feb + f_is_b)
        next_fkb = Mux(b_panel_end, 0, Mux(f_is_b, fkb_ahead, fkb))
        next_a_left = a_left & ~(~f_is_b & fea_last & ~phase_more)
        # Column-outer B panel after B panel: the next one when a group the A phases cover
        # needs it, and once A is whole, every next one in turn, without walking back
        # through the blocks (the walk takes two cycles a block; decision C28).
        b_pending = col_outer & b_more & ((b_qnext < ph_end) | ~a_left)
        b_phase = col_outer & b_in & (b_qblk < ph_end2)
        next_b_left = Mux(b_panel_end, b_pending, b_left | (next_phase & b_phase))
        # After a word column of one operand, the next read goes to the operand whose words
        # cover fewer k so far: a block that starts both an A and a B panel (block (0, 0))
        # gets them in the order its beats consume them.  The k compare of the next words,
        # case by case (next_phase masks it, and only A's or only B's count moves):
        # A read: fka + a_epw <= fkb; B read: fka <= fkb + b_epw, or fka <= 0 after B's
        # last word.
        a_not_ahead = Mux(f_is_b, Mux(feb_last, fka == 0, fka <= fkb_ahead), fka_ahead <= fkb)
        pick_a = next_a_left & (~next_b_left | (~next_phase & a_not_ahead))
        decision = {"ea_last": fea_last, "next_phase": next_phase, "next_fea": next_fea,
                    "next_fka": next_fka, "b_panel_end": b_panel_end, "next_feb": next_feb,
                    "next_fkb": next_fkb, "next_a_left": next_a_left,
                    "next_b_left": next_b_left, "pick_a": pick_a}
        d = {}
        for name, value in decision.items():
            d[name] = Signal(len(Value.cast(value)), name=f"d_{name}")
            m.d.sync += d[name].eq(value)
        fresh = Signal()

        def a_col_end(is_b):
            """The read ends an A word column of the phase."""
            return ~is_b & a_last & ~more_panels

        a_col_end_mv = a_col_end(f_is_b_mv)
        word_end = Mux(f_is_b_mv, cols_end, a_col_end_mv)
        dest_col_end = a_col_end(f_is_b_dest)
        dest = Cat(f_is_b_dest, fi[:dest_bank_bits], row[0], a_upper, fh,
                   Mux(f_is_b_dest, b_ebase + feb,
                       Mux(col_outer, phase_p + fpp + fa_eofs, fa_entry))[:max(a_aw, b_aw)],
                   Mux(f_is_b_dest, cols_end, a_last), dest_col_end,
                   dest_col_end & d["ea_last"])

        # Reads leave from a request register with a spare one behind it: the fill issues
        # while the spare is free, so that its moves depend on its own registers only, not
        # on the arbiter's ready (decision C24).
        # Buffered: each response's destination comes from a register, not from the FIFO's
        # LUT RAM (its read and the bank decode were 10.9 ns into the panel memories' write
        # ports in session 25's route, decision 47 in docs/decisions/hdl-cube.md); a
        # response comes at least four cycles after its request, when its destination has
        # reached the register.
        m.submodules.dests = dests = fifo.SyncFIFOBuffered(
            width=sum(w for _, w in dest_fields), depth=_FILL_DEPTH)
        req_valid, req_dest = Signal(), Signal(len(dest))
        spare_valid, spare_dest = Signal(), Signal(len(dest))
        spare_space = Signal(len(Value.cast(self.rd.payload.space)))
        spare_addr = Signal(len(self.rd.payload.addr))
        taken_rd = self.rd.valid & self.rd.ready
        m.d.comb += [
            self.rd.valid.eq(req_valid & dests.w_rdy),
            dests.w_data.eq(req_dest),
            dests.w_en.eq(taken_rd),
        ]
        issued = f_active & ~spare_valid & fresh
        new_space = Mux(f_is_b_req, run.b.space.as_value(), run.a.space.as_value())
        new_addr = Mux(f_is_b_req, b_addr, a_addr)
        m.d.sync += self.rd.payload.tag.eq(0)
        with m.If(~req_valid | taken_rd):
            # The spare issues nothing while it is full.
            m.d.sync += [
                req_valid.eq(spare_valid | issued), spare_valid.eq(0),
                req_dest.eq(Mux(spare_valid, spare_dest, dest)),
                self.rd.payload.space.eq(Mux(spare_valid, spare_space, new_space)),
                self.rd.payload.addr.eq(Mux(spare_valid, spare_addr, new_addr)),
            ]
        with m.Elif(issued):
            m.d.sync += [spare_valid.eq(1), spare_dest.eq(dest), spare_space.eq(new_space),
                         spare_addr.eq(new_addr)]

        fill_idle = Signal()
        # The choice at a block is registered (``f_seen``: from the block now in the
        # walker): a block takes two cycles, one to compare, one to act.
        f_seen, f_end, f_starts = Signal(), Signal(), Signal()
        m.d.sync += f_seen.eq(0)
        with m.FSM(name="fill"):
            with m.State("IDLE"):
                m.d.comb += fill_idle.eq(~req_valid & ~spare_valid)
                with m.If(self.start):
                    m.d.comb += f_restart.eq(1)
                    m.d.sync += [fa_entry.eq(0), b_done_col.eq(0)]
                    m.next = "SETTLE"
            with m.State("SETTLE"):
                m.next = "BLOCK"
            with m.State("BLOCK"):
                m.d.sync += [fresh.eq(0), f_seen.eq(1), f_end.eq(f_walk_done),
                             f_starts.eq((f_row0 == 0) & ((f_col0 == 0) | (f_col0 >= b_done_col))
                                         | ~col_outer & (f_col0 == 0))]
                with m.If(f_seen):
                    with m.If(f_end):
                        m.next = "IDLE"
                    with m.Elif(f_starts):
                        cells = n8_column_cells(run.b_k_repeat, f_col0)
                        m.d.sync += [*set_fea(0), *set_feb(0), *set_fka(0), *set_fkb(0),
                                     *set_a_pos(0, f_row0, 0, run.m32 & (a_half != 0)),
                                     *set_panel(f_row0, 0), *set_phase_row0(0), phase_p.eq(0),
                                     fa_eofs.eq(0), *set_b_col0(f_col0), *set_b_pos(0, f_col0),
                                     b_cells0.eq(cells),
                                     b_cells.eq(cells), b_ebase.eq(f_bbase), b_qblk.eq(0),
                                     b_qnext.eq(panels),
                                     ph_end.eq(Mux(f_col0 == 0, slots, 0)),
                                     ph_end2.eq(Mux(f_col0 == 0, 2 * slots, slots)),
                                     a_left.eq(f_col0 == 0),
                                     b_left.eq((f_row0 == 0) & (f_col0 >= b_done_col)),
                                     *set_is_b(f_col0 != 0)]
                        # The first word column's first read, as after a word column.
                        m.d.sync += [fresh.eq(~one_read), f_active.eq(1)]
                        m.next = "READ"
                    with m.Else():
                        m.d.comb += f_step.eq(1)
                        m.d.sync += f_seen.eq(0)
            with m.State("READ"):
                m.d.sync += fresh.eq(~(issued & word_end & one_read))
                with m.If(issued & word_end & ~d["next_a_left"] & ~d["next_b_left"]):
                    m.d.comb += f_step.eq(1)
                    m.d.sync += f_active.eq(0)
                    m.next = "BLOCK"

        # A read's moves (``issued`` implies READ: no decode of the state in their enables).
        with m.If(issued):
            with m.If(f_is_b_mv):
                m.d.sync += [*set_b_pos(Mux(cols_end, 0, fi + 1),
                                        Mux(cols_end, b_col0, col + 1)),
                             b_cells.eq(Mux(cols_end, b_cells0, b_cells_next))]
            with m.Elif(~rows_end):
                m.d.sync += set_a_pos(a_next_i, Mux(run.m32, (row | 1) + 1, row + 1),
                                      fh, fea_halved)
            with m.Elif(second_half):
                m.d.sync += set_a_pos(0, a_row0, 1, fea_halved)
            with m.Elif(more_panels):
                m.d.sync += [*set_a_pos(0, a_row0 + rows, 0, fea_halved),
                             *set_panel(a_row0 + rows, fpp + 1)]
            with m.If(~f_is_b_mv & a_last):
                m.d.sync += fa_entry.eq(fa_entry + 1)
            with m.If(word_end):
                first_row = Mux(col_outer, phase_row0, f_row0)
                halved = run.m32 & (d["next_fea"] < a_half)
                m.d.sync += [*set_fea(d["next_fea"]),
                             *set_fka(d["next_fka"]), *set_feb(d["next_feb"]),
                             *set_fkb(d["next_fkb"]),
                             *set_a_pos(0, first_row, 0, halved),
                             *set_panel(first_row, 0),
                             *set_b_pos(0, Mux(d["b_panel_end"], b_col0 + cols, b_col0)),
                             a_left.eq(d["next_a_left"]), b_left.eq(d["next_b_left"]),
                             *set_is_b(~d["pick_a"])]
                with m.If(a_col_end_mv):
                    m.d.sync += fa_eofs.eq(fa_eofs + panels)
                with m.If(d["next_phase"]):
                    m.d.sync += [*set_phase_row0(phase_row0 + rows * slots),
                                 *set_a_pos(0, phase_row0 + rows * slots, 0, halved),
                                 *set_panel(phase_row0 + rows * slots, 0),
                                 phase_p.eq(phase_p + slots), fa_eofs.eq(0),
                                 ph_end.eq(ph_end + slots), ph_end2.eq(ph_end2 + slots)]
                with m.If(d["b_panel_end"]):
                    # The next B panel starts at the column after this one.
                    m.d.sync += [b_done_col.eq(b_col0 + cols), *set_b_col0(b_col0 + cols),
                                 b_cells0.eq(b_cells_next),
                                 b_cells.eq(b_cells_next), b_ebase.eq(b_ebase + wpc),
                                 b_qblk.eq(b_qnext), b_qnext.eq(b_qnext + panels)]

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
        # Column-outer A: panels below a_lo are whole, those of the phase from a_lo (to
        # a_hi = a_lo + L) have their first a_cols words.
        a_lo, a_hi, a_cols = Signal(16), Signal(16), Signal(16)
        with m.If(write & fields["col_end"]):
            m.d.sync += a_cols.eq(a_cols + 1)
        with m.If(write & fields["phase_end"]):
            m.d.sync += [a_cols.eq(0), a_lo.eq(a_hi), a_hi.eq(a_hi + slots)]
        with m.If(self.start):
            m.d.sync += [a_complete.eq(0), b_complete.eq(0), a_lo.eq(0), a_hi.eq(slots),
                         a_cols.eq(0)]

        # ------------------------------------------------------------------
        # Beats: a null group, the real groups, a null group
        # ------------------------------------------------------------------
        # A sequencer emits beat positions into a position register; a beat leaves the
        # position register for the output stage when its operands are in the buffers
        # (decision C20).  Term k is kept as the facts the beats need, each stepped with k:
        # whether k is 0 / the last term, and k's word and element index per operand.
        k_zero, last_term = Signal(), Signal()
        k_left = Signal(16)                     # K - 1 - k
        a_sub, b_sub = Signal(6), Signal(6)     # k mod (elements per word)
        a_word, b_word = Signal(16), Signal(16)  # k // (elements per word)
        s = Signal(range(max(2, slots)))
        restart, step_group = Signal(), Signal()
        blocks, walk_done = block_walker(m, "pbeat", rows, cols, slots, m_dim, n_dim,
                                         restart, step_group, strides=(a_stride, wpc),
                                         outer=col_outer, limits=(m_less_rows, n_less_cols))
        a_kofs = Signal(16)             # column-outer: (k's word along K) x P
        row0, col0, used = Signal(16), Signal(16), Signal()
        a_base, b_base = Signal(16), Signal(16)
        for index, (r, c, u, rb, cb) in enumerate(blocks):
            # One slot: no selection (s is always 0).
            with m.If((s == index) if slots > 1 else Const(1)):
                m.d.comb += [row0.eq(r), col0.eq(c), used.eq(u), a_base.eq(rb),
                             b_base.eq(cb)]
        a_entry = (a_base + Mux(col_outer, a_kofs, a_word))[:a_aw + 1]
        b_entry = (b_base + b_word)[:b_aw + 1]

        def present(a_entry, b_entry, a_base, a_word):
            """The beat's A and B words are in the buffers."""
            a_present = Mux(col_outer,
                            (a_base < a_lo) | ((a_base < a_hi) & (a_word < a_cols)),
                            a_entry < a_complete)
            return a_present & (b_entry < b_complete)

        a_index = Mux(a_swap, Cat(a_sub[:2], a_sub[3], a_sub[2]), a_sub)
        a_off = (a_index << run.a_log2w)[:6]
        b_off = (b_sub << run.b_log2w)[:6]

        # The position register: a beat, its buffer entries and whether they are filled.
        p_valid, p_ok, p_first, p_null = Signal(), Signal(), Signal(), Signal()
        m1_valid = Signal()                     # the read ports hold a beat's words
        m2_valid = Signal()                     # the words register holds them
        p_slot = Signal.like(beat.slot)
        p_a_entry, p_b_entry = Signal(a_aw + 1), Signal(b_aw + 1)
        p_a_base, p_a_word = Signal(16), Signal(16)
        p_a_off, p_b_off = Signal(6), Signal(6)
        p_row_ok, p_col_ok = Signal(rows), Signal(cols)

        offer, null, first = Signal(), Signal(), Signal()
        # The output stages move whenever the consumer is ready, even into an empty output
        # register: their enable (about 2,000 register and block-RAM inputs) is then the
        # engine's ready flip-flop, not a LUT of it and ``feed.valid`` (decision 30), or
        # rather one of its copies in ``go``.
        go_a = [self.go[i] for i in range(rows)]
        go_b = [self.go[rows + j] for j in range(cols)]
        go = self.go[rows + cols]
        advance = p_valid & p_ok & go
        emit = offer & (~p_valid | advance)
        next_slot = Signal()
        with m.If(next_slot):
            m.d.sync += s.eq(Mux(s == slots - 1, 0, s + 1))

        with m.FSM(name="beats"):
            with m.State("IDLE"):
                m.d.comb += self.done.eq(~self.feed.valid & ~m2_valid & ~m1_valid & ~p_valid
                                         & fill_idle)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [s.eq(0), k_zero.eq(1), last_term.eq(run.k == 1),
                                 k_left.eq(run.k - 1), a_sub.eq(0), b_sub.eq(0),
                                 a_word.eq(0), b_word.eq(0), a_kofs.eq(0)]
                    m.next = "SETTLE"
            with m.State("SETTLE"):
                m.next = "NULL_FIRST"
            with m.State("NULL_FIRST"):
                m.d.comb += [offer.eq(1), null.eq(1), first.eq(1), next_slot.eq(emit)]
                with m.If(emit & (s == slots - 1)):
                    m.next = "REAL"
            with m.State("REAL"):
                with m.If(walk_done):
                    m.next = "NULL_LAST"
                with m.Elif(~used & ~k_zero):
                    m.d.comb += next_slot.eq(1)        # no beat: the slot has no block
                with m.Else():
                    m.d.comb += [offer.eq(1), null.eq(~used), first.eq(k_zero),
                                 next_slot.eq(emit)]
                with m.If(next_slot & (s == slots - 1)):
                    a_done, b_done = a_sub == a_mask, b_sub == b_mask
                    m.d.sync += [
                        k_zero.eq(last_term),
                        last_term.eq(Mux(last_term, k_is1, k_left == 1)),
                        k_left.eq(Mux(last_term, k_m1, k_left - 1)),
                        a_sub.eq(Mux(last_term | a_done, 0, a_sub + 1)),
                        b_sub.eq(Mux(last_term | b_done, 0, b_sub + 1)),
                        a_word.eq(Mux(last_term, 0, a_word + a_done)),
                        b_word.eq(Mux(last_term, 0, b_word + b_done)),
                        a_kofs.eq(Mux(last_term, 0, Mux(a_done, a_kofs + panels, a_kofs))),
                    ]
                    m.d.comb += step_group.eq(last_term)
            with m.State("NULL_LAST"):
                m.d.comb += [offer.eq(1), null.eq(1), first.eq(1), next_slot.eq(emit)]
                with m.If(emit & (s == slots - 1)):
                    m.next = "IDLE"

        # ``p_ok`` is registered from the completion counts, which only grow during a run:
        # a beat may leave a cycle after its words arrive, never before.
        with m.If(emit):
            m.d.sync += [
                p_valid.eq(1), p_slot.eq(s), p_first.eq(first), p_null.eq(null),
                p_ok.eq(null | present(a_entry, b_entry, a_base, a_word)),
                p_a_entry.eq(a_entry), p_b_entry.eq(b_entry), p_a_base.eq(a_base),
                p_a_word.eq(a_word), p_a_off.eq(a_off), p_b_off.eq(b_off),
                p_row_ok.eq(Mux(null, 0, Cat(*(row0 + i < m_dim for i in range(rows))))),
                p_col_ok.eq(Mux(null, 0, Cat(*(col0 + j < n_dim for j in range(cols))))),
            ]
        with m.Else():
            m.d.sync += p_ok.eq(p_null | present(p_a_entry, p_b_entry, p_a_base, p_a_word))
            with m.If(advance):
                m.d.sync += p_valid.eq(0)

        # Output stages: the buffers' read ports, a register of the words read (the block
        # RAMs' outputs are slow), then a register of the elements cut from them, so that
        # no shifter sits in front of the array's entry register; all move on one enable.
        out_first, out_null = Signal(), Signal()
        m1_slot, m2_slot, out_slot = (Signal.like(beat.slot) for _ in range(3))
        m1_first, m1_null, m2_first, m2_null = (Signal() for _ in range(4))
        m1_a_off, m1_b_off, m2_a_off, m2_b_off = (Signal(6) for _ in range(4))
        m1_row_ok, row_ok = Signal(rows), Signal(rows)
        m1_col_ok, col_ok = Signal(cols), Signal(cols)
        # Data registers without a reset (a beat's words are loaded before they are used), so
        # that an ECP5 build takes them into the block RAMs as output registers (F44), unless
        # the configuration keeps them in the fabric (F48).
        words_attrs = {} if cfg.panel_words_outreg else FABRIC_REGISTER
        a_words = Signal(64 * rows, reset_less=True, attrs=words_attrs)
        b_words = Signal(64 * cols, reset_less=True, attrs=words_attrs)
        out_a = [Signal(len(Value.cast(beat.a[i])), name=f"out_a{i}") for i in range(rows)]
        out_b = [Signal(len(Value.cast(beat.b[j])), name=f"out_b{j}") for j in range(cols)]
        m.d.comb += [a_rd.addr.eq(p_a_entry), a_rd.en.eq(go),
                     b_rd.addr.eq(p_b_entry), b_rd.en.eq(go)]
        # An element is aligned to its width (4 bits or more): its offset is a whole
        # number of nibbles, which leaves the shifters 16 positions, not 64.
        a_nibble, b_nibble = Cat(Const(0, 2), m2_a_off[2:]), Cat(Const(0, 2), m2_b_off[2:])
        with m.If(go):
            m.d.sync += [
                m1_valid.eq(p_valid & p_ok), m1_slot.eq(p_slot), m1_first.eq(p_first),
                m1_null.eq(p_null), m1_a_off.eq(p_a_off), m1_b_off.eq(p_b_off),
                m1_row_ok.eq(p_row_ok), m1_col_ok.eq(p_col_ok),
                m2_valid.eq(m1_valid), m2_slot.eq(m1_slot), m2_first.eq(m1_first),
                m2_null.eq(m1_null), m2_a_off.eq(m1_a_off), m2_b_off.eq(m1_b_off),
                row_ok.eq(m1_row_ok), col_ok.eq(m1_col_ok),
                self.feed.valid.eq(m2_valid), out_slot.eq(m2_slot), out_first.eq(m2_first),
                out_null.eq(m2_null),
            ]
        # Each lane's word and element registers move on that lane's copy of the enable.
        for go_k, words, port, outs, ok, nibble, log2w in (
                (go_a, a_words, a_rd, out_a, row_ok, a_nibble, run.a_log2w),
                (go_b, b_words, b_rd, out_b, col_ok, b_nibble, run.b_log2w)):
            for k, out in enumerate(outs):
                lane = slice(64 * k, 64 * (k + 1))
                with m.If(go_k[k]):
                    m.d.sync += [words[lane].eq(port.data[lane]),
                                 out.eq(Mux(ok[k], extract(words[lane], nibble, log2w, 32), 0))]
        m.d.comb += [*(beat.a[i].eq(out_a[i]) for i in range(rows)),
                     *(beat.b[j].eq(out_b[j]) for j in range(cols))]
        m.d.comb += [beat.a_type.eq(run.a_type), beat.b_type.eq(run.b_type),
                     beat.slot.eq(out_slot), beat.first.eq(out_first),
                     beat.load.eq(run.acc | run.int_bias), beat.null.eq(out_null)]
        if self.has_scale:
            m.d.comb += [beat.a_scale_en.eq(0), beat.b_scale_en.eq(0)]
        return m
