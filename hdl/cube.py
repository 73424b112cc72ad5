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
beats reach the array through a head and a skid register, drained rows reach the result
path through a FIFO.
``docs/hdl-cube.md`` describes the schedule and the figures.
"""

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from ..model.faults import FaultClass
from ..model.layout import Layout
from .cell_address import log2_bits, log2_of_power
from .config import CubeConfig
from .cube_run import RunLayout
from .fill_source import FillSource
from .logic import KEEP, register_copies
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
        # otherwise; the idle one offers nothing.  Beats reach the array through a head
        # register with a skid register behind it (decision C26): the array decides from a
        # beat in flip-flops, and the feeds see a ready from one (the skid is free), so
        # that the array's acceptance does not reach the enables of the feeds' pipelines.
        buffered = Signal()                 # registered beside the run context
        usable = Signal()                   # what ``buffered`` loads
        beat_shape = array.feed.payload.shape()
        head, skid = Signal(beat_shape, name="beat_head"), Signal(beat_shape, name="beat_skid")
        head_valid, skid_valid = Signal(), Signal()
        in_beat = beat_shape(Mux(buffered, panels.feed.payload.as_value(),
                                 feed.feed.payload.as_value()))
        in_take = Mux(buffered, panels.feed.valid, feed.feed.valid) & ~skid_valid
        # The buffered feed's ready (``buffered & ~skid_valid``) is a flip-flop of its own,
        # loaded with the value it will have: it is the enable of that feed's output
        # stages, about 2,000 register and block-RAM inputs (decision 30), split among
        # copies, one per output lane (issue #9).
        head_free = ~head_valid | array.feed.ready
        skid_next = Mux(head_free, 0, skid_valid | in_take)
        panels_go = register_copies(m, usable & ~skid_next, len(panels.go), "panels_go")
        m.d.comb += [
            array.feed.valid.eq(head_valid), array.feed.payload.eq(head),
            panels.go.eq(Cat(*panels_go)), panels.feed.ready.eq(panels_go[-1]),
            feed.feed.ready.eq(~buffered & ~skid_valid),
        ]
        m.d.sync += skid_valid.eq(skid_next)
        with m.If(head_free):
            m.d.sync += head_valid.eq(skid_valid | in_take)
        # An empty skid copies the offered beat in every cycle: its enable is a flip-flop,
        # not the handshake.  That flip-flop and the head's choice between skid and offer
        # reach the ~540 data registers as copies of ``skid_valid``, one per A and B lane
        # and one for the rest, each near its lane (issue #9).
        skid_full = register_copies(m, skid_next, cfg.rows + cfg.cols + 1, "skid_full")
        lanes = [(head.a[i], skid.a[i], in_beat.a[i]) for i in range(cfg.rows)]
        lanes += [(head.b[j], skid.b[j], in_beat.b[j]) for j in range(cfg.cols)]
        rest = [name for name, _ in beat_shape if name not in ("a", "b")]
        lanes.append(tuple(Cat(*(Value.cast(beat[n]) for n in rest))
                           for beat in (head, skid, in_beat)))
        for full, (to_head, to_skid, offered) in zip(skid_full, lanes):
            with m.If(head_free):
                m.d.sync += to_head.eq(Mux(full, to_skid, offered))
            with m.If(~full):
                m.d.sync += to_skid.eq(offered)
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
        # Whether the roles from ``role`` on are present (``role``'s in bit 0) and whether
        # ``role`` is past the last, stepped with it, so that the walk decides from
        # flip-flops rather than through a multiplexer of the plan (decision 30).
        presence = Cat(*(plan.operands[r.value].present for r in _ROLES))
        present_left, roles_done = Signal(len(_ROLES)), Signal()
        present = present_left[0]

        def first_role():
            return [role.eq(0), present_left.eq(presence), roles_done.eq(0)]

        def next_role():
            return [role.eq(role + 1), present_left.eq(present_left >> 1),
                    roles_done.eq(role == len(_ROLES) - 1)]
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

        # Every unit idle and no beat or drained row left, registered: the units' done
        # flags drop in the cycle after ``run_start`` and, once all high, stay high until
        # the next one, so the flag may be a cycle late (not set from ``SETTLE``).
        finished = Signal()
        m.d.sync += finished.eq(feed.done & panels.done & fill.done & result.done
                                & reads.idle & ~drained.r_rdy & ~head_valid & ~skid_valid
                                & ~run_start)
        # The PE after this one, registered: ``pe`` holds still from the descriptor walk on.
        found, following = Signal(), Signal.like(pe)
        after_found, after_pe = next_pe_after(pe)
        m.d.sync += [found.eq(after_found), following.eq(after_pe)]
        with m.FSM():
            with m.State("IDLE"):
                # The walk's start is loaded in every idle cycle (the plan is valid with
                # ``start``), so that ``start``, from the top level's state, reaches only
                # the state, not the enables of ``pe`` and the walk.
                _, first = next_pe_after(-1)
                m.d.sync += [pe.eq(first), *first_role()]
                with m.If(self.start):
                    m.d.comb += result.clear.eq(1)
                    m.next = "DESC"
            with m.State("DESC"):
                m.d.comb += self.busy.eq(1)
                with m.If(roles_done):
                    m.next = "SETTLE"
                with m.Elif(~present):
                    m.d.sync += next_role()
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
                    m.d.sync += next_role()
                    m.next = "DESC"
            with m.State("SETTLE"):
                # The run context register now holds this PE's descriptors.
                m.d.comb += [self.busy.eq(1), run_start.eq(1)]
                m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                with m.If(finished):
                    m.d.sync += fresh.eq(0)
                    with m.If(found):
                        m.d.sync += [pe.eq(following), *first_role()]
                        m.next = "DESC"
                    with m.Else():
                        m.d.comb += [self.done.eq(1), self.commit.eq(1)]
                        m.next = "IDLE"
        m.d.comb += [self.fault.eq(FaultClass.NONE), self.flags.eq(result.flags)]

        # ------------------------------------------------------------------
        # The run context of the current PE
        # ------------------------------------------------------------------
        # Registered (decision C19): every unit of the run sees it straight from flip-flops,
        # not through the type decoders, the descriptor muxes and the K-repeat adder.  The
        # part that comes from the plan and ``pe`` passes one more register (``pre``, and
        # the K-repeat's shift and rounded K before it, decisions C26, C33): both hold
        # still for the whole descriptor walk, at least ten cycles before ``SETTLE``.
        # Each unit has a copy of its own, loaded alike (decision 52): one register read by
        # all four spread its bits across the device (in the 8 x 8 unit's netlist more long
        # paths began at it than at any other signal but two).
        pre = Signal(RunLayout(cfg), name="run_pre")
        runs = {name: Signal(RunLayout(cfg), name=f"run_{name}", attrs=KEEP)
                for name in ("fill", "result", "feed", "panels")}
        m.d.sync += [run.eq(pre) for run in runs.values()]
        form = plan.op[0:2]
        is_float = plan.acc_type == int(DataType.FP32)
        b_log2w = log2_bits(m, plan.b_type, "b_log2w")
        cr_log2 = Signal(3)
        k_round = Signal(len(plan.k) + 1)
        m.d.sync += [cr_log2.eq(7 - b_log2w), k_round.eq(plan.k + (1 << cr_log2) - 1)]
        geometry = plan.d_geometry[pe]
        m.d.sync += [
            pre.space.as_value().eq(pe), pre.m.eq(plan.m), pre.n.eq(plan.n), pre.k.eq(plan.k),
            pre.a_type.eq(plan.a_type), pre.b_type.eq(plan.b_type),
            pre.acc_type.eq(plan.acc_type),
            pre.a_log2w.eq(log2_bits(m, plan.a_type, "a_log2w")), pre.b_log2w.eq(b_log2w),
            pre.d_log2w.eq(log2_bits(m, plan.d_type, "d_log2w")),
            pre.b_k_repeat.eq(k_round >> cr_log2),
            pre.m32.eq(geometry.layout == Layout.CUBE_M32.value),
            pre.a_shared.eq(plan.operands[OperandRole.A.value].shared),
            pre.b_shared.eq(plan.operands[OperandRole.B.value].shared),
            pre.trans_a.eq(plan.trans_a), pre.trans_b.eq(plan.trans_b),
            pre.a_scaled.eq(plan.a_scaled), pre.b_scaled.eq(plan.b_scaled),
            pre.acc.eq(form == 2), pre.int_bias.eq((form == 1) & ~is_float),
            pre.float_bias.eq((form == 1) & is_float),
            pre.d_cells.eq(geometry.cells),
        ]
        for index, (r, name) in enumerate(zip(_ROLES, ("c", "a", "a_scale", "b", "b_scale",
                                                       "bias", "rowmax_in", "quant",
                                                       "alpha"))):
            m.d.sync += getattr(pre, name).space.as_value().eq(
                Mux(plan.operands[r.value].shared, MemSpace.SHARED.value, pe))
            # The descriptors' fields come straight from their registers.
            for run in runs.values():
                m.d.sync += [getattr(run, name).base.eq(bases[index]),
                             getattr(run, name).log2p.eq(log2ps[index])]
        outputs = self.out_base[pe]
        group_entry = 1 + plan.row_max
        # GroupMaxOut's row length, picked from the plan's outputs a register ahead of its
        # log2 (the plan holds still for the walk): no entry multiplexer in front of the
        # decode (issue #9).
        gm_cols = Signal(len(plan.outputs[0].phys_cols))
        m.d.sync += gm_cols.eq(plan.outputs[group_entry].phys_cols)
        m.d.sync += [
            pre.d.space.as_value().eq(pe), pre.d.base.eq(outputs[0]),
            pre.row_max.space.as_value().eq(pe), pre.row_max.base.eq(outputs[1]),
            pre.row_max.log2p.eq(log2_of_power(m, plan.outputs[1].phys_cols, "rm_log2p")),
            pre.group_max.space.as_value().eq(pe), pre.group_max.base.eq(outputs[group_entry]),
            pre.group_max.log2p.eq(log2_of_power(m, gm_cols, "gm_log2p")),
        ]
        m.d.comb += usable.eq(panel_feed_usable(pre))
        m.d.sync += buffered.eq(usable)
        for unit in (fill, result):
            m.d.comb += unit.start.eq(run_start)
        m.d.comb += [fill.run.eq(runs["fill"]), result.run.eq(runs["result"]),
                     feed.run.eq(runs["feed"]), feed.start.eq(run_start & ~buffered),
                     panels.run.eq(runs["panels"]), panels.start.eq(run_start & buffered)]
        m.d.comb += [fill.fresh.eq(fresh), result.fresh.eq(fresh),
                     result.plan.eq(plan), result.rmode.eq(self.rmode),
                     result.sat.eq(self.sat)]
        return m
