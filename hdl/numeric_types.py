"""Internal operand forms and elaboration parameters of the numeric datapath.

Every processing element multiplies two Matrix input elements and adds the
exact product to an accumulator.  The input elements arrive in a dozen storage
formats; :class:`~ptocube.hdl.input_decoder.InputDecoder` turns each into one of
two internal forms defined here:

* the **float operand** (:class:`FloatOperandLayout`): sign, unbiased exponent,
  normalized significand with its hidden bit made explicit, and the three
  class flags ``is_zero``/``is_inf``/``is_nan``.  The value of a finite
  nonzero operand is ``(-1)**sign * sig * 2**(exp - (sig_width - 1))`` with
  ``sig``'s top bit set;
* the **integer operand**: a two's complement ``signed(int_width)`` value.

:class:`NumericConfig` chooses at elaboration time which input types are
built; the widths of both forms follow from that choice (an FP8-only build
carries a 4-bit significand, an integer-only build has no float logic at all).

The module also holds two small datapath helpers shared by the units:
:func:`count_leading_zeros` and :func:`pipeline_boundary`.
"""

from dataclasses import dataclass, field

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed, unsigned
from amaranth.lib import data

from ..model.datatype import (DataType, MX_MATRIX_TYPES, MX_SCALED_TYPES,
                              NumClass, ORDINARY_MATRIX_TYPES)

__all__ = ["NumericConfig", "FloatOperandLayout", "FloatFormat", "FLOAT_FORMATS",
           "INT_FORMATS", "MATRIX_INPUT_TYPES", "FP32_BIAS", "FP32_FRAC_BITS",
           "FP32_EMIN_SUBNORMAL", "E8M0_BIAS", "E8M0_NAN", "count_leading_zeros",
           "pipeline_boundary"]

#: Every DataType a Matrix operation accepts as an A or B input.
MATRIX_INPUT_TYPES = ORDINARY_MATRIX_TYPES | MX_MATRIX_TYPES

FP32_BIAS = 127
FP32_FRAC_BITS = 23
#: Exponent of the least significant bit of an FP32 subnormal (2**-149).
FP32_EMIN_SUBNORMAL = 1 - FP32_BIAS - FP32_FRAC_BITS

#: An E8M0 scale ``raw`` means 2**(raw - E8M0_BIAS); E8M0_NAN means NaN.
E8M0_BIAS = 127
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class FloatFormat:
    """Bit fields of one floating input format (an element or a 4-bit lane).

    ``specials`` names how the format spends its top codes:
    ``"ieee"`` (all-ones exponent: zero fraction is infinity, else NaN),
    ``"e4m3"`` (only S.1111.111 is NaN, no infinity), ``"finite"`` (every
    code is a number) or ``"hif8"`` (HiF8's tapered encoding, which ignores
    the exponent/fraction fields below and is decoded by its own logic).
    """

    sign_bit: int
    exp_lsb: int
    exp_bits: int
    frac_bits: int
    bias: int
    specials: str

    @property
    def precision(self) -> int:
        """Significand bits including the hidden bit."""
        return self.frac_bits + 1

    @property
    def exp_range(self) -> tuple[int, int]:
        """(min, max) unbiased exponent of a *normalized* nonzero finite value.

        The minimum is that of the smallest subnormal once its leading one is
        shifted to the hidden-bit position.
        """
        if self.specials == "hif8":
            return (-22, 15)  # denormals 2**-22..2**-16; D4 reaches 2**15
        top = (1 << self.exp_bits) - 1
        emax_field = top - 1 if self.specials == "ieee" else top
        return (1 - self.bias - self.frac_bits, emax_field - self.bias)


#: Field layout of every floating Matrix input type (the lane of a packed X2
#: type is given in the low nibble; TF32/HF32/E3M2/E2M3 list only their
#: defined bits, so must-be-zero bits are ignored, ruling R10).
FLOAT_FORMATS = {
    DataType.FP32: FloatFormat(31, 23, 8, 23, 127, "ieee"),
    DataType.TF32: FloatFormat(31, 23, 8, 10, 127, "ieee"),
    DataType.HF32: FloatFormat(31, 23, 8, 11, 127, "ieee"),
    DataType.FP16: FloatFormat(15, 10, 5, 10, 15, "ieee"),
    DataType.BF16: FloatFormat(15, 7, 8, 7, 127, "ieee"),
    DataType.HiF8: FloatFormat(7, 0, 0, 3, 0, "hif8"),
    DataType.E4M3: FloatFormat(7, 3, 4, 3, 7, "e4m3"),
    DataType.E5M2: FloatFormat(7, 2, 5, 2, 15, "ieee"),
    DataType.E3M2: FloatFormat(5, 2, 3, 2, 3, "finite"),
    DataType.E2M3: FloatFormat(5, 3, 2, 3, 1, "finite"),
    DataType.E2M1X2: FloatFormat(3, 1, 2, 1, 1, "finite"),
    DataType.E1M2X2: FloatFormat(3, 2, 1, 2, 1, "finite"),
}

