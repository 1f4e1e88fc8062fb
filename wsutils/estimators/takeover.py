"""The take-over constructions of the attention chapters and what they certify.

- :func:`row_takeover` and :func:`key_takeover` build explicit perturbations ``Δ`` with
  ``‖Δ‖ ≤ √d`` (:prf:ref:`def-takeover`); :func:`takeover_candidates` stacks them with a few
  blends; :func:`certified_lower_bound` is the best relative change attained by every
  construction the book proves something for (these, the doubling ``Δ = x_i`` and, for ReLU
  attention, the orthogonal take-over), a certified lower bound on ``S(X)``.
- :func:`takeover_certificate` computes every quantity of :prf:ref:`thm-raf-high` (margin,
  self-weight, ``κ(X) = ‖X‖_op/√d``, ``‖A‖_F``) and the lower bound the theorem proves;
  :func:`row_competition` the part of it the take-over's own row decides.

The constructions take any normalisation of eq. :eq:`eq-general-attention` (``normalisation``:
anything :meth:`wsutils.maps.Normalisation.parse` reads). The eigenvector of ``(W + Wᵀ)/2``
and the orthogonal take-over points are cached, keyed on the exact ``W`` (and ``X``, row)
they come from. Every ``Δ`` lies in the ball exactly (:func:`wsutils.sensitivity.project_ball`)
and every certified value is computed in float64 whatever the input's dtype. The fast
estimator that starts from these constructions is
:func:`wsutils.estimators.self_attention.attention_word_sensitivity`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from .._tensor import Array, like
from ..checks import as_tensor, as_text, check_shape, check_unit_rows
from ..maps import Normalisation, attention_scores, general_attention, softmax_attention
from ..sensitivity import check_rows, project_ball, relative_changes, search_dtype
from .relu import orthogonal_points
from .softmax_upper import sym_eigh

__all__ = [
    "row_takeover",
    "key_takeover",
    "takeover_candidates",
    "word_constructions",
    "certified_lower_bound",
    "TakeoverCertificate",
    "takeover_certificate",
    "row_competition",
]


def prepare(X: Array, W: Array, device=None, check_norms: bool = False):
    """Validate ``(X, W)`` once: ``X`` a finite real ``n × d`` text (rows of norm ``√d`` if
    ``check_norms``, checked in its own dtype), returned as a tensor in its search dtype
    (:func:`wsutils.sensitivity.search_dtype`); ``W`` a finite ``d × d`` matrix."""
    Xt, n, d = as_text(X, device=device)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if check_norms:
        check_unit_rows(Xt)
    Xt = Xt.to(search_dtype(Xt.dtype))
    return Xt, search_weights(W, Xt), n, d


def search_weights(W: Array, Xt: torch.Tensor) -> torch.Tensor:
    """The search's copy of ``W``: in ``Xt``'s dtype (rounded if ``W`` is wider)."""
    return caller_weights(W, Xt).to(Xt.dtype)


def caller_weights(W: Array, Xt: torch.Tensor) -> torch.Tensor:
    """The caller's ``W`` in float64 (exact from its own dtype), on ``Xt``'s device: every
    certified value and every take-over uses it, never the search's rounded copy."""
    d = Xt.shape[1]
    Wt = as_tensor(W, device=Xt.device, name="W")
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    return Wt.to(torch.float64)


def one_row(row, n: int) -> int:
    """``row`` checked as one index of a text of ``n`` words (``check_rows``)."""
    rows = check_rows(row, n)
    if len(rows) != 1:
        raise ValueError(f"row must be a single row index, got {rows}.")
    return rows[0]


def kernel(norm: Normalisation):
    """The map ``(X, W) ↦ φ(X)`` of ``norm`` (trusted input); for softmax (``β = 1``) and
    ReLU attention it returns the very floats of :func:`wsutils.maps.raf` and
    :func:`wsutils.maps.relu_attention`."""
    return lambda X, W: general_attention(X, W, norm)


