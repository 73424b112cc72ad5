"""The hardware preflight (hdl/preflight.py) against the golden model's preflight.

Every case is a model :class:`State` and one bundle record (decoded by the model decoder).
The simulated :class:`Preflight` reads the state through its ports - a testbench tile store
answers them from the State, one cycle after each request, and puts garbage on every port
nobody read - and its verdict is compared with the model:

* the fault class and reporting index of :class:`~ptocube.model.machine.Machine` /
  :func:`~ptocube.model.preflight.preflight`;
* the *point*: which step of :mod:`ptocube.model.preflight` raised (found by running the
  model's step functions one by one, :func:`model_point`) and, when the model's reason names
  a PE, that PE;
* on approval, the whole plan, bit for bit (:meth:`PlanLayout.encode` of the model's plan);
* that a fault or no-op record reads nothing, and that ``commit_enable`` rises only after
  an approval and falls with ``exec_done``.

TIMG2COL bundles go on to the :class:`~ptocube.hdl.img2col_engine.Img2ColEngine` (one job per
selected PE, built by :func:`~ptocube.hdl.preflight.img2col_job`), and the composition must
give the model's verdict.

Vectors: the fault vectors of ``test_preflight.py`` (decode faults included), directed
cases for each rule, the example scenarios, and seeded random bundles and states (mostly
legal, a fault injected at random).  Bigger random sweeps are marked ``slow``.
"""

import dataclasses
import random
import re
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.descriptor import RecordLayout
from ptocube.hdl.img2col_engine import Img2ColEngine
from ptocube.hdl.preflight import (Check, Outcome, Preflight, _group_count, cube_shape,
                                   img2col_job, ordinary_shape)
from ptocube.hdl.tile_desc import (PlanLayout, SharedDescLayout, TileDescLayout, encode_shared,
                                   encode_tile, shared_defined, tile_defined)
from ptocube.model import preflight as P
from ptocube.model.asm import assemble
from ptocube.model.bundle import Bundle, BundleRecord, Datr, Destination, Fpatr, Operation
from ptocube.model.datatype import (MX_MATRIX_TYPES, MX_SCALED_TYPES, ORDINARY_MATRIX_TYPES,
                                    TIMG2COL_TYPES, DataType, NumClass, accumulator_type)
from ptocube.model.decode import BundleDecoder, decode_stream
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.img2col import FeatureMapDescriptor
from ptocube.model.isa import word_and_length
from ptocube.model.layout import (LOCAL_MAX_CAPACITY_BYTES, SHARED_MAX_CAPACITY_BYTES, Layout,
                                  cube_geometry, cube_shape_legal, ordinary_shape_legal)
from ptocube.model.machine import Machine
from ptocube.model.postprocess import PREQUANT_MODES, ParamKind, d_dtype, group_count, group_n
from ptocube.model.scenario import load_scenario
from ptocube.model.state import PE_COUNT, Location, SharedTile, State, pes_of_mask, popcount
from ptocube.sim.bench_img2col import load_feature_map

from model_helpers import make_state, matrix_bundle, tile
from img2col_cases import random_descriptor
from fault_vectors import CASES as FAULT_VECTORS

CONFIG = CubeConfig()
TL, TA = FaultClass.TILE_LEGALITY, FaultClass.TILE_ALLOCATION
BC, II = FaultClass.BUNDLE_CONTROL, FaultClass.ILLEGAL_INSTRUCTION
RECORDS = RecordLayout(CONFIG)
PLANS = PlanLayout(CONFIG)


# ---------------------------------------------------------------------------
# The model side: verdict, point and plan
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Expected:
    """What the model says about one record."""
    outcome: Outcome
    fault: FaultClass = FaultClass.NONE
    index: int = 0
    check: Check = Check.NONE
    pe: int | None = None               # the PE the model's reason names, if any
    plan: object = None                 # the model plan (Matrix, or TIMG2COL when it passed)
    i2c_engine: bool = False            # TIMG2COL: the preflight approves, the engine decides


def _pe_of(fault: PTOFault):
    found = re.search(r"\bPE(\d)\b", fault.reason)
    return int(found.group(1)) if found else None


def model_point(bundle: Bundle, state: State):
    """``(Check, PTOFault or None)``: the model's preflight steps run one by one, in
    :func:`ptocube.model.preflight.plan_matrix`'s order (TIMG2COL: the steps before the
    engine's destination-shape check)."""
    if bundle.op is Operation.TIMG2COL:
        steps = [(Check.I2C_ATTRIBUTES, lambda c: P.img2col_attributes_legal(bundle)),
                 (Check.I2C_DIMENSIONS, lambda c: P.img2col_dimensions(bundle)),
                 (Check.I2C_ALLOCATION, lambda c: P._allocate_indices(bundle, state))]
    else:
        def local(c):
            c["local"] = P._local_roles(bundle, c["types"])
            c["pes"] = pes_of_mask(bundle.pe_mask)

        steps = [
            (Check.TYPES, lambda c: c.update(types=P.matrix_types_legal(bundle))),
            (Check.BINDINGS, lambda c: P.dynamic_bindings_complete(bundle, c["types"], state)),
            (Check.DATR, lambda c: P.data_attributes_legal(bundle)),
            (Check.DIMENSIONS, lambda c: c.update(mnk=P.dimensions_legal(bundle))),
            (Check.ATTRIBUTES, lambda c: P.documented_attribute_rules(bundle)),
            (Check.GEMV_M, lambda c: P.gemv_m_is_one(bundle, c["mnk"][0])),
            (Check.SHARED, lambda c: P.shared_schemas_legal(bundle, c["types"], *c["mnk"],
                                                           state)),
            (Check.NONE, local),
            (Check.POSTPROCESS, lambda c: P.postprocess_sources_legal(
                bundle, c["types"], c["local"], *c["mnk"][:2], state, c["pes"])),
            (Check.MATH_SOURCES, lambda c: P.local_mathematical_sources_legal(
                bundle, c["types"], c["local"], *c["mnk"], state, c["pes"])),
            (Check.CD_INDEX, lambda c: P.accumulator_destination_distinct(bundle)),
            (Check.M_LAYOUT, lambda c: c.update(layouts=P.cooperative_m_layout(
                bundle, c["local"], c["mnk"][0], state, c["pes"]))),
            (Check.ALLOCATION, lambda c: P.resolve_destination_group(
                bundle, c["types"], d_dtype(bundle.fpatr.pre_quant_mode, c["types"].acc),
                *c["mnk"][:2], c["layouts"], state)),
        ]
    context = {}
    for check, step in steps:
        try:
            step(context)
        except PTOFault as fault:
            return check, fault
    return Check.NONE, None


def expected(record: BundleRecord, state: State) -> Expected:
    """The model's verdict on ``record`` (and, for TIMG2COL, what is left to the engine)."""
    if not record.ok:
        return Expected(Outcome.FAULT, record.fault, record.fault_index, Check.RECORD)
    if record.noop:
        return Expected(Outcome.NOOP)
    bundle = record.bundle
    check, fault = model_point(bundle, state)
    try:
        plan = P.preflight(bundle, state)
    except PTOFault as whole:
        plan = None
        if fault is None:       # a TIMG2COL fault after allocation: the engine's
            assert bundle.op is Operation.TIMG2COL
            return Expected(Outcome.APPROVE, whole.fault, bundle.boundary_index,
                            i2c_engine=True)
        assert whole.fault is fault.fault and whole.reason == fault.reason
    if fault is not None:
        return Expected(Outcome.FAULT, fault.fault, bundle.boundary_index, check, _pe_of(fault))
    return Expected(Outcome.APPROVE, plan=plan, i2c_engine=bundle.op is Operation.TIMG2COL)


# ---------------------------------------------------------------------------
# The testbench tile store
# ---------------------------------------------------------------------------

class TileStore:
    """Answers the preflight's read ports from a model :class:`State`."""

    def __init__(self, state: State, config: CubeConfig = CONFIG):
        self.state = state
        self.config = config

    def tile(self, pe, index):
        t = self.state.tile(pe, index)
        return encode_tile(t), int(tile_defined(t))

    def shared(self, sid):
        s = self.state.shared.get(sid)
        return encode_shared(s), int(shared_defined(s))

    def word(self, pe, index, addr):
        t = self.state.tile(pe, index)
        if t is None or 8 * addr + 8 > t.payload.size:
            return 0
        return int(t.payload[8 * addr:8 * addr + 8].view("<u8")[0])

    def gpr(self, number):
        return self.state.read_gpr(number)

    def alloc(self):
        allocated = sum(1 << i for i in range(64) if self.state.index_allocated(i))
        pe_bytes = [sum(t.capacity for t in pe.tiles if t is not None) for pe in self.state.pes]
        return allocated, self.state.capacity_in_use(), pe_bytes, self.state.tile_capacity


@dataclasses.dataclass
class Result:
    """What the hardware did with one record."""
    outcome: Outcome
    fault: FaultClass
    index: int
    check: Check
    pe: int
    plan: int | None
    cycles: int                     # record accepted .. verdict valid
    reads: int
    commit_cycles: int              # cycles commit_enable was high


