"""The img2col address generator and the TIMG2COL engine (hdl/img2col*.py) against the model.

* :class:`Img2ColAddressGenerator` is compared element by element with
  :func:`ptocube.model.img2col.gather_indices` (index, padding, row and window ends), with a
  consumer that stalls at random.
* :class:`Img2ColEngine` runs jobs against a simulated tile store (source memory with random
  latency and stalls, a staging area that is published only on ``commit``) and is compared
  with the golden model: the model's checks in the model's order give the expected fault
  class (and which check), :func:`ptocube.model.img2col.img2col` the published window.

Vectors: the spec's TIMG2COL tests and the digest's worked examples (imported from
``test_img2col.py``), one job per fault check, and seeded random descriptors of every
TIMG2COL data type (strides, dilations, asymmetric padding, logical channels not a multiple
of C0, NDC1HWC0, window offsets).  Bigger random sweeps are marked ``slow``.
"""

import dataclasses
import functools
import random
from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Cat, Const, Module, Signal, Value
from amaranth.lib import data
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.img2col import (FEATURE_MAP_DESCRIPTOR, FM_PARTS, AddressJobLayout,
                                 AddressLayout, DivMod, Img2ColAddressGenerator, MulAdd,
                                 SerialProgram, feature_map_parts)
from ptocube.hdl.img2col_engine import (CHECK_FAULT, Img2ColCheck, Img2ColEngine,
                                        Img2ColJobLayout)
from ptocube.model.bundle import Bundle, Destination, Operation
from ptocube.model.datatype import DataType, TIMG2COL_TYPES
from ptocube.model.faults import FaultClass, PTOFault
from ptocube.model.img2col import (FeatureMapDescriptor, FeatureMapLayout, check_descriptor,
                                   check_operand_types, check_window, gather_indices, img2col,
                                   output_shape)
from ptocube.model.layout import Layout, ordinary_shape_legal
from ptocube.model.execute import execute
from ptocube.model.preflight import preflight
from ptocube.model.state import Location, State, Tile
from ptocube.sim.bench_img2col import bench_img2col, load_feature_map

from img2col_cases import (EXAMPLE1, EXAMPLE1_RESULT, EXAMPLE1_SOURCE, EXAMPLE2, EXAMPLE2_RESULT,
                          EXAMPLE2_SOURCE, EXAMPLE3, EXAMPLE3_RESULT, EXAMPLE3_SOURCE,
                          EXAMPLE3_WINDOW, random_descriptor, random_source, random_window,
                          source)

NC1HWC0, NDC1HWC0 = FeatureMapLayout.NC1HWC0, FeatureMapLayout.NDC1HWC0
IMG2COL_TYPES = sorted(TIMG2COL_TYPES)
CONFIG = CubeConfig()


# ---------------------------------------------------------------------------
# Address generator
# ---------------------------------------------------------------------------

def generator_cmd(fm, window):
    """The generator's command bits for a checked descriptor and window (the descriptor
    itself goes to the generator's ``fm`` input)."""
    shape = output_shape(fm)
    valid_row, valid_col, pos_m, pos_k = window
    return AddressJobLayout.const({
        "out_height": shape.out_height, "out_width": shape.out_width,
        "valid_row": valid_row, "valid_col": valid_col, "pos_m": pos_m, "pos_k": pos_k,
    }).as_bits()


@dataclasses.dataclass
class Walk:
    """One generator case: a checked descriptor and window, the consumer's probability of
    being ready each cycle, and optionally ``abort`` after that many elements."""

    fm: FeatureMapDescriptor
    window: tuple
    ready: float = 0.7
    abort_after: int | None = None


def run_generator(walks, config=CONFIG, seed=0, radix_bits=4):
    """Run every :class:`Walk` on one generator, back to back; returns per walk the list of
    (index, pad, row_last, last) tuples taken and the cycle numbers at which they were taken.
    """
    dut = Img2ColAddressGenerator(config, radix_bits=radix_bits)
    layout = AddressLayout(dut.index_width)
    rng = random.Random(seed)
    results = []

    async def bench(ctx):
        cycle = 0
        for walk in walks:
            ctx.set(dut.fm.as_value(), FEATURE_MAP_DESCRIPTOR.encode(walk.fm))
            ctx.set(dut.cmd.payload.as_value(), generator_cmd(walk.fm, walk.window))
            ctx.set(dut.cmd.valid, 1)
            while True:
                _, _, accepted = await ctx.tick().sample(dut.cmd.ready)
                cycle += 1
                if accepted:
                    break
            ctx.set(dut.cmd.valid, 0)
            elements, cycles, offered = [], [], None
            while len(elements) < walk.window[0] * walk.window[1]:
                ready = rng.random() < walk.ready
                ctx.set(dut.out.ready, ready)
                _, _, valid, bits = await ctx.tick().sample(dut.out.valid,
                                                            dut.out.payload.as_value())
                cycle += 1
                # Stream rule: an offered element stays offered, unchanged, until taken.
                assert offered is None or (valid and bits == offered)
                offered = bits if valid and not ready else None
                if valid and ready:
                    v = data.Const(layout, bits)
                    elements.append((int(v.index), bool(v.pad), bool(v.row_last), bool(v.last)))
                    cycles.append(cycle)
                    if len(elements) == walk.abort_after:
                        ctx.set(dut.abort, 1)
                        await ctx.tick()
                        ctx.set(dut.abort, 0)
                        assert not ctx.get(dut.out.valid) and not ctx.get(dut.busy)
                        break
            results.append((elements, cycles))
            # Then idle (an empty window still runs its setup), with nothing more on offer.
            ctx.set(dut.out.ready, 1)
            for _ in range(200):
                _, _, valid, busy = await ctx.tick().sample(dut.out.valid, dut.busy)
                assert not valid
                if not busy:
                    break
            assert not busy

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results, dut


