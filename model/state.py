"""Architectural state of one PTO core as the CUBE unit and TIMG2COL see it.

* Four PEs, each with 64 Local tile registers.  A register is named by its
  absolute 6-bit TileIndex ``hand * 16 + n - 1`` (hands T, U, M, N; ``T#1`` is
  index 0, ``N#16`` index 63), exactly as the executable spec uses the raw
  B.IOT selector.
* 256 Shared tiles S0..S255, core-private and visible to all PEs.
* 24 general-purpose registers of 64 bits (GPR0 reads as zero).
* The sticky numeric status flags NV DZ OF UF NX (``CORE_STATE[36:32]``).
* The core tile capacity limit (system register ``tile_capacity``).

A :class:`Tile` is one register's complete descriptor plus its payload.  The
payload is stored exactly as the hardware tile store holds it
(:mod:`ptocube.model.layout`), so CUBE operands are kept in CELL order.

**Definedness** is tracked per *storage element slot* of the payload (one
flag per element position, valid or padding), the granularity at which the
executable spec keeps its ``defined_elements`` bits.  The Matrix operations
only need "every valid element is defined" (:attr:`Tile.contents_defined`);
TIMG2COL needs the per-slot flags, because it may reference any storage
element of its row-major source, inside the valid region or not.

**Allocation** follows the spec's core-wide TileIndex namespace: an index is
free only when no PE holds it (the spec keeps one allocation mask per
index), and capacity is charged per PE holding a tile, plus
``popcount(allocation_mask) * capacity`` for every Shared tile.

Tiles are never modified in place once they are in the state: an operation
builds new :class:`Tile` objects and :meth:`State.publish` installs them,
with the status flags, in one step.  This is what makes publication atomic.
"""

import copy
import enum
from dataclasses import dataclass, field

import numpy as np

from .datatype import DataType
from .convert import Flag as StatusFlag  # the sticky status register holds the same five flags
from .faults import PTOFault
from .isa import HANDS
from .layout import (CELL_BYTES, LOCAL_MAX_CAPACITY_BYTES, SHARED_MAX_CAPACITY_BYTES, Layout,
                     capacity_legal, cube_geometry, element_offsets, ordinary_geometry, pack,
                     unpack)

__all__ = ["PE_COUNT", "LOCAL_TILE_COUNT", "SHARED_TILE_COUNT", "GPR_COUNT", "HANDS",
           "CORE_TILE_CAPACITY_BYTES", "Location", "StatusFlag", "Tile", "SharedTile",
           "PEState", "State", "selector_name", "pes_of_mask", "popcount"]

PE_COUNT = 4
LOCAL_TILE_COUNT = 64
SHARED_TILE_COUNT = 256
GPR_COUNT = 24
#: Reset value of the ``tile_capacity`` system register: 2048 CELLs per core.
CORE_TILE_CAPACITY_BYTES = 262144


class Location(enum.Enum):
    """Where a tile may be consumed: CUBE operands live in Matrix, auxiliary tiles in Any."""
    MATRIX = "Matrix"
    ANY = "Any"


def popcount(mask: int) -> int:
    """Number of PEs in a 4-bit PE mask."""
    return bin(mask & 0xF).count("1")


def pes_of_mask(mask: int) -> tuple[int, ...]:
    """PE numbers selected by a 4-bit mask; PE0 is bit 3 (written first)."""
    return tuple(pe for pe in range(PE_COUNT) if mask & (0b1000 >> pe))


def selector_name(index: int) -> str:
    """``T#1``-style name of an absolute TileIndex 0..63."""
    return f"{HANDS[index >> 4]}#{(index & 0xF) + 1}"


