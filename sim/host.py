"""Host-side driver of the CUBE unit's host port, independent of any simulator.

The driver speaks :mod:`ptocube.hdl.host` through *generators*: each operation is a
generator that yields :class:`~ptocube.hdl.host.HostCommand` objects and receives the
matching :class:`~ptocube.hdl.host.HostResponse` from whoever runs it (the Amaranth
simulator in :mod:`ptocube.sim.hw_run`, a Verilator harness, a plain function in tests)::

    gen = load_state(state, config)
    rsp = None
    while True:
        try:
            cmd = gen.send(rsp)
        except StopIteration:
            break
        rsp = transact(cmd)

:func:`run_sync` does exactly that for a synchronous ``transact``.

* :func:`load_state` puts a model :class:`~ptocube.model.state.State` into the unit: GPRs,
  ``tile_capacity``, sticky flags, every Local and Shared register (descriptor, payload
  words, definedness flags, undefined count, feature-map descriptor).  A register that the
  build's memory cannot hold raises :class:`DoesNotFit`.
* :func:`read_tile` reads one register back as the result record of ``ptocube run --json``.
* :func:`read_status` reads the sticky status flags.
* :func:`clear_state` frees every register, so the next :func:`load_state` starts clean.
"""

import numpy as np
from amaranth.hdl import Value
from amaranth.lib import data

from ..hdl.host import (DESC_PARTS, FM_PARTS, HostCommand, HostError, HostOp, HostResponse,
                        SysReg, join_parts, split_parts)
from ..hdl.img2col import FEATURE_MAP_DESCRIPTOR
from ..hdl.tile_desc import TileDescLayout, TileLocation, encode_shared, encode_tile
from ..hdl.tile_port import MemSpace
from ..model.datatype import DataType
from ..model.layout import CELL_BYTES, SHARED_MAX_CAPACITY_BYTES, Layout, element_offsets, unpack
from ..model.state import GPR_COUNT, HANDS, PE_COUNT, State, selector_name

__all__ = ["HostPortError", "DoesNotFit", "load_state", "clear_state", "read_tile",
           "read_status", "run_sync", "run_async", "stream_request", "tile_words"]

WORDS_PER_CELL = CELL_BYTES // 8


class HostPortError(RuntimeError):
    """The unit refused a host command the driver expected to succeed."""


class DoesNotFit(HostPortError):
    """A scenario register does not fit the build's tile memory (an implementation limit)."""


def _check(cmd: HostCommand, rsp: HostResponse, what: str) -> HostResponse:
    if not rsp.ok:
        if rsp.error is HostError.NO_SPACE:
            raise DoesNotFit(f"{what} does not fit the tile memory of this build")
        raise HostPortError(f"{what}: the unit answered {rsp.error.name} to {cmd}")
    return rsp


def _space_name(space: int, index: int) -> str:
    return f"S{index}" if space == MemSpace.SHARED.value else f"PE{space} {selector_name(index)}"


def tile_words(tile) -> list[int]:
    """The tile's payload as 64-bit little-endian words (its capacity; longer storage of an
    oversized CUBE descriptor is cut to the capacity, which is all the store keeps)."""
    payload = np.asarray(tile.payload, dtype=np.uint8)[:tile.capacity]
    return payload.view("<u8").tolist()


