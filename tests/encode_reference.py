"""Independent reference encoders for the destination conversions (test-only).

They work on exact rationals (fractions.Fraction) and are written from the spec's *rules*
(digest §5.7/§5.8, hardware numeric profile), not from the model's algorithm: they bracket the
value between two representable neighbours and pick one by the rounding mode's definition, and
the narrow floats use a literal scan over all 256 codes.  ``test_convert.py`` checks the model's
encoders against them and ``test_postprocess.py`` builds its per-element reference on them.
"""

import math
from fractions import Fraction as Q

import ml_dtypes
import numpy as np

from ptocube.model.convert import Flag, RMode, resolve_rmode
from ptocube.model.datatype import DataType as T

NV, OF, UF, NX = int(Flag.NV), int(Flag.OF), int(Flag.UF), int(Flag.NX)
MODES = [RMode.RNE, RMode.RTZ, RMode.RDN, RMode.RUP, RMode.RNA, RMode.RTO, RMode.RHB]


def ref_round(q: Q, mode: RMode) -> int:
    """Round a rational to an integer by the definition of each mode."""
    lo = math.floor(q)
    if q == lo:
        return lo
    hi = lo + 1
    half = q - lo
    if mode is RMode.RTZ:
        return lo if q > 0 else hi
    if mode is RMode.RDN:
        return lo
    if mode is RMode.RUP:
        return hi
    if mode is RMode.RTO:
        return lo if lo % 2 else hi
    if half != Q(1, 2):
        return lo if half < Q(1, 2) else hi
    return {RMode.RNE: lo if lo % 2 == 0 else hi,
            RMode.RNA: hi if q > 0 else lo,
            RMode.RHB: hi}[mode]


def ref_int(q: Q, dtype: T, mode: RMode, sat: bool) -> tuple[int, int]:
    """Integer destination: round first, then clamp (Sat) or wrap; OF|NX / NX."""
    bits = dtype.bits
    signed = dtype.name.startswith("S")
    lo, hi = (-(1 << bits - 1), (1 << bits - 1) - 1) if signed else (0, (1 << bits) - 1)
    r = ref_round(q, mode)
    if lo <= r <= hi:
        return r % (1 << bits), (NX if r != q else 0)
    if sat:
        r = lo if r < lo else hi
    return r % (1 << bits), OF | NX


def ilog2(q: Q) -> int:
    """floor(log2(q)) of a positive rational."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e if Q(2) ** e <= q else e - 1


IEEE = {T.FP32: (23, -126, 127, 32), T.FP16: (10, -14, 15, 16), T.BF16: (7, -126, 127, 16)}


def ref_ieee(q: Q, dtype: T, mode: RMode, sat: bool) -> tuple[int, int]:
    """FP32/FP16/BF16 from exact q: bracket by neighbours, pick, apply overflow rules."""
    p, emin, emax, bits = IEEE[dtype]
    if q == 0:
        return 0, 0
    sign = (1 << bits - 1) if q < 0 else 0
    a = abs(q)
    inf = (2 * emax + 1) << p
    if a >= Q(2) ** (emax + 1):                      # exponent above emax: overflow in any mode
        return sign | ((inf - 1) if sat else inf), OF | NX
    e = max(ilog2(a), emin)
    quantum = Q(2) ** (e - p)                        # spacing around a (emin quantum below)
    k = math.floor(a / quantum)
    down, up = k * quantum, (k + 1) * quantum         # magnitude neighbours
    if down == a:
        chosen = down
    else:
        # Round the signed value: for a negative q the magnitude "down" is toward +inf.
        toward_plus_inf = up if q > 0 else down
        toward_minus_inf = down if q > 0 else up
        dist_down, dist_up = a - down, up - a
        if mode is RMode.RTZ:
            chosen = down
        elif mode is RMode.RUP:
            chosen = toward_plus_inf
        elif mode is RMode.RDN:
            chosen = toward_minus_inf
        elif mode is RMode.RTO:
            chosen = down if k % 2 else up
        elif dist_down != dist_up:
            chosen = down if dist_down < dist_up else up
        elif mode is RMode.RNE:
            chosen = down if k % 2 == 0 else up
        elif mode is RMode.RNA:
            chosen = up
        else:                                         # RHB: numerically greater
            chosen = toward_plus_inf
    if chosen == 0:
        mag = 0
    else:
        ce = ilog2(chosen)
        if chosen < Q(2) ** emin:
            mag = int(chosen / Q(2) ** (emin - p))
        else:
            mag = ((ce + emax) << p) | int(chosen / Q(2) ** (ce - p) - (1 << p))
    if mag >= inf:                                    # rounding carried past the largest binade
        return sign | ((inf - 1) if sat else inf), OF | NX
    if chosen == a:
        return sign | mag, 0
    return sign | mag, (UF | NX) if a < Q(2) ** emin else NX


def hif8_table_from_prefixes() -> list:
    """HiF8 code values decoded from the profile's dot-prefix description."""
    fields = [("0000", None, 3), ("0001", 0, 3), ("001", 1, 3), ("01", 2, 3), ("10", 3, 2),
              ("11", 4, 1)]
    table = []
    for code in range(256):
        if code == 0x80:
            table.append("nan")
            continue
        if code in (0x6F, 0xEF):
            table.append("inf")
            continue
        body = format(code & 0x7F, "07b")
        prefix, d, mbits = next(f for f in fields if body.startswith(f[0]))
        rest = body[len(prefix):]
        mant = int(rest[-mbits:], 2)
        if d is None:                                  # denormal: 2^(M-23); M = 0 is zero
            mag = Q(0) if mant == 0 else Q(2) ** (mant - 23)
        else:
            if d == 0:
                exponent = 0
            else:
                ebits = rest[:d]                       # sign bit, then d-1 magnitude bits
                magnitude = int("1" + ebits[1:], 2)    # implicit leading magnitude bit
                exponent = -magnitude if ebits[0] == "1" else magnitude
            mag = (1 + Q(mant, 1 << mbits)) * Q(2) ** exponent
        table.append(-mag if code & 0x80 else mag)
    return table


