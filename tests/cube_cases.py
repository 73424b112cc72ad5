"""Matrix bundles and states for the CUBE engine tests, built from model objects.

:func:`make_case` builds one legal Matrix bundle (every operand in place, random payloads,
different on every selected PE) and runs the model's preflight on it, returning the state
and the :class:`~ptocube.model.preflight.MatrixPlan` the hardware engine executes.  Any
field can be fixed; the others are drawn from ``rng``.  :func:`random_case` draws
everything within size bounds.
"""

import numpy as np

from ptocube.model.bundle import Bundle, Datr, Destination, Fpatr, Operation
from ptocube.model.datatype import (MX_MATRIX_TYPES, MX_SCALED_TYPES, ORDINARY_MATRIX_TYPES,
                                    DataType, NumClass, accumulator_type)
from ptocube.model.layout import Layout, cube_geometry
from ptocube.model.postprocess import PREQUANT_MODES, ParamKind, group_count, group_n
from ptocube.model.preflight import preflight
from ptocube.model.state import SharedTile, State, pes_of_mask
from model_helpers import tile

__all__ = ["MATRIX_OPS", "random_raw", "make_case", "random_case", "types_of_config"]

MATRIX_OPS = [op for op in Operation if op.is_matrix]
MASKS = (0b1000, 0b0100, 0b0010, 0b0001, 0b1100, 0b1010, 0b0111, 0b1111)


def random_raw(rng, dtype: DataType, shape, special: float = 0.05) -> np.ndarray:
    """Random raw patterns: small types uniformly; wide floats mostly with moderate
    exponents (so that sums stay finite), a ``special`` share of any pattern."""
    dtype = DataType(dtype)
    bits = dtype.bits
    raw = rng.integers(0, 1 << bits, shape, dtype=np.uint64)
    if dtype.num_class is NumClass.FLOAT and bits >= 16 and dtype is not DataType.E8M0:
        exp_bits = {16: 5 if dtype is DataType.FP16 else 8, 32: 8}[bits]
        frac = bits - 1 - exp_bits
        bias = (1 << (exp_bits - 1)) - 1
        span = 6 if exp_bits == 5 else 12
        exp = rng.integers(bias - span, bias + span, shape, dtype=np.uint64)
        sign = rng.integers(0, 2, shape, dtype=np.uint64)
        moderate = (sign << (bits - 1)) | (exp << frac) | (raw & ((1 << frac) - 1))
        raw = np.where(rng.random(shape) < special, raw, moderate)
    if dtype is DataType.E8M0:
        raw = np.where(rng.random(shape) < special, raw,
                       rng.integers(120, 134, shape, dtype=np.uint64))
    return raw.astype(np.uint64)


def types_of_config(config):
    """The Matrix operations and ordinary type classes a build implements."""
    classes = ([NumClass.FLOAT] if config.float_types else []) + \
        ([NumClass.SIGNED, NumClass.UNSIGNED] if config.int_types else [])
    ops = [op for op in MATRIX_OPS if not op.is_mx or config.mx_types]
    return ops, classes


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _tsize(need: int) -> int:
    size = 128
    while size < need:
        size *= 2
    return size


