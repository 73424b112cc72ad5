"""The serial lane path of the CUBE engine: one lane at a time, for builds short of logic.

:class:`SerialFeed` gives the same beats as :class:`~ptocube.hdl.operand_feed.OperandFeed`
(same positions: a null group, the real groups, a null group, from the same walker and
sequencer) but gathers each beat's elements one *lane* at a time instead of all at once:
the A rows, then the B columns, then (MX builds) the A-scale rows and the B-scale columns.
Only the runs :class:`~ptocube.hdl.panel_feed.PanelFeed` cannot take reach it (Shared or
transposed primaries, MX scales, the floating Bias term), so a build that must save logic
(``CubeConfig.serial_lane_feed``) trades their speed - about one lane per cycle, R + C
cycles a beat or more, against one beat per cycle - for one address adder chain, one
element extractor and one word register instead of R + C of each (``docs/hdl-cube.md``).

Lanes move through five stages that advance together, and a sixth that never waits:

* **row**: the lane's output row (A, scale of A) or column (B, scale of B), whether the
  beat needs its element, and the row's shift in its operand's address;
* **cell** and **part**: the CUBE_N8 CELL multiplier and the shifted row, then the row
  part of the bit address (as the parallel feed computes it);
* **address**: the element's bit address (row part + K part) split into word address and
  offset; the lane's entry of a small word memory (R + C entries, or twice that with
  scales: LUT RAM) is read and both hits are found here, a cycle ahead;
* **lookup**: the word from the lane's entry, or the word the previous lane used; on a
  miss it reads the word (a registered request, one outstanding read), keeps it in both,
  and looks again;
* **element**: the element cut from the word's half and written into the beat register.

A lane keeps its entry across beats, so a word along K is read once per block row or
column as in the parallel feed (without its read-ahead).  The beat register is filled only
while no beat is offered, and a beat is offered once its last lane's element is written.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib.memory import Memory

from ..model.datatype import DataType
from .cell_address import extract
from .operand_feed import _FP32_ONE, OperandFeed

__all__ = ["SerialFeed"]


class SerialFeed(OperandFeed):
    """Beats for one PE's run of a Matrix plan, one lane at a time.

    The ports and their meaning are :class:`~ptocube.hdl.operand_feed.OperandFeed`'s; only
    the time a beat takes differs (see the module docstring).
    """

    def _beats(self, m: Module, f: SimpleNamespace, p1: SimpleNamespace):
        cfg = self.config
        rows, cols, scaled = cfg.rows, cfg.cols, self.has_scale
        aw, sw = f.aw, f.sw
        # Lane groups in gathering order: (operand, lane count).
        groups = [("a", rows), ("b", cols)] + ([("sa", rows), ("sb", cols)] if scaled else [])
        lanes = sum(count for _, count in groups)
        first_lane = [sum(count for _, count in groups[:g]) for g in range(len(groups))]

        out = Signal(self.feed.payload.shape(), name="out")
        out_valid = Signal(name="out_valid")
        m.d.comb += [self.feed.valid.eq(out_valid), self.feed.payload.eq(out)]
        with m.If(self.feed.ready):
            m.d.sync += out_valid.eq(0)

        # ------------------------------------------------------------------
        # The position being gathered, taken from stage 1 while no beat is offered.
        # ------------------------------------------------------------------
        gathering = Signal()
        take = Signal()
        m.d.comb += [take.eq(p1.valid & ~gathering & ~out_valid),
                     p1.adv.eq(~p1.valid | take)]
        pos = SimpleNamespace(
            slot=Signal(len(p1.slot), name="s_slot"), real=Signal(name="s_real"),
            bias=Signal(name="s_bias"), first=Signal(name="s_first"),
            block=Signal(p1.block.shape(), name="s_block"),
            k=Signal(16, name="s_k"), ka=Signal(sw, name="s_ka"), kb=Signal(sw, name="s_kb"))
        if scaled:
            pos.ksa, pos.ksb = Signal(sw, name="s_ksa"), Signal(sw, name="s_ksb")
        issue = Signal(range(lanes + 1), name="s_issue")     # next lane into the row stage
        # The K parts take two registered steps from k (its shifts, then their merge),
        # loaded every cycle: valid two cycles after a take, before the first lane's part
        # stage (a take's lane 0 reaches it four cycles later, through the row and cell
        # stages).
        a_shifts = [Signal(len(Value.cast(v)), name=f"s_ka_sh{x}")
                    for x, v in enumerate(self._a_kshifts(f, pos.k))]
        b_shifts = [Signal(len(Value.cast(v)), name=f"s_kb_sh{x}")
                    for x, v in enumerate(self._b_kshifts(f, pos.k))]
        m.d.sync += [*(r.eq(v) for r, v in zip(a_shifts, self._a_kshifts(f, pos.k))),
                     *(r.eq(v) for r, v in zip(b_shifts, self._b_kshifts(f, pos.k))),
                     pos.ka.eq(self._kjoin(f, "a", a_shifts)),
                     pos.kb.eq(Mux(pos.bias, 0, self._kjoin(f, "b", b_shifts)))]
        with m.If(take):
            m.d.sync += [gathering.eq(1), issue.eq(Mux(p1.real, 0, lanes)),
                         pos.slot.eq(p1.slot), pos.real.eq(p1.real), pos.bias.eq(p1.bias),
                         pos.first.eq(p1.first), pos.block.eq(p1.block), pos.k.eq(p1.k)]
            if scaled:
                m.d.sync += [pos.ksa.eq(self._sa_kpart(p1.k)),
                             pos.ksb.eq(self._sb_kpart(f, p1.k))]
            # Elements no lane needs stay 0, as the parallel feed's masked windows.
            m.d.sync += [out.a[i].eq(Mux(p1.bias, _FP32_ONE, 0)) for i in range(rows)]
            m.d.sync += [out.b[j].eq(0) for j in range(cols)]
            if scaled:
                m.d.sync += [out.a_scale[i].eq(0) for i in range(rows)]
                m.d.sync += [out.b_scale[j].eq(0) for j in range(cols)]

        # ------------------------------------------------------------------
        # The lane stages; ``go`` moves all but the element stage (the lookup is done
        # or empty).
        # ------------------------------------------------------------------
        go = Signal()
        r_valid, a_valid, l_valid = (Signal(name=f"s_{n}_valid") for n in ("row", "addr", "look"))
        r_lane, a_lane, l_lane = (Signal(range(lanes), name=f"s_{n}_lane")
                                  for n in ("row", "addr", "look"))
        r_group, a_group = (Signal(range(len(groups)), name=f"s_{n}_group")
                            for n in ("row", "addr"))
        r_index = Signal(range(max(2, rows, cols)), name="s_row_index")
        r_g, r_need = Signal(16, name="s_row_g"), Signal(name="s_row_need")

        # Row stage: lane ``issue`` -> group, index in it, output row or column, need, and
        # the shift of the row or column in its operand's address (``_*_row``).
        r_sh = Signal(5, name="s_row_sh")
        row_sh = {"a": f.a_row_sh, "b": f.b_row_sh}
        if scaled:
            row_sh.update(sa=f.sa_row_sh, sb=Const(3))
        wanted = {"a": ~pos.bias, "b": Const(1)}
        if scaled:
            wanted.update(sa=~pos.bias & f.a_scaled, sb=~pos.bias & f.b_scaled)
        with m.If(go):
            m.d.sync += r_valid.eq(gathering & (issue < lanes))
            with m.If(gathering & (issue < lanes)):
                m.d.sync += [issue.eq(issue + 1), r_lane.eq(issue)]
                for g, ((name, count), base) in enumerate(zip(groups, first_lane)):
                    with m.If((issue >= base) & (issue < base + count)):
                        index = (issue - base)[:len(r_index)]
                        is_row = name in ("a", "sa")
                        start = pos.block.r if is_row else pos.block.c
                        ok = (pos.block.rows_ok if is_row else pos.block.cols_ok).bit_select(
                            index, 1)
                        m.d.sync += [r_group.eq(g), r_index.eq(index), r_g.eq(start + index),
                                     r_need.eq(ok & wanted[name]), r_sh.eq(row_sh[name])]

        # Cell stage: the CUBE_N8 CELL multiplier and the row's shift have a stage of their
        # own; part stage: the row (or column) part of the bit address.
        stages = {}
        for stage in ("cell", "part"):
            stages[stage] = SimpleNamespace(
                valid=Signal(name=f"s_{stage}_valid"),
                lane=Signal(range(lanes), name=f"s_{stage}_lane"),
                group=Signal(range(len(groups)), name=f"s_{stage}_group"),
                index=Signal.like(r_index, name=f"s_{stage}_index"),
                need=Signal(name=f"s_{stage}_need"))
        c, p = stages["cell"], stages["part"]
        c_g, c_cells = Signal(16, name="s_cell_g"), Signal(sw - 10, name="s_cell_cells")
        p_row, row = Signal(sw, name="s_part_row"), Signal(sw, name="s_row_part")
        c_shifted = Signal(sw, name="s_cell_shifted")
        rows_of = {"a": self._a_row(f, c_g, c_shifted),
                   "b": self._b_row(f, c_g, c_cells, pos.bias, c_shifted)}
        if scaled:
            rows_of.update(sa=self._sa_row(f, c_g, c_shifted), sb=self._sb_row(f, c_g))
        with m.Switch(c.group):
            for g, (name, _) in enumerate(groups):
                with m.Case(g):
                    m.d.comb += row.eq(rows_of[name])
        with m.If(go):
            m.d.sync += [c.valid.eq(r_valid), c.lane.eq(r_lane), c.group.eq(r_group),
                         c.index.eq(r_index), c.need.eq(r_need), c_g.eq(r_g),
                         c_cells.eq(self._b_cells(f, r_g)), c_shifted.eq(r_g << r_sh),
                         p.valid.eq(c.valid), p.lane.eq(c.lane), p.group.eq(c.group),
                         p.index.eq(c.index), p.need.eq(c.need), p_row.eq(row)]

        # Address stage: the bit address of the element (+ its K part), memory and width.
        a_addr, a_off = Signal(aw, name="s_addr_word"), Signal(6, name="s_addr_off")
        a_space, a_log2w = Signal(3, name="s_addr_space"), Signal(3, name="s_addr_log2w")
        a_need, a_index = Signal(name="s_addr_need"), Signal(len(r_index), name="s_addr_index")
        bits = Signal(sw, name="s_bits")
        space, log2w = Signal(3, name="s_space"), Signal(3, name="s_log2w")
        # Per group: (K part, memory space, log2 of the element width).
        parts = {"a": (pos.ka, f.a_space, f.a_w),
                 "b": (pos.kb, Mux(pos.bias, f.bias_space, f.b_space), Mux(pos.bias, 5, f.b_w))}
        if scaled:
            parts.update(sa=(pos.ksa, f.sa_space, 3), sb=(pos.ksb, f.sb_space, 3))
        with m.Switch(p.group):
            for g, (name, _) in enumerate(groups):
                with m.Case(g):
                    k_part, sp, w = parts[name]
                    m.d.comb += [bits.eq(p_row + k_part), space.eq(sp), log2w.eq(w)]
        with m.If(go):
            m.d.sync += [a_valid.eq(p.valid), a_lane.eq(p.lane), a_group.eq(p.group),
                         a_index.eq(p.index), a_need.eq(p.need), a_addr.eq(bits[6:]),
                         a_off.eq(bits[:6]), a_space.eq(space), a_log2w.eq(log2w)]

        # Lookup stage: the lane's word memory entry or the last word, else a read.  Both
        # hits are found a cycle ahead, in the address stage, so that the lookup's ``done``
        # and ``go`` are a gate from registers.  The lane's entry is read a stage earlier
        # still, into ``a_entry`` beside the address stage, so that the memory's read does
        # not stand in front of the tag compare (issue #9); an entry the lookup writes as it
        # is read is taken from the write.
        a_tag = Cat(a_addr, a_space)
        m.submodules.words = words = Memory(shape=64 + len(a_tag), depth=lanes, init=[])
        held = words.read_port(domain="comb")
        store = words.write_port()
        a_entry = Signal(64 + len(a_tag), name="s_addr_entry")
        with m.If(go):
            m.d.sync += a_entry.eq(Mux(store.en & (store.addr == p.lane), store.data,
                                       held.data))
        held_ok = Signal(lanes, name="s_held_ok")       # entries written since start
        last_word, last_tag = Signal(64, name="s_last_word"), Signal.like(a_tag, name="s_last_tag")
        last_ok = Signal(name="s_last_ok")
        l_group = Signal.like(a_group, name="s_look_group")
        l_index = Signal.like(a_index, name="s_look_index")
        l_addr, l_off = Signal.like(a_addr, name="s_look_word"), Signal.like(a_off, name="s_look_off")
        l_space, l_log2w = Signal(3, name="s_look_space"), Signal(3, name="s_look_log2w")
        l_need = Signal(name="s_look_need")
        l_held = Signal(64, name="s_look_held")
        lane_hit, last_hit = Signal(name="s_lane_hit"), Signal(name="s_last_hit")
        tag = Cat(l_addr, l_space)
        done, used = Signal(name="s_look_done"), Signal(name="s_look_used")
        m.d.comb += [done.eq(l_valid & (~l_need | lane_hit | last_hit)),
                     used.eq(done & l_need), go.eq(~l_valid | done)]
        # The last word changes only to the lookup's own word (when it is used, or read).
        refresh = used | self.rsp.valid
        m.d.comb += held.addr.eq(p.lane)
        with m.If(go):
            m.d.sync += [l_valid.eq(a_valid), l_lane.eq(a_lane), l_group.eq(a_group),
                         l_index.eq(a_index), l_addr.eq(a_addr), l_off.eq(a_off),
                         l_space.eq(a_space), l_log2w.eq(a_log2w), l_need.eq(a_need),
                         l_held.eq(a_entry[:64]),
                         lane_hit.eq(held_ok.bit_select(a_lane, 1) & (a_entry[64:] == a_tag)),
                         last_hit.eq(Mux(refresh, a_tag == tag,
                                         last_ok & (a_tag == last_tag)))]
        with m.Elif(self.rsp.valid):
            m.d.sync += last_hit.eq(1)

        # A word found becomes the last word (the next lane often needs it: the other row
        # of a CUBE_M32 word, the next element of a row-major row) and the lane's entry.
        word = Mux(lane_hit, l_held, last_word)
        m.d.comb += [store.addr.eq(l_lane), store.data.eq(Cat(last_word, tag)),
                     store.en.eq(used & ~lane_hit)]
        with m.If(used):
            m.d.sync += [last_word.eq(word), last_tag.eq(tag), last_ok.eq(1),
                         held_ok.eq(held_ok | (Const(1, lanes) << l_lane)[:lanes])]

        # Element stage: the element into its place in the beat register, a cycle after
        # its lookup.  An element is aligned to its width (4 bits or more), so its offset
        # in the word's half is a whole number of nibbles.
        e_used, e_last = Signal(name="s_elem_used"), Signal(name="s_elem_last")
        e_half, e_nibble = Signal(32, name="s_elem_half"), Signal(3, name="s_elem_nibble")
        e_log2w = Signal(3, name="s_elem_log2w")
        e_group = Signal.like(l_group, name="s_elem_group")
        e_index = Signal.like(l_index, name="s_elem_index")
        m.d.sync += [e_used.eq(used), e_last.eq(done & (l_lane == lanes - 1)),
                     e_half.eq(Mux(l_off[5], word[32:], word[:32])), e_nibble.eq(l_off[2:5]),
                     e_log2w.eq(l_log2w), e_group.eq(l_group), e_index.eq(l_index)]
        targets = {"a": out.a, "b": out.b}
        if scaled:
            targets.update(sa=out.a_scale, sb=out.b_scale)
        element = extract(e_half, Cat(Const(0, 2), e_nibble), e_log2w, 32)
        with m.If(e_used):
            for g, (name, count) in enumerate(groups):
                with m.If(e_group == g):
                    with m.Switch(e_index):
                        for index in range(count):
                            with m.Case(index):
                                m.d.sync += targets[name][index].eq(element)
        none_left = (gathering & (issue == lanes) & ~r_valid & ~c.valid & ~p.valid & ~a_valid
                     & ~l_valid & ~e_last)
        with m.If(e_last | none_left):
            m.d.sync += [gathering.eq(0), out_valid.eq(1),
                         out.a_type.eq(Mux(pos.bias, int(DataType.FP32), f.a_type)),
                         out.b_type.eq(Mux(pos.bias, int(DataType.FP32), f.b_type)),
                         out.slot.eq(pos.slot), out.first.eq(pos.first),
                         out.load.eq(f.load), out.null.eq(~pos.real)]
            if scaled:
                m.d.sync += [out.a_scale_en.eq(f.a_scaled & ~pos.bias),
                             out.b_scale_en.eq(f.b_scaled & ~pos.bias)]

        # Reads: one outstanding, from a request register; the answer becomes the last
        # word, and the lookup finds it the next cycle.
        rq_valid, pending = Signal(name="s_rq_valid"), Signal(name="s_pending")
        rq = Signal(self.rd.payload.shape(), name="s_rq")
        m.d.comb += [self.rd.valid.eq(rq_valid), self.rd.payload.eq(rq)]
        with m.If(self.rd.ready):
            m.d.sync += rq_valid.eq(0)
        with m.If(l_valid & ~done & ~pending):
            m.d.sync += [rq_valid.eq(1), pending.eq(1), rq.space.as_value().eq(l_space),
                         rq.addr.eq(l_addr), rq.tag.eq(0)]
        with m.If(self.rsp.valid):
            m.d.sync += [pending.eq(0), last_word.eq(self.rsp.data), last_tag.eq(tag),
                         last_ok.eq(1)]
        with m.If(self.start):
            m.d.sync += [held_ok.eq(0), last_ok.eq(0)]

        m.d.comb += p1.busy.eq(gathering | out_valid | rq_valid | pending)
