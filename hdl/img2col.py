"""TIMG2COL address generator: destination window in, source element addresses out.

:class:`Img2ColAddressGenerator` walks the ValidRow x ValidCol window of the im2col matrix at
(posM, posK) in destination row-major order and yields, for every destination element, the
source storage index of the feature-map element it copies or a padding marker.  It follows
the index mathematics of :func:`ptocube.model.img2col.gather_indices` exactly and the
counters-and-adders scheme of :func:`ptocube.model.img2col.walk`.

How it works (``docs/hdl-img2col.md`` has the full design notes):

* **Setup**, once per window: a short fixed program (:class:`SerialProgram`) runs on one
  multiply-add unit and one serial restoring divider.  It forms the loop-invariant strides,
  the address deltas applied when a counter wraps and the wrap points, and seeds the walk
  from posM/posK by division.  65 cycles at the default radix, whatever the window size.
* **Stream**, one element per cycle.  Row state: the input coordinates ih0 = oh*SH - PT and
  iw0 = ow*SW - PL and the row address.  Column state: c0, kw*DW, kh*DH, the channels left
  before LC (LC - c1*C0) and the column address.  ow, oh, kw and kh need no counters of
  their own: each wraps when its running coordinate reaches a wrap point computed in setup.
  Advancing uses adds of precomputed steps and deltas and equality compares only - no
  multiplier, no divider.  The element's index is row address + column address; it is
  padding when ih = ih0 + kh*DH or iw = iw0 + kw*DW falls outside the map or c0 is not
  below LC - c1*C0.

Address arithmetic is modular.  Every real source index is below P = N*D*C1*H*W*C0, which
preflight bounds by the source tile's element count (at most ``2**index_width``), so all
address terms are kept modulo ``2**index_width``: intermediate terms of padding positions may
be "negative" or huge, but a real element's sum is exact.  The coordinates that the padding
test compares are exact in ``arith_width`` bits (see :func:`arith_width`).

Preconditions (the TIMG2COL engine's preflight guarantees them; see ``img2col_engine``):
the descriptor passed ``check_descriptor`` with a source of at most ``2**index_width``
elements, ``out_height``/``out_width`` are the model's ``output_shape``, and the window
passed ``check_window``.  A zero ValidRow or ValidCol yields no element.
"""

import math
import operator
from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.img2col import FeatureMapDescriptor, FeatureMapLayout
from .config import CubeConfig

__all__ = ["FeatureMapDescriptorLayout", "FEATURE_MAP_DESCRIPTOR", "EXTENT_WIDTH",
           "AddressJobLayout", "AddressLayout", "MulAdd", "DivMod", "SerialProgram",
           "source_index_width", "arith_width", "Img2ColAddressGenerator"]

#: Width of outH / outW: at most H + PT + PB = 3 * 65535 < 2**18.
EXTENT_WIDTH = 18

_FIELD_WIDTH = 16
_DIMENSION_FIELDS = ("batches", "depth", "channel_groups", "height", "width",
                     "channels_per_group", "filter_height", "filter_width", "stride_height",
                     "stride_width", "dilation_height", "dilation_width", "pad_left",
                     "pad_right", "pad_top", "pad_bottom", "logical_channels")


class FeatureMapDescriptorLayout(data.StructLayout):
    """The feature-map descriptor register of a tile, field for field the model's dataclass.

    Field widths are the register's: ``layout`` 2 bits (codes 0 NC1HWC0, 1 NDC1HWC0; 2 and 3
    are illegal values a host may write), every dimension, filter, stride, dilation, padding
    count and ``logical_channels`` 16 bits, ``padding`` the 64-bit word, ``transposed`` and
    ``valid`` one bit each.  Values the model's checks reject but the register can hold (zero
    dimensions, layout 2/3, ``transposed``, ``valid`` clear) are the preflight's to reject.
    """

    def __init__(self):
        fields = {"layout": 2}
        fields.update({name: _FIELD_WIDTH for name in _DIMENSION_FIELDS})
        fields.update({"padding": 64, "transposed": 1, "valid": 1})
        super().__init__(fields)

    def encode(self, fm: FeatureMapDescriptor) -> int:
        """The register's bit pattern for a model descriptor.

        Raises ValueError for a value the register cannot hold (a dimension above 65535 or
        negative, a layout code above 3, a padding word outside 64 bits): such a descriptor
        cannot be written through the hardware descriptor port at all.
        """
        values = {"layout": int(fm.layout), "padding": fm.padding,
                  "transposed": int(bool(fm.transposed)), "valid": int(bool(fm.valid))}
        values.update({name: getattr(fm, name) for name in _DIMENSION_FIELDS})
        for name, value in values.items():
            width = self.members[name]
            try:
                values[name] = operator.index(value)     # ints, numpy ints; not floats
            except TypeError:
                values[name] = None
            if values[name] is None or not 0 <= values[name] < 1 << width:
                raise ValueError(f"feature-map {name}={value!r} does not fit the {width}-bit "
                                 f"descriptor register field")
        return self.const(values).as_bits()

    def decode(self, bits: int) -> FeatureMapDescriptor:
        """The model descriptor of a register bit pattern (``layout`` stays an int if illegal)."""
        v = data.Const(self, bits)
        layout = int(v.layout)
        return FeatureMapDescriptor(
            layout=FeatureMapLayout(layout) if layout in tuple(FeatureMapLayout) else layout,
            padding=int(v.padding), transposed=bool(v.transposed), valid=bool(v.valid),
            **{name: int(getattr(v, name)) for name in _DIMENSION_FIELDS})


