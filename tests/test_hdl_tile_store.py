"""The tile store alone: host-port round trips, errors, placement, and the preflight's ports.

A model :class:`State` is loaded through the host port (:func:`ptocube.sim.host.load_state`);
then every preflight read port and the allocation inputs must answer what the preflight tests'
model store (``encode_tile``, ``tile_defined``, ...) answers, and every host read must return
what was written.
"""

import random

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, Value
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.host import (DESC_PART_UNDEFINED, FM_PARTS, HostCommand, HostError, HostOp,
                              SysReg, build_info, decode_response, encode_command, join_parts,
                              split_parts)
from ptocube.hdl.img2col import FEATURE_MAP_DESCRIPTOR
from ptocube.hdl.tile_desc import (OutputRole, SharedDescLayout, TileDescLayout, encode_shared,
                                   encode_tile, shared_defined, tile_defined)
from ptocube.hdl.tile_port import OperandDescLayout
from ptocube.hdl.tile_store import (IMPLICIT_CYCLES, StoreOp, TileStore, _implicit_flags,
                                    _thermometer)
from ptocube.model.datatype import DataType
from ptocube.model.layout import Layout
from ptocube.model.scenario import parse_scenario
from ptocube.model.state import SharedTile, Tile
from ptocube.sim.host import _flag_words, load_state, run_async, stream_request, tile_words

CONFIG = CubeConfig(tile_bytes_per_pe=8192, shared_bytes=4096)

STATE = parse_scenario({
    "name": "store",
    "gprs": {"a0": "0x603e800000", "R5": 7, "R23": -1},
    "status": ["NV", "UF"],
    "tile_capacity": 65536,
    "tiles": {
        "PE0": {"M": [{"dtype": "S8", "layout": "CUBE_M16",
                       "data": [[1, 2, 3, 4, 5, 6, 7, 8], [-1, -2, None, -4, -5, -6, -7, -8]]}]},
        "PE2": {"T": [None, {"dtype": "FP16", "layout": "CUBE_N8", "shape": [20, 9],
                             "fill": 1.5}]},
        "all": {"N": [{"dtype": "S8", "layout": "CUBE_N8",
                       "data": [[1, 0, 0, -1], [0, 1, 0, -1], [2, 0, 0, 127]]}],
                "U": [{"dtype": "U64", "data": [["0x123456789abcdef0", 5, 6]], "cols": 4},
                      {"dtype": "U8", "location": "Matrix", "cols": 8, "tsize": 256,
                       # Every word differs, some elements undefined: the element port's
                       # stall test reads it (``_element_reads``).
                       "data": [[None if (8 * r + c) % 13 == 5 else (8 * r + c) * 7 % 256
                                 for c in range(8)] for r in range(32)],
                       "feature_map": {"height": 2, "width": 3, "padding": 77}}]},
    },
    "shared": {"S9": {"dtype": "S32", "data": [[1, 2], [3, 4]], "cols": 4},
               "S200": {"dtype": "E8M0", "data": [["0x7f", None]], "initialized_mask": "1000",
                        "published": False}},
    "program": "BSTOP",
}).state


def _run(bench):
    """Simulate a TileStore with ``bench(ctx, store, transact)`` as the testbench."""
    store = TileStore(CONFIG)
    sim = Simulator(store)
    sim.add_clock(1e-8)

    async def transact(ctx, cmd):
        return decode_response(await stream_request(ctx, store.host_cmd, encode_command(cmd),
                                                    store.host_rsp))

    async def main(ctx):
        ctx.set(store.host_enable, 1)
        ctx.set(store.host_rsp.ready, 1)
        await bench(ctx, store, transact)

    sim.add_testbench(main)
    sim.run()


