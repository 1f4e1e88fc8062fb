"""Per-point functions for the sweep tests, in their own importable module: a Dask worker
process and a separate sweep process must import them under the same name as the test."""

from __future__ import annotations

import time

import torch

import wsutils as ws


def rf_sensitivity(n: int, d: int, seed: int, steps: int = 10) -> dict:
    """One real grid point: the estimated word sensitivity of random features (k = D) on a
    synthetic text, from explicit seeds."""
    X = ws.sample_X(n, d, seed=seed)
    V = ws.sample_V(n * d, n, d, seed=seed + 1)
    r = ws.word_sensitivity(lambda Z: ws.rf(Z, V), X, steps=steps, starts=2, seed=seed)
    return {
        "S": r.value,
        "row": r.row,
        "Delta_norm": float(torch.linalg.vector_norm(torch.as_tensor(r.Delta))),
    }


def slow_rf_sensitivity(n: int, d: int, seed: int, pause: float = 0.0) -> dict:
    """``rf_sensitivity`` after a pause, so that a test can kill a sweep between two points."""
    time.sleep(pause)
    return rf_sensitivity(n, d, seed)


def fails_until(x: int, flag: str) -> dict:
    """``x²``, or a RuntimeError while the file ``flag`` does not exist: a grid that fails,
    then runs once the flag is set (a rerun must run its points again)."""
    from pathlib import Path

    if not Path(flag).exists():
        raise RuntimeError(f"not ready: {flag}")
    return {"y": x * x}