def _flag_words(tile) -> list[int]:
    flags = np.zeros(-(-tile.defined.size // 64) * 64, dtype=np.uint8)
    flags[:tile.defined.size] = tile.defined
    return [int.from_bytes(np.packbits(flags[k:k + 64], bitorder="little").tobytes(), "little")
            for k in range(0, flags.size, 64)]


def _load_register(space: int, index: int, tile, desc_bits: int, skip_zero: bool):
    what = _space_name(space, index)
    for part, word in enumerate(split_parts(desc_bits, DESC_PARTS)):
        cmd = HostCommand(HostOp.DESC_PART, addr=part, data=word)
        _check(cmd, (yield cmd), what)
    cmd = HostCommand(HostOp.CONFIGURE, space, index)
    _check(cmd, (yield cmd), f"{what} ({tile.capacity} B)")
    for addr, word in enumerate(tile_words(tile)):
        if word or not skip_zero:
            cmd = HostCommand(HostOp.WRITE_WORD, space, index, addr, word)
            _check(cmd, (yield cmd), what)
    limit = tile.capacity // CELL_BYTES * 4
    for addr, word in enumerate(_flag_words(tile)[:limit]):
        if word:                               # CONFIGURE cleared every flag word
            cmd = HostCommand(HostOp.WRITE_FLAGS, space, index, addr, word)
            _check(cmd, (yield cmd), what)
    undefined = int((~tile.defined_valid()).sum())
    cmd = HostCommand(HostOp.SET_UNDEFINED, space, index, data=undefined)
    _check(cmd, (yield cmd), what)


def load_state(state: State, config, *, skip_zero: bool = True):
    """Generator: load ``state`` into a unit just out of reset.

    ``skip_zero`` leaves out zero payload words and GPRs (they reset to zero); use False on
    a unit that has been used (after :func:`clear_state`).
    """
    del config     # the unit checks every size itself; kept for symmetry with the readers
    for number in range(1, GPR_COUNT):
        value = state.read_gpr(number)
        if value or not skip_zero:
            cmd = HostCommand(HostOp.WRITE_GPR, index=number, data=value)
            _check(cmd, (yield cmd), f"GPR {number}")
    cmd = HostCommand(HostOp.WRITE_SYS, addr=SysReg.TILE_CAPACITY.value, data=state.tile_capacity)
    _check(cmd, (yield cmd), "tile_capacity")
    cmd = HostCommand(HostOp.WRITE_SYS, addr=SysReg.STATUS.value, data=state.flags)
    _check(cmd, (yield cmd), "status flags")
    for pe in range(PE_COUNT):
        for index, tile in enumerate(state.pes[pe].tiles):
            if tile is None:
                continue
            yield from _load_register(pe, index, tile, encode_tile(tile), skip_zero)
            if tile.feature_map is not None:
                try:
                    bits = FEATURE_MAP_DESCRIPTOR.encode(tile.feature_map)
                except ValueError as exc:
                    raise DoesNotFit(f"PE{pe} {selector_name(index)}: {exc}") from None
                for part, word in enumerate(split_parts(bits, FM_PARTS)):
                    cmd = HostCommand(HostOp.WRITE_FM, pe, index, part, word)
                    _check(cmd, (yield cmd), f"PE{pe} {selector_name(index)} feature map")
    for sid, shared in sorted(state.shared.items()):
        yield from _load_register(MemSpace.SHARED.value, sid, shared.tile,
                                  encode_shared(shared), skip_zero)


def clear_state(state: State):
    """Generator: free every Local register some PE holds and the Shared registers of
    ``state`` (the state a program started from)."""
    cmd = HostCommand(HostOp.READ_SYS, addr=SysReg.ALLOCATED.value)
    held = _check(cmd, (yield cmd), "allocation").data
    for index in range(64):
        if held >> index & 1:
            for pe in range(PE_COUNT):
                rsp = yield HostCommand(HostOp.FREE, pe, index)
                if not rsp.ok and rsp.error is not HostError.NOT_ALLOCATED:
                    raise HostPortError(f"FREE PE{pe} {selector_name(index)}: {rsp.error.name}")
    for sid in state.shared:
        cmd = HostCommand(HostOp.FREE, MemSpace.SHARED.value, sid)
        _check(cmd, (yield cmd), f"S{sid}")


def _hex(value: int, bits: int) -> str:
    return f"0x{int(value):0{max(bits // 4, 1)}x}"


def read_tile(pe: int, index: int):
    """Generator: read Local register ``index`` of PE ``pe``; returns its result record
    (the ``published`` entry format of ``ptocube run --json``), or None when it is empty."""
    words = []
    for part in range(DESC_PARTS):
        cmd = HostCommand(HostOp.READ_DESC, pe, index, part)
        words.append(_check(cmd, (yield cmd), f"PE{pe} {selector_name(index)}").data)
    desc = data.Const(TileDescLayout, join_parts(words) & ((1 << TileDescLayout.size) - 1))
    if not desc.allocated:
        return None
    dtype, layout = DataType(desc.dtype), Layout(desc.layout)
    rows, cols, capacity = int(desc.valid_rows), int(desc.valid_cols), int(desc.cells) * 128
    phys = None if layout.is_cube else int(desc.phys_cols)
    offsets = element_offsets(layout, dtype, rows, cols, phys)
    first = offsets * dtype.bits // 64
    last = ((offsets + 1) * dtype.bits - 1) // 64
    needed = sorted(set(first.ravel().tolist()) | set(last.ravel().tolist()))
    payload = np.zeros(max(capacity, (max(needed) + 1) * 8), dtype=np.uint8)
    for addr in needed:
        cmd = HostCommand(HostOp.READ_WORD, pe, index, addr)
        word = _check(cmd, (yield cmd), f"PE{pe} {selector_name(index)} word {addr}").data
        payload[8 * addr:8 * addr + 8] = np.frombuffer(word.to_bytes(8, "little"), np.uint8)
    raw = unpack(payload, layout, dtype, rows, cols, phys, max_capacity=SHARED_MAX_CAPACITY_BYTES)
    location = "Matrix" if desc.location == TileLocation.MATRIX else "Any"
    return {"pe": pe, "hand": HANDS[index >> 4], "n": (index & 0xF) + 1,
            "selector": selector_name(index), "dtype": dtype.name, "layout": layout.name,
            "location": location, "tsize": capacity, "shape": [rows, cols],
            "data": [[_hex(v, dtype.bits) for v in row] for row in raw.tolist()]}


def read_status():
    """Generator: the sticky status flags (an int, NV..NX in bits 4..0)."""
    cmd = HostCommand(HostOp.READ_SYS, addr=SysReg.STATUS.value)
    return _check(cmd, (yield cmd), "status").data


def run_sync(gen, transact):
    """Run a driver generator with a synchronous ``transact(cmd) -> HostResponse``; returns
    the generator's result."""
    rsp = None
    while True:
        try:
            cmd = gen.send(rsp)
        except StopIteration as stop:
            return stop.value
        rsp = transact(cmd)


async def run_async(gen, transact):
    """Run a driver generator with an awaitable ``transact(cmd) -> HostResponse`` (a
    simulation testbench's port access); returns the generator's result."""
    rsp = None
    while True:
        try:
            cmd = gen.send(rsp)
        except StopIteration as stop:
            return stop.value
        rsp = await transact(cmd)


async def stream_request(ctx, req, bits: int, rsp) -> int:
    """Send one item ``bits`` on stream ``req`` and return the bits of the next item on
    stream ``rsp`` (whose ``ready`` the caller holds high): a request/response port in an
    Amaranth testbench, such as the host port or the tile port's descriptor lookup.  Once
    taken, the payload is inverted: a port that reads it after the handshake fails."""
    payload = Value.cast(req.payload)
    ctx.set(req.valid, 1)
    ctx.set(payload, bits)
    while not (await ctx.tick().sample(req.ready))[2]:
        pass
    ctx.set(req.valid, 0)
    ctx.set(payload, ~bits & ((1 << len(payload)) - 1))
    while True:
        _, _, valid, payload = await ctx.tick().sample(rsp.valid, Value.cast(rsp.payload))
        if valid:
            return payload
