"""One processing element of the output-stationary systolic array.

A PE sits at row i, column j of :class:`~ptocube.hdl.systolic.SystolicArray`.
Every cycle it takes one decoded A operand from its left neighbour, one
decoded B operand from above and one control word (travelling with A), and
adds their product to one of its ``slots`` accumulators.  The accumulators
are not a register file: they are the values in flight in the MAC pipeline.
The pipeline is exactly ``slots`` cycles long, so the value leaving it in a
cycle is the one that entered ``slots`` cycles earlier, and feeding it back
gives each of ``slots`` interleaved output chains one term every ``slots``
cycles.  A multi-cycle FMA thereby never waits on itself.

Next to the pipeline, each PE holds ``slots`` 32-bit *chain* registers, one
per slot.  When a chain starts (``first``), the PE *swaps*: the finished
value of the previous chain of that slot goes into the slot's chain
register, and the new chain starts from the register's old content (an
initial accumulator value, for ACC forms) or from zero.  Between swaps the
chain registers of a column form one shift register through which the array
drains results and loads initial values (``shift``); see
``docs/hdl-systolic.md``.
"""

from amaranth.hdl import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .fma import Fma32
from .int_mac import IntMac
from .numeric_types import NumericConfig

__all__ = ["ProcessingElement", "operand_layout", "control_layout", "delay_line"]


def operand_layout(numeric: NumericConfig) -> data.StructLayout:
    """A decoded operand as it travels through the array.

    ``fp``: the float operand (:class:`~ptocube.hdl.numeric_types.FloatOperandLayout`),
    present when the build has floating types; ``int``: the signed integer
    operand, present when it has integer types.
    """
    fields = {}
    if numeric.has_float:
        fields["fp"] = numeric.float_layout
    if numeric.has_int:
        fields["int"] = signed(numeric.int_width)
    return data.StructLayout(fields)


def control_layout(numeric: NumericConfig, slots: int) -> data.StructLayout:
    """The control word that travels along a row with the A operand.

    ``first``: this term starts a new chain in its slot (the PE swaps);
    ``load``: with ``first``, start from the slot's chain register rather
    than zero; ``slot``: the slot this term belongs to (only read on a swap);
    ``is_int``: the term is integer arithmetic (only in builds with both
    classes; selects which MAC's result the slot carries).
    """
    fields = {"first": 1, "load": 1, "slot": unsigned(max(1, (slots - 1).bit_length()))}
    if numeric.has_float and numeric.has_int:
        fields["is_int"] = 1
    return data.StructLayout(fields)


def delay_line(m: Module, value, cycles: int, name: str, reset_less: bool = False):
    """``value`` delayed by ``cycles`` registers (``cycles`` may be 0)."""
    for stage in range(cycles):
        reg = Signal.like(value, name=f"{name}_d{stage}", reset_less=reset_less)
        m.d.sync += reg.eq(value)
        value = reg
    return value