@pytest.fixture(scope="module")
def loaded():
    """Everything read back from a store loaded with STATE (host and preflight ports)."""
    out = {}

    async def bench(ctx, store, transact):
        await run_async(load_state(STATE, CONFIG), lambda cmd: transact(ctx, cmd))
        rd = {}
        for pe in range(4):
            for index in range(64):
                ctx.set(store.tile_rd.en, 1)
                ctx.set(store.tile_rd.pe, pe)
                ctx.set(store.tile_rd.index, index)
                await ctx.tick()
                ctx.set(store.tile_rd.en, 0)
                rd[pe, index] = (ctx.get(Value.cast(store.tile_rd.desc)),
                                 ctx.get(store.tile_rd.defined))
        out["tile_rd"] = rd
        srd = {}
        for sid in (0, 9, 200, 255):
            ctx.set(store.shared_rd.en, 1)
            ctx.set(store.shared_rd.sid, sid)
            await ctx.tick()
            ctx.set(store.shared_rd.en, 0)
            srd[sid] = (ctx.get(Value.cast(store.shared_rd.desc)), ctx.get(store.shared_rd.defined))
        out["shared_rd"] = srd
        words = {}
        for pe in range(4):
            # As the preflight does: the register's descriptor, then its words back to back
            # (the word port takes the base from that read, decision T11).
            ctx.set(store.tile_rd.en, 1)
            ctx.set(store.tile_rd.pe, pe)
            ctx.set(store.tile_rd.index, 16)                           # U#1
            await ctx.tick()
            ctx.set(store.tile_rd.en, 0)
            # Each word is answered two cycles after its read (decision T39).
            for addr in range(3):
                ctx.set(store.word_rd.en, 1)
                ctx.set(store.word_rd.pe, pe)
                ctx.set(store.word_rd.index, 16)
                ctx.set(store.word_rd.addr, addr)
                await ctx.tick()
                if addr:
                    words[pe, addr - 1] = ctx.get(store.word_rd.data)
            ctx.set(store.word_rd.en, 0)
            await ctx.tick()
            words[pe, 2] = ctx.get(store.word_rd.data)
        out["word_rd"] = words
        gprs = {}
        for number in range(24):
            ctx.set(store.gpr_rd.en, 1)
            ctx.set(store.gpr_rd.addr, number)
            await ctx.tick()
            ctx.set(store.gpr_rd.en, 0)
            gprs[number] = ctx.get(store.gpr_rd.data)
        out["gpr_rd"] = gprs
        low = {}
        for number in range(32):
            ctx.set(store.gpr_index, number)
            low[number] = ctx.get(store.gpr_value)
        out["gpr_value"] = low
        out["alloc"] = (ctx.get(store.alloc.allocated), ctx.get(store.alloc.capacity_in_use),
                        [ctx.get(store.alloc.pe_bytes_in_use[p]) for p in range(4)],
                        ctx.get(store.alloc.tile_capacity))
        host = {}
        for pe, index, tile in _tiles():
            host[pe, index, "words"] = [
                (await transact(ctx, HostCommand(HostOp.READ_WORD, pe, index, a))).data
                for a in range(tile.capacity // 8)]
            host[pe, index, "flags"] = [
                (await transact(ctx, HostCommand(HostOp.READ_FLAGS, pe, index, a))).data
                for a in range(tile.capacity // 128 * 4)]
            host[pe, index, "desc"] = [
                (await transact(ctx, HostCommand(HostOp.READ_DESC, pe, index, a))).data
                for a in range(4)]
        host["fm"] = [(await transact(ctx, HostCommand(HostOp.READ_FM, 1, 17, a))).data
                      for a in range(6)]
        host["gpr"] = [(await transact(ctx, HostCommand(HostOp.READ_GPR, index=n))).data
                       for n in range(24)]
        host["sys"] = [(await transact(ctx, HostCommand(HostOp.READ_SYS, addr=r.value))).data
                       for r in SysReg]
        out["host"] = host
        out["engine_desc"] = await _engine_lookups(ctx, store)
        reads = [(pe, host[pe, index, "desc"][2] * 16 + w)
                 for pe, index, tile in _tiles() for w in range(tile.capacity // 8)]
        out["engine_words"] = dict(zip(reads, await _engine_words(ctx, store, reads)))
        out["sources"] = {index: await _load_sources(ctx, store, index)
                          for index in (_ONLY_PE2, _WITH_FM)}
        # ``_load_sources`` leaves PE0's register _WITH_FM as the element port's source.
        out["elements"] = await _element_reads(ctx, store, STATE.tile(0, _WITH_FM).capacity)

    _run(bench)
    return out


#: A TileIndex only PE2 holds (a PE mix-up of the source read shows) and one with a feature
#: map on every PE.
_ONLY_PE2 = next(i for i in range(64) if STATE.tile(2, i) is not None
                 and all(STATE.tile(p, i) is None for p in (0, 1, 3)))
_WITH_FM = next(i for i in range(64) if STATE.tile(1, i) is not None
                and STATE.tile(1, i).feature_map is not None)


async def _engine_lookups(ctx, store):
    """Every loaded register and one empty one through the CUBE engine's ``desc_req``."""
    port = store.engine
    ctx.set(port.desc_rsp.ready, 1)
    answers = {}
    for pe, index, _ in [*_tiles(), (3, 63, None), (4, 255, None)]:
        req = port.desc_req.payload.shape().const({"space": pe, "index": index})
        answers[pe, index] = await stream_request(ctx, port.desc_req, req.as_bits(),
                                                  port.desc_rsp)
    return answers


async def _load_sources(ctx, store, index):
    """PLACE a plan with no outputs whose TIMG2COL source is ``index``, then ``src_load``
    each PE (PE3 first, so a load that does not happen shows): its ``src_desc`` and feature
    map (``src_fm`` after ``src_fm_read`` of every ``src_fm_part``, zero unless
    ``src_fm_set``, joined; ``src_load`` reads part 0), read again after ``src_pe`` moved on;
    a part holds until the next read."""

    def fm_part():
        return ctx.get(store.src_fm) if ctx.get(store.src_fm_set) else 0

    async def source():
        parts = []
        for part in range(FM_PARTS):
            ctx.set(store.src_fm_part, part)
            ctx.set(store.src_fm_read, 1)
            await ctx.tick()
            ctx.set(store.src_fm_read, 0)
            parts.append(fm_part())
            await ctx.tick()
            assert fm_part() == parts[-1]
        return ctx.get(Value.cast(store.src_desc)), join_parts(parts)

    ctx.set(store.plan.operands[9].index, index)
    for j in range(3):
        ctx.set(store.plan.outputs[j].role, OutputRole.NONE)
    ctx.set(store.req, StoreOp.PLACE)
    ctx.set(store.req_valid, 1)
    while not (await ctx.tick().sample(store.req_done))[2]:
        ctx.set(store.req_valid, 0)
    sources = {}
    for p in reversed(range(4)):
        ctx.set(store.src_pe, p)
        ctx.set(store.src_fm_part, 0)
        ctx.set(store.src_load, 1)
        await ctx.tick()
        ctx.set(store.src_load, 0)
        first_part = fm_part()                      # src_load reads a part too
        ctx.set(store.src_pe, (p + 1) % 4)
        loaded = await source()
        assert first_part == loaded[1] & ((1 << 64) - 1), (index, p)
        for _ in range(3):
            await ctx.tick()
            assert await source() == loaded, (index, p)
        sources[p] = loaded
    return [sources[p] for p in range(4)]


async def _stalled_reads(ctx, req, rsp, requests, seed):
    """Offer ``requests`` (each a function that sets ``req.payload``) back to back on the
    stream ``req``, with gaps, and take the answers on ``rsp`` with ``ready`` low at random:
    a stalled answer must hold, and the reads behind it must wait (decision T39)."""
    rng = random.Random(seed)
    answers, todo = [], list(requests)
    while len(answers) < len(requests):
        offer = bool(todo) and rng.random() < 0.8
        if offer:
            todo[0]()
        take = rng.random() < 0.5
        ctx.set(req.valid, offer)
        ctx.set(rsp.ready, take)
        *_, req_ready, rsp_valid, rsp_bits = await ctx.tick().sample(
            req.ready, rsp.valid, Value.cast(rsp.payload))
        if offer and req_ready:
            todo.pop(0)
        if rsp_valid and take:
            answers.append(rsp_bits)
    ctx.set(req.valid, 0)
    return answers


async def _engine_words(ctx, store, reads):
    """The payload words ``reads`` ((space, word address) pairs) through the CUBE engine's
    ``mem_req`` / ``mem_rsp``, its answers stalled at random."""
    port = store.engine

    def request(space, addr):
        def offer():
            ctx.set(port.mem_req.payload.space, space)
            ctx.set(port.mem_req.payload.addr, addr)
        return offer

    return await _stalled_reads(ctx, port.mem_req, port.mem_rsp,
                                [request(*r) for r in reads], seed=3)


async def _element_reads(ctx, store, count):
    """Source elements 0..count-1 through the TIMG2COL element port (``src_req`` /
    ``src_rsp``, byte elements: the plan's type is 0), in a shuffled order so that the
    reads in flight come from different words, its answers stalled at random; as
    ``(data, defined)`` pairs in element order."""
    port = store.i2c
    order = random.Random(5).sample(range(count), count)

    def request(index):
        def offer():
            ctx.set(port.src_req.payload, index)
        return offer

    answers = await _stalled_reads(ctx, port.src_req, port.src_rsp,
                                   [request(q) for q in order], seed=4)
    layout = port.src_rsp.payload.shape()
    # The answer is the word from the element's byte on; the engine cuts it to the type.
    by_index = {q: (layout.from_bits(bits).data & 0xFF, layout.from_bits(bits).defined)
                for q, bits in zip(order, answers)}
    return [by_index[q] for q in range(count)]


def _tiles():
    for pe in range(4):
        for index, tile in enumerate(STATE.pes[pe].tiles):
            if tile is not None:
                yield pe, index, tile
    for sid, shared in STATE.shared.items():
        yield 4, sid, shared.tile


def test_tile_read_port_matches_model(loaded):
    for (pe, index), (desc, defined) in loaded["tile_rd"].items():
        tile = STATE.tile(pe, index)
        assert desc == encode_tile(tile), (pe, index)
        assert defined == tile_defined(tile), (pe, index)
    # The undefined element of PE0 M#1 makes it not defined; the others are.
    assert loaded["tile_rd"][0, 32][1] == 0 and loaded["tile_rd"][1, 48][1] == 1


def test_shared_read_port_matches_model(loaded):
    for sid, (desc, defined) in loaded["shared_rd"].items():
        shared = STATE.shared.get(sid)
        assert desc == encode_shared(shared) and defined == shared_defined(shared), sid


def test_word_and_gpr_ports_and_allocation(loaded):
    for (pe, addr), word in loaded["word_rd"].items():
        assert word == tile_words(STATE.tile(pe, 16))[addr]
    assert loaded["gpr_rd"] == {n: STATE.read_gpr(n) for n in range(24)}
    # The decoder's combinational port: GPR[15:0], zero past the last GPR.
    assert loaded["gpr_value"] == {n: STATE.read_gpr(n) & 0xFFFF if n < 24 else 0
                                   for n in range(32)}
    allocated, in_use, pe_bytes, capacity = loaded["alloc"]
    assert allocated == sum(1 << i for i in range(64) if STATE.index_allocated(i))
    assert in_use == STATE.capacity_in_use()
    assert pe_bytes == [sum(t.capacity for t in pe.tiles if t is not None) for pe in STATE.pes]
    assert capacity == STATE.tile_capacity


def test_host_reads_return_what_was_loaded(loaded):
    host = loaded["host"]
    for pe, index, tile in _tiles():
        assert host[pe, index, "words"] == tile_words(tile)
        flags = _flag_words(tile)[:tile.capacity // 128 * 4]
        assert host[pe, index, "flags"][:len(flags)] == flags
        assert not any(host[pe, index, "flags"][len(flags):])
        desc = encode_tile(tile) if pe < 4 else encode_shared(STATE.shared[index])
        assert join_parts(host[pe, index, "desc"][:2]) == desc
        assert host[pe, index, "desc"][3] == int((~tile.defined_valid()).sum())
    fm = STATE.tile(1, 17).feature_map
    assert join_parts(host["fm"]) == FEATURE_MAP_DESCRIPTOR.encode(fm)
    assert host["gpr"] == [STATE.read_gpr(n) for n in range(24)]
    assert host["sys"] == [STATE.tile_capacity, STATE.flags, STATE.capacity_in_use(),
                           sum(1 << i for i in range(64) if STATE.index_allocated(i)),
                           build_info(CONFIG)]


def test_engine_descriptor_lookups(loaded):
    """The TilePort's descriptor answers are the registers' descriptors and bases; an empty
    register (and a Shared one not published) answers not allocated."""
    layout = OperandDescLayout(CONFIG)
    answers = {k: layout.from_bits(v) for k, v in loaded["engine_desc"].items()}
    for pe, index, tile in _tiles():
        if pe < 4:
            desc = TileDescLayout.from_bits(encode_tile(tile))
            allocated = desc.allocated
        else:
            desc = SharedDescLayout.from_bits(encode_shared(STATE.shared[index]))
            allocated = desc.published and desc.allocation_mask != 0
        got = answers[pe, index]
        assert got.allocated == allocated, (pe, index)
        for field in ("dtype", "layout", "cells", "valid_rows", "valid_cols", "phys_cols"):
            assert got[field] == desc[field], (pe, index, field)
        assert got.base == loaded["host"][pe, index, "desc"][2], (pe, index)
    assert not answers[3, 63].allocated and not answers[4, 255].allocated
    assert not answers[4, 200].allocated                      # not published


def test_engine_payload_reads_under_stalls(loaded):
    """The CUBE engine's payload reads return every loaded word, in order, while its answers
    stall at random (a stalled answer holds, the reads behind it wait)."""
    for pe, index, tile in _tiles():
        base = loaded["host"][pe, index, "desc"][2] * 16
        got = [loaded["engine_words"][pe, base + w] for w in range(tile.capacity // 8)]
        assert got == tile_words(tile), (pe, index)


def test_element_reads_under_stalls(loaded):
    """The TIMG2COL element port returns each byte of its source and the byte's flag, in
    order, while its answers stall at random."""
    tile = STATE.tile(0, _WITH_FM)
    payload = np.asarray(tile.payload, dtype=np.uint8)[:tile.capacity]
    defined = np.zeros(tile.capacity, dtype=bool)
    defined[:tile.defined.size] = tile.defined.ravel()
    assert loaded["elements"] == [(int(b), int(d)) for b, d in zip(payload, defined)]
    assert not all(defined[:tile.defined.size])         # an undefined element is read too


def test_src_load_reads_every_source(loaded):
    """``src_load`` shows each PE's TIMG2COL source register and feature map."""
    for index, per_pe in loaded["sources"].items():
        for pe, (desc, fm) in enumerate(per_pe):
            tile = STATE.tile(pe, index)
            assert desc == encode_tile(tile), (index, pe)
            expected = 0 if tile is None or tile.feature_map is None else \
                FEATURE_MAP_DESCRIPTOR.encode(tile.feature_map)
            assert fm == expected, (index, pe)
    assert any(d for d, _ in loaded["sources"][_ONLY_PE2])
    assert all(fm for _, fm in loaded["sources"][_WITH_FM])


def test_payloads_do_not_overlap(loaded):
    """First fit: every register's CELLs are its own."""
    used = {}
    for pe, index, tile in _tiles():
        base = loaded["host"][pe, index, "desc"][2]
        for cell in range(base, base + tile.capacity // 128):
            assert (pe, cell) not in used, (pe, index, used.get((pe, cell)))
            used[pe, cell] = index


def test_host_errors_and_replacement():
    """Each refused command changes nothing and names its reason; FREE then CONFIGURE reuses
    the first fitting hole."""
    results = {}
    one = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1]], 1024)
    big = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1]], 8192)

    async def stage(ctx, transact, bits):
        for part, word in enumerate(split_parts(bits, 2)):
            assert (await transact(ctx, HostCommand(HostOp.DESC_PART, addr=part, data=word))).ok

    async def bench(ctx, store, transact):
        async def do(name, cmd):
            results[name] = await transact(ctx, cmd)
        await stage(ctx, transact, encode_tile(one))
        await do("cfg_a", HostCommand(HostOp.CONFIGURE, 1, 3))
        await do("cfg_b", HostCommand(HostOp.CONFIGURE, 1, 4))
        await do("again", HostCommand(HostOp.CONFIGURE, 1, 3))
        await do("bad_space", HostCommand(HostOp.READ_WORD, 6, 3))
        await do("bad_index", HostCommand(HostOp.READ_WORD, 1, 64))
        await do("bad_gpr", HostCommand(HostOp.WRITE_GPR, index=0, data=1))
        await do("bad_op", HostCommand(20))
        await do("empty", HostCommand(HostOp.READ_WORD, 1, 5))
        await do("range_word", HostCommand(HostOp.READ_WORD, 1, 3, 128))
        await do("range_flags", HostCommand(HostOp.WRITE_FLAGS, 1, 3, 32))
        await do("fm_shared", HostCommand(HostOp.READ_FM, 4, 3))
        await do("read_only", HostCommand(HostOp.WRITE_SYS, addr=SysReg.BUILD.value))
        await do("free_a", HostCommand(HostOp.FREE, 1, 3))
        await do("free_empty", HostCommand(HostOp.FREE, 1, 3))
        await do("cfg_c", HostCommand(HostOp.CONFIGURE, 1, 5))      # reuses A's hole
        await stage(ctx, transact, encode_tile(big))
        await do("too_big", HostCommand(HostOp.CONFIGURE, 1, 6))    # 8 KiB, 6 KiB free
        await stage(ctx, transact, 0)
        await do("bad_desc", HostCommand(HostOp.CONFIGURE, 1, 6))
        await do("in_use", HostCommand(HostOp.READ_SYS, addr=SysReg.CAPACITY_IN_USE.value))
        # Each address check at its bound: the first address past it is refused.
        await do("range_part", HostCommand(HostOp.DESC_PART, addr=2, data=1))
        await do("range_desc", HostCommand(HostOp.READ_DESC, 1, 5, DESC_PART_UNDEFINED + 1))
        await do("range_sys", HostCommand(HostOp.READ_SYS, addr=len(SysReg)))
        await do("range_fm", HostCommand(HostOp.WRITE_FM, 1, 5, FM_PARTS, 1))
        await do("last_fm", HostCommand(HostOp.READ_FM, 1, 5, FM_PARTS - 1))

    _run(bench)
    assert results["cfg_a"].ok and results["cfg_a"].data == 0
    assert results["cfg_b"].data == 8 and results["cfg_c"].ok and results["cfg_c"].data == 0
    expected = {"again": HostError.ALLOCATED, "bad_space": HostError.BAD_SPACE,
                "bad_index": HostError.BAD_INDEX, "bad_gpr": HostError.BAD_INDEX,
                "bad_op": HostError.BAD_OP, "empty": HostError.NOT_ALLOCATED,
                "range_word": HostError.OUT_OF_RANGE, "range_flags": HostError.OUT_OF_RANGE,
                "fm_shared": HostError.BAD_SPACE, "read_only": HostError.READ_ONLY,
                "free_empty": HostError.NOT_ALLOCATED, "too_big": HostError.NO_SPACE,
                "bad_desc": HostError.BAD_DESCRIPTOR, "range_part": HostError.OUT_OF_RANGE,
                "range_desc": HostError.OUT_OF_RANGE, "range_sys": HostError.BAD_INDEX,
                "range_fm": HostError.OUT_OF_RANGE}
    assert {k: results[k].error for k in expected} == expected
    assert results["free_a"].ok and results["in_use"].data == 2048
    assert results["last_fm"].ok


def test_feature_map_parts_are_written_alone():
    """WRITE_FM writes its 64-bit part and keeps the others (each part is a write lane of
    the feature-map memory); the parts read back cut to the descriptor's width; FREE and a
    new CONFIGURE clear the whole descriptor."""
    rng = random.Random(15)
    first = [rng.getrandbits(64) for _ in range(FM_PARTS)]
    second = rng.getrandbits(64)
    one = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1]], 1024)
    reads = {}

    async def bench(ctx, store, transact):
        async def read_all():
            return [(await transact(ctx, HostCommand(HostOp.READ_FM, 2, 9, a))).data
                    for a in range(FM_PARTS)]
        for part, word in enumerate(split_parts(encode_tile(one), 2)):
            await transact(ctx, HostCommand(HostOp.DESC_PART, addr=part, data=word))
        assert (await transact(ctx, HostCommand(HostOp.CONFIGURE, 2, 9))).ok
        reads["new"] = await read_all()
        for part, word in enumerate(first):
            assert (await transact(ctx, HostCommand(HostOp.WRITE_FM, 2, 9, part, word))).ok
        reads["first"] = await read_all()
        await transact(ctx, HostCommand(HostOp.WRITE_FM, 2, 9, 2, second))
        reads["second"] = await read_all()
        await transact(ctx, HostCommand(HostOp.FREE, 2, 9))
        await transact(ctx, HostCommand(HostOp.CONFIGURE, 2, 9))
        reads["again"] = await read_all()

    _run(bench)
    width = FEATURE_MAP_DESCRIPTOR.size
    cut = [w & ((1 << max(0, min(64, width - 64 * k))) - 1) for k, w in enumerate(first)]
    assert reads["new"] == [0] * FM_PARTS and reads["again"] == [0] * FM_PARTS
    assert reads["first"] == cut and cut[-1] != first[-1]
    assert reads["second"] == cut[:2] + [second] + cut[3:]


def test_writes_are_read_at_once():
    """Every register-file write is seen by a read of the same entry in the first cycle an
    agent may read after it (decision T27): the next host command, or a preflight read the
    cycle after the response."""
    one = Tile.from_raw(DataType.S8, Layout.ROW_MAJOR, [[1, 2], [3, 4]], 1024)
    shared = encode_shared(SharedTile(Tile.from_raw(DataType.S32, Layout.ROW_MAJOR, [[1]], 1024)))
    seen = {}

    async def bench(ctx, store, transact):
        async def tile_rd(pe, index):
            ctx.set(store.tile_rd.en, 1)
            ctx.set(store.tile_rd.pe, pe)
            ctx.set(store.tile_rd.index, index)
            await ctx.tick()
            ctx.set(store.tile_rd.en, 0)
            return ctx.get(store.tile_rd.desc.allocated), ctx.get(store.tile_rd.defined)

        async def shared_rd(sid):
            ctx.set(store.shared_rd.en, 1)
            ctx.set(store.shared_rd.sid, sid)
            await ctx.tick()
            ctx.set(store.shared_rd.en, 0)
            return ctx.get(store.shared_rd.defined)

        async def do(cmd):
            rsp = await transact(ctx, cmd)
            assert rsp.ok, (cmd, rsp)
            return rsp.data

        for part, word in enumerate(split_parts(encode_tile(one), 2)):
            await do(HostCommand(HostOp.DESC_PART, addr=part, data=word))
        await do(HostCommand(HostOp.CONFIGURE, 1, 3))
        seen["configured"] = await tile_rd(1, 3)
        await do(HostCommand(HostOp.SET_UNDEFINED, 1, 3, data=0))
        seen["defined"] = await tile_rd(1, 3)
        await do(HostCommand(HostOp.SET_UNDEFINED, 1, 3, data=3))
        seen["undef"] = await do(HostCommand(HostOp.READ_DESC, 1, 3, 3))
        await do(HostCommand(HostOp.WRITE_FM, 1, 3, 2, 0x1234))
        seen["fm"] = await do(HostCommand(HostOp.READ_FM, 1, 3, 2))
        await do(HostCommand(HostOp.WRITE_FLAGS, 1, 3, 1, 0xF0))
        seen["flags"] = await do(HostCommand(HostOp.READ_FLAGS, 1, 3, 1))
        await do(HostCommand(HostOp.WRITE_GPR, index=7, data=0x55))
        seen["gpr"] = await do(HostCommand(HostOp.READ_GPR, index=7))
        await do(HostCommand(HostOp.FREE, 1, 3))
        seen["freed"] = await tile_rd(1, 3)
        for part, word in enumerate(split_parts(shared, 2)):
            await do(HostCommand(HostOp.DESC_PART, addr=part, data=word))
        await do(HostCommand(HostOp.CONFIGURE, 4, 7))
        await do(HostCommand(HostOp.SET_UNDEFINED, 4, 7, data=0))
        seen["shared"] = await shared_rd(7)
        await do(HostCommand(HostOp.FREE, 4, 7))
        seen["shared_freed"] = await do(HostCommand(HostOp.READ_DESC, 4, 7, 0))

    _run(bench)
    assert seen["configured"] == (1, 0) and seen["defined"] == (1, 1)
    assert seen["undef"] == 3 and seen["fm"] == 0x1234 and seen["flags"] == 0xF0
    assert seen["gpr"] == 0x55 and seen["freed"] == (0, 0)
    assert seen["shared"] == 1 and seen["shared_freed"] == 0


# ---------------------------------------------------------------------------
# The store's thermometer codes and implicit flags (decision T14), exhaustively
# ---------------------------------------------------------------------------

def _simulate_comb(build, cases):
    """Run ``build(m)`` -> (inputs, outputs) over ``cases`` (input values); returns the
    output values of each case."""
    m = Module()
    inputs, outputs = build(m)
    seen = []

    async def bench(ctx):
        for case in cases:
            for signal, value in zip(inputs, case):
                ctx.set(signal, value)
            seen.append([ctx.get(o) for o in outputs])

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return seen


@pytest.mark.parametrize("bits,width", [(8, 128), (7, 64), (5, 20)])
def test_thermometer_every_value(bits, width):
    value = Signal(bits)
    got = _simulate_comb(lambda m: ([value], [_thermometer(m, value, width, "t")]),
                         [(v,) for v in range(1 << bits)])
    assert [g[0] for g in got] == [(1 << min(v, width)) - 1 for v in range(1 << bits)]


def test_implicit_flags_match_the_slot_formula():
    """Bit i of flag word w of a row-major tile with 2**k physical columns and a rows x cols
    valid region: slot s = 64 w + i is defined when s >> k < rows and s & (2**k - 1) < cols,
    IMPLICIT_CYCLES after the inputs."""
    word, phys_cols, pc_mask = Signal(10), Signal(16), Signal(16)
    rows, cols = Signal(16), Signal(16)
    m = Module()
    flags = _implicit_flags(m, word, phys_cols, pc_mask, rows, cols, "w")

    rng = np.random.default_rng(14)
    cases = []
    for k in range(0, 10):
        for _ in range(40):
            pc = 1 << k
            r, c = int(rng.integers(0, 70)), int(rng.integers(0, pc + 1))
            last = max(1, (r * pc + 63) // 64)
            cases.append((int(rng.integers(0, last + 2)), k, r, c))
        cases += [(0, k, 1, 1 << k), (0, k, 0, 1 << k), (3, k, 70, 1)]
    got = []

    async def bench(ctx):
        for w, k, r, c in cases:
            for signal, value in ((word, w), (phys_cols, 1 << k), (pc_mask, (1 << k) - 1),
                                  (rows, r), (cols, c)):
                ctx.set(signal, value)
            await ctx.tick().repeat(IMPLICIT_CYCLES)
            got.append(ctx.get(flags))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for (w, k, r, c), value in zip(cases, got):
        expected = sum(1 << i for i in range(64)
                       if ((64 * w + i) >> k) < r and ((64 * w + i) & ((1 << k) - 1)) < c)
        assert value == expected, (w, k, r, c)
