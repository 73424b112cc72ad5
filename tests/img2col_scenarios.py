"""Random TIMG2COL scenarios for the whole-unit tests (test-only).

Used by ``tests/test_hdl_top.py`` (pysim against the model) and ``tests/test_verilator.py``
(Verilator against pysim); one generator, so a seed names the same scenarios in both.
"""

import random

from ptocube.model.scenario import parse_scenario

from model_helpers import img2col_bundle

__all__ = ["random_img2col"]


def random_img2col(rng: random.Random, number: int):
    """A random TIMG2COL scenario: feature map, source data (a few elements undefined) and a
    window somewhere in the im2col matrix, with posM/posK from GPRs.  Some are illegal."""
    dtype, bits = rng.choice([("U8", 8), ("S16", 16), ("FP16", 16), ("U32", 32), ("FP32", 32)])
    c0 = rng.choice([1, 2, 4])
    c1, h, w = rng.randint(1, 2), rng.randint(1, 5), rng.randint(1, 5)
    kh, kw = rng.randint(1, 3), rng.randint(1, 3)
    fm = {"layout": "NC1HWC0", "height": h, "width": w, "channel_groups": c1,
          "channels_per_group": c0, "filter_height": kh, "filter_width": kw,
          "stride_height": rng.randint(1, 2), "stride_width": rng.randint(1, 2),
          "dilation_height": rng.randint(1, 2), "dilation_width": rng.randint(1, 2),
          "pad_top": rng.randint(0, 1), "pad_bottom": rng.randint(0, 1),
          "pad_left": rng.randint(0, 1), "pad_right": rng.randint(0, 1),
          "logical_channels": rng.randint(1, c1 * c0), "padding": rng.getrandbits(64)}
    elements = c1 * h * w * c0
    cols = 16
    rows = -(-elements // cols)
    undefined = rng.random() < 0.3
    data = [[None if undefined and rng.random() < 0.05 else f"0x{rng.getrandbits(bits):x}"
             for _ in range(cols)] for _ in range(rows)]
    tsize = max(128, 1 << (rows * cols * bits // 8 - 1).bit_length())
    source = {"dtype": dtype, "location": "Matrix", "cols": cols, "tsize": tsize, "data": data,
              "feature_map": fm}
    out_h = max(1, (h + fm["pad_top"] + fm["pad_bottom"]
                    - fm["dilation_height"] * (kh - 1) - 1) // fm["stride_height"] + 1)
    out_w = max(1, (w + fm["pad_left"] + fm["pad_right"]
                    - fm["dilation_width"] * (kw - 1) - 1) // fm["stride_width"] + 1)
    all_rows, all_cols = out_h * out_w, c1 * c0 * kh * kw
    valid_row = rng.randint(1, min(all_rows, 12))
    valid_col = rng.randint(1, min(all_cols, 16))
    pos_m = rng.randint(0, all_rows - valid_row + (rng.random() < 0.1))
    pos_k = rng.randint(0, all_cols - valid_col)
    col = 1 << (valid_col - 1).bit_length()
    size = max(128, 1 << (valid_row * col * bits // 8 - 1).bit_length())
    mask = rng.choice(["1111", "1000", "1100", "1110", "0001"])
    program = img2col_bundle(dtype, valid_col, valid_row, col, destination=("T", f"{size}B"),
                             source="M#1", mask=mask, ior="a0, a1")
    return parse_scenario({"name": f"random-img2col-{number}", "tiles": {"all": {"M": [source]}},
                           "gprs": {"a0": pos_m, "a1": pos_k}, "program": program})
