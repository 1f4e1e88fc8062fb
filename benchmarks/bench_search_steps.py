"""Issue 34's steps of the searches, each against the way it ran before, side by side in one
process, one thread, alternating (the best of ``--repeats`` rounds):

- ``gram``: random features' ``(V_i)_Jᵀ(V_i)_J`` and ``V_iᵀV_i`` in float64 by BLAS ``syrk``
  (``wsutils.estimators.rf._grams``, one triangle) against ``B.T @ B`` on the same float64
  blocks (the former ``_grams``, written out below);
- ``rf step``: one step of the random-features ascent (value and gradient) in one pass over
  ``V_i``, block by block (``_relative_change_objective``), against two whole passes (the
  former objective, below);
- ``rf step (numba)``: the same step as one compiled loop over the rows of ``V_i``
  (``wsutils.estimators._rf_step``, what runs on one thread with numba installed) against the
  blocked products of ``rf step``;
- ``attention``: a softmax / ReLU search of every row (the IMDb sweep's, float32 and float64)
  by :func:`~wsutils.estimators.self_attention.attention_word_sensitivity` as it runs now
  (chunks sized by ``pair_elements``, the gradient written out) against the same search with
  the objective's gradient by autograd and chunks of the full map's ``n·d`` a pair (the fast
  objective wrapped so that ``ascend_rows`` sees no ``evaluate`` and ``pair_elements = n·d``).

- ``flip features``: the flip experiment's random features, ``(V flat(X_b))_b`` and ``V_i``
  drawn from their joint law (``wsutils.generalization._features._rf_law_rows``,
  ``prop-rf-texts-law``) against forming every ``V flat(X_b)`` from the whole ``V``, block by
  block in float32 (``_rf_rows``, the former way; both still in the code base);
- ``thp``: one IMDb sweep point (random features, ``n = 200``, ``d = 384``) in a child process
  with PyTorch's large allocations on transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``, what
  the book's kernels get) against without, alternately; user + system CPU s of the child;
- ``pool``: IMDb sweep points (random features, ``n = 150``, ``d = 384``), one process per
  core at once (what ``process_pool`` now allows a build's kernel: one process each) against
  two per core (two chapters' 2-process pools side by side, as before); CPU s a point.

Sizes: the IMDb sweep's largest (``k = 76,800``, ``d = 384``, ``n = 200``) and the ReLU
chapter's RF grid's (``k = 192,000``, ``d = 768``). The attention rows print both searches'
values (the same search; they differ by rounding).

Run: ``.venv/bin/python -m benchmarks bench_search_steps`` (``--repeats 3``).
"""

from __future__ import annotations

import math
import time

import torch

RF_SIZES = [(76800, 384, 4), (192000, 768, 6)]
ATTENTION = [("raf", 200, 384, "float32"), ("relu", 200, 384, None), ("relu", 100, 768, None)]


def _grams_gemm(A: torch.Tensor, active: torch.Tensor, full: bool = True):
    """The former ``_grams``: ``A_JᵀA_J`` and (``full``) ``AᵀA`` by ``B.T @ B`` on float64
    blocks."""
    from wsutils.estimators.rf import _blocks64

    d = A.shape[1]
    G = torch.zeros(d, d, dtype=torch.float64)
    GJ = torch.zeros_like(G)
    for s, B in _blocks64(A):
        m = active[s : s + B.shape[0]]
        BJ = B[m]
        GJ += BJ.T @ BJ
        if full:
            BO = B[~m]
            G += BO.T @ BO
    return G + GJ, GJ


def _two_passes(u: torch.Tensor, Vi: torch.Tensor):
    """The former random-features objective: ``V_i Δ`` and ``V_iᵀ(…)`` as two whole passes."""
    base = torch.relu(u)
    base_norm = torch.linalg.vector_norm(base)

    def evaluate(Delta):
        pre = u[:, None] + (Delta @ Vi.T).T
        diff = torch.relu(pre) - base[:, None]
        vals = torch.linalg.vector_norm(diff, dim=0) / base_norm
        return vals, lambda: (diff * (pre > 0)).T.contiguous() @ Vi

    return evaluate


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def _row(name: str, size: str, new: float, old: float, note: str = "") -> None:
    print(f"{name:<15} {size:<26} {new:>9.3f} {old:>9.3f} {old / new:>7.2f}×  {note}")


