"""The TIMG2COL engine: preflight, gather copy and atomic publication for one PE.

:class:`Img2ColEngine` takes one job - the facts the tile store knows about the source and
destination tiles, after the source tile's feature-map descriptor has been loaded into the
engine in 64-bit parts - and either publishes the destination window or reports the first
fault in the golden model's order.  It is the hardware twin of
:func:`ptocube.model.preflight.plan_img2col` from the destination shape check on, followed
by :func:`ptocube.model.img2col.img2col` for one PE.

Phases (``docs/hdl-img2col.md`` has the design notes):

1. **Preflight.**  A short saturating program (:class:`~ptocube.hdl.img2col.SerialProgram`)
   forms C1*C0, P = N*D*C1*H*W*C0, the receptive fields, outH/outW (two serial divisions)
   and the im2col matrix shape; then the checks are evaluated in the model's order and the
   first failing one is reported (:class:`Img2ColCheck`):

   =================  ====================  =================================================
   check              fault                 model
   =================  ====================  =================================================
   DST_SHAPE          Fault_TileAllocation  ``resolve_img2col_destination`` (shape in TSize)
   SRC_DESCRIPTOR     Fault_TileLegality    source is a legal row-major tile
   FEATURE_MAP        Fault_TileLegality    ``check_descriptor``
   OPERAND_TYPES      Fault_TileLegality    ``check_operand_types``
   SRC_LOCATION       Fault_TileLegality    source in Matrix location
   OUTPUT_SHAPE       Fault_TileLegality    ``output_shape`` (outH, outW > 0)
   WINDOW             Fault_TileLegality    ``check_window``
   UNDEFINED          Fault_TileLegality    a referenced real source element is undefined
   =================  ====================  =================================================

2. **Copy.**  The address generator (:class:`~ptocube.hdl.img2col.Img2ColAddressGenerator`)
   walks the window; every real element becomes a source read request (data and definedness
   bit come back together), every padding element takes the descriptor's padding word cut
   to the element width.  Each destination element is written to the *staging* area through
   the destination port, at storage index r*Col + c.  Up to ``fifo_depth`` reads are in
   flight, so the copy sustains one element per cycle with a source latency below
   ``fifo_depth``.
3. **Publication.**  ``done`` pulses once per job.  With it, ``commit`` pulses only if every
   check passed and every element was written: the top level then publishes the staged
   destination (descriptor, payload, definedness of the valid region) in one step.  On a
   fault ``commit`` stays low and the staging area must be discarded - nothing is published.
   A referenced undefined element is found during the copy; the engine stops the walk,
   drains the reads already issued and reports UNDEFINED.

What the engine does not do (the top level's job, before starting it): the B.DATR and
dimension checks, the PE mask, the choice of a free destination register and the core
capacity charge (``plan_img2col`` steps before the destination shape check).  With several
PEs selected, the top level runs one job per PE and publishes all of them only when every
job committed.
"""

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType, TIMG2COL_TYPES
from ..model.faults import FaultClass
from ..model.img2col import FeatureMapLayout
from ..model.layout import Layout
from .config import CubeConfig
from .img2col import (AddressLayout, EXTENT_WIDTH, FEATURE_MAP_DESCRIPTOR, FM_PARTS, DivMod,
                      FeatureMapPartLayout, Img2ColAddressGenerator, MulAdd, SerialProgram,
                      source_index_width)
from .skid_buffer import SkidBuffer

__all__ = ["Img2ColCheck", "CHECK_FAULT", "Img2ColJobLayout", "SourceResponseLayout",
           "DestinationWriteLayout", "Img2ColEngine"]

#: Widest TIMG2COL element (FP32/S32/U32).
DATA_WIDTH = 32


class Img2ColCheck(enum.Enum, shape=4):
    """Which check ended a job (NONE: success).  Not architectural: only the fault class is.

    Values are in the model's evaluation order.
    """

    NONE = 0
    DST_SHAPE = 1
    SRC_DESCRIPTOR = 2
    FEATURE_MAP = 3
    OPERAND_TYPES = 4
    SRC_LOCATION = 5
    OUTPUT_SHAPE = 6
    WINDOW = 7
    UNDEFINED = 8


#: The fault class each check raises.
CHECK_FAULT = {check: (FaultClass.NONE if check is Img2ColCheck.NONE
                       else FaultClass.TILE_ALLOCATION if check is Img2ColCheck.DST_SHAPE
                       else FaultClass.TILE_LEGALITY)
               for check in Img2ColCheck}