class Bench(Elaboratable):
    """The preflight, plus (``with_engine``) a TIMG2COL engine fed by :func:`img2col_job`
    from a source descriptor the testbench drives (it loads the feature map itself)."""

    def __init__(self, config=CONFIG, with_engine=False):
        self.dut = Preflight(config)
        self.with_engine = with_engine
        if with_engine:
            self.engine = Img2ColEngine(config)
            self.src_desc = Signal(TileDescLayout)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        if self.with_engine:
            m.submodules.engine = engine = self.engine
            job = img2col_job(m, plan=dut.plan, desc=self.src_desc,
                              tile_capacity=dut.alloc.tile_capacity, config=dut.config)
            m.d.comb += engine.job.payload.eq(job)
        return m


def run(cases, config=CONFIG, seed=0):
    """Run ``cases`` (``(state, record)`` pairs) back to back on one simulated preflight."""
    bench = Bench(config, with_engine=any(
        r.ok and not r.noop and r.bundle.op is Operation.TIMG2COL for _, r in cases))
    dut = bench.dut
    rng = random.Random(seed)
    results, engine_results = [], []
    ports = (dut.tile_rd.en, dut.tile_rd.pe, dut.tile_rd.index,
             dut.shared_rd.en, dut.shared_rd.sid,
             dut.word_rd.en, dut.word_rd.pe, dut.word_rd.index, dut.word_rd.addr,
             dut.gpr_rd.en, dut.gpr_rd.addr,
             dut.verdict.valid, dut.verdict.payload.as_value(), dut.commit_enable,
             dut.record.ready)
    layout = dut.verdict.payload.shape()

    # Each read port's answer signals, and how to fill them with garbage.
    answers = {
        "tile": ((dut.tile_rd.desc.as_value(), TileDescLayout.size), (dut.tile_rd.defined, 1)),
        "shared": ((dut.shared_rd.desc.as_value(), SharedDescLayout.size),
                   (dut.shared_rd.defined, 1)),
        "word": ((dut.word_rd.data, 64),),
        "gpr": ((dut.gpr_rd.data, 64),),
    }

    def garbage(ctx, port):
        for signal, width in answers[port]:
            ctx.set(signal, rng.getrandbits(width))

    async def testbench(ctx):
        ctx.set(dut.verdict.ready, 1)
        for state, record in cases:
            store = TileStore(state, config)
            allocated, in_use, pe_bytes, capacity = store.alloc()
            ctx.set(dut.alloc.allocated, allocated)
            ctx.set(dut.alloc.capacity_in_use, in_use)
            for pe in range(PE_COUNT):
                ctx.set(dut.alloc.pe_bytes_in_use[pe], pe_bytes[pe])
            ctx.set(dut.alloc.tile_capacity, capacity)
            for port in answers:
                garbage(ctx, port)
            ctx.set(dut.record.payload.as_value(), RECORDS.encode(record))
            ctx.set(dut.record.valid, 1)
            while True:
                *_, ready = await ctx.tick().sample(dut.record.ready)
                if ready:
                    break
            ctx.set(dut.record.valid, 0)
            cycles = reads = commit_cycles = 0
            verdict = plan = engine = None
            answered = set()            # ports whose answer is valid in this cycle
            last_reg = None             # the register the previous cycle's tile/word read named
            word_due = None             # a word read's answer, due a cycle later (latency 2)
            while True:
                (_, _, t_en, t_pe, t_index, s_en, sid, w_en, w_pe, w_index, w_addr, g_en,
                 g_addr, v_valid, v_bits, commit, _) = await ctx.tick().sample(*ports)
                # An answer is valid for one cycle only: scramble it in the next.
                for port in answered - {p for p, en in (("tile", t_en), ("shared", s_en),
                                                        ("gpr", g_en)) if en}:
                    garbage(ctx, port)
                answered = set()
                if word_due is not None:
                    ctx.set(dut.word_rd.data, word_due)
                    answered.add("word")
                    word_due = None
                if t_en:
                    bits, defined = store.tile(t_pe, t_index)
                    ctx.set(dut.tile_rd.desc.as_value(), bits)
                    ctx.set(dut.tile_rd.defined, defined)
                    answered.add("tile")
                if s_en:
                    bits, defined = store.shared(sid)
                    ctx.set(dut.shared_rd.desc.as_value(), bits)
                    ctx.set(dut.shared_rd.defined, defined)
                    answered.add("shared")
                if w_en:
                    # The store takes the word's base from the previous read of the same
                    # register (decision T11 in docs/decisions/hdl-top.md).
                    assert last_reg == (w_pe, w_index), "word read not after its register's read"
                    word_due = store.word(w_pe, w_index, w_addr)
                last_reg = ((t_pe, t_index) if t_en else (w_pe, w_index) if w_en else None)
                if g_en:
                    assert g_addr != 0, "GPR 0 is never read"
                    ctx.set(dut.gpr_rd.data, store.gpr(g_addr))
                    answered.add("gpr")
                reads += t_en + s_en + w_en + g_en
                if verdict is None:
                    assert not commit, "commit_enable before the verdict"
                    cycles += 1
                    if v_valid:
                        verdict = _verdict_fields(layout, v_bits)
                        plan = ctx.get(dut.plan.as_value())
                        if verdict["outcome"] != Outcome.APPROVE.value:
                            break
                        continue
                    assert cycles < 100_000
                    continue
                # Approved: commit_enable holds until exec_done.
                assert commit, "commit_enable must be high after an approval"
                commit_cycles += 1
                if bench.with_engine and record.bundle.op is Operation.TIMG2COL:
                    engine = await _run_engines(ctx, bench, state, record)
                ctx.set(dut.exec_done, 1)
                *_, still = await ctx.tick().sample(dut.commit_enable)
                assert still
                ctx.set(dut.exec_done, 0)
                _, _, ce = await ctx.tick().sample(dut.commit_enable)
                assert not ce, "commit_enable must fall with exec_done"
                break
            engine_results.append(engine)
            results.append(Result(Outcome(verdict["outcome"]), FaultClass(verdict["fault"]),
                                  verdict["fault_index"], Check(verdict["check"]), verdict["pe"],
                                  plan if verdict["outcome"] == Outcome.APPROVE.value else None,
                                  cycles, reads, commit_cycles))

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return results, engine_results


def _verdict_fields(layout, bits):
    out = {}
    for name, field in layout:
        width = field.width
        out[name] = (bits >> field.offset) & ((1 << width) - 1)
    return out


async def _run_engines(ctx, bench, state, record):
    """Run the TIMG2COL engine once per selected PE (PE0 first); returns the first failing
    engine fault class, or NONE when every PE's job committed."""
    engine = bench.engine
    bundle = record.bundle
    source = bundle.local_sources[0]
    for pe in pes_of_mask(bundle.pe_mask):
        src = state.tile(pe, source)
        ctx.set(bench.src_desc.as_value(), encode_tile(src))
        fm = (src.feature_map if src is not None and src.feature_map is not None
              else FeatureMapDescriptor(valid=False))
        await load_feature_map(ctx, engine, fm)
        memory = ([] if src is None else
                  [int(v) | (int(d) << 32) for v, d in zip(src.raw_slots().tolist(),
                                                           src.defined.tolist())])
        ctx.set(engine.job.valid, 1)
        ctx.set(engine.dst.ready, 1)
        *_, accepted = await ctx.tick().sample(engine.job.ready)
        assert accepted
        ctx.set(engine.job.valid, 0)
        pending = None
        for _ in range(100_000):
            # A source that holds one response: it takes a request only when it holds none.
            ready = pending is None
            ctx.set(engine.src_req.ready, ready)
            ctx.set(engine.src_rsp.valid, not ready)
            if not ready:
                ctx.set(engine.src_rsp.payload.as_value(), pending)
            (_, _, req_valid, index, rsp_ready, done, commit,
             fault) = await ctx.tick().sample(engine.src_req.valid, engine.src_req.payload,
                                              engine.src_rsp.ready, engine.done,
                                              engine.commit, engine.fault)
            if pending is not None and rsp_ready:
                pending = None
            if req_valid and ready:
                pending = memory[index]
            if done:
                break
        ctx.set(engine.src_rsp.valid, 0)
        if not commit:
            return FaultClass(fault)
    return FaultClass.NONE


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------

def check(cases, config=CONFIG, seed=0):
    """Run ``cases`` and compare every verdict with the model's; returns the results."""
    results, engine_results = run(cases, config, seed)
    for n, ((state, record), got, engine) in enumerate(zip(cases, results, engine_results)):
        want = expected(record, state)
        where = f"case {n}: {record.reason or ''} want {want} got {got}"
        assert got.outcome is want.outcome, where
        if want.outcome is Outcome.FAULT:
            assert (got.fault, got.index, got.check) == (want.fault, want.index, want.check), \
                where
            if want.pe is not None:
                assert got.pe == want.pe, where
        if want.outcome is not Outcome.APPROVE:
            assert got.plan is None and got.commit_cycles == 0, where
        if want.outcome is not Outcome.APPROVE and want.check in (Check.RECORD, Check.NONE):
            assert got.reads == 0, f"a fault or no-op record must read nothing; {where}"
        if want.outcome is Outcome.APPROVE and want.plan is not None:
            bits = PLANS.encode(want.plan)
            assert got.plan == bits, \
                f"{where}\n got  {PLANS.unpack(got.plan)}\n want {PLANS.unpack(bits)}"
        if want.i2c_engine:
            assert engine is (want.fault if want.plan is None else FaultClass.NONE), where
    return results, engine_results