@dataclass(eq=False)
class Tile:
    """One tile register: descriptor, payload bytes and per-slot definedness.

    ``payload`` is a ``uint8`` array laid out by :mod:`ptocube.model.layout`;
    ``defined`` has one flag per storage element slot of the payload.  For a
    ROW_MAJOR tile ``phys_cols`` is the physical column count (rows derive from
    the capacity); CUBE tiles derive all geometry from their valid shape.

    A tile may carry a descriptor that an operation will reject (say a CUBE
    tile whose CELLs need more than its capacity, or the wrong location): the
    state holds whatever was configured and preflight judges it.  For such a
    CUBE tile the payload is sized to hold the CELLs all the same.
    """

    dtype: DataType
    layout: Layout
    valid_rows: int
    valid_cols: int
    capacity: int
    location: Location
    payload: np.ndarray
    defined: np.ndarray
    phys_cols: int | None = None
    feature_map: object | None = None     # img2col.FeatureMapDescriptor (ruling R14)

    # ---- construction -------------------------------------------------
    @classmethod
    def from_raw(cls, dtype: DataType, layout: Layout, raw, capacity: int,
                 location: Location | None = None, phys_cols: int | None = None,
                 defined=None, feature_map=None,
                 max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> "Tile":
        """Build a tile holding ``raw[valid_rows, valid_cols]`` bit patterns.

        ``defined`` (bool array of the raw shape, default all True) marks which
        valid elements are defined; padding slots are undefined.  ``location``
        defaults to Matrix for CUBE layouts and Any for ROW_MAJOR.  Raises
        ValueError when the descriptor cannot hold a payload at all (illegal
        capacity, a CUBE shape outside the layout, a row-major region that
        does not fit); other rule breaks are left for preflight to reject.
        """
        dtype, layout = DataType(dtype), Layout(layout)
        raw = np.asarray(raw)
        if raw.ndim != 2 or raw.shape[0] < 1 or raw.shape[1] < 1:
            raise ValueError(f"tile data must be a non-empty 2-D array, got shape {raw.shape}")
        rows, cols = raw.shape
        if not capacity_legal(capacity, max_capacity):
            raise ValueError(f"capacity {capacity} B must be a multiple of {CELL_BYTES} B "
                             f"in {CELL_BYTES}..{max_capacity}")
        if location is None:
            location = Location.MATRIX if layout.is_cube else Location.ANY
        try:
            if layout.is_cube:
                if phys_cols is not None:
                    raise ValueError("a CUBE tile derives its physical columns from its shape")
                storage = max(capacity, cube_geometry(layout, dtype, rows, cols).required_bytes)
                payload = pack(raw, layout, dtype, storage, max_capacity=SHARED_MAX_CAPACITY_BYTES)
            elif layout is Layout.ROW_MAJOR:
                phys_cols = _smallest_power_of_two(cols) if phys_cols is None else phys_cols
                payload = pack(raw, layout, dtype, capacity, phys_cols, max_capacity=max_capacity)
            else:
                raise ValueError(f"layout {layout.name} is not supported by the tile store")
        except PTOFault as fault:
            raise ValueError(f"{dtype.name} {layout.name} {rows}x{cols} in {capacity} B: "
                             f"{fault.reason}") from fault
        tile = cls(dtype, layout, rows, cols, capacity, location, payload,
                   np.zeros(payload.size * 8 // dtype.bits, dtype=bool), phys_cols, feature_map)
        mask = np.ones((rows, cols), dtype=bool) if defined is None else np.asarray(defined, bool)
        if mask.shape != (rows, cols):
            raise ValueError(f"definedness mask shape {mask.shape} differs from data {raw.shape}")
        tile.defined[tile.offsets()[mask]] = True
        return tile

    # ---- geometry -----------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """Valid (logical) shape ``(valid_rows, valid_cols)``."""
        return self.valid_rows, self.valid_cols

    @property
    def rows(self) -> int:
        """Physical rows: derived from the capacity (row-major) or the CELL geometry."""
        if self.layout.is_cube:
            return self.cube_geometry().storage_rows
        return self.capacity * 8 // (self.phys_cols * self.dtype.bits)

    @property
    def cols(self) -> int:
        """Physical columns."""
        if self.layout.is_cube:
            return self.cube_geometry().storage_cols
        return self.phys_cols

    def cube_geometry(self):
        """The CELL geometry of a CUBE tile (:class:`layout.CubeGeometry`)."""
        return cube_geometry(self.layout, self.dtype, self.valid_rows, self.valid_cols)

    def offsets(self) -> np.ndarray:
        """Storage element index of every valid element, ``int64[valid_rows, valid_cols]``."""
        if self.layout.is_cube:
            return element_offsets(self.layout, self.dtype, self.valid_rows, self.valid_cols)
        return element_offsets(self.layout, self.dtype, self.valid_rows, self.valid_cols,
                               self.phys_cols)

    # ---- contents -----------------------------------------------------
    def raw(self) -> np.ndarray:
        """Raw bit patterns of the valid region in logical row-major order."""
        phys = None if self.layout.is_cube else self.phys_cols
        return unpack(self.payload, self.layout, self.dtype, self.valid_rows, self.valid_cols,
                      phys, max_capacity=SHARED_MAX_CAPACITY_BYTES)

    def raw_slots(self) -> np.ndarray:
        """Every storage slot of the payload as raw bit patterns (storage order)."""
        if self.dtype.bits == 4:
            lanes = np.empty(self.payload.size * 2, dtype=np.uint8)
            lanes[0::2] = self.payload & 0x0F
            lanes[1::2] = self.payload >> 4
            return lanes
        return self.payload.view(f"<u{self.dtype.bits // 8}")

    def defined_valid(self) -> np.ndarray:
        """Definedness of each valid element, ``bool[valid_rows, valid_cols]``."""
        return self.defined[self.offsets()]

    @property
    def contents_defined(self) -> bool:
        """True when every valid element is defined (the spec's ``contents_defined``)."""
        return bool(self.defined_valid().all())


def _smallest_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(eq=False)
class SharedTile:
    """A Shared register S0..S255: a row-major tile plus its cooperative state.

    ``allocation_mask``/``initialized_mask`` say which PE quarters own and have
    written the register; a Matrix operation reads it only when it is
    cooperatively ready (:meth:`cooperatively_ready`).
    """

    tile: Tile
    allocation_mask: int = 0b1111
    initialized_mask: int = 0b1111
    published: bool = True

    def descriptor_legal(self) -> bool:
        """The spec's Shared descriptor rule: row-major, legal capacity and geometry."""
        t = self.tile
        if t.layout is not Layout.ROW_MAJOR or self.allocation_mask == 0:
            return False
        if self.initialized_mask & ~self.allocation_mask & 0xF:
            return False
        try:
            geometry = ordinary_geometry(t.dtype, t.capacity, t.phys_cols,
                                         SHARED_MAX_CAPACITY_BYTES)
        except PTOFault:
            return False
        return t.valid_rows <= geometry.rows and t.valid_cols <= geometry.cols

    def cooperatively_ready(self) -> bool:
        """Allocated and initialized on all four PEs, published, every valid element defined."""
        return (self.descriptor_legal() and self.allocation_mask == 0b1111
                and self.initialized_mask == 0b1111 and self.published
                and self.tile.contents_defined)


@dataclass(eq=False)
class PEState:
    """The Local tile registers of one PE, indexed by absolute TileIndex."""
    tiles: list = field(default_factory=lambda: [None] * LOCAL_TILE_COUNT)


@dataclass(eq=False)
class State:
    """Complete architectural state the golden model reads and publishes."""

    pes: list = field(default_factory=lambda: [PEState() for _ in range(PE_COUNT)])
    shared: dict = field(default_factory=dict)          # shared id -> SharedTile
    gprs: list = field(default_factory=lambda: [0] * GPR_COUNT)
    flags: int = 0
    tile_capacity: int = CORE_TILE_CAPACITY_BYTES

    # ---- registers ----------------------------------------------------
    def tile(self, pe: int, index: int) -> Tile | None:
        """The tile in register ``index`` of PE ``pe`` (None when unallocated)."""
        return self.pes[pe].tiles[index]

    def set_tile(self, pe: int, index: int, tile: Tile | None) -> None:
        """Configure (or, with None, release) one Local register: a state-setup hook."""
        self.pes[pe].tiles[index] = tile

    def read_gpr(self, number: int) -> int:
        """GPR value as an unsigned 64-bit integer; GPR0 reads as zero."""
        return 0 if number == 0 else self.gprs[number] & (2**64 - 1)

    def write_gpr(self, number: int, value: int) -> None:
        """Set a GPR (a state-setup hook); writes to GPR0 are rejected."""
        if not 0 <= number < GPR_COUNT:
            raise ValueError(f"GPR number {number} is not in 0..{GPR_COUNT - 1}")
        if number == 0 and value != 0:
            raise ValueError("GPR0 (zero) always reads as zero and cannot be set")
        self.gprs[number] = value & (2**64 - 1)

    # ---- allocation ---------------------------------------------------
    def index_allocated(self, index: int) -> bool:
        """Whether any PE holds register ``index`` (the spec's core-wide allocation)."""
        return any(pe.tiles[index] is not None for pe in self.pes)

    def capacity_in_use(self) -> int:
        """Bytes charged against ``tile_capacity``: Local tiles per PE plus Shared tiles."""
        local = sum(t.capacity for pe in self.pes for t in pe.tiles if t is not None)
        shared = sum(popcount(s.allocation_mask) * s.tile.capacity for s in self.shared.values())
        return local + shared

    def lowest_free_index(self, hand: int, reserved=()) -> int | None:
        """Lowest index of ``hand`` free on every PE and not in ``reserved``, or None."""
        for index in range(hand * 16, hand * 16 + 16):
            if index not in reserved and not self.index_allocated(index):
                return index
        return None

    # ---- publication --------------------------------------------------
    def publish(self, tiles, flags: int = 0) -> None:
        """Install an approved output group in one step.

        ``tiles`` is an iterable of ``(pe, index, Tile)``; ``flags`` is ORed
        into the sticky status.  Every check has already passed, so nothing
        here can fail halfway: the group is applied completely.
        """
        for pe, index, tile in tiles:
            self.pes[pe].tiles[index] = tile
        self.flags |= flags & 0x1F

    def snapshot(self) -> "State":
        """A deep, independent copy (for comparison and rollback in tests and tools)."""
        return copy.deepcopy(self)

    def same_as(self, other: "State") -> bool:
        """True when both states hold identical descriptors, payloads, GPRs and flags."""
        if (self.gprs != other.gprs or self.flags != other.flags
                or self.tile_capacity != other.tile_capacity
                or self.shared.keys() != other.shared.keys()):
            return False
        for mine, theirs in zip(self.pes, other.pes):
            for a, b in zip(mine.tiles, theirs.tiles):
                if not _same_tile(a, b):
                    return False
        for sid, s in self.shared.items():
            o = other.shared[sid]
            if (s.allocation_mask, s.initialized_mask, s.published) != \
                    (o.allocation_mask, o.initialized_mask, o.published):
                return False
            if not _same_tile(s.tile, o.tile):
                return False
        return True


def _same_tile(a: Tile | None, b: Tile | None) -> bool:
    if a is None or b is None:
        return a is b
    return ((a.dtype, a.layout, a.valid_rows, a.valid_cols, a.capacity, a.location, a.phys_cols)
            == (b.dtype, b.layout, b.valid_rows, b.valid_cols, b.capacity, b.location, b.phys_cols)
            and np.array_equal(a.payload, b.payload) and np.array_equal(a.defined, b.defined)
            and a.feature_map == b.feature_map)

