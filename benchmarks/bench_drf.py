"""Deep random features: ``drf_point`` with its weights drawn and searched in float32
(``precision="float32"``, what the chapter runs) against the same estimator in float64 (the
former default, ``precision="float64"``), side by side in one process, one thread.

Both runs re-evaluate the best iterate of every start in float64 at the weights' exact
values, so both values are certified lower bounds for their own draws. The two precisions
draw different weights from one seed (float32 normals are not float64 normals rounded), so
the values differ by the seed-to-seed spread of a draw, not by rounding: the table prints
both and their mean ratio over seeds.

Points: the chapter's costliest (``d = 16``, ``n = 64``, ``L = 8``, ``k = 4096`` and
``2048``: the convergence grid's widest networks) and one of the paper's grid
(``d = 768``, ``n = 80``, ``L = 8``, ``k = 1024``).

Run: ``.venv/bin/python -m benchmarks bench_drf`` (``--seeds 3`` for more draws).
"""

from __future__ import annotations

import time

import numpy as np
import torch

POINTS = [(16, 64, 8, 4096), (16, 64, 8, 2048), (16, 64, 4, 4096), (768, 80, 8, 1024)]


def _timed(precision: str, d: int, n: int, L: int, k: int, seed: int) -> tuple[float, float]:
    from wsutils.experiments.deep_random_features import drf_point

    c0 = time.process_time()
    S = drf_point(n=n, d=d, L=L, k=k, seed=seed, precision=precision)["S"]
    return time.process_time() - c0, S


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_drf")
    parser.add_argument("--seeds", type=int, default=2, help="draws per point")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    _timed("float32", 4, 4, 2, 16, 0)  # warm-up: load libraries
    print("drf_point, 1 thread, one process; CPU s per point (mean over seeds), S per seed")
    head = (
        f"{'d':>4} {'n':>4} {'L':>2} {'k':>5} {'cpu f64':>8} {'cpu f32':>8} {'speed-up':>8}"
        f"  S f64 / S f32 (each seed)"
    )
    print(head)
    print("-" * len(head))
    for d, n, L, k in POINTS:
        rows = {"float64": [], "float32": []}
        for s in range(args.seeds):
            for prec in ("float64", "float32"):  # alternate, so load hits both alike
                rows[prec].append(_timed(prec, d, n, L, k, 1000 + s))
        c64 = np.mean([c for c, _ in rows["float64"]])
        c32 = np.mean([c for c, _ in rows["float32"]])
        pairs = ", ".join(
            f"{a[1]:.4f}/{b[1]:.4f}" for a, b in zip(rows["float64"], rows["float32"])
        )
        print(
            f"{d:>4} {n:>4} {L:>2} {k:>5} {c64:>8.2f} {c32:>8.2f} {c64 / c32:>7.2f}×  {pairs}",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
