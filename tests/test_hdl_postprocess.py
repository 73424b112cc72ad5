"""PostProcess (hdl/postprocess.py), its parts and ParamCheck, against the golden model.

The oracle is :func:`ptocube.model.postprocess.postprocess`: every D element, RowMax and
GroupMax value and the ORed flags of each operation are compared word for word, and, for
operations without reductions, every element's own flags against the model applied to that
element alone.  Operations stream through one simulator per test with random stalls on both
sides (the producer offers a beat and the consumer takes one with probability < 1).

Inputs are heavy in what breaks encoders: NaNs of both kinds and signs, infinities, zeros
of both signs, subnormals, INT_MIN/INT_MAX, and values placed exactly on, or a quarter-step
beside, the rounding ties and overflow thresholds of the operation's destination type (the
column scale is then a power of two so that P can hold them exactly).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from amaranth.hdl import Shape
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig, preset
from ptocube.hdl.encoders import HIF8_BINADES, OutKind
from ptocube.hdl.param_check import ParamCheck
from ptocube.hdl.postprocess import AccBeat, DBeat, PostProcess, PostProcessPlan, built_modes
from ptocube.model.bundle import Fpatr
from ptocube.model.convert import Flag, fp8_value_table
from ptocube.model.datatype import DataType as T
from ptocube.model.faults import PTOFault
from ptocube.model.postprocess import (PREQUANT_MODES, ParamKind, check_alpha_word,
                                       check_quant_word, group_n, postprocess)

NV, OF, NX = int(Flag.NV), int(Flag.OF), int(Flag.NX)
ACC_TYPES = (T.FP32, T.S32, T.U32)
PLAN, BEAT, OUT = PostProcessPlan(), AccBeat(), DBeat()


def _fields(layout):
    return {name: (member.offset, Shape.cast(member.shape).width) for name, member in layout}


OUT_FIELDS = _fields(OUT)


def unpack_out(word: int) -> dict:
    return {name: (word >> off) & ((1 << width) - 1) for name, (off, width) in OUT_FIELDS.items()}


# --- operations ---------------------------------------------------------------------------

class Op:
    """One post-process operation: model arguments, the beats to stream and the expected result."""

    def __init__(self, p, acc, fpatr, rmode=0, sat=0, quant_scalar=None, alpha_scalar=None,
                 quant_vector=None, alpha_vector=None, rowmax_in=None, omitted=False):
        self.p = np.asarray(p, dtype=np.uint32)
        self.acc, self.fpatr, self.rmode, self.sat = acc, fpatr, rmode, sat
        self.kw = dict(quant_scalar=quant_scalar, alpha_scalar=alpha_scalar,
                       quant_vector=quant_vector, alpha_vector=alpha_vector, rowmax_in=rowmax_in)
        self.omitted = omitted
        self.result = postprocess(self.p, acc, fpatr, rmode, sat, **self.kw,
                                  omitted_ior_reads_zero=omitted)
        self.plan = PLAN.from_fpatr(fpatr, acc, rmode, sat, quant_scalar, alpha_scalar)
        m, n = self.p.shape
        qv = [0] * n if quant_vector is None else [int(w) for w in quant_vector]
        av = [0] * n if alpha_vector is None else [int(w) for w in alpha_vector]
        seeds = [0] * m if rowmax_in is None else [int(v) for v in rowmax_in]
        # RowMaxIn is only promised with a row's last beat: the others carry an sNaN / INT_MIN.
        junk = 0xFF800001 if acc is T.FP32 else 0x80000000
        self.beats = [BEAT.pack(p=int(self.p[i, j]), last=int(j == n - 1), quant=qv[j],
                                alpha=av[j], rowmax_in=seeds[i] if j == n - 1 else junk)
                      for i in range(m) for j in range(n)]

    def describe(self) -> str:
        f = self.fpatr
        return (f"mode {f.pre_quant_mode} relu {f.relu_mode} acc {self.acc.name} "
                f"rmode {self.rmode} sat {self.sat} shape {self.p.shape}")

    def element_flags(self):
        """Each element's own flags: the model applied to that element alone (no reductions)."""
        f = Fpatr(pre_quant_mode=self.fpatr.pre_quant_mode, relu_mode=self.fpatr.relu_mode)
        m, n = self.p.shape
        out = []
        for i in range(m):
            for j in range(n):
                kw = dict(self.kw, rowmax_in=None)
                for key in ("quant_vector", "alpha_vector"):
                    if kw[key] is not None:
                        kw[key] = np.asarray(kw[key])[j:j + 1]
                r = postprocess(self.p[i:i + 1, j:j + 1], self.acc, f, self.rmode, self.sat,
                                **kw, omitted_ior_reads_zero=self.omitted)
                out.append(r.flags)
        return out

    def check(self, beats, sticky):
        r, f = self.result, self.fpatr
        m, n = self.p.shape
        assert len(beats) == m * n, self.describe()
        gn = group_n(f.group_n_code) if f.group_max_en else 0
        ored = 0
        for k, word in enumerate(beats):
            i, j = divmod(k, n)
            b = unpack_out(word)
            where = f"{self.describe()} element ({i},{j}) p={int(self.p[i, j]):#x}"
            assert b["d"] == int(r.d[i, j]), f"{where}: d {b['d']:#x} != {int(r.d[i, j]):#x}"
            assert b["last"] == int(j == n - 1), where
            assert b["rowmax_valid"] == int(f.row_max_en and j == n - 1), where
            if b["rowmax_valid"]:
                assert b["rowmax"] == int(r.rowmax[i]), \
                    f"{where}: rowmax {b['rowmax']:#x} != {int(r.rowmax[i]):#x}"
            group_end = bool(gn) and (j == n - 1 or j % gn == gn - 1)
            assert b["groupmax_valid"] == int(group_end), where
            if group_end:
                want = int(r.groupmax[i, j // gn])
                assert b["groupmax"] == want, f"{where}: groupmax {b['groupmax']:#x} != {want:#x}"
            ored |= b["flags"]
        assert ored == r.flags, f"{self.describe()}: flags {ored:#x} != {r.flags:#x}"
        assert sticky == r.flags, f"{self.describe()}: sticky flags {sticky:#x}"
        if not (f.row_max_en or f.group_max_en):
            for k, (word, want) in enumerate(zip(beats, self.element_flags())):
                got = unpack_out(word)["flags"]
                assert got == want, \
                    f"{self.describe()} element {divmod(k, n)}: flags {got:#x} != {want:#x}"


def stream_ops(dut, ops, rng, p_in=0.75, p_out=0.75):
    """Stream each operation through ``dut`` in one simulation, with random stalls.

    Returns ``(beats, sticky flags)`` per operation and the simulated cycle count.
    """
    results = []
    cycles = [0]

    async def bench(ctx):
        for op in ops:
            assert not ctx.get(dut.busy)
            ctx.set(dut.plan.as_value(), op.plan)
            ctx.set(dut.clear, 1)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            sent, got = 0, []
            total = len(op.beats)
            while len(got) < total:
                offer = sent < total and rng.random() < p_in
                ctx.set(dut.acc_in.valid, offer)
                if offer:
                    ctx.set(dut.acc_in.payload.as_value(), op.beats[sent])
                take = bool(rng.random() < p_out)
                ctx.set(dut.d_out.ready, take)
                _, _, in_ready, out_valid, payload = await ctx.tick().sample(
                    dut.acc_in.ready, dut.d_out.valid, dut.d_out.payload.as_value())
                cycles[0] += 1
                sent += bool(offer and in_ready)
                if take and out_valid:
                    got.append(payload)
            ctx.set(dut.acc_in.valid, 0)
            assert ctx.get(dut.plan_ok), op.describe()
            results.append((got, ctx.get(dut.flags)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results, cycles[0]


def run_and_check(ops, rng, config=None, dut=None, **stalls):
    dut = dut or PostProcess(config or CubeConfig())
    results, _ = stream_ops(dut, ops, rng, **stalls)
    for op, (beats, sticky) in zip(ops, results):
        op.check(beats, sticky)


# --- special-heavy inputs -------------------------------------------------------------------

FP32_SPECIALS = np.array([0x7FC00000, 0xFFC00001, 0x7FA00000, 0xFF800001, 0x7F800000,
                          0xFF800000, 0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                          0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32)
S32_SPECIALS = np.array([0x80000000, 0x7FFFFFFF, 0, 1, 0xFFFFFFFF, 0x80000001, 0x40000000,
                         0xC0000000, 0x00010000, 0xFFFF0000], dtype=np.uint32)


def f32_bits(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def exact_f32(x: float):
    """FP32 bits of ``x`` if it is exactly an FP32 value, else None."""
    if not math.isfinite(x) or abs(x) > 3.4e38:
        return None
    y = np.float32(x)
    return int(y.view(np.uint32)) if float(y) == x else None


def _finite_values(dtype) -> np.ndarray:
    """Sorted non-negative finite values of a narrow destination type."""
    if dtype is T.FP16:
        v = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    elif dtype is T.BF16:
        v = np.arange(0, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    else:
        t = fp8_value_table(dtype)
        v = t[np.isfinite(t) & (t >= 0)]
    return np.unique(v)


_VALUES = {d: _finite_values(d) for d in (T.FP16, T.BF16, T.E4M3, T.HiF8)}


def interesting_target(rng, d_type, width):
    """A real value on or beside a rounding tie or threshold of D (or of the intermediate)."""
    sign = -1.0 if rng.random() < 0.5 else 1.0
    if d_type in _VALUES:
        v = _VALUES[d_type]
        if rng.random() < 0.25:                     # around the largest finite value
            top, ulp = v[-1], v[-1] - v[-2]
            return sign * (top + ulp * rng.choice([0, 0.25, 0.5, 0.75, 1, 2, 64]))
        i = int(rng.integers(0, len(v) - 1))
        lo, hi = v[i], v[i + 1]
        return sign * (lo + (hi - lo) * rng.choice([0, 0.25, 0.5, 0.75]))
    if width:                                       # S5/S9/S17 intermediate
        edge = 1 << (width - 1)
        base = rng.choice([0, 1, 2, edge - 2, edge - 1, edge, edge + 1, int(rng.integers(0, edge))])
        return sign * (base + rng.choice([0, 0.25, 0.5, 0.75]))
    return None


def rand_p(rng, acc, n, targets=(), scales=None):
    """``n`` raw accumulator values; some placed on ``targets`` (reals) through ``scales``."""
    out = np.empty(n, dtype=np.uint32)
    for k in range(n):
        r = rng.random()
        if r < 0.3 and targets and scales is not None:
            t, s = targets[k], scales[k]
            if t is not None and s:
                x = t / s
                if acc is T.FP32:
                    bits = exact_f32(x)
                elif x == int(x) and (acc is T.S32 and -2 ** 31 <= x < 2 ** 31
                                      or acc is T.U32 and 0 <= x < 2 ** 32):
                    bits = int(x) & 0xFFFFFFFF
                else:
                    bits = None
                if bits is not None:
                    out[k] = bits
                    continue
        if acc is T.FP32:
            if r < 0.45:
                out[k] = rng.choice(FP32_SPECIALS)
            elif r < 0.75:
                out[k] = f32_bits(float(rng.integers(-300, 300)) + rng.choice([0.25, 0.5, 0.75]))
            else:
                exp = int(rng.integers(90, 160) if rng.random() < 0.7 else rng.integers(0, 255))
                out[k] = int(rng.integers(0, 2)) << 31 | exp << 23 | int(rng.integers(0, 1 << 23))
        elif acc is T.S32:
            if r < 0.45:
                out[k] = rng.choice(S32_SPECIALS)
            elif r < 0.75:
                out[k] = int(rng.integers(-600, 600)) & 0xFFFFFFFF
            else:
                out[k] = int(rng.integers(-(1 << 31), 1 << 31)) >> int(rng.integers(0, 31)) \
                    & 0xFFFFFFFF
        else:
            out[k] = int(rng.integers(0, 1 << 32)) >> int(rng.integers(0, 32))
    return out


def fp19_value(bits19: int) -> float:
    exp, frac = (bits19 >> 10) & 0xFF, bits19 & 0x3FF
    return (1 + frac / 1024) * 2.0 ** (exp - 127) if exp else frac * 2.0 ** -136


def rand_scale19(rng):
    """A positive normal FP19: often a power of two, sometimes 1.5 (makes FP32 ties)."""
    r = rng.random()
    if r < 0.4:
        return int(rng.integers(120, 135)) << 10
    if r < 0.55:
        return 127 << 10 | 512
    if r < 0.9:
        return int(rng.integers(110, 145)) << 10 | int(rng.integers(0, 1024))
    return int(rng.integers(1, 255)) << 10 | int(rng.integers(0, 1024))


def rand_alpha19(rng):
    r = rng.random()
    if r < 0.15:
        return 0
    if r < 0.5:
        return int(rng.integers(120, 130)) << 10
    return int(rng.integers(100, 170)) << 10 | int(rng.integers(0, 1024))


def rand_quant_word(rng, mode):
    if mode.shift:
        return int(rng.integers(0, 16)) << 32
    width = mode.offset_width
    word = rand_scale19(rng) << 13
    if width:
        off = int(rng.integers(-(1 << (width - 1)), 1 << (width - 1)))
        if rng.random() < 0.3:
            off = int(rng.choice([-(1 << (width - 1)), (1 << (width - 1)) - 1, 0]))
        word |= (off & ((1 << width) - 1)) << 37
    return word


def make_op(rng, code, relu, rmode, sat, acc=None, shape=(2, 9), reductions=None,
            omitted=False):
    """A random operation of PreQuantMode ``code``; ``reductions``: dict of Fpatr fields."""
    mode = PREQUANT_MODES[code]
    acc = acc or mode.source
    m, n = shape
    d_type = acc if mode.d_dtype is None else mode.d_dtype
    kw = {}
    words = [None] * n
    if mode.param is ParamKind.SCALAR:
        kw["quant_scalar"] = None if omitted else rand_quant_word(rng, mode)
        words = [kw["quant_scalar"] or 0] * n
    elif mode.param is ParamKind.VECTOR:
        words = [rand_quant_word(rng, mode) for _ in range(n)]
        kw["quant_vector"] = np.array(words, dtype=np.uint64)
    if relu == 2:
        kw["alpha_scalar"] = None if omitted else rand_alpha19(rng)
    elif relu == 3:
        kw["alpha_vector"] = np.array([rand_alpha19(rng) for _ in range(n)], dtype=np.uint64)
    scales = [fp19_value((w >> 13) & 0x7FFFF) if w and not mode.shift else 1.0 for w in words]
    targets = [interesting_target(rng, d_type, mode.offset_width) for _ in range(m * n)]
    p = rand_p(rng, acc, m * n, targets, scales * m).reshape(shape)
    fields = dict(reductions or {})
    fpatr = Fpatr(pre_quant_mode=code, relu_mode=relu, **fields)
    if fpatr.row_max_en and fpatr.row_max_init:
        kw["rowmax_in"] = rand_p(rng, acc, m)
    return Op(p, acc, fpatr, rmode, sat, omitted=omitted, **kw)


def allowed_controls(code):
    mode = PREQUANT_MODES[code]
    return (list(range(8)) if mode.rmode_free else [0]), ([0, 1] if mode.sat_free else [0])


def mode_ops(rng, codes, shape=(2, 9)):
    """Every (mode, ReluMode, accumulator) with a random legal RMode/Sat."""
    ops = []
    for code in codes:
        rmodes, sats = allowed_controls(code)
        accs = ACC_TYPES if code == 0 else (None,)
        for acc in accs:
            for relu in range(4):
                ops.append(make_op(rng, code, relu, int(rng.choice(rmodes)),
                                   int(rng.choice(sats)), acc, shape))
    return ops


FP32_MODES = sorted(c for c, m in PREQUANT_MODES.items() if m.source is T.FP32)
S32_MODES = sorted(c for c, m in PREQUANT_MODES.items() if m.source is T.S32)


# --- every mode x every ReluMode -------------------------------------------------------------

@pytest.mark.parametrize("codes", [[0], FP32_MODES, S32_MODES], ids=["mode0", "fp32", "s32"])
def test_every_mode_every_relu(codes):
    rng = np.random.default_rng(sum(codes) + 11)
    run_and_check(mode_ops(rng, codes), rng)


def test_programmable_modes_every_rmode_and_sat():
    rng = np.random.default_rng(23)
    ops = []
    for code in (3, 5, 17, 19, 24, 27, 35, 38):
        for rmode in range(8):
            for sat in (0, 1):
                ops.append(make_op(rng, code, int(rng.integers(0, 4)), rmode, sat, shape=(1, 8)))
    run_and_check(ops, rng)


def test_fixed_rounding_modes_with_sat():
    rng = np.random.default_rng(29)
    ops = [make_op(rng, code, relu, 0, sat, shape=(2, 8))
           for code in (1, 16, 25, 26, 28, 32, 33, 34, 36, 37) for sat in (0, 1)
           for relu in (0, 2)]
    run_and_check(ops, rng)


def test_omitted_ior_reads_zero():
    # The ASL-replay convention: a missing scalar is the zero GPR (scale 0, shift 1, alpha 0).
    rng = np.random.default_rng(31)
    ops = [make_op(rng, code, relu, 0, 0, shape=(1, 6), omitted=True)
           for code in (3, 13, 24, 27, 35) for relu in (0, 2)]
    run_and_check(ops, rng)


def test_directed_values():
    """Hand-picked points: spec check values, ties, thresholds and the -0 / -inf rules."""
    one, half = 0x3F800000, 0x3F000000
    fp = lambda *v: np.array([[f32_bits(x) for x in v]], dtype=np.uint32)
    ops = [
        # FP32 1.5 -> E4M3 0x3C and HiF8 0x0C; 0x3F801000 -> FP16 0x3C00 (NX).
        Op(fp(1.5, 448.0, 449.0, 464.0, 480.0, -1e-9, 2.0 ** -10), T.FP32,
           Fpatr(pre_quant_mode=26), quant_scalar=one),
        Op(fp(1.5, 32768.0, 40000.0, 2.0 ** -23, 1.5 * 2 ** -23, -2.0 ** -23, 49152.0), T.FP32,
           Fpatr(pre_quant_mode=25), quant_scalar=one),
        Op([[0x3F801000, 0x477FF000, 0x477FE000, 0x33000000, 0x33000001, 0xC77FF000]], T.FP32,
           Fpatr(pre_quant_mode=32), quant_scalar=one),
        # -0 keeps its sign with a nonzero multiplier, becomes +0 under ReLU; -inf * 0 is 0.
        Op(fp(-0.0, float("-inf"), -0.0, 1.0), T.FP32, Fpatr(pre_quant_mode=34, relu_mode=1),
           quant_scalar=one),
        Op(fp(-0.0, float("-inf"), -3.0), T.FP32, Fpatr(pre_quant_mode=25, relu_mode=2),
           quant_scalar=one, alpha_scalar=0),
        Op(fp(-0.0, float("-inf"), -4.0), T.FP32, Fpatr(pre_quant_mode=24, relu_mode=2),
           quant_scalar=one, alpha_scalar=half >> 13),
        # 127.5 RNA -> 128 -> Sat 127; S9 clamp then offset wrap.
        Op(fp(127.5, -127.5, 300.0, -300.0), T.FP32, Fpatr(pre_quant_mode=24), 5, 1,
           quant_scalar=one),
        Op(fp(255.0, -256.0, 250.0, -250.0), T.FP32, Fpatr(pre_quant_mode=24), 1, 0,
           quant_scalar=one | (100 << 37)),
        # Shift modes: ASR then S16 saturation; ReLU ignored.
        Op([[0x80000000, 0x7FFFFFFF, 0xFFFFFFFF, 0x00012345]], T.S32,
           Fpatr(pre_quant_mode=13, relu_mode=1), quant_scalar=0),
        # Mode 0 on S32 with LReLU alpha 2**20: wraps modulo 2**32 with OF|NX.
        Op([[0x80000000, 0xFFFFF000, 0xFFFFFFFF, 5]], T.S32,
           Fpatr(pre_quant_mode=0, relu_mode=2), alpha_scalar=147 << 10),
        # Overflow to infinity under every rounding mode (RTZ here) and its Sat variant.
        Op(fp(3.0e38, -3.0e38), T.FP32, Fpatr(pre_quant_mode=27), 2, 0, quant_scalar=0x40000000),
        Op(fp(3.0e38, -3.0e38), T.FP32, Fpatr(pre_quant_mode=27), 2, 1, quant_scalar=0x40000000),
    ]
    run_and_check(ops, np.random.default_rng(3))


# --- RowMax / GroupMax -------------------------------------------------------------------------

def reduction_ops(rng, count):
    """Operations with RowMax and/or GroupMax; every choice drawn independently."""
    ops = []
    for k in range(count):
        acc = ACC_TYPES[k % 3]
        code = 0 if acc is T.U32 or rng.random() < 0.5 else int(
            rng.choice(FP32_MODES if acc is T.FP32 else S32_MODES))
        gcode = int(rng.integers(1, 10)) if rng.random() < 0.7 else 1
        gn = group_n(gcode)
        n = int(rng.choice([1, 2, gn - 1, gn, gn + 1, 2 * gn + 1, int(rng.integers(1, 20))]))
        n = max(1, min(n, 40))
        m = int(rng.integers(1, 4))
        which = int(rng.integers(0, 3))             # row only, group only, both
        fields = dict(row_max_en=which != 1, group_max_en=which != 0,
                      max_abs_en=bool(rng.random() < 0.4))
        fields["group_n_code"] = gcode if fields["group_max_en"] else 0
        fields["row_max_init"] = fields["row_max_en"] and bool(rng.random() < 0.5)
        rmodes, sats = allowed_controls(code)
        op = make_op(rng, code, int(rng.integers(0, 4)), int(rng.choice(rmodes)),
                     int(rng.choice(sats)), acc, (m, n), fields)
        if acc is not T.U32 and m > 1:
            # An all-negative row orders negatives among themselves (max_abs aside).
            if acc is T.FP32:
                op.p[-1, :] |= np.uint32(0x80000000)
            else:
                op.p[-1, :] = np.where(op.p[-1, :] >> 31 == 1, op.p[-1, :],
                                       (-op.p[-1, :].astype(np.int64) - 1) & 0xFFFFFFFF)
        if acc is T.FP32 and rng.random() < 0.5:
            # All-NaN rows and NaN seeds reach the canonical-NaN and raw-bit rules; NaNs in
            # the last column also make one-element groups of NaN when N = k*GroupN + 1.
            op.p[0, :] = rng.choice(np.array([0x7FC00000, 0x7F800001, 0xFFC12345], np.uint32), n)
            op.p[:, -1] = rng.choice(np.array([0x7FA00000, 0xFF800001, 0x7FC00000], np.uint32), m)
            if op.kw["rowmax_in"] is not None:
                op.kw["rowmax_in"][0] = 0x7FA00000
        if acc is T.S32 and rng.random() < 0.5:
            op.p[0, int(rng.integers(0, n))] = 0x80000000       # |INT_MIN| saturates with OF
            if op.kw["rowmax_in"] is not None and rng.random() < 0.5:
                op.kw["rowmax_in"][-1] = 0x80000000
        ops.append(Op(op.p, acc, op.fpatr, op.rmode, op.sat, **op.kw))
    return ops


def test_reduction_corner_cases():
    """One-element folds keep raw bits, seeds count only with the last beat, signed zeros."""
    snan, qnan, one = 0x7FA00000, 0x7FC00000, 0x3F800000
    group8 = dict(group_max_en=True, group_n_code=1)
    row_seeded = dict(row_max_en=True, row_max_init=True)
    ops = [
        # A lone sNaN in the last group (N = 9, GroupN = 8) is not a MAX operand: raw, no NV.
        Op([[one] * 8 + [snan]], T.FP32, Fpatr(**group8)),
        Op([[snan], [0xFFC00001]], T.FP32, Fpatr(row_max_en=True)),
        # A seed makes a one-element row a fold step: MAX(seed, x), NV for an sNaN operand.
        Op([[one], [snan], [0xC0000000]], T.FP32, Fpatr(**row_seeded),
           rowmax_in=[0x40000000, one, qnan]),
        # The same with MaxAbsEn is a fold step: canonical NaN and NV.
        Op([[one] * 8 + [snan]], T.FP32, Fpatr(max_abs_en=True, **group8)),
        # Seeded rows of ordinary values raise nothing (junk seeds on other beats ignored).
        Op([[one, 0xBF800000, 0x40000000]] * 2, T.FP32, Fpatr(**row_seeded),
           rowmax_in=[0x40400000, 0xC0400000]),
        Op([[5, 0xFFFFFFF0, 7]] * 2, T.S32, Fpatr(max_abs_en=True, **row_seeded),
           rowmax_in=[3, 0xFFFFFF00]),
        # MAX(-0, +0) = +0; MAX(-0, -0) = -0; negatives order by magnitude.
        Op([[0x80000000, 0], [0x80000000, 0x80000000], [0xC0000000, 0xBF800000]], T.FP32,
           Fpatr(row_max_en=True)),
        Op([[0x80000000, 0x80000001, 0x7FFFFFFF]], T.S32, Fpatr(row_max_en=True, **group8)),
    ]
    assert ops[0].result.groupmax[0, 1] == snan and ops[0].result.flags == 0
    assert ops[2].result.rowmax.tolist() == [0x40000000, one, 0xC0000000]
    assert ops[2].result.flags == NV
    assert ops[4].result.flags == 0 and ops[5].result.flags == 0
    run_and_check(ops, np.random.default_rng(43))


def test_row_and_group_max():
    rng = np.random.default_rng(41)
    run_and_check(reduction_ops(rng, 36), rng)


# --- stream behaviour ----------------------------------------------------------------------------

def test_one_element_per_cycle_and_latency():
    rng = np.random.default_rng(5)
    op = make_op(rng, 33, 3, 0, 0, shape=(4, 16),
                 reductions=dict(row_max_en=True, group_max_en=True, group_n_code=1))
    dut = PostProcess()
    results, cycles = stream_ops(dut, [op], rng, p_in=1.0, p_out=1.0)
    op.check(*results[0])
    assert cycles == 64 + PostProcess.latency


def test_pipeline_fills_while_output_stalls():
    """With the consumer stalled the unit still takes one beat per stage, then waits."""
    rng = np.random.default_rng(7)
    op = make_op(rng, 3, 1, 1, 1, shape=(1, 12))
    dut = PostProcess()
    accepted = []

    async def bench(ctx):
        ctx.set(dut.plan.as_value(), op.plan)
        ctx.set(dut.d_out.ready, 0)
        await ctx.tick()                            # the plan leads its first beat
        sent, got = 0, []
        for cycle in range(40):
            if cycle == 20:
                accepted.append(sent)
                ctx.set(dut.d_out.ready, 1)
            ctx.set(dut.acc_in.valid, sent < len(op.beats))
            if sent < len(op.beats):
                ctx.set(dut.acc_in.payload.as_value(), op.beats[sent])
            _, _, in_ready, out_valid, payload, ready = await ctx.tick().sample(
                dut.acc_in.ready, dut.d_out.valid, dut.d_out.payload.as_value(),
                dut.d_out.ready)
            sent += bool(in_ready and sent < len(op.beats))
            if out_valid and ready:
                got.append(payload)
        accepted.append(got)
        accepted.append(ctx.get(dut.flags))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert accepted[0] == PostProcess.latency
    op.check(accepted[1], accepted[2])


def test_heavy_backpressure():
    rng = np.random.default_rng(6)
    ops = mode_ops(rng, [24, 35], shape=(3, 5))
    run_and_check(ops, rng, p_in=0.9, p_out=0.25)
    run_and_check(ops, rng, p_in=0.25, p_out=0.9)


def test_plan_ok_and_bit_copy_for_unbuilt_plans():
    dut = PostProcess(preset("ecp5-int8"))
    async def bench(ctx):
        for code, acc, ok in ((0, T.S32, 1), (3, T.S32, 1), (3, T.U32, 0), (24, T.FP32, 0),
                              (5, T.S32, 0), (0, T.FP32, 0), (6, T.S32, 0)):
            ctx.set(dut.plan.as_value(), PLAN.pack(acc_type=int(acc), pre_quant_mode=code,
                                        quant_scalar=0x3F800000))
            await ctx.tick().repeat(2)              # the decode's two register stages
            assert ctx.get(dut.plan_ok) == ok, (code, acc)
        ctx.set(dut.plan.as_value(), PLAN.pack(acc_type=int(T.S32), pre_quant_mode=3,
                                    group_n_code=12))
        await ctx.tick().repeat(2)
        assert ctx.get(dut.plan_ok) == 0
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


# --- builds --------------------------------------------------------------------------------------

def test_integer_only_build_has_no_float_logic():
    dut = PostProcess(preset("ecp5-int8"))
    assert sorted(dut.modes) == [0, 2, 3, 12, 13, 17, 18, 19, 20]
    assert dut.out_kinds == {OutKind.S4, OutKind.S8, OutKind.S16, OutKind.S32}
    assert dut.acc_types == (T.S32, T.U32)
    rng = np.random.default_rng(51)
    ops = mode_ops(rng, [0, 2, 3, 12, 17, 19], shape=(1, 6))
    ops = [op for op in ops if op.acc is not T.FP32]
    run_and_check(ops, rng, dut=dut)


def test_float_only_build():
    config = CubeConfig(int_types=False)
    assert sorted(built_modes(config)) == [0] + FP32_MODES
    rng = np.random.default_rng(53)
    ops = [op for op in mode_ops(rng, [0, 23, 25, 38], shape=(1, 6)) if op.acc is T.FP32]
    run_and_check(ops, rng, config=config)


def test_hif8_binades_match_model_table():
    table = fp8_value_table(T.HiF8)
    for e, (code, bits) in HIF8_BINADES.items():
        for k in range(1 << bits):
            assert table[code + k] == 2.0 ** e * (1 + k / (1 << bits))


# --- ParamCheck --------------------------------------------------------------------------------

def _model_ok(check, *args):
    try:
        check(*args)
        return 1
    except PTOFault:
        return 0


def param_words(rng, count):
    """Quantization/activation words around every legality boundary, plus random ones."""
    words = []
    for _ in range(count):
        fp19 = int(rng.choice([0, 1, 0x3FF, 1 << 10, 0x1FC00, 0x3FBFF, 0x3FC00, 0x3FFFF,
                               0x40000 | 0x1FC00, int(rng.integers(0, 1 << 19))]))
        word = fp19 << 13
        r = rng.random()
        if r < 0.3:
            word |= int(rng.integers(0, 1 << 17)) << 37 >> int(rng.integers(0, 13))
        elif r < 0.45:
            word |= 1 << int(rng.integers(0, 64))
        elif r < 0.6:
            word = int(rng.integers(0, 16)) << 32 | (1 << int(rng.integers(0, 64))
                                                   if rng.random() < 0.3 else 0)
        elif r < 0.8:
            word = fp19 | (1 << int(rng.integers(19, 64)) if rng.random() < 0.3 else 0)
        elif r < 0.9:
            word = int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2))
        words.append(word & ((1 << 64) - 1))
    return words


@pytest.mark.parametrize("config", [CubeConfig(), preset("ecp5-int8")], ids=["full", "int8"])
def test_param_check_matches_model(config):
    rng = np.random.default_rng(61)
    dut = ParamCheck(config)
    built = built_modes(config)
    words = param_words(rng, 160)

    async def bench(ctx):
        for code in range(64):
            ctx.set(dut.mode, code)
            assert ctx.get(dut.mode_built) == int(code in built), code
            for word in words:
                ctx.set(dut.quant, word)
                ctx.set(dut.alpha, word)
                want = _model_ok(check_quant_word, code, word) if code in PREQUANT_MODES else 0
                assert ctx.get(dut.quant_ok) == want, (code, hex(word))
        for word in words:
            ctx.set(dut.alpha, word)
            assert ctx.get(dut.alpha_ok) == _model_ok(check_alpha_word, word), hex(word)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


# --- large sweep (make regress) ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_large_sweep(seed):
    rng = np.random.default_rng(1000 + seed)
    ops = mode_ops(rng, sorted(PREQUANT_MODES), shape=(4, 12))
    for code in sorted(PREQUANT_MODES):
        rmodes, sats = allowed_controls(code)
        for rmode in rmodes:
            for sat in sats:
                acc = ACC_TYPES[int(rng.integers(0, 3))] if code == 0 else None
                ops.append(make_op(rng, code, int(rng.integers(0, 4)), rmode, sat, acc,
                                   shape=(2, 10)))
    ops += reduction_ops(rng, 120)
    run_and_check(ops, rng)
