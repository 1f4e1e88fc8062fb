"""The normalisation chapter's objects: the normalisations it compares, the margin each needs
for a take-over (:prf:ref:`prop-norm-margin`), and the per-point function of its grids.

- :data:`CHAPTER` names the normalisations of the chapter (a
  :class:`wsutils.maps.Normalisation` each, at the parameters the chapter uses; ``"tempered"``
  is softmax at the inverse temperature ``β = 2``).
- :func:`required_margin` is the score margin that :prf:ref:`prop-norm-margin` proves
  sufficient for a self-weight ``≥ 1 − ε`` (exact one-hot for sparsemax, entmax, hardmax).
- :func:`row_margin` measures, after the row take-over (:prf:ref:`def-takeover`), the margin
  of the perturbed word in its own row and the self-weight it gets.
- :func:`doubling_bound` is the bound of :prf:ref:`prop-norm-double` on what the doubling
  ``Δ = x_i`` changes, from the scores.
- :func:`normalisation_point` is ``S`` of one normalisation at one text: the fast estimator
  (:func:`wsutils.estimators.self_attention.attention_word_sensitivity`) and a certified lower
  bound (the row and the key take-over and the doubling, through the full map), for
  :func:`wsutils.run.sweep.run_grid`; :func:`phase_point` is the row take-over's self-weight
  under :data:`PHASE`, for the phase diagram.
- :func:`takeover_margin_model` and :func:`margin_interval` give the phase diagram's
  predicted boundaries (:prf:ref:`obs-norm-phase`): the margin the row take-over is predicted
  to reach at ``(d, n)``, and the margins a self-weight ``≥ a_min`` needs and suffices with.
- :class:`Scale`, ``SCALES`` and :func:`scale` hold the sizes of the two normalisation
  chapters (``normalisation`` and ``normalisation-boundary``) at each ``WSBOOK_SCALE``.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from scipy import special

from ..checks import check_int
from ..estimators.screen import Screen, screened_word_sensitivity
from ..estimators.self_attention import attention_word_sensitivity
from ..estimators.takeover import key_takeover, row_takeover
from ..maps import Normalisation, attention_scores, general_attention, normalise_scores
from ..run.seeds import point_seed, search_seed
from ..search import Search, point_search
from ..sensitivity import perturb, project_ball
from ..weights import sample_W, sample_X
from .attention import _point_rows

__all__ = [
    "CHAPTER",
    "PHASE",
    "DOUBLING",
    "required_margin",
    "row_margin",
    "doubling_bound",
    "normalisation_point",
    "upper_certificate",
    "phase_point",
    "takeover_margin_model",
    "margin_interval",
    "MODEL_DRAWS",
    "POINT_SEARCH",
    "SEARCH_DTYPE",
    "SCREEN",
    "EVERY_MAX_N",
    "Scale",
    "SCALES",
    "scale",
]

#: The normalisations of the chapter, by the label its tables and figures use.
CHAPTER = {
    "softmax": Normalisation("softmax"),
    "tempered": Normalisation("softmax", beta=2.0),
    "scalable": Normalisation("scalable", s=1.0),
    "sparsemax": Normalisation("sparsemax"),
    "entmax": Normalisation("entmax", alpha=1.5),
    "sigmoid": Normalisation("sigmoid"),
    "relu": Normalisation("relu"),
    "hardmax": Normalisation("hardmax"),
}


#: The normalisations of the chapter's phase diagram.
PHASE = ("softmax", "scalable", "sparsemax")


def _norm(normalisation) -> Normalisation:
    """A label of :data:`CHAPTER` (``"tempered"``: softmax with ``β = 2``), else anything
    :meth:`wsutils.maps.Normalisation.parse` reads."""
    if isinstance(normalisation, str) and normalisation in CHAPTER:
        return CHAPTER[normalisation]
    return Normalisation.parse(normalisation)


def required_margin(normalisation, n: int, eps: float = 0.0) -> float:
    """The margin ``m = s_ii − max_{k≠i} s_ik`` (unscaled scores) that
    :prf:ref:`prop-norm-margin` proves sufficient for a self-weight ``a_ii ≥ 1 − ε``:

    - softmax (``β``): ``(log(n−1) + log((1−ε)/ε))/β`` (``ε > 0``; tight when the other
      scores tie);
    - scalable softmax: the same with ``β·s·log n`` in place of ``β``;
    - sparsemax: ``1/β``, and then ``a_i = e_i`` exactly (any ``ε ≥ 0``); entmax:
      ``1/((α−1)β)``; hardmax: any ``m > 0`` (returns 0, to be exceeded strictly).

    Sigmoid and ReLU attention have no margin condition (their self-weight depends on the other
    scores' sizes, not only on the gap): a ValueError."""
    norm = _norm(normalisation)
    n = check_int("n", n, minimum=2)
    if norm.name in ("softmax", "scalable"):
        if not 0 < eps < 1:
            raise ValueError(f"eps must be in (0, 1) for {norm.name}, got {eps}.")
        return (math.log(n - 1) + math.log((1 - eps) / eps)) / norm.scale(n)
    if norm.name == "sparsemax":
        return 1 / norm.beta
    if norm.name == "entmax":
        return 1 / ((norm.alpha - 1) * norm.beta)
    if norm.name == "hardmax":
        return 0.0
    raise ValueError(f"{norm.name} attention has no margin condition (see the chapter).")


def row_margin(X, W, row: int, normalisation) -> dict:
    """After the row take-over of word ``row``: its self-score ``s'_ii``, the margin
    ``m = s'_ii − max_{k≠i} s'_ik`` in its own row (unscaled scores), the largest other score,
    its self-weight ``a'_ii`` under ``normalisation`` and the largest weight of another key
    ``others_weight`` (``0.0`` exactly when the row is one-hot). ``X``, ``W``: float64 tensors
    of a text and its weights (trusted)."""
    norm = _norm(normalisation)
    i = row
    Delta = row_takeover(X, W, i)
    Xp = X.clone()
    Xp[i] += Delta
    s = (Xp[i] @ W) @ Xp.T / math.sqrt(X.shape[1])  # row i of the new scores only
    others = torch.cat([s[:i], s[i + 1 :]])
    a = normalise_scores(s[None], norm)[0]
    return {
        "self_score": float(s[i]),
        "max_other": float(others.max()),
        "margin": float(s[i] - others.max()),
        "self_weight": float(a[i]),
        "others_weight": float(torch.cat([a[:i], a[i + 1 :]]).max()),
    }


#: The precision of each normalisation's search in the chapter's grid (``S`` and every
#: certificate are float64 on the float64 text either way): float32 where it finds the
#: float64 search's value (within 7e-7 on the points of ``benchmarks/bench_attention_grids``'s
#: ``norm`` part), float64 for ReLU attention (the two searches end up to 1.5e-4 apart) and for
#: hardmax (its search can end on a construction itself, ``S`` equal to the certificate, which
#: a float32 copy of the construction would miss by its rounding).
SEARCH_DTYPE = {name: "float32" for name in CHAPTER} | {"relu": None, "hardmax": None}

#: The search of :func:`normalisation_point` where its ``search`` sets nothing: 2 starts
#: (plus the take-over constructions and the doubling), 40 steps, in float64.
POINT_SEARCH = Search(starts=2, steps=40)

#: The screen of every word in the chapter's grid (:class:`~wsutils.estimators.screen.Screen`
#: without ``keep``): the seven constructions of each word alone (0.1–0.3 of the default
#: screen's time, within 0.1 % of its certified value or above on 22 of the 30 texts of
#: ``benchmarks/bench_screen --constructions``), and for sigmoid and ReLU attention, whose best
#: ``Δ`` is often not a construction, a short search as well: 2 starts × 30 steps for sigmoid
#: (with the constructions alone its certified value was 10–14 % low on two of three texts at
#: ``n = 256``; with 2 × 10, 5 % on one), 2 × 10 for ReLU (up to 4.5 % low at ``n = 256``,
#: within 0.8 % with 2 × 30, which cost about 13 CPU s more in the paper build:
#: ``bench_screen --miss``).
SCREEN = {name: dict(starts=0, steps=0, constructions=True) for name in CHAPTER} | {
    "sigmoid": dict(constructions=True, starts=2, steps=30),
    "relu": dict(constructions=True, starts=2, steps=10),
}

#: The longest text whose every word the grid screens, where it is shorter than the grid's:
#: 1.5-entmax's screen took 33 s a text at ``n = 1024`` (``d = 32``), some ten times the other
#: normalisations' together, so its grid stops at ``n = 256``.
EVERY_MAX_N = {"entmax": 256}


#: The normalisations that :prf:ref:`prop-norm-double` covers.
DOUBLING = ("softmax", "tempered", "scalable", "sparsemax", "entmax", "hardmax")


def doubling_bound(X, W, row: int, normalisation) -> dict:
    """The lower bound :eq:`eq-norm-double` of :prf:ref:`prop-norm-double` on the relative
    change of the doubling ``Δ = x_row`` (``‖Δ‖ = √d``): ``√(Σ_{j≠row} (3ℓ_j − 2)_+² / n)``,
    ``ℓ_j`` the proposition's lower bound on key ``row``'s new weight in row ``j``, from its
    margin ``m_j = 2 s_{j,row} − max_{k≠row} s_jk`` (old scores, float64): ``1[m_j > 0]``
    hardmax, ``1[βm_j > 1]`` sparsemax, ``1[(α−1)βm_j > 1]`` entmax (strict: a subset of the
    proposition's rows, so the bound stays valid), ``sigmoid(c_n m_j − log(n−1))`` softmax and
    scalable softmax. Returns ``{"bound", "frac"}``, ``frac`` the fraction of rows with
    ``ℓ_j > 2/3``. ``X``, ``W``: float64 tensors (trusted); ``n ≥ 2``.
    """
    norm = _norm(normalisation)
    if norm.name not in DOUBLING:
        raise ValueError(f"prop-norm-double covers {DOUBLING}, not {norm.name!r}.")
    n, i = X.shape[0], row
    s = attention_scores(X, W)
    mu = 2 * s[:, i] - torch.cat([s[:, :i], s[:, i + 1 :]], dim=1).amax(dim=1)
    mu = torch.cat([mu[:i], mu[i + 1 :]])  # rows j ≠ i
    if norm.name == "hardmax":
        lb = (mu > 0).to(mu.dtype)
    elif norm.name == "sparsemax":
        lb = (norm.beta * mu > 1).to(mu.dtype)
    elif norm.name == "entmax":
        lb = ((norm.alpha - 1) * norm.beta * mu > 1).to(mu.dtype)
    else:  # 1/(1 + (n−1)e^{−c_n μ}), stably
        lb = torch.sigmoid(norm.scale(n) * mu - math.log(n - 1))
    f = torch.clamp(3 * lb - 2, min=0)
    return {
        "bound": math.sqrt(float((f**2).sum()) / n),
        "frac": float((lb > 2 / 3).double().sum()) / n,
    }


def normalisation_point(
    normalisation: str,
    d: int,
    n: int,
    seed: int,
    rows: Sequence[int] | str = (0,),
    search: dict | None = None,
    screen: dict | None = None,
) -> dict:
    """``S`` of attention with ``normalisation`` (a label of :data:`CHAPTER`) at one synthetic text
    (``X = sample_X(n, d, seed)``, ``W = sample_W(d, seed + 1)``, as in the attention
    chapters): the estimate ``S`` (fast estimator over the words ``rows``, random starts
    plus the take-over constructions; ``search``: a dict of :class:`~wsutils.search.Search`'s
    fields over :data:`POINT_SEARCH`, seeded by :func:`~wsutils.run.seeds.search_seed`, a
    stream independent of the text), the certified lower bound ``certified`` (the best of the row
    and the key take-over of :prf:ref:`def-takeover` and the doubling ``Δ = x_i`` of
    :prf:ref:`prop-norm-double` at each searched word ``i``, through the full map in float64;
    all are also starts of the search),
    ``phi_rel = ‖φ(X)‖_F/√(n·d)``, the doubling ``Δ = x_0``'s relative change ``double`` (and,
    for :data:`DOUBLING`, its bound ``double_bound`` and ``double_frac``,
    :func:`doubling_bound`), the row take-over's margin and
    self-weight at word 0 (:func:`row_margin`), the searched words ``certified_rows``, the seconds
    the estimator took (``seconds``, wall) and the CPU seconds of the whole point
    (``cpu_seconds``). The search's ``dtype`` (``None``: float64, or ``"float32"``) is the
    precision of the search only: ``S`` and every certificate are computed in float64 on the
    float64 text either way.

    ``rows="every"`` searches **every** word: each is screened (``screen``, a dict of
    :class:`~wsutils.estimators.screen.Screen`'s fields) and the best ``keep`` are certified
    with word 0 by the same search
    (:func:`~wsutils.estimators.screen.screened_word_sensitivity`), so ``S`` is a certified
    lower bound on the sup over every word; ``S_word1`` is then word 0's own value in that
    search (at least the fixed-word search's: its starts and also the screened ``Δ``). ``S`` is
    the best of the search and ``certified`` (a float32 search, recomputed in float64 at its
    best iterate, can end a rounding short of a construction it started from)."""
    torch.set_num_threads(1)
    cpu0 = time.process_time()
    norm = _norm(normalisation)
    X, W = sample_X(n, d, seed=seed), sample_W(d, seed=seed + 1)
    search = Search.parse(POINT_SEARCH, **point_search(search), seed=search_seed(seed))
    t0 = time.perf_counter()
    out = {}
    if rows == "every":
        res = screened_word_sensitivity(
            X,
            W,
            normalisation=norm,
            screen=Screen.parse(screen),
            search=search,
            also=[0],
            upper=False,  # upper_certificate bounds every word where the chapter needs it
        )
        out["S_word1"] = res.per_row[0]
    else:
        if screen is not None:
            raise ValueError("screen is read only with rows='every'; leave it None.")
        res = attention_word_sensitivity(
            X,
            W,
            normalisation=norm,
            rows=_point_rows(rows, n),
            search=search,
            takeovers=True,
            init=_doubling(X, W, 0),  # Δ = x_0, in the ball exactly
            upper=False,
        )
    elapsed = time.perf_counter() - t0
    searched = sorted(res.per_row)
    # the certificate: the row and the key take-over and the doubling Δ = x_i of
    # prop-norm-double at each searched word, through the full map in float64 (starts of
    # the estimator; every other start only adds to S); the doubling of word 0 last;
    # one batched evaluation of X and the copies
    words = [r for r in searched if r != 0] + [0]
    cands = torch.stack(
        [f(X, W, r) for r in words for f in (row_takeover, key_takeover, _doubling)]
    )
    rows3 = torch.tensor([r for r in words for _ in range(3)])
    with torch.no_grad():
        y = general_attention(torch.cat([X[None], perturb(X, rows3, cands)]), W, norm)
    base = float(torch.linalg.vector_norm(y[0]))
    changes = torch.linalg.vector_norm(y[1:] - y[0], dim=(-2, -1)) / base
    certified = float(changes.max())
    out.update(
        S=max(res.value, certified),  # a float32 search can end a rounding short of them
        certified=certified,
        certified_rows=searched,
        seconds=elapsed,
        phi_rel=base / math.sqrt(n * d),
        double=float(changes[-1]),
    )
    if norm.name in DOUBLING:
        b = doubling_bound(X, W, 0, norm)
        out.update(double_bound=b["bound"], double_frac=b["frac"])
    out.update(row_margin(X, W, 0, norm))
    out["cpu_seconds"] = time.process_time() - cpu0
    return out


def upper_certificate(normalisation: str, d: int, n: int, seed: int) -> float | None:
    """The upper certificate over every word of :func:`normalisation_point`'s text (``seed``)
    for the normalisations that have one: softmax at any ``β`` and scalable softmax
    (:prf:ref:`prop-softmax-upper`, row-wise: the joint certificate of
    :prf:ref:`prop-softmax-joint` would cost about 10 CPU s at the grid's largest ``n``,
    :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`) and ReLU attention
    (:func:`~wsutils.estimators.relu.relu_certified_upper`), so ``S`` of that text is at most
    the value; ``None`` for the others."""
    from ..estimators.relu import relu_certified_upper
    from ..estimators.softmax_upper import softmax_certified_upper

    norm = _norm(normalisation)
    if norm.name not in ("softmax", "scalable", "relu"):
        return None
    X, W = sample_X(n, d, seed=seed), sample_W(d, seed=seed + 1)
    if norm.name == "relu":
        return float(relu_certified_upper(X, W).max())
    return float(softmax_certified_upper(X, W, normalisation=norm, joint=False).max())


def _doubling(X, W, row: int) -> torch.Tensor:
    """The doubling ``Δ = x_row`` of :prf:ref:`prop-norm-double`, on the exact ball."""
    return project_ball(X[row : row + 1].clone(), math.sqrt(X.shape[1]))[0]


def phase_point(d: int, n: int, seed: int) -> dict:
    """The row take-over of word 0 at one text (``X``, ``W`` drawn as in
    :func:`normalisation_point`): its margin ``m`` (:prf:ref:`prop-norm-margin`) and the
    self-weight it reaches under each normalisation of :data:`PHASE`
    (``a_softmax``, ``a_scalable``, ``a_sparsemax``), for the chapter's phase diagram."""
    torch.set_num_threads(1)
    X, W = sample_X(n, d, seed=seed), sample_W(d, seed=seed + 1)
    out = {}
    for name in PHASE:
        r = row_margin(X, W, 0, name)
        out["margin"] = r["margin"]
        out[f"a_{name}"] = r["self_weight"]
    return out


#: Draws of ``(x_i, W)`` behind :func:`takeover_margin_model`'s means and spread.
MODEL_DRAWS = 64


@functools.lru_cache(maxsize=None)
def _self_and_norm(d: int, draws: int) -> tuple:
    """Over ``draws`` independent (``x_i``, ``W``) (streams ``point_seed("margin-model", d, r)``,
    none of them a text of the chapter's grids): the self-score ``s'_ii`` after the row
    take-over and ``‖Wᵀx'_i‖``, as two float64 arrays."""
    ss, vs = np.empty(draws), np.empty(draws)
    for r in range(draws):
        seed = point_seed("margin-model", d, r)
        x, W = sample_X(1, d, seed=seed), sample_W(d, seed=seed + 1)
        xp = x[0] + row_takeover(x, W, 0)
        ss[r] = float(xp @ W @ xp) / math.sqrt(d)
        vs[r] = float(torch.linalg.vector_norm(W.T @ xp))
    return ss, vs


def takeover_margin_model(d: int, n: int, draws: int = MODEL_DRAWS) -> dict:
    """The margin ``m = s'_ii − max_{k≠i} s'_ik`` that the row take-over (:prf:ref:`def-takeover`)
    is predicted to reach at width ``d`` and length ``n`` (the model of
    :prf:ref:`obs-norm-phase`; a heuristic, not a theorem).

    The competing scores are ``s'_ik = vᵀx_k/√d = ‖v‖·t_k`` with ``v = Wᵀx'_i``; for ``x_k``
    uniform on the sphere of radius ``√d`` and independent of ``v`` the cosines ``t_k`` are
    i.i.d. with ``P(t > q) = ½ I_{1−q²}((d−1)/2, ½)`` (``q ≥ 0``, ``I`` the regularised
    incomplete beta function; ``x'_i`` is built from ``x_i`` and ``W`` only, so the other words
    are independent of ``v``). Their maximum over the ``n − 1`` other words is replaced by its
    median ``q_{d,n}`` (``P(t > q) = 1 − 2^{−1/(n−1)}``), and ``s'_ii`` and ``‖v‖`` by their
    means over ``draws`` independent draws (``_self_and_norm``): ``margin = E s'_ii −
    E‖v‖·q_{d,n}``. ``sd`` is the standard deviation of one text's margin under the model,
    ``s'_ii − ‖v‖·T`` over those draws, with ``T`` the maximum of the ``n − 1`` cosines taken
    from its exact law (``P(T ≤ τ) = (1 − P(t > τ))^{n−1}``), one stratified quantile per draw,
    in an order fixed by ``point_seed("margin-max", d, n)``. Also returned: ``self_score`` (``E
    s'_ii``), ``v_norm`` (``E‖v‖``) and ``q``. ``d ≥ 2``, ``n ≥ 2``."""
    d = check_int("d", d, minimum=2)
    n = check_int("n", n, minimum=2)
    draws = check_int("draws", draws, minimum=2)
    ss, vs = _self_and_norm(d, draws)
    p = -math.expm1(-math.log(2) / (n - 1))  # 1 − 2^{−1/(n−1)} ≤ ½
    q = float(_cosine_quantile(d, np.array(p)))
    u = (np.arange(draws) + 0.5) / draws  # stratified P(T ≤ τ) = u ...
    u = np.random.default_rng(point_seed("margin-max", d, n)).permutation(u)
    T = _cosine_quantile(d, -np.expm1(np.log(u) / (n - 1)))  # P(t > τ) = 1 − u^{1/(n−1)}
    sd = float((ss - vs * T).std(ddof=1))
    return {
        "margin": float(ss.mean() - vs.mean() * q),
        "sd": sd,
        "q": q,
        "self_score": float(ss.mean()),
        "v_norm": float(vs.mean()),
    }


def _cosine_quantile(d: int, p: np.ndarray) -> np.ndarray:
    """``τ`` with ``P(t > τ) = p`` for the cosine ``t`` of a uniform point of the sphere in
    ``R^d`` with a fixed direction: ``P(t > τ) = ½ I_{1−τ²}((d−1)/2, ½)`` for ``τ ≥ 0``, and
    ``t`` is symmetric (so ``p > ½`` gives ``τ < 0``)."""
    a = (d - 1) / 2

    def tail(r):  # τ ≥ 0 with P(t > τ) = r ≤ ½
        return np.sqrt(np.maximum(0.0, 1 - special.betaincinv(a, 0.5, np.minimum(2 * r, 1.0))))

    return np.where(p <= 0.5, tail(p), -tail(1 - p))


def margin_interval(normalisation, n: int, a_min: float) -> tuple[float, float]:
    """``(necessary, sufficient)``: the margins ``m`` (unscaled scores) below which the
    self-weight cannot reach ``a_min`` and above which it must (:prf:ref:`prop-norm-margin`).

    Softmax and scalable softmax (``c = c_n``): ``a_i ≤ 1/(1 + e^{−c m})`` (the largest other
    term alone) and ``a_i ≥ 1/(1 + (n−1)e^{−c m})``, so ``(log(a/(1−a))/c,
    (log(n−1) + log(a/(1−a)))/c)`` with ``a = a_min ∈ (0, 1)``; sparsemax and entmax, for the
    exactly one-hot row (``a_min = 1``): both ``1/β`` resp. ``1/((α−1)β)``."""
    norm = _norm(normalisation)
    n = check_int("n", n, minimum=2)
    if norm.name in ("sparsemax", "entmax"):
        if a_min != 1:
            raise ValueError(
                f"{norm.name}: the margin condition is for the one-hot row, "
                f"a_min = 1; got {a_min}."
            )
        m = required_margin(norm, n)
        return m, m
    if norm.name not in ("softmax", "scalable"):
        raise ValueError(
            f"margin_interval covers softmax, scalable, sparsemax and entmax, not {norm.name!r}."
        )
    if not 0 < a_min < 1:
        raise ValueError(f"a_min must be in (0, 1) for {norm.name}, got {a_min}.")
    c, logit = norm.scale(n), math.log(a_min / (1 - a_min))
    return logit / c, (math.log(n - 1) + logit) / c


@dataclass(frozen=True)
class Scale:
    """The sizes of the two normalisation chapters at one scale.

    ``grid``
        The grid of ``S`` against ``n``: ``((d, (n, ...)), ...)``, widths and their lengths;
        the first width is :attr:`d_fit`, where the slopes are fitted.
    ``seeds_fit``
        Seeds per point at ``d = d_fit``; at most 2 at the other widths (:meth:`seeds`).
    ``keep``, ``search_starts``, ``search_steps``
        The search of :func:`normalisation_point`: every word screened (:data:`SCREEN`), the
        ``keep`` best and word 1 certified by a search of ``starts`` and ``steps``.
    ``phase_d``, ``phase_n``, ``phase_seeds``
        The phase diagram's widths, lengths and seeds per cell (:func:`phase_point`).
    ``flip_d``, ``flip_n``, ``flip_Ns``, ``flip_seeds``, ``flip_starts``, ``flip_steps``
        The flip experiment (``wsutils.generalization.flip_point`` with ``map="attention"``):
        width, length, training-set sizes, draws, search starts and steps.
    ``workers``
        Processes for the grids (``wsutils.run.sweep.process_pool``).
    """

    grid: tuple[tuple[int, tuple[int, ...]], ...]
    seeds_fit: int
    keep: int
    search_starts: int
    search_steps: int
    phase_d: tuple[int, ...]
    phase_n: tuple[int, ...]
    phase_seeds: int
    flip_d: int
    flip_n: int
    flip_Ns: tuple[int, ...]
    flip_seeds: int
    flip_starts: int
    flip_steps: int
    workers: int

    @property
    def d_fit(self) -> int:
        """The width at which the slopes are fitted (the smallest of the grid)."""
        return min(d for d, _ in self.grid)

    def search(self, normalisation: str) -> dict:
        """The search of :func:`normalisation_point` for ``normalisation`` (a label of
        :data:`CHAPTER`) as a point takes it: ``rows="every"``, the ``screen``
        (:data:`SCREEN`, keeping ``keep`` words) and the certifying ``search``
        (``starts``, ``steps`` and the precision :data:`SEARCH_DTYPE` gives the map)."""
        search = dict(
            starts=self.search_starts, steps=self.search_steps, dtype=SEARCH_DTYPE[normalisation]
        )
        screen = dict(SCREEN[normalisation], keep=self.keep)
        return dict(rows="every", search=search, screen=screen)

    def lengths(self, d: int, normalisation: str) -> tuple[int, ...]:
        """The grid's lengths at width ``d`` for ``normalisation``: those of ``grid``, up
        to :data:`EVERY_MAX_N` where it sets one."""
        top = EVERY_MAX_N.get(normalisation, math.inf)
        return tuple(n for n in dict(self.grid)[d] if n <= top)

    def seeds(self, d: int, n: int, normalisation: str | None = None) -> int:
        """Seeds at grid point ``(d, n)`` for ``normalisation`` (a label of :data:`CHAPTER`;
        every normalisation has the same): ``seeds_fit`` at ``d = d_fit``, at most 2 at the
        other widths (the figure only)."""
        return self.seeds_fit if d == self.d_fit else min(self.seeds_fit, 2)

    def grid_text(self) -> str:
        """The grid with its seed counts, for the prose: ``"d = 32: n = 16, 64 (3 seeds);
        d = 128: ..."``."""
        texts = []
        for d, ns in self.grid:
            counts = [self.seeds(d, n) for n in ns]
            parts = [
                ", ".join(str(n) for n, c in zip(ns, counts) if c == k) + f" ({k} seeds)"
                for k in sorted(set(counts), reverse=True)
            ]
            texts.append(f"d = {d}: n = " + ", ".join(parts))
        return "; ".join(texts)


#: The sizes per scale — ``quick`` for the tests, ``paper`` for the published book.
SCALES = {
    "quick": Scale(
        grid=((16, (16, 64, 256)),),
        seeds_fit=3,
        keep=2,
        search_starts=2,
        search_steps=30,
        phase_d=(4, 16, 32, 64),
        phase_n=(10, 100, 1000, 10**4),
        phase_seeds=3,
        flip_d=4,
        flip_n=128,
        flip_Ns=(50, 400),
        flip_seeds=2,
        flip_starts=2,
        flip_steps=60,
        workers=1,
    ),
    "paper": Scale(
        # every word screened: n ≤ 1024 (a screen costs O(n²) a text: 1.5-entmax's about
        # 33 s at n = 1024, EVERY_MAX_N), and the wider panels up to n = 128
        grid=((32, (16, 64, 256, 1024)), (128, (16, 128)), (768, (16, 128))),
        seeds_fit=3,
        keep=2,
        search_starts=2,
        search_steps=30,
        phase_d=(2, 4, 8, 16, 32, 64, 128),
        phase_n=(10, 100, 1000, 10**4, 10**5),
        phase_seeds=3,  # a median of three: one seed near its boundary cannot flip it
        flip_d=4,
        flip_n=256,
        flip_Ns=(100, 800),
        flip_seeds=3,
        flip_starts=4,
        flip_steps=40,
        workers=2,
    ),
}


def scale(name: str | None = None) -> Scale:
    """The normalisation chapters' sizes at scale ``name`` (``"quick"`` or ``"paper"``;
    ``None``: the current ``WSBOOK_SCALE``).

    Raises
    ------
    ValueError
        ``name`` is not a scale.
    """
    from ..run import config

    return config.pick(SCALES, name)
