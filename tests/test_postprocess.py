"""B.FPATR post-processing (model/postprocess.py).

Three kinds of checks:

* the mode table, field rules, parameter legality and B.DATR rule against
  facts transcribed from the spec (B.FPATR page/ASL, digest §5);
* the spec's own vectors: the hardware numeric vectors' matrix_postprocess
  group and the execution/boundary points of the ASL tests (inventory parts
  D, E, F), transcribed here (the tests never read the spec);
* random matrices through every PreQuantMode x ReluMode against a slow
  per-element reference written below from the digest's §5.6 pipeline, using
  the exact rational encoders of test_convert.py, and a literal MAX fold for
  RowMax/GroupMax.
"""

import struct
from fractions import Fraction as Q

import numpy as np
import pytest

from ptocube.model.bundle import Fpatr
from ptocube.model.convert import Flag, RMode, resolve_rmode
from ptocube.model.datatype import DataType as T
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.postprocess import (
    PREQUANT_MODES, ParamKind, check_acc_type, check_alpha_word, check_fpatr,
    check_quant_word, check_rmode_sat, d_dtype, effective_rounding, fp19_value, group_count,
    group_max, group_n, intermediate_round_clamp, needs_scalar_param, needs_vector_param,
    postprocess, quant_offset, quant_scale, quant_shift, row_max, scalar_param_slots,
    shift_s32_to_s16, vector_param_sources)

# The exact reference encoders live with the encoder tests (pytest puts tests/ on sys.path).
from encode_reference import ref_encode, ref_int, ref_round

NV, OF, UF, NX = int(Flag.NV), int(Flag.OF), int(Flag.UF), int(Flag.NX)
TL, II = FaultClass.TILE_LEGALITY, FaultClass.ILLEGAL_INSTRUCTION

# --- the PreQuantMode table, transcribed from the spec digest §5.3 -----------------
# code: (name, source accumulator, D type, parameter, offset/intermediate width, rounding)
# rounding: "RNE"/"RHB" fixed, "RMode" programmable, "shift" for the ASR modes, "NONE" mode 0.
MODE_TABLE = {
    0: ("NoQuant", None, None, "none", 0, "NONE"),
    1: ("F322F16", T.FP32, T.FP16, "none", 0, "RNE"),
    2: ("VREQ8", T.S32, T.S8, "vector", 9, "RMode"),
    3: ("REQ8", T.S32, T.S8, "scalar", 9, "RMode"),
    4: ("VDEQF16", T.S32, T.FP16, "vector", 0, "RMode"),
    5: ("DEQF16", T.S32, T.FP16, "scalar", 0, "RMode"),
    12: ("VSHIFTS322S16", T.S32, T.S16, "vector", 0, "shift"),
    13: ("SHIFTS322S16", T.S32, T.S16, "scalar", 0, "shift"),
    16: ("F322BF16", T.FP32, T.BF16, "none", 0, "RNE"),
    17: ("REQ4", T.S32, T.S4X2, "scalar", 5, "RMode"),
    18: ("VREQ4", T.S32, T.S4X2, "vector", 5, "RMode"),
    19: ("DEQS16", T.S32, T.S16, "scalar", 17, "RMode"),
    20: ("VDEQS16", T.S32, T.S16, "vector", 17, "RMode"),
    23: ("VQF322B8_PRE", T.FP32, T.S8, "vector", 9, "RMode"),
    24: ("QF322B8_PRE", T.FP32, T.S8, "scalar", 9, "RMode"),
    25: ("QF322HIF8_PRE", T.FP32, T.HiF8, "scalar", 0, "RHB"),
    26: ("QF322FP8_PRE", T.FP32, T.E4M3, "scalar", 0, "RNE"),
    27: ("QF322F32_PRE", T.FP32, T.FP32, "scalar", 0, "RMode"),
    28: ("VQF322HIF8_PRE", T.FP32, T.HiF8, "vector", 0, "RHB"),
    32: ("QF322F16_PRE", T.FP32, T.FP16, "scalar", 0, "RNE"),
    33: ("VQF322F16_PRE", T.FP32, T.FP16, "vector", 0, "RNE"),
    34: ("QF322BF16_PRE", T.FP32, T.BF16, "scalar", 0, "RNE"),
    35: ("QS322BF16_PRE", T.S32, T.BF16, "scalar", 0, "RMode"),
    36: ("VQF322BF16_PRE", T.FP32, T.BF16, "vector", 0, "RNE"),
    37: ("VQF322FP8_PRE", T.FP32, T.E4M3, "vector", 0, "RNE"),
    38: ("VQF322F32_PRE", T.FP32, T.FP32, "vector", 0, "RMode"),
    39: ("VQS322BF16_PRE", T.S32, T.BF16, "vector", 0, "RMode"),
}
FLOAT_D = {T.FP32, T.FP16, T.BF16, T.E4M3, T.HiF8}


def fp19(f32_bits: int) -> int:
    """FP19 carrier of an FP32 value whose low 13 bits are zero (all test values are)."""
    assert f32_bits & 0x1FFF == 0
    return f32_bits >> 13


def qword(scale_f32: int, offset: int = 0, width: int = 0) -> int:
    """A quantization word: FP19 scale in bits[31:13], signed offset at bit 37."""
    return (fp19(scale_f32) << 13) | ((offset & ((1 << width) - 1)) << 37 if width else 0)


def shift_word(code: int) -> int:
    return code << 32


ONE, TWO, HALF = 0x3F800000, 0x40000000, 0x3F000000


def run(p, acc, mode, relu=0, rmode=0, sat=0, **kw):
    """postprocess on a small matrix; returns (d as a list of rows, flags)."""
    r = postprocess(np.array(p, dtype=np.uint32), acc, Fpatr(pre_quant_mode=mode, relu_mode=relu),
                    rmode, sat, **kw)
    return r.d.tolist(), r.flags


def run1(value, acc, mode, relu=0, rmode=0, sat=0, **kw):
    d, flags = run([[value]], acc, mode, relu, rmode, sat, **kw)
    return d[0][0], flags


def fault(fn, cls=TL):
    with pytest.raises(PTOFault) as info:
        fn()
    assert info.value.fault is cls
    return info.value


# --- table, field rules and helpers ---------------------------------------------------

