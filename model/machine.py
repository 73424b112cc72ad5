"""The golden model's top level: decode -> preflight -> execute -> publish.

:class:`Machine` holds the architectural :class:`~ptocube.model.state.State`
and runs programs on it, one bundle at a time:

1. **decode** (:mod:`ptocube.model.decode`): words to bundle records, one
   instruction at a time; decode- and header-time faults come back as records;
2. a bundle whose bindings all have PE_MASK 0000 is a **strict no-op**
   (ruling R12): nothing is read, checked, allocated or published;
3. **preflight** (:mod:`ptocube.model.preflight`): every completion-time
   check in the spec's order, ending with destination allocation;
4. **execute** (:mod:`ptocube.model.execute`): the arithmetic, per PE;
5. **publish**: the outputs (D, RowMaxOut, GroupMaxOut or the TIMG2COL
   window) of every selected PE - descriptors, payloads, definedness - and
   the numeric status flags, as one atomic group.

Each record is completed as soon as the decoder returns it, before the next
instruction is decoded: when a commit that a start ended fails here, that
start opens nothing (:meth:`~ptocube.model.decode.BundleDecoder.squash`), as
when the decoder detects the fault itself.

A fault at any step publishes nothing: the state after a faulting bundle is
identical to the state before it (sources, previous status, Shared tiles and
allocation included), and the next bundle runs.  Sources always persist.

Every bundle yields a :class:`BundleResult`: the outcome (success, no-op, or
the fault class with the index of the reporting instruction) and the tiles
it published.
"""

from dataclasses import dataclass, field

from .asm import assemble
from .bundle import BundleRecord, Operation
from .decode import BundleDecoder
from .execute import ARITHMETIC_MODES, execute
from .faults import FaultClass, PTOFault
from .isa import word_and_length
from .preflight import preflight
from .state import HANDS, State, Tile, selector_name

__all__ = ["Outcome", "PublishedTile", "BundleResult", "Machine"]


class Outcome:
    """The three ways a bundle can end."""
    SUCCESS = "success"
    NOOP = "noop"
    FAULT = "fault"


@dataclass(frozen=True)
class PublishedTile:
    """One tile a bundle created: on PE ``pe``, in register ``index``."""
    pe: int
    index: int
    tile: Tile

    @property
    def hand(self) -> str:
        """Hand letter T, U, M or N."""
        return HANDS[self.index >> 4]

    @property
    def n(self) -> int:
        """The register's number within its hand (the ``#n`` of ``T#n``), 1..16."""
        return (self.index & 0xF) + 1

    @property
    def name(self) -> str:
        """``T#1``-style selector name."""
        return selector_name(self.index)


@dataclass(frozen=True)
class BundleResult:
    """What one bundle did.

    ``fault_index`` is the zero-based index (in the program's instruction
    stream) of the instruction that reported the fault: the faulting header
    command for decode/header faults, the completion boundary for
    completion-time faults.  ``flags`` are the status flags the bundle ORed
    into the sticky status (0 unless it succeeded).
    """
    number: int                                   # bundle ordinal in the program
    operation: Operation | None
    outcome: str
    fault: FaultClass = FaultClass.NONE
    fault_index: int | None = None
    reason: str = ""
    published: tuple = ()
    flags: int = 0
    record: BundleRecord | None = field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        """True for success and no-op."""
        return self.outcome != Outcome.FAULT


class Machine:
    """Architectural state plus the bundle pipeline.

    ``arithmetic`` selects the accumulation arithmetic: ``"ieee"`` (the
    hardware numeric profile, ruling R1; default) or ``"pto-v0"`` (the
    executable spec's raw-carrier profile, to replay its own tests).
    """

    def __init__(self, state: State | None = None, arithmetic: str = "ieee"):
        if arithmetic not in ARITHMETIC_MODES:
            raise ValueError(f"unknown arithmetic {arithmetic!r}; use one of {ARITHMETIC_MODES}")
        self.state = State() if state is None else state
        self.arithmetic = arithmetic
        self.results: list[BundleResult] = []

    def run(self, program) -> list[BundleResult]:
        """Run a program: assembly text, or a sequence of instructions / ``(word, bits)``.

        Returns the results of this program's bundles (also appended to
        :attr:`results`).  GPRs are read when the bundle commands execute;
        bundles do not write GPRs, so the whole program sees the same values.
        """
        words = assemble(program) if isinstance(program, str) else list(program)
        decoder = BundleDecoder(self.state.gprs)
        results = []
        for index, item in enumerate(words):
            self._complete(decoder, decoder.step(index, *word_and_length(item)), results)
        self._complete(decoder, decoder.finish(len(words)), results)
        self.results.extend(results)
        return results

    def _complete(self, decoder: BundleDecoder, records: list, results: list):
        """Complete the records one decoder step returned, appending to ``results``."""
        for record in records:
            result = self.step(record, len(results))
            results.append(result)
            if record.ok and not result.ok:
                # The commit failed after decode.  If a start ended the bundle, it
                # opens nothing: the decoder drops its bundle, and a second record
                # of this step (an unsupported start, D11) is that bundle's.
                decoder.squash()
                return

    def step(self, record: BundleRecord, number: int = 0) -> BundleResult:
        """Complete one decoded bundle against the state (publishing on success)."""
        op = None if record.bundle is None else record.bundle.op
        if not record.ok:
            return BundleResult(number, op, Outcome.FAULT, record.fault, record.fault_index,
                                record.reason, record=record)
        if record.noop:
            return BundleResult(number, op, Outcome.NOOP, record=record)
        bundle = record.bundle
        try:
            plan = preflight(bundle, self.state)
            tiles, flags = execute(plan, self.state, self.arithmetic)
        except PTOFault as fault:
            index = bundle.boundary_index if fault.index is None else fault.index
            return BundleResult(number, op, Outcome.FAULT, fault.fault, index, fault.reason,
                                record=record)
        self.state.publish(tiles, flags)
        published = tuple(PublishedTile(pe, index, tile) for pe, index, tile in tiles)
        return BundleResult(number, op, Outcome.SUCCESS, published=published, flags=flags,
                            record=record)
