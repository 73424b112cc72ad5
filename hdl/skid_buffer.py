"""A two-entry stream register that cuts the ``ready`` path between two pipeline stages.

The bundle decoder registers each fetched instruction in one, and the TIMG2COL engine puts
one between its address generator and its copy (issue #9).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """A two-entry stream register whose ``i.ready`` is a register output.

    It cuts the combinational ``ready`` path between two pipeline stages at full throughput:
    the payload is registered (``o`` is valid one cycle after a transfer on ``i``), and a
    second entry catches the transfer that arrives in the cycle ``o`` stalls.  ``level``
    (read-only) counts the entries held.
    """

    def __init__(self, shape):
        self.level = Signal(range(3))
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        spare = Signal.like(self.i.payload)
        spare_valid = Signal()
        m.d.comb += [self.i.ready.eq(~spare_valid), self.level.eq(self.o.valid + spare_valid)]
        with m.If(~self.o.valid | self.o.ready):
            # The output register is free at the next edge: refill it from the spare entry
            # first, else from the input.
            with m.If(spare_valid):
                m.d.sync += [self.o.p.eq(spare), self.o.valid.eq(1), spare_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.p.eq(self.i.p), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += spare_valid.eq(1)
        # An empty spare entry follows the input whatever happens: only its valid bit waits
        # for the handshake (the late ``valid``/``ready`` do not reach the wide enable).
        with m.If(~spare_valid):
            m.d.sync += spare.eq(self.i.p)
        return m