class ProcessingElement(wiring.Component):
    """Multiply-accumulate cell with ``slots`` interleaved accumulators.

    Parameters
    ----------
    numeric : NumericConfig
        The built types; a float build instantiates :class:`~ptocube.hdl.fma.Fma32`,
        an integer build :class:`~ptocube.hdl.int_mac.IntMac` (a full build both).
    slots : int
        Accumulator chains interleaved in the PE; at least the latency of each
        built MAC unit and at least 1.  A shorter unit is padded with
        registers so every path around the accumulator loop is ``slots`` long.

    Members
    -------
    a_in, b_in : In(operand_layout(numeric))
        Operands from the left and from above.  A term that must not change
        its accumulator (a bubble) arrives as A = -0, B = +0 (integer 0 x 0),
        whose product leaves every FP32 value (and -0) unchanged.
    ctl_in : In(control_layout(numeric, slots))
        Control word, in step with ``a_in``.
    a_out, b_out, ctl_out : Out(...)
        The registered inputs, for the right and lower neighbours.
    shift : In(1)
        Shift the chain registers by one position towards ``chain_out``.
        Never asserted in a cycle in which this PE swaps, nor (with
        ``input_lag`` = 1) in the cycle before, when the swapping term's
        control word is in the operand register and its start value is read.
    chain_in : In(32)
        Chain value from the PE below (or the array's fill input).
    chain_out : Out(32)
        Chain register of slot 0: goes to the PE above (or the drain output).
    chain_next : Out(32)
        What ``chain_out`` holds after one shift: chain register 1, or
        ``chain_in`` with one slot.
    """

    def __init__(self, numeric: NumericConfig, slots: int):
        if not isinstance(numeric, NumericConfig):
            raise TypeError(f"numeric must be a NumericConfig, not {numeric!r}")
        minimum = self.minimum_slots(numeric)
        if slots < minimum:
            raise ValueError(f"slots must be at least {minimum} (the MAC latency) for this "
                             f"build, not {slots}")
        self.numeric = numeric
        self.slots = slots
        operand = operand_layout(numeric)
        control = control_layout(numeric, slots)
        super().__init__({
            "a_in": In(operand), "b_in": In(operand), "ctl_in": In(control),
            "a_out": Out(operand), "b_out": Out(operand), "ctl_out": Out(control),
            "shift": In(1), "chain_in": In(32), "chain_out": Out(32),
            "chain_next": Out(32),
        })

    @property
    def input_lag(self) -> int:
        """Cycles between an operand's register and the accumulation of its product
        (1 with ``int_product_register``)."""
        return int(self.numeric.int_product_register)

    @staticmethod
    def minimum_slots(numeric: NumericConfig) -> int:
        """Fewest slots that keep every built MAC unit busy every cycle."""
        latencies = [1]
        if numeric.has_float:
            latencies.append(numeric.fma_stages)
        if numeric.has_int:
            latencies.append(numeric.int_mac_stages)
        return max(latencies)

    def elaborate(self, platform):
        m = Module()
        cfg = self.numeric
        slots = self.slots

        # The operand registers are the outputs to the neighbours.  Data registers
        # (operands, sums, chain registers) have no reset: what they hold after a reset is
        # never a result (the two exchanges after reset drain nothing, and every chain
        # starts at a swap), and a reset reaching every flip-flop of the array is a net of
        # thousands of loads.  The control word keeps its reset: a stray `first` would swap.
        operand = operand_layout(cfg)
        a = Signal(operand, name="a", reset_less=True)
        b = Signal(operand, name="b", reset_less=True)
        ctl = self.ctl_out
        m.d.sync += [a.eq(self.a_in), b.eq(self.b_in), ctl.eq(self.ctl_in)]
        m.d.comb += [self.a_out.eq(a), self.b_out.eq(b)]

        chain = Array(Signal(32, name=f"chain{s}", reset_less=True) for s in range(slots))
        acc_in = Signal(32)
        # A new chain starts from its chain register (ACC) or from +0 / 0.
        if self.input_lag:
            # The term is in the operand registers a cycle before it is accumulated:
            # choose the start value then, so the accumulation loop has only a 2:1 mux
            # before its adder, driven by a register of this PE alone (`start` has no
            # reset, so yosys does not merge it with the right neighbour's control
            # register, which holds the same bit).  No shift happens in that cycle.
            init = Signal(32, name="init", reset_less=True)
            start = Signal(name="start", reset_less=True)
            m.d.sync += [init.eq(Mux(ctl.load, chain[ctl.slot], 0)), start.eq(ctl.first)]
        # With the product registered, the control word meets it one cycle later.
        ctl = delay_line(m, ctl, self.input_lag, "ctl_acc")
        if not self.input_lag:
            init, start = Mux(ctl.load, chain[ctl.slot], 0), ctl.first
        # Each unit's result, delayed so that the loop around it is `slots` long.
        results = {}
        if cfg.has_float:
            fma = m.submodules.fma = Fma32(cfg)
            m.d.comb += [fma.a.eq(a.fp), fma.b.eq(b.fp), fma.acc_in.eq(acc_in)]
            results["fp"] = delay_line(m, fma.acc_out, slots - fma.latency, "fma_pad", True)
        if cfg.has_int:
            mac = m.submodules.mac = IntMac(cfg)
            # A MAC that registers its operands itself (the DSP primitive's input
            # registers) takes them where this PE's operand registers do.
            early = mac.input_lag - self.input_lag
            assert early in (0, 1)
            a_mac, b_mac = (self.a_in, self.b_in) if early else (a, b)
            m.d.comb += [mac.a.eq(a_mac.int), mac.b.eq(b_mac.int), mac.acc_in.eq(acc_in)]
            results["int"] = delay_line(m, mac.acc_out, slots - mac.latency, "mac_pad", True)
        if len(results) == 2:
            # Both units see every term; the slot's class, carried round the
            # loop beside the value, says whose result is the accumulator.
            done_is_int = delay_line(m, ctl.is_int, slots, "class")
            done = Mux(done_is_int, results["int"], results["fp"])
        else:
            (done,) = results.values()
        done_acc = Signal(32)
        m.d.comb += done_acc.eq(done)

        m.d.comb += acc_in.eq(Mux(start, init, done_acc))
        with m.If(ctl.first):
            # The chain that just left the pipeline is finished: park it.
            m.d.sync += chain[ctl.slot].eq(done_acc)
        with m.Elif(self.shift):
            for s in range(slots - 1):
                m.d.sync += chain[s].eq(chain[s + 1])
            m.d.sync += chain[slots - 1].eq(self.chain_in)
        m.d.comb += [self.chain_out.eq(chain[0]),
                     self.chain_next.eq(chain[1] if slots > 1 else self.chain_in)]
        return m
