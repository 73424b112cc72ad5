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
IOR            4b ``dynamic_bindings_complete``: counts,    TileLegality   BINDINGS
               then the B.IOR scalar words (GPR reads)
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

Reads are pipelined: each cycle a phase issues one read (into request registers), and each
read's check is due seven cycles later (a response pipeline that splits the shape rules over
registers), so a fault found in a response preempts whatever the phase does in that cycle; a
phase waits for its reads' checks to be due before the next phase checks anything, which
keeps the model's order.  The facts of the held record are registers too.  Every phase moves
forward only (``docs/hdl-preflight.md``: the ranking argument the formal proof checks, and
the timing notes), so the verdict comes within a bounded number of cycles.

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
from .img2col_engine import Img2ColJobLayout
from .logic import load_in_shares, register_copies
from .param_check import ParamCheck
from .tile_desc import (OperandRole, OutputRole, ParamSource, PlanLayout, SharedDescLayout,
                        TileDescLayout, TileLocation)

__all__ = ["Outcome", "Check", "Phase", "VerdictLayout", "TileReadSignature",
           "SharedReadSignature", "WordReadSignature", "GprReadSignature",
           "AllocQuerySignature", "Preflight", "ordinary_shape", "cube_shape", "img2col_job",
           "IMG2COL_JOB_CYCLES", "one_hot_index"]


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


#: Cycles a phase waits after its last read before the next phase checks anything: a read
#: issued in cycle t is on the port in t+1 (the request registers) and checked in t+7 (the
#: response pipeline), the next phase's first cycle, where that check has priority - the
#: model's order is kept.  Counted, not read off
#: the pipeline, so that every waiting phase ends within a fixed number of cycles (the
#: formal proof's ranking cannot wrap around).
_DRAIN = 5

#: Copies of ``record.ready``, each enabling a share of the held record (issue #9).
_RECORD_ENABLES = 4

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

#: Tile payload read port (latency 2): 64-bit word ``addr`` (payload bytes 8*addr..8*addr+7,
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


def _reg(m, value, name):
    """``value`` registered in ``m``: it follows its inputs one cycle late.  Every fact of
    the held record is such a register (or a chain of them): the record is held from START
    to the verdict, so a fact ``d`` registers deep is valid from the ``d``-th cycle after
    START's first (``docs/hdl-preflight.md``, "Pipelined facts")."""
    value = Value.cast(value)
    signal = Signal(value.shape(), name=name)
    m.d.sync += signal.eq(value)
    return signal


def _registered(m, tree, name):
    """A copy of ``tree`` (facts: Values, nested in dicts, lists and tuples; ints kept)
    with every Value replaced by a register of it (:func:`_reg`), enum shapes kept."""
    if isinstance(tree, dict):
        return {k: _registered(m, v, f"{name}_{getattr(k, 'name', k)}".lower())
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_registered(m, v, f"{name}{i}") for i, v in enumerate(tree))
    if isinstance(tree, int):
        return tree
    if isinstance(tree, Signal):
        signal = Signal.like(tree, name=f"{name}_q")
        m.d.sync += signal.eq(tree)
        return signal
    return _reg(m, tree, f"{name}_q")


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


def _lowest(m, vector, width, name):
    """``(found, index)`` of the lowest set bit of ``vector``.

    The lowest candidate is isolated on the carry chain (``v & -v``) and its index is an OR
    tree per bit: a priority chain of ``width`` muxes was the preflight's longest path
    (14 LUT levels from ``slot`` back to ``slot``, ``synth --paths``).
    """
    found = Signal(name=f"{name}_found")
    index = Signal(range(width), name=f"{name}_index")
    candidates = Signal(width, name=f"{name}_candidates")
    lowest = Signal(width, name=f"{name}_lowest")
    m.d.comb += [candidates.eq(vector), lowest.eq(candidates & ~(candidates - 1)),
                 found.eq(candidates.any())]
    m.d.comb += index.eq(one_hot_index(lowest, width))
    return found, index


def one_hot_index(value, width):
    """The position of the set bit of a one-hot ``value`` of ``width`` bits, one OR tree per
    bit of the position (with several bits set: the OR of their positions)."""
    return Cat(*(Cat(*(value[i] for i in range(width) if i >> k & 1)).any()
                 for k in range(max(1, (width - 1).bit_length()))))


def _no_cut(value, name):
    """The identity: the shape rule in one combinational piece."""
    return value


def ordinary_shape(m, *, dtype, cells, phys_cols, valid_rows, valid_cols, shared, name,
                   cut=_no_cut, cut_rows=_no_cut, cut_legal=_no_cut):
    """The row-major descriptor rule of :func:`ptocube.model.layout.ordinary_shape_legal`.

    ``cells`` is the capacity in CELLs, legal from 1 to 512 (64 KiB; ``shared``: 2048, 256
    KiB).  ``phys_cols`` must be a power of two, a row must divide the capacity, the derived
    row count must be at most 65535 and hold ``valid_rows``, and ``valid_cols`` <=
    ``phys_cols``.  Returns ``(legal, elements)``: elements = capacity bits / element bits.
    ``cut(value, name)`` is applied to every value that crosses the middle of the rule: the
    identity (combinational), or a register (:class:`Preflight` splits it over two cycles).
    ``cut_rows`` likewise, after the shifts that form the row and element counts and before
    the compares (:func:`img2col_job` splits the rule over three cycles); ``cut_legal`` on
    each term of the final AND (the preflight's response pipeline splits it over four).
    """
    lb = _log2_bits(m, dtype, f"{name}_lb")
    pow2 = (phys_cols != 0) & ((phys_cols & (phys_cols - 1)) == 0)
    # log2 of the columns as OR trees of their bits: exact for a power of two, and any other
    # count fails ``pow2`` whatever ``lc`` says (a 16-deep priority chain was the longest
    # path after the descriptor memories, ``ptocube synth --paths``).
    lc = Signal(4, name=f"{name}_lc")
    m.d.comb += lc.eq(one_hot_index(phys_cols, 16))
    max_cells = Mux(shared, 2048, 512)
    # The early comparisons cross the cut apart (in one AND behind the wide comparisons they
    # were the longest path into it).
    early = ((cells != 0) & (cells <= max_cells), pow2, valid_cols <= phys_cols)
    # A row divides the capacity (``cells`` * 1024 bits) when it has no more trailing zero
    # bits than the capacity: a comparison of logarithms after the cut (a mask of the row's
    # bits and a zero test of the capacity under it was 14 levels, issue #9).  ``cells`` =
    # 0 fails ``early``.
    width = len(Value.cast(cells))
    tz = Signal(range(width), name=f"{name}_cells_tz")
    m.d.comb += tz.eq(one_hot_index(cells & ~(cells - 1), width))
    # The element count (capacity bits over element bits) crosses the cut, the row count is
    # that over the columns after it; the two logarithms cross it and are added after it
    # (the sum behind the column count's OR trees was the longest path of the preflight's
    # response stage, and the shift by the sum after the cut 6 levels).
    # One shift per type code (the type's log2, then a shift by it, were 7 levels).
    elements = Signal(22, name=f"{name}_elements")
    with m.Switch(dtype):
        for t in DataType:
            with m.Case(t.value):
                m.d.comb += elements.eq((cells << 10) >> (t.bits.bit_length() - 1))
        with m.Default():
            m.d.comb += elements.eq((cells << 10) >> 3)     # as ``_log2_bits``
    early = Cat(*(cut(v, f"{name}_early{i}_cut") for i, v in enumerate(early))).all()
    lc, lb, elements, valid_rows, tz = (cut(v, f"{name}_{k}_cut") for k, v in (
        ("lc", lc), ("lb", lb), ("elements", elements), ("valid_rows", valid_rows),
        ("tz", tz)))
    e = Signal(5, name=f"{name}_row_log2")          # log2 of the bits in one row
    m.d.comb += e.eq(lc + lb)
    rows = Signal(22, name=f"{name}_rows")
    m.d.comb += rows.eq(elements >> lc)
    divisible = e <= tz + 10
    early, divisible, rows, valid_rows, elements = (
        cut_rows(v, f"{name}_{k}_cut_rows") for k, v in (
            ("early", early), ("divisible", divisible), ("rows", rows),
            ("valid_rows", valid_rows), ("elements", elements)))
    # ``rows`` fits 16 bits and holds ``valid_rows``: the high bits' zero test and one
    # 16-bit comparison instead of two 22-bit ones.
    terms = (early, divisible, rows[16:] == 0, valid_rows <= rows[:16])
    legal = Signal(name=f"{name}_legal")
    m.d.comb += legal.eq(Cat(*(cut_legal(v, f"{name}_term{i}_cut_legal")
                               for i, v in enumerate(terms))).all())
    return legal, elements