def records_of(program, state=None):
    """The model decoder's records of ``program`` (GPRs from ``state``)."""
    gprs = None if state is None else state.gprs
    return decode_stream(assemble(program), gprs)


# ---------------------------------------------------------------------------
# The spec's fault vectors and the rulings' checks
# ---------------------------------------------------------------------------

def vector_cases():
    cases = []
    for name in sorted(FAULT_VECTORS):
        state, program, _, _ = FAULT_VECTORS[name]
        records = records_of(program, state)
        assert len(records) == 1, name
        cases.append((state, records[0]))
    return cases


def test_fault_vectors():
    cases = vector_cases()
    assert len(cases) >= 96
    results, engines = check(cases)
    # Every vector faults - in the preflight, or in the TIMG2COL engine after its approval -
    # and together they reach every class and most steps.
    assert all(r.outcome is Outcome.FAULT or e not in (None, FaultClass.NONE)
               for r, e in zip(results, engines))
    classes = {r.fault for r in results} | set(engines)
    assert classes - {None, FaultClass.NONE} == {TL, TA, BC, II}
    reached = {r.check for r in results}
    assert {Check.RECORD, Check.TYPES, Check.BINDINGS, Check.DIMENSIONS, Check.ATTRIBUTES,
            Check.GEMV_M, Check.SHARED, Check.POSTPROCESS, Check.MATH_SOURCES,
            Check.CD_INDEX, Check.ALLOCATION, Check.I2C_ATTRIBUTES,
            Check.I2C_DIMENSIONS} <= reached, reached


# ---------------------------------------------------------------------------
# Random bundles and states
# ---------------------------------------------------------------------------

MASKS = (0b1000, 0b0100, 0b0010, 0b0001, 0b1100, 0b1110, 0b1111)
MATRIX_OPS = [op for op in Operation if op.is_matrix]


@dataclasses.dataclass
class Spec:
    """A tile to build: :func:`model_helpers.tile` arguments, plus an explicit payload."""
    dtype: DataType
    layout: Layout
    rows: int
    cols: int
    tsize: int | None = None
    location: Location | None = None
    phys_cols: int | None = None
    undefined: tuple = ()
    raw: object = None

    def build(self, shared=False):
        raw = (np.zeros((self.rows, self.cols), dtype=np.uint64) if self.raw is None
               else np.asarray(self.raw, dtype=np.uint64).reshape(self.rows, self.cols))
        return tile(self.dtype, self.layout, raw, self.tsize, cols=self.phys_cols,
                    location=self.location, undefined=self.undefined, shared=shared)


def fp19(rng, allow_zero=False):
    """A positive normal FP19 pattern (or +0)."""
    if allow_zero and rng.random() < 0.2:
        return 0
    return rng.randrange(1, 255) << 10 | rng.randrange(1 << 10)


def quant_word(rng, mode):
    """A legal quantization word for ``mode``."""
    row = PREQUANT_MODES[mode]
    if row.shift:
        return rng.randrange(16) << 32
    word = fp19(rng) << 13
    if row.offset_width:
        word |= rng.randrange(1 << row.offset_width) << 37
    return word


def bad_word(rng, word):
    """``word`` with one random bit flipped (legal or not: the model decides)."""
    return word ^ (1 << rng.randrange(64))


def smallest_tsize(spec):
    if spec.layout.is_cube:
        need = cube_geometry(spec.layout, spec.dtype, spec.rows, spec.cols).required_bytes
    else:
        phys = spec.phys_cols or 1 << max(spec.cols - 1, 0).bit_length()
        need = max(spec.rows, 1) * phys * spec.dtype.bits // 8
    size = 128
    while size < need:
        size *= 2
    return size


def size_code(tsize):
    return tsize.bit_length() - 7


@dataclasses.dataclass
class MatrixCase:
    """A random Matrix bundle and the tiles it binds, before building the state."""
    op: Operation
    a_type: DataType
    b_type: DataType
    dims: list                      # LB0..LB2 as written (None: omitted)
    fpatr: Fpatr
    datr: Datr | None
    mask: int
    local: dict                     # role -> [index, Spec]
    shared: dict                    # role -> [sid, Spec]
    dests: list                     # [hand, size_code]
    ior: tuple | None
    gprs: dict
    extra: dict                     # (pe, index) -> Spec: other allocated tiles
    shared_state: dict = dataclasses.field(default_factory=dict)   # sid -> mask overrides
    per_pe: dict = dataclasses.field(default_factory=dict)         # (pe, role) -> Spec|None
    tile_capacity: int | None = None
    terminated: bool = True
    local_order: list | None = None

    def bundle(self):
        order = self.local_order or [r for r in ("c", "a", "a_scale", "b", "b_scale", "bias",
                                                 "rowmax_in", "quant_vector", "alpha_vector")
                                     if r in self.local]
        shared_order = [r for r in ("a", "a_scale", "b", "b_scale") if r in self.shared]
        return Bundle(self.op, int(self.a_type), 3, 17, datr=self.datr, fpatr=self.fpatr,
                      dims=tuple(self.dims),
                      local_sources=tuple(self.local[r][0] for r in order),
                      destinations=tuple(Destination(h, c) for h, c in self.dests),
                      shared_sources=tuple(self.shared[r][0] for r in shared_order),
                      terminated=self.terminated, ior=self.ior, pe_mask=self.mask)

    def state(self):
        state = State()
        for (pe, index), spec in self.extra.items():
            state.set_tile(pe, index, spec.build())
        for role, (index, spec) in self.local.items():
            for pe in range(PE_COUNT):
                if self.mask & (0b1000 >> pe) or (pe, role) in self.per_pe:
                    chosen = self.per_pe.get((pe, role), spec)
                    state.set_tile(pe, index, None if chosen is None else chosen.build())
        for role, (sid, spec) in self.shared.items():
            masks = self.shared_state.get(role, {})
            state.shared[sid] = SharedTile(spec.build(shared=True), **masks)
        for number, value in self.gprs.items():
            state.write_gpr(number, value)
        if self.tile_capacity is not None:
            state.tile_capacity = self.tile_capacity
        return state


