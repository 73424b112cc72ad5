"""Tile storage layouts: where each logical element of a tile lives in its payload.

A tile owns ``capacity_bytes`` bytes of payload (its per-PE TSize: a multiple of
128 bytes, at most 64 KiB for a Local tile).  The golden model and the hardware
tile store share this module's byte layout exactly; the hardware address
generators are tested against :func:`element_offsets`.

Two families of layout matter to the CUBE unit and TIMG2COL:

* **Ordinary row-major** tiles (Bias, MX scales, RowMaxIn, parameter tiles,
  Shared tiles, the TIMG2COL source and destination).  The physical column
  count ``Col`` is a nonzero power of two and the physical row count is exactly
  ``capacity_bits / (Col * bits)``.  Element (r, c) has storage index
  ``r * Col + c``.
* **CUBE layouts** (``CUBE_M16`` and ``CUBE_M32`` for A, C and D; ``CUBE_N8``
  for B).  Storage is a sequence of 128-byte CELLs whose geometry depends on
  the element width (:func:`cell_shape`).  The M layouts hold all M rows in
  one CELL height and step through CELLs along the columns; inside a CELL rows
  follow one another and the column runs fastest.  ``CUBE_N8`` orders CELLs
  K-fast, N-slow (``cell = n_cell * K_repeat + k_cell``) and is column-major
  (K fastest) inside a CELL.  ``CUBE_M16`` with 4-bit data swaps the nibble
  groups 4-7 and 8-11 of each 16-wide CELL row, i.e. swaps bits 2 and 3 of the
  in-CELL column, so that 32-bit word 0 of a row holds logical columns
  0-3, 8-11 and word 1 holds 4-7, 12-15 (ruling R11).

From storage index to bytes: element ``e`` of a ``w``-bit type occupies bits
``[e*w, e*w + w)`` of the payload read as one little-endian bit string.  So a
wider element is stored least-significant byte first at byte ``e * w / 8``, and
a 4-bit lane ``e`` is the low nibble of byte ``e // 2`` when ``e`` is even, the
high nibble when odd (hardware profile ``packed_storage``).  The byte order of
wider elements inside a tile payload is not visible in the executable spec
(its payload is an array of per-element words); little-endian is the project's
choice, consistent with the spec's little-endian memory accesses and its
packed-carrier lane order (see docs/decisions/layout-img2col.md).

Raw element values are unsigned bit patterns (``0 <= v < 2**bits``); this
module never interprets them.  Geometry that breaks an architectural rule
raises :class:`PTOFault` with ``Fault_TileLegality``; malformed Python
arguments (wrong array rank, out-of-range raw values, a payload of the wrong
type) raise :class:`ValueError`.
"""

import enum
from dataclasses import dataclass

import numpy as np

from .datatype import DataType
from .faults import FaultClass, PTOFault

__all__ = [
    "Layout", "CELL_BYTES", "LOCAL_MAX_CAPACITY_BYTES", "SHARED_MAX_CAPACITY_BYTES",
    "MAX_EXTENT", "MODEL_TILE_ELEMENTS", "M16_B4_COLUMN_MAP",
    "CubeGeometry", "OrdinaryGeometry",
    "cube_dtype_supported", "cell_shape", "cube_geometry", "cube_shape_legal",
    "capacity_legal", "check_capacity", "ordinary_geometry", "ordinary_shape_legal",
    "element_offsets", "raw_numpy_dtype", "to_raw_array", "pack", "unpack",
]

#: Bytes in one CELL, the allocation and CUBE storage granule.
CELL_BYTES = 128
#: Largest per-PE capacity of a Local tile (SizeCode 10).
LOCAL_MAX_CAPACITY_BYTES = 65536
#: Largest per-PE capacity of a Shared tile.
SHARED_MAX_CAPACITY_BYTES = 262144
#: Tile extents are 16-bit quantities.
MAX_EXTENT = 65535
#: The executable spec's bound on the storage elements of one CUBE tile
#: (``PTO_MODEL_TILE_ELEMENTS``).  It limits CUBE tiles to 1024 CELLs of b32,
#: 512 of b16, 256 of b8 and 128 of b4; see the decisions file.
MODEL_TILE_ELEMENTS = 32768