def run_groups(run, groups, **kwargs):
    """Run all groups' cases in one simulation (building a simulator costs about 2 s);
    returns ``({name: [(case, result), ...]}, dut)``."""
    flat = [case for cases in groups.values() for case in cases]
    results, dut = run(flat, **kwargs)
    out, start = {}, 0
    for name, cases in groups.items():
        out[name] = list(zip(cases, results[start:start + len(cases)]))
        start += len(cases)
    return out, dut


def expected_walk(fm, window):
    """The model's elements of a window as (index, pad, row_last, last); padding index None."""
    index, is_pad = gather_indices(fm, *window)
    valid_row, valid_col = window[:2]
    return [(None if is_pad[r, c] else int(index[r, c]), bool(is_pad[r, c]),
             c == valid_col - 1, r == valid_row - 1 and c == valid_col - 1)
            for r in range(valid_row) for c in range(valid_col)]


def assert_walk(walk, elements):
    got = [(None if pad else index, pad, row_last, last)
           for index, pad, row_last, last in elements]
    assert got == expected_walk(walk.fm, walk.window), walk


EXAMPLE_WINDOWS = [(EXAMPLE1, (4, 8, 0, 0)), (EXAMPLE2, (4, 8, 0, 0)), (EXAMPLE3, (8, 8, 0, 0)),
                   (EXAMPLE3, (3, 4, 3, 2)), (EXAMPLE3, (3, 4, 5, 4))]


def random_walks(seed, count, **window_bounds):
    rng = np.random.default_rng(seed)
    walks = []
    for _ in range(count):
        fm, shape = random_descriptor(rng)
        walks.append(Walk(fm, random_window(rng, shape, **window_bounds)))
    return walks


@functools.cache
def generator_runs():
    """The default generator cases, simulated once for all the tests that read them."""
    return run_groups(run_generator, {
        "examples": [Walk(fm, window) for fm, window in EXAMPLE_WINDOWS],
        "random": random_walks(11, 120),
        # A consumer that is always ready.
        "full_rate": [Walk(dataclasses.replace(EXAMPLE3, pad_left=1, pad_top=2,
                                               stride_width=2), (6, 8, 1, 0), ready=1.0)],
        # Abort after 5 elements, then a different descriptor from scratch.
        "abort": [Walk(EXAMPLE3, (8, 8, 0, 0), abort_after=5), Walk(EXAMPLE1, (4, 8, 0, 0))],
        "empty": [Walk(EXAMPLE1, (0, 8, 0, 0)), Walk(EXAMPLE1, (2, 0, 0, 0)),
                  Walk(EXAMPLE1, (1, 2, 3, 6))],
    }, seed=11)[0]


@pytest.mark.parametrize("group", ["examples", "random"])
def test_generator_against_the_model(group):
    for walk, (elements, _) in generator_runs()[group]:
        assert_walk(walk, elements)


def test_generator_sustains_one_element_per_cycle():
    (walk, (elements, cycles)), = generator_runs()["full_rate"]
    assert_walk(walk, elements)
    assert cycles == list(range(cycles[0], cycles[0] + len(cycles)))


def test_generator_abort_and_restart():
    (aborted, (first, _)), (restarted, (second, _)) = generator_runs()["abort"]
    assert len(first) == 5
    assert_walk(restarted, second)


def test_generator_empty_window_yields_nothing():
    (_, (rows0, _)), (_, (cols0, _)), (walk, (one, _)) = generator_runs()["empty"]
    assert rows0 == [] and cols0 == []
    assert_walk(walk, one)
    assert [e[0] for e in one] == [EXAMPLE1_SOURCE.index(v) for v in EXAMPLE1_RESULT[3][6:8]]


def test_generator_divider_radix_3():
    # 3 quotient bits per cycle: the 16-bit dividend is padded to 18 bits.
    walks = [Walk(fm, window) for fm, window in EXAMPLE_WINDOWS] + random_walks(16, 25)
    results, _ = run_generator(walks, seed=3, radix_bits=3)
    for walk, (elements, _) in zip(walks, results):
        assert_walk(walk, elements)


def test_generator_large_positions_with_a_wide_index():
    # P = 74,383,400 elements needs a 27-bit index: a configuration with 128 MiB per PE.
    fm = FeatureMapDescriptor(NDC1HWC0, batches=40, depth=5, channel_groups=7, height=61,
                              width=67, channels_per_group=13, filter_height=5, filter_width=3,
                              stride_height=2, stride_width=3, dilation_height=3,
                              dilation_width=2, pad_left=4, pad_right=1, pad_top=2,
                              pad_bottom=5, logical_channels=85, padding=9)
    shape = output_shape(fm)
    walks = [Walk(fm, w) for w in [(4, 40, 65535, shape.cols - 40), (3, 30, 60001, 777),
                                   (2, 50, 12345, 0)]]
    results, dut = run_generator(walks, config=CubeConfig(tile_bytes_per_pe=128 << 20))
    assert dut.index_width == 27 and fm.physical_elements >> 26
    for walk, (elements, _) in zip(walks, results):
        assert_walk(walk, elements)
    assert any(pad for elements, _ in results for _, pad, _, _ in elements)


@pytest.mark.slow
@pytest.mark.parametrize("radix_bits", [1, 2, 4])
def test_generator_random_sweep(radix_bits):
    walks = random_walks(12 + radix_bits, 400, max_rows=16, max_cols=24)
    results, _ = run_generator(walks, seed=radix_bits, radix_bits=radix_bits)
    for walk, (elements, _) in zip(walks, results):
        assert_walk(walk, elements)