def test_mode_table_matches_spec():
    assert sorted(PREQUANT_MODES) == sorted(MODE_TABLE)
    assert len(PREQUANT_MODES) == 27
    for code, (name, source, d, param, width, rounding) in MODE_TABLE.items():
        m = PREQUANT_MODES[code]
        assert (m.code, m.name, m.source, m.d_dtype, m.param.value, m.offset_width) == \
            (code, name, source, d, param, width)
        assert m.shift == (rounding == "shift")
        assert m.fixed_rounding == (RMode[rounding] if rounding in ("RNE", "RHB") else None)


def test_mode_predicates_match_asl_sets():
    # B.FPATR ASL predicates and block-fault-b-fpatr-controls-010 / input-type-002.
    fixed = {1, 16, 25, 26, 28, 32, 33, 34, 36, 37}
    s32 = {2, 3, 4, 5, 12, 13, 17, 18, 19, 20, 35, 39}
    vector = {2, 4, 12, 18, 20, 23, 28, 33, 36, 37, 38, 39}
    scalar = {3, 5, 13, 17, 19, 24, 25, 26, 27, 32, 34, 35}
    assert {c for c, m in PREQUANT_MODES.items() if m.fixed_rounding} == fixed
    assert {c for c, m in PREQUANT_MODES.items() if m.source is T.S32} == s32
    assert {c for c, m in PREQUANT_MODES.items() if m.param is ParamKind.VECTOR} == vector
    assert {c for c, m in PREQUANT_MODES.items() if m.param is ParamKind.SCALAR} == scalar
    assert {c for c, m in PREQUANT_MODES.items() if m.sat_free} == set(MODE_TABLE) - {0, 12, 13}
    for code in (3, 17, 19, 25):
        assert PREQUANT_MODES[code].sat_free


def test_acc_type_rule():
    # block-fault-b-fpatr-input-type-002: mode 0 takes all three; others only their own.
    for code in MODE_TABLE:
        for acc in (T.FP32, T.S32, T.U32):
            ok = code == 0 or MODE_TABLE[code][1] is acc
            if ok:
                check_acc_type(code, acc)
                assert d_dtype(code, acc) is (acc if code == 0 else MODE_TABLE[code][2])
            else:
                fault(lambda: check_acc_type(code, acc))


# B.FPATR DATR legality pairs asserted by block-fault-b-fpatr-controls-010 and
# block-bound-b-fpatr-mode-table-001: (mode, RMode, Sat, legal).
DATR_PAIRS = [
    (1, 0, 0, True), (1, 0, 1, True), (1, 1, 0, False), (26, 5, 1, False), (3, 1, 0, True),
    (19, 5, 1, True), (12, 0, 0, True), (12, 0, 1, False), (13, 1, 0, False),
    (0, 0, 0, True), (0, 1, 0, False), (1, 6, 1, False), (12, 1, 0, False), (13, 2, 1, False),
    (1, 7, 1, False), (3, 7, 1, True),
]


@pytest.mark.parametrize("mode,rmode,sat,legal", DATR_PAIRS)
def test_rmode_sat_rule_asl_pairs(mode, rmode, sat, legal):
    if legal:
        check_rmode_sat(mode, rmode, sat)
    else:
        fault(lambda: check_rmode_sat(mode, rmode, sat))


def test_rmode_sat_rule_all_modes():
    for code, row in MODE_TABLE.items():
        for rmode in range(8):
            for sat in (0, 1):
                legal = {"NONE": rmode == 0 and not sat, "shift": rmode == 0 and not sat,
                         "RNE": rmode == 0, "RHB": rmode == 0, "RMode": True}[row[5]]
                if legal:
                    check_rmode_sat(code, rmode, sat)
                else:
                    fault(lambda: check_rmode_sat(code, rmode, sat))


def test_effective_rounding_overrides_rmode_in_fixed_modes():
    for code, row in MODE_TABLE.items():
        for rmode in range(8):
            want = {"RNE": RMode.RNE, "RHB": RMode.RHB}.get(row[5], resolve_rmode(rmode))
            assert effective_rounding(code, rmode) is want


# block-bound-b-fpatr-mode-table-001, BundleFPATRFieldsLegal:
# (group code, RowMaxEn, GroupMaxEn, RowMaxInit, MaxAbsEn, legal)
FIELD_PAIRS = [
    (1, False, False, False, False, False), (0, False, False, True, False, False),
    (0, False, False, False, True, False), (0, True, False, False, True, True),
    (0, False, False, False, False, True), (1, False, True, False, True, True),
    (1, True, True, False, True, True), (0, False, True, False, False, False),
    (1, False, False, True, False, False),
]


@pytest.mark.parametrize("gcode,row,grp,init,mabs,legal", FIELD_PAIRS)
def test_fpatr_field_rules(gcode, row, grp, init, mabs, legal):
    f = Fpatr(group_n_code=gcode, row_max_en=row, group_max_en=grp, row_max_init=init,
              max_abs_en=mabs)
    if legal:
        check_fpatr(f)
    else:
        fault(lambda: check_fpatr(f))


def test_reserved_fields_do_not_decode():
    # block-fault-b-fpatr-pq*-001, relu-rsvd-001, group-rsvd-001.
    for code in range(64):
        if code not in MODE_TABLE:
            fault(lambda: check_fpatr(Fpatr(pre_quant_mode=code)), II)
    for relu in range(4, 8):
        fault(lambda: check_fpatr(Fpatr(relu_mode=relu)), II)
    for gcode in range(10, 16):
        fault(lambda: check_fpatr(Fpatr(group_n_code=gcode, group_max_en=True)), II)


def test_group_n_and_count():
    assert [group_n(c) for c in range(10)] == [0, 8, 16, 32, 48, 64, 80, 96, 112, 128]
    # BundleGroupMaxColumns points of the mode-table test.
    assert [group_count(n, 8) for n in (3, 8, 9, 127, 128)] == [1, 1, 2, 16, 16]
    assert [group_count(n, 128) for n in (127, 128, 129)] == [1, 1, 2]


