"""TIMG2COL semantics as pure functions: the feature-map descriptor, its checks, the gather.

TIMG2COL copies one rectangular window of the im2col ("image to column")
matrix of a feature map into a new row-major destination tile.  This module
holds the operation's mathematics; finding the tiles, allocating the
destination and publishing it is the architectural-state wrapper's job.

Where the data lives
--------------------
The source is an ordinary ROW_MAJOR, Matrix-location tile (see
:mod:`.layout`).  The feature map is one flat array in N, D, C1, H, W, C0 order
(C0 innermost; D = 1 for NC1HWC0), and its linear index

    idx(n, d, c1, h, w, c0) = ((((n*D + d)*C1 + c1)*H + h)*W + w)*C0 + c0

*is* the source tile's storage index: element ``idx`` sits at physical row
``idx // Col``, column ``idx % Col``, i.e. at byte ``idx * bits / 8`` of the
payload.  The feature map's physical element count ``P = N*D*C1*H*W*C0`` must
fit the tile's ``rows * Col`` elements (which, for a legal row-major tile,
equals ``capacity_bits / bits``).  Definedness is tracked per storage index
too.  The destination is ROW_MAJOR with ``dst[r][c]`` at ``r * Col + c``.

The feature-map descriptor (:class:`FeatureMapDescriptor`) is not an operand:
it is descriptor state attached to the *source* tile, written by the host
through the tile store's descriptor interface (ruling R14), and read-only to
TIMG2COL.  Allocating or reconfiguring that tile index invalidates it.

Legality order
--------------
``TileOperandsLegal_TIMG2COL`` evaluates, all as ``Fault_TileLegality``:

1. destination tile descriptor legal (caller; :func:`.layout.ordinary_shape_legal`);
2. source tile descriptor legal (caller);
3. :func:`check_descriptor` - feature-map descriptor structurally valid;
4. :func:`check_operand_types` - DataType in the TIMG2COL set, destination
   type equals source type, both ROW_MAJOR (both in Matrix location: caller);
5. :func:`output_shape` - outH > 0 and outW > 0;
6. :func:`check_window` - the ValidRow x ValidCol window at (posM, posK) lies
   inside the N*D*outH*outW x C1*KH*KW*C0 matrix;
7. every referenced real source element is defined (:func:`img2col`).

:func:`img2col` runs 3-7 itself; :func:`gather_indices` and :func:`walk` run
the checks they can (3 without the source-size part, then 5 and 6).
"""

import enum
from dataclasses import asdict, dataclass, fields
from typing import Iterator, NamedTuple

import numpy as np

from .datatype import DataType, TIMG2COL_TYPES
from .faults import FaultClass, PTOFault
from .layout import Layout, raw_numpy_dtype, to_raw_array

__all__ = ["FeatureMapLayout", "FeatureMapDescriptor", "Img2ColShape", "WalkStep",
           "check_descriptor", "check_operand_types", "output_shape", "check_window",
           "padding_raw", "gather_indices", "img2col", "walk"]

_U16 = 65535
#: Any index at or beyond this could overflow int64 arithmetic; no tile holds this many elements.
_INDEX_LIMIT = 1 << 62


class FeatureMapLayout(enum.IntEnum):
    """Feature-map layouts, valued in the spec's enumeration order."""

    NC1HWC0 = 0
    NDC1HWC0 = 1


#: Descriptor fields that must be 1..65535 (the rest of the integers are paddings, 0..65535).
_NONZERO_FIELDS = ("batches", "depth", "channel_groups", "height", "width", "channels_per_group",
                   "filter_height", "filter_width", "stride_height", "stride_width",
                   "dilation_height", "dilation_width", "logical_channels")
_PAD_FIELDS = ("pad_left", "pad_right", "pad_top", "pad_bottom")