#: The one instance every component uses.
FEATURE_MAP_DESCRIPTOR = FeatureMapDescriptorLayout()

#: Address generator command: the descriptor, the output extents and the window.
AddressJobLayout = data.StructLayout({
    "fm": FEATURE_MAP_DESCRIPTOR,
    "out_height": EXTENT_WIDTH,
    "out_width": EXTENT_WIDTH,
    "valid_row": 16,
    "valid_col": 16,
    "pos_m": 16,
    "pos_k": 16,
})


def AddressLayout(index_width: int) -> data.StructLayout:
    """One generated element: source ``index`` (meaningless when ``pad``), ``pad``,
    ``row_last`` (last element of a destination row) and ``last`` (last of the window)."""
    return data.StructLayout({"index": index_width, "pad": 1, "row_last": 1, "last": 1})


def source_index_width(config: CubeConfig) -> int:
    """Bits of a TIMG2COL source storage index for ``config``.

    The largest source is a whole PE's tile memory of 8-bit elements (the narrowest TIMG2COL
    type), so an index is below ``tile_bytes_per_pe``.
    """
    return max(1, (config.tile_bytes_per_pe - 1).bit_length())


def arith_width(index_width: int) -> int:
    """Bits of the generator's coordinate arithmetic (see the module docstring).

    A used input coordinate ih = oh*SH + kh*DH - PT lies in [-65535, H + PB - 1], inside
    [-2**17, 2**17): 19 signed bits.  The channels left before LC, LC - c1*C0, lie in
    (-P, 65535] with P <= 2**index_width: index_width + 1 signed bits.
    """
    return max(index_width + 1, 19)


# ---------------------------------------------------------------------------
# Setup program: one multiply-add unit, one serial divider
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MulAdd:
    """One program step: ``dst <- x*y + z``, or ``dst <- x*y - z`` when ``sub``.

    ``x`` is up to the program width, ``y`` up to its ``y_width``; constants are allowed.
    """

    dst: Value
    x: object
    y: object = 1
    z: object = 0
    sub: bool = False


@dataclass(frozen=True)
class DivMod:
    """One program step: ``quotient, remainder <- divmod(dividend, divisor)``.

    ``remainder`` may be None.  A zero divisor gives a meaningless result but still ends.
    """

    quotient: Value
    remainder: Value | None
    dividend: object
    divisor: object


