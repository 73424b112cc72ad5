"""The result path of the CUBE engine: drained accumulators to output payload words.

:class:`ResultPath` takes the rows the systolic array drains for one PE's run and turns
them into the words of D, RowMaxOut and GroupMaxOut:

1. **Intake.** Drained rows come R x L per group, one group behind the feed; the first
   row sets of a run carry no results (the opening null group, and before it the previous
   run's closing null group unless the array is fresh from reset) and are dropped.  A row
   of a real group is kept when its block exists and its row is below M.
2. **Serializer.** One element per cycle, columns below N, into
   :class:`~ptocube.hdl.postprocess.PostProcess` with its column's quantization / PReLU
   words (read from the 1 x N U64 vector tiles).  Blocks are visited row-major or block
   columns outer (:func:`~ptocube.hdl.cube_run.block_walker`) and drained row by row, so
   each output row's elements arrive in column order, in pieces of up to C elements that
   may interleave with other rows' pieces: RowMax and GroupMax are folded by one
   :class:`~ptocube.hdl.reduce.MaxReduce` each with one fold state per output row (and a
   group position per row), seeded with RowMaxIn.  ``PostProcess`` itself converts
   elements only (its reductions are off).
3. **Writer.** D elements are merged into one 64-bit word per array row (bank) and written
   when the bank's next element lies in another word or the row ends; RowMaxOut and
   GroupMaxOut elements are written as they complete.  Before any of that, the run writes
   zeros over D's CELL storage and the two row-major outputs' rows, so that every padding
   byte is what the model's payload holds.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from ..model.layout import Layout, cell_shape
from .cell_address import (BIT_ADDR_WIDTH, byte_mask, cube_m_bits, extract, row_major_bits,
                           word_and_offset)
from .config import CubeConfig
from .cube_run import RunLayout, block_walker, column_outer, in_block
from .encoders import SrcKind
from .logic import register_copies, registered
from .postprocess import PostProcess
from .read_arbiter import ReadReqLayout, ReadRspLayout, lane_cache
from .reduce import MaxReduce
from .tile_desc import ParamSource, PlanLayout
from .tile_port import MemWriteLayout, word_addr_width

__all__ = ["ResultPath"]

#: Output rows of one PE's run: a CUBE_M32 CELL's rows (CUBE_M16 holds at most 16).
MAX_ROWS = cell_shape(Layout.CUBE_M32, DataType.S32)[0]


class ResultPath(wiring.Component):
    """Drained rows in, output payload words out, for one PE's run at a time.

    Members
    -------
    run : In(RunLayout(config)), plan : In(PlanLayout(config)), rmode : In(3), sat : In(1)
        The run context, the plan (post-processing fields) and B.DATR RMode/Sat.
    start : In(1), fresh : In(1), done : Out(1)
        Begin a run (strobe while idle; ``fresh``: the array has not exchanged since reset);
        ``done`` is high while idle.
    clear : In(1)
        Clear the sticky ``flags`` (once per bundle, while idle).
    flags : Out(5)
        NV DZ OF UF NX raised since ``clear`` (conversions and reductions).
    drain : In(stream.Signature(drain_shape))
    rd, rsp : the read client (vector parameter words, RowMaxIn).
    wr : Out(stream.Signature(MemWriteLayout(config)))
    """

    def __init__(self, config: CubeConfig, drain_shape, slots: int):
        self.config = config
        self.slots = slots
        super().__init__({
            "run": In(RunLayout(config)), "plan": In(PlanLayout(config)),
            "rmode": In(3), "sat": In(1),
            "start": In(1), "fresh": In(1), "done": Out(1),
            "clear": In(1), "flags": Out(5),
            "drain": In(stream.Signature(drain_shape)),
            "rd": Out(stream.Signature(ReadReqLayout(config))),
            "rsp": In(ReadRspLayout),
            "wr": Out(stream.Signature(MemWriteLayout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, run, plan = self.config, self.run, self.plan
        rows, cols, slots = cfg.rows, cfg.cols, self.slots
        aw = word_addr_width(cfg)
        row_bits = max(1, (rows - 1).bit_length())

        running = Signal()
        # ------------------------------------------------------------------
        # Prefill: zeros over D's CELLs, then over RowMaxOut's and GroupMaxOut's rows
        # ------------------------------------------------------------------
        # The region's words left and next word address are counters, loaded when a region
        # begins: the RowMaxOut / GroupMaxOut sizes come from registers that follow the run
        # context (still for the whole run), so no size adder or compare is in front of the
        # write port.
        pre_region = Signal(2)
        pre_left = Signal(16)
        pre_more = Signal()                        # pre_left != 0, kept beside it
        pre_addr = Signal(aw)
        pre_done = Signal()                        # pre_region == 3, kept beside it
        later_words = [Signal(16, name=f"pre_words{k}") for k in (1, 2)]
        later_base = [Signal(aw, name=f"pre_base{k}") for k in (1, 2)]
        for words, base, enable, info in ((later_words[0], later_base[0], plan.row_max,
                                           run.row_max),
                                          (later_words[1], later_base[1], plan.group_max,
                                           run.group_max)):
            m.d.sync += [words.eq(Mux(enable, ((run.m << info.log2p) + 1) >> 1, 0)),
                         base.eq(info.base << 4)]
        pre_valid = running & ~pre_done & pre_more
        pre_taken = Signal()
        with m.If(running & ~pre_done):
            with m.If(~pre_more):
                m.d.sync += [pre_region.eq(pre_region + 1), pre_done.eq(pre_region == 2)]
                with m.Switch(pre_region):
                    for k in (0, 1):
                        with m.Case(k):
                            m.d.sync += [pre_left.eq(later_words[k]),
                                         pre_more.eq(later_words[k] != 0),
                                         pre_addr.eq(later_base[k])]
            with m.Elif(pre_taken):
                m.d.sync += [pre_left.eq(pre_left - 1), pre_more.eq(pre_left != 1),
                             pre_addr.eq(pre_addr + 1)]

        # ------------------------------------------------------------------
        # Intake: drop the empty row sets, keep rows of real blocks below M
        # ------------------------------------------------------------------
        junk = Signal(2)
        step_group = Signal()
        restart = Signal()
        # The blocks of the group to come are found one slot per cycle by a one-slot walker
        # and kept in registers with the facts the intake needs (which of their rows exist):
        # no chain of block steps across the slots and no row adder or compare in front of
        # the drain handshake (issue #9).  A group's rows come ``R x L`` beats after its
        # blocks are known, so the slot registers are ready long before they are used.
        walk_step = Signal()
        # The walk's facts of the run, registered in every cycle (decision 51): the run
        # context holds still from ``start`` to ``done``, so they are valid from the cycle
        # after ``start``, the walk's first step.  The walk and the slots' row facts then
        # compare registers with registers: no M > N, M - R or M - row0 in front of them
        # (the 8 x 8 unit's 83.73 MHz route had 54 walk registers over 10 ns).
        def fact(name, value, width=16):
            return registered(m, value, width, f"drain_{name}")
        m_dim, n_dim = fact("m_dim", run.m), fact("n_dim", run.n)
        n_m1 = fact("n_m1", run.n - 1)
        limits = (fact("m_less_rows", Mux(run.m > rows, run.m - rows, 0)),
                  fact("n_less_cols", Mux(run.n > cols, run.n - cols, 0)))
        # Row r of a block at row0 exists when row0 < M - r (0 when M <= r).
        m_less = [m_dim] + [fact(f"m_less{r}", Mux(run.m > r, run.m - r, 0))
                            for r in range(1, rows)]
        walker, w_done = block_walker(m, "drain", rows, cols, 1, m_dim, n_dim, restart,
                                      walk_step, outer=fact("col_outer", column_outer(
                                          cols, run.m, run.n), 1), limits=limits)
        (w_row0, w_col0, w_used), = walker
        slot_row0 = Array(Signal(16, name=f"slot{s}_row0") for s in range(slots))
        slot_col0 = Array(Signal(16, name=f"slot{s}_col0") for s in range(slots))
        # Whether the block's first column is the last of a row (N - 1): found as the slot
        # fills, so no compare follows the held row into the serializer's loads.
        slot_last = Array(Signal(name=f"slot{s}_last") for s in range(slots))
        slot_rows = Array(Signal(rows, name=f"slot{s}_rows") for s in range(slots))
        filled = Signal(range(slots + 1))
        blocks_ready = filled == slots
        walk_done = Signal()                       # the group has no block: the run is over
        # The filling does not wait for the intake's handshake: a group ends (the slot
        # registers are free again) only while they are full, and a restart rewrites them.
        with m.If(~blocks_ready):
            m.d.comb += walk_step.eq(1)
            m.d.sync += [filled.eq(filled + 1), slot_row0[filled].eq(w_row0),
                         slot_col0[filled].eq(w_col0), slot_last[filled].eq(w_col0 == n_m1),
                         slot_rows[filled].eq(Cat(*(w_used & (w_row0 < m_less[r])
                                                    for r in range(rows))))]
            with m.If(filled == 0):
                m.d.sync += walk_done.eq(w_done)
        with m.If(restart | step_group):
            m.d.sync += filled.eq(0)
        d_row = self.drain.payload.row
        d_slot = self.drain.payload.slot

        # A kept row waits in ``held`` (its output row and first column computed) until the
        # serializer's buffer is free.  The drained FIFO's read enable is a register
        # (``drain.ready``, computed a cycle ahead from the next cycle's state): it loads the
        # FIFO's ~290-bit output register, so no handshake logic may sit in front of it
        # (issue #9).  It is high only while ``held`` will be empty, so a taken row always
        # has room; ``held`` follows the FIFO's head while empty (enable: a register) and
        # keeps it when the row is kept.  Its row's group position is looked up into ``look``
        # registers from ``held_row``, a register next to the per-row table, so the row
        # loads two cycles after it is taken at the earliest (``looked``): the lookup no
        # longer starts at the FIFO's head across the chip (issue #9).
        held_valid = Signal()
        looked = Signal()
        held_data = Signal(data.ArrayLayout(32, cols))
        held_bank = Signal(row_bits)
        held_row = Signal(16)
        held_col0 = Signal(16)
        held_last = Signal()
        buf_valid = Signal()
        buf = Signal(data.ArrayLayout(32, cols))
        buf_bank = Signal(row_bits)
        buf_row = Signal(16)
        ser_j = Signal(range(cols + 1))
        # The serializer's position facts live in registers (set when a row piece is loaded,
        # stepped with each element) so that no adder sits in front of the element handshake.
        gj = Signal(16)
        elt = Signal()
        row_last = Signal()
        col_first = Signal()
        q_addr = Signal(aw)
        a_addr = Signal(aw)
        # The buffer is free once its piece has no element left (no element is pushed then).
        # ``elt`` is set only with ``buf_valid`` and the buffer empties only once it is
        # clear, so ``elt`` alone says that an element is on offer.
        buf_free = ~elt
        load = looked & buf_free
        ready = Signal()
        m.d.comb += self.drain.ready.eq(ready)
        got = self.drain.valid & ready
        set_end = got & (d_row == rows - 1) & (d_slot == slots - 1)
        with m.If(got & set_end):
            with m.If(junk != 0):
                m.d.sync += junk.eq(junk - 1)
            with m.Else():
                m.d.comb += step_group.eq(1)
        keep = got & (junk == 0) & slot_rows[d_slot].bit_select(d_row, 1)
        # With R a power of two the row is an OR, not an adder, on the FIFO head's way into
        # ``held_row``.
        in_row = in_block(slot_row0[d_slot], d_row, rows)[:16]
        with m.If(load):
            m.d.sync += held_valid.eq(0)
        with m.If(keep):
            m.d.sync += held_valid.eq(1)
        # ``held_row`` has held still for a cycle, so ``look`` is its row's entry.
        m.d.sync += looked.eq(held_valid & ~load)
        # The next cycle's state, for ``ready``: a junk row to drop, or the group's blocks
        # known and ``held`` empty (a kept row and a load never share a cycle).
        junk_next = (junk > 1) | ((junk == 1) & ~set_end)
        blocks_next = ~restart & ~step_group & (blocks_ready | (filled == slots - 1))
        walk_done_next = Mux(~blocks_ready & (filled == 0), w_done, walk_done)
        held_next = (held_valid & ~load) | keep
        # "held is empty" once per column and once for the row's facts: the enables of
        # ~290 flip-flops are copies of ``~held_valid``, so that ``held_valid`` itself drives
        # only the logic near the group position lookup (issue #9).
        held_open = register_copies(m, ~held_next, cols + 1, "held_open", init=1)
        for j in range(cols):
            with m.If(held_open[j]):
                m.d.sync += held_data[j].eq(self.drain.payload.data[j])
        with m.If(held_open[cols]):
            m.d.sync += [held_bank.eq(d_row), held_row.eq(in_row),
                         held_col0.eq(slot_col0[d_slot]), held_last.eq(slot_last[d_slot])]
        m.d.sync += ready.eq(running & ~restart
                             & (junk_next | (blocks_next & ~walk_done_next & ~held_next)))
        with m.If(load):
            m.d.sync += [buf.eq(held_data), buf_bank.eq(held_bank), buf_row.eq(held_row),
                         ser_j.eq(0), gj.eq(held_col0), elt.eq(held_col0 < run.n),
                         row_last.eq(held_last), col_first.eq(held_col0 == 0),
                         q_addr.eq((run.quant.base << 4) + held_col0),
                         a_addr.eq((run.alpha.base << 4) + held_col0)]

        # ------------------------------------------------------------------
        # Serializer: one element per cycle into PostProcess and the reductions
        # ------------------------------------------------------------------
        m.submodules.post = post = PostProcess(cfg)
        # The plan is still for the whole run and its first element comes many cycles
        # after the start, so PostProcess takes it from registers: the B.IOR words cross
        # the chip once, into these, instead of feeding its logic directly (issue #9).
        m.d.sync += [
            post.plan.acc_type.eq(plan.acc_type),
            post.plan.pre_quant_mode.eq(plan.pre_quant_mode),
            post.plan.relu_mode.eq(plan.relu_mode),
            post.plan.rmode.eq(self.rmode), post.plan.sat.eq(self.sat),
            post.plan.quant_scalar.eq(plan.quant_scalar),
            post.plan.alpha_scalar.eq(plan.alpha_scalar),
        ]
        m.d.comb += post.clear.eq(self.clear)
        gi = buf_row
        elem = Signal(32)
        with m.Switch(ser_j):
            for j in range(cols):
                with m.Case(j):
                    m.d.comb += elem.eq(buf[j])
        element = elt

        # Which words the elements need, from registers (the plan holds still for the run).
        quant_vector = Signal()
        alpha_vector = Signal()
        seeded = Signal()
        m.d.sync += [quant_vector.eq(plan.quant_source == ParamSource.VECTOR),
                     alpha_vector.eq(plan.alpha_source == ParamSource.VECTOR),
                     seeded.eq(plan.row_max & plan.row_max_init)]
        need_quant = element & quant_vector
        need_alpha = element & alpha_vector
        need_seed = element & seeded & row_last
        # RowMaxIn's word and offset for the piece's row, set when the piece is loaded: no
        # address adder in front of the parameter cache's hit test and the element handshake.
        s_addr = Signal(aw)
        s_off = Signal(6)
        with m.If(load):
            bits = row_major_bits(5, run.rowmax_in.log2p, held_row, 0)
            m.d.sync += Cat(s_addr, s_off).eq(Cat(*word_and_offset(run.rowmax_in.base, bits,
                                                                    aw)))
        # The cache's hits are registers computed a cycle ahead from the addresses the
        # element after a push needs: the element handshake starts from flip-flops, not
        # from the address compares (issue #9).  A loaded piece's first element finds its
        # words a cycle later (they are other words than the previous piece's last anyway).
        push = Signal()
        params = lane_cache(
            m, "param", [(need_quant, run.quant.space, q_addr),
                         (need_alpha, run.alpha.space, a_addr),
                         (need_seed, run.rowmax_in.space, s_addr)],
            self.rd, self.rsp, self.start,
            entering=[(push, run.quant.space, q_addr + 1, load),
                      (push, run.alpha.space, a_addr + 1, load),
                      (0, run.rowmax_in.space, s_addr, load)])
        params_hit = params.all_hit
        q_word, a_word, s_word = params.words
        seed = extract(s_word, s_off, 5, 32)

        # Per-output-row group position: a row's elements may come in pieces (one per block
        # column) between other rows' pieces.
        row_index = gi[:(MAX_ROWS - 1).bit_length()]
        # The current row's position in registers: loaded with a piece, stepped with each
        # element and written back to the row's entry once the piece has no element left
        # (from registers: the element handshake drives no row decoder).  An entry keeps its
        # row's group_hit, so that no compare follows the lookup.  The held row's entry is
        # read into ``look`` registers each cycle; a piece of the row being written back in
        # its load cycle, or the cycle before, takes the written position instead.
        cur_gcol = Signal(8)
        cur_gidx = Signal(16)
        group_hit = Signal()                       # cur_gcol = GroupN - 1
        position = Cat(cur_gcol, cur_gidx, group_hit)
        # Per row: its group column, group index and group_hit, as in ``position``.
        gpos = Array(Signal(len(position), name=f"gpos{r}") for r in range(MAX_ROWS))
        # GroupN - 1 (all ones without GroupMax: never reached), registered from the plan.
        group_end = Signal(9)
        m.d.sync += group_end.eq(plan.group_n - 1)
        group_last = row_last | group_hit
        # Whether the element on offer closes a row or group whose result is written, in a
        # register set with ``row_last`` and ``group_hit``: the element handshake's
        # hold-back test is then a gate on flip-flops (issue #9).
        reduces = Signal()

        def closing(last, hit):
            return (plan.row_max & last) | (plan.group_max & (last | hit))

        # The reductions (one fold state per output row) and their delay line.
        src = Signal(SrcKind)
        with m.Switch(plan.acc_type):
            with m.Case(int(DataType.S32)):
                m.d.comb += src.eq(SrcKind.S32)
            with m.Case(int(DataType.U32)):
                m.d.comb += src.eq(SrcKind.U32)
        sources = ({SrcKind.FP32} if cfg.float_types else set()) | \
            ({SrcKind.S32, SrcKind.U32} if cfg.int_types else set())
        reductions = {kind: MaxReduce(sources, MAX_ROWS) for kind in ("row", "group")}
        # The reductions take their operands from registers (a stage after the element
        # handshake, issue #9), so the line is a cycle longer than their latency.
        line = [Signal(data.StructLayout({"valid": 1, "row": 16,
                                          "group": 16, "row_last": 1, "group_last": 1}),
                       name=f"red_line{t}") for t in range(1 + reductions["row"].latency)]
        row_hold_valid = Signal()
        group_hold_valid = Signal()
        # A reduction is pending (in the line or a hold) in a register: it is loaded with
        # every source of this cycle's pending state and of the next one (the line steps into
        # the holds, a closing element into the line), so it is high whenever one is pending
        # and at most a cycle longer; the element handshake then reads a flip-flop (issue #9).
        red_busy = Signal()
        red_pending = Cat(*(st.valid & (st.row_last | st.group_last) for st in line)).any() \
            | row_hold_valid | group_hold_valid

        # An element's coordinates wait here from its push until it leaves PostProcess and
        # enters the writer's ``e`` stage (PostProcess's latency, then ``dq`` and the stage:
        # about 13 cycles).  The queue is deeper than that loop, so the serializer pushes an
        # element every cycle (with 8 entries it pushed 8 per 13 cycles; decision C28).
        m.submodules.coords = coords = fifo.SyncFIFOBuffered(width=row_bits + 32,
                                                             depth=post.latency + 8)
        # Room in ``coords`` for this cycle's element, in a register: the queue is at least
        # two entries short of full a cycle before (two deeper than it needs to be for
        # that), so the element handshake does not wait for its level compare.
        coords_room = Signal()
        m.d.sync += coords_room.eq(coords.level < coords.depth - 2)
        m.d.comb += push.eq(element & params_hit & coords_room & pre_done
                            & ~(reduces & red_busy))
        m.d.comb += [
            post.acc_in.valid.eq(push),
            post.acc_in.payload.p.eq(elem), post.acc_in.payload.last.eq(row_last),
            post.acc_in.payload.quant.eq(q_word), post.acc_in.payload.alpha.eq(a_word),
            coords.w_en.eq(push), coords.w_data.eq(Cat(buf_bank, gi, gj)),
        ]
        m.d.sync += red_busy.eq(red_pending | (push & reduces))
        next_gcol = Mux(group_last, 0, cur_gcol + 1)[:8]
        next_gidx = Mux(group_last, cur_gidx + 1, cur_gidx)[:16]
        next_last = Signal()
        next_hit = Signal()
        m.d.comb += [next_last.eq(gj + 2 == run.n), next_hit.eq(next_gcol == group_end)]
        # An element's column is below N, so another follows in the row unless it ends the
        # row: ``row_last`` stands for the column compare.
        with m.If(push):
            m.d.sync += [ser_j.eq(ser_j + 1), gj.eq(gj + 1), col_first.eq(0),
                         elt.eq((ser_j + 1 < cols) & ~row_last),
                         row_last.eq(next_last),
                         q_addr.eq(q_addr + 1), a_addr.eq(a_addr + 1),
                         cur_gcol.eq(next_gcol), cur_gidx.eq(next_gidx),
                         group_hit.eq(next_hit), reduces.eq(closing(next_last, next_hit))]
        write_back = buf_valid & ~elt
        with m.If(write_back):
            m.d.sync += [buf_valid.eq(0),
                         gpos[row_index].eq(position)]
        new_row = held_row[:len(row_index)]
        look = Signal(len(position))
        written = Signal(len(position))
        written_valid = Signal()
        written_row = Signal(len(row_index))
        # A multiplexer tree on the row's bits, not a decoder of every entry (issue #9).
        m.d.sync += [look.eq(Cat(*gpos).word_select(new_row, len(position))),
                     written_valid.eq(write_back), written_row.eq(row_index),
                     written.eq(position)]
        first_piece = Cat(Const(0, len(cur_gcol) + len(cur_gidx)), group_end == 0)
        loaded = Signal(len(position))
        m.d.comb += loaded.eq(Mux(held_col0 == 0, first_piece,
                                  Mux(write_back & (row_index == new_row), position,
                                      Mux(written_valid & (written_row == new_row), written,
                                          look))))
        with m.If(load):
            m.d.sync += [buf_valid.eq(1), position.eq(loaded),
                         reduces.eq(closing(held_last, loaded[-1]))]

        red_in = Signal(data.StructLayout({"valid": 1, "index": len(row_index), "value": 32,
                                           "seed": 32, "row_first": 1, "row_last": 1,
                                           "group_first": 1, "group_last": 1}))
        m.d.sync += red_in.eq(Cat(push, row_index, elem, seed, col_first, row_last,
                                  cur_gcol == 0, group_last))
        for kind, first, last, seed_en in (("row", red_in.row_first, red_in.row_last,
                                            plan.row_max_init),
                                           ("group", red_in.group_first, red_in.group_last,
                                            Const(0, 1))):
            red = m.submodules[f"{kind}_max"] = reductions[kind]
            # The controls come from the plan, which holds still for the whole run, so each
            # reduction takes them from registers of its own a cycle later: read straight
            # from the plan's registers across the device, their decode was the 8 x 8
            # unit's critical path (12.5 ns, 10.6 of it wire; issue #9).
            ctl = register_copies(m, Cat(plan.max_abs, seed_en, src), 1, f"{kind}_red_ctl")[0]
            m.d.comb += [red.max_abs.eq(ctl[0]), red.seed_en.eq(ctl[1]), red.src.eq(ctl[2:]),
                         red.valid.eq(red_in.valid), red.index.eq(red_in.index),
                         red.value.eq(red_in.value), red.first.eq(first), red.last.eq(last),
                         red.seed.eq(red_in.seed)]
        m.d.sync += line[0].eq(Cat(push, gi, cur_gidx, row_last & plan.row_max,
                                   group_last & plan.group_max))
        for t in range(1, len(line)):
            m.d.sync += line[t].eq(line[t - 1])
        out = line[-1]
        red_flags = Signal(5)
        m.d.comb += red_flags.eq(Mux(out.valid & plan.row_max, reductions["row"].flags, 0)
                                 | Mux(out.valid & plan.group_max, reductions["group"].flags,
                                       0))
        row_result = reductions["row"].result
        group_result = reductions["group"].result

        # Reduction outputs wait in one register each (the serializer holds back an element
        # that closes a row or group while one is pending).
        # Their bit addresses are registered from the line's stage before last (the line
        # steps every cycle), so that only the word adder is in front of the hold.
        holds = []
        ahead = line[-2]
        for kind, fire, info, column, result, hold_valid in (
                ("rowmax", out.valid & out.row_last, run.row_max, 0, row_result,
                 row_hold_valid),
                ("groupmax", out.valid & out.group_last, run.group_max, ahead.group,
                 group_result, group_hold_valid)):
            hold = Signal(MemWriteLayout(cfg), name=f"{kind}_hold")
            bits = Signal(BIT_ADDR_WIDTH, name=f"{kind}_bits")
            m.d.sync += bits.eq(row_major_bits(5, info.log2p, ahead.row, column))
            addr, off = word_and_offset(info.base, bits, aw)
            with m.If(fire):
                m.d.sync += [hold_valid.eq(1), hold.space.eq(run.space), hold.addr.eq(addr),
                             hold.data.eq(result << off), hold.mask.eq(0xF << (off >> 3))]
            holds.append((hold, hold_valid))

        # ------------------------------------------------------------------
        # D words: one assembly register per bank
        # ------------------------------------------------------------------
        # PostProcess never waits: its beats queue in ``dq`` beside their coordinates.  An
        # element enters ``coords`` when it enters PostProcess and leaves both queues
        # together, so ``dq`` never holds more beats than ``coords`` entries.
        m.submodules.dq = dq = fifo.SyncFIFOBuffered(width=32, depth=coords.depth)
        m.d.comb += [post.d_out.ready.eq(1), dq.w_en.eq(post.d_out.valid),
                     dq.w_data.eq(post.d_out.payload.d)]
        c_bank = coords.r_data[:row_bits]
        c_row = coords.r_data[row_bits:row_bits + 16]
        c_col = coords.r_data[row_bits + 16:row_bits + 32]
        # An element's bit address in D and its bits take a register stage of their own
        # (``e``) before the word address, shift and mask (issue #9).
        e_valid = Signal()
        e_bank = Signal(row_bits)
        e_bits = Signal(BIT_ADDR_WIDTH)
        e_data = Signal(32)
        e_row_end = Signal()
        e_addr, e_off = word_and_offset(run.d.base, e_bits, aw)
        # D's layout and element width in the writer's own registers (still for the whole
        # run, whose first element comes long after the start): the bit address and the
        # element's mask start here, not at the run context's fan-out.
        d_m32 = Signal()
        d_log2w = Signal(3)
        m.d.sync += [d_m32.eq(run.m32), d_log2w.eq(run.d_log2w)]
        # The writer works on a register of the element's word, bits and mask.
        d_valid = Signal()
        d_bank = Signal(row_bits)
        d_addr = Signal(aw)
        d_ins = Signal(64)
        d_mask = Signal(8)
        d_row_end = Signal()

        asm_valid = [Signal(name=f"asm{b}_valid") for b in range(rows)]
        asm_addr = [Signal(aw, name=f"asm{b}_addr") for b in range(rows)]
        asm_data = [Signal(64, name=f"asm{b}_data") for b in range(rows)]
        asm_mask = [Signal(8, name=f"asm{b}_mask") for b in range(rows)]
        asm = list(zip(asm_valid, asm_addr, asm_data, asm_mask))
        # Each open word's index from the start of D (the bit address without its offset),
        # beside its address: an element's word is compared by index, so the compare needs
        # no adder (the index names one word within the run, whose D base holds still).
        asm_index = [Signal(aw, name=f"asm{b}_index") for b in range(rows)]
        d_index = Signal(aw)
        # The open word of the element's bank has registers of its own, kept equal to that
        # bank's assembly register: the writer's decisions start from flip-flops, not from a
        # bank multiplexer.
        cur_valid = Signal()
        cur_addr = Signal(aw)
        cur_data = Signal(64)
        cur_mask = Signal(8)
        cur = Cat(cur_valid, cur_addr, cur_data, cur_mask)
        # Whether the element's word is the open word is decided when the element enters
        # ``d``, against the open word it will meet there: the 64-bit word multiplexers
        # below start from this flip-flop, not from an address compare (issue #9).
        e_index = e_bits[6:6 + aw]
        same = Signal()
        conflict = cur_valid & ~same
        # The element's word: the open word with the element merged in when it is the same
        # word, else the element alone.
        merged_data = Mux(same, cur_data, 0) | d_ins
        merged_mask = Mux(same, cur_mask, 0) | d_mask
        # The bank's open word once the element is placed: none once its row ends (an open
        # word's contents count only while it is valid).
        placed = Cat(~d_row_end, d_addr, merged_data, merged_mask)
        # An element that finds another word open writes that word and opens its own in
        # the same cycle (a bank's rows alternate words with every block column); one that
        # ends its row writes its own word, so an element writes up to two words.  They
        # wait for the write port in a ring of four registers, and an element is placed
        # only while the ring has room for two: ``room`` is a register computed a cycle
        # ahead, so whether an element advances is known from flip-flops.  The port's
        # handshake reaches the ring's pointers only, and the address compare only the
        # words, neither the stages' enables nor the FIFO reads (issue #9).
        ring = [Signal(MemWriteLayout(cfg), name=f"wq{k}") for k in range(4)]
        w_ptr = Signal(2)
        r_ptr = Signal(2)
        used = Signal(3)
        room = Signal(init=1)
        d_taken = Signal()
        d_here = d_valid & room
        d_load = e_valid & (~d_valid | d_here)
        e_load = coords.r_rdy & dq.r_rdy & (~e_valid | d_load)
        m.d.comb += [coords.r_en.eq(e_load), dq.r_en.eq(e_load)]
        with m.If(d_load):
            m.d.sync += e_valid.eq(0)
        with m.If(e_load):
            m.d.sync += [e_valid.eq(1), e_bank.eq(c_bank),
                         e_bits.eq(cube_m_bits(d_m32, d_log2w, c_row, c_col)),
                         e_data.eq(extract(dq.r_data, 0, d_log2w, 32)),
                         e_row_end.eq(c_col + 1 == run.n)]
        with m.If(d_load):
            m.d.sync += [d_valid.eq(1), d_bank.eq(e_bank), d_addr.eq(e_addr),
                         d_index.eq(e_index), d_ins.eq((e_data << e_off)[:64]),
                         d_mask.eq(byte_mask(d_log2w, e_off)), d_row_end.eq(e_row_end)]
            with m.If(d_here & (d_bank == e_bank)):
                m.d.sync += [cur.eq(placed), same.eq(~d_row_end & (d_index == e_index))]
            with m.Else():
                for b in range(rows):
                    with m.If(e_bank == b):
                        m.d.sync += [cur.eq(Cat(*asm[b])),
                                     same.eq(asm_valid[b] & (asm_index[b] == e_index))]
        with m.Elif(d_here):
            m.d.sync += cur.eq(placed)
        with m.If(d_here & ~d_load):
            m.d.sync += d_valid.eq(0)
        for b in range(rows):
            with m.If(d_here & (d_bank == b)):
                m.d.sync += [Cat(*asm[b]).eq(placed), asm_index[b].eq(d_index)]
        # The two ring entries at ``w_ptr`` are free whenever an element is placed, so they
        # load with every element (enables from registers); only the words pushed count: the
        # open word that the element leaves and its own word when it ends its row, or its
        # own word alone when it ends its row in the open word.
        first = Signal(MemWriteLayout(cfg))
        second = Signal(MemWriteLayout(cfg))
        m.d.comb += [first.space.eq(run.space), first.addr.eq(Mux(conflict, cur_addr, d_addr)),
                     first.data.eq(Mux(conflict, cur_data, merged_data)),
                     first.mask.eq(Mux(conflict, cur_mask, merged_mask)),
                     second.space.eq(run.space), second.addr.eq(d_addr),
                     second.data.eq(d_ins), second.mask.eq(d_mask)]
        with m.If(d_here):
            for k in range(4):
                with m.If(w_ptr == k):
                    m.d.sync += ring[k].eq(first)
                with m.If(w_ptr == (k - 1) % 4):
                    m.d.sync += ring[k].eq(second)
        pushed = Mux(d_here, (conflict | d_row_end) + (conflict & d_row_end), 0)
        used_next = used + pushed - d_taken
        m.d.sync += [used.eq(used_next), room.eq(used_next <= 2),
                     w_ptr.eq(w_ptr + pushed), r_ptr.eq(r_ptr + d_taken)]

        # ------------------------------------------------------------------
        # Write port: reductions, D, prefill (the prefill ends before any data exists)
        # ------------------------------------------------------------------
        # The port is a register: the store's write address, data and enables start from
        # flip-flops, not from this priority choice (issue #9).  A write leaves a cycle later
        # at the same rate and in the same order.
        (row_hold, _), (group_hold, _) = holds
        wr = self.wr
        with m.If(wr.ready):
            m.d.sync += wr.valid.eq(0)
        with m.If(~wr.valid | wr.ready):
            with m.If(row_hold_valid):
                m.d.sync += [wr.valid.eq(1), wr.payload.eq(row_hold), row_hold_valid.eq(0)]
            with m.Elif(group_hold_valid):
                m.d.sync += [wr.valid.eq(1), wr.payload.eq(group_hold),
                             group_hold_valid.eq(0)]
            with m.Elif(used != 0):
                m.d.sync += [wr.valid.eq(1),
                             wr.payload.eq(Array(w.as_value() for w in ring)[r_ptr])]
                m.d.comb += d_taken.eq(1)
            with m.Elif(pre_valid):
                m.d.sync += [wr.valid.eq(1), wr.payload.space.eq(run.space),
                             wr.payload.addr.eq(pre_addr), wr.payload.data.eq(0),
                             wr.payload.mask.eq(0xFF)]
                m.d.comb += pre_taken.eq(1)

        # Flags: conversions (PostProcess) and reduction steps.
        red_sticky = Signal(5)
        m.d.sync += red_sticky.eq(Mux(self.clear, 0, red_sticky | red_flags))
        m.d.comb += self.flags.eq(post.flags | red_sticky)

        # ------------------------------------------------------------------
        # Run control
        # ------------------------------------------------------------------
        idle_inside = ~held_valid & ~buf_valid & ~post.busy & ~post.d_out.valid \
            & ~coords.r_rdy & ~e_valid & ~d_valid & ~Cat(*(st.valid for st in line)).any() \
            & ~row_hold_valid & ~group_hold_valid & (used == 0) & ~wr.valid \
            & pre_done
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [junk.eq(Mux(self.fresh, 1, 2)), pre_region.eq(0), pre_done.eq(0),
                                 pre_left.eq(run.d_cells << 4), pre_more.eq(run.d_cells != 0),
                                 pre_addr.eq(run.d.base << 4), running.eq(1)]
                    m.next = "RUN"
            with m.State("RUN"):
                with m.If(blocks_ready & walk_done & (junk == 0) & idle_inside):
                    m.d.sync += running.eq(0)
                    m.next = "IDLE"
        return m
