"""SelfTest and its host-command player, in Amaranth simulation.

The player is checked against a small stand-in unit with the same host port
(``tests/selftest_units.py``: a GPR file that answers WRITE_GPR / READ_GPR and one status per
``last`` parcel beat), so its protocol handling is tested on its own; the self-test of the real
unit follows in ``test_selftest_cube_unit*``, and the golden program's Matrix bundles per
preset in ``test_matrix_bundles*``.
"""

import re

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from ptocube.build.host_player import HostCommandPlayer, Step, StepKind
from ptocube.build.selftest import (MATRIX_PE, SELFTEST_BUNDLES, STATUS_MASK, SelfTest,
                                    golden_program, matrix_scenario, message_text,
                                    port_shapes, selftest_scenario, unit_selftest)
from ptocube.hdl.config import PRESETS, CubeConfig, preset
from ptocube.hdl.host import HostOp, StatusLayout, StatusOutcome, decode_command, decode_status
from ptocube.hdl.numeric_types import NumericConfig
from ptocube.hdl.top import PARCELS_PER_BEAT, CubeUnit
from ptocube.model.bundle import Operation
from ptocube.model.datatype import DataType
from ptocube.model.machine import Machine, Outcome
from ptocube.model.scenario import parse_scenario
from ptocube.model.state import PE_COUNT, selector_name

from selftest_units import GprUnit, gpr_program


