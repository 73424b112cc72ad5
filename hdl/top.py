"""The CUBE unit: bundle decoder, legality preflight, engines and tile store in one component.

:class:`CubeUnit` takes instruction parcels (the decoder's ``ParcelBeat`` stream) and host
commands (:mod:`ptocube.hdl.host`), and reports one ``status`` item per bundle::

    parcels ─► BundleDecoder ─► Preflight ─► place ─► engines ─► publish / abort ─► status
                     ▲  GPR         ▲ read ports      │ TilePort / element port
                     └──────────────┴──── TileStore ◄─┘ ◄── host_cmd / host_rsp

A bundle's life (decision T1): the preflight's verdict is taken; a FAULT or NOOP verdict
becomes its status at once.  An APPROVE verdict asks the store to PLACE every output on
every selected PE (first fit; a destination that cannot be placed is Fault_TileAllocation,
decision T4), then runs the engines - the one
:class:`~ptocube.hdl.img2col_engine.Img2ColEngine` for TIMG2COL, one job per selected PE,
PE0 first (decision T10), the CUBE engine (:mod:`ptocube.hdl.cube`, when the build has it)
for Matrix plans - and finally asks the store to PUBLISH (every job committed, and the
preflight's ``commit_enable`` is high) or to ABORT (free the placement).  Only then does the
preflight see ``exec_done`` and take the next record, so nothing can observe a half-published
group.  ``docs/hdl-top.md`` has the timing and figures.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.bundle import Operation
from ..model.faults import FaultClass
from ..model.state import PE_COUNT
from .config import CubeConfig
from .decoder import BundleDecoder, ParcelBeat
from .host import (FM_PARTS, HostCommandLayout, HostResponseLayout, StatusLayout,
                   StatusOutcome)
from .img2col_engine import Img2ColEngine
from .preflight import IMG2COL_JOB_CYCLES, Outcome, Preflight, img2col_job
from .tile_desc import OutputRole
from .tile_store import StoreOp, TileStore

__all__ = ["CubeUnit", "cube_engine_class", "PARCELS_PER_BEAT"]

#: Parcels per beat of the ``parcels`` stream.
PARCELS_PER_BEAT = 2


def cube_engine_class():
    """The CUBE engine class of :mod:`ptocube.hdl.cube`, or None while it does not exist."""
    try:
        from .cube import CubeEngine
    except ImportError:
        return None
    return CubeEngine


class CubeUnit(wiring.Component):
    """The CUBE unit top level.

    Parameters
    ----------
    config : CubeConfig
        The build (array, type classes, memories).
    cube : bool
        Build the CUBE engine (default: when :mod:`ptocube.hdl.cube` is available).  Without
        it an approved Matrix bundle ends as Fault_TileLegality (decision T2).

    Members
    -------
    parcels : In(stream.Signature(ParcelBeat(2)))
        The instruction stream; ``last`` ends a program.
    host_cmd : In(stream.Signature(HostCommandLayout))
    host_rsp : Out(stream.Signature(HostResponseLayout))
        The host port (``docs/hdl-top.md``); commands wait while a bundle is in flight.
    status : Out(stream.Signature(StatusLayout))
        One item per bundle, in program order.
    busy : Out(1)
        A record is on its way out of the decoder, in the preflight or executing, or the
        store serves a host command.  The decoder finishes a record within 9 cycles of its
        boundary parcel while its output is free, so ``busy`` low for 16 cycles after the
        last beat was taken means every bundle of the program has its status.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), *, cube: bool | None = None):
        self.config = config
        engine = cube_engine_class()
        self.has_cube = engine is not None if cube is None else cube
        if self.has_cube and engine is None:
            raise ValueError("this checkout has no CUBE engine (ptocube.hdl.cube)")
        self._cube_class = engine
        super().__init__({
            "parcels": In(stream.Signature(ParcelBeat(PARCELS_PER_BEAT))),
            "host_cmd": In(stream.Signature(HostCommandLayout)),
            "host_rsp": Out(stream.Signature(HostResponseLayout)),
            "status": Out(stream.Signature(StatusLayout)),
            "busy": Out(1),
        })
        # Submodules are created here so a testbench or waveform writer can name them.
        self.decoder = BundleDecoder(config, parcels_per_beat=PARCELS_PER_BEAT)
        self.preflight = Preflight(config)
        self.store = TileStore(config)
        # The store's element port answers five cycles after a request (decisions T26,
        # T39): six reads in flight keep the copy at one element per cycle.
        self.img2col = Img2ColEngine(config, fifo_depth=6)
        self.cube = self._cube_class(config) if self.has_cube else None
        self.phase = Signal(4, name="top_phase")
        #: The PE whose TIMG2COL job the engine runs (or runs next).
        self.img2col_pe = Signal(range(PE_COUNT), name="img2col_pe")

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        dec, pf, st = self.decoder, self.preflight, self.store
        m.submodules.decoder, m.submodules.preflight, m.submodules.store = dec, pf, st
        eng, cur = self.img2col, self.img2col_pe
        m.submodules.img2col = eng

        wiring.connect(m, wiring.flipped(self.parcels), dec.i)
        # A record waits while the store serves a host command (decision T3), and in the
        # cycle the store takes one: the host's window is a register (decision T25).  The
        # take is known from registers (T29): the window open means that the top level was
        # idle with the preflight empty a cycle ago, so it is idle now and asks the store for
        # nothing else, and the store, idle, takes a valid command.
        host_window = Signal(name="host_window")
        host_take = self.host_cmd.valid & host_window & st.idle
        m.d.comb += [pf.record.payload.eq(dec.o.payload),
                     pf.record.valid.eq(dec.o.valid & st.idle & ~host_take),
                     dec.o.ready.eq(pf.record.ready & st.idle & ~host_take)]
        wiring.connect(m, wiring.flipped(self.host_cmd), st.host_cmd)
        wiring.connect(m, st.host_rsp, wiring.flipped(self.host_rsp))
        for name in ("tile_rd", "shared_rd", "word_rd", "gpr_rd", "alloc"):
            wiring.connect(m, getattr(pf, name), getattr(st, name))
        m.d.comb += [st.gpr_index.eq(dec.gpr_index), dec.gpr_value.eq(st.gpr_value),
                     st.plan.eq(pf.plan)]
        # The engine runs one PE's job at a time on the store's element port, which serves
        # the PE whose source the store read last (decisions T10, T15).
        for name in ("src_req", "src_rsp", "dst"):
            wiring.connect(m, getattr(eng, name), getattr(st.i2c, name))
        m.d.comb += st.src_pe.eq(cur)
        job = img2col_job(m, plan=pf.plan, desc=st.src_desc, tile_capacity=st.tile_capacity,
                          config=cfg)
        # The job is offered after the feature map's FM_PARTS parts, FM_PARTS + 1 cycles
        # after ``src_load``; the store's ``src_desc`` follows ``src_load`` two cycles late and
        # the job's source facts follow ``src_desc`` IMG2COL_JOB_CYCLES late (T23).
        assert FM_PARTS + 1 >= 2 + IMG2COL_JOB_CYCLES
        m.d.comb += eng.job.payload.eq(job)
        # The source's feature map goes to the engine one 64-bit part a cycle (T18): the
        # store reads part k + 1 while the engine takes part k (T20).
        fm_part = Signal(range(FM_PARTS + 1), name="img2col_fm_part")   # parts sent
        m.d.comb += [eng.fm.payload.part.eq(fm_part), eng.fm.payload.data.eq(st.src_fm),
                     eng.fm.payload.unset.eq(~st.src_fm_set)]

        plan = pf.plan
        pe_sel = Cat(plan.pe_mask[3], plan.pe_mask[2], plan.pe_mask[1], plan.pe_mask[0])
        is_img2col = plan.op == Operation.TIMG2COL.value

        cube = self.cube
        if cube is not None:
            m.submodules.cube = cube
            wiring.connect(m, cube.tile, st.engine)
            datr = pf.rec.bundle.datr
            m.d.comb += [cube.plan.eq(plan), st.flags.eq(Mux(is_img2col, 0, cube.flags)),
                         cube.rmode.eq(Mux(pf.rec.bundle.datr_valid, datr.rmode, 0)),
                         cube.sat.eq(Mux(pf.rec.bundle.datr_valid, datr.sat, 0))]
            for p in range(PE_COUNT):
                for j in range(3):
                    m.d.comb += cube.out_base[p][j].eq(st.out_base[p][j])

        # Cycles since the current record left the decoder.
        cycles = Signal(32)
        with m.If(dec.o.valid & dec.o.ready):
            m.d.sync += cycles.eq(1)
        with m.Elif(~cycles.all()):
            m.d.sync += cycles.eq(cycles + 1)

        status = Signal(StatusLayout)
        status_valid = Signal()
        m.d.comb += [self.status.payload.eq(status), self.status.valid.eq(status_valid)]
        with m.If(self.status.ready):
            m.d.sync += status_valid.eq(0)

        # A bundle that faults after decode tells the decoder (model D29): if a start ended
        # it, that start opens nothing.  The preflight keeps the record stream stalled until
        # then, as the decoder's squash protocol requires.  The decoder sees the squash a cycle
        # late, from a register (the FSM's decode of the store's answer was the decoder's
        # longest input path, issue #9): the preflight's ``ready`` rises only the cycle after
        # the squash (it is a register set as the verdict is taken or the bundle ends), so the
        # squash still comes at the latest with ``o.ready``, as the protocol requires (T32).
        squash = Signal()
        if "squash" in dec.signature.members:
            squash_q = Signal(name="squash_q")
            m.d.sync += squash_q.eq(squash)
            m.d.comb += dec.squash.eq(squash_q)

        # Outcome of the engines: the first fault ends the bundle.
        first_fault = Signal(FaultClass)
        faulted = Signal()
        # TIMG2COL jobs to run after the current one (PE p = bit p; the jobs run lowest PE
        # first, so each step clears the lowest bit), a register, so that the last job's test
        # and the next PE do not wait for a decode of ``cur`` (T29).  An approved plan
        # selects at least one PE (a zero mask is a no-op record).
        rest = Signal(PE_COUNT, name="img2col_rest")

        def lowest(mask, name):
            pe = Signal(range(PE_COUNT), name=name)
            for p in reversed(range(PE_COUNT)):
                with m.If(mask[p]):
                    m.d.comb += pe.eq(p)
            return pe

        first_pe, next_pe = lowest(pe_sel, "img2col_first_pe"), lowest(rest, "img2col_next_pe")
        boundary = pf.rec.bundle.boundary_index

        def report(outcome, fault=FaultClass.NONE, index=0, published=False):
            outs = [plan.outputs[j] for j in range(3)]
            m.d.sync += [
                status.outcome.eq(outcome), status.fault.eq(fault),
                status.fault_index.eq(index), status.cycles.eq(cycles),
                status.flags.eq(Mux(published, st.flags, 0)),
                status.pe_mask.eq(Mux(published, plan.pe_mask, 0)),
                status.op_valid.eq(pf.rec.fault == 0), status.op.eq(pf.rec.bundle.op),
                status_valid.eq(1),
            ]
            for j, o in enumerate(outs):
                m.d.sync += [status.outputs[j].valid.eq(Mux(published,
                                                            o.role != OutputRole.NONE, 0)),
                             status.outputs[j].index.eq(Mux(published, o.index, 0))]

        m.d.comb += self.busy.eq(pf.busy | dec.o.valid | (self.phase != 0) | ~st.idle
                                 | status_valid)
        # The host may act only when no bundle is anywhere past the decoder.  The window
        # follows the decoder's output one cycle late, so a record that appears in the cycle
        # a host command is taken waits for it (above); after that the record goes first.
        m.d.sync += host_window.eq(~pf.busy & ~dec.o.valid & (self.phase == 0))
        m.d.comb += st.host_enable.eq(host_window)

        with m.FSM(name="top"):
            with m.State("IDLE"):
                m.d.comb += self.phase.eq(0)
                v = pf.verdict.payload
                with m.If(pf.verdict.valid & ~status_valid):
                    m.d.comb += pf.verdict.ready.eq(1)
                    with m.Switch(v.outcome):
                        with m.Case(Outcome.FAULT):
                            m.d.comb += squash.eq(1)
                            report(StatusOutcome.FAULT, v.fault, v.fault_index)
                        with m.Case(Outcome.NOOP):
                            report(StatusOutcome.NOOP)
                        with m.Default():
                            m.next = "PLACE"
            with m.State("PLACE"):
                m.d.comb += [self.phase.eq(1), st.req.eq(StoreOp.PLACE), st.req_valid.eq(1)]
                with m.If(st.req_done):
                    m.d.comb += st.req_valid.eq(0)
                    with m.If(st.req_ok):
                        m.d.sync += faulted.eq(0)
                        with m.If(is_img2col):
                            m.d.sync += [rest.eq(pe_sel & (pe_sel - 1)), cur.eq(first_pe)]
                            m.next = "IMG2COL"
                        with m.Else():
                            m.next = "MATRIX"
                    with m.Else():
                        m.d.comb += [pf.exec_done.eq(1), squash.eq(1)]
                        report(StatusOutcome.FAULT, FaultClass.TILE_ALLOCATION, boundary)
                        m.next = "IDLE"
            with m.State("IMG2COL"):
                # One job per selected PE, PE0 first (decision T10).  The store reads the
                # PE's source and the feature map's first part (one cycle, decision T15),
                # then the engine takes the feature map (FM_PARTS cycles, T18, T20).
                m.d.comb += self.phase.eq(2)
                loaded, started = Signal(), Signal()
                with m.If(~loaded):
                    m.d.comb += [st.src_load.eq(1), st.src_fm_part.eq(0)]
                    m.d.sync += loaded.eq(1)
                with m.Elif(fm_part != FM_PARTS):
                    m.d.comb += [eng.fm.valid.eq(1), st.src_fm_part.eq(fm_part + 1)]
                    with m.If(eng.fm.ready):
                        m.d.comb += st.src_fm_read.eq(fm_part != FM_PARTS - 1)
                        m.d.sync += fm_part.eq(fm_part + 1)
                with m.Elif(~started):
                    m.d.comb += eng.job.valid.eq(1)
                    with m.If(eng.job.ready):
                        m.d.sync += started.eq(1)
                with m.If(eng.done):
                    m.d.sync += [loaded.eq(0), fm_part.eq(0), started.eq(0),
                                 rest.eq(rest & (rest - 1)), cur.eq(next_pe)]
                    # The engine reports only the class, and every PE's class is the model's
                    # (the destination check is PE-independent): the first fault decides,
                    # and the remaining jobs would be discarded anyway.
                    with m.If(~eng.commit):
                        m.d.sync += [first_fault.eq(eng.fault), faulted.eq(1)]
                        m.next = "FINISH"
                    with m.Elif(rest == 0):
                        m.next = "FINISH"
            with m.State("MATRIX"):
                m.d.comb += self.phase.eq(3)
                if cube is None:
                    m.d.sync += [first_fault.eq(FaultClass.TILE_LEGALITY), faulted.eq(1)]
                    m.next = "FINISH"
                else:
                    started = Signal()
                    with m.If(~started):
                        m.d.comb += cube.start.eq(1)
                        m.d.sync += started.eq(1)
                    with m.If(cube.done):
                        m.d.sync += started.eq(0)
                        with m.If(~cube.commit):
                            m.d.sync += [first_fault.eq(cube.fault), faulted.eq(1)]
                        m.next = "FINISH"
            with m.State("FINISH"):
                m.d.comb += self.phase.eq(4)
                publish = ~faulted & pf.commit_enable
                m.d.comb += [st.req.eq(Mux(publish, StoreOp.PUBLISH, StoreOp.ABORT)),
                             st.req_valid.eq(1)]
                m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.phase.eq(5)
                with m.If(st.req_done):
                    m.d.comb += pf.exec_done.eq(1)
                    with m.If(faulted):
                        m.d.comb += squash.eq(1)
                        report(StatusOutcome.FAULT, first_fault, boundary)
                    with m.Else():
                        report(StatusOutcome.SUCCESS, published=True)
                    m.next = "IDLE"
        return m
