"""The operand feed of the CUBE engine: systolic-array beats from the tile store.

:class:`OperandFeed` walks one PE's output blocks group by group (in the order of
``hdl/cube_run.py``'s :func:`~ptocube.hdl.cube_run.block_walker`) and, for each term k of
each slot, reads the A column (R elements), the B row (C elements) and, for MX forms,
their E8M0 scales from their CELL or row-major payloads, and offers the beat to the array
(``docs/hdl-systolic.md`` section 7).  Every lane (one per array row or column, operand
and slot) keeps the last payload words it read, so a lane reads a new word only when its
element moves out of the ones it holds.  This *lane path* serves the runs that
:class:`~ptocube.hdl.panel_feed.PanelFeed` does not (Shared or transposed primaries, MX
scales, the floating Bias term); the engine starts one of the two per run.

A run is: one group of null first beats (the chains' initial values for the first real
group are loaded by the exchange it triggers), the real groups, then one more null group
that pushes the last results out.  A floating BIAS form adds one term after the K loop:
a = FP32 1.0, b = Bias[j], so that the FMA computes RNE(acc + Bias[j]) exactly as the
model's separate bias step does.

The feed is a pipeline (decision C18, ``docs/hdl-cube.md`` "Reads: lanes and the
arbiter"): a sequencer emits beat *positions* (slot, k, block) from registered blocks;
three address stages turn a position into every lane's word address and bit offset; the
lane stage holds a position until all its lanes hold their words, and cuts each element's
32-bit half out of its word; the beat register shifts and masks the elements and offers
the beat.  Every stage moves together, when the beat may advance.  Reads are asked from
registered facts and sent from a request register.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from .cell_address import extract
from .config import CubeConfig
from .cube_run import RunLayout, column_outer
from .read_arbiter import ReadReqLayout, ReadRspLayout, lane_cache
from .tile_port import word_addr_width

__all__ = ["OperandFeed", "FeedComponent"]


class FeedComponent(wiring.Component):
    """The ports and parameters every operand feed has, so the engine swaps feeds without
    rewiring: ``run``, ``start``/``done``, the ``feed`` beats and the ``rd``/``rsp`` reads;
    a feed adds its own ports as ``members``."""

    def __init__(self, config: CubeConfig, feed_shape, slots: int, has_scale: bool,
                 members=None):
        self.config = config
        self.slots = slots
        self.has_scale = has_scale
        super().__init__({
            "run": In(RunLayout(config)),
            "start": In(1), "done": Out(1),
            "feed": Out(stream.Signature(feed_shape)),
            "rd": Out(stream.Signature(ReadReqLayout(config))),
            "rsp": In(ReadRspLayout),
            **(members or {}),
        })


_FP32_ONE = 0x3F800000


def _mask(log2):
    """``2**log2 - 1`` in 16 bits."""
    return ((Value.cast(1) << log2) - 1)[:16]


def _named(m: Module, value, name: str) -> Signal:
    """``value`` as a signal of its own: it feeds many expressions, and is built once."""
    sig = Signal(len(Value.cast(value)), name=name)
    m.d.comb += sig.eq(value)
    return sig


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
        Beats for the array, from a register.
    rd : Out(stream.Signature(ReadReqLayout)), rsp : In(ReadRspLayout)
        Payload reads through the engine's read arbiter, from a request register.
    """

    def elaborate(self, platform):
        m = Module()
        f = self._run_facts(m)
        pos = self._positions(m, f)
        self._beats(m, f, pos)
        return m

    def _run_facts(self, m: Module) -> SimpleNamespace:
        """Run facts: the run context is still from start to done, so everything the
        address stages derive from it alone is registered (valid one cycle after start,
        long before the first real position reaches them)."""
        run, f = self.run, SimpleNamespace()
        f.aw = aw = word_addr_width(self.config)
        f.sw = sw = aw + 6                  # a word address and the bit offset in it

        def fact(name, value, width):
            reg = Signal(width, name=f"f_{name}")
            m.d.sync += reg.eq(value)
            setattr(f, name, reg)

        # An integer-only build has no floating plan, hence no floating Bias term.
        float_bias = run.float_bias if self.config.float_types else Const(0)
        f.run_float_bias = float_bias

        fact("k", run.k, 16)
        fact("terms_m1", (run.k + float_bias - 1)[:16], 16)
        fact("float_bias", float_bias, 1)
        fact("m", run.m, 16)
        fact("n", run.n, 16)
        fact("col_outer", column_outer(self.config.cols, run.m, run.n), 1)
        fact("load", run.acc | run.int_bias, 1)
        fact("a_type", run.a_type, 5)
        fact("b_type", run.b_type, 5)

        a_w, a_p = run.a_log2w, run.a.log2p
        fact("a_w", a_w, 3)
        fact("a_space", Value.cast(run.a.space), 3)
        fact("a_base", run.a.base << 10, sw)
        fact("a_cell", ~run.a_shared, 1)
        fact("paired", run.m32 & ~run.a_shared, 1)
        fact("a_row_sh", Mux(run.a_shared, Mux(run.trans_a, a_w, a_p + a_w),
                             Mux(run.m32, 5, 6)), 5)
        fact("a_k_sh", Mux(run.trans_a, a_p + a_w, a_w), 5)
        fact("a_cc", (Mux(run.m32, 5, 6) - a_w)[:3], 3)
        fact("a_swap", ~run.m32 & (a_w == 2), 1)
        fact("a_next", _mask(Mux(run.a_shared, Mux(run.trans_a, 0, 6 - a_w),
                                 Mux(run.m32, 5, 6) - a_w)[:4]), 16)

        b_w, b_p = run.b_log2w, run.b.log2p
        fact("b_w", b_w, 3)
        fact("b_space", Value.cast(run.b.space), 3)
        fact("b_base", run.b.base << 10, sw)
        fact("b_cell", ~run.b_shared, 1)
        fact("b_krep", run.b_k_repeat, 13)
        fact("b_row_sh", Mux(run.trans_b, b_p + b_w, b_w), 5)
        fact("b_k_sh", Mux(run.trans_b, b_w, b_p + b_w), 5)
        fact("b_cr", (7 - b_w)[:3], 3)
        fact("b_next", _mask(Mux(run.b_shared & run.trans_b, 0, 6 - b_w)[:4]), 16)
        fact("bias_space", Value.cast(run.bias.space), 3)
        fact("bias_base", run.bias.base << 10, sw)
        if self.has_scale:
            fact("a_scaled", run.a_scaled, 1)
            fact("b_scaled", run.b_scaled, 1)
            fact("sa_space", Value.cast(run.a_scale.space), 3)
            fact("sb_space", Value.cast(run.b_scale.space), 3)
            fact("sa_base", run.a_scale.base << 10, sw)
            fact("sb_base", run.b_scale.base << 10, sw)
            fact("sa_row_sh", run.a_scale.log2p + 3, 5)
            fact("sb_k_sh", run.b_scale.log2p + 3, 5)
        return f

    def _positions(self, m: Module, f: SimpleNamespace) -> SimpleNamespace:
        """The walker, the sequencer and stage 1: beat positions, one per ``adv``.

        Returns the stage-1 registers (``valid``, ``slot``, ``real``, ``bias``, ``first``,
        ``k``, ``ka``/``kb``/``ks``: the next word's k per operand, ``block``) and two
        signals the beat stages drive: ``adv`` (stage 1 may take the next position) and
        ``busy`` (a position is still past stage 1, or a read is still to be sent).
        """
        cfg, run = self.config, self.run
        rows, cols, slots = cfg.rows, cfg.cols, self.slots
        adv, busy = Signal(name="p1_adv"), Signal(name="beats_busy")
        p1_valid = Signal(name="p1_valid")

        # ------------------------------------------------------------------
        # Blocks: a walker steps one block per cycle (the order of block_walker) into
        # the next group's registers; a group step copies them into the current ones.
        # ------------------------------------------------------------------
        Block = data.StructLayout({"r": 16, "c": 16, "used": 1,
                                   "rows_ok": rows, "cols_ok": cols})
        restart = Signal()
        walk_r, walk_c = Signal(16), Signal(16)
        # M - walk_r and N - walk_c, stepped with them, so that no subtraction sits in
        # front of the compares.
        m_left, n_left = Signal(signed(18)), Signal(signed(18))
        walked = Signal(Block)
        m.d.comb += [walked.r.eq(walk_r), walked.c.eq(walk_c),
                     walked.used.eq(Mux(f.col_outer, n_left > 0, m_left > 0)),
                     walked.rows_ok.eq(Cat(*(m_left > i for i in range(rows)))),
                     walked.cols_ok.eq(Cat(*(n_left > j for j in range(cols))))]
        # m_left <= R and n_left <= C, kept beside them (stepped from compares of the
        # registers with 2R and 2C): the walker's moves start from flip-flops, not from the
        # 18-bit compares (issue #9).
        m_wrap, n_wrap = Signal(init=1), Signal(init=1)
        wrap = Mux(f.col_outer, m_wrap, n_wrap)
        step_r = Mux(f.col_outer, ~wrap, wrap)
        reset_r, reset_c = f.col_outer & wrap, ~f.col_outer & wrap
        # Two banks of a group's blocks: the walker fills the one the sequencer does not read
        # (``~bank``) and a group step flips ``bank``, so the blocks' registers load from
        # flip-flop conditions (a copy of the next group into the current one, enabled
        # behind the beat stages' ``adv``, was the feed's longest path, issue #9).
        banks = [[Signal(Block, name=f"bank{b}_block{l}") for l in range(slots)]
                 for b in range(2)]
        bank = Signal()
        cur = [Signal(Block, name=f"block{l}") for l in range(slots)]
        m.d.comb += [c.eq(Mux(bank, banks[1][l], banks[0][l])) for l, c in enumerate(cur)]
        nxt_count = Signal(range(slots + 1))
        nxt_full = nxt_count == slots
        have_group = Signal()
        load_group = Signal()
        # A group loads only from a full next bank and the walker steps only into one not
        # full, so the walker's moves do not wait for the sequencer's decision.
        with m.If(load_group):
            m.d.sync += [bank.eq(~bank), nxt_count.eq(0)]
        with m.If(restart):
            m.d.sync += [walk_r.eq(0), walk_c.eq(0), nxt_count.eq(0), m_left.eq(run.m),
                         n_left.eq(run.n), m_wrap.eq(run.m <= rows), n_wrap.eq(run.n <= cols)]
        with m.Elif(~nxt_full):
            for l in range(slots):
                for b in range(2):
                    with m.If((nxt_count == l) & (bank != b)):
                        m.d.sync += banks[b][l].eq(walked)
            m.d.sync += [nxt_count.eq(nxt_count + 1),
                         walk_r.eq(Mux(reset_r, 0, Mux(step_r, walk_r + rows, walk_r))),
                         walk_c.eq(Mux(reset_c, 0, Mux(step_r, walk_c, walk_c + cols))),
                         m_left.eq(Mux(reset_r, f.m, Mux(step_r, m_left - rows, m_left))),
                         n_left.eq(Mux(reset_c, f.n, Mux(step_r, n_left, n_left - cols))),
                         m_wrap.eq(Mux(reset_r, f.m <= rows,
                                       Mux(step_r, m_left <= 2 * rows, m_wrap))),
                         n_wrap.eq(Mux(reset_c, f.n <= cols,
                                       Mux(step_r, n_wrap, n_left <= 2 * cols)))]

        # ------------------------------------------------------------------
        # Sequencer: a null group, the real groups, a null group; one position per
        # cycle (slot s, term k) into stage 1.
        # ------------------------------------------------------------------
        s = Signal(range(max(2, slots)))
        k = Signal(16)
        left = Signal(16)                   # terms after k
        last_term = Signal()                # left == 0, kept with it
        k_zero = Signal()                   # k == 0, kept with it
        block = Signal(Block)
        m.d.comb += block.eq(cur[0])
        for l in range(1, slots):
            with m.If(s == l):
                m.d.comb += block.eq(cur[l])
        emit, real, next_slot, group_end = Signal(), Signal(), Signal(), Signal()
        with m.If(next_slot):
            m.d.sync += s.eq(Mux(s == slots - 1, 0, s + 1))
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [s.eq(0), k.eq(0), k_zero.eq(1),
                                 left.eq((run.k + f.run_float_bias - 1)[:16]),
                                 last_term.eq(run.k + f.run_float_bias == 1)]
                    m.next = "NULL_FIRST"
            with m.State("NULL_FIRST"):
                m.d.comb += [emit.eq(1), next_slot.eq(adv)]
                with m.If(adv & (s == slots - 1)):
                    m.next = "REAL"
            with m.State("REAL"):
                m.d.comb += load_group.eq(~have_group & nxt_full)
                # Without a group the walker is still filling it: no position.
                with m.If(have_group):
                    with m.If(~cur[0].used):
                        m.next = "NULL_LAST"        # past the last group
                    with m.Elif(~block.used & ~k_zero):
                        m.d.comb += next_slot.eq(1)     # no beat: the slot has no block
                    with m.Else():
                        m.d.comb += [emit.eq(1), real.eq(block.used), next_slot.eq(adv)]
                with m.If(have_group & next_slot & (s == slots - 1)):
                    m.d.sync += [k.eq(Mux(last_term, 0, k + 1)), k_zero.eq(last_term),
                                 left.eq(Mux(last_term, f.terms_m1, left - 1)),
                                 last_term.eq(Mux(last_term, f.terms_m1 == 0, left == 1))]
                    with m.If(last_term):
                        m.d.comb += [group_end.eq(1), load_group.eq(nxt_full)]
            with m.State("NULL_LAST"):
                m.d.comb += [emit.eq(1), next_slot.eq(adv)]
                with m.If(adv & (s == slots - 1)):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(~(p1_valid | busy)):
                    m.next = "IDLE"
        with m.If(restart):
            m.d.sync += have_group.eq(0)
        with m.Elif(load_group):
            m.d.sync += have_group.eq(1)
        with m.Elif(group_end):
            m.d.sync += have_group.eq(0)

        # ------------------------------------------------------------------
        # Stage 1: the position (slot, k, the next word's k per operand, the block).
        # A lane's next word along K holds the first k of its next run of elements (a
        # CELL row slice of A, 64 bits of a CUBE_N8 column or a row-major row, the next
        # row of a transposed Shared primary, the next 32-k block of a scale).
        # ------------------------------------------------------------------
        p1 = SimpleNamespace(
            valid=p1_valid, adv=adv, busy=busy, slot=Signal(len(s), name="p1_slot"),
            real=Signal(name="p1_real"), bias=Signal(name="p1_bias"),
            first=Signal(name="p1_first"), k=Signal(16, name="p1_k"),
            ka=Signal(17, name="p1_ka"), kb=Signal(17, name="p1_kb"),
            ks=Signal(17, name="p1_ks"), block=Signal(Block, name="p1_block"))
        with m.If(adv):
            m.d.sync += [p1.valid.eq(emit), p1.real.eq(real), p1.slot.eq(s),
                         p1.bias.eq(f.float_bias & last_term), p1.first.eq(k_zero),
                         p1.k.eq(k), p1.ka.eq((k | f.a_next) + 1),
                         p1.kb.eq((k | f.b_next) + 1), p1.ks.eq((k | 31) + 1),
                         p1.block.eq(block)]
        return p1

    # ---- bit addresses: a lane's row (or column) part plus its operand's K part ----------
    # Each K part is two halves: the shifts of k by a run fact (``_*_kshifts``), then their
    # merge (``_kjoin``), so that a feed may register between them.
    @staticmethod
    def _a_kshifts(f, kk):
        """k's CELL index, its swapped index in the CELL and its row-major part."""
        inner = kk & _mask(f.a_cc)
        swapped = Mux(f.a_swap, (inner & 0b10011) | (inner[2] << 3) | (inner[3] << 2), inner)
        return (kk >> f.a_cc)[:f.sw], swapped[:8], (kk << f.a_k_sh)[:f.sw]

    @staticmethod
    def _b_kshifts(f, kk):
        return (kk >> f.b_cr)[:f.sw], (kk & _mask(f.b_cr)[:8])[:8], (kk << f.b_k_sh)[:f.sw]

    @staticmethod
    def _kjoin(f, operand, shifts):
        """Operand ``"a"`` or ``"b"``'s K part from its shifts: CELL-ordered or linear."""
        cell, index, linear = shifts
        cells, width = getattr(f, f"{operand}_cell"), getattr(f, f"{operand}_w")
        return Mux(cells, (cell << 10) | (index << width), linear)[:f.sw]

    @classmethod
    def _kpart(cls, f, operand, kk):
        shifts = cls._a_kshifts if operand == "a" else cls._b_kshifts
        return cls._kjoin(f, operand, shifts(f, kk))

    @staticmethod
    def _sa_kpart(kk):
        return (kk >> 5) << 3

    @staticmethod
    def _sb_kpart(f, kk):
        return ((kk >> 5) << f.sb_k_sh)[:f.sw]

    @staticmethod
    def _a_row(f, gi, shifted=None):
        """Row ``gi``'s part; ``shifted``: ``gi << f.a_row_sh`` when computed apart (the
        serial feed registers it), and likewise for the other ``_*_row``."""
        return f.a_base + (gi << f.a_row_sh if shifted is None else shifted)

    @staticmethod
    def _b_cells(f, gj):
        """CUBE_N8: column gj's first CELL is (gj // 8) * K_repeat (a multiplier)."""
        return (gj >> 3) * f.b_krep

    @staticmethod
    def _b_row(f, gj, cells, bias, shifted=None):
        # CUBE_N8: CELLs K-fast, N-slow; column gj's slice in its CELL is gj % 8.
        n8 = (cells << 10) | (gj[:3] << 7)
        shifted = gj << f.b_row_sh if shifted is None else shifted
        return Mux(bias, f.bias_base + (gj << 5), f.b_base + Mux(f.b_cell, n8, shifted))

    @staticmethod
    def _sa_row(f, gi, shifted=None):
        return f.sa_base + (gi << f.sa_row_sh if shifted is None else shifted)

    @staticmethod
    def _sb_row(f, gj):
        return f.sb_base + (gj << 3)

    def _beats(self, m: Module, f: SimpleNamespace, p1: SimpleNamespace):
        """Stages 2 to 5 and the beat register: every lane in parallel (see the module
        docstring); drives ``p1.adv`` and ``p1.busy``."""
        cfg = self.config
        rows, cols, slots, scaled = cfg.rows, cfg.cols, self.slots, self.has_scale
        aw, sw = f.aw, f.sw
        adv = p1.adv
        p2_valid, p3_valid, p4_valid, q_valid, out_valid = (
            Signal(name=f"{n}_valid") for n in ("p2", "p3", "p4", "q", "out"))

        # ------------------------------------------------------------------
        # Stage 2: each row's and column's index and need; each operand's K part of the
        # bit address (for k and for the next word's k).
        # ------------------------------------------------------------------
        def reg(width, name):
            return Signal(width, name=name)

        p2_slot, p2_real, p2_bias, p2_first = (reg(len(p1.slot), "p2_slot"), reg(1, "p2_real"),
                                               reg(1, "p2_bias"), reg(1, "p2_first"))
        p2_gi = [reg(16, f"p2_row{i}") for i in range(rows)]
        p2_gj = [reg(16, f"p2_col{j}") for j in range(cols)]
        p2_cells = [reg(sw - 10, f"p2_cells{j}") for j in range(cols)]
        p2_need_a = [reg(1, f"p2_need_a{i}") for i in range(rows)]
        p2_need_b = [reg(1, f"p2_need_b{j}") for j in range(cols)]
        p2_ka, p2_ka_next, p2_kb, p2_kb_next = (reg(sw, n) for n in (
            "p2_ka", "p2_ka_next", "p2_kb", "p2_kb_next"))
        p2_ahead_a, p2_ahead_b = reg(1, "p2_ahead_a"), reg(1, "p2_ahead_b")
        with m.If(adv):
            m.d.sync += [p2_valid.eq(p1.valid), p2_slot.eq(p1.slot), p2_real.eq(p1.real),
                         p2_bias.eq(p1.bias), p2_first.eq(p1.first),
                         p2_ka.eq(self._kpart(f, "a", p1.k)),
                         p2_ka_next.eq(self._kpart(f, "a", p1.ka)),
                         p2_kb.eq(Mux(p1.bias, 0, self._kpart(f, "b", p1.k))),
                         p2_kb_next.eq(self._kpart(f, "b", p1.kb)),
                         p2_ahead_a.eq(p1.real & ~p1.bias & (p1.ka < f.k)),
                         p2_ahead_b.eq(p1.real & ~p1.bias & (p1.kb < f.k))]
            m.d.sync += [p2_gi[i].eq(p1.block.r + i) for i in range(rows)]
            m.d.sync += [p2_gj[j].eq(p1.block.c + j) for j in range(cols)]
            # The CUBE_N8 CELL multiplier has a stage of its own.
            m.d.sync += [p2_cells[j].eq(self._b_cells(f, p1.block.c + j))
                         for j in range(cols)]
            m.d.sync += [p2_need_a[i].eq(p1.real & p1.block.rows_ok[i] & ~p1.bias)
                         for i in range(rows)]
            m.d.sync += [p2_need_b[j].eq(p1.real & p1.block.cols_ok[j]) for j in range(cols)]
        if scaled:
            p2_need_sa = [reg(1, f"p2_need_sa{i}") for i in range(rows)]
            p2_need_sb = [reg(1, f"p2_need_sb{j}") for j in range(cols)]
            p2_ksa, p2_ksa_next, p2_ksb, p2_ksb_next = (reg(sw, n) for n in (
                "p2_ksa", "p2_ksa_next", "p2_ksb", "p2_ksb_next"))
            p2_ahead_s = reg(1, "p2_ahead_s")
            with m.If(adv):
                m.d.sync += [p2_ksa.eq(self._sa_kpart(p1.k)),
                             p2_ksa_next.eq(self._sa_kpart(p1.ks)),
                             p2_ksb.eq(self._sb_kpart(f, p1.k)),
                             p2_ksb_next.eq(self._sb_kpart(f, p1.ks)),
                             p2_ahead_s.eq(p1.ks < f.k)]
                m.d.sync += [p2_need_sa[i].eq(p1.real & p1.block.rows_ok[i] & ~p1.bias
                                              & f.a_scaled) for i in range(rows)]
                m.d.sync += [p2_need_sb[j].eq(p1.real & p1.block.cols_ok[j] & ~p1.bias
                                              & f.b_scaled) for j in range(cols)]

        # ------------------------------------------------------------------
        # Stage 3: each row's and column's part of the bit address, base included.
        # ------------------------------------------------------------------
        p3_slot, p3_real, p3_bias, p3_first = (reg(len(p1.slot), "p3_slot"), reg(1, "p3_real"),
                                               reg(1, "p3_bias"), reg(1, "p3_first"))
        p3_row_a = [reg(sw, f"p3_row_a{i}") for i in range(rows)]
        p3_row_b = [reg(sw, f"p3_row_b{j}") for j in range(cols)]
        p3_need_a = [reg(1, f"p3_need_a{i}") for i in range(rows)]
        p3_need_b = [reg(1, f"p3_need_b{j}") for j in range(cols)]
        p3_ka, p3_ka_next, p3_kb, p3_kb_next = (reg(sw, n) for n in (
            "p3_ka", "p3_ka_next", "p3_kb", "p3_kb_next"))
        p3_ahead_a, p3_ahead_b = reg(1, "p3_ahead_a"), reg(1, "p3_ahead_b")
        with m.If(adv):
            m.d.sync += [p3_valid.eq(p2_valid), p3_slot.eq(p2_slot), p3_real.eq(p2_real),
                         p3_bias.eq(p2_bias), p3_first.eq(p2_first),
                         p3_ka.eq(p2_ka), p3_ka_next.eq(p2_ka_next), p3_kb.eq(p2_kb),
                         p3_kb_next.eq(p2_kb_next), p3_ahead_a.eq(p2_ahead_a),
                         p3_ahead_b.eq(p2_ahead_b)]
            m.d.sync += [p3_need_a[i].eq(p2_need_a[i]) for i in range(rows)]
            m.d.sync += [p3_need_b[j].eq(p2_need_b[j]) for j in range(cols)]
            m.d.sync += [p3_row_a[i].eq(self._a_row(f, p2_gi[i])) for i in range(rows)]
            m.d.sync += [p3_row_b[j].eq(self._b_row(f, p2_gj[j], p2_cells[j], p2_bias))
                         for j in range(cols)]
        if scaled:
            p3_row_sa = [reg(sw, f"p3_row_sa{i}") for i in range(rows)]
            p3_row_sb = [reg(sw, f"p3_row_sb{j}") for j in range(cols)]
            p3_need_sa = [reg(1, f"p3_need_sa{i}") for i in range(rows)]
            p3_need_sb = [reg(1, f"p3_need_sb{j}") for j in range(cols)]
            p3_ksa, p3_ksa_next, p3_ksb, p3_ksb_next = (reg(sw, n) for n in (
                "p3_ksa", "p3_ksa_next", "p3_ksb", "p3_ksb_next"))
            p3_ahead_s = reg(1, "p3_ahead_s")
            with m.If(adv):
                m.d.sync += [p3_ksa.eq(p2_ksa), p3_ksa_next.eq(p2_ksa_next),
                             p3_ksb.eq(p2_ksb), p3_ksb_next.eq(p2_ksb_next),
                             p3_ahead_s.eq(p2_ahead_s)]
                m.d.sync += [p3_need_sa[i].eq(p2_need_sa[i]) for i in range(rows)]
                m.d.sync += [p3_need_sb[j].eq(p2_need_sb[j]) for j in range(cols)]
                m.d.sync += [p3_row_sa[i].eq(self._sa_row(f, p2_gi[i])) for i in range(rows)]
                m.d.sync += [p3_row_sb[j].eq(self._sb_row(f, p2_gj[j])) for j in range(cols)]

        # ------------------------------------------------------------------
        # Stage 4 (the lane stage): every lane's word address and bit offset, for k and
        # for its next word; it holds the position until every lane holds its word.
        # ------------------------------------------------------------------
        p4_slot, p4_real, p4_bias, p4_first = (reg(len(p1.slot), "p4_slot"), reg(1, "p4_real"),
                                               reg(1, "p4_bias"), reg(1, "p4_first"))
        lanes, entering, extractors = [], [], []
        slot_is = [Signal(name=f"p4_slot_is{l}") for l in range(slots)]
        m.d.comb += [slot_is[l].eq(p4_slot == l) for l in range(slots)]

        def lane_group(name, count, row_parts, k_part, k_next, needs, ahead, space, log2w,
                       in_space, own=lambda index, need: need):
            """The lane-stage registers of one operand's R or C lanes, one per slot."""
            for index in range(count):
                addr, off = reg(aw, f"p4_{name}_addr{index}"), reg(6, f"p4_{name}_off{index}")
                next_addr = reg(aw, f"p4_{name}_next{index}")
                need = reg(1, f"p4_{name}_need{index}")
                own_need = reg(1, f"p4_{name}_own{index}")
                ahead_need = reg(1, f"p4_{name}_ahead{index}")
                bits = _named(m, (row_parts[index] + k_part)[:sw], f"p3_{name}_bits{index}")
                with m.If(adv):
                    m.d.sync += [addr.eq(bits[6:]), off.eq(bits[:6]),
                                 next_addr.eq((row_parts[index] + k_next)[6:sw]),
                                 need.eq(needs[index]), own_need.eq(own(index, needs[index])),
                                 ahead_need.eq(own(index, needs[index]) & ahead)]
                for lane_slot in range(slots):
                    here = slot_is[lane_slot]
                    lanes.append((own_need & here, space, addr, ahead_need & here, next_addr))
                    entering.append((adv, in_space, bits[6:], 0))
                    extractors.append((need & here, off, log2w))

        # A CUBE_M32 word holds two rows: with R even, blocks start on an even row, so an
        # odd array row takes its element from the even row's word (read once).
        pairs = rows % 2 == 0

        def own_a(index, need):
            return need & ~f.paired if pairs and index % 2 else need

        lane_group("a", rows, p3_row_a, p3_ka, p3_ka_next, p3_need_a, p3_ahead_a,
                   f.a_space, f.a_w, f.a_space, own_a)
        lane_group("b", cols, p3_row_b, p3_kb, p3_kb_next, p3_need_b, p3_ahead_b,
                   Mux(p4_bias, f.bias_space, f.b_space), Mux(p4_bias, 5, f.b_w),
                   Mux(p3_bias, f.bias_space, f.b_space))
        if scaled:
            lane_group("sa", rows, p3_row_sa, p3_ksa, p3_ksa_next, p3_need_sa, p3_ahead_s,
                       f.sa_space, 3, f.sa_space)
            lane_group("sb", cols, p3_row_sb, p3_ksb, p3_ksb_next, p3_need_sb, p3_ahead_s,
                       f.sb_space, 3, f.sb_space)
        with m.If(adv):
            m.d.sync += [p4_valid.eq(p3_valid), p4_slot.eq(p3_slot), p4_real.eq(p3_real),
                         p4_bias.eq(p3_bias), p4_first.eq(p3_first)]

        cache = lane_cache(m, "lane", lanes, self.rd, self.rsp, self.start, entering)
        all_hit, words = cache.all_hit, cache.words
        m.d.comb += p1.busy.eq(p2_valid | p3_valid | p4_valid | q_valid | out_valid | cache.busy)
        for i in range(1, rows if pairs else 0, 2):
            for lane_slot in range(slots):
                lane = i * slots + lane_slot             # A lanes come first, row-major
                words[lane] = Mux(f.paired, words[lane - slots], words[lane])

        # ------------------------------------------------------------------
        # Stage 5: each row's and column's element window.  An element (at most 32 bits,
        # aligned to its width) lies in one half of its word: the half moves on, the
        # shift inside it and the mask are the beat register's work.
        # ------------------------------------------------------------------
        q_slot, q_real, q_bias, q_first = (reg(len(p1.slot), "q_slot"), reg(1, "q_real"),
                                           reg(1, "q_bias"), reg(1, "q_first"))
        windows = []
        for index in range(len(lanes) // slots):
            window, off = reg(32, f"q_window{index}"), reg(5, f"q_off{index}")
            need, log2w = reg(1, f"q_need{index}"), reg(3, f"q_log2w{index}")
            need_now, window_now, off_now = 0, None, None   # slot 0's half comes first
            for lane_slot in range(slots):
                lane = index * slots + lane_slot
                here_need, here_off, log2w_now = extractors[lane]
                half = Mux(here_off[5], words[lane][32:], words[lane][:32])
                if lane_slot:
                    window_now = Mux(slot_is[lane_slot], half, window_now)
                    off_now = Mux(slot_is[lane_slot], here_off[:5], off_now)
                else:
                    window_now, off_now = half, here_off[:5]
                need_now = need_now | here_need
            with m.If(adv):
                m.d.sync += [window.eq(window_now), off.eq(off_now), need.eq(need_now),
                             log2w.eq(log2w_now)]
            windows.append(Mux(need, extract(window, off, log2w, 32), 0))
        with m.If(adv):
            m.d.sync += [q_valid.eq(p4_valid), q_slot.eq(p4_slot), q_real.eq(p4_real),
                         q_bias.eq(p4_bias), q_first.eq(p4_first)]

        # ------------------------------------------------------------------
        # The beat register.
        # ------------------------------------------------------------------
        m.d.comb += adv.eq((~out_valid | self.feed.ready) & (~p4_valid | all_hit))
        out = Signal(self.feed.payload.shape(), name="out")
        m.d.comb += [self.feed.valid.eq(out_valid), self.feed.payload.eq(out)]
        with m.If(adv):
            m.d.sync += out_valid.eq(q_valid)
        with m.Elif(self.feed.ready):
            m.d.sync += out_valid.eq(0)
        with m.If(adv):
            m.d.sync += [out.a[i].eq(Mux(q_bias, _FP32_ONE, windows[i])) for i in range(rows)]
            m.d.sync += [out.b[j].eq(windows[rows + j]) for j in range(cols)]
            m.d.sync += [out.a_type.eq(Mux(q_bias, int(DataType.FP32), f.a_type)),
                         out.b_type.eq(Mux(q_bias, int(DataType.FP32), f.b_type)),
                         out.slot.eq(q_slot), out.first.eq(q_first),
                         out.load.eq(f.load), out.null.eq(~q_real)]
            if scaled:
                m.d.sync += [out.a_scale[i].eq(windows[rows + cols + i]) for i in range(rows)]
                m.d.sync += [out.b_scale[j].eq(windows[2 * rows + cols + j])
                             for j in range(cols)]
                m.d.sync += [out.a_scale_en.eq(f.a_scaled & ~q_bias),
                             out.b_scale_en.eq(f.b_scaled & ~q_bias)]