def test_parameter_routing():
    # block-exec-b-fpatr-operand-routing-001: LReLU alone uses RegSrc0;
    # a scalar quant mode with LReLU uses RegSrc0 then RegSrc1.
    assert scalar_param_slots(Fpatr(pre_quant_mode=0, relu_mode=2)) == ("alpha",)
    assert scalar_param_slots(Fpatr(pre_quant_mode=3, relu_mode=2)) == ("quant", "alpha")
    assert scalar_param_slots(Fpatr(pre_quant_mode=2, relu_mode=3)) == ()
    assert vector_param_sources(Fpatr(pre_quant_mode=2, relu_mode=3)) == ("quant", "alpha")
    assert vector_param_sources(Fpatr(pre_quant_mode=3, relu_mode=3)) == ("alpha",)
    for code, row in MODE_TABLE.items():
        for relu in range(4):
            f = Fpatr(pre_quant_mode=code, relu_mode=relu)
            assert needs_scalar_param(f) == (row[3] == "scalar" or relu == 2)
            assert needs_vector_param(f) == (row[3] == "vector" or relu == 3)


# --- parameter words --------------------------------------------------------------

def test_fp19_values():
    assert fp19_value(0x1FC00) == 1.0                       # FP19 of FP32 1.0
    assert fp19_value(fp19(0x3F400000)) == 0.75
    assert fp19_value(0x400) == 2.0 ** -126                 # smallest normal
    assert fp19_value(0x1) == 2.0 ** -136                   # subnormal carrier value
    assert fp19_value(0x7FBFF) == -(2 - 2 ** -10) * 2.0 ** 127
    assert fp19_value([0, 0x1FC00]).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError):
        fp19_value(0x3FC00)                                  # +inf carrier


def test_asl_param_legality_points():
    # tile-bound-matrix-params-002, -vquant-001, -vprelu-001.
    check_quant_word(2, 0x400 << 13)
    fault(lambda: check_quant_word(2, 1 << 13))              # subnormal scale
    check_alpha_word(0x400)
    check_alpha_word(0)
    fault(lambda: check_alpha_word(1))                       # subnormal alpha
    fault(lambda: check_alpha_word(0x80000))                 # bit 19
    check_quant_word(2, (0x400 << 13) | (1 << 37))           # scale + S9 offset 1
    fault(lambda: check_quant_word(2, (0x400 << 13) | (1 << 37) | 1))
    check_alpha_word(0x0001FC00)                              # FP19 1.0


def test_asl_parameter_fields():
    # arch-exec-matrix-quantization-001: FP19 1.0 with S9 offset 0x1FF reads back
    # as scale 1.0 and offset -1; shift code 15 sits in bits[35:32] (shift 16).
    word = qword(ONE, 0x1FF, 9)
    assert (word >> 13) & 0x7FFFF == 0x1FC00
    assert quant_scale(word) == 1.0 and quant_offset(3, word) == -1
    assert quant_offset(17, qword(ONE, -16, 5)) == -16 and quant_offset(19, qword(ONE, 65535, 17)) == 65535
    assert quant_offset(27, qword(ONE)) == 0
    assert quant_shift(shift_word(15)) == 16 and quant_shift(0) == 1


def test_asl_rowmax_input_shape():
    # tile-bound-matrix-rowmax-001: RowMaxIn must be M x 1 (here M = 2).
    f = Fpatr(row_max_en=True, row_max_init=True)
    p = np.zeros((2, 1), dtype=np.uint32)
    assert postprocess(p, T.FP32, f, 0, 0, rowmax_in=[0, 0]).rowmax.tolist() == [0, 0]
    fault(lambda: postprocess(p, T.FP32, f, 0, 0, rowmax_in=[0]))


def test_quant_word_reserved_bits_every_mode():
    for code, row in MODE_TABLE.items():
        if row[3] == "none":
            fault(lambda: check_quant_word(code, qword(ONE)))
            continue
        base = shift_word(0) if row[5] == "shift" else qword(ONE)
        check_quant_word(code, base)
        width = row[4]
        for bit in range(64):
            word = base ^ (1 << bit)
            if row[5] == "shift":
                legal = 32 <= bit <= 35
            elif 13 <= bit <= 31:                            # inside the FP19 scale
                legal = 0 < ((word >> 23) & 0xFF) < 255 and not (word >> 31) & 1
            else:
                legal = width and 37 <= bit < 37 + width
            if legal:
                check_quant_word(code, word)
            else:
                fault(lambda: check_quant_word(code, word))


def test_scale_and_alpha_classes():
    for bad in (0, fp19(0xBF800000) << 13, 0x3FC00 << 13, 0x3FE00 << 13, 5 << 13):
        fault(lambda: check_quant_word(3, bad))              # zero, negative, inf, NaN, subnormal
    for bad in (fp19(0xBF800000), 0x3FC00, 0x3FE00, 5, 0x40000):
        fault(lambda: check_alpha_word(bad))                 # negative, inf, NaN, subnormal, -0
    with pytest.raises(ValueError):
        check_alpha_word(1 << 64)


# --- the spec's own ASL execution points -----------------------------------------------

def test_asl_all_modes_unit():
    # block-exec-b-fpatr-all-modes-007: a unit input through every mode, flags 0.
    cases = {0: (ONE, 0x3F800000), 1: (ONE, 0x3C00), 2: (1, 1), 3: (1, 1), 4: (1, 0x3C00),
             5: (1, 0x3C00), 12: (2, 1), 13: (2, 1), 16: (ONE, 0x3F80), 17: (1, 1), 18: (1, 1),
             19: (1, 1), 20: (1, 1), 23: (ONE, 1), 24: (ONE, 1), 25: (ONE, 0x08), 26: (ONE, 0x38),
             27: (ONE, 0x3F800000), 28: (ONE, 0x08), 32: (ONE, 0x3C00), 33: (ONE, 0x3C00),
             34: (ONE, 0x3F80), 35: (1, 0x3F80), 36: (ONE, 0x3F80), 37: (ONE, 0x38),
             38: (ONE, 0x3F800000), 39: (1, 0x3F80)}
    assert sorted(cases) == sorted(MODE_TABLE)
    for code, (source, expected) in cases.items():
        row = MODE_TABLE[code]
        acc = row[1] or T.FP32
        word = shift_word(0) if row[5] == "shift" else qword(ONE, 0, row[4])
        kw = {}
        if row[3] == "scalar":
            kw["quant_scalar"] = word
        elif row[3] == "vector":
            kw["quant_vector"] = [word]
        assert run1(source, acc, code, **kw) == (expected, 0), code


