"""InputDecoder (hdl/input_decoder.py) against the golden model's exact element decode.

Every 8-bit-or-smaller code of every type is checked in the default suite; the
16-bit types get a seeded sample there and an exhaustive sweep under
``@pytest.mark.slow``, the 32-bit types a special-heavy sample.  The reference
is ``ptocube.model.numeric.decode`` (float64, exact for every input value)
times the E8M0 scale, plus the spec's own decode vectors written out below.

The simulation helpers live in ``hdl_numeric_helpers.py`` (shared with ``test_hdl_fma.py``).
"""

import random

import numpy as np
import pytest
from amaranth.hdl import Module, Shape
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ptocube.hdl.input_decoder import InputDecoder
from ptocube.hdl.numeric_types import (FLOAT_FORMATS, INT_FORMATS, MATRIX_INPUT_TYPES,
                                       NumericConfig, count_leading_zeros)
from ptocube.model.datatype import DataType, MX_SCALED_TYPES, NumClass
from ptocube.model.numeric import decode

from hdl_numeric_helpers import (Flat, construction_error, expected_operand, lane_mask,
                                 operand_values, simulate, special_heavy_raws, unused)

FLOAT_TYPES = sorted(FLOAT_FORMATS)
INT_TYPES = sorted(INT_FORMATS)
SMALL_TYPES = [t for t in sorted(MATRIX_INPUT_TYPES) if t.bits <= 8]

CONFIGS = {
    "full": NumericConfig(),
    # FP8/FP6/FP4 only: a 4-bit significand and a narrow exponent.
    "fp8": NumericConfig(input_types={DataType.HiF8, DataType.E4M3, DataType.E5M2,
                                      DataType.E3M2, DataType.E2M3, DataType.E2M1X2,
                                      DataType.E1M2X2}),
    "half": NumericConfig(input_types={DataType.FP16, DataType.BF16, DataType.E5M2},
                          mx_scales=False),
    "int": NumericConfig(input_types={DataType.S16, DataType.S8, DataType.S4X2,
                                      DataType.U16, DataType.U8, DataType.U4X2}),
    "int8": NumericConfig(input_types={DataType.S8, DataType.U4X2}),
}


# ---------------------------------------------------------------------------
# Decoder test driver
# ---------------------------------------------------------------------------

def run_decoder(config: NumericConfig, vectors):
    """Decode ``vectors`` = [(dtype, raw, scale, scale_en)] and check every output."""
    dut = InputDecoder(config)
    flat = Flat(dut)
    words = [flat.pack(dtype=int(d), raw=r, scale=s, scale_en=e) for d, r, s, e in vectors]
    outs = [flat.unpack(w) for w in simulate(flat, words)]
    layout = config.float_layout if config.has_float else None

    by_type = {}
    for index, (dtype, raw, scale, scale_en) in enumerate(vectors):
        by_type.setdefault(dtype, []).append(index)
    for dtype, indices in by_type.items():
        raws = [vectors[i][1] for i in indices]
        got = [outs[i] for i in indices]
        legal = dtype in config.input_types
        assert all(o["legal"] == legal for o in got), f"legal flag for {dtype!r}"
        float_in = legal and dtype.num_class is NumClass.FLOAT
        int_in = legal and not float_in
        if layout is not None:
            fp = [layout.unpack(o["fp"]) for o in got]
            if float_in:
                values = operand_values(dtype, raws, [vectors[i][2] for i in indices],
                                        [vectors[i][3] and config.has_scale for i in indices])
                want = expected_operand(values, layout.sig_width)
            else:
                zeros = np.zeros(len(indices), dtype=np.int64)
                want = dict(sign=zeros, exp=zeros, sig=zeros, is_zero=zeros + 1,
                            is_inf=zeros, is_nan=zeros)
            for name, column in want.items():
                have = np.array([f[name] for f in fp], dtype=np.int64)
                bad = np.flatnonzero(have != column)
                assert not bad.size, (
                    f"{getattr(dtype, 'name', dtype)} raw={raws[bad[0]]:#x}: fp.{name} = "
                    f"{have[bad[0]]}, want {column[bad[0]]} ({bad.size} mismatches)")
        if config.has_int:
            width = config.int_width
            have = np.array([o["int_value"] - ((o["int_value"] >> (width - 1)) << width)
                             for o in got], dtype=np.int64)
            if int_in:
                want = decode(dtype, np.asarray(raws, dtype=np.uint64) & np.uint64(lane_mask(dtype)))
            else:
                want = np.zeros(len(indices), dtype=np.int64)
            bad = np.flatnonzero(have != want)
            assert not bad.size, (f"{dtype!r} raw={raws[bad[0]]:#x}: int_value = "
                                  f"{have[bad[0]]}, want {want[bad[0]]}")


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_small_code_of_every_type(name):
    # All 256 raw codes of every <= 8-bit type, built or not: bits above a
    # 4-bit lane and bits 7:6 of E3M2/E2M3 must be ignored; unbuilt types
    # decode to the +0 / 0 defaults with legal = 0.
    config = CONFIGS[name]
    vectors = [(t, raw, 0x7F, 0) for t in SMALL_TYPES for raw in range(256)]
    run_decoder(config, vectors)