def run_program(queue_inputs, inputs, *, change_after=None):
    """Run a small :class:`SerialProgram` on ``inputs`` (a, b, c) and return its results
    (r, s, q, rem) and cycles.  ``change_after``: the inputs from cycle 1 of the program on."""
    a, b, c = (Signal(16, name=n) for n in "abc")
    r, s, q, rem = (Signal(20, name=n) for n in ("r", "s", "q", "rem"))
    program = SerialProgram([
        DivMod(q, rem, a, b),
        MulAdd(r, a, b, c),
        MulAdd(s, r, c, a, sub=True),
        MulAdd(r, r, a, b),
        MulAdd(s, s, 1, c, sub=True),
    ], width=20, y_width=16, dividend_width=16, divisor_width=16,
        queue_inputs=queue_inputs)
    m = Module()
    program.emit(m)
    go = Signal()
    with m.If(go):
        m.d.sync += program.start()
    done = []

    async def bench(ctx):
        ctx.set(Cat(a, b, c), Cat(*(Const(v, 16) for v in inputs)))
        ctx.set(go, 1)
        await ctx.tick()                            # the start cycle
        ctx.set(go, 0)
        await ctx.tick()                            # cycle 0: the queues load
        if change_after is not None:
            ctx.set(Cat(a, b, c), Cat(*(Const(v, 16) for v in change_after)))
        cycles = 1
        while ctx.get(program.busy):
            await ctx.tick()
            cycles += 1
        done.append(([ctx.get(v) for v in (r, s, q, rem)], cycles))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return done[0]


