"""Decode one raw Matrix input element into the datapath's internal form.

The decoder is combinational.  In a systolic array it belongs at the array
edge (one per row for A, one per column for B), so its normalizing shifter is
paid per edge lane, not per processing element.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..model.datatype import MX_SCALED_TYPES
from .numeric_types import (E8M0_BIAS, E8M0_NAN, FLOAT_FORMATS, NumericConfig,
                            INT_FORMATS, count_leading_zeros)

__all__ = ["InputDecoder"]


class InputDecoder(wiring.Component):
    """Raw element of any built Matrix input type -> internal operand form.

    The data type is a run-time input (one decoder serves every operation);
    which types exist is fixed at elaboration by ``config.input_types``.

    Parameters
    ----------
    config : NumericConfig

    Members
    -------
    dtype : In(5)
        DataType code of ``raw``.
    raw : In(config.raw_width)
        The element, right-aligned: a 4-bit lane of a packed X2 type in bits
        3:0, an E3M2/E2M3 carrier in bits 7:0 (bits 7:6 ignored, ruling R10),
        TF32/HF32 in a 32-bit carrier (their must-be-zero low fraction bits
        ignored, R10).  Bits above the type's width are ignored.
    scale : In(8), scale_en : In(1)
        Present when ``config.has_scale``.  With ``scale_en`` high, an element
        of a scaled MX type (E4M3, E5M2, E2M1X2, E1M2X2) is multiplied by
        2**(scale - 127); scale 0xFF makes it NaN (ruling R3).  Unscaled types
        ignore both inputs.
    fp : Out(config.float_layout)
        Present when a floating type is built: the float operand
        (:class:`~ptocube.hdl.numeric_types.FloatOperandLayout`), +0 for a
        non-floating ``dtype``.
    int_value : Out(signed(config.int_width))
        Present when an integer type is built: the element's value, 0 for a
        non-integer ``dtype``.
    legal : Out(1)
        ``dtype`` is one of the built types (preflight guarantees it; the
        outputs are the +0/0 defaults when it is not).
    """

    def __init__(self, config: NumericConfig):
        if not isinstance(config, NumericConfig):
            raise TypeError(f"config must be a NumericConfig, not {config!r}")
        self.config = config
        members = {"dtype": In(5), "raw": In(config.raw_width)}
        if config.has_scale:
            members["scale"] = In(8)
            members["scale_en"] = In(1)
        if config.has_float:
            members["fp"] = Out(config.float_layout)
        if config.has_int:
            members["int_value"] = Out(signed(config.int_width))
        members["legal"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        with m.Switch(self.dtype):
            with m.Case(*sorted(t.value for t in cfg.input_types)):
                m.d.comb += self.legal.eq(1)
        if cfg.has_float:
            self._elaborate_float(m)
        if cfg.has_int:
            self._elaborate_int(m)
        return m

    def _elaborate_float(self, m):
        cfg = self.config
        width = cfg.sig_width
        raw = self.raw
        # Per-type field extraction into one unnormalized form: the value is
        # (-1)**sign * Cat(frac, hidden) * 2**(exp - (width - 1)).
        sign = Signal()
        exp = Signal(signed(10))
        frac = Signal(width - 1)
        hidden = Signal()
        is_zero = Signal(init=1)   # non-float dtypes decode to +0
        is_inf = Signal()
        is_nan = Signal()
        scaled = Signal()
        with m.Switch(self.dtype):
            for dtype in sorted(cfg.float_types):
                fmt = FLOAT_FORMATS[dtype]
                with m.Case(dtype.value):
                    m.d.comb += [sign.eq(raw[fmt.sign_bit]),
                                 scaled.eq(dtype in MX_SCALED_TYPES)]
                    if fmt.specials == "hif8":
                        self._hif8_fields(m, raw[:8], exp, frac, hidden,
                                          is_zero, is_inf, is_nan)
                    else:
                        self._binary_fields(m, fmt, exp, frac, hidden,
                                            is_zero, is_inf, is_nan)

        # Normalize subnormals: shift the leading one to the hidden position.
        unnorm = Cat(frac, hidden)
        shift = Signal(range(width + 1))
        m.d.comb += shift.eq(count_leading_zeros(m, unnorm, "norm_clz"))
        sig = (unnorm << shift)[:width]
        norm_exp = exp - shift
        if cfg.has_scale:
            apply = self.scale_en & scaled
            norm_exp = norm_exp + Mux(apply, self.scale - E8M0_BIAS, 0)
            is_nan = is_nan | (apply & (self.scale == E8M0_NAN))
        special = is_zero | is_inf | is_nan
        m.d.comb += [
            self.fp.sign.eq(sign & ~is_nan),
            self.fp.sig.eq(Mux(special, 0, sig)),
            self.fp.exp.eq(Mux(special, 0, norm_exp)),
            self.fp.is_nan.eq(is_nan),
            self.fp.is_inf.eq(is_inf & ~is_nan),
            self.fp.is_zero.eq(is_zero & ~is_nan),
        ]

    def _binary_fields(self, m, fmt, exp, frac, hidden, is_zero, is_inf, is_nan):
        """Sign/exponent/fraction formats (IEEE-like, E4M3 and the finite-only ones)."""
        raw = self.raw
        e_field = raw[fmt.exp_lsb:fmt.exp_lsb + fmt.exp_bits]
        f_field = raw[fmt.exp_lsb - fmt.frac_bits:fmt.exp_lsb]
        e_top = (1 << fmt.exp_bits) - 1
        m.d.comb += [
            exp.eq(Mux(e_field == 0, 1, e_field) - fmt.bias),
            frac.eq(f_field << (self.config.sig_width - 1 - fmt.frac_bits)),
            hidden.eq(e_field != 0),
            is_zero.eq((e_field == 0) & (f_field == 0)),
        ]
        if fmt.specials == "ieee":
            m.d.comb += [is_inf.eq((e_field == e_top) & (f_field == 0)),
                         is_nan.eq((e_field == e_top) & (f_field != 0))]
        elif fmt.specials == "e4m3":
            m.d.comb += is_nan.eq((e_field == e_top) & (f_field == (1 << fmt.frac_bits) - 1))

    def _hif8_fields(self, m, raw, exp, frac, hidden, is_zero, is_inf, is_nan):
        """HiF8: a dot prefix in bits 6.. selects how many exponent bits follow.

        The exponent field holds a sign bit then the magnitude's bits below an
        implicit leading one; the denormals 2**(m-23) are decoded straight to
        normalized form.
        """
        align = self.config.sig_width - 1 - 3   # HiF8 fractions are at most 3 bits
        body = raw[:7]
        m.d.comb += [
            hidden.eq(1),
            is_zero.eq(raw == 0x00),
            is_nan.eq(raw == 0x80),
            is_inf.eq(body == 0x6F),
        ]
        with m.If(body[3:7] == 0b0000):           # denormal: 2**(m-23)
            m.d.comb += exp.eq(body[0:3] - 23)
        with m.Elif(body[3:7] == 0b0001):         # D0: exponent 0
            m.d.comb += [exp.eq(0), frac.eq(body[0:3] << align)]
        with m.Elif(body[4:7] == 0b001):          # D1: exponent +-1
            m.d.comb += [exp.eq(Mux(body[3], -1, 1)), frac.eq(body[0:3] << align)]
        with m.Elif(body[5:7] == 0b01):           # D2: +-(2..3)
            mag = Cat(body[3], Const(1, 1))
            m.d.comb += [exp.eq(Mux(body[4], -mag, mag)), frac.eq(body[0:3] << align)]
        with m.Elif(body[5:7] == 0b10):           # D3: +-(4..7), 2 fraction bits
            mag = Cat(body[2:4], Const(1, 1))
            m.d.comb += [exp.eq(Mux(body[4], -mag, mag)), frac.eq(body[0:2] << (align + 1))]
        with m.Else():                            # D4: +-(8..15), 1 fraction bit
            mag = Cat(body[1:4], Const(1, 1))
            m.d.comb += [exp.eq(Mux(body[4], -mag, mag)), frac.eq(body[0] << (align + 2))]

    def _elaborate_int(self, m):
        raw = self.raw
        with m.Switch(self.dtype):
            for dtype in sorted(self.config.int_types):
                bits, is_signed = INT_FORMATS[dtype]
                value = raw[:bits].as_signed() if is_signed else raw[:bits]
                with m.Case(dtype.value):
                    m.d.comb += self.int_value.eq(value)
