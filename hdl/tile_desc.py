"""``lib.data`` layouts around the preflight: tile descriptors in, the resolved plan out.

Two families of layouts live here.

**What the tile store holds** (read by :class:`~ptocube.hdl.preflight.Preflight` through its
read ports):

* :data:`TileDescLayout` - one Local tile register of one PE: the hardware twin of a
  :class:`ptocube.model.state.Tile` descriptor (``allocated`` clear: the register is empty).
* :data:`SharedDescLayout` - one Shared register S0..S255 with its cooperative state (the
  twin of :class:`ptocube.model.state.SharedTile`).
* The definedness summary (one bit per register, answered by the definedness read port).

**What the preflight hands the execution engines** once it approves a bundle:

* :class:`PlanLayout` - the twin of :class:`ptocube.model.preflight.MatrixPlan` and
  :class:`~ptocube.model.preflight.Img2ColPlan`: types, dimensions, where every operand
  lives (:class:`OperandRole`), which post-process stages run, the B.IOR words, and the
  destinations with their allocated registers (:class:`OutputRole`) and, per PE, D's CELL
  geometry.

Conventions (so that each model object has exactly one bit pattern, and a testbench can
compare hardware and model bit for bit):

* Capacities are counted in 128-byte CELLs; a destination keeps its B.IOT SizeCode
  (TSize = 128 B << (SizeCode - 1)).
* Every field a plan does not use is zero: absent operands and outputs, the per-PE
  geometry of PEs outside the mask, the scalar words a bundle does not consume.

**Definedness** (``docs/hdl-preflight.md``): the tile store keeps one flag per storage
element slot (the granularity of the spec's ``defined_elements``) and, per register, a
count of the *valid* elements whose flag is clear, updated on every element write (a flag
that changes inside the valid region moves the count by one) and recomputed when a
descriptor is (re)configured.  The definedness read port answers ``count == 0``, which is
exactly the spec's "every valid element is defined" for every write the system can make.
The Matrix preflight needs nothing finer; TIMG2COL reads the per-slot flags with its data
(:class:`~ptocube.hdl.img2col_engine.Img2ColEngine`).
"""

from amaranth.lib import data, enum

from ..model.layout import CELL_BYTES, Layout, cube_geometry
from ..model.preflight import Img2ColPlan, MatrixPlan
from ..model.postprocess import ParamKind, group_count, group_n, prequant_mode
from ..model.state import PE_COUNT, Location, SharedTile, Tile
from .config import CubeConfig
from .descriptor import Packer

__all__ = ["TileLocation", "TileDescLayout", "SharedDescLayout", "OperandRole", "OutputRole",
           "ParamSource", "OperandLayout", "OutputLayout", "DGeometryLayout", "PlanLayout",
           "encode_tile", "encode_shared", "tile_defined", "shared_defined"]


class TileLocation(enum.Enum, shape=1):
    """Where a tile may be consumed (:class:`ptocube.model.state.Location`)."""
    ANY = 0
    MATRIX = 1


#: One Local tile register of one PE, as the tile store holds it.
#:
#: ``allocated``: the register holds a tile on this PE (the other fields are zero when not).
#: ``dtype``: DataType code.  ``layout``: :class:`~ptocube.model.layout.Layout` code.
#: ``location``: :class:`TileLocation`.  ``cells``: capacity (per-PE TSize) in 128-byte
#: CELLs.  ``valid_rows``/``valid_cols``: the valid (logical) shape.  ``phys_cols``: the
#: physical column count of a ROW_MAJOR tile (0 for CUBE layouts, whose storage derives
#: from the valid shape).
TileDescLayout = data.StructLayout({
    "allocated": 1,
    "dtype": 5,
    "layout": 3,
    "location": TileLocation,
    "cells": 10,
    "valid_rows": 16,
    "valid_cols": 16,
    "phys_cols": 16,
})