@dataclass(frozen=True)
class FeatureMapDescriptor:
    """The spec's TileFeatureMapDescriptor, attached to a TIMG2COL source tile.

    Fields in the spec's configuration order (symbol in brackets):
    ``layout``; ``batches`` [N], ``depth`` [D], ``channel_groups`` [C1],
    ``height`` [H], ``width`` [W], ``channels_per_group`` [C0] (any value, not
    only 16/32); ``filter_height``/``filter_width`` [KH, KW];
    ``stride_height``/``stride_width`` [SH, SW];
    ``dilation_height``/``dilation_width`` [DH, DW]; ``pad_left``,
    ``pad_right``, ``pad_top``, ``pad_bottom`` [PL, PR, PT, PB];
    ``logical_channels`` [LC], the real channel count (packed channel
    ``c1*C0 + c0 >= LC`` is padding); ``padding``, the typed padding value as a
    raw 64-bit word of which TIMG2COL uses the low element-width bits;
    ``transposed`` (must be False); ``valid`` (False once the tile is
    reallocated).

    Construction does not validate; :func:`check_descriptor` does, so an
    illegal host-written descriptor faults where the spec says it does.
    """

    layout: FeatureMapLayout = FeatureMapLayout.NC1HWC0
    batches: int = 1
    depth: int = 1
    channel_groups: int = 1
    height: int = 1
    width: int = 1
    channels_per_group: int = 1
    filter_height: int = 1
    filter_width: int = 1
    stride_height: int = 1
    stride_width: int = 1
    dilation_height: int = 1
    dilation_width: int = 1
    pad_left: int = 0
    pad_right: int = 0
    pad_top: int = 0
    pad_bottom: int = 0
    logical_channels: int = 1
    padding: int = 0
    transposed: bool = False
    valid: bool = True

    @property
    def physical_elements(self) -> int:
        """P = N*D*C1*H*W*C0, the source elements the feature map occupies."""
        return (self.batches * self.depth * self.channel_groups * self.height * self.width
                * self.channels_per_group)

    def to_dict(self) -> dict:
        """Plain JSON-able dict; ``layout`` by name."""
        out = asdict(self)
        out["layout"] = FeatureMapLayout(self.layout).name
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureMapDescriptor":
        """Inverse of :meth:`to_dict`.

        Missing fields take their defaults; unknown keys are an error.

        ``layout`` may be a name (``"NDC1HWC0"``) or its integer value.
        """
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown feature-map descriptor fields: {sorted(unknown)}")
        values = dict(data)
        if "layout" in values:
            layout = values["layout"]
            try:
                values["layout"] = (FeatureMapLayout[layout] if isinstance(layout, str)
                                    else FeatureMapLayout(layout))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"unknown feature-map layout {layout!r}") from exc
        return cls(**values)


class Img2ColShape(NamedTuple):
    """Output extents and the im2col matrix shape of a descriptor."""

    out_height: int
    out_width: int
    rows: int       # N*D*outH*outW
    cols: int       # C1*KH*KW*C0 (packed C0, padding channels included)


class WalkStep(NamedTuple):
    """One destination element as the address generator produces it."""

    row: int
    col: int
    src_index: int   # source storage index; -1 for a padding position
    is_pad: bool


def _illegal(reason: str) -> PTOFault:
    return PTOFault(FaultClass.TILE_LEGALITY, reason)


def _check_structure(fm: FeatureMapDescriptor) -> None:
    """Every structural rule that does not need the source tile (step 3 minus the P bound)."""
    if not fm.valid:
        raise _illegal("the source tile has no valid feature-map descriptor")
    if fm.layout not in tuple(FeatureMapLayout):
        raise _illegal(f"feature-map layout {fm.layout!r} is not NC1HWC0 or NDC1HWC0")
    for name in _NONZERO_FIELDS + _PAD_FIELDS:
        value, low = getattr(fm, name), (1 if name in _NONZERO_FIELDS else 0)
        if not isinstance(value, (int, np.integer)) or not low <= value <= _U16:
            raise _illegal(f"feature-map {name}={value!r} outside {low}..{_U16}")
    if not isinstance(fm.padding, (int, np.integer)) or not 0 <= fm.padding < 1 << 64:
        raise _illegal(f"feature-map padding {fm.padding!r} is not a 64-bit word")
    if fm.transposed:
        raise _illegal("transposed TIMG2COL is not assigned")
    if fm.layout == FeatureMapLayout.NC1HWC0 and fm.depth != 1:
        raise _illegal(f"NC1HWC0 requires depth 1, got {fm.depth}")
    if fm.logical_channels > fm.channel_groups * fm.channels_per_group:
        raise _illegal(f"logical channels {fm.logical_channels} exceed C1*C0 = "
                       f"{fm.channel_groups * fm.channels_per_group}")


