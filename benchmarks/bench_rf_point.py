"""The random-features chapter's grid point, ``rf_point`` (reduced law, first word,
``k = D``), with its block drawn in single precision (``precision="float32"``, what the
chapter runs) against the float64 draw (the default, and the chapter's former setting), side by
side in one process, one thread, alternating.

Both compute the certificates and the value in float64 from the drawn weights' exact values;
the two precisions draw different weights from one seed, so ``lower ≤ S ≤ upper`` differ by
the spread of a draw (the table prints them), not by rounding.

Points: the paper grid's largest (``d = 768``, ``n = 150``), its smallest ``n`` at ``d = 768``,
one at ``d = 384``, and the far grid's largest (``d = 64``, ``n = 4000``).

Run: ``.venv/bin/python -m benchmarks bench_rf_point`` (``--seeds 2``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

POINTS = [(768, 150), (768, 90), (384, 150), (64, 4000)]


def _timed(precision: str, d: int, n: int, seed: int) -> tuple[float, dict]:
    from wsutils.experiments.random_features import rf_point

    c0 = time.process_time()
    r = rf_point(family="isotropic", n=n, d=d, seed=seed, precision=precision)
    return time.process_time() - c0, r


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_rf_point")
    parser.add_argument("--seeds", type=int, default=2, help="draws per point")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    _timed("float32", 4, 4, 0)  # warm-up: load libraries
    print(
        "rf_point (reduced law, first word, k = D), 1 thread, one process; CPU s per point "
        "(mean over seeds); lower ≤ S ≤ upper of the first seed"
    )
    head = (
        f"{'d':>4} {'n':>5} {'cpu f64':>8} {'cpu f32':>8} {'speed-up':>8}  "
        f"{'f64: lower ≤ S ≤ upper':<26}  f32: lower ≤ S ≤ upper"
    )
    print(head)
    print("-" * len(head))
    for d, n in POINTS:
        rows = {"float64": [], "float32": []}
        for s in range(args.seeds):
            for prec in rows:
                rows[prec].append(_timed(prec, d, n, 1000 + s))
        c64 = np.mean([c for c, _ in rows["float64"]])
        c32 = np.mean([c for c, _ in rows["float32"]])
        fmt = lambda r: f"{r['lower']:.4f} ≤ {r['S']:.4f} ≤ {r['upper']:.4f}"  # noqa: E731
        print(
            f"{d:>4} {n:>5} {c64:>8.2f} {c32:>8.2f} {c64 / c32:>7.2f}×  "
            f"{fmt(rows['float64'][0][1]):<26}  {fmt(rows['float32'][0][1])}",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
