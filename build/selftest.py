"""The board self-test: the unit checks itself against the golden model after reset.

:class:`SelfTest` holds a unit and a :class:`~ptocube.build.host_player.HostCommandPlayer`
whose program loads architectural state through the host port, streams the instruction parcels
of a few bundles, checks each bundle's status and reads the state back, comparing every
response with what the golden model says. The verdict shows on LEDs (``passed``, ``failed``,
``busy``) and as a line of text on ``tx`` (8N1 UART), repeated so that a terminal opened late
sees it::

    ptocube selftest PASS
    ptocube selftest FAIL step 002a        (hexadecimal index of the step that failed)
"""

import random

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from ..hdl.decoder import ParcelBeat
from ..hdl.host import (DESC_PARTS, HostCommand, HostError, HostOp, HostResponse,
                        StatusLayout, StatusOutcome, SysReg, build_info, encode_command,
                        encode_response, split_parts)
from ..hdl.tile_desc import encode_tile
from ..model import isa
from ..model.asm import assemble
from ..model.machine import Machine, Outcome
from ..model.scenario import parse_scenario
from ..model.state import GPR_COUNT, PE_COUNT
from ..sim.host import load_state, read_tile, run_sync, tile_words
from .host_player import PORTS, HostCommandPlayer, Step
from .uart_tx import UartTx

__all__ = ["SelfTest", "message_text", "port_shapes", "golden_program", "STATUS_MASK",
           "SELFTEST_BUNDLES", "SELFTEST_TILES", "MATRIX_PE", "matrix_scenario",
           "selftest_scenario", "split_bundles", "unit_selftest"]

#: The status bits a self-test compares: all but the cycle count, which is not architectural.
STATUS_MASK = ((1 << StatusLayout.size) - 1) & ~(
    ((1 << 32) - 1) << dict(StatusLayout)["cycles"].offset)

#: The bundles of the default self-test, one program each, in assembly. Each exercises the
#: decoder, the GPR port, the preflight and the status path against the golden model:
#: a strict no-op (PE mask 0000), a TIMG2COL bundle whose GPR dimension cannot be allocated
#: (Fault_TileAllocation), a TGEMV bundle whose sources are missing (Fault_TileLegality at
#: the reporting instruction), and two bundle-control faults (a stray B.DIM, a stream that
#: ends inside a bundle).
SELFTEST_BUNDLES = (
    "BSTART.SFU TIMG2COL, U8\nB.DIM zero, 8, ->LB0\nB.DIM a0, 4, ->LB1\n"
    "B.IOT M#1, mask=0000, last, ->M<128B>\nBSTOP",
    "BSTART.SFU TIMG2COL, U8\nB.DIM a1, 8, ->LB0\nB.DIM zero, 4, ->LB1\n"
    "B.IOT M#1, mask=1100, last, ->M<128B>\nBSTOP",
    "BSTART.TGEMV.BIAS U8\nB.FPATR None, None, 0, 0, 0, 0, 0, 0, 0\nB.DIM zero, 8, ->LB1\n"
    "B.DIM a2, 16, ->LB2\nB.IOT M#1, N#1, mask=1111\nB.IOT T#1, mask=1111, last, ->U<512B>\n"
    "BSTOP",
    "B.DIM zero, 8, ->LB0",
    "BSTART.SFU TIMG2COL, U8\nB.DIM zero, 8, ->LB0",
)

