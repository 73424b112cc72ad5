"""Slow, exact reference arithmetic for the numeric tests (test-only).

Written from the format definitions (value formulas, field layouts, the HiF8 dot
scheme as the hardware profile words it) and not from ``model/numeric.py``, so
the two can check each other.  A value is a :class:`Val`: a finite magnitude as a
``Fraction`` with an explicit sign bit (so -0 exists), an infinity, or NaN.
Rounding to FP32 works on integers: find the binade, scale to an integer
significand, round half to even, re-normalise.
"""

from dataclasses import dataclass
from fractions import Fraction

from ptocube.model.datatype import DataType

__all__ = ["Val", "NAN", "POS_ZERO", "pow2", "ref_decode", "ref_int_decode", "ref_scale",
           "ref_mul", "round_f32_bits", "val_of_f32_bits", "f32_bits_of_val",
           "ref_fma", "ref_matmul_float", "ref_add_bias", "ref_matmul_int",
           "ref_matmul_pto_v0"]


@dataclass(frozen=True)
class Val:
    """An exact floating value: kind 'num' (mag >= 0 with sign neg), 'inf' or 'nan'."""
    kind: str
    mag: Fraction = Fraction(0)
    neg: bool = False

    @property
    def signed(self) -> Fraction:
        return -self.mag if self.neg else self.mag

    def is_zero(self) -> bool:
        return self.kind == "num" and self.mag == 0


NAN = Val("nan")
POS_ZERO = Val("num")


def pow2(e: int) -> Fraction:
    """2^e exactly, for any integer e."""
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)


def _num(value: Fraction, neg: bool | None = None) -> Val:
    if neg is None:
        neg = value < 0
    return Val("num", abs(value), neg)


# ---------------------------------------------------------------------------
# Decoders, from the format definitions
# ---------------------------------------------------------------------------

def _binary(raw: int, ebits: int, mbits: int, bias: int, specials: str) -> Val:
    """A sign/exponent/fraction format; ``specials`` is 'ieee', 'e4m3' or 'none'."""
    neg = bool(raw >> (ebits + mbits) & 1)
    e = raw >> mbits & ((1 << ebits) - 1)
    m = raw & ((1 << mbits) - 1)
    top = (1 << ebits) - 1
    if specials == "ieee" and e == top:
        return Val("inf", neg=neg) if m == 0 else NAN
    if specials == "e4m3" and e == top and m == (1 << mbits) - 1:
        return NAN
    if e == 0:
        return Val("num", Fraction(m, 1 << mbits) * pow2(1 - bias), neg)
    return Val("num", (1 + Fraction(m, 1 << mbits)) * pow2(e - bias), neg)


def _hif8(raw: int) -> Val:
    """HiF8 per the hardware profile: sign, dot prefix giving D, then D exponent bits
    (exponent sign then D-1 magnitude bits below an implicit 1), then the mantissa."""
    if raw == 0x80:
        return NAN
    neg = bool(raw & 0x80)
    if raw & 0x7F == 0x6F:
        return Val("inf", neg=neg)
    body = format(raw & 0x7F, "07b")                  # bits 6..0 as text, MSB first
    for prefix, d in (("0000", None), ("0001", 0), ("001", 1), ("01", 2), ("10", 3), ("11", 4)):
        if body.startswith(prefix):
            rest = body[len(prefix):]
            break
    if d is None:                                     # denormal: 2^(M-23), M = bits 2:0
        m = int(rest, 2)
        return Val("num", pow2(m - 23) if m else Fraction(0), neg if m else False)
    if d == 0:
        exponent = 0
    else:
        exp_sign, magnitude_bits = rest[0], rest[1:d]
        magnitude = int("1" + magnitude_bits, 2)
        exponent = -magnitude if exp_sign == "1" else magnitude
    mantissa_bits = rest[d:]
    mantissa = Fraction(int(mantissa_bits, 2), 1 << len(mantissa_bits))
    return Val("num", (1 + mantissa) * pow2(exponent), neg)


