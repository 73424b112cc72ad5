"""TIMG2COL golden model (model/img2col.py).

Vectors: the spec's TIMG2COL tests (inventory part J), the three worked
examples of the img2col digest (§11), and seeded random descriptors checked
against an independent per-element reference written below.
"""

import dataclasses

import numpy as np
import pytest

from ptocube.model.datatype import DataType, TIMG2COL_TYPES
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.img2col import (
    FeatureMapDescriptor, FeatureMapLayout, Img2ColShape, check_descriptor, check_operand_types,
    check_window, gather_indices, img2col, output_shape, padding_raw, walk)
from ptocube.model.layout import Layout, pack, unpack

from img2col_cases import (EXAMPLE1, EXAMPLE1_RESULT, EXAMPLE1_SOURCE, EXAMPLE2, EXAMPLE2_RESULT,
                           EXAMPLE2_SOURCE, EXAMPLE3, EXAMPLE3_RESULT, EXAMPLE3_SOURCE,
                           EXAMPLE3_WINDOW, random_descriptor, random_source, random_window,
                           source)

NC1HWC0, NDC1HWC0 = FeatureMapLayout.NC1HWC0, FeatureMapLayout.NDC1HWC0
RM = Layout.ROW_MAJOR
IMG2COL_TYPES = sorted(TIMG2COL_TYPES)


def legality(fn, *args, **kwargs):
    with pytest.raises(PTOFault) as info:
        fn(*args, **kwargs)
    assert info.value.fault is FaultClass.TILE_LEGALITY
    return info.value


# ---------------------------------------------------------------- the spec's TIMG2COL tests

def test_map_001():
    # PTO-AVS-TILE-TIMG2COL-MAP-001: FP32 2x2 image, 2x2 filter -> one row, filter order.
    fm = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 2, 2, 1, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 99)
    raw, defined = source([11, 12, 13, 14], DataType.FP32, 128, 4)
    assert img2col(raw, defined, fm, DataType.FP32, 1, 4).tolist() == [[11, 12, 13, 14]]


def test_pad_001():
    # PTO-AVS-TILE-TIMG2COL-PAD-001: packed channel 1 >= LC takes PAD; its undefined
    # source element is never referenced, so the operation is legal.
    fm = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 77)
    raw, defined = source([21], DataType.S16, 128, 2)
    assert not defined[1]
    assert img2col(raw, defined, fm, DataType.S16, 1, 2).tolist() == [[21, 77]]


def test_offset_001():
    # PTO-AVS-TILE-IMG2COL-OFFSET-001: posK = 1 is applied before decomposing the column.
    fm = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 0)
    raw, defined = source([31, 32], DataType.U8, 128, 2)
    assert img2col(raw, defined, fm, DataType.U8, 1, 1, 0, 1).tolist() == [[32]]


def test_range_001():
    # PTO-AVS-TILE-IMG2COL-RANGE-001: a 1x1 window fits at (0, 0) but not at posK = 1.
    fm = FeatureMapDescriptor(NC1HWC0, logical_channels=1)
    raw, defined = source([5], DataType.U8, 128, 1)
    assert img2col(raw, defined, fm, DataType.U8, 1, 1).tolist() == [[5]]
    legality(img2col, raw, defined, fm, DataType.U8, 1, 1, 0, 1)


def test_data_type_contract():
    # PTO-AVS-TILE-STAGE4-CARRIER-TYPES-001 (U8 legal; E3M2, FP64, U4X2 illegal) and the
    # rest of the contract's nine types.
    for dtype in DataType:
        if dtype in TIMG2COL_TYPES:
            check_operand_types(dtype, dtype, RM, RM)
        else:
            legality(check_operand_types, dtype, dtype, RM, RM)
    assert {DataType.U8} <= TIMG2COL_TYPES
    assert not {DataType.E3M2, DataType.FP64, DataType.U4X2} & TIMG2COL_TYPES


