"""The hardware bundle decoder's figures: instructions per cycle, ECP5 resources and Fmax.

:func:`bench_decoder` decodes a long random stream of legal bundles (16- and 32-bit
instructions, the rate the decoder is built for) in simulation and checks every record against
the golden model, synthesizes the decoder alone for its ECP5 cell counts, and places and routes
it (:mod:`ptocube.build.pnr`) on an LFE5U-85F for its post-route Fmax over several nextpnr seeds.

For place and route the decoder sits in :class:`DecoderCore`, which adds a 24 x 16-bit register
file on its GPR read port (the read is combinational in the decoder's contract, so the path
through the register file counts) and flattens the ports, and that core sits behind
:class:`ptocube.build.pnr.PinLightWrapper`: every path measured is register to register.

The random bundle generator here (:func:`well_formed_bundle` and helpers, driven by the ISA
tables) is shared with ``tests/test_hdl_decoder.py``.
"""

import os
import random

from amaranth.hdl import Array, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..build.pnr import Device, PinLightWrapper, place_and_route
from ..build.synth import ecp5_resources
from ..hdl.decoder import BundleDecoder
from ..model import isa
from ..model.decode import decode_stream
from .harness import Drain, Feed, run_streams

__all__ = ["DEVICES", "FREQ_MHZ", "BSTOP", "C_BSTOP", "L_BSTOP", "FORMS_BY_ROLE", "random_word",
           "consistent_fpatr", "random_boundary", "well_formed_bundle", "legal_stream",
           "DecoderCore", "decoder_throughput", "decoder_fmax", "bench_decoder"]

#: The parts the Fmax figures are for: LFE5U-85F in CABGA381, speed grades 6 (the slowest)
#: and 8; the 150 MHz target is met with grade 8 (docs/decisions/hdl-decoder.md H15).
DEVICES = (Device("ecp5", "85k", "CABGA381", "6"), Device("ecp5", "85k", "CABGA381", "8"))
#: The clock constraint given to nextpnr (the decoder's target).
FREQ_MHZ = 150

BSTOP = (0x00000001, 32)
C_BSTOP = (0x0000, 16)
L_BSTOP = (0x000000010000000F, 64)


# ---------------------------------------------------------------------------
# Random bundles from the ISA tables
# ---------------------------------------------------------------------------

#: The forms of each role that a parcel stream can carry: BSTART.CALL's first parcel reads as a
#: 16-bit instruction under the length rule (R15), so the fused form never reaches the decoder.
FORMS_BY_ROLE = {role: [f for f in isa.FORMS if f.role is role and
                   isa.length_of(f.match & 0xFFFF) == f.length] for role in isa.Role}


def _legal_value(form, field, rng):
    """A random value of ``field`` that passes the form's constraints."""
    cons = [c for c in form.constraints if c.field == field.name]
    for _ in range(64):
        value = rng.getrandbits(field.width) & field.value_mask
        if all(c.holds(value) for c in cons):
            return value
    return next(c.values[0] for c in cons if c.op == "one-of")


def random_word(form, rng, legal=0.97, **fixed):
    """A word of ``form`` (one of its encodings) with random fields; ``fixed`` overrides.

    Each field is legal with probability ``legal``, else any value of its width.
    """
    encoding = rng.choice(form.encodings)
    word = encoding.match | (rng.getrandbits(form.length) & ~encoding.mask)
    for f in form.fields:
        if f.name in fixed:
            value = fixed[f.name]
        elif rng.random() < legal:
            value = _legal_value(form, f, rng)
        else:
            value = rng.getrandbits(f.width)
        for piece in f.pieces:
            bits = (value >> piece.value_lsb) & ((1 << piece.width) - 1)
            word &= ~(((1 << piece.width) - 1) << piece.instruction_lsb)
            word |= bits << piece.instruction_lsb
    # Field values must not break the fixed bits of the chosen encoding.
    word = (word & ~encoding.mask) | encoding.match
    return word, form.length


def consistent_fpatr(rng):
    """B.FPATR fields that pass the field-consistency rules."""
    row, group = rng.random() < 0.3, rng.random() < 0.3
    return {"RowMaxEn": row, "RowMaxInit": row and rng.random() < 0.5,
            "GroupMaxEn": group, "GroupNCode": rng.randint(1, 9) if group else 0,
            "MaxAbsEn": (row or group) and rng.random() < 0.5,
            "PreQuantMode": rng.choice(sorted(isa.PREQUANT_MODES)), "ReluMode": rng.randint(0, 3),
            "TransA": rng.random() < 0.2, "TransB": rng.random() < 0.2}


