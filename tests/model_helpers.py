"""The one test helper of the golden-model tests: build a state, write a bundle, run it,
and an independent reference to check the result against.

* :func:`tile` / :func:`value_tile` make a Local or Shared tile from raw bit
  patterns or exact values; :func:`make_state` installs tiles (on every PE
  or one), Shared tiles and GPRs.
* :func:`matrix_bundle` and :func:`img2col_bundle` write the assembly of one
  bundle from its parts; :func:`run_bundle` runs one bundle on a state and
  returns its :class:`BundleResult` and the machine.
* The reference (``ref_*``) recomputes what a Matrix bundle must produce from
  the format definitions, with Python integers and ``Fraction`` - nothing from
  ``ptocube.model.numeric``, ``postprocess`` or ``convert`` - so the model and
  the reference check each other.  It covers decoding, accumulation (IEEE and
  pto-v0), bias, and the post-processing cases the tests use (PreQuantMode 0
  with or without ReLU, RowMax/GroupMax without MaxAbs).
"""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

from ptocube.model.bundle import Operation
from ptocube.model.datatype import DataType, NumClass
from ptocube.model.layout import Layout, cube_geometry
from ptocube.model.machine import Machine
from ptocube.model.state import SharedTile, State, Tile

__all__ = ["tile", "value_tile", "make_state", "matrix_bundle", "img2col_bundle",
           "run_bundle", "sel", "dt", "ref_decode", "ref_encode", "ref_round_f32", "ref_accumulate",
           "ref_postprocess", "ref_img2col", "f32", "FP32_NAN"]

HANDS = "TUMN"
FP32_NAN = 0x7FC00000


def dt(dtype) -> DataType:
    """A DataType from itself, its code or its name."""
    return DataType[dtype] if isinstance(dtype, str) else DataType(dtype)


def sel(name: str) -> int:
    """Absolute TileIndex of a ``T#1``-style name."""
    hand, n = name.split("#")
    return HANDS.index(hand.upper()) * 16 + int(n) - 1


# ---------------------------------------------------------------------------
# Tiles and states
# ---------------------------------------------------------------------------

def tile(dtype, layout, raw, tsize=None, *, cols=None, location=None, undefined=(),
         feature_map=None, shared=False) -> Tile:
    """A tile holding ``raw`` bit patterns (2-D); ``undefined`` lists (row, col) left undefined.

    ``tsize`` defaults to the smallest power-of-two size that holds the tile.
    """
    dtype = dt(dtype)
    layout = Layout[layout] if isinstance(layout, str) else Layout(layout)
    raw = np.asarray(raw, dtype=np.uint64)
    if raw.ndim == 1:
        raw = raw[None, :]
    defined = np.ones(raw.shape, dtype=bool)
    for r, c in undefined:
        defined[r, c] = False
    if tsize is None:
        if layout.is_cube:
            need = cube_geometry(layout, dtype, *raw.shape).required_bytes
        else:
            phys = cols or 1 << max(raw.shape[1] - 1, 0).bit_length()
            need = raw.shape[0] * phys * dtype.bits // 8
        tsize = 128
        while tsize < need:
            tsize *= 2
    return Tile.from_raw(dtype, layout, raw, tsize, location, cols, defined, feature_map,
                         max_capacity=262144 if shared else 65536)


def value_tile(dtype, layout, values, tsize=None, **kw) -> Tile:
    """A tile holding exact ``values`` (encoded by the reference encoder :func:`ref_encode`)."""
    values = np.asarray(values, dtype=object)
    if values.ndim == 1:
        values = values[None, :]
    raw = np.array([[ref_encode(dtype, v) for v in row] for row in values], dtype=np.uint64)
    return tile(dtype, layout, raw, tsize, **kw)


def make_state(local=None, *, pes=(0, 1, 2, 3), shared=None, gprs=None, flags=0,
               tile_capacity=None) -> State:
    """A state with ``local`` tiles: ``{"M#1": tile}`` on every PE in ``pes``, or
    ``{(pe, "M#1"): tile}`` on one PE; ``shared`` maps ids to tiles or SharedTiles;
    ``gprs`` maps GPR numbers to values."""
    state = State()
    for key, t in (local or {}).items():
        targets, name = ((key[0],), key[1]) if isinstance(key, tuple) else (pes, key)
        for pe in targets:
            state.set_tile(pe, sel(name), t)
    for sid, t in (shared or {}).items():
        state.shared[sid] = t if isinstance(t, SharedTile) else SharedTile(t)
    for number, value in (gprs or {}).items():
        state.write_gpr(number, value)
    state.flags = flags
    if tile_capacity is not None:
        state.tile_capacity = tile_capacity
    return state


