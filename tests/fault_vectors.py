"""Fault vectors: the spec's fault tests (inventory parts A-C, H, I) and the rulings' checks.

``CASES`` maps a case name to (initial state, program, expected fault class, index of the
reporting instruction or ``STOP``).  The cases are transcribed from the spec's tests (bundle,
tile state, expected fault); where a test used a model hook we cannot express (a non-encodable
mask, a column-major tile) the nearest encodable variant is used and says so.  The model
(``test_preflight.py``) and the hardware preflight (``test_hdl_preflight.py``) both run them.
"""

import numpy as np

from ptocube.model.bundle import Operation as Op
from ptocube.model.faults import FaultClass
from ptocube.model.img2col import FeatureMapDescriptor
from ptocube.model.state import Location, SharedTile, StatusFlag

from model_helpers import img2col_bundle, make_state, matrix_bundle, tile

TL, TA = FaultClass.TILE_LEGALITY, FaultClass.TILE_ALLOCATION
BC, II = FaultClass.BUNDLE_CONTROL, FaultClass.ILLEGAL_INSTRUCTION
STOP = "stop"


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

def fp16_1x1(extra=None, **kw):
    local = {"M#1": tile("FP16", "CUBE_M16", [[0x4000]]),
             "N#1": tile("FP16", "CUBE_N8", [[0x4200]])}
    local.update(extra or {})
    return make_state(local, **kw)


def _s16_s8_2x2(extra=None):
    local = {"M#1": tile("S16", "CUBE_M16", [[1, 2], [3, 4]]),
             "N#1": tile("S8", "CUBE_N8", [[5, 6], [7, 8]])}
    local.update(extra or {})
    return make_state(local)


def _bias_case(bias):
    return (_s16_s8_2x2({"T#5": bias}),
            matrix_bundle(Op.TMATMUL_BIAS, "S16", b_type="S8", dims=(2, 2, 2),
                          sources=["M#1", "N#1", "T#5"]))


def _u16_shared(extra_shared=None, local=None):
    shared = {50: tile("U16", "ROW_MAJOR", [[3]], shared=True),
              51: tile("U16", "ROW_MAJOR", [[2]], shared=True)}
    shared.update(extra_shared or {})
    return make_state(local or {"M#1": tile("U16", "CUBE_M16", [[2]])}, shared=shared)


def _e4m3_mx(extra=None):
    local = {"M#1": tile("E4M3", "CUBE_M16", [[0x38]]), "T#1": tile("E8M0", "ROW_MAJOR", [[0x7F]]),
             "N#1": tile("E4M3", "CUBE_N8", [[0x38]]), "T#2": tile("E8M0", "ROW_MAJOR", [[0x7F]])}
    local.update(extra or {})
    return make_state(local)


def img2col_source(fm=None, dtype="U8", data=((5,),), location=Location.MATRIX, **kw):
    fm = FeatureMapDescriptor() if fm is None else fm
    return tile(dtype, "ROW_MAJOR", np.array(data), location=location, feature_map=fm, **kw)


def _raw(*words):
    """A program of raw 32-bit words."""
    return "\n".join(f".4byte {w:#010x}" for w in words) + "\n"


# ---------------------------------------------------------------------------
# The cases: id -> (state, program, fault class, reporting instruction)
# ---------------------------------------------------------------------------

