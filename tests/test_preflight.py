"""Fault vectors through the model: each must report the expected fault class at the expected
instruction and leave the state exactly as it was (nothing published, sources and status
untouched).  The vectors themselves are in ``fault_vectors.py``.
"""

import pytest

from ptocube.model.asm import assemble
from ptocube.model.bundle import Operation as Op
from ptocube.model.decode import decode_stream
from ptocube.model.machine import Machine
from ptocube.model.preflight import preflight

from fault_vectors import CASES, STOP, TA, TL, fp16_1x1, img2col_source
from model_helpers import img2col_bundle, make_state, matrix_bundle, tile


@pytest.mark.parametrize("case", sorted(CASES))
def test_fault_vector(case):
    state, program, fault, where = CASES[case]
    before = state.snapshot()
    machine = Machine(state)
    results = machine.run(program)
    assert len(results) == 1, [(r.outcome, r.reason) for r in results]
    result = results[0]
    assert (result.fault, result.outcome) == (fault, "fault"), result.reason
    expected_index = len(assemble(program)) - 1 if where == STOP else where
    assert result.fault_index == expected_index
    assert result.published == () and result.flags == 0
    assert machine.state.same_as(before)


def test_all_zero_timg2col_datr_makes_the_destination_fp64():
    # The audit's reproducers: an all-zero B.DATR passes the field check, so the
    # destination is allocated as FP64 (8 B per element) before operand legality.
    def run(valid_col, datr, local=None):
        program = img2col_bundle("U8", valid_col)
        if datr:
            program = program.replace("B.DIM", "B.DATR {NORM, FP64, Zero, EQ, Default, 0, 0}\n"
                                               "B.DIM", 1)
        state = make_state({"M#1": img2col_source(), **(local or {})})
        (result,) = Machine(state).run(program)
        return result

    assert run(1, datr=False).outcome == "success"
    zero = run(1, datr=True)
    assert (zero.fault, zero.fault_index) == (TL, 4) and "FP64" in zero.reason
    # 16 FP64 columns fill the 128 B destination exactly; 32 do not (32 U8 would).
    assert run(16, datr=True).fault is TL
    assert run(32, datr=False).fault is TL                 # the window, after allocation
    too_small = run(32, datr=True)
    assert too_small.fault is TA and "FP64" in too_small.reason
    # Allocation comes first: with hand M full the class is TileAllocation.
    full = {f"M#{n}": tile("U8", "ROW_MAJOR", [[n]]) for n in range(2, 17)}
    assert run(1, datr=True, local=full).fault is TA
    assert run(1, datr=False, local=full).fault is TA


def test_preflight_reports_the_first_failing_step():
    # A bundle breaking two rules reports the earlier one: the type pair (step 4a)
    # before the missing operand tiles (step 8), legality before allocation.
    state = make_state()
    program = matrix_bundle(Op.TMATMUL, "U8", b_type="S8", sources=["M#1", "N#1"],
                            destinations=[("T", 1)])
    result = Machine(state).run(program)[0]
    assert result.fault is TL and "mixes numeric classes" in result.reason
    state = fp16_1x1({f"T#{n}": tile("U8", "ROW_MAJOR", [[n]]) for n in range(1, 17)})
    program = matrix_bundle(Op.TMATMUL, "FP16", dims=(None, None, 2), sources=["M#1", "N#1"])
    assert Machine(state).run(program)[0].fault is TL      # K mismatch beats the full hand


def test_preflight_plans_without_changing_the_state():
    state = fp16_1x1()
    before = state.snapshot()
    record, = decode_stream(assemble(matrix_bundle(Op.TMATMUL, "FP16", sources=["M#1", "N#1"],
                                                   destinations=[("U", 2)])))
    plan = preflight(record.bundle, state)
    assert plan.pes == (0, 1, 2, 3) and (plan.m, plan.n, plan.k) == (1, 1, 1)
    assert plan.outputs[0][0].index == 16 and plan.outputs[0][0].capacity == 256
    assert state.same_as(before)
