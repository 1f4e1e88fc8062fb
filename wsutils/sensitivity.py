"""Word sensitivity ``S_φ(X)`` (definition :prf:ref:`def-word-sensitivity`) and a generic
estimator of it for any differentiable torch map.

``S_φ(X) = sup_{i, ‖Δ‖ ≤ √d} ‖φ(X_i(Δ)) − φ(X)‖ / ‖φ(X)‖`` where ``X_i(Δ)`` is ``X`` with
row ``i`` replaced by ``x_i + Δ``. Any ``Δ`` in the ball gives a *lower* bound on ``S``; the
estimator searches for a good one by projected gradient ascent from several starts, keeps the
best iterate seen (not the last one) and takes the sup over the requested rows.

Every estimator of ``wsutils`` returns, for each searched row, a ``Δ`` that lies in the ball
in exact arithmetic (:func:`project_ball`) and the relative change at that ``Δ`` recomputed
in float64 (:func:`relative_change`), whatever the dtype of the search: its values are
lower bounds on ``S`` that a reader can recompute.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ._tensor import Array, probe_moves, row_norms
from .checks import (
    as_tensor,
    as_text,
    check_finite,
    check_int,
    check_real,
    check_rows,
    check_unit_rows,
)
from .halving import EVAL_ELEMENTS, halving_ascent, passes
from .search import Search
from .tokenwise import TokenwiseMap, check_tokenwise, replace_rows

__all__ = [
    "BALL_DTYPES",
    "MAP_SEARCH",
    "SensitivityResult",
    "ball_slack",
    "ascend",
    "ascend_and_certify",
    "autograd_values",
    "ascend_rows",
    "certify",
    "check_batch_map",
    "check_rows",
    "cosine_ascent",
    "cosine_step",
    "map_objective",
    "perturb",
    "project_ball",
    "relative_change",
    "relative_changes",
    "search_dtype",
    "search_setup",
    "sphere_starts",
    "sphere_step",
    "stalled",
    "word_sensitivity",
]

Map = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SensitivityResult:
    """What :func:`word_sensitivity` found.

    ``value`` is the best relative change found, ``row`` the word and ``Delta`` (a float64
    numpy vector with ``‖Delta‖ ≤ √d`` exactly) the perturbation attaining it: ``value`` is a
    certified lower bound on ``S_φ(X)``. ``per_row`` maps each searched row to its best value
    and ``per_row_Delta`` to the perturbation attaining it; every value is the float64
    relative change at its ``Δ`` (:func:`relative_change`). ``phi_norm`` is ``‖φ(X)‖`` in
    float64, the denominator of those values, as the certification computed it (NaN where an
    estimator does not record it). ``ball`` is the radius of the ball searched: ``"√d"`` (the
    book's definition, :prf:ref:`def-word-sensitivity`) or ``"‖x_i‖"``, the changed word's
    own norm (:prf:ref:`def-own-norm-ws`, :func:`wsutils.trained.own_norm_word_sensitivity`);
    ``bound`` says what ``value`` is: ``"lower"``, a certified lower bound on the sup over
    that ball. ``upper`` is an upper certificate on the largest relative change over the rows
    searched (``per_row``'s, or every word where a screen searched them all,
    :func:`wsutils.estimators.screen.screened_word_sensitivity`), the largest of
    ``per_row_upper`` (each row's), where the
    estimator has one for the map (:mod:`wsutils.estimators.upper`; random features); ``None``
    (and ``per_row_upper`` empty) where it has none: a map of one's own gets a lower bound
    only. With every word searched, ``value ≤ S_φ(X) ≤ upper``. The one-line summary prints
    ``value`` and the ball, and the bracket where there is one.
    """

    value: float
    row: int
    Delta: np.ndarray
    per_row: dict[int, float] = field(default_factory=dict)
    starts: int = 0
    steps: int = 0
    seed: int = 0
    per_row_Delta: dict[int, np.ndarray] = field(default_factory=dict)
    phi_norm: float = math.nan
    ball: str = "√d"
    bound: str = "lower"
    upper: float | None = None
    per_row_upper: dict[int, float] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        """A one-line summary (``Delta`` and the per-row tables are attributes, not printed:
        they hold a vector per searched row)."""
        norm = float(np.linalg.norm(self.Delta)) if np.size(self.Delta) else math.nan
        return (
            f"{type(self).__name__}(value={self.value:.6g}, row={self.row}, "
            f"‖Delta‖={norm:.4g}, rows searched={len(self.per_row)}, starts={self.starts}, "
            f"steps={self.steps}, seed={self.seed}, ball ‖Δ‖ ≤ {self.ball}, "
            + (
                f"{self.bound} bound)"
                if self.upper is None
                else f"sup over the rows searched ∈ [{self.value:.6g}, {self.upper:.6g}])"
            )
        )

    def with_upper(self, per_row_upper: dict[int, float]) -> SensitivityResult:
        """This result with the upper certificates ``per_row_upper`` (each bounding its row's
        sup; at least every row of ``per_row``, or every word where a screen searched them
        all) and ``upper`` their largest. A certificate below the value found at its row is a
        ValueError: it does not bound the map."""
        missing = sorted(set(self.per_row) - set(per_row_upper))
        if missing:
            raise ValueError(f"no upper certificate for the searched rows {missing}.")
        for r, u in per_row_upper.items():
            if not u >= self.per_row.get(r, -math.inf):
                raise ValueError(
                    f"the upper certificate {u!r} at row {r} is not above the relative change "
                    f"{self.per_row[r]!r} found there: it does not bound this map."
                )
        ups = {r: float(u) for r, u in per_row_upper.items()}
        return dataclasses.replace(self, upper=max(ups.values()), per_row_upper=ups)


def perturb(X: torch.Tensor, rows: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
    """``X_i(Δ)`` for a batch: ``X`` is ``(n, d)``, ``rows`` ``(B,)`` and ``Delta`` ``(B, d)``;
    returns ``(B, n, d)`` with row ``rows[b]`` of copy ``b`` moved by ``Delta[b]``. Shapes
    are checked (a ValueError), values are not: the searches call it at every step."""
    if X.ndim != 2 or rows.ndim != 1 or Delta.shape != (rows.shape[0], X.shape[-1]):
        raise ValueError(
            f"perturb needs X (n, d), rows (B,) and Delta (B, d), got {tuple(X.shape)}, "
            f"{tuple(rows.shape)} and {tuple(Delta.shape)}."
        )
    return replace_rows(X, rows, X[rows] + Delta)  # one copy of X; only row i moves


#: Dtypes in which a perturbation is searched and returned. Half precision (float16,
#: bfloat16) has a unit roundoff of 5e-4 to 4e-3: the exact-ball margin below would exceed
#: 1 for ``d`` in the hundreds, so half-precision input is searched in float32.
BALL_DTYPES = (torch.float32, torch.float64)


def ball_slack(d: int, dtype: torch.dtype) -> float:
    """The relative margin ``(3d + 12)·u`` (``u = eps/2`` the unit roundoff of ``dtype``) that
    :func:`project_ball` keeps on the *squared* norm. Why this size:

    - any routine that sums ``d`` squares in ``dtype``, in any order, with or without FMA
      (numpy's ``dot``/``norm``, torch's ``vector_norm``, a BLAS ``nrm2``), returns a value
      within a relative ``γ_d = d·u/(1 − d·u)`` of the exact sum (Higham, *Accuracy and
      Stability of Numerical Algorithms*, eq. (3.5)), and its square root adds one more ``u``;
      ``math.sqrt(d)`` is within ``u₆₄`` of ``√d``. So a vector whose exact squared norm is
      at most ``d·(1 − (d + 4)·u)`` has a computed norm ``≤ math.sqrt(d)`` under every such
      routine, and an exact norm ``< √d``;
    - :func:`project_ball` verifies its output with a float64 sum whose own error is at most
      ``γ_d`` in float64, so it asks for ``d·(1 − (3d + 12)·u)``, which covers both errors
      with room to spare. In float64 the margin is ``(3d + 12)·1.1e-16``: ``2.6e-13`` at
      ``d = 768``, so a value computed at a projected ``Δ`` moves by at most about that much.
    """
    d = check_int("d", d, minimum=1)
    u = torch.finfo(dtype).eps / 2
    return (3 * d + 12) * u


def project_ball(Delta: torch.Tensor, radius: float, *, exact: bool = True) -> torch.Tensor:
    """Euclidean projection of each row of ``Delta`` onto ``{‖Δ‖ ≤ radius}``, with a margin
    that makes the statement hold in exact arithmetic and under every floating-point norm.

    A row of norm above ``radius·(1 − s)``, ``s = ball_slack(d, dtype)``, is rescaled to that
    norm (the norm is computed without overflow, ``wsutils._tensor.row_norms``); rows
    inside are returned unchanged. The result is then *verified*: the exact squared norm of
    every returned row (its float entries taken as exact rationals) is at most
    ``radius²·(1 − (d + 4)·u)``, checked by a float64 sum with the power-of-two row scaling
    and the rounding bound of :func:`ball_slack`. With ``radius = math.sqrt(d)`` this gives
    ``‖Δ‖ ≤ √d`` for ``fractions.Fraction`` arithmetic, numpy's and torch's norms, in
    float64 and float32 (``tests/test_ball.py``). Half precision is refused (see
    :data:`BALL_DTYPES`); non-finite entries are a ValueError.

    ``exact=False`` is the projection *between the steps* of a search: rows are rescaled to
    ``radius·(1 − 2u)`` and not verified, so a computed norm may exceed ``radius`` by a few
    ulps. It spares a float32 search the float32 margin (``7e-5`` at ``d = 384``) on every
    iterate; every ``Δ`` an estimator returns goes through ``exact=True``.

    Every ``Δ`` an estimator or construction of ``wsutils`` returns goes through this
    projection, so ``‖Δ‖ ≤ √d`` holds in exact arithmetic and under every norm routine, not
    only under torch's rounding.

    Raises
    ------
    TypeError
        If ``Delta`` is not float32 or float64 (half precision is too coarse for an exact
        ball).
    ValueError
        If ``Delta`` has non-finite entries.
    """
    radius = check_real("radius", radius, positive=True)
    if Delta.dtype not in BALL_DTYPES:
        raise TypeError(
            f"project_ball works in float32 or float64, got {Delta.dtype}; "
            "cast the perturbation first (half precision is too coarse for an "
            "exact ball)."
        )
    d = Delta.shape[-1]
    slack = ball_slack(d, Delta.dtype)
    if not slack < 0.25:
        raise ValueError(f"d = {d} is too large for an exact ball in {Delta.dtype}; use float64.")
    target = radius * (1 - (slack if exact else torch.finfo(Delta.dtype).eps))
    with torch.no_grad():
        norm = torch.linalg.vector_norm(Delta.detach(), dim=-1, keepdim=True)
        if not bool(torch.isfinite(norm).all()):
            if not bool(torch.isfinite(Delta).all()):
                raise ValueError(
                    "Delta has non-finite entries (NaN or inf): there is nothing to project."
                )
            norm = row_norms(Delta.detach())  # the squares overflowed: rescaled norms
        factor = torch.where(
            norm > target,
            target / norm.clamp_min(torch.finfo(norm.dtype).tiny),
            torch.ones_like(norm),
        )
    Delta = Delta * factor
    if not exact:
        return Delta
    for _ in range(4):  # never needed by the rounding bounds above; kept as the proof's check
        over = ~_inside(Delta, radius, slack)
        if not bool(over.any()):
            return Delta
        Delta = torch.where(over[..., None], Delta * (1 - slack), Delta)
    raise RuntimeError("project_ball could not certify the ball; please report this input.")


def _inside(Delta: torch.Tensor, radius: float, slack: float) -> torch.Tensor:
    """Rows whose exact squared norm is certainly ``≤ radius²·(1 − (d + 4)·u)``: the float64
    sum of squares of the row is compared with ``radius²·(1 − slack)`` (see :func:`ball_slack`
    for why this suffices; underflow only lowers the sum by at most ``d·2⁻¹⁰⁷⁴``, far inside
    the margin). If a sum overflows, the rows are first divided by a power of two ``p ≥``
    their largest entry (exact) and compared with ``(radius/p)²·(1 − slack)``."""
    with torch.no_grad():
        D64 = Delta.detach().to(torch.float64)
        s = (D64 * D64).sum(dim=-1)
        if bool(torch.isfinite(s).all()):
            return s <= radius * radius * (1 - slack)
        big = D64.abs().amax(dim=-1, keepdim=True)
        _, e = torch.frexp(big)
        p = torch.where(big > 0, torch.ldexp(torch.ones_like(big), e), torch.ones_like(big))
        s = ((D64 / p) ** 2).sum(dim=-1)
        return s <= (radius / p[..., 0]) ** 2 * (1 - slack)


def _norms(t: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.linalg.vector_norm(t.reshape(batch, -1), dim=-1)


def search_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a search runs in for input of ``dtype``: its own if float32/float64,
    float32 for half precision (see :data:`BALL_DTYPES`)."""
    return dtype if dtype in BALL_DTYPES else torch.float32


def relative_changes(
    phi_b: Map,
    X64: torch.Tensor,
    rows: Sequence[int],
    Deltas: torch.Tensor,
    *,
    max_batch_elements: int = 2**23,
    with_base: bool = False,
    alone: bool = False,
):
    """The quantity inside the sup of :prf:ref:`def-word-sensitivity`,
    ``‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖``, in float64 for many pairs ``(rows[b], Deltas[b])`` at once
    (the batched :func:`relative_change`; ``phi_b`` takes a ``(B, n, d)`` batch). Trusts its
    caller: ``X64`` a float64 ``(n, d)`` tensor, ``rows`` valid indices, ``Deltas`` ``(B, d)``
    finite, unchecked. ``X`` goes through ``φ`` in the
    same batch as each chunk of perturbed copies, and ``Δ = 0`` gives exactly 0. A non-finite
    output of ``φ`` is a ValueError. ``with_base=True`` returns ``(changes, ‖φ(X)‖)``, the
    norm as the last chunk's batch computed it.

    ``alone=True``: every text goes through ``φ`` on its own, as a batch of one (``X``
    once, then each ``X_i(Δ)``): the values are those of the map evaluated text by text, as
    a reader evaluates it by hand, whatever it does with a batch (a map of a reader's own,
    :func:`word_sensitivity`); ``False`` (the maps of ``wsutils``, whose batch entries are
    independent): chunks of ``max_batch_elements``."""
    n, d = X64.shape
    Deltas = Deltas.to(dtype=torch.float64, device=X64.device)
    chunk = 1 if alone else max(1, max_batch_elements // (n * d) - 1)
    out = []
    with torch.no_grad():
        base = _finite_map(phi_b, X64[None])[0] if alone else None
        for j in range(0, len(rows), chunk):
            r = torch.as_tensor(list(rows[j : j + chunk]), device=X64.device)
            moved = perturb(X64, r, Deltas[j : j + chunk])
            if alone:
                y = torch.cat([base[None], _finite_map(phi_b, moved)])
            else:
                y = _finite_map(phi_b, torch.cat([X64[None], moved]))
            base_norm = torch.linalg.vector_norm(y[0])
            if not float(base_norm) > 0:
                raise ValueError(
                    "‖φ(X)‖ = 0: the relative change is undefined for this X and map."
                )
            out.append(_norms(y[1:] - y[0], len(r)) / base_norm)
    out = torch.cat(out)
    # X_i(0) = X exactly, so Δ = 0 gives exactly 0 on every machine (a batched product need
    # not round two identical batch entries identically)
    out = torch.where((Deltas == 0).all(dim=-1), torch.zeros_like(out), out)
    return (out, float(base_norm)) if with_base else out


def _finite_map(phi_b: Map, texts: torch.Tensor) -> torch.Tensor:
    """``φ`` of a batch of texts in float64; a non-finite output is a ValueError."""
    y = phi_b(texts).to(torch.float64)
    if not bool(torch.isfinite(y).all()):
        raise ValueError(
            "φ returned non-finite values (NaN or inf) on X or on a "
            "perturbed X_i(Δ) in float64: the relative change is undefined."
        )
    return y


def relative_change(phi: Map, X: Array, row: int, Delta: Array, *, batched: bool = True) -> float:
    """``‖φ(X_i(Δ)) − φ(X)‖ / ‖φ(X)‖`` for one row ``i = row`` and one ``Δ`` (a vector of
    length ``d``): the quantity inside the sup of :prf:ref:`def-word-sensitivity`.

    Evaluated in float64 whatever the dtypes of ``X`` and ``Delta`` (their values are taken
    exactly), each text on its own as a batch of one (``φ(X[None])``, then the perturbed
    text's): ``phi`` must accept a float64 ``(1, n, d)`` batch; the maps of
    :mod:`wsutils.maps` cast their weights to the input's dtype. ``batched=False``: ``phi``
    takes one ``(n, d)`` text, as in :func:`word_sensitivity`."""
    Xt, n, d = as_text(X, dtype=torch.float64)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    Dt = as_tensor(Delta, dtype=torch.float64, device=Xt.device, name="Delta")
    if tuple(Dt.shape) != (d,):
        raise ValueError(
            f"Delta must have length d = {d} (one vector), got shape {tuple(Dt.shape)}."
        )
    check_finite("Delta", Dt)
    row = check_rows(row, n)
    if len(row) != 1:
        raise ValueError(f"row must be a single row index, got {row}.")
    return float(relative_changes(_batched(phi, batched), Xt, row, Dt[None], alone=True)[0])


def search_setup(
    X: Array,
    *,
    rows,
    starts: int | None = None,
    steps: int | None = None,
    init: Array | None = None,
    check_norms: bool = True,
    sink: bool = False,
    device=None,
):
    """Validate the text and rows every word-sensitivity estimator takes, once: a single text
    ``X`` (``n × d``, real, finite, rows of norm ``√d`` unless ``check_norms=False``), the rows
    to search (``None``: all; see ``check_rows``; with ``sink=True`` row 0 is the attention
    sink's token of eq. :eq:`eq-sink-attention`, not a word: its norm is free and ``None``
    means the words ``1, …, n − 1``), extra starts ``init`` (a vector of length
    ``d`` or an ``m × d`` array, projected onto the ball) and, where given (a search not made
    by :class:`wsutils.search.Search`, which checks its own), integers ``starts ≥ 1`` and
    ``steps ≥ 0``. Returns ``(X as a tensor in its search dtype, the list of rows, init as an
    m × d tensor or None)``; the search dtype is ``X``'s if float32/float64, else float32
    (:func:`search_dtype`)."""
    Xt, n, d = as_text(X, device=device)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if check_norms:
        check_unit_rows(Xt[1:] if sink else Xt)  # in X's own dtype: its rounding is allowed
    if sink and rows is None:
        rows = range(1, n)
    Xt = Xt.to(search_dtype(Xt.dtype))
    if starts is not None:
        check_int("starts", starts, minimum=1)
    if steps is not None:
        check_int("steps", steps, minimum=0)
    extra = None if init is None else init_starts(init, d, dtype=Xt.dtype, device=Xt.device)
    return Xt, check_rows(rows, n), extra


def init_starts(init: Array, d: int, *, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Extra starts of a search: ``init`` is one perturbation of length ``d`` or an ``m × d``
    array of them (anything else, e.g. ``2d`` entries in one vector, is a ValueError, never
    split into several starts), finite, returned ``m × d`` and projected onto the ball."""
    extra = as_tensor(init, dtype=dtype, device=device, name="init")
    if extra.ndim == 1:
        extra = extra[None]
    if extra.ndim != 2 or extra.shape[1] != d:
        raise ValueError(
            f"init must be one perturbation of length d = {d} or an m × d "
            f"array of them, got shape {tuple(extra.shape)}."
        )
    check_finite("init", extra)
    return project_ball(extra, math.sqrt(d))


def _batched(phi: Map, batched: bool) -> Map:
    if batched:
        return phi
    return lambda Xb: torch.stack([phi(x) for x in Xb])


#: The default search of :func:`word_sensitivity`, ``Search()`` with a progress bar once the
#: search has run 5 seconds (a map of one's own can take minutes; a short search prints
#: nothing).
MAP_SEARCH = Search(progress=5.0)


def word_sensitivity(
    phi: Map,
    X: Array,
    *,
    rows: int | Sequence[int] | None = None,
    init: Array | None = None,
    search: Search | dict | None = None,
    batched: bool = True,
    check_norms: bool = True,
    device=None,
    **settings,
) -> SensitivityResult:
    """Estimate ``S_φ(X)`` (:prf:ref:`def-word-sensitivity`) by projected gradient ascent.

    For every requested row ``i`` (default: all; a sequence of indices, never a boolean
    mask), ``starts`` searches run in one batch: the first from the authors' start ``0.1·ξ``
    (``ξ`` standard normal), the others from uniform points on the sphere ``‖Δ‖ = √d``, plus
    one search from each row of ``init`` (a vector of length ``d`` or an ``m × d`` array of
    candidate perturbations, e.g. the constructions of later chapters). Each step moves ``Δ``
    by ``lr·√d·cos``-decayed multiples of the normalised gradient of ``‖φ(X_i(Δ)) − φ(X)‖``
    and projects back onto the ball ``‖Δ‖ ≤ √d`` (:func:`project_ball`). The best iterate of
    every row is kept and its relative change recomputed in float64 (:func:`relative_change`);
    the result is the best over rows.

    ``phi`` maps a torch tensor ``(B, n, d)`` to ``(B, ...)``, each text of the batch on its
    own; set ``batched=False`` for a map that only takes a single ``(n, d)`` text. A
    :class:`wsutils.tokenwise.TokenwiseMap` (``mix(tokens(Z))``, ``tokens`` word by word) is
    checked to be one (:func:`wsutils.tokenwise.check_tokenwise`) and searched through
    ``mix`` alone, the changed word's ``tokens`` computed on its own. Before a
    batched search the map is checked to treat a batch as independent texts
    (:func:`check_batch_map`): one that mixes them (a mean over axis 0) or fails on a batch
    is a ValueError that names ``batched=False``. Every reported value is the map evaluated
    text by text, ``φ(X)`` and ``φ(X_i(Δ))`` each on its own, in float64. The search runs
    in ``search.dtype`` (default: ``X``'s dtype, float32 for half precision) and the final
    values in float64, so ``phi`` must accept both. ``X`` must have rows of norm ``√d``
    (``check_norms=False`` skips that check). Same ``seed``, same result. A float16/float32
    ``X`` is accepted: every returned ``Δ`` is float64 and every value the float64 relative
    change at that ``Δ`` (``per_row_Delta``).

    Parameters
    ----------
    phi
        The map, batched ``(B, n, d) → (B, ...)`` (or one text with ``batched=False``).
    X
        One text ``(n, d)``, real and finite.
    rows, init
        As above: the rows searched and extra starts.
    search
        The search's settings (:class:`wsutils.search.Search`: starts per row, steps, step
        size, seed, precision, batch size, progress, halving); default :data:`MAP_SEARCH`
        (``Search()`` with a bar after 5 s). For a long search, ``halving=(10, 1/3)``
        (:data:`wsutils.halving.SCHEDULE`) cuts the hopeless (row, start) searches early
        (:mod:`wsutils.halving`).
    **settings
        Fields of :class:`~wsutils.search.Search` as keywords (``starts=4, steps=50``), which
        replace those of ``search``.

    Returns
    -------
    SensitivityResult
        The best relative change found (a certified lower bound on ``S_φ(X)``), its row and
        ``Δ``, and the same per row. ``upper`` is ``None`` (a lower bound only) unless
        ``phi`` is a :class:`~wsutils.tokenwise.TokenwiseMap` that brings an
        ``upper_certificate`` (:func:`wsutils.tokenwise.softmax_attention` does): then each
        searched row's bound, checked to lie above the value found there.

    Raises
    ------
    TypeError
        If ``rows`` is a boolean mask (pass ``np.flatnonzero(mask)``: a mask read as indices
        searches rows 0 and 1) or has a non-integer entry (``1.9``), ``starts``/``steps`` is
        not an integer, or ``X`` is complex or not numeric (the imaginary part would be
        dropped).
    ValueError
        If ``X`` is not one finite ``n × d`` text with rows of norm ``√d``, the map mixes
        the texts of a batch or fails on one (with ``batched=True``), a row is out of
        range, ``init`` is neither ``(d,)`` nor ``(m, d)`` (``2d`` entries are not two
        starts), ``lr`` is NaN or not positive (the message names ``lr``), or the map returns
        NaN/inf at ``X``, a zero ``φ(X)``, or non-finite values at every iterate of a row
        (the search used to drop out and report ``value = −1.0``).
    """
    search = Search.parse(search, default=MAP_SEARCH, **settings)
    Xt, row_list, extra = search_setup(
        X, rows=rows, init=init, check_norms=check_norms, device=device
    )
    phi_b = _batched(phi, batched)
    check_map_at_door(phi, phi_b, Xt, search.work_dtype(Xt.dtype), batched=batched)
    if batched:
        check_batch_map(phi_b, Xt.to(torch.float64))
    work = search.work_dtype(Xt.dtype)
    Xs = Xt.to(work)  # Xt itself in its own dtype
    with torch.no_grad():
        base = phi_b(Xs[None])[0]  # as every text of the search: a batch entry
    objective = map_objective(phi_b, Xs, base)
    if batched and isinstance(phi, TokenwiseMap):  # a changed word goes through mix alone
        check_tokenwise(phi, Xt.to(torch.float64), BATCH_RTOL)
        objective = phi.word_objective(Xs, base, float(torch.linalg.vector_norm(base)))
    result = ascend_and_certify(
        objective,
        phi_b,
        Xs,
        Xt,
        row_list,
        search,
        extra=None if extra is None else extra.to(work),
        pair_elements=getattr(objective, "pair_elements", None),
        alone=True,
    )
    certificate = (
        getattr(phi, "upper_certificate", None) if isinstance(phi, TokenwiseMap) else None
    )
    if certificate is None:
        return result
    bounds = np.asarray(certificate(Xt.to(torch.float64).cpu(), row_list), dtype=np.float64)
    if bounds.shape != (len(row_list),):
        raise ValueError(
            f"the map's upper_certificate returned shape {bounds.shape} for {len(row_list)} "
            "rows: it must give one bound per row asked."
        )
    return result.with_upper(dict(zip(row_list, bounds.tolist())))


def _module_hint(phi) -> str:
    return (
        " For a torch module: wsutils.module_map(module) evaluates it in the precision asked "
        "for (a float64 copy for the certificate, the module untouched), or module.double() "
        "gives that copy by hand (a float32 module fails there)."
        if isinstance(phi, torch.nn.Module)
        else " Give the map float64 weights (or cast them to the input's dtype inside it)."
    )


def check_map_at_door(
    phi,
    phi_b: Map,
    Xt: torch.Tensor,
    work: torch.dtype,
    *,
    batched: bool = True,
    module=None,
) -> None:
    """Refuse, before any search, a map that cannot be measured: a torch module built with
    ``batch_first=False`` searched batched (it would read the batch axis as the words; one
    text at a time, ``batched=False``, it is read right), one in training
    mode (dropout makes it another function at every call), a map whose two evaluations of
    ``φ(X)`` differ (any randomness: a search and its certification would measure different
    maps, and the value would be wrong silently), and a map that fails in the precisions the
    estimator needs: ``work`` (the search's) and float64 (every reported value). Each is a
    ValueError that names the fix that works (``.eval()``, a float64 copy). ``module``: the
    user's own map when ``phi`` wraps it (the own-norm rescaling), read for the module checks
    and the hint; ``None``: ``phi`` itself."""
    module = phi if module is None else module
    if (
        batched
        and isinstance(module, torch.nn.Module)
        and any(getattr(m, "batch_first", True) is False for m in module.modules())
    ):
        raise ValueError(
            f"the map is a torch module that reads (n, B, d), batch_first=False "
            f"({type(module).__name__}): the estimator passes (B, n, d). Build it with "
            "batch_first=True, or wrap it: wsutils.module_map(module) reads it words first."
        )
    if isinstance(module, torch.nn.Module) and any(m.training for m in module.modules()):
        raise ValueError(
            f"the map is a torch module in training mode ({type(module).__name__}): "
            "dropout and batch statistics make it a different function at every call. "
            "Call module.eval() first (and module.train() afterwards if you need it), or "
            "measure wsutils.module_map(module), an eval-mode copy (the module untouched)."
        )
    X64 = Xt.to(torch.float64)[None]
    first = None
    for dtype in dict.fromkeys((torch.float64, work)):
        try:
            with torch.no_grad():
                out = phi(X64.to(dtype)) if batched else phi(X64[0].to(dtype))
            if not isinstance(out, torch.Tensor):
                raise TypeError(
                    f"the map returned a {type(out).__module__}.{type(out).__name__}, not a "
                    "torch tensor: the estimator differentiates it with torch autograd, so "
                    "write it with torch operations (torch.as_tensor would cut the gradient)."
                )
            out = out if batched else out[None]
        except TypeError as err:
            if "not a torch tensor" in str(err):
                raise
            return  # the batch check or the search reports it, as before this check
        except IndexError:
            return  # likewise (a map written for one text, searched batched)
        except RuntimeError as err:
            if not any(w in str(err).lower() for w in ("dtype", "double", "float", "half")):
                return  # not a precision problem: the batch check or the search reports it
            hint = (
                _module_hint(module)
                if dtype == torch.float64
                else " It works in float64: pass dtype=None to search in float64 too, or cast "
                "inside the map (lambda Z: phi(Z.double()).to(Z.dtype))."
            )
            raise ValueError(
                f"the map failed on one text in {str(dtype).removeprefix('torch.')} ({err}): "
                f"the estimator evaluates it in the search's precision "
                f"({str(work).removeprefix('torch.')}) and certifies every value in "
                f"float64.{hint}"
            ) from err
        if first is None:
            first = out.to(torch.float64)
    with torch.no_grad():
        second = phi_b(X64).to(torch.float64)
    if not bool(torch.isfinite(first).all() & torch.isfinite(second).all()):
        return  # a non-finite φ(X) is reported where the search evaluates it
    scale = float(torch.linalg.vector_norm(first))
    gap = float(torch.linalg.vector_norm(second - first))
    if not gap <= BATCH_RTOL * scale:
        raise ValueError(
            f"the map is not the same function at every call: two evaluations of φ(X) differ "
            f"by {gap:.3g} (relative {gap / scale if scale > 0 else math.inf:.3g}), so the "
            "search and its certification would measure different maps. Remove the "
            "randomness; for a torch module, call module.eval() (dropout)."
        )


#: How far apart ``φ`` of a text in a batch and ``φ`` of it alone may be, relative, for a map
#: whose batch entries are independent (:func:`check_batch_map`): the two differ only in the
#: rounding of kernels chosen by the batch's shape, at most ``γ_k ≈ k·u`` relative for a
#: computation of ``k`` roundings in a row, below ``√ε ≈ 1.5e-8`` for any ``k < 10⁷`` in
#: float64; a map that mixes a batch's texts differs by the size of the texts' differences.
BATCH_RTOL = math.sqrt(torch.finfo(torch.float64).eps)


def check_batch_map(phi_b: Map, X64: torch.Tensor) -> None:
    """Check, before a batched search, that ``phi_b`` treats a batch ``(B, n, d)`` as ``B``
    independent texts: ``φ`` of the batch ``[X, X', X'']`` (``X``, and ``X`` with its first
    and its last word moved by a fixed ``Δ`` of norm ``√d``), and of the same batch in
    reverse order, equals ``φ`` of each text alone (a batch of one), to ``BATCH_RTOL``.
    A map written for one ``(n, d)`` text that mixes a batch (a mean over axis 0, a norm over
    the whole tensor) would otherwise be searched and certified as another map; one that does
    not broadcast fails on the batch. Each is a ValueError that names ``batched=False``."""
    ends, D = probe_moves(*X64.shape)
    texts = torch.cat([X64[None], perturb(X64, ends, D)])
    hint = (
        "the estimator evaluates many texts in one batch (B, n, d); for a map written for "
        "one (n, d) text, pass batched=False. A map that reads (n, B, d) (a torch layer built "
        "with batch_first=False, or wsutils.module_map reading its layout wrong) mixes them "
        "too: build it with batch_first=True, or pass batch_first= to wsutils.module_map."
    )
    try:
        with torch.no_grad():
            alone = [phi_b(t[None]).to(torch.float64)[0] for t in texts]
            together = phi_b(texts).to(torch.float64)
            reverse = phi_b(texts.flip(0)).to(torch.float64).flip(0)
    except (RuntimeError, IndexError) as err:
        raise ValueError(f"the map failed on a batch of texts ({err}): {hint}") from err
    if together.shape[0] != len(texts) or tuple(together.shape[1:]) != tuple(alone[0].shape):
        raise ValueError(
            f"the map returned shape {tuple(together.shape)} for a batch of {len(texts)} texts "
            f"and {tuple(alone[0].shape)} for one: it keeps no batch axis; {hint}"
        )
    for b, one in enumerate(alone):
        if not bool(torch.isfinite(one).all()):
            continue  # a non-finite φ is reported where it is evaluated
        scale = float(torch.linalg.vector_norm(one))
        for other in (together[b], reverse[b]):
            if not bool(torch.isfinite(other).all()):
                continue  # likewise
            gap = float(torch.linalg.vector_norm(other - one))
            if not gap <= BATCH_RTOL * scale:
                size = f"relative {gap / scale:.3g}" if scale > 0 else "φ of it alone is 0"
                raise ValueError(
                    f"the map mixes the texts of a batch: φ of text {b} inside a batch differs "
                    f"from φ of it alone by {gap:.3g} ({size}), so a batched search would "
                    f"measure another map. {hint}"
                )


def map_objective(phi_b: Map, Xt: torch.Tensor, base: torch.Tensor):
    """The objective of :func:`ascend_rows` for the batched map ``phi_b`` at ``Xt``,
    ``base = φ(X)``: the relative change ``‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖`` through the full map
    (:prf:ref:`def-word-sensitivity`). A non-finite or zero ``φ(X)`` is a ValueError."""
    if not bool(torch.isfinite(base).all()):
        raise ValueError(
            "φ(X) has non-finite entries (NaN or inf): the relative change is "
            "undefined; check the map and its weights."
        )
    base_norm = float(torch.linalg.vector_norm(base))
    if not base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and map.")

    def objective(chunk: list[int]):
        def values(row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
            out = phi_b(perturb(Xt, row_idx, Delta))
            return _norms(out - base, len(row_idx)) / base_norm

        return values

    return objective


def ascend_and_certify(
    objective,
    phi_b: Map,
    Xs: torch.Tensor,
    Xt: torch.Tensor,
    row_list: list[int],
    search: Search,
    *,
    extra: torch.Tensor | None = None,
    row_starts: Callable[[int], torch.Tensor] | None = None,
    pair_elements: int | None = None,
    alone: bool = False,
) -> SensitivityResult:
    """The one search every estimator runs: :func:`ascend_rows` with ``objective`` on the
    search copy ``Xs`` of the text, then :func:`certify` of the iterates found, through the
    full map ``phi_b`` at ``Xt`` in float64 (``Xs`` is ``Xt`` when the search runs in ``X``'s
    own dtype). The result counts ``search.starts`` plus the rows of ``extra`` as its starts.
    Trusts its caller as :func:`ascend_rows` does.

    ``row_starts``: a function ``row ↦ (m_row × d)`` of starts for that row alone (such as the
    take-over constructions of the row, in ``Xs``'s dtype), added after ``extra``; each row's
    random starts are then seeded by ``(seed + row) mod 2**63`` (``seed``:
    ``search.start_seed(0)``), and the result counts the most of them any row had.
    ``pair_elements``: what one (row, start) pair of a step holds (:func:`ascend_rows`).
    ``alone``: certify text by text (:func:`relative_changes`).

    Returns
    -------
    SensitivityResult
        The best float64 relative change found, a certified lower bound on ``S_φ(X)``.

    Raises
    ------
    ValueError
        As :func:`ascend_rows` and :func:`certify`: every value of a row non-finite, or a
        non-finite or zero ``φ(X)``.
    """
    shared = 0 if extra is None else extra.shape[0]
    own: dict[int, int] = {}  # the number of each row's own starts

    def counted(r: int) -> torch.Tensor:
        starts = row_starts(r)
        own[r] = starts.shape[0]
        return starts

    found = ascend_rows(
        objective,
        Xs,
        row_list,
        search,
        extra=extra,
        row_starts=None if row_starts is None else counted,
        pair_elements=pair_elements,
    )
    return certify(
        phi_b, Xt, found, search, extra_starts=shared + max(own.values(), default=0), alone=alone
    )


def certify(
    phi_b: Map,
    Xt: torch.Tensor,
    found: dict[int, torch.Tensor],
    search: Search,
    *,
    extra_starts: int = 0,
    alone: bool = False,
) -> SensitivityResult:
    """The result of a search: for each row its best ``Δ`` (``found[row]``), cast to float64
    and projected onto the exact ball (a no-op unless the search dtype was coarser), and the
    float64 relative change there (``relative_changes``); ``value``/``row``/``Delta`` are the
    best of them. The result records ``search``'s steps and seed and, as its starts,
    ``search.starts + extra_starts``. ``alone``: each text through ``φ`` on its own
    (:func:`relative_changes`)."""
    n, d = Xt.shape
    X64 = Xt.to(torch.float64)
    rows = list(found)
    D64 = project_ball(torch.stack([found[r] for r in rows]).to(torch.float64).cpu(), math.sqrt(d))
    vals, phi_norm = relative_changes(
        phi_b,
        X64,
        rows,
        D64,
        max_batch_elements=search.max_batch_elements,
        with_base=True,
        alone=alone,
    )
    vals = vals.cpu()
    per_row = {r: float(vals[j]) for j, r in enumerate(rows)}
    per_Delta = {r: D64[j].numpy().copy() for j, r in enumerate(rows)}
    j = int(torch.argmax(vals))
    return SensitivityResult(
        value=per_row[rows[j]],
        row=rows[j],
        Delta=per_Delta[rows[j]],
        per_row=per_row,
        starts=search.starts + extra_starts,
        steps=search.steps,
        seed=search.start_seed(0),
        per_row_Delta=per_Delta,
        phi_norm=phi_norm,
    )


def sphere_starts(xi: torch.Tensor, radius: float) -> torch.Tensor:
    """Turn standard-normal draws ``xi`` of shape ``(..., s, d)`` into the estimators' starts,
    in place: the first is the authors' start ``0.1·ξ``, the others are uniform on the sphere
    ``‖Δ‖ = radius`` (projected onto the exact ball by the callers)."""
    radius = check_real("radius", radius, positive=True)
    if xi.ndim < 2:
        raise ValueError(f"xi must be (..., s, d), got shape {tuple(xi.shape)}.")
    xi[..., 1:, :] *= radius / row_norms(xi[..., 1:, :])
    xi[..., :1, :] *= 0.1
    return xi


def ascend(
    evaluate,
    Delta: torch.Tensor,
    *,
    steps: int,
    step,
    stop: tuple[int, float] | None = None,
    group: int | None = None,
):
    """The one projected ascent of ``wsutils``, from each row of ``Delta`` (``B × d``, starts
    already in the ball). ``evaluate(Delta)`` returns the values ``(B,)`` at ``Delta`` and a
    function that returns their gradient ``(B × d)`` there (or the gradient of any function
    increasing in each row's value: the steps use only its direction); :func:`autograd_values`
    makes one from a differentiable ``values(Delta)``, an estimator with a gradient of its own
    writes it (:func:`wsutils.estimators.rf.rf_word_sensitivity`). ``step(Delta, grad, t)``
    returns the next iterates, in the ball: :func:`cosine_step` or :func:`sphere_step`.

    Keeps each row's best value and the iterate attaining it (the best iterate, not the last;
    ``-inf`` and the start where every value was NaN). ``stop = (m, rtol)`` ends the ascent
    before ``steps`` once every search has stalled (:func:`stalled`; a search is a group of
    ``group`` consecutive rows, ``None``: all rows are one search); ``None`` takes every step.
    Trusts its caller (``steps`` a checked integer, ``stop`` checked by
    :func:`wsutils.search.check_stop`).

    Returns
    -------
    tuple of torch.Tensor
        The best value of each row and the iterate attaining it, as the steps left it (not
        projected onto the exact ball).
    """
    best_val = torch.full((Delta.shape[0],), -math.inf, dtype=Delta.dtype, device=Delta.device)
    best = Delta.detach().clone()
    trail: list[torch.Tensor] = []  # each search's best value so far, the last m + 1 steps
    for t in range(steps + 1):
        vals, gradient = evaluate(Delta)
        with torch.no_grad():
            better = vals > best_val
            best_val = torch.where(better, vals, best_val)
            best[better] = Delta[better]
        if t == steps or (stop is not None and stalled(trail, best_val, stop, group)):
            break
        grad = gradient()
        gradient = None  # the evaluation's work arrays go before the next one is made
        with torch.no_grad():
            Delta = step(Delta.detach(), grad, t)
    return best_val, best


def autograd_values(values):
    """The ``evaluate`` of :func:`ascend` for a differentiable ``values(Delta) -> (B,)``:
    the values, and their gradient by autograd (of their sum: the rows do not interact)."""

    def evaluate(Delta: torch.Tensor):
        Delta = Delta.detach().requires_grad_(True)
        vals = values(Delta)
        return vals.detach(), lambda: torch.autograd.grad(vals.sum(), Delta)[0]

    return evaluate


def _unit(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``grad`` divided by its norm, and where that is defined (a finite,
    nonzero norm; :func:`wsutils._tensor.row_norms`, without overflow)."""
    gnorm = row_norms(grad)
    ok = (gnorm > 0) & torch.isfinite(gnorm)
    return grad / gnorm.clamp_min(torch.finfo(grad.dtype).tiny), ok


def cosine_step(radius: float, lr: float, steps: int):
    """The step of :func:`cosine_ascent`: step ``t`` moves by
    ``lr·radius·(1 + cos(πt/steps))/2`` along the normalised gradient and projects back onto
    the ball (:func:`project_ball`, ``exact=False``); a row whose gradient is zero or not
    finite does not move."""

    def step(Delta: torch.Tensor, grad: torch.Tensor, t: int) -> torch.Tensor:
        eta = lr * radius * 0.5 * (1 + math.cos(math.pi * t / steps))
        finite = torch.isfinite(grad).all(dim=-1, keepdim=True)
        unit, ok = _unit(torch.where(finite, grad, torch.zeros_like(grad)))
        unit = torch.where(ok, unit, torch.zeros_like(unit))
        return project_ball(Delta + eta * unit, radius, exact=False)

    return step


def sphere_step(radius: float):
    """The step of the random-feature searches: every step lands on the sphere
    ``‖Δ‖ = radius`` along the normalised gradient (the fixed point of projected gradient
    ascent with a step much longer than the radius, as the authors' ``lr = 100`` is;
    :func:`project_ball`, ``exact=False``); a row whose gradient is zero or not finite does
    not move."""

    def step(Delta: torch.Tensor, grad: torch.Tensor, t: int) -> torch.Tensor:
        unit, ok = _unit(grad)
        moved = project_ball(radius * torch.where(ok, unit, Delta), radius, exact=False)
        return torch.where(ok, moved, Delta)

    return step


def cosine_ascent(
    values,
    Delta: torch.Tensor,
    radius: float,
    *,
    steps: int,
    lr: float,
    exact_result: bool = True,
    stop: tuple[int, float] | None = None,
    group: int | None = None,
    evaluate=None,
    tick: Callable[[], object] | None = None,
):
    """Projected gradient ascent of ``values(Delta) -> (B,)`` from each row of ``Delta``
    (``B × d``) over the ball ``‖Δ‖ ≤ radius``: :func:`ascend` with the gradient by autograd
    and :func:`cosine_step` (step ``t`` moves by ``lr·radius·(1 + cos(πt/steps))/2`` along
    the normalised gradient and projects back, ``exact=False`` between steps). Returns the
    best value of each search and the iterate attaining it (the best iterate, not the last;
    ``-inf`` and the start where every value was NaN), projected onto the exact ball
    (``exact_result=True``): a returned row can lie inside its iterate by the margin of
    :func:`ball_slack`, so callers recompute values there. ``exact_result=False`` returns the
    iterates themselves, for a caller that projects them exactly itself (in float64, with its
    smaller margin). A search whose gradient is not finite stays where it is. Minimise a loss
    by passing ``-loss``.

    ``stop = (m, rtol)`` (:func:`wsutils.search.check_stop`) ends the ascent before ``steps``
    once every search has stalled: ``b_t − b_{t−m} ≤ rtol·|b_{t−m}|`` for the best value
    ``b_t`` seen up to step ``t`` by each group of ``group`` consecutive rows of ``Delta`` (the
    starts of one search; ``None``: all rows are one search). ``None`` takes every step.

    ``evaluate``: an ``evaluate`` of :func:`ascend` for the same values with a gradient of its
    own (``Δ ↦ (values, gradient function)``), used instead of autograd's through ``values``.
    ``tick``: called once after every step (a progress bar's ``update``)."""
    steps = check_int("steps", steps, minimum=0)
    lr = check_real("lr", lr, positive=True)
    radius = check_real("radius", radius, positive=True)
    if Delta.ndim != 2:
        raise ValueError(f"Delta must be (B, d), one start per row, got {tuple(Delta.shape)}.")
    best_val, best = ascend(
        autograd_values(values) if evaluate is None else evaluate,
        Delta,
        steps=steps,
        step=cosine_step(radius, lr, steps)
        if tick is None
        else _ticked(cosine_step(radius, lr, steps), tick),
        stop=stop,
        group=group,
    )
    return best_val, project_ball(best, radius) if exact_result else best


def _ticked(step, tick):
    """``step`` that calls ``tick()`` after each step."""

    def ticked(Delta, grad, t):
        out = step(Delta, grad, t)
        tick()
        return out

    return ticked


def stalled(
    trail: list, best_val: torch.Tensor, stop: tuple[int, float], group: int | None = None
) -> bool:
    """The stopping rule of a search (:class:`wsutils.search.Search`'s ``stop = (m, rtol)``),
    called once a step: append the best value so far of each search (each group of ``group``
    consecutive entries of ``best_val``; ``None``: one search) to ``trail`` (the caller's
    list, empty at step 0) and say whether every search gained at most ``rtol``, relative,
    over the last ``m`` steps: ``b_t ≤ b_{t−m} + rtol·|b_{t−m}|``, compared in float64
    whatever the search's precision."""
    m, rtol = stop
    best = best_val.reshape(-1, group or best_val.shape[0]).amax(dim=1)
    trail.append(best.to(torch.float64, copy=True))
    if len(trail) <= m:
        return False
    b_old, b = trail.pop(0), trail[-1]
    return bool((b <= b_old + rtol * b_old.abs()).all())


def ascend_rows(
    objective,
    Xt: torch.Tensor,
    row_list: list[int],
    search: Search,
    *,
    extra: torch.Tensor | None = None,
    row_starts: Callable[[int], torch.Tensor] | None = None,
    pair_elements: int | None = None,
) -> dict[int, torch.Tensor]:
    """The projected gradient ascent shared by :func:`word_sensitivity`, the fast attention
    estimator (:func:`wsutils.estimators.self_attention.attention_word_sensitivity`) and the
    trained heads (:mod:`wsutils.trained`), for every row of ``row_list``: ``objective(chunk)``
    returns a function ``values(row_idx, Delta) -> (B,)`` of relative changes for the rows of
    ``chunk``, maximised by :func:`cosine_ascent`, ``search.steps`` steps of size
    ``search.lr``, stopped early by ``search.stop`` once every row of a chunk has stalled.

    Each row's starts: ``search.starts`` random ones (:func:`sphere_starts`), then ``extra``,
    then ``row_starts(row)`` when given (a function ``row ↦ (m_row × d)``, such as the row's
    take-over constructions). The random starts of every row are drawn at once from one
    generator seeded ``search.start_seed(0)``; with ``row_starts``, each row's from its own,
    seeded ``(search.start_seed(0) + row) mod 2**63``. So the chunks do not change the starts.
    They are drawn start by start (the first start of every row, then the second, …), so a
    search with more starts begins with the smaller one's: the starts are nested. With the
    same steps, no halving and no stopping rule (both decide from the best values of all the
    starts), more starts never find less, up to the rounding of the same paths computed in
    batches of another shape (a float32 path can then drift).

    The rows are searched together, as many a chunk as keep a step within
    ``search.max_batch_elements`` entries, each (row, start) pair taking ``pair_elements``
    (default ``n·d``, a perturbed text through the full map; the fast objectives hold
    ``O(n + d)`` a pair). Searches never interact: each row's steps are those it takes alone.
    A row with fewer starts than the most of its chunk repeats its last one (the same path,
    so the same best iterate). With ``search.halving`` every row is one chunk, evaluated
    ``max_batch_elements // pair_elements`` searches at a time, and only the best searches
    go on after each cut (:func:`wsutils.halving.halving_ascent`); a row whose every search
    was cut keeps its best iterate so far. Trusts its caller: ``Xt``, ``row_list`` and ``extra`` as
    :func:`search_setup` returns them, ``search`` a checked :class:`~wsutils.search.Search`.

    Returns
    -------
    dict
        For each row, the best iterate over its starts (on the CPU, in the search dtype, not
        yet on the exact ball: :func:`certify` projects it in float64).

    Raises
    ------
    ValueError
        If every value of a row was NaN or infinite.
    """
    n, d = Xt.shape
    radius = math.sqrt(d)
    starts = _row_starts(Xt, row_list, search, extra, row_starts)
    S = max(st.shape[0] for st in starts.values())
    per_pair = n * d if pair_elements is None else pair_elements
    if search.halving is not None:  # every row at once, the hopeless searches cut
        chunks = [row_list]
    else:
        rows_per_chunk = max(1, search.max_batch_elements // (S * per_pair))
        chunks = [
            row_list[j : j + rows_per_chunk] for j in range(0, len(row_list), rows_per_chunk)
        ]
    found: dict[int, torch.Tensor] = {}
    # progress counts steps (a chunk of many rows can take minutes): one tick a step; with
    # halving it counts evaluations, the work the cuts leave (passes), so that the time left
    # is not that of every search run to the end
    if search.halving is None:
        total, unit = len(chunks) * max(search.steps, 1), "step"
    else:
        total = passes(len(row_list) * S, search.steps, search.halving, S)
        unit = "pass"
    bar = tqdm(total=total, desc="word sensitivity", unit=unit, leave=False, **search.bar())
    tick = None if bar.disable else bar.update
    for c, chunk in enumerate(chunks):
        Delta = torch.cat([_padded(starts[r], S) for r in chunk])
        Delta = project_ball(Delta, radius, exact=False)
        row_idx = torch.tensor(chunk, device=Xt.device).repeat_interleave(S)
        values = objective(chunk)
        own = getattr(values, "evaluate", None)  # a gradient written out (fast objectives)
        if search.halving is None:
            best_val, best_Delta = cosine_ascent(
                lambda D: values(row_idx, D),
                Delta,
                radius,
                steps=search.steps,
                lr=search.lr,
                exact_result=False,
                stop=search.stop,
                group=S,
                evaluate=None if own is None else (lambda D: own(row_idx, D)),
                tick=tick,
            )
        else:
            best_val, best_Delta = _halving(values, own, row_idx, Delta, search, S, per_pair, tick)
        if search.halving is None:
            bar.update((c + 1) * max(search.steps, 1) - bar.n)  # a chunk stopped by ``stop``
        elif tick is not None and bar.n < total:  # stopped early: the bar ends at the work done
            bar.total = bar.n
        if not bar.disable and bar.format_dict["elapsed"] >= bar.delay:
            bar.refresh()  # the chunk's last count shown (update shows at most 10 a second)
        found.update(_best_of_rows(chunk, best_val, best_Delta, S))
    bar.close()
    return found


def _halving(values, own, row_idx, Delta, search: Search, S: int, per_pair: int, tick):
    """:func:`ascend_rows`'s searches with ``search.halving``
    (:func:`wsutils.halving.halving_ascent`): the same steps and stopping rule as
    :func:`cosine_ascent`, evaluated ``max_batch_elements // per_pair`` searches at a time, and
    for a full map (no gradient of its own) at most :data:`wsutils.halving.EVAL_ELEMENTS`
    entries a chunk."""
    radius = math.sqrt(Delta.shape[1])
    limit = search.max_batch_elements  # a full map's chunk also fits in cache:
    if own is None:
        limit = min(limit, EVAL_ELEMENTS)

    def evaluate(idx: torch.Tensor, D: torch.Tensor):
        if own is not None:
            return own(row_idx[idx], D)
        return autograd_values(lambda DD: values(row_idx[idx], DD))(D)

    trail: list[torch.Tensor] = []
    return halving_ascent(
        evaluate,
        Delta,
        steps=search.steps,
        step=cosine_step(radius, search.lr, search.steps),
        halving=search.halving,
        floor=S,
        chunk=max(1, limit // per_pair),
        stalled=None if search.stop is None else (lambda b: stalled(trail, b, search.stop, S)),
        tick=tick,
    )


def _best_of_rows(chunk: list[int], best_val, best_Delta, S: int) -> dict[int, torch.Tensor]:
    """Each row's best iterate over its ``S`` searches (consecutive in ``best_val``), on the
    CPU; a row whose best value is ``+inf`` or every value non-finite is a ValueError."""
    vals = best_val.reshape(len(chunk), S).cpu()
    blown = [r for j, r in enumerate(chunk) if bool((vals[j] == math.inf).any())]
    if blown:
        raise ValueError(
            f"the map's relative change was +inf at some iterate of rows {blown} (φ "
            "overflowed, or grew without bound, at a Δ in the ball), so no finite best "
            "value exists there: evaluate the map in float64, or rescale it."
        )
    lost = [r for j, r in enumerate(chunk) if not bool(torch.isfinite(vals[j]).any())]
    if lost:
        raise ValueError(
            f"the map gave non-finite values (NaN or inf) at every iterate of "
            f"rows {lost}: no relative change could be measured there."
        )
    found = {}
    for j, r in enumerate(chunk):
        k = j * S + int(torch.argmax(torch.nan_to_num(vals[j], nan=-math.inf)))
        found[r] = best_Delta[k].detach().cpu()
    return found


def _row_starts(Xt, row_list, search, extra, row_starts) -> dict[int, torch.Tensor]:
    """Every row's starts for :func:`ascend_rows`, ``(S_row × d)`` in ``Xt``'s dtype and
    device."""
    d, radius = Xt.shape[1], math.sqrt(Xt.shape[1])
    seed = search.start_seed(0)

    def draw(g: torch.Generator, R: int) -> torch.Tensor:
        # one draw a start (start j of every row before start j + 1 of any), so a search with
        # more starts draws the smaller one's first, whatever R·d (one draw of all the starts
        # would not do: torch fills a draw whose size is not a multiple of 16 differently)
        xi = torch.stack(
            [torch.randn(R, d, generator=g, dtype=torch.float64) for _ in range(search.starts)],
            dim=1,
        )  # (R, starts, d)
        return sphere_starts(xi, radius).to(device=Xt.device, dtype=Xt.dtype)

    if row_starts is None:
        random = dict(zip(row_list, draw(torch.Generator().manual_seed(seed), len(row_list))))
    else:
        seeds = {r: (seed + r) % 2**63 for r in row_list}  # each row its own generator
        random = {r: draw(torch.Generator().manual_seed(seeds[r]), 1)[0] for r in row_list}
    out = {}
    for r in row_list:
        parts = [random[r]] + ([] if extra is None else [extra])
        if row_starts is not None:
            parts.append(row_starts(r))
        out[r] = torch.cat(parts)
    return out


def _padded(starts: torch.Tensor, S: int) -> torch.Tensor:
    """``starts`` with its last row repeated up to ``S`` rows."""
    missing = S - starts.shape[0]
    return starts if missing == 0 else torch.cat([starts, starts[-1:].expand(missing, -1)])