def test_operand_type_and_layout_mismatches():
    legality(check_operand_types, DataType.U16, DataType.S16, RM, RM)
    legality(check_operand_types, DataType.FP16, DataType.FP16, Layout.CUBE_M16, RM)
    legality(check_operand_types, DataType.FP16, DataType.FP16, RM, Layout.CUBE_M16)


def test_invalidated_descriptor_faults():
    # PTO-AVS-TILE-FEATURE-MAP-STATE-001: reconfiguring the tile invalidates its descriptor;
    # TIMG2COL then rejects the source.
    fm = dataclasses.replace(FeatureMapDescriptor(), valid=False)
    raw, defined = source([5], DataType.U8, 128, 1)
    legality(img2col, raw, defined, fm, DataType.U8, 1, 1)


# ---------------------------------------------------------------- worked examples (digest §11)


def test_example1_basic_u16():
    raw, defined = source(EXAMPLE1_SOURCE, DataType.U16, 128, 8)
    assert output_shape(EXAMPLE1) == Img2ColShape(2, 2, 4, 8)
    assert img2col(raw, defined, EXAMPLE1, DataType.U16, 4, 8).tolist() == EXAMPLE1_RESULT


def test_example1_through_tile_payloads():
    # The feature map's linear index is the source tile's storage index: pack the source
    # as a 128 B U16 tile with Col 8, read it back by storage index, publish row-major.
    rows = 8
    src_payload = pack(np.array(EXAMPLE1_SOURCE + [0] * 6).reshape(3, 8), RM, DataType.U16, 128)
    flat = unpack(src_payload, RM, DataType.U16, rows, 8).ravel()
    defined = np.arange(flat.size) < len(EXAMPLE1_SOURCE)
    result = img2col(flat, defined, EXAMPLE1, DataType.U16, 4, 8)
    dst_payload = pack(result, RM, DataType.U16, 128)
    assert dst_payload[:2 * 32].view("<u2").reshape(4, 8).tolist() == EXAMPLE1_RESULT
    assert src_payload[2 * 17:2 * 18].tobytes() == (221).to_bytes(2, "little")


def test_example2_padding_stride_and_logical_channels_u8():
    raw, defined = source(EXAMPLE2_SOURCE, DataType.U8, 128, 8)
    assert padding_raw(EXAMPLE2, DataType.U8) == 0xEE
    assert img2col(raw, defined, EXAMPLE2, DataType.U8, 4, 8).tolist() == EXAMPLE2_RESULT
    # Channel 1 (value 99) is never real data, so leaving it undefined is legal.
    only_channel0 = [i for i in range(len(EXAMPLE2_SOURCE)) if i % 2 == 0]
    raw, defined = source(EXAMPLE2_SOURCE, DataType.U8, 128, 8, defined=only_channel0)
    assert img2col(raw, defined, EXAMPLE2, DataType.U8, 4, 8).tolist() == EXAMPLE2_RESULT


def test_example3_ndc1hwc0_dilation_and_window_s16():
    raw, defined = source(EXAMPLE3_SOURCE, DataType.S16, 128, 16)
    assert img2col(raw, defined, EXAMPLE3, DataType.S16, 8, 8).tolist() == EXAMPLE3_RESULT
    assert img2col(raw, defined, EXAMPLE3, DataType.S16, 3, 4, 3, 2).tolist() == EXAMPLE3_WINDOW
    legality(img2col, raw, defined, EXAMPLE3, DataType.S16, 3, 4, 6, 0)
    legality(img2col, raw, defined, EXAMPLE3, DataType.S16, 3, 4, 0, 5)
    # The last window that fits in each direction.
    assert img2col(raw, defined, EXAMPLE3, DataType.S16, 3, 4, 5, 4).tolist() == [
        row[4:8] for row in EXAMPLE3_RESULT[5:8]]