#: Architectural state the self-test loads for its TIMG2COL bundle (a U8 NC1HWC0 feature map on
#: every PE) and the bundle: TIMG2COL with padding, stride 2 and logical-channel padding, whose
#: 4 x 8 window (four whole payload words) is read back from every PE.
SELFTEST_TILES = {
    "tiles": {"all": {"M": [{
        "dtype": "U8", "layout": "ROW_MAJOR", "location": "Matrix", "cols": 8, "tsize": 128,
        "data": [[1, 99, 2, 98, 3, 97, 11, 96], [12, 95, 13, 94, 21, 93, 22, 92],
                 [23, 91, None, None, None, None, None, None]],
        "feature_map": {"layout": "NC1HWC0", "height": 3, "width": 3, "channels_per_group": 2,
                        "filter_height": 2, "filter_width": 2, "stride_height": 2,
                        "stride_width": 2, "pad_top": 1, "pad_left": 1,
                        "logical_channels": 1, "padding": 0x1EE}}]}},
    "program": ["BSTART.SFU TIMG2COL, U8", "B.DIM zero, 8, ->LB0", "B.DIM zero, 4, ->LB1",
                "B.IOT M#1, mask=1111, last, ->M<128B>", "BSTOP"],
}

#: The PE that holds the Matrix bundles' operands (mask 0001). One PE keeps the ROM small; PE3
#: rather than PE0 shows that the engine reads and writes the PE the plan names.
MATRIX_PE = 3
_MATRIX_MASK = "mask=" + "".join("1" if pe == MATRIX_PE else "0" for pe in range(PE_COUNT))
#: The quantization word of the S8 requantization (B.IOR): FP19 scale 0.5, 9-bit offset -3.
_REQ8_WORD = 0x3F00_0000 | ((-3 & 0x1FF) << 37)
_REQ8_GPR = "s0"

# Operands of the Matrix bundles: M x K = 3 x 8 (two A), K x N = 8 x 4 (one B).
_S8_A = ([[1, -2, 3, -4, 5, -6, 7, -8], [9, 10, -11, 12, -13, 14, -15, 16],
          [-1, -1, -1, -1, 2, 2, 2, 2]],
         [[3, 1, 4, 1, 5, 9, 2, 6], [-5, 3, 5, -8, 9, 7, -9, 3], [2, 3, 8, 4, 6, -2, 6, 4]])
_S8_B = [[1, 2, 3, 4], [-1, 0, 1, 2], [5, -5, 5, -5], [0, 1, 0, -1], [7, 7, -7, -7],
         [1, 1, 1, 1], [2, -3, 4, -5], [-6, 5, -4, 3]]
_FP16_A = ([[1.5, -2.0, 0.125, 3.0, -0.75, 8.0, "0x3555", -1.0],
            [65504, 1.0, -1.0, 0.0009765625, 2.5, -3.5, 0.5, "-0"],
            [-4.0, 0.25, 6.0, -0.5, 1.0, 1.0, -2.0, 0.375]],
           [[0.5, 0.5, -1.5, 2.0, "0x3c01", 4.0, -0.25, 1.0],
            [3.0, -2.0, 1.0, 0.0, 0.125, -8.0, 2.0, "0x3555"],
            [1.0, 2.0, 3.0, 4.0, -5.0, 6.0, -7.0, 0.0625]])
_FP16_B = [[1.0, 2.0, -0.5, 0.0], [0.25, -4.0, 8.0, 1.0], [16.0, 0.0, 1.0, -1.0],
           [-1.0, 1.0, "0x3555", 2.0], [0.5, 0.5, 0.5, -0.5], [2.0, -1.0, 0.0, 3.0],
           [-0.125, 1.5, 1.0, 1.0], [1.0, 0.0, -2.0, 0.75]]
# The MX bundle's B is _S8_B: small integers, exact in E4M3; it is also the Shared B.
_SHARED_B = "S0"
_E4M3_A = [[1.5, -2.0, 0.125, 3.0, -0.75, 8.0, 448.0, -1.0],
           [0.5, 1.0, -1.0, 0.015625, 2.5, -3.5, 0.5, 0.0],
           [-4.0, 0.25, 6.0, -0.5, 1.0, 1.0, -2.0, 0.375]]