def test_asl_formats():
    # block-exec-b-fpatr-formats-003: FP32 1.5 through the cast modes.
    x = 0x3FC00000
    assert run1(x, T.FP32, 1) == (0x3E00, 0)
    assert run1(x, T.FP32, 16) == (0x3FC0, 0)
    assert run1(x, T.FP32, 26, quant_scalar=qword(ONE)) == (0x3C, 0)
    assert run1(x, T.FP32, 25, quant_scalar=qword(ONE)) == (0x0C, 0)
    assert run1(x, T.FP32, 27, quant_scalar=qword(HALF)) == (0x3F400000, 0)


def test_asl_quant():
    # block-exec-b-fpatr-quant-002: REQ8 and the scalar shift mode.
    assert run1(3, T.S32, 3, quant_scalar=qword(TWO, -1, 9)) == (5, 0)
    assert run1(70, T.S32, 3, quant_scalar=qword(TWO, 0, 9)) == (0x8C, OF | NX)
    assert run1(70, T.S32, 3, sat=1, quant_scalar=qword(TWO, 0, 9)) == (127, OF | NX)
    assert run1(0xFFFFFFDF, T.S32, 13, quant_scalar=shift_word(0)) == (0xFFEF, 0)
    # Sat must be 0 in a shift mode (R8); the ASL's Sat=1 run gives the same S16 clamp.
    assert run1(0x7FFFFFFF, T.S32, 13, quant_scalar=shift_word(0)) == (0x7FFF, OF | NX)


def test_asl_intermediate_saturation():
    # block-exec-b-fpatr-rounding-008: the S9/S5/S17 clamp happens with Sat 0,
    # then +1 overflows the destination and wraps to 0.
    assert run1(300, T.S32, 3, quant_scalar=qword(ONE, 1, 9)) == (0, OF | NX)
    assert run1(20, T.S32, 17, quant_scalar=qword(ONE, 1, 5)) == (0, OF | NX)
    assert run1(70000, T.S32, 19, quant_scalar=qword(ONE, 1, 17)) == (0, OF | NX)
    assert run1(0x7FFFFFFF, T.S32, 13, quant_scalar=shift_word(0)) == (0x7FFF, OF | NX)


def test_asl_intermediate_helpers():
    # arch-exec-matrix-intermediate-002: MatrixRoundAndSaturateSigned / MatrixShiftS32ToS16.
    cases = [(15.0, 5, RMode.RNE, 15, 0), (15.5, 5, RMode.RNE, 15, OF | NX),
             (-16.5, 5, RMode.RNA, -16, OF | NX), (255.75, 9, RMode.RNE, 255, OF | NX),
             (-256.75, 9, RMode.RNE, -256, OF | NX), (65535.4, 17, RMode.RTZ, 65535, NX)]
    for value, width, mode, want, flags in cases:
        got, f = intermediate_round_clamp([value], width, mode)
        assert (got.tolist(), f.tolist()) == ([want], [flags])
    ties = {RMode.RNE: (0, 0), RMode.RNA: (1, -1), RMode.RTP: (1, 0), RMode.RTM: (0, -1),
            RMode.RTZ: (0, 0)}
    for mode, (pos, neg) in ties.items():
        assert intermediate_round_clamp([0.5, -0.5], 9, mode)[0].tolist() == [pos, neg]
    raw, flags = shift_s32_to_s16([-33, 0x7FFFFFFF], 1)
    assert raw.tolist() == [0xFFEF, 0x7FFF] and flags.tolist() == [0, OF | NX]


def test_asl_special_values():
    # block-exec-b-fpatr-special-005.
    q1 = qword(ONE, 0, 9)
    for x in (0x7FC00000, 0x7F800000, 0xFF800000):
        assert run1(x, T.FP32, 24, quant_scalar=q1) == (0x80, NV)
    assert run1(0x7FC00000, T.FP32, 24, sat=1, quant_scalar=q1) == (0, NV)
    assert run1(0x7F800000, T.FP32, 24, sat=1, quant_scalar=q1) == (127, OF | NX)
    assert run1(0x7FC00000, T.FP32, 26, quant_scalar=qword(ONE)) == (0x7F, 0)
    assert run1(0x7FC00000, T.FP32, 32, sat=1, quant_scalar=qword(ONE)) == (0, 0)
    assert run1(0x7F800001, T.FP32, 32, sat=1, quant_scalar=qword(ONE)) == (0, NV)
    assert run1(0x7F800000, T.FP32, 32, sat=1, quant_scalar=qword(ONE)) == (0x7BFF, OF | NX)
    assert run1(0x7FC00000, T.FP32, 32, quant_scalar=qword(ONE)) == (0x7E00, 0)
    assert run1(0x7FC00000, T.FP32, 25, quant_scalar=qword(ONE)) == (0x80, 0)


def test_asl_zero_affine():
    # block-exec-b-fpatr-zero-affine-009: signed FP32 zeros with S9 offsets.
    assert run1(0x00000000, T.FP32, 24, quant_scalar=qword(ONE, 5, 9)) == (5, 0)
    assert run1(0x80000000, T.FP32, 24, quant_scalar=qword(ONE, 5, 9)) == (5, 0)
    assert run1(0x00000000, T.FP32, 24, quant_scalar=qword(ONE, -5, 9)) == (0xFB, 0)
    assert run1(0x80000000, T.FP32, 24, quant_scalar=qword(ONE, 0, 9)) == (0, 0)


def test_asl_activation():
    # block-exec-b-fpatr-activation-004 and arch-exec-matrix-postprocess-001.
    q1 = qword(ONE, 0, 9)
    assert run1(0xC0000000, T.FP32, 24, relu=1, quant_scalar=q1) == (0, 0)
    alpha = fp19(HALF)
    assert run1(0xC0800000, T.FP32, 24, relu=2, quant_scalar=q1, alpha_scalar=alpha) == (0xFE, 0)
    assert run1(0xC0800000, T.FP32, 24, relu=3, quant_scalar=q1, alpha_vector=[alpha]) == (0xFE, 0)


def test_asl_single_rounding_pipeline():
    # arch-exec-matrix-postprocess-pipeline-002: alpha 0.75 on 0xBF000BB0 to FP16,
    # one rounding of the exact product (no double rounding).
    got = run1(0xBF000BB0, T.FP32, 32, relu=2, quant_scalar=qword(ONE),
               alpha_scalar=fp19(0x3F400000))
    assert got == (0xB601, NX)


def test_asl_commit_two_elements():
    # block-exec-b-fpatr-commit-006: FP32 [1.5, 70.0], mode 24, scale 2.0.
    d, flags = run([[0x3FC00000, 0x428C0000]], T.FP32, 24, quant_scalar=qword(TWO, 0, 9))
    assert d == [[3, 0x8C]] and flags == OF | NX


