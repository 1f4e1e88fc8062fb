"""The flip experiment's searches: one after another in float64 against one batch in float32.

A point of the generalization experiment (``book/generalization.md``, ``book/imdb.md``) runs
up to 10 searches (six output-loss, three align_rt, one align_ft), 4 starts each. Before
(``batch_searches=False``, ``search={"dtype": "float64"}``):
:func:`wsutils.generalization.search_flip` once per search, each step a 4-column product
over the weights. After (the default):
:func:`wsutils.generalization.search_flips`, the 40 rows in one batch, iterations in float32,
every recorded number float64 at the returned ``Δ`` (as the chapters run it:
``search={"dtype": "float32"}``). Both on the same point (same texts,
weights and starts), one thread, in one process, alternately; the whole point is timed
(features, Gram matrix and searches), CPU seconds.

``python -m benchmarks.bench_flip_batch --configs rf:40,raf:40,raf:120,relu:120``
(the paper grid's configurations at ``d = 768``, ``N ∈ {1100, 1200, 1300}``, 300 steps).
``--linalg raf:120``: the per-``N`` linear algebra with ``check_finite`` on every call
against once per point (item 7 of issue 25). ``--sweep rf,raf,relu --Ns 25,100,400,1300``:
the chapter's sweep in ``N``, two points per map (ours, the authors') against one.
"""

from __future__ import annotations

import argparse
import time

import torch

from wsutils import generalization as G
from wsutils.checks import check_finite
from wsutils.generalization import _flip as GF

VARIANTS = {  # batch_searches, the search's dtype
    "old": (False, "float64"),
    "batched64": (True, "float64"),
    "new": (True, "float32"),
}


def one(m: str, n: int, d: int, Ns: list[int], steps: int, variant: str):
    c0 = time.process_time()
    batch, dtype = VARIANTS[variant]
    search = dict(starts=4, steps=steps, dtype=dtype)
    out = G.flip_point(map=m, n=n, d=d, Ns=Ns, seed=0, search=search, batch_searches=batch)
    return time.process_time() - c0, out["runs"]


def linalg(m: str, n: int, d: int, Ns: list[int]) -> None:
    """The per-``N`` linear algebra of a point, before (the public functions, each checking
    its ``N × p`` input with ``check_finite``: five passes per ``N``) and after (checked once
    at the door, then ``_min_norm``, ``_project``, ``_retrain`` of
    ``wsutils.generalization._flip``), same ``Φ``, same process, alternately; the results are
    the same numbers (same formulas)."""
    Xs, Y, X, y = G.planted_data(max(Ns), n, d, seed=0)
    Phi_all, phi, _ = GF._features(m, Xs, X, seed=3, row=0, block_rows=2048, progress=False)
    L_all = G.gram_cholesky(Phi_all)

    def old():
        out = []
        for N in Ns:
            Phi, L = Phi_all[:N], L_all[:N, :N]
            t0 = G.min_norm_interpolator(Phi, Y[:N], L=L)
            Pphi = G.project_out(Phi, phi, L=L)
            out.append((t0, Pphi, G.retrain(Phi, Y[:N], phi, y, L=L)))
        return out

    def new():
        check_finite("phi", phi)
        out = []
        for N in Ns:
            Phi, L = Phi_all[:N], L_all[:N, :N]
            t0 = GF._min_norm(Phi, Y[:N], L)
            Pphi = GF._project(Phi, phi, L)
            out.append((t0, Pphi, GF._retrain(phi, y, t0, Pphi)))
        return out

    times = {"old": [], "new": []}
    for _ in range(2):
        for name, fn in (("old", old), ("new", new)):
            c0 = time.process_time()
            res = fn()
            times[name].append(time.process_time() - c0)
            if name == "old":
                ref = res
    same = all(torch.equal(a, b) for r, q in zip(ref, res) for a, b in zip(r, q))
    print(
        f"linear algebra per point, {m} n = {n}, p = {Phi_all.shape[1]}, N ∈ {Ns}: "
        f"checked per call {min(times['old']):.1f} s, checked once {min(times['new']):.1f} s "
        f"(best of 2, CPU s); same numbers: {same}",
        flush=True,
    )


