"""Completion-time legality of a decoded bundle, in the executable spec's order.

A decoded :class:`~ptocube.model.bundle.Bundle` has passed every decode- and
header-time rule (:mod:`ptocube.model.decode`).  At its completion boundary
the bundle is checked against the architectural state; :func:`preflight`
either returns a plan (every operand resolved, every destination allocated
on paper) or raises the *first* :class:`PTOFault` the spec would raise.
Nothing here changes the state: the plan is executed by
:mod:`ptocube.model.execute` and published by :mod:`ptocube.model.machine`.

Matrix bundles (``ExecuteBundleTMATMULOperation`` in
``asl/block/model/dispatch/cube-tmatmul.asl``; spec digest §8.3), one
function per ASL predicate group, in evaluation order:

====  ==========================================  ================================
step  function                                    fault
====  ==========================================  ================================
4a    :func:`matrix_types_legal`                  TileLegality
4b    :func:`dynamic_bindings_complete`           TileLegality
4c    :func:`data_attributes_legal`               TileLegality
4d    :func:`dimensions_legal`                    TileLegality
R8    :func:`documented_attribute_rules`          TileLegality
5     :func:`gemv_m_is_one`                       TileLegality
6     :func:`shared_schemas_legal`                TileLegality
7     :func:`postprocess_sources_legal`           TileLegality
8     :func:`local_mathematical_sources_legal`    TileLegality
9     :func:`accumulator_destination_distinct`    TileLegality
10    :func:`cooperative_m_layout`                TileLegality
11    :func:`resolve_destination_group`           TileAllocation
====  ==========================================  ================================

Steps 0-2 (PE_MASK 0000: strict no-op; B.FPATR missing: BundleControl), the
PE-mask agreement of step 4e and the header rules are the decoder's
(:mod:`ptocube.model.decode`), which never hands preflight such a bundle.
Only the fault class is architectural; within a step the sub-checks follow
the ASL's order too, so the hardware preflight FSM can copy this file line
by line.

TIMG2COL bundles follow the instruction contract (ruling R13) with the
generic TEPL completion order of ``tile-execution.asl``:
:func:`img2col_attributes_legal` and :func:`img2col_dimensions` (TileLegality),
:func:`resolve_img2col_destination` of type :func:`img2col_data_type`
(TileAllocation), then :func:`img2col_operands_legal`
(``TileOperandsLegal_TIMG2COL``, TileLegality).

Every selected PE runs the operation on its own Local tiles (ruling R12), so
the per-tile checks of a step run over each selected PE before the next step.
"""

from dataclasses import dataclass

import numpy as np

from .bundle import Bundle, Datr, Operation
from .datatype import (DTYPE_NONE, MX_MATRIX_TYPES, MX_SCALED_TYPES, ORDINARY_MATRIX_TYPES,
                       DataType, accumulator_type)
from .faults import FaultClass, PTOFault
from .img2col import (FeatureMapDescriptor, check_descriptor, check_operand_types,
                      gather_indices)
from .layout import (LOCAL_MAX_CAPACITY_BYTES, Layout, capacity_legal, cube_shape_legal,
                     ordinary_geometry, ordinary_shape_legal)
from .numeric import MX_BLOCK
from .postprocess import (check_acc_type, check_alpha_word, check_quant_word, check_rmode_sat,
                          d_dtype, group_count, group_n, scalar_param_slots,
                          vector_param_sources)
from .state import Location, State, Tile, pes_of_mask, popcount, selector_name

__all__ = ["LocalOperands", "SharedOperands", "Output", "MatrixPlan", "Img2ColPlan",
           "preflight", "plan_matrix", "plan_img2col",
           "matrix_types_legal", "dynamic_bindings_complete",
           "data_attributes_legal", "dimensions_legal", "documented_attribute_rules",
           "gemv_m_is_one", "shared_schemas_legal", "postprocess_sources_legal",
           "local_mathematical_sources_legal", "accumulator_destination_distinct",
           "cooperative_m_layout", "resolve_destination_group",
           "img2col_attributes_legal", "img2col_data_type", "img2col_dimensions",
           "resolve_img2col_destination", "img2col_operands_legal"]


def _legality(reason: str) -> PTOFault:
    return PTOFault(FaultClass.TILE_LEGALITY, reason)


def _allocation(reason: str) -> PTOFault:
    return PTOFault(FaultClass.TILE_ALLOCATION, reason)


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