class _MatrixOperands:
    """The Matrix bundles' registers on :data:`MATRIX_PE`, by hand in allocation order.

    ``first`` counts each hand's registers that other tiles of the scenario already hold.
    :meth:`dest` reserves a free register (a ``null`` entry) that the next destination of
    that hand takes, because a destination gets the lowest register of its hand free on every
    PE; a later source then lies above it.
    """

    def __init__(self, first: dict):
        self.hands = {hand: [None] * first.get(hand, 0) for hand in "TUMN"}

    def add(self, hand: str, tile: dict) -> str:
        """Add a source tile; its register name."""
        self.hands[hand].append(tile)
        return f"{hand}#{len(self.hands[hand])}"

    def dest(self, hand: str) -> str:
        """Reserve the register the next destination of ``hand`` takes; its name."""
        self.hands[hand].append(None)
        return f"{hand}#{len(self.hands[hand])}"

    def tiles(self) -> dict:
        """The scenario's hands (trailing free registers dropped)."""
        out = {}
        for hand, entries in self.hands.items():
            while entries and entries[-1] is None:
                entries = entries[:-1]
            if entries:
                out[hand] = entries
        return out


def _cube(dtype, data, layout="CUBE_M16"):
    return {"dtype": dtype, "layout": layout, "data": data}


def _row(dtype, data):
    return {"dtype": dtype, "layout": "ROW_MAJOR", "data": data}


def _dims(m, n, k):
    return [f"B.DIM zero, {m}, ->LB0", f"B.DIM zero, {n}, ->LB1", f"B.DIM zero, {k}, ->LB2"]


def _bias_acc_chain(regs, dtype, a_pair, b, bias, acc_datr, acc_fpatr, acc_ior=()) -> list:
    """TMATMUL.BIAS with ReLU and RowMax (D1, RowMaxOut), then TMATMUL.ACC reading D1 as C
    with the post-processing ``acc_datr``/``acc_fpatr``/``acc_ior`` lines (D2). The ACC's C
    is the first bundle's output, so the chain also checks that a published register is a
    legal source."""
    a1, a2 = (regs.add("M", _cube(dtype, a)) for a in a_pair)
    b_reg = regs.add("N", _cube(dtype, b, "CUBE_N8"))
    bias_reg = regs.add("T", bias)
    d1, _ = regs.dest("U"), regs.dest("U")
    d2 = regs.dest("T")
    return [f"BSTART.TMATMUL.BIAS {dtype}", "B.FPATR None, ReLU, 0, 1, 0, 0, 0, 0, 0",
            *_dims(3, 4, 8), f"B.IOT {a1}, {b_reg}, {_MATRIX_MASK}",
            f"B.IOT {bias_reg}, {_MATRIX_MASK}, ->U<256B>",
            f"B.IOT {_MATRIX_MASK}, last, ->U<128B>", "BSTOP",
            f"BSTART.TMATMUL.ACC {dtype}", *acc_datr, acc_fpatr, *_dims(3, 4, 8),
            f"B.IOT {d1}, {a2}, {_MATRIX_MASK}",
            f"B.IOT {b_reg}, {_MATRIX_MASK}, last, ->{d2[0]}<128B>", *acc_ior, "BSTOP"]


