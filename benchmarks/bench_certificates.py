"""The cost of the certificates of issue 23 (items 14, 2, 7) at paper-scale points, side by side
in one process, one thread.

- ``certified_lower_bound`` and the estimator's take-over starts now include the doubling
  ``Δ = x_i`` and, for ReLU attention, the orthogonal take-over (an SVD per row, cached):
  ``sensitivity_point("relu", …)`` with the former constructions (the take-over candidates of
  ``def-takeover`` only) against the current ones, at the paper's ``SEARCH``.
- ``relu_certified_upper`` (the bound of ``prop-relu-low`` at every row, a closed form per word)
  at the far ``n`` of the ReLU chapter, against the search it brackets there and against the
  chapter's former bound (``relu_upper_bound`` with ``relu_zeta_estimate``, searched rows only).
- ``sigma2_model`` at ``d = 768`` (600 draws), the softmax chapter's σ² law.

``python -m benchmarks bench_certificates``.
"""

from __future__ import annotations

import time

import torch

import wsutils as ws
import wsutils.estimators.self_attention as at
import wsutils.estimators.takeover as tk
from wsutils.estimators.relu import (
    relu_certified_upper,
    relu_upper_bound,
    relu_zeta_estimate,
)
from wsutils.estimators.softmax_laws import sigma2_model
from wsutils.experiments.attention import sensitivity_point
from wsutils.run.seeds import point_seed

PAPER_SEARCH = dict(rows=2, search=dict(starts=4, steps=100))


def _cpu(fn):
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def main(argv=None) -> None:
    torch.set_num_threads(1)
    current = tk.constructions
    former = lambda Xt, Wt, i, norm: tk._takeover_candidates(Xt, Wt, i)  # noqa: E731
    print("item 14: sensitivity_point('relu'), paper SEARCH; CPU s, S, certified")
    for d, n in ((768, 50), (768, 250)):
        seed = point_seed("attention", d, n, 0)
        for name, f in (("former", former), ("current", current)) * 2:
            at.constructions = tk.constructions = f  # the estimator's starts and the bound
            tk._ORTHO_CACHE.clear()
            t, r = _cpu(lambda: sensitivity_point("relu", d, n, seed, **PAPER_SEARCH))
            print(
                f"  d={d} n={n} {name:>7}: {t:6.2f} s  S={r['S']:.4f}  "
                f"certified={r['certified']:.4f}"
            )
    at.constructions = tk.constructions = current
    print("item 2: the upper certificate over every word at the far n (d = 192)")
    for n in (1000, 4000):
        seed = point_seed("attention", 192, n, 0)
        X, W = ws.sample_X(n, 192, seed=seed), ws.sample_W(192, seed=seed + 1)
        t_up, up = _cpu(lambda: relu_certified_upper(X, W).max())
        t_s, r = _cpu(lambda: sensitivity_point("relu", 192, n, seed, **PAPER_SEARCH))
        t_old, old = _cpu(
            lambda: max(
                relu_upper_bound(X, W, i, relu_zeta_estimate(X, i, starts=4, steps=150)).value
                for i in range(2)
            )
        )
        print(
            f"  n={n}: certified upper over all {n} words {up:.3f} in {t_up:.2f} s; "
            f"search S={r['S']:.3f} in {t_s:.2f} s; former bound (2 rows, ζ estimated) "
            f"{old:.3f} in {t_old:.2f} s"
        )
    t, law = _cpu(lambda: sigma2_model(768, draws=600, seed=point_seed("sigma2", 768)))
    print(f"item 7: sigma2_model(768, draws=600) = {law[0]:.3f} (sd {law[1]:.3f}) in {t:.2f} s")


if __name__ == "__main__":
    main()