def run_selftest(dut, max_cycles=20_000, uart_cycles=0):
    """Run until the verdict; then ``uart_cycles`` more, decoding ``tx`` (one bit per
    ``dut.divisor`` cycles). Returns (passed, failed, cycles, failing step, text)."""
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    result = {}

    async def bench(ctx):
        cycles = 0
        while not (ctx.get(dut.passed) or ctx.get(dut.failed)):
            assert cycles < max_cycles, "the self-test never ended"
            assert ctx.get(dut.busy)
            await ctx.tick()
            cycles += 1
        result.update(passed=ctx.get(dut.passed), failed=ctx.get(dut.failed), cycles=cycles,
                      step=ctx.get(dut.player.step), busy=ctx.get(dut.busy))
        line = []
        bit_time = dut.divisor
        waited = 0
        while waited < uart_cycles:
            if ctx.get(dut.tx) == 0:              # start bit: sample the middle of each bit
                await ctx.tick().repeat(bit_time // 2 + bit_time)
                byte = 0
                for k in range(8):
                    byte |= ctx.get(dut.tx) << k
                    await ctx.tick().repeat(bit_time)
                assert ctx.get(dut.tx) == 1, "stop bit"
                line.append(byte)
                waited += 10 * bit_time
                if byte == ord("\n"):
                    break
            else:
                await ctx.tick()
                waited += 1
        result["text"] = bytes(line).decode("ascii")

    sim.add_testbench(bench)
    sim.run()
    return result


def test_player_passes_on_matching_unit():
    dut = SelfTest(GprUnit(), gpr_program(), clk_hz=4e6, baud=1e6, status_mask=STATUS_MASK,
                   repeat_cycles=50)
    r = run_selftest(dut, uart_cycles=2000)
    assert r["passed"] and not r["failed"] and not r["busy"]
    assert r["text"] == message_text(True)
    assert r["step"] == len(gpr_program())        # the END step


@pytest.mark.parametrize("corrupt", [0, 10, 13, 20])
def test_player_reports_the_corrupted_step(corrupt):
    steps = gpr_program(corrupt)
    assert steps[corrupt].checked
    dut = SelfTest(GprUnit(), steps, clk_hz=4e6, baud=1e6, status_mask=STATUS_MASK,
                   repeat_cycles=50)
    r = run_selftest(dut, uart_cycles=2000)
    assert r["failed"] and not r["passed"]
    assert r["step"] == corrupt
    assert r["text"] == message_text(False, corrupt)


def test_status_mask_ignores_cycles_but_not_outcome():
    steps = gpr_program()
    # Another cycle count passes under the mask; another outcome does not.
    other_cycles = StatusLayout.const({"cycles": 12345}).as_bits()
    fault = StatusLayout.const({"outcome": StatusOutcome.FAULT}).as_bits()
    index = next(k for k, s in enumerate(steps) if s.kind.name == "STATUS")
    good = steps[:index] + [Step.status(other_cycles)] + steps[index + 1:]
    bad = steps[:index] + [Step.status(fault)] + steps[index + 1:]
    for program, passes in ((good, True), (bad, False)):
        dut = SelfTest(GprUnit(), program, clk_hz=1e6, status_mask=STATUS_MASK)
        r = run_selftest(dut)
        assert bool(r["passed"]) == passes and r["step"] == (len(program) if passes else index)


def test_player_times_out_on_a_hung_unit():
    class Hung(GprUnit):
        def elaborate(self, platform):
            return Module()                       # never ready, never answers
    dut = SelfTest(Hung(), gpr_program(), clk_hz=1e6, timeout=40)
    r = run_selftest(dut, max_cycles=200)
    assert r["failed"] and r["step"] == 0


def test_player_rejects_bad_programs():
    shapes = port_shapes(GprUnit())
    with pytest.raises(ValueError, match="STATUS step"):
        HostCommandPlayer(shapes, [Step(Step.status(0).kind)])
    with pytest.raises(ValueError, match="wider"):
        HostCommandPlayer(shapes, [Step.parcel(1 << 96)])
    with pytest.raises(ValueError, match="no host_rsp"):
        HostCommandPlayer({"host_cmd": 96, "parcels": 35, "status": 99}, [])


def _model_results(config):
    """The self-test scenario of ``config`` on the golden model: (bundle results, state)."""
    parsed = parse_scenario(selftest_scenario(config))
    machine = Machine(parsed.state)
    return machine.run(parsed.program), machine.state


def _reads(steps, op):
    """The (space, index) of every ``op`` command of ``steps``."""
    return {(c.space, c.index) for c in (decode_command(s.bits) for s in steps
                                         if s.kind is StepKind.COMMAND) if c.op is op}


MATRIX_OPS = {Operation.TMATMUL_BIAS, Operation.TMATMUL_ACC, Operation.TMATMUL_MX}


def test_golden_program_shape():
    config = preset("ice40-tiny")
    steps = golden_program(config, per_beat=PARCELS_PER_BEAT)
    results, _ = _model_results(config)
    kinds = [s.kind for s in steps]
    assert kinds.count(StepKind.STATUS) == len(SELFTEST_BUNDLES) + len(results)
    assert kinds.count(StepKind.PARCEL) > 10
    statuses = [decode_status(s.expect) for s in steps if s.kind is StepKind.STATUS]
    # The default bundles' statuses are all different; the scenario's bundles all succeed.
    expects = [s.expect for s in steps if s.kind is StepKind.STATUS]
    assert len(set(expects[:len(SELFTEST_BUNDLES)])) == len(SELFTEST_BUNDLES)
    own = statuses[len(SELFTEST_BUNDLES):]
    assert all(s.outcome is StatusOutcome.SUCCESS for s in own)
    assert own[0].op == Operation.TIMG2COL and own[0].pe_mask == 0b1111
    assert [Operation(s.op) for s in own[1:]] == [Operation.TMATMUL_BIAS, Operation.TMATMUL_ACC]
    assert all(s.pe_mask == 1 << (PE_COUNT - 1 - MATRIX_PE) for s in own[1:])
    commands = [decode_command(s.bits) for s in steps if s.kind is StepKind.COMMAND]
    unchecked = [c for c, s in zip(commands, (s for s in steps if s.kind is StepKind.COMMAND))
                 if not s.checked]
    assert unchecked and all(c.op is HostOp.CONFIGURE for c in unchecked)
    # Every published register is read back: the TIMG2COL window on every PE, D, RowMaxOut
    # and the ACC's D on the Matrix PE.
    published = {(p.pe, p.index) for r in results for p in r.published}
    assert _reads(steps, HostOp.READ_WORD) == published
    assert len(published) == PE_COUNT + 3
    # The ROM stays within one 256-deep row of iCE40 block RAMs (docs/fpga.md, SelfTest).
    assert len(steps) + 1 <= 256


TYPE_SETS = {**PRESETS, "float-only": CubeConfig(int_types=False, mx_types=False),
             "float-no-mx": CubeConfig(mx_types=False)}


@pytest.mark.parametrize("name", TYPE_SETS)
def test_matrix_bundles_per_type_set(name):
    # One chain per type class the build has, every bundle succeeding on the model, and all
    # of the Matrix PE's registers within the build's tile memory.
    config = TYPE_SETS[name]
    program = matrix_scenario(config)["program"]
    types = set(re.findall(r"^BSTART\.\S+ (\w+)", "\n".join(program), re.M))
    built = NumericConfig.from_cube_config(config).input_types
    assert types and types <= {t.name for t in built}
    assert ("S8" in types) == config.int_types and ("FP16" in types) == config.float_types
    assert ("E4M3" in types) == config.mx_types
    results, state = _model_results(config)
    matrix = [r for r in results if r.operation in MATRIX_OPS]
    assert len(matrix) == 2 * config.int_types + 2 * config.float_types + config.mx_types
    assert all(r.outcome is Outcome.SUCCESS and r.published for r in matrix)
    # Each chain's ACC reads the BIAS bundle's D as C.
    acc = [r for r in matrix if r.operation is Operation.TMATMUL_ACC]
    bias = [r for r in matrix if r.operation is Operation.TMATMUL_BIAS]
    c_names = re.findall(r"^BSTART\.TMATMUL\.ACC .*?^B\.IOT (\S+),", "\n".join(program),
                         re.M | re.S)
    assert c_names == [selector_name(b.published[0].index) for b in bias] and len(acc) == len(bias)
    # A serial lane path is checked by a TMATMUL with a Shared B (the lane path's runs).
    lane = [r for r in results if r.operation is Operation.TMATMUL]
    assert len(lane) == (config.int_types and config.serial_lane_feed)
    assert all(r.outcome is Outcome.SUCCESS and r.published for r in lane)
    assert bool(re.search(r"^B\.IOS S0,", "\n".join(program), re.M)) == bool(lane)
    held = sum(t.capacity for t in state.pes[MATRIX_PE].tiles if t is not None)
    assert held <= config.tile_bytes_per_pe
    steps = golden_program(config, per_beat=PARCELS_PER_BEAT)
    assert sum(s.kind is StepKind.STATUS for s in steps) == len(SELFTEST_BUNDLES) + len(results)


def test_matrix_outputs_are_not_trivial():
    # The S8 chain's outputs exercise what the bundles claim: ReLU zeros some of D1, the
    # requantization saturates some of D2, and nothing is all one value.
    results, state = _model_results(preset("ice40-tiny"))
    d1, rowmax = (state.tile(p.pe, p.index) for p in results[1].published)
    d2 = state.tile(MATRIX_PE, results[2].published[0].index)
    assert (d1.dtype, rowmax.dtype, d2.dtype) == (DataType.S32, DataType.S32, DataType.S8)
    d1v = d1.raw().astype("int64")
    d2v = (d2.raw().astype("int64") + 128) % 256 - 128      # S8 bit patterns as values
    assert d1v.shape == d2v.shape == (3, 4)
    assert (d1v == 0).any() and (d1v > 0).any()
    assert (d2v == 127).any() and len(set(d2v.ravel().tolist())) > 3


def _unit_run(corrupt=None, config=preset("ice40-tiny"), max_cycles=4000):
    if corrupt is None:
        dut = unit_selftest(config, clk_hz=4e6, baud=1e6, repeat_cycles=50)
    else:
        # The same unit and program with one expected word flipped.
        program = golden_program(config, per_beat=PARCELS_PER_BEAT)
        s = program[corrupt]
        program[corrupt] = Step(s.kind, s.bits, s.expect ^ (1 << 3))
        dut = SelfTest(CubeUnit(config), program, clk_hz=4e6, baud=1e6,
                       status_mask=STATUS_MASK, repeat_cycles=50)
    return dut, run_selftest(dut, max_cycles=max_cycles, uart_cycles=1500)


def test_selftest_cube_unit_passes():
    dut, r = _unit_run()
    assert r["passed"] and not r["failed"], f"failed at step {r['step']}"
    assert r["step"] == len(dut.player.steps) - 1
    assert r["text"] == message_text(True)


def test_selftest_cube_unit_detects_a_corrupted_word():
    # A payload word of the TMATMUL.BIAS output D, read back after both Matrix bundles ran.
    config = preset("ice40-tiny")
    results, _ = _model_results(config)
    d1 = next(r for r in results if r.operation is Operation.TMATMUL_BIAS).published[0]
    steps = golden_program(config, per_beat=PARCELS_PER_BEAT)
    word_at = [k for k, s in enumerate(steps) if s.kind is StepKind.COMMAND
               and (c := decode_command(s.bits)).op is HostOp.READ_WORD
               and (c.space, c.index) == (d1.pe, d1.index)][-1]
    dut, r = _unit_run(corrupt=word_at)
    assert r["failed"] and r["step"] == word_at
    assert r["text"] == message_text(False, word_at)


@pytest.mark.parametrize("name", ["ecp5-int8", "ecp5-int4", "ecp5-full"])
def test_selftest_cube_unit_passes_on_the_ecp5_presets(name):
    # The units of the ECP5 bitstreams (docs/fpga.md), in the default suite so that a board
    # build is known to pass before it reaches a board. ecp5-int8 / ecp5-int4: the S8 chain
    # on an 8 x 8 / 4 x 4 array; ecp5-full: the S8, FP16 and MX bundles on a 2 x 2 array
    # with every type class.
    dut, r = _unit_run(config=preset(name), max_cycles=40_000)
    assert r["passed"] and not r["failed"], f"failed at step {r['step']}"
    assert r["step"] == len(dut.player.steps) - 1
