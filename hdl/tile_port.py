"""The tile store's ports towards the execution engines.

This module is the contract between the tile store (:mod:`ptocube.hdl.tile_store`) and the
engines that run an approved plan (:mod:`ptocube.hdl.cube`, the TIMG2COL wiring of
:mod:`ptocube.hdl.top`).  An engine sees the store through three streams and one lookup:

* ``desc_req`` / ``desc_rsp`` - the descriptor of a Local register (space PE0..PE3, index
  0..63) or of a Shared register (space SHARED, index 0..255), with the CELL address where its
  payload starts (:data:`OperandDescLayout`).
* ``mem_req`` / ``mem_rsp`` - read one 64-bit payload word.
* ``mem_wr`` - write one 64-bit payload word under a byte mask.

Payload memories are 64 bits wide, one per PE and one for the Shared tiles, and addressed in
64-bit words from the start of that memory; a tile's payload is stored from its base CELL in
the spec's byte layout (:mod:`ptocube.model.layout`), little-endian within a word.  Every
stream follows :mod:`amaranth.lib.stream`: a source holds ``valid`` and the payload until the
transfer.  Responses come back in request order, after any latency of one cycle or more, and
the store holds a response until it is taken.  Words an engine writes into a newly allocated
output register are invisible until the top level publishes the group, so writing them
directly is the staging the spec's atomic publication needs.
"""

from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.layout import CELL_BYTES
from .config import CubeConfig

__all__ = ["MemSpace", "word_addr_width", "cell_addr_width", "OperandDescLayout",
           "DescReqLayout", "MemReqLayout", "MemWriteLayout", "TilePortSignature"]

WORD_BYTES = 8


class MemSpace(enum.Enum, shape=3):
    """Which payload memory a request addresses."""
    PE0 = 0
    PE1 = 1
    PE2 = 2
    PE3 = 3
    SHARED = 4


def _largest_memory(config: CubeConfig) -> int:
    return max(config.tile_bytes_per_pe, config.shared_bytes)


def word_addr_width(config: CubeConfig) -> int:
    """Bits of a 64-bit word address in the largest payload memory of the build."""
    return max(1, (_largest_memory(config) // WORD_BYTES - 1).bit_length())


def cell_addr_width(config: CubeConfig) -> int:
    """Bits of a CELL address in the largest payload memory of the build."""
    return max(1, (_largest_memory(config) // CELL_BYTES - 1).bit_length())


def OperandDescLayout(config: CubeConfig) -> data.StructLayout:
    """A register's descriptor as an engine needs it to address its payload.

    ``allocated``: the register holds a tile (for a Shared register: it is published).
    ``dtype``, ``layout``: DataType and :class:`~ptocube.model.layout.Layout` codes.
    ``cells``: capacity in CELLs.  ``valid_rows``/``valid_cols``: the valid shape.
    ``phys_cols``: physical columns of a ROW_MAJOR tile (0 for CUBE layouts).
    ``base``: CELL address of the payload's first byte in its memory.
    """
    return data.StructLayout({
        "allocated": 1,
        "dtype": 5,
        "layout": 3,
        "cells": 12,
        "valid_rows": 16,
        "valid_cols": 16,
        "phys_cols": 16,
        "base": cell_addr_width(config),
    })


#: A descriptor lookup: which memory space, which register.
DescReqLayout = data.StructLayout({"space": MemSpace, "index": 8})


def MemReqLayout(config: CubeConfig) -> data.StructLayout:
    """A payload read: memory space and 64-bit word address."""
    return data.StructLayout({"space": MemSpace, "addr": word_addr_width(config)})


def MemWriteLayout(config: CubeConfig) -> data.StructLayout:
    """A payload write: memory space, word address, data and byte enables (bit i: byte i)."""
    return data.StructLayout({"space": MemSpace, "addr": word_addr_width(config),
                              "data": 64, "mask": 8})


class TilePortSignature(wiring.Signature):
    """An engine's view of the tile store (the engine side; the store uses ``.flip()``)."""

    def __init__(self, config: CubeConfig):
        super().__init__({
            "desc_req": Out(stream.Signature(DescReqLayout)),
            "desc_rsp": In(stream.Signature(OperandDescLayout(config))),
            "mem_req": Out(stream.Signature(MemReqLayout(config))),
            "mem_rsp": In(stream.Signature(64)),
            "mem_wr": Out(stream.Signature(MemWriteLayout(config))),
        })