#: (bits, signed) of every integer Matrix input type (a 4-bit lane for the X2 types).
INT_FORMATS = {
    DataType.S16: (16, True), DataType.S8: (8, True), DataType.S4X2: (4, True),
    DataType.U16: (16, False), DataType.U8: (8, False), DataType.U4X2: (4, False),
}


def _signed_width(lo: int, hi: int) -> int:
    """Bits of the narrowest two's complement type holding lo..hi."""
    width = 1
    while not (-(1 << (width - 1)) <= lo and hi < (1 << (width - 1))):
        width += 1
    return width


class FloatOperandLayout(data.StructLayout):
    """The internal float operand: ``lib.data`` layout produced by the decoder.

    Members (least significant first): ``sig`` (unsigned, ``sig_width``),
    ``exp`` (signed, ``exp_width``), ``sign``, ``is_zero``, ``is_inf``,
    ``is_nan``.  A finite nonzero value is
    ``(-1)**sign * sig * 2**(exp - (sig_width - 1))`` with ``sig``'s top bit
    set.  For zero, infinity and NaN, ``sig`` and ``exp`` are 0; a zero or
    infinity keeps its sign and a NaN has sign 0.
    """

    def __init__(self, sig_width: int, exp_width: int):
        self.sig_width = sig_width
        self.exp_width = exp_width
        super().__init__({
            "sig": unsigned(sig_width), "exp": signed(exp_width), "sign": 1,
            "is_zero": 1, "is_inf": 1, "is_nan": 1,
        })

    def pack(self, *, sign=0, exp=0, sig=0, is_zero=0, is_inf=0, is_nan=0) -> int:
        """The bit pattern of one operand (for testbenches driving the FMA)."""
        fields = dict(sign=sign, exp=exp, sig=sig, is_zero=is_zero,
                      is_inf=is_inf, is_nan=is_nan)
        bits = 0
        for name, value in fields.items():
            member = self[name]
            bits |= (value & ((1 << member.width) - 1)) << member.offset
        return bits

    def unpack(self, bits: int) -> dict:
        """Inverse of :meth:`pack`: a dict of plain ints (``exp`` signed)."""
        out = {}
        for name, member in self:
            value = (bits >> member.offset) & ((1 << member.width) - 1)
            if Shape.cast(member.shape).signed and value >> (member.width - 1):
                value -= 1 << member.width
            out[name] = value
        return out


@dataclass(frozen=True)
class NumericConfig:
    """Elaboration parameters of the numeric units of a processing element.

    ``input_types``: the Matrix input DataTypes the hardware decodes (a
    subset of :data:`MATRIX_INPUT_TYPES`).  Float logic is built only if a
    floating type is present, integer logic only if an integer type is.
    ``mx_scales``: build the E8M0 scale inputs (effective only if a scaled
    MX type, E4M3/E5M2/E2M1X2/E1M2X2, is built).
    ``fma_stages``: latency of :class:`~ptocube.hdl.fma.Fma32` in cycles,
    0 (combinational) to 5.
    ``int_mac_stages``: latency of :class:`~ptocube.hdl.int_mac.IntMac`, 0 to 2.
    ``int_product_register``: IntMac registers its product before the accumulator
    (the multiplier's pipeline register) without lengthening the accumulation
    loop; integer-only builds.
    ``dsp_primitives``: ``None`` (the multiplier is ``*``) or ``"ecp5"`` (with
    ``int_product_register``: an explicit MULT18X18D with its input and output
    registers, see :class:`~ptocube.hdl.int_mac.IntMac`).
    """

    input_types: frozenset = field(default=MATRIX_INPUT_TYPES)
    mx_scales: bool = True
    fma_stages: int = 3
    int_mac_stages: int = 1
    int_product_register: bool = False
    dsp_primitives: str | None = None

    def __post_init__(self):
        types = frozenset(DataType(t) for t in self.input_types)
        object.__setattr__(self, "input_types", types)
        if not types:
            raise ValueError("NumericConfig needs at least one input type")
        bad = types - MATRIX_INPUT_TYPES
        if bad:
            names = ", ".join(sorted(t.name for t in bad))
            raise ValueError(f"not Matrix input types: {names}")
        if not 0 <= self.fma_stages <= 5:
            raise ValueError(f"fma_stages must be 0..5, not {self.fma_stages}")
        if not 0 <= self.int_mac_stages <= 2:
            raise ValueError(f"int_mac_stages must be 0..2, not {self.int_mac_stages}")
        if self.int_product_register and self.has_float:
            # A float build pads the integer MAC to the FMA's length instead.
            raise ValueError("int_product_register is for integer-only builds")
        if self.dsp_primitives not in (None, "ecp5"):
            raise ValueError(f"dsp_primitives must be None or 'ecp5', not "
                             f"{self.dsp_primitives!r}")
        if self.dsp_primitives is not None and not self.int_product_register:
            # The primitive's registers are the operand and product registers.
            raise ValueError("dsp_primitives needs int_product_register")

    @classmethod
    def from_cube_config(cls, cube) -> "NumericConfig":
        """The numeric part of a :class:`~ptocube.hdl.config.CubeConfig`.

        Its ``float_types``/``int_types`` flags select whole type classes and
        ``mx_types`` the E8M0 scale inputs.
        """
        types = frozenset()
        if cube.float_types:
            types |= {t for t in MATRIX_INPUT_TYPES if t.num_class is NumClass.FLOAT}
        if cube.int_types:
            types |= {t for t in MATRIX_INPUT_TYPES if t.num_class is not NumClass.FLOAT}
        return cls(input_types=types, mx_scales=cube.mx_types, fma_stages=cube.fma_stages,
                   int_product_register=cube.int_product_register,
                   dsp_primitives=cube.dsp_primitives)

    @property
    def float_types(self) -> frozenset:
        """The floating input types built."""
        return frozenset(t for t in self.input_types if t.num_class is NumClass.FLOAT)

    @property
    def int_types(self) -> frozenset:
        """The integer input types built."""
        return self.input_types - self.float_types

    @property
    def has_float(self) -> bool:
        """True when float logic (decoder float path, Fma32) is built."""
        return bool(self.float_types)

    @property
    def has_int(self) -> bool:
        """True when integer logic (decoder integer path, IntMac) is built."""
        return bool(self.int_types)

    @property
    def has_scale(self) -> bool:
        """True when the decoder gets ``scale``/``scale_en`` inputs."""
        return self.mx_scales and bool(self.input_types & MX_SCALED_TYPES)

    @property
    def raw_width(self) -> int:
        """Width of the decoder's raw element input."""
        return max(t.bits for t in self.input_types)

    @property
    def sig_width(self) -> int:
        """Significand width of the float operand (hidden bit included)."""
        return max(FLOAT_FORMATS[t].precision for t in self.float_types)

    @property
    def exp_range(self) -> tuple[int, int]:
        """(min, max) exponent a decoded float operand can carry, MX scale included."""
        lo, hi = 0, 0
        for t in self.float_types:
            tlo, thi = FLOAT_FORMATS[t].exp_range
            if self.has_scale and t in MX_SCALED_TYPES:
                tlo, thi = tlo - E8M0_BIAS, thi + (E8M0_NAN - 1 - E8M0_BIAS)
            lo, hi = min(lo, tlo), max(hi, thi)
        return lo, hi

    @property
    def float_layout(self) -> FloatOperandLayout:
        """The :class:`FloatOperandLayout` of this build."""
        if not self.has_float:
            raise ValueError("an integer-only NumericConfig has no float operand")
        return FloatOperandLayout(self.sig_width, _signed_width(*self.exp_range))

    @property
    def int_width(self) -> int:
        """Width of the signed integer operand (an unsigned type needs one bit more)."""
        if not self.has_int:
            raise ValueError("a float-only NumericConfig has no integer operand")
        return max(bits + (0 if is_signed else 1)
                   for bits, is_signed in (INT_FORMATS[t] for t in self.int_types))


