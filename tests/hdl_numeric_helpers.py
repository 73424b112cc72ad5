"""Simulation helpers of the numeric hardware tests (test-only).

:class:`Flat` packs a component's inputs into one word and its outputs into another so a
testbench settles the simulator once per vector; :func:`simulate` drives such words;
:func:`operand_values` and :func:`expected_operand` give the exact operands an input decoder must
produce; :func:`special_heavy_raws` draws float codes biased to the hard cases.  Shared by
``test_hdl_input_decoder.py`` and ``test_hdl_fma.py``.
"""

import gc
import random
import warnings

import numpy as np
import pytest
from amaranth.hdl import Cat, Module, Shape, UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from ptocube.hdl.numeric_types import FLOAT_FORMATS
from ptocube.model.datatype import DataType, MX_SCALED_TYPES
from ptocube.model.numeric import decode


class Flat(wiring.Component):
    """Wraps a component so that all its inputs form one word and all outputs another.

    One ``ctx.set`` per vector means one simulator settle per vector, which
    is what makes pysim fast enough for thousands of vectors.  Members are
    packed in signature order, least significant first.
    """

    def __init__(self, dut):
        self.dut = dut
        self.in_fields, self.out_fields = {}, {}
        for path, member, _ in dut.signature.flatten(dut):
            name = path[0]
            fields = self.in_fields if member.flow == In else self.out_fields
            fields[name] = Shape.cast(member.shape).width
        super().__init__({"vec_in": In(sum(self.in_fields.values())),
                          "vec_out": Out(sum(self.out_fields.values()))})

    def _port(self, name):
        port = getattr(self.dut, name)
        return port.as_value() if hasattr(port, "as_value") else port

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        offset = 0
        for name, width in self.in_fields.items():
            m.d.comb += self._port(name).eq(self.vec_in[offset:offset + width])
            offset += width
        m.d.comb += self.vec_out.eq(Cat(*(self._port(name) for name in self.out_fields)))
        return m

    @staticmethod
    def _pack(fields, values):
        word, offset = 0, 0
        for name, width in fields.items():
            word |= (values.get(name, 0) & ((1 << width) - 1)) << offset
            offset += width
        return word

    @staticmethod
    def _unpack(fields, word):
        out, offset = {}, 0
        for name, width in fields.items():
            out[name] = (word >> offset) & ((1 << width) - 1)
            offset += width
        return out

    def pack(self, **values) -> int:
        """The input word for the given member values (missing ones are 0)."""
        return self._pack(self.in_fields, values)

    def unpack(self, word: int) -> dict:
        """The output members (unsigned ints) of one output word."""
        return self._unpack(self.out_fields, word)


def simulate(flat: Flat, words, latency: int = 0) -> list:
    """Drive one input word per clock and return the output word of each, in order."""
    outputs = []

    async def bench(ctx):
        for cycle in range(len(words) + latency):
            if cycle < len(words):
                ctx.set(flat.vec_in, words[cycle])
            if cycle >= latency:
                outputs.append(ctx.get(flat.vec_out))    # the word of cycle - latency
            if latency:
                await ctx.tick()

    sim = Simulator(flat)
    if latency:
        sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return outputs


def construction_error(exc_type, match: str, factory):
    """Assert that ``factory()`` raises; hide the half-built component's unused warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc_type, match=match):
            factory()
        gc.collect()


def unused(elaboratable):
    """Silence Amaranth's 'created but never used' warning for a signature-only check."""
    elaboratable._MustUse__silence = True
    return elaboratable


def lane_mask(dtype: DataType) -> int:
    """Bits of the raw input that carry the element (the rest is ignored)."""
    return (1 << dtype.bits) - 1


def operand_values(dtype, raws, scales=None, scale_en=None) -> np.ndarray:
    """Exact float64 value of each decoded operand, E8M0 scale applied (NaN for NaN)."""
    raws = np.asarray(raws, dtype=np.uint64) & np.uint64(lane_mask(dtype))
    values = decode(dtype, raws)
    if dtype in MX_SCALED_TYPES and scales is not None:
        scales = np.asarray(scales, dtype=np.int64)
        on = np.asarray(scale_en, dtype=bool) & np.ones(len(values), dtype=bool)
        with np.errstate(invalid="ignore"):
            scaled = np.ldexp(values, np.where(scales == 0xFF, 0, scales - 127))
        values = np.where(on, np.where(scales == 0xFF, np.nan, scaled), values)
    return values


def expected_operand(values: np.ndarray, sig_width: int) -> dict:
    """The float operand fields the decoder must produce for exact ``values``."""
    nan = np.isnan(values)
    inf = np.isinf(values)
    zero = values == 0
    finite = ~(nan | inf | zero)
    mant, expo = np.frexp(np.where(finite, np.abs(values), 1.0))   # |v| = mant * 2**expo
    sig = np.ldexp(mant, sig_width).astype(np.int64)
    if not np.array_equal(np.ldexp(sig.astype(np.float64), -sig_width), mant):
        raise AssertionError("a reference value has more significant bits than sig_width")
    return {
        "sign": np.where(nan, 0, np.signbit(values)).astype(np.int64),
        "exp": np.where(finite, expo - 1, 0).astype(np.int64),
        "sig": np.where(finite, sig, 0),
        "is_zero": zero.astype(np.int64), "is_inf": inf.astype(np.int64),
        "is_nan": nan.astype(np.int64),
    }


def special_heavy_raws(dtype: DataType, rng: random.Random, count: int) -> list:
    """Raw codes of a 16/32-bit float type biased to zeros, specials, subnormals, extremes."""
    fmt = FLOAT_FORMATS[dtype]
    exp_top = (1 << fmt.exp_bits) - 1
    out = []
    for _ in range(count):
        sign = rng.getrandbits(1)
        pick = rng.random()
        if pick < 0.25:
            exp = rng.choice([0, exp_top])                # zero/subnormal/inf/NaN
        elif pick < 0.45:
            exp = rng.choice([1, 2, exp_top - 1])         # extreme normals
        else:
            exp = rng.randrange(exp_top + 1)
        frac_bits = fmt.exp_lsb                           # incl. ignored low bits (R10)
        frac = rng.getrandbits(frac_bits) if rng.random() < 0.8 else rng.choice([0, 1])
        out.append((sign << fmt.sign_bit) | (exp << fmt.exp_lsb) | frac)
    return out