class Img2ColJobLayout(data.StructLayout):
    """One TIMG2COL job for one PE (its feature map comes separately, on the engine's ``fm``
    port).

    Fields
    ------
    dtype : 5
        The bundle's DataType code (the destination's type).
    src_dtype : 5, src_layout : 3
        The source tile's DataType and :class:`~ptocube.model.layout.Layout` codes.
    src_legal : 1
        The source register holds a legal row-major tile descriptor (allocated, legal
        capacity within the core limit, Col a power of two, valid shape inside the derived
        rows x Col) - the tile store's judgement.
    src_matrix : 1
        The source tile is in Matrix location.
    src_elements : index_width + 1
        The source tile's physical element count rows * Col.
    dst_size_code : 4
        The destination's B.IOT SizeCode (TSize = 128 B << (code - 1)).
    dst_cols : 16
        The destination's physical columns Col (LB2).
    valid_row, valid_col, pos_m, pos_k : 16
        The window: LB1, LB0 and the low 16 bits of the B.IOR GPRs.
    """

    def __init__(self, config: CubeConfig = CubeConfig()):
        self.config = config
        self.index_width = source_index_width(config)
        super().__init__({
            "dtype": 5,
            "src_dtype": 5,
            "src_layout": 3,
            "src_legal": 1,
            "src_matrix": 1,
            "src_elements": self.index_width + 1,
            "dst_size_code": 4,
            "dst_cols": 16,
            "valid_row": 16,
            "valid_col": 16,
            "pos_m": 16,
            "pos_k": 16,
        })

    def encode(self, dtype: DataType, *, src_elements: int,
               dst_size_code: int, dst_cols: int, valid_row: int, valid_col: int,
               pos_m: int = 0, pos_k: int = 0, src_dtype: DataType | None = None,
               src_layout: Layout = Layout.ROW_MAJOR, src_legal: bool = True,
               src_matrix: bool = True) -> int:
        """The bit pattern of a job (``src_dtype`` defaults to ``dtype``).

        Raises ValueError for a value that does not fit its field.
        """
        values = {"dtype": int(dtype), "src_dtype": int(dtype if src_dtype is None
                                                          else src_dtype),
                  "src_layout": int(src_layout), "src_legal": int(src_legal),
                  "src_matrix": int(src_matrix), "src_elements": src_elements,
                  "dst_size_code": dst_size_code, "dst_cols": dst_cols,
                  "valid_row": valid_row, "valid_col": valid_col, "pos_m": pos_m,
                  "pos_k": pos_k}
        for name, value in values.items():
            width = self.members[name]
            if not 0 <= value < 1 << width:
                raise ValueError(f"job field {name}={value} does not fit {width} bits")
        return self.const(values).as_bits()


#: Source read response: the element right-aligned (bits above its width are ignored) and
#: the element's definedness bit.
SourceResponseLayout = data.StructLayout({"data": DATA_WIDTH, "defined": 1})


def DestinationWriteLayout(index_width: int) -> data.StructLayout:
    """Staging write: destination storage index ``addr`` = r*Col + c and the element
    ``data``, right-aligned and zero-extended to 32 bits."""
    return data.StructLayout({"addr": index_width, "data": DATA_WIDTH})


#: Entry of the in-order queue of elements between address generation and staging write.
_PendingLayout = data.StructLayout({"pad": 1, "row_last": 1, "last": 1})


