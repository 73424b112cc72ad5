"""A host-command player: replays a fixed program into a unit's host port and checks it.

The program is a list of :class:`Step`: host commands (with the response each must get),
instruction parcel beats, and waits for a bundle status (with the status it must report). It
is held in two ROMs: the steps in order, and the expected values in the order the checks
happen. The player knows nothing about the commands' meaning, only the four streams' widths,
so it serves any unit with the host port of ``docs/hdl-top.md``.
"""

import enum
from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["StepKind", "Step", "HostCommandPlayer", "PORTS"]

#: The unit's streams the player drives (``Out``) or takes (``In``), seen from the player.
PORTS = {"host_cmd": Out, "host_rsp": In, "parcels": Out, "status": In}


class StepKind(enum.IntEnum):
    """What a step does."""
    COMMAND = 0   # send a host command, take its response (and check it)
    PARCEL = 1    # send one parcel beat
    STATUS = 2    # take one bundle status and check it
    END = 3       # the program is over and everything matched


@dataclass(frozen=True)
class Step:
    """One step of a player program.

    bits:   the host command or parcel beat bit pattern.
    expect: the response (COMMAND) or status (STATUS) bit pattern that must come back;
            ``None`` for a command whose response is not checked. Statuses are compared
            under the player's ``status_mask``.
    """

    kind: StepKind
    bits: int = 0
    expect: int | None = None

    @classmethod
    def command(cls, bits: int, expect: int | None = None) -> "Step":
        """Send a host command; check its response if ``expect`` is given."""
        return cls(StepKind.COMMAND, bits, expect)

    @classmethod
    def parcel(cls, bits: int) -> "Step":
        """Send one parcel beat."""
        return cls(StepKind.PARCEL, bits)

    @classmethod
    def status(cls, expect: int) -> "Step":
        """Wait for a bundle status and check it."""
        return cls(StepKind.STATUS, 0, expect)

    @property
    def checked(self) -> bool:
        """Whether the step compares something against the expected ROM."""
        return self.expect is not None


