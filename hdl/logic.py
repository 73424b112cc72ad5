"""Small building blocks shared by the components, for timing (issue #9).

Wide selections are written as AND-OR trees over one-hot selects rather than as chains of
multiplexers: a chain puts one LUT level per choice in front of the register it feeds, a
balanced OR tree only the logarithm of their number.  A flag that enables hundreds of
flip-flops is made as several copies (:func:`register_copies`), each near its own share.
"""

import operator

from amaranth.hdl import Const, Module, Mux, Signal, Value

__all__ = ["balanced", "or_tree", "one_hot_select", "KEEP", "registered", "register_copies",
           "load_in_shares", "NO_COLLISION", "FABRIC_REGISTER", "BlockReadPort"]

#: Attributes of a register that synthesis must not merge with an equal one: the builds'
#: yosys scripts (``KEEP_COPIES`` in ``build/pnr.py``) mark the flip-flops driving such a
#: signal ``keep``, which ``opt_merge`` respects.
KEEP = {"keep": 1}

#: Memory attributes telling yosys that a read never meets a write to the same entry in one
#: cycle (or that such a read's data is never used): with :class:`BlockReadPort`, no
#: collision logic around the block RAM.
NO_COLLISION = {"no_rw_check": 1}

#: Attributes of a register after a block RAM read port that the ECP5 flow must leave in the
#: fabric: ``build/outreg.py`` does not make it the RAM's output register (decision F48).
#: A register whose bits each fan out to many loads is better placed between the RAM and
#: them than held in the RAM, whose few output wires then carry every load.
FABRIC_REGISTER = {"ptocube_fabric": 1}


def balanced(op, values):
    """``values`` (at least one) combined by ``op`` as a balanced tree."""
    values = list(values)
    while len(values) > 1:
        values = [op(values[i], values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def or_tree(values):
    """``values`` ORed as a balanced tree (0 when there are none)."""
    values = list(values)
    return balanced(operator.or_, values) if values else Const(0, 1)


def one_hot_select(one_hot, values):
    """``values[i]`` for the set bit ``i`` of ``one_hot`` (0 when none is set; with several
    set, the OR of theirs): an AND-OR, no decoder."""
    return or_tree(Mux(one_hot[i], v, 0) for i, v in enumerate(values))


def registered(m: Module, value, width: int, name: str) -> Signal:
    """A ``width``-bit register that loads ``value`` in every cycle: a fact of inputs that
    hold still while it is used, one level of logic from them (the run facts of the CUBE
    engine's units)."""
    reg = Signal(width, name=name)
    m.d.sync += reg.eq(value)
    return reg


def register_copies(m: Module, value, count: int, name: str, init: int = 0) -> list:
    """``count`` registers that each load ``value`` in every cycle: one fan-out split into
    ``count`` nets, which place and route can keep short (a 256-bit register's enable, say).
    Yosys would merge equal flip-flops back into one; :data:`KEEP` stops it."""
    width = len(Value.cast(value))
    regs = [Signal(width, name=f"{name}{i}", init=init, attrs=KEEP) for i in range(count)]
    m.d.sync += [reg.eq(value) for reg in regs]
    return regs


def load_in_shares(m: Module, target, value, enables):
    """``target`` loads ``value`` in equal shares of its bits, share ``i`` while
    ``enables[i]`` (copies of one enable, :func:`register_copies`): each copy's fan-out is a
    share of the register's width."""
    bits, source = Value.cast(target), Value.cast(value)
    share = -(-len(bits) // len(enables))
    for i, enable in enumerate(enables):
        with m.If(enable):
            m.d.sync += bits[i * share:(i + 1) * share].eq(source[i * share:(i + 1) * share])


class BlockReadPort:
    """A synchronous read port of ``memory`` (latency 1, ``data`` held while ``en`` is low),
    built so that yosys maps it into block RAM with no collision logic.

    An ``amaranth.lib.memory`` read port in the sync domain must return the old entry when a
    write hits it in the same cycle; yosys emulates that around the block RAM with registers
    of the written data and address and a bypass.  An asynchronous port followed by an
    enabled register is the same in simulation, and yosys merges that register into the RAM
    honouring ``no_rw_check`` (the memory's ``attrs``, :data:`NO_COLLISION`): no emulation
    (decision T11).
    """

    def __init__(self, m: Module, memory, name: str):
        port = memory.read_port(domain="comb")
        self.addr = port.addr
        self.en = Signal(name=f"{name}_rd_en")
        self.data = Signal(memory.shape, name=f"{name}_rd_data", reset_less=True)
        with m.If(self.en):
            m.d.sync += self.data.eq(port.data)
