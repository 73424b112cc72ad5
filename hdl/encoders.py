"""Per-element B.FPATR conversion: raw accumulator P -> D element bit pattern and flags.

:class:`ElementConverter` is the numeric heart of
:class:`~ptocube.hdl.postprocess.PostProcess`, the hardware twin of the per-element part of
:func:`ptocube.model.postprocess.postprocess` (activation, special values, the S5/S9/S17
intermediate clamp, offsets, the shift modes and the destination encoders of
:mod:`ptocube.model.convert`).

The idea: every finite input of the post-process is an exact product
``v = (-1)**sign * M * 2**E`` of the source magnitude (an FP32 significand or an S32/U32
magnitude, at most 32 bits) and the FP19 multiplier's 11-bit significand, so ``M`` has at most
43 bits.  Every destination rounds ``v`` once to a *quantum* ``2**q``:

* integers (the S5/S9/S17 intermediates and S32): ``q = 0``;
* FP32/FP16/BF16/E4M3: ``q = max(e, emin) - p`` with ``e`` the exponent of ``v``'s leading
  one, ``p`` the fraction bits and ``emin`` the minimum normal exponent;
* HiF8: the same with a tapered ``p(e)`` (3 bits near 1.0 down to 0 for its denormals),
  taken from the model's HiF8 code table at elaboration.

One right shifter with sticky collection turns ``M`` into the truncated quantum count ``n``
and its guard and sticky bits; one rounding decision (:func:`round_up`) gives ``n + up``, and
small per-format packers build the bit pattern.  Stages (one register between each):

A0. unpack P, select the multiplier (activation); the bypass results (bit copy, shift
    modes, NaN/infinity table, the -0 rule) are finished here;
A. multiply;
B. leading-zero count of ``M``, exponent of ``v``, quantum and shift amount;
C1, C2. the sticky right shifter (steps of 16..64, then of 1..8);
D1. rounding, and the count's compares with the S5/S9/S17 and S32 limits;
D2. the intermediate clamp;
E. integer sign and offset, floating packers, result select.

``docs/hdl-postprocess.md`` has the widths and their derivations.
"""

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from ..model.convert import (Flag, RMode, Special, encode_special, fp8_value_table,
                             signed_zero)
from ..model.datatype import DataType, NumClass
from .logic import or_tree
from .numeric_types import count_leading_zeros, pipeline_boundary

__all__ = ["SrcKind", "OutKind", "OUT_KIND_OF", "INTERMEDIATE_WIDTH", "ConvControl", "HIF8_BINADES",
           "HIF8_ROUNDINGS",
           "round_up", "ElementConverter"]

_NV, _OF, _UF, _NX = int(Flag.NV), int(Flag.OF), int(Flag.UF), int(Flag.NX)


class SrcKind(enum.Enum, shape=2):
    """Class of the raw accumulator (the post-process source; always the accumulator type)."""

    FP32 = 0
    S32 = 1
    U32 = 2


class OutKind(enum.Enum, shape=4):
    """The destination encoder that produces D (U32 D is always a bit copy, so it has none)."""

    FP32 = 0
    FP16 = 1
    BF16 = 2
    E4M3 = 3
    HIF8 = 4
    S4 = 5
    S8 = 6
    S16 = 7
    S32 = 8


#: D element type -> encoder.
OUT_KIND_OF = {
    DataType.FP32: OutKind.FP32, DataType.FP16: OutKind.FP16, DataType.BF16: OutKind.BF16,
    DataType.E4M3: OutKind.E4M3, DataType.HiF8: OutKind.HIF8, DataType.S4X2: OutKind.S4,
    DataType.S8: OutKind.S8, DataType.S16: OutKind.S16, DataType.S32: OutKind.S32,
}
_DTYPE_OF = {kind: dtype for dtype, kind in OUT_KIND_OF.items()}

#: Integer encoders fed by an S5/S9/S17 intermediate: kind -> intermediate width w.  D has
#: w - 1 bits, and the mode's offset field is w bits wide (checked against the mode table by
#: :class:`~ptocube.hdl.postprocess.PostProcess`).
INTERMEDIATE_WIDTH = {OutKind.S4: 5, OutKind.S8: 9, OutKind.S16: 17}

#: IEEE-style encoders: kind -> (fraction bits p, minimum normal exponent, bias, width).
_IEEE = {OutKind.FP32: (23, -126, 127, 32), OutKind.FP16: (10, -14, 15, 16),
         OutKind.BF16: (7, -126, 127, 16)}

