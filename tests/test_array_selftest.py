"""The array self-test (build/array_selftest.py) in Amaranth simulation.

The iCEBreaker's self-test: the preset's SystolicArray behind the host port's four streams,
driven by the unit's SelfTest and HostCommandPlayer with integer products whose drain rows the
golden model predicts. Its bitstream is built in tests/test_build.py.
"""

import numpy as np
import pytest
from amaranth.hdl import Shape

from ptocube.build.array_selftest import (RSP_WIDTH, ArrayHarness, array_jobs, array_program,
                                          array_selftest)
from ptocube.build.host_player import Step, StepKind
from ptocube.build.selftest import SelfTest, message_text, port_shapes
from ptocube.hdl.config import CubeConfig, preset
from ptocube.hdl.numeric_types import NumericConfig
from ptocube.hdl.systolic import SystolicArray, drain_layout, fill_layout
from ptocube.model.datatype import DataType, NumClass
from ptocube.sim.bench_systolic import Schedule

from test_selftest import run_selftest

TINY = preset("ice40-tiny")


def _described(design):
    """``design``, used only for its parameters and signature: no "never used" warning."""
    design._MustUse__silence = True
    return design


def _tiny_array():
    return _described(SystolicArray(TINY))


def _run(config, steps=None, uart_cycles=0):
    """Simulate the array self-test of ``config`` (``steps``: another program) to its verdict."""
    clocks = {"clk_hz": 4e6, "baud": 1e6, "repeat_cycles": 50}
    dut = (array_selftest(config, **clocks) if steps is None
           else SelfTest(ArrayHarness(config), steps, **clocks))
    return run_selftest(dut, max_cycles=5000, uart_cycles=uart_cycles)


@pytest.mark.parametrize("name", ["ice40-tiny", "ecp5-int8", "ecp5-full"])
def test_array_selftest_passes(name):
    # ice40-tiny: the iCEBreaker's design; ecp5-int8: 8 x 8 with the product register;
    # ecp5-full: three interleaved slots (null first beats, slot tags).
    config = preset(name)
    r = _run(config, uart_cycles=2000 if name == "ice40-tiny" else 0)
    assert r["passed"] and not r["failed"] and not r["busy"]
    assert r["step"] == len(array_program(config))          # the END step
    if name == "ice40-tiny":
        assert r["text"] == message_text(True)
        # No step waits for the array long: a step costs four cycles of the player, a
        # command six, three more when it is checked (decision F36).
        assert r["cycles"] < 7 * len(array_program(config))


def _corrupt(steps, index, *, bits=0, expect=0):
    s = steps[index]
    steps[index] = Step(s.kind, s.bits ^ bits, None if s.expect is None else s.expect ^ expect)


def _job_steps(steps, job_index):
    """Step indexes of the first fill row, first beat and first drain row of the first
    group of ``job_index`` among :func:`array_jobs` (groups and exchanges from 0 here)."""
    array = _tiny_array()
    schedule = Schedule(array, array_jobs(TINY))
    group = next(g for g, members in enumerate(schedule.groups)
                 if members and members[0][0] == job_index)
    per = array.exchange_rows
    of = {kind: [k for k, s in enumerate(steps) if s.kind is kind] for kind in StepKind}
    # Group g's initial values come with exchange g, its results leave with exchange g + 2,
    # the g-th exchange that drains.
    return (of[StepKind.COMMAND][group * per],
            of[StepKind.PARCEL][sum(schedule.group_beats[:group])],
            of[StepKind.STATUS][group * per])


@pytest.mark.parametrize("what", ["drain", "fill", "beat"])
def test_corruption_is_reported_at_its_step(what):
    steps = array_program(TINY)
    jobs = array_jobs(TINY)
    if what == "drain":
        # One bit of an expected result word (row 1 of the first block): that step fails.
        _, _, drain_at = _job_steps(steps, 0)
        want = drain_at + 1
        _corrupt(steps, want, expect=1 << 7)
    elif what == "fill":
        # One bit of an ACC job's first initial value (element [0, 0]): its result row fails.
        acc = next(k for k, job in enumerate(jobs) if job.acc0 is not None)
        fill_at, _, want = _job_steps(steps, acc)
        _corrupt(steps, fill_at, bits=1 << 3)
    else:
        # A[0, 1] of the S16 job (-32768) becomes -32767 in its beat (bit 0 is a[0]'s): row
        # 0 of the results fails, so the array multiplies what the player sends.
        wrap = next(k for k, job in enumerate(jobs) if job.a_type is DataType.S16
                    and job.b_type is DataType.S16)
        _, beat_at, want = _job_steps(steps, wrap)
        _corrupt(steps, beat_at + 1, bits=1)
    r = _run(TINY, steps, uart_cycles=2000)
    assert r["failed"] and not r["passed"]
    assert r["step"] == want and steps[want].kind is StepKind.STATUS
    assert r["text"] == message_text(False, want)


