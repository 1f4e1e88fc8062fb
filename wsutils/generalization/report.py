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

from ..maps import LABELS
from ..run.seeds import point_seed
from . import LOSSES, METHODS, TRAININGS, check_Ns

__all__ = [
    "CONFIGS",
    "flip_lower_bound",
    "invariant_errors",
    "flip_values",
    "mean_yD1",
    "plot_flip",
    "sweep_points",
    "sweep_table",
    "plot_sweep",
    "rf_headline",
    "rf_verdict",
    "regime_points",
    "regime_table",
    "plot_regime",
]

#: The configurations ``(map, n)`` of the authors' ``gen.py`` (``ns`` per ``--map``).
CONFIGS = (("rf", 40), ("raf", 40), ("raf", 120), ("relu", 120))


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


def mean_yD1_frame(table: dict, configs: Sequence[tuple[str, int]] = CONFIGS):
    """:func:`mean_yD1`'s ``table`` as a ``pandas.DataFrame`` to show: one row per map and
    ``n`` of ``configs``, one column per training and search loss (two header rows), so that
    the table fits a page instead of one long printed line per map."""
    import pandas as pd

    cols = pd.MultiIndex.from_tuples([(tr, loss) for tr in TRAININGS for loss in LOSSES])
    return pd.DataFrame(
        [[table[(m, n, tr, loss)] for tr, loss in cols] for m, n in configs],
        index=[f"{LABELS[m]}, n = {n}" for m, n in configs],
        columns=cols,
    ).round(2)


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
    ax.set_xticks(range(len(configs)), [f"{LABELS[m]}\n$n$ = {n}" for m, n in configs])
    ax.set_ylabel(r"$y \cdot f(X_\Delta; \theta_1)$")
    ax.legend(fontsize=9, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.02), frameon=False)


def sweep_points(
    *,
    d: int,
    n: int,
    Ns: Sequence[int],
    seeds: Sequence[int],
    maps: Sequence[str] = ("rf", "raf", "relu"),
    methods: Sequence[str] = METHODS,
    data: str = "authors",
    trainings: Sequence[str] = ("fine_tune",),
    search: dict | None = None,
) -> list[dict]:
    """Points for :func:`wsutils.run.sweep.run_grid` of :func:`wsutils.generalization.flip_point`
    that trace ``y·t_1^Δ`` against ``N`` (output loss only): one point per ``(map, draw)``
    running every method of ``methods`` on features built once (one per
    ``(map, method, draw)`` when ``methods`` has one method), the ``N`` values of a point
    nested (its first ``N`` texts).
    Draw ``s`` has seed ``point_seed("flip-vs-N", data, d, n, s)``: every map and both
    methods see the same texts; ``search`` (a dict of :class:`~wsutils.search.Search`'s
    fields, ``{"starts": 4, "steps": 300, "dtype": "float32"}``) applies to our search only
    (the authors' search takes ``gen.py``'s,
    :func:`wsutils.generalization.authors_lr_steps`, in float64)."""
    Ns = check_Ns(Ns)
    ours = {} if search is None else dict(search=dict(search))
    points = []
    for s in seeds:
        seed = point_seed("flip-vs-N", data, d, n, s)
        common = dict(n=n, d=d, Ns=list(Ns), seed=seed, data=data, losses=["output"])
        for m in maps:
            if len(methods) > 1:  # one point: the features are built once for both
                points.append(
                    dict(map=m, **common, trainings=list(trainings), method=list(methods), **ours)
                )
                continue
            for method in methods:
                opts = ours if method == "ours" else {}
                points.append(
                    dict(map=m, **common, trainings=list(trainings), method=method, **opts)
                )
    return points


