"""The array self-test: the preset's systolic array checks itself against the golden model.

The whole unit does not fit the iCEBreaker's UP5K (``docs/fpga.md``), its
:class:`~ptocube.hdl.systolic.SystolicArray` does. :class:`ArrayHarness` gives the array the
four streams of the unit's host port, so the unit's :class:`~ptocube.build.selftest.SelfTest`
and :class:`~ptocube.build.host_player.HostCommandPlayer` drive it unchanged:

=============  ==========================================  ======================================
host port      carries                                     array side
=============  ==========================================  ======================================
``parcels``    one feed beat (``feed_layout``)             ``feed``, directly
``host_cmd``   one fill row (``fill_layout``)              a FIFO of R x L rows, then ``fill``
``host_rsp``   the fill row's number modulo 256 (8 bits)   (acknowledges the row)
``status``     one drain row (``drain_layout``)            ``drain``, then a FIFO of R x L rows
=============  ==========================================  ======================================

:func:`array_program` turns integer matrix products into a program whose expected drain rows
come from the golden model (:func:`ptocube.model.numeric.matmul_int`) at elaboration time, in
the beat, fill and drain order of :class:`ptocube.sim.bench_systolic.Schedule`.
"""

import numpy as np
from amaranth.hdl import Module, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..hdl.systolic import SystolicArray
from ..model.datatype import DataType
from ..sim.bench_systolic import MatmulJob, Schedule, pack_layout
from .host_player import Step
from .selftest import SelfTest

__all__ = ["ArrayHarness", "RSP_WIDTH", "array_jobs", "array_program", "array_selftest"]

#: Width of the fill acknowledgement: the fill row's number modulo 2**RSP_WIDTH.
RSP_WIDTH = 8


