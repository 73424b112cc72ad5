"""The tile store of the CUBE unit: payloads, descriptors, definedness, allocation, GPRs.

:class:`TileStore` holds all architectural state the CUBE unit reads and publishes and serves
every agent that touches it:

* the preflight's read ports (``tile_rd``, ``shared_rd``, ``gpr_rd``: latency 1; ``word_rd``: 2)
  and its allocation inputs (``alloc``), and the decoder's combinational GPR port;
* the CUBE engine's :class:`~ptocube.hdl.tile_port.TilePortSignature` (``engine``);
* the TIMG2COL engine's element port (``i2c``: the engine's ``src_req``, ``src_rsp`` and
  ``dst`` streams, addressed in elements of the source / destination), on the memories of
  the PE whose job runs (``src_load``, decision T15);
* the host port (``host_cmd`` / ``host_rsp``, :mod:`ptocube.hdl.host`);
* the top level's sequencing requests (``req``): PLACE the outputs of the approved plan,
  PUBLISH them, or ABORT (free the placement).

Storage (``docs/hdl-top.md`` has the figures):

* payload memories of 64-bit words, one per PE (``tile_bytes_per_pe``) and one Shared
  (``shared_bytes``), with byte enables; a tile's payload starts at its base CELL;
* definedness: one flag memory per payload memory, 4 flag words (256 slot flags) reserved per
  CELL, and per register the count of undefined *valid* elements (decision T5); a published
  output has implicit flags (``synth``: exactly its valid region is defined);
* register files of Local (4 x 64) and Shared (256) entries: descriptor, base CELL, count,
  ``synth``; the feature-map descriptor registers (4 x 64);
* one CELL occupancy bitmap per memory and a first-fit allocator scanning 8 CELLs per cycle
  in two pipeline stages (decisions T4, T13);
* GPRs, ``tile_capacity``, the sticky status flags and the allocation counters.

Every memory (payloads, flags, the three register files, the GPRs) has one synchronous read
port, shared by the agents, so that it maps to block RAM (decision T11).  ``word_rd`` takes
the register's base from a LUT-RAM copy of the Local bases, looked up with the read of the
same register that must come in the previous cycle (``tile_rd`` or ``word_rd``, decisions
T11, T26).

Port priority (decision T3): the engines (CUBE, then TIMG2COL) before the preflight before
the sequencer (host commands, placement, publication).  In normal operation they are never
active together: host commands are only taken while ``host_enable`` (the unit is idle), the
preflight reads only while checking, the engines run only between PLACE and PUBLISH/ABORT.
"""

import contextlib
from typing import NamedTuple

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..model.datatype import DataType
from ..model.layout import CELL_BYTES, Layout
from ..model.state import CORE_TILE_CAPACITY_BYTES, GPR_COUNT, PE_COUNT
from .config import CubeConfig
from .host import (DESC_PART_BASE, DESC_PART_UNDEFINED, FM_PARTS, HostCommandLayout, HostError,
                   HostOp, HostResponseLayout, SysReg, build_info)
from .img2col import FEATURE_MAP_DESCRIPTOR, source_index_width
from .logic import KEEP, NO_COLLISION, BlockReadPort, one_hot_select
from .img2col_engine import DestinationWriteLayout, SourceResponseLayout
from .preflight import (AllocQuerySignature, GprReadSignature, SharedReadSignature,
                        TileReadSignature, WordReadSignature, one_hot_index)
from .tile_desc import OutputRole, PlanLayout, SharedDescLayout, TileDescLayout, TileLocation
from .tile_port import MemSpace, TilePortSignature, cell_addr_width, word_addr_width

__all__ = ["StoreOp", "ElementPortSignature", "TileStore", "SCAN_CELLS_PER_CYCLE",
           "FLAG_WORDS_PER_CELL", "UNDEFINED_WIDTH"]

#: CELLs the first-fit allocator examines per cycle.
SCAN_CELLS_PER_CYCLE = 8
#: Flag words reserved per CELL: 256 slots, the 4-bit worst case.
FLAG_WORDS_PER_CELL = 4
#: Width of a register's undefined-valid-element count (256 KiB of 4-bit slots).
UNDEFINED_WIDTH = 20
_WORDS_PER_CELL = CELL_BYTES // 8
#: Host commands that do not address a tile register (their ``index`` is not checked).
_UNADDRESSED = (HostOp.NOP, HostOp.DESC_PART, HostOp.WRITE_GPR, HostOp.READ_GPR,
                HostOp.WRITE_SYS, HostOp.READ_SYS)
#: The sequencer's states (host commands, placement, publication), IDLE first.
_SEQ_STATES = ("IDLE", "HOST_READS", "HOST_LOAD", "HOST_FACTS", "HOST_CHECK", "HOST", "HOST_ISSUE",
               "HOST_FETCH", "HOST_READ", "HOST_SYNTH", "HOST_REPLY", "CFG_SCAN", "CFG_INSTALL",
               "CFG_CLEAR", "PLACE_PLAN", "PLACE_NEXT", "PLACE_SCAN", "PLACE_END", "FREE_PLACED",
               "PUBLISH", "PUBLISH_END")


class StoreOp(enum.Enum, shape=2):
    """Sequencing requests of the top level (``req``)."""
    NONE = 0
    PLACE = 1      # place every output of ``plan`` on every selected PE; answer ok / not
    PUBLISH = 2    # install the placed outputs, OR ``flags`` into the sticky status
    ABORT = 3      # free the placement, publish nothing


def ElementPortSignature(config: CubeConfig) -> wiring.Signature:
    """A TIMG2COL engine's element streams, seen from the engine (the store flips it)."""
    width = source_index_width(config)
    return wiring.Signature({
        "src_req": Out(stream.Signature(width)),
        "src_rsp": In(stream.Signature(SourceResponseLayout)),
        "dst": Out(stream.Signature(DestinationWriteLayout(width))),
    })


class _ReadBus:
    """The read-data bus of one kind of memory (the payloads or the flags), through a fabric
    register per memory (decision T39).

    Each memory's read register is a block RAM's output, which takes most of a 10 ns cycle
    to appear: it reaches only a register of its own (``out``), which the placer can put
    beside the RAM.  That register loads when the agent that read the memory moves its word
    on (``move[agent]``, set by the agent: the cycle after its read, or later while its
    pipeline stalls), and ``data`` is the ``out`` register of the memory read last, an
    AND-OR of registers.  So ``data`` answers a read two cycles after it, and holds until
    the next move: only one agent reads at a time (T3), and an agent whose pipeline stalls
    issues no read, so its word waits in the memory's read register.
    """

    def __init__(self, m, ports, name, agents):
        self.move = {agent: Signal(name=f"{name}_move_{agent}") for agent in agents}
        last = Signal(len(ports), name=f"{name}_last_read")   # the memory read last
        enables = Cat(port.en for port in ports)
        with m.If(enables.any()):
            m.d.sync += last.eq(enables)
        move = Cat(*self.move.values()).any()
        held = Signal(len(ports), name=f"{name}_held")        # ``out`` loaded last
        with m.If(move):
            m.d.sync += held.eq(last)
        outs = []
        for s, port in enumerate(ports):
            out = Signal(len(port.data), name=f"{name}{s}_out", reset_less=True)
            with m.If(move & last[s]):
                m.d.sync += out.eq(port.data)
            outs.append(out)
        self.data = one_hot_select(held, outs)