def check_descriptor(fm: FeatureMapDescriptor, dtype: DataType, src_tile_elements: int) -> None:
    """Step 3: the source's feature-map descriptor is structurally valid.

    In order: descriptor valid; layout NC1HWC0/NDC1HWC0; every dimension,
    filter, stride, dilation and LC in 1..65535 and paddings in 0..65535;
    not transposed; D = 1 for NC1HWC0; LC <= C1*C0; P <= ``src_tile_elements``,
    the source tile's physical element count (rows * Col) of ``dtype``.
    Raises ``Fault_TileLegality``.
    """
    dtype = DataType(dtype)
    _check_structure(fm)
    if fm.physical_elements > src_tile_elements:
        raise _illegal(f"feature map of {fm.physical_elements} elements does not fit the "
                       f"{src_tile_elements}-element {dtype.name} source tile")


def check_operand_types(src_dtype: DataType, dst_dtype: DataType,
                        src_layout: Layout, dst_layout: Layout) -> None:
    """Step 4: the DataType is one of TIMG2COL's nine, shared by source and destination,
    and both tiles are ROW_MAJOR.  Raises ``Fault_TileLegality``.

    (Both tiles must also be in Matrix location; the tile-state wrapper checks that.)
    """
    src_dtype, dst_dtype = DataType(src_dtype), DataType(dst_dtype)
    if src_dtype not in TIMG2COL_TYPES:
        raise _illegal(f"TIMG2COL does not accept {src_dtype.name}")
    if dst_dtype is not src_dtype:
        raise _illegal(f"destination type {dst_dtype.name} differs from source {src_dtype.name}")
    for role, layout in (("source", src_layout), ("destination", dst_layout)):
        if Layout(layout) is not Layout.ROW_MAJOR:
            raise _illegal(f"TIMG2COL {role} must be ROW_MAJOR, got {Layout(layout).name}")


def _out_extent(size: int, pad_a: int, pad_b: int, kernel: int, stride: int, dilation: int) -> int:
    receptive = dilation * (kernel - 1) + 1
    padded = size + pad_a + pad_b
    if padded < receptive:
        return 0
    return (padded - receptive) // stride + 1


def output_shape(fm: FeatureMapDescriptor) -> Img2ColShape:
    """Step 5: outH, outW and the im2col matrix shape; ``Fault_TileLegality`` unless outH, outW > 0.

    outH = floor((H + PT + PB - (DH*(KH-1) + 1)) / SH) + 1 (0 when the padded
    input is smaller than the receptive field), likewise outW.  The structural
    checks that need no source tile run first.
    """
    _check_structure(fm)
    out_h = _out_extent(fm.height, fm.pad_top, fm.pad_bottom, fm.filter_height,
                        fm.stride_height, fm.dilation_height)
    out_w = _out_extent(fm.width, fm.pad_left, fm.pad_right, fm.filter_width,
                        fm.stride_width, fm.dilation_width)
    if out_h <= 0 or out_w <= 0:
        raise _illegal(f"empty output {out_h}x{out_w}: the padded input is smaller than the "
                       f"dilated filter")
    return Img2ColShape(out_h, out_w, fm.batches * fm.depth * out_h * out_w,
                        fm.channel_groups * fm.filter_height * fm.filter_width
                        * fm.channels_per_group)