def test_asl_fixed_rounding_ignores_rmode():
    # block-fault-b-fpatr-controls-010: the ASL profile forces RNE/RHB in fixed
    # modes even when handed RTP or RNA.  R8 rejects those requests up front, so
    # the same results are checked through effective_rounding with RMode NONE.
    fault(lambda: run1(0x3F801000, T.FP32, 32, rmode=RMode.RTP, quant_scalar=qword(ONE)))
    assert effective_rounding(32, RMode.RTP) is RMode.RNE
    assert run1(0x3F801000, T.FP32, 32, quant_scalar=qword(ONE)) == (0x3C00, NX)
    assert effective_rounding(26, RMode.RNA) is RMode.RNE
    assert run1(0x3F880000, T.FP32, 26, quant_scalar=qword(ONE)) == (0x38, NX)
    assert run1(0x3F880000, T.FP32, 25, quant_scalar=qword(ONE)) == (0x09, NX)


def test_asl_reduction_points():
    # arch-exec-matrix-postprocess-001: max(3, 7) and |INT_MIN| with OF.
    assert row_max([[3, 7]], T.S32) == (np.array([7], dtype=np.uint32), 0)
    best, flags = row_max([[0x80000000, 0x80000000]], T.S32, max_abs=True)
    assert best.tolist() == [0x7FFFFFFF] and flags == OF
    # tile-exec-postprocess-aux-001: U32 1..9, RowMaxIn 10, GroupN 8.
    f = Fpatr(group_n_code=1, row_max_en=True, group_max_en=True, row_max_init=True)
    r = postprocess(np.arange(1, 10, dtype=np.uint32)[None, :], T.U32, f, 0, 0, rowmax_in=[10])
    assert r.d[0, 8] == 9 and r.rowmax.tolist() == [10] and r.groupmax.tolist() == [[8, 9]]
    # tile-exec-postprocess-group-large-004: one partial group.
    f = Fpatr(group_n_code=1, group_max_en=True)
    r = postprocess(np.array([[2, 5, 4]], dtype=np.uint32), T.U32, f, 0, 0)
    assert r.d[0, 2] == 4 and r.groupmax.tolist() == [[5]] and r.rowmax is None
    # tile-exec-postprocess-maxabs-single-002: S32 -3 with MaxAbs.
    f = Fpatr(group_n_code=1, row_max_en=True, group_max_en=True, max_abs_en=True)
    r = postprocess(np.array([[0xFFFFFFFD]], dtype=np.uint32), T.S32, f, 0, 0)
    assert r.rowmax.tolist() == [3] and r.groupmax.tolist() == [[3]] and r.flags == 0


# --- hardware numeric vectors (matrix_postprocess, signed_zero, reduction) -----------

def test_hw_matrix_postprocess_vectors():
    assert run1(3, T.S32, 3, quant_scalar=qword(TWO, -1, 9)) == (0x05, 0)       # req8-scalar-affine
    assert run1(70, T.S32, 3, quant_scalar=qword(TWO, 0, 9)) == (0x8C, OF | NX)  # req8-wrap
    assert run1(70, T.S32, 3, sat=1, quant_scalar=qword(TWO, 0, 9)) == (0x7F, OF | NX)
    assert run1(0x3FC00000, T.FP32, 26, quant_scalar=qword(ONE)) == (0x3C, 0)    # f32-e4m3-exact
    assert run1(0x3FC00000, T.FP32, 25, quant_scalar=qword(ONE)) == (0x0C, 0)    # f32-hif8-exact
    assert run1(0xC0800000, T.FP32, 24, relu=2, quant_scalar=qword(ONE, 0, 9),   # post-conversion-lrelu
                alpha_scalar=fp19(HALF)) == (0xFE, 0)
    assert run1(0x7FC00000, T.FP32, 24, quant_scalar=qword(ONE, 0, 9)) == (0x80, NV)   # nan-indefinite
    assert run1(0x7FC00000, T.FP32, 24, sat=1, quant_scalar=qword(ONE, 0, 9)) == (0x00, NV)


def test_hw_signed_zero_and_max_vectors():
    # -0 x 2 keeps its sign; MAX(+0, -0) and MAX(-0, +0) give +0.
    assert run1(0x80000000, T.FP32, 27, quant_scalar=qword(TWO)) == (0x80000000, 0)
    assert row_max([[0x00000000, 0x80000000]], T.FP32)[0].tolist() == [0]
    assert row_max([[0x80000000, 0x00000000]], T.FP32)[0].tolist() == [0]
    assert row_max([[0x80000000, 0x80000000]], T.FP32)[0].tolist() == [0x80000000]


# --- focused behaviours -------------------------------------------------------------

def test_negative_zero_rules():
    q = qword(ONE)
    assert run1(0x80000000, T.FP32, 32, quant_scalar=q) == (0x8000, 0)
    assert run1(0x80000000, T.FP32, 26, quant_scalar=q) == (0x80, 0)
    assert run1(0x80000000, T.FP32, 25, quant_scalar=q) == (0x00, 0)             # HiF8: one zero
    assert run1(0x80000000, T.FP32, 32, relu=1, quant_scalar=q) == (0x0000, 0)   # -0 is negative
    assert run1(0x80000000, T.FP32, 0, relu=2, alpha_scalar=0x1FC00) == (0x80000000, 0)
    assert run1(0x80000000, T.FP32, 0, relu=2, alpha_scalar=0) == (0, 0)


def test_negative_infinity_with_zero_multiplier_is_zero():
    q = qword(ONE)
    assert run1(0xFF800000, T.FP32, 32, relu=1, quant_scalar=q) == (0x0000, 0)
    assert run1(0xFF800000, T.FP32, 32, relu=2, quant_scalar=q, alpha_scalar=0) == (0, 0)
    assert run1(0xFF800000, T.FP32, 32, relu=2, quant_scalar=q, alpha_scalar=0x1FC00) == (0xFC00, 0)
    assert run1(0x7F800000, T.FP32, 32, relu=1, quant_scalar=q) == (0x7C00, 0)
    assert run1(0xFF800000, T.FP32, 26, quant_scalar=q) == (0x7F, OF | NX)