class HostCommandPlayer(wiring.Component):
    """Plays ``steps`` into a unit's host port and reports whether every check matched.

    Parameters
    ----------
    shapes : dict
        The payload shape of each of the unit's streams ``host_cmd``, ``host_rsp``,
        ``parcels``, ``status`` (``wiring.connect`` then joins player and unit directly).
    steps : list of :class:`Step`
        The program; an END step is appended.
    status_mask : int or None
        Status bits that are compared (e.g. all but a cycle count); ``None``: all.
    timeout : int
        Cycles a single step may wait before the player gives up and fails (a hung unit).

    Members
    -------
    host_cmd, parcels : Out(stream)   host_rsp, status : In(stream)
    done : Out(1)      the program ended or a check failed.
    passed : Out(1)    with ``done``: every check matched.
    step : Out         the step being played; after a failure, the one that failed.

    Timing: a step takes four cycles (ROM fetch, its register, the transfer, then the state
    machine's move on the registered transfer) plus the unit's wait, a command two more for its
    response, and a checked step two more (the comparison and its reduction, from registers).
    """

    def __init__(self, shapes: dict, steps: list, *, status_mask: int | None = None,
                 timeout: int = 1 << 20):
        missing = set(PORTS) - set(shapes)
        if missing:
            raise ValueError(f"the unit has no {', '.join(sorted(missing))} port")
        for step in steps:
            if not isinstance(step, Step) or step.kind is StepKind.END:
                raise ValueError(f"not a playable step: {step!r}")
            if step.kind is StepKind.STATUS and step.expect is None:
                raise ValueError("a STATUS step needs the status it expects")
        self.shapes = {name: Shape.cast(shapes[name]) for name in PORTS}
        self.steps = list(steps) + [Step(StepKind.END)]
        widths = {name: shape.width for name, shape in self.shapes.items()}
        self.status_mask = (1 << widths["status"]) - 1 if status_mask is None else status_mask
        self.timeout = timeout
        self._bits_width = max(widths["host_cmd"], widths["parcels"])
        self._expect_width = max(widths["host_rsp"], widths["status"])
        for step in self.steps:
            if step.bits >> self._bits_width or (step.expect or 0) >> self._expect_width:
                raise ValueError(f"step {step!r} is wider than the unit's ports")
        super().__init__({
            **{name: flow(stream.Signature(shapes[name])) for name, flow in PORTS.items()},
            "done": Out(1), "passed": Out(1), "step": Out(range(len(self.steps))),
        })

    def elaborate(self, platform):
        m = Module()
        entry = data.StructLayout({"kind": 2, "check": 1, "bits": self._bits_width})
        m.submodules.program = program = Memory(
            shape=entry, depth=len(self.steps),
            init=[{"kind": s.kind, "check": s.checked, "bits": s.bits} for s in self.steps])
        expected = [s.expect for s in self.steps if s.checked] or [0]
        m.submodules.expected = expect_rom = Memory(
            shape=self._expect_width, depth=len(expected), init=expected)
        fetch = program.read_port()
        expect = expect_rom.read_port()

        pc = self.step
        expect_at = Signal(range(len(expected) + 1))
        m.d.comb += [fetch.addr.eq(pc), expect.addr.eq(expect_at)]
        # The ROMs' outputs (block RAMs without their output registers) and the unit's answer
        # are registered before they are compared or decoded, so that the player's own paths
        # stay shorter than the unit's (issue #9, decision F33).
        step = Signal(entry, name="step_q")
        expect_q = Signal(self._expect_width, name="expect_q")
        got = Signal(self._expect_width, name="got")
        got_mask = Signal(self._expect_width, name="got_mask")
        m.d.sync += expect_q.eq(expect.data)
        m.d.comb += [Value.cast(self.host_cmd.payload).eq(step.bits),
                     Value.cast(self.parcels.payload).eq(step.bits)]
        rsp = Value.cast(self.host_rsp.payload)
        status = Value.cast(self.status.payload)
        # The comparison takes three states: COMPARE registers which nibbles differ, REDUCE
        # ORs them into ``mismatch`` and DECIDE tests it, so no state sees a compare as wide
        # as the ports, nor an OR tree over its nibbles (F35).
        differs = ((got ^ expect_q) & got_mask)
        nibbles = Signal((len(differs) + 3) // 4)
        m.d.comb += [nibbles[i].eq(differs[4 * i:4 * i + 4].any()) for i in range(len(nibbles))]
        nibbles_q = Signal.like(nibbles)
        mismatch = Signal()

        # The timeout is a hang detector: seen a cycle late from a register, it stays off the
        # state machine's decode of the unit's handshakes.
        waited = Signal(range(self.timeout + 1))
        expired = Signal()
        expiring = waited == self.timeout
        m.d.sync += expired.eq(expiring)
        # The step's kind one-hot, registered with the step and cleared as its transfer ends
        # or the step times out (a flag is set only in LOAD and EXEC), so that every handshake
        # offered to the unit is a flip-flop (F35, F36).  ``want_rsp`` offers ``host_rsp.ready``
        # after a command; ``capture`` loads ``got`` from the status or the response offered.
        offer = {kind: Signal(name=f"offer_{kind.name.lower()}") for kind in StepKind}
        want_rsp, capture = Signal(name="want_rsp"), Signal(name="capture")
        m.d.comb += [self.host_cmd.valid.eq(offer[StepKind.COMMAND]),
                     self.parcels.valid.eq(offer[StepKind.PARCEL]),
                     self.status.ready.eq(offer[StepKind.STATUS]),
                     self.host_rsp.ready.eq(want_rsp)]
        # Each flag falls with its own port's transfer (or the timeout), and each port's
        # transfer is registered on its own (``took``), so that a late ``ready``/``valid`` of
        # the unit reaches one LUT in front of a few flip-flops.  The state machine sees a
        # transfer a cycle late, in ``moved``, off the state's decode (F36).
        transfers = [(offer[StepKind.COMMAND], self.host_cmd.ready),
                     (offer[StepKind.PARCEL], self.parcels.ready),
                     (offer[StepKind.STATUS], self.status.valid),
                     (want_rsp, self.host_rsp.valid)]
        took = []
        for flag, done in transfers:
            took.append(Signal(name=f"took_{flag.name}"))
            m.d.sync += took[-1].eq(flag & done)
            with m.If(expiring | done):
                m.d.sync += flag.eq(0)
        moved = Cat(*took).any()
        with m.If(expiring | (offer[StepKind.STATUS] & self.status.valid) |
                  (want_rsp & self.host_rsp.valid)):
            m.d.sync += capture.eq(0)
        with m.If(expiring):
            m.d.sync += offer[StepKind.END].eq(0)
        # ``got`` follows what is offered until the transfer clears ``capture``: its enable is
        # that flag, not the unit's handshake.
        with m.If(capture):
            m.d.sync += [got.eq(Mux(offer[StepKind.STATUS], status, rsp)),
                         got_mask.eq(Mux(offer[StepKind.STATUS], self.status_mask,
                                         (1 << len(rsp)) - 1))]
        with m.FSM():
            with m.State("FETCH"):
                m.d.sync += waited.eq(0)
                m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += step.eq(fetch.data)
                m.d.sync += [flag.eq(fetch.data.kind == kind) for kind, flag in offer.items()]
                m.d.sync += capture.eq(fetch.data.kind == StepKind.STATUS)
                m.next = "EXEC"
            with m.State("EXEC"):
                m.d.sync += waited.eq(waited + 1)
                with m.If(moved):
                    with m.Switch(step.kind):
                        with m.Case(StepKind.COMMAND):
                            m.d.sync += [want_rsp.eq(1), capture.eq(1)]
                            m.next = "RESPONSE"
                        with m.Case(StepKind.PARCEL):
                            m.d.sync += pc.eq(pc + 1)
                            m.next = "FETCH"
                        with m.Default():
                            m.next = "COMPARE"
                with m.Elif(expired):
                    m.next = "FAILED"
                with m.Elif(offer[StepKind.END]):
                    m.next = "PASSED"
            with m.State("RESPONSE"):
                m.d.sync += waited.eq(waited + 1)
                with m.If(moved):
                    with m.If(step.check):
                        m.next = "COMPARE"
                    with m.Else():
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "FETCH"
                with m.Elif(expired):
                    m.next = "FAILED"
            with m.State("COMPARE"):
                m.d.sync += [expect_at.eq(expect_at + 1), nibbles_q.eq(nibbles)]
                m.next = "REDUCE"
            with m.State("REDUCE"):
                m.d.sync += mismatch.eq(nibbles_q.any())
                m.next = "DECIDE"
            with m.State("DECIDE"):
                with m.If(~mismatch):
                    m.d.sync += pc.eq(pc + 1)
                    m.next = "FETCH"
                with m.Else():
                    m.next = "FAILED"
            with m.State("PASSED"):
                m.d.comb += [self.done.eq(1), self.passed.eq(1)]
            with m.State("FAILED"):
                m.d.comb += self.done.eq(1)
        return m
