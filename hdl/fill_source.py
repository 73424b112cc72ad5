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

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .cell_address import cube_m_bits, extract, word_and_offset
from .config import CubeConfig
from .cube_run import RunLayout, block_walker, select_block
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

        i = Signal(range(max(2, rows)))
        s = Signal(range(max(2, slots)))
        zero_sets = Signal(2)
        step_group = Signal()
        restart = Signal()
        blocks, walk_done = block_walker(m, "fill", rows, cols, slots, run.m, run.n,
                                         restart, step_group)
        row0, col0, used = select_block(m, blocks, s)

        real = Signal()
        gi = row0 + i
        lanes, offsets = [], []
        for j in range(cols):
            gj = col0 + j
            inside = real & used & (gi < run.m) & (gj < run.n)
            c_addr, c_off = word_and_offset(run.c.base, cube_m_bits(run.m32, 5, gi, gj), aw)
            b_addr, b_off = word_and_offset(run.bias.base, gj << 5, aw)
            need = inside & (run.acc | run.int_bias)
            lanes.append((need, Mux(run.acc, run.c.space, run.bias.space),
                          Mux(run.acc, c_addr, b_addr)))
            offsets.append((need, Mux(run.acc, c_off, b_off)))
        all_hit, words = lane_cache(m, "fill", lanes, self.rd, self.rsp, self.start)
        for j, (word, (need, off)) in enumerate(zip(words, offsets)):
            m.d.comb += self.fill.payload.data[j].eq(Mux(need, extract(word, off, 5, 32), 0))

        taken = self.fill.valid & self.fill.ready
        row_done = taken & (s == slots - 1)
        set_done = row_done & (i == rows - 1)
        with m.If(taken):
            m.d.sync += s.eq(Mux(s == slots - 1, 0, s + 1))
            with m.If(s == slots - 1):
                m.d.sync += i.eq(Mux(i == rows - 1, 0, i + 1))

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.done.eq(1)
                with m.If(self.start):
                    m.d.comb += restart.eq(1)
                    m.d.sync += [i.eq(0), s.eq(0), zero_sets.eq(2)]
                    m.next = "START"
            with m.State("START"):
                with m.If(self.fresh):
                    m.next = "RESET"
                with m.Else():
                    m.next = "REAL"
            with m.State("RESET"):
                m.d.comb += self.fill.valid.eq(1)
                with m.If(set_done):
                    m.next = "REAL"
            with m.State("REAL"):
                with m.If(walk_done):
                    m.next = "ZEROS"
                with m.Else():
                    m.d.comb += [real.eq(1), self.fill.valid.eq(all_hit)]
                    m.d.comb += step_group.eq(set_done)
            with m.State("ZEROS"):
                m.d.comb += self.fill.valid.eq(1)
                with m.If(set_done):
                    m.d.sync += zero_sets.eq(zero_sets - 1)
                    with m.If(zero_sets == 1):
                        m.next = "IDLE"
        return m
