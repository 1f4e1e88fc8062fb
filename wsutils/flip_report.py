"""Reading the runs of the generalization experiment (chapters ``generalization`` and ``imdb``).

The runs are the rows of :func:`wsutils.generalization.flip_table`. Both chapters check the
same invariants and the same bound (:prf:ref:`prop-flip-bound`) and draw the same figure; the
code lives here once. The functions compute; the chapters assert.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

import numpy as np

from .generalization import LOSSES

__all__ = ["CONFIGS", "NAMES", "flip_lower_bound", "invariant_errors", "flip_values",
           "mean_yD1", "plot_flip"]

#: The paper's configurations ``(map, n)`` of the generalization experiment (brief §4).
CONFIGS = (("rf", 40), ("raf", 40), ("raf", 120), ("relu", 120))
NAMES = {"rf": "RF", "raf": "RAF", "relu": "ReLU attention"}


def flip_lower_bound(r: dict, S: float) -> float:
    """The lower bound of eq. :eq:`eq-flip-bound` on ``y·f(X_Δ; θ₁)`` for run ``r``, with
    ``S`` the relative change of the features (or a bound on it):
    ``1 − |D₀ − t₀| − ρ·S·|y − t₀|``."""
    return 1 - abs(r["D0"] - r["t0"]) - r["rho"] * S * abs(r["y"] - r["t0"])


def invariant_errors(runs: Sequence[dict]) -> dict:
    """The largest violation, over ``runs``, of each invariant of the experiment:
    ``t1``: ``|t₁ − y|`` (the trained model fits the new text); ``interp``: ``max |Φθ₀ − Y|``;
    ``ball``: ``max ‖Δ‖/√d`` (at most 1); ``identity``: the residual of
    eq. :eq:`eq-flip-identity`; ``bound``: ``max(LB − y·D₁)`` with the lower bound
    :func:`flip_lower_bound` at the relative change actually produced (at most 0 up to
    rounding); ``rf_change``: ``max(rel_change − S̄)`` over random-feature runs, with ``S̄`` the
    certified sensitivity bound (at most 0); ``rf_bound``: ``max(LB(S̄) − y·D₁)`` there."""
    rf = [r for r in runs if r["map"] == "rf"]
    return {
        "t1": max(abs(r["t1"] - r["y"]) for r in runs),
        "interp": max(r["interp_err"] for r in runs),
        "ball": max(r["norm_Delta"] / math.sqrt(r["d"]) for r in runs),
        "identity": max(abs(r["D1"] - r["y"] - (r["D0"] - r["t0"])
                            - (r["c"] - 1) * (r["y"] - r["t0"])) for r in runs),
        "bound": max(flip_lower_bound(r, r["rel_change"]) - r["y"] * r["D1"] for r in runs),
        "rf_change": max((r["rel_change"] - r["S_bound"] for r in rf), default=-math.inf),
        "rf_bound": max((flip_lower_bound(r, r["S_bound"]) - r["y"] * r["D1"] for r in rf),
                        default=-math.inf),
    }


def flip_values(runs: Sequence[dict], m: str, n: int | None = None, loss: str | None = None,
                training: str | None = None, losses: Sequence[str] | None = None) -> list[float]:
    """``y·D₁ = y·f(X_Δ; θ₁)`` of the runs of map ``m`` (optionally one ``n``, one ``loss``
    or a set of ``losses``, one ``training``)."""
    return [r["y"] * r["D1"] for r in runs if r["map"] == m and (n is None or r["n"] == n)
            and (loss is None or r["loss"] == loss)
            and (training is None or r["training"] == training)
            and (losses is None or r["loss"] in losses)]


def mean_yD1(runs: Sequence[dict]) -> dict:
    """Mean ``y·D₁`` per ``(map, n, training, loss)`` over every ``N`` and draw."""
    groups = defaultdict(list)
    for r in runs:
        groups[(r["map"], r["n"], r["training"], r["loss"])].append(r["y"] * r["D1"])
    return {k: float(np.mean(v)) for k, v in groups.items()}


def plot_flip(ax, runs: Sequence[dict], configs: Sequence[tuple[str, int]] = CONFIGS) -> None:
    """The figure of the experiment: ``y·D₁`` of every run, grouped by configuration and
    search loss (circles: fine-tuning, crosses: re-training), with the levels ``+1, 0, −1``."""
    colors = {"output": "C3", "align_ft": "C0", "align_rt": "C2"}
    for j, (m, n) in enumerate(configs):
        for l, loss in enumerate(LOSSES):
            for tr, marker, dx in (("fine_tune", "o", -0.06), ("retrain", "x", 0.06)):
                v = flip_values(runs, m, n, loss, tr)
                x = j + (l - 1) * 0.25 + dx + np.linspace(-0.03, 0.03, len(v))
                ax.scatter(x, v, marker=marker, color=colors[loss], s=18,
                           label=f"{loss}, {tr}" if j == 0 else None)
    for level in (1, 0, -1):
        ax.axhline(level, color="0.6", lw=0.8, ls="--" if level else ":")
    ax.set_xticks(range(len(configs)), [f"{NAMES[m]}\n$n$ = {n}" for m, n in configs])
    ax.set_ylabel(r"$y \cdot f(X_\Delta; \theta_1)$")
    ax.legend(fontsize=9, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.02), frameon=False)