def test_program_input_queues_sample_the_inputs_in_cycle_0():
    mask = (1 << 20) - 1
    rng = random.Random(24)
    for _ in range(6):
        a, b, c = (rng.randrange(1, 1 << 16) for _ in range(3))
        r = (a * b + c) * a + b & mask
        s = ((a * b + c) * c - a - c) & mask
        expected = [r, s, a // b, a % b]
        held, held_cycles = run_program(False, (a, b, c))
        queued, cycles = run_program(True, (a, b, c), change_after=(b, c, a))
        assert held == queued == expected
        assert cycles == held_cycles
    # Without the queues the program reads the inputs when each step issues.
    changed, _ = run_program(False, (a, b, c), change_after=(b, c, a))
    assert changed != expected


# ---------------------------------------------------------------------------
# Descriptor register and job layouts
# ---------------------------------------------------------------------------

def test_feature_map_register_round_trip():
    fm = dataclasses.replace(EXAMPLE3, padding=(1 << 64) - 2, pad_bottom=65535,
                             transposed=True, valid=False)
    assert FEATURE_MAP_DESCRIPTOR.decode(FEATURE_MAP_DESCRIPTOR.encode(fm)) == fm
    illegal_layout = dataclasses.replace(EXAMPLE1, layout=3)
    assert FEATURE_MAP_DESCRIPTOR.decode(FEATURE_MAP_DESCRIPTOR.encode(illegal_layout)).layout == 3


@pytest.mark.parametrize("change", [{"height": 65536}, {"pad_left": -1}, {"layout": 4},
                                    {"padding": 1 << 64}, {"padding": -1}, {"width": 2.0}])
def test_feature_map_register_rejects_unrepresentable_values(change):
    with pytest.raises(ValueError):
        FEATURE_MAP_DESCRIPTOR.encode(dataclasses.replace(EXAMPLE1, **change))


def test_job_layout_rejects_values_outside_their_fields():
    layout = Img2ColJobLayout(CONFIG)
    good = dict(src_elements=64, dst_size_code=1, dst_cols=8, valid_row=1, valid_col=3)
    job = data.Const(layout, layout.encode(DataType.U8, **good))
    assert (job.valid_col, job.src_dtype, job.src_legal) == (3, DataType.U8, 1)
    for change in ({"src_elements": 1 << 17}, {"pos_m": 65536}, {"dst_size_code": 16}):
        with pytest.raises(ValueError):
            layout.encode(DataType.U8, **{**good, **change})


def test_feature_map_parts_cover_the_register():
    fm = dataclasses.replace(EXAMPLE3, padding=(1 << 64) - 2, pad_bottom=65535, valid=True)
    parts = feature_map_parts(fm)
    assert len(parts) == FM_PARTS == 6 and all(0 <= p < 1 << 64 for p in parts)
    assert sum(p << (64 * k) for k, p in enumerate(parts)) == FEATURE_MAP_DESCRIPTOR.encode(fm)
    # The top bits of the last part lie above the 340-bit register.
    assert parts[-1] >> (FEATURE_MAP_DESCRIPTOR.size - 64 * (FM_PARTS - 1)) == 0


# ---------------------------------------------------------------------------
# Engine: jobs, the model's verdict, the simulated tile store
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Job:
    """One engine job and the source tile contents it reads."""

    fm: FeatureMapDescriptor
    dtype: DataType
    src_raw: np.ndarray            # the source tile's storage, raw patterns by storage index
    src_defined: np.ndarray
    dst_size_code: int
    dst_cols: int
    valid_row: int
    valid_col: int
    pos_m: int = 0
    pos_k: int = 0
    src_dtype: DataType | None = None
    src_layout: Layout = Layout.ROW_MAJOR
    src_legal: bool = True
    src_matrix: bool = True
    src_elements: int | None = None

    @property
    def source_type(self):
        return self.dtype if self.src_dtype is None else self.src_dtype

    @property
    def elements(self):
        return self.src_raw.size if self.src_elements is None else self.src_elements

    def bits(self, layout):
        return layout.encode(self.dtype, src_elements=self.elements,
                             dst_size_code=self.dst_size_code, dst_cols=self.dst_cols,
                             valid_row=self.valid_row, valid_col=self.valid_col,
                             pos_m=self.pos_m, pos_k=self.pos_k, src_dtype=self.source_type,
                             src_layout=self.src_layout, src_legal=self.src_legal,
                             src_matrix=self.src_matrix)


def model_outcome(job):
    """The model's verdict in its order: ``(check, window or None)``.

    Destination shape (``resolve_img2col_destination``), then ``img2col_operands_legal``:
    source descriptor, ``check_descriptor``, ``check_operand_types``, location,
    ``output_shape``, ``check_window``, definedness (``img2col``).
    """
    if not (1 <= job.dst_size_code <= 10 and ordinary_shape_legal(
            128 << (job.dst_size_code - 1), job.dst_cols, job.valid_row, job.valid_col,
            job.dtype)):
        return Img2ColCheck.DST_SHAPE, None
    steps = [
        (Img2ColCheck.SRC_DESCRIPTOR, lambda: job.src_legal or _raise()),
        (Img2ColCheck.FEATURE_MAP,
         lambda: check_descriptor(job.fm, job.source_type, job.elements)),
        (Img2ColCheck.OPERAND_TYPES,
         lambda: check_operand_types(job.source_type, job.dtype, job.src_layout,
                                     Layout.ROW_MAJOR)),
        (Img2ColCheck.SRC_LOCATION, lambda: job.src_matrix or _raise()),
        (Img2ColCheck.OUTPUT_SHAPE, lambda: output_shape(job.fm)),
        (Img2ColCheck.WINDOW, lambda: check_window(output_shape(job.fm), job.valid_row,
                                                   job.valid_col, job.pos_m, job.pos_k)),
    ]
    for check, run in steps:
        try:
            run()
        except PTOFault as fault:
            assert fault.fault is CHECK_FAULT[check]
            return check, None
    try:
        window = img2col(job.src_raw, job.src_defined, job.fm, job.dtype, job.valid_row,
                         job.valid_col, job.pos_m, job.pos_k)
    except PTOFault as fault:
        assert fault.fault is FaultClass.TILE_LEGALITY
        return Img2ColCheck.UNDEFINED, None
    return Img2ColCheck.NONE, window


def _raise():
    raise PTOFault(FaultClass.TILE_LEGALITY, "tile-store fact")


@dataclasses.dataclass
class Stalls:
    """Tile-store behaviour: probabilities of ready/valid per cycle and read latencies."""

    request_ready: float = 0.7
    response_valid: float = 0.8
    write_ready: float = 0.7
    latencies: tuple = (1, 2, 3)


NO_STALLS = Stalls(1.0, 1.0, 1.0, (1,))


@dataclasses.dataclass
class Outcome:
    fault: FaultClass
    check: Img2ColCheck
    commit: bool
    staging: dict          # destination storage index -> element written
    published: dict | None  # the staging area if committed, else None
    cycles: int            # job accepted .. done
    reads: int
    write_cycles: list     # cycle of every staging write


def with_input_word(dut, ports):
    """A module around ``dut`` that drives ``ports`` from one word (``ports[0]`` lowest).

    One ``ctx.set`` per cycle instead of one per port: each set makes the simulator settle,
    so this is what keeps the per-cycle testbench cheap.
    """
    top = Module()
    top.submodules.dut = dut
    word = Signal(sum(len(Value.cast(p)) for p in ports), name="inputs")
    offset = 0
    for port in ports:
        width = len(Value.cast(port))
        top.d.comb += port.eq(word[offset:offset + width])
        offset += width
    return top, word


def run_engine(jobs, stalls=Stalls(), seed=0, config=CONFIG, fifo_depth=4):
    """Run ``jobs`` back to back on one engine against a simulated tile store.

    An item of ``jobs`` is a :class:`Job` (run with ``stalls``) or a ``(Job, Stalls)`` pair.
    """
    jobs = [item if isinstance(item, tuple) else (item, stalls) for item in jobs]
    dut = Img2ColEngine(config, fifo_depth=fifo_depth)
    # Per-cycle inputs: src_req.ready, dst.ready, src_rsp.valid, src_rsp.payload.
    top, inputs = with_input_word(dut, [dut.src_req.ready, dut.dst.ready, dut.src_rsp.valid,
                                        dut.src_rsp.payload.as_value()])
    rng = random.Random(seed)
    outcomes = []
    sampled = (dut.src_req.valid, dut.src_req.payload, dut.src_rsp.ready, dut.dst.valid,
               dut.dst.payload.as_value(), dut.done, dut.commit, dut.fault,
               dut.check.as_value(), dut.busy, dut.fm.ready)
    addr_bits = dut.index_width

    async def bench(ctx):
        for job, stalls in jobs:
            memory = [int(v) | (int(d) << 32)
                      for v, d in zip(job.src_raw.tolist(), job.src_defined.tolist())]
            await load_feature_map(ctx, dut, job.fm)
            ctx.set(dut.job.payload.as_value(), job.bits(dut.job_layout))
            ctx.set(dut.job.valid, 1)
            _, _, accepted = await ctx.tick().sample(dut.job.ready)
            assert accepted
            ctx.set(dut.job.valid, 0)
            responses, staging, write_cycles = deque(), {}, []
            cycle, last_due, reads = 0, 0, 0
            offered_req = offered_dst = None
            holding = False           # a response offered and not yet taken stays offered
            while True:
                req_ready = rng.random() < stalls.request_ready
                dst_ready = rng.random() < stalls.write_ready
                offer = holding or (bool(responses) and responses[0][0] <= cycle
                                    and rng.random() < stalls.response_valid)
                ctx.set(inputs, req_ready | dst_ready << 1 | offer << 2
                        | (responses[0][1] << 3 if offer else 0))
                (_, _, req_valid, index, rsp_ready, dst_valid, dst_bits, done, commit, fault,
                 check, busy, fm_ready) = await ctx.tick().sample(*sampled)
                cycle += 1
                assert not fm_ready, "a feature map taken during a job"
                # Stream rules on the engine's outputs.
                assert offered_req is None or (req_valid and index == offered_req)
                assert offered_dst is None or (dst_valid and dst_bits == offered_dst)
                offered_req = index if req_valid and not req_ready else None
                offered_dst = dst_bits if dst_valid and not dst_ready else None
                if req_valid and req_ready:
                    assert index < job.elements, "read outside the source tile"
                    last_due = max(last_due, cycle + rng.choice(stalls.latencies) - 1)
                    responses.append((last_due, memory[index]))
                    reads += 1
                if offer and rsp_ready:
                    responses.popleft()
                holding = offer and not rsp_ready
                if dst_valid and dst_ready:
                    addr, value = dst_bits & ((1 << addr_bits) - 1), dst_bits >> addr_bits
                    assert addr not in staging, f"destination element {addr} written twice"
                    staging[addr] = value
                    write_cycles.append(cycle)
                if done:
                    assert not responses, "responses left unread"
                    outcomes.append(Outcome(FaultClass(fault), Img2ColCheck(check),
                                            bool(commit), staging,
                                            dict(staging) if commit else None, cycle, reads,
                                            write_cycles))
                    break
                assert busy and cycle < 20_000
            await ctx.tick()
            assert not ctx.get(dut.busy)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return outcomes, dut


def assert_matches_model(job, got):
    """The engine's outcome is the model's: same check and fault class; on success the
    published staging area holds exactly the model's window at r*Col + c."""
    check, window = model_outcome(job)
    assert (got.check, got.fault) == (check, CHECK_FAULT[check]), job
    assert got.commit == (check is Img2ColCheck.NONE)
    if window is not None:
        expected = {r * job.dst_cols + c: int(window[r, c])
                    for r in range(job.valid_row) for c in range(job.valid_col)}
        assert got.published == expected, job


def check_engine(jobs, **kwargs):
    """Run ``jobs`` and compare every outcome with the model's; returns the outcomes."""
    outcomes, _ = run_engine(jobs, **kwargs)
    for job, got in zip(jobs, outcomes):
        assert_matches_model(job, got)
    return outcomes


def smallest_destination(dtype, valid_row, valid_col):
    """(SizeCode, Col) of the smallest legal row-major destination for the window."""
    cols = 1 << max(valid_col - 1, 0).bit_length()
    bits = max(valid_row, 1) * cols * dtype.bits
    code = max(1, (-(-bits // 1024) - 1).bit_length() + 1)
    return code, cols


def make_job(fm, dtype, values, window, capacity=128, src_cols=8, defined=None, **changes):
    """A job on a row-major source of ``capacity`` bytes holding ``values`` from index 0."""
    raw, flags = source(values, dtype, capacity, src_cols, defined)
    valid_row, valid_col, pos_m, pos_k = window
    code, cols = smallest_destination(dtype, valid_row, valid_col)
    job = Job(fm, dtype, raw, flags, code, cols, valid_row, valid_col, pos_m, pos_k)
    return dataclasses.replace(job, **changes)


# ---------------------------------------------------------------------------
# Engine: the spec's tests and the worked examples
# ---------------------------------------------------------------------------

def spec_jobs():
    fm_map = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 2, 2, 1, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 99)
    fm_pad = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 77)
    fm_off = FeatureMapDescriptor(NC1HWC0, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 0)
    fm_range = FeatureMapDescriptor(NC1HWC0, logical_channels=1)
    return {
        # PTO-AVS-TILE-TIMG2COL-MAP-001
        "map": (make_job(fm_map, DataType.FP32, [11, 12, 13, 14], (1, 4, 0, 0), src_cols=4),
                [[11, 12, 13, 14]]),
        # PTO-AVS-TILE-TIMG2COL-PAD-001: element 1 is undefined and only padding reads it.
        "pad": (make_job(fm_pad, DataType.S16, [21], (1, 2, 0, 0), src_cols=2), [[21, 77]]),
        # PTO-AVS-TILE-IMG2COL-OFFSET-001
        "offset": (make_job(fm_off, DataType.U8, [31, 32], (1, 1, 0, 1), src_cols=2), [[32]]),
        # PTO-AVS-TILE-IMG2COL-RANGE-001: fits at (0, 0), not at posK = 1.
        "range_ok": (make_job(fm_range, DataType.U8, [5], (1, 1, 0, 0), src_cols=1), [[5]]),
        "range_bad": (make_job(fm_range, DataType.U8, [5], (1, 1, 0, 1), src_cols=1), None),
        # PTO-AVS-TILE-STAGE4-CARRIER-TYPES-001: E3M2 is not a TIMG2COL type.
        "carrier": (make_job(fm_range, DataType.E3M2, [5], (1, 1, 0, 0), src_cols=1), None),
        # PTO-AVS-TILE-FEATURE-MAP-STATE-001: a reconfigured tile's descriptor is invalid.
        "invalidated": (make_job(dataclasses.replace(fm_range, valid=False), DataType.U8, [5],
                                 (1, 1, 0, 0), src_cols=1), None),
    }


def test_engine_spec_tests():
    cases = spec_jobs()
    runs = engine_runs()["spec"]
    for (name, (job, result)), (_, got) in zip(cases.items(), runs):
        assert_matches_model(job, got)
        if result is None:
            assert got.fault is FaultClass.TILE_LEGALITY and not got.commit, name
        else:
            assert published_window(job, got) == result, name
    checks = {name: got.check for name, (_, got) in zip(cases, runs)}
    assert checks["range_bad"] is Img2ColCheck.WINDOW
    assert checks["carrier"] is Img2ColCheck.OPERAND_TYPES
    assert checks["invalidated"] is Img2ColCheck.FEATURE_MAP


def published_window(job, got):
    """The window as the top level would publish it: rows of the staging area."""
    return [[got.published[r * job.dst_cols + c] for c in range(job.valid_col)]
            for r in range(job.valid_row)]


def example_jobs():
    example2_channel0 = [i for i in range(len(EXAMPLE2_SOURCE)) if i % 2 == 0]
    return [
        (make_job(EXAMPLE1, DataType.U16, EXAMPLE1_SOURCE, (4, 8, 0, 0)), EXAMPLE1_RESULT),
        (make_job(EXAMPLE2, DataType.U8, EXAMPLE2_SOURCE, (4, 8, 0, 0)), EXAMPLE2_RESULT),
        (make_job(EXAMPLE2, DataType.U8, EXAMPLE2_SOURCE, (4, 8, 0, 0),
                  defined=example2_channel0), EXAMPLE2_RESULT),
        (make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (8, 8, 0, 0), src_cols=16),
         EXAMPLE3_RESULT),
        (make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 3, 2), src_cols=16),
         EXAMPLE3_WINDOW),
        (make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 5, 4), src_cols=16),
         [row[4:8] for row in EXAMPLE3_RESULT[5:8]]),
        (make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 6, 0), src_cols=16), None),
        (make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 0, 5), src_cols=16), None),
    ]