def run_bundle(state: State, program: str, arithmetic: str = "ieee"):
    """Run a program holding one bundle; returns ``(BundleResult, Machine)``."""
    machine = Machine(state, arithmetic)
    results = machine.run(program)
    assert len(results) == 1, f"expected one bundle, got {len(results)}"
    return results[0], machine


# ---------------------------------------------------------------------------
# Bundle text
# ---------------------------------------------------------------------------

def _iot_words(sources, destinations, mask):
    """B.IOT lines carrying the source and destination streams in order, last on the final one."""
    words = max(-(-len(sources) // 2), len(destinations), 1)
    lines = []
    for i in range(words):
        parts = list(sources[2 * i:2 * i + 2]) + [f"mask={mask}"]
        if i == words - 1:
            parts.append("last")
        if i < len(destinations):
            hand, size = destinations[i]
            parts.append(f"->{hand}<{size}>")
        lines.append("B.IOT " + ", ".join(parts))
    return lines


def matrix_bundle(op: Operation, a_type, *, b_type=None, dims=None, fpatr=(),
                  rmode="Default", sat=0, datr=None, sources=(), destinations=(("T", 1),),
                  shared=(), mask="1111", ior=None, stop="BSTOP") -> str:
    """Assembly of one Matrix bundle.

    ``dims`` = (LB0, LB1, LB2) with None for an omitted one; ``fpatr`` = up to nine
    B.FPATR operands (defaults 0); ``b_type``/``rmode``/``sat`` add a B.DATR
    (``datr`` gives its full text instead); ``sources`` are selector names,
    ``destinations`` (hand, SizeCode) pairs, ``shared`` Shared ids; ``ior`` the
    B.IOR operand text.
    """
    a_name = a_type if isinstance(a_type, str) else dt(a_type).name
    lines = [f"{op.mnemonic} {a_name}"]
    if datr is not None:
        lines.append(f"B.DATR {datr}")
    elif b_type is not None or rmode != "Default" or sat:
        b_name = (a_name if b_type is None else
                  b_type if isinstance(b_type, str) else dt(b_type).name)
        lines.append(f"B.DATR {{NORM, {b_name}, Zero, EQ, {rmode}, {int(sat)}, 0}}")
    if fpatr is not None:
        operands = [str(v) for v in fpatr] + ["0"] * (9 - len(fpatr))
        lines.append("B.FPATR " + ", ".join(operands))
    for lb, value in enumerate(dims or ()):
        if value is not None:
            lines.append(f"B.DIM zero, {value}, ->LB{lb}")
    lines += [f"B.IOS S{sid}, mask={mask}" for sid in shared]
    lines += _iot_words(list(sources), list(destinations), mask)
    if ior is not None:
        lines.append(f"B.IOR {ior}")
    lines.append(stop)
    return "\n".join(lines) + "\n"


def img2col_bundle(dtype, valid_col, valid_row=None, col=None, *, source="M#1",
                   destination=("M", 1), mask="1111", ior=None) -> str:
    """Assembly of one TIMG2COL bundle (LB0 = ValidCol, LB1 = ValidRow, LB2 = Col)."""
    name = dtype if isinstance(dtype, str) else dt(dtype).name
    lines = [f"BSTART.SFU TIMG2COL, {name}"]
    for lb, value in enumerate((valid_col, valid_row, col)):
        if value is not None:
            lines.append(f"B.DIM zero, {value}, ->LB{lb}")
    hand, size = destination
    lines.append(f"B.IOT {source}, mask={mask}, last, ->{hand}<{size}>")
    if ior is not None:
        lines.append(f"B.IOR {ior}")
    lines.append("BSTOP")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Reference decoding and encoding (from the format definitions)
# ---------------------------------------------------------------------------

_ML = {DataType.FP16: np.float16, DataType.BF16: ml_dtypes.bfloat16,
       DataType.E4M3: ml_dtypes.float8_e4m3fn, DataType.E5M2: ml_dtypes.float8_e5m2,
       DataType.E3M2: ml_dtypes.float6_e3m2fn, DataType.E2M3: ml_dtypes.float6_e2m3fn,
       DataType.E2M1X2: ml_dtypes.float4_e2m1fn}
_WIDTH = {np.float16: np.uint16, ml_dtypes.bfloat16: np.uint16}


def _hif8(raw: int) -> float:
    """HiF8 from the dot-prefix table of the spec digest (§1.3)."""
    if raw == 0x80:
        return math.nan
    if raw in (0x6F, 0xEF):
        return -math.inf if raw & 0x80 else math.inf
    sign = -1.0 if raw & 0x80 else 1.0
    b = raw & 0x7F
    if b == 0:
        return 0.0
    if b >> 3 == 0:                                  # 0000: denormal 2^(m-23)
        return sign * 2.0 ** ((b & 7) - 23)
    if b >> 3 == 1:                                  # 0001: D0
        return sign * (1 + (b & 7) / 8)
    if b >> 4 == 1:                                  # 001: D1
        e = -1 if b & 8 else 1
        return sign * (1 + (b & 7) / 8) * 2.0 ** e
    if b >> 5 == 1:                                  # 01: D2
        e = (2 + (b >> 3 & 1)) * (-1 if b & 16 else 1)
        return sign * (1 + (b & 7) / 8) * 2.0 ** e
    if b >> 5 == 2:                                  # 10: D3
        e = (4 + (b >> 2 & 3)) * (-1 if b & 16 else 1)
        return sign * (1 + (b & 3) / 4) * 2.0 ** e
    e = (8 + (b >> 1 & 7)) * (-1 if b & 16 else 1)   # 11: D4
    return sign * (1 + (b & 1) / 2) * 2.0 ** e


def ref_decode(dtype, raw: int):
    """Value of one raw element: float (exact) for floating types, int otherwise."""
    dtype, raw = dt(dtype), int(raw)
    if dtype.num_class is NumClass.SIGNED:
        return raw - (1 << dtype.bits) if raw >> (dtype.bits - 1) else raw
    if dtype.num_class is NumClass.UNSIGNED:
        return raw
    if dtype in (DataType.FP32, DataType.TF32, DataType.HF32):
        keep = {DataType.FP32: 0, DataType.TF32: 13, DataType.HF32: 12}[dtype]
        return float(np.array([raw >> keep << keep], np.uint32).view(np.float32)[0])
    if dtype is DataType.HiF8:
        return _hif8(raw)
    if dtype is DataType.E1M2X2:
        return (-1.0 if raw & 8 else 1.0) * (raw & 7) / 4
    if dtype is DataType.E8M0:
        return math.nan if raw == 0xFF else 2.0 ** (raw - 127)
    if dtype in (DataType.E3M2, DataType.E2M3):
        raw &= 0x3F                                   # bits 7:6 ignored (ruling R10)
    ml = _ML[dtype]
    with np.errstate(invalid="ignore"):           # a NaN code converts quietly
        return float(np.array([raw], _WIDTH.get(ml, np.uint8)).view(ml).astype(np.float64)[0])


def ref_encode(dtype, value) -> int:
    """Raw pattern of an exactly representable value (search over the codes)."""
    dtype = dt(dtype)
    if dtype.num_class is not NumClass.FLOAT:
        value = int(value)
        assert -(1 << dtype.bits) < value < (1 << dtype.bits)
        return value & ((1 << dtype.bits) - 1)
    if dtype is DataType.FP32:
        return int(np.array([value], np.float32).view(np.uint32)[0])
    if dtype in _ML:
        ml = _ML[dtype]
        x = np.array([value], np.float64).astype(ml)
        back = float(x.astype(np.float64)[0])
        if back == value or (math.isnan(back) and math.isnan(value)):
            return int(x.view(_WIDTH.get(ml, np.uint8))[0])
        raise ValueError(f"{value} is not a {dtype.name} value")
    for code in range(1 << dtype.bits):
        v = ref_decode(dtype, code)
        if v == value and math.copysign(1, v) == math.copysign(1, value):
            return code
    raise ValueError(f"{value} is not a {dtype.name} value")


def f32(bits: int) -> float:
    """The float value of an FP32 bit pattern."""
    return float(np.array([bits], np.uint32).view(np.float32)[0])


# ---------------------------------------------------------------------------
# Reference arithmetic
# ---------------------------------------------------------------------------

def ref_round_f32(x: Fraction, negative_zero: bool = False) -> int:
    """FP32 bits of the exact value ``x`` rounded to nearest, ties to even (IEEE, no FTZ).

    ``negative_zero`` gives the sign of an exact zero.
    """
    if x == 0:
        return 0x80000000 if negative_zero else 0
    sign = 0x80000000 if x < 0 else 0
    mag = abs(x)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** e > mag:
        e -= 1                                      # now 2^e <= mag < 2^(e+1)
    e = max(e, -126)                                # subnormal binade
    q = mag / Fraction(2) ** (e - 23)               # significand in units of the last place
    whole = q.numerator // q.denominator
    rest = q - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    if whole == 1 << 24:
        whole, e = 1 << 23, e + 1
    if e > 127:
        return sign | 0x7F800000
    if whole < 1 << 23:                             # subnormal (or zero after rounding)
        return sign | whole
    return sign | (e + 127) << 23 | (whole - (1 << 23))


def _fma(acc: float, prod: float) -> float:
    """RNE_fp32(acc + prod) with one rounding (``prod`` exact in float64)."""
    if math.isnan(acc) or math.isnan(prod):
        return math.nan
    if math.isinf(acc) or math.isinf(prod):
        total = acc + prod                          # inf - inf gives NaN, as IEEE says
        return total
    exact = Fraction(acc) + Fraction(prod)
    negative_zero = (exact == 0 and math.copysign(1, acc) < 0
                     and math.copysign(1, prod) < 0)
    return f32(ref_round_f32(exact, negative_zero))


def _bits(x: float) -> int:
    return FP32_NAN if math.isnan(x) else int(np.array([x], np.float32).view(np.uint32)[0])


def ref_accumulate(a_type, b_type, a_raw, b_raw, *, c_raw=None, bias_raw=None,
                   a_scale=None, b_scale=None, arithmetic="ieee") -> np.ndarray:
    """The raw accumulator P (uint32 [M, N]) of ``[C +] A x B [+ Bias]``, element by element."""
    a_type, b_type = dt(a_type), dt(b_type)
    a_raw, b_raw = np.asarray(a_raw), np.asarray(b_raw)
    (m, k), n = a_raw.shape, b_raw.shape[1]
    out = np.zeros((m, n), dtype=np.uint32)
    if arithmetic == "pto-v0":
        def carrier(dtype, raw):
            dtype = dt(dtype)
            if dtype in (DataType.S8, DataType.S16, DataType.S32):
                return ref_decode(dtype, raw) % (1 << 64)
            return int(raw)
        for i in range(m):
            for j in range(n):
                total = 0 if c_raw is None else carrier(DataType.S32 if a_type.num_class is
                                                        NumClass.SIGNED else DataType.U32,
                                                        c_raw[i][j])
                for kk in range(k):
                    left, right = carrier(a_type, a_raw[i][kk]), carrier(b_type, b_raw[kk][j])
                    if a_scale is not None:
                        left *= int(a_scale[i][kk // 32])
                    if b_scale is not None:
                        right *= int(b_scale[kk // 32][j])
                    total += left * right
                if bias_raw is not None:
                    total += int(bias_raw[j])
                out[i, j] = total % (1 << 32)
        return out
    if a_type.num_class is not NumClass.FLOAT:
        for i in range(m):
            for j in range(n):
                total = 0 if c_raw is None else int(c_raw[i][j])
                total += sum(ref_decode(a_type, a_raw[i][kk]) * ref_decode(b_type, b_raw[kk][j])
                             for kk in range(k))
                if bias_raw is not None:
                    total += int(bias_raw[j])
                out[i, j] = total % (1 << 32)
        return out
    for i in range(m):
        for j in range(n):
            acc = 0.0 if c_raw is None else f32(int(c_raw[i][j]))
            for kk in range(k):
                left = ref_decode(a_type, a_raw[i][kk])
                right = ref_decode(b_type, b_raw[kk][j])
                if a_scale is not None:
                    left *= ref_decode(DataType.E8M0, a_scale[i][kk // 32])
                if b_scale is not None:
                    right *= ref_decode(DataType.E8M0, b_scale[kk // 32][j])
                acc = _fma(acc, left * right)
            if bias_raw is not None:
                acc = _fma(acc, f32(int(bias_raw[j])))
            out[i, j] = _bits(acc)
    return out


def _max_fp32(current: int, candidate: int) -> int:
    """The spec's FP32 MAX step on raw patterns (no sNaN in these tests)."""
    cur_nan, cand_nan = math.isnan(f32(current)), math.isnan(f32(candidate))
    if cur_nan and cand_nan:
        return FP32_NAN
    if cur_nan:
        return candidate
    if cand_nan:
        return current
    x, y = f32(current), f32(candidate)
    if x == 0 and y == 0:
        return 0x80000000 if current == candidate == 0x80000000 else 0
    return candidate if y > x else current


def _max(acc_type: DataType, current: int, candidate: int) -> int:
    if acc_type is DataType.FP32:
        return _max_fp32(current, candidate)
    if acc_type is DataType.S32:
        return candidate if ref_decode(acc_type, candidate) > ref_decode(acc_type, current) \
            else current
    return max(current, candidate)


def ref_postprocess(p: np.ndarray, acc_type, *, relu=0, row_max=False, group_n=0,
                    rowmax_in=None):
    """D, RowMaxOut and GroupMaxOut for PreQuantMode 0 (ReluMode 0 or 1), MaxAbs off."""
    acc_type = dt(acc_type)
    m, n = p.shape
    d = p.copy()
    if relu == 1:
        for i in range(m):
            for j in range(n):
                v = int(p[i, j])
                if acc_type is DataType.FP32:
                    x = f32(v)
                    d[i, j] = FP32_NAN if math.isnan(x) else 0 if (x < 0 or v == 0x80000000) else v
                elif acc_type is DataType.S32 and v >> 31:
                    d[i, j] = 0
    rowmax = groupmax = None
    if row_max:
        rowmax = np.zeros((m, 1), dtype=np.uint32)
        for i in range(m):
            value = int(p[i, 0])
            for j in range(1, n):
                value = _max(acc_type, value, int(p[i, j]))
            if rowmax_in is not None:
                value = _max(acc_type, int(rowmax_in[i]), value)
            rowmax[i, 0] = value
    if group_n:
        groups = -(-n // group_n)
        groupmax = np.zeros((m, groups), dtype=np.uint32)
        for i in range(m):
            for g in range(groups):
                value = int(p[i, g * group_n])
                for j in range(g * group_n + 1, min(n, (g + 1) * group_n)):
                    value = _max(acc_type, value, int(p[i, j]))
                groupmax[i, g] = value
    return d, rowmax, groupmax


def ref_img2col(src_flat, fm: dict, pos_m, pos_k, valid_row, valid_col, bits):
    """The im2col window by direct loops over the spec's index formulas."""
    D, C1, H, W, C0 = (fm.get(k, 1) for k in ("depth", "channel_groups", "height", "width",
                                              "channels_per_group"))
    KH, KW = fm.get("filter_height", 1), fm.get("filter_width", 1)
    SH, SW = fm.get("stride_height", 1), fm.get("stride_width", 1)
    DH, DW = fm.get("dilation_height", 1), fm.get("dilation_width", 1)
    PT, PB, PL, PR = (fm.get(k, 0) for k in ("pad_top", "pad_bottom", "pad_left", "pad_right"))
    LC, pad = fm.get("logical_channels", 1), fm.get("padding", 0) & ((1 << bits) - 1)
    out_h = (H + PT + PB - (DH * (KH - 1) + 1)) // SH + 1
    out_w = (W + PL + PR - (DW * (KW - 1) + 1)) // SW + 1
    out = np.zeros((valid_row, valid_col), dtype=np.uint64)
    for r in range(valid_row):
        b, rest = divmod(pos_m + r, D * out_h * out_w)
        d, rest = divmod(rest, out_h * out_w)
        oh, ow = divmod(rest, out_w)
        for c in range(valid_col):
            c1, rest = divmod(pos_k + c, KH * KW * C0)
            kh, rest = divmod(rest, KW * C0)
            kw, c0 = divmod(rest, C0)
            ih, iw = oh * SH + kh * DH - PT, ow * SW + kw * DW - PL
            if c1 * C0 + c0 < LC and 0 <= ih < H and 0 <= iw < W:
                out[r, c] = src_flat[((((b * D + d) * C1 + c1) * H + ih) * W + iw) * C0 + c0]
            else:
                out[r, c] = pad
    return out

