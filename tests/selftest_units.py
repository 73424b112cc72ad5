"""A stand-in unit with the CubeUnit host port and a program for it (test-only).

Used by ``tests/test_selftest.py`` (the host-command player on its own) and
``tests/test_build.py`` (the SelfTest board flow without the whole unit's elaboration).
"""

from amaranth.hdl import Array, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ptocube.build.host_player import Step
from ptocube.hdl.decoder import ParcelBeat
from ptocube.hdl.host import (HostCommand, HostCommandLayout, HostError, HostOp,
                              HostResponse, HostResponseLayout, StatusLayout, StatusOutcome,
                              encode_command, encode_response)

__all__ = ["GprUnit", "gpr_program"]


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