def matrix_scenario(config, first: dict | None = None) -> dict:
    """The Matrix bundles the self-test of ``config`` runs, as a scenario fragment
    (``gprs``, ``tiles`` of :data:`MATRIX_PE`, ``program``); ``first``: registers of each hand
    already held by other tiles (e.g. ``{"M": 1}``).

    One chain per type class the build has, so every bundle is one the preset accepts:

    * ``int_types``: S8 TMATMUL.BIAS (S32 bias, ReLU, RowMax), then S8 TMATMUL.ACC from its D
      with REQ8 requantization to S8 (scale and offset from a GPR through B.IOR, Sat 1);
    * ``float_types``: the same in FP16 (FP32 bias and accumulator), the ACC converting to FP16
      (F322F16);
    * ``mx_types``: one TMATMULMX (E4M3 with E8M0 scales of A rows and B columns);
    * ``serial_lane_feed`` (integer builds): one S8 TMATMUL (4 x 4, K = 8) with a Shared
      row-major B, a run only the lane path takes, so the board checks that path too.

    All are 3 x 4 outputs with K = 8 on one PE: more than one block of every preset's array
    but a small ROM (``docs/fpga.md``, SelfTest).
    """
    regs = _MatrixOperands(first or {})
    program, gprs = [], {}
    if config.int_types:
        gprs[_REQ8_GPR] = hex(_REQ8_WORD)
        program += _bias_acc_chain(
            regs, "S8", _S8_A, _S8_B, _row("S32", [[10, -20, 300, -4000]]),
            ["B.DATR {NORM, S8, Zero, EQ, Default, 1, 0}"],
            "B.FPATR 3, None, 0, 0, 0, 0, 0, 0, 0", [f"B.IOR {_REQ8_GPR}"])
    if config.float_types:
        program += _bias_acc_chain(
            regs, "FP16", _FP16_A, _FP16_B, _row("FP32", [[0.5, -100.0, 3.25, 0.0]]),
            [], "B.FPATR 1, None, 0, 0, 0, 0, 0, 0, 0")
    if config.mx_types:
        a = regs.add("M", _cube("E4M3", _E4M3_A))
        sa = regs.add("T", _row("E8M0", [["0x7f"], ["0x80"], ["0x7d"]]))
        b = regs.add("N", _cube("E4M3", _S8_B, "CUBE_N8"))
        sb = regs.add("T", _row("E8M0", [["0x7f", "0x81", "0x7e", "0x80"]]))
        regs.dest("U")
        program += ["BSTART.TMATMULMX E4M3", "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0",
                    *_dims(3, 4, 8), f"B.IOT {a}, {sa}, {_MATRIX_MASK}",
                    f"B.IOT {b}, {sb}, {_MATRIX_MASK}, last, ->U<256B>", "BSTOP"]
    shared = {}
    if config.int_types and config.serial_lane_feed:
        # Shared operands need power-of-two dimensions: M x K = 4 x 8.
        a = regs.add("M", _cube("S8", _S8_A[0] + _S8_A[1][:1]))
        shared[_SHARED_B] = _row("S8", _S8_B)
        regs.dest("U")
        program += ["BSTART.TMATMUL S8", "B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0",
                    *_dims(4, 4, 8), f"B.IOS {_SHARED_B}, {_MATRIX_MASK}",
                    f"B.IOT {a}, {_MATRIX_MASK}, last, ->U<256B>", "BSTOP"]
    return {"gprs": gprs, "tiles": {f"PE{MATRIX_PE}": regs.tiles()}, "shared": shared,
            "program": program}


def selftest_scenario(config) -> dict:
    """The self-test's state and program for ``config``: :data:`SELFTEST_TILES` (TIMG2COL on
    every PE) and :func:`matrix_scenario` (the Matrix bundles on :data:`MATRIX_PE`)."""
    held = {hand: len(entries) for hand, entries in SELFTEST_TILES["tiles"]["all"].items()}
    matrix = matrix_scenario(config, held)
    return {"gprs": matrix["gprs"],
            "tiles": {**SELFTEST_TILES["tiles"], **matrix["tiles"]}, "shared": matrix["shared"],
            "program": SELFTEST_TILES["program"] + matrix["program"]}


_PREFIX = "ptocube selftest "


def message_text(passed: bool, step: int = 0) -> str:
    """The line :class:`SelfTest` sends for a verdict (``step``: the failing step)."""
    return _PREFIX + ("PASS" if passed else f"FAIL step {step:04x}") + "\r\n"


def port_shapes(unit) -> dict:
    """The payload shape of each host-port stream of ``unit`` (a wiring.Component)."""
    members = unit.signature.members
    return {name: members[name].signature.members["payload"].shape for name in PORTS}