def test_engine_worked_examples():
    for (job, result), (_, got) in zip(example_jobs(), engine_runs()["examples"]):
        assert_matches_model(job, got)
        if result is None:
            assert got.check is Img2ColCheck.WINDOW
        else:
            assert published_window(job, got) == result


@pytest.mark.parametrize("latency", [1, 3])
def test_engine_copies_at_one_element_per_cycle(latency):
    # No stalls and reads answered after `latency` cycles (below the queue depth of 4):
    # after preflight and setup, one element per cycle.
    job, got = engine_runs()["full_rate"][latency == 3]
    assert_matches_model(job, got)
    first = got.write_cycles[0]
    assert got.commit and got.write_cycles == list(range(first, first + 64))
    assert got.cycles == first + 64      # done right after the last write


def full_rate_jobs():
    job = make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (8, 8, 0, 0), src_cols=16)
    return [(job, dataclasses.replace(NO_STALLS, latencies=(latency,))) for latency in (1, 3)]


def recovery_jobs():
    """Jobs that stop their walk on an undefined element, each followed by a good job of
    another descriptor or window, without stalls and with them."""
    undefined_first = make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 3, 2),
                               src_cols=16, defined=[i for i in range(64) if i != 13])
    undefined_last = dataclasses.replace(undefined_first, src_defined=np.arange(64) != 51)
    good = [job for job, _ in example_jobs()[:4]]
    jobs = [undefined_first, good[0], undefined_last, good[1], undefined_first, good[3]]
    return [(job, stalls) for stalls in (NO_STALLS, Stalls()) for job in jobs]


