"""The hardware legality preflight: one bundle record in, a verdict (and a plan) out.

:class:`Preflight` is the hardware twin of :func:`ptocube.model.preflight.preflight`.  It
takes the bundle records of the decoder (:class:`~ptocube.hdl.descriptor.RecordLayout`),
reads the descriptors of the bound tiles, the Shared registers, the B.IOR GPRs and the
vector-parameter words through read-only ports, and either approves the bundle - handing
the execution engines a :class:`~ptocube.hdl.tile_desc.PlanLayout` - or reports the first
fault in the golden model's order.  ``docs/hdl-preflight.md`` has the design notes (states,
cycles per check, worst-case latency) and ``docs/decisions/hdl-preflight.md`` the choices.

Matrix bundles run the model's steps in its order, one phase per predicate group:

=============  ===========================================  =============  ===============
phase          model step                                   fault          :class:`Check`
=============  ===========================================  =============  ===============
START          record fault / no-op pass-through;           (record)       RECORD
               defensive record sanity (decoder's rules);   II/BC/TL       WELL_FORMED
               4a ``matrix_types_legal`` (+ build profile)  TileLegality   TYPES
               4b ``dynamic_bindings_complete``: counts     TileLegality   BINDINGS
IOR            4b: the B.IOR scalar words (GPR reads)       TileLegality   BINDINGS
STATIC         4c DATR, 4d dimensions, R8 attributes,       TileLegality   DATR ...
               5 TGEMV M = 1                                               GEMV_M
SHARED_*       6 ``shared_schemas_legal``                   TileLegality   SHARED
POST_*         7 ``postprocess_sources_legal`` (per PE)     TileLegality   POSTPROCESS
MATH_*         8 ``local_mathematical_sources_legal``       TileLegality   MATH_SOURCES
CD_INDEX       9 ``accumulator_destination_distinct``       TileLegality   CD_INDEX
M_LAYOUT       10 ``cooperative_m_layout``                  TileLegality   M_LAYOUT
ALLOCATE       11 indices, core capacity, per-PE memory     TileAllocation ALLOCATION
D_SHAPE,AUX_*  11 D / RowMaxOut / GroupMaxOut shapes        TileAllocation ALLOCATION
=============  ===========================================  =============  ===============

TIMG2COL bundles run START (sanity, ``img2col_attributes_legal``, ``img2col_dimensions``),
IOR (posM/posK) and ALLOCATE (the destination register and the capacity charge of
``resolve_img2col_destination``); the destination shape and ``img2col_operands_legal`` are
the :class:`~ptocube.hdl.img2col_engine.Img2ColEngine`'s, which checks them first thing in
each per-PE job (:func:`img2col_job` builds the job from the plan and the source register).

Reads are pipelined: each cycle a phase issues one read and checks the response of the
previous one, so a fault found in a response preempts whatever the phase does in that
cycle.  Every phase moves forward only (``docs/hdl-preflight.md``: the ranking argument the
formal proof checks), so the verdict comes within a bounded number of cycles.

Atomic publication: nothing here writes architectural state.  ``commit_enable`` is high only
after an APPROVE verdict was taken and until ``exec_done``; the execution engines AND it into
their commit strobes, so a faulted or no-op bundle can publish nothing.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..model.bundle import Operation
from ..model.datatype import (DTYPE_NONE, MX_MATRIX_TYPES, MX_SCALED_TYPES,
                              ORDINARY_MATRIX_TYPES, DataType, NumClass)
from ..model.faults import FaultClass
from ..model.layout import Layout, cube_dtype_supported
from ..model.postprocess import PREQUANT_MODES, ParamKind, group_n
from ..model.state import PE_COUNT
from .config import CubeConfig
from .descriptor import RecordLayout
from .img2col import FEATURE_MAP_DESCRIPTOR
from .img2col_engine import Img2ColJobLayout
from .param_check import ParamCheck
from .tile_desc import (OperandRole, OutputRole, ParamSource, PlanLayout, SharedDescLayout,
                        TileDescLayout, TileLocation)

__all__ = ["Outcome", "Check", "Phase", "VerdictLayout", "TileReadSignature",
           "SharedReadSignature", "WordReadSignature", "GprReadSignature",
           "AllocQuerySignature", "Preflight", "ordinary_shape", "cube_shape", "img2col_job"]


class Outcome(enum.Enum, shape=2):
    """How a bundle ended its preflight."""
    NONE = 0
    APPROVE = 1
    FAULT = 2
    NOOP = 3


class Check(enum.Enum, shape=5):
    """Which check decided a verdict (not architectural: only the fault class is).

    Matrix steps are numbered as in :mod:`ptocube.model.preflight`.
    """
    NONE = 0
    RECORD = 1                 # a decode/header fault carried by the record
    WELL_FORMED = 2            # a rule the decoder already enforces (defensive)
    TYPES = 3                  # 4a
    BINDINGS = 4               # 4b
    DATR = 5                   # 4c
    DIMENSIONS = 6             # 4d
    ATTRIBUTES = 7             # R8
    GEMV_M = 8                 # 5
    SHARED = 9                 # 6
    POSTPROCESS = 10           # 7
    MATH_SOURCES = 11          # 8
    CD_INDEX = 12              # 9
    M_LAYOUT = 13              # 10
    ALLOCATION = 14            # 11
    I2C_ATTRIBUTES = 15
    I2C_DIMENSIONS = 16
    I2C_ALLOCATION = 17


class Phase(enum.Enum, shape=5):
    """FSM phases, numbered in evaluation order (a checking phase never moves backwards)."""
    IDLE = 0
    START = 1
    IOR = 2
    STATIC = 3
    SHARED_ENTRY = 4
    SHARED_RUN = 5
    POST_ENTRY = 6
    POST_RUN = 7
    MATH_ENTRY = 8
    MATH_RUN = 9
    CD_INDEX = 10
    M_LAYOUT = 11
    ALLOCATE = 12
    D_SHAPE = 13
    AUX_SHAPE = 14
    VERDICT = 15
    HOLD = 16


class _Pend(enum.Enum, shape=4):
    """The check due on the response of the read issued in the previous cycle."""
    NONE = 0
    GPR = 1
    SHARED = 2
    ROWMAX = 3
    QVEC = 4
    QWORD = 5
    AVEC = 6
    AWORD = 7
    A = 8
    C = 9
    SA = 10
    B = 11
    SB = 12
    BIAS = 13


#: Roles of the per-PE slots of the POST phase (slot = pe * 8 + role): each vector tile's
#: descriptor, then its N words (issued from the same slot).
_POST_ROLES = (_Pend.ROWMAX, _Pend.QVEC, _Pend.QWORD, _Pend.AVEC, _Pend.AWORD)
#: Roles of the per-PE slots of the MATH phase: A before C, whose layout rule needs A's.
_MATH_ROLES = (_Pend.A, _Pend.C, _Pend.SA, _Pend.B, _Pend.SB, _Pend.BIAS)


def VerdictLayout(index_width: int = 32) -> data.StructLayout:
    """Payload of the verdict stream: outcome, fault class, reporting instruction index
    (the record's for a decode/header fault, the boundary's otherwise), deciding check and
    the PE whose tile failed (0 when the check is not per PE)."""
    return data.StructLayout({
        "outcome": Outcome,
        "fault": FaultClass,
        "fault_index": index_width,
        "check": Check,
        "pe": 2,
    })


#: Local tile read port (latency 1: ``desc``/``defined`` answer the ``pe``/``index`` of the
#: previous cycle's ``en``).  ``defined`` is the definedness read port: every valid element
#: of that register is defined (``tile_desc`` module docstring).
TileReadSignature = wiring.Signature({
    "en": Out(1), "pe": Out(2), "index": Out(6),
    "desc": In(TileDescLayout), "defined": In(1),
})

#: Shared register read port (latency 1), with its definedness summary.
SharedReadSignature = wiring.Signature({
    "en": Out(1), "sid": Out(8),
    "desc": In(SharedDescLayout), "defined": In(1),
})

#: Tile payload read port (latency 1): 64-bit word ``addr`` (payload bytes 8*addr..8*addr+7,
#: little-endian) of Local register ``index`` of PE ``pe``.  Used for the U64 parameter tiles.
#: A word read must come in the cycle right after a ``tile_rd`` or ``word_rd`` of the same
#: register: the tile store takes the register's base from that read (decision T11).
WordReadSignature = wiring.Signature({
    "en": Out(1), "pe": Out(2), "index": Out(6), "addr": Out(16), "data": In(64),
})

#: GPR file read port (latency 1).  GPR 0 is never read (it reads as zero).
GprReadSignature = wiring.Signature({"en": Out(1), "addr": Out(5), "data": In(64)})

#: Allocation state, held stable by the tile store while the preflight runs.
#: ``allocated``: bit i set when any PE holds TileIndex i (the core-wide namespace);
#: ``capacity_in_use``: bytes charged against ``tile_capacity`` (Local tiles per PE holding
#: them, Shared tiles ``popcount(allocation_mask) * capacity``); ``pe_bytes_in_use``: Local
#: payload bytes in use on each PE (PE number order); ``tile_capacity``: the system register.
AllocQuerySignature = wiring.Signature({
    "allocated": In(64),
    "capacity_in_use": In(32),
    "pe_bytes_in_use": In(data.ArrayLayout(32, PE_COUNT)),
    "tile_capacity": In(32),
})


# ---------------------------------------------------------------------------
# Small combinational helpers
# ---------------------------------------------------------------------------

def _sig(m, value, name):
    """``value`` as a named signal: computed once, however often it is used."""
    value = Value.cast(value)
    signal = Signal(value.shape(), name=name)
    m.d.comb += signal.eq(value)
    return signal


def _in_set(code, codes):
    """1 when ``code`` (at most 6 bits) is one of ``codes``."""
    return Const(sum(1 << int(c) for c in codes), 64).bit_select(code, 1)


def _log2_bits(m, dtype, name):
    """log2 of the element width of a DataType code (3 for codes that name no type)."""
    lb = Signal(3, name=name, init=3)
    with m.Switch(dtype):
        for t in DataType:
            with m.Case(t.value):
                m.d.comb += lb.eq(t.bits.bit_length() - 1)
    return lb


def _num_class(code):
    """2-bit numeric class of a DataType code: 0 float, 1 signed, 2 unsigned."""
    return Mux(code <= 14, 0, Mux(code <= 20, 1, 2))


def _lowest(m, vector, width, name, above=None):
    """``(found, index)`` of the lowest set bit of ``vector`` (above position ``above``)."""
    found = Signal(name=f"{name}_found")
    index = Signal(range(width), name=f"{name}_index")
    for i in reversed(range(width)):
        cond = vector[i] if above is None else vector[i] & (above < i)
        with m.If(cond):
            m.d.comb += [found.eq(1), index.eq(i)]
    return found, index


def ordinary_shape(m, *, dtype, cells, phys_cols, valid_rows, valid_cols, shared, name):
    """The row-major descriptor rule of :func:`ptocube.model.layout.ordinary_shape_legal`.

    ``cells`` is the capacity in CELLs, legal from 1 to 512 (64 KiB; ``shared``: 2048, 256
    KiB).  ``phys_cols`` must be a power of two, a row must divide the capacity, the derived
    row count must be at most 65535 and hold ``valid_rows``, and ``valid_cols`` <=
    ``phys_cols``.  Returns ``(legal, elements)``: elements = capacity bits / element bits.
    """
    lb = _log2_bits(m, dtype, f"{name}_lb")
    pow2 = (phys_cols != 0) & ((phys_cols & (phys_cols - 1)) == 0)
    lc = Signal(4, name=f"{name}_lc")
    for i in range(16):
        with m.If(phys_cols[i]):
            m.d.comb += lc.eq(i)
    e = Signal(5, name=f"{name}_row_log2")          # log2 of the bits in one row
    m.d.comb += e.eq(lc + lb)
    cap_bits = Signal(22, name=f"{name}_cap_bits")
    m.d.comb += cap_bits.eq(cells << 10)
    rows = Signal(22, name=f"{name}_rows")
    m.d.comb += rows.eq(cap_bits >> e)
    divisible = (cap_bits & ((Const(1, 23) << e) - 1)) == 0
    max_cells = Mux(shared, 2048, 512)
    legal = Signal(name=f"{name}_legal")
    m.d.comb += legal.eq((cells != 0) & (cells <= max_cells) & pow2 & divisible
                         & (rows <= 65535) & (valid_rows <= rows) & (valid_cols <= phys_cols))
    elements = Signal(22, name=f"{name}_elements")
    m.d.comb += elements.eq(cap_bits >> lb)
    return legal, elements


def cube_shape(m, *, layout, dtype, rows, cols, cells, name):
    """The CUBE descriptor shape rule of :func:`ptocube.model.layout.cube_shape_legal`.

    A CUBE layout and a CUBE type, ``rows`` x ``cols`` both nonzero, M within the CELL
    height of an M layout, storage within the 32768-element model bound and the CELLs
    within ``cells`` (itself 1..512).  Returns ``(legal, cells_needed, cell_cols)``.
    """
    lb = _log2_bits(m, dtype, f"{name}_lb")
    supported = _in_set(dtype, [t for t in DataType if cube_dtype_supported(t)])
    n8 = layout == Layout.CUBE_N8
    m16 = layout == Layout.CUBE_M16
    m32 = layout == Layout.CUBE_M32
    # CUBE_N8 CELLs are (2**(7-lb)) K x 8 N; an M layout's are 16 or 32 rows of 2**(6-lb)
    # or 2**(5-lb) columns (lb = log2 element bits; meaningful for supported types only).
    n8_shift = Signal(3, name=f"{name}_n8_shift")
    m_shift = Signal(3, name=f"{name}_m_shift")
    m.d.comb += [n8_shift.eq(7 - lb), m_shift.eq(Mux(m16, 6 - lb, 5 - lb))]
    k_rep_n8 = Signal(16, name=f"{name}_k_rep_n8")
    n_rep = Signal(14, name=f"{name}_n_rep")
    k_rep_m = Signal(16, name=f"{name}_k_rep_m")
    m.d.comb += [
        k_rep_n8.eq((rows + (Const(1, 9) << n8_shift) - 1) >> n8_shift),
        n_rep.eq((cols + 7) >> 3),
        k_rep_m.eq((cols + (Const(1, 9) << m_shift) - 1) >> m_shift),
    ]
    need = Signal(30, name=f"{name}_cells_needed")
    m.d.comb += need.eq(Mux(n8, k_rep_n8 * n_rep, k_rep_m))
    limit = Const(1, 12) << (lb + 5)                  # 32768 elements in CELLs
    cell_cols = Signal(5, name=f"{name}_cell_cols")
    m.d.comb += cell_cols.eq(Mux(n8, 8, Const(1, 5) << m_shift))
    legal = Signal(name=f"{name}_legal")
    m.d.comb += legal.eq(supported & (n8 | m16 | m32) & (rows != 0) & (cols != 0)
                         & (~m16 | (rows <= 16)) & (~m32 | (rows <= 32))
                         & (need <= limit) & (need <= cells) & (cells != 0) & (cells <= 512))
    return legal, need, cell_cols


def _group_count(m, code, n):
    """ceil(N / GroupN) for GroupNCode ``code`` (0 for code 0 or a reserved code).

    GroupN = 2**s * q with q in {1, 3, 5, 7}: ceil(ceil(N / 2**s) / q), the division by q a
    multiplication by a reciprocal that is exact for every 16-bit N (checked here).
    """
    out = Signal(16, name="group_count")
    with m.Switch(code):
        for c in range(1, 10):
            gn = group_n(c)
            s = (gn & -gn).bit_length() - 1
            q = gn >> s
            with m.Case(c):
                x = (n + (1 << s) - 1) >> s
                if q == 1:
                    m.d.comb += out.eq(x)
                    continue
                mul, shift = _reciprocal(q, ((1 << 16) + (1 << s) - 1 >> s) + q)
                m.d.comb += out.eq(((x + q - 1) * mul) >> shift)
    return out


def _reciprocal(q, limit):
    """``(mul, shift)`` with ``(y * mul) >> shift == y // q`` for every ``0 <= y < limit``."""
    for shift in range(1, 40):
        mul = -(-(1 << shift) // q)
        if all((y * mul) >> shift == y // q for y in range(limit)):
            return mul, shift
    raise AssertionError(f"no reciprocal for {q}")


def _mode_table(m, mode, config):
    """Facts of the PreQuantMode table for the current ``mode`` code."""
    from .postprocess import built_modes        # postprocess does not import this module
    built = built_modes(config)
    f = {"known": Signal(name="mode_known"), "source": Signal(5, name="mode_source"),
         "d": Signal(5, name="mode_d"), "param": Signal(ParamSource, name="mode_param"),
         "rmode_free": Signal(name="mode_rmode_free"), "sat_free": Signal(name="mode_sat_free"),
         "built": Signal(name="mode_built")}
    params = {ParamKind.NONE: ParamSource.NONE, ParamKind.SCALAR: ParamSource.SCALAR,
              ParamKind.VECTOR: ParamSource.VECTOR}
    with m.Switch(mode):
        for code, row in PREQUANT_MODES.items():
            with m.Case(code):
                m.d.comb += [
                    f["known"].eq(1),
                    f["source"].eq(0 if row.source is None else row.source.value),
                    f["d"].eq(0 if row.d_dtype is None else row.d_dtype.value),
                    f["param"].eq(params[row.param]),
                    f["rmode_free"].eq(row.rmode_free),
                    f["sat_free"].eq(row.sat_free),
                    f["built"].eq(code in built),
                ]
    return f


# ---------------------------------------------------------------------------
# The preflight
# ---------------------------------------------------------------------------

class Preflight(wiring.Component):
    """Legality preflight of CUBE Matrix and TIMG2COL bundles, in the golden model's order.

    Parameters
    ----------
    config : CubeConfig
        Sizes the record's lists; ``int_types``/``float_types``/``mx_types`` are the build's
        type profile (an omitted class is ``Fault_TileLegality`` at step 4a, an omitted
        PreQuantMode at step 7); ``tile_bytes_per_pe`` is the per-PE memory limit of the
        allocation step.
    index_width : int
        Width of the record's instruction indices.

    Members
    -------
    record : In(stream.Signature(RecordLayout(config, index_width)))
        Bundle records from the decoder; one is taken when the preflight is idle.
    verdict : Out(stream.Signature(VerdictLayout(index_width)))
        One verdict per record.
    plan : Out(PlanLayout(config))
        The resolved plan; meaningful with an APPROVE verdict and while ``commit_enable``.
    approve, fault, noop : Out(1)
        ``verdict.valid`` with outcome APPROVE / FAULT / NOOP.
    commit_enable : Out(1)
        High from the cycle after an APPROVE verdict is taken until ``exec_done``; the
        execution engines AND it into every commit strobe.
    exec_done : In(1)
        The execution of the approved bundle finished (published or abandoned); the
        preflight then takes the next record.
    busy : Out(1)
        A record is being checked, its verdict waits, or its execution runs.
    tile_rd : Out(TileReadSignature)
    shared_rd : Out(SharedReadSignature)
    word_rd : Out(WordReadSignature)
    gpr_rd : Out(GprReadSignature)
    alloc : Out(AllocQuerySignature)
        The tile store's ports (see each signature); reads have no side effects.
    """

    def __init__(self, config: CubeConfig = CubeConfig(), index_width: int = 32):
        self.config = config
        self.index_width = index_width
        self.record_layout = RecordLayout(config, index_width)
        self.plan_layout = PlanLayout(config)
        super().__init__({
            "record": In(stream.Signature(self.record_layout)),
            "verdict": Out(stream.Signature(VerdictLayout(index_width))),
            "plan": Out(self.plan_layout),
            "approve": Out(1),
            "fault": Out(1),
            "noop": Out(1),
            "commit_enable": Out(1),
            "exec_done": In(1),
            "busy": Out(1),
            "tile_rd": Out(TileReadSignature),
            "shared_rd": Out(SharedReadSignature),
            "word_rd": Out(WordReadSignature),
            "gpr_rd": Out(GprReadSignature),
            "alloc": Out(AllocQuerySignature),
        })
        # Internal state the formal harness observes (created in elaborate).
        self.phase = Signal(Phase, name="phase")
        self.slot = Signal(5, name="slot")
        self.word = Signal(16, name="word")
        self.rec = Signal(self.record_layout, name="rec")

    # ---- facts of the held record -------------------------------------------------
    def _facts(self, m, rec):
        """Everything derived combinationally from the held record, by name.

        Only the facts a phase relies on are meaningful there: the operand positions, for
        instance, once step 4b found the binding counts legal.
        """
        cfg = self.config
        b = rec.bundle
        f = b.fpatr
        x = SimpleNamespace(b=b, f=f)

        op = b.op
        x.is_img2col = _sig(m, op == Operation.TIMG2COL, "is_img2col")
        x.is_matrix = _sig(m, ~x.is_img2col, "is_matrix")
        x.op_known = _sig(m, _in_set(op, [o.value for o in Operation]), "op_known")
        x.uses_bias = _sig(m, x.is_matrix & (op[0:2] == 1), "uses_bias")
        x.uses_acc = _sig(m, x.is_matrix & (op[0:2] == 2), "uses_acc")
        x.is_mx = _sig(m, x.is_matrix & op[2], "is_mx")
        x.is_gemv = _sig(m, x.is_matrix & op[4], "is_gemv")

        # Step 4a: the type pair and the build's type profile.
        a_type, b_type = b.a_type, b.b_type
        built_classes = ({NumClass.FLOAT} if cfg.float_types else set()) | (
            {NumClass.SIGNED, NumClass.UNSIGNED} if cfg.int_types else set())
        ordinary = [t for t in ORDINARY_MATRIX_TYPES if t.num_class in built_classes]
        mx_pair = _in_set(a_type, MX_MATRIX_TYPES) & _in_set(b_type, MX_MATRIX_TYPES)
        ordinary_pair = (_in_set(a_type, ordinary) & _in_set(b_type, ordinary)
                         & (_num_class(a_type) == _num_class(b_type)))
        dtype_none = b.datr_valid & (b.datr.dtype == DTYPE_NONE)
        x.types_ok = _sig(m, ~dtype_none & Mux(x.is_mx, mx_pair & cfg.mx_types, ordinary_pair),
                          "types_ok")
        x.a_scaled = _sig(m, x.is_mx & _in_set(a_type, MX_SCALED_TYPES), "a_scaled")
        x.b_scaled = _sig(m, x.is_mx & _in_set(b_type, MX_SCALED_TYPES), "b_scaled")
        x.acc = Signal(5, name="acc_type")
        by_class = Array([Const(DataType.FP32.value, 5), Const(DataType.S32.value, 5),
                          Const(DataType.U32.value, 5), Const(DataType.U32.value, 5)])
        m.d.comb += x.acc.eq(Mux(x.is_mx, DataType.FP32.value, by_class[_num_class(a_type)]))

        # The PreQuantMode and the parameters it needs.
        x.mode = _mode_table(m, f.pre_quant_mode, cfg)
        x.scalar_quant = _sig(m, x.mode["param"] == ParamSource.SCALAR, "scalar_quant")
        x.vector_quant = _sig(m, x.mode["param"] == ParamSource.VECTOR, "vector_quant")
        x.alpha_vector = _sig(m, f.relu_mode == 3, "alpha_vector")
        x.rowmax_in = _sig(m, f.row_max_en & f.row_max_init, "rowmax_in")
        x.n_slots = Signal(2, name="scalar_slots")
        m.d.comb += x.n_slots.eq(x.scalar_quant + (f.relu_mode == 2))
        x.d_type = Signal(5, name="d_type")
        m.d.comb += x.d_type.eq(Mux(f.pre_quant_mode == 0, x.acc, x.mode["d"]))

        x.dims = [b.dims[i].value for i in range(3)]
        x.dm, x.dn, x.dk = x.dims
        x.nb = Signal(12, name="scale_blocks")
        m.d.comb += x.nb.eq((x.dk + 31) >> 5)

        # Step 4b: the operand groups and the binding counts.
        x.left = _sig(m, 1 + x.a_scaled, "left_group")
        x.right = _sig(m, 1 + x.b_scaled, "right_group")
        sc, lc = b.shared_count, b.local_count
        x.sc = sc
        shared_ok = Mux(x.is_gemv, sc == 0,
                        (sc == 0) | (sc == x.right) | (sc == x.left + x.right))
        supp = x.uses_acc | x.uses_bias
        math_count = Mux(sc == 0, x.left + x.right + supp,
                         Mux(sc == x.right, x.left + supp, supp))
        post_count = x.rowmax_in + x.vector_quant + x.alpha_vector
        ior = b.ior
        ior_fields_ok = ~b.ior_valid | (((x.n_slots >= 1) | (ior.reg_src0 == 0))
                                        & ((x.n_slots >= 2) | (ior.reg_src1 == 0))
                                        & (ior.reg_src2 == 0) & (ior.reg_dst == 0))
        x.counts_ok = _sig(m, shared_ok & (lc == math_count + post_count)
                           & (b.dest_count == 1 + f.row_max_en + f.group_max_en)
                           & b.terminated & ior_fields_ok, "counts_ok")

        # Where each operand is: positions in the Local stream ([C] [A [sA]] [B [sB]] [Bias]
        # [RowMaxIn] [quant vector] [alpha vector]) or in the Shared stream ([A [sA]] B [sB]).
        x.a_local = _sig(m, (sc == 0) | (sc == x.right), "a_local")
        x.b_local = _sig(m, sc == 0, "b_local")
        x.a_shared = _sig(m, (sc != 0) & ~x.a_local, "a_shared")
        x.b_shared = _sig(m, sc != 0, "b_shared")
        pos = {k: Signal(4, name=f"pos_{k}") for k in ("a", "b", "bias", "rowmax", "qvec",
                                                       "avec")}
        m.d.comb += [
            pos["a"].eq(x.uses_acc),
            pos["b"].eq(pos["a"] + Mux(x.a_local, x.left, 0)),
            pos["bias"].eq(pos["b"] + Mux(x.b_local, x.right, 0)),
            pos["rowmax"].eq(pos["bias"] + x.uses_bias),
            pos["qvec"].eq(pos["rowmax"] + x.rowmax_in),
            pos["avec"].eq(pos["qvec"] + x.vector_quant),
        ]
        x.spos_b = _sig(m, Mux(x.a_shared, x.left, 0), "shared_pos_b")
        local, shared = b.local_sources, b.shared_sources
        a_index = Mux(x.a_shared, shared[0], local[pos["a"]])
        sa_index = Mux(x.a_shared, shared[1], local[pos["a"] + 1])
        b_index = Mux(x.b_shared, shared[x.spos_b], local[pos["b"]])
        sb_index = Mux(x.b_shared, shared[x.spos_b + 1], local[pos["b"] + 1])
        # role -> (present, shared, index): the plan's operand table.
        x.operands = {
            OperandRole.C: (x.uses_acc, 0, local[0]),
            OperandRole.A: (x.is_matrix, x.a_shared, a_index),
            OperandRole.A_SCALE: (x.a_scaled, x.a_shared, sa_index),
            OperandRole.B: (x.is_matrix, x.b_shared, b_index),
            OperandRole.B_SCALE: (x.b_scaled, x.b_shared, sb_index),
            OperandRole.BIAS: (x.uses_bias, 0, local[pos["bias"]]),
            OperandRole.ROWMAX_IN: (x.is_matrix & x.rowmax_in, 0, local[pos["rowmax"]]),
            OperandRole.QUANT_VECTOR: (x.is_matrix & x.vector_quant, 0, local[pos["qvec"]]),
            OperandRole.ALPHA_VECTOR: (x.is_matrix & x.alpha_vector, 0, local[pos["avec"]]),
            OperandRole.SOURCE: (x.is_img2col, 0, local[0]),
        }
        x.index = {}
        for role, (_, _, index) in x.operands.items():
            x.index[role] = Signal(8, name=f"index_{role.name.lower()}")
            m.d.comb += x.index[role].eq(index)

        x.selected = [b.pe_mask[3 - pe] for pe in range(PE_COUNT)]     # PE0 is bit 3
        x.tsize_cells = [Signal(10, name=f"tsize_cells{j}") for j in range(3)]
        for j in range(3):
            m.d.comb += x.tsize_cells[j].eq(Const(1, 10) << (b.destinations[j].size_code - 1)[:4])
        x.group_count = _group_count(m, f.group_n_code, x.dn)
        return x

    # ---- elaboration --------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        # Separate submodules for logic that changes at different rates (the record's
        # facts, the shape units, the slot search, the plan): the simulator then only
        # re-evaluates the part whose inputs changed.
        m.submodules.facts = fm = Module()
        m.submodules.shapes = sm = Module()
        m.submodules.slots = nm = Module()
        m.submodules.plan = pm = Module()
        cfg = self.config
        phase, slot, word, rec = self.phase, self.slot, self.word, self.rec
        x = self._facts(fm, rec)
        b, f = x.b, x.f
        dm, dn, dk, nb, acc = x.dm, x.dn, x.dk, x.nb, x.acc
        TL, TA = FaultClass.TILE_LEGALITY, FaultClass.TILE_ALLOCATION
        BC, II = FaultClass.BUNDLE_CONTROL, FaultClass.ILLEGAL_INSTRUCTION

        # ---- registers --------------------------------------------------------------
        pend = Signal(_Pend, name="pend")                 # check due on this cycle's response
        pend_pe = Signal(2, name="pend_pe")
        pend_slot = Signal(2, name="pend_slot")
        pend_zero = Signal(name="pend_gpr_zero")          # that GPR read was GPR 0
        r = SimpleNamespace(
            gpr_val=Array(Signal(64, name=f"gpr_val{i}") for i in range(2)),
            pe_layout=Array(Signal(3, name=f"pe_layout{pe}") for pe in range(PE_COUNT)),
            d_cells=Array(Signal(10, name=f"d_cells{pe}") for pe in range(PE_COUNT)),
            d_cell_cols=Array(Signal(5, name=f"d_cell_cols{pe}") for pe in range(PE_COUNT)),
            out_index=Array(Signal(6, name=f"out_index{j}") for j in range(3)),
        )
        v_outcome = Signal(Outcome, name="v_outcome")
        v_fault = Signal(FaultClass, name="v_fault")
        v_index = Signal(self.index_width, name="v_index")
        v_check = Signal(Check, name="v_check")
        v_pe = Signal(2, name="v_pe")
        tile_capacity = self.alloc.tile_capacity

        def cap_ok(cells):
            """TileCapacityIsLegal for a Local tile: 1..512 CELLs and within the core limit."""
            return (cells != 0) & (cells <= 512) & ((cells << 7) <= tile_capacity)

        desc_cap_ok = _sig(sm, cap_ok(self.tile_rd.desc.cells), "desc_capacity_ok")

        # ---- the two shape units, shared by every phase's checks --------------------
        desc, sdesc = self.tile_rd.desc, self.shared_rd.desc
        ord_in = {k: Signal(w, name=f"ord_{k}") for k, w in (
            ("dtype", 5), ("cells", 12), ("phys_cols", 16), ("valid_rows", 16),
            ("valid_cols", 16), ("shared", 1))}
        cube_in = {k: Signal(w, name=f"cube_{k}") for k, w in (
            ("layout", 3), ("dtype", 5), ("rows", 16), ("cols", 16), ("cells", 10))}
        ord_legal, _ = ordinary_shape(sm, name="ord", **ord_in)
        cube_legal, cube_need, cube_cell_cols = cube_shape(sm, name="cube", **cube_in)

        aux_is_group = slot[0]                  # AUX_SHAPE: slot 0 RowMaxOut, 1 GroupMaxOut
        aux_cols = Mux(aux_is_group, x.group_count, 1)
        aux_dest = Mux(aux_is_group, 1 + f.row_max_en, 1)
        with m.If(phase == Phase.AUX_SHAPE):
            m.d.comb += [ord_in["dtype"].eq(acc),
                         ord_in["cells"].eq(Array(x.tsize_cells)[aux_dest]),
                         ord_in["phys_cols"].eq(aux_cols), ord_in["valid_rows"].eq(dm),
                         ord_in["valid_cols"].eq(aux_cols)]
        with m.Elif(pend == _Pend.SHARED):
            m.d.comb += [ord_in["dtype"].eq(sdesc.dtype), ord_in["cells"].eq(sdesc.cells),
                         ord_in["phys_cols"].eq(sdesc.phys_cols),
                         ord_in["valid_rows"].eq(sdesc.valid_rows),
                         ord_in["valid_cols"].eq(sdesc.valid_cols), ord_in["shared"].eq(1)]
        with m.Else():
            m.d.comb += [ord_in["dtype"].eq(desc.dtype), ord_in["cells"].eq(desc.cells),
                         ord_in["phys_cols"].eq(desc.phys_cols),
                         ord_in["valid_rows"].eq(desc.valid_rows),
                         ord_in["valid_cols"].eq(desc.valid_cols)]
        with m.If(phase == Phase.D_SHAPE):
            m.d.comb += [cube_in["layout"].eq(r.pe_layout[slot[:2]]),
                         cube_in["dtype"].eq(x.d_type), cube_in["rows"].eq(dm),
                         cube_in["cols"].eq(dn), cube_in["cells"].eq(x.tsize_cells[0])]
        with m.Else():
            m.d.comb += [cube_in["layout"].eq(desc.layout), cube_in["dtype"].eq(desc.dtype),
                         cube_in["rows"].eq(desc.valid_rows),
                         cube_in["cols"].eq(desc.valid_cols), cube_in["cells"].eq(desc.cells)]

        # ---- the parameter-word checker (B.IOR scalars and vector-tile words) ---------
        m.submodules.param = param = ParamCheck(cfg)
        gpr_word = Mux(pend_zero, 0, self.gpr_rd.data)
        param_word = Mux(pend == _Pend.GPR, gpr_word, self.word_rd.data)
        m.d.comb += [param.mode.eq(f.pre_quant_mode), param.quant.eq(param_word),
                     param.alpha.eq(param_word)]

        # ---- the response checker: the read issued in the previous cycle ------------
        pend_ok = Signal(name="pend_ok", init=1)
        pend_check = Signal(Check, name="pend_check")
        defined = self.tile_rd.defined

        def ordinary_source(rows, cols, dtype, need_any):
            """TileSourceContentsDefined plus the expected shape, type (and location Any)."""
            return (desc.allocated & (desc.layout == Layout.ROW_MAJOR) & desc_cap_ok
                    & ord_legal & defined & (desc.valid_rows == rows)
                    & (desc.valid_cols == cols) & (desc.dtype == dtype)
                    & (~need_any | (desc.location == TileLocation.ANY)))

        def cube_primary(rows, cols, dtype, layout_ok):
            """TileMatrixLocalPrimaryInfoLegal, the layout rule given as ``layout_ok``."""
            return (desc.allocated & (desc.location == TileLocation.MATRIX)
                    & desc_cap_ok & cube_legal & defined
                    & (desc.valid_rows == rows) & (desc.valid_cols == cols)
                    & (desc.dtype == dtype) & layout_ok)

        m_holds = _sig(sm, ((desc.layout == Layout.CUBE_M16) & (dm <= 16))
                       | ((desc.layout == Layout.CUBE_M32) & (dm <= 32)), "m_holds")
        # Shared slot j -> its role (0 A, 1 sA, 2 B, 3 sB), the stored shape (a transposed
        # primary is stored transposed) and the type.
        srole = Signal(2, name="shared_role")
        with fm.If(x.a_shared & (pend_slot == 0)):
            fm.d.comb += srole.eq(0)
        with fm.Elif(x.a_shared & x.a_scaled & (pend_slot == 1)):
            fm.d.comb += srole.eq(1)
        with fm.Elif(pend_slot == x.spos_b):
            fm.d.comb += srole.eq(2)
        with fm.Else():
            fm.d.comb += srole.eq(3)
        s_rows = _sig(fm, Array([Mux(f.trans_a, dk, dm), dm, Mux(f.trans_b, dn, dk), nb])[srole],
                      "shared_rows")
        s_cols = _sig(fm, Array([Mux(f.trans_a, dm, dk), nb, Mux(f.trans_b, dk, dn), dn])[srole],
                      "shared_cols")
        s_type = _sig(fm, Array([b.a_type, Const(DataType.E8M0.value, 5), b.b_type,
                                Const(DataType.E8M0.value, 5)])[srole], "shared_type")

        with m.Switch(pend):
            with m.Case(_Pend.GPR):
                alpha_slot = (pend_slot == 1) | ~x.scalar_quant
                m.d.comb += [pend_check.eq(Check.BINDINGS),
                             pend_ok.eq(x.is_img2col
                                        | Mux(alpha_slot, param.alpha_ok, param.quant_ok))]
                m.d.sync += r.gpr_val[pend_slot[0]].eq(gpr_word)
            with m.Case(_Pend.SHARED):
                m.d.comb += [
                    pend_check.eq(Check.SHARED),
                    pend_ok.eq((sdesc.allocation_mask == 0xF) & (sdesc.initialized_mask == 0xF)
                               & sdesc.published & self.shared_rd.defined
                               & (sdesc.layout == Layout.ROW_MAJOR) & ord_legal
                               & (sdesc.phys_cols == s_cols) & (s_rows <= sdesc.valid_rows)
                               & (s_cols <= sdesc.valid_cols) & (sdesc.dtype == s_type)),
                ]
            with m.Case(_Pend.ROWMAX):
                m.d.comb += [pend_check.eq(Check.POSTPROCESS),
                             pend_ok.eq(ordinary_source(dm, 1, acc, 1))]
            with m.Case(_Pend.QVEC, _Pend.AVEC):
                m.d.comb += [pend_check.eq(Check.POSTPROCESS),
                             pend_ok.eq(ordinary_source(1, dn, DataType.U64.value, 1))]
            with m.Case(_Pend.QWORD):
                m.d.comb += [pend_check.eq(Check.POSTPROCESS), pend_ok.eq(param.quant_ok)]
            with m.Case(_Pend.AWORD):
                m.d.comb += [pend_check.eq(Check.POSTPROCESS), pend_ok.eq(param.alpha_ok)]
            with m.Case(_Pend.A):
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(cube_primary(dm, dk, b.a_type, m_holds))]
                m.d.sync += r.pe_layout[pend_pe].eq(desc.layout)
            with m.Case(_Pend.C):
                # C's layout must be A's (read just before it on the same PE); its capacity
                # D's TSize unless D is converted.
                layout_ok = ~x.a_local | (desc.layout == r.pe_layout[pend_pe])
                capacity_ok = (f.pre_quant_mode != 0) | (desc.cells == x.tsize_cells[0])
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(cube_primary(dm, dn, acc, layout_ok) & capacity_ok)]
                with m.If(~x.a_local):
                    m.d.sync += r.pe_layout[pend_pe].eq(desc.layout)
            with m.Case(_Pend.SA):
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(ordinary_source(dm, nb, DataType.E8M0.value, 0))]
            with m.Case(_Pend.B):
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(cube_primary(dk, dn, b.b_type,
                                                     desc.layout == Layout.CUBE_N8))]
            with m.Case(_Pend.SB):
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(ordinary_source(nb, dn, DataType.E8M0.value, 0))]
            with m.Case(_Pend.BIAS):
                m.d.comb += [pend_check.eq(Check.MATH_SOURCES),
                             pend_ok.eq(ordinary_source(1, dn, acc, 0))]
        m.d.sync += pend.eq(_Pend.NONE)             # unless a phase issues a read below

        # ---- verdict and transition helpers -------------------------------------------
        def fault(cls, check, pe=0, index=None):
            m.d.sync += [v_outcome.eq(Outcome.FAULT), v_fault.eq(cls), v_check.eq(check),
                         v_pe.eq(pe), v_index.eq(b.boundary_index if index is None else index),
                         phase.eq(Phase.VERDICT)]

        def finish(outcome):
            m.d.sync += [v_outcome.eq(outcome), v_fault.eq(FaultClass.NONE),
                         v_check.eq(Check.NONE), v_pe.eq(0), v_index.eq(0),
                         phase.eq(Phase.VERDICT)]

        def goto(next_phase, next_slot=0):
            m.d.sync += [phase.eq(next_phase), slot.eq(next_slot), word.eq(0)]

        def read_tile(pe, index, kind):
            m.d.comb += [self.tile_rd.en.eq(1), self.tile_rd.pe.eq(pe),
                         self.tile_rd.index.eq(index)]
            m.d.sync += [pend.eq(kind), pend_pe.eq(pe)]

        # ---- the slots of the per-PE phases (slot = pe * 8 + role) ------------------
        post_present = [x.rowmax_in, x.vector_quant, x.vector_quant, x.alpha_vector,
                        x.alpha_vector]
        math_present = [x.a_local, x.uses_acc, x.a_local & x.a_scaled, x.b_local,
                        x.b_local & x.b_scaled, x.uses_bias]

        def slot_vector(present):
            return Cat(*[x.selected[s >> 3] & present[s & 7] if (s & 7) < len(present)
                         else Const(0) for s in range(32)])

        post_vec = _sig(fm, slot_vector(post_present), "post_slots")
        math_vec = _sig(fm, slot_vector(math_present), "math_slots")
        sel_vec = _sig(fm, Cat(*x.selected), "selected_pes")
        post_first = _lowest(fm, post_vec, 32, "post_first")
        post_next = _lowest(nm, post_vec, 32, "post_next", above=slot)
        math_first = _lowest(fm, math_vec, 32, "math_first")
        math_next = _lowest(nm, math_vec, 32, "math_next", above=slot)
        pe_first = _lowest(fm, sel_vec, PE_COUNT, "pe_first")
        pe_next = _lowest(nm, sel_vec, PE_COUNT, "pe_next", above=slot)
        role, slot_pe = slot[0:3], slot[3:5]

        # ---- static checks (the record's facts; the facts submodule) ---------------------
        # Record sanity: rules the decoder already enforces, with the decoder's classes.
        size_codes_ok = _sig(fm, Cat(*[(j >= b.dest_count)
                                       | ((b.destinations[j].size_code >= 1)
                                          & (b.destinations[j].size_code <= 10))
                                       for j in range(3)]).all(), "size_codes_ok")
        fpatr_reserved = _sig(fm, b.fpatr_valid & (~x.mode["known"] | (f.relu_mode > 3)
                                                   | (f.group_n_code > 9)), "fpatr_reserved")
        fpatr_enables_ok = _sig(fm, (~f.row_max_init | f.row_max_en)
                                & (f.group_max_en == (f.group_n_code != 0))
                                & (~f.max_abs_en | f.row_max_en | f.group_max_en),
                                "fpatr_enables_ok")
        ior = b.ior
        i2c_bindings_ok = _sig(fm, (b.local_count == 1) & (b.dest_count == 1) & b.terminated,
                               "i2c_bindings_ok")
        i2c_ior_ok = _sig(fm, ~b.ior_valid | ((ior.reg_src2 == 0) & (ior.reg_dst == 0)),
                          "i2c_ior_ok")
        i2c_dims_ok = _sig(fm, b.dims[0].written
                           & Cat(*[~b.dims[i].written | (x.dims[i] != 0) for i in range(3)]).all(),
                           "i2c_dims_ok")

        def pow2(v):
            return (v != 0) & ((v & (v - 1)) == 0)

        dims_ok = _sig(fm, Mux(x.sc != 0, pow2(dm) & pow2(dn) & pow2(dk),
                               (dm != 0) & (dn != 0) & (dk != 0)), "dims_ok")
        rmode = Mux(b.datr_valid, b.datr.rmode, 0)
        sat = Mux(b.datr_valid, b.datr.sat, 0)
        attributes_ok = _sig(fm, ((rmode == 0) | x.mode["rmode_free"])
                             & (~sat | x.mode["sat_free"]) & ((x.n_slots == 0) | b.ior_valid),
                             "attributes_ok")
        datr_ok = _sig(fm, ~b.datr_valid | ((b.datr.layout == 0) & (b.datr.pad == 0)
                                            & (b.datr.cmode == 0) & (b.datr.canonicalize == 0)),
                       "datr_ok")
        trans_ok = _sig(fm, Mux(x.sc == 0, ~f.trans_a & ~f.trans_b, ~f.trans_a | x.a_shared),
                        "trans_ok")
        acc_ok = _sig(fm, x.mode["built"] & ((f.pre_quant_mode == 0) | (x.mode["source"] == acc)),
                      "acc_ok")
        cd_ok = _sig(fm, ~x.uses_acc | (b.local_sources[0] != b.destinations[0].hand), "cd_ok")

        # Step 10: each selected PE's M layout (A's, else C's, else from M) must hold M.
        have_layout = x.a_local | x.uses_acc
        m_layouts = [_sig(fm, Mux(have_layout, r.pe_layout[pe],
                                 Mux(dm <= 16, Layout.CUBE_M16, Layout.CUBE_M32)),
                          f"m_layout{pe}") for pe in range(PE_COUNT)]
        m_layout_bad = _sig(fm, Cat(*[x.selected[pe] & ~(
            ((m_layouts[pe] == Layout.CUBE_M16) & (dm <= 16))
            | ((m_layouts[pe] == Layout.CUBE_M32) & (dm <= 32))) for pe in range(PE_COUNT)]),
            "m_layout_bad")
        m_layout_fault = _lowest(fm, m_layout_bad, PE_COUNT, "m_layout_bad")

        # Step 11: the lowest free register of each destination's hand (minus those taken
        # by earlier destinations), the core capacity charge and each PE's memory.
        free = ~self.alloc.allocated
        taken, found_bits = [], []
        for j in range(3):
            hand = b.destinations[j].hand
            candidates = Signal(16, name=f"alloc_candidates{j}")
            mask = free.word_select(hand, 16)
            for hand_i, index_i in taken:
                mask = mask & ~Mux(hand_i == hand, Const(1, 16) << index_i, 0)
            fm.d.comb += candidates.eq(mask)
            found, index = _lowest(fm, candidates, 16, f"alloc{j}")
            taken.append((hand, index))
            found_bits.append((j >= b.dest_count) | found)
        group_bytes = Signal(19, name="group_bytes")         # the TSizes of one PE
        fm.d.comb += group_bytes.eq(sum(Mux(j < b.dest_count, x.tsize_cells[j], 0)
                                        for j in range(3)) << 7)
        required = Signal(21, name="required_bytes")
        fm.d.comb += required.eq(group_bytes * sum(x.selected))
        pe_fits = Cat(*[~x.selected[pe] | (self.alloc.pe_bytes_in_use[pe] + group_bytes
                                           <= cfg.tile_bytes_per_pe)
                        for pe in range(PE_COUNT)])
        allocation_ok = _sig(fm, Cat(*found_bits).all()
                             & (self.alloc.capacity_in_use + required <= tile_capacity)
                             & pe_fits.all(), "allocation_ok")

        # ---- the phases ---------------------------------------------------------------
        with m.If(~pend_ok):
            fault(TL, pend_check, pend_pe)
        with m.Else():
            with m.Switch(phase):
                with m.Case(Phase.IDLE):
                    m.d.comb += self.record.ready.eq(1)
                    with m.If(self.record.valid):
                        m.d.sync += rec.eq(self.record.payload)
                        goto(Phase.START)

                with m.Case(Phase.START):
                    with m.If(rec.fault != FaultClass.NONE):
                        fault(rec.fault, Check.RECORD, index=rec.fault_index)
                    with m.Elif(b.noop):
                        finish(Outcome.NOOP)
                    with m.Elif(~x.op_known | ~size_codes_ok | fpatr_reserved):
                        fault(II, Check.WELL_FORMED)
                    with m.Elif(x.is_img2col):
                        with m.If(b.fpatr_valid):
                            fault(BC, Check.WELL_FORMED)
                        with m.Elif(x.sc != 0):
                            fault(TL, Check.WELL_FORMED)
                        with m.Elif(~i2c_bindings_ok | ~i2c_ior_ok):
                            fault(BC, Check.WELL_FORMED)
                        with m.Elif(b.datr_valid & (b.datr.as_value() != 0)):
                            fault(TL, Check.I2C_ATTRIBUTES)
                        with m.Elif(~i2c_dims_ok):
                            fault(TL, Check.I2C_DIMENSIONS)
                        with m.Else():
                            goto(Phase.IOR)
                    with m.Elif(~b.fpatr_valid):
                        fault(BC, Check.WELL_FORMED)
                    with m.Elif(~fpatr_enables_ok):
                        fault(TL, Check.WELL_FORMED)
                    with m.Elif(~x.types_ok):
                        fault(TL, Check.TYPES)
                    with m.Elif(~x.counts_ok):
                        fault(TL, Check.BINDINGS)
                    with m.Else():
                        goto(Phase.IOR)

                with m.Case(Phase.IOR):
                    # Matrix: the scalar words (checked as they arrive); TIMG2COL: posM, posK.
                    reads = Mux(b.ior_valid, Mux(x.is_img2col, 2, x.n_slots), 0)
                    after = Mux(x.is_img2col, Phase.ALLOCATE, Phase.STATIC)
                    with m.If(slot < reads):
                        reg = Mux(slot[0], ior.reg_src1, ior.reg_src0)
                        m.d.comb += [self.gpr_rd.en.eq(reg != 0), self.gpr_rd.addr.eq(reg)]
                        m.d.sync += [pend.eq(_Pend.GPR), pend_slot.eq(slot), pend_pe.eq(0),
                                     pend_zero.eq(reg == 0)]
                    with m.If(slot + 1 >= reads):
                        goto(after)
                    with m.Else():
                        m.d.sync += slot.eq(slot + 1)

                with m.Case(Phase.STATIC):
                    with m.If(~datr_ok):
                        fault(TL, Check.DATR)
                    with m.Elif(~dims_ok):
                        fault(TL, Check.DIMENSIONS)
                    with m.Elif(~attributes_ok):
                        fault(TL, Check.ATTRIBUTES)
                    with m.Elif(x.is_gemv & (dm != 1)):
                        fault(TL, Check.GEMV_M)
                    with m.Else():
                        goto(Phase.SHARED_ENTRY)

                with m.Case(Phase.SHARED_ENTRY):
                    with m.If(~trans_ok):
                        fault(TL, Check.SHARED)
                    with m.Elif(x.sc == 0):
                        goto(Phase.POST_ENTRY)
                    with m.Else():
                        goto(Phase.SHARED_RUN)

                with m.Case(Phase.SHARED_RUN):
                    with m.If(slot < x.sc):
                        m.d.comb += [self.shared_rd.en.eq(1),
                                     self.shared_rd.sid.eq(b.shared_sources[slot[:2]])]
                        m.d.sync += [pend.eq(_Pend.SHARED), pend_slot.eq(slot), pend_pe.eq(0)]
                    with m.If(slot + 1 >= x.sc):
                        goto(Phase.POST_ENTRY)
                    with m.Else():
                        m.d.sync += slot.eq(slot + 1)

                with m.Case(Phase.POST_ENTRY):
                    found, first = post_first
                    with m.If(~acc_ok):
                        fault(TL, Check.POSTPROCESS)
                    with m.Elif(found):
                        goto(Phase.POST_RUN, first)
                    with m.Else():
                        goto(Phase.MATH_ENTRY)

                with m.Case(Phase.POST_RUN):
                    found, nxt = post_next
                    scanning = (role == 2) | (role == 4)
                    vec_index = Mux(role < 3, x.index[OperandRole.QUANT_VECTOR],
                                    x.index[OperandRole.ALPHA_VECTOR])
                    kind = Array([Const(k.value, 4) for k in _POST_ROLES])[role]
                    with m.If(scanning):
                        m.d.comb += [self.word_rd.en.eq(1), self.word_rd.pe.eq(slot_pe),
                                     self.word_rd.index.eq(vec_index),
                                     self.word_rd.addr.eq(word)]
                        m.d.sync += [pend.eq(kind), pend_pe.eq(slot_pe)]
                    with m.Else():
                        read_tile(slot_pe, Mux(role == 0, x.index[OperandRole.ROWMAX_IN],
                                               vec_index), kind)
                    # A scan stays on its slot until word N-1 was issued.
                    with m.If(scanning & (word + 1 < dn)):
                        m.d.sync += word.eq(word + 1)
                    with m.Elif(found):
                        m.d.sync += [slot.eq(nxt), word.eq(0)]
                    with m.Else():
                        goto(Phase.MATH_ENTRY)

                with m.Case(Phase.MATH_ENTRY):
                    found, first = math_first
                    with m.If(found):
                        goto(Phase.MATH_RUN, first)
                    with m.Else():
                        goto(Phase.CD_INDEX)

                with m.Case(Phase.MATH_RUN):
                    found, nxt = math_next
                    roles = (OperandRole.A, OperandRole.C, OperandRole.A_SCALE, OperandRole.B,
                             OperandRole.B_SCALE, OperandRole.BIAS)
                    index = Array([x.index[o] for o in roles])[role]
                    kind = Array([Const(k.value, 4) for k in _MATH_ROLES])[role]
                    read_tile(slot_pe, index, kind)
                    with m.If(found):
                        m.d.sync += slot.eq(nxt)
                    with m.Else():
                        goto(Phase.CD_INDEX)

                with m.Case(Phase.CD_INDEX):
                    with m.If(~cd_ok):
                        fault(TL, Check.CD_INDEX)
                    with m.Else():
                        goto(Phase.M_LAYOUT)

                with m.Case(Phase.M_LAYOUT):
                    bad, bad_pe = m_layout_fault
                    with m.If(bad):
                        fault(TL, Check.M_LAYOUT, bad_pe)
                    with m.Else():
                        for pe in range(PE_COUNT):
                            m.d.sync += r.pe_layout[pe].eq(m_layouts[pe])
                        goto(Phase.ALLOCATE)

                with m.Case(Phase.ALLOCATE):
                    with m.If(~allocation_ok):
                        fault(TA, Mux(x.is_img2col, Check.I2C_ALLOCATION, Check.ALLOCATION))
                    with m.Else():
                        for j, (hand, index) in enumerate(taken):
                            m.d.sync += r.out_index[j].eq(Cat(index, hand))
                        with m.If(x.is_img2col):
                            finish(Outcome.APPROVE)
                        with m.Else():
                            goto(Phase.D_SHAPE, pe_first[1])

                with m.Case(Phase.D_SHAPE):
                    found, nxt = pe_next
                    with m.If(~cube_legal | ((x.tsize_cells[0] << 7) > tile_capacity)):
                        fault(TA, Check.ALLOCATION, slot[:2])
                    with m.Else():
                        m.d.sync += [r.d_cells[slot[:2]].eq(cube_need),
                                     r.d_cell_cols[slot[:2]].eq(cube_cell_cols)]
                        with m.If(found):
                            m.d.sync += slot.eq(nxt)
                        with m.Else():
                            goto(Phase.AUX_SHAPE)

                with m.Case(Phase.AUX_SHAPE):
                    wanted = Mux(aux_is_group, f.group_max_en, f.row_max_en)
                    with m.If(wanted & ~ord_legal):
                        fault(TA, Check.ALLOCATION)
                    with m.Elif(slot == 0):
                        m.d.sync += slot.eq(1)
                    with m.Else():
                        finish(Outcome.APPROVE)

                with m.Case(Phase.VERDICT):
                    m.d.comb += self.verdict.valid.eq(1)
                    with m.If(self.verdict.ready):
                        goto(Mux(v_outcome == Outcome.APPROVE, Phase.HOLD, Phase.IDLE))

                with m.Case(Phase.HOLD):
                    m.d.comb += self.commit_enable.eq(1)
                    with m.If(self.exec_done):
                        goto(Phase.IDLE)

        # ---- outputs ------------------------------------------------------------------
        v = self.verdict.payload
        m.d.comb += [
            v.outcome.eq(v_outcome), v.fault.eq(v_fault), v.fault_index.eq(v_index),
            v.check.eq(v_check), v.pe.eq(v_pe),
            self.approve.eq(self.verdict.valid & (v_outcome == Outcome.APPROVE)),
            self.fault.eq(self.verdict.valid & (v_outcome == Outcome.FAULT)),
            self.noop.eq(self.verdict.valid & (v_outcome == Outcome.NOOP)),
            self.busy.eq(phase != Phase.IDLE),
        ]
        self._drive_plan(pm, x, r)
        return m

    def _drive_plan(self, m, x, r):
        """The plan: combinational from the held record (facts ``x``) and the registers
        ``r`` the phases set; every field the bundle does not use is zero."""
        p, b, f = self.plan, x.b, x.f
        # TIMG2COL's one data type is the record's resolved B.DATR DataType, i.e. the
        # start's unless an all-zero B.DATR (the only one it accepts) selects FP64.
        m.d.comb += [
            p.op.eq(b.op), p.pe_mask.eq(b.pe_mask),
            p.a_type.eq(Mux(x.is_matrix, b.a_type, b.b_type)), p.b_type.eq(b.b_type),
            p.acc_type.eq(Mux(x.is_matrix, x.acc, b.b_type)),
            p.d_type.eq(Mux(x.is_matrix, x.d_type, b.b_type)),
        ]
        for role, (present, shared, index) in x.operands.items():
            with m.If(present):
                o = p.operands[role.value]
                m.d.comb += [o.present.eq(1), o.shared.eq(shared), o.index.eq(index)]

        with m.If(x.is_matrix):
            gn = Signal(8, name="plan_group_n")
            with m.Switch(f.group_n_code):
                for c in range(1, 10):
                    with m.Case(c):
                        m.d.comb += gn.eq(group_n(c))
            m.d.comb += [
                p.m.eq(x.dm), p.n.eq(x.dn), p.k.eq(x.dk),
                p.scale_blocks.eq(Mux(x.a_scaled | x.b_scaled, x.nb, 0)),
                p.a_scaled.eq(x.a_scaled), p.b_scaled.eq(x.b_scaled),
                p.trans_a.eq(f.trans_a), p.trans_b.eq(f.trans_b),
                p.pre_quant_mode.eq(f.pre_quant_mode), p.relu_mode.eq(f.relu_mode),
                p.row_max.eq(f.row_max_en), p.row_max_init.eq(f.row_max_init),
                p.group_max.eq(f.group_max_en), p.max_abs.eq(f.max_abs_en),
                p.quant_source.eq(x.mode["param"]),
                p.alpha_source.eq(Mux(f.relu_mode == 2, ParamSource.SCALAR,
                                      Mux(f.relu_mode == 3, ParamSource.VECTOR,
                                          ParamSource.NONE))),
                # B.IOR slots are dense: the quantization word first, then LReLU's alpha.
                p.quant_scalar.eq(Mux(x.scalar_quant, r.gpr_val[0], 0)),
                p.alpha_scalar.eq(Mux(f.relu_mode == 2,
                                      Mux(x.scalar_quant, r.gpr_val[1], r.gpr_val[0]), 0)),
            ]
            with m.If(f.group_max_en):
                m.d.comb += [p.group_n.eq(gn), p.group_count.eq(x.group_count)]
            out_roles = [Const(OutputRole.D.value, 3),
                         Mux(f.row_max_en, OutputRole.ROW_MAX, OutputRole.GROUP_MAX),
                         Const(OutputRole.GROUP_MAX.value, 3)]
            for j in range(3):
                o = p.outputs[j]
                cols = Mux(out_roles[j] == OutputRole.GROUP_MAX, x.group_count,
                           Mux(j > 0, 1, x.dn))
                with m.If(j < b.dest_count):
                    m.d.comb += [
                        o.role.eq(out_roles[j]), o.index.eq(r.out_index[j]),
                        o.size_code.eq(b.destinations[j].size_code),
                        o.dtype.eq(x.acc if j > 0 else x.d_type),
                        o.rows.eq(x.dm), o.cols.eq(cols), o.phys_cols.eq(cols if j > 0 else 0),
                    ]
            for pe in range(PE_COUNT):
                with m.If(x.selected[pe]):
                    g = p.d_geometry[pe]
                    m.d.comb += [g.layout.eq(r.pe_layout[pe]), g.cells.eq(r.d_cells[pe]),
                                 g.cell_cols.eq(r.d_cell_cols[pe])]
        with m.Else():
            o = p.outputs[0]
            lb0, lb1, lb2 = (b.dims[i] for i in range(3))
            m.d.comb += [
                o.role.eq(OutputRole.IMG2COL), o.index.eq(r.out_index[0]),
                o.size_code.eq(b.destinations[0].size_code), o.dtype.eq(b.b_type),
                o.rows.eq(lb1.value), o.cols.eq(lb0.value),
                o.phys_cols.eq(Mux(lb2.written, lb2.value, lb0.value)),
                p.pos_m.eq(Mux(b.ior_valid, r.gpr_val[0][:16], 0)),
                p.pos_k.eq(Mux(b.ior_valid, r.gpr_val[1][:16], 0)),
            ]