def ref_decode(dtype: DataType, raw: int) -> Val:
    """Exact value of one raw pattern of a floating DataType (one lane for X2 types)."""
    d = DataType
    if dtype == d.FP64:
        return _binary(raw, 11, 52, 1023, "ieee")
    if dtype == d.FP32:
        return _binary(raw, 8, 23, 127, "ieee")
    if dtype == d.TF32:                               # e8m10: fraction bits 22:13
        return _binary(raw & ~0x1FFF, 8, 23, 127, "ieee")
    if dtype == d.HF32:                               # e8m11: fraction bits 22:12
        return _binary(raw & ~0xFFF, 8, 23, 127, "ieee")
    if dtype == d.FP16:
        return _binary(raw, 5, 10, 15, "ieee")
    if dtype == d.BF16:
        return _binary(raw, 8, 7, 127, "ieee")
    if dtype == d.E4M3:
        return _binary(raw, 4, 3, 7, "e4m3")
    if dtype == d.E5M2:
        return _binary(raw, 5, 2, 15, "ieee")
    if dtype == d.E3M2:                               # 6-bit lane, bits 7:6 ignored
        return _binary(raw & 0x3F, 3, 2, 3, "none")
    if dtype == d.E2M3:
        return _binary(raw & 0x3F, 2, 3, 1, "none")
    if dtype == d.E2M1X2:
        return _binary(raw, 2, 1, 1, "none")
    if dtype in (d.E1M2X2, d.HiF4X2):
        return _binary(raw, 1, 2, 1, "none")
    if dtype == d.HiF8:
        return _hif8(raw)
    if dtype == d.E8M0:
        return NAN if raw == 0xFF else Val("num", pow2(raw - 127))
    raise ValueError(f"{dtype!r} is not a floating type")


def ref_int_decode(dtype: DataType, raw: int) -> int:
    """Two's complement (S types) or plain binary (U types) value of a raw pattern."""
    bits = dtype.bits
    if dtype.name.startswith("S") and raw >= 1 << (bits - 1):
        return raw - (1 << bits)
    return raw


def ref_scale(raw: int) -> Val:
    """The E8M0 scale factor 2^(raw-127), NaN for 0xFF."""
    return ref_decode(DataType.E8M0, raw)


# ---------------------------------------------------------------------------
# IEEE arithmetic on exact values, rounding once to FP32
# ---------------------------------------------------------------------------

def ref_mul(a: Val, b: Val) -> Val:
    """Exact product with IEEE specials (0 * inf is NaN)."""
    if a.kind == "nan" or b.kind == "nan":
        return NAN
    neg = a.neg != b.neg
    if a.kind == "inf" or b.kind == "inf":
        return NAN if a.is_zero() or b.is_zero() else Val("inf", neg=neg)
    return Val("num", a.mag * b.mag, neg)


def round_f32_bits(x: Fraction) -> int:
    """FP32 bits of RNE(x) for a nonzero exact x (overflow gives infinity)."""
    assert x != 0
    sign = 0x80000000 if x < 0 else 0
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if pow2(e) > m:
        e -= 1                                        # now 2^e <= m < 2^(e+1)
    q = max(e, -126) - 23                             # exponent of one unit in the last place
    scaled = m / pow2(q)
    n = scaled.numerator // scaled.denominator
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n == 1 << 24:                                  # rounding carried into the next binade
        n, q = n >> 1, q + 1
    if n >= 1 << 23:
        biased = q + 23 + 127
        if biased >= 255:
            return sign | 0x7F800000
        return sign | biased << 23 | (n - (1 << 23))
    return sign | n                                   # subnormal (or zero after rounding)


def val_of_f32_bits(bits: int) -> Val:
    return _binary(bits, 8, 23, 127, "ieee")