def make_case(rng, config, *, op=None, a_type=None, b_type=None, m=None, n=None, k=None,
              mask=None, shared=None, mode=None, relu=None, gcode=None, row_max=None,
              row_max_init=None, max_abs=None, trans_a=None, trans_b=None, rmode=None,
              sat=None, m_layout=None, special=0.05, max_mnk=(8, 9, 40), payload=None):
    """A legal Matrix bundle and state; returns ``(state, plan)``.

    ``shared``: None (all Local), ``"right"`` (B [sB] Shared) or ``"both"``.  ``payload``:
    optional ``f(rng, role, dtype, shape) -> raw`` overriding the random payloads.
    """
    ops, classes = types_of_config(config)
    op = ops[int(rng.integers(len(ops)))] if op is None else op
    if a_type is None or b_type is None:
        if op.is_mx:
            pool = sorted(MX_MATRIX_TYPES)
            a_type = pool[rng.integers(len(pool))] if a_type is None else a_type
            b_type = pool[rng.integers(len(pool))] if b_type is None else b_type
        else:
            cls = DataType(a_type).num_class if a_type is not None else \
                classes[rng.integers(len(classes))]
            pool = sorted(t for t in ORDINARY_MATRIX_TYPES if t.num_class is cls)
            a_type = pool[rng.integers(len(pool))] if a_type is None else a_type
            b_type = pool[rng.integers(len(pool))] if b_type is None else b_type
    a_type, b_type = DataType(a_type), DataType(b_type)
    acc = DataType.FP32 if op.is_mx else accumulator_type(a_type)
    if op.is_gemv:
        shared = None
    power = shared is not None
    def dim(value, bound, gemv_one=False):
        if value is not None:
            return value
        if gemv_one:
            return 1
        if power:
            return 1 << int(rng.integers(0, bound.bit_length()))
        return int(rng.integers(1, bound + 1))
    m = dim(m, max_mnk[0], op.is_gemv)
    n, k = dim(n, max_mnk[1]), dim(k, max_mnk[2])
    a_scaled = op.is_mx and a_type in MX_SCALED_TYPES
    b_scaled = op.is_mx and b_type in MX_SCALED_TYPES
    nb = -(-k // 32)

    modes = [c for c, row in PREQUANT_MODES.items() if c and row.source is acc
             and (config.float_types or row.d_dtype is None
                  or row.d_dtype.num_class is not NumClass.FLOAT)]
    if mode is None:
        mode = int(rng.choice(modes)) if modes and rng.random() < 0.5 else 0
    relu = int(rng.choice([0, 0, 1, 2, 3])) if relu is None else relu
    row_max = bool(rng.random() < 0.3) if row_max is None else row_max
    if gcode is None:
        codes = [c for c in range(1, 10) if group_count(n, group_n(c))
                 & (group_count(n, group_n(c)) - 1) == 0]
        gcode = int(rng.choice([0, 0, 0] + codes))
    row_max_init = (row_max and bool(rng.random() < 0.5)) if row_max_init is None \
        else row_max_init
    max_abs = ((row_max or gcode != 0) and bool(rng.random() < 0.3)) if max_abs is None \
        else max_abs
    trans_a = (shared == "both" and bool(rng.random() < 0.4)) if trans_a is None else trans_a
    trans_b = (shared is not None and bool(rng.random() < 0.4)) if trans_b is None else trans_b
    fpatr = Fpatr(mode, relu, gcode, row_max, gcode != 0, row_max_init, max_abs, trans_a,
                  trans_b)
    row = PREQUANT_MODES[mode]
    if rmode is None:
        rmode = int(rng.integers(8)) if row.rmode_free and rng.random() < 0.5 else 0
    if sat is None:
        sat = int(row.sat_free and rng.random() < 0.5)
    datr = Datr(dtype=int(b_type), rmode=rmode, sat=sat) \
        if (b_type != a_type or rmode or sat) else None
    d_type = acc if mode == 0 else row.d_dtype
    if m_layout is None:
        m_layout = Layout.CUBE_M16 if m <= 16 and rng.random() < 0.5 else Layout.CUBE_M32
    mask = int(rng.choice(MASKS)) if mask is None else mask
    pes = pes_of_mask(mask)

    def raw(role, dtype, shape):
        if payload is not None:
            return payload(rng, role, dtype, shape)
        return random_raw(rng, dtype, shape, special)

    def param_words(role, count):
        if role == "quant":
            if row.shift:
                return [int(rng.integers(16)) << 32 for _ in range(count)]
            words = []
            for _ in range(count):
                word = (int(rng.integers(110, 140)) << 10 | int(rng.integers(1 << 10))) << 13
                if row.offset_width:
                    word |= int(rng.integers(1 << row.offset_width)) << 37
                words.append(word)
            return words
        return [0 if rng.random() < 0.2 else
                int(rng.integers(100, 130)) << 10 | int(rng.integers(1 << 10))
                for _ in range(count)]

    # Local operands: (role, builder(pe) -> Tile).
    d_geometry = cube_geometry(m_layout, d_type, m, n)
    d_tsize = _tsize(d_geometry.required_bytes) * int(rng.choice([1, 1, 2]))
    local = []
    if op.uses_acc:
        c_tsize = d_tsize if mode == 0 else None
        local.append(("c", lambda: tile(acc, m_layout, raw("c", acc, (m, n)), c_tsize)))
    if shared != "both":
        local.append(("a", lambda: tile(a_type, m_layout, raw("a", a_type, (m, k)))))
        if a_scaled:
            local.append(("a_scale", lambda: tile(DataType.E8M0, Layout.ROW_MAJOR,
                                                  raw("a_scale", DataType.E8M0, (m, nb)))))
    if shared is None:
        local.append(("b", lambda: tile(b_type, Layout.CUBE_N8, raw("b", b_type, (k, n)))))
        if b_scaled:
            local.append(("b_scale", lambda: tile(DataType.E8M0, Layout.ROW_MAJOR,
                                                  raw("b_scale", DataType.E8M0, (nb, n)))))
    if op.uses_bias:
        local.append(("bias", lambda: tile(acc, Layout.ROW_MAJOR, raw("bias", acc, (1, n)))))
    if row_max_init and row_max:
        local.append(("rowmax_in", lambda: tile(acc, Layout.ROW_MAJOR,
                                                raw("rowmax_in", acc, (m, 1)))))
    if row.param is ParamKind.VECTOR:
        local.append(("quant_vector", lambda: tile(DataType.U64, Layout.ROW_MAJOR,
                                                   [param_words("quant", n)])))
    if relu == 3:
        local.append(("alpha_vector", lambda: tile(DataType.U64, Layout.ROW_MAJOR,
                                                   [param_words("alpha", n)])))
    indices = [int(i) for i in rng.permutation(64)[:len(local)]]
    state = State()
    for pe in pes:
        for (role, build), index in zip(local, indices):
            state.set_tile(pe, index, build())
    shared_ids = []
    sids = [int(i) for i in rng.permutation(256)[:4]]
    if shared == "both":
        rows_, cols_ = (k, m) if trans_a else (m, k)
        t = tile(a_type, Layout.ROW_MAJOR, raw("a", a_type, (rows_, cols_)), cols=cols_,
                 shared=True)
        state.shared[sids[0]] = SharedTile(t)
        shared_ids.append(sids[0])
        if a_scaled:
            state.shared[sids[1]] = SharedTile(tile(
                DataType.E8M0, Layout.ROW_MAJOR, raw("a_scale", DataType.E8M0, (m, nb)),
                cols=nb, shared=True))
            shared_ids.append(sids[1])
    if shared is not None:
        rows_, cols_ = (n, k) if trans_b else (k, n)
        state.shared[sids[2]] = SharedTile(tile(b_type, Layout.ROW_MAJOR,
                                                raw("b", b_type, (rows_, cols_)), cols=cols_,
                                                shared=True))
        shared_ids.append(sids[2])
        if b_scaled:
            state.shared[sids[3]] = SharedTile(tile(
                DataType.E8M0, Layout.ROW_MAJOR, raw("b_scale", DataType.E8M0, (nb, n)),
                cols=n, shared=True))
            shared_ids.append(sids[3])

    regs = []
    words = (param_words("quant", 1) if row.param is ParamKind.SCALAR else []) + \
        (param_words("alpha", 1) if relu == 2 else [])
    for word, reg in zip(words, (5, 9)):
        state.write_gpr(reg, word)
        regs.append(reg)
    ior = tuple(regs + [0] * (4 - len(regs))) if words else None

    hands = [int(h) for h in rng.integers(0, 4, 3)]
    dests = [Destination(hands[0], d_tsize.bit_length() - 7)]
    if row_max:
        dests.append(Destination(hands[1], _tsize(m * 4).bit_length() - 7))
    if gcode:
        phys = _power_of_two_at_least(group_count(n, group_n(gcode)))
        dests.append(Destination(hands[2], _tsize(m * phys * 4).bit_length() - 7))
    if op.uses_acc and indices[0] == dests[0].hand:
        return make_case(rng, config, op=op, a_type=a_type, b_type=b_type, m=m, n=n, k=k,
                         mask=mask, shared=shared, mode=mode, relu=relu, gcode=gcode,
                         row_max=row_max, row_max_init=row_max_init, max_abs=max_abs,
                         trans_a=trans_a, trans_b=trans_b, rmode=rmode, sat=sat,
                         m_layout=m_layout, special=special, max_mnk=max_mnk, payload=payload)
    bundle = Bundle(op, int(a_type), 3, 17, datr=datr, fpatr=fpatr,
                    dims=(m, n, k), local_sources=tuple(indices),
                    destinations=tuple(dests), shared_sources=tuple(shared_ids),
                    terminated=True, ior=ior, pe_mask=mask)
    return state, preflight(bundle, state)


def random_case(rng, config, max_mnk=(8, 9, 40)):
    """A random legal case of any function, type pair and post-processing."""
    shared = None if rng.random() < 0.7 else str(rng.choice(["right", "both"]))
    return make_case(rng, config, shared=shared, max_mnk=max_mnk)