def sweep_table(runs: Sequence[dict], key: str = "yD1") -> dict:
    """Mean over draws (and trainings) per ``(map, method, N)`` of ``key``: ``"yD1"``
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
        groups[(r["map"], r["method"], r["N"])].append(get[key](r))
    return {k: float(np.mean(v)) for k, v in sorted(groups.items())}


def plot_sweep(axes, runs: Sequence[dict], maps: Sequence[str] = ("rf", "raf", "relu")) -> None:
    """One panel per map: ``y·t_1^Δ`` against ``N`` for both methods (solid: ours, dashed:
    the authors'), with the two terms of eq. :eq:`eq-flip-identity` for our search (``1 +``
    base-model term, and the sensitivity term), so that ``y·t_1^Δ = 1 + base + sens``."""
    for ax, m in zip(axes, maps):
        for method, ls in (("ours", "-"), ("authors", "--")):
            t = sweep_table([r for r in runs if r["map"] == m], "yD1")
            Ns = [N for (_, s, N) in t if s == method]
            ax.plot(
                Ns,
                [t[m, method, N] for N in Ns],
                "o" + ls,
                color="k",
                ms=4,
                label=f"$y\\,t_1^\\Delta$, {method} search",
            )
        ours = [r for r in runs if r["map"] == m and r["method"] == "ours"]
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
        ax.set_title(LABELS[m])
    axes[0].set_ylabel("value")
    axes[0].legend(fontsize=8, loc="lower left")


#: The sizes of the authors' ``gen.py`` (their ``d`` and smallest ``N``).
AUTHORS_D, AUTHORS_N_MIN = 768, 1100


def rf_headline(flipped: int, runs: int, d: int, N_max: int) -> str:
    """The sentence, glued into the chapters and the intro, that says what the output-loss
    runs of random features show against the abstract's claim ("random features provably
    cannot learn to distinguish between two sentences that differ only in a single word"):
    at the authors' sizes (``d = 768``, ``N ≥ 1100``) whether it reproduces; below them, only
    the counts (the claim is then not tested at the authors' sizes)."""
    counts = f"the output loss flips {flipped} of {runs} runs of random features"
    if d < AUTHORS_D or N_max < AUTHORS_N_MIN:
        return f"d = {d} and N up to {N_max}, below the authors' sizes: {counts}"
    where = f"at the authors' sizes (d = {d}, N up to {N_max}) {counts}"
    if flipped == 0:
        return f"{where}, as the abstract's claim says"
    return (
        f"{where}, so the abstract's claim that random features cannot tell apart two "
        f"texts that differ in one word does not reproduce in this setting"
    )


def rf_verdict(flipped: int, runs: int, d: int, N_max: int) -> str:
    """The ledger's short verdict on the same runs as :func:`rf_headline`: ``"✓ reproduced"``
    when no run of random features flips at the authors' sizes, ``"✗ not reproduced"`` when
    one does, and ``"not tested at the authors' sizes"`` below them."""
    if d < AUTHORS_D or N_max < AUTHORS_N_MIN:
        return "not tested at the authors' sizes"
    return "✓ reproduced" if flipped == 0 else "✗ not reproduced"


def regime_points(
    *,
    d: int,
    n: int,
    Ns: Sequence[int],
    seeds: Sequence[int],
    maps: Sequence[str] = ("rf", "raf"),
    data: str = "planted",
    search: dict | None = None,
) -> list[dict]:
    """Points for :func:`wsutils.run.sweep.run_grid` of :func:`wsutils.generalization.flip_point`
    for the protection study (chapter ``generalization-n``): one point per ``(map, draw)``,
    the output loss under both trainings, our search in float32 (``search``: a dict of
    :class:`~wsutils.search.Search`'s fields besides, ``{"starts": 4, "steps": 300}``), the
    ``N`` values nested.
    Draw ``s`` has seed ``point_seed("regime", d, n, s)``, so every map sees the same
    texts, and ``data="planted"`` and ``"independent"`` share them too."""
    Ns = check_Ns(Ns)
    return [
        dict(
            map=m,
            n=n,
            d=d,
            Ns=list(Ns),
            seed=point_seed("regime", d, n, s),
            data=data,
            losses=["output"],
            search={**(search or {}), "dtype": "float32"},
        )
        for s in seeds
        for m in maps
    ]


def regime_table(runs: Sequence[dict]) -> dict:
    """Per ``(map, n, N)``: ``r = √N/n``, the number of runs ``flipped`` (``y·t_1^Δ < 0``) of
    ``runs`` in all, and the means of the base-model term ``base = y(t_0^Δ − t_0)`` and of
    ``y·t_1^Δ`` (``yD1``) over draws and trainings."""
    groups = defaultdict(list)
    for r in runs:
        groups[(r["map"], r["n"], r["N"])].append(r)
    return {
        (m, n, N): dict(
            r=math.sqrt(N) / n,
            flipped=sum(x["y"] * x["D1"] < 0 for x in g),
            runs=len(g),
            base=float(np.mean([x["y"] * x["base_term"] for x in g])),
            yD1=float(np.mean([x["y"] * x["D1"] for x in g])),
        )
        for (m, n, N), g in sorted(groups.items())
    }


def plot_regime(ax_share, ax_base, tables: dict) -> None:
    """The protection study's figure. ``tables``: ``{label: table}`` of
    :func:`regime_table`. Left: the share of runs flipped against ``√N/n``, one line per
    ``(label, map)``; right: the mean base-model term ``−y(t_0^Δ − t_0)`` of random features
    against ``√N/n``, with the margin ``1`` that it must stay under (condition (a) of
    :prf:ref:`prop-flip-bound`)."""
    colors = {"rf": "C0", "raf": "C3", "relu": "C2"}
    markers = "osd^v"
    for j, (label, table) in enumerate(tables.items()):
        for m in sorted({k[0] for k in table}):
            rows = [v for k, v in table.items() if k[0] == m]
            r = [v["r"] for v in rows]
            style = dict(marker=markers[j % 5], color=colors.get(m, "k"), ms=5)
            ax_share.plot(
                r,
                [v["flipped"] / v["runs"] for v in rows],
                "-",
                label=f"{LABELS[m]}, {label}",
                **style,
            )
            if m == "rf":
                ax_base.plot(r, [-v["base"] for v in rows], "-", label=label, **style)
    for ax in (ax_share, ax_base):
        ax.set_xscale("log")
        ax.set_xlabel(r"$\sqrt{N}/n$")
    ax_base.set_yscale("log")
    ax_base.axhline(1, color="0.5", ls="--", lw=0.8)
    ax_share.set_ylabel("share of runs flipped")
    ax_share.set_ylim(-0.05, 1.05)
    ax_base.set_ylabel(r"RF: mean $-y(t_0^\Delta - t_0)$")
    ax_share.legend(frameon=False, fontsize=8)
    ax_base.legend(frameon=False, fontsize=8)
