"""Formal properties of the hardware preflight (yowasp-sby + z3, through ``hdl/formal.py``).

Every input of :class:`Preflight` is free on every cycle: the records, the tile store's
answers, the allocation state, the verdict's ``ready`` and ``exec_done``.  The harness
watches the outputs and proves, by k-induction (so for every reachable state, not only up
to a depth):

1. **No commit without approval**: ``commit_enable`` is high only after an APPROVE
   verdict was taken and before the next record is accepted.
2. **A faulted bundle changes nothing**: after a FAULT or NOOP verdict ``commit_enable``
   stays low until the next record; the preflight has no write port at all, so nothing
   else could change state.  A record that carries a decode fault or is a strict no-op
   reads nothing (no tile, Shared, word or GPR read).
3. **A verdict within a bounded number of cycles**: while a record is being checked, the
   ranking ``(phase, -walk, slot, word)`` strictly increases every cycle (lexicographically;
   ``walk`` is the number ``walk_found``:``walk_after_found``:``walk_rest``, the slots a
   per-PE phase has still to visit, which each step of the walk lowers) and the phase never
   returns to IDLE or HOLD without a verdict.  The ranking takes finitely many values, so
   the verdict comes; ``docs/hdl-preflight.md`` derives the exact bound.
4. **The verdict is a well-behaved stream**: once valid it stays valid with the same
   payload until taken.

A cover run (``slow``) shows the properties are not vacuous: a Matrix approval, a TIMG2COL
approval, a fault found in a tile descriptor and a completed execution are reachable.
"""

import pytest
from amaranth.hdl import Assert, Assume, Cat, Cover, Elaboratable, Module, ResetSignal, Signal

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.formal import run_sby
from ptocube.hdl.preflight import Check, Outcome, Phase, Preflight
from ptocube.model.bundle import Operation

#: Phases in which a record is being checked (the ranking must increase in them).
CHECKING = [p for p in Phase if Phase.START.value <= p.value <= Phase.AUX_SHAPE.value]


class Harness(Elaboratable):
    """The preflight with observers and the four properties (``cover``: reachability)."""

    def __init__(self, config=CubeConfig(), cover=False):
        self.dut = Preflight(config)
        self.cover = cover

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += Assume(~ResetSignal())

        accepted = dut.record.valid & dut.record.ready
        taken = dut.verdict.valid & dut.verdict.ready
        outcome = dut.verdict.payload.outcome
        reads = Cat(dut.tile_rd.en, dut.shared_rd.en, dut.word_rd.en, dut.gpr_rd.en)
        phase = dut.phase.as_value()
        checking = Cat(*[phase == p.value for p in CHECKING]).any()

        # Observers, cleared when a record is accepted.
        approved = Signal()         # an APPROVE verdict was taken since
        rejected = Signal()         # a FAULT or NOOP verdict was taken since
        passthrough = Signal()      # the accepted record is a fault record or a no-op
        with m.If(accepted):
            m.d.sync += [approved.eq(0), rejected.eq(0),
                         passthrough.eq((dut.record.payload.fault != 0)
                                        | dut.record.payload.bundle.noop)]
        with m.Elif(taken):
            m.d.sync += [approved.eq(outcome == Outcome.APPROVE),
                         rejected.eq(outcome != Outcome.APPROVE)]

        # The ranking, and whether the previous cycle was a checking one.
        rank = Cat(dut.word, dut.slot, ~dut.walk, phase)
        last_rank = Signal.like(rank)
        was_checking = Signal()
        last_valid = Signal()
        last_payload = Signal.like(dut.verdict.payload.as_value())
        m.d.sync += [last_rank.eq(rank), was_checking.eq(checking),
                     last_valid.eq(dut.verdict.valid & ~dut.verdict.ready),
                     last_payload.eq(dut.verdict.payload.as_value())]

        if self.cover:
            matrix = dut.rec.bundle.op != Operation.TIMG2COL
            check = dut.verdict.payload.check
            m.d.comb += [Cover(taken & (outcome == Outcome.APPROVE) & matrix),
                         Cover(taken & (outcome == Outcome.APPROVE) & ~matrix),
                         Cover(taken & (outcome == Outcome.FAULT)
                               & (check == Check.MATH_SOURCES)),
                         Cover(dut.commit_enable & dut.exec_done)]
            return m

        m.d.comb += [
            # 1. No commit without approval (with the invariants that make it inductive).
            Assert(~dut.commit_enable | approved),
            Assert(~dut.commit_enable | (phase == Phase.HOLD.value)),
            Assert((phase != Phase.HOLD.value) | approved),
            Assert(~approved | (phase == Phase.HOLD.value) | (phase == Phase.IDLE.value)),
            # 2. A rejected bundle changes nothing; a pass-through record reads nothing.
            Assert(~rejected | ~dut.commit_enable),
            Assert(~rejected | (phase == Phase.IDLE.value)),
            Assert(~(passthrough & checking) | (reads == 0)),
            Assert(~(passthrough & checking)),     # its verdict comes from IDLE (P18)
            Assert((phase == Phase.IDLE.value)
                   | (passthrough == ((dut.rec.fault != 0) | dut.rec.bundle.noop))),
            # The record follows the payload while ``ready`` (a register): only when idle.
            Assert(~dut.record.ready | ~dut.busy),
            # 3. Bounded: forward progress in every checking cycle, verdict before idle.
            # The phase is one-hot, so ``phase`` names it.
            Assert((dut.at != 0) & ((dut.at & (dut.at - 1)) == 0)),
            Assert(phase <= Phase.HOLD.value),
            Assert(~(was_checking & checking) | (rank > last_rank)),
            Assert(~was_checking | checking | (phase == Phase.VERDICT.value)),
            Assert((dut.verdict.valid == (phase == Phase.VERDICT.value))),
            # 4. A verdict on offer stays on offer, unchanged.
            Assert(~last_valid | (dut.verdict.valid
                                  & (dut.verdict.payload.as_value() == last_payload))),
        ]
        return m


def _ports(harness):
    dut = harness.dut
    return [dut.record.valid, dut.record.payload.as_value(), dut.verdict.ready, dut.exec_done,
            dut.tile_rd.desc.as_value(), dut.tile_rd.defined, dut.shared_rd.desc.as_value(),
            dut.shared_rd.defined, dut.word_rd.data, dut.gpr_rd.data,
            dut.alloc.allocated, dut.alloc.capacity_in_use,
            dut.alloc.pe_bytes_in_use.as_value(), dut.alloc.tile_capacity,
            dut.commit_enable, dut.verdict.valid]


def test_preflight_properties_hold_in_every_reachable_state(tmp_path):
    harness = Harness()
    result = run_sby(harness, "preflight", ports=_ports(harness), mode="prove", depth=3,
                     workdir=tmp_path)
    assert result.passed, result.log[-3000:]


@pytest.mark.slow
def test_approval_and_fault_are_reachable(tmp_path):
    harness = Harness(cover=True)
    result = run_sby(harness, "preflight_cover", ports=_ports(harness), mode="cover",
                     depth=26, workdir=tmp_path)
    assert result.passed, result.log[-3000:]
