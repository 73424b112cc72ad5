"""Throughput of the golden model's bit-exact CUBE arithmetic beside numpy's own matmul.

:func:`bench_model` times the numeric path the execution engine runs (decode the
raw operands, the exact product, the result bit patterns) for an S8, an FP16 and
an MX (E4M3 x E5M2 with E8M0 scales) TMATMUL-style product, and numpy's matmul
on the decoded values of the same shapes (float32 for floats, int64 for
integers).  ``ratio`` = model time / numpy time.
"""

import time

import numpy as np

from ptocube.model.datatype import DataType
from ptocube.model.numeric import decode, f32_to_bits, matmul_float, matmul_int

__all__ = ["bench_model"]

#: Slow-down limits relative to numpy (``None``: reported, no target).
TARGET_RATIO = {"S8": 10.0, "FP16": 300.0, "MX E4M3xE5M2": None}


def _best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _finite_codes(rng, dtype, shape, codes):
    """Random raw patterns of ``dtype`` whose values are finite."""
    raw = rng.integers(0, codes, shape)
    values = decode(dtype, raw)
    return np.where(np.isfinite(values), raw, 0)


def bench_model(m: int = 64, n: int = 64, k: int = 256, repeats: int = 5,
                seed: int = 0) -> list[dict]:
    """Measure bit-exact MACs/s of the model against numpy matmul on [m,k] x [k,n].

    Returns one dict per case with keys ``case``, ``shape`` (M, N, K), ``macs``,
    ``model_s``, ``numpy_s`` (best of ``repeats`` runs; numpy gets 20x as many),
    ``model_macs_per_s``, ``numpy_macs_per_s``, ``ratio``, ``target_ratio`` and
    ``meets_target`` (None where there is no target).
    """
    rng = np.random.default_rng(seed)
    macs = m * n * k
    cases = []

    a_raw = rng.integers(0, 256, (m, k))
    b_raw = rng.integers(0, 256, (k, n))
    a_int, b_int = decode(DataType.S8, a_raw), decode(DataType.S8, b_raw)
    # Sanity: the wrapped S32 result must be numpy's int64 product modulo 2^32.
    got = matmul_int(a_int, b_int, signed=True)
    assert (got == (a_int @ b_int).astype(np.uint32)).all()
    cases.append(("S8",
                  lambda: matmul_int(decode(DataType.S8, a_raw), decode(DataType.S8, b_raw)),
                  lambda: a_int @ b_int))

    a16 = rng.standard_normal((m, k)).astype(np.float16)
    b16 = rng.standard_normal((k, n)).astype(np.float16)
    a16_raw, b16_raw = a16.view(np.uint16), b16.view(np.uint16)
    a32, b32 = a16.astype(np.float32), b16.astype(np.float32)
    cases.append(("FP16",
                  lambda: f32_to_bits(matmul_float(decode(DataType.FP16, a16_raw),
                                                   decode(DataType.FP16, b16_raw))),
                  lambda: a32 @ b32))

    blocks = -(-k // 32)
    a8_raw = _finite_codes(rng, DataType.E4M3, (m, k), 256)
    b8_raw = _finite_codes(rng, DataType.E5M2, (k, n), 256)
    a_scale = rng.integers(120, 135, (m, blocks))
    b_scale = rng.integers(120, 135, (blocks, n))
    a8 = decode(DataType.E4M3, a8_raw).astype(np.float32)
    b8 = decode(DataType.E5M2, b8_raw).astype(np.float32)
    cases.append(("MX E4M3xE5M2",
                  lambda: f32_to_bits(matmul_float(decode(DataType.E4M3, a8_raw),
                                                   decode(DataType.E5M2, b8_raw),
                                                   a_scale=a_scale, b_scale=b_scale)),
                  lambda: a8 @ b8))

    results = []
    for name, model, reference in cases:
        model_s = _best_time(model, repeats)
        numpy_s = _best_time(reference, 20 * repeats)
        target = TARGET_RATIO[name]
        ratio = model_s / numpy_s
        results.append({
            "case": name, "shape": (m, n, k), "macs": macs,
            "model_s": model_s, "numpy_s": numpy_s,
            "model_macs_per_s": macs / model_s, "numpy_macs_per_s": macs / numpy_s,
            "ratio": ratio, "target_ratio": target,
            "meets_target": None if target is None else ratio <= target,
        })
    return results
