"""Drive the systolic array with whole matrix products, and measure it.

:func:`run_matmuls` plays the part of the CUBE sequencer in simulation: it
tiles each :class:`MatmulJob` (an M x N x K product with its data types,
optional MX scales and optional initial accumulator) over the R x C array,
groups the output blocks ``slots`` at a time, streams the beats, fill rows
and drain rows through :class:`~ptocube.hdl.systolic.SystolicArray` with
optional random stalls on every stream, and reassembles the results.
:func:`bench_systolic` reports cycle counts, MAC utilization and simulator
speed for the issue's reference shapes.

The schedule follows ``docs/hdl-systolic.md``: group g's initial values are
filled during group g-1 (the first during the exchange that follows reset),
group g's results are drained during group g+1, and a final *flush* group
of null beats pushes the last group's results out.
"""

import time
from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.sim import Simulator

from ptocube.hdl.config import CubeConfig
from ptocube.hdl.systolic import SystolicArray
from ptocube.model.datatype import DataType, MX_SCALED_TYPES, NumClass
from ptocube.model.numeric import MX_BLOCK, decode, f32_to_bits, matmul_float, matmul_int

__all__ = ["MatmulJob", "RunStats", "Schedule", "pack_layout", "run_matmuls",
           "predict_cycles", "bench_systolic"]


def pack_layout(shape, value) -> int:
    """The bit pattern of ``value`` for a ``lib.data`` layout (or a plain shape).

    ``value`` is an int for a plain member, a dict for a struct (missing
    fields are 0) and a sequence for an array.
    """
    if isinstance(shape, data.StructLayout):
        word = 0
        for name, member in shape:
            if name in value:
                word |= pack_layout(member.shape, value[name]) << member.offset
        return word
    if isinstance(shape, data.ArrayLayout):
        width = Shape.cast(shape.elem_shape).width
        word = 0
        for index, item in enumerate(value):
            word |= pack_layout(shape.elem_shape, item) << (index * width)
        return word
    return int(value) & ((1 << Shape.cast(shape).width) - 1)


@dataclass
class MatmulJob:
    """One M x N x K product as the sequencer sees it.

    ``a``: [M, K] and ``b``: [K, N] raw bit patterns (one 4-bit lane value per
    element for the packed X2 types); ``a_scale``: [M, ceil(K/32)] and
    ``b_scale``: [ceil(K/32), N] raw E8M0 scales of the scaled MX sides, or
    None; ``acc0``: [M, N] 32-bit initial accumulator patterns (ACC forms), or
    None to start from zero.
    """

    a_type: DataType
    b_type: DataType
    a: np.ndarray
    b: np.ndarray
    a_scale: np.ndarray | None = None
    b_scale: np.ndarray | None = None
    acc0: np.ndarray | None = None

    def __post_init__(self):
        self.a_type, self.b_type = DataType(self.a_type), DataType(self.b_type)
        self.a, self.b = np.asarray(self.a), np.asarray(self.b)
        if self.a.ndim != 2 or self.b.ndim != 2 or self.a.shape[1] != self.b.shape[0]:
            raise ValueError(f"operands must be [M, K] and [K, N], got {self.a.shape} "
                             f"and {self.b.shape}")
        if self.a.shape[1] < 1:
            raise ValueError("K must be at least 1")
        for side, dtype, scale in (("a", self.a_type, self.a_scale),
                                   ("b", self.b_type, self.b_scale)):
            if scale is not None and dtype not in MX_SCALED_TYPES:
                raise ValueError(f"{side}_scale given for {dtype.name}, which is not a "
                                 f"scaled MX type")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(M, N, K)."""
        return self.a.shape[0], self.b.shape[1], self.a.shape[1]

    def reference(self) -> np.ndarray:
        """The golden model's result bit patterns, uint32 [M, N]."""
        a, b = decode(self.a_type, self.a), decode(self.b_type, self.b)
        if self.a_type.num_class is NumClass.FLOAT:
            acc0 = None
            if self.acc0 is not None:
                acc0 = np.asarray(self.acc0, dtype=np.uint32).view(np.float32)
            return f32_to_bits(matmul_float(a, b, acc0, self.a_scale, self.b_scale))
        return matmul_int(a, b, self.acc0, signed=self.a_type.num_class is NumClass.SIGNED)


@dataclass
class RunStats:
    """What one :func:`run_matmuls` simulation measured."""

    cycles: int           # from reset to the last drain transfer
    beats: int            # feed transfers (null beats included)
    useful_macs: int      # sum of M * N * K over the jobs
    rows: int
    cols: int
    cpu_s: float          # simulator CPU time (construction excluded)

    @property
    def utilization(self) -> float:
        """Useful MACs / (R x C x cycles)."""
        return self.useful_macs / (self.rows * self.cols * self.cycles)

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.cpu_s


