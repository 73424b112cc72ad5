"""Execution of an approved plan: the arithmetic of one bundle, per selected PE.

:func:`execute` takes a plan from :mod:`ptocube.model.preflight` and the
(unchanged) architectural state and returns the output group to publish:
the new tiles of every selected PE and the numeric status flags.  It never
touches the state; :mod:`ptocube.model.machine` publishes the group
atomically.

A Matrix bundle, on each PE (spec digest §2, §5.6):

1. snapshot the sources: Local operands are unpacked from their CELL or
   row-major payloads; Shared primaries are read from the Shared tile, with
   TransA/TransB applied to its row-major logical view;
2. accumulate ``P = [C +] A x B`` over increasing K, then ``[+ Bias]`` once:

   * ``ieee`` (default, ruling R1/R2/R3): FP32 per-term fused multiply-add
     with the exact product of the decoded (and MX-scaled) inputs; integer
     classes wrap modulo 2^32;
   * ``pto-v0`` (test-only): the executable spec's raw-carrier hooks, integer
     arithmetic on the 64-bit carrier words, of which D keeps bits 31:0;

3. B.FPATR post-processing of P into D, RowMaxOut and GroupMaxOut, with flags.

A TIMG2COL bundle gathers its window from the source feature map.
"""

import numpy as np

from .datatype import DataType, NumClass
from .img2col import img2col
from .numeric import (add_bias_f32, add_bias_int, add_bias_pto_v0, bits_to_f32, decode,
                      f32_to_bits, matmul_float, matmul_int, matmul_pto_v0, pto_v0_carrier)
from .postprocess import postprocess
from .preflight import Img2ColPlan, MatrixPlan
from .state import State

__all__ = ["ARITHMETIC_MODES", "execute", "execute_matrix", "execute_img2col",
           "accumulate"]

#: Accumulation arithmetic the golden model offers (ruling R1).
ARITHMETIC_MODES = ("ieee", "pto-v0")


def execute(plan, state: State, arithmetic: str = "ieee"):
    """Compute a planned bundle; returns ``(tiles, flags)`` with tiles as ``(pe, index, Tile)``."""
    if isinstance(plan, MatrixPlan):
        return execute_matrix(plan, state, arithmetic)
    if isinstance(plan, Img2ColPlan):
        return execute_img2col(plan, state)
    raise TypeError(f"not a bundle plan: {plan!r}")


def _shared_primary(state: State, sid: int, rows: int, cols: int, transpose: bool) -> np.ndarray:
    """The logical ``rows x cols`` view of a Shared primary (stored transposed when asked)."""
    tile = state.shared[sid].tile
    stored = (cols, rows) if transpose else (rows, cols)
    raw = tile.raw()[:stored[0], :stored[1]]
    return raw.T if transpose else raw


def _operands(plan: MatrixPlan, state: State, pe: int) -> dict:
    """Raw bit patterns of every mathematical source of one PE, by role."""
    f, local, shared = plan.bundle.fpatr, plan.local, plan.shared
    nb = plan.scale_blocks
    raw = {}
    for role in ("c", "a", "a_scale", "b", "b_scale", "bias"):
        index = getattr(local, role)
        if index is not None:
            raw[role] = state.tile(pe, index).raw()
    if shared.a is not None:
        raw["a"] = _shared_primary(state, shared.a, plan.m, plan.k, f.trans_a)
    if shared.a_scale is not None:
        raw["a_scale"] = state.shared[shared.a_scale].tile.raw()[:plan.m, :nb]
    if shared.b is not None:
        raw["b"] = _shared_primary(state, shared.b, plan.k, plan.n, f.trans_b)
    if shared.b_scale is not None:
        raw["b_scale"] = state.shared[shared.b_scale].tile.raw()[:nb, :plan.n]
    return raw


def accumulate(plan: MatrixPlan, raw: dict, arithmetic: str = "ieee") -> np.ndarray:
    """The raw accumulator P (uint32 [M, N]) of one PE: ``[C +] A x B [+ Bias]``.

    ``raw`` holds the sources' raw bit patterns by role (``a``, ``b``, and
    ``c``, ``a_scale``, ``b_scale``, ``bias`` when present).
    """
    acc0, bias = raw.get("c"), raw.get("bias")
    if arithmetic == "pto-v0":
        p = matmul_pto_v0(pto_v0_carrier(plan.a_type, raw["a"]),
                          pto_v0_carrier(plan.b_type, raw["b"]),
                          None if acc0 is None else pto_v0_carrier(plan.acc_type, acc0),
                          _carrier_scale(raw.get("a_scale")), _carrier_scale(raw.get("b_scale")))
        if bias is not None:
            p = add_bias_pto_v0(p, pto_v0_carrier(plan.acc_type, bias[0]))
        return (p & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    if arithmetic != "ieee":
        raise ValueError(f"unknown arithmetic mode {arithmetic!r}; use one of {ARITHMETIC_MODES}")
    a, b = decode(plan.a_type, raw["a"]), decode(plan.b_type, raw["b"])
    if plan.acc_type is DataType.FP32:
        p = matmul_float(a, b, None if acc0 is None else bits_to_f32(acc0),
                         raw.get("a_scale"), raw.get("b_scale"))
        if bias is not None:
            p = add_bias_f32(p, bits_to_f32(bias[0]))
        return f32_to_bits(p)
    p = matmul_int(a, b, acc0, signed=plan.a_type.num_class is NumClass.SIGNED)
    return p if bias is None else add_bias_int(p, bias[0])


def _carrier_scale(scale):
    return None if scale is None else pto_v0_carrier(DataType.E8M0, scale)


def execute_matrix(plan: MatrixPlan, state: State, arithmetic: str = "ieee"):
    """Run a Matrix plan on every selected PE; returns ``(tiles, flags)``."""
    f, local = plan.bundle.fpatr, plan.local
    tiles, flags = [], 0
    for pe in plan.pes:
        p = accumulate(plan, _operands(plan, state, pe), arithmetic)
        aux = {role: None if getattr(local, role) is None
               else state.tile(pe, getattr(local, role)).raw()
               for role in ("rowmax_in", "quant_vector", "alpha_vector")}
        result = postprocess(
            p, plan.acc_type, f, plan.bundle.rmode, plan.bundle.sat,
            plan.quant_scalar, plan.alpha_scalar,
            None if aux["quant_vector"] is None else aux["quant_vector"][0],
            None if aux["alpha_vector"] is None else aux["alpha_vector"][0],
            None if aux["rowmax_in"] is None else aux["rowmax_in"][:, 0])
        values = {"D": result.d,
                  "RowMaxOut": None if result.rowmax is None else result.rowmax[:, None],
                  "GroupMaxOut": result.groupmax}
        for output in plan.outputs[pe]:
            tiles.append((pe, output.index, output.tile(values[output.role])))
        flags |= result.flags
    return tiles, flags


def execute_img2col(plan: Img2ColPlan, state: State):
    """Run a TIMG2COL plan on every selected PE; returns ``(tiles, 0)`` (no flags)."""
    tiles = []
    out = plan.output
    for pe in plan.pes:
        src = state.tile(pe, plan.source)
        window = img2col(src.raw_slots(), src.defined, src.feature_map, plan.dtype,
                         out.valid_rows, out.valid_cols, plan.pos_m, plan.pos_k)
        tiles.append((pe, out.index, out.tile(window)))
    return tiles, 0
