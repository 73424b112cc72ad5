"""The specification's matrix-level vectors, run as whole bundles through the Machine.

* The hardware numeric profile's ``matrix`` group (fp32 2x2, bias, acc, the MX
  E8M0 scale and the K = 33 MX block vector 40/42/43) and its
  ``matrix_postprocess`` group, under the default ``ieee`` arithmetic.
* The executable spec's own CUBE execution tests (parts A-C of the test
  inventory).  Integer results hold in every profile; the FP16/E4M3 ones are
  raw-carrier results and run under ``pto-v0``.

Values were transcribed from the spec's vector file and tests; nothing is
read from the spec at run time.
"""

import numpy as np
import pytest

from ptocube.model.bundle import Operation as Op
from ptocube.model.faults import FaultClass
from ptocube.model.img2col import FeatureMapDescriptor, FeatureMapLayout
from ptocube.model.machine import Machine
from ptocube.model.state import Location, StatusFlag

from model_helpers import (f32, img2col_bundle, make_state, matrix_bundle, run_bundle, sel,
                           tile, value_tile)

FP32_ONE = 0x3F800000


def _d(result, pe=0, role=0):
    """Raw values of the ``role``-th tile a successful bundle published on ``pe``."""
    assert result.outcome == "success", (result.fault, result.reason)
    tiles = [p for p in result.published if p.pe == pe]
    return tiles[role].tile.raw()


# ---------------------------------------------------------------------------
# Hardware numeric profile, group "matrix" (ieee)
# ---------------------------------------------------------------------------