def check_window(shape: Img2ColShape, valid_row: int, valid_col: int,
                 pos_m: int, pos_k: int) -> None:
    """Step 6: posM + ValidRow <= rows and posK + ValidCol <= cols, else ``Fault_TileLegality``.

    posM/posK are 16-bit (0..65535) and ValidRow/ValidCol 0..65535; other
    values are a ValueError (the bundle cannot produce them).
    """
    for name, value in (("pos_m", pos_m), ("pos_k", pos_k),
                        ("valid_row", valid_row), ("valid_col", valid_col)):
        if not 0 <= value <= _U16:
            raise ValueError(f"{name}={value} outside 0..{_U16}")
    if pos_m + valid_row > shape.rows:
        raise _illegal(f"rows {pos_m}..{pos_m + valid_row - 1} exceed the {shape.rows}-row "
                       f"im2col matrix")
    if pos_k + valid_col > shape.cols:
        raise _illegal(f"columns {pos_k}..{pos_k + valid_col - 1} exceed the {shape.cols}-column "
                       f"im2col matrix")


def padding_raw(fm: FeatureMapDescriptor, dtype: DataType) -> int:
    """The descriptor's padding word cut to the element width (zero-extended, no conversion)."""
    return fm.padding & ((1 << DataType(dtype).bits) - 1)


def _checked_shape(fm: FeatureMapDescriptor, valid_row: int, valid_col: int,
                   pos_m: int, pos_k: int) -> Img2ColShape:
    shape = output_shape(fm)
    check_window(shape, valid_row, valid_col, pos_m, pos_k)
    if fm.physical_elements >= _INDEX_LIMIT:
        raise _illegal(f"feature map of {fm.physical_elements} elements fits no tile")
    return shape