# E4M3 is IEEE-packed (p = 3, bias 7) with its own overflow rule: |v| > 448 overflows before
# rounding, so 448 = 1.75 * 2**8 (exponent 8, significand 14/8) is the last finite value.
_E4M3_P, _E4M3_EMIN, _E4M3_BIAS, _E4M3_EMAX, _E4M3_MAX_SIG = 3, -6, 7, 8, 14
_E4M3_MAX_CODE, _E4M3_OVERFLOW_CODE = 0x7E, 0x7F
_HIF8_MAX_CODE, _HIF8_INF_CODE = 0x6E, 0x6F


class ConvControl(data.StructLayout):
    """Operation-wide controls of the converter, decoded from the plan by PostProcess.

    ``src``: accumulator class; ``out``: D encoder; ``copy``: D = P bit for bit (mode 0
    without activation, or a U32 accumulator, which is never negative); ``shift``: the
    VSHIFTS322S16/SHIFTS322S16 path; ``relu``: ReluMode; ``rounding``: the effective
    rounding, an :class:`~ptocube.model.convert.RMode` code 1..7 (never NONE); ``sat``.
    """

    def __init__(self):
        super().__init__({"src": SrcKind, "out": OutKind, "copy": 1, "shift": 1, "relu": 2,
                          "rounding": 3, "sat": 1})


def _hif8_binades() -> dict:
    """HiF8 as a tapered binary format: exponent -> (code of 2**e, fraction bits there).

    Derived from the model's code table: in each binade [2**e, 2**(e+1)) the positive codes
    must be consecutive, start at the code of 2**e and number a power of two.  The hardware
    relies on that shape, so a table that breaks it fails elaboration.
    """
    values = fp8_value_table(DataType.HiF8)
    binades = {}
    for code in range(1, 0x80):
        v = float(values[code])
        if not math.isfinite(v):
            continue
        e = math.frexp(v)[1] - 1                  # 2**e <= v < 2**(e+1)
        binades.setdefault(e, []).append((v, code))
    table = {}
    for e, entries in sorted(binades.items()):
        entries.sort()
        codes = [c for _, c in entries]
        count = len(codes)
        p = count.bit_length() - 1
        if (1 << p != count or entries[0][0] != 2.0 ** e
                or codes != list(range(codes[0], codes[0] + count))
                or any(v != 2.0 ** e * (1 + i / count) for i, (v, _) in enumerate(entries))):
            raise AssertionError(f"HiF8 binade 2**{e} is not a tapered binary binade")
        table[e] = (codes[0], p)
    if sorted(table) != list(range(min(table), max(table) + 1)):
        raise AssertionError("HiF8 binades are not contiguous")
    return table


#: HiF8 binades: exponent (-22..15) -> (code of 2**e, fraction bits).
HIF8_BINADES = _hif8_binades()
_HIF8_EMIN = min(HIF8_BINADES)                 # smallest denormal, 2**-22
_HIF8_EMAX = max(HIF8_BINADES)                 # 2**15 = 32768, the largest finite value
_HIF8_MIN_NORMAL_EXP = -15                     # UF below 2**-15 (model: _FP8 min_normal)

#: Roundings the HiF8 encoder supports.  In the 0-fraction binades the count's parity is not
#: the code's, so RNE and RTO (which look at parity) would need the code; every HiF8 mode
#: fixes RHB, and PostProcess refuses to elaborate a mode table that breaks this.
HIF8_ROUNDINGS = frozenset({RMode.RTZ, RMode.RDN, RMode.RUP, RMode.RNA, RMode.RHB})


def round_up(m: Module, rounding: Value, neg: Value, lsb: Value, guard: Value,
             sticky: Value) -> Value:
    """1 when a truncated magnitude must be incremented, for every resolved RMode.

    ``neg`` is the sign of the exact value, ``lsb`` the parity of the truncated result's
    code, ``guard`` the first dropped bit and ``sticky`` the OR of the rest.  Directed modes
    mirror for negative values; RHB ties go toward +inf (the smaller magnitude when
    negative); RTO forces an odd result when inexact.
    """
    inexact = guard | sticky
    up = Signal(name="round_up")
    with m.Switch(rounding):
        with m.Case(RMode.RNE):
            m.d.comb += up.eq(guard & (sticky | lsb))
        with m.Case(RMode.RDN):
            m.d.comb += up.eq(neg & inexact)
        with m.Case(RMode.RUP):
            m.d.comb += up.eq(~neg & inexact)
        with m.Case(RMode.RNA):
            m.d.comb += up.eq(guard)
        with m.Case(RMode.RTO):
            m.d.comb += up.eq(~lsb & inexact)
        with m.Case(RMode.RHB):
            m.d.comb += up.eq(guard & (sticky | ~neg))
        # RTZ (and the unused NONE code): truncate.
    return up


