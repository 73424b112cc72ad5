"""What the CUBE engine's units share while they run one PE's share of a Matrix plan.

:class:`RunLayout` is the per-PE *run context* the engine (:mod:`ptocube.hdl.cube`) derives
from the plan and the operand descriptors before a PE starts, and holds still until the PE
is finished: where every operand lives (memory space, base CELL, physical columns) and the
shape facts the address generators need.  :func:`block_walker` is the one definition of the
order in which the engine visits output blocks; the operand feed, the fill source and the
result path each run their own copy of it, one group apart.
"""

from amaranth.hdl import Const, Module, Mux, Signal, Value
from amaranth.lib import data

from .config import CubeConfig
from .tile_port import MemSpace, cell_addr_width

__all__ = ["OperandInfo", "RunLayout", "block_walker", "column_outer", "in_block",
           "select_block"]


def OperandInfo(config: CubeConfig) -> data.StructLayout:
    """One operand: its memory ``space``, ``base`` CELL and log2 of its physical columns
    (row-major tiles; 0 for CUBE layouts)."""
    return data.StructLayout({"space": MemSpace, "base": cell_addr_width(config),
                              "log2p": 4})


def RunLayout(config: CubeConfig) -> data.StructLayout:
    """The run context of one PE (see the module docstring).

    ``m``, ``n``, ``k``: dimensions; ``a_type``/``b_type``/``acc_type``: DataType codes;
    ``a_log2w``/``b_log2w``/``d_log2w``: log2 of the element bits of A, B and D;
    ``b_k_repeat``: CELLs down K of a Local B (CUBE_N8); ``m32``: A, C and D use CUBE_M32
    (else CUBE_M16); ``a_shared``/``b_shared``, ``trans_a``/``trans_b``: Shared primaries and
    their TransA/TransB; ``a_scaled``/``b_scaled``: MX scales; ``acc``: ACC form (C fills
    the chains); ``int_bias``: integer BIAS form (Bias fills the chains); ``float_bias``:
    floating BIAS form (one extra term 1.0 x Bias[j]); ``operands``: the nine sources;
    ``d``, ``row_max``, ``group_max``: the output registers (``log2p`` their physical
    columns); ``d_cells``: D's CELL count; ``space``: this PE's Local memory.
    """
    info = OperandInfo(config)
    return data.StructLayout({
        "space": MemSpace,
        "m": 16, "n": 16, "k": 16,
        "a_type": 5, "b_type": 5, "acc_type": 5,
        "a_log2w": 3, "b_log2w": 3, "d_log2w": 3,
        "b_k_repeat": 13,
        "m32": 1, "a_shared": 1, "b_shared": 1, "trans_a": 1, "trans_b": 1,
        "a_scaled": 1, "b_scaled": 1, "acc": 1, "int_bias": 1, "float_bias": 1,
        "a": info, "b": info, "a_scale": info, "b_scale": info, "c": info, "bias": info,
        "rowmax_in": info, "quant": info, "alpha": info,
        "d": info, "row_max": info, "group_max": info,
        "d_cells": 11,
    })


def column_outer(cols: int, m_dim, n_dim) -> Value:
    """Whether :func:`block_walker` visits block columns outer: when N > M (B's words
    exceed A's for equal element widths, decision C14) on an array with an even number of
    columns (so that a 4-bit D byte never spans two block columns)."""
    return Const(0, 1) if cols % 2 else (n_dim > m_dim)


