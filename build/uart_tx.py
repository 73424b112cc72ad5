"""An 8N1 UART transmitter fed by a byte stream."""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UartTx"]


class UartTx(wiring.Component):
    """Sends each byte of ``data`` as a start bit, 8 data bits (LSB first) and a stop bit.

    divisor: clock cycles per bit (clock frequency / baud rate, rounded).

    Members: ``data`` (in, byte stream; ready while idle) and ``tx`` (out, the line; idles high).
    """

    data: In(stream.Signature(8))
    tx: Out(1, init=1)

    def __init__(self, divisor: int):
        if divisor < 1:
            raise ValueError(f"divisor must be at least 1 cycle per bit, not {divisor}")
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        shift = Signal(10)            # start, 8 data bits, stop; shifted out LSB first
        bits_left = Signal(range(11))
        timer = Signal(range(self.divisor))
        m.d.comb += self.data.ready.eq(bits_left == 0)
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [shift.eq(Cat(Const(0, 1), self.data.payload, Const(1, 1))),
                         bits_left.eq(10), timer.eq(0)]
        with m.Elif(bits_left != 0):
            m.d.comb += self.tx.eq(shift[0])
            with m.If(timer == self.divisor - 1):
                m.d.sync += [timer.eq(0), shift.eq(shift >> 1), bits_left.eq(bits_left - 1)]
            with m.Else():
                m.d.sync += timer.eq(timer + 1)
        return m