def _wire(m: Module, name: str, value) -> Signal:
    """A named combinational signal holding ``value``."""
    sig = Signal(Value.cast(value).shape(), name=name)
    m.d.comb += sig.eq(value)
    return sig


def _at_least(value, c: int):
    """``value >= c`` for a signed ``value`` and a constant ``0 < c < 128``, as equality
    decodes of its low seven bits in two parts (LUTs, not a carry chain per constant)."""
    low_hi, low_lo = value[4:7], value[0:4]
    above = Cat(*(low_hi == v for v in range((c >> 4) + 1, 8))).any()
    within = (low_hi == c >> 4) & Cat(*(low_lo == v for v in range(c & 15, 16))).any()
    return ~value[-1] & (value[7:-1].any() | above | within)


def _smax(a, b):
    return Mux(a > b, a, b)


def _at_least_1(e):
    """max(e, 1) for an unsigned ``e``, without a compare's carry chain."""
    return Cat(e[0] | (e == 0), e[1:])


class ElementConverter(wiring.Component):
    """One post-processed D element per cycle, bit-exact with the golden model.

    Parameters
    ----------
    sources : set of SrcKind
        Accumulator classes built.
    out_kinds : set of OutKind
        Destination encoders built (an integer-only build lists no floating kind and gets no
        floating logic).
    shift : bool
        Build the shift-mode path.

    Members
    -------
    ctl : In(ConvControl)
        Operation controls; must hold still while elements are in flight.
    p : In(32)
        Raw accumulator element.
    quant : In(64)
        The element's quantization word (scalar word, its column's vector word, or FP32 1.0
        for modes without a parameter): FP19 scale in bits[31:13], signed offset from bit
        37, shift code in bits[35:32].  It must be legal for the mode (preflight).
    alpha : In(19)
        The element's FP19 LReLU/PReLU parameter (+0 or positive normal).
    d : Out(32)
        Raw D element, right-aligned (an S4 lane in bits 3:0), ``latency`` cycles later.
    flags : Out(5)
        The element's NV/DZ/OF/UF/NX flags (:class:`~ptocube.model.convert.Flag`).

    The unit has no stall input: the sync domain must be gated from outside (PostProcess
    wraps it in an ``EnableInserter``).
    """

    #: Cycles from ``p`` to ``d`` (registers after the input and stages A0, A, B, C1, C2,
    #: D1 and D2).
    latency = 8

    def __init__(self, sources, out_kinds, shift: bool):
        self.sources = frozenset(SrcKind(s) for s in sources)
        # In code order, not a set's: the encoders are elaborated in this order, and a set of
        # enum members iterates in an order that changes with Python's string hashing from
        # one process to the next, which gave nextpnr a different netlist for every build.
        self.out_kinds = tuple(sorted({OutKind(k) for k in out_kinds}, key=lambda k: k.value))
        self.shift = bool(shift)
        super().__init__({"ctl": In(ConvControl()), "p": In(32), "quant": In(64),
                          "alpha": In(19), "d": Out(32), "flags": Out(5)})

    def _has(self, *kinds) -> bool:
        return any(k in self.out_kinds for k in kinds)

    @property
    def float_kinds(self) -> tuple:
        """The floating destination encoders built, in code order."""
        return tuple(k for k in self.out_kinds if _DTYPE_OF[k].num_class is NumClass.FLOAT)

    def elaborate(self, platform):
        m = Module()
        # One sub-module per stage: pysim then re-evaluates only the stage a change reaches.
        stages = {name: Module() for name in ("input", "unpack", "multiply", "normalize",
                                              "shift", "shift_fine", "round", "clamp",
                                              "encode")}
        for name, stage in stages.items():
            m.submodules[name] = stage
        # The element and the controls enter through registers: neither the source's
        # multiplexers (the result path's serializer) nor the plan's decode reach into stage
        # A0, and every later stage reads the controls from this one register (they hold
        # still while elements are in flight, so it is loaded with the first element).
        s_in = pipeline_boundary(stages["input"], True, "in", ctl=self.ctl, p=self.p,
                                 quant=self.quant, alpha=self.alpha)
        ctl = s_in["ctl"]
        s0 = self._unpack(stages["unpack"], ctl, s_in)
        s1 = self._multiply(stages["multiply"], s0)
        s2 = self._normalize(stages["normalize"], ctl, s1)
        s3 = self._shift(stages["shift"], stages["shift_fine"], s2)
        s4 = self._round(stages["round"], stages["clamp"], ctl, s3)
        self._encode(stages["encode"], ctl, s4)
        return m

    # --- stages A0 and A --------------------------------------------------------------

    def _unpack(self, m, ctl, s):
        p, quant = s["p"], s["quant"]
        fp = ctl.src == SrcKind.FP32 if SrcKind.FP32 in self.sources else Const(0)
        s32 = ctl.src == SrcKind.S32 if SrcKind.S32 in self.sources else Const(0)
        exp, frac, sign_bit = p[23:31], p[0:23], p[31]
        exp_max = exp == 0xFF
        nan = _wire(m, "nan", fp & exp_max & (frac != 0))
        inf = _wire(m, "inf", fp & exp_max & (frac == 0))
        # "Negative" selects the activation multiplier: -normal, -subnormal, -inf and -0 for
        # FP32, value < 0 for S32, never for U32.  (A NaN's sign is irrelevant: every NaN
        # takes the special path.)
        negative = _wire(m, "negative", Mux(fp, sign_bit, s32 & sign_bit))
        src_mag = Signal(32)
        src_exp = Signal(signed(9))
        m.d.comb += src_mag.eq(p)                        # U32
        with m.If(fp):
            # Infinities carry magnitude 0: they reach the finite path only as -inf * 0.
            m.d.comb += [src_mag.eq(Mux(exp_max, 0, Cat(frac, exp != 0))),
                         src_exp.eq(_at_least_1(exp) - 150)]
        with m.Elif(s32):
            m.d.comb += src_mag.eq(abs(p.as_signed()))  # |INT_MIN| = 2**31 fits unsigned

        # Activation picks the multiplier before the single conversion: alpha (or 0 for
        # ReLU) replaces the scale for negative inputs.
        scale19, alpha19 = quant[13:32], s["alpha"]
        # Both candidates' significand, zero test and exponent term are formed beside the
        # choice, which then selects among finished values (issue #9); ReLU's multiplier 0
        # has significand 0 and exponent term 1 - 137.
        candidates = []
        for word in (scale19, alpha19):
            sig = Cat(word[0:10], word[10:18] != 0)
            candidates.append((sig, sig == 0, _at_least_1(word[10:18]) - 137))
        (s_sig, s_zero, s_exp), (a_sig, a_zero, a_exp) = candidates
        activated = negative & (ctl.relu != 0)
        use_zero = activated & (ctl.relu == 1)
        use_alpha = activated & (ctl.relu != 1)
        m_sig = Mux(use_zero, 0, Mux(use_alpha, a_sig, s_sig))
        mult_zero = _wire(m, "mult_zero", use_zero | Mux(use_alpha, a_zero, s_zero))
        exponent = _wire(m, "exponent", src_exp + Mux(use_zero, 1 - 137,
                                                      Mux(use_alpha, a_exp, s_exp)))

        offset = Signal(signed(17))
        for kind, width in INTERMEDIATE_WIDTH.items():
            if kind in self.out_kinds:
                with m.If(ctl.out == kind):
                    m.d.comb += offset.eq(quant[37:37 + width].as_signed())

        # Results that bypass the arithmetic, in priority order.
        bypass = Signal()
        bypass_raw = Signal(32)
        bypass_flags = Signal(5)
        special = nan | (inf & ~(sign_bit & mult_zero))
        neg_zero = fp & sign_bit & (exp == 0) & (frac == 0)
        float_out = Signal()
        for kind in self.float_kinds:
            with m.If(ctl.out == kind):
                m.d.comb += float_out.eq(1)
        extra = {}
        with m.If(ctl.copy):
            m.d.comb += [bypass.eq(1), bypass_raw.eq(p)]
        if self.shift:
            with m.Elif(ctl.shift):
                # ASR by 1..16 rounds toward -inf with no NX.  The S16 saturation is stage
                # A's: here the shifted word goes into bypass_raw whole.
                shifting = extra["shifting"] = Signal()
                m.d.comb += [bypass.eq(1), shifting.eq(1),
                             bypass_raw.eq((p.as_signed() >> 1) >> quant[32:36])]
        if SrcKind.FP32 in self.sources:
            with m.Elif(special):
                m.d.comb += bypass.eq(1)
                self._special_table(m, ctl, nan, frac[22], sign_bit, bypass_raw, bypass_flags)
            with m.Elif(neg_zero & ~mult_zero & float_out):
                # An FP32 -0 keeps its sign in a floating D (HiF8 has a single zero).
                m.d.comb += bypass.eq(1)
                for kind in self.float_kinds:
                    with m.If(ctl.out == kind):
                        m.d.comb += bypass_raw.eq(signed_zero(_DTYPE_OF[kind]))

        return pipeline_boundary(m, True, "a0", src_mag=src_mag, m_sig=m_sig,
                                 exponent=exponent, sign=negative, offset=offset,
                                 bypass=bypass, bypass_raw=bypass_raw,
                                 bypass_flags=bypass_flags, **extra)

    def _multiply(self, m, s):
        # The 32 x 11 product (two MULT18X18D and an adder) from registers, so that neither
        # the source's absolute value nor the activation's choice of multiplier reaches
        # into it (decision 14 of docs/decisions/hdl-postprocess.md).
        product = _wire(m, "product", s["src_mag"] * s["m_sig"])   # 43 bits, exact
        passed = {key: s[key] for key in ("exponent", "sign", "offset", "bypass",
                                          "bypass_raw", "bypass_flags")}
        if "shifting" in s:
            # A shift mode's result saturates to S16 (OF and NX) unless the shifted word's
            # bits 31..15 are all its sign.
            shifting, raw = s["shifting"], s["bypass_raw"]
            over = _wire(m, "shift_over", shifting & (raw[15:32] != 0) & ~raw[15:32].all())
            passed["bypass_raw"] = Mux(over, Mux(raw[31], 0x8000, 0x7FFF),
                                       Mux(shifting, raw[0:16], raw))
            passed["bypass_flags"] = Mux(over, _OF | _NX, s["bypass_flags"])
        return pipeline_boundary(m, True, "a", product=product, **passed)

    def _special_table(self, m, ctl, nan, quiet, sign_bit, raw, flags):
        """NaN/infinity results, from the model's ``encode_special`` at elaboration."""
        for kind in self.out_kinds:
            dtype = _DTYPE_OF[kind]
            with m.If(ctl.out == kind):
                for sat in (0, 1):
                    cases = {k: encode_special(k, dtype, sat) for k in Special}
                    # Quiet and signaling NaNs differ only in their flags.
                    assert cases[Special.QNAN][0] == cases[Special.SNAN][0]
                    with m.If(ctl.sat == sat):
                        with m.If(nan):
                            m.d.comb += [raw.eq(cases[Special.QNAN][0]),
                                         flags.eq(Mux(quiet, cases[Special.QNAN][1],
                                                      cases[Special.SNAN][1]))]
                        with m.Else():
                            m.d.comb += [raw.eq(Mux(sign_bit, cases[Special.NEG_INF][0],
                                                    cases[Special.POS_INF][0])),
                                         flags.eq(Mux(sign_bit, cases[Special.NEG_INF][1],
                                                      cases[Special.POS_INF][1]))]

    # --- stage B ------------------------------------------------------------------------

    def _normalize(self, m, ctl, s):
        product, exponent = s["product"], s["exponent"]
        zero = _wire(m, "zero", product == 0)
        lead = _wire(m, "lead", 42 - count_leading_zeros(m, product, "pclz"))
        # Exponent of v's leading one (meaningless when zero).
        e_v = _wire(m, "e_v", (exponent + lead).as_signed())
        quantum = Signal(signed(11))               # integers: q = 0
        for kind, (p, emin, _, _) in _IEEE.items():
            if kind in self.out_kinds:
                with m.If(ctl.out == kind):
                    m.d.comb += quantum.eq(_smax(e_v, emin) - p)
        if OutKind.E4M3 in self.out_kinds:
            with m.If(ctl.out == OutKind.E4M3):
                m.d.comb += quantum.eq(_smax(e_v, _E4M3_EMIN) - _E4M3_P)
        extra = {}
        if OutKind.HIF8 in self.out_kinds:
            # HiF8's fraction bits depend on the binade of v (above 2**15 the value
            # overflows whatever the quantum, and p stays 0).
            e_h = _wire(m, "hif8_e", _smax(e_v, _HIF8_EMIN))
            bits = Signal(2, name="hif8_bits")
            with m.Switch(e_h):
                for e, (_, p) in HIF8_BINADES.items():
                    with m.Case(e):
                        m.d.comb += bits.eq(p)
            with m.If(ctl.out == OutKind.HIF8):
                m.d.comb += quantum.eq(e_h - bits)
            extra["hif8_bits"] = bits
        # M is pre-extended by 32 zero bits in stage C, so a right shift by t = 32 + q - E
        # keeps the bits of weight >= 2**q.  t < 0 (an integer v = M * 2**E with E > 32) is
        # clamped to 0: M * 2**32 has the same zero low 33 bits and is just as surely
        # >= 2**33, since E > 32 needs an FP19 multiplier above 2**42, a normal one with an
        # 11-bit significand, so M >= 1024.  Shifts beyond the 77-bit word all look alike.
        amount = _wire(m, "amount", (32 + quantum - exponent).as_signed())
        clamped = _wire(m, "clamped", Mux(amount < 0, 0, Mux(amount > 127, 127, amount))[0:7])
        # Which of M's bits stage C1's sticky and ``big`` ORs take: the compares of the
        # clamped amount with constants, registered beside it (issue #9).  Each is the same
        # compare on the unclamped amount (the constants lie within 1..127; bit 0 is never
        # above the amount), built from its bits rather than as a subtraction per constant.
        sticky_from = Cat(*(_at_least(amount, i + 34) for i in range(len(product))))
        big_from = Cat(Const(0, 1), *(~_at_least(amount, i) for i in range(1, len(product))))
        return pipeline_boundary(m, True, "b", product=product, amount=clamped,
                                 sticky_from=sticky_from, big_from=big_from,
                                 zero=zero, e_v=e_v, sign=s["sign"],
                                 offset=s["offset"], bypass=s["bypass"], bypass_raw=s["bypass_raw"],
                                 bypass_flags=s["bypass_flags"], **extra)

    # --- stage C ------------------------------------------------------------------------

    def _shift(self, m, fine, s):
        # word = M * 2**32, with two more bits below for the guard and the last sticky bit.
        word = Cat(Const(0, 34), s["product"])
        # Sticky is the OR of the word's bits 0..amount (those shifted out and the last
        # bit): M's bit i is word bit 34 + i.  The bits of n from 33 up (``big``: beyond
        # every integer range) are word bits from 35 + amount up, M's bits above amount.
        # Both are ORs of M's bits under per-bit compares of the amount with constants
        # (made in stage B), not a count of M's trailing or leading zeros before the
        # shifter (issue #9).
        product = s["product"]
        sticky = _wire(m, "sticky", (product & s["sticky_from"]).any())
        big = _wire(m, "big", (product & s["big_from"]).any())
        # The shifter is two stages (C1: the steps of 16, 32 and 64; C2: 1 to 8), so that
        # neither is seven multiplexers deep (issue #9).
        for k in range(4, 7):
            step = 1 << k
            word = _wire(m, f"word{k}", Mux(s["amount"][k], word[step:], word))
        # Integers need the low 33 bits and ``big``; floating counts have at most 25 bits.
        passed = {key: s[key] for key in ("zero", "e_v", "sign", "offset", "bypass",
                                          "bypass_raw", "bypass_flags", "hif8_bits") if key in s}
        # The fine steps shift the word right by at most 15: its bits above 35 + 15 reach
        # n's bits above 33 only, which no encoder reads.
        c1 = pipeline_boundary(m, True, "c1", word=word[:35 + 15], fine=s["amount"][:4],
                               big=big, sticky=sticky, **passed)
        word = c1["word"]
        for k in range(4):
            step = 1 << k
            word = _wire(fine, f"word{k}", Mux(c1["fine"][k], word[step:], word))
        n = word[2:]
        count, guard = n[:33], word[1]
        passed = {key: c1[key] for key in passed}
        return pipeline_boundary(fine, True, "c", count=count, big=c1["big"], guard=guard,
                                 sticky=c1["sticky"], **passed)

    # --- stage D ------------------------------------------------------------------------

    def _round(self, m, clamp_stage, ctl, s):
        # Rounding is a 34-bit carry chain and the intermediate clamp a compare on its
        # result; the sign, offset and packers after them are stage E's (decision 13 of
        # docs/decisions/hdl-postprocess.md).  D1 rounds and compares the count with the
        # limits, D2 decides the clamp from those registers (issue #9).
        n, guard, sticky, sign = s["count"], s["guard"], s["sticky"], s["sign"]
        inexact = _wire(m, "inexact", guard | sticky)
        # The count's parity is the truncated code's for every encoder that meets a
        # parity-based rounding (RNE, RTO); HiF8 never does (see HIF8_ROUNDINGS).
        up = round_up(m, ctl.rounding, sign, n[0], guard, sticky)
        rounded = _wire(m, "rounded", n + up)              # 34 bits

        compares = {}
        if self._has(OutKind.S32):
            compares.update(s32_gt=n > (1 << 31), s32_eq=n == (1 << 31),
                            s32_below=n == (1 << 31) - 1)
        if self._has(*INTERMEDIATE_WIDTH):
            # ``ctl.out`` is one kind: each compare is an OR of the kinds' (a one-hot
            # selection, not a priority chain of multiplexers after the compares).
            picks = {"mid_limit": [], "mid_gt": [], "mid_eq": [], "mid_below": []}
            for kind, width in INTERMEDIATE_WIDTH.items():
                if kind in self.out_kinds:
                    chosen = ctl.out == kind
                    top = 1 << (width - 1)               # the limit, 2**(w-1)
                    for key, value in (("mid_limit", Const(top, 18)), ("mid_gt", n > top),
                                       ("mid_eq", n == top), ("mid_below", n == top - 1)):
                        picks[key].append(Mux(chosen, value, 0))
            for key, values in picks.items():
                compares[key] = _wire(m, key, or_tree(values))
        passed = {key: s[key] for key in ("count", "zero", "e_v", "sign", "offset", "bypass",
                                          "bypass_raw", "bypass_flags", "hif8_bits")
                  if key in s}
        d1 = pipeline_boundary(m, True, "d1", rounded=rounded, inexact=inexact, up=up,
                               big=s["big"], **compares, **passed)
        sign, up = d1["sign"], d1["up"]

        def beyond(gt, eq, below):
            # rounded > (sign ? limit : limit - 1) from n's compares with the limit (``gt``,
            # ``eq``) and limit - 1 (``below``), beside the rounding add: n + up > T when
            # n > T, or n = T and up.
            return d1["big"] | Mux(sign, gt | (eq & up), gt | eq | (below & up))

        extra = {}
        if self._has(OutKind.S32):
            extra["s32_over"] = beyond(d1["s32_gt"], d1["s32_eq"], d1["s32_below"])
        if self._has(*INTERMEDIATE_WIDTH):
            clamp = _wire(clamp_stage, "mid_clamp",
                          beyond(d1["mid_gt"], d1["mid_eq"], d1["mid_below"]))
            limit = d1["mid_limit"]
            extra["mid_clamp"] = clamp
            magnitude = Mux(clamp, Mux(sign, limit, limit - 1), d1["rounded"][0:18])
            # The offset is added here, beside the clamp, so that stage E starts from the
            # total: its range test, Sat choice and the result select would otherwise follow
            # the adder (issue #9).  offset +/- magnitude as two adders side by side rather
            # than a negation before one.
            extra["mid_total"] = Mux(sign, d1["offset"] - magnitude, d1["offset"] + magnitude)
        passed = {key: d1[key] for key in passed}
        return pipeline_boundary(clamp_stage, True, "d", rounded=d1["rounded"],
                                 inexact=d1["inexact"], **passed, **extra)

    # --- stage E ------------------------------------------------------------------------

    def _encode(self, m, ctl, s):
        rounded, inexact = s["rounded"], s["inexact"]
        raw = Signal(32)
        flags = Signal(5)
        results = {}
        if self._has(OutKind.S32):
            results[OutKind.S32] = self._encode_s32(s, rounded, inexact)
        if self._has(*INTERMEDIATE_WIDTH):
            results.update(self._encode_intermediate(m, ctl, s, inexact))
        for kind, fmt in _IEEE.items():
            if kind in self.out_kinds:
                results[kind] = self._encode_ieee(m, ctl, kind, fmt, s, rounded, inexact)
        if self._has(OutKind.E4M3):
            results[OutKind.E4M3] = self._encode_e4m3(m, ctl, s, rounded, inexact)
        if self._has(OutKind.HIF8):
            results[OutKind.HIF8] = self._encode_hif8(m, ctl, s, rounded, inexact)
        with m.Switch(ctl.out):
            for kind, (k_raw, k_flags) in results.items():
                with m.Case(kind):
                    m.d.comb += [raw.eq(k_raw), flags.eq(k_flags)]
        m.d.comb += [self.d.eq(Mux(s["bypass"], s["bypass_raw"], raw)),
                     self.flags.eq(Mux(s["bypass"], s["bypass_flags"], flags))]

    def _encode_s32(self, s, rounded, inexact):
        """Mode 0 with activation on an S32 accumulator: round, then wrap.

        Mode 0 is the only mode with an S32 D and it requires Sat 0 (ruling R8), so an
        overflow always wraps to the low 32 bits.
        """
        raw = Mux(s["sign"], -rounded, rounded)[0:32]
        return raw, Mux(s["s32_over"], _OF | _NX, Mux(inexact, _NX, 0))

    def _encode_intermediate(self, m, ctl, s, inexact):
        """S4/S8/S16: clamped to S5/S9/S17 and the offset added (stage D), encode with Sat."""
        clamp, total = s["mid_clamp"], s["mid_total"]
        f1 = Mux(clamp, _OF | _NX, Mux(inexact, _NX, 0))
        results = {}
        for kind, width in INTERMEDIATE_WIDTH.items():
            if kind in self.out_kinds:
                bits = width - 1
                lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
                # |magnitude| <= 2**(w-1) and the offset is a w-bit signed field, so the
                # total fits w + 1 signed bits: it is outside lo..hi exactly when its bits
                # w..bits-1 are not all equal (no compare chains).
                top = total[bits - 1:width + 1]
                over = (top != 0) & ~top.all()
                clamped = Mux(total[-1], lo & ((1 << bits) - 1), hi)
                raw = Mux(over & ctl.sat, clamped, total[0:bits])
                results[kind] = (raw, f1 | Mux(over, _OF | _NX, 0))
        return results

    def _float_flags(self, zero, over, inexact, tiny):
        return Mux(zero, 0, Mux(over, _OF | _NX, Mux(inexact, Mux(tiny, _UF | _NX, _NX), 0)))

    def _encode_ieee(self, m, ctl, kind, fmt, s, rounded, inexact):
        """FP32/FP16/BF16: pack the rounded count; overflow gives inf in every mode."""
        p, emin, bias, width = fmt
        name = kind.name.lower()
        sign, e_v, zero = s["sign"], s["e_v"], s["zero"]
        count = rounded[0:p + 2]
        carry = count[p + 1]
        # A subnormal's count may round up to 2**p: the packed sum then lands on the
        # minimum normal by itself, as does a normal's carry onto the next exponent.
        biased = Mux(e_v < emin, 0, (e_v + (bias - 1))[0:width - 1 - p])
        mag = _wire(m, f"{name}_mag", (Cat(Const(0, p), biased) + count)[0:width - 1])
        over = _wire(m, f"{name}_over", (e_v > bias) | ((e_v == bias) & carry))
        inf = ((2 * bias + 1) << p)
        top = Mux(ctl.sat, inf - 1, inf)
        body = Mux(zero, 0, Mux(over, top, mag))[0:width - 1]
        raw = Cat(body, sign & ~zero)
        return raw, self._float_flags(zero, over, inexact, e_v < emin)

    def _encode_e4m3(self, m, ctl, s, rounded, inexact):
        """E4M3: IEEE packing, overflow above 448 before rounding, zero is always 0x00."""
        sign, e_v, zero, n = s["sign"], s["e_v"], s["zero"], s["count"]
        sig = n[0:_E4M3_P + 1]
        over = _wire(m, "e4m3_over", (e_v > _E4M3_EMAX) | (
            (e_v == _E4M3_EMAX) & ((sig > _E4M3_MAX_SIG) | ((sig == _E4M3_MAX_SIG) & inexact))))
        biased = Mux(e_v < _E4M3_EMIN, 0, (e_v + (_E4M3_BIAS - 1))[0:4])
        mag = _wire(m, "e4m3_mag", (Cat(Const(0, _E4M3_P), biased)
                                    + rounded[0:_E4M3_P + 2])[0:7])
        top = Mux(ctl.sat, Cat(Const(_E4M3_MAX_CODE, 7), sign), _E4M3_OVERFLOW_CODE)
        # The nearest-code search of the model always returns +0 for a zero result.
        raw = Mux(zero, 0, Mux(over, top, Mux(mag == 0, 0, Cat(mag, sign))))
        return raw, self._float_flags(zero, over, inexact, e_v < _E4M3_EMIN)

    def _encode_hif8(self, m, ctl, s, rounded, inexact):
        """HiF8: round in the binade of v, carry into the next binade, look the code up."""
        sign, e_v, zero, n = s["sign"], s["e_v"], s["zero"], s["count"]
        e_h = _wire(m, "hif8_eh", _smax(e_v, _HIF8_EMIN))
        bits = s["hif8_bits"]
        count = rounded[0:5]
        carry = Signal(name="hif8_carry")
        frac = Signal(3, name="hif8_rfrac")
        with m.Switch(bits):
            for p in range(4):
                with m.Case(p):
                    m.d.comb += carry.eq(count[p + 1])
                    if p:
                        m.d.comb += frac.eq(count[0:p])
        e_r = _wire(m, "hif8_er", e_h + carry)
        base_r = Signal(7, name="hif8_base_r")
        with m.Switch(e_r):
            for e, (code, _) in HIF8_BINADES.items():
                with m.Case(e):
                    m.d.comb += base_r.eq(code)
        # Below the smallest denormal the quantum is 2**-22 and the count (0 or 1) is the code.
        code = _wire(m, "hif8_code", Mux(e_v < _HIF8_EMIN, count[0:7], base_r | frac))
        top_bits = HIF8_BINADES[_HIF8_EMAX][1]
        # |v| > 32768 overflows before rounding (32768 = 2**15 has a zero fraction).
        over = _wire(m, "hif8_over", (e_v > _HIF8_EMAX) | (
            (e_v == _HIF8_EMAX) & ((n[0:top_bits] != 0) | inexact)))
        top = Cat(Mux(ctl.sat, _HIF8_MAX_CODE, _HIF8_INF_CODE)[0:7], sign)
        raw = Mux(zero, 0, Mux(over, top, Mux(code == 0, 0, Cat(code, sign))))
        return raw, self._float_flags(zero, over, inexact, e_v < _HIF8_MIN_NORMAL_EXP)
