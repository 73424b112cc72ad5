"""The Machine end to end: publication, atomicity, PE masks, and random differential runs.

The differential tests generate whole bundles (every one of the twelve Matrix
operations, every type-pair class, Local and Shared operands, transposes,
partial PE masks with different data on every PE, bias, accumulators,
RowMax/GroupMax, ReLU) with a fixed seed, run them on the Machine and compare
every published tile with the independent reference of ``model_helpers``.
"""

import random

import numpy as np
import pytest

from ptocube.model.bundle import Operation as Op
from ptocube.model.datatype import MX_MATRIX_TYPES, MX_SCALED_TYPES, DataType, NumClass
from ptocube.model.faults import FaultClass
from ptocube.model.layout import Layout, cube_geometry
from ptocube.model.machine import Machine, Outcome
from ptocube.model.state import SharedTile, StatusFlag, pes_of_mask

from model_helpers import (dt, make_state, matrix_bundle, ref_accumulate, ref_postprocess,
                           run_bundle, sel, tile, value_tile)

MASKS = ("1000", "0100", "0010", "0001", "1100", "1110", "1111")


def _fp16_state(**kw):
    return make_state({"M#1": value_tile("FP16", "CUBE_M16", [[1.5, 2.0]]),
                       "N#1": value_tile("FP16", "CUBE_N8", [[2.0], [0.25]])}, **kw)


# ---------------------------------------------------------------------------
# Publication and atomicity
# ---------------------------------------------------------------------------