def test_alpha_replaces_scale():
    # -3 with scale 4 and alpha 0.5: the negative path uses alpha alone (-1.5 -> -2 RNE).
    got = run1(0xFFFFFFFD, T.S32, 3, relu=2, quant_scalar=qword(0x40800000, 0, 9),
               alpha_scalar=fp19(HALF))
    assert got == (0xFE, NX)
    assert run1(3, T.S32, 3, relu=2, quant_scalar=qword(0x40800000, 0, 9),
                alpha_scalar=fp19(HALF)) == (12, 0)


def test_shift_modes_ignore_relu():
    for relu, kw in ((1, {}), (2, {"alpha_scalar": 0}), (3, {"alpha_vector": [0, 0]})):
        d, flags = run([[0xFFFFFFC0, 0xFFFFFFC0]], T.S32, 12, relu,
                       quant_vector=[shift_word(0), shift_word(15)], **kw)
        assert d == [[0xFFE0, 0xFFFF]] and flags == 0


def test_mode0_activation_on_integer_accumulators():
    # S32 with LReLU alpha 0.5: -3 -> -1.5 -> RNE -2, NX; U32 is never negative.
    d, flags = run([[0xFFFFFFFD, 5]], T.S32, 0, 2, alpha_scalar=fp19(HALF))
    assert d == [[0xFFFFFFFE, 5]] and flags == NX
    d, flags = run([[0xFFFFFFFD, 5]], T.U32, 0, 1)
    assert d == [[0xFFFFFFFD, 5]] and flags == 0


def test_mode0_without_relu_is_a_bit_copy():
    p = [[0x7FA00001, 0xFFFFFFFF, 0x80000000]]           # sNaN payload survives
    d, flags = run(p, T.FP32, 0)
    assert d == p and flags == 0


# --- operand and legality errors ---------------------------------------------------------

def test_missing_scalar_is_rejected_r8():
    e = fault(lambda: run1(3, T.S32, 3))
    assert "R8" in e.reason
    fault(lambda: run1(3, T.S32, 0, relu=2))


def test_omitted_ior_reads_zero_in_asl_mode():
    # ASL: the omitted B.IOR reads the zero GPR: scale 0, offset 0, shift 1, alpha 0.
    assert run1(100, T.S32, 3, omitted_ior_reads_zero=True) == (0, 0)
    assert run1(0x40000000, T.FP32, 27, omitted_ior_reads_zero=True) == (0, 0)
    assert run1(0xFFFFFFFD, T.S32, 13, omitted_ior_reads_zero=True) == (0xFFFE, 0)
    assert run1(0xC0000000, T.FP32, 0, relu=2, omitted_ior_reads_zero=True) == (0, 0)


def test_operand_errors():
    q = qword(ONE, 0, 9)
    fault(lambda: run1(3, T.S32, 3, quant_scalar=0))                       # explicit zero scale
    fault(lambda: run1(3, T.S32, 3, quant_scalar=q | 1))                   # reserved bit
    fault(lambda: run1(3, T.S32, 3, quant_scalar=q, alpha_scalar=0))       # unused alpha
    fault(lambda: run1(3, T.S32, 0, quant_scalar=q))                       # unused quant word
    fault(lambda: run1(3, T.S32, 2))                                       # missing vector
    fault(lambda: run([[1, 2]], T.S32, 2, quant_vector=[q]))               # wrong length
    fault(lambda: run([[1, 2]], T.S32, 2, quant_vector=[q, 0]))            # illegal column
    fault(lambda: run1(3, T.S32, 3, quant_scalar=q, quant_vector=[q]))     # unused vector
    fault(lambda: run1(3, T.S32, 0, relu=3, alpha_vector=[1]))             # subnormal alpha
    fault(lambda: run1(3, T.FP32, 3, quant_scalar=q))                      # mode vs accumulator
    fault(lambda: run1(3, T.U32, 24, quant_scalar=q))
    fault(lambda: run1(3, T.S32, 0, rmode=1))                              # R8 B.DATR rule
    fault(lambda: run1(3, T.S32, 13, sat=1, quant_scalar=0))
    f = Fpatr(row_max_en=True, row_max_init=True)
    fault(lambda: postprocess(np.ones((2, 2), np.uint32), T.U32, f, 0, 0))              # no RowMaxIn
    fault(lambda: postprocess(np.ones((2, 2), np.uint32), T.U32, f, 0, 0, rowmax_in=[1]))
    fault(lambda: postprocess(np.ones((2, 2), np.uint32), T.U32, Fpatr(), 0, 0, rowmax_in=[1, 1]))
    fault(lambda: postprocess(np.ones((1, 1), np.uint32), T.U32, Fpatr(pre_quant_mode=7), 0, 0), II)
    with pytest.raises(TypeError):
        postprocess(np.ones((1, 1)), T.U32, Fpatr(), 0, 0)
    with pytest.raises(ValueError):
        postprocess(np.ones(3, np.uint32), T.U32, Fpatr(), 0, 0)
    with pytest.raises(ValueError):
        postprocess(np.ones((1, 1), np.uint32), T.S8, Fpatr(), 0, 0)


# --- slow per-element reference (digest §5.6) -------------------------------------------

CANONICAL = {T.FP32: 0x7FC00000, T.FP16: 0x7E00, T.BF16: 0x7FC0, T.E4M3: 0x7F, T.HiF8: 0x80}
INFINITY = {T.FP32: (0x7F800000, 0xFF800000), T.FP16: (0x7C00, 0xFC00),
            T.BF16: (0x7F80, 0xFF80), T.HiF8: (0x6F, 0xEF), T.E4M3: (0x7F, 0x7F)}
MAX_FINITE = {T.FP32: (0x7F7FFFFF, 0xFF7FFFFF), T.FP16: (0x7BFF, 0xFBFF),
              T.BF16: (0x7F7F, 0xFF7F), T.HiF8: (0x6E, 0xEE), T.E4M3: (0x7E, 0xFE)}
NEG_ZERO = {T.FP32: 0x80000000, T.FP16: 0x8000, T.BF16: 0x8000, T.E4M3: 0x80, T.HiF8: 0x00}


def ref_fp19(bits: int) -> Q:
    sign, exp, frac = bits >> 18 & 1, bits >> 10 & 0xFF, bits & 0x3FF
    mag = Q(frac, 1024) * Q(2) ** -126 if exp == 0 else (1 + Q(frac, 1024)) * Q(2) ** (exp - 127)
    return -mag if sign else mag