def test_engine_recovers_after_an_undefined_fault():
    # A job that stops its walk must leave nothing behind: the next job, with another
    # descriptor and window, starts from a clean generator.
    runs = engine_runs()["recovery"]
    for job, got in runs:
        assert_matches_model(job, got)
    assert [got.check for _, got in runs[::2]] == [Img2ColCheck.UNDEFINED] * 6
    assert all(got.commit for _, got in runs[1::2])


BASE = make_job(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, (3, 4, 3, 2), src_cols=16)

FAULT_JOBS = {
    Img2ColCheck.DST_SHAPE: [
        dict(dst_cols=3),                          # Col not a power of two
        dict(dst_cols=2),                          # ValidCol > Col
        dict(dst_size_code=0),                     # no such SizeCode
        dict(dst_size_code=11),
        dict(valid_row=3, dst_cols=32, dst_size_code=1),   # 128 B holds 2 rows of 32 S16
        dict(dtype=DataType.FP64, dst_cols=16),    # a 64-bit row of 16 does not fit 128 B
        dict(dst_cols=1 << 15, valid_col=4),       # a row wider than the TSize
        # 64 KiB of 1-column U8 rows: 65536 rows, one more than a descriptor can count.
        dict(dtype=DataType.U8, dst_cols=1, valid_row=1, valid_col=1, dst_size_code=10),
    ],
    Img2ColCheck.SRC_DESCRIPTOR: [dict(src_legal=False),
                                  dict(src_legal=False, dtype=DataType.E4M3)],
    Img2ColCheck.FEATURE_MAP: [
        dict(fm=dataclasses.replace(EXAMPLE3, valid=False)),
        dict(fm=dataclasses.replace(EXAMPLE3, transposed=True)),
        dict(fm=dataclasses.replace(EXAMPLE3, layout=2)),
        dict(fm=dataclasses.replace(EXAMPLE3, layout=3)),
        dict(fm=dataclasses.replace(EXAMPLE3, layout=NC1HWC0)),      # depth 2
        dict(fm=dataclasses.replace(EXAMPLE3, logical_channels=3)),  # > C1*C0 = 2
        dict(src_elements=63),                                       # P = 64
        dict(fm=dataclasses.replace(EXAMPLE3, batches=65535, depth=65535)),   # P huge
        *[dict(fm=dataclasses.replace(EXAMPLE3, **{name: 0})) for name in (
            "batches", "depth", "channel_groups", "height", "width", "channels_per_group",
            "filter_height", "filter_width", "stride_height", "stride_width",
            "dilation_height", "dilation_width", "logical_channels")],
        # Also broken later: the descriptor is reported first.
        dict(fm=dataclasses.replace(EXAMPLE3, transposed=True), dtype=DataType.E4M3),
    ],
    Img2ColCheck.OPERAND_TYPES: [
        dict(dtype=DataType.E4M3), dict(dtype=DataType.FP64, dst_cols=4),
        dict(dtype=DataType.U4X2), dict(dtype=DataType.TF32),
        dict(src_dtype=DataType.U16),                       # destination S16, source U16
        dict(src_layout=Layout.CUBE_M16),
        dict(dtype=DataType.E4M3, src_matrix=False),        # before the location
    ],
    Img2ColCheck.SRC_LOCATION: [dict(src_matrix=False),
                                dict(src_matrix=False, valid_row=8, pos_m=7)],
    Img2ColCheck.OUTPUT_SHAPE: [
        dict(fm=dataclasses.replace(EXAMPLE3, filter_height=3)),     # receptive 5 > 4
        dict(fm=dataclasses.replace(EXAMPLE3, dilation_width=65535)),
        dict(fm=dataclasses.replace(EXAMPLE3, filter_width=65535, dilation_width=65535)),
        dict(fm=dataclasses.replace(EXAMPLE3, filter_height=3), pos_m=60000),   # before window
    ],
    Img2ColCheck.WINDOW: [dict(pos_m=6), dict(pos_k=5), dict(pos_m=65535),
                          dict(valid_col=8, pos_k=1, dst_cols=8), dict(valid_row=9, pos_m=0)],
    # The window reads indices 13, 15, 21, 23 (row 0) and 40..43, 48..51 (rows 1, 2).
    Img2ColCheck.UNDEFINED: [
        dict(src_defined=np.arange(BASE.src_raw.size) != 13),     # read by the first element
        dict(src_defined=np.arange(BASE.src_raw.size) < 40),      # rows 1 and 2
        dict(src_defined=np.arange(BASE.src_raw.size) != 51),     # the very last element
    ],
    # Undefined elements that the window never reads.
    Img2ColCheck.NONE: [
        dict(src_defined=np.arange(BASE.src_raw.size) != 0),
        dict(dst_cols=1, valid_col=1, dst_size_code=10),    # 32768 rows of S16: legal
        dict(src_defined=np.isin(np.arange(BASE.src_raw.size),
                                 [13, 15, 21, 23, 40, 41, 42, 43, 48, 49, 50, 51])),
    ],
}