def _top_eigvec(W: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Top eigenpair of ``(W + Wᵀ)/2``, in float64 (:func:`sym_eigh`)."""
    evals, evecs = sym_eigh(W)
    return float(evals[-1]), evecs[:, -1].clone()


def _row_takeover(Xt: torch.Tensor, Wt: torch.Tensor, i: int) -> torch.Tensor:
    d = Xt.shape[1]
    _, u = _top_eigvec(Wt)
    if float(u @ Xt[i].to(torch.float64)) < 0:
        u = -u
    return project_ball((math.sqrt(d) * u[None]).to(Xt.dtype), math.sqrt(d))[0]


def _key_takeover(Xt: torch.Tensor, Wt: torch.Tensor, i: int) -> torch.Tensor:
    d = Xt.shape[1]
    v = Wt.to(torch.float64).T @ Xt.to(torch.float64).mean(dim=0)
    norm = float(torch.linalg.vector_norm(v))
    if norm == 0:
        raise ValueError(
            "Wᵀx̄ = 0 (the mean row is in the kernel of Wᵀ): the key take-over "
            "has no direction; use row_takeover instead."
        )
    return project_ball((math.sqrt(d) * v[None] / norm).to(Xt.dtype), math.sqrt(d))[0]


def row_takeover(X: Array, W: Array, row: int) -> Array:
    """The row take-over ``Δ = √d·u`` (:prf:ref:`def-takeover`): ``u`` is a unit top
    eigenvector of ``(W + Wᵀ)/2`` (computed in float64), with the sign that makes
    ``uᵀx_row ≥ 0``; projected onto the exact ball. Returned in ``X``'s search dtype."""
    Xt, Wt, n, d = prepare(X, W)
    return like(_row_takeover(Xt, caller_weights(W, Xt), one_row(row, n)), X)


def key_takeover(X: Array, W: Array, row: int) -> Array:
    """The key take-over ``Δ = √d·Wᵀx̄/‖Wᵀx̄‖`` (:prf:ref:`def-takeover`), ``x̄`` the mean row of
    ``X``: it raises the score of key ``row`` in every query row at once."""
    Xt, Wt, n, d = prepare(X, W)
    return like(_key_takeover(Xt, caller_weights(W, Xt), one_row(row, n)), X)


def _takeover_candidates(Xt, Wt, i, blends=(0.25, 0.5, 0.75)) -> torch.Tensor:
    d = Xt.shape[1]
    r = _row_takeover(Xt, Wt, i).to(torch.float64)
    k = _key_takeover(Xt, Wt, i).to(torch.float64)
    cands = [r, -r, k]
    for t in blends:
        v = (1 - t) * r + t * k
        cands.append(v * math.sqrt(d) / torch.linalg.vector_norm(v).clamp_min(1e-300))
    return project_ball(torch.stack(cands).to(Xt.dtype), math.sqrt(d))


def takeover_candidates(
    X: Array, W: Array, row: int, blends: Sequence[float] = (0.25, 0.5, 0.75)
) -> Array:
    """The constructions of :prf:ref:`def-takeover` as an ``m × d`` array: the row take-over
    (both signs of ``u``), the key take-over, and for each ``t`` in ``blends`` the direction
    ``(1 − t)·Δ_row + t·Δ_key`` rescaled to norm ``√d``. Every row lies in the ball exactly."""
    Xt, Wt, n, d = prepare(X, W)
    blends = tuple(blends)
    if not all(isinstance(t, numbers.Real) and math.isfinite(t) for t in blends):
        raise ValueError(f"blends must be finite real numbers, got {blends}.")
    return like(_takeover_candidates(Xt, caller_weights(W, Xt), one_row(row, n), blends), X)


def word_constructions(Xt: torch.Tensor, Wt: torch.Tensor) -> torch.Tensor:
    """The first seven rows of ``constructions`` for **every** word at once, an
    ``n × 7 × d`` array in ``Xt``'s dtype: the take-over candidates of :prf:ref:`def-takeover`
    (:func:`takeover_candidates`; they depend on the word only through the sign of
    ``uᵀx_i``, so they are built twice, once per sign) and the doubling ``Δ = x_i`` of
    :prf:ref:`prop-norm-double`. Row ``i`` equals ``constructions(Xt, Wt, i, norm)[:7]``
    (ReLU attention's orthogonal take-over points, a decomposition per word, are left out)."""
    n, d = Xt.shape
    _, u = _top_eigvec(Wt)
    plus = Xt.to(torch.float64) @ u >= 0  # the sign _row_takeover gives each word
    by_sign = {}
    for sign in (True, False):
        hits = torch.nonzero(plus == sign)
        if hits.numel():
            by_sign[sign] = _takeover_candidates(Xt, Wt, int(hits[0, 0]))
    shared = torch.stack([by_sign[bool(p)] for p in plus.tolist()]) if n else Xt[:0, None]
    double = project_ball(Xt.clone(), math.sqrt(d))[:, None]
    return torch.cat([shared, double], dim=1)


def constructions(Xt: torch.Tensor, Wt: torch.Tensor, i: int, norm: Normalisation) -> torch.Tensor:
    """Every explicit ``Δ`` the book proves something for at row ``i``, as an ``m × d`` array
    in the exact ball, in ``Xt``'s dtype: the take-over candidates of :prf:ref:`def-takeover`
    (:func:`takeover_candidates`), the doubling ``Δ = x_i`` of :prf:ref:`prop-norm-double`,
    and for ReLU attention the orthogonal take-over points of :prf:ref:`prop-relu-takeover`
    (``y = 2c`` and ``y = c + ‖c‖e`` with a positive self-score, computed in float64;
    none where ``K_i = {0}``, i.e. typically ``n − 1 ≥ d``)."""
    d = Xt.shape[1]
    cands = [_takeover_candidates(Xt, Wt, i), project_ball(Xt[i : i + 1].clone(), math.sqrt(d))]
    if norm.name == "relu":
        points = _orthogonal_cached(Xt.to(torch.float64), Wt.to(torch.float64), i)
        if points is not None:
            cands.append(project_ball(points.to(Xt.dtype), math.sqrt(d)))
    return torch.cat(cands)


_ORTHO_CACHE: list = []  # [(X64, W64, i, points)], the last _ORTHO_KEEP rows asked for
_ORTHO_KEEP = 4


def _orthogonal_cached(X64: torch.Tensor, W64: torch.Tensor, i: int):
    """The orthogonal take-over points of row ``i`` as a ``m × d`` float64 tensor (``None``
    where the construction does not apply), from
    :func:`wsutils.estimators.relu._orthogonal_points` (an SVD, ``O(d²·n + d³)``). The last
    few results are kept and reused when ``X``, ``W`` and ``i`` equal a kept key exactly
    (``O(n·d + d²)`` comparisons): :func:`certified_lower_bound` and the search's starts ask
    for the same rows."""
    for Xk, Wk, ik, pts in _ORTHO_CACHE:
        if (
            ik == i
            and Xk.shape == X64.shape
            and Wk.shape == W64.shape
            and Xk.device == X64.device
            and torch.equal(Xk, X64)
            and torch.equal(Wk, W64)
        ):
            return None if pts is None else pts.clone()
    try:
        _, points = orthogonal_points(X64, W64, i)
    except ValueError:
        points = []
    pts = torch.stack([D for _, D in points]) if points else None
    _ORTHO_CACHE[:] = (_ORTHO_CACHE + [(X64.clone(), W64.clone(), i, pts)])[-_ORTHO_KEEP:]
    return None if pts is None else pts.clone()


def certified_lower_bound(
    X: Array, W: Array, row: int, *, normalisation: str | Normalisation = "raf"
) -> float:
    """The best certificate the book proves for ``normalisation`` at word ``row``:
    ``max_Δ ‖φ(X_row(Δ)) − φ(X)‖/‖φ(X)‖`` over every construction below, the
    row and key take-overs and their blends (:func:`takeover_candidates`,
    :prf:ref:`def-takeover`), the doubling ``Δ = x_row`` (:prf:ref:`prop-norm-double`) and,
    for ReLU attention, the orthogonal take-over (:prf:ref:`prop-relu-takeover`,
    :func:`wsutils.estimators.relu.relu_orthogonal_takeover`). Each is an explicit ``Δ`` in
    the ball, so the value is a certified lower bound on ``S_φ(X)``
    (:prf:ref:`def-word-sensitivity`), at least each construction's own relative change.
    ``normalisation`` is ``"raf"`` (eq. :eq:`eq-raf`), ``"relu"``
    (eq. :eq:`eq-relu-attention`) or any other of eq. :eq:`eq-general-attention`
    (:meth:`wsutils.maps.Normalisation.parse`).
    Everything is computed in float64, whatever the dtype of ``X`` and ``W``.

    Returns
    -------
    float
        The certified lower bound.

    Raises
    ------
    TypeError
        If ``X``/``W`` is complex or not numeric, or ``row`` is not an integer.
    ValueError
        If ``X`` is not one finite ``n × d`` text, ``W`` not a finite ``d × d`` matrix,
        ``row`` is out of range, or ``normalisation`` unknown.
    """
    norm = Normalisation.parse(normalisation)
    fn = kernel(norm)
    Xt, Wt, n, d = prepare(X, W)
    i = one_row(row, n)
    X64, W64 = Xt.to(torch.float64), caller_weights(W, Xt)  # the caller's W, not Wt
    cands = constructions(X64, W64, i, norm)
    vals = relative_changes(lambda Z: fn(Z, W64), X64, [i] * cands.shape[0], cands)
    return float(vals.max())


@dataclass
class TakeoverCertificate:
    """The quantities of :prf:ref:`thm-raf-high` for one row and the row take-over.

    ``lam``: top eigenvalue of ``(W+Wᵀ)/2``; ``self_score``: ``s'_ii``; ``lse_others``:
    ``log Σ_{j≠i} exp s'_ij``; ``margin = self_score − lse_others``; ``self_weight`` ``a'_ii``;
    ``kappa = ‖X‖_op/√d``; ``A_fro = ‖A‖_F`` and ``a_row = ‖a_i‖`` (unperturbed attention);
    ``bound``: the lower bound on ``S_RAF(X)`` proved in the theorem (may be negative, i.e.
    vacuous); ``exact``: the relative change the row take-over actually attains.
    """

    lam: float
    self_score: float
    lse_others: float
    margin: float
    self_weight: float
    kappa: float
    A_fro: float
    a_row: float
    bound: float
    exact: float


def _row_competition(Xt: torch.Tensor, Wt: torch.Tensor, i: int) -> dict:
    """The competition in row ``i`` after its row take-over (:prf:ref:`def-takeover`), float64
    ``Xt``, ``Wt`` (trusted): ``lam`` (top eigenvalue of ``(W+Wᵀ)/2``), ``Delta``,
    ``self_score`` ``s'_ii``, ``lse_others`` ``log Σ_{j≠i} exp s'_ij``, ``margin`` and
    ``self_weight`` ``a'_ii`` (:prf:ref:`thm-raf-high`). Only row ``i`` of the new scores is
    formed, ``(x'_iᵀ W) X'ᵀ/√d``: ``O(n·d)`` after the ``O(d³)`` eigenvector."""
    n, d = Xt.shape
    lam, _ = _top_eigvec(Wt)
    Delta = _row_takeover(Xt, Wt, i)
    Xp = Xt.clone()
    Xp[i] += Delta
    s = (Xp[i] @ Wt) @ Xp.T / math.sqrt(d)  # row i of attention_scores(Xp, W)
    others = torch.cat([s[:i], s[i + 1 :]])
    lse = float(torch.logsumexp(others, 0)) if n > 1 else -math.inf
    return {
        "lam": lam,
        "Delta": Delta,
        "self_score": float(s[i]),
        "lse_others": lse,
        "margin": float(s[i]) - lse,
        "self_weight": float(torch.softmax(s, 0)[i]),
    }


def row_competition(X: Array, W: Array, row: int) -> dict:
    """The part of :func:`takeover_certificate` that the row take-over's own row decides:
    ``lam``, ``self_score``, ``lse_others``, ``margin`` and ``self_weight`` (the same floats
    as the certificate's fields), in ``O(n·d + d³)`` and float64, without ``κ``, ``‖A‖_F``,
    the bound and the relative change (each an ``n × n`` product or an SVD)."""
    Xt, Wt, n, d = prepare(X, W, check_norms=True)
    c = _row_competition(Xt.to(torch.float64), caller_weights(W, Xt), one_row(row, n))
    del c["Delta"]
    return c


def takeover_certificate(X: Array, W: Array, row: int) -> TakeoverCertificate:
    """Evaluate :prf:ref:`thm-raf-high` at ``(X, W, row)``, in float64:
    ``S ≥ [(1+√2)·a'_ii − 1 − κ‖a_i‖] / (κ‖A‖_F)`` with ``a'_ii = 1/(1 + e^{−margin})``
    (the margin from :func:`row_competition`)."""
    Xt, Wt, n, d = prepare(X, W, check_norms=True)
    i = one_row(row, n)
    Xt, Wt = Xt.to(torch.float64), caller_weights(W, Xt)  # the caller's W, not rounded
    c = _row_competition(Xt, Wt, i)
    Delta, a_self = c["Delta"], c["self_weight"]
    A = torch.softmax(attention_scores(Xt, Wt), dim=-1)
    kappa = float(torch.linalg.matrix_norm(Xt, ord=2)) / math.sqrt(d)
    A_fro = float(torch.linalg.matrix_norm(A))
    a_row = float(torch.linalg.vector_norm(A[i]))
    bound = ((1 + math.sqrt(2)) * a_self - 1 - kappa * a_row) / (kappa * A_fro)
    exact = float(relative_changes(lambda Z: softmax_attention(Z, Wt), Xt, [i], Delta[None])[0])
    return TakeoverCertificate(
        lam=c["lam"],
        self_score=c["self_score"],
        lse_others=c["lse_others"],
        margin=c["margin"],
        self_weight=a_self,
        kappa=kappa,
        A_fro=A_fro,
        a_row=a_row,
        bound=bound,
        exact=exact,
    )