def _command(op, *, index=0, addr=0, value=0, expect=None, error=None):
    """A COMMAND step; ``expect``: the response data, ``error``: the HostError it must get."""
    bits = encode_command(HostCommand(op, index=index, addr=addr, data=value))
    if error is not None:
        return Step.command(bits, encode_response(HostResponse(0, error)))
    return Step.command(bits, None if expect is None else encode_response(HostResponse(expect)))


def _parcel_steps(program: str, per_beat: int) -> list:
    """The program's instructions as parcel beats; the last beat ends the stream."""
    parcels = isa.words_to_parcels(assemble(program))
    chunks = [parcels[k:k + per_beat] for k in range(0, len(parcels), per_beat)]
    layout = ParcelBeat(per_beat)
    return [Step.parcel(layout.const({"parcels": chunk + [0] * (per_beat - len(chunk)),
                                      "count": len(chunk),
                                      "last": k == len(chunks) - 1}).as_bits())
            for k, chunk in enumerate(chunks)]


def _status_bits(result) -> int:
    """The status item the model's :class:`BundleResult` stands for (``cycles`` zero)."""
    outcome = {Outcome.SUCCESS: StatusOutcome.SUCCESS, Outcome.NOOP: StatusOutcome.NOOP,
               Outcome.FAULT: StatusOutcome.FAULT}[result.outcome]
    fields = {"outcome": outcome, "flags": result.flags}
    if result.outcome == Outcome.FAULT:
        fields.update(fault=result.fault, fault_index=result.fault_index or 0)
    if result.operation is not None:
        fields.update(op_valid=1, op=result.operation.value)
    if result.published:
        indexes = list(dict.fromkeys(p.index for p in result.published))
        fields["pe_mask"] = sum(1 << (PE_COUNT - 1 - pe) for pe in {p.pe for p in result.published})
        fields["outputs"] = [{"valid": 1, "index": i} for i in indexes] + \
            [{"valid": 0, "index": 0}] * (3 - len(indexes))
    return StatusLayout.const(fields).as_bits()


def _driver_steps(generator, answer) -> list:
    """Run a :mod:`ptocube.sim.host` driver generator against ``answer(cmd) -> (data or
    None)``; each command becomes a COMMAND step expecting that data (None: unchecked)."""
    steps = []

    def transact(cmd):
        value = answer(cmd)
        steps.append(Step.command(encode_command(cmd), None if value is None
                                  else encode_response(HostResponse(value))))
        return HostResponse(value or 0)

    run_sync(generator, transact)
    return steps


def _model_read(state):
    """Answers of a unit holding ``state`` to the reads :func:`read_tile` issues."""
    def answer(cmd):
        tile = state.tile(cmd.space, cmd.index)
        if cmd.op is HostOp.READ_DESC:
            return split_parts(encode_tile(tile), DESC_PARTS)[cmd.addr]
        if cmd.op is HostOp.READ_WORD:
            return tile_words(tile)[cmd.addr]
        raise ValueError(f"unexpected read {cmd}")
    return answer


def split_bundles(program: str) -> list[str]:
    """The program's bundles, each from its start line to the line before the next start.

    The player takes a stream's statuses only after its last parcel beat, while the unit
    decodes ahead only as far as its status output and decoder buffers hold: a stream of
    several bundles can stall both (decision F13), so the self-test sends one bundle per
    stream.
    """
    bundles = []
    for line in program.splitlines():
        if not bundles or line.strip().upper().startswith("BSTART"):
            bundles.append([])
        bundles[-1].append(line)
    return ["\n".join(lines) for lines in bundles]