@pytest.mark.parametrize("name", ["full", "half", "int"])
def test_sixteen_bit_types_sampled(name):
    rng = random.Random(16)
    vectors = []
    for dtype in (DataType.FP16, DataType.BF16, DataType.S16, DataType.U16):
        codes = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7C01,
                 0x7E00, 0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0x007F, 0x0080, 0x7FFF, 0xFFFF]
        codes += [rng.getrandbits(16) for _ in range(1500)]
        vectors += [(dtype, raw, 0x7F, 0) for raw in codes]
    run_decoder(CONFIGS[name], vectors)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16, DataType.S16, DataType.U16],
                         ids=lambda t: t.name)
def test_sixteen_bit_types_exhaustive(dtype):
    run_decoder(CONFIGS["full"], [(dtype, raw, 0x7F, 0) for raw in range(1 << 16)])


@pytest.mark.parametrize("count", [pytest.param(800, id="sample"),
                                   pytest.param(60_000, id="sweep", marks=pytest.mark.slow)])
def test_thirty_two_bit_types(count):
    # FP32 / TF32 / HF32, with random must-be-zero low bits on TF32/HF32 (R10).
    rng = random.Random(32)
    vectors = []
    for dtype in (DataType.FP32, DataType.TF32, DataType.HF32):
        vectors += [(dtype, raw, 0x7F, 0) for raw in special_heavy_raws(dtype, rng, count)]
    run_decoder(CONFIGS["full"], vectors)


@pytest.mark.parametrize("name", ["full", "fp8"])
def test_mx_scales(name):
    # Every scale on every scaled type (0xFF makes even a zero or a NaN
    # element NaN); unscaled types (FP16, BF16, ...) ignore scale and scale_en.
    rng = random.Random(8)
    config = CONFIGS[name]
    vectors = []
    for dtype in sorted(config.float_types):
        elements = [0, 1 << (dtype.bits - 1)] + [rng.getrandbits(dtype.bits) for _ in range(4)]
        if dtype in MX_SCALED_TYPES:
            scales = range(256)
        else:
            scales = [0x00, 0x7F, 0xFE, 0xFF] + [rng.getrandbits(8) for _ in range(4)]
        vectors += [(dtype, raw, scale, 1) for scale in scales for raw in elements]
        vectors += [(dtype, raw, rng.getrandbits(8), 0) for raw in elements]
    run_decoder(config, vectors)


#: (dtype, raw, E8M0 scale or None, exact value) decode vectors from the spec.
SPEC_DECODE_VECTORS = [
    # HiF8 anchors: +0, denormals 2^-22 / 2^-16, 1, 32768, +-inf, the NaN.
    (DataType.HiF8, 0x00, None, 0.0), (DataType.HiF8, 0x01, None, 2.0 ** -22),
    (DataType.HiF8, 0x07, None, 2.0 ** -16), (DataType.HiF8, 0x08, None, 1.0),
    (DataType.HiF8, 0x6E, None, 32768.0), (DataType.HiF8, 0x6F, None, np.inf),
    (DataType.HiF8, 0xEF, None, -np.inf), (DataType.HiF8, 0x80, None, np.nan),
    (DataType.E4M3, 0x01, None, 2.0 ** -9), (DataType.E4M3, 0x7E, None, 448.0),
    (DataType.E4M3, 0x7F, None, np.nan), (DataType.E5M2, 0x01, None, 2.0 ** -16),
    (DataType.E5M2, 0x7B, None, 57344.0), (DataType.E5M2, 0x7C, None, np.inf),
    (DataType.E5M2, 0x7E, None, np.nan), (DataType.E3M2, 0x01, None, 0.0625),
    (DataType.E3M2, 0x1F, None, 28.0), (DataType.E2M3, 0x01, None, 0.125),
    (DataType.E2M3, 0x1F, None, 7.5),
    # Packed byte 0x91: even lane = low nibble.
    (DataType.E2M1X2, 0x1, None, 0.5), (DataType.E2M1X2, 0x9, None, -0.5),
    (DataType.E1M2X2, 0x1, None, 0.25), (DataType.E1M2X2, 0x9, None, -0.25),
    # MX: 1.5 x E8M0 0x80 = 3.0; 0x00 is 2^-127, not zero; 0xFF is NaN.
    (DataType.E4M3, 0x3C, 0x80, 3.0), (DataType.E4M3, 0x38, 0x00, 2.0 ** -127),
    (DataType.E5M2, 0x3C, 0xFE, 2.0 ** 127), (DataType.E2M1X2, 0x0, 0xFF, np.nan),
    # Subnormal FP32 inputs are kept exactly (no DAZ), normalized.
    (DataType.FP32, 0x00000001, None, 2.0 ** -149), (DataType.FP32, 0x80400000, None, -2.0 ** -127),
    (DataType.FP16, 0x0001, None, 2.0 ** -24), (DataType.BF16, 0x0001, None, 2.0 ** -133),
]


