"""TIMG2COL test cases shared by the model and hardware tests (test-only).

The three worked examples of the img2col digest (section 11) with their sources and results, a
row-major source-tile builder, and the seeded random descriptor, window and source generators.
"""

import numpy as np

from ptocube.model.faults import PTOFault
from ptocube.model.img2col import FeatureMapDescriptor, FeatureMapLayout, output_shape
from ptocube.model.layout import ordinary_geometry

NC1HWC0, NDC1HWC0 = FeatureMapLayout.NC1HWC0, FeatureMapLayout.NDC1HWC0


def tile_elements(dtype, capacity, cols):
    return ordinary_geometry(dtype, capacity, cols).elements


def source(values, dtype, capacity, cols, defined=None):
    """A row-major source tile's storage: ``values`` from index 0, the rest zero.

    ``defined`` lists the defined storage indices (default: exactly the written ones).
    """
    raw = np.zeros(tile_elements(dtype, capacity, cols), dtype=np.uint64)
    raw[:len(values)] = values
    flags = np.zeros(raw.size, dtype=bool)
    flags[list(range(len(values))) if defined is None else defined] = True
    return raw, flags


EXAMPLE1 = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 3, 3, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 2, 0)


EXAMPLE1_SOURCE = [100 * h + 10 * w + c0 for h in range(3) for w in range(3) for c0 in range(2)]


EXAMPLE1_RESULT = [[0, 1, 10, 11, 100, 101, 110, 111],
                   [10, 11, 20, 21, 110, 111, 120, 121],
                   [100, 101, 110, 111, 200, 201, 210, 211],
                   [110, 111, 120, 121, 210, 211, 220, 221]]


EXAMPLE2 = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 3, 3, 2, 2, 2, 2, 2, 1, 1,
                                pad_left=1, pad_right=0, pad_top=1, pad_bottom=0,
                                logical_channels=1, padding=0x1EE)


EXAMPLE2_SOURCE = [v for h in range(3) for w in range(3) for v in (10 * h + w + 1, 99)]


EXAMPLE2_RESULT = [[238, 238, 238, 238, 238, 238, 1, 238],
                   [238, 238, 238, 238, 2, 238, 3, 238],
                   [238, 238, 11, 238, 238, 238, 21, 238],
                   [12, 238, 13, 238, 22, 238, 23, 238]]


EXAMPLE3 = FeatureMapDescriptor(NDC1HWC0, 1, 2, 2, 4, 4, 1, 2, 2, 1, 1, 2, 2, 0, 0, 0, 0, 2, 0)


EXAMPLE3_SOURCE = [1000 * d + 100 * c1 + 10 * h + w
                   for d in range(2) for c1 in range(2) for h in range(4) for w in range(4)]


EXAMPLE3_RESULT = [[0, 2, 20, 22, 100, 102, 120, 122],
                   [1, 3, 21, 23, 101, 103, 121, 123],
                   [10, 12, 30, 32, 110, 112, 130, 132],
                   [11, 13, 31, 33, 111, 113, 131, 133],
                   [1000, 1002, 1020, 1022, 1100, 1102, 1120, 1122],
                   [1001, 1003, 1021, 1023, 1101, 1103, 1121, 1123],
                   [1010, 1012, 1030, 1032, 1110, 1112, 1130, 1132],
                   [1011, 1013, 1031, 1033, 1111, 1113, 1131, 1133]]


EXAMPLE3_WINDOW = [[31, 33, 111, 113],
                   [1020, 1022, 1100, 1102],
                   [1021, 1023, 1101, 1103]]


def random_descriptor(rng):
    """A descriptor with a nonempty output; dimensions small enough for the reference."""
    while True:
        layout = NDC1HWC0 if rng.random() < 0.4 else NC1HWC0
        c1, c0 = int(rng.integers(1, 4)), int(rng.integers(1, 7))
        fm = FeatureMapDescriptor(
            layout, batches=int(rng.integers(1, 3)),
            depth=int(rng.integers(1, 4)) if layout == NDC1HWC0 else 1,
            channel_groups=c1, height=int(rng.integers(1, 8)), width=int(rng.integers(1, 8)),
            channels_per_group=c0,
            filter_height=int(rng.integers(1, 4)), filter_width=int(rng.integers(1, 4)),
            stride_height=int(rng.integers(1, 4)), stride_width=int(rng.integers(1, 4)),
            dilation_height=int(rng.integers(1, 4)), dilation_width=int(rng.integers(1, 4)),
            pad_left=int(rng.integers(0, 4)), pad_right=int(rng.integers(0, 4)),
            pad_top=int(rng.integers(0, 4)), pad_bottom=int(rng.integers(0, 4)),
            logical_channels=int(rng.integers(1, c1 * c0 + 1)),
            padding=int(rng.integers(0, 1 << 32)) << 32 | int(rng.integers(0, 1 << 32)))
        try:
            return fm, output_shape(fm)
        except PTOFault:
            continue


def random_window(rng, shape, max_rows=10, max_cols=14):
    pos_m = int(rng.integers(0, shape.rows))
    pos_k = int(rng.integers(0, shape.cols))
    valid_row = int(rng.integers(1, min(shape.rows - pos_m, max_rows) + 1))
    valid_col = int(rng.integers(1, min(shape.cols - pos_k, max_cols) + 1))
    return valid_row, valid_col, pos_m, pos_k


def random_source(rng, fm, dtype, all_defined, defined_share):
    """Random payload and definedness of the smallest row-major tile holding ``fm``.

    The tile sometimes gets one CELL more; with probability ``all_defined`` every
    element is defined, otherwise each one is with probability ``defined_share``.
    """
    cols = 1 << int(rng.integers(0, 5))
    row_bytes = cols * dtype.bits // 8
    rows_needed = -(-fm.physical_elements // cols)
    capacity = -(-rows_needed * row_bytes // 128) * 128 + 128 * int(rng.integers(0, 2))
    while capacity % row_bytes:
        capacity += 128
    elements = tile_elements(dtype, capacity, cols)
    raw = rng.integers(0, 1 << dtype.bits, size=elements, dtype=np.uint64)
    defined = (np.ones(elements, dtype=bool) if rng.random() < all_defined
               else rng.random(elements) < defined_share)
    return raw, defined