def golden_program(config, bundles=SELFTEST_BUNDLES, scenario=None, *,
                   seed: int = 1, per_beat: int = 2) -> list:
    """A self-test program and its expected results, all from the golden model.

    After a NOP and a check of the BUILD register (the unit is the preset it claims to be),
    the ``scenario``'s state (a scenario-file object, ``docs/scenario-format.md``; default
    :func:`selftest_scenario` of ``config``), with every writable GPR the scenario leaves zero
    set to a pseudo-random value (``seed``), is loaded through
    :func:`ptocube.sim.host.load_state`. Each entry of ``bundles``, then each bundle of the
    scenario's program, is sent as its own parcel stream (:func:`split_bundles`), and each
    bundle's status must equal the model's (outcome, fault class, reporting instruction,
    flags, PEs, outputs, operation).
    Finally every GPR, the sticky status, the allocation map and every register a bundle
    published (descriptor and the payload words of its valid elements) are read back, and a
    refused GPR0 write checks the error path.
    """
    rng = random.Random(seed)
    parsed = parse_scenario(selftest_scenario(config) if scenario is None else scenario)
    machine = Machine(parsed.state)
    for number in range(1, GPR_COUNT):
        value = rng.getrandbits(64)
        if not machine.state.read_gpr(number):
            machine.state.write_gpr(number, value)
    steps = [_command(HostOp.NOP, expect=0),
             _command(HostOp.READ_SYS, addr=SysReg.BUILD.value, expect=build_info(config))]
    # The unit answers 0 to every load command but CONFIGURE (its placement, not checked).
    steps += _driver_steps(load_state(machine.state, config),
                           lambda cmd: None if cmd.op is HostOp.CONFIGURE else 0)
    published = []
    for program in (*bundles, *split_bundles(parsed.program)):
        results = machine.run(program)
        steps += _parcel_steps(program, per_beat)
        steps += [Step.status(_status_bits(r)) for r in results]
        published += [(p.pe, p.index) for r in results for p in r.published]
    state = machine.state
    steps += [_command(HostOp.READ_GPR, index=n, expect=state.read_gpr(n))
              for n in range(GPR_COUNT)]
    steps += [_command(HostOp.READ_SYS, addr=SysReg.STATUS.value, expect=state.flags),
              _command(HostOp.READ_SYS, addr=SysReg.ALLOCATED.value,
                       expect=sum(1 << i for i in range(64) if state.index_allocated(i)))]
    for pe, index in dict.fromkeys(published):
        steps += _driver_steps(read_tile(pe, index), _model_read(state))
    steps += [_command(HostOp.WRITE_GPR, index=0, value=1, error=HostError.BAD_INDEX),
              _command(HostOp.NOP, expect=0)]
    return steps


def unit_selftest(config, *, clk_hz: float, baud: int = 115200, **kwargs) -> "SelfTest":
    """The self-test of the preset's :class:`~ptocube.hdl.top.CubeUnit` with the golden
    program (other keyword arguments go to :class:`SelfTest`)."""
    from ..hdl.top import CubeUnit, PARCELS_PER_BEAT
    return SelfTest(CubeUnit(config), golden_program(config, per_beat=PARCELS_PER_BEAT),
                    clk_hz=clk_hz, baud=baud, status_mask=STATUS_MASK, **kwargs)


