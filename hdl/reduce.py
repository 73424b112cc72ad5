"""RowMax / GroupMax: running MAX folds over the raw accumulator stream.

:class:`MaxReduce` folds one row (or one column group) of raw accumulator values as they
stream past, the hardware twin of :func:`ptocube.model.postprocess.row_max` /
:func:`~ptocube.model.postprocess.group_max`.  It uses the same closed form as the model
(``docs/decisions/postprocess.md`` entry 10): every operand becomes an unsigned *key* whose
order is the MAX order (FP32 total order, S32 signed, U32 unsigned), NaNs drop out while a
number is present, an all-NaN fold is the canonical NaN, and a fold of a single element with
neither MaxAbsEn nor a seed takes no step and keeps the element's raw bits.  A fold may
keep several groups open at once (``entries``): each value names the group it belongs to
(``index``), so the values of different groups may interleave (the CUBE engine's result
path folds its output rows across block columns this way).
"""

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..model.convert import Flag
from .encoders import SrcKind
from .numeric_types import pipeline_boundary

__all__ = ["MaxReduce", "max_key"]

_SIGN = 1 << 31
_INT_MIN = 1 << 31
_INT_MAX = (1 << 31) - 1
_CANONICAL_NAN = 0x7FC00000
_NV, _OF = int(Flag.NV), int(Flag.OF)


def max_key(m: Module, value: Value, src: Value, max_abs: Value, sources, name: str) -> dict:
    """An operand in fold form: ``key`` (32 bits, MAX = larger key), ``nan``, ``snan``, ``of``.

    With ``max_abs``, |.| is applied first: FP32 clears the sign (a NaN stays NaN), S32 maps
    INT_MIN to INT_MAX and raises ``of`` (OF without NX), U32 is unchanged.
    """
    key = Signal(32, name=f"{name}_key")
    nan = Signal(name=f"{name}_nan")
    snan = Signal(name=f"{name}_snan")
    of = Signal(name=f"{name}_of")
    m.d.comb += key.eq(value)                                   # U32
    if SrcKind.FP32 in sources:
        with m.If(src == SrcKind.FP32):
            bits = Mux(max_abs, value[0:31], value)
            is_nan = (bits[23:31] == 0xFF) & (bits[0:23] != 0)
            # Total order: negative patterns reversed below the positive ones.
            m.d.comb += [key.eq(Mux(bits[31], ~bits, bits ^ _SIGN)),
                         nan.eq(is_nan), snan.eq(is_nan & ~bits[22])]
    if SrcKind.S32 in sources:
        with m.If(src == SrcKind.S32):
            int_min = value == _INT_MIN
            magnitude = Mux(int_min, _INT_MAX, abs(value.as_signed()))
            m.d.comb += [key.eq(Mux(max_abs, magnitude, value) ^ _SIGN),
                         of.eq(max_abs & int_min)]
    return {"key": key, "nan": nan, "snan": snan, "of": of}


def _max(a: dict, b: dict) -> dict:
    """MAX of two fold-form operands: a NaN yields the other, two NaNs stay NaN."""
    key = Mux(a["nan"], b["key"], Mux(b["nan"] | (a["key"] >= b["key"]), a["key"], b["key"]))
    return {"key": key, "nan": a["nan"] & b["nan"]}