#: One Shared register: a row-major descriptor plus the cooperative state.
#:
#: ``allocation_mask``/``initialized_mask``: PE quarters owning / having written it (PE0 in
#: bit 3, as the PE mask); all-zero when the register does not exist.  ``published``: the
#: producing operation committed.  ``cells``: capacity in CELLs (up to 256 KiB).
SharedDescLayout = data.StructLayout({
    "allocation_mask": 4,
    "initialized_mask": 4,
    "published": 1,
    "dtype": 5,
    "layout": 3,
    "cells": 12,
    "valid_rows": 16,
    "valid_cols": 16,
    "phys_cols": 16,
})


class OperandRole(enum.Enum, shape=4):
    """Index of an operand in :attr:`PlanLayout` ``operands``.

    The Matrix roles follow :class:`~ptocube.model.preflight.LocalOperands`; SOURCE is the
    TIMG2COL source.
    """
    C = 0
    A = 1
    A_SCALE = 2
    B = 3
    B_SCALE = 4
    BIAS = 5
    ROWMAX_IN = 6
    QUANT_VECTOR = 7
    ALPHA_VECTOR = 8
    SOURCE = 9


class OutputRole(enum.Enum, shape=3):
    """Role of one entry of :attr:`PlanLayout` ``outputs`` (NONE: unused entry)."""
    NONE = 0
    D = 1
    ROW_MAX = 2
    GROUP_MAX = 3
    IMG2COL = 4


class ParamSource(enum.Enum, shape=2):
    """Where a post-process parameter comes from: none, a B.IOR scalar, a 1 x N U64 tile."""
    NONE = 0
    SCALAR = 1
    VECTOR = 2


#: One operand: ``present``; ``shared`` (supplied by B.IOS); ``index``: the Local TileIndex
#: (0..63, the same on every selected PE) or the Shared register number.
OperandLayout = data.StructLayout({"present": 1, "shared": 1, "index": 8})

#: One destination to create.  ``index``: the allocated TileIndex (same on every selected
#: PE).  ``size_code``: the B.IOT SizeCode.  ``rows`` x ``cols``: the valid shape.
#: ``phys_cols``: physical columns of a row-major output (0 for D, whose layout and CELLs
#: are per PE in :attr:`PlanLayout` ``d_geometry``).  D and IMG2COL outputs are in Matrix
#: location, ROW_MAX/GROUP_MAX in location Any; all but D are ROW_MAJOR.
OutputLayout = data.StructLayout({
    "role": OutputRole,
    "index": 6,
    "size_code": 4,
    "dtype": 5,
    "rows": 16,
    "cols": 16,
    "phys_cols": 16,
})

#: D's CELL geometry on one PE: its M layout (the PE's A layout, else C's, else from M),
#: the CELL width in elements and the CELL count (= K_repeat along N).
DGeometryLayout = data.StructLayout({"layout": 3, "cell_cols": 5, "cells": 10})