def cube_shape(m, *, layout, dtype, rows, cols, cells, name, cut=_no_cut, cut_need=_no_cut,
               cut_legal=_no_cut):
    """The CUBE descriptor shape rule of :func:`ptocube.model.layout.cube_shape_legal`.

    A CUBE layout and a CUBE type, ``rows`` x ``cols`` both nonzero, M within the CELL
    height of an M layout, storage within the 32768-element model bound and the CELLs
    within ``cells`` (itself 1..512).  Returns ``(legal, cells_needed, cell_cols)``;
    ``cut`` as in :func:`ordinary_shape`, before the CELL-count product, ``cut_need`` after
    it (a multiplier's input and output registers), ``cut_legal`` on each term of the final
    AND.
    """
    lb = _log2_bits(m, dtype, f"{name}_lb")
    supported = _in_set(dtype, [t for t in DataType if cube_dtype_supported(t)])
    n8 = layout == Layout.CUBE_N8
    m16 = layout == Layout.CUBE_M16
    m32 = layout == Layout.CUBE_M32
    # CUBE_N8 CELLs are (2**(7-lb)) K x 8 N; an M layout's are 16 or 32 rows of 2**(6-lb)
    # or 2**(5-lb) columns (lb = log2 element bits; meaningful for supported types only).
    # Shift amounts are 3 bits wide (they wrap for the types no CUBE layout supports); one
    # rounded quotient per shift, in parallel, then a choice: no variable shift on the path.
    # An M layout's shift crosses the cut, its quotients come after it (with the choice of
    # lb and layout before them, they were the longest path into the cut, issue #9).
    k_rep_n8 = Signal(16, name=f"{name}_k_rep_n8")
    sh_m = Signal(3, name=f"{name}_sh_m")
    cell_cols = Signal(5, name=f"{name}_cell_cols")
    limit = Signal(13, name=f"{name}_limit")           # 32768 elements in CELLs

    def ceil_shift(v, sh):
        return (v + (1 << sh) - 1) >> sh

    with m.Switch(lb):
        for value in range(8):
            with m.Case(value):
                sh_n8, sh_m16, sh_m32 = (7 - value) % 8, (6 - value) % 8, (5 - value) % 8
                m.d.comb += [
                    k_rep_n8.eq(ceil_shift(rows, sh_n8)),
                    sh_m.eq(Mux(m16, sh_m16, sh_m32)),
                    cell_cols.eq(Mux(n8, 8, Mux(m16, (1 << sh_m16) & 0x1F,
                                                (1 << sh_m32) & 0x1F))),
                    limit.eq(1 << (value + 5)),
                ]
    n_rep = Signal(14, name=f"{name}_n_rep")
    m.d.comb += n_rep.eq((cols + 7) >> 3)
    # The early comparisons cross the cut apart, as in :func:`ordinary_shape`.
    early = Cat(*(cut(v, f"{name}_early{i}_cut") for i, v in enumerate((
        supported & (n8 | m16 | m32), (rows != 0) & (cols != 0),
        (~m16 | (rows <= 16)) & (~m32 | (rows <= 32)), (cells != 0) & (cells <= 512))))).all()
    n8, k_rep_n8, n_rep, sh_m, cols, limit, cells, cell_cols = (
        cut(v, f"{name}_{k}_cut") for k, v in (
            ("n8", n8), ("k_rep_n8", k_rep_n8), ("n_rep", n_rep),
            ("sh_m", sh_m), ("cols", cols), ("limit", limit), ("cells", cells),
            ("cell_cols", cell_cols)))
    # Only the shifts of the supported types' element widths (a choice of 5 quotients,
    # not 8: the others fail ``early``).
    k_rep_m = Signal(16, name=f"{name}_k_rep_m")
    with m.Switch(sh_m):
        log2_bits = {t.bits.bit_length() - 1 for t in DataType if cube_dtype_supported(t)}
        for sh in sorted({s for lb in log2_bits for s in (6 - lb, 5 - lb)}):
            with m.Case(sh):
                m.d.comb += k_rep_m.eq(ceil_shift(cols, sh))
    need = Signal(30, name=f"{name}_cells_needed")
    m.d.comb += need.eq(Mux(n8, k_rep_n8 * n_rep, k_rep_m))
    # Within both bounds: within the lower one, chosen before ``cut_need`` (both fit 13
    # bits), so that one comparison follows it.
    bound = Signal(13, name=f"{name}_bound")
    m.d.comb += bound.eq(Mux(limit <= cells, limit, cells))
    early, need, bound = (cut_need(v, f"{name}_{k}_cut_need") for k, v in (
        ("early", early), ("need", need), ("bound", bound)))
    terms = (early, need[13:] == 0, need[:13] <= bound)
    legal = Signal(name=f"{name}_legal")
    m.d.comb += legal.eq(Cat(*(cut_legal(v, f"{name}_term{i}_cut_legal")
                               for i, v in enumerate(terms))).all())
    return legal, need, cell_cols


def _group_count(m, code, n):
    """ceil(N / GroupN) for GroupNCode ``code`` (0 for code 0 or a reserved code), three
    registers deep (:func:`_reg`): operand, product, shifted result.

    GroupN = 2**s * q with q in {1, 3, 5, 7}: ceil(ceil(N / 2**s) / q), the division by q a
    multiplication by a reciprocal that is exact for every 16-bit N (checked here).
    """
    pre = Signal(17, name="group_count_pre")
    mul = Signal(12, name="group_count_mul")
    shifts = {}
    with m.Switch(code):
        for c in range(1, 10):
            gn = group_n(c)
            s = (gn & -gn).bit_length() - 1
            q = gn >> s
            limit = ((1 << 16) + (1 << s) - 1 >> s) + q
            shifts[c] = (0, 1) if q == 1 else _reciprocal(q, limit)[::-1]
            # ceil(N / 2**s) + q - 1 == (N + GroupN - 1) >> s: one addition.
            with m.Case(c):
                m.d.sync += [pre.eq((n + gn - 1) >> s), mul.eq(shifts[c][1])]
    product = _reg(m, pre * mul, "group_count_product")
    out = Signal(16, name="group_count")
    with m.Switch(code):
        for c, (shift, _) in shifts.items():
            with m.Case(c):
                m.d.sync += out.eq(product >> shift)
        with m.Default():
            m.d.sync += out.eq(0)
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
    params = {ParamKind.NONE: ParamSource.NONE, ParamKind.SCALAR: ParamSource.SCALAR,
              ParamKind.VECTOR: ParamSource.VECTOR}
    columns = {
        "known": (1, lambda code, row: 1),
        "source": (5, lambda code, row: 0 if row.source is None else row.source.value),
        "d": (5, lambda code, row: 0 if row.d_dtype is None else row.d_dtype.value),
        "param": (ParamSource, lambda code, row: params[row.param].value),
        "rmode_free": (1, lambda code, row: int(row.rmode_free)),
        "sat_free": (1, lambda code, row: int(row.sat_free)),
        "built": (1, lambda code, row: int(code in built)),
    }
    # Each bit a constant indexed by the code (a 6-input function: a LUT and its muxes),
    # not a case per code (a compare per code and a priority mux: 8 levels on the facts).
    f = {}
    for key, (shape, value) in columns.items():
        f[key] = Signal(shape, name=f"mode_{key}")
        width = Value.cast(f[key]).shape().width
        m.d.comb += Value.cast(f[key]).eq(Cat(*(
            _in_set(mode, [c for c, row in PREQUANT_MODES.items() if value(c, row) >> i & 1])
            for i in range(width))))
    return f


# ---------------------------------------------------------------------------
# The preflight
# ---------------------------------------------------------------------------