def sweep(maps: list[str], d: int, n: int, Ns: list[int], steps: int) -> None:
    """The chapter's sweep in ``N`` (``gen.py``'s data, fine-tuning, output loss), one draw:
    before, two points per map (ours, then the authors', each building the features and
    running its searches one by one in float64); after, one point running both searches on
    features built once, each search's runs in one batch (ours in float32)."""
    from wsutils.run.seeds import point_seed

    kw = dict(
        n=n,
        d=d,
        Ns=Ns,
        seed=point_seed("flip-vs-N", "authors", d, n, 0),
        data="authors",
        losses=["output"],
        trainings=["fine_tune"],
    )
    old64 = dict(batch_searches=False)
    print(f"N sweep, d = {d}, n = {n}, N ∈ {Ns}; CPU s per map")
    print(
        f"{'map':<6}{'old':>9}{'new':>9}{'ratio':>8}   y·t1Δ ours old/new, authors old/new "
        f"at N = {max(Ns)}"
    )
    for m in maps:
        c0 = time.process_time()
        ours = dict(starts=4, steps=steps)
        o = G.flip_point(map=m, method="ours", search=ours, **old64, **kw)["runs"]
        a = G.flip_point(map=m, method="authors", **old64, **kw)["runs"]
        c1 = time.process_time()
        both = G.flip_point(
            map=m, method=["ours", "authors"], search=ours | dict(dtype="float32"), **kw
        )["runs"]
        c2 = time.process_time()

        def last(runs, method):
            return next(
                r["y"] * r["D1"] for r in runs if r["method"] == method and r["N"] == max(Ns)
            )

        print(
            f"{m:<6}{c1 - c0:>9.1f}{c2 - c1:>9.1f}{(c1 - c0) / (c2 - c1):>7.1f}×   "
            f"{last(o, 'ours'):+.4f}/{last(both, 'ours'):+.4f}, "
            f"{last(a, 'authors'):+.4f}/{last(both, 'authors'):+.4f}",
            flush=True,
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="rf:40,raf:40,raf:120,relu:120")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--Ns", default="1100,1200,1300")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--variants", default="old,new")
    ap.add_argument(
        "--linalg",
        default="",
        help="map:n, e.g. raf:120: time the per-N "
        "linear algebra with and without the repeated check_finite, and stop",
    )
    ap.add_argument(
        "--sweep",
        default="",
        help="maps, e.g. rf,raf,relu: the sweep in N "
        "at --d, n = 40, N ∈ --Ns (e.g. 25,100,400,1300), and stop",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    Ns = [int(v) for v in args.Ns.split(",")]
    variants = args.variants.split(",")
    if args.sweep:
        sweep(args.sweep.split(","), args.d, 40, Ns, args.steps)
        return
    if args.linalg:
        m, n = args.linalg.split(":")
        linalg(m, int(n), args.d, Ns)
        return
    print(
        f"torch {torch.__version__}, 1 thread; d = {args.d}, N ∈ {Ns}, 4 starts, "
        f"{args.steps} steps; CPU s per point"
    )
    print(
        f"{'map':<6}{'n':>5}"
        + "".join(f"{v:>11}" for v in variants)
        + f"{'ratio':>8}  max |Δ y·t1Δ|  old / new: max y·t1Δ(output), min y·t1Δ(align)"
    )
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

        print(
            f"{m:<6}{n:>5}"
            + "".join(f"{res[v][0]:>11.1f}" for v in variants)
            + f"{res[a][0] / res[b][0]:>7.1f}×  {diff:>12.2e}  {summary(a)}  {summary(b)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
