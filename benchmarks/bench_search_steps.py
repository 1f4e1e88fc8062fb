"""Issue 34's steps of the searches, each against the way it ran before, side by side in one
process, one thread, alternating (the best of ``--repeats`` rounds):

- ``gram``: random features' ``(V_i)_Jᵀ(V_i)_J`` and ``V_iᵀV_i`` in float64 by BLAS ``syrk``
  (``wsutils.estimators.rf._grams``, one triangle) against ``B.T @ B`` on the same float64
  blocks (the former ``_grams``, written out below);
- ``rf step``: one step of the random-features ascent (value and gradient) in one pass over
  ``V_i``, block by block (``_relative_change_objective``), against two whole passes (the
  former objective, below);
- ``attention``: a softmax / ReLU search of every row (the IMDb sweep's, float32 and float64)
  by :func:`~wsutils.estimators.self_attention.attention_word_sensitivity` as it runs now
  (chunks sized by ``pair_elements``, the gradient written out) against the same search with
  the objective's gradient by autograd and chunks of the full map's ``n·d`` a pair (the fast
  objective wrapped so that ``ascend_rows`` sees no ``evaluate`` and ``pair_elements = n·d``).

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
    print(f"{name:<10} {size:<26} {new:>9.3f} {old:>9.3f} {old / new:>7.2f}×  {note}")


def _rf(repeats: int) -> None:
    from wsutils.estimators.rf import _grams, _relative_change_objective

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

        def step(make):
            def run():
                for _ in range(5):
                    _, grad = make(u32, Vi)(Delta)
                    grad()

            return run

        new = _best(step(_relative_change_objective), repeats) / 5
        old = _best(step(_two_passes), repeats) / 5
        _row("rf step", f"{size}, B={B}", new, old, "a step, value and gradient")


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


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_search_steps")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best is kept")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    print("issue 34's search steps, 1 thread, one process; CPU s, best of the rounds")
    head = f"{'step':<10} {'size':<26} {'now s':>9} {'before s':>9} {'speed-up':>8}"
    print(head)
    print("-" * len(head))
    _rf(args.repeats)
    _attention(args.repeats)


if __name__ == "__main__":
    main()