@pytest.mark.parametrize("fm,rows,cols", [(EXAMPLE1, 4, 8), (EXAMPLE2, 4, 8), (EXAMPLE3, 8, 8)])
def test_walk_reproduces_the_examples(fm, rows, cols):
    index, is_pad = gather_indices(fm, rows, cols)
    steps = list(walk(fm, rows, cols))
    assert [(s.row, s.col) for s in steps] == [(r, c) for r in range(rows) for c in range(cols)]
    assert [s.src_index for s in steps] == index.ravel().tolist()
    assert [s.is_pad for s in steps] == is_pad.ravel().tolist()
    assert (index[is_pad] == -1).all()


# ---------------------------------------------------------------- faults

GOOD = FeatureMapDescriptor(NDC1HWC0, 2, 2, 2, 3, 3, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 3, 0)


@pytest.mark.parametrize("change", [
    {"valid": False},
    {"transposed": True},
    {"layout": 2},
    {"layout": NC1HWC0},                      # depth 2 with NC1HWC0
    {"logical_channels": 5},                  # > C1*C0 = 4
    {"batches": 0}, {"depth": 0}, {"channel_groups": 0}, {"height": 0}, {"width": 0},
    {"channels_per_group": 0}, {"filter_height": 0}, {"filter_width": 0},
    {"stride_height": 0}, {"stride_width": 0}, {"dilation_height": 0},
    {"dilation_width": 0}, {"logical_channels": 0},
    {"height": 65536}, {"stride_width": 70000},
    {"pad_left": -1}, {"pad_right": -1}, {"pad_top": -1}, {"pad_bottom": 65536},
    {"padding": -1}, {"padding": 1 << 64},
])
def test_descriptor_structure_faults(change):
    fm = dataclasses.replace(GOOD, **change)
    legality(check_descriptor, fm, DataType.U8, 1024)
    legality(output_shape, fm)
    legality(gather_indices, fm, 1, 1)


def test_descriptor_bounds_that_pass():
    check_descriptor(GOOD, DataType.U8, 144)     # P = 2*2*2*3*3*2 = 144 exactly
    check_descriptor(dataclasses.replace(GOOD, logical_channels=4, padding=(1 << 64) - 1,
                                         pad_left=65535), DataType.U8, 144)


def test_feature_map_must_fit_the_source_tile():
    legality(check_descriptor, GOOD, DataType.U8, 143)
    raw, defined = source(EXAMPLE1_SOURCE, DataType.U16, 128, 8)
    legality(img2col, raw[:17], defined[:17], EXAMPLE1, DataType.U16, 1, 1)


@pytest.mark.parametrize("change", [
    {"height": 1, "filter_height": 3},                        # receptive 3 > padded 1
    {"width": 2, "filter_width": 2, "dilation_width": 2},     # receptive 3 > padded 2
    {"height": 1, "filter_height": 3, "pad_top": 1},          # still one short
])
def test_empty_output_faults(change):
    fm = dataclasses.replace(EXAMPLE1, **change)
    legality(output_shape, fm)
    raw, defined = source(EXAMPLE1_SOURCE, DataType.U16, 128, 8)
    legality(img2col, raw, defined, fm, DataType.U16, 1, 1)


def test_padding_can_rescue_a_small_input():
    fm = dataclasses.replace(EXAMPLE1, height=1, filter_height=3, pad_top=1, pad_bottom=1,
                             width=2, filter_width=2, dilation_width=2, pad_right=1)
    assert output_shape(fm)[:2] == (1, 1)


def test_window_checks():
    shape = output_shape(EXAMPLE3)
    check_window(shape, 8, 8, 0, 0)
    check_window(shape, 0, 0, 8, 8)
    legality(check_window, shape, 9, 1, 0, 0)
    legality(check_window, shape, 1, 1, 0, 8)
    for bad in [(1, 1, 65536, 0), (1, 1, 0, -1), (-1, 1, 0, 0), (1, 65536, 0, 0)]:
        with pytest.raises(ValueError):
            check_window(shape, *bad)