def f32_bits_of_val(v: Val) -> int:
    """FP32 bits of a value FP32 holds; NaN gives the canonical 0x7FC00000."""
    if v.kind == "nan":
        return 0x7FC00000
    sign = 0x80000000 if v.neg else 0
    if v.kind == "inf":
        return sign | 0x7F800000
    if v.mag == 0:
        return sign
    bits = round_f32_bits(v.signed)
    assert val_of_f32_bits(bits) == v, "value is not an FP32 value"
    return bits


def ref_fma(acc: Val, prod: Val) -> Val:
    """RNE_fp32(acc + prod) from the exact sum, with IEEE specials and signed zeros."""
    if acc.kind == "nan" or prod.kind == "nan":
        return NAN
    if acc.kind == "inf" and prod.kind == "inf":
        return acc if acc.neg == prod.neg else NAN
    if acc.kind == "inf":
        return acc
    if prod.kind == "inf":
        return prod
    total = acc.signed + prod.signed
    if total == 0:                                    # exact zero: +0 unless both are -0
        return Val("num", Fraction(0), acc.neg and prod.neg)
    return val_of_f32_bits(round_f32_bits(total))


def ref_matmul_float(a_raw, a_type, b_raw, b_type, acc0_bits=None,
                     a_scale=None, b_scale=None):
    """FP32 bits of the sequential per-term FMA chain, from raw inputs (nested lists)."""
    m, k, n = len(a_raw), len(b_raw), len(b_raw[0]) if b_raw else 0
    a = [[ref_decode(a_type, a_raw[i][kk]) for kk in range(k)] for i in range(m)]
    b = [[ref_decode(b_type, b_raw[kk][j]) for j in range(n)] for kk in range(k)]
    if a_scale is not None:
        a = [[ref_mul(a[i][kk], ref_scale(a_scale[i][kk // 32])) for kk in range(k)]
             for i in range(m)]
    if b_scale is not None:
        b = [[ref_mul(b[kk][j], ref_scale(b_scale[kk // 32][j])) for j in range(n)]
             for kk in range(k)]
    out = []
    for i in range(m):
        row = []
        for j in range(n):
            acc = POS_ZERO if acc0_bits is None else val_of_f32_bits(acc0_bits[i][j])
            for kk in range(k):
                acc = ref_fma(acc, ref_mul(a[i][kk], b[kk][j]))
            row.append(f32_bits_of_val(acc))
        out.append(row)
    return out


def ref_add_bias(acc_bits, bias_bits):
    """FP32 bits of acc[i][j] + bias[j], one RNE add each."""
    return [[f32_bits_of_val(ref_fma(val_of_f32_bits(v), val_of_f32_bits(bias_bits[j])))
             for j, v in enumerate(row)] for row in acc_bits]


def ref_matmul_int(a, b, acc0=None, bias=None):
    """S32/U32 bit patterns of an integer product with Python big integers, mod 2^32."""
    out = []
    for i, row in enumerate(a):
        out_row = []
        for j in range(len(b[0])):
            total = sum(row[kk] * b[kk][j] for kk in range(len(b)))
            total += acc0[i][j] if acc0 is not None else 0
            total += bias[j] if bias is not None else 0
            out_row.append(total % (1 << 32))
        out.append(out_row)
    return out


def ref_matmul_pto_v0(a, b, acc0=None, a_scale=None, b_scale=None):
    """The raw-carrier hooks on Python integers: acc + (a*sa)*(b*sb) mod 2^64."""
    mod = 1 << 64
    out = []
    for i, row in enumerate(a):
        out_row = []
        for j in range(len(b[0])):
            acc = acc0[i][j] if acc0 is not None else 0
            for kk in range(len(b)):
                left = row[kk] * (a_scale[i][kk // 32] if a_scale is not None else 1) % mod
                right = b[kk][j] * (b_scale[kk // 32][j] if b_scale is not None else 1) % mod
                acc = (acc + left * right) % mod
            out_row.append(acc)
        out.append(out_row)
    return out