def e4m3_table_from_ml_dtypes() -> list:
    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return ["nan" if np.isnan(v) else Q(float(v)) for v in vals]


FP8 = {  # value table, largest finite, smallest normal, code of +max, Sat-0 overflow codes (+, -)
    T.E4M3: (e4m3_table_from_ml_dtypes(), Q(448), Q(2) ** -6, 0x7E, (0x7F, 0x7F)),
    T.HiF8: (hif8_table_from_prefixes(), Q(32768), Q(2) ** -15, 0x6E, (0x6F, 0xEF)),
}


#: Every value the FP8 tests use is a multiple of 2^-FP8_SCALE_BITS (post-process
#: products are multiples of 2^-285: FP32 2^-149 times FP19 2^-136), so the scan
#: below runs on exact Python integers (value * 2^FP8_SCALE_BITS) instead of Fractions.
FP8_SCALE_BITS = 320
FP8_INT = {d: [int(c * 2 ** FP8_SCALE_BITS) if isinstance(c, Q) else None for c in v[0]]
           for d, v in FP8.items()}


def ref_fp8(q: Q, dtype: T, mode: RMode, sat: bool) -> tuple[int, int]:
    """E4M3/HiF8 by scanning all 256 codes in increasing order (the spec's search)."""
    _, maximum, min_normal, max_code, over_codes = FP8[dtype]
    table = FP8_INT[dtype]
    scaled = q * 2 ** FP8_SCALE_BITS
    assert scaled.denominator == 1, "FP8 reference needs values on the 2^-320 grid"
    if q == 0:
        return 0, 0
    if abs(q) > maximum:                              # overflow before any rounding
        if sat:
            return max_code | (0x80 if q < 0 else 0), OF | NX
        return over_codes[q < 0], OF | NX
    q = int(scaled)
    best = None
    for code in range(256):
        c = table[code]
        if c is None:
            continue
        if mode is RMode.RUP:
            ok, better = c >= q, best is None or c < table[best]
        elif mode is RMode.RDN:
            ok, better = c <= q, best is None or c > table[best]
        elif mode in (RMode.RTZ, RMode.RTO):
            ok = (0 <= c <= q) if q > 0 else (q <= c <= 0)
            better = best is None or abs(c) > abs(table[best])
        else:
            ok = True
            if best is None:
                better = True
            else:
                b = table[best]
                dc, db = abs(c - q), abs(b - q)
                if dc != db:
                    better = dc < db
                elif mode is RMode.RNE:
                    better = code % 2 == 0 and best % 2 == 1
                elif mode is RMode.RNA:
                    better = abs(c) > abs(b)
                else:
                    better = c > b
        if ok and better:
            best = code
    if mode is RMode.RTO and table[best] != q and best % 2 == 0:
        # Inexact with an even code: the nearest odd code further from zero.
        odd = [c for c in range(1, 256, 2) if table[c] is not None
               and (table[c] > table[best] if q > 0 else table[c] < table[best])]
        if odd:
            best = min(odd, key=lambda c: abs(table[c] - table[best]))
    if table[best] == q:
        return best, 0
    return best, (UF | NX) if abs(q) < min_normal * 2 ** FP8_SCALE_BITS else NX


def ref_encode(q: Q, dtype: T, mode: RMode, sat: bool) -> tuple[int, int]:
    """Reference for :func:`encode` on one exact value."""
    mode = resolve_rmode(mode)
    if dtype in IEEE:
        return ref_ieee(q, dtype, mode, sat)
    if dtype in FP8:
        return ref_fp8(q, dtype, mode, sat)
    return ref_int(q, dtype, mode, sat)