def fault_jobs():
    return [(check, dataclasses.replace(BASE, **change))
            for check, changes in FAULT_JOBS.items() for change in changes]


def test_engine_reaches_every_fault_check():
    runs, dut = engine_runs(), engine_dut()
    for (check, _), (job, got) in zip(fault_jobs(), runs["faults"]):
        assert_matches_model(job, got)
        assert got.check is check, (check, job)
        assert got.fault is {Img2ColCheck.NONE: FaultClass.NONE,
                             Img2ColCheck.DST_SHAPE: FaultClass.TILE_ALLOCATION}.get(
                                 check, FaultClass.TILE_LEGALITY)
        assert got.commit == (check is Img2ColCheck.NONE)
        if check not in (Img2ColCheck.NONE, Img2ColCheck.UNDEFINED):
            # A preflight fault ends the job at a fixed time, before any memory access.
            assert got.cycles == dut.preflight_cycles + 4 and got.reads == 0
    assert {got.check for _, got in runs["faults"]} == set(Img2ColCheck)


# ---------------------------------------------------------------------------
# Engine: random descriptors
# ---------------------------------------------------------------------------

def random_job(rng, dtype):
    """A random job: legal most of the time, sometimes broken in one of many ways."""
    fm, shape = random_descriptor(rng)
    raw, defined = random_source(rng, fm, dtype, 0.7, 0.95)
    valid_row, valid_col, pos_m, pos_k = random_window(rng, shape)
    code, dst_cols = smallest_destination(dtype, valid_row, valid_col)
    if rng.random() < 0.3:
        dst_cols *= 2
    job = Job(fm, dtype, raw, defined, code, dst_cols, valid_row, valid_col, pos_m, pos_k)
    breakage = rng.random()
    if breakage < 0.75:
        return job
    choices = [
        lambda: dict(dst_cols=dst_cols // 2) if dst_cols > 1 else dict(dst_cols=3),
        lambda: dict(src_legal=False),
        lambda: dict(fm=dataclasses.replace(fm, valid=False)),
        lambda: dict(fm=dataclasses.replace(fm, logical_channels=fm.channel_groups
                                            * fm.channels_per_group + 1)),
        lambda: dict(src_elements=fm.physical_elements - 1),
        lambda: dict(fm=dataclasses.replace(fm, layout=NC1HWC0, depth=2)),
        lambda: dict(src_dtype=DataType.U8 if dtype is not DataType.U8 else DataType.S8),
        lambda: dict(src_matrix=False),
        lambda: dict(fm=dataclasses.replace(fm, filter_height=fm.height + fm.pad_top
                                            + fm.pad_bottom + 1)),
        lambda: dict(pos_m=shape.rows - valid_row + 1),
        lambda: dict(pos_k=shape.cols - valid_col + int(rng.integers(1, 3))),
    ]
    change = choices[int(rng.integers(0, len(choices)))]()
    if change.get("src_elements", 1) < 1:
        return job
    return dataclasses.replace(job, **change)


def random_jobs(rng, count):
    return [random_job(rng, IMG2COL_TYPES[int(rng.integers(0, len(IMG2COL_TYPES)))])
            for _ in range(count)]


def test_engine_random_descriptors():
    runs = engine_runs()["random"]
    for job, got in runs:
        assert_matches_model(job, got)
    checks = {got.check for _, got in runs}
    assert Img2ColCheck.NONE in checks and Img2ColCheck.UNDEFINED in checks
    assert len(checks) >= 7
    assert {job.dtype for job, _ in runs} == set(TIMG2COL_TYPES)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", IMG2COL_TYPES)
def test_engine_random_sweep(dtype):
    rng = np.random.default_rng(1000 + dtype)
    check_engine([random_job(rng, dtype) for _ in range(150)], seed=int(dtype),
                 fifo_depth=2 + int(dtype) % 3)


# ---------------------------------------------------------------------------
# Engine against the model machine's preflight and execution
# ---------------------------------------------------------------------------

def state_scenario(fm, dtype, values, src_capacity, src_cols, window, dst_cols, size_code,
                   location=Location.MATRIX):
    """A State with the source in T#1 of PE0 and posM/posK in a0/a1, and its bundle."""
    valid_row, valid_col, pos_m, pos_k = window
    state = State()
    rows = src_capacity * 8 // (src_cols * dtype.bits)
    raw = np.zeros((rows, src_cols), dtype=np.uint64)
    raw.ravel()[:len(values)] = values
    state.set_tile(0, 0, Tile.from_raw(dtype, Layout.ROW_MAJOR, raw, src_capacity, location,
                                       src_cols, feature_map=fm))
    state.write_gpr(2, pos_m)
    state.write_gpr(3, pos_k)
    bundle = Bundle(Operation.TIMG2COL, int(dtype), 0, 5, dims=(valid_col, valid_row, dst_cols),
                    local_sources=(0,), destinations=(Destination(1, size_code),),
                    terminated=True, ior=(2, 3, 0, 0), pe_mask=0b1000)
    return state, bundle


def job_from_state(state, bundle):
    """The job the top level would build for PE0 from the state and the bundle."""
    src = state.tile(0, bundle.local_sources[0])
    valid_col, valid_row, cols = bundle.dims
    return Job(src.feature_map, DataType(bundle.a_type), src.raw_slots().astype(np.uint64),
               src.defined, bundle.destinations[0].size_code, cols, valid_row, valid_col,
               state.read_gpr(2) & 0xFFFF, state.read_gpr(3) & 0xFFFF, src.dtype, src.layout,
               ordinary_shape_legal(src.capacity, src.cols, src.valid_rows, src.valid_cols,
                                    src.dtype), src.location is Location.MATRIX,
               src.rows * src.cols)


def machine_scenarios():
    return [
        state_scenario(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, 128, 16, (3, 4, 3, 2), 4, 1),
        state_scenario(EXAMPLE1, DataType.U16, EXAMPLE1_SOURCE, 128, 8, (4, 8, 0, 0), 8, 1),
        state_scenario(EXAMPLE2, DataType.U8, EXAMPLE2_SOURCE, 256, 32, (4, 8, 0, 0), 16, 2),
        # Source in Any location; a destination too small; a window out of range.
        state_scenario(EXAMPLE1, DataType.U16, EXAMPLE1_SOURCE, 128, 8, (4, 8, 0, 0), 8, 1,
                       location=Location.ANY),
        state_scenario(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, 128, 16, (8, 8, 0, 0), 64, 1),
        state_scenario(EXAMPLE3, DataType.S16, EXAMPLE3_SOURCE, 128, 16, (8, 8, 1, 0), 8, 1),
    ]


def test_engine_agrees_with_the_model_machine():
    scenarios = machine_scenarios()
    for (state, bundle), (job, got) in zip(scenarios, engine_runs()["machine"]):
        try:
            plan = preflight(bundle, state)
        except PTOFault as fault:
            assert got.fault is fault.fault and not got.commit
            continue
        (pe, index, tile), = execute(plan, state)[0]
        assert got.commit and pe == 0
        published = np.zeros(tile.rows * tile.cols, dtype=np.int64)
        for addr, value in got.published.items():
            published[addr] = value
        assert published.reshape(tile.rows, tile.cols)[:job.valid_row, :job.valid_col]\
            .tolist() == tile.raw().tolist()
    assert {got.fault for _, got in engine_runs()["machine"]} == {
        FaultClass.NONE, FaultClass.TILE_LEGALITY, FaultClass.TILE_ALLOCATION}


# ---------------------------------------------------------------------------
# Engine: every default job in one simulation
# ---------------------------------------------------------------------------

@functools.cache
def _engine_runs():
    random_rng = np.random.default_rng(21)
    groups = {
        "spec": [job for job, _ in spec_jobs().values()],
        "examples": [job for job, _ in example_jobs()],
        "full_rate": full_rate_jobs(),
        "recovery": recovery_jobs(),
        "faults": [job for _, job in fault_jobs()],
        "random": random_jobs(random_rng, 200),
        "machine": [job_from_state(state, bundle) for state, bundle in machine_scenarios()],
    }
    runs, dut = run_groups(run_engine, groups, seed=21)
    # Unwrap (job, stalls) cases to their job.
    return {name: [(case[0] if isinstance(case, tuple) else case, got) for case, got in pairs]
            for name, pairs in runs.items()}, dut


def engine_runs():
    """The default engine jobs, simulated once for all the tests that read them:
    ``{group: [(job, Outcome), ...]}``."""
    return _engine_runs()[0]


def engine_dut():
    return _engine_runs()[1]


# ---------------------------------------------------------------------------
# Performance figures
# ---------------------------------------------------------------------------

def test_bench_reports_throughput():
    figures = bench_img2col(synthesize=False, window=(4, 288))
    for unit in ("generator", "engine"):
        got = figures[unit]
        assert got["elements"] == 4 * 288
        assert got["steady_state_elements_per_cycle"] == 1.0
        assert 0.5 < got["elements_per_cycle"] < 1.0
    assert figures["engine"]["committed"] and figures["engine"]["bit_exact"]
