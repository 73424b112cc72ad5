"""FP32 fused multiply-add: ``acc_out = RNE_fp32(acc_in + a*b)`` (ruling R1).

The datapath is the classic single-rounding FMA: the exact product and the
aligned addend meet in one fixed-point window wide enough that their sum is
exact down to two bits below the result's last place, with a sticky bit for
everything further down; one leading-zero count normalizes (or, for a
subnormal result, denormalizes) the sum, and one round-to-nearest-even step
packs it.  ``docs/hdl-numeric.md`` derives the window widths.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .numeric_types import (FP32_BIAS, FP32_EMIN_SUBNORMAL, FP32_FRAC_BITS,
                            NumericConfig, count_leading_zeros, pipeline_boundary)

__all__ = ["Fma32", "FP32_CANONICAL_NAN", "FP32_INF"]

FP32_CANONICAL_NAN = 0x7FC00000
FP32_INF = 0x7F800000

_P = FP32_FRAC_BITS + 1          # FP32 precision (24)

#: Registered pipeline boundaries for each latency, in the order they are
#: added: output first, then after the multiplier, after the adder, after the
#: normalizing shifter (the longest stage), after the alignment shifter.
_BOUNDARY_ORDER = ("out", "mul", "add", "norm", "align")


def _wire(m, name, value):
    """A named combinational signal holding ``value`` (shared, not recomputed)."""
    sig = Signal(Value.cast(value).shape(), name=name)
    m.d.comb += sig.eq(value)
    return sig


class Fma32(wiring.Component):
    """Pipelined FP32 fused multiply-add with one rounding.

    ``acc_out = RNE_fp32(acc_in + a*b)``: the product of the two decoded
    operands is exact, the sum is rounded once to nearest-even.  IEEE
    specials: a NaN operand, 0*inf and inf-inf give the canonical NaN
    0x7FC00000; an infinite product or accumulator passes through with its
    sign; overflow rounds to infinity.  Subnormal inputs and results are
    exact/gradual (no FTZ/DAZ).  An exact zero sum is +0 unless both the
    accumulator and the product are -0.

    No status flags are produced (ruling R4: none come from accumulation).

    Parameters
    ----------
    config : NumericConfig
        Must build a floating type; ``config.fma_stages`` is the latency.

    Members
    -------
    a, b : In(config.float_layout)
        Operands from :class:`~ptocube.hdl.input_decoder.InputDecoder`.
    acc_in : In(32)
        FP32 bit pattern of the accumulator.
    acc_out : Out(32)
        FP32 bit pattern of the result, ``latency`` cycles after the inputs
        (combinational when 0).  A new operation may start every cycle; the
        unit has no stall input (wrap it in an ``EnableInserter`` if needed).
    """

    def __init__(self, config: NumericConfig):
        if not isinstance(config, NumericConfig):
            raise TypeError(f"config must be a NumericConfig, not {config!r}")
        if not config.has_float:
            raise ValueError("Fma32 needs a NumericConfig that builds a floating type")
        self.config = config
        layout = config.float_layout
        super().__init__({"a": In(layout), "b": In(layout),
                          "acc_in": In(32), "acc_out": Out(32)})

    @property
    def latency(self) -> int:
        """Cycles from inputs to ``acc_out``."""
        return self.config.fma_stages

    # Window geometry (bit positions in the adder window; see docs/hdl-numeric.md).
    @property
    def product_width(self) -> int:
        return 2 * self.config.sig_width

    @property
    def guard_bits(self) -> int:
        """Window bits below the product's LSB that an aligned addend may occupy."""
        return max(0, _P + 3 - self.product_width)

    @property
    def window_width(self) -> int:
        """Sticky bit + guard bits + product + 3-bit gap + addend + carry."""
        return 1 + self.guard_bits + self.product_width + 3 + _P + 1

    def elaborate(self, platform):
        m = Module()
        # One sub-module per stage: a combinational change then re-evaluates
        # only the stage it reaches (several times faster in pysim) and each
        # stage is its own scope in waveforms and netlists.
        stages = {name: Module() for name in ("mul", "align", "add", "norm", "out")}
        for name, stage in stages.items():
            m.submodules[name] = stage
        registered = set(_BOUNDARY_ORDER[:self.latency])
        s1 = self._multiply(stages["mul"], "mul" in registered)
        s2 = self._align(stages["align"], "align" in registered, s1)
        s3 = self._add(stages["add"], "add" in registered, s2)
        s4 = self._normalize(stages["norm"], "norm" in registered, s3)
        out = self._round(stages["out"], "out" in registered, s4)
        m.d.comb += self.acc_out.eq(out)
        return m

    def _multiply(self, m, registered):
        """Exact product, unpacked accumulator and the special cases."""
        a, b, acc = self.a, self.b, self.acc_in
        acc_e, acc_f = acc[23:31], acc[0:23]
        acc_zero = (acc_e == 0) & (acc_f == 0)
        acc_inf = (acc_e == 0xFF) & (acc_f == 0)
        acc_nan = (acc_e == 0xFF) & (acc_f != 0)
        prod_sign = a.sign ^ b.sign
        prod_zero = a.is_zero | b.is_zero
        prod_inf = a.is_inf | b.is_inf
        nan = (a.is_nan | b.is_nan | acc_nan | (prod_zero & prod_inf)
               | (prod_inf & acc_inf & (prod_sign != acc[31])))
        # Both terms as sig * 2**lsb_exp.
        width = self.config.sig_width
        return pipeline_boundary(
            m, registered, "mul",
            prod_sig=a.sig * b.sig, prod_lsb_exp=a.exp + b.exp - 2 * (width - 1),
            prod_sign=prod_sign, prod_zero=prod_zero,
            acc_sig=Cat(acc_f, acc_e != 0),
            acc_lsb_exp=Mux(acc_e == 0, 1, acc_e) - (FP32_BIAS + FP32_FRAC_BITS),
            acc_sign=acc[31], acc_zero=acc_zero,
            nan=nan, inf=(prod_inf | acc_inf) & ~nan,
            inf_sign=Mux(prod_inf, prod_sign, acc[31]))

    def _align(self, m, registered, s1):
        """Place product and addend in the adder window.

        ``offset`` is the addend's LSB position relative to the product's.  An
        addend more than ``s_max`` above is pinned at ``s_max`` (the product
        then only decides the sticky bit); the parts of one that falls below
        the window collapse into the sticky bit 0.
        """
        base = 1 + self.guard_bits           # window position of the product LSB
        s_max = self.product_width + 3
        win = self.window_width
        offset = _wire(m, "offset", s1["acc_lsb_exp"] - s1["prod_lsb_exp"])
        pinned = _wire(m, "pinned", s1["prod_zero"] | (~s1["acc_zero"] & (offset > s_max)))
        # Exponent of window bit 0: anchored on the addend when pinned.
        w0_exp = Mux(pinned, s1["acc_lsb_exp"] - (base + s_max), s1["prod_lsb_exp"] - base)
        # The addend starts at position base+s_max of the window extended by
        # _P - 1 bits below bit 1; a right shift of `cap` moves it entirely
        # into the extension, which ORs into the sticky bit.
        cap = base + s_max - 1 + _P
        rshift = Mux(pinned | (offset >= s_max), 0,
                     Mux(offset < s_max - cap, cap, s_max - offset))
        placed = Cat(Const(0, _P - 1), s1["acc_sig"].shift_left(base + s_max))
        shifted = placed >> rshift[:cap.bit_length()]
        return pipeline_boundary(
            m, registered, "align",
            prod_window=s1["prod_sig"].shift_left(base),
            acc_window=Cat(shifted[:_P].any(), shifted[_P:_P + win - 1]),
            subtract=s1["prod_sign"] ^ s1["acc_sign"],
            prod_sign=s1["prod_sign"], acc_sign=s1["acc_sign"],
            both_zero_sign=(s1["prod_zero"] & s1["acc_zero"]
                            & s1["prod_sign"] & s1["acc_sign"]),
            w0_exp=w0_exp, nan=s1["nan"], inf=s1["inf"], inf_sign=s1["inf_sign"])

    def _add(self, m, registered, s2):
        """Exact signed sum of the window, as sign and magnitude."""
        total = _wire(m, "total", Mux(s2["subtract"], s2["prod_window"] - s2["acc_window"],
                                      s2["prod_window"] + s2["acc_window"]))
        negative = total < 0
        return pipeline_boundary(
            m, registered, "add",
            magnitude=Mux(negative, -total, total)[:self.window_width],
            sign=Mux(negative, s2["acc_sign"], s2["prod_sign"]),
            both_zero_sign=s2["both_zero_sign"], w0_exp=s2["w0_exp"],
            nan=s2["nan"], inf=s2["inf"], inf_sign=s2["inf_sign"])

    def _normalize(self, m, registered, s3):
        """Shift the result's last place to a fixed frame position.

        The last place is 23 bits below the leading one, but never below
        2**-149 (gradual underflow).  The frame has _P + 2 spare bits below
        the window, so a tiny result whose last place lies above the window
        is a right shift, done here as a smaller left shift; beyond that range
        the value is under a quarter of the last place and rounds to zero.
        """
        win = self.window_width
        mag = s3["magnitude"]
        normal_lsb = _wire(m, "normal_lsb", (win - _P) - count_leading_zeros(m, mag))
        subnormal_lsb = _wire(m, "subnormal_lsb", FP32_EMIN_SUBNORMAL - s3["w0_exp"])
        lsb = _wire(m, "lsb", Mux(normal_lsb > subnormal_lsb, normal_lsb, subnormal_lsb))
        extra = _P + 2
        frame_width = win + extra
        lshift = (win - _P) - lsb + extra     # moves position lsb to frame_width - _P
        shift = Mux(lshift < 0, 0, lshift)[:(frame_width - 1).bit_length()]
        frame = _wire(m, "frame", (mag << shift)[:frame_width])
        return pipeline_boundary(
            m, registered, "norm",
            kept=frame[frame_width - _P:], guard=frame[frame_width - _P - 1],
            sticky=frame[:frame_width - _P - 1].any(),
            biased_exp=s3["w0_exp"] + lsb + (FP32_BIAS + FP32_FRAC_BITS),
            exact_zero=mag == 0, sign=s3["sign"], both_zero_sign=s3["both_zero_sign"],
            nan=s3["nan"], inf=s3["inf"], inf_sign=s3["inf_sign"])

    def _round(self, m, registered, s4):
        """Round to nearest even, pack, and select the special results."""
        round_up = s4["guard"] & (s4["sticky"] | s4["kept"][0])
        sig = s4["kept"] + round_up          # may carry into the next binade
        # sig includes the hidden bit, so a carry out of the significand or a
        # subnormal rounding up to 2**-126 bumps the exponent field by itself.
        packed = _wire(m, "packed", ((s4["biased_exp"] - 1) << FP32_FRAC_BITS) + sig)
        result = Signal(32)
        with m.If(s4["nan"]):
            m.d.comb += result.eq(FP32_CANONICAL_NAN)
        with m.Elif(s4["inf"]):
            m.d.comb += result.eq(Cat(Const(FP32_INF, 31), s4["inf_sign"]))
        with m.Elif(s4["exact_zero"]):
            m.d.comb += result.eq(Cat(Const(0, 31), s4["both_zero_sign"]))
        with m.Elif(packed >= FP32_INF):
            m.d.comb += result.eq(Cat(Const(FP32_INF, 31), s4["sign"]))
        with m.Else():
            m.d.comb += result.eq(Cat(packed[:31], s4["sign"]))
        return pipeline_boundary(m, registered, "out", acc_out=result)["acc_out"]
