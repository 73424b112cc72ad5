"""Tile storage layouts: CELL geometry, element offsets, pack/unpack (model/layout.py).

The spec's own CELL tests (inventory parts D and K) are transcribed as vectors;
the offsets are also checked against an independent per-element restatement
of the spec's CELL order written here.
"""

import numpy as np
import pytest

from ptocube.model.datatype import DataType
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.layout import (
    CELL_BYTES, Layout, SHARED_MAX_CAPACITY_BYTES, capacity_legal, cell_shape,
    check_capacity, cube_dtype_supported, cube_geometry, cube_shape_legal, element_offsets,
    ordinary_geometry, ordinary_shape_legal, pack, raw_numpy_dtype, unpack)

M16, M32, N8, RM = Layout.CUBE_M16, Layout.CUBE_M32, Layout.CUBE_N8, Layout.ROW_MAJOR
CUBE_LAYOUTS = (M16, M32, N8)
#: One type per width a CUBE layout accepts, plus every other CUBE-legal type.
CUBE_TYPES = [t for t in DataType if t is not DataType.HiF4X2 and t.bits != 64]
WIDTH_REPRESENTATIVES = {32: DataType.FP32, 16: DataType.FP16, 8: DataType.E4M3,
                         4: DataType.E2M1X2}

#: CELL geometry (rows, cols) by layout and width, transcribed from the spec's table.
CELL_TABLE = {
    N8: {32: (4, 8), 16: (8, 8), 8: (16, 8), 4: (32, 8)},
    M32: {32: (32, 1), 16: (32, 2), 8: (32, 4), 4: (32, 8)},
    M16: {32: (16, 2), 16: (16, 4), 8: (16, 8), 4: (16, 16)},
}


def legality(fn, *args, **kwargs):
    with pytest.raises(PTOFault) as info:
        fn(*args, **kwargs)
    assert info.value.fault is FaultClass.TILE_LEGALITY
    return info.value


