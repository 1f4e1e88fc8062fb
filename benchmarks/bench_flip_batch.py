"""The flip experiment's searches: one after another in float64 against one batch in float32.

A point of the generalization experiment (``book/generalization.md``, ``book/imdb.md``) runs
up to 10 searches (six output-loss, three align_rt, one align_ft), 4 starts each. Before
(``batch_searches=False, search_dtype="float64"``): :func:`wsutils.generalization.search_flip`
once per search, each step a 4-column product over the weights. After (the default):
:func:`wsutils.generalization.search_flips`, the 40 rows in one batch, iterations in float32,
every recorded number float64 at the returned ``Δ``. Both on the same point (same texts,
weights and starts), one thread, in one process, alternately; the whole point is timed
(features, Gram matrix and searches), CPU seconds.

``python -m benchmarks.bench_flip_batch --configs rf:40,raf:40,raf:120,relu:120``
(the paper grid's configurations at ``d = 768``, ``N ∈ {1100, 1200, 1300}``, 300 steps).
"""

from __future__ import annotations

import argparse
import time

import torch

from wsutils import generalization as G

VARIANTS = {"old": dict(batch_searches=False, search_dtype="float64"),
            "batched64": dict(batch_searches=True, search_dtype="float64"),
            "new": dict(batch_searches=True, search_dtype="float32")}


def one(m: str, n: int, d: int, Ns: list[int], steps: int, variant: str):
    c0 = time.process_time()
    out = G.flip_point(map=m, n=n, d=d, Ns=Ns, seed=0, starts=4, steps=steps,
                       **VARIANTS[variant])
    return time.process_time() - c0, out["runs"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="rf:40,raf:40,raf:120,relu:120")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--Ns", default="1100,1200,1300")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", default="old,new")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    Ns = [int(v) for v in args.Ns.split(",")]
    variants = args.variants.split(",")
    print(f"torch {torch.__version__}, 1 thread; d = {args.d}, N ∈ {Ns}, 4 starts, "
          f"{args.steps} steps; CPU s per point")
    print(f"{'map':<6}{'n':>5}" + "".join(f"{v:>11}" for v in variants)
          + f"{'ratio':>8}  max |Δ y·t1Δ|  old / new: max y·t1Δ(output), min y·t1Δ(align)")
    for spec in args.configs.split(","):
        m, n = spec.split(":")
        n = int(n)
        res = {v: one(m, n, args.d, Ns, args.steps, v) for v in variants}
        yD1 = {v: [r["y"] * r["D1"] for r in runs] for v, (_, runs) in res.items()}
        a, b = variants[0], variants[-1]
        diff = max(abs(x - y) for x, y in zip(yD1[a], yD1[b]))

        def summary(v):
            runs = res[v][1]
            out = [r["y"] * r["D1"] for r in runs if r["loss"] == "output"]
            al = [r["y"] * r["D1"] for r in runs if r["loss"] != "output"]
            return f"{max(out):+.4f}/{min(al):+.4f}"
        print(f"{m:<6}{n:>5}" + "".join(f"{res[v][0]:>11.1f}" for v in variants)
              + f"{res[a][0] / res[b][0]:>7.1f}×  {diff:>12.2e}  {summary(a)}  {summary(b)}",
              flush=True)


if __name__ == "__main__":
    main()
