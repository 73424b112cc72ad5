"""Formal proofs of the hardware bundle decoder with SymbiYosys (``yowasp-sby`` + z3).

``BundleDecoder(checks="all")`` carries the properties as ``Assert`` statements (see
``BundleDecoder._add_checks``): every output record is a descriptor or exactly one fault class,
records are well formed and held until taken (a squash only changes records that are not
offered), and with the output ready the decoder makes progress - a C.BSTOP that enters the
decoder is executed within ``PROGRESS_BOUND`` cycles and completes a record unless the decoder
is skipping a faulted bundle.  Here every input is free in every cycle (any parcels, any beat
sizes, any ``last``, any GPR value, any ``o.ready``, any ``squash``); the contract is proved by
k-induction, so it covers every reachable state, not just traces from reset.

The proofs use a decoder with small lists and 4-bit instruction indices (the properties do not
depend on either), which keeps them within the default suite's time budget.
"""

import pytest
from amaranth.hdl import Assert, Assume, Cover, Elaboratable, Module, ResetSignal, Value

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.decoder import PROGRESS_BOUND, BundleDecoder
from ptocube.hdl.formal import run_sby, tools_available
from ptocube.model.bundle import Operation
from ptocube.model.faults import FaultClass

pytestmark = pytest.mark.skipif(not tools_available(), reason="yowasp-sby or z3 missing")

SMALL = CubeConfig(max_local_sources=2, max_destinations=1, max_shared=1, max_iot_words=2)


class DecoderUnderProof(Elaboratable):
    """The decoder with its checks, free inputs, and optional covers or a planted bug."""

    def __init__(self, config=SMALL, *, checks="all", index_width=4, covers=False,
                 false_claim=False):
        self.dut = BundleDecoder(config, index_width=index_width, checks=checks)
        self.covers = covers
        self.false_claim = false_claim

    @property
    def ports(self):
        dut = self.dut
        return [dut.i.valid, Value.cast(dut.i.payload), dut.o.ready, dut.gpr_value, dut.squash]

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += Assume(~ResetSignal())
        record = dut.o.p
        if self.covers:
            m.d.comb += [
                Cover(dut.o.valid & (record.fault == FaultClass.NONE) & ~record.bundle.noop &
                      (record.bundle.op == Operation.TMATMUL) & (record.bundle.local_count == 2)),
                Cover(dut.o.valid & (record.fault == FaultClass.NONE) & record.bundle.noop),
                Cover(dut.o.valid & (record.fault == FaultClass.TILE_LEGALITY)),
            ]
        if self.false_claim:
            # Not true: a stray C.BSTOP is Fault_BundleControl.  The proof must find it.
            m.d.sync += Assert(~dut.o.valid | (record.fault != FaultClass.BUNDLE_CONTROL))
        return m


def _run(top, name, tmp_path, **kwargs):
    return run_sby(top, name, ports=top.ports, workdir=tmp_path / name, **kwargs)


def test_record_contract_by_induction(tmp_path):
    # Full-size decoder: each record is a descriptor or one fault class, held until taken.
    top = DecoderUnderProof(CubeConfig(), checks="contract", index_width=32)
    result = _run(top, "decoder_contract", tmp_path, mode="prove", depth=2)
    assert result.passed, result.log[-3000:]


@pytest.mark.slow
def test_all_checks_from_reset(tmp_path):
    # Long enough for a bundle, its commit and a C.BSTOP tracked through the pipeline.
    result = _run(DecoderUnderProof(), "decoder_bmc", tmp_path, mode="bmc",
                  depth=PROGRESS_BOUND + 4, timeout=7200)
    assert result.passed, result.log[-3000:]


@pytest.mark.slow
def test_covers_reach_descriptors_noops_and_faults(tmp_path):
    # The checks are not vacuous: the free inputs do produce every kind of record.
    result = _run(DecoderUnderProof(covers=True), "decoder_cover", tmp_path, mode="cover",
                  depth=16)
    assert result.passed, result.log[-3000:]


def test_a_false_property_is_refuted(tmp_path):
    result = _run(DecoderUnderProof(checks="contract", false_claim=True), "decoder_false",
                  tmp_path, mode="bmc", depth=8)
    assert result.status == "FAIL", result.log[-3000:]
