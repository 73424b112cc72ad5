"""Where an element of a tile lives in the 64-bit payload words: the engines' address logic.

The hardware twin of :func:`ptocube.model.layout.element_offsets` for the layouts the CUBE
unit reads and writes.  Each function builds combinational logic and returns the element's
*bit address* relative to the tile's first payload byte; :func:`word_and_offset` turns it
into a 64-bit word address in its memory and the bit offset inside that word, and
:func:`extract` cuts the element out of the word.

All strides are powers of two (CELLs are 1024 bits, element widths 4/8/16/32/64 bits,
row-major physical column counts are powers of two), so everything is shifts and masks,
except the CELL index of a ``CUBE_N8`` column, which is ``(col // 8) * K_repeat``
(:func:`n8_column_cells`, computed once per column and shared by its addresses).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value

from ..model.datatype import DataType

__all__ = ["BIT_ADDR_WIDTH", "log2_bits", "cube_m_bits", "n8_column_cells", "cube_n8_bits",
           "row_major_bits", "word_and_offset", "extract", "byte_mask", "log2_of_power"]

#: Bit address width: 256 KiB (the largest Shared tile) is 2**21 bits.
BIT_ADDR_WIDTH = 22


def log2_bits(m: Module, dtype: Value, name: str) -> Signal:
    """log2 of the storage bits of a DataType code (2 for 4-bit lanes .. 6 for 64-bit)."""
    out = Signal(3, name=name)
    with m.Switch(dtype):
        for t in DataType:
            with m.Case(int(t)):
                m.d.comb += out.eq(t.bits.bit_length() - 1)
    return out


def log2_of_power(m: Module, value: Value, name: str) -> Signal:
    """log2 of a power of two (the index of its highest set bit; 0 for 0).

    A tree of halves (does the upper half hold a set bit, then that half's index), so that
    its depth grows with log2 of the width, not with the width."""
    def highest(bits):
        if len(bits) == 1:
            return bits[0], Const(0, 0)
        half = 1 << ((len(bits) - 1).bit_length() - 1)
        lo_any, lo_index = highest(bits[:half])
        hi_any, hi_index = highest(bits[half:])
        width = (half - 1).bit_length()
        return lo_any | hi_any, Cat(Mux(hi_any, hi_index, lo_index)[:width], hi_any)

    out = Signal(range(max(2, len(value))), name=name)
    m.d.comb += out.eq(highest(Value.cast(value))[1])
    return out


def cube_m_bits(m32: Value, log2w: Value, row: Value, col: Value) -> Value:
    """Bit address of element (row, col) of a CUBE_M16 (``m32`` = 0) or CUBE_M32 tile.

    A CELL row holds 64 (M16) or 32 (M32) bits: ``col // cell_cols`` picks the CELL, the
    row its 64- or 32-bit slice, ``col % cell_cols`` the element in it.  4-bit CUBE_M16
    rows swap bits 2 and 3 of the in-CELL column (ruling R11).  The element must fit a
    CELL row (``log2w`` at most 5).
    """
    # col << log2w is the column's bit offset: its bits above the CELL row's width count
    # CELLs, the ones below place the element in the row.  One shift, then selects, rather
    # than a width subtraction before a mask and two shifts (issue #9).
    bits = col << log2w
    swap = ~m32 & (log2w == 2)
    m16_inner = Mux(swap, Cat(bits[0:4], bits[5], bits[4]), bits[0:6])
    inner = Mux(m32, bits[0:5], m16_inner)
    cell = Mux(m32, bits[5:], bits[6:])
    row_bits = Mux(m32, row << 5, row << 6)
    return ((cell << 10) | row_bits | inner)[:BIT_ADDR_WIDTH]


def n8_column_cells(k_repeat: Value, col: Value) -> Value:
    """CELLs before column ``col``'s first CELL in a CUBE_N8 tile: ``(col // 8) * K_repeat``."""
    return (col >> 3) * k_repeat


def cube_n8_bits(log2w: Value, column_cells: Value, row: Value, col: Value) -> Value:
    """Bit address of element (row = k, col = n) of a CUBE_N8 tile (``column_cells`` from
    :func:`n8_column_cells`): CELLs K-fast, N-slow; inside a CELL, 8 columns of 128 bits,
    K fastest."""
    cr_log2 = (7 - log2w)[:3]
    cell = column_cells + (row >> cr_log2)
    within = row & ((Value.cast(1) << cr_log2) - 1)[:8]
    return ((cell << 10) | (col[:3] << 7) | (within << log2w))[:BIT_ADDR_WIDTH]


def row_major_bits(log2w: Value, log2p: Value, row: Value, col: Value) -> Value:
    """Bit address of element (row, col) of a row-major tile with 2**log2p physical columns."""
    return (((row << log2p) + col) << log2w)[:BIT_ADDR_WIDTH]


def word_and_offset(base_cell: Value, bits: Value, width: int) -> tuple[Value, Value]:
    """(64-bit word address, bit offset in the word) of a bit address in a tile at CELL
    ``base_cell``."""
    return ((base_cell << 4) + (bits >> 6))[:width], bits[:6]


def extract(word: Value, offset: Value, log2w: Value, width: int) -> Value:
    """The element of 2**log2w bits at ``offset`` in ``word``, right-aligned in ``width`` bits."""
    shifted = (word >> offset)[:width]
    mask = Mux(log2w == 2, 0xF, Mux(log2w == 3, 0xFF, Mux(log2w == 4, 0xFFFF,
                                                          (1 << 64) - 1)))
    return (shifted & mask)[:width]


def byte_mask(log2w: Value, offset: Value) -> Value:
    """Write enables (bit i: byte i) of the bytes an element of 2**log2w bits at bit
    ``offset`` touches (a 4-bit lane enables its whole byte)."""
    count = Mux(log2w <= 3, 0b1, Mux(log2w == 4, 0b11, Mux(log2w == 5, 0xF, 0xFF)))
    return (count << offset[3:6])[:8]