# ---------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalOperands:
    """The Local source registers by role, the same selectors on every selected PE
    (None: not a Local operand of this bundle)."""
    c: int | None = None
    a: int | None = None
    a_scale: int | None = None
    b: int | None = None
    b_scale: int | None = None
    bias: int | None = None
    rowmax_in: int | None = None
    quant_vector: int | None = None
    alpha_vector: int | None = None


@dataclass(frozen=True)
class SharedOperands:
    """Shared register ids of the operands supplied by B.IOS (None: Local or absent)."""
    a: int | None = None
    a_scale: int | None = None
    b: int | None = None
    b_scale: int | None = None


@dataclass(frozen=True)
class Output:
    """A destination to create: its register, descriptor and role."""
    role: str                       # "D", "RowMaxOut", "GroupMaxOut" or "TIMG2COL"
    index: int                      # absolute TileIndex allocated for it
    capacity: int                   # per-PE TSize in bytes
    dtype: DataType
    layout: Layout
    valid_rows: int
    valid_cols: int
    phys_cols: int | None
    location: Location

    def tile(self, raw) -> Tile:
        """The published tile holding ``raw`` (valid region defined, padding zero)."""
        return Tile.from_raw(self.dtype, self.layout, raw, self.capacity, self.location,
                             self.phys_cols)


