"""One flip-experiment point, an older ``wsutils`` against this one, side by side (issue 25).

Each variant runs the same :func:`wsutils.generalization.flip_point` (same map, sizes, seed,
search) in its own child process, with ``PYTHONPATH`` set to the tree whose ``wsutils`` it
imports, one torch thread (as in the book build: ``OMP_NUM_THREADS=1``), alternately
(old, new, old, new, ...); the child times the whole point (data, features, Gram matrix,
searches) in CPU seconds and returns its records, and every numeric field of every run is
compared between the two variants (``identical`` when every field is the same float).

``--ref`` is a directory holding the old ``wsutils`` or a git revision (its ``wsutils`` is
extracted with ``git archive``; default 3399557, before issue 25's changes):
``python -m benchmarks.bench_flip_checks --configs raf:120,relu:120``
(the paper grid's points: ``d = 768``, ``N ∈ {1100, 1200, 1300}``, 4 starts, 300 steps,
float32 search, as ``book/generalization.md`` runs them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def child(args) -> None:
    import time

    import torch

    torch.set_num_threads(1)
    import inspect

    from wsutils import generalization as G

    method = args.search.split(",") if "," in args.search else args.search
    search = dict(starts=args.starts, steps=args.steps, dtype="float32")
    if "method" in inspect.signature(G.flip_point).parameters:  # one search dict (issue 33)
        how = dict(method=method, search=search)
    else:  # a tree from before: loose keywords
        how = dict(search=method, starts=args.starts, steps=args.steps, search_dtype="float32")
    c0 = time.process_time()
    out = G.flip_point(
        map=args.map,
        n=args.n,
        d=args.d,
        Ns=[int(N) for N in args.Ns.split(",")],
        seed=args.seed,
        data=args.data,
        **how,
    )
    cpu = time.process_time() - c0
    print(json.dumps({"cpu": cpu, "runs": out["runs"]}))


def run_variant(tree: str, args, m: str, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", "--map", m, "--n", str(n), "--d", str(args.d)]
    cmd += ["--Ns", args.Ns, "--seed", str(args.seed), "--starts", str(args.starts)]
    cmd += ["--steps", str(args.steps), "--data", args.data, "--search", args.search]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def compare(a: list[dict], b: list[dict]) -> tuple[float, str]:
    """The largest absolute difference of any numeric field over the runs, and its field."""
    worst, where = 0.0, "-"
    for ra, rb in zip(a, b, strict=True):
        for k, va in ra.items():
            vb = rb[k]
            if isinstance(va, (int, float)) and not isinstance(va, bool):
                if math.isnan(va) and math.isnan(vb):
                    continue
                diff = abs(va - vb) if va != vb else 0.0
                if diff > worst or (math.isnan(diff) and worst == worst):
                    worst, where = diff, k
            elif va != vb:
                return math.inf, k
    return worst, where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--ref",
        default="3399557",
        help="a directory holding the old wsutils package, or a git revision of this "
        "repository (default 3399557, before issue 25's flip-point changes)",
    )
    ap.add_argument("--new", default=str(HERE), help="the same for the new one (this tree)")
    ap.add_argument("--configs", default="raf:120", help="map:n pairs, comma separated")
    ap.add_argument("--map", default="raf")
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--Ns", default="1100,1200,1300")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--data", default="planted")
    ap.add_argument("--search", default="ours", help="ours, authors, or ours,authors")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if not Path(args.ref).is_dir():  # a git revision: its wsutils in a temporary directory
        tmp = tempfile.mkdtemp(prefix="bench_flip_checks_")
        tar = subprocess.run(
            ["git", "-C", str(HERE), "archive", args.ref, "wsutils"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        args.ref = tmp
    for cfg in args.configs.split(","):
        m, n = cfg.split(":")
        times: dict[str, list[float]] = {"old": [], "new": []}
        runs = {}
        for _ in range(args.repeats):
            for name, tree in (("old", args.ref), ("new", args.new)):
                r = run_variant(tree, args, m, int(n))
                times[name].append(r["cpu"])
                runs[name] = r["runs"]
        worst, field = compare(runs["old"], runs["new"])
        same = "identical" if worst == 0 else f"largest difference {worst:.3g} ({field})"
        print(
            f"{m} n = {n}, d = {args.d}, N ∈ {{{args.Ns}}}, {args.data}, {args.search}: "
            f"CPU s old {' / '.join(f'{t:.1f}' for t in times['old'])}, "
            f"new {' / '.join(f'{t:.1f}' for t in times['new'])} "
            f"(min {min(times['old']):.1f} → {min(times['new']):.1f}, "
            f"{min(times['old']) - min(times['new']):.1f} s saved); "
            f"{len(runs['new'])} runs, {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
