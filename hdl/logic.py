"""Small combinational building blocks shared by the components.

Wide selections are written as AND-OR trees over one-hot selects rather than as chains of
multiplexers: a chain puts one LUT level per choice in front of the register it feeds, a
balanced OR tree only the logarithm of their number (issue #9).
"""

import operator

from amaranth.hdl import Const, Mux

__all__ = ["balanced", "or_tree", "one_hot_select"]


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
