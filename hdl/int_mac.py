"""Integer multiply-accumulate: ``acc_out = (acc_in + a*b) mod 2**32`` (ruling R2)."""

from amaranth.hdl import Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .numeric_types import NumericConfig, pipeline_boundary

__all__ = ["IntMac"]


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
        return int(self.config.int_product_register)

    def elaborate(self, platform):
        m = Module()
        stages = self.latency
        product = pipeline_boundary(m, self.input_lag == 1, "dsp", product=self.a * self.b)
        s1 = pipeline_boundary(m, stages >= 2, "mul", product=product["product"],
                               acc=self.acc_in)
        s2 = pipeline_boundary(m, stages >= 1, "out", acc_out=(s1["acc"] + s1["product"])[:32])
        m.d.comb += self.acc_out.eq(s2["acc_out"])
        return m