class Img2ColEngine(wiring.Component):
    """TIMG2COL for one PE: preflight, gather copy into a staging area, commit strobe.

    Parameters
    ----------
    config : CubeConfig
        ``tile_bytes_per_pe`` fixes the index widths and the largest destination TSize.
    fifo_depth : int
        Source reads in flight (and queued padding elements); full throughput needs a
        source latency (request accepted to response valid) below ``fifo_depth``.
    radix_bits : int
        Quotient bits per cycle of the serial dividers (preflight and address generator);
        the default 2 keeps a division step within one cycle at 100 MHz on ECP5.

    Members
    -------
    fm : In(stream.Signature(FeatureMapPartLayout))
        The next job's feature-map descriptor register (ruling R14), one 64-bit part per
        beat (:func:`feature_map_parts`); accepted when idle, into the engine's own register,
        which the address generator reads for the whole walk.  A 64-bit path instead of
        340 wires from the tile store's block RAMs (issue #9, decision T18).
    job : In(stream.Signature(Img2ColJobLayout(config)))
        One job, on the feature map loaded last; accepted when idle, its payload copied.
    src_req : Out(stream.Signature(index_width))
        Source read request: the source storage index (row*Col + col of the source tile).
        Every index requested is below ``src_elements``.
    src_rsp : In(stream.Signature(SourceResponseLayout))
        Responses to the requests, in request order.
    dst : Out(stream.Signature(DestinationWriteLayout(index_width)))
        Staging writes, in destination row-major order, one per window element.
    done : Out(1)
        One-cycle strobe: the job ended; ``fault`` and ``check`` say how.
    commit : Out(1)
        One-cycle strobe with ``done`` when the job succeeded: publish the staged destination.
    fault : Out(FaultClass), check : Out(Img2ColCheck)
        Outcome of the last job (held until the next one ends).
    busy : Out(1)
        A job is in progress.

    Attributes
    ----------
    preflight_cycles : int
        Cycles of the preflight program (set when the component is elaborated).  A failing
        preflight check ends the job ``preflight_cycles + 4`` cycles after it was accepted.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), *, fifo_depth: int = 4,
                 radix_bits: int = 2):
        if fifo_depth < 1:
            raise ValueError(f"fifo_depth must be at least 1, not {fifo_depth}")
        self.config = config
        self.fifo_depth = fifo_depth
        self.radix_bits = radix_bits
        self.index_width = source_index_width(config)
        self.job_layout = Img2ColJobLayout(config)
        super().__init__({
            "fm": In(stream.Signature(FeatureMapPartLayout)),
            "job": In(stream.Signature(self.job_layout)),
            "src_req": Out(stream.Signature(self.index_width)),
            "src_rsp": In(stream.Signature(SourceResponseLayout)),
            "dst": Out(stream.Signature(DestinationWriteLayout(self.index_width))),
            "done": Out(1),
            "commit": Out(1),
            "fault": Out(FaultClass),
            "check": Out(Img2ColCheck),
            "busy": Out(1),
        })

    @property
    def max_size_code(self) -> int:
        """Largest destination SizeCode this build can hold (TSize within a PE's memory)."""
        return max((c for c in range(1, 11) if 128 << (c - 1) <= self.config.tile_bytes_per_pe),
                   default=0)

    def elaborate(self, platform):
        m = Module()
        m.submodules.gen = gen = Img2ColAddressGenerator(self.config, radix_bits=self.radix_bits)
        # The walk's counters advance on a registered ready: without this buffer the
        # pending queue's head decided, through the source port's stall and the request
        # handshake, whether the walk moved, all in one cycle (issue #9, decision E19).
        # An abort empties it with the generator.
        m.submodules.walked = walked = ResetInserter(gen.abort)(
            SkidBuffer(AddressLayout(self.index_width)))
        wiring.connect(m, gen.out, walked.i)
        # The queue's head is a register: the copy's decisions start from flip-flops, not
        # from a LUT-RAM read behind the read pointer (issue #9, decision E21).
        m.submodules.pending = pending = SyncFIFOBuffered(width=_PendingLayout.size,
                                                          depth=self.fifo_depth)

        job = Signal(self.job_layout, name="job")
        fm_parts = Signal(64 * FM_PARTS, name="fm_parts", reset_less=True)
        fm = FEATURE_MAP_DESCRIPTOR(fm_parts[:FEATURE_MAP_DESCRIPTOR.size])
        # A feature-map beat is registered as it arrives and stored in its part a cycle
        # later: the beat comes from the store's block RAMs, and their outputs then reach
        # flip-flops only, not the part decode in front of 340 enables (E21).  The last
        # part is stored in the cycle the job is taken, before the preflight reads it.  The
        # beat register loads in every cycle (only ``fm_beat_parts`` says whether it holds a
        # beat), so no enable multiplexer follows the store's read path (E22).  Which part
        # it holds is registered one-hot with it, so each part's 64 enables come from a
        # flip-flop, and an ``unset`` part is stored as zero (the store's ``fm_set`` bit,
        # E23).
        beat = Signal(FeatureMapPartLayout, name="fm_beat", reset_less=True)
        beat_parts = Signal(FM_PARTS, name="fm_beat_parts")
        m.d.sync += [beat_parts.eq(0), beat.eq(self.fm.payload)]
        for part in range(FM_PARTS):
            with m.If(beat_parts[part]):
                m.d.sync += fm_parts.word_select(part, 64).eq(Mux(beat.unset, 0, beat.data))
        m.d.comb += gen.fm.eq(fm)
        checks = self._preflight(m, job, fm)
        program, out_height, out_width, first_failure, window_empty = checks

        check = Signal(Img2ColCheck, name="check_reg")
        m.d.comb += self.check.eq(check)
        with m.Switch(check):
            for result, fault_class in CHECK_FAULT.items():
                with m.Case(result):
                    m.d.comb += self.fault.eq(fault_class)

        # Element width of the job's type: the padding word and source data are cut to it.
        # Both are registers, settled long before the copy (the job and the feature map are
        # held from the job's acceptance on).
        bits = Signal(range(DATA_WIDTH + 1), name="element_bits")
        with m.Switch(job.dtype):
            for dtype in TIMG2COL_TYPES:
                with m.Case(dtype.value):
                    m.d.comb += bits.eq(dtype.bits)
        element_mask = Signal(DATA_WIDTH, name="element_mask")
        pad_value = Signal(DATA_WIDTH, name="pad_value")
        m.d.sync += [element_mask.eq((Const(1, DATA_WIDTH + 1) << bits) - 1),
                     pad_value.eq(fm.padding[:DATA_WIDTH] & element_mask)]

        # The generator's command: the window plus outH/outW from preflight.
        m.d.comb += [gen.cmd.payload.out_height.eq(out_height),
                     gen.cmd.payload.out_width.eq(out_width),
                     gen.cmd.payload.valid_row.eq(job.valid_row),
                     gen.cmd.payload.valid_col.eq(job.valid_col),
                     gen.cmd.payload.pos_m.eq(job.pos_m),
                     gen.cmd.payload.pos_k.eq(job.pos_k)]

        # Issue side: every generated element enters the pending queue; a real one also
        # becomes a source read.  A request once offered stays offered until accepted.
        element = walked.o.payload
        faulted = Signal(name="faulted")        # a referenced element was undefined
        copying = Signal(name="copying")
        offered = Signal(name="src_req_offered")    # offered and not taken in the last cycle
        m.d.sync += offered.eq(self.src_req.valid & ~self.src_req.ready)
        # After a fault no new request is offered, and the walk stops once none is on offer:
        # so the stop is decided from registers, not through the source port's handshake,
        # which fans out into every register of the generator (issue #9, decision E21).
        issuing = ~faulted | offered
        m.d.comb += [
            self.src_req.payload.eq(element.index),
            self.src_req.valid.eq(copying & walked.o.valid & ~element.pad & pending.w_rdy
                                  & issuing),
            walked.o.ready.eq(copying & pending.w_rdy
                              & Mux(element.pad, ~faulted, self.src_req.ready & issuing)),
            pending.w_en.eq(walked.o.valid & walked.o.ready),
            pending.w_data.eq(Cat(element.pad, element.row_last, element.last)),
            gen.abort.eq(copying & faulted & ~offered),
        ]

        # Write side, in order: a padding element is written at once, a real one when its
        # response arrives (and only if it is defined).  An element goes out through a
        # register (address, data, valid, whether it is the window's last), so the store's
        # write port starts from flip-flops (issue #9, decision E21).
        head = data.View(_PendingLayout, pending.r_data)
        head_real = pending.r_rdy & ~head.pad
        rsp = self.src_rsp.payload
        dst_addr = Signal(self.index_width, name="dst_addr")
        row_base = Signal(self.index_width, name="dst_row_base")
        out = Signal(DestinationWriteLayout(self.index_width), name="dst_out")
        out_valid, out_last = Signal(name="dst_out_valid"), Signal(name="dst_out_last")
        out_free = ~out_valid | self.dst.ready
        staged = Signal(name="dst_staged")
        m.d.comb += [self.dst.valid.eq(out_valid), self.dst.payload.eq(out)]
        # The queue holds entries only while copying (the job ends on an empty queue), so
        # its head needs no test of ``copying``.
        with m.If(~faulted):
            m.d.comb += [
                staged.eq(pending.r_rdy & out_free
                          & (head.pad | (self.src_rsp.valid & rsp.defined))),
                self.src_rsp.ready.eq(head_real & (out_free | ~rsp.defined)),
            ]
        with m.Else():
            m.d.comb += self.src_rsp.ready.eq(head_real)
        written = self.dst.valid & self.dst.ready
        dropped = faulted & pending.r_rdy & (head.pad | self.src_rsp.valid)
        undefined = self.src_rsp.valid & self.src_rsp.ready & ~rsp.defined & ~faulted
        m.d.comb += pending.r_en.eq(staged | dropped | undefined)
        with m.If(written):
            m.d.sync += out_valid.eq(0)
        with m.If(staged):
            m.d.sync += [out_valid.eq(1), out_last.eq(head.last), out.addr.eq(dst_addr),
                         out.data.eq(Mux(head.pad, pad_value, rsp.data & element_mask))]
            with m.If(head.row_last):
                m.d.sync += [row_base.eq(row_base + job.dst_cols),
                             dst_addr.eq(row_base + job.dst_cols)]
            with m.Else():
                m.d.sync += dst_addr.eq(dst_addr + 1)
        with m.If(undefined):
            m.d.sync += faulted.eq(1)

        def finish(result):
            m.d.sync += check.eq(result)
            m.next = "DONE"

        with m.FSM(name="engine"):
            with m.State("IDLE"):
                m.d.comb += [self.job.ready.eq(1), self.fm.ready.eq(1)]
                with m.If(self.fm.valid):
                    m.d.sync += beat_parts.eq(
                        Cat(*(self.fm.payload.part == k for k in range(FM_PARTS))))
                with m.If(self.job.valid):
                    m.d.sync += [job.eq(self.job.payload), *program.start()]
                    m.next = "PREFLIGHT"
            with m.State("PREFLIGHT"):
                m.d.comb += self.busy.eq(1)
                with m.If(~program.busy):
                    m.next = "VERDICT"
            with m.State("VERDICT"):
                # The comparisons take the program's last results in this cycle; the first
                # failure follows them at the next edge.
                m.d.comb += self.busy.eq(1)
                m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If(first_failure != Img2ColCheck.NONE):
                    finish(first_failure)
                with m.Elif(window_empty):
                    finish(Img2ColCheck.NONE)
                with m.Else():
                    m.d.comb += gen.cmd.valid.eq(1)
                    with m.If(gen.cmd.ready):
                        m.d.sync += [copying.eq(1), faulted.eq(0), dst_addr.eq(0),
                                     row_base.eq(0)]
                        m.next = "COPY"
            with m.State("COPY"):
                m.d.comb += self.busy.eq(1)
                with m.If(written & out_last):
                    m.d.sync += copying.eq(0)
                    finish(Img2ColCheck.NONE)
                with m.If(faulted & (pending.r_level == 0) & ~out_valid & ~gen.busy
                          & (walked.level == 0)):
                    m.d.sync += copying.eq(0)
                    finish(Img2ColCheck.UNDEFINED)
            with m.State("DONE"):
                m.d.comb += [self.busy.eq(1), self.done.eq(1),
                             self.commit.eq(check == Img2ColCheck.NONE)]
                m.next = "IDLE"
        return m

    def _preflight(self, m, job, fm):
        """Preflight arithmetic and checks; returns (program, outH, outW, first failure,
        empty window).

        The first failure is a register two stages behind the program's results (their
        comparisons, then the priority select), so it holds the verdict on the final results
        two cycles after the program ends.  Facts of the job alone are registered as they settle during the
        program (they are stable from the job's acceptance on).
        """
        index_width = self.index_width
        # Saturating width: above every bound a product is compared with (P against
        # 2**index_width elements; receptive fields, outH/outW and the window against
        # values below 2**18).
        width = max(index_width + 1, EXTENT_WIDTH)
        names = ("c1c0", "nd", "physical", "rec_h", "rec_w", "im2col_rows", "im2col_cols",
                 "padded_h", "padded_w")
        c1c0, nd, physical, rec_h, rec_w, rows, cols, padded_h, padded_w = (
            Signal(width, name=n) for n in names)
        out_height = Signal(EXTENT_WIDTH, name="out_height")
        out_width = Signal(EXTENT_WIDTH, name="out_width")
        # rec = DH*(KH - 1) is the receptive field minus one; the padded input (below
        # 3 * 65535, never clamped) holds the dilated filter when padded > rec, and then
        # outH = (padded - 1 - rec) // SH + 1; padded + ~rec is padded - 1 - rec.
        program = SerialProgram([
            MulAdd(c1c0, fm.channel_groups, fm.channels_per_group),
            MulAdd(nd, fm.batches, fm.depth),
            MulAdd(rec_h, (fm.filter_height - 1)[:16], fm.dilation_height),
            MulAdd(rec_w, (fm.filter_width - 1)[:16], fm.dilation_width),
            MulAdd(padded_h, fm.height, 1, fm.pad_top),
            MulAdd(padded_w, fm.width, 1, fm.pad_left),
            MulAdd(physical, nd, fm.channel_groups),
            MulAdd(padded_h, padded_h, 1, fm.pad_bottom),
            MulAdd(padded_w, padded_w, 1, fm.pad_right),
            DivMod(out_height, None, (padded_h + ~rec_h)[:EXTENT_WIDTH], fm.stride_height),
            MulAdd(physical, physical, fm.height),
            MulAdd(cols, c1c0, fm.filter_height),
            MulAdd(physical, physical, fm.width),
            MulAdd(cols, cols, fm.filter_width),
            MulAdd(physical, physical, fm.channels_per_group),
            DivMod(out_width, None, (padded_w + ~rec_w)[:EXTENT_WIDTH], fm.stride_width),
            MulAdd(out_height, 1, 1, out_height),
            MulAdd(rows, nd, out_height),
            MulAdd(out_width, 1, 1, out_width),
            MulAdd(rows, rows, out_width),
        ], width=width, y_width=EXTENT_WIDTH, dividend_width=EXTENT_WIDTH, divisor_width=16,
            saturate=True, radix_bits=self.radix_bits)
        self.preflight_cycles = program.cycles
        program.emit(m)

        # Facts of the job alone, registered.
        job_facts = {name: Signal(name=name) for name in (
            "fm_fields_ok", "types_ok", "window_empty")}
        window_ends = Signal(17, name="window_row_end"), Signal(17, name="window_col_end")
        # The 13 fields' zero tests are registers of their own before their AND (E21).
        nonzero = Signal(13, name="fm_nonzero")
        m.d.sync += nonzero.eq(Cat(*(getattr(fm, name) != 0 for name in (
            "batches", "depth", "channel_groups", "height", "width", "channels_per_group",
            "filter_height", "filter_width", "stride_height", "stride_width",
            "dilation_height", "dilation_width", "logical_channels"))))
        type_ok = Signal(name="type_ok")
        with m.Switch(job.src_dtype):
            with m.Case(*(t.value for t in TIMG2COL_TYPES)):
                m.d.comb += type_ok.eq(1)
        m.d.sync += [
            job_facts["fm_fields_ok"].eq(
                fm.valid & (fm.layout <= FeatureMapLayout.NDC1HWC0) & nonzero.all()
                & ~fm.transposed
                & ((fm.layout == FeatureMapLayout.NDC1HWC0) | (fm.depth == 1))),
            job_facts["types_ok"].eq(type_ok & (job.dtype == job.src_dtype)
                                     & (job.src_layout == Layout.ROW_MAJOR)),
            job_facts["window_empty"].eq((job.valid_row == 0) | (job.valid_col == 0)),
            window_ends[0].eq(job.pos_m + job.valid_row),
            window_ends[1].eq(job.pos_k + job.valid_col),
        ]
        dst_ok, settle = self._destination_shape_ok(m, job)
        # The registered facts must have settled before the verdict is taken.
        assert program.cycles > settle + 1

        # The comparisons with the program's results are registered before the priority
        # select: both in one cycle made the engine's longest path (issue #9, decision E20).
        # One register per comparison, each the end of one carry chain (E21): a <= b is
        # "b - a does not borrow", and padded > rec the carry out of padded + ~rec, the
        # divisions' dividend.  Written as compares, yosys tested a difference for zero
        # after its chain, or merged the compare into the dividend's adder and did that.
        compared = {name: Signal(name=name) for name in (
            "channels_ok", "physical_ok", "height_ok", "width_ok", "rows_ok", "cols_ok")}
        m.d.sync += [
            compared["channels_ok"].eq(~(c1c0 - fm.logical_channels)[-1]),
            compared["physical_ok"].eq(~(job.src_elements - physical)[-1]),
            compared["height_ok"].eq((padded_h + ~rec_h)[-1]),
            compared["width_ok"].eq((padded_w + ~rec_w)[-1]),
            compared["rows_ok"].eq(~(rows - window_ends[0])[-1]),
            compared["cols_ok"].eq(~(cols - window_ends[1])[-1]),
        ]
        feature_map_ok = (job_facts["fm_fields_ok"] & compared["channels_ok"]
                          & compared["physical_ok"])
        shape_ok = compared["height_ok"] & compared["width_ok"]
        window_ok = compared["rows_ok"] & compared["cols_ok"]

        first_failure = Signal(Img2ColCheck, name="first_failure")
        failure = Signal(Img2ColCheck, name="first_failure_comb")
        ordered = [(dst_ok, Img2ColCheck.DST_SHAPE),
                   (job.src_legal, Img2ColCheck.SRC_DESCRIPTOR),
                   (feature_map_ok, Img2ColCheck.FEATURE_MAP),
                   (job_facts["types_ok"], Img2ColCheck.OPERAND_TYPES),
                   (job.src_matrix, Img2ColCheck.SRC_LOCATION),
                   (shape_ok, Img2ColCheck.OUTPUT_SHAPE),
                   (window_ok, Img2ColCheck.WINDOW)]
        # Reversed, so that the earliest failing check is assigned last and wins.
        for ok, check in reversed(ordered):
            with m.If(~ok):
                m.d.comb += failure.eq(check)
        m.d.sync += first_failure.eq(failure)
        return program, out_height, out_width, first_failure, job_facts["window_empty"]

    def _destination_shape_ok(self, m, job):
        """``ordinary_shape_legal``: ValidRow x ValidCol with Col physical columns in TSize.

        Returns the verdict (a register) and the cycles it takes to settle after the job
        changes.  Everything is a power of two, so the rule works on logarithms: TSize is
        2**(9 + SizeCode) bits, a row 2**(log2 Col + log2 bits); rows = their quotient must
        be at most 65535, i.e. 2**15.
        """
        size_code, cols = job.dst_size_code, job.dst_cols
        log2_bits = Signal(3, name="dst_log2_bits")
        m.d.comb += log2_bits.eq(3)    # reserved codes (never sent) count as 8-bit
        with m.Switch(job.dtype):
            for dtype in DataType:
                with m.Case(dtype.value):
                    m.d.comb += log2_bits.eq(dtype.bits.bit_length() - 1)
        log2_cols = Signal(4, name="dst_log2_cols")
        for i in range(16):
            with m.If(cols[i]):
                m.d.comb += log2_cols.eq(i)
        # First stage: the logarithms and the facts that need no arithmetic on them; the
        # power-of-two test and the other column facts apart, each a short cone (E21).
        row_log2_parts = Signal(signed(7), name="dst_log2_rows_part")
        columns_pow2 = Signal(name="dst_columns_pow2")
        columns_ok = Signal(name="dst_columns_ok")
        m.d.sync += [
            row_log2_parts.eq(size_code + 9 - log2_bits),
            columns_pow2.eq((cols != 0) & ((cols & (cols - 1)) == 0)),
            columns_ok.eq((size_code >= 1) & (size_code <= self.max_size_code)
                          & ~(cols - job.valid_col)[-1]),
        ]
        log2_cols_r = Signal(4, name="dst_log2_cols_r")
        m.d.sync += log2_cols_r.eq(log2_cols)
        # Second stage: log2 of the rows TSize holds; third: the rows as a number and
        # whether the logarithm is in range; fourth: the verdict.
        row_log2 = Signal(signed(7), name="dst_log2_rows")
        columns_ok_r = Signal(name="dst_columns_ok_r")
        m.d.sync += [row_log2.eq(row_log2_parts - log2_cols_r),
                     columns_ok_r.eq(columns_ok & columns_pow2)]
        row_limit = Signal(17, name="dst_row_limit")
        rows_ok = Signal(name="dst_rows_ok")
        m.d.sync += [row_limit.eq(Const(1, 17) << row_log2[:4]),
                     rows_ok.eq(columns_ok_r & (row_log2 >= 0) & (row_log2 <= 15))]
        ok = Signal(name="dst_shape_ok")
        m.d.sync += ok.eq(rows_ok & ~(row_limit - job.valid_row)[-1])
        return ok, 4