def block_walker(m: Module, name: str, rows: int, cols: int, slots: int, m_dim, n_dim,
                 restart, step, strides=None, outer=None, limits=None) -> tuple[list, Signal]:
    """Output blocks of the current group, and whether the walk is past the last group.

    Blocks of ``rows`` x ``cols`` outputs are visited row-major ((0, 0), (0, C), ...,
    (R, 0), ...) or, when :func:`column_outer` holds, column-major ((0, 0), (R, 0), ...,
    (0, C), ...), ``slots`` per group.  ``restart`` goes back to the first group, ``step``
    to the next.  Returns, per slot, ``(row0, col0, used)`` - the block's first output row
    and column and whether the slot has a block - and ``done`` (no block left: the group
    after the last).  With ``strides = (row_stride, col_stride)`` each slot also carries
    ``row_base`` and ``col_base``: the block row index times ``row_stride`` and the block
    column index times ``col_stride`` (the operand buffers' entry bases, kept as running
    sums so that no multiplier is needed).  A caller that keeps per-run facts in registers
    may pass ``outer`` (:func:`column_outer` of the run) and ``limits = (M - R, N - C)``
    (clamped at 0): the steps then compare with them instead of comparing M with N and
    adding R or C before the compares.
    """
    col_outer = Signal(name=f"{name}_col_outer")
    m.d.comb += col_outer.eq(column_outer(cols, m_dim, n_dim) if outer is None else outer)
    row0 = Signal(16, name=f"{name}_row0")
    col0 = Signal(16, name=f"{name}_col0")
    if strides is not None:
        row_stride, col_stride = strides
        row_base = Signal(16, name=f"{name}_row_base")
        col_base = Signal(16, name=f"{name}_col_base")
    else:
        row_stride = col_stride = row_base = col_base = Const(0, 16)

    def advance(r, c, rb, cb):
        # The inner index steps; at its end it wraps to 0 and the outer one steps.
        if limits is None:
            wrap = Mux(col_outer, r + rows >= m_dim, c + cols >= n_dim)
        else:
            wrap = Mux(col_outer, r >= limits[0], c >= limits[1])
        step_r = Mux(col_outer, ~wrap, wrap)
        step_c = ~step_r
        reset_r = col_outer & wrap
        reset_c = ~col_outer & wrap
        return (Mux(reset_r, 0, Mux(step_r, r + rows, r))[:16],
                Mux(reset_c, 0, Mux(step_c, c + cols, c))[:16],
                Mux(reset_r, 0, Mux(step_r, rb + row_stride, rb))[:16],
                Mux(reset_c, 0, Mux(step_c, cb + col_stride, cb))[:16])

    slot_blocks = []
    r, c, rb, cb = row0, col0, row_base, col_base
    for s in range(slots):
        if s:
            r, c, rb, cb = advance(r, c, rb, cb)
        block = (r, c, Mux(col_outer, c < n_dim, r < m_dim))
        slot_blocks.append(block + (rb, cb) if strides is not None else block)
    next_r, next_c, next_rb, next_cb = advance(r, c, rb, cb)
    with m.If(restart):
        m.d.sync += [row0.eq(0), col0.eq(0)]
        if strides is not None:
            m.d.sync += [row_base.eq(0), col_base.eq(0)]
    with m.Elif(step):
        m.d.sync += [row0.eq(next_r), col0.eq(next_c)]
        if strides is not None:
            m.d.sync += [row_base.eq(next_rb), col_base.eq(next_cb)]
    done = Signal(name=f"{name}_done")
    m.d.comb += done.eq(Mux(col_outer, col0 >= n_dim, row0 >= m_dim))
    return slot_blocks, done


def in_block(first, offset, size: int) -> Value:
    """``first + offset``: a block's first row (column) plus a row (column) inside it.  The
    first is a multiple of the block's ``size``, so for a power of two the sum is an OR, no
    carry chain (issue #9)."""
    return first | offset if size & (size - 1) == 0 else first + offset


def select_block(m: Module, blocks: list, slot) -> tuple[Signal, Signal, Signal]:
    """``(row0, col0, used)`` of the block that :func:`block_walker` gives slot ``slot``."""
    row0, col0, used = Signal(16), Signal(16), Signal()
    for index, (r, c, u) in enumerate(block[:3] for block in blocks):
        with m.If(slot == index):
            m.d.comb += [row0.eq(r), col0.eq(c), used.eq(u)]
    return row0, col0, used