def test_spec_decode_vectors():
    config = CONFIGS["full"]
    flat = Flat(InputDecoder(config))
    words = [flat.pack(dtype=int(dtype), raw=raw, scale=0x7F if scale is None else scale,
                       scale_en=scale is not None)
             for dtype, raw, scale, _ in SPEC_DECODE_VECTORS]
    for (dtype, raw, scale, value), word in zip(SPEC_DECODE_VECTORS, simulate(flat, words)):
        fp = config.float_layout.unpack(flat.unpack(word)["fp"])
        where = f"{dtype.name} {raw:#x} scale {scale}"
        if np.isnan(value):
            assert fp["is_nan"] == 1, where
        elif np.isinf(value):
            assert fp["is_inf"] == 1 and fp["sign"] == (value < 0), where
        elif value == 0:
            assert fp["is_zero"] == 1 and fp["sig"] == 0, where
        else:
            assert not (fp["is_nan"] or fp["is_inf"] or fp["is_zero"]), where
            assert fp["sig"] >> (config.sig_width - 1) == 1, where
            got = (-1) ** fp["sign"] * fp["sig"] * 2.0 ** (fp["exp"] - config.sig_width + 1)
            assert got == value, where


def test_integer_only_build_has_no_float_logic():
    dut = unused(InputDecoder(CONFIGS["int"]))
    assert "fp" not in dut.signature.members
    assert "scale" not in dut.signature.members
    assert Shape.cast(dut.signature.members["int_value"].shape) == Shape(17, signed=True)
    # The integer form is as wide as the widest built type needs (U8: 9 bits).
    assert NumericConfig(input_types={DataType.S8, DataType.U4X2}).int_width == 8
    assert NumericConfig(input_types={DataType.U8}).int_width == 9
    with pytest.raises(ValueError, match="no float operand"):
        CONFIGS["int"].float_layout


def test_float_only_build_has_no_integer_port():
    dut = unused(InputDecoder(CONFIGS["fp8"]))
    assert "int_value" not in dut.signature.members
    assert Shape.cast(dut.signature.members["raw"].shape) == Shape(8)
    layout = CONFIGS["fp8"].float_layout
    assert layout.sig_width == 4
    # E5M2 subnormals reach 2^-16; scales add -127..+127.
    assert CONFIGS["fp8"].exp_range == (-16 - 127, 15 + 127)


def test_sizes_follow_the_configuration():
    full = CONFIGS["full"]
    assert full.sig_width == 24 and full.raw_width == 32 and full.int_width == 17
    assert full.exp_range == (-149, 142)          # FP32 subnormal .. E5M2 max * 2^127
    assert full.float_layout.exp_width == 9
    assert CONFIGS["half"].sig_width == 11 and not CONFIGS["half"].has_scale


@pytest.mark.parametrize("kwargs,message", [
    (dict(input_types={DataType.S32}), "not Matrix input types: S32"),
    (dict(input_types={DataType.HiF4X2, DataType.FP16}), "HiF4X2"),
    (dict(input_types=set()), "at least one"),
    (dict(fma_stages=6), "fma_stages"),
    (dict(int_mac_stages=-1), "int_mac_stages"),
])
def test_bad_configuration_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NumericConfig(**kwargs)


def test_decoder_rejects_a_non_config():
    construction_error(TypeError, "NumericConfig",
                       lambda: InputDecoder({"input_types": {DataType.FP16}}))


@pytest.mark.parametrize("width", [1, 3, 8, 23, 77])
def test_count_leading_zeros(width):
    rng = random.Random(width)
    values = [0, (1 << width) - 1, 1, 1 << (width - 1)]
    values += [rng.getrandbits(width) >> rng.randrange(width) for _ in range(200)]

    class Clz(wiring.Component):
        value: In(width)
        count: Out(8)

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.count.eq(count_leading_zeros(m, self.value))
            return m

    flat = Flat(Clz())
    outs = simulate(flat, [flat.pack(value=v) for v in values])
    for value, out in zip(values, outs):
        assert flat.unpack(out)["count"] == width - value.bit_length(), value