class MaxReduce(wiring.Component):
    """Running MAX over groups of a value stream, with an optional seed per group.

    Parameters
    ----------
    sources : set of SrcKind
        Accumulator classes built.
    entries : int
        Groups that may be open at once (one fold state each; default 1).

    Members
    -------
    src : In(SrcKind), max_abs : In(1)
        Operation controls (held still while values are in flight).
    valid : In(1)
        A value is present this cycle (the sync domain is gated by the stream's advance).
    value : In(32)
        Raw accumulator value.
    index : In(range(entries))
        The open group the value belongs to (0 with one entry).
    first, last : In(1)
        The value opens / closes its group (both for a one-element group).
    seed, seed_en : In(32), In(1)
        With ``seed_en``, ``seed`` is folded in after the group's last value as the left
        operand (RowMaxInit); sampled with ``last``.
    result : Out(32)
        The group's MAX (raw accumulator-type bits), ``latency`` cycles after its last value.
        ``latency`` is 3 with one entry; with several, the entry's state is read in a stage
        of its own (4).
    flags : Out(5)
        Flags raised by the operands of this cycle's value: NV for an sNaN that takes part
        in a fold step, OF for |INT_MIN|; the seed's with the last value.
    """

    def __init__(self, sources, entries: int = 1):
        if entries < 1:
            raise ValueError(f"entries must be at least 1, not {entries}")
        self.sources = frozenset(SrcKind(s) for s in sources)
        self.entries = entries
        #: Cycles from ``value`` to ``result``/``flags`` (operand, [state read,] fold and
        #: final registers).
        self.latency = 3 if entries == 1 else 4
        super().__init__({"src": In(SrcKind), "max_abs": In(1), "valid": In(1),
                          "index": In(max(1, (entries - 1).bit_length())),
                          "value": In(32), "first": In(1), "last": In(1), "seed": In(32),
                          "seed_en": In(1), "result": Out(32), "flags": Out(5)})

    def elaborate(self, platform):
        m = Module()
        src, max_abs = self.src, self.max_abs
        elem = max_key(m, self.value, src, max_abs, self.sources, "elem")
        seed = max_key(m, self.seed, src, max_abs, self.sources, "seed")
        # A lone value with neither MaxAbsEn nor a seed is never an operand of MAX.
        stepped = max_abs | ~(self.first & self.last) | self.seed_en
        use_seed = self.seed_en & self.last
        nv = (elem["snan"] & stepped) | (use_seed & seed["snan"])
        of = elem["of"] | (use_seed & seed["of"])
        flags = Signal(5)
        m.d.comb += flags.eq(Mux(nv, _NV, 0) | Mux(of, _OF, 0))
        s1 = pipeline_boundary(m, True, "op", valid=self.valid, key=elem["key"],
                               nan=elem["nan"], first=self.first, stepped=stepped,
                               index=self.index,
                               raw=self.value, seed_key=seed["key"], seed_nan=seed["nan"],
                               seed_en=self.seed_en, flags=flags)

        # The fold: each entry's state holds the MAX of its group so far.
        # The last fold's outcome (the state it wrote), also the next stage's total.
        last_key = Signal(32)
        last_nan = Signal()
        if self.entries == 1:
            fold_in = s1
            state_key, state_nan = Signal(32, name="state_key"), Signal(name="state_nan")
            prior = {"key": state_key, "nan": state_nan}
        else:
            # Several entries: the states are a memory (LUT RAM on an FPGA rather than
            # registers behind a wide multiplexer, docs/decisions/hdl-postprocess.md 15),
            # read asynchronously one stage ahead into a register; a value of the entry the
            # previous value folded into takes that fold's outcome instead (it is written
            # as this reads).
            states = m.submodules.states = Memory(shape=33, depth=self.entries, init=[])
            read, write = states.read_port(domain="comb"), states.write_port()
            m.d.comb += read.addr.eq(s1["index"])
            fold_in = pipeline_boundary(m, True, "read", **s1, read_key=read.data[:32],
                                        read_nan=read.data[32])
            chained = fold_in["chained"] = Signal(name="read_chained")
            m.d.sync += chained.eq(fold_in["valid"] & (fold_in["index"] == s1["index"]))
            prior = {"key": Mux(fold_in["chained"], last_key, fold_in["read_key"]),
                     "nan": Mux(fold_in["chained"], last_nan, fold_in["read_nan"])}
        folded = _max(prior, {"key": fold_in["key"], "nan": fold_in["nan"]})
        new_key = Mux(fold_in["first"], fold_in["key"], folded["key"])
        new_nan = Mux(fold_in["first"], fold_in["nan"], folded["nan"])
        if self.entries == 1:
            with m.If(fold_in["valid"]):
                m.d.sync += [state_key.eq(new_key), state_nan.eq(new_nan)]
        else:
            m.d.comb += [write.en.eq(fold_in["valid"]), write.addr.eq(fold_in["index"]),
                         write.data.eq(Cat(new_key, new_nan))]
        m.d.sync += [last_key.eq(new_key), last_nan.eq(new_nan)]
        s2 = pipeline_boundary(m, True, "fold", stepped=fold_in["stepped"], raw=fold_in["raw"],
                               seed_key=fold_in["seed_key"], seed_nan=fold_in["seed_nan"],
                               seed_en=fold_in["seed_en"], flags=fold_in["flags"])

        # One stage later the state includes this value: fold the seed in and decode.
        total = {"key": last_key, "nan": last_nan}
        seeded = _max({"key": s2["seed_key"], "nan": s2["seed_nan"]}, total)
        best_key = Mux(s2["seed_en"], seeded["key"], total["key"])
        best_nan = Mux(s2["seed_en"], seeded["nan"], total["nan"])
        result = Signal(32)
        m.d.comb += result.eq(best_key)                          # U32
        if SrcKind.FP32 in self.sources:
            with m.If(self.src == SrcKind.FP32):
                m.d.comb += result.eq(Mux(best_nan, _CANONICAL_NAN,
                                          Mux(best_key[31], best_key ^ _SIGN, ~best_key)))
        if SrcKind.S32 in self.sources:
            with m.If(self.src == SrcKind.S32):
                m.d.comb += result.eq(best_key ^ _SIGN)
        s3 = pipeline_boundary(m, True, "out", result=Mux(s2["stepped"], result, s2["raw"]),
                               flags=s2["flags"])
        m.d.comb += [self.result.eq(s3["result"]), self.flags.eq(s3["flags"])]
        return m
