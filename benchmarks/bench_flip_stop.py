"""Our flip search with every step against the stopping rule ``FLIP_STOP``.

Before (until 2026-12-07): :func:`wsutils.generalization.flip_point` with the chapters' search
(``starts``, ``steps``, float32) taking every step. After: the same search with
``stop=FLIP_STOP`` (:data:`wsutils.experiments.generalization.FLIP_STOP`): the batch ends once
every search's best loss has gained at most ``rtol``, relative, over the last ``m`` steps.
Both on the same point (same texts, weights and starts), one thread, in one process, one after
the other; the whole point is timed (features, Gram matrix and searches), wall seconds.

Each run's outcome is printed beside it: ``N``, training, loss, flipped or not
(``y·t₁^Δ < 0``), and ``y·t₁^Δ`` with every step, then with the stopping rule.

``python -m benchmarks.bench_flip_stop`` (the paper grid's first draw, ``d = 768``, the four
configurations); ``--grid regime``: the protection study's first draw (``n = 40``, random
features and softmax attention, the ``N`` of ``regime_Ns``, output loss).
"""

from __future__ import annotations

import argparse
import time

import torch

from wsutils import generalization as G
from wsutils.experiments import generalization as gen_exp
from wsutils.generalization import report as FR


def _points(grid: str) -> list[dict]:
    P = gen_exp.SCALES["paper"]
    search = dict(starts=P.starts, steps=P.steps, dtype="float32")
    if grid == "flip":
        return G.flip_grid(d=P.d, Ns=P.Ns, seeds=P.seeds[:1], search=search)
    return FR.regime_points(d=P.d, n=40, Ns=P.regime_Ns, seeds=P.regime_seeds[:1], search=search)


def _outcomes(rec: dict) -> list[tuple]:
    return [
        (r["N"], r["training"], r["loss"], r["y"] * r["D1"] < 0, r["y"] * r["D1"])
        for r in rec["runs"]
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=["flip", "regime"], default="flip")
    args = ap.parse_args(argv or [])
    torch.set_num_threads(1)
    total = {"every step": 0.0, "stop": 0.0}
    for p in _points(args.grid):
        out = {}
        for name, extra in (("every step", {}), ("stop", dict(stop=gen_exp.FLIP_STOP))):
            q = dict(p, search=dict(p["search"], **extra))
            t = time.perf_counter()
            rec = G.flip_point(**q)
            out[name] = (time.perf_counter() - t, _outcomes(rec))
            total[name] += out[name][0]
        (ta, a), (tb, b) = out["every step"], out["stop"]
        same = sum(x[3] == y[3] for x, y in zip(a, b))
        gap = max(abs(x[4] - y[4]) for x, y in zip(a, b))
        print(
            f"{p['map']:>5} n={p['n']:<4} every step {ta:6.1f} s, stop {tb:6.1f} s; "
            f"flipped alike in {same}/{len(a)} runs, y·t1 at most {gap:.3g} apart",
            flush=True,
        )
        for x, y in zip(a, b):
            print(
                f"      N={x[0]:<5} {x[1]:<10} {x[2]:<9} {x[3]!s:>5} {x[4]:+.4f} | "
                f"{y[3]!s:>5} {y[4]:+.4f}"
            )
    print(f"total: every step {total['every step']:.1f} s, stop {total['stop']:.1f} s")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