class Schedule:
    """Beats, fill rows and the drain-row map of a list of jobs on one array.

    ``beats``: the feed payloads in order, ``group_beats[g]`` of them for group g (the
    flush group last); ``fills``: the fill payloads, R x L per exchange, the exchange after
    reset first; ``groups[g]``: the (job index, block row, block column) of each used slot
    of group g; ``drain_rows``: how many rows are drained (R x L per group but the flush).
    """

    def __init__(self, array: SystolicArray, jobs: list[MatmulJob]):
        self.array = array
        self.jobs = jobs
        rows, cols, slots = array.rows, array.cols, array.slots
        feed_shape = array.feed.payload.shape()
        fill_shape = array.fill.payload.shape()
        self.beats, self.fills, self.group_beats = [], [], []
        self.groups = []
        for index, job in enumerate(jobs):
            m, n, k = job.shape
            tiles = [(index, bm, bn) for bm in range(-(-m // rows))
                     for bn in range(-(-n // cols))]
            for start in range(0, len(tiles), slots):
                group = tiles[start:start + slots]
                self.groups.append(group)
                self._group_fills(jobs, group, fill_shape)
                before = len(self.beats)
                self._group_beats(jobs, group, feed_shape)
                self.group_beats.append(len(self.beats) - before)
        # The flush group: null first beats push the last results out.
        self.groups.append([])
        self.beats.extend(pack_layout(feed_shape, {"slot": s, "first": 1, "null": 1})
                          for s in range(slots))
        self.group_beats.append(slots)
        # Initial values of the flush group and of the (absent) group after it.
        self.fills.extend([0] * (2 * rows * slots))
        self.drain_rows = (len(self.groups) - 1) * rows * slots

    def drain_target(self, index: int) -> tuple[int, int, int, int] | None:
        """Where drain row ``index`` (from 0, in drain order) belongs: (job index, output
        row, first output column, columns), or None for a row of padding or an unused
        slot.  The row's (array row, slot) tag is ``divmod(index % (R x L), L)``."""
        rows, cols, slots = self.array.rows, self.array.cols, self.array.slots
        row, slot = divmod(index % (rows * slots), slots)
        group = self.groups[index // (rows * slots)]
        if slot >= len(group):
            return None
        job, bm, bn = group[slot]
        m, n, _ = self.jobs[job].shape
        if bm * rows + row >= m:
            return None
        return job, bm * rows + row, bn * cols, min(cols, n - bn * cols)

    def _group_fills(self, jobs, group, fill_shape):
        rows, cols, slots = self.array.rows, self.array.cols, self.array.slots
        for i in range(rows):
            for s in range(slots):
                values = [0] * cols
                if s < len(group):
                    index, bm, bn = group[s]
                    acc0 = jobs[index].acc0
                    m, n, _ = jobs[index].shape
                    if acc0 is not None and bm * rows + i < m:
                        for j in range(min(cols, n - bn * cols)):
                            values[j] = int(acc0[bm * rows + i, bn * cols + j]) & 0xFFFFFFFF
                self.fills.append(pack_layout(fill_shape, {"data": values}))

    def _group_beats(self, jobs, group, feed_shape):
        rows, cols, slots = self.array.rows, self.array.cols, self.array.slots
        has_scale = self.array.numeric.has_scale
        k_len = jobs[group[0][0]].shape[2]
        # Zero-padded operand blocks of each slot, indexed [k, i] and [k, j].
        blocks = []
        for index, bm, bn in group:
            job = jobs[index]
            m, n, k = job.shape
            a = np.zeros((k, rows), dtype=np.int64)
            b = np.zeros((k, cols), dtype=np.int64)
            a_rows = job.a[bm * rows:(bm + 1) * rows, :]
            b_cols = job.b[:, bn * cols:(bn + 1) * cols]
            a[:, :a_rows.shape[0]] = a_rows.T
            b[:, :b_cols.shape[1]] = b_cols
            a_sc = np.zeros((k, rows), dtype=np.int64)
            b_sc = np.zeros((k, cols), dtype=np.int64)
            if job.a_scale is not None:
                blk = np.asarray(job.a_scale)[bm * rows:(bm + 1) * rows, :]
                a_sc[:, :blk.shape[0]] = np.repeat(blk.T, MX_BLOCK, axis=0)[:k]
            if job.b_scale is not None:
                blk = np.asarray(job.b_scale)[:, bn * cols:(bn + 1) * cols]
                b_sc[:, :blk.shape[1]] = np.repeat(blk, MX_BLOCK, axis=0)[:k]
            fields = {"a_type": job.a_type, "b_type": job.b_type, "slot": None,
                      "load": int(job.acc0 is not None)}
            if has_scale:
                fields.update(a_scale_en=int(job.a_scale is not None),
                              b_scale_en=int(job.b_scale is not None))
            blocks.append((a, b, a_sc, b_sc, fields))
        for kk in range(k_len):
            for s in range(slots):
                if s >= len(blocks):
                    if kk == 0:
                        self.beats.append(pack_layout(feed_shape,
                                                      {"slot": s, "first": 1, "null": 1}))
                    continue
                a, b, a_sc, b_sc, fields = blocks[s]
                beat = dict(fields, slot=s, first=int(kk == 0), a=a[kk], b=b[kk])
                if has_scale:
                    beat.update(a_scale=a_sc[kk], b_scale=b_sc[kk])
                self.beats.append(pack_layout(feed_shape, beat))


def _unpack_drain(array: SystolicArray, word: int) -> tuple[list[int], int, int]:
    layout = array.drain.payload.shape()
    values = [(word >> (32 * j)) & 0xFFFFFFFF for j in range(array.cols)]
    row = (word >> layout["row"].offset) & ((1 << layout["row"].width) - 1)
    slot = (word >> layout["slot"].offset) & ((1 << layout["slot"].width) - 1)
    return values, row, slot


def run_matmuls(array: SystolicArray, jobs: list[MatmulJob], *, feed_gap: float = 0.0,
                fill_gap: float = 0.0, drain_stall: float = 0.0, seed: int = 0,
                max_cycles: int | None = None) -> tuple[list[np.ndarray], RunStats]:
    """Simulate ``jobs`` back to back on ``array`` (fresh from reset).

    ``feed_gap``/``fill_gap``: probability that the sequencer has no beat /
    fill row ready in a cycle (it then waits); ``drain_stall``: probability
    that it refuses a drain row.  Returns each job's result bit patterns
    (uint32 [M, N]) and the :class:`RunStats`.  Raises ``RuntimeError`` if the
    run does not finish within ``max_cycles`` (default: generous).
    """
    schedule = Schedule(array, jobs)
    results = [np.zeros(job.shape[:2], dtype=np.uint32) for job in jobs]
    written = [np.zeros(job.shape[:2], dtype=bool) for job in jobs]
    rows, cols, slots = array.rows, array.cols, array.slots
    if max_cycles is None:
        max_cycles = 4 * (len(schedule.beats) + len(schedule.fills)) + 1000
    rng = np.random.default_rng(seed)
    feed, fill, drain = array.feed, array.fill, array.drain
    outcome = {}

    async def bench(ctx):
        beat_i = fill_i = drain_i = 0
        beat_on = fill_on = False
        levels = {}
        for cycle in range(max_cycles):
            if drain_i == schedule.drain_rows:
                outcome["cycles"] = cycle
                outcome["beats"] = beat_i
                return
            # A source holds valid until its transfer; it may start late.
            if not beat_on and beat_i < len(schedule.beats):
                beat_on = rng.random() >= feed_gap
                if beat_on:
                    ctx.set(feed.payload.as_value(), schedule.beats[beat_i])
            if not fill_on and fill_i < len(schedule.fills):
                fill_on = rng.random() >= fill_gap
                if fill_on:
                    ctx.set(fill.payload.as_value(), schedule.fills[fill_i])
            drain_ready = rng.random() >= drain_stall
            # Every ctx.set settles the design: set only what changed.
            for port, value in ((feed.valid, beat_on), (fill.valid, fill_on),
                                (drain.ready, drain_ready)):
                if levels.get(port.name) != value:
                    ctx.set(port, value)
                    levels[port.name] = value
            if beat_on and ctx.get(feed.ready):
                beat_i += 1
                beat_on = False
            if fill_on and ctx.get(fill.ready):
                fill_i += 1
                fill_on = False
            if drain_ready and ctx.get(drain.valid):
                values, row, slot = _unpack_drain(array, ctx.get(drain.payload.as_value()))
                expected = divmod(drain_i % (rows * slots), slots)
                if (row, slot) != expected:
                    raise AssertionError(f"drain row {drain_i} tagged (row {row}, slot "
                                         f"{slot}), expected {expected}")
                target = schedule.drain_target(drain_i)
                if target is not None:
                    index, out_row, col, width = target
                    where = (out_row, slice(col, col + width))
                    results[index][where] = values[:width]
                    written[index][where] = True
                drain_i += 1
            await ctx.tick()
        raise RuntimeError(f"the array did not finish within {max_cycles} cycles "
                           f"({beat_i} beats, {fill_i} fill rows, {drain_i} drain rows)")

    sim = Simulator(array)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    start = time.process_time()
    sim.run()
    cpu = time.process_time() - start
    for index, mask in enumerate(written):
        if not mask.all():
            raise AssertionError(f"job {index}: no drain row carried element "
                                 f"{tuple(np.argwhere(~mask)[0])}")
    macs = sum(int(np.prod(job.shape)) for job in jobs)
    stats = RunStats(outcome["cycles"], outcome["beats"], macs, rows, cols, cpu)
    return results, stats


def predict_cycles(array: SystolicArray, jobs: list[MatmulJob]) -> int:
    """Cycles :func:`run_matmuls` needs for ``jobs`` when no stream stalls.

    The closed form of ``docs/hdl-systolic.md``: after the reset exchange
    (R x L cycles), group g+1 starts ``max(K_g x L, ceil_L(L + D + R x L))``
    cycles after group g (its own beats, or the swap window plus the
    exchange, rounded up to a whole slot round); the flush group then needs
    L + D + R x L cycles to drain the last results.  D is the array's
    :attr:`~ptocube.hdl.systolic.SystolicArray.swap_distance`: R + C, plus
    the edge and product registers the build has.
    """
    rows, cols, slots, swap = array.rows, array.cols, array.slots, array.swap_distance
    turnaround = slots + swap + rows * slots
    turnaround = -(-turnaround // slots) * slots
    cycles = rows * slots
    for job in jobs:
        m, n, k = job.shape
        groups = -(-(-(-m // rows) * -(-n // cols)) // slots)
        cycles += groups * max(k * slots, turnaround)
    return cycles + slots + swap + rows * slots


def _random_job(rng, a_type, b_type, m, n, k) -> MatmulJob:
    """Random finite operands (integers: any pattern)."""
    def operand(dtype, shape):
        raw = rng.integers(0, 1 << dtype.bits, shape)
        if dtype.num_class is NumClass.FLOAT:
            raw = np.where(np.isfinite(decode(dtype, raw)), raw, 0)
        return raw
    return MatmulJob(a_type, b_type, operand(a_type, (m, k)), operand(b_type, (k, n)))


def bench_systolic(m: int = 64, n: int = 64, k: int = 256, size: int = 8,
                   seed: int = 0) -> list[dict]:
    """Cycle counts and MAC utilization of whole products on the array.

    Cases (each an M x N x K product tiled over a ``size`` x ``size`` array):

    * ``S8``: S8 x S8 on an integer-only build with the sum registered (L = 1);
    * ``FP16 schedule``: the full-type build's schedule (L = fma_stages = 3),
      simulated on an integer-only array padded to 3 slots: the control and
      hence the cycle count depend only on R, C, L and the shape, and the
      floating-point array is too slow to simulate at this size in pysim;
    * ``FP16``: FP16 x FP16 on the full-type build, half the array size and a
      quarter of each dimension (no target: it shows that the real float
      array keeps the predicted schedule).

    Returns one dict per case: ``case``, ``array`` (R, C, L), ``shape``,
    ``cycles``, ``predicted_cycles``, ``utilization``, ``target`` and
    ``meets_target`` (None without a target), ``bit_exact`` and
    ``sim_cycles_per_s`` (pysim, CPU time).
    """
    rng = np.random.default_rng(seed)
    int_build = CubeConfig(rows=size, cols=size, float_types=False, mx_types=False)
    quarter = max(2, size // 2)
    cases = [
        ("S8", SystolicArray(int_build), (DataType.S8, DataType.S8), (m, n, k), 0.90),
        ("FP16 schedule", SystolicArray(int_build, slots=CubeConfig().fma_stages),
         (DataType.S8, DataType.S8), (m, n, k), 0.80),
        ("FP16", SystolicArray(CubeConfig(rows=quarter, cols=quarter)),
         (DataType.FP16, DataType.FP16), (max(1, m // 4), max(1, n // 4), max(1, k // 4)),
         None),
    ]
    report = []
    for name, array, (a_type, b_type), (mm, nn, kk), target in cases:
        job = _random_job(rng, a_type, b_type, mm, nn, kk)
        results, stats = run_matmuls(array, [job])
        report.append({
            "case": name, "array": (array.rows, array.cols, array.slots),
            "shape": (mm, nn, kk), "cycles": stats.cycles,
            "predicted_cycles": predict_cycles(array, [job]),
            "utilization": stats.utilization, "target": target,
            "meets_target": None if target is None else stats.utilization >= target,
            "bit_exact": bool(np.array_equal(results[0], job.reference())),
            "sim_cycles_per_s": stats.cycles_per_s,
        })
    return report


if __name__ == "__main__":
    for row in bench_systolic():
        print(row)