def _rf(repeats: int) -> None:
    from wsutils.estimators import _rf_step
    from wsutils.estimators.rf import _blocked_objective, _grams

    for k, d, B in RF_SIZES:
        g = torch.Generator().manual_seed(k)
        Vi = torch.randn(k, d, generator=g) / math.sqrt(k)
        u = torch.randn(k, generator=g, dtype=torch.float64)
        active = u > 0
        size = f"k={k}, d={d}"
        new = _best(lambda: _grams(Vi, active), repeats)
        old = _best(lambda: _grams_gemm(Vi, active), repeats)
        G, GJ = _grams(Vi, active)
        G0, GJ0 = _grams_gemm(Vi, active)
        err = float((G - G0).abs().max() / G0.abs().max())
        _row("gram", size, new, old, f"both; largest difference {err:.1e} of the largest entry")
        new = _best(lambda: _grams(Vi, active, full=False), repeats)
        old = _best(lambda: _grams_gemm(Vi, active, full=False), repeats)
        _row("gram J", size, new, old, "the active rows' only (no upper certificate)")
        u32, Delta = u.float(), torch.randn(B, d, generator=g)

        base = torch.relu(u32)
        norm = torch.linalg.vector_norm(base)

        def step(make):
            def run():
                for _ in range(5):
                    _, grad = make()(Delta)
                    grad()

            return run

        blocked = step(lambda: _blocked_objective(u32, Vi, base, norm))
        new = _best(blocked, repeats) / 5
        old = _best(step(lambda: _two_passes(u32, Vi)), repeats) / 5
        _row("rf step", f"{size}, B={B}", new, old, "a step, value and gradient")
        if _rf_step.usable(Vi):  # numba installed, one thread
            compiled = step(lambda: _rf_step.objective(u32, Vi, base, norm))
            compiled()  # compiled (or loaded from numba's cache) before it is timed
            new, old = _best(compiled, repeats) / 5, _best(blocked, repeats) / 5
            _row("rf step (numba)", f"{size}, B={B}", new, old, "against the blocked products")


def _attention(repeats: int) -> None:
    from wsutils.estimators import self_attention as sa
    from wsutils.estimators.objectives import fast_objective
    from wsutils.weights import sample_W, sample_X

    def former(X, W, norm):  # no evaluate (autograd's gradient), the full map's n·d a pair
        obj = fast_objective(X, W, norm)
        plain = lambda row_idx, Delta: obj(row_idx, Delta)  # noqa: E731
        plain.base_norm, plain.Phi, plain.pair_elements = obj.base_norm, obj.Phi, obj.n * obj.d
        return plain

    for norm, n, d, dtype in ATTENTION:
        X, W = sample_X(n, d, seed=n), sample_W(d, seed=d)
        kw = dict(normalisation=norm, rows=None, starts=4, steps=100, seed=3, dtype=dtype)
        out = {}

        def run(which):
            def go():
                if which == "old":
                    sa.fast_objective = former
                try:
                    out[which] = sa.attention_word_sensitivity(X, W, **kw).value
                finally:
                    sa.fast_objective = fast_objective

            return go

        new, old = _best(run("new"), repeats), _best(run("old"), repeats)
        size = f"n={n}, d={d}, {dtype or 'float64'}"
        _row(norm, size, new, old, f"S {out['new']:.10f} vs {out['old']:.10f}")


FLIP_SIZES = {"small": (1301, 20, 384), "paper": (1301, 40, 768)}