def count_leading_zeros(m: Module, value: Value, name: str = "clz") -> Value:
    """Leading zeros of ``value`` (its width when it is all zero), as a log-depth tree.

    The operand is padded at the bottom with at least one 1 up to a power of
    two, so the count stops at the true width without a separate zero test.
    Every third tree level is kept in named signals (driven in ``m``): the
    hardware is the same, but the simulator then compiles small expressions
    instead of one deep tree, which it does in quadratic time.
    """
    value = Value.cast(value)
    width = len(value)
    size = 2
    while size < width + 1:
        size *= 2
    padded = Cat(Const((1 << (size - width)) - 1, size - width), value)
    # chunks[i] = (all_zero, leading zeros) of padded bits [i*w, (i+1)*w)
    chunks = [(~padded[i], Const(0, 0)) for i in range(size)]
    level = 0
    while len(chunks) > 1:
        level += 1
        merged = []
        for lo, hi in zip(chunks[0::2], chunks[1::2]):
            zero = hi[0] & lo[0]
            count = Mux(hi[0], Cat(lo[1], Const(1, 1)), Cat(hi[1], Const(0, 1)))
            if level % 3 == 0 and len(chunks) > 2:
                zero_sig = Signal(name=f"{name}_z{level}_{len(merged)}")
                count_sig = Signal(level, name=f"{name}_c{level}_{len(merged)}")
                m.d.comb += [zero_sig.eq(zero), count_sig.eq(count)]
                zero, count = zero_sig, count_sig
            merged.append((zero, count))
        chunks = merged
    return chunks[0][1]


def pipeline_boundary(m: Module, registered: bool, stage: str, **values) -> dict:
    """Pass ``values`` to the next stage, through a register if ``registered``.

    Returns a dict of fresh signals (named ``<stage>_<key>``) with the shapes
    of the given values or ``lib.data`` views; an unregistered boundary is a
    plain wire, so the same stage code serves every pipeline depth.
    """
    domain = m.d.sync if registered else m.d.comb
    out = {}
    for key, value in values.items():
        if isinstance(value, data.View):
            sig = Signal(value.shape(), name=f"{stage}_{key}")
        else:
            sig = Signal(Value.cast(value).shape(), name=f"{stage}_{key}")
        domain += sig.eq(value)
        out[key] = sig
    return out
