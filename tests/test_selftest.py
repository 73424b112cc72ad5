"""SelfTest and its host-command player, in Amaranth simulation.

The player is checked against a small stand-in unit with the same host port (a GPR file that
answers WRITE_GPR / READ_GPR and one status per ``last`` parcel beat), so its protocol
handling is tested on its own; the self-test of the real unit follows in
``test_selftest_cube_unit*``.
"""

import pytest
from amaranth.hdl import Array, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ptocube.build.host_player import HostCommandPlayer, Step, StepKind
from ptocube.build.selftest import (STATUS_MASK, SelfTest, golden_program, message_text,
                                    port_shapes, unit_selftest)
from ptocube.hdl.config import preset
from ptocube.hdl.top import CubeUnit
from ptocube.hdl.decoder import ParcelBeat
from ptocube.hdl.host import (HostCommand, HostCommandLayout, HostError, HostOp,
                              HostResponse, HostResponseLayout, StatusLayout, StatusOutcome,
                              decode_command, decode_status, encode_command, encode_response)


class GprUnit(wiring.Component):
    """Stand-in with the CubeUnit host port: 24 GPRs, a status per finished parcel stream.

    Responses come one cycle after the command (``host_cmd.ready`` is low while one waits),
    and ``host_cmd.ready`` also drops for ``busy_cycles`` after a status, like the real
    unit's availability rule.
    """

    host_cmd: In(stream.Signature(HostCommandLayout))
    host_rsp: Out(stream.Signature(HostResponseLayout))
    parcels: In(stream.Signature(ParcelBeat(2)))
    status: Out(stream.Signature(StatusLayout))

    def elaborate(self, platform):
        m = Module()
        gprs = Array(Signal(64, name=f"gpr{k}") for k in range(24))
        cmd = self.host_cmd.payload
        m.d.comb += self.host_cmd.ready.eq(~self.host_rsp.valid & ~self.status.valid)
        with m.If(self.host_rsp.valid & self.host_rsp.ready):
            m.d.sync += self.host_rsp.valid.eq(0)
        with m.If(self.host_cmd.valid & self.host_cmd.ready):
            m.d.sync += [self.host_rsp.valid.eq(1), self.host_rsp.payload.error.eq(0),
                         self.host_rsp.payload.data.eq(0)]
            with m.If((cmd.op == HostOp.WRITE_GPR) & (cmd.index < 24) & (cmd.index != 0)):
                m.d.sync += gprs[cmd.index].eq(cmd.data)
            with m.Elif((cmd.op == HostOp.READ_GPR) & (cmd.index < 24)):
                m.d.sync += self.host_rsp.payload.data.eq(gprs[cmd.index])
            with m.Elif(cmd.op != HostOp.NOP):
                m.d.sync += [self.host_rsp.payload.error.eq(1),
                             self.host_rsp.payload.data.eq(HostError.BAD_OP.value)]
        # A stream's last beat makes GPR1 := GPR1 + (number of parcels) and one SUCCESS status.
        m.d.comb += self.parcels.ready.eq(~self.status.valid)
        with m.If(self.parcels.valid & self.parcels.ready):
            m.d.sync += gprs[1].eq(gprs[1] + self.parcels.payload.count)
            with m.If(self.parcels.payload.last):
                m.d.sync += [self.status.valid.eq(1),
                             self.status.payload.outcome.eq(StatusOutcome.SUCCESS),
                             self.status.payload.cycles.eq(self.status.payload.cycles + 7)]
        with m.If(self.status.valid & self.status.ready):
            m.d.sync += self.status.valid.eq(0)
        return m


def _cmd(op, index=0, value=0):
    return encode_command(HostCommand(op, index=index, data=value))


def _ok(value=0):
    return encode_response(HostResponse(value))


def _status_success():
    return data.Const(StatusLayout, 0).as_value().value  # outcome SUCCESS = 0, all zero


