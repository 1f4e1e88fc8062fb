"""The normalisation chapter's generalization experiment (:prf:ref:`obs-norm-flip`), larger.

The chapter runs ``y·t_1^Δ`` for softmax, scalable softmax, sparsemax and hardmax attention
at ``d = 4``, ``n`` far beyond ``e^{√(2d)} ≈ 17``, two ``N`` and two or three draws; this runs
the same experiment (the same seeds: ``point_seed("flip-norm", d, n, s)``, so its first draws
are the chapter's) on more draws and more ``N``, fine-tuning, output loss and the
feature-alignment surrogate, and prints per normalisation and ``N``: the mean ``y·t_1^Δ``, the
runs flipped, the mean base-model and sensitivity terms, the largest ``|sensitivity term|``,
the median relative change and the surrogate's smallest ``y·t_1^Δ``.

``python -m benchmarks.bench_flip_norm --seeds 8 --workers 2`` (the defaults are the chapter's
paper search, ``starts=4, steps=40``, and ``N ∈ {100, 400, 800}``)
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    from wsutils import generalization as G
    from wsutils.run.seeds import point_seed
    from wsutils.run.sweep import run_grid

    p = argparse.ArgumentParser(prog="bench_flip_norm", description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=4)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--Ns", type=_ints, default=[100, 400, 800])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--starts", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--names", default="softmax,scalable,sparsemax,hardmax")
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv or [])
    names = args.names.split(",")
    points = [
        dict(
            map="attention",
            normalisation=name,
            d=args.d,
            n=args.n,
            Ns=args.Ns,
            seed=point_seed("flip-norm", args.d, args.n, s),
            search=dict(starts=args.starts, steps=args.steps),
            losses=["output", "align_ft"],
            trainings=["fine_tune"],
        )
        for name in names
        for s in range(args.seeds)
    ]
    pool = ProcessPoolExecutor(args.workers) if args.workers > 1 else None
    t = time.perf_counter()
    try:
        runs = G.flip_table(run_grid(G.flip_point, points, executor=pool))
    finally:
        if pool is not None:
            pool.shutdown()
    print(
        f"d = {args.d}, n = {args.n}, {args.seeds} draws, {args.starts} starts × "
        f"{args.steps} steps: {time.perf_counter() - t:.0f} s",
        flush=True,
    )
    print(
        f"{'normalisation':>13} {'N':>5} {'y·t1Δ':>7} {'flipped':>8} {'base':>7} {'sens':>7} "
        f"{'max|sens|':>9} {'rel.':>5} {'align min':>9}"
    )
    for name in names:
        for N in args.Ns:
            sel = [r for r in runs if r["normalisation"] == name and r["N"] == N]
            out = [r for r in sel if r["loss"] == "output"]
            yD1 = np.array([r["y"] * r["D1"] for r in out])
            print(
                f"{name:>13} {N:>5} {yD1.mean():+7.2f} {int((yD1 < 0).sum()):>4} of "
                f"{len(out):<2}"
                f"{np.mean([r['y'] * r['base_term'] for r in out]):+7.2f} "
                f"{np.mean([r['y'] * r['sens_term'] for r in out]):+7.3f} "
                f"{max(abs(r['sens_term']) for r in out):9.3f} "
                f"{np.median([r['rel_change'] for r in out]):5.2f} "
                f"{min(r['y'] * r['D1'] for r in sel if r['loss'] == 'align_ft'):+9.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