class PlanLayout(data.StructLayout):
    """The resolved plan of an approved bundle.

    Fields
    ------
    op : Operation code.  pe_mask : the selected PEs (PE0 = bit 3).
    a_type, b_type, acc_type, d_type : DataType codes (TIMG2COL: all four are its DataType).
    m, n, k : Matrix dimensions (TIMG2COL: 0; its window is in ``outputs[0]``).
    scale_blocks : nb = ceil(K / 32) when a scale is present, else 0.
    a_scaled, b_scaled : an E8M0 scale accompanies A / B.
    trans_a, trans_b : B.FPATR TransA / TransB (a Shared primary stored transposed).
    operands : ArrayLayout(OperandLayout, 10), indexed by :class:`OperandRole`.
    pre_quant_mode, relu_mode, row_max, row_max_init, group_max, max_abs : the B.FPATR
        stages that run.  group_n, group_count : GroupN and ceil(N / GroupN) (0 without
        GroupMax).  quant_source, alpha_source : :class:`ParamSource` of the quantization
        and activation parameters.
    quant_scalar, alpha_scalar : the B.IOR words (0 when not a scalar parameter).
    pos_m, pos_k : TIMG2COL window position (low 16 bits of the B.IOR GPRs; 0 for Matrix).
    outputs : ArrayLayout(OutputLayout, 3) in B.IOT destination order (D, RowMaxOut,
        GroupMaxOut; TIMG2COL: its one destination).
    d_geometry : ArrayLayout(DGeometryLayout, 4), indexed by PE number (zero off the mask).
    """

    def __init__(self, config: CubeConfig = CubeConfig()):
        self.config = config
        super().__init__({
            "op": 6,
            "pe_mask": 4,
            "a_type": 5,
            "b_type": 5,
            "acc_type": 5,
            "d_type": 5,
            "m": 16,
            "n": 16,
            "k": 16,
            "scale_blocks": 12,
            "a_scaled": 1,
            "b_scaled": 1,
            "trans_a": 1,
            "trans_b": 1,
            "operands": data.ArrayLayout(OperandLayout, len(OperandRole)),
            "pre_quant_mode": 6,
            "relu_mode": 3,
            "row_max": 1,
            "row_max_init": 1,
            "group_max": 1,
            "max_abs": 1,
            "group_n": 8,
            "group_count": 16,
            "quant_source": ParamSource,
            "alpha_source": ParamSource,
            "quant_scalar": 64,
            "alpha_scalar": 64,
            "pos_m": 16,
            "pos_k": 16,
            "outputs": data.ArrayLayout(OutputLayout, 3),
            "d_geometry": data.ArrayLayout(DGeometryLayout, PE_COUNT),
        })
        self._packer = Packer(self)

    def encode(self, plan) -> int:
        """The bit pattern of a model :class:`MatrixPlan` or :class:`Img2ColPlan`."""
        if isinstance(plan, Img2ColPlan):
            return self._packer.pack(self._img2col_values(plan))
        if isinstance(plan, MatrixPlan):
            return self._packer.pack(self._matrix_values(plan))
        raise TypeError(f"not a preflight plan: {plan!r}")

    def unpack(self, bits: int) -> dict:
        """Nested dict of the fields of ``bits`` (arrays as dicts keyed by index)."""
        return self._packer.unpack(bits)

    @staticmethod
    def _img2col_values(plan: Img2ColPlan) -> dict:
        out = plan.output
        return {
            "op": plan.bundle.op.value, "pe_mask": plan.bundle.pe_mask,
            "a_type": plan.dtype, "b_type": plan.dtype, "acc_type": plan.dtype,
            "d_type": plan.dtype,
            "operands": {OperandRole.SOURCE.value: {"present": 1, "index": plan.source}},
            "pos_m": plan.pos_m, "pos_k": plan.pos_k,
            "outputs": {0: {"role": OutputRole.IMG2COL.value, "index": out.index,
                            "size_code": plan.bundle.destinations[0].size_code,
                            "dtype": out.dtype, "rows": out.valid_rows,
                            "cols": out.valid_cols, "phys_cols": out.phys_cols}},
        }

    @staticmethod
    def _matrix_values(plan: MatrixPlan) -> dict:
        b = plan.bundle
        f = b.fpatr
        mode = prequant_mode(f.pre_quant_mode)
        operands = {}
        for role in OperandRole:
            name = role.name.lower()
            local = getattr(plan.local, name, None)
            shared = getattr(plan.shared, name, None)
            if local is not None:
                operands[role.value] = {"present": 1, "index": local}
            elif shared is not None:
                operands[role.value] = {"present": 1, "shared": 1, "index": shared}
        outputs, geometry = {}, {}
        roles = {"D": OutputRole.D, "RowMaxOut": OutputRole.ROW_MAX,
                 "GroupMaxOut": OutputRole.GROUP_MAX}
        for pe in plan.pes:
            for j, (out, dest) in enumerate(zip(plan.outputs[pe], b.destinations)):
                outputs[j] = {"role": roles[out.role].value, "index": out.index,
                              "size_code": dest.size_code, "dtype": out.dtype,
                              "rows": out.valid_rows, "cols": out.valid_cols,
                              "phys_cols": out.phys_cols or 0}
            d = plan.outputs[pe][0]
            g = cube_geometry(d.layout, d.dtype, d.valid_rows, d.valid_cols)
            geometry[pe] = {"layout": d.layout.value, "cell_cols": g.cell_cols,
                            "cells": g.cells}
        scaled = plan.a_scaled or plan.b_scaled
        param = {ParamKind.NONE: ParamSource.NONE, ParamKind.SCALAR: ParamSource.SCALAR,
                 ParamKind.VECTOR: ParamSource.VECTOR}[mode.param]
        alpha = {2: ParamSource.SCALAR, 3: ParamSource.VECTOR}.get(f.relu_mode,
                                                                   ParamSource.NONE)
        gn = group_n(f.group_n_code) if f.group_max_en else 0
        return {
            "op": plan.op.value, "pe_mask": b.pe_mask,
            "a_type": plan.a_type, "b_type": plan.b_type, "acc_type": plan.acc_type,
            "d_type": plan.d_type, "m": plan.m, "n": plan.n, "k": plan.k,
            "scale_blocks": plan.scale_blocks if scaled else 0,
            "a_scaled": plan.a_scaled, "b_scaled": plan.b_scaled,
            "trans_a": f.trans_a, "trans_b": f.trans_b,
            "operands": operands,
            "pre_quant_mode": f.pre_quant_mode, "relu_mode": f.relu_mode,
            "row_max": f.row_max_en, "row_max_init": f.row_max_init,
            "group_max": f.group_max_en, "max_abs": f.max_abs_en,
            "group_n": gn, "group_count": group_count(plan.n, gn) if gn else 0,
            "quant_source": param.value, "alpha_source": alpha.value,
            "quant_scalar": plan.quant_scalar or 0, "alpha_scalar": plan.alpha_scalar or 0,
            "outputs": outputs, "d_geometry": geometry,
        }