def test_referenced_undefined_source_faults():
    raw, defined = source(EXAMPLE3_SOURCE, DataType.S16, 128, 16)
    defined[3] = False                       # d0 c1=0 h=0 w=3 (value 3): read only by row m=1
    legality(img2col, raw, defined, EXAMPLE3, DataType.S16, 8, 8)
    legality(img2col, raw, defined, EXAMPLE3, DataType.S16, 1, 8, 1, 0)
    assert img2col(raw, defined, EXAMPLE3, DataType.S16, 1, 8, 2, 0).tolist() == [
        EXAMPLE3_RESULT[2]]


def test_checks_run_in_the_spec_order():
    # Several rules broken at once: the descriptor is reported before the data type,
    # the data type before the output shape, the shape before the window.
    raw, defined = source([5], DataType.U8, 128, 1)
    broken = dataclasses.replace(FeatureMapDescriptor(), transposed=True, height=1,
                                 filter_height=2)
    assert "transposed" in legality(img2col, raw, defined, broken, DataType.E4M3, 1, 1).reason
    no_output = dataclasses.replace(broken, transposed=False)
    assert "E4M3" in legality(img2col, raw, defined, no_output, DataType.E4M3, 1, 1).reason
    assert "empty output" in legality(img2col, raw, defined, no_output, DataType.U8, 1, 2).reason
    raw, defined = source([5], DataType.U8, 128, 1, defined=[])
    assert "exceed" in legality(img2col, raw, defined, FeatureMapDescriptor(),
                                DataType.U8, 1, 2).reason


def test_malformed_arguments():
    raw, defined = source([5], DataType.U8, 128, 1)
    with pytest.raises(ValueError):
        img2col(raw.reshape(8, 16), None, FeatureMapDescriptor(), DataType.U8, 1, 1)
    with pytest.raises(ValueError):
        img2col(raw, defined[:5], FeatureMapDescriptor(), DataType.U8, 1, 1)
    with pytest.raises(ValueError):
        img2col(raw + 256, None, FeatureMapDescriptor(), DataType.U8, 1, 1)


# ---------------------------------------------------------------- descriptor plumbing

def test_descriptor_dict_round_trip():
    fm = dataclasses.replace(EXAMPLE3, padding=(1 << 64) - 2, pad_bottom=3)
    data = fm.to_dict()
    assert data["layout"] == "NDC1HWC0" and data["padding"] == (1 << 64) - 2
    assert FeatureMapDescriptor.from_dict(data) == fm
    assert FeatureMapDescriptor.from_dict({**data, "layout": 1}) == fm
    assert FeatureMapDescriptor.from_dict({"height": 5}) == FeatureMapDescriptor(height=5)
    with pytest.raises(ValueError):
        FeatureMapDescriptor.from_dict({"heigth": 5})
    with pytest.raises(ValueError):
        FeatureMapDescriptor.from_dict({"layout": "NHWC"})


@pytest.mark.parametrize("dtype,expected", [
    (DataType.U8, 0xEF), (DataType.S8, 0xEF), (DataType.FP16, 0xBEEF), (DataType.BF16, 0xBEEF),
    (DataType.S32, 0xDEADBEEF), (DataType.FP32, 0xDEADBEEF)])
def test_padding_is_truncated_and_zero_extended(dtype, expected):
    fm = FeatureMapDescriptor(padding=0x1234_5678_DEAD_BEEF)
    assert padding_raw(fm, dtype) == expected


# ---------------------------------------------------------------- random descriptors