def img2col_job(m, *, plan, desc, fm, tile_capacity, config: CubeConfig = CubeConfig()):
    """The :class:`~ptocube.hdl.img2col_engine.Img2ColJobLayout` of one PE of an approved
    TIMG2COL plan, from that PE's source register ``desc`` (:data:`TileDescLayout`) and its
    feature-map descriptor register ``fm``; combinational, for the top level.

    ``src_legal`` is the model's ``_ordinary_descriptor_legal`` (allocated, row-major,
    capacity legal and within ``tile_capacity``, ordinary geometry holding the valid shape).
    """
    layout = Img2ColJobLayout(config)
    job = Signal(layout, name="img2col_job")
    legal, elements = ordinary_shape(m, dtype=desc.dtype, cells=desc.cells,
                                     phys_cols=desc.phys_cols, valid_rows=desc.valid_rows,
                                     valid_cols=desc.valid_cols, shared=0, name="i2c_src")
    width = layout.members["src_elements"]
    top = (1 << width) - 1
    out = plan.outputs[0]
    m.d.comb += [
        job.fm.eq(fm), job.dtype.eq(plan.a_type),
        job.src_dtype.eq(desc.dtype), job.src_layout.eq(desc.layout),
        job.src_legal.eq(desc.allocated & (desc.layout == Layout.ROW_MAJOR) & legal
                         & ((desc.cells << 7) <= tile_capacity)),
        job.src_matrix.eq(desc.location == TileLocation.MATRIX),
        job.src_elements.eq(Mux(elements > top, top, elements)),
        job.dst_size_code.eq(out.size_code), job.dst_cols.eq(out.phys_cols),
        job.valid_row.eq(out.rows), job.valid_col.eq(out.cols),
        job.pos_m.eq(plan.pos_m), job.pos_k.eq(plan.pos_k),
    ]
    assert FEATURE_MAP_DESCRIPTOR is layout.members["fm"]
    return job