def random_boundary(rng):
    """A stop, a B.HINT TRACE, or nothing (the next bundle's start is the boundary)."""
    r = rng.random()
    if r < 0.35:
        return [BSTOP]
    if r < 0.55:
        return [C_BSTOP]
    if r < 0.65:
        return [L_BSTOP]
    if r < 0.68:
        return [random_word(FORMS_BY_ROLE[isa.Role.TRACE_START][0], rng)]
    return []


def well_formed_bundle(rng):
    """A bundle that follows the grammar (it may still fail the preflight's rules)."""
    timg2col = rng.random() < 0.2
    if timg2col:
        start = random_word(FORMS_BY_ROLE[isa.Role.TEPL_START][0], rng, Mode=3, Function=4)
    else:
        start = random_word(rng.choice(FORMS_BY_ROLE[isa.Role.MATRIX_START]), rng)
    header = []
    if rng.random() < 0.2:
        header.append(random_word(FORMS_BY_ROLE[isa.Role.CATR][0], rng, DR=0))
    if rng.random() < 0.2:
        header.append(random_word(FORMS_BY_ROLE[isa.Role.HINT][0], rng))
    if rng.random() < 0.5:
        header.append(random_word(FORMS_BY_ROLE[isa.Role.DATR][0], rng))
    if not timg2col:
        header.append(random_word(FORMS_BY_ROLE[isa.Role.FPATR][0], rng, **consistent_fpatr(rng)))
    for lb in range(3):
        if rng.random() < 0.6:
            if rng.random() < 0.5:
                header.append(random_word(FORMS_BY_ROLE[isa.Role.DIMI][0], rng, LoopNest=lb))
            else:
                form = next(f for f in FORMS_BY_ROLE[isa.Role.DIM] if isa.dim_lb_index(f) == lb)
                header.append(random_word(form, rng))
    rng.shuffle(header)
    mode = 0 if rng.random() < 0.1 else rng.choice([7, 7, 7, 1, 2, 5, 6])
    bindings = []
    if timg2col:
        form = isa.FORMS_BY_ID["b_iot_32_10db6db84f5d"]       # one source and a destination
        bindings.append(random_word(form, rng, PEMode=mode, L=1))
    else:
        tids = rng.sample(range(256), 4)
        for k in range(rng.choice([0, 0, 0, 1, 2])):
            bindings.append(random_word(FORMS_BY_ROLE[isa.Role.IOS][0], rng, SharedTID=tids[k],
                                        SizeCode=0, PEMode=mode))
        count = rng.randint(1, 4)
        for k in range(count):
            form = rng.choice(FORMS_BY_ROLE[isa.Role.IOT])
            bindings.append(random_word(form, rng, PEMode=mode, L=int(k == count - 1)))
    for _ in range(rng.choice([0, 0, 1])):
        zero = rng.choice(FORMS_BY_ROLE[isa.Role.IOT] + FORMS_BY_ROLE[isa.Role.IOS])
        bindings.insert(rng.randint(0, len(bindings)), random_word(zero, rng, PEMode=0))
    tail = []
    if rng.random() < 0.4:
        fixed = {"RegSrc2": 0, "RegDst": 0} if timg2col and rng.random() < 0.8 else {}
        tail.append(random_word(FORMS_BY_ROLE[isa.Role.IOR][0], rng, **fixed))
    return [start] + header + bindings + tail + random_boundary(rng)




def legal_stream(rng, instructions):
    """Well-formed bundles of 16- and 32-bit instructions only, ``instructions`` long."""
    words = []
    while len(words) < instructions:
        bundle = [w for w in well_formed_bundle(rng) if w[1] <= 32]
        words += bundle
    return words


# ---------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------

