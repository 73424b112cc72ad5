"""A testbench tile store for :class:`~ptocube.hdl.cube.CubeEngine`, driven from model objects.

:func:`run_engine` places a model :class:`~ptocube.model.state.State` into 64-bit payload
memories (one per PE and one Shared, like the real store): every Local tile of the PEs and
every Shared tile gets a base CELL, its payload is copied in word by word (the model's
``layout`` packing, little-endian within a word), and each output register of the plan gets
a fresh region.  Everything else - free memory and the output regions - holds random
garbage, so an engine that skips a padding word or reads outside an operand is caught.

The store then serves the engine's :class:`~ptocube.hdl.tile_port.TilePortSignature`:
descriptors one cycle after the request, payload reads in order after ``latency`` cycles
(one word per cycle), and writes (optionally stalled at random), recording each of them.
:func:`check_against_model` compares every output word with
:func:`ptocube.model.execute.execute_matrix`, whole CELLs / rows including padding, and the
flags.
"""

import time
from dataclasses import dataclass, field

import numpy as np
from amaranth.sim import Simulator

from ptocube.hdl.cube import CubeEngine
from ptocube.hdl.tile_desc import PlanLayout
from ptocube.hdl.tile_port import MemSpace, OperandDescLayout
from ptocube.model.execute import execute_matrix
from ptocube.model.layout import CELL_BYTES, Layout
from ptocube.model.preflight import MatrixPlan
from ptocube.model.state import State

__all__ = ["StoreImage", "EngineRun", "place", "run_engine", "check_against_model"]

SHARED = MemSpace.SHARED.value


def _pack(layout, values: dict) -> int:
    """The bit pattern of a flat ``lib.data`` struct from a dict (missing fields 0)."""
    word = 0
    for name, member in layout:
        if name in values:
            word |= (int(values[name]) & ((1 << member.width) - 1)) << member.offset
    return word


@dataclass
class StoreImage:
    """Payload memories (byte arrays by space), the base CELL of every tile, output bases."""
    memories: dict                  # space -> np.uint8 array
    local_bases: dict               # (pe, index) -> base CELL
    shared_bases: dict              # sid -> base CELL
    out_bases: dict                 # (pe, entry) -> base CELL
    out_regions: dict               # (pe, entry) -> (start byte, length in bytes)


def place(state: State, plan: MatrixPlan, config, rng) -> StoreImage:
    """Lay out ``state``'s tiles and the plan's outputs in memories full of garbage."""
    memories = {pe: rng.integers(0, 256, config.tile_bytes_per_pe, dtype=np.uint8)
                for pe in range(4)}
    memories[SHARED] = rng.integers(0, 256, config.shared_bytes, dtype=np.uint8)
    local, shared, outs, regions = {}, {}, {}, {}
    for pe in range(4):
        cursor = int(rng.integers(0, 3))
        for index, tile in enumerate(state.pes[pe].tiles):
            if tile is None:
                continue
            local[(pe, index)] = cursor
            start = cursor * CELL_BYTES
            memories[pe][start:start + tile.capacity] = tile.payload
            cursor += tile.capacity // CELL_BYTES + int(rng.integers(0, 2))
        for entry, output in enumerate(plan.outputs.get(pe, ())):
            outs[(pe, entry)] = cursor
            regions[(pe, entry)] = (cursor * CELL_BYTES, output.capacity)
            cursor += output.capacity // CELL_BYTES + int(rng.integers(0, 2))
        if cursor * CELL_BYTES > config.tile_bytes_per_pe:
            raise ValueError(f"PE{pe}'s tiles do not fit {config.tile_bytes_per_pe} B")
    cursor = 0
    for sid, entry in sorted(state.shared.items()):
        shared[sid] = cursor
        start = cursor * CELL_BYTES
        memories[SHARED][start:start + entry.tile.capacity] = entry.tile.payload
        cursor += entry.tile.capacity // CELL_BYTES + int(rng.integers(0, 2))
    if cursor * CELL_BYTES > config.shared_bytes:
        raise ValueError("the Shared tiles do not fit the Shared memory")
    return StoreImage(memories, local, shared, outs, regions)