def test_program_shape():
    steps = array_program(TINY)
    jobs = array_jobs(TINY)
    rows, cols = TINY.rows, TINY.cols
    kinds = [s.kind for s in steps]
    # The ROM stays within one 256-deep row of iCE40 block RAMs (F15), END included.
    assert len(steps) + 1 <= 256
    # Every drain row of every group is checked, and every fill row acknowledged in order.
    blocks = sum(-(-job.shape[0] // rows) * -(-job.shape[1] // cols) for job in jobs)
    assert kinds.count(StepKind.STATUS) == blocks * rows
    commands = [s for s in steps if s.kind is StepKind.COMMAND]
    assert len(commands) == (blocks + 2) * rows
    assert [s.expect for s in commands] == [k % (1 << RSP_WIDTH) for k in range(len(commands))]
    assert kinds.count(StepKind.PARCEL) == sum(
        -(-job.shape[0] // rows) * -(-job.shape[1] // cols) * job.shape[2] for job in jobs) + 1
    # The jobs: more than one output block each way, several K terms, a K loop longer than
    # the swap window and exchange (the exchange runs while beats flow), ACC jobs, every
    # built integer type on each side, pairs within a class.
    slots = _tiny_array().slots
    assert any(job.shape[0] > rows and job.shape[1] > cols and job.shape[2] > 1 for job in jobs)
    assert any(job.shape[2] * slots > slots + rows + cols + rows * slots for job in jobs)
    assert sum(job.acc0 is not None for job in jobs) >= 2
    ints = NumericConfig.from_cube_config(TINY).int_types
    assert {job.a_type for job in jobs} == {job.b_type for job in jobs} == ints
    assert all(job.a_type.num_class is job.b_type.num_class for job in jobs)


def test_values_reach_extremes_and_wrap():
    # The exact sums leave the 32-bit range: S16 products of 2^30 wrap to 0, the ACC jobs'
    # sums cross 2^31 (signed) and 2^32 (unsigned); the model's result is the wrapped one.
    from ptocube.model.numeric import decode
    wrapped = set()
    for job in array_jobs(TINY):
        a = decode(job.a_type, job.a).astype(object)
        b = decode(job.b_type, job.b).astype(object)
        exact = a.dot(b)
        if job.acc0 is not None:
            acc = job.acc0.astype(np.int64).astype(object)
            if job.a_type.num_class is NumClass.SIGNED:
                acc = np.where(acc >= 1 << 31, acc - (1 << 32), acc)
            exact = exact + acc
        assert np.array_equal(np.vectorize(lambda v: v % (1 << 32))(exact).astype(np.uint32),
                              job.reference())
        signed = job.a_type.num_class is NumClass.SIGNED
        lo, hi = (-(1 << 31), (1 << 31) - 1) if signed else (0, (1 << 32) - 1)
        if ((exact < lo) | (exact > hi)).any():
            wrapped.add((job.a_type, job.acc0 is not None))
    assert (DataType.S16, False) in wrapped
    assert (DataType.S8, True) in wrapped and (DataType.U16, True) in wrapped


def test_harness_has_the_host_port():
    # The player drives the harness unchanged: the four streams, array payloads on three.
    harness = _described(ArrayHarness(TINY))
    _described(harness.array)
    shapes = port_shapes(harness)
    assert shapes["host_cmd"] == fill_layout(TINY.cols)
    assert shapes["status"] == drain_layout(TINY.rows, TINY.cols, 1)
    assert shapes["parcels"] == _tiny_array().feed.payload.shape()
    assert Shape.cast(shapes["host_rsp"]).width == RSP_WIDTH


def test_float_only_build_is_refused():
    with pytest.raises(ValueError, match="no integer types"):
        array_program(CubeConfig(int_types=False, mx_types=False))
