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
        Must build an integer type; ``config.int_mac_stages`` is the latency:
        0 combinational, 1 registered result, 2 registered product as well.

    Members
    -------
    a, b : In(signed(config.int_width))
        Operands from :class:`~ptocube.hdl.input_decoder.InputDecoder`.
    acc_in : In(32)
        Accumulator bits (S32 or U32).
    acc_out : Out(32)
        ``(acc_in + a*b) mod 2**32``, ``latency`` cycles later.
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

    def elaborate(self, platform):
        m = Module()
        stages = self.latency
        s1 = pipeline_boundary(m, stages >= 2, "mul", product=self.a * self.b,
                               acc=self.acc_in)
        s2 = pipeline_boundary(m, stages >= 1, "out", acc_out=(s1["acc"] + s1["product"])[:32])
        m.d.comb += self.acc_out.eq(s2["acc_out"])
        return m