def reference_img2col(src, defined, fm, bits, valid_row, valid_col, pos_m, pos_k):
    """Per-element restatement of the spec's execution model; None when it must fault."""
    def extent(size, pad_a, pad_b, kernel, stride, dilation):
        receptive = dilation * (kernel - 1) + 1
        return 0 if size + pad_a + pad_b < receptive else (
            (size + pad_a + pad_b - receptive) // stride + 1)
    out_h = extent(fm.height, fm.pad_top, fm.pad_bottom, fm.filter_height, fm.stride_height,
                   fm.dilation_height)
    out_w = extent(fm.width, fm.pad_left, fm.pad_right, fm.filter_width, fm.stride_width,
                   fm.dilation_width)
    rows_per_batch = fm.depth * out_h * out_w
    cols_per_group = fm.filter_height * fm.filter_width * fm.channels_per_group
    result = []
    for r in range(valid_row):
        m = pos_m + r
        n, rem = m // rows_per_batch, m % rows_per_batch
        d, rem = rem // (out_h * out_w), rem % (out_h * out_w)
        oh, ow = rem // out_w, rem % out_w
        row = []
        for c in range(valid_col):
            k = pos_k + c
            c1, rem = k // cols_per_group, k % cols_per_group
            kh, rem = rem // (fm.filter_width * fm.channels_per_group), rem % (
                fm.filter_width * fm.channels_per_group)
            kw, c0 = rem // fm.channels_per_group, rem % fm.channels_per_group
            ih = oh * fm.stride_height + kh * fm.dilation_height - fm.pad_top
            iw = ow * fm.stride_width + kw * fm.dilation_width - fm.pad_left
            if (c1 * fm.channels_per_group + c0 < fm.logical_channels
                    and 0 <= ih < fm.height and 0 <= iw < fm.width):
                idx = (((((n * fm.depth + d) * fm.channel_groups + c1) * fm.height + ih)
                        * fm.width + iw) * fm.channels_per_group + c0)
                if not defined[idx]:
                    return None
                row.append(int(src[idx]))
            else:
                row.append(fm.padding & ((1 << bits) - 1))
        result.append(row)
    return result


def check_random_case(rng, dtype):
    fm, shape = random_descriptor(rng)
    src, defined = random_source(rng, fm, dtype, 0.6, 0.9)
    window = random_window(rng, shape)
    expected = reference_img2col(src, defined, fm, dtype.bits, *window)
    if expected is None:
        legality(img2col, src, defined, fm, dtype, *window)
        return False
    got = img2col(src, defined, fm, dtype, *window)
    assert got.dtype == np.dtype(f"u{dtype.bits // 8}")
    assert got.tolist() == expected
    return True


@pytest.mark.parametrize("dtype", IMG2COL_TYPES)
def test_random_descriptors_against_reference(dtype):
    rng = np.random.default_rng(500 + dtype)
    outcomes = [check_random_case(rng, dtype) for _ in range(80)]
    assert any(outcomes) and not all(outcomes)   # both results and definedness faults seen


@pytest.mark.slow
@pytest.mark.parametrize("dtype", IMG2COL_TYPES)
def test_random_descriptors_against_reference_sweep(dtype):
    rng = np.random.default_rng(900 + dtype)
    for _ in range(3000):
        check_random_case(rng, dtype)


def check_walk(fm, window):
    index, is_pad = gather_indices(fm, *window)
    steps = list(walk(fm, *window))
    assert [s.src_index for s in steps] == index.ravel().tolist()
    assert [s.is_pad for s in steps] == is_pad.ravel().tolist()


def test_walk_equals_gather_on_random_descriptors():
    rng = np.random.default_rng(77)
    for _ in range(150):
        fm, shape = random_descriptor(rng)
        check_walk(fm, random_window(rng, shape))


def test_walk_seeds_from_large_positions():
    fm = FeatureMapDescriptor(NDC1HWC0, batches=40, depth=5, channel_groups=7, height=61,
                              width=67, channels_per_group=13, filter_height=5, filter_width=3,
                              stride_height=2, stride_width=3, dilation_height=3,
                              dilation_width=2, pad_left=4, pad_right=1, pad_top=2,
                              pad_bottom=5, logical_channels=85, padding=9)
    shape = output_shape(fm)
    assert shape.rows > 65535 + 4 and shape.cols > 1300
    for window in [(4, 40, 65535, shape.cols - 40), (3, 30, 60001, 777), (2, 50, 12345, 0)]:
        check_walk(fm, window)


@pytest.mark.slow
def test_walk_equals_gather_sweep():
    rng = np.random.default_rng(78)
    for _ in range(5000):
        fm, shape = random_descriptor(rng)
        check_walk(fm, random_window(rng, shape, max_rows=16, max_cols=24))