def test_fp32_matmul_2x2():
    state = make_state({"M#1": value_tile("FP32", "CUBE_M16", [[1, 2], [3, 4]]),
                        "N#1": value_tile("FP32", "CUBE_N8", [[5, 6], [7, 8]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL, "FP32", dims=(2, 2, 2),
                                                sources=["M#1", "N#1"]))
    assert [[f32(v) for v in row] for row in _d(result)] == [[19, 22], [43, 50]]


def _dot_state(extra=None):
    """A = [[1, 2]], B = [[5, 6], [7, 8]]: dot products [19, 22]."""
    local = {"M#1": value_tile("FP32", "CUBE_M16", [[1, 2]]),
             "N#1": value_tile("FP32", "CUBE_N8", [[5, 6], [7, 8]])}
    local.update(extra or {})
    return make_state(local)


def test_fp32_matmul_bias():
    state = _dot_state({"T#2": value_tile("FP32", "ROW_MAJOR", [[1, -2]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL_BIAS, "FP32", dims=(1, 2, 2),
                                                sources=["M#1", "N#1", "T#2"]))
    assert [f32(v) for v in _d(result)[0]] == [20, 20]


def test_fp32_matmul_acc():
    state = _dot_state({"U#5": value_tile("FP32", "CUBE_M16", [[10, 20]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL_ACC, "FP32", dims=(1, 2, 2),
                                                sources=["U#5", "M#1", "N#1"]))
    assert [f32(v) for v in _d(result)[0]] == [29, 42]


def test_mx_e8m0_scale():
    # 1.5 (E4M3 0x3C) x E8M0 0x80 = 3.0, against an unscaled FP16 1.0.
    state = make_state({"M#1": tile("E4M3", "CUBE_M16", [[0x3C]]),
                        "T#3": tile("E8M0", "ROW_MAJOR", [[0x80]]),
                        "N#1": value_tile("FP16", "CUBE_N8", [[1.0]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL_MX, "E4M3", b_type="FP16",
                                                sources=["M#1", "T#3", "N#1"]))
    assert f32(_d(result)[0, 0]) == 3.0


def _k33_state(extra=None):
    """E4M3 x E5M2, M = N = 1, K = 33, all inputs 1.0, sA = [0x7F, 0x80], sB = [0x7F, 0x81]."""
    local = {"M#1": tile("E4M3", "CUBE_M16", [[0x38] * 33]),
             "T#1": tile("E8M0", "ROW_MAJOR", [[0x7F, 0x80]]),
             "N#1": tile("E5M2", "CUBE_N8", [[0x3C]] * 33),
             "T#2": tile("E8M0", "ROW_MAJOR", [[0x7F], [0x81]])}
    local.update(extra or {})
    return make_state(local)


@pytest.mark.parametrize("op", [Op.TMATMUL_MX, Op.TGEMV_MX])
def test_mx_k_block_33(op):
    result, _ = run_bundle(_k33_state(), matrix_bundle(
        op, "E4M3", b_type="E5M2", dims=(None, 1, 33), sources=["M#1", "T#1", "N#1", "T#2"]))
    assert f32(_d(result)[0, 0]) == 40.0          # 32 * 1 + (1 * 2) * (1 * 4)


@pytest.mark.parametrize("op", [Op.TMATMUL_MX_BIAS, Op.TGEMV_MX_BIAS])
def test_mx_k_block_33_with_bias(op):
    state = _k33_state({"U#1": value_tile("FP32", "ROW_MAJOR", [[2.0]])})
    result, _ = run_bundle(state, matrix_bundle(
        op, "E4M3", b_type="E5M2", dims=(None, 1, 33),
        sources=["M#1", "T#1", "N#1", "T#2", "U#1"]))
    assert f32(_d(result)[0, 0]) == 42.0


@pytest.mark.parametrize("op", [Op.TMATMUL_MX_ACC, Op.TGEMV_MX_ACC])
def test_mx_k_block_33_with_prior_accumulator(op):
    state = _k33_state({"U#1": value_tile("FP32", "CUBE_M16", [[3.0]])})
    result, _ = run_bundle(state, matrix_bundle(
        op, "E4M3", b_type="E5M2", dims=(None, 1, 33),
        sources=["U#1", "M#1", "T#1", "N#1", "T#2"]))
    assert f32(_d(result)[0, 0]) == 43.0


# ---------------------------------------------------------------------------
# Hardware numeric profile, group "matrix_postprocess", as whole bundles
# ---------------------------------------------------------------------------

def _scale_word(scale: float, offset: int = 0) -> int:
    """A quantization word: FP19 scale in bits[31:13], S9 offset in bits[45:37]."""
    bits = int(np.array([scale], np.float32).view(np.uint32)[0])
    return bits | (offset & 0x1FF) << 37


def _postprocess_bundle(p_value, p_type, mode, *, relu=0, sat=0, a0=None, a1=None):
    """P = p_value as a 1x1x1 product, then B.FPATR ``mode``; returns (D raw, flags)."""
    if p_type == "S32":
        a = tile("S8", "CUBE_M16", [[p_value & 0xFF]])
        b = tile("S8", "CUBE_N8", [[1]])
        start = "S8"
    else:
        a = tile("FP32", "CUBE_M16", [[p_value]])
        b = tile("FP32", "CUBE_N8", [[FP32_ONE]])
        start = "FP32"
    gprs = {k: v for k, v in ((2, a0), (3, a1)) if v is not None}
    regs = ", ".join(name for name, v in (("a0", a0), ("a1", a1)) if v is not None)
    state = make_state({"M#1": a, "N#1": b}, gprs=gprs)
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL, start, fpatr=(mode, relu), sat=sat,
                                                sources=["M#1", "N#1"], ior=regs or None))
    return int(_d(result)[0, 0]), result.flags


@pytest.mark.parametrize("vector, p, p_type, mode, kwargs, raw, flags", [
    ("req8-scalar-affine", 3, "S32", 3, dict(a0=_scale_word(2.0, -1)), 0x05, 0),
    ("req8-wrap", 70, "S32", 3, dict(a0=_scale_word(2.0)), 0x8C, 0x14),
    ("req8-saturate", 70, "S32", 3, dict(a0=_scale_word(2.0), sat=1), 0x7F, 0x14),
    ("f32-e4m3-exact", 0x3FC00000, "FP32", 26, dict(a0=_scale_word(1.0)), 0x3C, 0),
    ("f32-hif8-exact", 0x3FC00000, "FP32", 25, dict(a0=_scale_word(1.0)), 0x0C, 0),
    ("post-conversion-lrelu", 0xC0800000, "FP32", 24,
     dict(relu=2, a0=_scale_word(1.0), a1=0x3F000000 >> 13), 0xFE, 0),
    ("nan-indefinite", 0x7FC00000, "FP32", 24, dict(a0=_scale_word(1.0)), 0x80, 0x01),
    ("nan-saturating-zero", 0x7FC00000, "FP32", 24, dict(a0=_scale_word(1.0), sat=1), 0x00,
     0x01),
])
def test_matrix_postprocess_vectors(vector, p, p_type, mode, kwargs, raw, flags):
    assert _postprocess_bundle(p, p_type, mode, **kwargs) == (raw, flags)


def test_postprocess_flags_reach_the_sticky_status():
    state = make_state({"M#1": tile("S8", "CUBE_M16", [[70]]), "N#1": tile("S8", "CUBE_N8", [[1]])},
                       gprs={2: _scale_word(2.0)}, flags=StatusFlag.UF)
    result, machine = run_bundle(state, matrix_bundle(Op.TMATMUL, "S8", fpatr=(3,),
                                                      sources=["M#1", "N#1"], ior="a0"))
    assert result.flags == StatusFlag.OF | StatusFlag.NX
    assert machine.state.flags == StatusFlag.OF | StatusFlag.NX | StatusFlag.UF


# ---------------------------------------------------------------------------
# The executable spec's CUBE execution tests: integer classes (any profile)
# ---------------------------------------------------------------------------

def _s16_s8_state(extra=None):
    local = {"M#1": tile("S16", "CUBE_M16", [[1, 2], [3, 4]]),
             "N#1": tile("S8", "CUBE_N8", [[5, 6], [7, 8]])}
    local.update(extra or {})
    return make_state(local)


def test_block_tmatmul_exec_001_mixed_input_types():
    result, _ = run_bundle(_s16_s8_state(), matrix_bundle(
        Op.TMATMUL, "S16", b_type="S8", dims=(2, 2, 2), sources=["M#1", "N#1"]))
    assert _d(result).tolist() == [[19, 22], [43, 50]]
    assert result.published[0].tile.dtype.name == "S32"


def test_block_tmatmul_exec_001_rmode_sat_with_mode_0_is_rejected_by_ruling_r8():
    # The spec's test sets RMode = RNE and Sat = 1 with PreQuantMode 0 and passes,
    # because the ASL's Matrix path never checks the documented rule; R8 enforces it.
    result, _ = run_bundle(_s16_s8_state(), matrix_bundle(
        Op.TMATMUL, "S16", b_type="S8", rmode="RNE", sat=1, dims=(2, 2, 2),
        sources=["M#1", "N#1"]))
    assert result.fault is FaultClass.TILE_LEGALITY


def test_block_tmatmul_bias_exec_001():
    state = _s16_s8_state({"T#5": tile("S32", "ROW_MAJOR", [[10, 20]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL_BIAS, "S16", b_type="S8",
                                                dims=(2, 2, 2), sources=["M#1", "N#1", "T#5"]))
    assert _d(result).tolist() == [[29, 42], [53, 70]]


def test_tile_tgemv_row_001():
    state = make_state({"M#1": tile("U16", "CUBE_M16", [[2, 3]]),
                        "N#1": tile("U16", "CUBE_N8", [[5, 7], [11, 13]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TGEMV, "U16", dims=(None, 2, 2),
                                                sources=["M#1", "N#1"]))
    assert _d(result).tolist() == [[43, 53]]
    assert result.published[0].tile.dtype.name == "U32"


def test_tile_matmul_execution_001():
    local = {"M#1": tile("U16", "CUBE_M16", [[1, 2], [3, 4]]),
             "N#1": tile("U16", "CUBE_N8", [[5, 6], [7, 8]]),
             "T#9": tile("U32", "ROW_MAJOR", [[1, 2]]),
             "M#2": tile("U16", "CUBE_M16", [[1, 2]]),
             "N#2": tile("U16", "CUBE_N8", [[2], [3]])}
    result, _ = run_bundle(make_state(local), matrix_bundle(
        Op.TMATMUL, "U16", dims=(2, 2, 2), sources=["M#1", "N#1"]))
    assert _d(result).tolist() == [[19, 22], [43, 50]]
    result, _ = run_bundle(make_state(local), matrix_bundle(
        Op.TMATMUL_BIAS, "U16", dims=(2, 2, 2), sources=["M#1", "N#1", "T#9"]))
    assert (_d(result)[0, 0], _d(result)[1, 1]) == (20, 52)
    result, _ = run_bundle(make_state(local), matrix_bundle(
        Op.TGEMV, "U16", dims=(1, 1, 2), sources=["M#2", "N#2"]))
    assert _d(result).tolist() == [[8]]


@pytest.mark.parametrize("start, acc", [("S8", "S32"), ("U8", "U32")])
def test_block_tmatmul_acc_types_022_integer(start, acc):
    state = make_state({"T#5": tile(acc, "CUBE_M16", [[5]]),
                        "M#1": tile(start, "CUBE_M16", [[2]]),
                        "N#1": tile(start, "CUBE_N8", [[3]])})
    result, machine = run_bundle(state, matrix_bundle(Op.TMATMUL_ACC, start,
                                                      sources=["T#5", "M#1", "N#1"]))
    d = result.published[0]
    assert d.tile.raw().tolist() == [[11]] and d.tile.dtype.name == acc
    assert d.index != sel("T#5")
    assert machine.state.tile(0, sel("T#5")).raw().tolist() == [[5]]


@pytest.mark.parametrize("mask, pes", [("1000", (0,)), ("0100", (1,)), ("0010", (2,)),
                                       ("0001", (3,)), ("1100", (0, 1)), ("1110", (0, 1, 2)),
                                       ("1111", (0, 1, 2, 3))])
def test_block_tmatmul_shared_mask_015(mask, pes):
    # Shared U16 A = 2, B = 3 for every encodable mask: D = 6 on the selected PEs,
    # and popcount(mask) x 128 B charged.
    shared = {10: tile("U16", "ROW_MAJOR", [[2]], shared=True),
              11: tile("U16", "ROW_MAJOR", [[3]], shared=True)}
    state = make_state(shared=shared)
    before = state.capacity_in_use()
    result, machine = run_bundle(state, matrix_bundle(Op.TMATMUL, "U16", shared=[10, 11],
                                                      sources=[], mask=mask))
    assert tuple(p.pe for p in result.published) == pes
    assert all(p.tile.raw().tolist() == [[6]] and p.tile.layout.name == "CUBE_M16"
               for p in result.published)
    assert machine.state.capacity_in_use() - before == 128 * len(pes)


def test_block_tmatmul_shared_pair_and_right_only():
    shared = {40: tile("U16", "ROW_MAJOR", [[4]], shared=True),
              41: tile("U8", "ROW_MAJOR", [[5]], shared=True),
              9: tile("U8", "ROW_MAJOR", [[7]], shared=True)}
    state = make_state({"M#1": tile("U16", "CUBE_M16", [[6]]),
                        "T#3": tile("U32", "ROW_MAJOR", [[5]])}, shared=shared)
    pair, _ = run_bundle(state.snapshot(), matrix_bundle(Op.TMATMUL, "U16", b_type="U8",
                                                         shared=[40, 41]))
    assert _d(pair).tolist() == [[20]]
    right, _ = run_bundle(state.snapshot(), matrix_bundle(Op.TMATMUL, "U16", b_type="U8",
                                                          shared=[9], sources=["M#1"]))
    assert _d(right).tolist() == [[42]]
    bias, machine = run_bundle(state, matrix_bundle(Op.TMATMUL_BIAS, "U16", b_type="U8",
                                                    shared=[9], sources=["M#1", "T#3"]))
    assert _d(bias).tolist() == [[47]]
    assert machine.state.shared[9].tile.raw().tolist() == [[7]]     # Shared state read-only


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_block_tmatmul_shared_transpose_011(trans_a, trans_b):
    a = [[1, 3], [2, 4]] if trans_a else [[1, 2], [3, 4]]
    b = [[5, 7], [6, 8]] if trans_b else [[5, 6], [7, 8]]
    state = make_state(shared={3: tile("U16", "ROW_MAJOR", a, shared=True),
                               4: tile("U16", "ROW_MAJOR", b, shared=True)})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL, "U16", dims=(2, 2, 2),
                                                fpatr=(0, 0, 0, 0, 0, 0, 0, trans_a, trans_b),
                                                shared=[3, 4]))
    assert _d(result).tolist() == [[19, 22], [43, 50]]
    assert result.published[0].tile.layout.name == "CUBE_M16"


def test_postprocess_aux_001_and_group_large_004():
    # U32 accumulator rows [1..9] with RowMaxIn 10 and GroupN 8; and [2, 5, 4] with GroupN 8.
    state = make_state({"M#1": tile("U8", "CUBE_M16", [[1]]),
                        "N#1": tile("U8", "CUBE_N8", [list(range(1, 10))]),
                        "N#2": tile("U8", "CUBE_N8", [[2, 5, 4]]),
                        "T#7": tile("U32", "ROW_MAJOR", [[10]])})
    result, _ = run_bundle(state.snapshot(), matrix_bundle(
        Op.TMATMUL, "U8", dims=(1, 9, 1), fpatr=(0, 0, 1, 1, 1, 1),
        sources=["M#1", "N#1", "T#7"], destinations=[("T", 4), ("U", 1), ("U", 1)]))
    assert _d(result)[0, 8] == 9
    assert _d(result, role=1).tolist() == [[10]]
    assert _d(result, role=2).tolist() == [[8, 9]]
    result, _ = run_bundle(state, matrix_bundle(
        Op.TMATMUL, "U8", dims=(1, 3, 1), fpatr=(0, 0, 1, 0, 1),
        sources=["M#1", "N#2"], destinations=[("T", 2), ("U", 1)]))
    assert _d(result)[0, 2] == 4 and _d(result, role=1).tolist() == [[5]]


def test_postprocess_maxabs_single_002():
    state = make_state({"M#1": tile("S8", "CUBE_M16", [[0xFD]]),      # -3
                        "N#1": tile("S8", "CUBE_N8", [[1]])})
    result, _ = run_bundle(state, matrix_bundle(
        Op.TMATMUL, "S8", fpatr=(0, 0, 1, 1, 1, 0, 1), sources=["M#1", "N#1"],
        destinations=[("T", 1), ("U", 1), ("N", 1)]))
    assert _d(result, role=1).tolist() == [[3]] and _d(result, role=2).tolist() == [[3]]


def test_block_tmatmul_acc_reduce_025():
    # FP16 ACC, PreQuantMode 1, RowMax + GroupMax (GroupN 8) over C with A = B = 0:
    # D = FP16(C), reductions of the raw FP32 accumulator; C unchanged.
    c_raw = [[FP32_ONE] * 7 + [0x40000000]]
    state = make_state({"T#5": tile("FP32", "CUBE_M16", c_raw),
                        "M#1": tile("FP16", "CUBE_M16", [[0]]),
                        "N#1": tile("FP16", "CUBE_N8", [[0] * 8])})
    result, machine = run_bundle(state, matrix_bundle(
        Op.TMATMUL_ACC, "FP16", dims=(1, 8, 1), fpatr=(1, 0, 1, 1, 1),
        sources=["T#5", "M#1", "N#1"], destinations=[("U", 2), ("U", 1), ("U", 1)]))
    assert _d(result).tolist() == [[0x3C00] * 7 + [0x4000]]
    assert _d(result, role=1).tolist() == [[0x40000000]]
    assert _d(result, role=2).tolist() == [[0x40000000]]
    assert machine.state.tile(2, sel("T#5")).raw().tolist() == c_raw


def test_block_tmatmul_acc_convert_023_and_cube_postprocess_006():
    # PreQuantMode 1 converts D to FP16: C (FP32 1x3, 2 CELLs, 256 B) may differ
    # from D's TSize (1 CELL, 128 B).
    state = make_state({"T#5": value_tile("FP32", "CUBE_M16", [[1, 2, 3]]),
                        "M#1": value_tile("FP16", "CUBE_M16", [[0]]),
                        "N#1": value_tile("FP16", "CUBE_N8", [[0, 0, 0]])})
    assert state.tile(0, sel("T#5")).capacity == 256
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL_ACC, "FP16", dims=(1, 3, 1),
                                                fpatr=(1,), sources=["T#5", "M#1", "N#1"],
                                                destinations=[("U", 1)]))
    d = result.published[0].tile
    assert d.dtype.name == "FP16" and d.capacity == 128
    assert (d.rows, d.cols, d.cube_geometry().cells) == (16, 4, 1)
    assert d.raw().tolist() == [[0x3C00, 0x4000, 0x4200]]


# ---------------------------------------------------------------------------
# The executable spec's raw-carrier (pto-v0) tests
# ---------------------------------------------------------------------------

def _raw_state(a=2, b=3, extra=None):
    local = {"M#1": tile("FP16", "CUBE_M16", [[a]]), "N#1": tile("FP16", "CUBE_N8", [[b]])}
    local.update(extra or {})
    return make_state(local)


@pytest.mark.parametrize("op, extra, sources, expected", [
    (Op.TMATMUL, None, ["M#1", "N#1"], 6),
    (Op.TGEMV, None, ["M#1", "N#1"], 6),
    (Op.TMATMUL_MX, None, ["M#1", "N#1"], 6),
    (Op.TGEMV_MX, None, ["M#1", "N#1"], 6),
    (Op.TMATMUL_ACC, "C", ["T#5", "M#1", "N#1"], 11),
    (Op.TGEMV_ACC, "C", ["T#5", "M#1", "N#1"], 11),
    (Op.TMATMUL_MX_ACC, "C", ["T#5", "M#1", "N#1"], 11),
    (Op.TGEMV_MX_ACC, "C", ["T#5", "M#1", "N#1"], 11),
    (Op.TMATMUL_BIAS, "bias", ["M#1", "N#1", "T#5"], 11),
    (Op.TGEMV_BIAS, "bias", ["M#1", "N#1", "T#5"], 11),
    (Op.TMATMUL_MX_BIAS, "bias", ["M#1", "N#1", "T#5"], 11),
    (Op.TGEMV_MX_BIAS, "bias", ["M#1", "N#1", "T#5"], 11),
])
def test_pto_v0_fp16_forms(op, extra, sources, expected):
    # FP16 raw 2 x raw 3 (+ C or bias raw 5): the spec's raw-carrier arithmetic.
    tiles = {"C": {"T#5": tile("FP32", "CUBE_M16", [[5]])},
             "bias": {"T#5": tile("FP32", "ROW_MAJOR", [[5]])}}.get(extra)
    result, _ = run_bundle(_raw_state(extra=tiles), matrix_bundle(op, "FP16", sources=sources),
                           arithmetic="pto-v0")
    assert _d(result).tolist() == [[expected]]


def test_pto_v0_defaults_001():
    # No B.DIM and no B.DATR: M = N = K = 1 and BType = AType.
    result, _ = run_bundle(_raw_state(6, 7), "BSTART.TMATMUL FP16\n"
                           "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
                           "B.IOT M#1, N#1, mask=1111, last, ->T<1>\nBSTOP\n",
                           arithmetic="pto-v0")
    assert _d(result).tolist() == [[42]]


def test_pto_v0_mx_noscale_001_decoded_words():
    # The spec test's literal words: A = T#1 (raw 2), B = T#2 (raw 3), D -> M hand.
    state = make_state({"T#1": tile("FP16", "CUBE_M16", [[2]]),
                        "T#2": tile("FP16", "CUBE_N8", [[3]])})
    words = [(0x20431181, 32), (0x00002023, 32), (0x0408CF13, 32), (0x00000001, 32)]
    result, = Machine(state, "pto-v0").run(words)
    assert _d(result).tolist() == [[6]]
    assert result.published[0].name == "M#1"


def test_pto_v0_acc_reuse_024():
    state = _raw_state(extra={"T#5": tile("FP32", "CUBE_M16", [[5]])})
    first, machine = run_bundle(state, matrix_bundle(
        Op.TMATMUL_ACC, "FP16", sources=["T#5", "M#1", "N#1"], destinations=[("T", 1)]),
        arithmetic="pto-v0")
    d1 = first.published[0]
    assert d1.name == "T#1" and d1.tile.raw().tolist() == [[11]]
    second = machine.run(matrix_bundle(Op.TMATMUL_ACC, "FP16", sources=["T#1", "M#1", "N#1"],
                                       destinations=[("U", 1)]))[0]
    assert _d(second).tolist() == [[17]]
    assert machine.state.tile(0, sel("T#1")).raw().tolist() == [[11]]


def test_pto_v0_tgemv_cube_002():
    state = make_state({"M#1": tile("FP16", "CUBE_M16", [[1] * 9]),
                        "N#1": tile("FP16", "CUBE_N8", [[1] * 10] * 9)})
    result, _ = run_bundle(state, matrix_bundle(Op.TGEMV, "FP16", dims=(None, 10, 9),
                                                sources=["M#1", "N#1"], destinations=[("T", 4)]),
                           arithmetic="pto-v0")
    d = result.published[0].tile
    assert (d.dtype.name, d.layout.name, d.shape) == ("FP32", "CUBE_M16", (1, 10))
    assert d.raw()[0, 0] == d.raw()[0, 9] == 9


def test_pto_v0_cube_destination_005_and_storage_003():
    state = make_state({"M#1": tile("FP16", "CUBE_M16", [[1, 2, 3], [4, 5, 6]]),
                        "N#1": tile("FP16", "CUBE_N8", [[1, 2], [3, 4], [5, 6]])})
    result, _ = run_bundle(state, matrix_bundle(Op.TMATMUL, "FP16", dims=(2, 2, 3),
                                                sources=["M#1", "N#1"]), arithmetic="pto-v0")
    d = result.published[0].tile
    assert d.raw().tolist() == [[22, 28], [49, 64]]
    assert (d.rows, d.cols, d.cube_geometry().cells, d.capacity) == (16, 2, 1, 128)


def test_pto_v0_cube_definedness_009_poisoned_padding_is_ignored():
    a = tile("FP16", "CUBE_M16", [[1, 2], [3, 4]])
    b = tile("FP16", "CUBE_N8", [[5, 6], [7, 8]])
    # All-ones, defined CELL padding: A (15, 3) and B (7, 7) in CELL coordinates.
    a.raw_slots()[15 * 4 + 3] = 0xFFFF
    a.defined[15 * 4 + 3] = True
    b.raw_slots()[7 * 8 + 7] = 0xFFFF
    b.defined[7 * 8 + 7] = True
    result, _ = run_bundle(make_state({"M#1": a, "N#1": b}), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(2, 2, 2), sources=["M#1", "N#1"]), arithmetic="pto-v0")
    assert _d(result)[0, 0] == 19 and _d(result)[1, 1] == 50


def test_pto_v0_aux_shape_001_and_mx_rowmax_001():
    local = {"M#1": tile("FP16", "CUBE_M16", [[2]]),
             "N#1": tile("FP16", "CUBE_N8", [list(range(1, 9))]),
             "T#7": tile("FP32", "ROW_MAJOR", [[5]]),
             "T#8": tile("FP32", "ROW_MAJOR", [[100]])}
    result, _ = run_bundle(make_state(local), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(1, 8, 1), fpatr=(0, 0, 1, 1, 1, 1),
        sources=["M#1", "N#1", "T#7"], destinations=[("T", 3), ("U", 1), ("U", 1)]),
        arithmetic="pto-v0")
    assert _d(result)[0, 7] == 16
    assert _d(result, role=1).tolist() == [[16]] and _d(result, role=2).tolist() == [[16]]
    result, _ = run_bundle(make_state(local), matrix_bundle(
        Op.TMATMUL_MX, "FP16", dims=(1, 8, 1), fpatr=(0, 0, 0, 1, 0, 1),
        sources=["M#1", "N#1", "T#8"], destinations=[("T", 3), ("U", 1)]),
        arithmetic="pto-v0")
    assert _d(result, role=1).tolist() == [[100]]


def test_pto_v0_mx_shared_both_and_right_001():
    shared = {20: tile("E4M3", "ROW_MAJOR", [[2] * 32], shared=True),
              21: tile("E8M0", "ROW_MAJOR", [[1]], shared=True),
              22: tile("E5M2", "ROW_MAJOR", [[3]] * 32, shared=True),
              23: tile("E8M0", "ROW_MAJOR", [[1]], shared=True)}
    local = {"M#1": tile("E4M3", "CUBE_M16", [[2] * 32]), "T#1": tile("E8M0", "ROW_MAJOR", [[1]])}
    both, _ = run_bundle(make_state(local, shared=shared), matrix_bundle(
        Op.TMATMUL_MX, "E4M3", b_type="E5M2", dims=(1, 1, 32), shared=[20, 21, 22, 23]),
        arithmetic="pto-v0")
    assert _d(both).tolist() == [[192]]
    right, _ = run_bundle(make_state(local, shared=shared), matrix_bundle(
        Op.TMATMUL_MX, "E4M3", b_type="E5M2", dims=(1, 1, 32), shared=[22, 23],
        sources=["M#1", "T#1"]), arithmetic="pto-v0")
    assert _d(right).tolist() == [[192]]


@pytest.mark.parametrize("op, expected", [(Op.TMATMUL_MX, 32), (Op.TMATMUL_MX_ACC, 64)])
def test_pto_v0_numeric_contract_legality_001(op, expected):
    local = {"M#1": tile("E4M3", "CUBE_M16", [[1] * 32]), "T#1": tile("E8M0", "ROW_MAJOR", [[1]]),
             "N#1": tile("E5M2", "CUBE_N8", [[1]] * 32), "T#2": tile("E8M0", "ROW_MAJOR", [[1]]),
             "U#4": tile("FP32", "CUBE_M16", [[32]])}
    sources = ["M#1", "T#1", "N#1", "T#2"]
    if op.uses_acc:
        sources = ["U#4"] + sources
    result, _ = run_bundle(make_state(local), matrix_bundle(op, "E4M3", b_type="E5M2",
                                                            dims=(1, 1, 32), sources=sources),
                           arithmetic="pto-v0")
    assert _d(result).tolist() == [[expected]]


@pytest.mark.parametrize("op", [op for op in Op if op.is_matrix])
def test_selectors_bound_001_every_function_executes(op):
    # U16 ordinary / E4M3 + E8M0 = 1 MX, 1x1: plain 6, ACC 5 + 6 = 11, BIAS 6 + 7 = 13.
    if op.is_mx:
        local = {"M#1": tile("E4M3", "CUBE_M16", [[2]]), "T#1": tile("E8M0", "ROW_MAJOR", [[1]]),
                 "N#1": tile("E4M3", "CUBE_N8", [[3]]), "T#2": tile("E8M0", "ROW_MAJOR", [[1]])}
        math_sources, start, acc = ["M#1", "T#1", "N#1", "T#2"], "E4M3", "FP32"
    else:
        local = {"M#1": tile("U16", "CUBE_M16", [[2]]), "N#1": tile("U16", "CUBE_N8", [[3]])}
        math_sources, start, acc = ["M#1", "N#1"], "U16", "U32"
    local["U#5"] = tile(acc, "CUBE_M16", [[5]])
    local["U#7"] = tile(acc, "ROW_MAJOR", [[7]])
    sources = (["U#5"] if op.uses_acc else []) + math_sources + (["U#7"] if op.uses_bias else [])
    result, _ = run_bundle(make_state(local), matrix_bundle(op, start, sources=sources),
                           arithmetic="pto-v0")
    assert _d(result).tolist() == [[11 if op.uses_acc else 13 if op.uses_bias else 6]]


# ---------------------------------------------------------------------------
# TIMG2COL, as bundles
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, dtype, flat, fm, window, expected", [
    ("map-001", "FP32", [0x41300000, 0x41400000, 0x41500000, 0x41600000],
     dict(height=2, width=2, filter_height=2, filter_width=2, padding=99),
     (1, 4, 0, 0), [[0x41300000, 0x41400000, 0x41500000, 0x41600000]]),
    ("offset-001", "U8", [31, 32], dict(channels_per_group=2, logical_channels=2),
     (1, 1, 0, 1), [[32]]),
])
def test_timg2col_spec_tests(name, dtype, flat, fm, window, expected):
    rows, cols, pos_m, pos_k = window
    src = tile(dtype, "ROW_MAJOR", [flat], location=Location.MATRIX,
               feature_map=FeatureMapDescriptor(**fm))
    state = make_state({"M#1": src}, gprs={2: pos_m, 3: pos_k})
    result, _ = run_bundle(state, img2col_bundle(dtype, cols, rows, ior="a0, a1"))
    assert _d(result).tolist() == expected


def test_timg2col_pad_001_undefined_channel_padding_is_not_read():
    src = tile("S16", "ROW_MAJOR", [[21, 0]], undefined=[(0, 1)], location=Location.MATRIX,
               feature_map=FeatureMapDescriptor(channels_per_group=2, logical_channels=1,
                                                padding=77))
    result, _ = run_bundle(make_state({"M#1": src}), img2col_bundle("S16", 2))
    assert _d(result).tolist() == [[21, 77]]


def _fm_source(dtype, flat, cols, fm):
    """A row-major Matrix source holding ``flat`` in storage order, with descriptor ``fm``."""
    rows = -(-len(flat) // cols)
    data = np.zeros(rows * cols, dtype=np.uint64)
    data[:len(flat)] = flat
    tail = [divmod(i, cols) for i in range(len(flat), rows * cols)]
    return tile(dtype, "ROW_MAJOR", data.reshape(rows, cols), 128, cols=cols,
                location=Location.MATRIX, undefined=tail, feature_map=FeatureMapDescriptor(**fm))


def test_timg2col_worked_example_1_basic():
    flat = [100 * h + 10 * w + c for h in range(3) for w in range(3) for c in range(2)]
    src = _fm_source("U16", flat, 8, dict(height=3, width=3, channels_per_group=2,
                                          filter_height=2, filter_width=2, logical_channels=2))
    result, _ = run_bundle(make_state({"M#1": src}), img2col_bundle("U16", 8, 4))
    assert _d(result).tolist() == [[0, 1, 10, 11, 100, 101, 110, 111],
                                   [10, 11, 20, 21, 110, 111, 120, 121],
                                   [100, 101, 110, 111, 200, 201, 210, 211],
                                   [110, 111, 120, 121, 210, 211, 220, 221]]


def test_timg2col_worked_example_3_ndc1hwc0_offset_window():
    flat = [1000 * d + 100 * c1 + 10 * h + w for d in range(2) for c1 in range(2)
            for h in range(4) for w in range(4)]
    fm = dict(layout=FeatureMapLayout.NDC1HWC0, depth=2, channel_groups=2, height=4, width=4,
              filter_height=2, filter_width=2, dilation_height=2, dilation_width=2,
              logical_channels=2)
    state = make_state({"M#1": _fm_source("S16", flat, 16, fm)}, gprs={2: 3, 3: 2})
    result, _ = run_bundle(state, img2col_bundle("S16", 4, 3, ior="a0, a1"))
    assert _d(result).tolist() == [[31, 33, 111, 113], [1020, 1022, 1100, 1102],
                                   [1021, 1023, 1101, 1103]]
    # Range faults of the same descriptor: posM = 6 (6 + 3 > 8) and posK = 5 (5 + 4 > 8).
    for pos_m, pos_k in ((6, 0), (0, 5)):
        state = make_state({"M#1": _fm_source("S16", flat, 16, fm)}, gprs={2: pos_m, 3: pos_k})
        result, _ = run_bundle(state, img2col_bundle("S16", 4, 3, ior="a0, a1"))
        assert result.fault is FaultClass.TILE_LEGALITY