class SerialProgram:
    """A fixed sequence of :class:`MulAdd` / :class:`DivMod` steps, run one after another.

    The steps are Python objects naming the caller's signals; :meth:`emit` builds the
    hardware into the caller's module so that the steps can write the caller's registers.
    A multiply-add step takes one cycle; a division ``1 + ceil(dividend_width /
    radix_bits)`` cycles (restoring division, ``radix_bits`` quotient bits per cycle).

    Arithmetic is modulo ``2**width``, or with ``saturate`` unsigned and clamped at
    ``2**width - 1`` (then ``sub`` is not allowed): a clamped value stands for "at least
    that", which keeps range checks on products of 16-bit fields exact.

    Use ``m.d.sync += program.start()`` to run it from step 0; :attr:`busy` is high until
    the last step has written its result; ``program.stop()`` abandons it.
    """

    def __init__(self, steps, *, width: int, y_width: int, dividend_width: int,
                 divisor_width: int, saturate: bool = False, radix_bits: int = 4):
        self.steps = tuple(steps)
        if saturate and any(isinstance(s, MulAdd) and s.sub for s in self.steps):
            raise ValueError("a saturating program cannot subtract")
        if radix_bits < 1:
            raise ValueError(f"radix_bits must be at least 1, not {radix_bits}")
        self.width, self.y_width = width, y_width
        self.dividend_width, self.divisor_width = dividend_width, divisor_width
        self.saturate, self.radix_bits = saturate, radix_bits
        self.iterations = math.ceil(dividend_width / radix_bits)
        self.pc = Signal(range(len(self.steps) + 1), init=len(self.steps), name="program_pc")
        self._count = Signal(range(self.iterations + 1), name="program_div_count")

    @property
    def busy(self) -> Value:
        """High while a step is still to run."""
        return self.pc != len(self.steps)

    @property
    def cycles(self) -> int:
        """Cycles from :meth:`start` until :attr:`busy` falls."""
        return sum(1 if isinstance(s, MulAdd) else 1 + self.iterations for s in self.steps)

    def start(self) -> list:
        """Statements (for ``m.d.sync``) that restart the program at step 0."""
        return [self.pc.eq(0), self._count.eq(0)]

    def stop(self) -> list:
        """Statements (for ``m.d.sync``) that abandon the program."""
        return [self.pc.eq(len(self.steps)), self._count.eq(0)]

    def emit(self, m: Module) -> None:
        """Add the program's datapath and sequencing to ``m``."""
        x = Signal(self.width, name="mul_x")
        y = Signal(self.y_width, name="mul_y")
        z = Signal(self.width, name="mul_z")
        sub = Signal(name="mul_sub")
        if self.saturate:
            cap = (1 << self.width) - 1
            total = x * y + z
            result = Mux(total > cap, cap, total)
        else:
            # x*y - z = x*y + ~z + 1 modulo 2**width.
            result = (x * y + (z ^ sub.replicate(self.width)) + sub)[:self.width]

        # Restoring division, radix_bits quotient bits per cycle.  The quotient register
        # holds the not yet consumed dividend bits below the quotient bits found so far.
        dividend = Signal(self.dividend_width, name="div_dividend")
        divisor = Signal(self.divisor_width, name="div_divisor")
        rem = Signal(self.divisor_width, name="div_rem")
        quo = Signal(self.iterations * self.radix_bits, name="div_quo")
        next_rem, next_quo = rem, quo
        for _ in range(self.radix_bits):
            trial = Cat(next_quo[-1], next_rem)
            fits = trial >= divisor
            next_rem = Mux(fits, trial - divisor, trial)[:self.divisor_width]
            next_quo = Cat(fits, next_quo[:-1])

        count = self._count
        with m.Switch(self.pc):
            for i, step in enumerate(self.steps):
                with m.Case(i):
                    if isinstance(step, MulAdd):
                        m.d.comb += [x.eq(step.x), y.eq(step.y), z.eq(step.z),
                                     sub.eq(step.sub)]
                        m.d.sync += [step.dst.eq(result), self.pc.eq(self.pc + 1)]
                        continue
                    m.d.comb += [dividend.eq(step.dividend), divisor.eq(step.divisor)]
                    with m.If(count == 0):
                        m.d.sync += [quo.eq(dividend), rem.eq(0), count.eq(1)]
                    with m.Else():
                        m.d.sync += [quo.eq(next_quo), rem.eq(next_rem), count.eq(count + 1)]
                        with m.If(count == self.iterations):
                            m.d.sync += [step.quotient.eq(next_quo), count.eq(0),
                                         self.pc.eq(self.pc + 1)]
                            if step.remainder is not None:
                                m.d.sync += step.remainder.eq(next_rem)


# ---------------------------------------------------------------------------
# The address generator
# ---------------------------------------------------------------------------