def ref_special(kind: str, d: T, sat: int) -> tuple[int, int]:
    """Digest §5.8 special-value table, as written."""
    if d not in FLOAT_D:
        bits = d.bits
        int_min, int_max = 1 << bits - 1, (1 << bits - 1) - 1
        if kind in ("qnan", "snan"):
            return (0 if sat else int_min), NV
        if sat:
            return (int_max if kind == "+inf" else int_min), OF | NX
        return int_min, NV
    if kind in ("qnan", "snan"):
        return (0 if sat else CANONICAL[d]), (NV if kind == "snan" else 0)
    neg = kind == "-inf"
    if sat:
        return MAX_FINITE[d][neg], OF | NX
    return INFINITY[d][neg], (OF | NX if d is T.E4M3 else 0)


def ref_post(p: int, acc: T, code: int, relu: int, qw: int, aw: int, rmode: int, sat: int):
    """One D element: the stage order of digest §5.6, step by step."""
    name, source, d, param, width, rounding = MODE_TABLE[code]
    if code == 0 and relu == 0:
        return p, 0
    if rounding == "shift":
        v = (p - (1 << 32) if p >> 31 else p) >> (((qw >> 32) & 0xF) + 1)
        if not -32768 <= v <= 32767:
            return (0x7FFF if v > 0 else 0x8000), OF | NX
        return v & 0xFFFF, 0
    src = acc if source is None else source
    d = acc if d is None else d
    mode = RMode[rounding] if rounding in ("RNE", "RHB") else resolve_rmode(rmode)
    kind = None
    if src is T.FP32:
        sign, exp, frac = p >> 31, p >> 23 & 0xFF, p & 0x7FFFFF
        if exp == 255:
            kind = ("snan", "qnan")[frac >> 22] if frac else ("-inf" if sign else "+inf")
            value = Q(0)
        else:
            value = Q(frac | (1 << 23 if exp else 0)) * Q(2) ** (max(exp, 1) - 150)
            value = -value if sign else value
        negative = bool(sign) and kind not in ("snan", "qnan")
        neg_zero = sign and exp == 0 and frac == 0
    else:
        value = Q(p - (1 << 32) if src is T.S32 and p >> 31 else p)
        negative, neg_zero = value < 0, False
    scale = ref_fp19(qw >> 13 & 0x7FFFF) if param != "none" else Q(1)
    if not negative or relu == 0:
        mult = scale
    else:
        mult = Q(0) if relu == 1 else ref_fp19(aw & 0x7FFFF)
    if kind and not (kind == "-inf" and mult == 0):
        return ref_special(kind, d, sat)
    activated = value * mult
    off = 0
    if width:
        off = qw >> 37 & ((1 << width) - 1)
        off = off - (1 << width) if off >> (width - 1) else off
    if neg_zero and mult != 0 and off == 0 and d in FLOAT_D:
        return NEG_ZERO[d], 0
    if width:
        t = ref_round(activated, mode)
        lo, hi = -(1 << width - 1), (1 << width - 1) - 1
        f1 = OF | NX if not lo <= t <= hi else (NX if t != activated else 0)
        raw, f2 = ref_int(Q(min(max(t, lo), hi) + off), d, mode, bool(sat))
        return raw, f1 | f2
    return ref_encode(activated, d, mode, bool(sat))


# --- random inputs ---------------------------------------------------------------------

def rand_fp32(rng, n):
    """FP32 bit patterns: mostly moderate magnitudes, plus extremes, specials, zeros, ties."""
    kind = rng.integers(0, 10, n)
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    frac = rng.integers(0, 1 << 23, n).astype(np.uint32)
    exp = np.where(kind < 5, rng.integers(100, 155, n), rng.integers(0, 255, n)).astype(np.uint32)
    bits = sign | exp << 23 | frac
    half_ints = np.float32(rng.integers(-300, 300, n) + 0.5).view(np.uint32)
    specials = rng.choice(np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFA00000,
                                    0x7F800000, 0xFF800000, 0, 0x80000000, 1, 0x80000001],
                                   dtype=np.uint32), n)
    return np.where(kind == 8, half_ints, np.where(kind == 9, specials, bits)).astype(np.uint32)


def rand_s32(rng, n):
    kind = rng.integers(0, 5, n)
    vals = np.where(kind == 0, rng.integers(-300, 301, n),
                    np.where(kind == 1, rng.integers(-(1 << 20), 1 << 20, n),
                             np.where(kind == 2, rng.choice([-(1 << 31), (1 << 31) - 1, 0, -1], n),
                                      rng.integers(-(1 << 31), 1 << 31, n))))
    return (vals & 0xFFFFFFFF).astype(np.uint32)


def rand_scale_word(rng, width):
    exp = int(rng.integers(117, 138)) if rng.random() < 0.85 else int(rng.integers(1, 255))
    bits19 = exp << 10 | int(rng.integers(0, 1024)) if rng.random() < 0.7 else exp << 10
    off = int(rng.integers(-(1 << width - 1), 1 << width - 1)) if width else 0
    return bits19 << 13 | ((off & ((1 << width) - 1)) << 37 if width else 0)


def rand_alpha_word(rng):
    if rng.random() < 0.2:
        return 0
    return int(rng.integers(121, 129)) << 10 | int(rng.integers(0, 1024))


def check_mode_against_reference(rng, code, relu, rmode, sat, shape=(4, 8), acc=None):
    name, source, d, param, width, rounding = MODE_TABLE[code]
    acc = acc or source
    m, n = shape
    p = {T.FP32: rand_fp32, T.S32: rand_s32,
         T.U32: lambda r, k: r.integers(0, 1 << 32, k, dtype=np.uint64).astype(np.uint32)}[acc](
        rng, m * n).reshape(shape)
    make = (lambda: int(rng.integers(0, 16)) << 32) if rounding == "shift" else \
        (lambda: rand_scale_word(rng, width))
    kw, words, alphas = {}, [0] * n, [0] * n
    if param == "scalar":
        kw["quant_scalar"] = words[0] = make()
        words = [words[0]] * n
    elif param == "vector":
        words = [make() for _ in range(n)]
        kw["quant_vector"] = np.array(words, dtype=np.uint64)
    if relu == 2:
        kw["alpha_scalar"] = alphas[0] = rand_alpha_word(rng)
        alphas = [alphas[0]] * n
    elif relu == 3:
        alphas = [rand_alpha_word(rng) for _ in range(n)]
        kw["alpha_vector"] = np.array(alphas, dtype=np.uint64)
    r = postprocess(p, acc, Fpatr(pre_quant_mode=code, relu_mode=relu), rmode, sat, **kw)
    flags = 0
    for i in range(m):
        for j in range(n):
            want, f = ref_post(int(p[i, j]), acc, code, relu, words[j], alphas[j], rmode, sat)
            flags |= f
            assert int(r.d[i, j]) == want, (code, relu, rmode, sat, hex(int(p[i, j])), hex(words[j]))
    assert r.flags == flags