_TILE_PACKER = Packer(TileDescLayout)
_SHARED_PACKER = Packer(SharedDescLayout)


def _cells(capacity: int) -> int:
    if capacity % CELL_BYTES:
        raise ValueError(f"capacity {capacity} B is not a whole number of CELLs")
    return capacity // CELL_BYTES


def encode_tile(tile: Tile | None) -> int:
    """The :data:`TileDescLayout` bit pattern of a model tile register (None: empty)."""
    if tile is None:
        return 0
    return _TILE_PACKER.pack({
        "allocated": 1, "dtype": tile.dtype.value, "layout": tile.layout.value,
        "location": (TileLocation.MATRIX if tile.location is Location.MATRIX
                     else TileLocation.ANY).value,
        "cells": _cells(tile.capacity), "valid_rows": tile.valid_rows,
        "valid_cols": tile.valid_cols,
        "phys_cols": 0 if tile.layout is not Layout.ROW_MAJOR else tile.phys_cols,
    })


def encode_shared(shared: SharedTile | None) -> int:
    """The :data:`SharedDescLayout` bit pattern of a model Shared register (None: absent)."""
    if shared is None:
        return 0
    t = shared.tile
    return _SHARED_PACKER.pack({
        "allocation_mask": shared.allocation_mask, "initialized_mask": shared.initialized_mask,
        "published": shared.published, "dtype": t.dtype.value, "layout": t.layout.value,
        "cells": _cells(t.capacity), "valid_rows": t.valid_rows, "valid_cols": t.valid_cols,
        "phys_cols": 0 if t.layout is not Layout.ROW_MAJOR else t.phys_cols,
    })


def tile_defined(tile: Tile | None) -> bool:
    """The definedness summary of a Local register: allocated and every valid element defined."""
    return tile is not None and tile.contents_defined


def shared_defined(shared: SharedTile | None) -> bool:
    """The definedness summary of a Shared register."""
    return shared is not None and shared.tile.contents_defined