class DecoderCore(wiring.Component):
    """The decoder with a GPR register file on its read port and flat ports (for P&R).

    ``gpr_we``/``gpr_sel``/``gpr_data`` write GPR ``gpr_sel`` (1..23 hold values, 0 reads as
    zero); the decoder's stream payloads are plain bit vectors, so that
    :class:`PinLightWrapper` can drive and fold every port.
    """

    def __init__(self, decoder: BundleDecoder | None = None):
        self.decoder = BundleDecoder() if decoder is None else decoder
        dec = self.decoder
        super().__init__({
            "i_payload": In(len(dec.i.payload.as_value())), "i_valid": In(1), "i_ready": Out(1),
            "o_payload": Out(len(dec.o.payload.as_value())), "o_valid": Out(1), "o_ready": In(1),
            "squash": In(1), "gpr_read": Out(1),
            "gpr_we": In(1), "gpr_sel": In(5), "gpr_data": In(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = dec = self.decoder
        m.d.comb += [
            dec.i.payload.as_value().eq(self.i_payload), dec.i.valid.eq(self.i_valid),
            self.i_ready.eq(dec.i.ready),
            self.o_payload.eq(dec.o.payload.as_value()), self.o_valid.eq(dec.o.valid),
            dec.o.ready.eq(self.o_ready), dec.squash.eq(self.squash),
            self.gpr_read.eq(dec.gpr_read),
        ]
        gprs = [Signal(16, name=f"gpr{k}") for k in range(24)]
        for k, gpr in enumerate(gprs[1:], start=1):
            with m.If(self.gpr_we & (self.gpr_sel == k)):
                m.d.sync += gpr.eq(self.gpr_data)
        m.d.comb += dec.gpr_value.eq(Array(gprs + [Const(0, 16)] * 8)[dec.gpr_index])
        return m


def decoder_throughput(instructions: int = 5000, seed: int = 7) -> dict:
    """Instructions per cycle on one stream of legal 16/32-bit bundles, no stalls.

    The hardware's records are checked against the model's (bit for bit); a mismatch raises.
    """
    rng = random.Random(seed)
    words = legal_stream(rng, instructions)
    dut = BundleDecoder()
    layout = dut.record_layout
    expected = [layout.encode(r) for r in decode_stream(words)]
    parcels = isa.words_to_parcels(words)
    beats = [{"parcels": parcels[i:i + 2] + [0] * (2 - len(parcels[i:i + 2])),
              "count": len(parcels[i:i + 2]), "last": int(i + 2 >= len(parcels))}
             for i in range(0, len(parcels), 2)]
    result = run_streams(dut, feeds=[Feed(dut.i, beats)], drains=[Drain(dut.o, len(expected))],
                         max_cycles=4 * len(words) + 1000)
    if result.outputs[0] != expected or result.extra != [[]]:
        raise AssertionError("the decoder's records differ from the model's")
    return {"instructions": len(words), "records": len(expected), "cycles": result.cycles,
            "instructions_per_cycle": len(words) / result.cycles}


def decoder_fmax(seeds=range(1, 6), device: Device = DEVICES[0],
                 freq_mhz: float = FREQ_MHZ) -> list:
    """Post-route Fmax (MHz) of :class:`DecoderCore` on ``device`` for each nextpnr seed."""
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    return [place_and_route(PinLightWrapper(DecoderCore()), device, freq_mhz=freq_mhz,
                            seed=seed).min_fmax for seed in seeds]


def bench_decoder(synthesize: bool = True, seeds=range(1, 6), instructions: int = 5000) -> list:
    """The decoder's figures as rows: throughput, and with ``synthesize`` resources and Fmax.

    Throughput: instructions per cycle on ``instructions`` legal 16/32-bit instructions (see
    :func:`decoder_throughput`).  Resources: ``synth_ecp5`` cells of the decoder alone, default
    configuration.  Fmax: post-route at :data:`FREQ_MHZ` on each of :data:`DEVICES`, one row
    per nextpnr seed, and the minimum over the seeds.
    """
    t = decoder_throughput(instructions)
    rows = [{"figure": "instructions per cycle (legal 16/32-bit stream, bit-exact)",
             "value": f"{t['instructions_per_cycle']:.4f}",
             "detail": f"{t['instructions']} instructions, {t['records']} records in "
                       f"{t['cycles']} cycles"}]
    if not synthesize:
        return rows
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    cells = ecp5_resources(BundleDecoder(), "decoder")
    rows.append({"figure": "ECP5 cells, decoder alone (synth_ecp5)",
                 "value": f"{cells['LUT4']} LUT4, {cells['FF']} FF",
                 "detail": ", ".join(f"{n} {k}" for k, n in cells.items())})
    seeds = list(seeds)
    fmax = {device.speed: decoder_fmax(seeds, device) for device in DEVICES}
    grades = " / ".join(f"speed {device.speed}" for device in DEVICES)
    for k, seed in enumerate(seeds):
        rows.append({"figure": f"Fmax MHz, nextpnr seed {seed} ({grades})",
                     "value": " / ".join(f"{fmax[d.speed][k]:.2f}" for d in DEVICES),
                     "detail": f"LFE5U-85F CABGA381, post-route, constraint {FREQ_MHZ} MHz"})
    rows.append({"figure": f"Fmax MHz, minimum over the seeds ({grades})",
                 "value": " / ".join(f"{min(fmax[d.speed]):.2f}" for d in DEVICES),
                 "detail": "; ".join(f"speed {d.speed}: "
                                     f"{'met' if min(fmax[d.speed]) >= FREQ_MHZ else 'NOT met'}"
                                     for d in DEVICES)})
    return rows


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(bench_decoder(seeds=[int(a) for a in sys.argv[1:]] or range(1, 6)),
                     indent=2))
