"""The fill source of the CUBE engine: initial accumulator rows for the systolic array.

The array loads each group's initial values during the exchange that runs while the
previous group computes (``docs/hdl-systolic.md`` section 4).  :class:`FillSource` produces
those rows in the array's order - per group R x L rows, (row 0, slot 0), (row 0, slot 1),
..., (row R-1, slot L-1) - for one PE's run:

* when the array is fresh from reset, first the R x L rows of the reset exchange;
* then one row set per real group: C[i][j] for ACC forms (read from C's CELL layout),
  Bias[j] in every row for integer BIAS forms (integer addition is associative modulo
  2**32, so starting the chain from Bias[j] gives the model's ``P + Bias`` bit for bit),
  zeros otherwise;
* then two row sets of zeros: the initial values of the closing null group and of the group
  after it (the next run's opening null group).
"""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .cell_address import cube_m_bits, extract, word_and_offset
from .config import CubeConfig
from .cube_run import RunLayout, column_outer, in_block
from .logic import register_copies
from .read_arbiter import ReadReqLayout, ReadRspLayout, lane_cache
from .tile_port import word_addr_width

__all__ = ["FillSource"]


class FillSource(wiring.Component):
    """Fill rows for one PE's run.

    Members
    -------
    run : In(RunLayout(config))
    start : In(1)
        Begin a run (strobe, while idle).  ``fresh``: the array has not exchanged since
        reset (its reset exchange still needs rows).
    done : Out(1)
        High while idle.
    fill : Out(stream.Signature(fill_shape))
    rd, rsp : the read client (C or Bias words).
    """

    def __init__(self, config: CubeConfig, fill_shape, slots: int):
        self.config = config
        self.slots = slots
        super().__init__({
            "run": In(RunLayout(config)),
            "start": In(1), "fresh": In(1), "done": Out(1),
            "fill": Out(stream.Signature(fill_shape)),
            "rd": Out(stream.Signature(ReadReqLayout(config))),
            "rsp": In(ReadRspLayout),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, run = self.config, self.run
        rows, cols, slots = cfg.rows, cfg.cols, self.slots
        aw = word_addr_width(cfg)

        # Two stages, so that no path runs from the walk through the address arithmetic
        # into the read client and the fill handshake: the position stage (row ``i``,
        # slot ``s``, the slot's block) computes the next row's words into one of two
        # offer registers (``offer<b>_*``, filled and offered in turn), which wait for
        # their words and for the array.  With two of them the position stage loads when
        # the next one is free, which does not depend on this cycle's hits.
        i = Signal(range(max(2, rows)))
        s = Signal(range(max(2, slots)))
        zero_sets = Signal(2)
        col_outer = Signal()
        space = Signal.like(run.c.space)
        blk_r, blk_c = Signal(16), Signal(16)      # the block of slot s of this group
        grp_r, grp_c = Signal(16), Signal(16)      # the block of slot 0 of this group
        # Kept beside them: whether they exist and their next block positions (r + R,
        # c + C), so that a step has no adder in front of its compares.
        blk_used, grp_used = Signal(), Signal()
        blk_r2, blk_c2 = Signal(16), Signal(16)
        grp_r2, grp_c2 = Signal(16), Signal(16)

        # The walk's single step (the order of cube_run.block_walker, one block a cycle).
        # Whether the inner index wraps after the block is kept beside it too (``wrap``,
        # ``grp_wrap``), computed when the block is loaded.
        wrap, grp_wrap = Signal(), Signal()
        step_r = Mux(col_outer, ~wrap, wrap)
        reset_r, reset_c = col_outer & wrap, ~col_outer & wrap
        next_r = Mux(reset_r, 0, Mux(step_r, blk_r2, blk_r))
        next_c = Mux(reset_c, 0, Mux(~step_r, blk_c2, blk_c))
        next_r2 = Mux(reset_r, rows, Mux(step_r, blk_r2 + rows, blk_r2))[:16]
        next_c2 = Mux(reset_c, cols, Mux(~step_r, blk_c2 + cols, blk_c2))[:16]
        # next_r2 >= M case by case, without the adder in front of the compare: r2 + R >= M
        # is r2 >= M - R (``m_less``, set with the run), likewise for the columns.
        m_less, n_less = Signal(signed(17)), Signal(signed(17))
        next_wrap = Mux(col_outer,
                        Mux(reset_r, rows >= run.m,
                            Mux(step_r, blk_r2 >= m_less, blk_r2 >= run.m)),
                        Mux(reset_c, cols >= run.n,
                            Mux(~step_r, blk_c2 >= n_less, blk_c2 >= run.n)))
        # The next block exists: the outer index stepped (wrap) or not, and only it decides.
        next_used = Mux(col_outer, Mux(wrap, blk_c2 < run.n, blk_c < run.n),
                        Mux(wrap, blk_r2 < run.m, blk_r < run.m))

        # Where the position stage is in its row set, kept in registers beside ``i`` and
        # ``s`` (set at each load for the next position), so that the state machine and
        # the loads decide from flags, not from compares of the counters.
        row_end = Signal()                          # s = L - 1
        i_last = Signal()                           # i = R - 1
        # In RESET, REAL or ZEROS (``in_rows``), in REAL (``in_real``): flip-flops set with
        # the state, so that the loads and the counters decide without a state decode.
        in_rows, in_real = Signal(), Signal()
        # A group whose slot 0 has no block is the one after the last: "i = s = 0 and the
        # block is unused", a flip-flop set with the position and the block.
        past_last = Signal()
        real = in_real & ~past_last
        has = in_rows & ~(in_real & past_last)     # the position stage holds a row
        load = Signal()
        wp = Signal()                              # the offer register the next row goes to
        rp = Signal()                              # the offer register on offer
        offer_valid = [Signal(name=f"offer{b}_valid") for b in range(2)]
        # A lane's need is cleared when its row is taken (the lane asks only while needed).
        offer_need = [[Signal(name=f"offer{b}_need{j}") for j in range(cols)] for b in range(2)]
        offer_addr = [[Signal(aw, name=f"offer{b}_addr{j}") for j in range(cols)]
                      for b in range(2)]
        offer_off = [[Signal(6, name=f"offer{b}_off{j}") for j in range(cols)]
                     for b in range(2)]
        # Whether each lane of the row on offer holds its word, registered (``hit<j>``):
        # the lanes' address compares reach a flip-flop each, not the take and the
        # enables behind it.  They are a cycle late, which is safe: while a row is on
        # offer a lane's word stays once held (a held word a lane needs is not replaced),
        # so a hit stays a hit until the row is taken.  They are computed only for a row
        # on offer, and the cycle after a take (``took``) they belong to the row taken.
        # A row that reads nothing (``offer<b>_none``: zeros, or a form without C or
        # integer Bias) does not wait for them.
        lane_hit = [Signal(name=f"hit{j}") for j in range(cols)]
        took = Signal()
        hit = Cat(*lane_hit).all() & ~took
        none = [Signal(name=f"offer{b}_none") for b in range(2)]
        # Rows leave through two registers in a ring, so that the lanes' compares do not
        # reach into the array: the row on offer is loaded into every empty one, and is
        # taken when the one at the ring's tail is empty.  Each register's wide enable is
        # then its own valid flip-flop; the array's late ``ready`` reaches only the valid
        # bits and the head (decision 39).
        out_valid = [Signal(name=f"out{k}_valid") for k in range(2)]
        outs = [Signal.like(self.fill.payload, name=f"out{k}") for k in range(2)]
        out_head, out_tail = Signal(), Signal()
        row = Signal.like(self.fill.payload, name="row")
        m.d.comb += [self.fill.valid.eq(Mux(out_head, out_valid[1], out_valid[0])),
                     self.fill.payload.eq(Mux(out_head, outs[1], outs[0]))]
        # Whether the register at the tail is empty, kept as a flip-flop of its own.
        room = Signal(init=1)
        on_offer = Mux(rp, offer_valid[1], offer_valid[0])
        taken = Mux(rp, offer_valid[1] & (hit | none[1]),
                    offer_valid[0] & (hit | none[0])) & room
        leaving = self.fill.valid & self.fill.ready
        # A row enters only an empty register and only a full one leaves, so the two
        # never meet in one register.
        valid_next = [(out_valid[k] | (taken & (out_tail == k))) & ~(leaving & (out_head == k))
                      for k in range(2)]
        m.d.sync += [out_valid[k].eq(valid_next[k]) for k in range(2)]
        m.d.sync += room.eq(~Mux(out_tail ^ taken, valid_next[1], valid_next[0]))
        # Each register's enable is a copy of ``~out_valid`` per column (issue #9).
        for k in range(2):
            out_open = register_copies(m, ~valid_next[k], cols, f"out{k}_open", init=1)
            for j in range(cols):
                with m.If(out_open[j]):
                    m.d.sync += outs[k].data[j].eq(row.data[j])
        with m.If(taken):
            m.d.sync += out_tail.eq(~out_tail)
        with m.If(leaving):
            m.d.sync += out_head.eq(~out_head)
        # The row and column of the block's element (i, j): ORs on a power-of-two array, not
        # adders in front of the address adder (decision 53).
        gi = in_block(blk_r, i, rows)
        for j in range(cols):
            gj = in_block(blk_c, j, cols)
            inside = real & blk_used & (gi < run.m) & (gj < run.n)
            c_addr, c_off = word_and_offset(run.c.base, cube_m_bits(run.m32, 5, gi, gj), aw)
            b_addr, b_off = word_and_offset(run.bias.base, gj << 5, aw)
            for b in range(2):
                with m.If(load & (wp == b)):
                    m.d.sync += [offer_need[b][j].eq(inside & (run.acc | run.int_bias)),
                                 offer_addr[b][j].eq(Mux(run.acc, c_addr, b_addr)),
                                 offer_off[b][j].eq(Mux(run.acc, c_off, b_off))]
                with m.If(taken & (rp == b)):
                    m.d.sync += offer_need[b][j].eq(0)
        lanes, offsets = [], []
        for j in range(cols):
            need = Mux(rp, offer_need[1][j], offer_need[0][j])
            lanes.append((need, space, Mux(rp, offer_addr[1][j], offer_addr[0][j])))
            offsets.append((need, Mux(rp, offer_off[1][j], offer_off[0][j])))
        cache = lane_cache(m, "fill", lanes, self.rd, self.rsp, self.start)
        words, hits = cache.words, cache.hits
        m.d.sync += [h.eq(lane & on_offer) for h, lane in zip(lane_hit, hits)]
        m.d.sync += took.eq(taken)
        for j, (word, (need, off)) in enumerate(zip(words, offsets)):
            m.d.comb += row.data[j].eq(Mux(need, extract(word, off, 5, 32), 0))

        # A load and a take never meet in one register (one is free, the other full).
        m.d.comb += load.eq(has & ~Mux(wp, offer_valid[1], offer_valid[0]))
        for b in range(2):
            with m.If(load & (wp == b)):
                m.d.sync += [offer_valid[b].eq(1),
                             none[b].eq(~real | ~blk_used | ~(run.acc | run.int_bias))]
            with m.If(taken & (rp == b)):
                m.d.sync += offer_valid[b].eq(0)
        with m.If(load):
            m.d.sync += wp.eq(~wp)
        with m.If(taken):
            m.d.sync += rp.eq(~rp)

        set_end = row_end & i_last
        with m.If(load):
            m.d.sync += [s.eq(Mux(row_end, 0, s + 1)),
                         row_end.eq(Mux(row_end, slots == 1, s + 1 == slots - 1)),
                         past_last.eq(set_end & ~Mux(real, next_used, blk_used))]
            with m.If(row_end):
                m.d.sync += [i.eq(Mux(i_last, 0, i + 1)),
                             i_last.eq(Mux(i_last, rows == 1, i + 1 == rows - 1))]
            with m.If(real):
                # The next slot's block; a new row starts again from slot 0's, a new group
                # from the block after the last slot's.
                with m.If(~row_end | set_end):
                    m.d.sync += [blk_r.eq(next_r), blk_c.eq(next_c), blk_used.eq(next_used),
                                 blk_r2.eq(next_r2), blk_c2.eq(next_c2), wrap.eq(next_wrap)]
                with m.Else():
                    m.d.sync += [blk_r.eq(grp_r), blk_c.eq(grp_c), blk_used.eq(grp_used),
                                 blk_r2.eq(grp_r2), blk_c2.eq(grp_c2), wrap.eq(grp_wrap)]
                with m.If(set_end):
                    m.d.sync += [grp_r.eq(next_r), grp_c.eq(next_c), grp_used.eq(next_used),
                                 grp_r2.eq(next_r2), grp_c2.eq(next_c2),
                                 grp_wrap.eq(next_wrap)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.start):
                    m.d.sync += [i.eq(0), s.eq(0), row_end.eq(slots == 1), i_last.eq(rows == 1),
                                 zero_sets.eq(2), blk_r.eq(0), blk_c.eq(0),
                                 grp_r.eq(0), grp_c.eq(0), blk_r2.eq(rows), blk_c2.eq(cols),
                                 grp_r2.eq(rows), grp_c2.eq(cols)]
                    m.next = "START"
            with m.State("START"):
                outer = column_outer(cols, run.m, run.n)
                first_used = Mux(outer, run.n != 0, run.m != 0)
                first_wrap = Mux(outer, rows >= run.m, cols >= run.n)
                m.d.sync += [m_less.eq(run.m - rows), n_less.eq(run.n - cols)]
                m.d.sync += [col_outer.eq(outer), blk_used.eq(first_used),
                             past_last.eq(~first_used),
                             grp_used.eq(first_used), wrap.eq(first_wrap), grp_wrap.eq(first_wrap),
                             space.eq(Mux(run.acc, run.c.space, run.bias.space))]
                m.d.sync += [in_rows.eq(1), in_real.eq(~self.fresh)]
                with m.If(self.fresh):
                    m.next = "RESET"
                with m.Else():
                    m.next = "REAL"
            with m.State("RESET"):
                with m.If(load & set_end):
                    m.d.sync += in_real.eq(1)
                    m.next = "REAL"
            with m.State("REAL"):
                with m.If(past_last):
                    m.d.sync += in_real.eq(0)
                    m.next = "ZEROS"
            with m.State("ZEROS"):
                with m.If(load & set_end):
                    m.d.sync += zero_sets.eq(zero_sets - 1)
                    with m.If(zero_sets == 1):
                        m.d.sync += in_rows.eq(0)
                        m.next = "FLUSH"
            with m.State("FLUSH"):
                with m.If(~offer_valid[0] & ~offer_valid[1] & ~out_valid[0] & ~out_valid[1]):
                    m.next = "IDLE"
        return m