class Img2ColAddressGenerator(wiring.Component):
    """Source element address (or padding marker) of every destination element of a window.

    Parameters
    ----------
    config : CubeConfig
        ``tile_bytes_per_pe`` fixes the source index width (:func:`source_index_width`).
    radix_bits : int
        Quotient bits per cycle of the setup divider (the default 4 needs 5 cycles per
        16-bit division; any value >= 1 works).

    Members
    -------
    cmd : In(stream.Signature(AddressJobLayout))
        One window to walk; accepted when idle.  The payload is copied on acceptance.
    out : Out(stream.Signature(AddressLayout(index_width)))
        The window's elements in destination row-major order, at most one per cycle; the
        payload is registered.  ``index`` is the source storage index (the feature map's
        linear index N, D, C1, H, W, C0 with C0 innermost); it is meaningless when ``pad``.
    abort : In(1)
        Abandon the current window at once (drops the element on ``out``); no command is
        accepted while it is high.
    busy : Out(1)
        A window is being set up or walked, or an element is waiting on ``out``.

    Attributes
    ----------
    setup_cycles : int
        Cycles of the setup program (set when the component is elaborated).  The first
        element appears ``setup_cycles + 3`` cycles after the command is accepted.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), *, radix_bits: int = 4):
        self.config = config
        self.radix_bits = radix_bits
        self.index_width = source_index_width(config)
        self.arith_width = arith_width(self.index_width)
        super().__init__({
            "cmd": In(stream.Signature(AddressJobLayout)),
            "out": Out(stream.Signature(AddressLayout(self.index_width))),
            "abort": In(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        a_w, b_w = self.index_width, self.arith_width

        job = Signal(AddressJobLayout, name="job")
        fm = job.fm
        c0_n, kw_n, kh_n = fm.channels_per_group, fm.filter_width, fm.filter_height

        # Loop invariants, modulo 2**a_w: the source-index stride of one input row (ws),
        # one channel group (c1s), one (n, d) image (nds); the steps of ow, oh, kw and kh;
        # and the address deltas applied when a counter wraps (see the program below).
        ws, c1s, nds = (Signal(a_w, name=n) for n in ("w_stride", "c1_stride", "nd_stride"))
        ow_step, oh_step, kw_step, kh_step = (
            Signal(a_w, name=n) for n in ("ow_step", "oh_step", "kw_step", "kh_step"))
        oh_delta, image_delta = Signal(a_w, name="oh_delta"), Signal(a_w, name="image_delta")
        kw_delta, kh_delta, c1_delta = (
            Signal(a_w, name=n) for n in ("kw_delta", "kh_delta", "c1_delta"))
        # Where the coordinate counters wrap, exact: ow wraps when iw0 would reach
        # outW*SW - PL, oh when ih0 would reach outH*SH - PT, kw when kw*DW would reach
        # KW*DW, kh when kh*DH would reach KH*DH.  So ow, oh, kw and kh need no counters.
        iw0_end, ih0_end = Signal(signed(b_w), name="iw0_end"), Signal(signed(b_w),
                                                                       name="ih0_end")
        kw_end, kh_end = Signal(b_w, name="kw_off_end"), Signal(b_w, name="kh_off_end")
        t0, t1 = Signal(b_w, name="t0"), Signal(b_w, name="t1")
        quotient = Signal(16, name="quotient")
        image, c1 = Signal(16, name="image"), Signal(16, name="c1_seed")

        # Row state: ih0 = oh*SH - PT, iw0 = ow*SW - PL and the row's address.
        ih0, iw0 = Signal(signed(b_w), name="ih0"), Signal(signed(b_w), name="iw0")
        row_addr = Signal(a_w, name="row_addr")

        def column_registers(suffix):
            return {
                "c0": Signal(16, name="c0" + suffix),
                "kw_off": Signal(b_w, name="kw_off" + suffix),     # kw * DW
                "kh_off": Signal(b_w, name="kh_off" + suffix),     # kh * DH
                "lc_left": Signal(signed(b_w), name="lc_left" + suffix),   # LC - c1*C0
                "col_addr": Signal(a_w, name="col_addr" + suffix),
            }
        # Column state: the seed every row starts from, and the running copy.
        seed, col = column_registers("_seed"), column_registers("")

        program = SerialProgram([
            # Strides and wrap points.
            MulAdd(ws, fm.width, c0_n),
            MulAdd(c1s, ws, fm.height),
            MulAdd(nds, c1s, fm.channel_groups),
            MulAdd(ow_step, c0_n, fm.stride_width),
            MulAdd(oh_step, ws, fm.stride_height),
            MulAdd(kw_step, c0_n, fm.dilation_width),
            MulAdd(kh_step, ws, fm.dilation_height),
            MulAdd(kw_end, kw_n, fm.dilation_width),
            MulAdd(kh_end, kh_n, fm.dilation_height),
            # ow wraps: oh_delta = ow_step - outW*SW*C0 + oh_step.
            MulAdd(t0, job.out_width, fm.stride_width),
            MulAdd(iw0_end, t0, 1, fm.pad_left, sub=True),
            MulAdd(t0, t0, c0_n, ow_step, sub=True),
            MulAdd(oh_delta, oh_step, 1, t0, sub=True),
            # oh wraps too: image_delta = oh_delta - outH*SH*W*C0 + nds.
            MulAdd(t0, job.out_height, fm.stride_height),
            MulAdd(ih0_end, t0, 1, fm.pad_top, sub=True),
            MulAdd(t0, t0, fm.width),
            MulAdd(t0, t0, c0_n, oh_delta, sub=True),
            MulAdd(image_delta, nds, 1, t0, sub=True),
            # c0 wraps: kw_delta = 1 - C0 + kw_step; kw wraps too: kh_delta = kw_delta
            # - KW*kw_step + kh_step; kh wraps too: c1_delta = kh_delta - KH*kh_step + c1s.
            MulAdd(t0, c0_n, 1, 1, sub=True),
            MulAdd(kw_delta, kw_step, 1, t0, sub=True),
            MulAdd(t0, kw_step, kw_n, kw_delta, sub=True),
            MulAdd(kh_delta, kh_step, 1, t0, sub=True),
            MulAdd(t0, kh_step, kh_n, kh_delta, sub=True),
            MulAdd(c1_delta, c1s, 1, t0, sub=True),
            # Row seed: posM -> (image, oh, ow) (n*D + d is the image number), then
            # iw0 = ow*SW - PL, ih0 = oh*SH - PT and the row address.
            DivMod(quotient, t1, job.pos_m, job.out_width),
            MulAdd(t0, t1, fm.stride_width),
            MulAdd(iw0, t0, 1, fm.pad_left, sub=True),
            DivMod(image, t1, quotient, job.out_height),
            MulAdd(t0, t1, fm.stride_height),
            MulAdd(ih0, t0, 1, fm.pad_top, sub=True),
            MulAdd(t0, ih0, fm.width),
            MulAdd(t0, t0, c0_n),
            MulAdd(t0, nds, image, t0),
            MulAdd(row_addr, iw0, c0_n, t0),
            # Column seed: posK -> (c1, kh, kw, c0), then kw*DW, kh*DH, LC - c1*C0 and
            # the column address.
            DivMod(quotient, seed["c0"], job.pos_k, c0_n),
            DivMod(quotient, t1, quotient, kw_n),
            MulAdd(seed["kw_off"], t1, fm.dilation_width),
            DivMod(c1, t1, quotient, kh_n),
            MulAdd(seed["kh_off"], t1, fm.dilation_height),
            MulAdd(t0, c1, c0_n, fm.logical_channels, sub=True),
            MulAdd(seed["lc_left"], 0, 0, t0, sub=True),
            MulAdd(t0, c1s, c1, seed["c0"]),
            MulAdd(t1, seed["kh_off"], fm.width),
            MulAdd(t0, t1, c0_n, t0),
            MulAdd(seed["col_addr"], seed["kw_off"], c0_n, t0),
        ], width=b_w, y_width=16, dividend_width=16, divisor_width=b_w,
            radix_bits=self.radix_bits)
        self.setup_cycles = program.cycles
        program.emit(m)

        # The current element, from the running registers.
        ih, iw = Signal(signed(b_w), name="ih"), Signal(signed(b_w), name="iw")
        m.d.comb += [ih.eq(ih0 + col["kh_off"]), iw.eq(iw0 + col["kw_off"])]
        real = ((ih >= 0) & (ih < fm.height) & (iw >= 0) & (iw < fm.width)
                & (col["c0"] < col["lc_left"]))
        cols_left, rows_left = Signal(16, name="cols_left"), Signal(16, name="rows_left")
        row_last = cols_left == 1
        last = row_last & (rows_left == 1)

        out_valid = Signal(name="out_valid")
        payload = Signal(AddressLayout(a_w), name="out_payload")
        idle = Signal(name="idle")
        m.d.comb += [self.out.valid.eq(out_valid), self.out.payload.eq(payload),
                     self.busy.eq(~idle | out_valid)]
        with m.If(self.out.ready):
            m.d.sync += out_valid.eq(0)

        with m.FSM(name="walk"):
            with m.State("IDLE"):
                m.d.comb += [idle.eq(1), self.cmd.ready.eq(~self.abort)]
                with m.If(self.cmd.valid & ~self.abort):
                    m.d.sync += [job.eq(self.cmd.payload), *program.start()]
                    m.next = "SETUP"
            with m.State("SETUP"):
                with m.If(~program.busy):
                    m.d.sync += [col[k].eq(seed[k]) for k in col]
                    m.d.sync += [cols_left.eq(job.valid_col), rows_left.eq(job.valid_row)]
                    with m.If((job.valid_row == 0) | (job.valid_col == 0)):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "RUN"
                with m.If(self.abort):
                    m.next = "IDLE"
            with m.State("RUN"):
                with m.If(~out_valid | self.out.ready):
                    m.d.sync += [out_valid.eq(1),
                                 payload.index.eq(row_addr + col["col_addr"]),
                                 payload.pad.eq(~real),
                                 payload.row_last.eq(row_last),
                                 payload.last.eq(last)]
                    with m.If(row_last):
                        self._next_row(m, job, seed, col, cols_left, rows_left,
                                       (ih0, iw0, row_addr), (ih0_end, iw0_end),
                                       (ow_step, oh_delta, image_delta))
                    with m.Else():
                        self._next_column(m, job, col, cols_left, (kw_end, kh_end),
                                          (kw_delta, kh_delta, c1_delta))
                    with m.If(last):
                        m.next = "IDLE"
                with m.If(self.abort):
                    m.next = "IDLE"
        # Last, so that it overrides everything above.
        with m.If(self.abort):
            m.d.sync += [out_valid.eq(0), *program.stop()]
        return m

    @staticmethod
    def _next_column(m, job, col, cols_left, ends, deltas):
        """Advance (c1, kh, kw, c0) by one: c0 fastest, then kw, kh, c1."""
        fm = job.fm
        kw_end, kh_end = ends
        kw_delta, kh_delta, c1_delta = deltas
        kw_next = col["kw_off"] + fm.dilation_width
        kh_next = col["kh_off"] + fm.dilation_height
        # One adder for the column address; the wrap pattern picks its delta.
        delta = Signal.like(col["col_addr"], name="col_delta")
        m.d.sync += [cols_left.eq(cols_left - 1), col["col_addr"].eq(col["col_addr"] + delta)]
        with m.If(col["c0"] + 1 != fm.channels_per_group):
            m.d.comb += delta.eq(1)
            m.d.sync += col["c0"].eq(col["c0"] + 1)
        with m.Elif(kw_next[:len(kw_end)] != kw_end):
            m.d.comb += delta.eq(kw_delta)
            m.d.sync += [col["c0"].eq(0), col["kw_off"].eq(kw_next)]
        with m.Elif(kh_next[:len(kh_end)] != kh_end):
            m.d.comb += delta.eq(kh_delta)
            m.d.sync += [col["c0"].eq(0), col["kw_off"].eq(0), col["kh_off"].eq(kh_next)]
        with m.Else():
            m.d.comb += delta.eq(c1_delta)
            m.d.sync += [col["c0"].eq(0), col["kw_off"].eq(0), col["kh_off"].eq(0),
                         col["lc_left"].eq(col["lc_left"] - fm.channels_per_group)]

    @staticmethod
    def _next_row(m, job, seed, col, cols_left, rows_left, row, ends, deltas):
        """Restart the columns from their seed and advance (image, oh, ow) by one."""
        fm = job.fm
        ih0, iw0, row_addr = row
        ih0_end, iw0_end = ends
        ow_step, oh_delta, image_delta = deltas
        iw0_next = Signal.like(iw0, name="iw0_next")
        ih0_next = Signal.like(ih0, name="ih0_next")
        m.d.comb += [iw0_next.eq(iw0 + fm.stride_width), ih0_next.eq(ih0 + fm.stride_height)]
        delta = Signal.like(row_addr, name="row_delta")
        m.d.sync += [col[k].eq(seed[k]) for k in col]
        m.d.sync += [cols_left.eq(job.valid_col), rows_left.eq(rows_left - 1),
                     row_addr.eq(row_addr + delta)]
        with m.If(iw0_next != iw0_end):
            m.d.comb += delta.eq(ow_step)
            m.d.sync += iw0.eq(iw0_next)
        with m.Elif(ih0_next != ih0_end):
            m.d.comb += delta.eq(oh_delta)
            m.d.sync += [iw0.eq(-fm.pad_left), ih0.eq(ih0_next)]
        with m.Else():
            m.d.comb += delta.eq(image_delta)
            m.d.sync += [iw0.eq(-fm.pad_left), ih0.eq(-fm.pad_top)]
