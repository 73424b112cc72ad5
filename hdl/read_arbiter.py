"""One payload read port shared by several clients of the CUBE engine.

The tile store answers reads in request order (``hdl/tile_port.py``).  :class:`ReadArbiter`
lets several clients (the fill source, the result path, the operand buffers' fill, the lane
feed) share that port: it grants the lowest-numbered client that asks, remembers in a small
FIFO which client (and which of its lanes, ``tag``) each outstanding request belongs to,
and returns every response to its owner the cycle after it arrives, from registers of the
owner's own.  A client must take a response at once (its ``rsp`` is valid-only), which
every client guarantees by asking only for words it has a register for: responses
therefore never wait, and no client can block another's.

:func:`lane_cache` is the client side: a set of *lanes*, each holding one payload word and
the address it came from (two for a lane that reads ahead); a lane whose next element lies
in another word asks for that word.
"""

import operator
from typing import NamedTuple

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .config import CubeConfig
from .logic import balanced, one_hot_select
from .tile_port import MemReqLayout, MemSpace, word_addr_width

__all__ = ["ReadReqLayout", "ReadRspLayout", "ReadArbiter", "LaneWords", "lane_cache",
           "TAG_WIDTH"]

#: Width of a client's tag (a lane number and which of its two registers).
TAG_WIDTH = 9


def ReadReqLayout(config: CubeConfig) -> data.StructLayout:
    """A client's read: memory space, 64-bit word address, and the tag its answer carries."""
    return data.StructLayout({"space": MemSpace, "addr": word_addr_width(config),
                              "tag": TAG_WIDTH})


#: An answer to a client: ``valid`` for one cycle, the request's ``tag`` and the word.
ReadRspLayout = data.StructLayout({"valid": 1, "tag": TAG_WIDTH, "data": 64})