def random_matrix_case(rng) -> MatrixCase:
    """A legal Matrix bundle with every operand in place."""
    op = rng.choice(MATRIX_OPS)
    if op.is_mx:
        a_type, b_type = rng.choice(sorted(MX_MATRIX_TYPES)), rng.choice(sorted(MX_MATRIX_TYPES))
        acc = DataType.FP32
    else:
        cls = rng.choice(list(NumClass))
        types = sorted(t for t in ORDINARY_MATRIX_TYPES if t.num_class is cls)
        a_type, b_type = rng.choice(types), rng.choice(types)
        acc = accumulator_type(a_type)
    shared_mode = None if op.is_gemv or rng.random() < 0.75 else rng.choice(["right", "both"])
    if shared_mode:
        m = 1 << rng.randrange(6)
        n, k = 1 << rng.randrange(6), 1 << rng.randrange(7)
    else:
        m = 1 if op.is_gemv else rng.choice([1, 1, 2, 3, 7, 16, rng.randrange(1, 33)])
        n, k = rng.randrange(1, 41), rng.choice([1, 2, rng.randrange(1, 71)])
    dims = [None if v == 1 and rng.random() < 0.5 else v for v in (m, n, k)]
    a_scaled = op.is_mx and a_type in MX_SCALED_TYPES
    b_scaled = op.is_mx and b_type in MX_SCALED_TYPES
    nb = -(-k // 32)

    # B.FPATR: a mode for the accumulator, activation, reductions.
    modes = [c for c, row in PREQUANT_MODES.items() if c and row.source is acc]
    mode = rng.choice(modes) if modes and rng.random() < 0.5 else 0
    relu = rng.choice([0, 0, 1, 2, 3])
    row_max = rng.random() < 0.3
    # GroupMaxOut needs a power-of-two column count ceil(N / GroupN).
    counts = {c: group_count(n, group_n(c)) for c in range(1, 10)}
    gcodes = [c for c, count in counts.items() if count & (count - 1) == 0]
    gcode = rng.choice([0, 0, 0] + gcodes)
    fpatr = Fpatr(mode, relu, gcode, row_max, gcode != 0, row_max and rng.random() < 0.5,
                  (row_max or gcode != 0) and rng.random() < 0.3,
                  shared_mode == "both" and rng.random() < 0.3,
                  bool(shared_mode) and rng.random() < 0.3)
    row = PREQUANT_MODES[mode]
    rmode = rng.randrange(8) if row.rmode_free and rng.random() < 0.5 else 0
    sat = int(row.sat_free and rng.random() < 0.5)
    datr = None
    if b_type != a_type or rmode or sat or rng.random() < 0.2:
        datr = Datr(dtype=b_type, rmode=rmode, sat=sat)

    d_type = acc if mode == 0 else row.d_dtype
    m_layout = rng.choice([Layout.CUBE_M16, Layout.CUBE_M32]) if m <= 16 else Layout.CUBE_M32
    d_spec = Spec(d_type, m_layout, m, n)
    d_tsize = smallest_tsize(d_spec) * rng.choice([1, 1, 2])
    indices = rng.sample(range(64), 12)

    local, shared = {}, {}

    def put(role, spec):
        local[role] = [indices.pop(), spec]

    if op.uses_acc:
        put("c", Spec(acc, m_layout, m, n, d_tsize if mode == 0 else None))
    sids = rng.sample(range(256), 4)
    a_rows, a_cols = (k, m) if fpatr.trans_a else (m, k)
    b_rows, b_cols = (n, k) if fpatr.trans_b else (k, n)
    if shared_mode == "both":
        shared["a"] = [sids[0], Spec(a_type, Layout.ROW_MAJOR, a_rows, a_cols,
                                     phys_cols=a_cols)]
        if a_scaled:
            shared["a_scale"] = [sids[1], Spec(DataType.E8M0, Layout.ROW_MAJOR, m, nb,
                                               phys_cols=nb)]
    else:
        put("a", Spec(a_type, m_layout, m, k))
        if a_scaled:
            put("a_scale", Spec(DataType.E8M0, Layout.ROW_MAJOR, m, nb))
    if shared_mode:
        shared["b"] = [sids[2], Spec(b_type, Layout.ROW_MAJOR, b_rows, b_cols, phys_cols=b_cols)]
        if b_scaled:
            shared["b_scale"] = [sids[3], Spec(DataType.E8M0, Layout.ROW_MAJOR, nb, n,
                                               phys_cols=n)]
    else:
        put("b", Spec(b_type, Layout.CUBE_N8, k, n))
        if b_scaled:
            put("b_scale", Spec(DataType.E8M0, Layout.ROW_MAJOR, nb, n))
    if op.uses_bias:
        put("bias", Spec(acc, Layout.ROW_MAJOR, 1, n))
    if fpatr.row_max_init:
        put("rowmax_in", Spec(acc, Layout.ROW_MAJOR, m, 1))
    if row.param is ParamKind.VECTOR:
        put("quant_vector", Spec(DataType.U64, Layout.ROW_MAJOR, 1, n,
                                 raw=[quant_word(rng, mode) for _ in range(n)]))
    if relu == 3:
        put("alpha_vector", Spec(DataType.U64, Layout.ROW_MAJOR, 1, n,
                                 raw=[fp19(rng, True) for _ in range(n)]))

    # B.IOR: the scalar words in dense slots.
    gprs, regs = {}, []
    words = ([quant_word(rng, mode)] if row.param is ParamKind.SCALAR else []) + \
        ([fp19(rng, True)] if relu == 2 else [])
    for word, reg in zip(words, rng.sample(range(1, 24), 2)):
        gprs[reg] = word if word or rng.random() < 0.5 else 0
        regs.append(0 if word == 0 and rng.random() < 0.5 else reg)
    ior = tuple(regs + [0] * (4 - len(regs))) if words or rng.random() < 0.1 else None

    dests = [[rng.randrange(4), size_code(d_tsize)]]
    if row_max:
        dests.append([rng.randrange(4), size_code(smallest_tsize(Spec(acc, Layout.ROW_MAJOR,
                                                                      m, 1, phys_cols=1)))])
    if gcode:
        cols = group_count(n, group_n(gcode))
        phys = 1 << max(cols - 1, 0).bit_length()
        dests.append([rng.randrange(4), size_code(smallest_tsize(
            Spec(acc, Layout.ROW_MAJOR, m, cols, phys_cols=phys)))])
    mask = rng.choice(MASKS)
    # Other tiles already allocated, so that the allocator has to skip some.
    extra = {}
    free = [i for i in range(64) if i not in {v[0] for v in local.values()}]
    for index in rng.sample(free, rng.randrange(0, 8)):
        extra[(rng.randrange(4), index)] = Spec(DataType.U8, Layout.ROW_MAJOR, 1, 1)
    return MatrixCase(op, a_type, b_type, dims, fpatr, datr, mask, local, shared, dests, ior,
                      gprs, extra)


def _mutate_spec(rng, spec):
    """A variant of one tile: another type, layout, shape, location, capacity or definedness."""
    kind = rng.randrange(7)
    if kind == 0:
        return dataclasses.replace(spec, dtype=rng.choice(list(DataType)))
    if kind == 1:
        return dataclasses.replace(spec, layout=rng.choice(
            [Layout.ROW_MAJOR, Layout.CUBE_M16, Layout.CUBE_M32, Layout.CUBE_N8]),
            phys_cols=None, tsize=None)
    if kind == 2:
        return dataclasses.replace(spec, rows=max(1, spec.rows + rng.choice([-1, 1])),
                                   raw=None, tsize=None)
    if kind == 3:
        return dataclasses.replace(spec, cols=max(1, spec.cols + rng.choice([-1, 1])),
                                   raw=None, tsize=None)
    if kind == 4:
        return dataclasses.replace(spec, location=rng.choice(list(Location)))
    if kind == 5:
        return dataclasses.replace(spec, tsize=rng.choice([128, 256, 512, 1024, 4096]))
    return dataclasses.replace(spec, undefined=((rng.randrange(spec.rows),
                                                 rng.randrange(spec.cols)),))


def inject_fault(rng, case: MatrixCase):
    """Change one thing at random; the model decides whether (and how) it faults."""
    kind = rng.randrange(22)
    b = case
    if kind == 0:
        b.a_type = rng.choice(list(DataType))
    elif kind == 1:
        b.datr = Datr(dtype=rng.choice([int(b.b_type), 31, int(rng.choice(list(DataType)))]),
                      layout=rng.choice([0, 0, 1]), pad=rng.choice([0, 0, 1]),
                      cmode=rng.choice([0, 0, 1]), rmode=rng.randrange(8), sat=rng.randrange(2),
                      canonicalize=rng.choice([0, 0, 1]))
    elif kind == 2:
        i = rng.randrange(3)
        b.dims[i] = rng.choice([0, 1, 2, 3, 17, 33, (b.dims[i] or 1) + 1])
    elif kind == 3:
        b.op = rng.choice(MATRIX_OPS)
    elif kind == 4:
        f = b.fpatr
        mode = rng.choice(list(PREQUANT_MODES))
        b.fpatr = dataclasses.replace(f, pre_quant_mode=mode, relu_mode=rng.randrange(4))
    elif kind == 5:
        b.fpatr = dataclasses.replace(b.fpatr, trans_a=rng.random() < 0.5,
                                      trans_b=rng.random() < 0.5)
    elif kind == 6:
        regs = list(b.ior or (0, 0, 0, 0))
        regs[rng.randrange(4)] = rng.randrange(24)
        b.ior = tuple(regs) if rng.random() < 0.8 else None
    elif kind == 7 and b.gprs:
        reg = rng.choice(list(b.gprs))
        b.gprs[reg] = bad_word(rng, b.gprs[reg])
    elif kind == 8 and b.local:
        role = rng.choice(list(b.local))
        pe = rng.choice(pes_of_mask(b.mask))
        b.per_pe[(pe, role)] = (None if rng.random() < 0.2
                                else _mutate_spec(rng, b.local[role][1]))
    elif kind == 9 and b.shared:
        role = rng.choice(list(b.shared))
        if rng.random() < 0.5:
            b.shared_state[role] = {"allocation_mask": rng.choice([0b1111, 0b0111]),
                                    "initialized_mask": rng.choice([0b1111, 0b0011]),
                                    "published": rng.random() < 0.7}
        else:
            b.shared[role][1] = _mutate_spec(rng, b.shared[role][1])
    elif kind == 10 and "quant_vector" in b.local or kind == 11 and "alpha_vector" in b.local:
        role = "quant_vector" if kind == 10 else "alpha_vector"
        spec = b.local[role][1]
        raw = list(spec.raw)
        j = rng.randrange(len(raw))
        raw[j] = bad_word(rng, raw[j])
        b.per_pe[(rng.choice(pes_of_mask(b.mask)), role)] = dataclasses.replace(spec, raw=raw)
    elif kind == 12 and "c" in b.local:
        b.local["c"][0] = b.dests[0][0]       # C's selector equals D's hand (ruling R6)
    elif kind == 13:
        hand = b.dests[rng.randrange(len(b.dests))][0]
        used = {v[0] for v in b.local.values()}
        for index in range(hand * 16, hand * 16 + 16):
            if index not in used and rng.random() < 0.9:
                b.extra[(rng.randrange(4), index)] = Spec(DataType.U8, Layout.ROW_MAJOR, 1, 1)
    elif kind == 14:
        b.tile_capacity = rng.choice([4096, 8192, 16384, 32768])
    elif kind == 15:
        j = rng.randrange(len(b.dests))
        b.dests[j][1] = max(1, b.dests[j][1] + rng.choice([-2, -1, 1]))
    elif kind == 16:
        b.mask = rng.choice(MASKS)
    elif kind == 17:
        b.terminated = rng.random() < 0.5
        if b.local and rng.random() < 0.5:
            order = [r for r in b.local]
            rng.shuffle(order)
            b.local_order = order[:rng.randrange(len(order) + 1)]
    elif kind == 18:
        b.dests = b.dests[:rng.randrange(1, len(b.dests) + 1)] if rng.random() < 0.5 else \
            b.dests + [[rng.randrange(4), 1]]
        b.dests = b.dests[:3]
    elif kind == 19:
        b.b_type = rng.choice(list(DataType))
        b.datr = Datr(dtype=int(b.b_type))
    elif kind == 20:
        datr = b.datr or Datr(dtype=int(b.b_type))
        b.datr = dataclasses.replace(datr, sat=1 - datr.sat) if rng.random() < 0.5 else \
            dataclasses.replace(datr, rmode=rng.randrange(8))
    elif kind == 21 and b.shared:
        role = rng.choice(list(b.shared))
        spec = b.shared[role][1]
        b.shared[role][1] = dataclasses.replace(spec, phys_cols=spec.phys_cols * 2)


def random_cases(rng, count, fault_probability=0.6):
    """``count`` random Matrix cases, a fault injected into most of them."""
    cases = []
    while len(cases) < count:
        case = random_matrix_case(rng)
        if rng.random() < fault_probability:
            inject_fault(rng, case)
            if rng.random() < 0.2:
                inject_fault(rng, case)
        try:
            state = case.state()
        except (ValueError, PTOFault):
            continue            # a tile no state can hold (refused by the model's Tile)
        bundle = case.bundle()
        if not RECORDS.descriptor.fits(bundle):
            continue
        cases.append((state, BundleRecord(bundle=bundle)))
    return cases


def test_random_matrix_bundles():
    rng = random.Random(2024)
    results, _ = check(random_cases(rng, 250))
    outcomes = {r.outcome for r in results}
    assert outcomes == {Outcome.APPROVE, Outcome.FAULT}


# ---------------------------------------------------------------------------
# Directed cases: approvals, every rule's edge, the example scenarios
# ---------------------------------------------------------------------------

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.json"))


def scenario_cases(path):
    """``(state, record)`` for every bundle of an example scenario, each record paired
    with the state the model's machine holds when that bundle completes."""
    scenario = load_scenario(path)
    machine = Machine(scenario.state.snapshot(), scenario.arithmetic)
    decoder = BundleDecoder(machine.state.gprs)
    cases = []
    words = assemble(scenario.program)
    # As Machine.run: each record completes before the next instruction decodes.
    for index, word in enumerate(words + [None]):
        records = (decoder.step(index, *word_and_length(word)) if word is not None
                   else decoder.finish(len(words)))
        for record in records:
            cases.append((machine.state.snapshot(), record))
            result = machine.step(record, len(cases) - 1)
            if record.ok and not result.ok:
                decoder.squash()
                break
    return cases


def _fp16(extra=None, **kw):
    local = {"M#1": tile("FP16", "CUBE_M16", [[0x4000]]),
             "N#1": tile("FP16", "CUBE_N8", [[0x4200]])}
    local.update(extra or {})
    return make_state(local, **kw)


def _u16_shared(shared=None, local=None, **kw):
    tiles = {50: tile("U16", "ROW_MAJOR", [[3]], shared=True),
             51: tile("U16", "ROW_MAJOR", [[2]], shared=True)}
    tiles.update(shared or {})
    return make_state(local or {"M#1": tile("U16", "CUBE_M16", [[2]])}, shared=tiles, **kw)


def _vector(words, location=None):
    return tile("U64", "ROW_MAJOR", [words], location=location)


def directed_cases():
    """name -> (state, record): each compared with the model by :func:`check`."""
    cases = {}

    def add(name, state, program):
        record, = records_of(program, state)
        cases[name] = (state, record)

    fp16 = dict(sources=["M#1", "N#1"])
    add("approve-fp16", _fp16(), matrix_bundle(Operation.TMATMUL, "FP16", **fp16))
    add("approve-one-pe", _fp16(pes=(2,)),
        matrix_bundle(Operation.TMATMUL, "FP16", mask="0010", **fp16))
    add("approve-three-pes-skipping-taken-registers",
        _fp16({"T#1": tile("U8", "ROW_MAJOR", [[1]]), "T#3": tile("U8", "ROW_MAJOR", [[1]])}),
        matrix_bundle(Operation.TMATMUL, "FP16", mask="1110", destinations=[("T", 2)], **fp16))
    # Sat is a post-processing control: with PreQuantMode 0 it is rejected (ruling R8) ...
    add("sat-with-mode-0", _fp16(), matrix_bundle(Operation.TMATMUL, "FP16", sat=1, **fp16))
    # ... and so it is for a shift mode, which takes neither RMode nor Sat.
    s8 = {"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]])}
    add("sat-with-shift-mode", make_state(s8, gprs={5: 3 << 32}),
        matrix_bundle(Operation.TMATMUL, "S8", fpatr=(13,), sat=1, ior="R5", **fp16))
    add("approve-shift-mode", make_state(s8, gprs={5: 3 << 32}),
        matrix_bundle(Operation.TMATMUL, "S8", fpatr=(13,), ior="R5", **fp16))
    add("approve-req8-sat-rmode", make_state(s8, gprs={5: 0x603E800000}),
        matrix_bundle(Operation.TMATMUL, "S8", fpatr=(3,), rmode="RTZ", sat=1, ior="R5",
                      **fp16))
    add("rmode-with-fixed-rounding", _fp16(),
        matrix_bundle(Operation.TMATMUL, "FP16", fpatr=(16,), rmode="RTZ", **fp16))
    add("approve-sat-with-fixed-rounding", _fp16(),
        matrix_bundle(Operation.TMATMUL, "FP16", fpatr=(16,), sat=1, **fp16))
    # B.IOR: GPR 0 supplies a +0 LReLU alpha without a read; both slots in use.
    add("approve-lrelu-alpha-from-zero", _fp16(),
        matrix_bundle(Operation.TMATMUL, "FP16", fpatr=(0, 2), ior="zero", **fp16))
    add("approve-two-scalar-slots", make_state(s8, gprs={5: 0x603E800000, 6: 0x1FC00}),
        matrix_bundle(Operation.TMATMUL, "S8", fpatr=(3, 2), ior="R5, R6", **fp16))
    add("bad-second-scalar-slot", make_state(s8, gprs={5: 0x603E800000, 6: 1 << 19}),
        matrix_bundle(Operation.TMATMUL, "S8", fpatr=(3, 2), ior="R5, R6", **fp16))
    add("ior-regdst-set", _fp16(),
        matrix_bundle(Operation.TMATMUL, "FP16", fpatr=(0, 2), ior="zero, ->R5", **fp16))
    # Shared operands: right group, both groups, transposed, columns, readiness.
    add("approve-shared-right", _u16_shared(),
        matrix_bundle(Operation.TMATMUL, "U16", shared=[50], sources=["M#1"]))
    add("approve-shared-both-transposed",
        _u16_shared({60: tile("U16", "ROW_MAJOR", np.ones((2, 4)), shared=True),
                     61: tile("U16", "ROW_MAJOR", np.ones((8, 2)), shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", dims=(4, 8, 2), fpatr=(0,) * 7 + (1, 1),
                      shared=[60, 61], destinations=[("T", 3)]))
    add("shared-physical-columns-wider",
        _u16_shared({52: tile("U16", "ROW_MAJOR", [[2]], cols=2, shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", shared=[52], sources=["M#1"]))
    add("approve-shared-larger-than-needed",
        _u16_shared({53: tile("U16", "ROW_MAJOR", np.ones((4, 2)), cols=2, shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", dims=(1, 2, 1), shared=[53], sources=["M#1"]))
    state = _u16_shared({53: tile("U16", "ROW_MAJOR", np.ones((4, 2)), cols=2, shared=True)})
    state.set_tile(2, 32, None)             # M#1 missing on PE2 only
    add("a-missing-on-pe2", state,
        matrix_bundle(Operation.TMATMUL, "U16", dims=(1, 2, 1), shared=[53], sources=["M#1"]))
    add("shared-undefined",
        _u16_shared({54: tile("U16", "ROW_MAJOR", [[2, 3]], undefined=[(0, 1)],
                              shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", dims=(1, 2, 1), shared=[54], sources=["M#1"]))
    add("shared-wrong-type", _u16_shared({56: tile("S16", "ROW_MAJOR", [[2]], shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", shared=[56], sources=["M#1"]))
    add("shared-not-published",
        _u16_shared({55: SharedTile(tile("U16", "ROW_MAJOR", [[2]], shared=True),
                                    published=False)}),
        matrix_bundle(Operation.TMATMUL, "U16", shared=[55], sources=["M#1"]))
    # MX with scales on both sides, K across two scale blocks.
    mx = {"M#1": tile("E4M3", "CUBE_M16", np.full((2, 33), 0x38)),
          "T#1": tile("E8M0", "ROW_MAJOR", [[0x7F, 0x80]] * 2),
          "N#1": tile("E5M2", "CUBE_N8", np.full((33, 3), 0x3C)),
          "T#2": tile("E8M0", "ROW_MAJOR", [[0x7F] * 3, [0x81] * 3]),
          "T#3": tile("FP32", "ROW_MAJOR", [[0, 0, 0]])}
    add("approve-mx-bias-two-blocks", make_state(mx),
        matrix_bundle(Operation.TMATMUL_MX_BIAS, "E4M3", b_type="E5M2", dims=(2, 3, 33),
                      sources=["M#1", "T#1", "N#1", "T#2", "T#3"], destinations=[("U", 2)]))
    # Vector parameters: a long scan, and a bad word at its very end.
    n = 40
    words = [0x3F800 << 13] * n
    vq = {"M#1": tile("S8", "CUBE_M16", np.ones((1, 1))),
          "N#1": tile("S8", "CUBE_N8", np.ones((1, n))),
          "T#3": _vector(words), "T#4": _vector([0x1FC00] * n)}
    add("approve-vector-quant-and-prelu", make_state(vq),
        matrix_bundle(Operation.TMATMUL, "S8", dims=(1, n, 1), fpatr=(2, 3),
                      sources=["M#1", "N#1", "T#3", "T#4"], destinations=[("T", 4)]))
    bad = dict(vq)
    bad["T#4"] = _vector([0x1FC00] * (n - 1) + [0x80000])
    state = make_state(vq)
    state.set_tile(3, 16 * 0 + 3, bad["T#4"])       # PE3's alpha tile ends with -0.0... bits
    add("prelu-word-bad-on-pe3", state,
        matrix_bundle(Operation.TMATMUL, "S8", dims=(1, n, 1), fpatr=(2, 3),
                      sources=["M#1", "N#1", "T#3", "T#4"], destinations=[("T", 1)]))
    add("vector-in-location-matrix",
        make_state({**vq, "T#3": _vector(words, Location.MATRIX)}),
        matrix_bundle(Operation.TMATMUL, "S8", dims=(1, n, 1), fpatr=(2,),
                      sources=["M#1", "N#1", "T#3"], destinations=[("T", 1)]))
    # ACC: C in A's layout, an all-Shared ACC taking C's layout, C's capacity with a
    # converting mode.
    acc = {"U#1": tile("FP32", "CUBE_M32", [[0]]), "M#1": tile("FP16", "CUBE_M32", [[1]]),
           "N#1": tile("FP16", "CUBE_N8", [[1]])}
    add("approve-acc-m32", make_state(acc),
        matrix_bundle(Operation.TMATMUL_ACC, "FP16", sources=["U#1", "M#1", "N#1"],
                      destinations=[("U", 1)]))
    add("approve-acc-converted-c-larger", make_state({**acc, "U#1": tile(
        "FP32", "CUBE_M32", [[0]], 1024)}),
        matrix_bundle(Operation.TMATMUL_ACC, "FP16", fpatr=(1,), sources=["U#1", "M#1", "N#1"],
                      destinations=[("U", 1)]))
    shared_acc = _u16_shared(local={"T#5": tile("U32", "CUBE_N8", [[0]])})
    shared_acc.shared[60] = SharedTile(tile("U16", "ROW_MAJOR", [[1]], shared=True))
    add("all-shared-acc-c-in-n8", shared_acc,
        matrix_bundle(Operation.TMATMUL_ACC, "U16", shared=[60, 50], sources=["T#5"],
                      destinations=[("U", 1)]))
    add("approve-all-shared-acc", _u16_shared(local={"T#5": tile("U32", "CUBE_M32", [[0]])},
                                              shared={60: tile("U16", "ROW_MAJOR", [[1]],
                                                               shared=True)}),
        matrix_bundle(Operation.TMATMUL_ACC, "U16", shared=[60, 50], sources=["T#5"],
                      destinations=[("U", 1)]))
    add("approve-all-shared-m-32", _u16_shared(shared={
        62: tile("U16", "ROW_MAJOR", np.ones((32, 1)), shared=True)}),
        matrix_bundle(Operation.TMATMUL, "U16", dims=(32, 1, 1), shared=[62, 50],
                      destinations=[("T", 1)]))
    # RowMax and GroupMax outputs in the hands D uses too.
    rg = {"M#1": tile("U8", "CUBE_M16", np.ones((3, 2))),
          "N#1": tile("U8", "CUBE_N8", np.ones((2, 32))),
          "T#9": tile("U32", "ROW_MAJOR", np.ones((3, 1)))}
    add("approve-rowmax-groupmax-same-hand", make_state(rg),
        matrix_bundle(Operation.TMATMUL, "U8", dims=(3, 32, 2), fpatr=(0, 0, 4, 1, 1, 1, 1),
                      sources=["M#1", "N#1", "T#9"],
                      destinations=[("T", 5), ("T", 1), ("T", 1)]))
    add("groupmax-columns-not-power-of-two",
        make_state({**rg, "N#1": tile("U8", "CUBE_N8", np.ones((2, 24)))}),
        matrix_bundle(Operation.TMATMUL, "U8", dims=(3, 24, 2), fpatr=(0, 0, 1, 0, 1),
                      sources=["M#1", "N#1"], destinations=[("T", 5), ("T", 1)]))
    add("rowmax-too-small", make_state({**rg, "M#1": tile("U8", "CUBE_M32", np.ones((32, 2)))}),
        matrix_bundle(Operation.TMATMUL, "U8", dims=(32, 32, 2), fpatr=(0, 0, 0, 1),
                      sources=["M#1", "N#1"], destinations=[("T", 5), ("T", 1)]))
    add("d-tsize-too-small", make_state(rg),
        matrix_bundle(Operation.TMATMUL, "U8", dims=(3, 32, 2), sources=["M#1", "N#1"],
                      destinations=[("T", 4)]))
    # TIMG2COL through the engine: success on several PEs, posM/posK from GPRs, and each
    # pre-engine rule.
    fm = FeatureMapDescriptor(height=2, width=3, channels_per_group=2, logical_channels=2,
                              filter_width=2)
    src = tile("U16", "ROW_MAJOR", [list(range(12))], location=Location.MATRIX,
               feature_map=fm)
    img = make_state({"M#1": src}, gprs={7: 0xFFFF0001, 8: 1})
    add("approve-img2col-window", img,
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 3, ->LB0\nB.DIM zero, 2, ->LB1\n"
        "B.DIM zero, 4, ->LB2\nB.IOT M#1, mask=1110, last, ->N<1>\nB.IOR R7, R8\nBSTOP\n")
    add("img2col-window-out-of-range", img,
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 4, ->LB0\nB.DIM zero, 2, ->LB1\n"
        "B.IOT M#1, mask=1111, last, ->N<1>\nB.IOR R7, R8\nBSTOP\n")
    add("img2col-zero-valid-row", img,
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 4, ->LB0\nB.DIM zero, 0, ->LB1\n"
        "B.IOT M#1, mask=1111, last, ->N<1>\nBSTOP\n")
    full = make_state({"M#1": src, **{f"N#{i}": tile("U8", "ROW_MAJOR", [[1]])
                                      for i in range(1, 17)}})
    add("img2col-hand-full", full,
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 2, ->LB0\nB.IOT M#1, mask=1111, last, ->N<1>\n"
        "BSTOP\n")
    add("img2col-capacity", make_state({"M#1": src}, tile_capacity=640),
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 2, ->LB0\nB.IOT M#1, mask=1100, last, ->N<1>\n"
        "BSTOP\n")
    undefined_src = tile("U16", "ROW_MAJOR", [list(range(12))], location=Location.MATRIX,
                         feature_map=fm, undefined=[(0, 5)])
    state = make_state({"M#1": src})
    state.set_tile(1, 32, undefined_src)
    add("img2col-undefined-on-pe1", state,
        "BSTART.SFU TIMG2COL, U16\nB.DIM zero, 4, ->LB0\nB.DIM zero, 2, ->LB1\n"
        "B.IOT M#1, mask=1111, last, ->N<1>\nBSTOP\n")
    # A no-op record.
    add("zero-mask-noop", _fp16(), "BSTART.TMATMUL FP16\nB.FPATR None, None, 0, 0, 0, 0, 0, "
        "0, 0\nB.IOT M#1, N#1, mask=0000, last, ->T<1>\nBSTOP\n")
    for path in EXAMPLES:
        for number, case in enumerate(scenario_cases(path)):
            cases[f"example-{path.stem}-{number}"] = case
    return cases


DIRECTED = directed_cases()


@pytest.fixture(scope="module")
def directed_results():
    names = sorted(DIRECTED)
    results, engines = check([DIRECTED[name] for name in names])
    return dict(zip(names, zip(results, engines)))


@pytest.mark.parametrize("name", sorted(DIRECTED))
def test_directed(name, directed_results):
    # check() already compared the verdict with the model; make sure each case tests what
    # its name says.
    result, engine = directed_results[name]
    approved = result.outcome is Outcome.APPROVE and engine in (None, FaultClass.NONE)
    if not name.startswith("example"):
        assert approved == name.startswith("approve"), (result, engine)


# ---------------------------------------------------------------------------
# What only the hardware checks: build profile, memory per PE, record sanity
# ---------------------------------------------------------------------------

def _bundle(op=Operation.TMATMUL, a_type=DataType.FP16, **fields):
    """A FP16 1x1 Matrix bundle on M#1 x N#1 (or TIMG2COL on M#1) with ``fields`` changed."""
    if op is Operation.TIMG2COL:
        base = dict(dims=(1, None, None), local_sources=(32,),
                    destinations=(Destination(2, 1),), terminated=True, pe_mask=0b1111)
    else:
        base = dict(fpatr=Fpatr(), local_sources=(32, 48), destinations=(Destination(0, 1),),
                    terminated=True, pe_mask=0b1111)
    base.update(fields)
    return BundleRecord(bundle=Bundle(op, int(a_type), 0, 9, **base))


def _hardware_only_cases():
    """(config, state, record, (outcome, fault, check)) the model does not decide."""
    fp16 = _fp16()
    s8 = make_state({"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]])},
                    gprs={5: 0x3F800 << 13})
    mx = make_state({"M#1": tile("FP16", "CUBE_M16", [[1]]),
                     "N#1": tile("BF16", "CUBE_N8", [[1]])})
    # Three builds: integer-only with 16 KiB per PE, floating-point without MX, and full.
    int_only = small = CubeConfig(float_types=False, mx_types=False,
                                  tile_bytes_per_pe=16 * 1024)
    float_only = CubeConfig(int_types=False, mx_types=False)
    # PE1 already holds 12.25 KiB: a 2 KiB D still fits its 16 KiB, a 4 KiB one does not.
    crowded = make_state({"M#1": tile("S8", "CUBE_M16", [[1]]), "N#1": tile("S8", "CUBE_N8", [[1]]),
                          **{(1, f"T#{n}"): tile("U8", "ROW_MAJOR", np.ones((1, 1)), 2048)
                             for n in range(1, 7)}})
    approve, fault = Outcome.APPROVE, Outcome.FAULT
    s8_plain = _bundle(a_type=DataType.S8)
    return [
        (int_only, fp16, _bundle(), (fault, TL, Check.TYPES)),
        (int_only, s8, s8_plain, (approve, FaultClass.NONE, Check.NONE)),
        (int_only, s8, _bundle(a_type=DataType.S8, fpatr=Fpatr(pre_quant_mode=5),
                               ior=(5, 0, 0, 0)), (fault, TL, Check.POSTPROCESS)),
        (int_only, s8, _bundle(a_type=DataType.S8, fpatr=Fpatr(pre_quant_mode=3),
                               ior=(5, 0, 0, 0)), (approve, FaultClass.NONE, Check.NONE)),
        (float_only, s8, s8_plain, (fault, TL, Check.TYPES)),
        (float_only, fp16, _bundle(), (approve, FaultClass.NONE, Check.NONE)),
        (float_only, mx,
         _bundle(Operation.TMATMUL_MX, datr=Datr(dtype=DataType.BF16)), (fault, TL, Check.TYPES)),
        (CONFIG, mx, _bundle(Operation.TMATMUL_MX, datr=Datr(dtype=DataType.BF16)),
         (approve, FaultClass.NONE, Check.NONE)),
        (small, crowded, _bundle(a_type=DataType.S8, destinations=(Destination(2, 5),)),
         (approve, FaultClass.NONE, Check.NONE)),
        (small, crowded, _bundle(a_type=DataType.S8, destinations=(Destination(2, 6),)),
         (fault, TA, Check.ALLOCATION)),
        # Records the decoder never emits get the decoder's class.
        (CONFIG, fp16, _bundle(Operation.TIMG2COL, a_type=DataType.U8, fpatr=Fpatr()),
         (fault, BC, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(fpatr=None), (fault, BC, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(fpatr=Fpatr(pre_quant_mode=6)), (fault, II, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(fpatr=Fpatr(relu_mode=5)), (fault, II, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(fpatr=Fpatr(group_n_code=12, group_max_en=True)),
         (fault, II, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(fpatr=Fpatr(row_max_init=True)), (fault, TL, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(destinations=(Destination(0, 0),)),
         (fault, II, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(Operation.TIMG2COL, a_type=DataType.U8, shared_sources=(1,)),
         (fault, TL, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(Operation.TIMG2COL, a_type=DataType.U8,
                               local_sources=(32, 33)), (fault, BC, Check.WELL_FORMED)),
        (CONFIG, fp16, _bundle(Operation.TIMG2COL, a_type=DataType.U8, ior=(0, 0, 4, 0)),
         (fault, BC, Check.WELL_FORMED)),
    ]


def test_what_only_the_hardware_checks():
    cases = _hardware_only_cases()
    for config in {c for c, *_ in cases}:
        mine = [(state, record, want) for c, state, record, want in cases if c == config]
        results, _ = run([(state, record) for state, record, _ in mine], config)
        for (state, record, want), got in zip(mine, results):
            assert (got.outcome, got.fault, got.check) == want, (config, record.bundle, got)
            if want[0] is Outcome.FAULT:
                assert got.index == record.bundle.boundary_index


# ---------------------------------------------------------------------------
# Random TIMG2COL bundles, through the engine
# ---------------------------------------------------------------------------

def random_img2col_case(rng):
    """A TIMG2COL bundle and its source tile on every selected PE, maybe with one fault."""
    fm, shape = random_descriptor(np.random.default_rng(rng.randrange(1 << 32)))
    dtype = rng.choice(sorted(TIMG2COL_TYPES))
    cols = 1 << rng.randrange(5)
    rows = -(-fm.physical_elements // cols)
    raw = np.array([rng.randrange(1 << dtype.bits) for _ in range(rows * cols)],
                   dtype=np.uint64).reshape(rows, cols)
    valid_row = rng.randrange(1, min(shape.rows, 3) + 1)
    valid_col = rng.randrange(1, min(shape.cols, 6) + 1)
    pos_m = rng.randrange(shape.rows - valid_row + 1)
    pos_k = rng.randrange(shape.cols - valid_col + 1)
    col = None if rng.random() < 0.5 else 1 << (valid_col - 1).bit_length() + rng.randrange(2)
    phys = col or 1 << (valid_col - 1).bit_length()
    code = size_code(smallest_tsize(Spec(dtype, Layout.ROW_MAJOR, valid_row, phys,
                                         phys_cols=phys)))
    mask, hand = rng.choice(MASKS), rng.randrange(4)
    gprs = {9: pos_m | rng.randrange(1 << 16) << 16, 10: pos_k}
    ior = (9, 10, 0, 0) if pos_m or pos_k or rng.random() < 0.5 else None
    dims = [valid_col, valid_row, col]
    datr, tile_capacity, undefined, location = None, None, (), Location.MATRIX
    local = {}
    fault = rng.randrange(12) if rng.random() < 0.6 else None
    if fault == 0:
        datr = Datr() if rng.random() < 0.7 else Datr(sat=1)
    elif fault == 1:
        dims[rng.randrange(3)] = 0 if rng.random() < 0.7 else None
    elif fault == 2:
        local.update({(pe, 16 * hand + n): Spec(DataType.U8, Layout.ROW_MAJOR, 1, 1)
                      for n in range(16) for pe in (rng.randrange(4),)})
    elif fault == 3:
        tile_capacity = rng.choice([128, 512, 1024])
    elif fault == 4:
        gprs[9] += rng.randrange(1, 4)                   # window below the matrix
    elif fault == 5:
        code = max(1, code - 1)
    elif fault == 6:
        undefined = ((rng.randrange(rows), rng.randrange(cols)),)
    elif fault == 7:
        location = Location.ANY
    pes = pes_of_mask(mask)
    odd_pe = rng.choice(pes)
    state = State()
    for pe in range(PE_COUNT):
        this_fm, this_dtype = fm, dtype
        if pe == odd_pe and fault == 8:
            this_fm = dataclasses.replace(fm, transposed=True)
        if pe == odd_pe and fault == 9:
            this_dtype = rng.choice([t for t in TIMG2COL_TYPES if t.bits == dtype.bits] +
                                    [DataType.FP64])
        if pe == odd_pe and fault == 10:
            continue                                      # no source on this PE
        state.set_tile(pe, 32, tile(this_dtype, "ROW_MAJOR", raw,
                                    location=location if pe == odd_pe else Location.MATRIX,
                                    undefined=undefined if pe == odd_pe else (),
                                    feature_map=this_fm, cols=cols))
    for (pe, index), spec in local.items():
        state.set_tile(pe, index, spec.build())
    for number, value in gprs.items():
        state.write_gpr(number, value)
    if tile_capacity is not None:
        state.tile_capacity = tile_capacity
    bundle = Bundle(Operation.TIMG2COL, int(dtype), 0, 6, datr=datr, dims=tuple(dims),
                    local_sources=(32,), destinations=(Destination(hand, code),),
                    terminated=True, ior=ior, pe_mask=mask)
    if fault == 11:
        bundle = dataclasses.replace(bundle, a_type=int(rng.choice(list(DataType))))
    return state, BundleRecord(bundle=bundle)


def test_random_img2col_bundles_through_the_engine():
    rng = random.Random(77)
    cases = [random_img2col_case(rng) for _ in range(40)]
    results, engines = check(cases)
    finals = [e if r.outcome is Outcome.APPROVE else r.fault for r, e in zip(results, engines)]
    assert FaultClass.NONE in finals and TL in finals and TA in finals


# ---------------------------------------------------------------------------
# The shape rules on their own, on descriptors no model state can hold
# ---------------------------------------------------------------------------

class ShapeBench(Elaboratable):
    """:func:`ordinary_shape`, :func:`cube_shape` and the GroupMax column count, alone."""

    def __init__(self):
        self.o = {k: Signal(w, name=f"o_{k}") for k, w in (
            ("dtype", 5), ("cells", 12), ("phys_cols", 16), ("valid_rows", 16),
            ("valid_cols", 16), ("shared", 1))}
        self.c = {k: Signal(w, name=f"c_{k}") for k, w in (
            ("layout", 3), ("dtype", 5), ("rows", 16), ("cols", 16), ("cells", 10))}
        self.code, self.n = Signal(4), Signal(16)

    def elaborate(self, platform):
        m = Module()
        self.ord_legal, self.elements = ordinary_shape(m, name="o", **self.o)
        self.cube_legal, self.need, self.cell_cols = cube_shape(m, name="c", **self.c)
        self.groups = _group_count(m, self.code, self.n)
        return m


def _ordinary_vectors(rng, count):
    for _ in range(count):
        dtype = rng.choice(list(DataType))
        shared = rng.random() < 0.3
        cells = rng.choice([0, 1, 2, 3, 5, 512, 513, 2048, 2049, rng.randrange(4096)])
        phys = rng.choice([0, 1, 2, 3, 6, 16, 64, 1 << rng.randrange(16), rng.randrange(65536)])
        rows = rng.choice([0, 1, rng.randrange(65536), rng.randrange(300)])
        cols = rng.choice([0, 1, phys, phys + 1, rng.randrange(65536)]) & 0xFFFF
        yield dtype, cells, phys, rows, cols, shared


def _cube_vectors(rng, count):
    layouts = [Layout.ROW_MAJOR, Layout.CUBE_M16, Layout.CUBE_M32, Layout.CUBE_N8]
    for _ in range(count):
        yield (rng.choice(layouts), rng.choice(list(DataType)),
               rng.choice([0, 1, 15, 16, 17, 32, 33, rng.randrange(65536), rng.randrange(100)]),
               rng.choice([0, 1, 8, 9, rng.randrange(65536), rng.randrange(3000)]),
               rng.choice([0, 1, 4, 512, 513, rng.randrange(1024)]))


def test_shape_rules_against_the_model():
    rng = random.Random(5)
    ordinary = list(_ordinary_vectors(rng, 300))
    cube = list(_cube_vectors(rng, 300))
    groups = [(c, rng.choice([1, 2, 47, 48, 49, 95, 96, 97, 65535, rng.randrange(1, 65536)]))
              for c in range(1, 10) for _ in range(8)]
    bench = ShapeBench()
    got = {"ordinary": [], "cube": [], "groups": []}

    async def testbench(ctx):
        for dtype, cells, phys, rows, cols, shared in ordinary:
            for k, v in zip(("dtype", "cells", "phys_cols", "valid_rows", "valid_cols",
                             "shared"), (dtype, cells, phys, rows, cols, shared)):
                ctx.set(bench.o[k], int(v))
            got["ordinary"].append((ctx.get(bench.ord_legal), ctx.get(bench.elements)))
        for layout, dtype, rows, cols, cells in cube:
            for k, v in zip(("layout", "dtype", "rows", "cols", "cells"),
                            (layout, dtype, rows, cols, cells)):
                ctx.set(bench.c[k], int(v))
            got["cube"].append((ctx.get(bench.cube_legal), ctx.get(bench.need),
                                ctx.get(bench.cell_cols)))
        for code, n in groups:
            ctx.set(bench.code, code)
            ctx.set(bench.n, n)
            await ctx.tick().repeat(3)            # the group count is three registers deep
            got["groups"].append(ctx.get(bench.groups))

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    legal_seen = {True: 0, False: 0}
    for (dtype, cells, phys, rows, cols, shared), (legal, elements) in zip(ordinary,
                                                                          got["ordinary"]):
        want = ordinary_shape_legal(cells * 128, phys, rows, cols, dtype,
                                    SHARED_MAX_CAPACITY_BYTES if shared
                                    else LOCAL_MAX_CAPACITY_BYTES)
        assert bool(legal) == want, (dtype, cells, phys, rows, cols, shared)
        if want:
            assert elements == cells * 1024 // dtype.bits
        legal_seen[want] += 1
    for (layout, dtype, rows, cols, cells), (legal, need, cell_cols) in zip(cube, got["cube"]):
        want = cube_shape_legal(cells * 128, rows, cols, dtype, layout)
        assert bool(legal) == want, (layout, dtype, rows, cols, cells)
        if want:
            g = cube_geometry(layout, dtype, rows, cols)
            assert (need, cell_cols) == (g.cells, g.cell_cols)
        legal_seen[want] += 1
    assert min(legal_seen.values()) > 50
    for (code, n), count in zip(groups, got["groups"]):
        assert count == group_count(n, group_n(code)), (code, n)


# ---------------------------------------------------------------------------
# Verdict latency
# ---------------------------------------------------------------------------

def approval_cycles(bundle: Bundle, state: State) -> int:
    """Cycles from the accepted record to the valid verdict of an approved Matrix bundle
    (``docs/hdl-preflight.md``): 13 fixed, the B.IOR phase (one cycle, or its reads and
    six), the Shared reads and six, per selected PE one per post-process descriptor and
    N per vector tile and one per Local mathematical source, six after the last of those
    (five when only post-process reads were made), and one per PE for D's shape.  Each
    wait after reads grew by one with the registered read requests (decision P18) and
    again with the registered shape comparisons (P19)."""
    f = bundle.fpatr
    mode = PREQUANT_MODES[f.pre_quant_mode]
    gpr_reads = len([s for s in P.scalar_param_slots(f)]) if bundle.ior else 0
    vectors = (mode.param is ParamKind.VECTOR) + (f.relu_mode == 3)
    post = (f.row_max_en and f.row_max_init) + vectors * (1 + bundle.dim(1))
    math = len(bundle.local_sources) - (f.row_max_en and f.row_max_init) - vectors
    pes = popcount(bundle.pe_mask)
    shared = len(bundle.shared_sources)
    drain = 6 if math else 5 if post else 0
    return (13 + (gpr_reads + 6 if gpr_reads else 1) + (shared + 6 if shared else 0)
            + pes * (post + math) + drain + pes)


def test_verdict_latency(directed_results):
    timed = 0
    for name, (state, record) in DIRECTED.items():
        result, _ = directed_results[name]
        if record.ok and not record.noop and record.bundle.op.is_matrix \
                and result.outcome is Outcome.APPROVE:
            assert result.cycles == approval_cycles(record.bundle, state), name
            timed += 1
        elif not record.ok or record.noop:
            assert result.cycles == 2, name           # START, then the verdict
    assert timed >= 15
    assert directed_results["approve-fp16"][0].cycles == 32
    assert directed_results["approve-one-pe"][0].cycles == 23
    # posM/posK: one cycle more for posK to reach the plan (the registered GPR read).
    assert directed_results["approve-img2col-window"][0].cycles == 9


@pytest.mark.slow
def test_worst_case_latency():
    # The longest check a 64 KiB-per-PE tile store can ask for: on four PEs, RowMaxIn and
    # two 1 x 2048 U64 parameter tiles (16 KiB each), then A, sA, B, sB and Bias.
    n = 2048
    local = {"M#1": tile("E4M3", "CUBE_M16", [[0x38]]), "T#1": tile("E8M0", "ROW_MAJOR",
                                                                   [[0x7F]]),
             "N#1": tile("E4M3", "CUBE_N8", np.full((1, n), 0x38)),
             "T#2": tile("E8M0", "ROW_MAJOR", np.full((1, n), 0x7F)),
             "T#3": tile("FP32", "ROW_MAJOR", np.zeros((1, n))),
             "T#4": tile("FP32", "ROW_MAJOR", [[0]]),
             "U#1": _vector([0x3F800 << 13] * n), "U#2": _vector([0x1FC00] * n)}
    state = make_state(local)
    program = matrix_bundle(Operation.TMATMUL_MX_BIAS, "E4M3", dims=(1, n, 1),
                            fpatr=(33, 3, 0, 1, 0, 1),
                            sources=["M#1", "T#1", "N#1", "T#2", "T#3", "T#4", "U#1", "U#2"],
                            destinations=[("M", 10), ("N", 1)])
    record, = records_of(program, state)
    (result,), _ = check([(state, record)])
    # Every check passes but allocation: D (64 KiB per PE) cannot be had, so the verdict
    # comes six cycles before an approval would (no D_SHAPE, AUX_SHAPE phases).
    assert result.check is Check.ALLOCATION
    assert result.cycles == approval_cycles(record.bundle, state) - 6 == 56 + 8 * n - 6


# ---------------------------------------------------------------------------
# Regression sweeps (make regress)
# ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_random_matrix_sweep(seed):
    check(random_cases(random.Random(1000 + seed), 500))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_random_img2col_sweep(seed):
    rng = random.Random(2000 + seed)
    check([random_img2col_case(rng) for _ in range(120)])