def allowed_controls(code):
    m = PREQUANT_MODES[code]
    return (range(8) if m.rmode_free else [0]), ((0, 1) if m.sat_free else (0,))


@pytest.mark.parametrize("code", sorted(MODE_TABLE))
def test_every_mode_every_relu_vs_reference(code):
    rng = np.random.default_rng(1000 + code)
    rmodes, sats = allowed_controls(code)
    for relu in range(4):
        rmode = int(rng.choice(list(rmodes)))
        sat = int(rng.choice(list(sats)))
        accs = [T.FP32, T.S32, T.U32] if code == 0 else [None]
        for acc in accs:
            check_mode_against_reference(rng, code, relu, rmode, sat, acc=acc)


@pytest.mark.parametrize("code", [3, 5, 19, 24, 27, 35, 38])
def test_programmable_modes_every_rmode_and_sat(code):
    rng = np.random.default_rng(2000 + code)
    for rmode in range(8):
        for sat in (0, 1):
            check_mode_against_reference(rng, code, int(rng.integers(0, 4)), rmode, sat, (2, 6))


@pytest.mark.slow
@pytest.mark.parametrize("code", sorted(MODE_TABLE))
def test_every_mode_full_sweep(code):
    rng = np.random.default_rng(3000 + code)
    rmodes, sats = allowed_controls(code)
    accs = [T.FP32, T.S32, T.U32] if code == 0 else [None]
    for relu in range(4):
        for rmode in rmodes:
            for sat in sats:
                for acc in accs:
                    check_mode_against_reference(rng, code, relu, rmode, sat, (8, 16), acc)


# --- RowMax / GroupMax against a literal fold -----------------------------------------

def ref_abs(v: int, acc: T) -> tuple[int, int]:
    if acc is T.U32:
        return v, 0
    if acc is T.S32:
        if v == 0x80000000:
            return 0x7FFFFFFF, OF
        return (-(v - (1 << 32)) if v >> 31 else v), 0
    return v & 0x7FFFFFFF, 0


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def ref_max(left: int, right: int, acc: T, max_abs: bool) -> tuple[int, int]:
    """One ASL reduction step: MAX(left, right), |.| on both operands when MaxAbsEn."""
    flags = 0
    if max_abs:
        (left, fl), (right, fr) = ref_abs(left, acc), ref_abs(right, acc)
        flags = fl | fr
    if acc is T.U32:
        return (left if left >= right else right), flags
    if acc is T.S32:
        s = lambda v: v - (1 << 32) if v >> 31 else v
        return (left if s(left) >= s(right) else right), flags
    a, b = f32(left), f32(right)
    snan = any(v & 0x7F800000 == 0x7F800000 and v & 0x7FFFFF and not v & 0x400000
               for v in (left, right))
    flags |= NV if snan else 0
    if a != a and b != b:
        return 0x7FC00000, flags
    if a != a:
        return right, flags
    if b != b:
        return left, flags
    if a == 0 and b == 0:
        return (left if left == right == 0x80000000 else 0), flags
    return (left if a >= b else right), flags


def ref_fold(values, acc, max_abs, seed=None):
    v, flags = values[0], 0
    if max_abs:
        v, flags = ref_max(v, v, acc, True)
    for x in values[1:]:
        v, f = ref_max(v, x, acc, max_abs)
        flags |= f
    if seed is not None:
        v, f = ref_max(seed, v, acc, max_abs)
        flags |= f
    return v, flags


def rand_reduction_input(rng, acc, shape):
    n = shape[0] * shape[1]
    if acc is T.FP32:
        pool = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFA00000, 0x7F800000,
                         0xFF800000, 0, 0x80000000, 0x3F800000, 0xBF800000], dtype=np.uint32)
        vals = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rand_fp32(rng, n))
    elif acc is T.S32:
        vals = np.where(rng.random(n) < 0.2, np.uint32(0x80000000), rand_s32(rng, n))
    else:
        vals = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    return vals.astype(np.uint32).reshape(shape)


@pytest.mark.parametrize("acc", [T.FP32, T.S32, T.U32])
def test_row_and_group_max_vs_literal_fold(acc):
    rng = np.random.default_rng(7 + int(acc))
    for trial in range(60):
        m, n = int(rng.integers(1, 5)), int(rng.integers(1, 21))
        p = rand_reduction_input(rng, acc, (m, n))
        if trial % 3 == 0:          # rows made only of NaNs, to reach the all-NaN rules
            p[0, :] = rng.choice(np.array([0x7FC00000, 0x7F800001, 0xFFC12345], np.uint32), n)
        max_abs = bool(trial % 2)
        seed = rand_reduction_input(rng, acc, (1, m))[0] if trial % 4 < 2 else None
        gcode = int(rng.integers(1, 10)) if trial % 5 else 1
        gn = group_n(gcode)
        f = Fpatr(group_n_code=gcode, row_max_en=True, group_max_en=True,
                  row_max_init=seed is not None, max_abs_en=max_abs)
        r = postprocess(p, acc, f, 0, 0, rowmax_in=seed)
        flags = 0
        for i in range(m):
            row = [int(v) for v in p[i]]
            want, fl = ref_fold(row, acc, max_abs, None if seed is None else int(seed[i]))
            assert int(r.rowmax[i]) == want, (acc.name, trial, i)
            flags |= fl
            for g in range(group_count(n, gn)):
                want, fl = ref_fold(row[g * gn:(g + 1) * gn], acc, max_abs)
                assert int(r.groupmax[i, g]) == want, (acc.name, trial, i, g)
                flags |= fl
        assert r.flags == flags
        # A single-column group/row without MaxAbs takes no step and keeps raw bits.
        best, fl = group_max(p[:, :1], acc, 8, False)
        assert best[:, 0].tolist() == p[:, 0].tolist() and fl == 0