#: In-CELL column -> storage column of a CUBE_M16 row with 4-bit data.
M16_B4_COLUMN_MAP = (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)


class Layout(enum.IntEnum):
    """The spec's TileLayout values a tile descriptor may carry.

    The integer values follow the spec's enumeration order; the hardware tile
    descriptor stores the same code.  Only ROW_MAJOR and the three CUBE layouts
    are supported by this tile store: every CUBE and TIMG2COL operand must use
    one of them, and the others are rejected as ``Fault_TileLegality``.
    """

    ROW_MAJOR = 0
    COLUMN_MAJOR = 1
    ZN = 2
    NZ = 3
    CUBE_M16 = 4
    CUBE_M32 = 5
    CUBE_N8 = 6

    @property
    def is_cube(self) -> bool:
        """True for the three CUBE CELL layouts."""
        return self in (Layout.CUBE_M16, Layout.CUBE_M32, Layout.CUBE_N8)


def _illegal(reason: str) -> PTOFault:
    return PTOFault(FaultClass.TILE_LEGALITY, reason)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cube_dtype_supported(dtype: DataType) -> bool:
    """Whether a DataType may be stored in a CUBE layout (not HiF4X2, not 64-bit)."""
    dtype = DataType(dtype)
    return dtype is not DataType.HiF4X2 and dtype.bits != 64


def cell_shape(layout: Layout, dtype: DataType) -> tuple[int, int]:
    """``(cell_rows, cell_cols)`` of one 128-byte CELL for a CUBE layout and type.

    CUBE_N8: K rows x 8 N columns (4/8/16/32 rows for b32/b16/b8/b4);
    CUBE_M32: 32 rows x 1/2/4/8 columns; CUBE_M16: 16 rows x 2/4/8/16 columns.
    """
    layout, dtype = Layout(layout), DataType(dtype)
    if not layout.is_cube:
        raise _illegal(f"{layout.name} is not a CUBE layout")
    if not cube_dtype_supported(dtype):
        raise _illegal(f"{dtype.name} cannot be stored in a CUBE layout")
    elements = CELL_BYTES * 8 // dtype.bits
    if layout is Layout.CUBE_N8:
        return elements // 8, 8
    rows = 16 if layout is Layout.CUBE_M16 else 32
    return rows, elements // rows