def _beat(parcels, last):
    return ParcelBeat(2).const({"parcels": list(parcels) + [0] * (2 - len(parcels)),
                                      "count": len(parcels), "last": last}).as_bits()


def gpr_program(corrupt=None):
    """Writes GPRs, sends two parcel streams (5 parcels), reads everything back."""
    steps = [Step.command(_cmd(HostOp.NOP), _ok())]
    values = {k: (0x0123_4567_89AB_CDEF * k) % 2**64 for k in range(2, 8)}
    steps += [Step.command(_cmd(HostOp.WRITE_GPR, k, v), _ok()) for k, v in values.items()]
    steps += [Step.command(_cmd(HostOp.WRITE_GPR, 1, 100))]
    steps += [Step.parcel(_beat([0x11, 0x22], 0)), Step.parcel(_beat([0x33], 1)),
              Step.status(_status_success()),
              Step.parcel(_beat([0x44, 0x55], 1)), Step.status(_status_success())]
    steps += [Step.command(_cmd(HostOp.READ_GPR, 1), _ok(105))]
    steps += [Step.command(_cmd(HostOp.READ_GPR, k), _ok(v)) for k, v in values.items()]
    steps += [Step.command(_cmd(HostOp.WRITE_GPR, 0, 1),
                           encode_response(HostResponse(0, HostError.BAD_OP)))]
    steps += [Step.command(_cmd(HostOp.READ_GPR, 0), _ok(0))]
    if corrupt is not None:
        s = steps[corrupt]
        steps[corrupt] = Step(s.kind, s.bits, s.expect ^ (1 << 5))
    return steps


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


def test_golden_program_shape():
    steps = golden_program(preset("ice40-tiny"))
    kinds = [s.kind for s in steps]
    assert kinds.count(StepKind.STATUS) == 6             # one per bundle
    assert kinds.count(StepKind.PARCEL) > 10
    statuses = [decode_status(s.expect) for s in steps if s.kind is StepKind.STATUS]
    assert len({s.expect for s in steps if s.kind is StepKind.STATUS}) == 6
    assert statuses[-1].outcome is StatusOutcome.SUCCESS and statuses[-1].pe_mask == 0b1111
    commands = [decode_command(s.bits) for s in steps if s.kind is StepKind.COMMAND]
    unchecked = [c for c, s in zip(commands, (s for s in steps if s.kind is StepKind.COMMAND))
                 if not s.checked]
    assert unchecked and all(c.op is HostOp.CONFIGURE for c in unchecked)
    # The TIMG2COL window is read back from every PE.
    assert {(c.space, c.index) for c in commands if c.op is HostOp.READ_WORD} == \
        {(pe, 33) for pe in range(4)}


def _unit_run(corrupt=None):
    config = preset("ice40-tiny")
    if corrupt is None:
        dut = unit_selftest(config, clk_hz=4e6, baud=1e6, repeat_cycles=50)
    else:
        # The same unit and program with one expected word flipped.
        program = golden_program(config)
        s = program[corrupt]
        program[corrupt] = Step(s.kind, s.bits, s.expect ^ (1 << 3))
        dut = SelfTest(CubeUnit(config), program, clk_hz=4e6, baud=1e6,
                       status_mask=STATUS_MASK, repeat_cycles=50)
    return dut, run_selftest(dut, max_cycles=5000, uart_cycles=1500)


def test_selftest_cube_unit_passes():
    dut, r = _unit_run()
    assert r["passed"] and not r["failed"], f"failed at step {r['step']}"
    assert r["step"] == len(dut.player.steps) - 1
    assert r["text"] == message_text(True)


def test_selftest_cube_unit_detects_a_corrupted_word():
    steps = golden_program(preset("ice40-tiny"))
    word_at = [k for k, s in enumerate(steps) if s.kind is StepKind.COMMAND
               and decode_command(s.bits).op is HostOp.READ_WORD][-1]
    dut, r = _unit_run(corrupt=word_at)
    assert r["failed"] and r["step"] == word_at
    assert r["text"] == message_text(False, word_at)