class ReadArbiter(wiring.Component):
    """Fixed-priority sharing of ``mem_req``/``mem_rsp`` among ``clients`` read clients.

    Members
    -------
    req : In(stream.Signature(ReadReqLayout)).array(clients)
        Client reads; client 0 has the highest priority.
    rsp : Out(ReadRspLayout).array(clients)
        Answers, in each client's request order, a cycle after the store's (registered).
    mem_req : Out(stream.Signature(MemReqLayout)), mem_rsp : In(stream.Signature(64))
        The tile store's read port.  At most ``depth`` reads are outstanding.
    idle : Out(1)
        No read is outstanding and no answer still to reach its client.
    """

    def __init__(self, config: CubeConfig, clients: int, depth: int = 4):
        self.clients = clients
        self.depth = depth
        super().__init__({
            "req": In(stream.Signature(ReadReqLayout(config))).array(clients),
            "rsp": Out(ReadRspLayout).array(clients),
            "mem_req": Out(stream.Signature(MemReqLayout(config))),
            "mem_rsp": In(stream.Signature(64)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        owner_width = max(1, (self.clients - 1).bit_length())
        m.submodules.owners = owners = fifo.SyncFIFO(width=owner_width + TAG_WIDTH,
                                                     depth=self.depth)
        grant = Signal(range(max(2, self.clients)))
        any_valid = Signal()
        for i in reversed(range(self.clients)):
            with m.If(self.req[i].valid):
                m.d.comb += [grant.eq(i), any_valid.eq(1)]
        for i in range(self.clients):
            with m.If(grant == i):
                m.d.comb += [self.mem_req.payload.space.eq(self.req[i].payload.space),
                             self.mem_req.payload.addr.eq(self.req[i].payload.addr),
                             owners.w_data.eq(self.req[i].payload.tag << owner_width | i)]
            m.d.comb += self.req[i].ready.eq((grant == i) & owners.w_rdy & self.mem_req.ready)
        m.d.comb += [self.mem_req.valid.eq(any_valid & owners.w_rdy),
                     owners.w_en.eq(self.mem_req.valid & self.mem_req.ready),
                     self.mem_rsp.ready.eq(1),
                     owners.r_en.eq(self.mem_rsp.valid)]
        # Each client's answer comes from registers of its own, loaded only for its own
        # answers: the store's response register drives one copy per client instead of
        # every lane register of every client, which lie across the device (issue #9).
        owner = owners.r_data[:owner_width]
        answers = []
        for i in range(self.clients):
            mine = self.mem_rsp.valid & (owner == i)
            valid = Signal(name=f"rsp{i}_valid")
            tag = Signal(TAG_WIDTH, name=f"rsp{i}_tag")
            word = Signal(64, name=f"rsp{i}_data")
            m.d.sync += valid.eq(mine)
            with m.If(mine):
                m.d.sync += [tag.eq(owners.r_data[owner_width:]), word.eq(self.mem_rsp.payload)]
            m.d.comb += [self.rsp[i].valid.eq(valid), self.rsp[i].tag.eq(tag),
                         self.rsp[i].data.eq(word)]
            answers.append(valid)
        m.d.comb += self.idle.eq(~owners.r_rdy & ~Cat(*answers).any())
        return m


class LaneWords(NamedTuple):
    """What :func:`lane_cache` gives its client."""

    all_hit: Value   #: every lane needs nothing or holds its word ready
    words: list      #: per lane, its word (valid while the lane hits)
    hits: list       #: per lane, needs nothing or holds its word ready
    busy: Value      #: an ask or a request is still to be sent


def lane_cache(m: Module, name: str, lanes: list, req, rsp, clear,
               entering=None) -> LaneWords:
    """Word registers for ``lanes`` of one read client (the fill source, the result path's
    parameters, the lane feed).

    ``lanes``: per lane ``(need, space, addr)`` - whether the lane needs a word now, and
    which - optionally followed by ``(ahead_need, ahead_addr)``: the word the lane will need
    next, read into a second register.  ``req``: the client's read stream (driven here),
    ``rsp``: its answers, ``clear``: forget every word (the memory contents may have
    changed; only while no read is outstanding).  A lane is a hit when it needs nothing or
    holds its word.  A missing lane asks for its word; when no lane misses, a lane with an
    ``ahead`` word asks for that one, so that reads overlap the beats that use the words
    already there.

    ``entering``: optionally per lane ``(step, step_space, step_addr, forget)``: the lane's
    word changes only on ``step`` (to ``step_space``/``step_addr``) or on ``forget`` (to
    one not known a cycle ahead).  Whether a register holds the lane's word, and holds it
    ready, are then registers, compared a cycle ahead with the entering (or staying)
    word, so that the hits are a gate from flip-flops rather than an address compare
    (issue #9); after a ``forget`` the lane misses for a cycle.

    Asks are registered with the word and the register to load; the next cycle the lowest
    asking lane (words needed now before words ahead) is granted: its register is marked
    pending with the address, and the read goes into a request register, so that ``req``
    is driven from registers and no path runs from the lanes' compares into the arbiter.
    A granted ask is dropped.  A registered ask is at most a cycle old: it still names a
    word the lane lacks (only a grant changes a lane's addresses) and a register that is
    not pending (only a grant sets pending); at worst a read-ahead replaces a word that is
    read again.
    """
    words, hits, info = [], [], []
    for index, lane in enumerate(lanes):
        need, space, addr = lane[0], Value.cast(lane[1]), lane[2]
        ahead_need, ahead_addr = lane[3:] if len(lane) > 3 else (0, addr)
        held = []
        for r in range(2 if len(lane) > 3 else 1):
            held.append({
                "word": Signal(64, name=f"{name}{index}_word{r}"),
                "space": Signal(len(space), name=f"{name}{index}_space{r}"),
                "addr": Signal(len(addr), name=f"{name}{index}_addr{r}"),
                "valid": Signal(name=f"{name}{index}_valid{r}"),
                "pending": Signal(name=f"{name}{index}_pending{r}"),
            })
        for r, h in enumerate(held):
            h["match"] = Signal(name=f"{name}{index}_match{r}")
            m.d.comb += h["match"].eq(h["valid"] & (h["addr"] == addr) & (h["space"] == space))
            h["ahead"] = h["valid"] & (h["addr"] == ahead_addr) & (h["space"] == space)
        matched = Cat(*(h["match"] for h in held)).any()
        for r, h in enumerate(held):
            if entering is None:
                h["holds"], h["ready"] = h["match"], h["match"] & ~h["pending"]
            else:
                h["holds"] = Signal(name=f"{name}{index}_holds{r}")
                h["ready"] = Signal(name=f"{name}{index}_ready{r}")
        ready = Cat(*(h["ready"] for h in held)).any()
        word = held[0]["word"]
        for h in held[1:]:
            word = Mux(h["holds"], h["word"], word)
        # A register to (re)load: not waiting for a word, not holding the current one.
        victim = Signal(range(2), name=f"{name}{index}_victim")
        free = Signal(name=f"{name}{index}_free")
        for r in reversed(range(len(held))):
            with m.If(~held[r]["pending"] & ~(need & held[r]["match"])):
                m.d.comb += [victim.eq(r), free.eq(1)]
        ask_now = need & ~matched & free
        ask_ahead = ahead_need & ~Cat(*(h["ahead"] for h in held)).any() & free \
            & (~need | matched)
        asked = Signal(name=f"{name}{index}_ask")
        asked_ahead = Signal(name=f"{name}{index}_ask_ahead")
        target = Signal(len(addr), name=f"{name}{index}_target")
        target_space = Signal(len(space), name=f"{name}{index}_target_space")
        target_reg = Signal(range(2), name=f"{name}{index}_target_reg")
        granted = Signal(name=f"{name}{index}_granted")
        m.d.sync += [asked.eq(ask_now & ~granted & ~clear),
                     asked_ahead.eq(ask_ahead & ~granted & ~clear),
                     target.eq(Mux(ask_now, addr, ahead_addr)), target_space.eq(space),
                     target_reg.eq(victim)]
        for r, h in enumerate(held):
            answered = rsp.valid & (rsp.tag == 2 * index + r)
            retarget = granted & (target_reg == r)
            # A pending register follows the response bus until its answer comes, so its
            # 64 clock enables are the pending flip-flop, not the late ``rsp.valid`` and
            # tag compare; a pending register's word is never used.
            with m.If(h["pending"]):
                m.d.sync += h["word"].eq(rsp.data)
            with m.If(answered):
                m.d.sync += h["pending"].eq(0)
            with m.If(clear):
                m.d.sync += h["valid"].eq(0)
            with m.Elif(retarget):
                m.d.sync += [h["space"].eq(target_space), h["addr"].eq(target),
                             h["valid"].eq(1), h["pending"].eq(1)]
            if entering is not None:
                # A retargeted register is pending: it does not hold the word for now.
                step, step_space, step_addr, forget = entering[index]
                incoming = (h["valid"] & (h["addr"] == step_addr)
                            & (h["space"] == Value.cast(step_space)))
                holds = Mux(forget, 0, Mux(step, incoming, h["match"])) & ~retarget & ~clear
                m.d.sync += [h["holds"].eq(holds),
                             h["ready"].eq(holds & (answered | ~h["pending"]))]
        words.append(word)
        hits.append(~need | ready)
        info.append((asked, asked_ahead, target, target_space, target_reg, granted))

    asks = [i[0] for i in info] + [i[1] for i in info]
    first = [ask & ~Cat(*asks[:index]).any() if index else ask
             for index, ask in enumerate(asks)]
    grants = [now | early for now, early in zip(first[:len(info)], first[len(info):])]
    rq_valid = Signal(name=f"{name}_rq_valid")
    rq = Signal(req.payload.shape(), name=f"{name}_rq")
    load = Signal(name=f"{name}_rq_load")
    m.d.comb += load.eq((~rq_valid | req.ready) & ~clear)
    m.d.comb += [i[5].eq(load & grant) for i, grant in zip(info, grants)]

    with m.If(load):
        m.d.sync += [rq_valid.eq(Cat(*asks).any()),
                     rq.space.as_value().eq(one_hot_select(grants, [i[3] for i in info])),
                     rq.addr.eq(one_hot_select(grants, [i[2] for i in info])),
                     rq.tag.eq(one_hot_select(grants, [2 * index + i[4]
                                                       for index, i in enumerate(info)]))]
    with m.Elif(req.ready):
        m.d.sync += rq_valid.eq(0)
    m.d.comb += [req.valid.eq(rq_valid), req.payload.eq(rq)]
    all_hit = Signal(name=f"{name}_all_hit")
    m.d.comb += all_hit.eq(balanced(operator.and_, hits) if hits else 1)
    return LaneWords(all_hit, words, hits, rq_valid | Cat(*asks).any())