#: Facts that are fields of the held record itself (or registers already): not registered.
_RECORD_FACTS = frozenset({"b", "f", "dims", "dm", "dn", "dk", "sc", "selected",
                           "group_count"})


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
        # Internal state the formal harness observes (created in elaborate): the phase is
        # kept one-hot (``at``, bit ``Phase.X.value``); ``phase`` is its encoding.
        self.at = Signal(len(Phase), name="at_phase", init=1 << Phase.IDLE.value)
        self.phase = Signal(Phase, name="phase")
        self.slot = Signal(5, name="slot")
        self.word = Signal(16, name="word")
        self.walk_found = Signal(name="walk_found")
        self.walk_after_found = Signal(name="walk_after_found")
        self.walk_rest = Signal(32, name="walk_rest")
        #: The slots a walk has still to visit, as a number each step lowers.
        self.walk = Cat(self.walk_rest, self.walk_after_found, self.walk_found)
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

        # Step 4b: the operand groups (the counts: :meth:`_counts_ok`).
        x.left = _sig(m, 1 + x.a_scaled, "left_group")
        x.right = _sig(m, 1 + x.b_scaled, "right_group")
        x.sc = sc = b.shared_count

        # Where each operand is: positions in the Local stream ([C] [A [sA]] [B [sB]] [Bias]
        # [RowMaxIn] [quant vector] [alpha vector]) or in the Shared stream ([A [sA]] B [sB]).
        x.a_local = _sig(m, (sc == 0) | (sc == x.right), "a_local")
        x.b_local = _sig(m, sc == 0, "b_local")
        x.a_shared = _sig(m, (sc != 0) & ~x.a_local, "a_shared")
        x.b_shared = _sig(m, sc != 0, "b_shared")
        # Each position counts the operands before it: a sum of registered one-bit facts,
        # registered, and of registered pairs of them (a chain of additions from the record
        # and the list index behind it were 10 levels, a sum of eight bits 7; the indices
        # are four registers deep, and the per-PE phases that use them come at least seven
        # cycles after START's first).
        before = [_reg(m, v, f"pos_term{i}") for i, v in enumerate((
            x.uses_acc, x.a_local, x.a_local & x.a_scaled, x.b_local, x.b_local & x.b_scaled,
            x.uses_bias, x.rowmax_in, x.vector_quant))]
        pairs = [_reg(m, before[i] + before[i + 1], f"pos_pair{i}") for i in range(0, 8, 2)]
        odd = [_reg(m, before[i], f"pos_odd{i}") for i in range(0, 8, 2)]
        pos = {k: _reg(m, sum(pairs[:n // 2]) + (odd[n // 2] if n % 2 else 0), f"pos_{k}")
               for k, n in (("a", 1), ("b", 3), ("bias", 5), ("rowmax", 6), ("qvec", 7),
                            ("avec", 8))}
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

    @staticmethod
    def _counts_ok(x):
        """Step 4b's binding counts, from the facts ``x`` (registers: :meth:`elaborate`):
        its terms, which hold together."""
        b, f, sc, lc = x.b, x.f, x.sc, x.b.local_count
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
        return (shared_ok, lc == math_count + post_count,
                (b.dest_count == 1 + f.row_max_en + f.group_max_en) & b.terminated,
                ior_fields_ok)

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
        at, slot, word, rec = self.at, self.slot, self.word, self.rec
        for p in Phase:
            with m.If(at[p.value]):
                m.d.comb += self.phase.eq(p)
        # The facts, computed combinationally from the held record (``xc``), are used as
        # registers (``x``): valid from START's second cycle, as the FSM needs them.
        xc = self._facts(fm, rec)
        x = SimpleNamespace(**{k: v if k in _RECORD_FACTS else _registered(fm, v, k)
                               for k, v in vars(xc).items()})
        b, f = x.b, x.f
        dm, dn, dk, nb, acc = x.dm, x.dn, x.dk, x.nb, x.acc
        TL, TA = FaultClass.TILE_LEGALITY, FaultClass.TILE_ALLOCATION
        BC, II = FaultClass.BUNDLE_CONTROL, FaultClass.ILLEGAL_INSTRUCTION

        # ---- registers --------------------------------------------------------------
        # A phase issues a read into request registers; the ports show it the next cycle
        # straight from flip-flops (the phase decode and the word counter's adder were in
        # front of the tile store's arbitration and its memories' read addresses, the unit's
        # longest paths, issue #9).  ``issue`` names the read's check, ``pend`` follows it
        # into the cycle of the answer.
        issue = Signal(_Pend, name="issue")
        issue_pe = Signal(2, name="issue_pe")
        issue_slot = Signal(2, name="issue_slot")
        issue_zero = Signal(name="issue_gpr_zero")
        req = {name: {k: Signal(w, name=f"req_{name}_{k}") for k, w in fields}
               for name, fields in (("tile", (("en", 1), ("pe", 2), ("index", 6))),
                                    ("shared", (("en", 1), ("sid", 8))),
                                    ("word", (("en", 1), ("pe", 2), ("index", 6),
                                              ("addr", 16))),
                                    ("gpr", (("en", 1), ("addr", 5))))}
        for name, port in (("tile", self.tile_rd), ("shared", self.shared_rd),
                           ("word", self.word_rd), ("gpr", self.gpr_rd)):
            m.d.comb += [getattr(port, k).eq(v) for k, v in req[name].items()]
        # The record handshake ends in a flag, not in the phase: ``record.valid`` comes from
        # deep in the decoder and the host interface (issue #9).  IDLE with ``accepted`` is the
        # first cycle of the record's check (the pass-through bits).  ``ready`` is a register
        # too (IDLE without ``accepted``) and the held record follows the payload in every
        # cycle it is high, so that the record's 309 clock enables come from a flip-flop, not
        # from ``valid`` (issue #9): only the record taken stays.
        accepted = Signal(name="accepted")
        ready = Signal(name="record_ready", init=1)
        pend = Signal(_Pend, name="pend")                 # check due on this cycle's response
        pend_pe = Signal(2, name="pend_pe")
        pend_slot = Signal(2, name="pend_slot")
        pend_zero = Signal(name="pend_gpr_zero")          # that GPR read was GPR 0
        r = SimpleNamespace(
            gpr_val=Array(Signal(64, name=f"gpr_val{i}") for i in range(2)),
            pe_layout=Array(Signal(3, name=f"pe_layout{pe}") for pe in range(PE_COUNT)),
            out_index=Array(Signal(6, name=f"out_index{j}") for j in range(3)),
        )
        v_outcome = Signal(Outcome, name="v_outcome")
        v_fault = Signal(FaultClass, name="v_fault")
        v_record = Signal(name="v_record")       # the index is the record's fault_index
        v_check = Signal(Check, name="v_check")
        v_pe = Signal(2, name="v_pe")
        tile_capacity = self.alloc.tile_capacity

        def cap_ok(cells):
            """TileCapacityIsLegal for a Local tile: 1..512 CELLs and within the core limit."""
            return (cells != 0) & (cells <= 512) & ((cells << 7) <= tile_capacity)

        # ---- the output shapes, registers of the facts (D_SHAPE, AUX_SHAPE) ---------------
        # D's layout on a PE is M16 or M32 by then (step 10): one unit for each.  Both
        # are pipelined like the response units: D_SHAPE comes long after START.
        def fcut(value, name):
            return _reg(fm, value, name)

        d_shape = {}
        d_rows, d_cols = _reg(fm, dm, "d_rows"), _reg(fm, dn, "d_cols")
        for layout in (Layout.CUBE_M16, Layout.CUBE_M32):
            name = f"d_{layout.name.lower()}"
            legal, need, cell_cols = cube_shape(
                fm, layout=Const(layout.value, 3), dtype=x.d_type, rows=d_rows, cols=d_cols,
                cells=x.tsize_cells[0], name=name, cut=fcut, cut_need=fcut)
            d_shape[layout] = tuple(_reg(fm, v, f"{name}_{k}_q") for k, v in (
                ("legal", legal), ("need", need), ("cell_cols", cell_cols)))
        # Each PE's choice by its layout, registered (``pe_layout`` is final from M_LAYOUT's
        # end, ALLOCATE comes between): D_SHAPE and the plan choose by PE only.
        d_by_pe = [[_reg(fm, Mux(r.pe_layout[pe] == Layout.CUBE_M16, u, v)[:w], f"d_{k}{pe}")
                    for k, w, u, v in zip(("legal", "cells", "cell_cols"), (1, 10, 5),
                                          d_shape[Layout.CUBE_M16], d_shape[Layout.CUBE_M32])]
                   for pe in range(PE_COUNT)]
        r.d_cells, r.d_cell_cols = ([d_by_pe[pe][k] for pe in range(PE_COUNT)] for k in (1, 2))
        # RowMaxOut (AUX_SHAPE slot 0): M x 1; GroupMaxOut (slot 1): M x group count.
        aux_legal = []
        for j, cols in ((1, 1), (2, x.group_count)):
            cells = x.tsize_cells[1] if j == 1 else Mux(f.row_max_en, x.tsize_cells[2],
                                                        x.tsize_cells[1])
            cols16 = Signal(16, name=f"aux{j}_cols")
            fm.d.comb += cols16.eq(cols)
            legal, _ = ordinary_shape(fm, dtype=acc, cells=cells, phys_cols=cols16,
                                      valid_rows=dm, valid_cols=cols16, shared=0,
                                      name=f"aux{j}", cut=fcut, cut_rows=fcut)
            aux_legal.append(_reg(fm, legal, f"aux{j}_legal_q"))
        aux_is_group = slot[0]                  # AUX_SHAPE: slot 0 RowMaxOut, 1 GroupMaxOut

        # Three registers deep (its terms, then their AND): IOR's first cycle is START's
        # fourth.
        counts_ok = _reg(fm, Cat(*(_reg(fm, v, f"counts_ok{i}")
                                   for i, v in enumerate(self._counts_ok(x)))).all(),
                         "counts_ok")
        # IOR's reads and end, two registers deep (from the registered slot count).
        ior_reads = _reg(fm, Mux(b.ior_valid, Mux(x.is_img2col, 2, x.n_slots), 0), "ior_reads")
        # IOR ends at slot ``n + _DRAIN``: after its reads and the drain (TIMG2COL: posM and
        # posK are not checked, so no drain, but one cycle for posK to reach its register by
        # the verdict, which the plan carries), or at slot 0 without reads.  For
        # ``slot_done`` (below): that slot less one, and whether it is 0.
        ior_end_less1 = _reg(fm, Mux(b.ior_valid & x.is_matrix & (x.n_slots != 0),
                                     x.n_slots + _DRAIN - 1,
                                     Mux(b.ior_valid & x.is_img2col, 2, 0)), "ior_end_less1")
        ior_end_zero = _reg(fm, ~b.ior_valid | (x.is_matrix & (x.n_slots == 0)), "ior_end_zero")
        dn_last = _reg(fm, dn - 1, "dn_last")
        # For ``stay`` one word ahead: ``word + 1 < dn_last`` is ``word < dn_before_last``.
        dn_before_last = _reg(fm, Mux(dn_last == 0, 0, dn_last - 1), "dn_before_last")
        dn_several = _reg(fm, dn_last != 0, "dn_several")
        # SHARED_RUN's reads, drained, end at slot ``sc + _DRAIN``: less one.
        shared_end_less1 = _reg(fm, x.sc + _DRAIN - 1, "shared_end_less1")
        dm_le16 = _reg(fm, dm <= 16, "dm_le16")
        dm_le32 = _reg(fm, dm <= 32, "dm_le32")

        # ---- the response pipeline ----------------------------------------------------
        # A read issued in cycle t is answered in t+1 (``pend`` names the check due); the
        # answer is registered as it comes, nothing else (a block RAM's unregistered output
        # leaves room for no logic).  In t+2 (stage 0, ``pend0``) the registered answer is
        # compared with the expected shape (registered from ``pend`` in t+1) and the first
        # third of the shape rules is computed; in t+3 (stage 1, ``pend1``) the check of the
        # read's kind is chosen into ``pend2_ok``, with the CUBE CELL count's product and the
        # ordinary rule's shifts; in t+4 (stage 2) their comparisons are registered term by
        # term, and in t+5 (stage 3) their AND completes the check into ``pend4_ok``, which
        # the FSM obeys in t+6.  Checks stay in read order; a phase moves on to a checking
        # phase only :data:`_DRAIN` cycles after its last read, when every read's check is
        # due by its first cycle.  A payload word (``word_rd``) is answered in t+2 and its
        # checks are a stage behind, chosen in t+4 into ``pend3_word_ok``, in time for
        # ``pend4_ok``.
        pend0 = Signal(_Pend, name="pend0")
        pend0_pe = Signal(2, name="pend0_pe")
        pend0_slot = Signal(2, name="pend0_slot")
        pend1 = Signal(_Pend, name="pend1")
        pend1_pe = Signal(2, name="pend1_pe")
        pend1_slot = Signal(2, name="pend1_slot")
        pend2_pe = Signal(2, name="pend2_pe")
        pend2_ok = Signal(name="pend2_ok", init=1)
        pend2_param_ok = Signal(name="pend2_param_ok", init=1)
        pend2_qword = Signal(name="pend2_qword")          # a parameter tile's words
        pend2_aword = Signal(name="pend2_aword")
        pend2_cube = Signal(name="pend2_cube")
        pend2_ord = Signal(name="pend2_ord")
        pend2_check = Signal(Check, name="pend2_check")
        pend3_pe = Signal(2, name="pend3_pe")
        pend3_ok = Signal(name="pend3_ok", init=1)
        pend3_cube = Signal(name="pend3_cube")
        pend3_ord = Signal(name="pend3_ord")
        pend3_check = Signal(Check, name="pend3_check")
        pend3_word_ok = Signal(name="pend3_word_ok", init=1)
        pend4_pe = Signal(2, name="pend4_pe")
        pend4_ok = Signal(name="pend4_ok", init=1)
        pend4_check = Signal(Check, name="pend4_check")
        with m.If(at[Phase.IDLE.value]):
            m.d.sync += [pend0.eq(_Pend.NONE), pend1.eq(_Pend.NONE), pend2_ok.eq(1),
                         pend2_param_ok.eq(1), pend2_qword.eq(0), pend2_aword.eq(0),
                         pend2_cube.eq(0), pend2_ord.eq(0), pend3_ok.eq(1), pend3_cube.eq(0),
                         pend3_ord.eq(0), pend3_word_ok.eq(1), pend4_ok.eq(1)]
        with m.Else():
            m.d.sync += [pend0.eq(pend), pend0_pe.eq(pend_pe), pend0_slot.eq(pend_slot),
                         pend1.eq(pend0), pend1_pe.eq(pend0_pe), pend1_slot.eq(pend0_slot),
                         pend2_pe.eq(pend1_pe),
                         pend3_pe.eq(pend2_pe), pend3_check.eq(pend2_check),
                         pend3_ok.eq(pend2_ok & pend2_param_ok), pend3_cube.eq(pend2_cube),
                         pend3_ord.eq(pend2_ord),
                         pend4_pe.eq(pend3_pe), pend4_check.eq(pend3_check)]
        pend_ok, pend_check, pend_pe_due = pend4_ok, pend4_check, pend4_pe

        # t+1: the answers, registered; and what the answer must show, from ``pend``.
        desc, sdesc = Signal(TileDescLayout, name="desc_r"), Signal(SharedDescLayout,
                                                                    name="sdesc_r")
        m.d.sync += [desc.eq(self.tile_rd.desc), sdesc.eq(self.shared_rd.desc)]
        defined = _reg(sm, self.tile_rd.defined, "defined_r")
        sdefined = _reg(sm, self.shared_rd.defined, "sdefined_r")
        # GPR 0 reads as zero: cleared as it is registered (the GPR read data is a register
        # of the tile store's; a choice after this register was in front of the checks' zero
        # tests).
        gpr_data = _reg(sm, Mux(pend_zero, 0, self.gpr_rd.data), "gpr_data_r")
        # The word is registered only in the cycle its answer is on the port, in t+2 (the
        # store's payload reads have an ``out`` register after the block RAM's, decision
        # T39 in docs/decisions/hdl-top.md): a register that followed the port in every
        # cycle was one flip-flop with the store's own copies of the same bus (yosys merges
        # them), whose fan-out crossed the device.
        word_data = Signal(64, name="word_data_r")
        with sm.If(_reg(sm, _reg(sm, self.word_rd.en, "word_read"), "word_answer")):
            sm.d.sync += word_data.eq(self.word_rd.data)
        # Local sources: the valid shape and type, whether the location must be Any, and
        # which layout rule applies.
        exp = {k: Signal(w, name=f"expect_{k}") for k, w in (
            ("rows", 16), ("cols", 16), ("dtype", 5), ("any", 1), ("m_layout", 1),
            ("n8", 1))}
        expected = {
            _Pend.ROWMAX: (dm, 1, acc, 1), _Pend.QVEC: (1, dn, DataType.U64.value, 1),
            _Pend.AVEC: (1, dn, DataType.U64.value, 1), _Pend.A: (dm, dk, b.a_type, 0),
            _Pend.C: (dm, dn, acc, 0), _Pend.SA: (dm, nb, DataType.E8M0.value, 0),
            _Pend.B: (dk, dn, b.b_type, 0), _Pend.SB: (nb, dn, DataType.E8M0.value, 0),
            _Pend.BIAS: (1, dn, acc, 0)}
        with sm.Switch(pend):
            for kind, (rows, cols, dtype, any_) in expected.items():
                with sm.Case(kind):
                    sm.d.sync += [exp["rows"].eq(rows), exp["cols"].eq(cols),
                                  exp["dtype"].eq(dtype), exp["any"].eq(any_)]
        # The layout rule: A's M layout holds M, B's is N8, else (C) A's layout.
        sm.d.sync += [exp["m_layout"].eq(pend == _Pend.A), exp["n8"].eq(pend == _Pend.B)]
        # Shared slot j -> its role (0 A, 1 sA, 2 B, 3 sB), the stored shape (a transposed
        # primary is stored transposed) and the type: per slot from the record's facts (two
        # registers deep; SHARED_RUN comes later), then chosen by the slot of ``pend``.
        by_role = {"rows": [Mux(f.trans_a, dk, dm), dm, Mux(f.trans_b, dn, dk), nb],
                   "cols": [Mux(f.trans_a, dm, dk), nb, Mux(f.trans_b, dk, dn), dn],
                   "type": [b.a_type, Const(DataType.E8M0.value, 5), b.b_type,
                            Const(DataType.E8M0.value, 5)]}
        per_slot = {k: [] for k in by_role}
        for j in range(4):
            srole = Mux(x.a_shared & (j == 0), 0,
                        Mux(x.a_shared & x.a_scaled & (j == 1), 1,
                            Mux(x.spos_b == j, 2, 3)))
            for k, values in by_role.items():
                per_slot[k].append(_reg(fm, Array(values)[srole], f"shared{j}_{k}"))
        s_rows, s_cols, s_type = (_reg(fm, Array(per_slot[k])[pend_slot], f"shared_{k}")
                                  for k in ("rows", "cols", "type"))

        # Stage 0: the registered answer against the expectation, the shape rules' first part.
        def cut(value, name):
            return _reg(sm, value, name)

        ord_in = {k: Signal(w, name=f"ord_{k}") for k, w in (
            ("dtype", 5), ("cells", 12), ("phys_cols", 16), ("valid_rows", 16),
            ("valid_cols", 16), ("shared", 1))}
        ord_legal, _ = ordinary_shape(sm, name="ord", cut=cut, cut_rows=cut, cut_legal=cut,
                                      **ord_in)
        cube_legal, _, _ = cube_shape(sm, name="cube", cut=cut, cut_need=cut, cut_legal=cut,
                                      layout=desc.layout, dtype=desc.dtype,
                                      rows=desc.valid_rows, cols=desc.valid_cols,
                                      cells=desc.cells)
        # Which answer the ordinary rule takes, from ``pend`` (a register, not a decode).
        with m.If(_reg(sm, pend == _Pend.SHARED, "answer_shared")):
            m.d.comb += [ord_in["dtype"].eq(sdesc.dtype), ord_in["cells"].eq(sdesc.cells),
                         ord_in["phys_cols"].eq(sdesc.phys_cols),
                         ord_in["valid_rows"].eq(sdesc.valid_rows),
                         ord_in["valid_cols"].eq(sdesc.valid_cols), ord_in["shared"].eq(1)]
        with m.Else():
            m.d.comb += [ord_in["dtype"].eq(desc.dtype), ord_in["cells"].eq(desc.cells),
                         ord_in["phys_cols"].eq(desc.phys_cols),
                         ord_in["valid_rows"].eq(desc.valid_rows),
                         ord_in["valid_cols"].eq(desc.valid_cols)]

        with m.If(pend0 == _Pend.GPR):
            m.d.sync += r.gpr_val[pend0_slot[0]].eq(gpr_data)
        # One parameter check per source of words, stage 1 chooses (a choice of the word in
        # front of the checks' zero tests was their longest path, issue #9).  The checks
        # register the words' field tests and apply the mode after them (in one piece, the
        # mode's table and the 64-bit zero tests were 7 levels).
        param_ok = {}
        for src, word_in in (("gpr", gpr_data), ("word", word_data)):
            m.submodules[f"param_{src}"] = param = ParamCheck(cfg, registered=True)
            m.d.comb += [param.mode.eq(f.pre_quant_mode), param.quant.eq(word_in),
                         param.alpha.eq(word_in)]
            param_ok[src] = (param.quant_ok, param.alpha_ok)
        # A's layout (C's when A is Shared) is D's on that PE; kept from the answer so that
        # C's rule, read the cycle after A on the same PE, can compare with it.
        with m.If((pend0 == _Pend.A) | ((pend0 == _Pend.C) & ~x.a_local)):
            m.d.sync += r.pe_layout[pend0_pe].eq(desc.layout)
        m_holds = (((desc.layout == Layout.CUBE_M16) & dm_le16)
                   | ((desc.layout == Layout.CUBE_M32) & dm_le32))
        c_ok = ((~x.a_local | (desc.layout == r.pe_layout[pend0_pe]))
                & ((f.pre_quant_mode != 0) | (desc.cells == x.tsize_cells[0])))
        layout_ok = Mux(exp["m_layout"], m_holds,
                        Mux(exp["n8"], desc.layout == Layout.CUBE_N8, c_ok))
        # TileSourceContentsDefined plus the expected shape and type: what both kinds of
        # Local source check (the shape rule itself comes in stage 2).  Each rule's terms
        # are registered apart and ANDed in stage 1 (in one piece they were 7 levels).
        def terms(name, *values):
            return Cat(*(_reg(sm, v, f"{name}{i}") for i, v in enumerate(values))).all()

        source_ok = terms("source_ok", desc.allocated & cap_ok(desc.cells) & defined,
                          desc.valid_rows == exp["rows"], desc.valid_cols == exp["cols"],
                          desc.dtype == exp["dtype"])
        ordinary_ok = source_ok & terms(
            "ordinary_source_ok", (desc.layout == Layout.ROW_MAJOR)
            & (~exp["any"] | (desc.location == TileLocation.ANY)))
        # TileMatrixLocalPrimaryInfoLegal, the layout rule of each primary.
        cube_ok = source_ok & terms("cube_primary_ok", desc.location == TileLocation.MATRIX,
                                    layout_ok)
        shared_ok = terms("shared_ok",
                          (sdesc.allocation_mask == 0xF) & (sdesc.initialized_mask == 0xF)
                          & sdesc.published & sdefined & (sdesc.layout == Layout.ROW_MAJOR),
                          (sdesc.phys_cols == s_cols) & (sdesc.dtype == s_type),
                          s_rows <= sdesc.valid_rows, s_cols <= sdesc.valid_cols)

        # Stage 1: the check of the read's kind.
        ok = Signal(name="pend1_ok", init=1)
        check = Signal(Check, name="pend1_check")
        # The parameter words' checks apart, into ``pend2_param_ok`` (their mode's choice
        # comes after their registers, ``ParamCheck``).
        param = Signal(name="pend1_param_ok", init=1)
        with m.Switch(pend1):
            with m.Case(_Pend.GPR):
                alpha_slot = (pend1_slot == 1) | ~x.scalar_quant
                m.d.comb += [check.eq(Check.BINDINGS),
                             param.eq(x.is_img2col | Mux(alpha_slot, param_ok["gpr"][1],
                                                         param_ok["gpr"][0]))]
            with m.Case(_Pend.SHARED):
                m.d.comb += [check.eq(Check.SHARED), ok.eq(shared_ok)]
            with m.Case(_Pend.ROWMAX, _Pend.QVEC, _Pend.AVEC):
                m.d.comb += [check.eq(Check.POSTPROCESS), ok.eq(ordinary_ok)]
            with m.Case(_Pend.QWORD, _Pend.AWORD):
                # The word's checks are a stage later (below): its answer comes in t+2.
                m.d.comb += check.eq(Check.POSTPROCESS)
            with m.Case(_Pend.A, _Pend.C, _Pend.B):
                m.d.comb += [check.eq(Check.MATH_SOURCES), ok.eq(cube_ok)]
            with m.Case(_Pend.SA, _Pend.SB, _Pend.BIAS):
                m.d.comb += [check.eq(Check.MATH_SOURCES), ok.eq(ordinary_ok)]
        # Stages 2 and 3: the shape rules' comparisons, each registered, then their AND
        # (``cube_legal``, ``ord_legal``), for the kinds whose rule they are.
        with m.If(~at[Phase.IDLE.value]):
            m.d.sync += [pend2_ok.eq(ok), pend2_param_ok.eq(param), pend2_check.eq(check),
                         pend2_cube.eq((pend1 == _Pend.A) | (pend1 == _Pend.B)
                                       | (pend1 == _Pend.C)),
                         pend2_ord.eq(_in_set(pend1, [k.value for k in (
                             _Pend.SHARED, _Pend.ROWMAX, _Pend.QVEC, _Pend.AVEC, _Pend.SA,
                             _Pend.SB, _Pend.BIAS)])),
                         pend2_qword.eq(pend1 == _Pend.QWORD),
                         pend2_aword.eq(pend1 == _Pend.AWORD),
                         # A word read is answered a cycle later than the other reads
                         # (t+2, decision T39): its checks are chosen in stage 2.
                         pend3_word_ok.eq(Mux(pend2_qword, param_ok["word"][0],
                                              Mux(pend2_aword, param_ok["word"][1], 1))),
                         pend4_ok.eq(pend3_ok & pend3_word_ok & (~pend3_cube | cube_legal)
                                     & (~pend3_ord | ord_legal))]
        m.d.sync += [pend.eq(issue), pend_pe.eq(issue_pe), pend_slot.eq(issue_slot),
                     pend_zero.eq(issue_zero), issue.eq(_Pend.NONE)]
        m.d.sync += [r["en"].eq(0) for r in req.values()]  # unless a phase issues a read below

        # ---- the slots of the per-PE phases (slot = pe * 8 + role) ------------------
        post_present = [xc.rowmax_in, xc.vector_quant, xc.vector_quant, xc.alpha_vector,
                        xc.alpha_vector]
        math_present = [xc.a_local, xc.uses_acc, xc.a_local & xc.a_scaled, xc.b_local,
                        xc.b_local & xc.b_scaled, xc.uses_bias]

        def slot_vector(present):
            return Cat(*[x.selected[s >> 3] & present[s & 7] if (s & 7) < len(present)
                         else Const(0) for s in range(32)])

        def first(vector, width, name):
            return tuple(_reg(fm, v, f"{name}_{k}_q")
                         for k, v in zip(("found", "index"), _lowest(fm, vector, width, name)))

        post_vec = _reg(fm, slot_vector(post_present), "post_slots")
        math_vec = _reg(fm, slot_vector(math_present), "math_slots")
        sel_vec = _sig(fm, Cat(*x.selected), "selected_pes")
        # A walk (the slots of a per-PE phase, in order) keeps its next slot's index in a
        # register (``walk_next_index``, which ``slot`` takes without an OR tree), the slot
        # after that one-hot (``walk_after``, whose OR tree gives the next index) and the
        # slots after those in ``rest``, whose lowest is the next ``walk_after``: each step
        # of the walk is a carry chain or an OR tree, never both (a search above ``slot`` was
        # 21 levels from ``slot`` back to itself, the lowest of ``rest`` and its index 10,
        # issue #9).  A phase starts its walk from facts: its first three slots and the rest.
        def walk(vector, width, name):
            after1 = _reg(fm, vector & (vector - 1), f"{name}_after1")
            second = _sig(fm, after1 & ~(after1 - 1), f"{name}_second_lowest")
            after2 = _reg(fm, after1 & (after1 - 1), f"{name}_after2")
            return (first(vector, width, f"{name}_first"),
                    (_reg(fm, after1 != 0, f"{name}_second_found"),
                     _reg(fm, one_hot_index(second, width), f"{name}_second_index")),
                    (_reg(fm, after2 != 0, f"{name}_third_found"),
                     _reg(fm, after2 & ~(after2 - 1), f"{name}_third")),
                    _reg(fm, after2 & (after2 - 1), f"{name}_after3"))

        post_walk = walk(post_vec, 32, "post")
        math_walk = walk(math_vec, 32, "math")
        pe_walk = walk(sel_vec, PE_COUNT, "pe")
        post_first, math_first = post_walk[0], math_walk[0]
        walk_next_index = Signal(5, name="walk_next_index")
        walk_after = Signal(32, name="walk_after")
        walk_found, walk_after_found, rest = (self.walk_found, self.walk_after_found,
                                              self.walk_rest)
        rest_lowest = _sig(nm, rest & ~(rest - 1), "walk_rest_lowest")
        role, slot_pe = slot[0:3], slot[3:5]

        # ---- static checks (registers of the record's facts; the facts submodule) ------
        # Record sanity: rules the decoder already enforces, with the decoder's classes
        # (START's conditions, registered there).
        size_codes_ok = Cat(*[(j >= b.dest_count) | ((b.destinations[j].size_code >= 1)
                                                     & (b.destinations[j].size_code <= 10))
                              for j in range(3)]).all()
        fpatr_reserved = b.fpatr_valid & (~xc.mode["known"] | (f.relu_mode > 3)
                                          | (f.group_n_code > 9))
        fpatr_enables_ok = ((~f.row_max_init | f.row_max_en)
                            & (f.group_max_en == (f.group_n_code != 0))
                            & (~f.max_abs_en | f.row_max_en | f.group_max_en))
        ior = b.ior
        i2c_bindings_ok = (b.local_count == 1) & (b.dest_count == 1) & b.terminated
        i2c_ior_ok = ~b.ior_valid | ((ior.reg_src2 == 0) & (ior.reg_dst == 0))
        i2c_dims_ok = b.dims[0].written & Cat(*[~b.dims[i].written | (x.dims[i] != 0)
                                                for i in range(3)]).all()

        def pow2(v):
            return (v != 0) & ((v & (v - 1)) == 0)

        # Two registers deep (each dimension's tests, then the rule): STATIC comes after
        # IOR's first cycle, START's fourth.
        dims_pow2 = Cat(*(_reg(fm, pow2(d), f"dim{i}_pow2") for i, d in enumerate(x.dims)))
        dims_nz = Cat(*(_reg(fm, d != 0, f"dim{i}_nonzero") for i, d in enumerate(x.dims)))
        dims_ok = _reg(fm, Mux(_reg(fm, x.sc != 0, "dims_shared"), dims_pow2.all(),
                               dims_nz.all()), "dims_ok")
        rmode = Mux(b.datr_valid, b.datr.rmode, 0)
        sat = Mux(b.datr_valid, b.datr.sat, 0)
        # From the registered mode table (two deep, like ``dims_ok``; from the record it was
        # the table's lookup and the slot count's adder in front of the rule, 7 levels).
        attributes_ok = _reg(fm, ((rmode == 0) | x.mode["rmode_free"])
                             & (~sat | x.mode["sat_free"]) & ((x.n_slots == 0) | b.ior_valid),
                             "attributes_ok")
        datr_ok = _reg(fm, ~b.datr_valid | ((b.datr.layout == 0) & (b.datr.pad == 0)
                                            & (b.datr.cmode == 0) & (b.datr.canonicalize == 0)),
                       "datr_ok")
        trans_ok = _reg(fm, Mux(x.sc == 0, ~f.trans_a & ~f.trans_b, ~f.trans_a | xc.a_shared),
                        "trans_ok")
        acc_ok = _reg(fm, x.mode["built"]
                      & ((f.pre_quant_mode == 0) | (x.mode["source"] == x.acc)), "acc_ok")
        cd_ok = _reg(fm, ~xc.uses_acc | (b.local_sources[0] != b.destinations[0].hand), "cd_ok")
        gemv_ok = _reg(fm, ~xc.is_gemv | (dm == 1), "gemv_ok")
        d_fits = _reg(fm, (xc.tsize_cells[0] << 7) <= tile_capacity, "d_fits")
        d_ok = Array(_sig(fm, d_by_pe[pe][0] & d_fits, f"d_ok{pe}") for pe in range(PE_COUNT))

        def first_fault(name, chain):
            """The first of ``chain`` ((condition, class, check) in the model's order) that
            holds, registered: ``(bad, class, check)``, one register deeper than the
            conditions.  A phase's checks in one registered verdict, so that the FSM obeys
            one bit instead of a priority chain of conditions (issue #9)."""
            bad = Signal(name=f"{name}_bad")
            cls = Signal(FaultClass, name=f"{name}_class")
            chk = Signal(Check, name=f"{name}_check")
            fm.d.sync += bad.eq(0)
            for cond, c, k in reversed(chain):      # the last assignment wins: the first
                with fm.If(cond):
                    fm.d.sync += [bad.eq(1), cls.eq(c), chk.eq(k)]
            return bad, cls, chk

        # START (two registers deep: its third cycle; each condition a register of the
        # record's, the chain of priorities after them) and STATIC (4c, 4d, R8, 5).
        i2c, mat = xc.is_img2col, xc.is_matrix
        start_fault = first_fault("start", [
            (_reg(fm, cond, f"start_cond{i}"), c, k) for i, (cond, c, k) in enumerate([
                (~xc.op_known | ~size_codes_ok | fpatr_reserved, II, Check.WELL_FORMED),
                (i2c & b.fpatr_valid, BC, Check.WELL_FORMED),
                (i2c & (x.sc != 0), TL, Check.WELL_FORMED),
                (i2c & (~i2c_bindings_ok | ~i2c_ior_ok), BC, Check.WELL_FORMED),
                (i2c & b.datr_valid & (b.datr.as_value() != 0), TL, Check.I2C_ATTRIBUTES),
                (i2c & ~i2c_dims_ok, TL, Check.I2C_DIMENSIONS),
                (mat & ~b.fpatr_valid, BC, Check.WELL_FORMED),
                (mat & ~fpatr_enables_ok, TL, Check.WELL_FORMED),
                (mat & ~xc.types_ok, TL, Check.TYPES)])])
        static_fault = first_fault("static", [
            (~datr_ok, TL, Check.DATR), (~dims_ok, TL, Check.DIMENSIONS),
            (~attributes_ok, TL, Check.ATTRIBUTES), (~gemv_ok, TL, Check.GEMV_M)])

        # Step 10: each selected PE's M layout (A's, else C's, else from M) must hold M.
        # Registers of ``r.pe_layout``, which the last read's answer sets five cycles or more
        # before M_LAYOUT (the MATH phases' drain and CD_INDEX): the layouts, their check
        # and the first failing PE, three deep.
        have_layout = x.a_local | x.uses_acc
        m_layouts = [_reg(fm, Mux(have_layout, r.pe_layout[pe],
                                  Mux(dm_le16, Layout.CUBE_M16, Layout.CUBE_M32)),
                          f"m_layout{pe}") for pe in range(PE_COUNT)]
        m_layout_bad = _reg(fm, Cat(*[x.selected[pe] & ~(
            ((m_layouts[pe] == Layout.CUBE_M16) & dm_le16)
            | ((m_layouts[pe] == Layout.CUBE_M32) & dm_le32)) for pe in range(PE_COUNT)]),
            "m_layout_bad")
        m_layout_fault = first(m_layout_bad, PE_COUNT, "m_layout_bad")

        # Step 11, four registers deep: the free registers of each destination's hand, less
        # the k lowest when k earlier destinations name the same hand (they take those);
        # their lowest; then the verdict (``allocation_ok``: TIMG2COL's ALLOCATE can be
        # START's fifth cycle).  With the core capacity charge and each PE's memory.
        free = ~self.alloc.allocated
        taken, found_bits = [], []
        for j in range(3):
            hand = b.destinations[j].hand
            avail = _reg(fm, free.word_select(hand, 16), f"alloc_free{j}")
            earlier = _reg(fm, sum(b.destinations[i].hand == hand for i in range(j)),
                           f"alloc_earlier{j}")
            less1 = avail & (avail - 1)
            less2 = less1 & (less1 - 1)
            candidates = _reg(fm, Mux(earlier == 0, avail, Mux(earlier == 1, less1, less2)),
                              f"alloc_candidates{j}")
            found, index = first(candidates, 16, f"alloc{j}")
            taken.append((hand, index))
            found_bits.append((j >= b.dest_count) | found)
        group_bytes = _reg(fm, sum(Mux(j < b.dest_count, xc.tsize_cells[j], 0)
                                   for j in range(3)) << 7, "group_bytes")  # one PE's TSizes
        pes = _reg(fm, sum(x.selected), "selected_count")
        required = Signal(21, name="required_bytes")
        with fm.Switch(pes):
            for n in range(1, PE_COUNT + 1):
                with fm.Case(n):
                    fm.d.sync += required.eq(sum(group_bytes << i for i in range(3) if n >> i & 1))
            with fm.Default():
                fm.d.sync += required.eq(0)
        # The room left, from the allocation state (held stable), against the charge: a
        # comparison after a register instead of an addition and a comparison.
        room = _reg(fm, tile_capacity - self.alloc.capacity_in_use, "capacity_room")
        # Each comparison registered on its own, ANDed with the others in ``allocation_ok``
        # (no deeper for it, one level less before the registers).
        capacity_ok = [_reg(fm, self.alloc.capacity_in_use <= tile_capacity, "capacity_ok"),
                       _reg(fm, required <= room[:32], "capacity_room_ok")]
        pe_room = [_reg(fm, cfg.tile_bytes_per_pe - self.alloc.pe_bytes_in_use[pe],
                        f"pe_room{pe}") for pe in range(PE_COUNT)]
        pe_fits = [_reg(fm, ~x.selected[pe] | (group_bytes <= pe_room[pe]), f"pe_fits{pe}")
                   for pe in range(PE_COUNT)]
        allocation_ok = _reg(fm, Cat(*found_bits, *capacity_ok, *pe_fits).all(),
                             "allocation_ok")

        # ---- the phases ---------------------------------------------------------------
        # The FSM moves ``phase`` and starts the reads (``issue`` and the ports' ``en``).
        # ``slot``, ``word``, ``rest``, the reads' addresses, the verdict and the plan's
        # registers follow the phase alone (below): what they become in a cycle that faults
        # does not matter (VERDICT holds the verdict, every other register is set again
        # before it is used), so the chain of fault checks in front of the phase is not in
        # front of them (it was their longest path, issue #9).
        def scans(s):
            return (s[0:3] == 2) | (s[0:3] == 4)

        scanning = scans(slot)
        # Registers of the walk's conditions, set with ``slot`` and ``word`` (below), so that
        # no comparison of ``word`` is in front of the walk's 64 enables or of the phase
        # (``word < dn_last`` was the walk's longest path, issue #9): ``stay``, a scan's word
        # N-1 not issued yet (``scanning & (word < dn_last)``); ``word_zero``; ``word_ge``
        # and ``word_gt``, ``word`` >= and > :data:`_DRAIN`.
        stay = Signal(name="stay")
        # ``slot_done``: ``slot`` is the last of a counting phase's (START 2, IOR and
        # SHARED_RUN after their reads and drain), a register set with ``slot``.
        slot_done = Signal(name="slot_done")
        # IOR's: its first cycle (``slot`` 0), and a GPR read due in this one (``slot`` <
        # ``ior_reads``), registers set with ``slot`` (their compares were in front of the
        # reads' requests, issue #9).
        ior_first = Signal(name="ior_first")
        ior_read = Signal(name="ior_read")
        word_zero = Signal(name="word_zero", init=1)
        word_ge = Signal(name="word_ge_drain")
        word_gt = Signal(name="word_gt_drain")
        wanted = Mux(aux_is_group, f.group_max_en, f.row_max_en)
        aux_bad = wanted & ~Mux(aux_is_group, aux_legal[1], aux_legal[0])
        m_bad, m_bad_pe = m_layout_fault
        gpr = Mux(slot[0], ior.reg_src1, ior.reg_src0)      # IOR slot 0 posM/quant, 1 posK/alpha

        def read(port, kind):
            m.d.sync += [req[port]["en"].eq(1), issue.eq(kind)]

        # The phase is one-hot, a flip-flop per phase (``at``), and each phase's next bit
        # is the OR of its ways in: no decode of an encoded phase is in front of the FSM,
        # the walk's registers or the read requests (the encoded phase and its decode were
        # the preflight's longest paths, issue #9).  ``go`` names a way out of a phase;
        # a phase stays where none is taken.  A failing check (``pend_ok`` low) preempts
        # whatever a checking phase does: the verdict next, beside the phases' choices
        # instead of in front of them.
        ways = {p: [] for p in Phase}
        leaves = {p: [] for p in Phase}

        def obeys_checks(p):
            return Phase.START.value <= p.value <= Phase.AUX_SHAPE.value

        def go(src, cond, dst):
            ways[dst].append(at[src.value] & cond & (pend_ok if obeys_checks(src) else 1))
            leaves[src].append(cond)

        checking = ~(at[Phase.IDLE.value] | at[Phase.VERDICT.value] | at[Phase.HOLD.value])

        # No read is pending in IDLE, VERDICT and HOLD: they do not wait for ``pend_ok``.
        # ``accepted`` is high for the one cycle after the handshake; ``ready`` rises with
        # every way into IDLE.
        # ``ready`` has copies, each the enable of a share of the held record's bits: one
        # flip-flop's 307 enables spanned the device (8.62 ns in session 25's route).
        approve = v_outcome == Outcome.APPROVE
        rise = ((at[Phase.VERDICT.value] & self.verdict.ready & ~approve)
                | (at[Phase.HOLD.value] & self.exec_done))
        ready_next = rise | (ready & ~self.record.valid)
        m.d.sync += [accepted.eq(ready & self.record.valid), ready.eq(ready_next)]
        m.d.comb += self.record.ready.eq(ready)
        copies = register_copies(m, ready_next, _RECORD_ENABLES, "record_ready_copy", init=1)
        load_in_shares(m, rec, self.record.payload, copies)

        # IDLE: ``slot`` and ``word`` are 0 here already (every way into IDLE clears them);
        # a fault record or a no-op has its verdict, the others START.
        passthrough = (rec.fault != FaultClass.NONE) | b.noop
        go(Phase.IDLE, accepted & passthrough, Phase.VERDICT)
        go(Phase.IDLE, accepted & ~passthrough, Phase.START)
        m.d.comb += [self.verdict.valid.eq(at[Phase.VERDICT.value]),
                     self.commit_enable.eq(at[Phase.HOLD.value])]
        go(Phase.VERDICT, self.verdict.ready & approve, Phase.HOLD)
        go(Phase.VERDICT, self.verdict.ready & ~approve, Phase.IDLE)
        go(Phase.HOLD, self.exec_done, Phase.IDLE)
        # START's slots 1 and 2: the facts' registers settle.
        go(Phase.START, slot_done & start_fault[0], Phase.VERDICT)
        go(Phase.START, slot_done & ~start_fault[0], Phase.IOR)
        # IOR: Matrix: the scalar words (checked as they arrive); TIMG2COL: posM, posK.  Its
        # first cycle ends step 4b: the binding counts, two registers deep.  Its reads come
        # before its end (``slot_done`` first: the walk's ``slot`` obeys it alone).
        ior_bad = x.is_matrix & ior_first & ~counts_ok
        ior_end = ~ior_bad & slot_done
        go(Phase.IOR, ior_bad, Phase.VERDICT)
        go(Phase.IOR, ior_end & x.is_img2col, Phase.ALLOCATE)
        go(Phase.IOR, ior_end & ~x.is_img2col, Phase.STATIC)
        with m.If(at[Phase.IOR.value] & ~ior_bad & ~slot_done & ior_read):
            m.d.sync += [req["gpr"]["en"].eq(gpr != 0), issue.eq(_Pend.GPR)]
        go(Phase.STATIC, static_fault[0], Phase.VERDICT)
        go(Phase.STATIC, ~static_fault[0], Phase.SHARED_ENTRY)
        go(Phase.SHARED_ENTRY, ~trans_ok, Phase.VERDICT)
        go(Phase.SHARED_ENTRY, trans_ok & (x.sc == 0), Phase.POST_ENTRY)
        go(Phase.SHARED_ENTRY, trans_ok & (x.sc != 0), Phase.SHARED_RUN)
        go(Phase.SHARED_RUN, slot_done, Phase.POST_ENTRY)
        with m.If(at[Phase.SHARED_RUN.value] & ~slot_done & (slot < x.sc)):
            read("shared", _Pend.SHARED)
        go(Phase.POST_ENTRY, ~acc_ok, Phase.VERDICT)
        go(Phase.POST_ENTRY, acc_ok & post_first[0], Phase.POST_RUN)
        go(Phase.POST_ENTRY, acc_ok & ~post_first[0], Phase.MATH_ENTRY)
        # POST_RUN: a scan stays on its slot until word N-1 was issued.
        with m.If(at[Phase.POST_RUN.value]):
            kind = Array([Const(k.value, 4) for k in _POST_ROLES])[role]
            m.d.sync += [req["word"]["en"].eq(scanning), req["tile"]["en"].eq(~scanning),
                         issue.eq(kind)]
        go(Phase.POST_RUN, ~stay & ~walk_found, Phase.MATH_ENTRY)
        # MATH_ENTRY waits for POST_RUN's last checks; in MATH_RUN ``word`` counts the cycles
        # after the last read.
        go(Phase.MATH_ENTRY, math_first[0], Phase.MATH_RUN)
        go(Phase.MATH_ENTRY, ~math_first[0] & (~post_first[0] | word_ge), Phase.CD_INDEX)
        with m.If(at[Phase.MATH_RUN.value] & word_zero):
            read("tile", Array([Const(k.value, 4) for k in _MATH_ROLES])[role])
        go(Phase.MATH_RUN, ~word_zero & word_gt, Phase.CD_INDEX)
        go(Phase.CD_INDEX, ~cd_ok, Phase.VERDICT)
        go(Phase.CD_INDEX, cd_ok, Phase.M_LAYOUT)
        go(Phase.M_LAYOUT, m_bad, Phase.VERDICT)
        go(Phase.M_LAYOUT, ~m_bad, Phase.ALLOCATE)
        go(Phase.ALLOCATE, ~allocation_ok | x.is_img2col, Phase.VERDICT)
        go(Phase.ALLOCATE, allocation_ok & ~x.is_img2col, Phase.D_SHAPE)
        d_shape_ok = d_ok[slot[:2]]
        go(Phase.D_SHAPE, ~d_shape_ok, Phase.VERDICT)
        go(Phase.D_SHAPE, d_shape_ok & ~walk_found, Phase.AUX_SHAPE)
        go(Phase.AUX_SHAPE, aux_bad | (slot != 0), Phase.VERDICT)

        for p in Phase:
            remain = at[p.value] & ~Cat(*leaves[p]).any() & (pend_ok if obeys_checks(p) else 1)
            fail = [checking & ~pend_ok] if p == Phase.VERDICT else []
            m.d.sync += at[p.value].eq(Cat(*ways[p], remain, *fail).any())
        with m.If(~pend_ok & checking):
            m.d.sync += [issue.eq(_Pend.NONE)] + [r["en"].eq(0) for r in req.values()]

        # The verdict this cycle would give, taken in every cycle but VERDICT's: the class,
        # check and PE of the phase's own fault, unless a read's check fails first (the
        # model's order); APPROVE / NOOP where a phase finishes.
        with m.If(~at[Phase.VERDICT.value]):
            m.d.sync += [v_outcome.eq(Outcome.FAULT), v_fault.eq(TL), v_check.eq(Check.NONE),
                         v_pe.eq(0), v_record.eq(0)]
            with m.If(at[Phase.IDLE.value]):
                failed = rec.fault != FaultClass.NONE
                m.d.sync += [v_outcome.eq(Mux(failed, Outcome.FAULT, Outcome.NOOP)),
                             v_fault.eq(rec.fault), v_record.eq(failed),
                             v_check.eq(Mux(failed, Check.RECORD, Check.NONE))]
            with m.Elif(~pend_ok):
                m.d.sync += [v_check.eq(pend_check), v_pe.eq(pend_pe_due)]
            with m.Else():
                with m.If(at[Phase.START.value]):
                    m.d.sync += [v_fault.eq(start_fault[1]), v_check.eq(start_fault[2])]
                with m.Elif(at[Phase.IOR.value]):
                    m.d.sync += v_check.eq(Check.BINDINGS)
                with m.Elif(at[Phase.STATIC.value]):
                    m.d.sync += v_check.eq(static_fault[2])
                with m.Elif(at[Phase.SHARED_ENTRY.value]):
                    m.d.sync += v_check.eq(Check.SHARED)
                with m.Elif(at[Phase.POST_ENTRY.value]):
                    m.d.sync += v_check.eq(Check.POSTPROCESS)
                with m.Elif(at[Phase.CD_INDEX.value]):
                    m.d.sync += v_check.eq(Check.CD_INDEX)
                with m.Elif(at[Phase.M_LAYOUT.value]):
                    m.d.sync += [v_check.eq(Check.M_LAYOUT), v_pe.eq(m_bad_pe)]
                with m.Elif(at[Phase.ALLOCATE.value]):
                    m.d.sync += [
                        v_outcome.eq(Mux(allocation_ok, Outcome.APPROVE, Outcome.FAULT)),
                        v_fault.eq(Mux(allocation_ok, FaultClass.NONE, TA)),
                        v_check.eq(Mux(allocation_ok, Check.NONE,
                                       Mux(x.is_img2col, Check.I2C_ALLOCATION,
                                           Check.ALLOCATION)))]
                with m.Elif(at[Phase.D_SHAPE.value]):
                    m.d.sync += [v_fault.eq(TA), v_check.eq(Check.ALLOCATION),
                                 v_pe.eq(slot[:2])]
                with m.Elif(at[Phase.AUX_SHAPE.value]):
                    m.d.sync += [v_outcome.eq(Mux(aux_bad, Outcome.FAULT, Outcome.APPROVE)),
                                 v_fault.eq(Mux(aux_bad, TA, FaultClass.NONE)),
                                 v_check.eq(Mux(aux_bad, Check.ALLOCATION, Check.NONE))]

        # The walk: ``slot`` and ``word`` move as the phase's transition above says when it
        # does not fault, and are 0 in every other phase; ``rest`` (the slots to come) is
        # loaded with a walk's first slot and follows its moves.
        def start_walk(w):
            (_, first_index), (second_found, second_index), (third_found, third), after3 = w
            m.d.sync += [slot.eq(first_index), walk_next_index.eq(second_index),
                         walk_found.eq(second_found), walk_after.eq(third),
                         walk_after_found.eq(third_found), rest.eq(after3)]

        def advance():
            m.d.sync += [slot.eq(walk_next_index),
                         walk_next_index.eq(one_hot_index(walk_after, 32)),
                         walk_found.eq(walk_after_found), walk_after.eq(rest_lowest),
                         walk_after_found.eq(rest.any()), rest.eq(rest & (rest - 1))]

        def count():
            """Stay on the slot, one more word (``word`` + 1 >= / > _DRAIN)."""
            m.d.sync += [slot.eq(slot), word.eq(word + 1), word_zero.eq(0),
                         word_ge.eq(word >= _DRAIN - 1), word_gt.eq(word_ge)]

        def count_slot(end_less1, next_done):
            """``slot`` + 1 up to the phase's end, then 0 (``next_done``: ``slot_done`` for
            slot 0 of the phase after)."""
            m.d.sync += [slot.eq(Mux(slot_done, 0, slot + 1)),
                         slot_done.eq(Mux(slot_done, next_done, slot >= end_less1))]

        m.d.sync += [slot.eq(0), word.eq(0), word_zero.eq(1), word_ge.eq(0), word_gt.eq(0),
                     stay.eq(0), slot_done.eq(0), ior_first.eq(0), ior_read.eq(0)]
        with m.If(at[Phase.IDLE.value]):
            m.d.sync += slot.eq(accepted)                       # START's slot 1
        with m.Elif(at[Phase.START.value]):
            count_slot(1, ior_end_zero)                         # slots 1, 2
            m.d.sync += [ior_first.eq(slot_done), ior_read.eq(slot_done & (ior_reads != 0))]
        with m.Elif(at[Phase.IOR.value]):
            count_slot(ior_end_less1, 0)
            m.d.sync += ior_read.eq(~slot_done & (slot + 1 < ior_reads))
        with m.Elif(at[Phase.SHARED_RUN.value]):
            count_slot(shared_end_less1, 0)
        with m.Elif(at[Phase.POST_ENTRY.value]):
            start_walk(post_walk)
            m.d.sync += stay.eq(scans(post_first[1]) & dn_several)
        with m.Elif(at[Phase.POST_RUN.value]):
            with m.If(stay):
                count()
                m.d.sync += stay.eq(word < dn_before_last)
            with m.Else():
                advance()
                m.d.sync += stay.eq(scans(walk_next_index) & dn_several)
        with m.Elif(at[Phase.MATH_ENTRY.value]):
            with m.If(math_first[0]):
                start_walk(math_walk)
            with m.Elif(post_first[0] & ~word_ge):
                count()                                 # POST_RUN's last checks
        with m.Elif(at[Phase.MATH_RUN.value]):
            with m.If(word_zero & walk_found):
                advance()
            with m.Elif(~word_gt):
                count()                 # from the last read's slot, word 1, to the drain
        with m.Elif(at[Phase.ALLOCATE.value]):
            start_walk(pe_walk)
        with m.Elif(at[Phase.D_SHAPE.value]):
            advance()
        with m.Elif(at[Phase.AUX_SHAPE.value]):
            m.d.sync += slot.eq(1)              # slot 0 RowMaxOut, 1 GroupMaxOut

        # The reads' addresses, whether a read is issued or not.
        vec_index = Mux(role < 3, x.index[OperandRole.QUANT_VECTOR],
                        x.index[OperandRole.ALPHA_VECTOR])
        math_index = Array([x.index[o] for o in (
            OperandRole.A, OperandRole.C, OperandRole.A_SCALE, OperandRole.B,
            OperandRole.B_SCALE, OperandRole.BIAS)])[role]
        m.d.sync += [
            issue_pe.eq(slot_pe), issue_slot.eq(slot[:2]), issue_zero.eq(gpr == 0),
            req["gpr"]["addr"].eq(gpr),
            req["shared"]["sid"].eq(b.shared_sources[slot[:2]]),
            req["word"]["pe"].eq(slot_pe), req["word"]["index"].eq(vec_index),
            req["word"]["addr"].eq(word),
            req["tile"]["pe"].eq(slot_pe),
            req["tile"]["index"].eq(Mux(at[Phase.POST_RUN.value],
                                        Mux(role == 0, x.index[OperandRole.ROWMAX_IN],
                                            vec_index), math_index)),
        ]

        # The plan's registers, set by their phases whether the phase faults or not (D's CELL
        # geometry: ``d_by_pe``).
        with m.If(at[Phase.M_LAYOUT.value]):
            m.d.sync += [r.pe_layout[pe].eq(m_layouts[pe]) for pe in range(PE_COUNT)]
        with m.Elif(at[Phase.ALLOCATE.value]):
            m.d.sync += [r.out_index[j].eq(Cat(index, hand))
                         for j, (hand, index) in enumerate(taken)]

        # ---- outputs ------------------------------------------------------------------
        v = self.verdict.payload
        m.d.comb += [
            v.outcome.eq(v_outcome), v.fault.eq(v_fault),
            v.fault_index.eq(Mux(v_outcome == Outcome.FAULT,
                                 Mux(v_record, rec.fault_index, b.boundary_index), 0)),
            v.check.eq(v_check), v.pe.eq(v_pe),
            self.approve.eq(self.verdict.valid & (v_outcome == Outcome.APPROVE)),
            self.fault.eq(self.verdict.valid & (v_outcome == Outcome.FAULT)),
            self.noop.eq(self.verdict.valid & (v_outcome == Outcome.NOOP)),
            self.busy.eq(~at[Phase.IDLE.value] | accepted),
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


#: Cycles :func:`img2col_job`'s source facts follow its ``desc`` input late.
IMG2COL_JOB_CYCLES = 3


def img2col_job(m, *, plan, desc, tile_capacity, config: CubeConfig = CubeConfig()):
    """The :class:`~ptocube.hdl.img2col_engine.Img2ColJobLayout` of one PE of an approved
    TIMG2COL plan, from that PE's source register ``desc`` (:data:`TileDescLayout`), for the
    top level.

    ``src_legal`` is the model's ``_ordinary_descriptor_legal`` (allocated, row-major,
    capacity legal and within ``tile_capacity``, ordinary geometry holding the valid shape).
    The plan's fields pass through; the facts of ``desc`` are pipelined, the shape rule split
    over three registers (issue #9, decision T23): the job holds the verdict on a ``desc``
    held for :data:`IMG2COL_JOB_CYCLES` cycles.
    """
    layout = Img2ColJobLayout(config)
    job = Signal(layout, name="img2col_job")
    def cut(value, name):
        return _reg(m, value, name)

    legal, elements = ordinary_shape(m, dtype=desc.dtype, cells=desc.cells,
                                     phys_cols=desc.phys_cols, valid_rows=desc.valid_rows,
                                     valid_cols=desc.valid_cols, shared=0, name="i2c_src",
                                     cut=cut, cut_rows=cut)
    base_ok = _reg(m, desc.allocated & (desc.layout == Layout.ROW_MAJOR)
                   & ((desc.cells << 7) <= tile_capacity), "i2c_src_base_ok")
    width = layout.members["src_elements"]
    top = (1 << width) - 1
    out = plan.outputs[0]
    m.d.comb += [
        job.dtype.eq(plan.a_type),
        job.src_dtype.eq(desc.dtype), job.src_layout.eq(desc.layout),
        job.src_matrix.eq(desc.location == TileLocation.MATRIX),
        job.dst_size_code.eq(out.size_code), job.dst_cols.eq(out.phys_cols),
        job.valid_row.eq(out.rows), job.valid_col.eq(out.cols),
        job.pos_m.eq(plan.pos_m), job.pos_k.eq(plan.pos_k),
        job.src_legal.eq(_reg(m, base_ok & legal, "i2c_src_legal")),
        job.src_elements.eq(_reg(m, Mux(elements > top, top, elements), "i2c_src_elements")),
    ]
    return job
