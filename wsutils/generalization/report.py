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

from ..run.seeds import point_seed
from . import LOSSES, SEARCHES, check_Ns

__all__ = [
    "CONFIGS",
    "NAMES",
    "flip_lower_bound",
    "invariant_errors",
    "flip_values",
    "mean_yD1",
    "plot_flip",
    "sweep_points",
    "sweep_table",
    "plot_sweep",
]

#: The configurations ``(map, n)`` of the authors' ``gen.py`` (``ns`` per ``--map``).
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
        "identity": max(
            abs(r["D1"] - r["y"] - (r["D0"] - r["t0"]) - (r["c"] - 1) * (r["y"] - r["t0"]))
            for r in runs
        ),
        "bound": max(flip_lower_bound(r, r["rel_change"]) - r["y"] * r["D1"] for r in runs),
        "rf_change": max((r["rel_change"] - r["S_bound"] for r in rf), default=-math.inf),
        "rf_bound": max(
            (flip_lower_bound(r, r["S_bound"]) - r["y"] * r["D1"] for r in rf), default=-math.inf
        ),
    }


def flip_values(
    runs: Sequence[dict],
    m: str,
    n: int | None = None,
    loss: str | None = None,
    training: str | None = None,
    losses: Sequence[str] | None = None,
) -> list[float]:
    """``y·D₁ = y·f(X_Δ; θ₁)`` of the runs of map ``m`` (optionally one ``n``, one ``loss``
    or a set of ``losses``, one ``training``)."""
    return [
        r["y"] * r["D1"]
        for r in runs
        if r["map"] == m
        and (n is None or r["n"] == n)
        and (loss is None or r["loss"] == loss)
        and (training is None or r["training"] == training)
        and (losses is None or r["loss"] in losses)
    ]


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
                ax.scatter(
                    x,
                    v,
                    marker=marker,
                    color=colors[loss],
                    s=18,
                    label=f"{loss}, {tr}" if j == 0 else None,
                )
    for level in (1, 0, -1):
        ax.axhline(level, color="0.6", lw=0.8, ls="--" if level else ":")
    ax.set_xticks(range(len(configs)), [f"{NAMES[m]}\n$n$ = {n}" for m, n in configs])
    ax.set_ylabel(r"$y \cdot f(X_\Delta; \theta_1)$")
    ax.legend(fontsize=9, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.02), frameon=False)


def sweep_points(
    *,
    d: int,
    n: int,
    Ns: Sequence[int],
    seeds: Sequence[int],
    maps: Sequence[str] = ("rf", "raf", "relu"),
    searches: Sequence[str] = SEARCHES,
    data: str = "authors",
    trainings: Sequence[str] = ("fine_tune",),
    starts: int = 4,
    steps: int = 300,
    search_dtype: str = "float64",
) -> list[dict]:
    """Points for :func:`wsutils.run.sweep.run_grid` of :func:`wsutils.generalization.flip_point`
    that trace ``y·t_1^Δ`` against ``N`` (output loss only): one point per ``(map, draw)``
    running every search of ``searches`` on features built once (one per
    ``(map, search, draw)`` when ``searches`` has one search), the ``N`` values of a point
    nested (its first ``N`` texts).
    Draw ``s`` has seed ``point_seed("flip-vs-N", data, d, n, s)``: every map and both
    searches see the same texts; ``steps``/``starts``/``search_dtype`` apply to our search
    only (the authors' search takes ``gen.py``'s,
    :func:`wsutils.generalization.authors_lr_steps`, in float64)."""
    Ns = check_Ns(Ns)
    points = []
    for s in seeds:
        seed = point_seed("flip-vs-N", data, d, n, s)
        for m in maps:
            if len(searches) > 1:  # one point: the features are built once for both
                points.append(
                    dict(
                        map=m,
                        n=n,
                        d=d,
                        Ns=list(Ns),
                        seed=seed,
                        search=list(searches),
                        data=data,
                        losses=["output"],
                        trainings=list(trainings),
                        starts=starts,
                        steps=steps,
                        search_dtype=search_dtype,
                    )
                )
                continue
            for search in searches:
                opts = (
                    dict(starts=starts, steps=steps, search_dtype=search_dtype)
                    if search == "ours"
                    else {}
                )
                points.append(
                    dict(
                        map=m,
                        n=n,
                        d=d,
                        Ns=list(Ns),
                        seed=seed,
                        search=search,
                        data=data,
                        losses=["output"],
                        trainings=list(trainings),
                        **opts,
                    )
                )
    return points


def sweep_table(runs: Sequence[dict], key: str = "yD1") -> dict:
    """Mean over draws (and trainings) per ``(map, search, N)`` of ``key``: ``"yD1"``
    (``y·t_1^Δ``), ``"base"`` (``y·(t_0^Δ − t_0)``, the base-model term of
    eq. :eq:`eq-flip-identity`), ``"sens"`` (``y·(c − 1)(y − t_0)``, the sensitivity term) or
    ``"scale"`` (``‖φ‖·‖θ₀‖``, which bounds the base-model term by ``S·‖φ‖·‖θ₀‖``)."""
    get = {
        "yD1": lambda r: r["y"] * r["D1"],
        "base": lambda r: r["y"] * r["base_term"],
        "sens": lambda r: r["y"] * r["sens_term"],
        "scale": lambda r: r["norm_phi_theta0"],
    }
    if key not in get:
        raise ValueError(f"key must be one of {sorted(get)}, got {key!r}.")
    groups = defaultdict(list)
    for r in runs:
        groups[(r["map"], r["search"], r["N"])].append(get[key](r))
    return {k: float(np.mean(v)) for k, v in sorted(groups.items())}


def plot_sweep(axes, runs: Sequence[dict], maps: Sequence[str] = ("rf", "raf", "relu")) -> None:
    """One panel per map: ``y·t_1^Δ`` against ``N`` for both searches (solid: ours, dashed:
    the authors'), with the two terms of eq. :eq:`eq-flip-identity` for our search (``1 +``
    base-model term, and the sensitivity term), so that ``y·t_1^Δ = 1 + base + sens``."""
    for ax, m in zip(axes, maps):
        for search, ls in (("ours", "-"), ("authors", "--")):
            t = sweep_table([r for r in runs if r["map"] == m], "yD1")
            Ns = [N for (_, s, N) in t if s == search]
            ax.plot(
                Ns,
                [t[m, search, N] for N in Ns],
                "o" + ls,
                color="k",
                ms=4,
                label=f"$y\\,t_1^\\Delta$, {search} search",
            )
        ours = [r for r in runs if r["map"] == m and r["search"] == "ours"]
        base, sens = sweep_table(ours, "base"), sweep_table(ours, "sens")
        Ns = [N for (_, _, N) in base]
        ax.plot(
            Ns,
            [1 + base[k] for k in base],
            "s-",
            color="C0",
            ms=3,
            label="$1 + y(t_0^\\Delta - t_0)$ (base model)",
        )
        ax.plot(
            Ns,
            [sens[k] for k in sens],
            "^-",
            color="C3",
            ms=3,
            label="$y(c-1)(y - t_0)$ (sensitivity)",
        )
        for level in (1, 0, -1):
            ax.axhline(level, color="0.6", lw=0.8, ls="--" if level else ":")
        ax.set_xscale("log")
        ax.set_xlabel("$N$ (training texts)")
        ax.set_title(NAMES[m])
    axes[0].set_ylabel("value")
    axes[0].legend(fontsize=8, loc="lower left")
