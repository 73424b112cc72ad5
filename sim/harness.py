"""Drive a component's ``lib.stream`` ports in the Amaranth simulator, with random stalls.

:func:`run_streams` is the one entry point: it feeds lists of payloads into input streams,
collects a given number of payloads from output streams, and can stall both sides at random
(a producer idling before a beat, a consumer holding ``ready`` low), which is how the stream
handshakes get exercised.  Any other stimulus (a register-file port, a status check) goes in
as extra testbenches.  The stream rules followed are those of ``amaranth.lib.stream``: a
producer never waits for ``ready`` before raising ``valid`` and holds the payload until the
transfer; a transfer happens at a clock edge where both are high.
"""

import random
from dataclasses import dataclass, field

from amaranth.hdl import Shape, Value
from amaranth.sim import Simulator

__all__ = ["Feed", "Drain", "RunResult", "run_streams"]


@dataclass
class Feed:
    """Payloads to put into the input stream ``port`` (an ``In(stream.Signature)`` member).

    A payload is an int (the bit pattern) or anything the payload shape's ``const`` accepts
    (a dict for a ``data.StructLayout``, ...).
    """
    port: object
    payloads: list


@dataclass
class Drain:
    """Collect ``count`` payloads from the output stream ``port``."""
    port: object
    count: int


@dataclass
class RunResult:
    """What a run produced.

    ``outputs[k]`` holds the payloads of the k-th drain as bit patterns (ints; turn one into a
    view with ``data.Const(layout, bits)``), ``extra[k]`` any payloads that arrived during the
    ``settle`` cycles after the expected count, ``cycles`` the clock cycles until every drain
    was satisfied and ``transfer_cycles[k]`` the cycle of each output transfer.
    """
    outputs: list
    extra: list
    cycles: int
    transfer_cycles: list = field(default_factory=list)


def run_streams(dut, *, feeds=(), drains=(), stall=0.0, seed=0, max_cycles=100_000,
                settle=8, testbenches=(), clock=1e-8, vcd=None) -> RunResult:
    """Simulate ``dut`` until every feed is consumed and every drain has its payloads.

    Parameters
    ----------
    feeds, drains : sequences of :class:`Feed` / :class:`Drain`
    stall : float or (float, float)
        Probability that, before each transfer, a producer idles for a cycle / a consumer
        holds ``ready`` low for a cycle (repeatedly; geometric stall lengths).  A pair gives
        separate probabilities for producers and consumers.
    seed : int
        Seed of the stall generator; runs are reproducible.
    settle : int
        Cycles to keep the drains ready after their counts are reached, to catch surplus output.
    testbenches : callables ``async def tb(ctx)``
        Extra stimulus, run as background testbenches.

    Raises
    ------
    TimeoutError
        When a feed or a drain is still not done after ``max_cycles`` cycles.
    """
    in_stall, out_stall = stall if isinstance(stall, tuple) else (stall, stall)
    rng = random.Random(seed)
    outputs = [[] for _ in drains]
    extra = [[] for _ in drains]
    stamps = [[] for _ in drains]
    cycle = [0]

    sim = Simulator(dut)
    sim.add_clock(clock)

    async def count_cycles(ctx):
        async for _ in ctx.tick():
            cycle[0] += 1

    sim.add_testbench(count_cycles, background=True)

    def bits_of(port, payload):
        if isinstance(payload, int):
            return payload
        shape = port.payload.shape()
        if isinstance(shape, Shape):
            return int(payload)
        return shape.const(payload).as_bits()

    def producer(feed):
        payloads = [bits_of(feed.port, p) for p in feed.payloads]

        async def testbench(ctx):
            port = feed.port
            bits = Value.cast(port.payload)
            for payload in payloads:
                while in_stall and rng.random() < in_stall:
                    await ctx.tick()
                ctx.set(port.valid, 1)
                ctx.set(bits, payload)
                while True:
                    _, _, ready = await ctx.tick().sample(port.ready)
                    if ready:
                        break
                    if cycle[0] >= max_cycles:
                        raise TimeoutError(f"after {max_cycles} cycles a producer still has "
                                           f"payloads to send")
                ctx.set(port.valid, 0)
        return testbench

    def consumer(k, drain):
        async def testbench(ctx):
            port = drain.port
            bits = Value.cast(port.payload)       # sampled as an int: cheap in every cycle
            for n in range(drain.count):
                while out_stall and rng.random() < out_stall:
                    ctx.set(port.ready, 0)
                    await ctx.tick()
                ctx.set(port.ready, 1)
                while True:
                    _, _, valid, payload = await ctx.tick().sample(port.valid, bits)
                    if valid:
                        break
                    if cycle[0] >= max_cycles:
                        raise TimeoutError(f"after {max_cycles} cycles drain {k} has received "
                                           f"{n} of {drain.count} payloads")
                outputs[k].append(payload)
                stamps[k].append(cycle[0])
            finished = cycle[0]
            ctx.set(port.ready, 1)
            for _ in range(settle):
                _, _, valid, payload = await ctx.tick().sample(port.valid, bits)
                if valid:
                    extra[k].append(payload)
            ctx.set(port.ready, 0)
            stamps[k].append(finished)
        return testbench

    for feed in feeds:
        sim.add_testbench(producer(feed))
    for k, drain in enumerate(drains):
        sim.add_testbench(consumer(k, drain))
    for tb in testbenches:
        sim.add_testbench(tb, background=True)

    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    finish = max((s[-1] for s in stamps), default=cycle[0])
    return RunResult(outputs, extra, finish, [s[:-1] for s in stamps])