def gather_indices(fm: FeatureMapDescriptor, valid_row: int, valid_col: int,
                   pos_m: int = 0, pos_k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source storage index of every destination element of the window, vectorised.

    Returns ``(src_index int64[valid_row, valid_col], is_pad bool[...])``;
    ``src_index`` is -1 where ``is_pad``.  For destination (r, c), with
    m = posM + r and k = posK + c:

    * m -> (n, d, oh, ow), slowest first, radices (N, D, outH, outW);
    * k -> (c1, kh, kw, c0), slowest first, radices (C1, KH, KW, C0);
    * ih = oh*SH + kh*DH - PT, iw = ow*SW + kw*DW - PL, channel = c1*C0 + c0;
    * padding when channel >= LC or ih, iw fall outside [0, H), [0, W);
      otherwise the source index is idx(n, d, c1, ih, iw, c0).
    """
    shape = _checked_shape(fm, valid_row, valid_col, pos_m, pos_k)
    d_, c1_, h_, w_, c0_ = (fm.depth, fm.channel_groups, fm.height, fm.width,
                            fm.channels_per_group)
    m = pos_m + np.arange(valid_row, dtype=np.int64)
    n, rest = np.divmod(m, d_ * shape.out_height * shape.out_width)
    d, rest = np.divmod(rest, shape.out_height * shape.out_width)
    oh, ow = np.divmod(rest, shape.out_width)
    k = pos_k + np.arange(valid_col, dtype=np.int64)
    c1, rest = np.divmod(k, fm.filter_height * fm.filter_width * c0_)
    kh, rest = np.divmod(rest, fm.filter_width * c0_)
    kw, c0 = np.divmod(rest, c0_)

    ih = (oh * fm.stride_height - fm.pad_top)[:, None] + (kh * fm.dilation_height)[None, :]
    iw = (ow * fm.stride_width - fm.pad_left)[:, None] + (kw * fm.dilation_width)[None, :]
    real = (((c1 * c0_ + c0) < fm.logical_channels)[None, :]
            & (ih >= 0) & (ih < h_) & (iw >= 0) & (iw < w_))
    # Padding positions may compute nonsense indices here; they are masked below.
    index = (((((n * d_ + d)[:, None] * c1_ + c1[None, :]) * h_ + ih) * w_ + iw) * c0_
             + c0[None, :])
    return np.where(real, index, -1), ~real


def img2col(src_raw_flat, src_defined_flat, fm: FeatureMapDescriptor, dtype: DataType,
            valid_row: int, valid_col: int, pos_m: int = 0, pos_k: int = 0) -> np.ndarray:
    """The TIMG2COL result window as raw bit patterns ``[valid_row, valid_col]``.

    ``src_raw_flat`` is the source tile's storage as raw ``dtype`` patterns by
    storage index (all rows * Col elements); ``src_defined_flat`` the matching
    definedness flags, or None when every element is defined.  Runs legality
    steps 3-7 (see the module docstring) and raises ``Fault_TileLegality`` on
    the first failure; a referenced real element that is undefined faults,
    an undefined element that only padding positions would have read does not.
    Real positions are raw copies; padding positions get :func:`padding_raw`.
    """
    dtype = DataType(dtype)
    source = to_raw_array(src_raw_flat, dtype)
    if source.ndim != 1:
        raise ValueError(f"src_raw_flat must be 1-D, got shape {source.shape}")
    if src_defined_flat is None:
        defined = np.ones(source.size, dtype=bool)
    else:
        defined = np.asarray(src_defined_flat, dtype=bool)
        if defined.shape != source.shape:
            raise ValueError(f"src_defined_flat shape {defined.shape} != {source.shape}")
    check_descriptor(fm, dtype, source.size)
    check_operand_types(dtype, dtype, Layout.ROW_MAJOR, Layout.ROW_MAJOR)
    index, is_pad = gather_indices(fm, valid_row, valid_col, pos_m, pos_k)
    real = ~is_pad
    # check_descriptor bounds P by the source size, and every real index is < P.
    undefined = np.zeros_like(real)
    undefined[real] = ~defined[index[real]]
    if undefined.any():
        r, c = (int(v) for v in np.argwhere(undefined)[0])
        raise _illegal(f"destination ({r}, {c}) reads undefined source element {index[r, c]}")
    out = np.full((valid_row, valid_col), padding_raw(fm, dtype), dtype=raw_numpy_dtype(dtype))
    out[real] = source[index[real]]
    return out


def _shift_subtract_divmod(dividend: int, divisor: int) -> tuple[int, int]:
    """Restoring binary long division: one shift, compare and subtract per quotient bit."""
    quotient = remainder = 0
    for bit in reversed(range(dividend.bit_length())):
        remainder = (remainder << 1) | ((dividend >> bit) & 1)
        quotient <<= 1
        if remainder >= divisor:
            remainder -= divisor
            quotient |= 1
    return quotient, remainder


def _shift_add_multiply(a: int, b: int) -> int:
    """a * b for b >= 0 by shift-and-add (a may be negative: two's complement)."""
    product = 0
    for bit in range(b.bit_length()):
        if (b >> bit) & 1:
            product += a << bit
    return product


def walk(fm: FeatureMapDescriptor, valid_row: int, valid_col: int,
         pos_m: int = 0, pos_k: int = 0) -> Iterator[WalkStep]:
    """Yield the window's elements in destination row-major order, as hardware would.

    Same result as :func:`gather_indices`, computed the way the address
    generator does it.  *Setup* (once per operation) forms the loop-invariant
    strides with shift-add multiplies and seeds the counters from posM/posK
    with shift-subtract divisions.  The *stream* (once per element) uses only
    increments, constant adds and compares: row counters (oh, ow) with running
    ih0 = oh*SH - PT, iw0 = ow*SW - PL and row address; column counters
    (kh, kw, c0) with running kh*DH, kw*DW, channel and column address.  The
    source index is row address + column address.  Checks as
    :func:`gather_indices`.
    """
    shape = _checked_shape(fm, valid_row, valid_col, pos_m, pos_k)
    mul, divmod_ = _shift_add_multiply, _shift_subtract_divmod
    out_h, out_w = shape.out_height, shape.out_width
    c0_, height, width = fm.channels_per_group, fm.height, fm.width
    sh, sw, dh, dw = fm.stride_height, fm.stride_width, fm.dilation_height, fm.dilation_width
    kh_n, kw_n = fm.filter_height, fm.filter_width

    # Setup: strides of the source index along each counter.
    w_stride = mul(width, c0_)                      # one input row (ih)
    c1_stride = mul(height, w_stride)               # one channel group (c1)
    nd_stride = mul(fm.channel_groups, c1_stride)   # one (n, d) image
    ow_span, oh_span = mul(out_w, sw), mul(out_h, sh)   # iw0, ih0 travel of a full sweep
    ow_step, ow_wrap = mul(sw, c0_), mul(ow_span, c0_)
    oh_step, oh_wrap = mul(sh, w_stride), mul(oh_span, w_stride)
    kw_step, kw_wrap = mul(dw, c0_), mul(mul(kw_n, dw), c0_)
    kh_step, kh_wrap = mul(dh, w_stride), mul(mul(kh_n, dh), w_stride)

    # Setup: seed the row counters from posM.  n*D + d is the quotient left after
    # removing ow and oh, so (n, d) need no counters of their own.
    rest, ow = divmod_(pos_m, out_w)
    image, oh = divmod_(rest, out_h)
    ih0 = mul(oh, sh) - fm.pad_top
    iw0 = mul(ow, sw) - fm.pad_left
    row_addr = mul(image, nd_stride) + mul(ih0, w_stride) + mul(iw0, c0_)

    # Setup: seed the column counters from posK.
    rest, c0_seed = divmod_(pos_k, c0_)
    rest, kw_seed = divmod_(rest, kw_n)
    c1_seed, kh_seed = divmod_(rest, kh_n)
    col_seed = (kh_seed, kw_seed, c0_seed, mul(kh_seed, dh), mul(kw_seed, dw),
                mul(c1_seed, c0_) + c0_seed,
                mul(c1_seed, c1_stride) + mul(mul(kh_seed, dh), w_stride)
                + mul(mul(kw_seed, dw), c0_) + c0_seed)

    for r in range(valid_row):
        kh, kw, c0, kh_off, kw_off, channel, col_addr = col_seed
        for c in range(valid_col):
            ih, iw = ih0 + kh_off, iw0 + kw_off
            is_pad = (channel >= fm.logical_channels or ih < 0 or ih >= height
                      or iw < 0 or iw >= width)
            yield WalkStep(r, c, -1 if is_pad else row_addr + col_addr, is_pad)
            # Advance the column counters: c0 fastest, then kw, kh, c1.
            c0, channel, col_addr = c0 + 1, channel + 1, col_addr + 1
            if c0 == c0_:
                c0, channel, col_addr = 0, channel - c0_, col_addr - c0_
                kw, kw_off, col_addr = kw + 1, kw_off + dw, col_addr + kw_step
                if kw == kw_n:
                    kw, kw_off, col_addr = 0, 0, col_addr - kw_wrap
                    kh, kh_off, col_addr = kh + 1, kh_off + dh, col_addr + kh_step
                    if kh == kh_n:
                        kh, kh_off, col_addr = 0, 0, col_addr - kh_wrap
                        channel, col_addr = channel + c0_, col_addr + c1_stride
        # Advance the row counters: ow fastest, then oh, then the (n, d) image.
        ow, iw0, row_addr = ow + 1, iw0 + sw, row_addr + ow_step
        if ow == out_w:
            ow, iw0, row_addr = 0, iw0 - ow_span, row_addr - ow_wrap
            oh, ih0, row_addr = oh + 1, ih0 + sh, row_addr + oh_step
            if oh == out_h:
                oh, ih0, row_addr = 0, ih0 - oh_span, row_addr - oh_wrap
                row_addr += nd_stride