class ArrayHarness(wiring.Component):
    """The preset's :class:`SystolicArray` behind the unit's four host-port streams.

    ``parcels`` are feed beats and go straight to ``feed``. ``host_cmd`` carries fill rows
    into a FIFO of ``exchange_rows`` (R x L) rows in front of ``fill``; each is acknowledged
    on ``host_rsp`` with its number modulo 256 (one row in flight, like a host command).
    Drain rows go into a FIFO of R x L rows and come out on ``status``. The FIFOs decouple
    the array's exchange, which needs a fill row and room for a drain row in the same cycle,
    from a host that does one thing at a time (:func:`array_program` gives the order).

    Members: ``host_cmd``, ``parcels`` (In streams), ``host_rsp``, ``status`` (Out streams);
    ``array``: the wrapped :class:`SystolicArray`.
    """

    def __init__(self, config):
        self.array = SystolicArray(config)
        shapes = {name: port.signature.members["payload"].shape
                  for name, port in self.array.signature.members.items()}
        super().__init__({
            "host_cmd": In(stream.Signature(shapes["fill"])),
            "host_rsp": Out(stream.Signature(RSP_WIDTH)),
            "parcels": In(stream.Signature(shapes["feed"])),
            "status": Out(stream.Signature(shapes["drain"])),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = self.array
        wiring.connect(m, wiring.flipped(self.parcels), array.feed)

        depth = array.exchange_rows
        fill_bits = Value.cast(array.fill.payload).shape().width
        drain_bits = Value.cast(array.drain.payload).shape().width
        m.submodules.fills = fills = SyncFIFO(width=fill_bits, depth=depth)
        m.submodules.drains = drains = SyncFIFO(width=drain_bits, depth=depth)

        # A fill row is taken only when its acknowledgement has gone: one row in flight.
        cmd, rsp = self.host_cmd, self.host_rsp
        number = Signal(RSP_WIDTH)
        m.d.comb += [fills.w_data.eq(cmd.payload),
                     fills.w_en.eq(cmd.valid & ~rsp.valid),
                     cmd.ready.eq(fills.w_rdy & ~rsp.valid)]
        with m.If(rsp.valid & rsp.ready):
            m.d.sync += rsp.valid.eq(0)
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += [rsp.valid.eq(1), rsp.payload.eq(number), number.eq(number + 1)]

        m.d.comb += [array.fill.payload.eq(fills.r_data), array.fill.valid.eq(fills.r_rdy),
                     fills.r_en.eq(array.fill.ready),
                     drains.w_data.eq(array.drain.payload), drains.w_en.eq(array.drain.valid),
                     array.drain.ready.eq(drains.w_rdy),
                     self.status.payload.eq(drains.r_data), self.status.valid.eq(drains.r_rdy),
                     drains.r_en.eq(self.status.ready)]
        return m


def _operand(rng, dtype: DataType, shape) -> np.ndarray:
    """Raw patterns of ``dtype``: random, a third of them the extremes (0, all ones, the
    most negative and the largest signed pattern)."""
    bits = dtype.bits
    extremes = [0, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1]
    raw = rng.integers(0, 1 << bits, shape)
    return np.where(rng.random(shape) < 1 / 3, rng.choice(extremes, shape), raw)


def array_jobs(config, seed: int = 1) -> list:
    """The default integer products of the array self-test for ``config``'s R x C array.

    Every integer input type on each side, within its class (signed x signed, unsigned x
    unsigned, the pairs the preflight accepts): S8 x S8 and U8 x U8 over more than one output
    block in both directions (M = R + 1 or R, N = 2C or C + 1, K = 5 and 12), S16 x S16 with a
    row and a column of -32768 (four products of 2^30 wrap to 0), two ACC jobs whose
    initial accumulators (through fill) wrap past 2^31 and 2^32, and the 4-bit types against
    the wider ones. About a third of all operands are extremes.
    """
    if not config.int_types:
        raise ValueError("the array self-test runs integer products; this build has no "
                         "integer types")
    rng = np.random.default_rng(seed)
    rows, cols = config.rows, config.cols
    D = DataType

    def job(a_type, b_type, m, n, k, acc0=None):
        return MatmulJob(a_type, b_type, _operand(rng, a_type, (m, k)),
                         _operand(rng, b_type, (k, n)), acc0=acc0)

    wrap = job(D.S16, D.S16, rows, cols, 4)
    wrap.a[0, :] = 0x8000
    wrap.b[:, 0] = 0x8000
    near_s32 = rng.choice([0x7FFFFFFF, 0x80000000, 0x7FFFFF00, 0x800000FF], (rows + 1, cols))
    near_u32 = rng.choice([0xFFFFFFFF, 0xFFFF0000, 0, 1], (rows, cols))
    return [
        job(D.S8, D.S8, rows + 1, 2 * cols, 5),
        job(D.U8, D.U8, rows, cols + 1, 12),
        wrap,
        job(D.S8, D.S8, rows + 1, cols, 3, acc0=near_s32.astype(np.uint32)),
        job(D.U16, D.U16, rows, cols, 3, acc0=near_u32.astype(np.uint32)),
        job(D.S4X2, D.S16, rows, cols, 2),
        job(D.S8, D.S4X2, rows, cols, 2),
        job(D.U4X2, D.U8, rows, cols, 2),
        job(D.U16, D.U4X2, rows, cols, 2),
    ]


def array_program(config, jobs: list | None = None) -> list:
    """The steps that run ``jobs`` (default :func:`array_jobs`) on :class:`ArrayHarness`
    and check every drain row, in full, against the golden model.

    The beats, fill rows and drain rows are :class:`~ptocube.sim.bench_systolic.Schedule`'s
    (tiling, slot interleaving, a flush group at the end); results are ``MatmulJob.reference``
    (``matmul_int`` on the same raw inputs and initial accumulators), zero for padding rows
    and columns.

    The player does one thing at a time, so the order matters. Exchange e takes R x L fill
    rows and, from e = 2 on, gives R x L drain rows (group e - 1's results); it starts when
    group e's first beats have reached every PE (groups counted from 1, exchange 0 after
    reset) and must end before group e + 1's first beats are taken. The program is

        fill rows of exchange 0;
        for each group e (the flush group last): the fill rows of exchange e, the group's
        beats, the drain rows of exchange e.

    Exchange e's fill rows are in their FIFO before the group's beats, so the exchange
    overlaps the group's K loop as in the CUBE engine, and its drain rows fit the drain FIFO,
    which the previous drain steps emptied: nothing waits for a step that comes later.
    (Exchanges 0 and 1 drain nothing: the fill rows of exchanges 1 and 2 may wait until they
    have taken theirs, which needs no step of the player.)
    """
    array = SystolicArray(config)
    array._MustUse__silence = True      # only its streams' shapes are needed, no hardware
    jobs = array_jobs(config) if jobs is None else jobs
    schedule = Schedule(array, jobs)
    per_exchange = array.exchange_rows
    results = [job.reference() for job in jobs]
    drain_shape = array.drain.payload.shape()

    def fill_steps(exchange):
        first = exchange * per_exchange
        return [Step.command(word, (first + k) % (1 << RSP_WIDTH))
                for k, word in enumerate(schedule.fills[first:first + per_exchange])]

    def drain_steps(exchange):
        steps = []
        for index in range((exchange - 2) * per_exchange, (exchange - 1) * per_exchange):
            values = [0] * array.cols
            target = schedule.drain_target(index)
            if target is not None:
                job, row, col, width = target
                values[:width] = [int(v) for v in results[job][row, col:col + width]]
            row, slot = divmod(index % per_exchange, array.slots)
            steps.append(Step.status(pack_layout(drain_shape, {"data": values, "row": row,
                                                               "slot": slot})))
        return steps

    steps = fill_steps(0)
    beat = 0
    for exchange, count in enumerate(schedule.group_beats, start=1):
        steps += fill_steps(exchange)
        steps += [Step.parcel(word) for word in schedule.beats[beat:beat + count]]
        beat += count
        if exchange >= 2:
            steps += drain_steps(exchange)
    return steps


def array_selftest(config, *, clk_hz: float, baud: int = 115200, jobs: list | None = None,
                   **kwargs) -> SelfTest:
    """The self-test of ``config``'s systolic array: :class:`SelfTest` of an
    :class:`ArrayHarness` with :func:`array_program` (other keyword arguments go to
    :class:`SelfTest`). Every bit of a drain row is compared."""
    return SelfTest(ArrayHarness(config), array_program(config, jobs), clk_hz=clk_hz,
                    baud=baud, **kwargs)
