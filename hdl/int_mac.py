"""Integer multiply-accumulate: ``acc_out = (acc_in + a*b) mod 2**32`` (ruling R2)."""

from amaranth.hdl import ClockSignal, Const, Instance, Module, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .numeric_types import NumericConfig

__all__ = ["IntMac", "Ecp5Multiplier"]


class IntMac(wiring.Component):
    """Exact product, sum wrapped to 32 bits.

    Two's complement wrap-around gives the S32 and the U32 accumulator the
    same bits, so one unit serves both classes: the decoder hands over every
    integer (S16..U4) sign-correctly in ``signed(config.int_width)``, and the
    product of two such values fits in ``2*int_width`` bits exactly.

    Parameters
    ----------
    config : NumericConfig
        Must build an integer type; ``config.int_mac_stages`` is the latency of the
        accumulation (``acc_in`` to ``acc_out``): 0 combinational, 1 registered result,
        2 registered product as well.  ``config.int_product_register`` registers the
        product ahead of that (``input_lag`` = 1): ``acc_in`` then joins the product of
        the ``a``, ``b`` of one cycle earlier, and the accumulation loop is no longer.
        With ``config.dsp_primitives == "ecp5"`` the product comes from an
        :class:`Ecp5Multiplier` that registers its operands and its product
        (``input_lag`` = 2): the caller hands over the operands a cycle before it
        would register them itself, so the registers around the multiplier are the
        DSP's own and the multiplier's delay stays inside the DSP block.

    Members
    -------
    a, b : In(signed(config.int_width))
        Operands from :class:`~ptocube.hdl.input_decoder.InputDecoder`.
    acc_in : In(32)
        Accumulator bits (S32 or U32).
    acc_out : Out(32)
        ``(acc_in + a*b) mod 2**32``, ``latency`` cycles after ``acc_in`` (and
        ``input_lag`` + ``latency`` after ``a``, ``b``).
    """

    def __init__(self, config: NumericConfig):
        if not isinstance(config, NumericConfig):
            raise TypeError(f"config must be a NumericConfig, not {config!r}")
        if not config.has_int:
            raise ValueError("IntMac needs a NumericConfig that builds an integer type")
        self.config = config
        width = config.int_width
        super().__init__({"a": In(signed(width)), "b": In(signed(width)),
                          "acc_in": In(32), "acc_out": Out(32)})

    @property
    def latency(self) -> int:
        """Cycles from inputs to ``acc_out``."""
        return self.config.int_mac_stages

    @property
    def input_lag(self) -> int:
        """Cycles by which ``acc_in`` follows the ``a``, ``b`` it is added to."""
        if self.config.dsp_primitives == "ecp5":
            return Ecp5Multiplier.latency
        return int(self.config.int_product_register)

    def elaborate(self, platform):
        m = Module()
        stages = self.latency
        # Only the low 32 bits of the product reach the wrapped sum.
        if self.config.dsp_primitives == "ecp5":
            mult = m.submodules.dsp = Ecp5Multiplier()
            m.d.comb += [mult.a.eq(self.a), mult.b.eq(self.b)]
            product = mult.p[:32]
        else:
            product = _stage(m, self.input_lag == 1, "dsp", (self.a * self.b)[:32])
        s1_product = _stage(m, stages >= 2, "mul_product", product)
        s1_acc = _stage(m, stages >= 2, "mul_acc", self.acc_in)
        s2 = _stage(m, stages >= 1, "out_acc_out", (s1_acc + s1_product)[:32])
        m.d.comb += self.acc_out.eq(s2)
        return m


def _stage(m: Module, registered: bool, name: str, value):
    """``value`` through a register without reset if ``registered``, else a wire: the MAC's
    registers hold data only (a sum after reset is never a result, see ``pe.py``)."""
    sig = Signal(Value.cast(value).shape(), name=name, reset_less=registered)
    if registered:
        m.d.sync += sig.eq(value)
    else:
        m.d.comb += sig.eq(value)
    return sig


class Ecp5Multiplier(wiring.Component):
    """The ECP5's MULT18X18D with its input and output registers: ``p = a * b``,
    :attr:`latency` = 2 cycles after ``a``, ``b``.

    Signed 18 x 18 -> 36 bits.  REG_INPUTA/B and REG_OUTPUT are clocked from CLK0
    (the ``sync`` domain's clock) with CE0 = 1 and RST0 = 0; the pipeline register
    is bypassed.  Those registers have no reset beyond the configuration's GSR, like
    the fabric registers they replace.  yosys keeps the instance as the cell it
    names and nextpnr times it with its registered model (REGS_ALL), so the
    multiplier's 3.9 ns are inside the block and only routing meets its pins.

    The primitive is elaborated only for an ECP5 (a ``platform`` whose ``family`` is
    ``"ecp5"``: an amaranth-boards ECP5 platform, or the flow's
    :class:`~ptocube.build.pnr.Device`).  Elsewhere (Amaranth's simulator, the formal
    checks, portable Verilog: no platform) it is the behavioural model of that
    configuration: both operands registered, their product registered, nothing else.  So
    the self-test a bitstream carries is the design ``make test`` simulates, with the
    multiplier's registers inside the DSP block (decision F47).

    Members
    -------
    a, b : In(signed(18))
    p : Out(signed(36))
    """

    latency = 2

    a: In(signed(18))
    b: In(signed(18))
    p: Out(signed(36))

    def elaborate(self, platform):
        m = Module()
        if getattr(platform, "family", None) != "ecp5":
            a = Signal(signed(18), reset_less=True)
            b = Signal(signed(18), reset_less=True)
            p = Signal(signed(36), reset_less=True)
            m.d.sync += [a.eq(self.a), b.eq(self.b), p.eq(a * b)]
            m.d.comb += self.p.eq(p)
            return m
        ports = {}
        for k in range(18):
            ports[f"i_A{k}"] = self.a[k]
            ports[f"i_B{k}"] = self.b[k]
        for k in range(36):
            ports[f"o_P{k}"] = self.p[k]
        m.submodules.mult = Instance(
            "MULT18X18D",
            p_REG_INPUTA_CLK="CLK0", p_REG_INPUTB_CLK="CLK0", p_REG_OUTPUT_CLK="CLK0",
            p_REG_INPUTA_CE="CE0", p_REG_INPUTB_CE="CE0", p_REG_OUTPUT_CE="CE0",
            p_REG_INPUTA_RST="RST0", p_REG_INPUTB_RST="RST0", p_REG_OUTPUT_RST="RST0",
            i_CLK0=ClockSignal(), i_CE0=Const(1), i_RST0=Const(0),
            i_SIGNEDA=Const(1), i_SIGNEDB=Const(1),
            **ports)
        return m