class SelfTest(wiring.Component):
    """A unit, a program of host commands with their expected responses, and the verdict.

    Parameters
    ----------
    unit : wiring.Component
        Anything with the host port of ``docs/hdl-top.md`` (``host_cmd``, ``host_rsp``,
        ``parcels``, ``status``).
    steps : list of :class:`~ptocube.build.host_player.Step`
        The program.
    clk_hz, baud : the clock and UART rates (the UART bit time is their ratio, rounded).
    status_mask : status bits compared (``None``: all).
    timeout : cycles one step may wait before the test fails (a hung unit).
    repeat_cycles : cycles between repetitions of the verdict line (default: one second).

    Members: ``passed``, ``failed`` (one of them lights when the program ends), ``busy``
    (while it runs), ``tx`` (the UART line).
    """

    passed: Out(1)
    failed: Out(1)
    busy: Out(1)
    tx: Out(1, init=1)

    def __init__(self, unit, steps, *, clk_hz: float, baud: int = 115200,
                 status_mask: int | None = None, timeout: int = 1 << 20,
                 repeat_cycles: int | None = None):
        if len(steps) >= 1 << 16:
            raise ValueError("a self-test program has at most 65535 steps (4 hex digits)")
        self.unit = unit
        self.player = HostCommandPlayer(port_shapes(unit), steps, status_mask=status_mask,
                                        timeout=timeout)
        self.divisor = max(1, round(clk_hz / baud))
        self.repeat_cycles = int(clk_hz) if repeat_cycles is None else repeat_cycles
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        m.submodules.player = player = self.player
        for name in PORTS:
            wiring.connect(m, getattr(player, name), getattr(unit, name))
        m.d.comb += [self.passed.eq(player.done & player.passed),
                     self.failed.eq(player.done & ~player.passed),
                     self.busy.eq(~player.done)]

        m.submodules.uart = uart = UartTx(self.divisor)
        m.d.comb += self.tx.eq(uart.tx)
        step16 = Signal(16)
        m.d.comb += step16.eq(player.step)
        # The verdict and the step's hexadecimal digits are registered too, so the message
        # mux starts from flip-flops (F35): both are steady from ``player.done`` on, a cycle
        # before the line's first character, which the two lines share, is taken.
        passed = Signal()
        digits = [Signal(8, name=f"digit{k}") for k in range(4)]
        m.d.sync += passed.eq(player.passed)
        for k, digit in enumerate(digits):
            nibble = step16[4 * (3 - k):4 * (4 - k)]
            m.d.sync += digit.eq(Mux(nibble < 10, ord("0") + nibble, ord("a") - 10 + nibble))
        chars = self._message_chars(passed, digits)
        last = Mux(passed, len(message_text(True)) - 1, len(chars) - 1)
        index = Signal(range(len(chars)))
        pause = Signal(range(max(2, self.repeat_cycles + 1)))
        # The character is registered: the line's mux over the verdict and the step's hex
        # digits stays off the UART's shift register. It is loaded every cycle; ``index``
        # and the verdict are steady from ``player.done`` on, and each byte taken keeps the
        # UART busy for a whole frame, so the register has caught up before ``ready`` again.
        # Each bit is a bit select over the positions, a mux tree on ``index`` (F35), not a
        # case per position and an OR over them.
        char = Signal(8)
        m.d.sync += [char[b].eq(Cat(Value.cast(c)[b] for c in chars).bit_select(index, 1))
                     for b in range(8)]
        m.d.comb += uart.data.payload.eq(char)
        with m.FSM():
            with m.State("RUN"):
                with m.If(player.done):
                    m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += uart.data.valid.eq(1)
                with m.If(uart.data.ready):
                    m.d.sync += index.eq(index + 1)
                    with m.If(index == last):
                        m.d.sync += [index.eq(0), pause.eq(0)]
                        m.next = "PAUSE"
            with m.State("PAUSE"):
                m.d.sync += pause.eq(pause + 1)
                with m.If(pause == self.repeat_cycles):
                    m.next = "SEND"
        return m

    @staticmethod
    def _message_chars(passed, digits) -> list:
        """The verdict line as one byte Value per position: the PASS line, or the FAIL line
        with the four characters ``digits`` (the step's hexadecimal digits, most significant
        first)."""
        ok, fail = message_text(True), message_text(False, 0)
        hex_at = fail.index("step ") + len("step ")
        chars = []
        for k, c_fail in enumerate(fail):
            if hex_at <= k < hex_at + 4:
                fail_char = digits[k - hex_at]
            else:
                fail_char = Const(ord(c_fail), 8)
            chars.append(Mux(passed & (k < len(ok)), ord(ok[min(k, len(ok) - 1)]), fail_char))
        return chars