@dataclass
class EngineRun:
    """What one simulated execution produced."""
    image: StoreImage
    flags: int
    commit: int
    fault: int
    cycles: int                     # start to done
    reads: int
    writes: list = field(default_factory=list)   # (space, byte address, data, mask)
    cpu_s: float = 0.0


def _descriptor(layout, tile, base: int) -> int:
    return _pack(layout, {
        "allocated": 1, "dtype": tile.dtype.value, "layout": tile.layout.value,
        "cells": tile.capacity // CELL_BYTES, "valid_rows": tile.valid_rows,
        "valid_cols": tile.valid_cols,
        "phys_cols": tile.phys_cols if tile.layout is Layout.ROW_MAJOR else 0, "base": base})


def run_engine(engine: CubeEngine, jobs, *, latency: int = 1, write_stall: float = 0.0,
               seed: int = 0, max_cycles: int = 2_000_000) -> list:
    """Simulate ``engine`` on ``jobs`` (``(state, plan)`` pairs) one after the other, from
    reset, and return one :class:`EngineRun` per job."""
    config = engine.config
    rng = np.random.default_rng(seed)
    images = [place(state, plan, config, rng) for state, plan in jobs]
    plans = PlanLayout(config)
    desc_layout = OperandDescLayout(config)
    port = engine.tile
    results = []

    async def bench(ctx):
        ctx.set(port.mem_wr.ready, 1)
        ctx.set(port.desc_req.ready, 1)
        ctx.set(port.mem_req.ready, 1)
        for (state, plan), image in zip(jobs, images):
            mem = image.memories
            ctx.set(engine.plan.as_value(), plans.encode(plan))
            bases = 0
            width = len(engine.out_base[0][0])
            for (pe, entry), base in image.out_bases.items():
                bases |= base << (width * (3 * pe + entry))
            ctx.set(engine.out_base.as_value(), bases)
            ctx.set(engine.rmode, plan.bundle.rmode)
            ctx.set(engine.sat, int(plan.bundle.sat))
            ctx.set(engine.start, 1)
            await ctx.tick()
            ctx.set(engine.start, 0)
            run = EngineRun(image, 0, 0, 0, 0, 0)
            desc_pending = None
            pending = []                        # [ready_cycle, word]
            rsp_on = None
            wr_ready = True
            cycle = 0
            levels = {}

            def level(signal, value):
                if levels.get(id(signal)) != value:
                    ctx.set(signal, value)
                    levels[id(signal)] = value

            while True:
                cycle += 1
                if cycle > max_cycles:
                    raise RuntimeError(f"the engine did not finish within {max_cycles} cycles")
                # Responses on offer this cycle.
                level(port.desc_rsp.valid, desc_pending is not None)
                if desc_pending is not None:
                    level(port.desc_rsp.payload.as_value(), desc_pending)
                if rsp_on is None and pending and pending[0][0] <= cycle:
                    rsp_on = pending.pop(0)[1]
                level(port.mem_rsp.valid, rsp_on is not None)
                if rsp_on is not None:
                    level(port.mem_rsp.payload, rsp_on)
                if write_stall:
                    wr_ready = bool(rng.random() >= write_stall)
                    level(port.mem_wr.ready, wr_ready)
                (_, _, d_req_v, d_req, d_rsp_r, m_req_v, m_req_r, m_req, m_rsp_r, w_v, w,
                 done, commit, fault, flags) = await ctx.tick().sample(
                    port.desc_req.valid, port.desc_req.payload.as_value(),
                    port.desc_rsp.ready, port.mem_req.valid, port.mem_req.ready,
                    port.mem_req.payload.as_value(), port.mem_rsp.ready, port.mem_wr.valid,
                    port.mem_wr.payload.as_value(), engine.done, engine.commit, engine.fault,
                    engine.flags)
                if desc_pending is not None and d_rsp_r:
                    desc_pending = None
                if d_req_v and desc_pending is None:
                    space, index = d_req & 0x7, (d_req >> 3) & 0xFF
                    if space == SHARED:
                        tile, base = state.shared[index].tile, image.shared_bases[index]
                    else:
                        tile, base = state.tile(space, index), image.local_bases[(space, index)]
                    desc_pending = _descriptor(desc_layout, tile, base)
                if rsp_on is not None and m_rsp_r:
                    rsp_on = None
                if m_req_v and m_req_r:
                    space, addr = m_req & 0x7, m_req >> 3
                    word = int.from_bytes(mem[space][8 * addr:8 * addr + 8].tobytes(), "little")
                    pending.append([cycle + latency, word])
                    run.reads += 1
                if w_v and wr_ready:
                    layout = port.mem_wr.payload.shape()
                    space = w & 0x7
                    addr = (w >> layout["addr"].offset) & ((1 << layout["addr"].width) - 1)
                    wdata = (w >> layout["data"].offset) & ((1 << 64) - 1)
                    wmask = (w >> layout["mask"].offset) & 0xFF
                    run.writes.append((space, 8 * addr, wdata, wmask))
                    for b in range(8):
                        if wmask >> b & 1:
                            mem[space][8 * addr + b] = (wdata >> (8 * b)) & 0xFF
                if done:
                    run.flags, run.commit, run.fault, run.cycles = flags, commit, fault, cycle
                    break
            results.append(run)

    sim = Simulator(engine)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    start = time.process_time()
    sim.run()
    cpu = time.process_time() - start
    for run in results:
        run.cpu_s = cpu / len(results)
    return results