@dataclass(frozen=True)
class MatrixPlan:
    """A Matrix bundle that passed preflight: everything execution needs."""
    bundle: Bundle
    op: Operation
    a_type: DataType
    b_type: DataType
    acc_type: DataType
    d_type: DataType
    m: int
    n: int
    k: int
    a_scaled: bool                  # an E8M0 scale accompanies A
    b_scaled: bool
    pes: tuple
    local: LocalOperands
    shared: SharedOperands
    outputs: dict                   # pe -> tuple of Output (D, then RowMaxOut, GroupMaxOut)
    quant_scalar: int | None        # B.IOR words (None: not used)
    alpha_scalar: int | None

    @property
    def scale_blocks(self) -> int:
        """nb = ceil(K / 32), the MX scale blocks along K."""
        return -(-self.k // MX_BLOCK)


@dataclass(frozen=True)
class Img2ColPlan:
    """A TIMG2COL bundle that passed preflight."""
    bundle: Bundle
    dtype: DataType
    pes: tuple
    source: int                     # source TileIndex (same on every PE)
    pos_m: int
    pos_k: int
    output: Output


def preflight(bundle: Bundle, state: State) -> "MatrixPlan | Img2ColPlan":
    """Check a decoded, participating bundle against ``state`` and plan it.

    Raises the first :class:`PTOFault` in the spec's order; the caller fills
    in the reporting instruction (the completion boundary).
    """
    if bundle.op.is_matrix:
        return plan_matrix(bundle, state)
    return plan_img2col(bundle, state)


# ---------------------------------------------------------------------------
# Descriptor predicates shared by several steps
# ---------------------------------------------------------------------------

def _capacity_ok(capacity: int, state: State) -> bool:
    """TileCapacityIsLegal: whole CELLs, 128 B .. 64 KiB, within the core limit."""
    return capacity_legal(capacity, LOCAL_MAX_CAPACITY_BYTES) and capacity <= state.tile_capacity


def _ordinary_descriptor_legal(tile: Tile | None, state: State) -> bool:
    """TileDescriptorLegal for the ordinary tiles this unit reads (row-major only)."""
    if tile is None or tile.layout is not Layout.ROW_MAJOR:
        return False
    if not _capacity_ok(tile.capacity, state):
        return False
    try:
        geometry = ordinary_geometry(tile.dtype, tile.capacity, tile.phys_cols)
    except PTOFault:
        return False
    return tile.valid_rows <= geometry.rows and tile.valid_cols <= geometry.cols


def _source_contents_defined(tile: Tile | None, state: State) -> bool:
    """TileSourceContentsDefined: a legal ordinary descriptor whose valid region is defined."""
    return _ordinary_descriptor_legal(tile, state) and tile.contents_defined


def _cube_descriptor_legal(tile: Tile | None, state: State) -> bool:
    """TileCubeDescriptorLegal: allocated, Matrix location, CELLs fit the capacity."""
    return (tile is not None and tile.location is Location.MATRIX and tile.layout.is_cube
            and _capacity_ok(tile.capacity, state)
            and cube_shape_legal(tile.capacity, tile.valid_rows, tile.valid_cols,
                                 tile.dtype, tile.layout))


def _m_layout_legal(layout, m: int) -> bool:
    """TileMatrixMLayoutLegal: CUBE_M16 holds M <= 16 rows, CUBE_M32 M <= 32."""
    return (layout is Layout.CUBE_M16 and m <= 16) or (layout is Layout.CUBE_M32 and m <= 32)


def _primary_info_legal(tile: Tile | None, rows: int, cols: int, dtype: DataType,
                        layout, state: State) -> bool:
    """TileMatrixLocalPrimaryInfoLegal: a defined CUBE operand of the expected shape/type/layout."""
    return (_cube_descriptor_legal(tile, state) and tile.contents_defined
            and tile.shape == (rows, cols) and tile.dtype is dtype and tile.layout is layout)


def _auxiliary_source_legal(tile: Tile | None, rows: int, cols: int, dtype: DataType,
                            state: State) -> bool:
    """TileMatrixAuxiliarySourceSchemaLegal: RowMaxIn and parameter tiles (location Any)."""
    return (_source_contents_defined(tile, state) and tile.shape == (rows, cols)
            and tile.dtype is dtype and tile.location is Location.ANY)


def _scale_schema_legal(tile: Tile | None, rows: int, cols: int, state: State) -> bool:
    """TileMatrixLocalScaleSchemaLegal: a defined row-major E8M0 tile of ``rows x cols``."""
    return (_source_contents_defined(tile, state) and tile.shape == (rows, cols)
            and tile.dtype is DataType.E8M0)


def _name(pe: int, index: int) -> str:
    return f"PE{pe} {selector_name(index)}"


# ---------------------------------------------------------------------------
# Matrix bundles
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Types:
    """Resolved type facts of a Matrix bundle (valid once step 4a passed)."""
    a: DataType
    b: DataType
    acc: DataType
    a_scaled: bool
    b_scaled: bool


def matrix_types_legal(bundle: Bundle) -> _Types:
    """Step 4a: the AType/BType pair (MX: both MX types; ordinary: same class).

    B.DATR DataType 31 (DTYPE_NONE) names no BType in a Matrix bundle and is
    rejected (ruling R8).  The accumulator type follows AType's class (MX: FP32).
    """
    a = DataType(bundle.a_type)
    if bundle.datr is not None and bundle.datr.dtype == DTYPE_NONE:
        raise _legality("B.DATR DataType DTYPE_NONE in a Matrix bundle (ruling R8)")
    b = DataType(bundle.b_type)
    op = bundle.op
    if op.is_mx:
        if a not in MX_MATRIX_TYPES or b not in MX_MATRIX_TYPES:
            raise _legality(f"{a.name} x {b.name} is not an MX type pair")
        return _Types(a, b, DataType.FP32, a in MX_SCALED_TYPES, b in MX_SCALED_TYPES)
    if a not in ORDINARY_MATRIX_TYPES or b not in ORDINARY_MATRIX_TYPES:
        raise _legality(f"{a.name} x {b.name}: not both ordinary Matrix input types")
    if a.num_class is not b.num_class:
        raise _legality(f"{a.name} x {b.name} mixes numeric classes")
    return _Types(a, b, accumulator_type(a), False, False)


def _group_sizes(types: _Types) -> tuple[int, int]:
    """(left, right) operand-group sizes: a matrix plus its MX scale when it needs one."""
    return 1 + types.a_scaled, 1 + types.b_scaled


def _shared_count_legal(op: Operation, types: _Types, shared: int) -> bool:
    """TileMatrixSharedSourceCountLegal: none (TGEMV: only none), right group or both groups."""
    if op.is_gemv:
        return shared == 0
    left, right = _group_sizes(types)
    return shared in (0, right, left + right)


def _local_mathematical_count(op: Operation, types: _Types, shared: int) -> int:
    """TileMatrixLocalMathematicalSourceCount: [C] A [sA] B [sB] [Bias] minus Shared groups."""
    left, right = _group_sizes(types)
    supplementary = int(op.uses_acc or op.uses_bias)
    if shared == 0:
        return left + right + supplementary
    if shared == right:
        return left + supplementary
    return supplementary


def _postprocess_source_count(bundle: Bundle) -> int:
    """RowMaxIn (RowMaxEn & RowMaxInit) plus the vector-parameter tiles."""
    f = bundle.fpatr
    return int(f.row_max_en and f.row_max_init) + len(vector_param_sources(f))


def dynamic_bindings_complete(bundle: Bundle, types: _Types, state: State) -> None:
    """Step 4b: the binding stream matches the operation, and the B.IOR scalars are legal.

    Shared count legal; Local sources = mathematical + post-process sources;
    destinations = D + RowMaxOut + GroupMaxOut; the B.IOT stream terminated;
    unused B.IOR RegSrc fields and RegDst zero; each consumed B.IOR GPR holds a
    legal quantization or activation word.
    """
    f, op, shared = bundle.fpatr, bundle.op, len(bundle.shared_sources)
    if not _shared_count_legal(op, types, shared):
        raise _legality(f"{shared} Shared source(s) do not form a legal operand group for "
                        f"{op.mnemonic}")
    expected = _local_mathematical_count(op, types, shared) + _postprocess_source_count(bundle)
    if len(bundle.local_sources) != expected:
        raise _legality(f"{len(bundle.local_sources)} Local source(s) bound, "
                        f"{op.mnemonic} with this B.FPATR needs {expected}")
    destinations = 1 + f.row_max_en + f.group_max_en
    if len(bundle.destinations) != destinations:
        raise _legality(f"{len(bundle.destinations)} destination(s) bound, this B.FPATR "
                        f"needs {destinations}")
    if not bundle.terminated:
        raise _legality("the B.IOT stream was not terminated (no effective B.IOT with L=1)")
    if bundle.ior is None:
        return
    slots = scalar_param_slots(f)
    if any(bundle.ior[i] for i in range(len(slots), 3)) or bundle.ior[3]:
        raise _legality(f"B.IOR sets a register field the bundle does not consume "
                        f"(uses {len(slots)} source slot(s), no RegDst)")
    for kind, register in zip(slots, bundle.ior):
        word = state.read_gpr(register)
        if kind == "quant":
            check_quant_word(f.pre_quant_mode, word)
        else:
            check_alpha_word(word)


def data_attributes_legal(bundle: Bundle) -> None:
    """Step 4c: in a Matrix bundle B.DATR may carry only DataType, RMode and Sat."""
    d = bundle.datr
    if d is not None and (d.layout or d.pad or d.cmode or d.canonicalize):
        raise _legality("B.DATR Layout, PadValue, CMode and Canonicalize must be zero in a "
                        "Matrix bundle")


def dimensions_legal(bundle: Bundle) -> tuple[int, int, int]:
    """Step 4d: M, N, K (LB0..LB2, omitted = 1); a present 0 is illegal, and with a
    Shared operand every dimension must be a power of two (ruling R5)."""
    m, n, k = (bundle.dim(i) for i in range(3))
    if bundle.shared_sources:
        if not all(_power_of_two(v) for v in (m, n, k)):
            raise _legality(f"M={m} N={n} K={k}: Shared operands need powers of two")
    elif 0 in (m, n, k):
        raise _legality(f"M={m} N={n} K={k}: a dimension is zero")
    return m, n, k


def documented_attribute_rules(bundle: Bundle) -> None:
    """Ruling R8: checks the documents mandate and the ASL's Matrix path omits.

    The B.DATR RMode/Sat rule of the PreQuantMode, and a scalar parameter the
    B.FPATR needs with no B.IOR to supply it.  (DTYPE_NONE: step 4a.)
    """
    f = bundle.fpatr
    check_rmode_sat(f.pre_quant_mode, bundle.rmode, bundle.sat)
    if scalar_param_slots(f) and bundle.ior is None:
        raise _legality("B.FPATR needs a scalar parameter but the bundle has no B.IOR")


def gemv_m_is_one(bundle: Bundle, m: int) -> None:
    """Step 5: TGEMV forms need M = 1."""
    if bundle.op.is_gemv and m != 1:
        raise _legality(f"{bundle.op.mnemonic} needs M = 1, got {m}")


def _shared_read_schema_legal(state: State, sid: int, rows: int, cols: int,
                              dtype: DataType) -> bool:
    """BundleMatrixSharedSourceSchemaLegal: ready, row-major, columns and type match."""
    shared = state.shared.get(sid)
    if shared is None or not shared.cooperatively_ready():
        return False
    t = shared.tile
    return (t.phys_cols == cols and rows <= t.valid_rows and cols <= t.valid_cols
            and t.dtype is dtype)


def shared_schemas_legal(bundle: Bundle, types: _Types, m: int, n: int, k: int,
                         state: State) -> SharedOperands:
    """Step 6: TransA/TransB only on Shared primaries; each Shared source ready and shaped.

    Shared sources come in group order, left group (A [sA]) first when both
    groups are Shared.  A transposed primary is stored with its shape
    transposed.  Returns the Shared register of each role.
    """
    f, shared = bundle.fpatr, bundle.shared_sources
    if not shared:
        if f.trans_a or f.trans_b:
            raise _legality("TransA/TransB need a Shared primary")
        return SharedOperands()
    # Step 4b fixed the count to the right group or both groups, so the
    # spec's closing "every Shared binding consumed" check always holds here.
    left_shared = len(shared) != _group_sizes(types)[1]
    if f.trans_a and not left_shared:
        raise _legality("TransA needs a Shared A")
    nb = -(-k // MX_BLOCK)
    checks = []
    if left_shared:
        rows, cols = (k, m) if f.trans_a else (m, k)
        checks.append(("a", rows, cols, types.a))
        if types.a_scaled:
            checks.append(("a_scale", m, nb, DataType.E8M0))
    rows, cols = (n, k) if f.trans_b else (k, n)
    checks.append(("b", rows, cols, types.b))
    if types.b_scaled:
        checks.append(("b_scale", nb, n, DataType.E8M0))
    for (role, rows, cols, dtype), sid in zip(checks, shared):
        if not _shared_read_schema_legal(state, sid, rows, cols, dtype):
            raise _legality(f"Shared S{sid} ({role}) is not a ready {dtype.name} "
                            f"{rows}x{cols} row-major tile with {cols} physical columns")
    return SharedOperands(**{role: sid for (role, *_), sid in zip(checks, shared)})


def _local_roles(bundle: Bundle, types: _Types) -> LocalOperands:
    """Name the Local sources in stream order: [C] [A [sA]] [B [sB]] [Bias], then
    RowMaxIn and the vector-parameter tiles (counts already checked by step 4b)."""
    op, f, shared = bundle.op, bundle.fpatr, len(bundle.shared_sources)
    right_group = _group_sizes(types)[1]
    roles = []
    if op.uses_acc:
        roles.append("c")
    if shared in (0, right_group):
        roles += ["a", "a_scale"] if types.a_scaled else ["a"]
    if shared == 0:
        roles += ["b", "b_scale"] if types.b_scaled else ["b"]
    if op.uses_bias:
        roles.append("bias")
    if f.row_max_en and f.row_max_init:
        roles.append("rowmax_in")
    roles += [f"{name}_vector" for name in vector_param_sources(f)]
    return LocalOperands(**dict(zip(roles, bundle.local_sources)))


def postprocess_sources_legal(bundle: Bundle, types: _Types, local: LocalOperands,
                              m: int, n: int, state: State, pes) -> None:
    """Step 7: PreQuantMode vs accumulator type, then RowMaxIn (M x 1, accumulator
    type) and the vector-parameter tiles (1 x N U64, every word legal), all row-major
    in location Any and defined, on every selected PE."""
    f = bundle.fpatr
    check_acc_type(f.pre_quant_mode, types.acc)
    for pe in pes:
        if local.rowmax_in is not None:
            tile = state.tile(pe, local.rowmax_in)
            if not _auxiliary_source_legal(tile, m, 1, types.acc, state):
                raise _legality(f"RowMaxIn {_name(pe, local.rowmax_in)} is not a defined "
                                f"row-major {types.acc.name} {m}x1 tile in location Any")
        for role, check in (("quant_vector", lambda w: check_quant_word(f.pre_quant_mode, w)),
                            ("alpha_vector", check_alpha_word)):
            index = getattr(local, role)
            if index is None:
                continue
            tile = state.tile(pe, index)
            if not _auxiliary_source_legal(tile, 1, n, DataType.U64, state):
                raise _legality(f"{role} {_name(pe, index)} is not a defined row-major "
                                f"U64 1x{n} tile in location Any")
            for word in np.unique(tile.raw()):
                check(int(word))


def local_mathematical_sources_legal(bundle: Bundle, types: _Types, local: LocalOperands,
                                     m: int, n: int, k: int, state: State, pes) -> None:
    """Step 8: the Local mathematical sources in stream order, on every selected PE.

    C: a defined CUBE M x N accumulator-type tile in A's layout whose capacity
    equals D's TSize unless D is converted (PreQuantMode != 0).  A: CUBE_M16 or
    CUBE_M32 holding M, M x K of AType.  sA: row-major E8M0 M x nb.  B: CUBE_N8
    K x N of BType.  sB: nb x N.  Bias: row-major 1 x N of the accumulator type.
    """
    f = bundle.fpatr
    nb = -(-k // MX_BLOCK)
    d_capacity = bundle.destinations[0].tsize
    for pe in pes:
        regs = state.pes[pe].tiles          # this PE's register file
        if local.a is not None:
            a_tile = regs[local.a]
            m_layout = None if a_tile is None else a_tile.layout
        elif local.c is not None and regs[local.c] is not None:
            m_layout = regs[local.c].layout
        else:
            m_layout = Layout.ROW_MAJOR
        if local.c is not None:
            c = regs[local.c]
            if not _primary_info_legal(c, m, n, types.acc, m_layout, state):
                raise _legality(f"C {_name(pe, local.c)} is not a defined {types.acc.name} "
                                f"{m}x{n} CUBE tile in A's layout")
            if f.pre_quant_mode == 0 and c.capacity != d_capacity:
                raise _legality(f"C {_name(pe, local.c)} capacity {c.capacity} B differs "
                                f"from D's TSize {d_capacity} B")
        if local.a is not None:
            a = regs[local.a]
            if a is None or not _m_layout_legal(a.layout, m) or \
                    not _primary_info_legal(a, m, k, types.a, a.layout, state):
                raise _legality(f"A {_name(pe, local.a)} is not a defined {types.a.name} "
                                f"{m}x{k} CUBE_M16/CUBE_M32 tile")
        if local.a_scale is not None and not _scale_schema_legal(regs[local.a_scale], m, nb, state):
            raise _legality(f"A scale {_name(pe, local.a_scale)} is not a defined row-major "
                            f"E8M0 {m}x{nb} tile")
        if local.b is not None and \
                not _primary_info_legal(regs[local.b], k, n, types.b, Layout.CUBE_N8, state):
            raise _legality(f"B {_name(pe, local.b)} is not a defined {types.b.name} "
                            f"{k}x{n} CUBE_N8 tile")
        if local.b_scale is not None and not _scale_schema_legal(regs[local.b_scale], nb, n, state):
            raise _legality(f"B scale {_name(pe, local.b_scale)} is not a defined row-major "
                            f"E8M0 {nb}x{n} tile")
        if local.bias is not None:
            bias = regs[local.bias]
            if not (_source_contents_defined(bias, state) and bias.shape == (1, n)
                    and bias.dtype is types.acc):
                raise _legality(f"Bias {_name(pe, local.bias)} is not a defined row-major "
                                f"{types.acc.name} 1x{n} tile")


def accumulator_destination_distinct(bundle: Bundle) -> None:
    """Step 9 (ruling R6): in ACC forms C's raw 6-bit selector must differ from the
    zero-extended 2-bit DstTile hand of D."""
    if bundle.op.uses_acc and bundle.local_sources[0] == bundle.destinations[0].hand:
        raise _legality(f"C selector {bundle.local_sources[0]} equals D's DstTile hand "
                        f"{bundle.destinations[0].hand} (C/D index rule)")


def cooperative_m_layout(bundle: Bundle, local: LocalOperands, m: int, state: State,
                         pes) -> dict:
    """Step 10: D's M layout per PE - A's layout, else C's (all-Shared ACC), else
    CUBE_M16 for M <= 16 and CUBE_M32 for M <= 32 - which must hold M rows."""
    layouts = {}
    for pe in pes:
        if local.a is not None:
            layout = state.tile(pe, local.a).layout
        elif local.c is not None:
            layout = state.tile(pe, local.c).layout
        elif m <= 16:
            layout = Layout.CUBE_M16
        elif m <= 32:
            layout = Layout.CUBE_M32
        else:
            raise _legality(f"M = {m} fits no CUBE M layout")
        if not _m_layout_legal(layout, m):
            raise _legality(f"{layout.name} cannot hold M = {m}")
        layouts[pe] = layout
    return layouts


def _allocate_indices(bundle: Bundle, state: State) -> list:
    """Lowest free register of each destination's hand, then the core capacity charge."""
    reserved = []
    for dest in bundle.destinations:
        index = state.lowest_free_index(dest.hand, reserved)
        if index is None:
            raise _allocation(f"no free register in hand {'TUMN'[dest.hand]}")
        reserved.append(index)
    required = sum(popcount(bundle.pe_mask) * dest.tsize for dest in bundle.destinations)
    if state.capacity_in_use() + required > state.tile_capacity:
        raise _allocation(f"core tile capacity exceeded: {state.capacity_in_use()} B in use + "
                          f"{required} B > {state.tile_capacity} B")
    return reserved


def resolve_destination_group(bundle: Bundle, types: _Types, d_type: DataType, m: int,
                              n: int, layouts: dict, state: State) -> dict:
    """Step 11: allocate D (CUBE, Matrix) and RowMaxOut/GroupMaxOut (row-major, Any).

    Each destination takes the lowest free register of its hand; the group
    must fit the core capacity; D's CELLs must fit its TSize; RowMaxOut
    (M x 1) and GroupMaxOut (M x ceil(N/GroupN), which must be a power of two)
    must be legal ordinary tiles of their TSize.  Every failure is
    ``Fault_TileAllocation``.  Returns each PE's :class:`Output` group.
    """
    f = bundle.fpatr
    indices = _allocate_indices(bundle, state)
    roles = ["D"] + ["RowMaxOut"] * f.row_max_en + ["GroupMaxOut"] * f.group_max_en
    outputs = {}
    for pe, layout in layouts.items():
        group = []
        for role, dest, index in zip(roles, bundle.destinations, indices):
            if role == "D":
                if not (_capacity_ok(dest.tsize, state)
                        and cube_shape_legal(dest.tsize, m, n, d_type, layout)):
                    raise _allocation(f"D {d_type.name} {layout.name} {m}x{n} does not fit "
                                      f"TSize {dest.tsize} B")
                group.append(Output(role, index, dest.tsize, d_type, layout, m, n, None,
                                    Location.MATRIX))
                continue
            cols = 1 if role == "RowMaxOut" else group_count(n, group_n(f.group_n_code))
            if not ordinary_shape_legal(dest.tsize, cols, m, cols, types.acc):
                raise _allocation(f"{role} {types.acc.name} {m}x{cols} is not a legal "
                                  f"row-major tile of TSize {dest.tsize} B")
            group.append(Output(role, index, dest.tsize, types.acc, Layout.ROW_MAJOR, m, cols,
                                cols, Location.ANY))
        outputs[pe] = tuple(group)
    return outputs


def plan_matrix(bundle: Bundle, state: State) -> MatrixPlan:
    """Run every Matrix completion check in the spec's order and build the plan."""
    types = matrix_types_legal(bundle)
    dynamic_bindings_complete(bundle, types, state)
    data_attributes_legal(bundle)
    m, n, k = dimensions_legal(bundle)
    documented_attribute_rules(bundle)
    gemv_m_is_one(bundle, m)
    shared = shared_schemas_legal(bundle, types, m, n, k, state)
    local = _local_roles(bundle, types)
    pes = pes_of_mask(bundle.pe_mask)
    postprocess_sources_legal(bundle, types, local, m, n, state, pes)
    local_mathematical_sources_legal(bundle, types, local, m, n, k, state, pes)
    accumulator_destination_distinct(bundle)
    layouts = cooperative_m_layout(bundle, local, m, state, pes)
    d_type = d_dtype(bundle.fpatr.pre_quant_mode, types.acc)
    outputs = resolve_destination_group(bundle, types, d_type, m, n, layouts, state)
    scalars = dict(zip(scalar_param_slots(bundle.fpatr),
                       (state.read_gpr(r) for r in (bundle.ior or ()))))
    return MatrixPlan(bundle, bundle.op, types.a, types.b, types.acc, d_type, m, n, k,
                      types.a_scaled, types.b_scaled, pes, local, shared, outputs,
                      scalars.get("quant"), scalars.get("alpha"))


# ---------------------------------------------------------------------------
# TIMG2COL bundles (ruling R13)
# ---------------------------------------------------------------------------

def img2col_attributes_legal(bundle: Bundle) -> None:
    """TIMG2COL allows no nonzero B.DATR field (catalog ``allowed_nonzero_fields = []``).

    A B.DATR with any nonzero field is ``Fault_TileLegality`` here, before
    allocation.  An all-zero B.DATR passes (``SelectedBundleTileDataAttributesLegal``
    checks only field values), but it names DataType 0: see :func:`img2col_data_type`.
    """
    if bundle.datr is not None and bundle.datr != Datr():
        raise _legality("TIMG2COL allows no nonzero B.DATR field")


def img2col_data_type(bundle: Bundle) -> DataType:
    """The bundle's effective data type: an explicit B.DATR's DataType, else the start's.

    Only an all-zero B.DATR gets this far, so an explicit one selects FP64
    (``ResolveBundleEffectiveDataType``).  The destination is allocated as FP64 and
    the bundle then fails ``TileOperandsLegal_TIMG2COL`` (FP64 is not a TIMG2COL
    type), unless allocation fails first.
    """
    return DataType(bundle.a_type if bundle.datr is None else bundle.datr.dtype)


def img2col_dimensions(bundle: Bundle) -> tuple[int, int, int]:
    """ValidCol = LB0 (required), ValidRow = LB1 (default 1), Col = LB2 (default ValidCol).

    A missing LB0 or a present zero is ``Fault_TileLegality``.
    """
    lb0, lb1, lb2 = bundle.dims
    if lb0 is None:
        raise _legality("TIMG2COL needs LB0 = ValidCol")
    if 0 in (lb0, lb1, lb2):
        raise _legality(f"TIMG2COL dimensions LB0={lb0} LB1={lb1} LB2={lb2}: zero is illegal")
    return lb0, (1 if lb1 is None else lb1), (lb0 if lb2 is None else lb2)


def resolve_img2col_destination(bundle: Bundle, dtype: DataType, valid_row: int,
                                valid_col: int, col: int, state: State) -> Output:
    """Allocate the row-major Matrix destination: a free register of its hand, the core
    capacity, and a legal ValidRow x ValidCol shape with Col physical columns in its
    TSize.  Every failure is ``Fault_TileAllocation``."""
    index, = _allocate_indices(bundle, state)
    tsize = bundle.destinations[0].tsize
    if not ordinary_shape_legal(tsize, col, valid_row, valid_col, dtype):
        raise _allocation(f"destination {dtype.name} {valid_row}x{valid_col} with {col} "
                          f"columns is not a legal row-major tile of TSize {tsize} B")
    return Output("TIMG2COL", index, tsize, dtype, Layout.ROW_MAJOR, valid_row, valid_col,
                  col, Location.MATRIX)


def img2col_operands_legal(source: int, output: Output, pos_m: int, pos_k: int,
                           state: State, pes) -> None:
    """``TileOperandsLegal_TIMG2COL`` on every selected PE (all ``Fault_TileLegality``).

    The destination descriptor is legal by construction.  Then: the source is a
    legal row-major tile; its feature-map descriptor is structurally valid; the
    DataType is one of TIMG2COL's nine and shared by source and destination,
    both row-major and in Matrix location; outH, outW > 0; the window lies in
    the im2col matrix; every source element read as real data is defined.
    """
    for pe in pes:
        src = state.tile(pe, source)
        if not _ordinary_descriptor_legal(src, state):
            raise _legality(f"TIMG2COL source {_name(pe, source)} is not a legal row-major tile")
        fm = src.feature_map if src.feature_map is not None else FeatureMapDescriptor(valid=False)
        check_descriptor(fm, src.dtype, src.rows * src.cols)
        check_operand_types(src.dtype, output.dtype, src.layout, output.layout)
        if src.location is not Location.MATRIX:
            raise _legality(f"TIMG2COL source {_name(pe, source)} is not in Matrix location")
        index, is_pad = gather_indices(fm, output.valid_rows, output.valid_cols, pos_m, pos_k)
        referenced = index[~is_pad]
        if not src.defined[referenced].all():
            raise _legality(f"TIMG2COL reads an undefined element of {_name(pe, source)}")


def plan_img2col(bundle: Bundle, state: State) -> Img2ColPlan:
    """Run TIMG2COL's completion checks in order and build the plan.

    posM/posK are the low 16 bits of the GPRs named by B.IOR RegSrc0/RegSrc1
    (0 when B.IOR is omitted).
    """
    img2col_attributes_legal(bundle)
    valid_col, valid_row, col = img2col_dimensions(bundle)
    dtype = img2col_data_type(bundle)
    output = resolve_img2col_destination(bundle, dtype, valid_row, valid_col, col, state)
    regs = bundle.ior or (0, 0, 0, 0)
    pos_m, pos_k = (state.read_gpr(r) & 0xFFFF for r in regs[:2])
    pes = pes_of_mask(bundle.pe_mask)
    source = bundle.local_sources[0]
    img2col_operands_legal(source, output, pos_m, pos_k, state, pes)
    return Img2ColPlan(bundle, dtype, pes, source, pos_m, pos_k, output)