def _thermometer(m: Module, value, width: int, name: str) -> Signal:
    """``width`` bits, bit i set when i < ``value`` (all set when ``value`` >= ``width``).

    Built from two small decodes, the value's high part against each 8-bit group and its low
    3 bits within a group, so each bit is one LUT of three shared signals.  Per-bit ``<``
    compares would each become a carry chain reading the whole value (decision T14).
    """
    value = Value.cast(value)
    groups = -(-width // 8)
    high, low = value[3:], value[:3]
    high_lt = Signal(groups, name=f"{name}_high_lt")   # group g lies below the value's group
    low_lt = Signal(8, name=f"{name}_low_lt")          # CELL j of a group below the value's
    with m.Switch(high):
        for g in range(groups):
            with m.Case(g):
                m.d.comb += high_lt.eq((1 << g) - 1)
        with m.Default():
            m.d.comb += high_lt.eq((1 << groups) - 1)
    with m.Switch(low):
        for j in range(8):
            with m.Case(j):
                m.d.comb += low_lt.eq((1 << j) - 1)
    bits = Signal(width, name=name)
    for i in range(width):
        m.d.comb += bits[i].eq(high_lt[i // 8] | ((high == i // 8) & low_lt[i % 8]))
    return bits


#: Cycles from the inputs of :func:`_implicit_flags` to its word.
IMPLICIT_CYCLES = 6


def _implicit_flags(m: Module, word, phys_cols, pc_mask, rows, cols, name: str) -> Signal:
    """The implicit definedness flags of flag word ``word`` of a row-major tile with
    ``phys_cols`` physical columns (``pc_mask`` = ``phys_cols`` - 1) and a ``rows`` x
    ``cols`` valid region: bit i set when element i of the word lies in the region.

    A pipeline of :data:`IMPLICIT_CYCLES` stages that register every cycle: the word is
    valid that many cycles after its inputs, which must hold meanwhile (decision T24).  The
    stages: log2 of the columns (0 unless a power of two) and that clamped to 6, one-hot; the
    rows and columns used before the word's first element; the rows and columns that remain
    to the region's end, clamped to 0-64 (one subtraction, its borrow and an OR of its high
    bits, T33); the elements of the remaining rows (``rows << log2``, clamped to 64) and the
    remaining columns as a thermometer code (T14); each element's row test, a thermometer
    code of those elements, and its column test, two AND-ORs under the one-hot log (T31,
    T33); the word.
    Element i is ``i >> log2`` rows and ``i & (columns - 1)`` columns past the word's first
    element: the 64 elements of a word never carry into higher slot bits, since physical
    columns are a power of two; its row lies in the region when ``i < rows << log2``."""
    log = Signal(5, name=f"{name}_log")
    log6 = Signal(7, name=f"{name}_log6")       # bit k: min(log, 6) == k
    m.d.sync += [log.eq(Mux((phys_cols & pc_mask) == 0, one_hot_index(phys_cols, 16), 0)),
                 log6.eq(Cat(*(log == k for k in range(6)), log >= 6))]
    first = Cat(Const(0, 6), word)
    rows_used = Signal(len(first), name=f"{name}_rows_used")
    cols_used = Signal(16, name=f"{name}_cols_used")
    m.d.sync += [rows_used.eq(first >> log), cols_used.eq(first & pc_mask)]
    rooms = []
    for size, used, what in ((rows, rows_used, "rows"), (cols, cols_used, "cols")):
        room = Signal(7, name=f"{name}_{what}_room")
        diff = Signal(max(len(size), len(used)) + 1, name=f"{name}_{what}_left")
        m.d.comb += diff.eq(size - used)        # its top bit: the borrow, size < used
        m.d.sync += room.eq(Mux(diff[-1], 0, Mux(diff[6:-1].any(), 64, diff[:6])))
        rooms.append(room)
    rows_room, cols_room = rooms
    # ``rows_room << log``, clamped to 64: it reaches 64 when the room has a bit at 6 - k.
    rows_end = Signal(7, name=f"{name}_rows_end")
    m.d.sync += rows_end.eq(one_hot_select(log6, [
        Mux(rows_room[6 - k:].any(), 64, (rows_room << k)[:7]) for k in range(7)]))
    cols_below = Signal(64, name=f"{name}_cols_below")
    m.d.sync += cols_below.eq(_thermometer(m, cols_room, 64, f"{name}_cols_thermometer"))
    # Element i's row test, and its column test in two halves (log below 4, log from 4),
    # registered, then their AND (T31, T33).
    rows_ok = Signal(64, name=f"{name}_rows_ok")
    m.d.sync += rows_ok.eq(_thermometer(m, rows_end, 64, f"{name}_rows_thermometer"))
    cols_ok = [Signal(64, name=f"{name}_cols_ok{h}") for h in range(2)]
    for i in range(64):
        for h, ks in enumerate((range(4), range(4, 7))):
            m.d.sync += cols_ok[h][i].eq(one_hot_select(
                log6[ks.start:ks.stop], [cols_below[i & ((1 << k) - 1)] for k in ks]))
    flags = Signal(64, name=name)
    m.d.sync += flags.eq(rows_ok & (cols_ok[0] | cols_ok[1]))
    return flags


def _entry_layout(desc_layout, config, *, feature_map=False):
    # ``clean``: ``undef == 0``, set by the table's write port, so that the definedness
    # answers read one bit after the block RAM, not a compare of the count (decision T28).
    fields = {"desc": desc_layout, "base": cell_addr_width(config), "undef": UNDEFINED_WIDTH,
              "clean": 1, "synth": 1}
    if feature_map:
        # Bit k: part k of the feature map was written since the register was allocated; the
        # others read as zero, so allocation and publication need not clear the memory (T20).
        fields["fm_set"] = FM_PARTS
    return data.StructLayout(fields)


class _ElementSource(NamedTuple):
    """The registers of the running TIMG2COL job's element port (decision T15)."""
    pe: Signal          # one-hot: the PE whose memories the port reads and writes
    entry: Signal       # its SOURCE register's Local entry
    rows_end: Signal    # implicit flags (T5, T19): valid rows x physical columns, saturated
    col_mask: Signal    # ... and physical columns - 1
    dst_base: Signal    # the base CELL of its placed output


class _ReadRequest(NamedTuple):
    """A read of one of a set of memories (decision T26): ``sel`` chooses the memory
    (one-hot), ``addr`` is its address while ``valid``, and it reads when ``go``."""
    valid: Value
    go: Value
    sel: Value
    addr: Value


def _issue_reads(m, ports, requests):
    """Drive the read ports ``ports`` from ``requests`` (:class:`_ReadRequest`), lowest
    priority first: a memory's address is that of the last valid request that selects it,
    and it reads when a request that selects it goes.  Requests that select the same
    memory are never valid together (decision T3)."""
    for s, port in enumerate(ports):
        for request in requests:
            with m.If(request.valid & request.sel[s]):
                m.d.comb += port.addr.eq(request.addr)
        m.d.comb += port.en.eq(Cat(*(r.go & r.sel[s] for r in requests)).any())


class _OneHotFSM:
    """A state machine with one flip-flop per state (decision T33): ``on[name]`` is the
    state's flip-flop, so every decision of a state starts from one register, not from a
    decode of a binary state register in front of the registers it enables.

    ``state(name)`` opens a state's block and ``goto(target)`` leaves it, like
    ``m.FSM`` / ``m.State`` / ``m.next``: the last ``goto`` a cycle executes wins, so each
    one also clears the targets that the state's earlier ``goto`` calls may have set.
    ``copies[name]`` more flip-flops of a state (``copy[name]``, ``keep``) are set and
    cleared with it, for wide enables (decision T41).
    """

    def __init__(self, m: Module, states, name: str, copies: dict | None = None):
        self._m = m
        self.on = {s: Signal(name=f"{name}_{s.lower()}", init=k == 0)
                   for k, s in enumerate(states)}
        self.copy = {s: [Signal(name=f"{name}_{s.lower()}_copy{j}", init=states.index(s) == 0,
                                attrs=KEEP) for j in range(count)]
                     for s, count in (copies or {}).items()}
        self._targets = {s: [] for s in states}
        self._current = None

    def _set(self, state: str, value: int):
        self._m.d.sync += [flop.eq(value) for flop in (self.on[state], *self.copy.get(state, ()))]

    @contextlib.contextmanager
    def state(self, name: str):
        """The block of state ``name``: its statements take effect while it is current."""
        self._current = name
        with self._m.If(self.on[name]):
            yield
        self._current = None

    def goto(self, target: str):
        """Make ``target`` the state of the next cycle."""
        seen = self._targets[self._current]
        for s in (*seen, self._current):
            if s != target:
                self._set(s, 0)
        self._set(target, 1)
        if target not in seen:
            seen.append(target)


def _log2_bytes(dtype):
    """log2 of the element bytes of a TIMG2COL DataType code (8/16/32-bit types)."""
    wide = [t.value for t in DataType if t.bits == 32]
    half = [t.value for t in DataType if t.bits == 16]
    return Mux(Cat(*[dtype == v for v in wide]).any(), 2,
               Mux(Cat(*[dtype == v for v in half]).any(), 1, 0))


class TileStore(wiring.Component):
    """All tile state of the CUBE unit and the ports that read and write it.

    Members
    -------
    tile_rd, shared_rd, word_rd, gpr_rd : the preflight's read ports (flipped), latency 1
        (``word_rd``: 2, decision T39).
        Answers hold until the next read of the same memory (``word_rd``'s until the next
        payload read moves on); ``word_rd`` must follow a ``tile_rd`` or ``word_rd`` of the
        same register (decisions T11, T26).
    alloc : the preflight's allocation inputs (flipped).
    gpr_index : In(5), gpr_value : Out(16)
        The decoder's combinational B.DIM GPR read.
    engine : In(TilePortSignature(config))
        The CUBE engine's port: descriptor lookups and payload reads answer after 3
        cycles (requests and words registered, decision T26).  ``mem_wr`` is always ready;
        a write reaches the memory a cycle later.
    i2c : In(ElementPortSignature)
        The TIMG2COL element port of the running job: the SOURCE register and the placed
        output of the PE whose source ``src_load`` read last (decision T15).
    host_cmd, host_rsp : the host port; ``host_enable`` gates it (the unit is idle).
    req : In(StoreOp), req_valid : In(1), req_done : Out(1), req_ok : Out(1)
        Sequencing: a request is taken when the store is idle; ``req_done`` strobes when it
        finished, with ``req_ok`` (PLACE: every output placed).
    plan : In(PlanLayout(config)), flags : In(5)
        The approved plan (PLACE, PUBLISH, ABORT) and the numeric flags to publish.
    out_base : Out, per PE per plan output, the placed base CELL (valid after PLACE).
    src_load : In(1), src_pe : In(2)
        The start of a TIMG2COL job (decision T15): while the store is idle and ``src_load``
        is high, it reads PE ``src_pe``'s SOURCE register (the plan's operand 9) and part
        ``src_fm_part`` of its feature map, and serves that PE on ``i2c``.
    src_desc : Out(TileDescLayout)
        That source's descriptor (for :func:`~ptocube.hdl.preflight.img2col_job`), from the
        second cycle after ``src_load`` until the cycle after the next ``src_load`` (a copy
        of the read register, decision T23).
    src_fm_read : In(1), src_fm_part : In(range(FM_PARTS)), src_fm : Out(64),
    src_fm_set : Out(1)
        The feature map goes out one 64-bit part at a time (decisions T18, T20): while the
        store is idle, ``src_fm_read`` reads part ``src_fm_part`` of the loaded source's
        feature map; ``src_fm`` shows the part read last from the next cycle until the
        store's next read of the feature-map memory, and ``src_fm_set`` whether it was
        written since allocation (the part is zero if not, decision T33).
    tile_capacity : Out(32) - the system register.
    status_flags : Out(5) - the sticky numeric flags.
    idle : Out(1) - no host command or request in progress.
    """

    def __init__(self, config: CubeConfig = CubeConfig()):
        self.config = config
        self.cw = cell_addr_width(config)
        self.ww = word_addr_width(config)
        self.local_entry = _entry_layout(TileDescLayout, config, feature_map=True)
        self.shared_entry = _entry_layout(SharedDescLayout, config)
        super().__init__({
            "tile_rd": In(TileReadSignature),
            "shared_rd": In(SharedReadSignature),
            "word_rd": In(WordReadSignature),
            "gpr_rd": In(GprReadSignature),
            "alloc": In(AllocQuerySignature),
            "gpr_index": In(5),
            "gpr_value": Out(16),
            "engine": In(TilePortSignature(config)),
            "i2c": In(ElementPortSignature(config)),
            "host_cmd": In(stream.Signature(HostCommandLayout)),
            "host_rsp": Out(stream.Signature(HostResponseLayout)),
            "host_enable": In(1),
            "req": In(StoreOp),
            "req_valid": In(1),
            "req_done": Out(1),
            "req_ok": Out(1),
            "plan": In(PlanLayout(config)),
            "flags": In(5),
            "out_base": Out(data.ArrayLayout(data.ArrayLayout(self.cw, 3), PE_COUNT)),
            "src_load": In(1),
            "src_pe": In(2),
            "src_desc": Out(TileDescLayout),
            "src_fm_read": In(1),
            "src_fm_part": In(range(FM_PARTS)),
            "src_fm": Out(64),
            "src_fm_set": Out(1),
            "tile_capacity": Out(32, init=CORE_TILE_CAPACITY_BYTES),
            "status_flags": Out(5),
            "idle": Out(1),
        })

    # ---- geometry of the memories ---------------------------------------------------
    def cells(self, space: int) -> int:
        """CELLs of the payload memory of ``space`` (0..3 PE, 4 Shared)."""
        size = self.config.shared_bytes if space == 4 else self.config.tile_bytes_per_pe
        return size // CELL_BYTES

    def elaborate(self, platform):
        m = Module()
        cfg, cw, ww = self.config, self.cw, self.ww
        spaces = range(PE_COUNT + 1)
        cells = [self.cells(s) for s in spaces]

        # ---- storage ----------------------------------------------------------------
        pay_rd, pay_wr, flg_rd, flg_wr = [], [], [], []
        for s in spaces:
            p = Memory(shape=64, depth=cells[s] * _WORDS_PER_CELL, init=[], attrs=NO_COLLISION)
            f = Memory(shape=64, depth=cells[s] * FLAG_WORDS_PER_CELL, init=[],
                       attrs=NO_COLLISION)
            m.submodules[f"payload{s}"] = p
            m.submodules[f"flags{s}"] = f
            pay_rd.append(BlockReadPort(m, p, f"payload{s}"))
            pay_wr.append(p.write_port(granularity=8))
            flg_rd.append(BlockReadPort(m, f, f"flags{s}")), flg_wr.append(f.write_port())
        # Every payload write (host, CUBE engine, TIMG2COL destination) is registered at the
        # store's boundary and reaches the memory a cycle later: the memories' write inputs
        # are flip-flops (decision T26).  ``write_payload`` adds a writer; the writers never
        # write in the same cycle (T3), so the registers load in every cycle an AND-OR of
        # the writes under their ``valid``: a writer's handshake reaches the registers' data,
        # not their clock enables (T33).
        wr_mask = [Signal(8, name=f"payload{s}_wr_mask") for s in spaces]
        # The address has a copy per memory (``keep``): one register's 40 block-RAM sinks
        # spread over the device made the longest wire of session 25's route (12.8 ns).
        wr_addr = [Signal(ww, name=f"payload{s}_wr_addr", attrs=KEEP) for s in spaces]
        wr_data = Signal(64, name="payload_wr_data")
        for port, mask, addr in zip(pay_wr, wr_mask, wr_addr):
            m.d.comb += [port.en.eq(mask), port.addr.eq(addr), port.data.eq(wr_data)]
        writes = []

        def write_payload(valid, masks, addr, data):
            writes.append((valid, masks, addr, data))

        lreg = Memory(shape=self.local_entry, depth=PE_COUNT * 64, init=[], attrs=NO_COLLISION)
        sreg = Memory(shape=self.shared_entry, depth=256, init=[], attrs=NO_COLLISION)
        # The feature maps are stored one 64-bit part to a word, the part number the high
        # address bits: every reader takes one part at a time, so the block RAMs' outputs are
        # one 64-bit bus and the part is chosen by address, not by a multiplexer of the whole
        # entry (issue #9, decisions T16, T20).
        fmr = Memory(shape=64, depth=FM_PARTS * PE_COUNT * 64, init=[], attrs=NO_COLLISION)
        m.submodules.local_regs, m.submodules.shared_regs = lreg, sreg
        m.submodules.fm_regs = fmr
        # One synchronous read port per table, shared by every agent (decision T11): the
        # tables map to block RAM, and an agent reads only while the others cannot.  Outputs
        # hold until the next read.
        l_rd, l_wr = BlockReadPort(m, lreg, "local_regs"), lreg.write_port()
        s_rd, s_wr = BlockReadPort(m, sreg, "shared_regs"), sreg.write_port()
        fm_rd, fm_wr = BlockReadPort(m, fmr, "fm_regs"), fmr.write_port()
        # The host's copies of the Local and Shared files, written with them and read only
        # by host commands: the host's facts and the bundles' readers (preflight, engines)
        # each load from block RAMs of their own, which the placer can put beside each
        # (issue #9, decision T38).
        host_files = []
        for memory, write, name in ((lreg, l_wr, "local_regs_host"),
                                    (sreg, s_wr, "shared_regs_host")):
            copy = Memory(shape=memory.shape, depth=memory.depth, init=[], attrs=NO_COLLISION)
            m.submodules[name] = copy
            copy_wr = copy.write_port()
            m.d.comb += [copy_wr.en.eq(write.en), copy_wr.addr.eq(write.addr),
                         copy_wr.data.eq(write.data)]
            host_files.append(BlockReadPort(m, copy, name))
        lh_rd, sh_rd = host_files
        # Each copy's read data is registered again, in every cycle, with nothing between:
        # on the ECP5 that register becomes the block RAM's output register (F44), so the
        # facts' compares start 1.2 ns after the clock instead of the RAM's 5.8 ns (the 8 x 8
        # unit's critical path at 83.73 MHz ended in ``f_flag_ok``).  Host commands wait a
        # cycle for it in HOST_LOAD (decision T42).
        lh_out, sh_out = (Signal(port.data.shape(), name=f"{name}_out", reset_less=True)
                          for port, name in zip(host_files, ("local_host", "shared_host")))
        m.d.sync += [lh_out.eq(lh_rd.data), sh_out.eq(sh_rd.data)]
        # The Local entries' bases again, in LUT RAM written with the Local file: the
        # preflight's word read adds its word to a register's base looked up here a cycle
        # earlier, not to the Local file's block-RAM output (decision T26).
        # LUT RAM: as a block RAM the register after the read would be its output again.
        bases_mem = Memory(shape=cw, depth=PE_COUNT * 64, init=[],
                           attrs={"ram_style": "distributed"})
        m.submodules.local_bases = bases_mem
        base_rd, base_wr = bases_mem.read_port(domain="comb"), bases_mem.write_port()
        m.d.comb += [base_wr.en.eq(l_wr.en), base_wr.addr.eq(l_wr.addr),
                     base_wr.data.eq(l_wr.data.base)]
        # The number of the part read last: the part was written since allocation when its
        # bit of ``fm_set`` is set in the Local entry read with it.
        fm_read_part = Signal(range(FM_PARTS), name="fm_read_part")

        def read_local(addr):
            m.d.comb += [l_rd.en.eq(1), l_rd.addr.eq(addr)]

        def read_shared(addr):
            m.d.comb += [s_rd.en.eq(1), s_rd.addr.eq(addr)]

        def read_fm():
            m.d.comb += fm_rd.en.eq(1)

        # GPRs: a memory for the 64-bit reads (host, preflight), and a second one of their
        # low 16 bits for the decoder's combinational GPR[15:0], read asynchronously (LUT
        # RAM, decision T21).  GPR0 is never written, so it reads as zero.
        gpr_mem = Memory(shape=64, depth=1 << 5, init=[], attrs=NO_COLLISION)
        gpr_low = Memory(shape=16, depth=1 << 5, init=[])
        m.submodules.gprs, m.submodules.gprs_low = gpr_mem, gpr_low
        g_rd, g_wr = BlockReadPort(m, gpr_mem, "gprs"), gpr_mem.write_port()
        g_low_rd, g_low_wr = gpr_low.read_port(domain="comb"), gpr_low.write_port()

        def read_gpr(addr):
            m.d.comb += [g_rd.en.eq(1), g_rd.addr.eq(addr)]

        status = Signal(5)
        capacity = Signal(32, init=CORE_TILE_CAPACITY_BYTES)
        in_use = Signal(32)
        pe_bytes = Array(Signal(32, name=f"pe{p}_bytes") for p in range(PE_COUNT))
        held = Array(Signal(64, name=f"pe{p}_held") for p in range(PE_COUNT))
        pad = [-(-c // SCAN_CELLS_PER_CYCLE) * SCAN_CELLS_PER_CYCLE for c in cells]
        # Occupancy bitmaps, padded with occupied CELLs to whole scan chunks.
        bitmap = Array(Signal(pad[s], init=((1 << pad[s]) - 1) ^ ((1 << cells[s]) - 1),
                              name=f"bitmap{s}") for s in spaces)
        m.d.comb += [self.tile_capacity.eq(capacity), self.status_flags.eq(status),
                     self.alloc.allocated.eq(held[0] | held[1] | held[2] | held[3]),
                     self.alloc.capacity_in_use.eq(in_use), self.alloc.tile_capacity.eq(capacity),
                     g_low_rd.addr.eq(self.gpr_index), self.gpr_value.eq(g_low_rd.data)]
        for p in range(PE_COUNT):
            m.d.comb += self.alloc.pe_bytes_in_use[p].eq(pe_bytes[p])

        # ---- preflight read ports ----------------------------------------------------
        # ``tile_rd`` / ``shared_rd`` answer from the tables' read registers (the reads are
        # issued below, after the sequencer's, decision T3).
        td, sr, wd = self.tile_rd, self.shared_rd, self.word_rd
        m.d.comb += [td.desc.eq(l_rd.data.desc),
                     td.defined.eq(l_rd.data.desc.allocated & l_rd.data.clean),
                     sr.desc.eq(s_rd.data.desc),
                     sr.defined.eq((s_rd.data.desc.allocation_mask != 0) & s_rd.data.clean)]
        gr = self.gpr_rd
        m.d.comb += gr.data.eq(g_rd.data)
        # One read-data bus per memory kind for every agent: only one agent reads at a time
        # (T3), so the bus shows the memory read last (one-hot, registered with the read)
        # instead of a multiplexer per agent at the block RAMs' outputs (issue #9), through a
        # register per memory (T39).
        pay_bus = _ReadBus(m, pay_rd, "payload", ("host", "engine", "i2c", "word"))
        flg_bus = _ReadBus(m, flg_rd, "flags", ("host", "i2c"))
        pay_data, flg_data = pay_bus.data, flg_bus.data
        m.d.comb += wd.data.eq(pay_data)

        # ---- sequencer (host commands, placement, publication) ----------------------
        cmd = Signal(HostCommandLayout)
        # Copies of the command's data, loaded with it, for the memories it writes: the five
        # flag memories, the payload write register and the GPR files each take theirs, not
        # one register's bus fanned out across the store (issue #9, decision T38).
        cmd_data = {name: Signal(64, name=f"cmd_data_{name}", attrs=KEEP)
                    for name in ("flags", "payload", "gprs")}
        rsp = Signal(HostResponseLayout)
        rsp_valid = Signal()
        stage = Signal(128)                    # DESC_PART staging register
        ok = Signal()
        # IDLE has a copy per command-data copy: their enable (223 sinks of one flip-flop,
        # 8.52 ns of routing in session 25's route) is split (decision T41).
        seq = _OneHotFSM(m, _SEQ_STATES, "seq", copies={"IDLE": len(cmd_data)})
        on = seq.on
        m.d.comb += [self.host_rsp.payload.eq(rsp), self.host_rsp.valid.eq(rsp_valid)]
        with m.If(self.host_rsp.ready):
            m.d.sync += rsp_valid.eq(0)

        # Placement walk: PE p, output j.  ``placed`` marks what must be freed on failure.
        walk_pe = Signal(2)
        walk_j = Signal(2)
        placed = Signal(16)
        bases = Array(Array(Signal(cw, name=f"base{p}_{j}") for j in range(3))
                      for p in range(PE_COUNT))
        for p in range(PE_COUNT):
            for j in range(3):
                m.d.comb += self.out_base[p][j].eq(bases[p][j])
        # ... and one past its last CELL, which an ABORT's or a failed PLACE's mark frees up
        # to without an adder behind the walk's multiplexer (T27).
        ends = Array(Array(Signal(max(pad).bit_length(), name=f"end{p}_{j}") for j in range(3))
                     for p in range(PE_COUNT))
        # The running TIMG2COL job's source (T15): the block RAMs' read registers hold the
        # entry that ``src_load`` read and the feature-map part read last, for the engine's
        # feature-map load (T20); a copy of the entry made a cycle later feeds the job's
        # formation (T23) and the element port, with the PE, its placed output's base and,
        # from the copy a cycle later again, the valid region's bounds in storage order
        # (implicit flags, T5).  The block RAMs' outputs reach only registers here.
        # The part and its ``fm_set`` bit go out apart, each from its block RAM, and the
        # engine zeroes an unwritten part after its beat register (decision T33).
        m.d.comb += [self.src_fm.eq(fm_rd.data),
                     self.src_fm_set.eq(l_rd.data.fm_set.bit_select(fm_read_part, 1))]
        src_latch = Signal()                    # the read registers hold PE src_pe's source
        index_w = len(self.i2c.src_req.payload)
        src = _ElementSource(
            pe=Signal(PE_COUNT, name="src_pe"), entry=Signal(self.local_entry, name="src_entry"),
            rows_end=Signal(index_w + 1, name="src_rows_end"),
            col_mask=Signal(16, name="src_col_mask"), dst_base=Signal(cw, name="src_dst_base"))
        m.d.comb += self.src_desc.eq(src.entry.desc)
        # Row r of a row-major tile with Col (a power of two) physical columns starts at
        # storage index r * Col: "row < ValidRow" is "index < ValidRow * Col", a product
        # the DSP block forms once per job instead of a shifter per request (T19).
        ld = src.entry.desc
        # The product is registered before it is saturated (the DSP block's output is slow,
        # decision T24); the bound is ready four cycles after ``src_load``.
        rows_end = Signal(32, name="src_rows_end_full")
        m.d.sync += [rows_end.eq(ld.valid_rows * ld.phys_cols), src.col_mask.eq(ld.phys_cols - 1),
                     src.rows_end.eq(Mux(rows_end[index_w:] != 0, 1 << index_w,
                                         rows_end[:index_w]))]
        m.d.sync += src_latch.eq(0)
        with m.If(src_latch):
            m.d.sync += [src.entry.eq(l_rd.data),
                         src.dst_base.eq(one_hot_select(src.pe, [b[0] for b in bases]))]

        # The plan, registered: it holds from the PLACE request to PUBLISH or ABORT, and the
        # preflight forms it in logic from its record, so the store reads only this copy,
        # valid from the cycle after the request (T31).
        plan = Signal.like(self.plan, name="plan_r")
        m.d.sync += plan.eq(self.plan)
        outs = plan.outputs
        source = Cat(plan.operands[9].index[:6], self.src_pe)     # its Local entry
        src_local = Signal(8, name="src_local")                   # ... as ``src_load`` read it
        # Each output's CELLs, registered from the copy: PLACE's walk reads them from the
        # second cycle after the request (T13, T24, T31).
        out_cells = Array(Signal(13, name=f"out_cells{j}") for j in range(len(outs)))
        for cells_r, o in zip(out_cells, outs):
            m.d.sync += cells_r.eq(Mux(o.role == OutputRole.NONE, 0,
                                       (Const(1, 13) << (o.size_code - 1)[:4])[:13]))
        # Bit 3p + j: output j is placed / published on PE p (the plan's mask has PE0 in bit
        # 3), in the walks' order.  A walk loads it from the copy and shifts it as it
        # advances, so the pair it stands at is bit 0 of a register (T31).
        todo = Cat(*(plan.pe_mask[3 - p] & (o.role != OutputRole.NONE)
                     for p in range(PE_COUNT) for o in outs))
        walk_left = Signal(len(todo), name="walk_left")
        walk_todo = walk_left[0]

        # The allocator: first fit over the bitmap of ``scan_space``, 8 CELLs per cycle, in
        # two stages (decision T13).  FETCH registers the next 8-CELL chunk; EVAL looks in
        # the registered chunk for the first CELL where a free run of ``scan_need`` CELLs
        # ends (from the chunk and the free run carried over from the chunks before it) and
        # registers it (``scan_found``, ``scan_last``) or that the last chunk held none
        # (``scan_failed``), a verdict shown for one cycle.  ``start_scan`` (with
        # ``scan_space`` / ``scan_need``) resets the scan's registers a cycle later
        # (``scan_begin``, a flip-flop), which sets ``scan_active`` until the verdict (T27).
        scan_space = Signal(3)
        scan_need = Signal(13)
        run_w = max(pad).bit_length()           # a free run, a CELL index or an end CELL
        scan_pos = Signal(range(max(pad) // SCAN_CELLS_PER_CYCLE + 1))
        chunks = Array(pad[s] // SCAN_CELLS_PER_CYCLE for s in spaces)
        start_scan = Signal()
        scan_active = Signal()
        chunk = Signal(SCAN_CELLS_PER_CYCLE)    # EVAL: the chunk FETCH registered
        chunk_pos = Signal.like(scan_pos)
        chunk_last = Signal()
        chunk_valid = Signal()
        run = Signal(run_w)                     # free CELLs right before ``chunk``
        scan_found = Signal()
        scan_failed = Signal()
        scan_last = Signal(run_w)               # the last CELL of the first fitting run
        scan_hit = Signal()                     # EVAL found the chunk of the first fit
        scan_begin = Signal()                   # the cycle after ``start_scan``
        m.d.sync += scan_begin.eq(start_scan)
        with m.If(scan_begin):
            m.d.sync += [scan_active.eq(1), scan_pos.eq(0), chunk_valid.eq(0), run.eq(0)]
        # The scan state acts on the verdict in the one cycle it shows, and the scan ends.
        with m.If(scan_found | scan_failed):
            m.d.sync += [scan_active.eq(0), scan_found.eq(0), scan_failed.eq(0),
                         scan_hit.eq(0)]
        with m.If(scan_active):
            m.d.sync += [
                chunk.eq(Array(bitmap[s].word_select(scan_pos, SCAN_CELLS_PER_CYCLE)
                               for s in spaces)[scan_space]),
                chunk_pos.eq(scan_pos), chunk_last.eq(scan_pos == chunks[scan_space] - 1),
                chunk_valid.eq(1), scan_pos.eq(scan_pos + 1)]
        # Facts of ``scan_need``, registered before the first chunk is evaluated, in two
        # stages (the compares and the differences, then the choices, T27): ``need <= c``,
        # need as one-hot for runs that lie inside one chunk, and the carried run a hit at
        # chunk CELL k needs if the next chunk is free (``need - k - 9``, above any run when
        # need is 0 or too big, T31).
        limit = max(pad) + 1
        c_w = SCAN_CELLS_PER_CYCLE
        need_le = {c: Signal(name=f"scan_need_le{c}") for c in range(1, 2 * c_w + 1)}
        need_after_free = [Signal(run_w, name=f"scan_need_after_free{k}") for k in range(c_w)]
        need_is = [Signal(name=f"scan_need_is{n}") for n in range(c_w + 1)]
        need_zero = Signal(name="scan_need_zero")
        m.d.sync += need_zero.eq(scan_need == 0)
        for c, le_c in need_le.items():
            m.d.sync += le_c.eq(scan_need <= c)
        for k, after_free in enumerate(need_after_free):
            big = Signal(name=f"scan_need_big{k}")
            less = Signal(run_w, name=f"scan_need_less{k}")
            m.d.sync += [big.eq(scan_need >= limit + k + 1), less.eq(scan_need - (k + 1 + c_w)),
                         after_free.eq(Mux(need_zero | big, limit,
                                           Mux(need_le[k + 1 + c_w], 0, less)))]
        for n in range(1, c_w + 1):
            m.d.sync += need_is[n].eq(scan_need == n)
        # ... and, for a chunk that is not all free, the chunk CELLs that must be free for
        # the run after it (its free CELLs at the end) to reach ``need - k - 1``: the last
        # ``need - k - 1`` (all of them when that is 8 or more, or need is 0).
        need_tail = [Signal(c_w, name=f"scan_need_tail{k}") for k in range(c_w)]
        for k, tail in enumerate(need_tail):
            m.d.sync += tail.eq(Cat(*(need_zero | ~need_le[k + c_w - j] for j in range(c_w))))
        free = ~chunk
        trailing = Signal(range(SCAN_CELLS_PER_CYCLE + 1))
        for k in reversed(range(SCAN_CELLS_PER_CYCLE)):
            with m.If(free[k:].all()):
                m.d.comb += trailing.eq(SCAN_CELLS_PER_CYCLE - k)
        # Bit k: the carried run is long enough for a hit at chunk CELL k (``run`` >= need -
        # k - 1, never when need is 0 or above any run), a register that follows ``run``
        # (T31): from ``need <= k + 1`` before the first chunk, then for the run after each
        # chunk: ``run + 8`` when the chunk was free, else its free CELLs at the end.
        run_ok = Signal(c_w, name="scan_run_ok")
        run_ok_next = Signal(c_w, name="scan_run_ok_next")
        for k in range(c_w):
            m.d.comb += run_ok_next[k].eq(Mux(free.all(), run >= need_after_free[k],
                                              (chunk & need_tail[k]) == 0))
        with m.If(scan_active & ~chunk_valid):
            m.d.sync += run_ok.eq(Cat(*(~need_zero & need_le[k + 1] for k in range(c_w))))
        hits = Signal(SCAN_CELLS_PER_CYCLE)
        for k in range(SCAN_CELLS_PER_CYCLE):
            inside = Cat(*(need_is[n] & free[k - n + 1:k + 1].all() for n in range(1, k + 2)))
            m.d.comb += hits[k].eq((free[:k + 1].all() & run_ok[k]) | inside.any())
        # The hit chunk's CELLs that end a fitting run are registered, and the first of them
        # a cycle later with ``scan_found`` (T27).  They follow every chunk until a hit and
        # hold from then on, so their enable is ``scan_hit``'s flip-flop, not the hit test
        # (T30).
        hit_cells = Signal(SCAN_CELLS_PER_CYCLE, name="scan_hit_cells")
        hit_pos = Signal.like(chunk_pos, name="scan_hit_pos")
        first = Signal(range(SCAN_CELLS_PER_CYCLE))
        for k in reversed(range(SCAN_CELLS_PER_CYCLE)):
            with m.If(hit_cells[k]):
                m.d.comb += first.eq(k)
        with m.If(~scan_hit):
            m.d.sync += [hit_cells.eq(hits), hit_pos.eq(chunk_pos)]
        with m.If(scan_active & chunk_valid & ~scan_hit & ~scan_failed):
            m.d.sync += [run.eq(Mux(free.all(), run + SCAN_CELLS_PER_CYCLE, trailing)),
                         run_ok.eq(run_ok_next)]
            with m.If(hits.any()):
                m.d.sync += scan_hit.eq(1)
            with m.Elif(chunk_last):
                m.d.sync += scan_failed.eq(1)
        with m.If(scan_hit & ~scan_found):     # (a scan ends with scan_found set)
            m.d.sync += [scan_found.eq(1), scan_last.eq(Cat(first, hit_pos))]
        # One past the run and its first CELL, each one carry chain from registers.
        need_less1 = Signal(run_w)
        m.d.sync += need_less1.eq(scan_need - 1)
        scan_end = Signal(run_w)
        scan_base = Signal(run_w)
        m.d.comb += [scan_end.eq(scan_last + 1), scan_base.eq(scan_last - need_less1)]

        # One range-mask generator for marking / freeing CELLs [base, end).  The request is
        # registered, then the mask, and the bitmap changes two cycles after the request, so
        # the scan, the mask and the update are three paths (decisions T12, T24).  No scan
        # reads the bitmap meanwhile: PLACE_NEXT waits while a mark is in its first stage,
        # and a host command's scan starts four cycles or more after a command that marked.
        mark_space = Signal(3)
        mark_base = Signal(run_w)
        mark_end = Signal(run_w)
        mark_set = Signal()
        mark_clear = Signal()
        marking = {name: Signal.like(value, name=f"{name}_r") for name, value in (
            ("space", mark_space), ("base", mark_base), ("end", mark_end),
            ("set", mark_set), ("clear", mark_clear))}
        m.d.sync += [marking["space"].eq(mark_space), marking["base"].eq(mark_base),
                     marking["end"].eq(mark_end), marking["set"].eq(mark_set),
                     marking["clear"].eq(mark_clear)]
        mark_pending = marking["set"] | marking["clear"]
        # Bit i: base <= i < end, from two thermometer codes (T14), and which bitmap it sets
        # or clears, registered.
        range_mask = Signal(max(pad), name="mark_mask")
        # The bitmap a mark changes (one-hot) and whether it sets, each a flip-flop: the
        # bitmaps' enables and the set / clear select come straight from registers (T27).
        mark_spaces = Signal(len(spaces), name="mark_spaces")
        mark_sets = Signal(name="mark_sets")
        m.d.sync += [
            range_mask.eq(_thermometer(m, marking["end"], max(pad), "mark_below_end")
                          & ~_thermometer(m, marking["base"], max(pad), "mark_below_base")),
            mark_spaces.eq(Cat(*((marking["space"] == s) & mark_pending for s in spaces))),
            mark_sets.eq(marking["set"])]
        for s in spaces:
            mask = range_mask[:pad[s]]
            with m.If(mark_spaces[s]):
                m.d.sync += bitmap[s].eq(Mux(mark_sets, bitmap[s] | mask, bitmap[s] & ~mask))

        # Facts of the host command's register: its entries were read when the command was
        # taken, and the read registers hold them until the command ends.
        space = Value.cast(cmd.space)
        is_pe = space < PE_COUNT
        idx = cmd.index
        le, se = lh_out, sh_out
        allocated = Mux(is_pe, le.desc.allocated, se.desc.allocation_mask != 0)
        reg_cells = Mux(is_pe, le.desc.cells, se.desc.cells)
        reg_base = Mux(is_pe, le.base, se.base)

        # The answer (decisions T26, T33): the states say whether they answer, and the
        # response register loads whenever no answer is pending (a command starts only
        # then), from an AND-OR of the answers under flip-flop selects, one per state that
        # may answer, set whether or not it answers: a word loaded without an answer is
        # never shown, so the states' decisions reach only ``rsp_valid`` and ``rsp.error``.
        answer, answer_error = Signal(), Signal()
        with m.If(answer):
            m.d.sync += rsp_valid.eq(1)

        def reply():
            m.d.comb += answer.eq(1)

        def fail():
            m.d.comb += [answer.eq(1), answer_error.eq(1)]

        read_flags = Signal()
        # HOST_ISSUE: the payload / flag memory a READ_WORD / READ_FLAGS reads (one-hot),
        # registered in HOST (decision T26).
        host_rd_pay = Signal(len(spaces), name="host_rd_pay")
        host_rd_flg = Signal(len(spaces), name="host_rd_flg")
        m.d.sync += [host_rd_pay.eq(0), host_rd_flg.eq(0)]
        # HOST_READ: the payload and the flag word read, each registered from its read-data
        # bus, and HOST_REPLY chooses (decision T24).
        read_word = Signal(64)
        read_flag_word = Signal(64)
        synth_wait = Signal(range(IMPLICIT_CYCLES))
        cfg_base = Signal(run_w)
        cfg_end = Signal(run_w)
        cfg_bytes = Signal(32)                  # the new register's share of capacity in use
        clear_pos = Signal(cw + 3)
        clear_end = Signal(cw + 3)
        clear_last = Signal()                   # CFG_CLEAR's last word: clear_pos + 1 == end
        undef_init = Signal(UNDEFINED_WIDTH)

        # Publication in two stages (decision T24): PUBLISH registers the entry of output
        # (walk_pe, walk_j) here; the next cycle writes it, marks the register held and
        # charges its bytes, so the walk's multiplexers end at these registers.
        pub_en = Signal()
        pub_pe = Signal(2)
        pub_index = Signal(6)
        pub_entry = Signal(self.local_entry)
        pub_bytes = Signal(20)
        m.d.sync += pub_en.eq(0)
        # FREE uncharges the register's bytes (CELLs x owners) the cycle after HOST, from a
        # product of ``f_cells`` and ``f_owners`` registered meanwhile; its response is still
        # pending then, so no agent reads the counters before (decision T24).
        free_en = Signal()
        free_bytes = Signal(32)
        m.d.sync += free_en.eq(0)
        staged_l = data.View(TileDescLayout, stage[:TileDescLayout.size])
        staged_s = data.View(SharedDescLayout, stage[:SharedDescLayout.size])
        popcnt = sum(staged_s.allocation_mask[k] for k in range(4))
        # CONFIGURE's undefined count (valid rows x columns, saturated) of the staged
        # descriptor: the product registered, then saturated.  The stage changes only in a
        # DESC_PART command, at least four cycles before the next command's HOST (decisions
        # T13, T24).
        undef_l, undef_s = Signal(UNDEFINED_WIDTH), Signal(UNDEFINED_WIDTH)
        for reg, staged, name in ((undef_l, staged_l, "l"), (undef_s, staged_s, "s")):
            product = Signal(32, name=f"undef_{name}_product")
            m.d.sync += [product.eq(staged.valid_rows * staged.valid_cols),
                         reg.eq(Mux(product >> UNDEFINED_WIDTH, (1 << UNDEFINED_WIDTH) - 1,
                                    product))]

        # Facts of the host command, registered in HOST_FACTS from the entries read when
        # the command was taken, so that HOST decides from registers (decision T13).
        f_allocated, f_word_ok, f_flag_ok = Signal(), Signal(), Signal()
        f_bad_space, f_bad_index = Signal(), Signal()   # refused whatever the register
        f_wide = Signal()                       # data does not fit an undefined count
        f_word_addr, f_flag_addr = Signal(ww), Signal(ww)
        f_space = Signal(len(spaces), name="f_space")   # one-hot: the command's memory
        f_base = Signal(run_w)                  # the register's first CELL
        # The command's own facts, so HOST's choices test single bits (decision T24): the op
        # one-hot (all clear for an unknown op), ``addr`` == k for k < 8, the GPR number out
        # of range or zero, and CONFIGURE's checks of the staged descriptor.
        f_op = Signal(len(HostOp), name="f_op")
        f_addr = Signal(8, name="f_addr")
        # ``addr`` below each bound a check tests, and a read-only system register: every
        # address check is then one flip-flop, not an OR of ``f_addr`` bits (T37).
        addr_bounds = {"desc_part": 2, "desc": max(1, DESC_PART_BASE, DESC_PART_UNDEFINED) + 1,
                       "sys": len(SysReg), "fm": FM_PARTS}
        f_addr_in = {name: Signal(name=f"f_addr_in_{name}") for name in addr_bounds}
        f_sys_read_only = Signal(name="f_sys_read_only")
        f_gpr_bad, f_gpr_zero = Signal(), Signal()
        f_cfg_bad, f_cfg_big = Signal(), Signal()
        need = Mux(is_pe, staged_l.cells, staged_s.cells)
        # CONFIGURE's bytes, registered in every cycle in two stages from the command and
        # the staged descriptor, which hold from HOST_READS on: ready before HOST, read in
        # CFG_INSTALL (T33).  The owners (1 to 4, one-hot) choose a multiple of the bytes.
        need_bytes = Signal(len(need) + 7, name="cfg_need_bytes")
        need_bytes3 = Signal(len(need) + 9, name="cfg_need_bytes3")
        cfg_owners = Signal(4, name="cfg_owners")
        m.d.sync += [need_bytes.eq(need << 7), need_bytes3.eq((need * 3) << 7),
                     cfg_owners.eq(Mux(is_pe, 1, Cat(*(popcnt == n for n in range(1, 5))))),
                     cfg_bytes.eq(one_hot_select(cfg_owners, [
                         need_bytes, need_bytes << 1, need_bytes3, need_bytes << 2]))]
        f_cells = Signal(12)                    # its CELLs, and the PEs that hold them
        f_owners = Signal(3)
        f_synth = Signal()                      # a published PE output: its flags implicit
        f_cube_synth = Signal()                 # ... in a CUBE layout (no flags to read)
        # The answer of a descriptor, feature-map, GPR or system-register read, in two
        # stages (decisions T24, T26, T31).  HOST_FACTS registers from the read registers
        # the descriptor's two parts and the undefined count, each an AND-OR of the Local
        # and the Shared entry under one-hot selects, the GPR under its select, the
        # feature-map part and whether it was written since allocation (T20): one LUT after
        # the block RAMs' outputs.  HOST_CHECK ORs them, the base (``f_base`` of an
        # allocated register) and a system register (copied from the system registers in
        # every cycle: nothing changes them while a host command runs) into ``f_value``.
        f_parts = {name: Signal(64, name=f"f_value_{name}")
                   for name in ("desc0", "desc1", "undef", "gpr", "fm")}
        f_fm_set = Signal(name="f_fm_set")
        f_value = Signal(64, name="f_value")
        sel_names = ("desc0_pe", "desc0_sh", "desc1_pe", "desc1_sh", "undef_pe", "undef_sh",
                     "gpr", "base", "sys")
        value_sel = Signal(len(sel_names), name="value_sel")
        vsel = {name: value_sel[k] for k, name in enumerate(sel_names)}
        sys_value = Signal(64, name="sys_value")
        fm_sel = Signal(FM_PARTS, name="fm_sel")  # READ_FM of part k
        # The implicit flags' geometry: physical columns, columns - 1, the valid region; the
        # flags of word ``cmd.addr`` follow IMPLICIT_CYCLES after HOST_FACTS.
        f_pc_cols, f_pc_mask = Signal(16, name="f_pc_cols"), Signal(16, name="f_pc_mask")
        f_rows, f_cols = Signal(16), Signal(16)
        read_synth = _implicit_flags(m, cmd.addr, f_pc_cols, f_pc_mask, f_rows, f_cols,
                                     "read_synth")

        # HOST_CHECK registers the outcome of the command's checks from the facts (decision
        # T27), every cycle: the facts hold from HOST_FACTS to the command's end.  ``h_ok``
        # bit k: op k passes every check; ``h_err``: the first check that failed, in the
        # order of the command's description (``docs/hdl-top.md``).  HOST then acts on single
        # bits, and the register files' write inputs are a multiplexer of registers under
        # register selects (``host_now``, ``cfg_now``, ``clearing``, ``pub_en``).
        ops = {op: f_op[op.value] for op in HostOp}
        not_allocated = (~f_allocated, HostError.NOT_ALLOCATED)
        checks = {
            HostOp.DESC_PART: [(~f_addr_in["desc_part"], HostError.OUT_OF_RANGE)],
            HostOp.CONFIGURE: [(f_allocated, HostError.ALLOCATED),
                               (f_cfg_bad, HostError.BAD_DESCRIPTOR),
                               (f_cfg_big, HostError.NO_SPACE)],
            HostOp.FREE: [not_allocated],
            HostOp.WRITE_WORD: [not_allocated, (~f_word_ok, HostError.OUT_OF_RANGE)],
            HostOp.READ_WORD: [not_allocated, (~f_word_ok, HostError.OUT_OF_RANGE)],
            HostOp.WRITE_FLAGS: [not_allocated, (~f_flag_ok, HostError.OUT_OF_RANGE)],
            HostOp.READ_FLAGS: [not_allocated, (~f_flag_ok, HostError.OUT_OF_RANGE),
                                (f_cube_synth, HostError.NOT_EXPLICIT)],
            HostOp.SET_UNDEFINED: [not_allocated, (f_wide, HostError.OUT_OF_RANGE)],
            HostOp.READ_DESC: [(~f_addr_in["desc"], HostError.OUT_OF_RANGE)],
            HostOp.WRITE_GPR: [(f_gpr_zero | f_gpr_bad, HostError.BAD_INDEX)],
            HostOp.READ_GPR: [(f_gpr_bad, HostError.BAD_INDEX)],
            HostOp.WRITE_SYS: [(f_sys_read_only, HostError.READ_ONLY),
                               (~f_addr_in["sys"], HostError.BAD_INDEX)],
            HostOp.READ_SYS: [(~f_addr_in["sys"], HostError.BAD_INDEX)],
        }
        for op in (HostOp.WRITE_FM, HostOp.READ_FM):
            checks[op] = [(~is_pe, HostError.BAD_SPACE), not_allocated,
                          (~f_addr_in["fm"], HostError.OUT_OF_RANGE)]
        op_errors = []
        for op in HostOp:
            error = Const(HostError.NONE.value, HostError.as_shape())
            for failed, code in reversed(checks.get(op, [])):
                error = Mux(failed, code, error)
            op_errors.append(error)
        error = Mux(f_bad_space, HostError.BAD_SPACE,
                    Mux(f_bad_index, HostError.BAD_INDEX,
                        Mux(f_op.any(), one_hot_select(f_op, op_errors), HostError.BAD_OP)))
        host_now = on["HOST"]
        # FREE's end CELL: base + cells of each table's entry, registered with the facts, then
        # the choice and the saturation (one carry chain per stage, T31).
        f_ends = [Signal(max(run_w, len(f_cells)) + 1, name=f"f_end_{t}") for t in ("pe", "sh")]
        f_end = Mux(is_pe, *f_ends)
        h_end = Signal(run_w, name="h_end")
        cfg_now = on["CFG_INSTALL"]
        clearing = on["CFG_CLEAR"]
        h_ok = Signal(len(HostOp), name="h_ok")
        h_stage = Signal(2, name="h_stage")     # DESC_PART's halves of ``stage``
        h_err = Signal(HostError.as_shape(), name="h_err")
        h_fail, h_value = Signal(name="h_fail"), Signal(name="h_value")
        h_wr_local, h_wr_shared = Signal(name="h_wr_local"), Signal(name="h_wr_shared")
        # The entries a FREE, WRITE_FLAGS (of a published output), SET_UNDEFINED or
        # WRITE_FM writes: a copy of the register's entry, changed by the op.
        h_local = Signal(self.local_entry, name="h_local", reset_less=True)
        h_shared = Signal(self.shared_entry, name="h_shared", reset_less=True)
        passed = Signal(len(HostOp), name="h_passed")
        # An op passes when none of its checks fails: a NOR of the check bits, not a compare
        # of the error code its priority chain selects (which put the chain in series).
        m.d.comb += passed.eq(Mux(f_bad_space | f_bad_index, 0, Cat(*(
            ops[op] & ~Cat(*(failed for failed, _ in checks.get(op, []))).any()
            for op in HostOp))))
        # The outcome's bits hold only in HOST (T33): HOST's writes and answers are
        # enabled by flip-flops, not by the state's decode and a bit.
        checking = on["HOST_CHECK"]
        m.d.sync += [
            h_ok.eq(Mux(checking, passed, 0)), h_err.eq(error),
            h_stage.eq(Mux(checking & passed[HostOp.DESC_PART.value], f_addr[:2], 0)),
            f_value.eq(f_parts["desc0"] | f_parts["desc1"] | f_parts["undef"] | f_parts["gpr"]
                       | Mux(f_fm_set, f_parts["fm"], 0)
                       | Mux(vsel["base"] & f_allocated, f_base, 0)
                       | Mux(vsel["sys"], sys_value, 0)),
            # The payload and flag word addresses, and FREE's saturated end CELL.
            f_word_addr.eq((f_base << 4) + cmd.addr), f_flag_addr.eq((f_base << 2) + cmd.addr),
            h_end.eq(Mux(f_end > max(pad), max(pad), f_end)),
            h_fail.eq(checking & ~passed.any()),        # error != NONE
            h_value.eq(checking & Cat(*(passed[op.value] for op in (
                HostOp.READ_DESC, HostOp.READ_FM, HostOp.READ_GPR, HostOp.READ_SYS))).any()),
            h_wr_local.eq(checking & (is_pe & Cat(*(passed[op.value] for op in (
                HostOp.FREE, HostOp.SET_UNDEFINED, HostOp.WRITE_FM))).any()
                                      | passed[HostOp.WRITE_FLAGS.value] & f_synth)),
            h_wr_shared.eq(checking & ~is_pe & (passed[HostOp.FREE.value]
                                                | passed[HostOp.SET_UNDEFINED.value])),
            h_local.eq(le), h_local.undef.eq(Mux(ops[HostOp.SET_UNDEFINED], cmd.data,
                                                 le.undef)),
            h_local.synth.eq(le.synth & ~ops[HostOp.WRITE_FLAGS]),
            h_local.fm_set.eq(le.fm_set
                              | Mux(ops[HostOp.WRITE_FM], 1 << cmd.addr[:3], 0)),
            h_shared.eq(se), h_shared.undef.eq(cmd.data),
        ]
        with m.If(ops[HostOp.FREE]):
            m.d.sync += [h_local.eq(0), h_shared.eq(0)]

        host_go = self.host_cmd.valid & self.host_enable & ~rsp_valid
        # The feature-map memory's read address, chosen by registers and ``src_load`` alone:
        # the sequencer's decisions reach only the read enable (T27).  HOST_READS reads the
        # command's part (a part number READ_FM refuses reads part 0, inside the memory),
        # ``src_load`` / ``src_fm_read`` the source's part ``src_fm_part``.
        reads_now = on["HOST_READS"]
        host_part = cmd.addr[:3]
        fm_entry = Mux(reads_now, Cat(idx[:6], space[:2]), Mux(self.src_load, source, src_local))
        fm_rd_part = Mux(reads_now, Mux(host_part < FM_PARTS, host_part, 0), self.src_fm_part)
        m.d.comb += fm_rd.addr.eq(Cat(fm_entry, fm_rd_part))
        with m.If(fm_rd.en):
            m.d.sync += fm_read_part.eq(fm_rd_part)
        busy = Signal()
        m.d.comb += [busy.eq(~on["IDLE"] & ~on["PLACE_END"]), self.idle.eq(~busy & ~rsp_valid)]
        # A mark's CELLs are chosen by the state that may mark, under its flip-flop, whether
        # or not it marks in the cycle (only ``mark_set`` / ``mark_clear`` say so, T33).
        m.d.comb += [
            mark_space.eq(one_hot_select(
                Cat(on["HOST"] | on["CFG_INSTALL"], on["PLACE_SCAN"] | on["FREE_PLACED"]),
                [space, walk_pe])),
            mark_base.eq(one_hot_select(
                Cat(on["HOST"], on["CFG_INSTALL"], on["PLACE_SCAN"], on["FREE_PLACED"]),
                [f_base, cfg_base, scan_base, bases[walk_pe][walk_j]])),
            mark_end.eq(one_hot_select(
                Cat(on["HOST"], on["CFG_INSTALL"], on["PLACE_SCAN"], on["FREE_PLACED"]),
                [h_end, cfg_end, scan_end, ends[walk_pe][walk_j]]))]
        # HOST_REPLY's answer, chosen as the state is entered (T33).
        answer_word, answer_flags, answer_synth = (Signal(name=f"answer_{n}")
                                                   for n in ("word", "flags", "synth"))
        m.d.sync += [answer_word.eq(0), answer_flags.eq(0), answer_synth.eq(0)]

        def to_reply():
            seq.goto("HOST_REPLY")
            m.d.sync += [answer_word.eq(~read_flags), answer_flags.eq(read_flags & ~f_synth),
                         answer_synth.eq(read_flags & f_synth)]

        with m.If(~rsp_valid):
            m.d.sync += [
                rsp.data.eq(one_hot_select(
                    Cat(h_fail, on["CFG_SCAN"], h_value, answer_word, answer_flags, answer_synth,
                        on["CFG_CLEAR"]),
                    [h_err, Const(HostError.NO_SPACE.value, HostError.as_shape()), f_value,
                     read_word, read_flag_word, read_synth, cfg_base])),
                rsp.error.eq(answer_error)]
        # HOST's register writes and payload write, under flip-flops of HOST_CHECK (T33).
        for k, part in enumerate((stage[:64], stage[64:])):
            with m.If(h_stage[k]):
                m.d.sync += part.eq(cmd.data)
        write_payload(h_ok[HostOp.WRITE_WORD.value], [Mux(f_space[s], 0xFF, 0) for s in spaces],
                      f_word_addr, cmd_data["payload"])
        with m.If(h_ok[HostOp.WRITE_SYS.value]):
            with m.If(f_addr[SysReg.TILE_CAPACITY.value]):
                m.d.sync += capacity.eq(cmd.data)
            with m.If(f_addr[SysReg.STATUS.value]):
                m.d.sync += status.eq(cmd.data)
        with m.If(h_ok[HostOp.FREE.value]):
            # Saturated: the mask then covers the same CELLs as base + cells.
            m.d.comb += mark_clear.eq(1)
            m.d.sync += free_en.eq(1)

        # The walks' position moves under two strobes of the states, so each of its
        # registers has one enable, not a multiplexer per state (T33); a step from the last
        # pair wraps to PE0's first.
        walk_step, walk_zero = Signal(name="walk_step"), Signal(name="walk_zero")
        walk_last = (walk_pe == PE_COUNT - 1) & (walk_j == 2)
        with m.If(walk_zero):
            m.d.sync += [walk_pe.eq(0), walk_j.eq(0)]
        with m.Elif(walk_step):
            m.d.sync += walk_left.eq(walk_left >> 1)
            with m.If(walk_j == 2):
                m.d.sync += [walk_j.eq(0), walk_pe.eq(walk_pe + 1)]
            with m.Else():
                m.d.sync += walk_j.eq(walk_j + 1)

        def advance(same, last):
            """The walk steps to its next (PE, output) pair, in state ``same`` or, after the
            last pair, ``last``."""
            m.d.comb += walk_step.eq(1)
            with m.If(walk_last):
                seq.goto(last)
            with m.Else():
                seq.goto(same)

        # The walks' registers load in every idle cycle: the request's handshake reaches only
        # the state flip-flops (T33).
        with seq.state("IDLE"):
            m.d.comb += walk_zero.eq(1)
            m.d.sync += [ok.eq(1), walk_left.eq(todo)]
            # The source's entry is the Local file's address in every idle cycle that no
            # other agent reads it: ``src_load`` reaches only the read's enable (T33).
            m.d.comb += l_rd.addr.eq(source)
            with m.If(self.req_valid & (self.req != StoreOp.NONE)):
                with m.Switch(self.req):
                    with m.Case(StoreOp.PLACE):
                        seq.goto("PLACE_PLAN")
                    with m.Case(StoreOp.PUBLISH):
                        seq.goto("PUBLISH")
                    with m.Case(StoreOp.ABORT):
                        seq.goto("FREE_PLACED")
            with m.Elif(self.src_load):
                m.d.comb += l_rd.en.eq(1)
                read_fm()
                m.d.sync += [src_latch.eq(1), src.pe.eq(1 << self.src_pe),
                             src_local.eq(source)]
            with m.Elif(self.src_fm_read):
                read_fm()
            with m.Elif(host_go):
                m.d.comb += self.host_cmd.ready.eq(1)
                seq.goto("HOST_READS")
            # The command register loads in every idle cycle: it holds the command from
            # the one that takes it (its fields are read only after, decision T26).
            m.d.sync += cmd.eq(self.host_cmd.payload)
        for idle, copy in zip(seq.copy["IDLE"], cmd_data.values()):
            with m.If(idle):
                m.d.sync += copy.eq(self.host_cmd.payload.data)

        with seq.state("HOST_READS"):
            # The command's entries are read from the command register, and the answer's
            # source is chosen (below, T24), a cycle after the take (decision T26).
            seq.goto("HOST_LOAD")
            m.d.comb += [lh_rd.en.eq(1), lh_rd.addr.eq(Cat(idx[:6], space[:2])),
                         sh_rd.en.eq(1), sh_rd.addr.eq(idx)]
            read_fm(), read_gpr(idx[:5])

        with seq.state("HOST_LOAD"):
            # The entries read move into the host copies' output registers (T42).
            seq.goto("HOST_FACTS")

        # ---- host commands ------------------------------------------------------------
        with seq.state("HOST_FACTS"):
            # The facts (below) are registered from the entries read.
            seq.goto("HOST_CHECK")
            lv, sv = le.desc.as_value(), se.desc.as_value()
            for name, pe_value, sh_value in (("desc0", lv[:64], sv[:64]),
                                             ("desc1", lv[64:], sv[64:]),
                                             ("undef", le.undef, se.undef)):
                m.d.sync += f_parts[name].eq(Mux(vsel[f"{name}_pe"], pe_value, 0)
                                             | Mux(vsel[f"{name}_sh"], sh_value, 0))
            m.d.sync += [f_parts["gpr"].eq(Mux(vsel["gpr"], g_rd.data, 0)),
                         f_parts["fm"].eq(fm_rd.data),
                         f_fm_set.eq((fm_sel & le.fm_set).any())]

        with seq.state("HOST_CHECK"):
            # The checks' outcome (``h_*``) is registered from the facts (T27).
            seq.goto("HOST")

        with seq.state("HOST"):
            # Every choice is a bit registered in HOST_CHECK; the register-file writes
            # follow from them above and below, outside the state machine (T27, T33).
            with m.If(h_fail):
                fail()
                seq.goto("IDLE")
            with m.Elif(h_value):
                reply()
                seq.goto("IDLE")
            with m.Elif(h_ok[HostOp.CONFIGURE.value]):
                m.d.comb += start_scan.eq(1)
                m.d.sync += [scan_space.eq(space), scan_need.eq(need),
                             undef_init.eq(Mux(is_pe, undef_l, undef_s))]
                seq.goto("CFG_SCAN")
            with m.Elif(h_ok[HostOp.READ_WORD.value]):
                m.d.sync += [host_rd_pay.eq(f_space), read_flags.eq(0)]
                seq.goto("HOST_ISSUE")
            with m.Elif(h_ok[HostOp.READ_FLAGS.value]):
                m.d.sync += [host_rd_flg.eq(f_space), read_flags.eq(1)]
                seq.goto("HOST_ISSUE")
            with m.Else():
                reply()
                seq.goto("IDLE")

        with seq.state("HOST_ISSUE"):
            # The read HOST chose, from registers (T26).
            seq.goto("HOST_FETCH")

        with seq.state("HOST_FETCH"):
            # The word moves from the memory's read register to its ``out`` register (T39).
            m.d.comb += [pay_bus.move["host"].eq(1), flg_bus.move["host"].eq(1)]
            seq.goto("HOST_READ")

        with seq.state("HOST_READ"):
            # The word read, registered and answered in HOST_REPLY (T13); a published
            # row-major output's flags (its valid region, decision T5) wait in HOST_SYNTH
            # for the implicit-flag pipeline (T24).
            m.d.sync += synth_wait.eq(0)
            with m.If(read_flags & f_synth):
                seq.goto("HOST_SYNTH")
            with m.Else():
                to_reply()

        with seq.state("HOST_SYNTH"):
            # The pipeline's inputs hold from HOST on: its flags are ready in HOST_REPLY.
            m.d.sync += synth_wait.eq(synth_wait + 1)
            with m.If(synth_wait == IMPLICIT_CYCLES - 4):
                to_reply()

        with seq.state("HOST_REPLY"):
            reply()
            seq.goto("IDLE")

        with seq.state("CFG_SCAN"):
            with m.If(scan_found):
                m.d.sync += [cfg_base.eq(scan_base), cfg_end.eq(scan_end),
                             clear_pos.eq(scan_base << 2), clear_end.eq(scan_end << 2)]
                seq.goto("CFG_INSTALL")
            with m.Elif(scan_failed):
                fail()
                seq.goto("IDLE")

        with seq.state("CFG_INSTALL"):
            m.d.comb += mark_set.eq(1)
            m.d.sync += clear_last.eq(0)
            seq.goto("CFG_CLEAR")

        with seq.state("CFG_CLEAR"):
            # The new register's flags start undefined, one flag word per cycle.
            m.d.sync += [clear_pos.eq(clear_pos + 1),
                         clear_last.eq(clear_pos + 2 == clear_end)]
            with m.If(clear_last):
                reply()
                seq.goto("IDLE")

        # ---- placement of an approved plan -------------------------------------------
        with seq.state("PLACE_PLAN"):
            # The plan's copy is registered; ``out_cells`` follow (T31).
            m.d.sync += [walk_left.eq(todo), placed.eq(0)]
            seq.goto("PLACE_NEXT")

        with seq.state("PLACE_NEXT"):
            with m.If(mark_pending):
                pass                            # the last placement's mark reaches the bitmap
            with m.Elif(walk_todo):
                m.d.comb += start_scan.eq(1)
                m.d.sync += [scan_space.eq(walk_pe), scan_need.eq(out_cells[walk_j])]
                seq.goto("PLACE_SCAN")
            with m.Else():
                advance("PLACE_NEXT", "PLACE_END")

        with seq.state("PLACE_SCAN"):
            with m.If(scan_found):
                m.d.comb += mark_set.eq(1)
                m.d.sync += [bases[walk_pe][walk_j].eq(scan_base),
                             ends[walk_pe][walk_j].eq(scan_end),
                             placed.bit_select(Cat(walk_j, walk_pe), 1).eq(1)]
                advance("PLACE_NEXT", "PLACE_END")
            with m.Elif(scan_failed):
                # Fragmentation: undo what this bundle placed (decision T4).
                m.d.comb += walk_zero.eq(1)
                m.d.sync += ok.eq(0)
                seq.goto("FREE_PLACED")

        with seq.state("PLACE_END"):
            m.d.comb += [self.req_done.eq(1), self.req_ok.eq(ok)]
            seq.goto("IDLE")

        with seq.state("FREE_PLACED"):
            with m.If(placed.bit_select(Cat(walk_j, walk_pe), 1)):
                m.d.comb += mark_clear.eq(1)
            advance("FREE_PLACED", "PLACE_END")

        # ---- publication --------------------------------------------------------------
        with seq.state("PUBLISH"):
            # The entry of output (walk_pe, walk_j) is registered in every cycle (below);
            # PUBLISH only says whether it is written.
            with m.If(walk_todo):
                m.d.sync += pub_en.eq(1)
            with m.If(walk_last):
                m.d.sync += status.eq(status | self.flags)
            advance("PUBLISH", "PUBLISH_END")

        with seq.state("PUBLISH_END"):
            # The last output's second stage.
            seq.goto("PLACE_END")

        # The answer's source and a system register's value, and the words a READ_WORD /
        # READ_FLAGS reads (in HOST_READ, for HOST_REPLY), are registered in every cycle,
        # without an enable, like the facts below: the command register and the system
        # registers hold while a command uses them (T27).
        m.d.sync += [read_word.eq(pay_data), read_flag_word.eq(flg_data)]
        t_pe = is_pe
        t_desc, t_sys = cmd.op == HostOp.READ_DESC, cmd.op == HostOp.READ_SYS
        t_addr = [cmd.addr == k for k in range(max(FM_PARTS, len(SysReg)))]
        sel = {"gpr": cmd.op == HostOp.READ_GPR, "sys": t_sys,
               "base": t_desc & t_addr[DESC_PART_BASE]}
        for name, part in (("desc0", 0), ("desc1", 1), ("undef", DESC_PART_UNDEFINED)):
            sel[f"{name}_pe"] = t_desc & t_addr[part] & t_pe
            sel[f"{name}_sh"] = t_desc & t_addr[part] & ~t_pe
        sys_values = {SysReg.TILE_CAPACITY: capacity, SysReg.STATUS: status,
                      SysReg.CAPACITY_IN_USE: in_use,
                      SysReg.ALLOCATED: self.alloc.allocated,
                      SysReg.BUILD: Const(build_info(cfg), 64)}
        m.d.sync += [
            value_sel.eq(Cat(*(sel[name] for name in sel_names))),
            # From ``f_addr``, HOST_FACTS's register: the value is read in HOST_CHECK.
            sys_value.eq(one_hot_select(Cat(*(f_addr[r.value] for r in SysReg)),
                                         [sys_values[r] for r in SysReg])),
            fm_sel.eq(Cat(*((cmd.op == HostOp.READ_FM) & t_addr[k]
                            for k in range(FM_PARTS))))]

        # The facts are registered in every cycle, without an enable: their inputs (the
        # command register, the read registers, the staged descriptor) hold from HOST_FACTS
        # while the command uses them, and nothing uses them outside a command (T27).
        m.d.sync += [
            f_bad_space.eq(space > MemSpace.SHARED),
            f_space.eq(Cat(*(space == s for s in spaces))),
            f_bad_index.eq(is_pe & (idx >= 64)
                           & ~Cat(*(cmd.op == o for o in _UNADDRESSED)).any()),
            f_wide.eq(cmd.data >= (1 << UNDEFINED_WIDTH)),
            f_allocated.eq(allocated),
            # One compare per table, then the choice: no multiplexer between the
            # block RAMs' outputs and the carry chains (T27).
            f_word_ok.eq(Mux(is_pe, cmd.addr < (le.desc.cells << 4),
                             cmd.addr < (se.desc.cells << 4))),
            f_flag_ok.eq(Mux(is_pe, cmd.addr < (le.desc.cells << 2),
                             cmd.addr < (se.desc.cells << 2))),
            f_base.eq(reg_base),
            f_ends[0].eq(le.base + le.desc.cells), f_ends[1].eq(se.base + se.desc.cells),
            f_op.eq(Cat(*(cmd.op == o for o in HostOp))),
            f_addr.eq(Cat(*(cmd.addr == k for k in range(len(f_addr))))),
            *(f_addr_in[name].eq(cmd.addr < bound) for name, bound in addr_bounds.items()),
            f_sys_read_only.eq(Cat(*(cmd.addr == r.value for r in (
                SysReg.CAPACITY_IN_USE, SysReg.ALLOCATED, SysReg.BUILD))).any()),
            f_gpr_bad.eq(idx >= GPR_COUNT), f_gpr_zero.eq(idx == 0),
            f_cfg_bad.eq(Mux(is_pe, ~staged_l.allocated, staged_s.allocation_mask == 0)
                         | (need == 0)),
            f_cfg_big.eq(need > Array(Const(c) for c in cells)[space]),
            f_cells.eq(reg_cells),
            f_owners.eq(Mux(is_pe, 1, sum(se.desc.allocation_mask[k] for k in range(4)))),
            f_synth.eq(is_pe & le.synth),
            f_cube_synth.eq(is_pe & le.synth & (le.desc.layout != Layout.ROW_MAJOR)),
            f_pc_cols.eq(le.desc.phys_cols), f_pc_mask.eq(le.desc.phys_cols - 1),
            f_rows.eq(le.desc.valid_rows), f_cols.eq(le.desc.valid_cols),
        ]
        m.d.sync += free_bytes.eq((f_cells << 7) * f_owners)
        # Publication's first stage, without an enable (T27): its registers are read only
        # with ``pub_en``.
        o = outs[walk_j]
        g = plan.d_geometry[walk_pe]
        role = o.role
        d = pub_entry.desc
        is_d = role == OutputRole.D
        m.d.sync += [
            pub_pe.eq(walk_pe), pub_index.eq(o.index), pub_bytes.eq(out_cells[walk_j] << 7),
            pub_entry.eq(0),
            d.allocated.eq(1), d.dtype.eq(o.dtype),
            d.layout.eq(Mux(is_d, g.layout, Layout.ROW_MAJOR)),
            d.location.eq(Mux((role == OutputRole.D) | (role == OutputRole.IMG2COL),
                              TileLocation.MATRIX, TileLocation.ANY)),
            d.cells.eq(out_cells[walk_j]), d.valid_rows.eq(o.rows),
            d.valid_cols.eq(o.cols), d.phys_cols.eq(Mux(is_d, 0, o.phys_cols)),
            pub_entry.base.eq(bases[walk_pe][walk_j]), pub_entry.synth.eq(1),
        ]
        # The counters change under flip-flop enables (T31): CONFIGURE charges its bytes in
        # CFG_INSTALL (``cfg_now``), FREE uncharges them (``free_en``).
        with m.If(cfg_now):
            m.d.sync += in_use.eq(in_use + cfg_bytes)
            for p in range(PE_COUNT):
                with m.If(is_pe & (space[:2] == p)):
                    m.d.sync += pe_bytes[p].eq(pe_bytes[p] + cfg_bytes)
        with m.If(free_en):
            m.d.sync += in_use.eq(in_use - free_bytes)
            for p in range(PE_COUNT):
                with m.If(is_pe & (space[:2] == p)):
                    m.d.sync += pe_bytes[p].eq(pe_bytes[p] - free_bytes)
        # The register files' writes (T27): HOST's (``host_now``), CONFIGURE's entry in
        # CFG_INSTALL (``cfg_now``) and its flag words' clearing in CFG_CLEAR (``clearing``),
        # and publication's second stage (``pub_en``), multiplexers of registers under
        # register selects.  Writes land when they did before T27.
        cfg_local = Signal(self.local_entry, name="cfg_local")
        cfg_shared = Signal(self.shared_entry, name="cfg_shared")
        fm_part_no = cmd.addr[:3]
        last_bits = FEATURE_MAP_DESCRIPTOR.size - 64 * (FM_PARTS - 1)
        # WRITE_FM's address and data come from registers of their own, loaded from the
        # command register in every cycle (valid from HOST_FACTS, written in HOST): the
        # command reaches the feature-map block RAMs register to register (T36).
        fm_wr_addr = Signal(len(fm_wr.addr), name="fm_wr_addr")
        fm_wr_data = Signal(64, name="fm_wr_data")
        m.d.sync += [fm_wr_addr.eq(Cat(idx[:6], space[:2], fm_part_no)),
                     fm_wr_data.eq(Mux(fm_part_no == FM_PARTS - 1, cmd.data[:last_bits],
                                       cmd.data))]
        l_entry = Signal(self.local_entry, name="l_wr_entry")
        s_entry = Signal(self.shared_entry, name="s_wr_entry")
        m.d.comb += [
            l_entry.eq(Mux(pub_en, pub_entry, Mux(cfg_now, cfg_local, h_local))),
            s_entry.eq(Mux(cfg_now, cfg_shared, h_shared)),
            cfg_local.desc.eq(staged_l), cfg_local.base.eq(cfg_base),
            cfg_local.undef.eq(undef_init),
            cfg_shared.desc.eq(staged_s), cfg_shared.base.eq(cfg_base),
            cfg_shared.undef.eq(undef_init),
            l_wr.en.eq(pub_en | h_wr_local | (cfg_now & is_pe)),
            l_wr.addr.eq(Mux(pub_en, Cat(pub_index, pub_pe), Cat(idx[:6], space[:2]))),
            l_wr.data.eq(l_entry), l_wr.data.clean.eq(l_entry.undef == 0),
            s_wr.en.eq(h_wr_shared | (cfg_now & ~is_pe)),
            s_wr.addr.eq(idx), s_wr.data.eq(s_entry), s_wr.data.clean.eq(s_entry.undef == 0),
            # The last part keeps only the descriptor's bits.
            fm_wr.en.eq(h_ok[HostOp.WRITE_FM.value]),
            fm_wr.addr.eq(fm_wr_addr), fm_wr.data.eq(fm_wr_data),
            g_wr.en.eq(h_ok[HostOp.WRITE_GPR.value]), g_wr.addr.eq(idx[:5]),
            g_wr.data.eq(cmd_data["gprs"]),
            g_low_wr.en.eq(h_ok[HostOp.WRITE_GPR.value]),
            g_low_wr.addr.eq(idx[:5]), g_low_wr.data.eq(cmd_data["gprs"][:16]),
        ]
        flag_write = h_ok[HostOp.WRITE_FLAGS.value] | clearing
        for s in spaces:
            m.d.comb += [flg_wr[s].en.eq(flag_write & f_space[s]),
                         flg_wr[s].addr.eq(Mux(clearing, clear_pos, f_flag_addr)),
                         flg_wr[s].data.eq(Mux(clearing, 0, cmd_data["flags"]))]
        # A Local write that allocates or frees marks the register held or not a cycle after
        # the write, from a registered request (T27): the bitmaps' enables are a decode of
        # flip-flops, the PE's one-hot with the request (T33).  The change lands before any
        # agent may read them (the response or ``req_done`` is pending meanwhile).
        held_pes, held_bit = Signal(PE_COUNT, name="held_pes"), Signal(name="held_bit")
        held_index = Signal(6, name="held_index")
        held_pe = Mux(pub_en, pub_pe, space[:2])
        m.d.sync += [held_pes.eq(Mux(pub_en | (h_ok[HostOp.FREE.value] & is_pe)
                                     | (cfg_now & is_pe),
                                     Cat(*(held_pe == q for q in range(PE_COUNT))), 0)),
                     held_index.eq(Mux(pub_en, pub_index, idx[:6])), held_bit.eq(~host_now)]
        for q in range(PE_COUNT):
            with m.If(held_pes[q]):
                m.d.sync += held[q].bit_select(held_index, 1).eq(held_bit)
        # Publication's second stage, the cycle after PUBLISH formed the entry (T24).
        with m.If(pub_en):
            for p in range(PE_COUNT):
                with m.If(pub_pe == p):
                    m.d.sync += pe_bytes[p].eq(pe_bytes[p] + pub_bytes)
            m.d.sync += in_use.eq(in_use + pub_bytes)

        # ---- preflight reads, then the engines: later assignments take priority --------
        with m.If(gr.en):
            read_gpr(gr.addr)
        with m.If(td.en):
            read_local(Cat(td.index, td.pe))
        with m.If(sr.en):
            read_shared(sr.sid)
        engine_rd = self._engine_port(m, read_local, read_shared, l_rd, s_rd, pay_bus, busy,
                                      write_payload)
        i2c_rd, i2c_flag_rd = self._element_port(m, pay_bus, flg_bus, src, write_payload)
        valid = Cat(*(w[0] for w in writes))
        m.d.sync += [addr.eq(one_hot_select(valid, [w[2] for w in writes])) for addr in wr_addr]
        m.d.sync += wr_data.eq(one_hot_select(valid, [w[3] for w in writes]))
        m.d.sync += [mask.eq(one_hot_select(valid, [w[1][s] for w in writes]))
                     for s, mask in enumerate(wr_mask)]
        # The payload and flag reads: every request but the preflight's word read comes from
        # registers (decision T26); the word read's address is formed in its cycle, so it is
        # the last multiplexer before the memories, and it yields to a registered request.
        word_go = wd.en & ~engine_rd.valid & ~i2c_rd.valid
        # The base of the register a word read reads is looked up (and registered) in the
        # cycle before, from the ``tile_rd`` or ``word_rd`` of the same register (T11).
        word_base = Signal(cw, name="word_base")
        m.d.comb += base_rd.addr.eq(Mux(wd.en, Cat(wd.index, wd.pe), Cat(td.index, td.pe)))
        m.d.sync += [word_base.eq(base_rd.data), pay_bus.move["word"].eq(word_go)]
        word_rd = _ReadRequest(valid=word_go, go=word_go,
                               sel=Cat(*(wd.pe == p for p in range(PE_COUNT)), Const(0, 1)),
                               addr=(word_base << 4) + wd.addr)
        host_pay_rd = _ReadRequest(valid=1, go=1, sel=host_rd_pay, addr=f_word_addr)
        host_flg_rd = _ReadRequest(valid=1, go=1, sel=host_rd_flg, addr=f_flag_addr)
        _issue_reads(m, pay_rd, [host_pay_rd, engine_rd, i2c_rd, word_rd])
        _issue_reads(m, flg_rd, [host_flg_rd, i2c_flag_rd])
        return m

    def _engine_port(self, m, read_local, read_shared, l_rd, s_rd, pay_bus, seq_busy,
                     write_payload):
        """The CUBE engine's TilePort: descriptors and payload words, one request at a time."""
        e = self.engine
        # Descriptor lookups are registered at the store's boundary (decision T26), then read
        # both tables while the sequencer idles; the response is registered from the read
        # registers a cycle later (latency 3).
        dq_valid = Signal(name="engine_desc_valid")
        dq = Signal(e.desc_req.payload.shape(), name="engine_desc_req")
        lookup = Signal()                       # the read registers hold the lookup's entries
        lookup_shared = Signal()
        rsp_valid = Signal()
        m.d.comb += [e.desc_rsp.valid.eq(rsp_valid),
                     e.desc_req.ready.eq(~dq_valid & ~rsp_valid & ~lookup & ~seq_busy)]
        with m.If(e.desc_rsp.ready):
            m.d.sync += rsp_valid.eq(0)
        m.d.sync += lookup.eq(0)
        with m.If(e.desc_req.valid & e.desc_req.ready):
            m.d.sync += [dq_valid.eq(1), dq.eq(e.desc_req.payload)]
        with m.If(dq_valid & ~seq_busy):
            read_local(Cat(dq.index[:6], Value.cast(dq.space)[:2]))
            read_shared(dq.index)
            m.d.sync += [dq_valid.eq(0), lookup.eq(1),
                         lookup_shared.eq(dq.space == MemSpace.SHARED)]
        with m.If(lookup):
            shared = lookup_shared
            ld, sd = l_rd.data, s_rd.data
            r = e.desc_rsp.payload
            m.d.sync += [
                rsp_valid.eq(1),
                r.allocated.eq(Mux(shared, sd.desc.published & (sd.desc.allocation_mask != 0),
                                   ld.desc.allocated)),
                r.dtype.eq(Mux(shared, sd.desc.dtype, ld.desc.dtype)),
                r.layout.eq(Mux(shared, sd.desc.layout, ld.desc.layout)),
                r.cells.eq(Mux(shared, sd.desc.cells, ld.desc.cells)),
                r.valid_rows.eq(Mux(shared, sd.desc.valid_rows, ld.desc.valid_rows)),
                r.valid_cols.eq(Mux(shared, sd.desc.valid_cols, ld.desc.valid_cols)),
                r.phys_cols.eq(Mux(shared, sd.desc.phys_cols, ld.desc.phys_cols)),
                r.base.eq(Mux(shared, sd.base, ld.base)),
            ]
        # Payload words: three stages that move together (decision T26): the request,
        # registered at the store's boundary; the memory read (``read_valid``: the read
        # register holds the word); the response, the memory's ``out`` register (T39), so
        # that the engine's clients load words from flip-flops, not from the block RAMs'
        # outputs.  A stalled response holds the read register too, and a request is taken
        # whenever they move.
        q_valid = Signal(name="engine_rd_valid")
        q_sel = Signal(PE_COUNT + 1, name="engine_rd_sel")
        q_addr = Signal(self.ww, name="engine_rd_addr")
        read_valid = Signal(name="engine_read_valid")
        mem_valid = Signal(name="engine_rsp_valid")
        advance = ~mem_valid | e.mem_rsp.ready
        issue = q_valid & advance
        m.d.comb += [e.mem_rsp.valid.eq(mem_valid),
                     e.mem_rsp.payload.eq(pay_bus.data),
                     e.mem_req.ready.eq(~q_valid | advance),
                     pay_bus.move["engine"].eq(advance & read_valid)]
        with m.If(advance):
            m.d.sync += [read_valid.eq(issue), mem_valid.eq(read_valid)]
        with m.If(e.mem_req.ready):
            q = e.mem_req.payload
            m.d.sync += [q_valid.eq(e.mem_req.valid), q_addr.eq(q.addr),
                         q_sel.eq(Cat(*(q.space == MemSpace(s) for s in range(PE_COUNT + 1))))]
        m.d.comb += e.mem_wr.ready.eq(1)
        w = e.mem_wr.payload
        write_payload(e.mem_wr.valid,
                      [Mux(w.space == MemSpace(s), w.mask, 0) for s in range(PE_COUNT + 1)],
                      w.addr, w.data)
        return _ReadRequest(valid=q_valid, go=issue, sel=q_sel, addr=q_addr)

    def _element_port(self, m, pay_bus, flg_bus, src, write_payload):
        """The running TIMG2COL job's source element reads and destination element writes,
        on the memories of PE ``src.pe``; returns its payload and flag read requests."""
        # log2 of the element bytes, registered: the plan is held from PLACE to PUBLISH or
        # ABORT, and elements move only in between (decision T13).
        shift = Signal(2)
        m.d.sync += shift.eq(_log2_bytes(self.plan.a_type))
        ww, port = self.ww, self.i2c
        desc, src_base, synth = src.entry.desc, src.entry.base, src.entry.synth
        # Five stages: the request, registered at the store's boundary with its word and flag
        # addresses (``req_valid``, decision T26); the memory read (``read_valid``: the read
        # registers hold the element's words); the memories' ``out`` registers (``out_valid``,
        # T39); a copy of the words read (``word_valid``); then the response register: the
        # read-data buses' selects start from flip-flops, and so do the element and flag
        # selects and the engine's decisions (decision T23).  All stages move together: a
        # stalled response holds the read registers too (nothing else reads the memories
        # during a job), and a request is taken whenever the stages move.
        req_valid = Signal(name="i2c_req_valid")
        read_valid = Signal(name="i2c_read_valid")
        out_valid = Signal(name="i2c_out_valid")
        word_valid = Signal(name="i2c_word_valid")
        rsp_valid = Signal(name="i2c_rsp_valid")
        req_addr = Signal(ww, name="i2c_req_addr")
        req_flag_addr = Signal(ww, name="i2c_req_flag_addr")
        word = Signal(64, name="i2c_word")
        flag_word = Signal(64, name="i2c_flag_word")
        rsp = Signal(SourceResponseLayout, name="i2c_rsp")
        # The element's byte in its word, its flag in its flag word and its implicit flag,
        # per stage.
        byte, read_byte, out_byte, word_byte = (Signal(3, name=f"i2c_{n}byte")
                                                for n in ("", "read_", "out_", "word_"))
        index, read_index, out_index = (Signal(6, name=f"i2c_{n}index")
                                        for n in ("", "read_", "out_"))
        # The copy's flag index: its low 3 bits, and its high 3 bits one-hot, so the flag is
        # a bit select of eight flag bytes' bits under a one-hot (decision T26).
        word_index = Signal(3, name="i2c_word_index")
        word_index_high = Signal(8, name="i2c_word_index_high")
        implicit, read_implicit, out_implicit, word_implicit = (
            Signal(name=f"i2c_{n}implicit") for n in ("", "read_", "out_", "word_"))
        advance = ~rsp_valid | port.src_rsp.ready
        m.d.comb += [port.src_req.ready.eq(advance),
                     pay_bus.move["i2c"].eq(advance & read_valid),
                     flg_bus.move["i2c"].eq(advance & read_valid)]
        addr = (src_base << 7) + (port.src_req.payload << shift)
        # A published source's flag (its valid region) is computed with the request and
        # registered, beside the memory reads (decision T13).
        q = port.src_req.payload
        take = port.src_req.valid & port.src_req.ready
        with m.If(advance):
            m.d.sync += [req_valid.eq(take), read_valid.eq(req_valid),
                         out_valid.eq(read_valid), word_valid.eq(out_valid),
                         rsp_valid.eq(word_valid),
                         read_byte.eq(byte), read_index.eq(index),
                         read_implicit.eq(implicit),
                         out_byte.eq(read_byte), out_index.eq(read_index),
                         out_implicit.eq(read_implicit),
                         word.eq(pay_bus.data), flag_word.eq(flg_bus.data),
                         word_byte.eq(out_byte), word_index.eq(out_index[:3]),
                         word_index_high.eq(Cat(*(out_index[3:] == k for k in range(8)))),
                         word_implicit.eq(out_implicit),
                         rsp.data.eq(word >> (word_byte << 3)),
                         rsp.defined.eq(Mux(synth, word_implicit, one_hot_select(
                             word_index_high, [flag_word.word_select(k, 8).bit_select(
                                 word_index, 1) for k in range(8)])))]
        with m.If(take):
            m.d.sync += [req_addr.eq(addr[3:3 + ww]),
                         req_flag_addr.eq((src_base << 2) + (q >> 6)),
                         byte.eq(addr[:3]), index.eq(q[:6]),
                         implicit.eq((q < src.rows_end)
                                     & ((q & src.col_mask) < desc.valid_cols))]
        m.d.comb += [port.src_rsp.valid.eq(rsp_valid), port.src_rsp.payload.eq(rsp)]
        # Destination writes into the placed output (entry 0), always accepted.  Only the
        # enables are per PE: the address and data are the same for every memory, which
        # nothing else uses during a job (T3), so the PE select reaches as few cells as it
        # can (issue #9).
        m.d.comb += port.dst.ready.eq(1)
        w = port.dst.payload
        daddr = (src.dst_base << 7) + (w.addr << shift)
        lane = daddr[:3]
        width_mask = Mux(shift == 2, 0xF, Mux(shift == 1, 0x3, 0x1))
        write_payload(port.dst.valid,
                      [Mux(src.pe[p], (width_mask << lane)[:8], 0) for p in range(PE_COUNT)]
                      + [0], daddr[3:3 + ww], (w.data << (lane << 3))[:64])
        go = req_valid & advance
        sel = Cat(src.pe, Const(0, 1))
        return (_ReadRequest(valid=req_valid, go=go, sel=sel, addr=req_addr),
                _ReadRequest(valid=req_valid, go=go, sel=sel, addr=req_flag_addr))
