"""The CUBE execution engine: runs an approved Matrix plan over the tile store.

:class:`CubeEngine` takes the plan the preflight approved (:class:`~ptocube.hdl.tile_desc.
PlanLayout`) and, for each PE the mask selects (PE0 first, the model's order), computes
``D = [C +] A x B [+ Bias]`` with B.FPATR post-processing and writes D, RowMaxOut and
GroupMaxOut into the output registers the top level allocated (``out_base``), through the
tile store's write port.  Those writes are the staging of the spec's atomic publication:
the top level publishes descriptors, definedness and flags on ``commit``.

Per PE the engine reads the descriptors of the plan's operands (base CELL, physical
columns), derives the run context (:class:`~ptocube.hdl.cube_run.RunLayout`) and runs
three units around the :class:`~ptocube.hdl.systolic.SystolicArray` at once:

* :class:`~ptocube.hdl.panel_feed.PanelFeed` - beats from A and B buffers filled once per
  PE, for Local A and B; :class:`~ptocube.hdl.operand_feed.OperandFeed` - the lane path
  (A, B, scale and Bias elements) for the other runs, or
  :class:`~ptocube.hdl.serial_feed.SerialFeed`, the same one lane at a time
  (``CubeConfig.serial_lane_feed``);
* :class:`~ptocube.hdl.fill_source.FillSource` - initial accumulator rows (C, or Bias for
  integer BIAS forms);
* :class:`~ptocube.hdl.result_path.ResultPath` - drained rows through post-processing and
  the reductions into output words;

sharing the store's one read port through a :class:`~ptocube.hdl.read_arbiter.ReadArbiter`;
drained rows reach the result path through a FIFO.
``docs/hdl-cube.md`` describes the schedule and the figures.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from ..model.faults import FaultClass
from ..model.layout import Layout
from .cell_address import log2_bits, log2_of_power
from .config import CubeConfig
from .cube_run import RunLayout
from .fill_source import FillSource
from .operand_feed import OperandFeed
from .panel_feed import PanelFeed, panel_feed_usable
from .serial_feed import SerialFeed
from .read_arbiter import ReadArbiter
from .result_path import ResultPath
from .systolic import SystolicArray
from .tile_desc import OperandRole, PlanLayout
from .tile_port import MemSpace, TilePortSignature, cell_addr_width

__all__ = ["CubeEngine"]

#: The operands whose descriptors a run needs, in OperandRole order.
_ROLES = (OperandRole.C, OperandRole.A, OperandRole.A_SCALE, OperandRole.B,
          OperandRole.B_SCALE, OperandRole.BIAS, OperandRole.ROWMAX_IN,
          OperandRole.QUANT_VECTOR, OperandRole.ALPHA_VECTOR)


class CubeEngine(wiring.Component):
    """Execution of an approved Matrix plan, PE by PE.

    Parameters
    ----------
    config : CubeConfig
        Array size, type classes and memory sizes.
    slots : int or None
        The array's interleaved chains per PE (default: the minimum that hides the MAC
        latency); a larger value reproduces another build's schedule (benchmarks).

    Members
    -------
    tile : Out(TilePortSignature(config))
        Descriptor lookups, payload reads and the staging writes.
    plan : In(PlanLayout(config))
        Held stable from ``start`` until ``done``.
    out_base : In(ArrayLayout(ArrayLayout(cell_addr_width, 3), 4))
        Per PE and per plan output entry (``plan.outputs`` order), the CELL address of the
        newly allocated output register; held like ``plan``.
    rmode, sat : In(3), In(1)
        The bundle's B.DATR RMode and Sat (0 without B.DATR).  ``PlanLayout`` does not carry
        them; held like ``plan``.
    start : In(1)
        Strobe, only while idle.
    busy : Out(1)
    done : Out(1)
        One-cycle strobe when every output word is written.
    commit : Out(1)
        With ``done``: publish (always: execution of an approved plan cannot fault).
    fault : Out(FaultClass)
        Tied to NONE (see ``docs/decisions/hdl-cube.md``).
    flags : Out(5)
        NV DZ OF UF NX raised by the group (``convert.Flag`` bit order), valid with ``done``.
    """

    def __init__(self, config: CubeConfig, slots: int | None = None):
        if not isinstance(config, CubeConfig):
            raise TypeError(f"config must be a CubeConfig, not {config!r}")
        self.config = config
        self.array = SystolicArray(config, slots)
        super().__init__({
            "tile": Out(TilePortSignature(config)),
            "plan": In(PlanLayout(config)),
            "out_base": In(data.ArrayLayout(data.ArrayLayout(cell_addr_width(config), 3), 4)),
            "rmode": In(3), "sat": In(1),
            "start": In(1), "busy": Out(1), "done": Out(1), "commit": Out(1),
            "fault": Out(FaultClass), "flags": Out(5),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, plan = self.config, self.plan
        array = m.submodules.array = self.array
        slots = array.slots
        lane_feed = SerialFeed if cfg.serial_lane_feed else OperandFeed
        m.submodules.feed = feed = lane_feed(cfg, array.feed.payload.shape(), slots,
                                             array.numeric.has_scale)
        m.submodules.panels = panels = PanelFeed(cfg, array.feed.payload.shape(), slots,
                                                 array.numeric.has_scale)
        m.submodules.fill = fill = FillSource(cfg, array.fill.payload.shape(), slots)
        m.submodules.result = result = ResultPath(cfg, array.drain.payload.shape(), slots)
        m.submodules.reads = reads = ReadArbiter(cfg, 4)
        # A run uses the buffered feed when it can (Local A and B) and the lane feed
        # otherwise; the idle one offers nothing.
        buffered = Signal()
        m.d.comb += [
            array.feed.valid.eq(Mux(buffered, panels.feed.valid, feed.feed.valid)),
            array.feed.payload.eq(Mux(buffered, panels.feed.payload.as_value(),
                                      feed.feed.payload.as_value())),
            panels.feed.ready.eq(buffered & array.feed.ready),
            feed.feed.ready.eq(~buffered & array.feed.ready),
        ]
        wiring.connect(m, fill.fill, array.fill)
        # Drained rows wait in a FIFO (4 groups' worth), so that the array's exchanges go on
        # while the result path is still writing D's zero prefill at the start of a run.
        drain_width = len(array.drain.payload.as_value())
        m.submodules.drained = drained = fifo.SyncFIFOBuffered(
            width=drain_width, depth=4 * cfg.rows * slots)
        m.d.comb += [
            drained.w_data.eq(array.drain.payload.as_value()),
            drained.w_en.eq(array.drain.valid), array.drain.ready.eq(drained.w_rdy),
            result.drain.valid.eq(drained.r_rdy),
            result.drain.payload.as_value().eq(drained.r_data),
            drained.r_en.eq(result.drain.ready),
        ]
        for index, client in enumerate((fill, result, panels, feed)):
            wiring.connect(m, client.rd, reads.req[index])
            m.d.comb += client.rsp.eq(reads.rsp[index])
        wiring.connect(m, reads.mem_req, wiring.flipped(self.tile.mem_req))
        wiring.connect(m, wiring.flipped(self.tile.mem_rsp), reads.mem_rsp)
        wiring.connect(m, result.wr, wiring.flipped(self.tile.mem_wr))

        # ------------------------------------------------------------------
        # PE loop and descriptor lookups
        # ------------------------------------------------------------------
        pe = Signal(2)
        role = Signal(range(len(_ROLES) + 1))
        bases = [Signal(cell_addr_width(cfg), name=f"{r.name.lower()}_base") for r in _ROLES]
        log2ps = [Signal(4, name=f"{r.name.lower()}_log2p") for r in _ROLES]
        fresh = Signal(init=1)
        run_start = Signal()

        operand = plan.operands[role]
        present = Signal()
        with m.Switch(role):
            for index, r in enumerate(_ROLES):
                with m.Case(index):
                    m.d.comb += present.eq(plan.operands[r.value].present)
        rsp = self.tile.desc_rsp
        m.d.comb += [self.tile.desc_req.payload.space.as_value().eq(
                         Mux(operand.shared, MemSpace.SHARED.value, pe)),
                     self.tile.desc_req.payload.index.eq(operand.index)]
        rsp_log2p = log2_of_power(m, rsp.payload.phys_cols, "rsp_log2p")

        mask_bit = [plan.pe_mask[3 - p] for p in range(4)]

        def next_pe_after(p):
            """Selected PE after ``p`` (PE0 first), and whether there is one."""
            found, value = 0, 0
            for q in reversed(range(4)):
                hit = (q > p) & mask_bit[q]
                value = Mux(hit, q, value)
                found = found | hit
            return found, value

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += result.clear.eq(1)
                    found, first = next_pe_after(-1)
                    m.d.sync += [pe.eq(first), role.eq(0)]
                    m.next = "DESC"
            with m.State("DESC"):
                m.d.comb += self.busy.eq(1)
                with m.If(role == len(_ROLES)):
                    m.next = "SETTLE"
                with m.Elif(~present):
                    m.d.sync += role.eq(role + 1)
                with m.Else():
                    m.d.comb += self.tile.desc_req.valid.eq(1)
                    with m.If(self.tile.desc_req.ready):
                        m.next = "DESC_WAIT"
            with m.State("DESC_WAIT"):
                m.d.comb += [self.busy.eq(1), rsp.ready.eq(1)]
                with m.If(rsp.valid):
                    for index in range(len(_ROLES)):
                        with m.If(role == index):
                            m.d.sync += [bases[index].eq(rsp.payload.base),
                                         log2ps[index].eq(rsp_log2p)]
                    m.d.sync += role.eq(role + 1)
                    m.next = "DESC"
            with m.State("SETTLE"):
                # The run context register now holds this PE's descriptors.
                m.d.comb += [self.busy.eq(1), run_start.eq(1)]
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                with m.If(feed.done & panels.done & fill.done & result.done & reads.idle
                          & ~drained.r_rdy & ~run_start):
                    m.d.sync += fresh.eq(0)
                    found, following = next_pe_after(pe)
                    with m.If(found):
                        m.d.sync += [pe.eq(following), role.eq(0)]
                        m.next = "DESC"
                    with m.Else():
                        m.d.comb += [self.done.eq(1), self.commit.eq(1)]
                        m.next = "IDLE"
        m.d.comb += [self.fault.eq(FaultClass.NONE), self.flags.eq(result.flags)]

        # ------------------------------------------------------------------
        # The run context of the current PE
        # ------------------------------------------------------------------
        # Registered (decision C19): every unit of the run sees it straight from flip-flops,
        # not through the type decoders, the descriptor muxes and the K-repeat adder.
        ctx, run = Signal(RunLayout(cfg)), Signal(RunLayout(cfg))
        m.d.sync += run.eq(ctx)
        form = plan.op[0:2]
        is_float = plan.acc_type == int(DataType.FP32)
        b_log2w = log2_bits(m, plan.b_type, "b_log2w")
        cr_log2 = (7 - b_log2w)[:3]
        geometry = plan.d_geometry[pe]
        m.d.comb += [
            ctx.space.as_value().eq(pe), ctx.m.eq(plan.m), ctx.n.eq(plan.n), ctx.k.eq(plan.k),
            ctx.a_type.eq(plan.a_type), ctx.b_type.eq(plan.b_type),
            ctx.acc_type.eq(plan.acc_type),
            ctx.a_log2w.eq(log2_bits(m, plan.a_type, "a_log2w")), ctx.b_log2w.eq(b_log2w),
            ctx.d_log2w.eq(log2_bits(m, plan.d_type, "d_log2w")),
            ctx.b_k_repeat.eq((plan.k + (1 << cr_log2) - 1) >> cr_log2),
            ctx.m32.eq(geometry.layout == Layout.CUBE_M32.value),
            ctx.a_shared.eq(plan.operands[OperandRole.A.value].shared),
            ctx.b_shared.eq(plan.operands[OperandRole.B.value].shared),
            ctx.trans_a.eq(plan.trans_a), ctx.trans_b.eq(plan.trans_b),
            ctx.a_scaled.eq(plan.a_scaled), ctx.b_scaled.eq(plan.b_scaled),
            ctx.acc.eq(form == 2), ctx.int_bias.eq((form == 1) & ~is_float),
            ctx.float_bias.eq((form == 1) & is_float),
            ctx.d_cells.eq(geometry.cells),
        ]
        for index, (r, name) in enumerate(zip(_ROLES, ("c", "a", "a_scale", "b", "b_scale",
                                                       "bias", "rowmax_in", "quant",
                                                       "alpha"))):
            info = getattr(ctx, name)
            m.d.comb += [info.space.as_value().eq(Mux(plan.operands[r.value].shared,
                                                     MemSpace.SHARED.value, pe)),
                         info.base.eq(bases[index]), info.log2p.eq(log2ps[index])]
        outputs = self.out_base[pe]
        group_entry = 1 + plan.row_max
        m.d.comb += [
            ctx.d.space.as_value().eq(pe), ctx.d.base.eq(outputs[0]),
            ctx.row_max.space.as_value().eq(pe), ctx.row_max.base.eq(outputs[1]),
            ctx.row_max.log2p.eq(log2_of_power(m, plan.outputs[1].phys_cols, "rm_log2p")),
            ctx.group_max.space.as_value().eq(pe), ctx.group_max.base.eq(outputs[group_entry]),
            ctx.group_max.log2p.eq(log2_of_power(m, plan.outputs[group_entry].phys_cols,
                                                 "gm_log2p")),
        ]
        m.d.comb += buffered.eq(panel_feed_usable(run))
        for unit in (fill, result):
            m.d.comb += [unit.run.eq(run), unit.start.eq(run_start)]
        m.d.comb += [feed.run.eq(run), feed.start.eq(run_start & ~buffered),
                     panels.run.eq(run), panels.start.eq(run_start & buffered)]
        m.d.comb += [fill.fresh.eq(fresh), result.fresh.eq(fresh),
                     result.plan.eq(plan), result.rmode.eq(self.rmode),
                     result.sat.eq(self.sat)]
        return m
