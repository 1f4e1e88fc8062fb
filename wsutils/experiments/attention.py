"""Per-point functions for the attention chapters' grids (run with
:func:`wsutils.run.sweep.run_grid`).

Each takes JSON-serialisable parameters (seeds included), draws its own synthetic text
(:func:`wsutils.weights.sample_X`, seed ``seed``) and weights (:func:`wsutils.weights.sample_W`,
seed ``seed + 1``) and returns a dict of floats, so a process pool or a Dask executor can run it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from ..estimators.rf import rf_word_sensitivity
from ..estimators.screen import Screen, screened_word_sensitivity
from ..estimators.self_attention import attention_word_sensitivity
from ..estimators.softmax_upper import softmax_certified_upper
from ..estimators.takeover import certified_lower_bound, row_competition, takeover_certificate
from ..run import config
from ..run.seeds import point_seed, search_seed
from ..search import Search, point_search
from ..sensitivity import check_rows
from ..weights import sample_W, sample_X

__all__ = [
    "POINT_SEARCH",
    "SEARCH_DTYPE",
    "SEARCH_HALVING",
    "EVERY_ROW_HALVING",
    "SCALES",
    "Scale",
    "grid_points",
    "scale",
    "sensitivity_point",
    "takeover_point",
    "rf_point",
]

#: The precision of each map's search in the chapters' grids, float32 for both maps. Every
#: value is certified in float64 on the float64 text either way, so the search's precision
#: only decides which ``Δ`` it proposes. Softmax attention: equal to 3e-7 or better on every
#: point of ``benchmarks/bench_attention_grids.py``. ReLU attention (float64 until
#: 2026-12-07): its float32 search takes other paths on some points, so the two lower bounds
#: can differ (``--parts relu32``, the 21 every-word grid points of seed 0: equal to 1e-4 on
#: 16, 0.02-0.7 % apart on five, lower on four), at 0.58 of the CPU time (3.1x less at
#: d = 768, n = 10).
SEARCH_DTYPE = {"raf": "float32", "relu": "float32"}

#: The successive halving (:func:`wsutils.halving.halving_ascent`) of the searches that take
#: every row of a text (the IMDb sweep): after 20 steps, then 40, 80, … only the best third of
#: the (word, start) searches go on. Measured on the IMDb sweep's 12 costliest ReLU points
#: (d = 96, n = 100 and 200, reviews and Gaussian texts) against the full search: the same
#: value on 11, 0.11 % lower on one, at 0.3-0.5 of the time; the default schedule
#: :data:`wsutils.halving.SCHEDULE` (cuts after 10 steps) was 2.6-8.3 % lower on four of them.
#: Softmax attention at n = 200 (d = 96 and 384, three reviews): equal on all six.
EVERY_ROW_HALVING = (20, 1 / 3)

#: The successive halving of each map's certifying search in the chapters' grids (the words
#: the screen ranks first, each from ``starts`` starts and the constructions), by map.
#: Softmax attention takes :data:`EVERY_ROW_HALVING`: on the 21 every-word grid points of seed
#: 0 it ended at the full search's value (to 2e-7, relative) on all 21, at 0.77 of its CPU time
#: (``benchmarks/bench_attention_grids.py --parts halving``). ReLU attention takes none: there
#: it lost half the value at d = 192, n = 200 (the full search's best start was cut early).
SEARCH_HALVING = {"raf": EVERY_ROW_HALVING, "relu": None}

#: The search of :func:`sensitivity_point` where its ``search`` sets nothing: 4 starts (plus
#: the take-over constructions), 100 steps, in the text's precision (float64).
POINT_SEARCH = Search(starts=4, steps=100)


@dataclass(frozen=True)
class Scale:
    """The sizes of the softmax and the ReLU attention chapters at one scale.

    The grid of both chapters (at the paper's scale the grid of the authors' scripts):
    widths ``ds``, lengths ``ns``, ``seeds`` texts per point and the search of
    :func:`sensitivity_point` (``starts``, ``steps``, :meth:`Scale.search`; the grids screen
    every word and certify the ``first_rows`` best, with word 0; a fixed-word search takes
    the first ``first_rows`` words). Beyond it:
    the far lengths ``n_far`` (at ``d = ds[0]``, ``far_seeds`` texts a length, the first
    ``far_seeds`` of the grid's seeds; the softmax and the ReLU far grids search
    every word up to ``far_every_max``, :meth:`Scale.far_every`, the ReLU chapter's upper
    certificate goes on to the last), the phase diagram's ``phase_ds`` ×
    ``phase_ns``, the authors' search at ``auth_points`` (``(d, n)``) with ``auth_seeds``
    texts each, the ReLU chapter's orthogonal take-over at ``takeover_points``, its RF
    grid (on the first ``rf_seeds`` of the ``seeds`` texts of each point of the grid) and
    search (``rf_starts``, ``rf_steps``), and the ``workers`` of the grids' process pool.
    Defined once here so that both chapters search the same points the same way."""

    ds: tuple[int, ...]
    ns: tuple[int, ...]
    seeds: int
    first_rows: int
    starts: int
    steps: int
    n_far: tuple[int, ...]
    far_every_max: int
    far_seeds: int
    phase_ds: tuple[int, ...]
    phase_ns: tuple[int, ...]
    auth_points: tuple[tuple[int, int], ...]
    auth_seeds: int
    takeover_points: tuple[tuple[int, int], ...]
    rf_seeds: int
    rf_starts: int
    rf_steps: int
    workers: int

    def far_every(self) -> tuple[int, ...]:
        """The far lengths where every word is screened (the far grids): ``n_far`` up to
        ``far_every_max``. The screen costs ``O(n²d)`` a step (every word's objective is
        ``O(nd)``): at ``d = 192``, one text took 3.3 s at ``n = 1000``, 11 s at 2000 and 52 s
        at 4000 on one core."""
        return tuple(n for n in self.n_far if n <= self.far_every_max)

    def search(self, normalisation: str) -> dict:
        """The search of :func:`sensitivity_point` for ``normalisation`` (``"raf"`` or
        ``"relu"``) as a point takes it: ``rows`` (the first ``first_rows`` words) and
        ``search`` (``starts``, ``steps``, the precision :data:`SEARCH_DTYPE` gives the map
        and its :data:`SEARCH_HALVING`, if any)."""
        search = dict(starts=self.starts, steps=self.steps, dtype=SEARCH_DTYPE[normalisation])
        if SEARCH_HALVING[normalisation] is not None:
            search["halving"] = SEARCH_HALVING[normalisation]
        return dict(rows=list(range(self.first_rows)), search=search)


SCALES = {
    "quick": Scale(
        ds=(192, 384),
        ns=(10, 50, 100, 250),
        seeds=2,
        first_rows=1,
        starts=2,
        steps=40,
        n_far=(250, 500, 1000, 2000),
        far_every_max=2000,
        far_seeds=2,
        phase_ds=(2, 4, 8, 16, 32, 64, 128),
        phase_ns=(10, 30, 100, 300, 1000),
        auth_points=((32, 10), (64, 10)),
        auth_seeds=2,
        takeover_points=((192, 100), (384, 100)),
        rf_seeds=2,
        rf_starts=2,
        rf_steps=30,
        workers=1,
    ),
    "paper": Scale(
        ds=(192, 384, 768),
        ns=(10, 20, 50, 100, 150, 200, 250),
        seeds=5,
        first_rows=2,
        starts=4,
        steps=100,
        n_far=(250, 500, 1000, 2000, 4000),
        far_every_max=2000,
        far_seeds=3,  # the every-word screen's cost: 3 texts a length (the build budget)
        phase_ds=(2, 4, 8, 16, 32, 64, 128, 256, 768),
        phase_ns=(10, 30, 100, 300, 1000, 3000),
        auth_points=((192, 50), (384, 50), (768, 50)),
        auth_seeds=4,
        takeover_points=((384, 100), (768, 150), (768, 250)),
        rf_seeds=2,  # RF varies little across texts (the ReLU chapter measures it)
        rf_starts=4,
        rf_steps=60,
        workers=2,
    ),
}


def scale(name: str | None = None) -> Scale:
    """The attention chapters' :class:`Scale` at ``name`` (``"quick"`` or ``"paper"``;
    ``None``: the current ``WSBOOK_SCALE``, :mod:`wsutils.run.config`)."""
    return config.pick(SCALES, name)


def grid_points(normalisation: str) -> list[dict]:
    """The points of the grid of :func:`scale` for ``normalisation`` (``"raf"`` or
    ``"relu"``), as
    :func:`sensitivity_point` takes them: every ``(d, n)`` and seed index ``s``, with the text
    and weights of ``point_seed("attention", d, n, s)``, every word searched (``rows="every"``:
    each word screened, the best ``first_rows`` certified by the search of
    :meth:`Scale.search`, in the precision :data:`SEARCH_DTYPE` gives ``normalisation``).
    The softmax chapter and the ReLU
    chapter both take their softmax grid from here: the same list of points, hence the same
    keys in a sweep store (:func:`wsutils.run.sweep.point_key`), so a store shared by the two
    computes it once."""
    if normalisation not in SEARCH_DTYPE:
        raise ValueError(
            f"normalisation must be one of {tuple(SEARCH_DTYPE)}, got {normalisation!r}."
        )
    g = scale()
    return [
        dict(
            normalisation=normalisation,
            d=d,
            n=n,
            seed=point_seed("attention", d, n, s),
            rows="every",
            search=g.search(normalisation)["search"],
            screen=dict(keep=g.first_rows),
        )
        for d in g.ds
        for n in g.ns
        for s in range(g.seeds)
    ]


def sensitivity_point(
    normalisation: str,
    d: int,
    n: int,
    seed: int,
    rows: Sequence[int] | str = (0, 1),
    search: dict | None = None,
    certificates: bool = True,
    screen: dict | None = None,
) -> dict:
    """``S`` of softmax (``normalisation="raf"``) or ReLU (``"relu"``) attention at one text
    (or of any other normalisation :meth:`wsutils.maps.Normalisation.parse` reads by name).

    The estimator (:func:`wsutils.estimators.self_attention.attention_word_sensitivity`) searches
    the words ``rows`` (indices, the chapters' first one or two) from random starts plus the
    take-over constructions (``search``: a dict of :class:`~wsutils.search.Search`'s fields
    over :data:`POINT_SEARCH`, seeded by ``seed``; :func:`wsutils.search.point_search`);
    ``S`` is the float64 relative change at the best ``Δ`` found, recomputed with the full map
    (a certified lower bound). Also returns ``phi_norm = ‖φ(X)‖_F/√d`` (the float64 norm
    that certification divides by),
    ``kappa = ‖X‖_op/√d``, the search's wall ``seconds`` and ``certified_rows``, the words
    whose values were certified.

    ``rows="every"`` searches every word instead: each is screened and the best ``keep``
    certified, with word 0 (where the take-over bound is computed) certified too
    (:func:`wsutils.estimators.screen.screened_word_sensitivity`, ``screen`` a dict of
    :class:`~wsutils.estimators.screen.Screen`'s fields, the same ``search`` certifying, its
    random starts seeded by :func:`~wsutils.run.seeds.search_seed`, independent of the
    text), so ``S`` is a lower bound on the sup over every word, at least the search's value
    at word 0; ``upper`` and ``certified`` are then taken at the certified words.

    ``certificates=True`` (default) adds ``certified``, the best construction alone
    (:func:`wsutils.estimators.takeover.certified_lower_bound`, six full float64 maps per
    row) over the same rows and, for ``raf``, the bound, self-weight, margin and ``‖A‖_F`` of
    :prf:ref:`thm-raf-high` at row 0 (:func:`~wsutils.estimators.takeover.takeover_certificate`)
    and the upper certificate of :prf:ref:`prop-softmax-upper` and :prf:ref:`prop-softmax-joint`
    (:func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`): ``upper``, the largest
    over the searched rows (so the searched rows' sensitivity lies in ``[S, upper]``),
    ``upper_all``, over every word (an upper bound on ``S`` itself), and ``upper_all_rw``, the
    same with :prf:ref:`prop-softmax-upper` alone.
    ``certificates=False`` computes only ``S``, ``phi_norm``, ``kappa`` and ``seconds``, for a
    grid that reads nothing else (the far-``n`` grids): the same ``S`` for the same point.
    The search's ``dtype`` (``None``: float64, or ``"float32"``) is the precision of the search
    only: ``S`` is certified in float64 on the float64 text either way.
    """
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    W = sample_W(d, seed=seed + 1)
    t0 = time.perf_counter()
    if rows == "every":
        search = Search.parse(POINT_SEARCH, **point_search(search), seed=search_seed(seed))
        res = screened_word_sensitivity(
            X,
            W,
            normalisation=normalisation,
            screen=Screen.parse(screen),
            search=search,
            also=[0],
            upper=False,  # the grids bound every word where they need it
        )
        searched = sorted(res.per_row)
    else:
        if screen is not None:
            raise ValueError("screen is read only with rows='every'; leave it None.")
        search = Search.parse(POINT_SEARCH, **point_search(search), seed=seed)
        searched = _point_rows(rows, n)
        res = attention_word_sensitivity(
            X,
            W,
            normalisation=normalisation,
            rows=searched,
            search=search,
            takeovers=True,
            upper=False,
        )
    elapsed = time.perf_counter() - t0
    out = {
        "S": res.value,
        "phi_norm": res.phi_norm / math.sqrt(d),  # ‖φ(X)‖_F of the certification
        "kappa": float(torch.linalg.matrix_norm(X, ord=2)) / math.sqrt(d),
        "seconds": elapsed,
        "certified_rows": searched,
    }
    if not certificates:
        return out
    out["certified"] = max(
        certified_lower_bound(X, W, r, normalisation=normalisation) for r in searched
    )
    if normalisation == "raf":
        c = takeover_certificate(X, W, 0)
        out.update(bound=c.bound, self_weight=c.self_weight, margin=c.margin, A_fro=c.A_fro)
        upper = softmax_certified_upper(X, W)  # the two certificates at every word, no search
        out.update(upper=float(upper[searched].max()), upper_all=float(upper.max()))
        out["upper_all_rw"] = float(softmax_certified_upper(X, W, joint=False).max())
    return out


def _point_rows(rows, n: int) -> list[int]:
    """A point's ``rows``: word indices (a list, as JSON gives it, or a tuple), checked
    (:func:`wsutils.sensitivity.check_rows`); ``None`` (every word, each searched in full) is
    not a grid's search: ``"every"`` screens them."""
    if rows is None or isinstance(rows, (int, str)):
        raise TypeError(
            f"rows must be a list of word indices, e.g. [0, 1], or 'every' (every word "
            f"screened), got {rows!r}."
        )
    return check_rows(list(rows), n)


def takeover_point(d: int, n: int, seed: int, certificate: bool = True) -> dict:
    """The row take-over at row 0 of one text (:prf:ref:`thm-raf-high`): the margin, the
    self-weight ``a'_00`` it reaches and ``lam``, the top eigenvalue of ``(W + Wᵀ)/2``; with
    ``certificate=True`` (default) also the relative change it produces (``change``) and the
    bound of the theorem (:func:`wsutils.estimators.takeover.takeover_certificate`).
    ``certificate=False`` computes only the row take-over's own row
    (:func:`wsutils.estimators.takeover.row_competition`, ``O(n·d + d³)`` instead of
    ``n × n`` products and an SVD), for the phase diagram, which reads the self-weight: the
    same margin and self-weight for the same point."""
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    W = sample_W(d, seed=seed + 1)
    if not certificate:
        c = row_competition(X, W, 0)
        return {"margin": c["margin"], "self_weight": c["self_weight"], "lam": c["lam"]}
    c = takeover_certificate(X, W, 0)
    return {
        "margin": c.margin,
        "self_weight": c.self_weight,
        "change": c.exact,
        "bound": c.bound,
        "lam": c.lam,
    }


def rf_point(
    d: int,
    n: int,
    seed: int,
    search: dict | None = None,
    upper: bool = True,
    precision: str = "float64",
) -> dict:
    """``S_RF`` at the same text as :func:`sensitivity_point` (``X`` from ``seed``), ``k = D``,
    with the exact estimator :func:`wsutils.estimators.rf.rf_word_sensitivity` (row 0);
    ``search`` (a dict of :class:`~wsutils.search.Search`'s fields over
    :data:`wsutils.estimators.rf.RF_SEARCH`, such as ``{"starts": 4, "steps": 60, "stop":
    [10, 1e-4]}``: ``stop`` ends the search once it has converged) and ``upper`` are passed
    to it: ``upper=False`` skips the upper certificate, which this function does not return.
    ``precision`` is the dtype of the draw of the weights (``"float32"``: single-precision
    weights, a different draw of the same law, about four times faster; the value is the
    float64 relative change either way)."""
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    res = rf_word_sensitivity(
        X,
        n * d,
        rows=0,
        seed=seed + 1,
        search=point_search(search),
        upper=upper,
        precision=precision,
    )
    return {"S": res.value}