def _cases():
    c = {}
    # -- part A: CUBE Matrix block-start pages --------------------------------------
    c["A-tgemv-cube-m-003"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", [[1], [2]]),
                    "N#1": tile("FP16", "CUBE_N8", [[3]])}),
        matrix_bundle(Op.TGEMV, "FP16", dims=(2, None, None), sources=["M#1", "N#1"]), TL, STOP)
    c["A-tgemv-shared-001"] = (
        _u16_shared(), matrix_bundle(Op.TGEMV, "U16", shared=[50], sources=["M#1"]), TL, STOP)
    for name, bias in (("1x1", tile("S32", "ROW_MAJOR", [[10]])),
                       ("2x1", tile("S32", "ROW_MAJOR", [[10], [20]])),
                       ("2x2", tile("S32", "ROW_MAJOR", [[10, 20], [30, 40]])),
                       # the spec's column-major variant is not a layout of this tile
                       # store; a CUBE bias is the nearest non-row-major one
                       ("cube", tile("S32", "CUBE_M16", [[10, 20]])),
                       ("s16-typed", tile("S16", "ROW_MAJOR", [[10, 20]]))):
        c[f"A-bias-shape-001-{name}"] = _bias_case(bias) + (TL, STOP)
    row_major = {"M#1": tile("FP16", "ROW_MAJOR", [[0x4000]]),
                 "N#1": tile("FP16", "ROW_MAJOR", [[0x4200]])}
    c["A-dim-001-m-zero"] = (make_state(row_major), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(0, None, None), sources=["M#1", "N#1"]), TL, STOP)
    c["A-dim-001-k-three"] = (make_state(row_major), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(None, None, 3), sources=["M#1", "N#1"]), TL, STOP)
    c["A-presence-001-datr-fp64"] = (
        make_state({"M#1": tile("FP32", "CUBE_M16", [[0]]), "N#1": tile("FP32", "CUBE_N8", [[0]])}),
        matrix_bundle(Op.TMATMUL, "FP32", datr="{NORM, FP64, Zero, EQ, Default, 0, 0}",
                      sources=["M#1", "N#1"]), TL, STOP)
    for a, b in (("FP64", None), ("E8M0", None), ("HiF4X2", None), ("S64", None), ("S32", None),
                 ("U64", None), ("U32", None), ("FP16", "S16"), ("U8", "S8")):
        c[f"A-types-001-{a}-{b or a}"] = (make_state(), matrix_bundle(
            Op.TMATMUL, a, b_type=b, sources=["M#1", "N#1"]), TL, STOP)
    # -- part B: direct Tile pages, as bundles ---------------------------------------
    c["B-tmatmul-acc-index-002"] = (
        fp16_1x1({"T#1": tile("FP32", "CUBE_M16", [[5]])}),
        matrix_bundle(Op.TMATMUL_ACC, "FP16", sources=["T#1", "M#1", "N#1"],
                      destinations=[("T", 1)]), TL, STOP)
    c["B-mx-scale-001-fp16-with-scale"] = (
        fp16_1x1({"T#1": tile("E8M0", "ROW_MAJOR", [[0x7F]])}),
        matrix_bundle(Op.TMATMUL_MX, "FP16", sources=["M#1", "T#1", "N#1"]), TL, STOP)
    c["B-mx-scale-001-e4m3-without-scale"] = (
        _e4m3_mx(), matrix_bundle(Op.TMATMUL_MX, "E4M3", sources=["M#1", "N#1"]), TL, STOP)
    c["B-mx-scale-001-wrong-scale-shape"] = (
        _e4m3_mx({"T#1": tile("E8M0", "ROW_MAJOR", [[0x7F, 0x7F]])}),
        matrix_bundle(Op.TMATMUL_MX, "E4M3", sources=["M#1", "T#1", "N#1", "T#2"]), TL, STOP)
    c["B-mx-scale-001-fp32-scale"] = (
        _e4m3_mx({"T#2": tile("FP32", "ROW_MAJOR", [[0x3F800000]])}),
        matrix_bundle(Op.TMATMUL_MX, "E4M3", sources=["M#1", "T#1", "N#1", "T#2"]), TL, STOP)
    c["B-mx-types-001-hif4x2"] = (
        make_state(), matrix_bundle(Op.TMATMUL_MX, "HiF4X2", b_type="FP16",
                                    sources=["M#1", "T#1", "N#1"]), TL, STOP)
    c["B-mx-acc-index-002"] = (
        _e4m3_mx({"T#4": tile("FP32", "CUBE_M16", [[0]])}),
        matrix_bundle(Op.TMATMUL_MX_ACC, "E4M3", sources=["T#4", "M#1", "T#1", "N#1", "T#2"],
                      destinations=[("N", 1)]), TL, STOP)
    # -- part C: decoded-bundle dispatch model ---------------------------------------
    c["C-dimensions-003-zero-n"] = (fp16_1x1(), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(None, 0, None), sources=["M#1", "N#1"]), TL, STOP)
    c["C-dimensions-003-shared-not-power-of-two"] = (
        _u16_shared(local={"M#1": tile("U16", "CUBE_M16", [[2]] * 3)}),
        matrix_bundle(Op.TMATMUL, "U16", dims=(3, 1, 1), shared=[50], sources=["M#1"]), TL,
        STOP)
    c["C-layout-002-a-in-n8"] = (
        make_state({"M#1": tile("FP16", "CUBE_N8", [[1]]), "N#1": tile("FP16", "CUBE_N8", [[1]])}),
        matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"]), TL, STOP)
    c["C-layout-002-b-in-m16"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", [[1]]),
                    "N#1": tile("FP16", "CUBE_M16", [[1]])}),
        matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"]), TL, STOP)
    c["C-layout-002-c-layout-differs-from-a"] = (
        fp16_1x1({"T#5": tile("FP32", "CUBE_M32", [[0]])}),
        matrix_bundle(Op.TMATMUL_ACC, "FP16", sources=["T#5", "M#1", "N#1"]), TL, STOP)
    c["C-cube-aux-007-cube-bias"] = (
        fp16_1x1({"T#5": tile("FP32", "CUBE_M16", [[5]])}),
        matrix_bundle(Op.TMATMUL_BIAS, "FP16", sources=["M#1", "N#1", "T#5"]), TL, STOP)
    c["C-acc-atomic-026"] = (
        make_state({"T#5": tile("FP32", "CUBE_M32", np.zeros((32, 16))),
                    "M#1": tile("FP16", "CUBE_M32", np.zeros((32, 1))),
                    "N#1": tile("FP16", "CUBE_N8", np.zeros((1, 16)))}, flags=StatusFlag.NV),
        matrix_bundle(Op.TMATMUL_ACC, "FP16", dims=(32, 16, 1), fpatr=(0, 0, 1, 1, 1),
                      sources=["T#5", "M#1", "N#1"],
                      destinations=[("U", 5), ("U", 2), ("U", 1)]), TA, STOP)
    # The spec test's start word 0x10431181 is TMATMULMX with TF32 (not an ACC form),
    # so the fault is over-determined: the type pair already fails.
    c["C-acc-cap-001"] = (
        make_state({"N#1": tile("FP32", "ROW_MAJOR", [[0, 0]], 256),
                    "M#1": tile("TF32", "ROW_MAJOR", [[0]]),
                    "N#2": tile("TF32", "ROW_MAJOR", [[0]])}),
        _raw(0x10431181, 0x00802023) + "B.IOT N#1, M#1, mask=1111\n"
        "B.IOT N#2, mask=1111, last, ->T<1>\nBSTOP\n", TL, STOP)
    c["C-acc-index-021"] = (
        make_state({(0, "T#2"): tile("FP32", "CUBE_M16", [[5]]),
                    (0, "T#3"): tile("FP16", "CUBE_M16", [[2]]),
                    (0, "T#4"): tile("FP16", "CUBE_N8", [[3]])}, flags=StatusFlag.NX),
        _raw(0x20231181, 0x00002023, 0x0010D293, 0x0C284213, 0x00000001), TL, 4)
    c["C-cube-capacity-008-source-capacity"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", np.ones((16, 17)), 512),
                    "N#1": tile("FP16", "CUBE_N8", np.ones((17, 9)))}),
        matrix_bundle(Op.TMATMUL, "FP16", dims=(16, 9, 17), sources=["M#1", "N#1"],
                      destinations=[("T", 4)]), TL, STOP)
    c["C-cube-capacity-008-destination-tsize"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", np.ones((16, 17))),
                    "N#1": tile("FP16", "CUBE_N8", np.ones((17, 9)))}),
        matrix_bundle(Op.TMATMUL, "FP16", dims=(16, 9, 17), sources=["M#1", "N#1"],
                      destinations=[("T", 3)]), TA, STOP)
    c["C-cube-definedness-009"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", [[1, 2], [3, 4]], undefined=[(1, 0)]),
                    "N#1": tile("FP16", "CUBE_N8", [[5, 6], [7, 8]])}),
        matrix_bundle(Op.TMATMUL, "FP16", dims=(2, 2, 2), sources=["M#1", "N#1"]), TL, STOP)
    c["C-local-transpose-013"] = (
        _u16_shared(), matrix_bundle(Op.TMATMUL, "U16", fpatr=(0, 0, 0, 0, 0, 0, 0, 1, 0),
                                     shared=[50], sources=["M#1"]), TL, STOP)
    c["C-missing-fpatr-001"] = (
        _u16_shared(), matrix_bundle(Op.TMATMUL, "U16", fpatr=None, shared=[50],
                                     sources=["M#1"]), BC, STOP)
    c["C-mx-shared-group-001"] = (
        _e4m3_mx(),
        matrix_bundle(Op.TMATMUL_MX, "E4M3", b_type="E5M2", shared=[60], sources=["M#1", "T#1"]),
        TL, STOP)
    c["C-ordinary-primary-004"] = (
        make_state(row_major), matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"]), TL,
        STOP)
    c["C-shared-readiness-012"] = (
        _u16_shared({52: SharedTile(tile("U16", "ROW_MAJOR", [[2]], shared=True),
                                    0b0011, 0b0011)}),
        matrix_bundle(Op.TMATMUL, "U16", shared=[52, 50]), TL, STOP)
    c["C-shared-rollback-019"] = (
        make_state(shared={3: tile("U16", "ROW_MAJOR", np.ones((16, 1)), shared=True),
                           4: tile("U16", "ROW_MAJOR", np.ones((1, 16)), shared=True)}),
        matrix_bundle(Op.TMATMUL, "U16", dims=(16, 16, 1), shared=[3, 4],
                      destinations=[("T", 3)]), TA, STOP)
    c["C-shared-undef-020"] = (
        fp16_1x1({"T#1": tile("FP16", "CUBE_M16", [[2]])}),
        _raw(0x20031181, 0x00002023, 0x04D01E13, 0x0008DE13, 0x00000001), TL, 4)
    c["C-slrelu-bits-001"] = (
        fp16_1x1(gprs={1: 0x00080000}),
        matrix_bundle(Op.TMATMUL, "FP16", fpatr=(0, 2), sources=["M#1", "N#1"], ior="sp"),
        TL, STOP)
    c["C-squant-bits-001"] = (
        make_state({"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]])},
                   gprs={2: 1}),
        matrix_bundle(Op.TMATMUL, "S8", fpatr=(3,), sources=["M#1", "N#1"], ior="a0"), TL, STOP)
    c["C-unused-ior-001"] = (
        fp16_1x1(), matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"], ior="a0"), TL,
        STOP)
    c["C-vquant-desc-001-u32-vector"] = (
        make_state({"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]]),
                    "T#3": tile("U32", "ROW_MAJOR", [[0x40000000]])}),
        matrix_bundle(Op.TMATMUL, "S8", fpatr=(2,), sources=["M#1", "N#1", "T#3"]), TL, STOP)
    c["C-shared-layout-014-m-too-large"] = (
        make_state(shared={3: tile("U16", "ROW_MAJOR", np.ones((64, 1)), shared=True),
                           4: tile("U16", "ROW_MAJOR", np.ones((1, 1)), shared=True)}),
        matrix_bundle(Op.TMATMUL, "U16", dims=(64, 1, 1), shared=[3, 4]), TL, STOP)
    # -- the rulings' own checks ------------------------------------------------------
    c["R5-cube-m16-caps-m"] = (
        make_state({"M#1": tile("FP16", "CUBE_M16", [[1]] * 16),
                    "N#1": tile("FP16", "CUBE_N8", [[1]])}),
        matrix_bundle(Op.TMATMUL, "FP16", dims=(17, 1, 1), sources=["M#1", "N#1"]), TL, STOP)
    c["R8-dtype-none"] = (fp16_1x1(), matrix_bundle(
        Op.TMATMUL, "FP16", datr="{NORM, DTYPE_NONE, Zero, EQ, Default, 0, 0}",
        sources=["M#1", "N#1"]), TL, STOP)
    c["R8-rmode-with-mode-0"] = (fp16_1x1(), matrix_bundle(
        Op.TMATMUL, "FP16", rmode="RTZ", sources=["M#1", "N#1"]), TL, STOP)
    c["R8-rmode-with-fixed-rounding-mode"] = (fp16_1x1(), matrix_bundle(
        Op.TMATMUL, "FP16", fpatr=(1,), rmode="RNE", sources=["M#1", "N#1"]), TL, STOP)
    c["R8-scalar-mode-without-ior"] = (
        make_state({"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]])}),
        matrix_bundle(Op.TMATMUL, "S8", fpatr=(3,), sources=["M#1", "N#1"]), TL, STOP)
    c["R8-lrelu-without-ior"] = (fp16_1x1(), matrix_bundle(
        Op.TMATMUL, "FP16", fpatr=(0, 2), sources=["M#1", "N#1"]), TL, STOP)
    c["mode-accumulator-class"] = (
        make_state({"M#1": tile("U8", "CUBE_M16", [[1]]), "N#1": tile("U8", "CUBE_N8", [[1]])}),
        matrix_bundle(Op.TMATMUL, "U8", fpatr=(1,), sources=["M#1", "N#1"]), TL, STOP)
    c["rowmax-in-location-matrix"] = (
        fp16_1x1({"T#3": tile("FP32", "ROW_MAJOR", [[0]], location=Location.MATRIX)}),
        matrix_bundle(Op.TMATMUL, "FP16", fpatr=(0, 0, 0, 1, 0, 1), sources=["M#1", "N#1", "T#3"],
                      destinations=[("T", 1), ("U", 1)]), TL, STOP)
    c["acc-c-capacity-differs-from-d"] = (
        fp16_1x1({"T#5": tile("FP32", "CUBE_M16", [[0]], 256)}),
        matrix_bundle(Op.TMATMUL_ACC, "FP16", sources=["T#5", "M#1", "N#1"]), TL, STOP)
    c["d-hand-full"] = (
        fp16_1x1({f"U#{n}": tile("U8", "ROW_MAJOR", [[n]]) for n in range(1, 17)}),
        matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"], destinations=[("U", 1)]), TA,
        STOP)
    c["core-capacity-exceeded"] = (
        fp16_1x1(tile_capacity=4096), matrix_bundle(
            Op.TMATMUL, "FP16", sources=["M#1", "N#1"], destinations=[("T", 5)]), TA, STOP)
    c["groupmax-columns-not-power-of-two"] = (
        make_state({"M#1": tile("U8", "CUBE_M16", [[1]]),
                    "N#1": tile("U8", "CUBE_N8", [[1] * 24])}),
        matrix_bundle(Op.TMATMUL, "U8", dims=(1, 24, 1), fpatr=(0, 0, 1, 0, 1),
                      sources=["M#1", "N#1"], destinations=[("T", 5), ("U", 1)]), TA, STOP)
    # -- part H: operand bindings (decode-time faults) -------------------------------
    fpatr = "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"
    iot = "B.IOT M#1, N#1, mask=1111, last, ->T<1>\n"
    c["H-b-ior-reserved-selector"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr + iot + _raw(0x000C0013) + "BSTOP\n", II, 3)
    c["H-b-ior-duplicate"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr + iot + "B.IOR zero\nB.IOR zero\nBSTOP\n",
        BC, 4)
    c["H-b-ior-placement"] = (make_state(), "B.IOR a0\n", BC, 0)
    c["H-b-ios-duplicate-id"] = (
        _u16_shared(), "BSTART.TMATMUL U16\n" + fpatr + "B.IOS S50, mask=1111\n"
        "B.IOS S50, mask=1111\nBSTOP\n", BC, 3)
    c["H-b-ios-fifth"] = (
        make_state(), "BSTART.TMATMUL U16\n" + fpatr + "".join(
            f"B.IOS S{i}, mask=1111\n" for i in range(5)) + "BSTOP\n", BC, 6)
    c["H-b-ios-mask-consistency"] = (
        _u16_shared(), "BSTART.TMATMUL U16\n" + fpatr + "B.IOT M#1, mask=1100, last, ->T<1>\n"
        "B.IOS S50, mask=1111\nBSTOP\n", TL, 3)
    # A B.IOT only compares Local masks when it executes; a Shared/Local mismatch
    # the other way round is caught at completion.
    c["H-b-iot-after-ios-mask-mismatch"] = (
        _u16_shared(), "BSTART.TMATMUL U16\n" + fpatr + "B.IOS S50, mask=1111\n"
        "B.IOT M#1, mask=1100, last, ->T<1>\nBSTOP\n", TL, STOP)
    c["H-b-ios-placement"] = (make_state(), "B.IOS S1, mask=1111\n", BC, 0)
    c["H-b-iot-sizecode-11"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr
        + _raw(0x00006013 | 11 << 15 | 7 << 9 | 1 << 19) + "BSTOP\n", II, 2)
    c["H-b-iot-schemas-mask-mismatch"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr + "B.IOT M#1, mask=1100\n"
        "B.IOT N#1, mask=1111, last, ->T<1>\nBSTOP\n", TL, 3)
    c["H-b-iot-last-order"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr + "B.IOT M#1, N#1, mask=1111, last\n"
        "B.IOT mask=1111, ->T<1>\nBSTOP\n", BC, 3)
    c["H-b-iot-placement"] = (make_state(), "B.IOT M#1, mask=1111, last\n", BC, 0)
    c["G-b-dim-duplicate"] = (
        fp16_1x1(), "BSTART.TMATMUL FP16\n" + fpatr + "B.DIM zero, 3, ->LB0\n"
        "B.DIM zero, 9, ->LB0\n" + iot + "BSTOP\n", BC, 3)
    # -- part I: bundle lifecycle ---------------------------------------------------
    c["I-bstop-inactive"] = (make_state(), "BSTOP\n", BC, 0)
    c["I-commit-rollback-missing-binding"] = (
        make_state(), "BSTART.SFU TIMG2COL, U8\nB.DIM zero, 1, ->LB0\nBSTOP\n", BC, 2)
    c["I-operation-fields-cube-function-hole"] = (make_state(), _raw(0xC0331181), II, 0)
    c["I-operation-fields-datatype-31"] = (make_state(), _raw(0xF8031181), II, 0)
    c["I-undersized-allocation"] = (
        make_state({"M#1": tile("U16", "CUBE_M16", np.ones((16, 2))),
                    "N#1": tile("U16", "CUBE_N8", np.ones((2, 16)))}),
        matrix_bundle(Op.TMATMUL, "U16", dims=(16, 16, 2), sources=["M#1", "N#1"],
                      destinations=[("T", 1)]), TA, STOP)
    # -- TIMG2COL (rulings R13, R14) ---------------------------------------------------
    c["J-img2col-range-001"] = (
        make_state({"M#1": img2col_source()}, gprs={3: 1}),
        img2col_bundle("U8", 1, ior="zero, a1"), TL, STOP)
    for dtype in ("E3M2", "FP64", "U4X2"):
        c[f"J-stage4-carrier-types-{dtype}"] = (
            make_state({"M#1": img2col_source(dtype=dtype, data=((1,),))}),
            img2col_bundle(dtype, 1), TL, STOP)
    c["J-feature-map-invalid-after-reconfigure"] = (
        make_state({"M#1": tile("U8", "ROW_MAJOR", [[5]], location=Location.MATRIX)}),
        img2col_bundle("U8", 1), TL, STOP)
    c["J-feature-map-transposed"] = (
        make_state({"M#1": img2col_source(FeatureMapDescriptor(transposed=True))}),
        img2col_bundle("U8", 1), TL, STOP)
    c["J-referenced-undefined"] = (
        make_state({"M#1": img2col_source(FeatureMapDescriptor(channels_per_group=2,
                                                                logical_channels=2),
                                           data=((31, 32),), undefined=[(0, 1)])}),
        img2col_bundle("U8", 2), TL, STOP)
    c["J-source-location-any"] = (
        make_state({"M#1": img2col_source(location=Location.ANY)}), img2col_bundle("U8", 1),
        TL, STOP)
    c["J-type-differs-from-source"] = (
        make_state({"M#1": img2col_source()}), img2col_bundle("S8", 1), TL, STOP)
    zero_datr = "B.DATR {NORM, FP64, Zero, EQ, Default, 0, 0}\n"
    c["J-datr-present"] = (
        make_state({"M#1": img2col_source()}),
        img2col_bundle("U8", 1).replace("B.DIM", "B.DATR {NORM, U8, Zero, EQ, Default, 0, 0}\n"
                                                  "B.DIM", 1), TL, STOP)
    # An all-zero B.DATR passes the field check and makes the destination FP64
    # (allocation first, then TileOperandsLegal_TIMG2COL); a nonzero field fails
    # before allocation.  M#2..M#16 fill hand M, so allocation would fail.
    full_hand = {f"M#{n}": tile("U8", "ROW_MAJOR", [[n]]) for n in range(2, 17)}
    c["J-datr-all-zero"] = (
        make_state({"M#1": img2col_source()}),
        img2col_bundle("U8", 1).replace("B.DIM", zero_datr + "B.DIM", 1), TL, STOP)
    c["J-datr-all-zero-hand-full"] = (
        make_state({"M#1": img2col_source(), **full_hand}),
        img2col_bundle("U8", 1).replace("B.DIM", zero_datr + "B.DIM", 1), TA, STOP)
    c["J-datr-all-zero-fp64-destination-too-small"] = (      # 32 FP64 = 256 B > 128 B
        make_state({"M#1": img2col_source()}),
        img2col_bundle("U8", 32).replace("B.DIM", zero_datr + "B.DIM", 1), TA, STOP)
    c["J-datr-nonzero-field-before-allocation"] = (
        make_state({"M#1": img2col_source(), **full_hand}),
        img2col_bundle("U8", 1).replace("B.DIM", "B.DATR {NORM, FP64, Zero, EQ, Default, 1, 0}\n"
                                                  "B.DIM", 1), TL, STOP)
    c["J-lb0-missing"] = (
        make_state({"M#1": img2col_source()}),
        "BSTART.SFU TIMG2COL, U8\nB.IOT M#1, mask=1111, last, ->M<1>\nBSTOP\n", TL, STOP)
    c["J-destination-too-small"] = (
        make_state({"M#1": img2col_source()}), img2col_bundle("U8", 64, 3, destination=("M", 1)),
        TA, STOP)
    c["J-destination-columns-not-power-of-two"] = (
        make_state({"M#1": img2col_source()}), img2col_bundle("U8", 3), TA, STOP)
    c["J-fpatr-in-timg2col"] = (
        make_state({"M#1": img2col_source()}),
        "BSTART.SFU TIMG2COL, U8\n" + fpatr + "B.DIM zero, 1, ->LB0\n"
        "B.IOT M#1, mask=1111, last, ->M<1>\nBSTOP\n", BC, 1)
    c["J-shared-binding"] = (
        make_state({"M#1": img2col_source()}),
        "BSTART.SFU TIMG2COL, U8\nB.DIM zero, 1, ->LB0\nB.IOS S1, mask=1111\n"
        "B.IOT M#1, mask=1111, last, ->M<1>\nBSTOP\n", TL, STOP)
    c["J-ior-regsrc2"] = (
        make_state({"M#1": img2col_source()}), img2col_bundle("U8", 1, ior="zero, zero, a0"), BC,
        STOP)
    return c


CASES = _cases()
