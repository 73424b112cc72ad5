"""Architectural state: tiles, definedness, allocation, capacity, publication."""

import numpy as np
import pytest

from ptocube.model.datatype import DataType
from ptocube.model.layout import Layout
from ptocube.model.state import (CORE_TILE_CAPACITY_BYTES, Location, SharedTile, State,
                                 StatusFlag, Tile, pes_of_mask, popcount, selector_name)

from model_helpers import make_state, sel, tile


def test_selectors_and_masks():
    assert [selector_name(i) for i in (0, 15, 16, 33, 63)] == ["T#1", "T#16", "U#1", "M#2",
                                                               "N#16"]
    assert sel("M#2") == 33 and sel("n#16") == 63
    assert pes_of_mask(0b1000) == (0,)
    assert pes_of_mask(0b0001) == (3,)
    assert pes_of_mask(0b1110) == (0, 1, 2)
    assert popcount(0b1100) == 2
    assert StatusFlag.names(0x14) == ["OF", "NX"]


def test_cube_tile_round_trips_and_reports_geometry():
    raw = np.arange(1, 7, dtype=np.uint16).reshape(2, 3)
    t = Tile.from_raw(DataType.FP16, Layout.CUBE_M16, raw, 128)
    assert np.array_equal(t.raw(), raw)
    assert (t.rows, t.cols) == (16, 4)          # one CELL: 16 rows x 4 FP16 columns
    assert t.location is Location.MATRIX
    assert t.contents_defined
    # Only the six valid slots of the 64-slot CELL are defined.
    assert t.defined.sum() == 6 and t.defined.size == 64


def test_row_major_tile_derives_rows_and_tracks_definedness():
    t = tile("U8", "ROW_MAJOR", [[1, 2, 3]], 128, undefined=[(0, 1)])
    assert (t.rows, t.cols) == (32, 4)
    assert t.location is Location.ANY
    assert not t.contents_defined
    assert t.defined_valid().tolist() == [[True, False, True]]
    assert t.defined[:4].tolist() == [True, False, True, False]
    assert t.raw_slots()[:4].tolist() == [1, 2, 3, 0]


def test_cube_tile_larger_than_its_capacity_is_representable():
    # Preflight must be able to see (and reject) a CUBE descriptor whose CELLs
    # exceed its capacity, as the spec's capacity test configures one.
    t = Tile.from_raw(DataType.FP16, Layout.CUBE_M16, np.ones((16, 17), np.uint16), 512)
    assert t.capacity == 512 and t.payload.size == 640
    assert t.cube_geometry().required_bytes == 640
    assert np.array_equal(t.raw(), np.ones((16, 17)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype=DataType.FP16, layout=Layout.CUBE_M16, raw=np.ones((17, 1)), capacity=1024),
     "at most 16 rows"),
    (dict(dtype=DataType.U8, layout=Layout.ROW_MAJOR, raw=np.ones((1, 1)), capacity=100),
     "multiple of 128"),
    (dict(dtype=DataType.U8, layout=Layout.ROW_MAJOR, raw=np.ones((2, 200), np.uint8),
          capacity=128), "does not fit"),
    (dict(dtype=DataType.U8, layout=Layout.ROW_MAJOR, raw=np.ones((0, 1)), capacity=128),
     "non-empty"),
])
def test_unrepresentable_tiles_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Tile.from_raw(**kwargs)


def test_allocation_uses_the_core_wide_index_namespace():
    state = make_state({(2, "T#1"): tile("U8", "ROW_MAJOR", [[1]])})
    assert state.index_allocated(sel("T#1"))          # held by PE2 only
    assert state.lowest_free_index(0) == sel("T#2")   # so T#1 is not free on any PE
    assert state.lowest_free_index(0, reserved=[1]) == sel("T#3")
    for n in range(1, 17):
        state.set_tile(0, sel(f"U#{n}"), tile("U8", "ROW_MAJOR", [[n]]))
    assert state.lowest_free_index(1) is None


def test_capacity_counts_local_tiles_per_pe_and_shared_tiles_per_quarter():
    t = tile("FP32", "ROW_MAJOR", [[1.0]], 1024)
    state = make_state({"M#1": t}, pes=(0, 1), shared={5: SharedTile(tile("U8", "ROW_MAJOR",
                                                                        [[1]], 512), 0b1100,
                                                                   0b1100)})
    assert state.capacity_in_use() == 2 * 1024 + 2 * 512
    assert state.tile_capacity == CORE_TILE_CAPACITY_BYTES


def test_gprs():
    state = State()
    state.write_gpr(2, -1)
    assert state.read_gpr(2) == 2**64 - 1
    assert state.read_gpr(0) == 0
    with pytest.raises(ValueError, match="GPR0"):
        state.write_gpr(0, 5)
    with pytest.raises(ValueError, match="0..23"):
        state.write_gpr(24, 5)


def test_publish_installs_the_group_and_ors_the_flags():
    state = make_state(flags=StatusFlag.NV)
    before = state.snapshot()
    t = tile("S32", "CUBE_M16", [[7]])
    state.publish([(0, sel("T#1"), t), (3, sel("U#2"), t)], StatusFlag.OF | StatusFlag.NX)
    assert state.tile(0, sel("T#1")) is t and state.tile(3, sel("U#2")) is t
    assert state.tile(1, sel("T#1")) is None
    assert state.flags == 0x15
    assert not state.same_as(before)
    assert before.flags == StatusFlag.NV and before.tile(0, sel("T#1")) is None


def test_snapshot_is_deep_and_same_as_compares_contents():
    state = make_state({"M#1": tile("FP16", "CUBE_M16", [[1, 2]])}, gprs={3: 9})
    copy = state.snapshot()
    assert copy.same_as(state)
    copy.tile(1, sel("M#1")).payload[0] ^= 1
    assert not copy.same_as(state)
    assert state.tile(1, sel("M#1")).raw().tolist() == [[1, 2]]


def test_shared_tile_readiness():
    data = tile("U16", "ROW_MAJOR", [[1, 2]], shared=True)
    assert SharedTile(data).cooperatively_ready()
    assert not SharedTile(data, 0b0011, 0b0011).cooperatively_ready()   # two quarters only
    assert not SharedTile(data, 0b1111, 0b0111).cooperatively_ready()   # not fully written
    assert not SharedTile(data, published=False).cooperatively_ready()
    assert not SharedTile(tile("U16", "ROW_MAJOR", [[1, 2]], undefined=[(0, 0)],
                               shared=True)).cooperatively_ready()
    assert not SharedTile(data, 0b0011, 0b0111).descriptor_legal()      # written, not owned