def _output_extent(output) -> int:
    """Bytes of an output the engine defines: D's CELLs, or the row-major rows (whole words)."""
    if output.layout.is_cube:
        from ptocube.model.layout import cube_geometry
        return cube_geometry(output.layout, output.dtype, output.valid_rows,
                             output.valid_cols).cells * CELL_BYTES
    row_bytes = output.phys_cols * output.dtype.bits // 8
    return -(-output.valid_rows * row_bytes // 8) * 8


def check_against_model(state: State, plan: MatrixPlan, run: EngineRun) -> None:
    """Assert that ``run`` wrote exactly the model's output payloads and flags."""
    tiles, flags = execute_matrix(plan, state)
    assert run.commit == 1 and run.fault == 0, (run.commit, run.fault)
    assert run.flags == flags, f"flags {run.flags:05b}, model {flags:05b}"
    expected = {}
    for pe, index, tile in tiles:
        entry = [o.index for o in plan.outputs[pe]].index(index)
        expected[(pe, entry)] = tile
    for (pe, entry), tile in expected.items():
        start, capacity = run.image.out_regions[(pe, entry)]
        extent = _output_extent(plan.outputs[pe][entry])
        got = run.image.memories[pe][start:start + extent]
        want = tile.payload[:extent]
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            raise AssertionError(
                f"PE{pe} {plan.outputs[pe][entry].role}: byte {bad} (word {bad // 8}) is "
                f"{got[bad]:#04x}, model {want[bad]:#04x}; word "
                f"{bytes(got[bad // 8 * 8:bad // 8 * 8 + 8]).hex()} vs "
                f"{bytes(want[bad // 8 * 8:bad // 8 * 8 + 8]).hex()}")
    regions = {(pe, start, start + cap) for (pe, _), (start, cap) in run.image.out_regions.items()}
    for space, addr, _, _ in run.writes:
        assert any(space == pe and lo <= addr < hi for pe, lo, hi in regions), \
            f"write outside the output registers: space {space}, byte {addr}"