def test_success_publishes_d_with_its_descriptor():
    result, machine = run_bundle(_fp16_state(), matrix_bundle(
        Op.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"], destinations=[("N", 2)]))
    assert result.outcome == Outcome.SUCCESS and result.ok
    assert [p.pe for p in result.published] == [0, 1, 2, 3]
    d = result.published[0]
    assert (d.hand, d.n, d.name) == ("N", 2, "N#2")      # N#1 holds B, so D takes N#2
    assert (d.tile.dtype, d.tile.layout, d.tile.shape, d.tile.capacity) == \
        (DataType.FP32, Layout.CUBE_M16, (1, 1), 256)
    assert d.tile.raw().tolist() == [[0x40600000]]       # 1.5 * 2 + 2 * 0.25 = 3.5
    assert d.tile.contents_defined
    assert machine.state.tile(3, sel("N#2")) is not None


def test_strict_noop_with_zero_mask_reads_nothing():
    # Bogus sources, no B.FPATR, no tiles at all: a zero-mask bundle is still a no-op.
    state = make_state(flags=StatusFlag.OF)
    before = state.snapshot()
    result, machine = run_bundle(state, "BSTART.TMATMUL FP16\n"
                                 "B.IOT N#15, N#16, mask=0000, last, ->T<10>\nBSTOP\n")
    assert result.outcome == Outcome.NOOP and result.published == ()
    assert machine.state.same_as(before)


def _acc_m32_state():
    """ACC, M = 32: C FP32 CUBE_M32 32x16 (2 KiB), A FP16 32x1, B FP16 1x16."""
    return make_state({"T#5": value_tile("FP32", "CUBE_M32", np.ones((32, 16))),
                       "M#1": value_tile("FP16", "CUBE_M32", np.full((32, 1), 2.0)),
                       "N#1": value_tile("FP16", "CUBE_N8", np.full((1, 16), 0.5))},
                      flags=StatusFlag.NV)


def _acc_m32_bundle(group_size_code):
    return matrix_bundle(Op.TMATMUL_ACC, "FP16", dims=(32, 16, 1), fpatr=(0, 0, 1, 1, 1),
                         sources=["T#5", "M#1", "N#1"],
                         destinations=[("U", 5), ("U", 2), ("U", group_size_code)])


def test_late_allocation_fault_publishes_nothing():
    # Every legality check passes; only GroupMaxOut (32 x 2 FP32) does not fit 128 B.
    state = _acc_m32_state()
    before = state.snapshot()
    machine = Machine(state)
    failed, done = machine.run(_acc_m32_bundle(1) + _acc_m32_bundle(2))
    assert failed.fault is FaultClass.TILE_ALLOCATION and failed.published == ()
    # The failed attempt reserved nothing: the retry gets U#1..U#3 and the status
    # gains nothing but what the successful bundle raised.
    assert [p.name for p in done.published[:3]] == ["U#1", "U#2", "U#3"]
    assert done.published[0].tile.raw().view(np.float32)[0, 0] == 2.0
    assert machine.state.flags == StatusFlag.NV
    for pe in range(4):
        assert machine.state.tile(pe, sel("T#5")).raw().tolist() == \
            before.tile(pe, sel("T#5")).raw().tolist()


def test_destinations_of_one_group_take_distinct_registers():
    state = make_state({"M#1": value_tile("U8", "CUBE_M16", [[2] * 9]),
                        "N#1": value_tile("U8", "CUBE_N8", [[3]] * 9)})
    machine = Machine(state)
    capacity = state.capacity_in_use()
    first, second = machine.run(
        matrix_bundle(Op.TMATMUL, "U8", dims=(1, 1, 9), fpatr=(0, 0, 0, 1),
                      sources=["M#1", "N#1"], destinations=[("T", 1), ("T", 1)])
        + matrix_bundle(Op.TMATMUL, "U8", dims=(1, 1, 9), sources=["M#1", "N#1"]))
    assert [p.name for p in first.published[:2]] == ["T#1", "T#2"]
    assert first.published[1].tile.raw().tolist() == [[54]]         # RowMax of [54]
    assert second.published[0].name == "T#3"
    assert machine.state.capacity_in_use() == capacity + 4 * 3 * 128


def test_an_index_held_by_some_pes_is_not_free_for_the_others():
    machine = Machine(_fp16_state(flags=StatusFlag.UF))
    partial, full = machine.run(
        matrix_bundle(Op.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"], mask="1100")
        + matrix_bundle(Op.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"]))
    assert [(p.pe, p.name) for p in partial.published] == [(0, "T#1"), (1, "T#1")]
    assert [p.name for p in full.published] == ["T#2"] * 4
    assert machine.state.tile(2, sel("T#1")) is None
    assert machine.state.flags == StatusFlag.UF


def test_a_faulting_bundle_is_skipped_and_the_next_one_runs():
    machine = Machine(_fp16_state())
    bad, good = machine.run(
        matrix_bundle(Op.TMATMUL, "FP16", dims=(1, 1, 3), sources=["M#1", "N#1"])
        + matrix_bundle(Op.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"]))
    assert bad.outcome == Outcome.FAULT and bad.fault is FaultClass.TILE_LEGALITY
    assert bad.fault_index == 6 and bad.operation is Op.TMATMUL
    assert good.outcome == Outcome.SUCCESS and good.published[0].name == "T#1"
    assert [r.number for r in machine.results] == [0, 1]


# ---------------------------------------------------------------------------
# Stream-level faults around the commit (audit findings 1-3)
# ---------------------------------------------------------------------------

_FPATR = "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\n"


def _tmatmul(a="M#1", fpatr=True):
    """An FP16 TMATMUL bundle without its boundary (A = ``a``, B = N#1, D -> T)."""
    return ("BSTART.TMATMUL FP16\n" + (_FPATR if fpatr else "")
            + f"B.IOT {a}, N#1, mask=1111, last, ->T<1>\n")


def _fp16_1x1_state(**local):
    return make_state({"M#1": tile("FP16", "CUBE_M16", [[0x4000]]),
                       "N#1": tile("FP16", "CUBE_N8", [[0x4200]]), **local})


def _summary(results):
    return [(r.outcome, r.fault_index, r.operation, [(p.pe, p.name) for p in r.published])
            for r in results]


@pytest.mark.parametrize("start", ["BSTART.STD IND", "BSTART.FP IND", "C.BSTART.STD IND",
                                   "C.BSTART.FP IND", "BSTART.ICALL 0, ->ra"])
def test_indirect_start_faults_before_committing_the_open_bundle(start):
    state = _fp16_1x1_state()
    before = state.snapshot()
    machine = Machine(state)
    results = machine.run(_tmatmul() + start + "\nBSTOP\n")
    assert _summary(results) == [(Outcome.FAULT, 3, None, [])]
    assert results[0].fault is FaultClass.BUNDLE_CONTROL
    assert machine.state.same_as(before)


def test_catr_trap_is_rejected_and_publishes_nothing():
    state = _fp16_1x1_state()
    before = state.snapshot()
    machine = Machine(state)
    results = machine.run("BSTART.TMATMUL FP16\nB.CATR {trap}\n" + _FPATR +
                          "B.IOT M#1, N#1, mask=1111, last, ->T<1>\nBSTOP\n")
    assert [(r.fault, r.fault_index) for r in results] == [(FaultClass.ILLEGAL_INSTRUCTION, 1)]
    assert "implementation limit" in results[0].reason
    assert machine.state.same_as(before)


_AFTER_START = {
    "matrix": _tmatmul() + "BSTOP\n" + _tmatmul() + "BSTOP\n",
    "timg2col": "BSTART.SFU TIMG2COL, FP16\nB.DIM zero, 1, ->LB0\n"
                "B.IOT M#1, mask=1111, last, ->M<1>\nBSTOP\n" + _tmatmul() + "BSTOP\n",
    "unsupported": "BSTART.STD FALL\nBSTOP\n" + _tmatmul() + "BSTOP\n",
    "stop": "BSTOP\n" + _tmatmul() + "BSTOP\n",
}


@pytest.mark.parametrize("rest", sorted(_AFTER_START))
def test_a_commit_failing_in_the_preflight_stops_the_next_start(rest):
    # The audit's reproducer: A = M#5 does not exist, so the commit that the next
    # start (or stop) triggers fails in the preflight.  That start opens nothing,
    # exactly as if the decoder had found the fault (the same bundle without
    # B.FPATR, one instruction shorter).
    program = _tmatmul("M#5") + _AFTER_START[rest]
    results = Machine(_fp16_1x1_state()).run(program)
    assert (results[0].fault, results[0].fault_index) == (FaultClass.TILE_LEGALITY, 3)
    detected = Machine(_fp16_1x1_state()).run(_tmatmul("M#5", fpatr=False) + _AFTER_START[rest])
    assert (detected[0].fault, detected[0].fault_index) == (FaultClass.BUNDLE_CONTROL, 2)
    assert _summary(results[1:]) == [(o, i + 1 if i is not None else None, op, pub)
                                     for o, i, op, pub in _summary(detected[1:])]
    # Only the last bundle runs, and it gets T#1: nothing before it published.
    assert [r.outcome for r in results[1:]] == [Outcome.SUCCESS]
    assert [p.name for p in results[1].published] == ["T#1"] * 4
    assert [r.number for r in results] == [0, 1]


def test_an_allocation_failure_at_a_start_also_stops_it():
    # Hand T is full: the first bundle fails allocation at the start that ends it.
    full = {f"T#{n}": tile("FP32", "CUBE_M16", [[0]]) for n in range(1, 17)}
    program = _tmatmul() + _tmatmul() + "BSTOP\n" + _tmatmul().replace("->T", "->U") + "BSTOP\n"
    results = Machine(_fp16_1x1_state(**full)).run(program)
    assert [(r.outcome, r.fault, r.fault_index) for r in results] == [
        (Outcome.FAULT, FaultClass.TILE_ALLOCATION, 3),
        (Outcome.SUCCESS, FaultClass.NONE, None)]
    assert results[1].record.bundle.start_index == 7


def test_acc_leaves_c_unchanged_and_d_is_new():
    c = value_tile("FP32", "CUBE_M16", [[10.0, 20.0]])
    state = make_state({"U#2": c, "M#1": value_tile("FP32", "CUBE_M16", [[1.0, 2.0]]),
                        "N#1": value_tile("FP32", "CUBE_N8", [[5, 6], [7, 8]])})
    result, machine = run_bundle(state, matrix_bundle(
        Op.TMATMUL_ACC, "FP32", dims=(1, 2, 2), sources=["U#2", "M#1", "N#1"],
        destinations=[("U", 1)]))          # C = U#2 (selector 17) with D -> U (hand 1): legal
    assert result.published[0].name == "U#1"
    after = machine.state.tile(0, sel("U#2"))
    assert after is c and after.raw().tolist() == c.raw().tolist()
    assert [np.float32(v).item() for v in result.published[0].tile.raw().view(np.float32)[0]] \
        == [29.0, 42.0]


def test_partial_mask_runs_each_pe_on_its_own_tiles():
    local = {}
    for pe in range(4):
        local[(pe, "M#1")] = tile("S8", "CUBE_M16", [[pe + 1, 1]])
        local[(pe, "N#1")] = tile("S8", "CUBE_N8", [[10], [pe]])
    state = make_state(local)
    result, machine = run_bundle(state, matrix_bundle(Op.TMATMUL, "S8", dims=(1, 1, 2),
                                                      sources=["M#1", "N#1"], mask="1110"))
    assert {p.pe: p.tile.raw()[0, 0] for p in result.published} == {0: 10, 1: 21, 2: 32}
    assert machine.state.tile(3, sel("T#1")) is None


def test_a_pe_outside_the_mask_is_not_checked():
    # PE3 has no operands at all; mask 1100 never looks at it.
    local = {(pe, name): t for pe in (0, 1) for name, t in
             (("M#1", tile("U8", "CUBE_M16", [[2]])), ("N#1", tile("U8", "CUBE_N8", [[3]])))}
    result, _ = run_bundle(make_state(local), matrix_bundle(Op.TMATMUL, "U8", mask="1100",
                                                            sources=["M#1", "N#1"]))
    assert result.outcome == Outcome.SUCCESS
    result, _ = run_bundle(make_state(local), matrix_bundle(Op.TMATMUL, "U8", mask="1110",
                                                            sources=["M#1", "N#1"]))
    assert result.fault is FaultClass.TILE_LEGALITY and "PE2" in result.reason


def test_unknown_arithmetic_is_rejected():
    with pytest.raises(ValueError, match="pto-v0"):
        Machine(arithmetic="exact")


def test_assembled_words_and_text_give_the_same_results():
    from ptocube.model.asm import assemble
    text = matrix_bundle(Op.TMATMUL, "FP16", dims=(1, 1, 2), sources=["M#1", "N#1"])
    by_text = Machine(_fp16_state()).run(text)[0]
    by_words = Machine(_fp16_state()).run([(i.word, i.length) for i in assemble(text)])[0]
    assert by_text.published[0].tile.raw().tolist() == by_words.published[0].tile.raw().tolist()


# ---------------------------------------------------------------------------
# Random differential runs
# ---------------------------------------------------------------------------

ORDINARY = {NumClass.FLOAT: ("FP32", "TF32", "HF32", "FP16", "BF16", "HiF8", "E4M3", "E5M2",
                             "E3M2", "E2M3", "E2M1X2", "E1M2X2"),
            NumClass.SIGNED: ("S16", "S8", "S4X2"),
            NumClass.UNSIGNED: ("U16", "U8", "U4X2")}
SCALED = sorted(t.name for t in MX_SCALED_TYPES)
UNSCALED = sorted(t.name for t in MX_MATRIX_TYPES - MX_SCALED_TYPES)


def _random_raw(rng: random.Random, dtype: DataType, shape) -> np.ndarray:
    """Random bit patterns; wide floats mostly near 1.0 so that rounding is exercised."""
    out = np.zeros(shape, dtype=np.uint64)
    for index in np.ndindex(*shape):
        if dtype.bits == 32 and dtype.num_class is NumClass.FLOAT and rng.random() < 0.9:
            value = rng.getrandbits(23) | rng.randrange(118, 137) << 23 | rng.getrandbits(1) << 31
        elif dtype.bits == 32:
            value = rng.getrandbits(32)
        else:
            value = rng.getrandbits(dtype.bits)
        out[index] = value
    return out


def _pow2(rng, top):
    return 1 << rng.randrange(top.bit_length())


def _size_code(need: int) -> int:
    code = 1
    while 128 << (code - 1) < need:
        code += 1
    return code


def random_case(rng: random.Random, op: Op, a_name: str, b_name: str, *, big=False):
    """A random bundle of ``op`` with AType/BType, its state, and the expected outputs."""
    a_type, b_type = dt(a_name), dt(b_name)
    acc = DataType.FP32 if op.is_mx else {NumClass.FLOAT: DataType.FP32,
                                          NumClass.SIGNED: DataType.S32,
                                          NumClass.UNSIGNED: DataType.U32}[a_type.num_class]
    a_scaled = op.is_mx and a_type in MX_SCALED_TYPES
    b_scaled = op.is_mx and b_type in MX_SCALED_TYPES
    sharing = "none" if op.is_gemv else rng.choice(["none", "none", "right", "both"])
    limit_m, limit_n, limit_k = (32, 24, 96) if big else (12, 8, 40 if op.is_mx else 20)
    if sharing == "none":
        m = 1 if op.is_gemv else rng.randrange(1, limit_m + 1)
        n, k = rng.randrange(1, limit_n + 1), rng.randrange(1, limit_k + 1)
    else:
        m, n, k = _pow2(rng, 32), _pow2(rng, limit_n), _pow2(rng, 64)
    nb = -(-k // 32)
    mask = rng.choice(MASKS)
    pes = pes_of_mask(int(mask, 2))
    trans_a = sharing == "both" and rng.random() < 0.5
    trans_b = sharing != "none" and rng.random() < 0.5
    relu = rng.choice([0, 1])
    row_max, group_code = rng.random() < 0.4, rng.choice([0, 0, 1, 2])
    groups = -(-n // (0, 8, 16)[group_code]) if group_code else 1
    if groups & (groups - 1):
        group_code = 0          # GroupMaxOut needs a power-of-two column count
    rowmax_init = row_max and rng.random() < 0.5
    fpatr = (0, relu, group_code, int(row_max), int(bool(group_code)), int(rowmax_init), 0,
             int(trans_a), int(trans_b))
    layout = "CUBE_M16" if m <= 16 and rng.random() < 0.6 else "CUBE_M32"

    state = make_state()
    shared_ids = []
    def put_shared(raw, dtype, transpose):
        sid = len(shared_ids) + 10
        stored = raw.T if transpose else raw
        state.shared[sid] = SharedTile(tile(dtype, "ROW_MAJOR", stored, shared=True))
        shared_ids.append(sid)
    a_common = _random_raw(rng, a_type, (m, k))
    sa_common = np.array([[rng.randrange(110, 145) for _ in range(nb)] for _ in range(m)])
    b_common = _random_raw(rng, b_type, (k, n))
    sb_common = np.array([[rng.randrange(110, 145) for _ in range(n)] for _ in range(nb)])
    if sharing == "both":
        put_shared(a_common, a_type, trans_a)
        if a_scaled:
            put_shared(sa_common, "E8M0", False)
    if sharing != "none":
        put_shared(b_common, b_type, trans_b)
        if b_scaled:
            put_shared(sb_common, "E8M0", False)

    d_need = cube_geometry(Layout[layout], acc, m, n).required_bytes
    d_code = _size_code(d_need)
    sources, names = [], iter(f"{h}#{i}" for h in "TUMN" for i in range(16, 0, -1))
    per_pe = {pe: {} for pe in pes}
    def scales(rows, cols):
        return np.array([[rng.randrange(110, 145) for _ in range(cols)] for _ in range(rows)])

    def local(role, make_raw, dtype, tile_layout, tsize=None):
        """Bind the next Local source: a fresh random tile on every selected PE."""
        name = next(names)
        sources.append(name)
        for pe in pes:
            raw = make_raw()
            per_pe[pe][role] = raw
            state.set_tile(pe, sel(name), tile(dtype, tile_layout, raw, tsize))

    if op.uses_acc:
        local("c", lambda: _random_raw(rng, acc, (m, n)), acc, layout, 128 << (d_code - 1))
    if sharing in ("none", "right"):
        local("a", lambda: _random_raw(rng, a_type, (m, k)), a_type, layout)
        if a_scaled:
            local("a_scale", lambda: scales(m, nb), "E8M0", "ROW_MAJOR")
    if sharing == "none":
        local("b", lambda: _random_raw(rng, b_type, (k, n)), b_type, "CUBE_N8")
        if b_scaled:
            local("b_scale", lambda: scales(nb, n), "E8M0", "ROW_MAJOR")
    if op.uses_bias:
        local("bias", lambda: _random_raw(rng, acc, (1, n)), acc, "ROW_MAJOR")
    if rowmax_init:
        # Finite seeds (no signalling NaN), so no flag is expected.
        local("rowmax_in", lambda: np.array(
            [[rng.getrandbits(23) | 127 << 23 if acc is DataType.FP32 else rng.getrandbits(32)]
             for _ in range(m)], dtype=np.uint64), acc, "ROW_MAJOR")
    group_n = (0, 8, 16)[group_code]
    destinations = [("T", d_code)]
    if row_max:
        destinations.append(("U", _size_code(m * 4)))
    if group_code:
        destinations.append(("U", _size_code(m * groups * 4)))
    program = matrix_bundle(op, a_type, b_type=b_type, dims=(m, n, k), fpatr=fpatr,
                            sources=sources, destinations=destinations, shared=shared_ids,
                            mask=mask)
    expected = {}
    for pe in pes:
        raw = per_pe[pe]
        p = ref_accumulate(a_type, b_type, raw.get("a", a_common), raw.get("b", b_common),
                           c_raw=raw.get("c"),
                           bias_raw=None if "bias" not in raw else raw["bias"][0],
                           a_scale=raw.get("a_scale", sa_common) if a_scaled else None,
                           b_scale=raw.get("b_scale", sb_common) if b_scaled else None)
        d, rowmax, groupmax = ref_postprocess(
            p, acc, relu=relu, row_max=row_max, group_n=group_n,
            rowmax_in=None if "rowmax_in" not in raw else raw["rowmax_in"][:, 0])
        expected[pe] = [x for x in (d, rowmax, groupmax) if x is not None]
    return state, program, expected


def _differential(seed, op, a_name, b_name, big=False):
    rng = random.Random(seed)
    state, program, expected = random_case(rng, op, a_name, b_name, big=big)
    result, _ = run_bundle(state, program)
    assert result.outcome == Outcome.SUCCESS, (result.fault, result.reason, program)
    got = {}
    for p in result.published:
        got.setdefault(p.pe, []).append(p.tile.raw())
    assert sorted(got) == sorted(expected)
    for pe in expected:
        for mine, ref in zip(got[pe], expected[pe]):
            assert np.array_equal(mine.astype(np.uint64), ref.astype(np.uint64)), (pe, program)
    assert result.flags == 0


def _class_pairs(op: Op):
    if op.is_mx:
        return [("scaled x scaled", SCALED, SCALED), ("scaled x unscaled", SCALED, UNSCALED),
                ("unscaled x scaled", UNSCALED, SCALED),
                ("unscaled x unscaled", UNSCALED, UNSCALED)]
    return [(cls.value, ORDINARY[cls], ORDINARY[cls]) for cls in NumClass]


DIFFERENTIAL = [(op, name, lefts, rights) for op in Op if op.is_matrix
                for name, lefts, rights in _class_pairs(op)]


@pytest.mark.parametrize("index", range(len(DIFFERENTIAL)),
                         ids=[f"{op.name}-{name}" for op, name, *_ in DIFFERENTIAL])
def test_random_bundles_match_the_reference(index):
    op, _, lefts, rights = DIFFERENTIAL[index]
    rng = random.Random(1000 + index)
    _differential(rng.getrandbits(32), op, rng.choice(lefts), rng.choice(rights))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_random_bundles_match_the_reference_sweep(seed):
    rng = random.Random(seed)
    for op, _, lefts, rights in DIFFERENTIAL:
        _differential(rng.getrandbits(32), op, rng.choice(lefts), rng.choice(rights), big=True)


@pytest.mark.parametrize("seed", range(4))
def test_random_pto_v0_bundles_match_the_raw_carrier_reference(seed):
    rng = random.Random(seed)
    op = rng.choice([o for o in Op if o.is_matrix])
    a_name = rng.choice(SCALED + UNSCALED if op.is_mx else ORDINARY[NumClass.FLOAT])
    b_name = rng.choice(SCALED + UNSCALED if op.is_mx else ORDINARY[NumClass.FLOAT])
    m, n, k = (1 if op.is_gemv else 3), 4, 35
    a = _random_raw(rng, dt(a_name), (m, k))
    b = _random_raw(rng, dt(b_name), (k, n))
    sa = np.full((m, 2), 3) if dt(a_name) in MX_SCALED_TYPES and op.is_mx else None
    sb = np.full((2, n), 5) if dt(b_name) in MX_SCALED_TYPES and op.is_mx else None
    c = _random_raw(rng, DataType.FP32, (m, n))
    bias = _random_raw(rng, DataType.FP32, (1, n))
    local = {"M#1": tile(a_name, "CUBE_M16", a), "N#1": tile(b_name, "CUBE_N8", b),
             "T#9": tile("FP32", "CUBE_M16", c), "T#10": tile("FP32", "ROW_MAJOR", bias)}
    sources = ["M#1"] + (["T#11"] if sa is not None else []) + ["N#1"] + \
        (["T#12"] if sb is not None else [])
    if sa is not None:
        local["T#11"] = tile("E8M0", "ROW_MAJOR", sa)
    if sb is not None:
        local["T#12"] = tile("E8M0", "ROW_MAJOR", sb)
    if op.uses_acc:
        sources = ["T#9"] + sources
    if op.uses_bias:
        sources = sources + ["T#10"]
    result, _ = run_bundle(make_state(local), matrix_bundle(
        op, a_name, b_type=b_name, dims=(m, n, k), sources=sources, destinations=[("U", 2)]),
        arithmetic="pto-v0")
    expected = ref_accumulate(a_name, b_name, a, b, c_raw=c if op.uses_acc else None,
                              bias_raw=bias[0] if op.uses_bias else None, a_scale=sa,
                              b_scale=sb, arithmetic="pto-v0")
    assert np.array_equal(result.published[0].tile.raw(), expected)