def reference_offset(layout, bits, rows, r, c):
    """Spec §7.2 restated per element: the CELL index, then the position inside the CELL."""
    cell_r, cell_c = CELL_TABLE[layout][bits]
    if layout is N8:
        k_repeat = -(-rows // cell_r)
        cell = (c // 8) * k_repeat + r // cell_r
        within = (c % 8) * cell_r + r % cell_r
    else:
        cell, inner = c // cell_c, c % cell_c
        if layout is M16 and bits == 4:
            if 4 <= inner < 8:
                inner += 4
            elif 8 <= inner < 12:
                inner -= 4
        within = r * cell_c + inner
    return cell * cell_r * cell_c + within


def payload_lanes(payload, bits):
    """Every storage position of a payload as an integer array (independent of unpack)."""
    if bits == 4:
        return np.stack([payload & 0xF, payload >> 4], axis=1).ravel()
    return payload.view(f"<u{bits // 8}")


def random_cube_shape(rng, layout, dtype, max_cells=40):
    cell_r, cell_c = cell_shape(layout, dtype)
    if layout is N8:
        return int(rng.integers(1, cell_r * 5)), int(rng.integers(1, 8 * 5))
    return int(rng.integers(1, cell_r + 1)), int(rng.integers(1, cell_c * max_cells))


def capacity_for(required):
    return -(-required // CELL_BYTES) * CELL_BYTES


# ---------------------------------------------------------------- CELL geometry

@pytest.mark.parametrize("layout", CUBE_LAYOUTS)
@pytest.mark.parametrize("bits", [32, 16, 8, 4])
def test_cell_geometry_table(layout, bits):
    # PTO-AVS-TILE-CUBE-CELL-WIDTH-001: every CELL is exactly 1024 bits.
    for dtype in (t for t in CUBE_TYPES if t.bits == bits):
        assert cell_shape(layout, dtype) == CELL_TABLE[layout][bits]
    rows, cols = CELL_TABLE[layout][bits]
    assert rows * cols * bits == CELL_BYTES * 8


@pytest.mark.parametrize("layout", CUBE_LAYOUTS)
@pytest.mark.parametrize("dtype", [DataType.HiF4X2, DataType.FP64, DataType.S64, DataType.U64])
def test_unsupported_cube_types(layout, dtype):
    assert not cube_dtype_supported(dtype)
    legality(cell_shape, layout, dtype)
    legality(cube_geometry, layout, dtype, 1, 1)


def test_u4x2_is_a_cube_type_and_row_major_is_not_a_cube_layout():
    assert cube_dtype_supported(DataType.U4X2)
    legality(cell_shape, RM, DataType.FP16)
    legality(cube_geometry, Layout.ZN, DataType.FP16, 1, 1)


def test_storage_tails():
    # PTO-AVS-TILE-CUBE-CELL-TAIL-004.
    g = cube_geometry(N8, DataType.FP16, 13, 19)
    assert (g.storage_rows, g.storage_cols) == (16, 24)
    g = cube_geometry(M16, DataType.FP32, 3, 5)
    assert (g.storage_rows, g.storage_cols) == (16, 6)
    g = cube_geometry(M32, DataType.FP16, 13, 19)
    assert (g.storage_rows, g.storage_cols) == (32, 20)
    assert cube_shape_legal(768, 13, 19, DataType.FP16, N8)
    assert cube_shape_legal(384, 3, 5, DataType.FP32, M16)


def test_n8_multi_cell_order():
    # PTO-AVS-TILE-CUBE-CELL-ORDER-003 and PTO-AVS-TILE-CUBE-ALLOCATE-001.
    g = cube_geometry(N8, DataType.FP16, 13, 19)
    assert (g.k_repeat, g.n_repeat, g.cells, g.required_bytes) == (2, 3, 6, 768)
    offsets = element_offsets(N8, DataType.FP16, 13, 19)
    assert offsets[0, 0] == 0
    assert offsets[8, 0] == 64
    assert offsets[0, 8] == 128
    assert offsets[12, 18] == 340


def test_m16_b4_nibble_interleave():
    # PTO-AVS-TILE-CUBE-CELL-M16-B4-002, and the same map in every row and CELL.
    expected = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    offsets = element_offsets(M16, DataType.E2M1X2, 3, 40)
    assert list(offsets[0, :16]) == expected
    assert list(offsets[2, :16]) == [32 + e for e in expected]
    assert list(offsets[1, 16:32]) == [256 + 16 + e for e in expected]
    # No interleave for M32 or N8 with 4-bit data, nor for M16 with 8-bit data.
    assert list(element_offsets(M32, DataType.U4X2, 1, 8)[0]) == list(range(8))
    assert list(element_offsets(M16, DataType.U8, 1, 8)[0]) == list(range(8))
    assert list(element_offsets(N8, DataType.S4X2, 32, 1)[:, 0]) == list(range(32))


def test_m16_b4_tload_bytes_and_words():
    # PTO-AVS-TILE-TLOAD-CUBE-M16-B4-005: logical nibbles 0..15 of row 0 land at payload
    # positions 0-3, 8-11, 4-7, 12-15; as 32-bit little-endian words, word 0 holds
    # x0 x1 x2 x3 x8 x9 x10 x11 and word 1 holds x4 x5 x6 x7 x12 x13 x14 x15.
    raw = np.zeros((2, 16), dtype=np.uint8)
    raw[0] = np.arange(16)
    payload = pack(raw, M16, DataType.U4X2, 128)
    lanes = payload_lanes(payload, 4)
    assert (lanes[0], lanes[3], lanes[4], lanes[7]) == (0, 3, 8, 11)
    assert (lanes[8], lanes[11], lanes[12], lanes[15]) == (4, 7, 12, 15)
    assert payload[:8].tobytes() == bytes([0x10, 0x32, 0x98, 0xBA, 0x54, 0x76, 0xDC, 0xFE])
    assert list(payload[:8].view("<u4")) == [0xBA983210, 0xFEDC7654]
    assert (unpack(payload, M16, DataType.U4X2, 2, 16) == raw).all()


def test_n8_fp16_tload_values_are_little_endian():
    # PTO-AVS-TILE-TLOAD-CUBE-001: value row*32 + col + 1 at each CUBE storage index.
    r, c = np.mgrid[0:13, 0:19]
    payload = pack(r * 32 + c + 1, N8, DataType.FP16, 768)
    element = payload.view("<u2")
    assert (element[0], element[63], element[64], element[340]) == (1, 232, 257, 403)
    assert (payload[680], payload[681]) == (403 & 0xFF, 403 >> 8)


def test_one_value_per_width_reaches_its_storage_index():
    # PTO-AVS-TILE-TLOAD-CUBE-WIDTHS-003 (the tile side of each TLOAD).
    raw = np.zeros((2, 2), dtype=np.uint32)
    raw[0, 0] = 0x89ABCDEF
    assert pack(raw, M32, DataType.FP32, 256)[:4].tobytes() == bytes([0xEF, 0xCD, 0xAB, 0x89])
    raw = np.zeros((2, 5), dtype=np.uint16)
    raw[1, 4] = 0xBEEF                       # CELL 1, row 1, column 0 -> index 68
    assert pack(raw, M16, DataType.FP16, 256)[136:138].tobytes() == bytes([0xEF, 0xBE])
    raw = np.zeros((2, 9), dtype=np.uint8)
    raw[1, 8] = 0x7E                         # CELL 1 (n=1), K row 1 -> index 129
    assert pack(raw, N8, DataType.E4M3, 256)[129] == 0x7E
    raw = np.zeros((2, 9), dtype=np.uint8)
    raw[0, 0], raw[0, 1] = 0xA, 0xB          # N8 column 1 starts 32 lanes later
    payload = pack(raw, N8, DataType.U4X2, 256)
    assert (payload[0], payload[16]) == (0x0A, 0x0B)


def test_packed_lane_order_vector():
    # Hardware numeric vectors `packed_lane_order`: byte 0x91 holds lanes (0x1, 0x9).
    payload = pack([[0x1, 0x9]], RM, DataType.E2M1X2, 128, phys_cols=2)
    assert payload[0] == 0x91 and not payload[1:].any()
    assert list(unpack(payload, RM, DataType.E2M1X2, 1, 2, phys_cols=2)[0]) == [1, 9]


# ---------------------------------------------------------------- capacity

def test_spec_capacity_examples():
    # PTO-AVS-BLOCK-TMATMUL-CUBE-CAPACITY-008: the smallest fitting TSize passes, the next
    # smaller one fails.
    for layout, dtype, rows, cols, cells, fits, fails in [
            (M16, DataType.FP16, 16, 17, 5, 1024, 512),
            (M32, DataType.FP16, 17, 17, 9, 2048, 1024),
            (N8, DataType.FP16, 17, 9, 6, 1024, 512),
            (M16, DataType.FP32, 16, 9, 5, 1024, 512)]:
        g = cube_geometry(layout, dtype, rows, cols)
        assert (g.cells, g.required_bytes) == (cells, cells * 128)
        assert cube_shape_legal(fits, rows, cols, dtype, layout)
        assert not cube_shape_legal(fails, rows, cols, dtype, layout)
        g.check_fits(fits)
        legality(g.check_fits, fails)
        legality(pack, np.zeros((rows, cols), dtype=np.uint16), layout, dtype, fails)


def test_cube_descriptor_rejections():
    # PTO-AVS-TILE-CUBE-CELL-CAPACITY-005.
    assert cube_shape_legal(768, 13, 19, DataType.FP16, N8)
    assert not cube_shape_legal(767, 13, 19, DataType.FP16, N8)
    assert not cube_shape_legal(128, 0, 8, DataType.FP16, N8)
    assert not cube_shape_legal(128, 8, 0, DataType.FP16, N8)
    assert not cube_shape_legal(128, 17, 1, DataType.FP32, M16)
    assert not cube_shape_legal(128, 33, 1, DataType.FP32, M32)
    assert not cube_shape_legal(128, 16, 16, DataType.HiF4X2, M16)
    assert not cube_shape_legal(128, 16, 1, DataType.FP64, M16)
    legality(cube_geometry, M16, DataType.FP32, 17, 1)
    legality(cube_geometry, M32, DataType.FP32, 33, 1)
    legality(cube_geometry, N8, DataType.FP16, 0, 8)
    legality(cube_geometry, N8, DataType.FP16, 8, 65536)


def test_model_element_bound():
    # 64 KiB holds 512 CELLs; the spec's model bound of 32768 storage elements caps b8 at
    # 256 CELLs and b4 at 128, while b32 reaches the full 512.
    assert cube_geometry(M16, DataType.FP32, 16, 1024).cells == 512
    assert cube_shape_legal(65536, 16, 1024, DataType.FP32, M16)
    assert cube_geometry(M16, DataType.FP16, 16, 2048).storage_elements == 32768
    assert cube_geometry(M16, DataType.U8, 16, 2048).cells == 256
    legality(cube_geometry, M16, DataType.U8, 16, 2049)
    assert cube_geometry(N8, DataType.U4X2, 32 * 16, 64).cells == 128
    legality(cube_geometry, N8, DataType.U4X2, 32 * 16, 65)


@pytest.mark.parametrize("capacity,ok", [
    (0, False), (100, False), (128, True), (129, False), (1000, False), (65536, True),
    (65536 + 128, False)])
def test_local_capacity_rule(capacity, ok):
    assert capacity_legal(capacity) == ok
    if ok:
        check_capacity(capacity)
    else:
        legality(check_capacity, capacity)


def test_shared_capacity_limit():
    assert capacity_legal(SHARED_MAX_CAPACITY_BYTES, SHARED_MAX_CAPACITY_BYTES)
    assert not capacity_legal(SHARED_MAX_CAPACITY_BYTES + 128, SHARED_MAX_CAPACITY_BYTES)
    geometry = ordinary_geometry(DataType.FP32, SHARED_MAX_CAPACITY_BYTES, 256,
                                 max_capacity=SHARED_MAX_CAPACITY_BYTES)
    assert (geometry.rows, geometry.cols) == (256, 256)
    legality(ordinary_geometry, DataType.FP32, SHARED_MAX_CAPACITY_BYTES, 256)


def test_ordinary_tile_rule():
    g = ordinary_geometry(DataType.FP16, 128, 8)
    assert (g.rows, g.cols, g.elements) == (8, 8, 64)
    assert ordinary_geometry(DataType.U4X2, 128, 1).rows == 256
    assert ordinary_geometry(DataType.FP64, 1024, 128).rows == 1
    legality(ordinary_geometry, DataType.FP16, 128, 3)          # not a power of two
    legality(ordinary_geometry, DataType.FP16, 128, 0)
    legality(ordinary_geometry, DataType.U8, 65536, 65536)      # not a 16-bit extent
    legality(ordinary_geometry, DataType.FP64, 1024, 256)       # one row is wider than the tile
    legality(ordinary_geometry, DataType.U4X2, 65536, 1)        # 131072 rows
    legality(ordinary_geometry, DataType.FP16, 96, 8)           # capacity not a CELL multiple
    assert ordinary_shape_legal(128, 4, 8, 4, DataType.FP32)
    assert not ordinary_shape_legal(128, 4, 9, 4, DataType.FP32)
    assert not ordinary_shape_legal(128, 4, 8, 5, DataType.FP32)
    assert not ordinary_shape_legal(128, 6, 1, 1, DataType.FP32)


def test_pack_and_unpack_reject_bad_shapes():
    legality(pack, np.zeros((9, 4), dtype=int), RM, DataType.FP32, 128, phys_cols=4)   # 8 rows only
    legality(pack, np.zeros((1, 5), dtype=int), RM, DataType.FP32, 128, phys_cols=4)
    legality(pack, np.zeros((1, 3), dtype=int), RM, DataType.FP32, 128)     # Col 3
    legality(pack, np.zeros((1, 1), dtype=int), Layout.COLUMN_MAJOR, DataType.FP32, 128)
    legality(unpack, np.zeros(512, dtype=np.uint8), M16, DataType.FP16, 16, 17)
    legality(unpack, np.zeros(100, dtype=np.uint8), RM, DataType.U8, 1, 1)
    legality(element_offsets, RM, DataType.U8, 2, 5, phys_cols=4)
    legality(element_offsets, Layout.NZ, DataType.U8, 16, 32)


def test_pack_and_unpack_reject_malformed_arguments():
    with pytest.raises(ValueError):
        pack(np.zeros(4, dtype=int), RM, DataType.U8, 128)                 # not 2-D
    with pytest.raises(ValueError):
        pack([[256]], RM, DataType.U8, 128)                                 # wider than 8 bits
    with pytest.raises(ValueError):
        pack([[16]], RM, DataType.U4X2, 128)
    with pytest.raises(ValueError):
        pack([[-1]], RM, DataType.S8, 128)                                  # raw is unsigned
    with pytest.raises(ValueError):
        pack([[1.5]], RM, DataType.FP32, 128)
    with pytest.raises(ValueError):
        pack(np.zeros((1, 1), dtype=int), M16, DataType.U8, 128, phys_cols=8)
    with pytest.raises(ValueError):
        unpack(np.zeros(128, dtype=np.int16), RM, DataType.U8, 1, 1)


# ---------------------------------------------------------------- offsets and round trips

@pytest.mark.parametrize("layout", CUBE_LAYOUTS)
@pytest.mark.parametrize("bits", [32, 16, 8, 4])
def test_offsets_match_the_spec_per_element(layout, bits):
    rng = np.random.default_rng(1000 + 10 * layout + bits)
    dtype = WIDTH_REPRESENTATIVES[bits]
    for _ in range(4):
        rows, cols = random_cube_shape(rng, layout, dtype, max_cells=6)
        offsets = element_offsets(layout, dtype, rows, cols)
        expected = [[reference_offset(layout, bits, rows, r, c) for c in range(cols)]
                    for r in range(rows)]
        assert offsets.dtype == np.int64
        assert offsets.tolist() == expected


def check_bijection(layout, dtype, rows, cols):
    g = cube_geometry(layout, dtype, rows, cols)
    storage = element_offsets(layout, dtype, g.storage_rows, g.storage_cols)
    # The full storage rectangle is a permutation of the CELL storage positions...
    assert sorted(storage.ravel().tolist()) == list(range(g.storage_elements))
    # ...and the valid region claims the same positions as in that rectangle.
    valid = element_offsets(layout, dtype, rows, cols)
    assert (valid == storage[:rows, :cols]).all()
    assert len(set(valid.ravel().tolist())) == rows * cols


@pytest.mark.parametrize("layout", CUBE_LAYOUTS)
@pytest.mark.parametrize("dtype", CUBE_TYPES)
def test_offsets_are_a_bijection(layout, dtype):
    rng = np.random.default_rng(2000 + 32 * layout + dtype)
    for _ in range(3):
        check_bijection(layout, dtype, *random_cube_shape(rng, layout, dtype))


def check_round_trip(rng, layout, dtype):
    if layout is RM:
        phys_cols = 1 << int(rng.integers(0, 7))
        capacity = capacity_for(phys_cols * dtype.bits // 8 * int(rng.integers(1, 9)) or 1)
        geometry = ordinary_geometry(dtype, capacity, phys_cols)
        rows = int(rng.integers(0, geometry.rows + 1))
        cols = int(rng.integers(0, phys_cols + 1))
        kwargs = {"phys_cols": phys_cols}
    else:
        rows, cols = random_cube_shape(rng, layout, dtype)
        capacity = cube_geometry(layout, dtype, rows, cols).required_bytes + CELL_BYTES * int(
            rng.integers(0, 3))
        kwargs = {}
    top = (1 << dtype.bits) - 1
    raw = rng.integers(0, top, size=(rows, cols), dtype=np.uint64, endpoint=True)
    payload = pack(raw, layout, dtype, capacity, **kwargs)
    assert payload.dtype == np.uint8 and payload.shape == (capacity,)
    back = unpack(payload, layout, dtype, rows, cols, **kwargs)
    assert back.dtype == raw_numpy_dtype(dtype)
    assert (back == raw).all()
    # Padding positions are zero: writing all-ones sets exactly the claimed positions.
    full = payload_lanes(pack(np.full((rows, cols), top, dtype=np.uint64), layout, dtype,
                              capacity, **kwargs), dtype.bits)
    offsets = element_offsets(layout, dtype, rows, cols, kwargs.get("phys_cols"))
    claimed = np.zeros(full.size, dtype=bool)
    claimed[offsets.ravel()] = True
    assert (full[claimed] == top).all() and not full[~claimed].any()


ROUND_TRIP_CASES = ([(RM, t) for t in DataType]
                    + [(layout, t) for layout in CUBE_LAYOUTS for t in CUBE_TYPES])


@pytest.mark.parametrize("layout,dtype", ROUND_TRIP_CASES)
def test_round_trip(layout, dtype):
    rng = np.random.default_rng(3000 + 32 * layout + dtype)
    for _ in range(3):
        check_round_trip(rng, layout, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("layout,dtype", ROUND_TRIP_CASES)
def test_round_trip_sweep(layout, dtype):
    rng = np.random.default_rng(4000 + 32 * layout + dtype)
    for _ in range(60):
        check_round_trip(rng, layout, dtype)
        if layout is not RM:
            check_bijection(layout, dtype, *random_cube_shape(rng, layout, dtype, max_cells=120))


def test_64_bit_row_major_values_keep_every_bit():
    raw = np.array([[2**64 - 1, 0x0123456789ABCDEF]], dtype=np.uint64)
    payload = pack(raw, RM, DataType.U64, 128, phys_cols=2)
    assert payload[8:16].tobytes() == bytes.fromhex("efcdab8967452301")
    assert (unpack(bytes(payload), RM, DataType.U64, 1, 2, phys_cols=2) == raw).all()


def test_odd_packed_extent_leaves_the_high_nibble_zero():
    payload = pack([[0xF, 0xF, 0xF]], RM, DataType.S4X2, 128, phys_cols=4)
    assert payload[:2].tobytes() == bytes([0xFF, 0x0F])
    # A stray high nibble is ignored on read.
    payload[1] |= 0xA0
    assert list(unpack(payload, RM, DataType.S4X2, 1, 3, phys_cols=4)[0]) == [15, 15, 15]
