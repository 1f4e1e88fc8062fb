"""Ours (:func:`wsutils.attention.attention_word_sensitivity`) against the authors' estimator,
on the same ``(X, W)``, for softmax attention (RAF).

The baseline is written here after the authors' ``sensitivity.py``: the first row only, one
start at ``x_1 + 0.1ξ``, plain gradient steps of learning rate 10 on
``−‖φ(X') − φ(X)‖/√(n·d)`` (their ``−sqrt(MSELoss)``) for ``50·n`` steps, each followed by the
projection onto the ball of radius ``√d`` centred at the noisy start, and the value read at
the last iterate. Both run in this process, one after the other on the same point, so the
timing ratio is fair even on a loaded machine.

``python -m benchmarks bench_attention`` (or ``python -m benchmarks.bench_attention --seeds 5``).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

import wsutils as ws
from wsutils.attention import attention_word_sensitivity

GRID = [(192, 50), (192, 250), (768, 50), (768, 250)]
OURS = dict(rows=[0], starts=8, steps=150, takeovers=True)


def authors_estimator(X: torch.Tensor, W: torch.Tensor, *, seed: int, lr: float = 10.0,
                      steps: int | None = None) -> float:
    """The authors' search as their script runs it (see the module docstring)."""
    n, d = X.shape
    steps = 50 * n if steps is None else steps
    g = torch.Generator().manual_seed(seed)
    phi = ws.raf(X, W).reshape(-1)
    x0 = X[0] + 0.1 * torch.randn(d, generator=g, dtype=X.dtype)
    xt = x0.clone().requires_grad_(True)
    rest = X[1:]
    for _ in range(steps):
        feats = ws.raf(torch.cat([xt[None], rest]), W).reshape(-1)
        loss = -torch.sqrt(torch.mean((feats - phi) ** 2))
        (grad,) = torch.autograd.grad(loss, xt)
        with torch.no_grad():
            xt -= lr * grad
            step = xt - x0
            norm = torch.linalg.vector_norm(step)
            if norm > math.sqrt(d):
                xt.copy_(x0 + step * (math.sqrt(d) / norm))
    with torch.no_grad():
        XD = X.clone()
        XD[0] = xt
        return float(torch.linalg.vector_norm(ws.raf(XD, W).reshape(-1) - phi)
                     / torch.linalg.vector_norm(phi))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--grid", default=",".join(f"{d}x{n}" for d, n in GRID),
                   help="comma-separated dxn points, e.g. 192x50,768x250")
    args = p.parse_args(argv or [])
    torch.set_num_threads(args.threads)  # more threads than idle cores makes tiny matmuls crawl
    grid = [tuple(int(v) for v in s.split("x")) for s in args.grid.split(",")]
    print(f"ours: {OURS}; baseline: row 0, one start, lr 10, 50·n steps, last iterate")
    print(f"{'d':>5} {'n':>5} {'seeds':>5} {'t_ours/pt':>10} {'t_base/pt':>10} {'speed-up':>9} "
          f"{'S_ours':>8} {'S_base':>8} {'ours>=base':>10}  exceptions")
    for d, n in grid:
        t_o = t_b = 0.0
        S_o, S_b = [], []
        for seed in range(args.seeds):
            X = ws.sample_X(n, d, seed=1000 * seed)
            W = ws.sample_W(d, seed=1000 * seed + 1)
            t = time.perf_counter()
            S_o.append(attention_word_sensitivity(X, W, seed=seed, **OURS).value)
            t_o += time.perf_counter() - t
            t = time.perf_counter()
            S_b.append(authors_estimator(X, W, seed=seed))
            t_b += time.perf_counter() - t
        S_o, S_b = np.array(S_o), np.array(S_b)
        wins = S_o >= S_b
        exc = ", ".join(f"seed {s}: {S_o[s]:.4f} < {S_b[s]:.4f}" for s in np.flatnonzero(~wins))
        k = args.seeds
        print(f"{d:>5} {n:>5} {k:>5} {t_o / k:>9.2f}s {t_b / k:>9.2f}s {t_b / t_o:>8.1f}x "
              f"{np.median(S_o):>8.3f} {np.median(S_b):>8.3f} {wins.mean():>10.2f}  {exc or '-'}",
              flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