def _flip_features(repeats: int, size: str) -> None:
    from wsutils.generalization._features import _rf_law_rows, _rf_rows

    B, n, d = FLIP_SIZES[size]
    D = n * d
    Xf = torch.randn(B, D, generator=torch.Generator().manual_seed(B), dtype=torch.float64)
    Xf32 = Xf.float()
    new = _best(lambda: _rf_law_rows(Xf, D, n, d, 1, 0, 2048, False), repeats)
    old = _best(lambda: _rf_rows(Xf32, D, n, d, 1, 0, 2048, torch.float32, False), repeats)
    _row("flip feat", f"B={B}, n={n}, d={d}", new, old, "(V flat(X_b))_b and V_i, k = D")
    from wsutils.generalization._linalg import _gram, _gram_by_blocks

    for N, p in ((B, D), (2561, 5120)):  # the flip grid's texts; the collapse check's largest
        P = torch.randn(N, p, generator=torch.Generator().manual_seed(p), dtype=torch.float64)
        new = _best(lambda: _gram(P), repeats)
        old = _best(lambda: _gram_by_blocks(P, 4), repeats)  # the former way, on the CPU
        ref = _gram_by_blocks(P, 4)
        err = float((_gram(P) - ref).abs().max() / ref.abs().max())
        _row("flip gram", f"N={N}, p={p}", new, old, f"float64 ΦΦᵀ by syrk; difference {err:.0e}")


_THP_CHILD = """
import resource, torch
torch.set_num_threads(1)
from wsutils.experiments import imdb as IM
from wsutils.run import config
P = IM.SCALES["paper"]
IM.review_matrix(0, 10, 10, model=config.model())
pt = IM.sweep_point(P, "rf", 200, 384, "imdb", 0, model=config.model(), imdb=None)
r0 = resource.getrusage(resource.RUSAGE_SELF)
IM.sensitivity_point(**pt)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
"""


def _thp(repeats: int) -> None:
    import os
    import subprocess
    import sys

    def child(flag: str) -> float:
        env = dict(os.environ, THP_MEM_ALLOC_ENABLE=flag, OMP_NUM_THREADS="1")
        env["OPENBLAS_NUM_THREADS"] = "1"
        out = subprocess.run(
            [sys.executable, "-c", _THP_CHILD], env=env, capture_output=True, text=True, check=True
        )
        return float(out.stdout.strip().splitlines()[-1])

    times = {"1": [], "0": []}
    for _ in range(repeats):
        for flag in times:
            times[flag].append(child(flag))
    new, old = min(times["1"]), min(times["0"])
    _row("thp", "IMDb RF point n=200 d=384", new, old, "user + sys CPU s of the point")


_POOL_CHILD = """
import resource, sys, torch
torch.set_num_threads(1)
from wsutils.experiments import imdb as IM
from wsutils.run import config
P, model = IM.SCALES["paper"], config.model()
IM.sensitivity_point(**IM.sweep_point(P, "rf", 10, 16, "gaussian", 0, model=model, imdb=None))
pts = [IM.sweep_point(P, "rf", 150, 384, "gaussian", s, model=model, imdb=None) for s in (0, 1)]
r0 = resource.getrusage(resource.RUSAGE_SELF)
for p in pts:
    IM.sensitivity_point(**p)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
"""


def _pool(repeats: int) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")

    def together(count: int) -> float:  # CPU s a point, `count` processes at once
        procs = [
            subprocess.Popen([sys.executable, "-c", _POOL_CHILD], env=env, stdout=subprocess.PIPE)
            for _ in range(count)
        ]
        cpu = [float(p.communicate()[0].decode().split()[-1]) for p in procs]
        return sum(cpu) / (2 * count)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    times = {cores: [], 2 * cores: []}
    for _ in range(repeats):
        for count in times:
            times[count].append(together(count))
    new, old = min(times[cores]), min(times[2 * cores])
    note = f"CPU s a point, {cores} processes at once against {2 * cores}"
    _row("pool", "IMDb RF point n=150 d=384", new, old, note)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_search_steps")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best is kept")
    parts = ("rf", "attention", "flip", "thp", "pool")
    parser.add_argument("--parts", nargs="+", choices=parts, default=list(parts))
    parser.add_argument("--flip-size", choices=sorted(FLIP_SIZES), default="small")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    print("issue 34's search steps, 1 thread, one process; CPU s, best of the rounds")
    head = f"{'step':<15} {'size':<26} {'now s':>9} {'before s':>9} {'speed-up':>8}"
    print(head)
    print("-" * len(head))
    if "rf" in args.parts:
        _rf(args.repeats)
    if "attention" in args.parts:
        _attention(args.repeats)
    if "flip" in args.parts:
        _flip_features(args.repeats, args.flip_size)
    if "thp" in args.parts:
        _thp(args.repeats)
    if "pool" in args.parts:
        _pool(args.repeats)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