@dataclass(frozen=True)
class CubeGeometry:
    """Derived storage of a CUBE tile with ``valid_rows x valid_cols`` logical elements.

    These are the values the spec's tile descriptor records (and legality
    re-checks): storage rows/columns, K_repeat, N_repeat, CELL count and
    storage bytes.  For the M layouts K_repeat counts the CELLs along the
    columns and N_repeat is 1; for CUBE_N8 K_repeat counts CELLs down K and
    N_repeat across N.
    """

    layout: Layout
    dtype: DataType
    valid_rows: int
    valid_cols: int
    cell_rows: int
    cell_cols: int
    storage_rows: int
    storage_cols: int
    k_repeat: int
    n_repeat: int
    cells: int

    @property
    def storage_elements(self) -> int:
        """Elements in the CELL storage, valid and padding alike."""
        return self.cells * self.cell_rows * self.cell_cols

    @property
    def required_bytes(self) -> int:
        """Bytes of CELL storage; the tile's capacity must be at least this."""
        return self.cells * CELL_BYTES

    def check_fits(self, capacity_bytes: int, max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> None:
        """Raise ``Fault_TileLegality`` unless ``capacity_bytes`` is legal and holds the CELLs."""
        check_capacity(capacity_bytes, max_capacity)
        if self.required_bytes > capacity_bytes:
            raise _illegal(
                f"{self.layout.name} {self.dtype.name} {self.valid_rows}x{self.valid_cols} needs "
                f"{self.cells} CELLs = {self.required_bytes} B, capacity is {capacity_bytes} B")


def cube_geometry(layout: Layout, dtype: DataType, rows: int, cols: int) -> CubeGeometry:
    """Storage geometry of a CUBE tile with ``rows x cols`` valid logical elements.

    ``rows``/``cols`` are M x K (A), M x N (C, D) or K x N (B), counted in
    logical elements (4-bit lanes for packed types).  Raises
    ``Fault_TileLegality`` for a non-CUBE layout, an unsupported type, a zero
    or over-16-bit extent, M above the M layout's CELL height, or storage
    beyond :data:`MODEL_TILE_ELEMENTS`.  Capacity is checked separately
    (:meth:`CubeGeometry.check_fits`).
    """
    layout, dtype = Layout(layout), DataType(dtype)
    cell_rows, cell_cols = cell_shape(layout, dtype)
    if not (1 <= rows <= MAX_EXTENT and 1 <= cols <= MAX_EXTENT):
        raise _illegal(f"CUBE extents {rows}x{cols} must each be 1..{MAX_EXTENT}")
    if layout is Layout.CUBE_N8:
        k_repeat = _ceil_div(rows, cell_rows)
        n_repeat = _ceil_div(cols, cell_cols)
        storage_rows = k_repeat * cell_rows
        storage_cols = n_repeat * cell_cols
    else:
        if rows > cell_rows:
            raise _illegal(f"{layout.name} holds at most {cell_rows} rows, got {rows}")
        k_repeat = _ceil_div(cols, cell_cols)
        n_repeat = 1
        storage_rows = cell_rows
        storage_cols = k_repeat * cell_cols
    if storage_rows > MAX_EXTENT or storage_cols > MAX_EXTENT:
        raise _illegal(f"CUBE storage {storage_rows}x{storage_cols} exceeds 16-bit extents")
    geometry = CubeGeometry(layout, dtype, rows, cols, cell_rows, cell_cols,
                            storage_rows, storage_cols, k_repeat, n_repeat, k_repeat * n_repeat)
    if geometry.storage_elements > MODEL_TILE_ELEMENTS:
        raise _illegal(f"CUBE storage of {geometry.storage_elements} elements exceeds "
                       f"{MODEL_TILE_ELEMENTS}")
    return geometry


def cube_shape_legal(capacity_bytes: int, rows: int, cols: int, dtype: DataType,
                     layout: Layout, max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> bool:
    """The spec's CUBE descriptor shape rule as a predicate (no exception)."""
    try:
        cube_geometry(layout, dtype, rows, cols).check_fits(capacity_bytes, max_capacity)
    except PTOFault:
        return False
    return True


def capacity_legal(capacity_bytes: int, max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> bool:
    """A tile capacity is at least one CELL, a whole number of CELLs, and at most ``max_capacity``.

    ``max_capacity`` is 64 KiB for Local tiles and 256 KiB for Shared tiles;
    the core limit (``tile_capacity``) is the allocator's business.
    """
    return (CELL_BYTES <= capacity_bytes <= max_capacity
            and capacity_bytes % CELL_BYTES == 0)


def check_capacity(capacity_bytes: int, max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> None:
    """Raise ``Fault_TileLegality`` unless :func:`capacity_legal`."""
    if not capacity_legal(capacity_bytes, max_capacity):
        raise _illegal(f"tile capacity {capacity_bytes} B is not a multiple of {CELL_BYTES} B "
                       f"in {CELL_BYTES}..{max_capacity}")


@dataclass(frozen=True)
class OrdinaryGeometry:
    """Physical shape of an ordinary row-major tile: ``rows x cols`` elements fill its capacity."""

    dtype: DataType
    capacity_bytes: int
    rows: int
    cols: int

    @property
    def elements(self) -> int:
        """Physical element count (``rows * cols``, equal to capacity_bits / bits)."""
        return self.rows * self.cols


def ordinary_geometry(dtype: DataType, capacity_bytes: int, phys_cols: int,
                      max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> OrdinaryGeometry:
    """The ordinary-tile rule: ``phys_cols`` a power of two, rows = capacity_bits / (cols * bits).

    Raises ``Fault_TileLegality`` for an illegal capacity, a column count that
    is not a nonzero 16-bit power of two, a row wider than the capacity, or
    more than 65535 derived rows.
    """
    dtype = DataType(dtype)
    check_capacity(capacity_bytes, max_capacity)
    if not (1 <= phys_cols <= MAX_EXTENT) or phys_cols & (phys_cols - 1):
        raise _illegal(f"physical columns {phys_cols} must be a power of two in 1..{MAX_EXTENT}")
    capacity_bits, row_bits = capacity_bytes * 8, phys_cols * dtype.bits
    if capacity_bits % row_bits:
        raise _illegal(f"a row of {phys_cols} {dtype.name} does not fit {capacity_bytes} B")
    rows = capacity_bits // row_bits
    if rows > MAX_EXTENT:
        raise _illegal(f"{capacity_bytes} B of {phys_cols}-column {dtype.name} rows gives "
                       f"{rows} rows, more than {MAX_EXTENT}")
    return OrdinaryGeometry(dtype, capacity_bytes, rows, phys_cols)


def ordinary_shape_legal(capacity_bytes: int, phys_cols: int, valid_rows: int, valid_cols: int,
                         dtype: DataType, max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> bool:
    """The spec's ordinary descriptor shape rule as a predicate (no exception)."""
    try:
        geometry = ordinary_geometry(dtype, capacity_bytes, phys_cols, max_capacity)
    except PTOFault:
        return False
    return 0 <= valid_rows <= geometry.rows and 0 <= valid_cols <= geometry.cols


def _cube_offsets(g: CubeGeometry, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Storage index of (r, c); r and c broadcast against each other."""
    cell_elements = g.cell_rows * g.cell_cols
    if g.layout is Layout.CUBE_N8:
        cell = (c // g.cell_cols) * g.k_repeat + r // g.cell_rows
        within = (c % g.cell_cols) * g.cell_rows + r % g.cell_rows
    else:
        inner = c % g.cell_cols
        if g.layout is Layout.CUBE_M16 and g.dtype.bits == 4:
            inner = np.asarray(M16_B4_COLUMN_MAP, dtype=np.int64)[inner]
        cell = c // g.cell_cols
        within = r * g.cell_cols + inner
    return cell * cell_elements + within


def _check_supported(layout: Layout) -> None:
    if not (layout is Layout.ROW_MAJOR or layout.is_cube):
        raise _illegal(f"layout {layout.name} is not supported by the CUBE unit's tile store")


def element_offsets(layout: Layout, dtype: DataType, rows: int, cols: int,
                    phys_cols: int | None = None) -> np.ndarray:
    """Storage element index of each logical element, as ``int64[rows, cols]``.

    CUBE layouts: ``rows x cols`` is the tile's valid shape (it fixes K_repeat)
    and ``phys_cols`` must be omitted.  ROW_MAJOR: ``rows x cols`` is the region
    to address (e.g. the valid region) and ``phys_cols`` the physical column
    count (default ``cols``), which must be at least ``cols``.

    Multiply by ``bits / 8`` for the byte offset; for 4-bit lanes index ``e``
    is the low (even) or high (odd) nibble of byte ``e // 2``.
    """
    layout, dtype = Layout(layout), DataType(dtype)
    _check_supported(layout)
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    if layout.is_cube:
        if phys_cols is not None:
            raise ValueError("phys_cols is derived from the shape for CUBE layouts; omit it")
        return _cube_offsets(cube_geometry(layout, dtype, rows, cols), r, c)
    phys_cols = cols if phys_cols is None else phys_cols
    if rows < 0 or cols < 0 or phys_cols < max(cols, 1):
        raise _illegal(f"row-major region {rows}x{cols} does not fit {phys_cols} physical columns")
    return r * phys_cols + c


def raw_numpy_dtype(dtype: DataType) -> np.dtype:
    """The unsigned numpy type that holds one raw element (uint8 for 4-bit lanes)."""
    return np.dtype(f"u{max(DataType(dtype).bits, 8) // 8}")


def to_raw_array(values, dtype: DataType) -> np.ndarray:
    """Validate raw bit patterns of ``dtype`` and return them in :func:`raw_numpy_dtype`.

    Raises ValueError for a non-integer array or a value outside ``0 .. 2**bits - 1``.
    """
    dtype = DataType(dtype)
    array = np.asarray(values)
    if array.dtype == object:
        # Python ints beyond int64 (e.g. 64-bit patterns mixed with small ones).
        try:
            array = array.astype(np.uint64)
        except (OverflowError, TypeError, ValueError) as exc:
            raise ValueError(f"raw {dtype.name} values must be integers "
                             f"0..2**{dtype.bits}-1") from exc
    if array.dtype.kind not in "iu":
        raise ValueError(f"raw {dtype.name} values must be integers, got {array.dtype}")
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= 1 << dtype.bits:
            raise ValueError(f"raw {dtype.name} values must be in 0..2**{dtype.bits}-1, "
                             f"got {low}..{high}")
    return array.astype(raw_numpy_dtype(dtype))


def _layout_offsets(layout: Layout, dtype: DataType, rows: int, cols: int,
                    capacity_bytes: int, phys_cols: int | None, max_capacity: int) -> np.ndarray:
    """Offsets of a ``rows x cols`` valid region after every capacity/shape rule passed."""
    layout = Layout(layout)
    _check_supported(layout)
    if layout.is_cube:
        if phys_cols is not None:
            raise ValueError("phys_cols is derived from the shape for CUBE layouts; omit it")
        cube_geometry(layout, dtype, rows, cols).check_fits(capacity_bytes, max_capacity)
        return element_offsets(layout, dtype, rows, cols)
    geometry = ordinary_geometry(dtype, capacity_bytes, cols if phys_cols is None else phys_cols,
                                 max_capacity)
    if rows > geometry.rows or cols > geometry.cols:
        raise _illegal(f"valid region {rows}x{cols} exceeds the physical "
                       f"{geometry.rows}x{geometry.cols} of a {capacity_bytes} B tile")
    return element_offsets(layout, dtype, rows, cols, geometry.cols)


def pack(raw, layout: Layout, dtype: DataType, capacity_bytes: int,
         phys_cols: int | None = None,
         max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> np.ndarray:
    """Store a ``raw[rows, cols]`` valid region into a ``uint8[capacity_bytes]`` tile payload.

    ``raw`` holds unsigned bit patterns.  Every payload position outside the
    valid region (CELL padding, row-major columns past ``cols``, the high
    nibble after an odd 4-bit extent, bytes past the CELL storage) is zero.
    ``phys_cols`` is the physical column count of a ROW_MAJOR tile (default
    ``cols``); omit it for CUBE layouts.  Raises ``Fault_TileLegality`` when the
    shape does not fit the capacity or breaks the layout's rules.
    """
    dtype = DataType(dtype)
    values = to_raw_array(raw, dtype)
    if values.ndim != 2:
        raise ValueError(f"raw must be a 2-D [rows, cols] array, got shape {values.shape}")
    offsets = _layout_offsets(layout, dtype, *values.shape, capacity_bytes, phys_cols, max_capacity)
    if dtype.bits == 4:
        lanes = np.zeros(capacity_bytes * 2, dtype=np.uint8)
        lanes[offsets] = values
        return lanes[0::2] | (lanes[1::2] << 4)
    elements = np.zeros(capacity_bytes * 8 // dtype.bits, dtype=f"<u{dtype.bits // 8}")
    elements[offsets] = values
    return elements.view(np.uint8)


def unpack(payload, layout: Layout, dtype: DataType, rows: int, cols: int,
           phys_cols: int | None = None,
           max_capacity: int = LOCAL_MAX_CAPACITY_BYTES) -> np.ndarray:
    """Read the ``rows x cols`` valid region of a tile payload; inverse of :func:`pack`.

    ``payload`` is the tile's whole payload (``bytes`` or a 1-D uint8 array);
    its length is the capacity.  Returns raw bit patterns in
    :func:`raw_numpy_dtype`.  Padding positions are never read.
    """
    dtype = DataType(dtype)
    if isinstance(payload, (bytes, bytearray, memoryview)):
        payload = np.frombuffer(payload, dtype=np.uint8)
    payload = np.ascontiguousarray(payload)
    if payload.dtype != np.uint8 or payload.ndim != 1:
        raise ValueError(f"payload must be a 1-D uint8 array, got {payload.dtype} {payload.shape}")
    offsets = _layout_offsets(layout, dtype, rows, cols, payload.size, phys_cols, max_capacity)
    if dtype.bits == 4:
        lanes = np.empty(payload.size * 2, dtype=np.uint8)
        lanes[0::2] = payload & 0x0F
        lanes[1::2] = payload >> 4
        return lanes[offsets]
    elements = payload.view(f"<u{dtype.bits // 8}")
    return elements[offsets].astype(raw_numpy_dtype(dtype))
