"""Attention-specific word sensitivity: the take-over constructions, the certificate of
:prf:ref:`thm-raf-high`, and a fast estimator for RAF and ReLU attention.

- :func:`row_takeover` and :func:`key_takeover` build explicit perturbations ``Δ`` with
  ``‖Δ‖ ≤ √d`` (:prf:ref:`def-takeover`); :func:`takeover_candidates` stacks them with a few
  blends; :func:`certified_lower_bound` is the best relative change attained by every
  construction the book proves something for (these, the doubling ``Δ = x_i`` and, for ReLU
  attention, the orthogonal take-over), a certified lower bound on ``S(X)``.
- :func:`takeover_certificate` computes every quantity of :prf:ref:`thm-raf-high` (margin,
  self-weight, ``κ(X) = ‖X‖_op/√d``, ``‖A‖_F``) and the lower bound the theorem proves.
- :func:`attention_word_sensitivity` runs the search of
  :func:`wsutils.sensitivity.word_sensitivity` (same starts, steps and step sizes, so the same
  answer up to rounding), but evaluates ``φ(X_i(Δ)) − φ(X)`` in ``O(n·d)`` per start and step:
  a change of row ``i`` touches only row ``i`` and column ``i`` of the score matrix, so every
  other output row is a two-point mixture of cached quantities (``_FastObjective``),
  evaluated without cancellation for every score scale.

``normalisation`` is anything :meth:`wsutils.maps.Normalisation.parse` reads: the paper's
``"raf"`` (softmax) and ``"relu"``, any other row normalisation of the normalisation chapter
(eq. :eq:`eq-general-attention`) by name, dict or :class:`wsutils.maps.Normalisation`: the
constructions, the certified bound and the fast estimator take any of them.

Every ``Δ`` returned lies in the ball exactly (:func:`wsutils.sensitivity.project_ball`) and
every certified value is computed in float64 whatever the input's dtype.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from .._tensor import Array, as_tensor, like, pow2_above
from ..checks import check_shape, check_text, check_unit_rows
from ..maps import (
    Normalisation,
    attention_scores,
    general_attention,
    normalise_scores,
    softmax_attention,
    sparsemax_threshold,
)
from ..search import Search
from ..sensitivity import (
    SensitivityResult,
    ascend_and_certify,
    check_rows,
    project_ball,
    relative_changes,
    search_dtype,
    search_setup,
)
from .relu import _orthogonal_points

__all__ = [
    "row_takeover",
    "key_takeover",
    "takeover_candidates",
    "certified_lower_bound",
    "TakeoverCertificate",
    "takeover_certificate",
    "row_competition",
    "attention_word_sensitivity",
]


def _prepare(X: Array, W: Array, device=None, check_norms: bool = False):
    """Validate ``(X, W)`` once: ``X`` a finite real ``n × d`` text (rows of norm ``√d`` if
    ``check_norms``, checked in its own dtype), returned as a tensor in its search dtype
    (:func:`wsutils.sensitivity.search_dtype`); ``W`` a finite ``d × d`` matrix."""
    Xt = as_tensor(X, device=device, name="X")
    n, d = check_text(Xt)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if check_norms:
        check_unit_rows(Xt)
    Xt = Xt.to(search_dtype(Xt.dtype))
    return Xt, _weights(W, Xt), n, d


def _weights(W: Array, Xt: torch.Tensor) -> torch.Tensor:
    """The search's copy of ``W``: in ``Xt``'s dtype (rounded if ``W`` is wider)."""
    return _weights64(W, Xt).to(Xt.dtype)


def _weights64(W: Array, Xt: torch.Tensor) -> torch.Tensor:
    """The caller's ``W`` in float64 (exact from its own dtype), on ``Xt``'s device: every
    certified value and every take-over uses it, never the search's rounded copy."""
    d = Xt.shape[1]
    Wt = as_tensor(W, device=Xt.device, name="W")
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    return Wt.to(torch.float64)


def _one_row(row, n: int) -> int:
    rows = check_rows(row, n)
    if len(rows) != 1:
        raise ValueError(f"row must be a single row index, got {rows}.")
    return rows[0]


def _kernel(norm: Normalisation):
    """The map ``(X, W) ↦ φ(X)`` of ``norm`` (trusted input); for softmax (``β = 1``) and
    ReLU attention it returns the very floats of :func:`wsutils.maps.raf` and
    :func:`wsutils.maps.relu_attention`."""
    return lambda X, W: general_attention(X, W, norm)


_EIG_CACHE: list = []  # [(a float64 copy of the last W, (λ, u))]


def _top_eigvec(W: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Top eigenpair of ``(W + Wᵀ)/2``, in float64. The last result is cached and reused when
    ``W`` equals the last matrix exactly (an ``O(d²)`` comparison against the ``O(d³)``
    eigendecomposition, which the take-over constructions ask for several times per text)."""
    W64 = W.to(torch.float64)
    cached = _EIG_CACHE[0] if _EIG_CACHE else None  # read the entry once
    if (
        cached is not None
        and cached[0].shape == W64.shape
        and cached[0].device == W64.device
        and torch.equal(cached[0], W64)
    ):
        lam, u = cached[1]
        return lam, u.clone()
    evals, evecs = torch.linalg.eigh((W64 + W64.T) / 2)
    out = (float(evals[-1]), evecs[:, -1])
    _EIG_CACHE[:] = [(W64.clone(), (out[0], out[1].clone()))]
    return out


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
    Xt, Wt, n, d = _prepare(X, W)
    return like(_row_takeover(Xt, _weights64(W, Xt), _one_row(row, n)), X)


def key_takeover(X: Array, W: Array, row: int) -> Array:
    """The key take-over ``Δ = √d·Wᵀx̄/‖Wᵀx̄‖`` (:prf:ref:`def-takeover`), ``x̄`` the mean row of
    ``X``: it raises the score of key ``row`` in every query row at once."""
    Xt, Wt, n, d = _prepare(X, W)
    return like(_key_takeover(Xt, _weights64(W, Xt), _one_row(row, n)), X)


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
    Xt, Wt, n, d = _prepare(X, W)
    blends = tuple(blends)
    if not all(isinstance(t, numbers.Real) and math.isfinite(t) for t in blends):
        raise ValueError(f"blends must be finite real numbers, got {blends}.")
    return like(_takeover_candidates(Xt, _weights64(W, Xt), _one_row(row, n), blends), X)


def _constructions(
    Xt: torch.Tensor, Wt: torch.Tensor, i: int, norm: Normalisation
) -> torch.Tensor:
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
        _, points = _orthogonal_points(X64, W64, i)
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
    fn = _kernel(norm)
    Xt, Wt, n, d = _prepare(X, W)
    i = _one_row(row, n)
    X64, W64 = Xt.to(torch.float64), _weights64(W, Xt)  # the caller's W, not Wt
    cands = _constructions(X64, W64, i, norm)
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
    Xt, Wt, n, d = _prepare(X, W, check_norms=True)
    c = _row_competition(Xt.to(torch.float64), _weights64(W, Xt), _one_row(row, n))
    del c["Delta"]
    return c


def takeover_certificate(X: Array, W: Array, row: int) -> TakeoverCertificate:
    """Evaluate :prf:ref:`thm-raf-high` at ``(X, W, row)``, in float64:
    ``S ≥ [(1+√2)·a'_ii − 1 − κ‖a_i‖] / (κ‖A‖_F)`` with ``a'_ii = 1/(1 + e^{−margin})``
    (the margin from :func:`row_competition`)."""
    Xt, Wt, n, d = _prepare(X, W, check_norms=True)
    i = _one_row(row, n)
    Xt, Wt = Xt.to(torch.float64), _weights64(W, Xt)  # the caller's W, not rounded
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


def _entmax_threshold(
    z: torch.Tensor, alpha: float, iters: int = 64, k: int = 128
) -> torch.Tensor:
    """A lower bound of ``τ`` with ``Σ_l [(α−1)z_l − τ]_+^{1/(α−1)} = 1`` along the last axis,
    keepdim (``−inf`` entries allowed), by bisection on the ``k`` largest entries of each row.

    The threshold is non-decreasing in every entry, and dropping an entry is lowering it to
    ``−inf``: so the threshold of the ``k`` largest entries is at most that of the whole row
    (equal to it when the support has at most ``k`` entries, as for every row of the
    chapter's texts but a few). Every bisection iterate ``lo`` has mass ``≥ 1``, so
    ``lo ≤ τ`` up to the rounding of that sum; the bisection runs on ``(α−1)(z − max z)``
    (translation invariance), so 64 halvings of the bracket ``[−1, −n^{1−α}]`` reach one
    ulp of 1 whatever ``(α−1)·max z``; ``(α−1)·max z`` is added back at the end.
    Cost ``O(n·k·iters)`` for ``n`` rows, instead of ``O(n²·iters)``."""
    top = z.amax(dim=-1, keepdim=True)
    zz = (alpha - 1) * (z - top)  # shifted: the bisection keeps its digits at any α
    n = z.shape[-1]
    if k < n:
        zz = torch.topk(zz, k, dim=-1).values
    lo, hi = torch.full_like(top, -1.0), torch.full_like(top, -(float(n) ** (1 - alpha)))
    for _ in range(iters):
        mid = (lo + hi) / 2
        mass = torch.clamp(zz - mid, min=0).pow(1 / (alpha - 1)).sum(dim=-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    return lo + (alpha - 1) * top


def _support_floor(s: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    """Per row ``j`` a value ``f_j`` (keepdim) such that after *any* change of one entry ``i``
    of the row, no key ``k ≠ i`` with ``s_jk ≤ f_j`` carries weight (sparsemax, entmax,
    hardmax of the already scaled scores ``s``).

    The threshold ``τ`` of sparsemax/entmax is non-decreasing in every entry and symmetric, so
    changing entry ``i`` (at worst removing it) leaves it at least the threshold of the row with
    its *largest* entry removed: ``f_j`` is that threshold (in score units). For hardmax the new
    maximum is at least the second largest entry, which is ``f_j``. A one-word row has only its
    own key: ``f = s − 1``."""
    n = s.shape[-1]
    if n == 1:
        return s - 1
    top = s.argmax(dim=-1, keepdim=True)
    rest = s.scatter(-1, top, -math.inf)  # the row without its largest entry
    if norm.name == "hardmax":
        return rest.amax(dim=-1, keepdim=True)
    if norm.name == "sparsemax":
        return sparsemax_threshold(rest)
    return _entmax_threshold(rest, norm.alpha) / (norm.alpha - 1)


#: Rows of the compact update whose sets ``C_j`` are at least this fraction of their group's
#: largest share its padding (``_FastObjective._init_compact``).
_GROUP_RATIO = 0.6


class _FastObjective:
    """``Δ ↦ ‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖`` for a batch of (row, Δ) pairs in ``O(n·d)`` each.

    A change of row ``i`` changes, in every other output row ``j``, only the weight of key
    ``i``. Write ``m_ji`` for the mean of the *other* keys under row ``j``'s weights and ``ρ``,
    ``ρ'`` for the total weight of the other keys before and after; then
    ``φ_j = ρ m_ji + (1 − ρ) x_i``, ``φ'_j = ρ' m_ji + (1 − ρ')(x_i + Δ)`` and

        ``φ'_j − φ_j = (ρ' − ρ)(m_ji − x_i) + (1 − ρ')Δ``,

    whose squared norm needs ``‖m_ji − x_i‖²`` (cached, ``n × n``) and ``⟨m_ji − x_i, Δ⟩`` (one
    ``(B, d) × (d, n)`` product). Nothing is divided by a small number, so the update is exact
    up to rounding for every score scale, including the limit where one key takes all the
    weight (where the textbook rank-one update ``(Z − E_ji)`` cancels):

    - softmax: with ``ℓ_ji = log Σ_{k≠i} exp s_jk`` (a log-sum-exp, never a difference),
      ``ρ = σ(ℓ_ji − s_ji)`` and ``ρ' = σ(ℓ_ji − s'_ji)``, ``σ`` the logistic function, and
      ``ρ' − ρ = σ(a)σ(−b) − σ(b)σ(−a)`` (``a``, ``b`` those two arguments) has no cancellation
      beyond the genuine one of a small change;
    - ReLU: ``ρ = R/(R + α)``, ``ρ' = R/(R + β)`` with ``R = Σ_{k≠i} ReLU(s_jk)``, ``α``, ``β``
      the old and new weights of key ``i``, so ``ρ' − ρ = R(α − β)/((R + α)(R + β))``; when
      ``R = 0`` the row is ``x_i`` or zero before and after, and the change is written out.

    ``m_ji − x_i`` is ``Z_j(φ_j − x_i)/R_ji`` unless ``i`` is row ``j``'s largest weight
    (then ``R_ji ≥`` that weight ``≥ E_ji``, so ``Z_j/R_ji ≤ 2``); for the largest key it is
    stored as its own vector (``n × d``). Row ``i`` itself is recomputed from its ``n`` new scores.
    No ``(B, n, d)`` array is ever formed.

    The other normalisations of eq. :eq:`eq-general-attention` (a
    :class:`wsutils.maps.Normalisation`; the factor ``c_n`` is folded into ``W`` once):

    - softmax with ``β ≠ 1`` and scalable softmax: the softmax update above, on ``c_n·s``;
    - sigmoid: weights are entrywise, so only ``p_ji`` changes in row ``j``:
      ``φ'_j − φ_j = (p'_ji − p_ji)x_i + p'_ji Δ``, with ``p'_ji − p_ji`` written as
      ``σ(a')σ(−a) − σ(a)σ(−a')`` (no cancellation beyond the genuine one);
    - sparsemax, entmax, hardmax: their threshold is non-decreasing in every score, so after
      any change of one score ``i`` of row ``j`` no key ``k ≠ i`` below ``f_j`` (the threshold
      of the row without its largest entry; for hardmax its second largest entry) carries
      weight (``_support_floor``). Each row keeps the keys of ``C_j = {k : s_jk > f_j}`` (a
      handful for sparsemax and hardmax on isotropic texts, tens for 1.5-entmax), padded to the
      largest set of its group (rows of similar set size, ``_GROUP_RATIO``), their weights and
      Gram matrix (or the keys themselves when ``K > d``); a step recomputes row ``j``'s weights
      on those keys and key ``i`` (exact: the same threshold as the full row) and the squared
      change, ``O(n·K·(min(K, d) + d))``.
      The squared change is a sum of expanded terms: its absolute rounding error is of order
      ``u·(‖p' − p‖₁√d + p'_ji‖Δ‖)²`` per row, so a change that vanishes in exact arithmetic
      can come out of the square root at about ``√u`` times that size (harmless for the
      search, which looks for large changes; every reported value is recomputed with the map).
    """

    def __init__(self, X: torch.Tensor, W: torch.Tensor, norm: Normalisation):
        self.X = X
        self.n, self.d = n, d = X.shape
        self.sqd = math.sqrt(d)
        # the factor c_n of the scores is folded into W once (c_n = 1 is skipped: the softmax
        # and ReLU paths then run exactly as before); every mode below sees z = c_n·s
        c = norm.scale(n)
        if norm.name == "relu":
            # rownorm(ReLU(c·s)) = rownorm(ReLU(s)): a power-of-two rescaling of W (exact)
            # keeps ReLU scores finite for any finite W
            self.kind, self.W = "relu", W / pow2_above(W)
        else:
            self.W = W if c == 1.0 else W * c
            self.kind = {"softmax": "raf", "scalable": "raf", "sigmoid": "sigmoid"}.get(
                norm.name, "compact"
            )
        # the normalisation of the already scaled scores (row i is recomputed with it)
        self.inner = (
            Normalisation("sigmoid", bias=norm.sigmoid_bias(n))
            if norm.name == "sigmoid"
            else Normalisation(norm.name, alpha=norm.alpha)
            if norm.name == "entmax"
            else Normalisation("softmax" if norm.name == "scalable" else norm.name)
        )
        kind = self.kind
        W = self.W
        with torch.no_grad():
            s = attention_scores(X, W)
            if not bool(torch.isfinite(s).all()):
                raise ValueError(
                    f"the attention scores c·XWXᵀ/√d overflow {X.dtype}: pass "
                    "float64 input or a smaller W."
                )
            self.s = s
            self.xsq = (X**2).sum(-1)  # ‖x_i‖²
            if kind in ("sigmoid", "compact"):
                getattr(self, "_init_" + kind)(s)
                return
            idx = torch.arange(n, device=X.device)
            kstar = (s if kind == "raf" else torch.relu(s)).argmax(dim=1)
            top = (idx, kstar)  # entries (j, k*_j): O(n) edits
            self.top = torch.zeros(n, n, dtype=torch.bool, device=X.device)
            self.top[top] = True  # top[j, i]: i is j's largest key
            if kind == "raf":
                shift = s.max(dim=1, keepdim=True).values
                E = torch.exp(s - shift)
            else:
                E = torch.relu(s)
            Z = E.sum(dim=1, keepdim=True)
            self.Phi = (E / torch.where(Z > 0, Z, torch.ones_like(Z))) @ X
            self.base_norm = float(torch.linalg.vector_norm(self.Phi))
            # R_ji = Σ_{k≠i} E_jk: Z − E off the largest key (no cancellation, R ≥ E_jk*),
            # and for the largest key the sum of the others, computed directly
            E_oth = E.clone()
            E_oth[top] = 0
            R_top = E_oth.sum(dim=1)
            R = Z - E
            R[top] = R_top
            if kind == "raf":
                # from the scores, not from E: exp(s − max) underflows when k* dominates
                s_oth = s.clone()
                s_oth[top] = -math.inf
                lse_top = torch.logsumexp(s_oth, dim=1, keepdim=True)  # −inf if n = 1
                lse_fin = torch.where(torch.isfinite(lse_top), lse_top, torch.zeros_like(lse_top))
                self.Mbar = torch.exp(s_oth - lse_fin) @ X  # 0 if n = 1 (never used then)
                self.logR = torch.log(R.clamp_min(torch.finfo(R.dtype).tiny)) + shift
                self.logR[top] = lse_top[:, 0]
            else:
                self.Mbar = (E_oth / torch.where(R_top > 0, R_top, 1.0)[:, None]) @ X
                self.E, self.R = E, R
            # ratio Z_j/R_ji (≤ 2 off the largest key) and V2[j, i] = ‖m_ji − x_i‖²
            self.ratio = Z / R.clamp_min(torch.finfo(R.dtype).tiny)  # 0 where Z = 0
            self.ratio[top] = 0
            # ‖φ_j − x_i‖² by expansion (one GEMM): its absolute error ≈ 2u·d is harmless
            # here, since off the largest key it is multiplied by (Z/R)² ≤ 4 and g² ≤ 1
            M = ((self.Phi**2).sum(-1)[:, None] - 2 * self.Phi @ X.T + self.xsq[None]).clamp_min(0)
            self.V2 = self.ratio**2 * M
            # on the largest key φ_j ≈ x_k* and the expansion would cancel: the difference
            # m̄_j − x_k* is formed directly (n vectors)
            self.V2[top] = ((self.Mbar - X[kstar]) ** 2).sum(-1)

    def _init_sigmoid(self, s: torch.Tensor) -> None:
        self.Phi = normalise_scores(s, self.inner) @ self.X
        self.base_norm = float(torch.linalg.vector_norm(self.Phi))

    def _init_compact(self, s: torch.Tensor) -> None:
        """Sparsemax, entmax, hardmax: per row ``j`` the keys that can carry weight after any
        change of one score, ``C_j = {k : z_jk > f_j}`` (see the class docstring). The rows are
        sorted by ``|C_j|`` and cut into groups whose sizes stay within a factor
        ``_GROUP_RATIO`` of the group's largest (a handful of groups); each group keeps the
        ``K_g = max |C_j|`` largest scores of its rows, padded below ``f_j``, so a step costs
        ``Σ_g n_g·K_g·min(K_g, d)`` instead of ``n·K·min(K, d)`` with ``K`` the largest set of
        all rows (entmax's sets vary from a few keys to a hundred at ``n = 4096``)."""
        X, n, d, name = self.X, self.n, self.d, self.inner.name
        f = _support_floor(s, self.inner)  # (n, 1)
        tol = 64 * torch.finfo(s.dtype).eps * (1 + s.abs().amax(dim=1, keepdim=True))
        count = (s > f - tol).sum(dim=1)  # ≥ 1: the top key is in C_j
        unit = (self.inner.alpha - 1) if name == "entmax" else 1.0
        pad = f - 1 / unit  # below every possible threshold
        order = torch.argsort(count, descending=True, stable=True)
        sizes = count[order].tolist()
        self.groups, start = [], 0
        while start < n:
            K = sizes[start]
            stop = start + 1
            while stop < n and sizes[stop] >= _GROUP_RATIO * K:
                stop += 1
            rows = order[start:stop]
            zC, Cidx = torch.topk(s[rows], K, dim=1)  # each C_j: its row's |C_j| largest
            valid = torch.arange(K, device=X.device)[None] < count[rows][:, None]
            g = {
                "rows": rows,
                "Cidx": Cidx,
                "valid": valid,
                "pad": pad[rows],
                "zC": torch.where(valid, zC, pad[rows]),
            }
            g["pC"] = normalise_scores(g["zC"], self.inner)  # old weights (exact zeros off)
            XC = X[Cidx]  # (n_g, K, d)
            # the squared change: a Gram quadratic form (K ≤ d) or the vector itself (K > d)
            g["GC" if K <= d else "XC"] = XC @ XC.transpose(1, 2) if K <= d else XC
            self.groups.append(g)
            start = stop
        self.inv_order = torch.argsort(order)
        self.Phi = normalise_scores(s, self.inner) @ X
        self.base_norm = float(torch.linalg.vector_norm(self.Phi))

    def _others_sigmoid(self, row_idx, Delta, col, xD, dd):
        """Rows ``j ≠ i`` of sigmoid attention: only ``p_ji`` changes,
        ``φ'_j − φ_j = (p'_ji − p_ji)x_i + p'_ji Δ``."""
        b = self.inner.bias
        a_new, a_old = col + b, self.s[:, row_idx].T + b
        g = torch.sigmoid(a_new) * torch.sigmoid(-a_old) - torch.sigmoid(a_old) * torch.sigmoid(
            -a_new
        )
        w = torch.sigmoid(a_new)
        xsq = self.xsq[row_idx][:, None]
        return g**2 * xsq + 2 * g * w * xD + w**2 * dd

    def _others_compact(self, row_idx, Delta, col, xD, dd):
        """Rows ``j ≠ i`` of sparsemax, entmax, hardmax: the row's weights on ``C_j ∪ {i}``
        recomputed (exact: no other key can enter), and the squared norm of
        ``v = Σ_k c_k x_k + c_i x_i + p'_ji Δ`` (``c = p' − p``), group by group: as a quadratic
        form in the Gram matrices of the ``C_j`` when ``K_g ≤ d``, else from ``v`` itself."""
        Gx = self.X[row_idx] @ self.X.T  # ⟨x_k, x_i⟩, (B, n)
        Dx = Delta @ self.X.T  # ⟨x_k, Δ⟩
        xsq = self.xsq[row_idx][:, None]
        out = []
        for g in self.groups:
            rows, Cidx, valid = g["rows"], g["Cidx"], g["valid"]
            B, (m, K) = row_idx.shape[0], Cidx.shape
            colg = col[:, rows]
            inC = (Cidx[None] == row_idx[:, None, None]) & valid[None]  # (B, n_g, K)
            hasI = inC.any(-1)  # (B, n_g)
            zN = torch.where(inC, colg[..., None], g["zC"][None])
            last = torch.where(hasI, g["pad"][:, 0][None], colg)
            pN = normalise_scores(torch.cat([zN, last[..., None]], dim=-1), self.inner)
            cC = pN[..., :K] - g["pC"][None]  # change of the weights on C_j
            cL = torch.where(hasI, torch.zeros_like(colg), pN[..., K])  # key i outside C_j
            wI = torch.where(hasI, (pN[..., :K] * inC).sum(-1), pN[..., K])  # new weight of i
            if "GC" in g:
                idx = Cidx.reshape(1, -1).expand(B, -1)
                Gi = Gx.gather(1, idx).reshape(B, m, K)
                Di = Dx.gather(1, idx).reshape(B, m, K)
                quad = torch.einsum("bnk,nkl,bnl->bn", cC, g["GC"], cC)
                out.append(
                    quad
                    + 2 * cL * (cC * Gi).sum(-1)
                    + cL**2 * xsq
                    + 2 * wI * ((cC * Di).sum(-1) + cL * xD)
                    + wI**2 * dd
                )
            else:
                v = (
                    torch.einsum("bnk,nkd->bnd", cC, g["XC"])
                    + cL[..., None] * self.X[row_idx][:, None]
                    + wI[..., None] * Delta[:, None]
                )
                out.append((v**2).sum(-1))
        return torch.cat(out, dim=1)[:, self.inv_order]

    def _normalise(self, t: torch.Tensor) -> torch.Tensor:
        if self.kind == "raf":
            return torch.softmax(t, dim=-1)
        if self.kind in ("sigmoid", "compact"):
            return normalise_scores(t, self.inner)
        a = torch.relu(t)
        mass = a.sum(dim=-1, keepdim=True)
        return a / torch.where(mass > 0, mass, torch.ones_like(mass))

    def __call__(self, row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        X, W, Phi = self.X, self.W, self.Phi
        xi = X[row_idx]  # (B, d)
        xp = xi + Delta  # x'_i
        col = (xp @ W.T) @ X.T / self.sqd  # s'_ji = x_j W x'_i/√d, (B, n)
        xD = (xi * Delta).sum(-1, keepdim=True)
        dd = (Delta**2).sum(-1, keepdim=True)
        if self.kind in ("sigmoid", "compact"):
            sq = getattr(self, "_others_" + self.kind)(row_idx, Delta, col, xD, dd)
            return self._finish(sq, row_idx, Delta, xp)
        top = self.top[:, row_idx].T  # is i row j's largest key? (B, n)
        # ⟨m_ji − x_i, Δ⟩
        cross = torch.where(
            top, Delta @ self.Mbar.T - xD, self.ratio[:, row_idx].T * (Delta @ Phi.T - xD)
        )
        V2 = self.V2[:, row_idx].T
        if self.kind == "raf":
            logR = self.logR[:, row_idx].T
            a = logR - col  # ρ' = σ(a)
            b = logR - self.s[:, row_idx].T  # ρ  = σ(b)
            g = torch.sigmoid(a) * torch.sigmoid(-b) - torch.sigmoid(b) * torch.sigmoid(-a)
            w = torch.sigmoid(-a)  # 1 − ρ'
            sq = g**2 * V2 + 2 * g * w * cross + w**2 * dd
        else:
            R = self.R[:, row_idx].T
            alpha, beta = self.E[:, row_idx].T, torch.relu(col)
            pos = R > 0
            one = torch.ones_like(R)
            Ra = torch.where(pos, R + alpha, one)
            Rb = torch.where(pos, R + beta, one)
            g = torch.where(pos, R * (alpha - beta) / (Ra * Rb), torch.zeros_like(R))
            w = torch.where(pos, beta / Rb, torch.zeros_like(R))
            sq_pos = g**2 * V2 + 2 * g * w * cross + w**2 * dd
            # R = 0: φ_j = 1[α>0]·x_i and φ'_j = 1[β>0]·(x_i + Δ)
            p, q = (beta > 0).to(X.dtype), (alpha > 0).to(X.dtype)
            xsq = self.xsq[row_idx][:, None]
            sq_zero = (p - q) ** 2 * xsq + 2 * (p - q) * p * xD + p * dd
            sq = torch.where(pos, sq_pos, sq_zero)
        return self._finish(sq, row_idx, Delta, xp)

    def _finish(self, sq, row_idx, Delta, xp):
        """Row ``i`` from its ``n`` new scores; the relative change from the squared rows."""
        X, W, Phi = self.X, self.W, self.Phi
        sq = sq.clamp_min(0)
        # row i: its n new scores
        t = (xp @ W) @ X.T / self.sqd  # s'_{i k}, k ≠ i
        onehot = torch.nn.functional.one_hot(row_idx, self.n).to(X.dtype)
        t = t + onehot * ((xp @ W * xp).sum(-1, keepdim=True) / self.sqd - t)
        wrow = self._normalise(t)
        wi = (wrow * onehot).sum(-1, keepdim=True)
        new_i = wrow @ X + wi * Delta
        diff_i = new_i - Phi[row_idx]
        sq = torch.where(onehot > 0, (diff_i**2).sum(-1, keepdim=True), sq)
        return torch.sqrt(sq.sum(-1)) / self.base_norm


def attention_word_sensitivity(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "raf",
    rows: int | Sequence[int] | None = None,
    init: Array | None = None,
    takeovers: bool = False,
    search: Search | None = None,
    device=None,
    **settings,
) -> SensitivityResult:
    """Estimate ``S(X)`` for softmax (``normalisation="raf"``, eq. :eq:`eq-raf`), ReLU
    attention (``"relu"``, eq. :eq:`eq-relu-attention`) or any normalisation of
    eq. :eq:`eq-general-attention` (a name, dict or :class:`wsutils.maps.Normalisation`) with
    weights ``W``.

    The search is exactly that of :func:`wsutils.sensitivity.word_sensitivity` (same starts
    from ``seed``, same steps, best iterate kept, every requested row searched, ``init`` extra
    starts), with the relative change evaluated in ``O(n·d)`` per start and step instead of
    ``O(n²·d + n·d²)`` (``_FastObjective``, stable for every score scale). ``takeovers=True``
    adds every construction of :func:`certified_lower_bound` for the row being searched as
    extra starts (so the estimate is at least that certificate, up to rounding). Every reported
    value (``value`` and ``per_row``) is recomputed with the full map in float64 from the
    returned ``Delta``/``per_row_Delta``, with the caller's ``W`` (exactly; the search alone
    uses ``W`` in ``X``'s dtype).

    ``search.dtype`` (``"float32"`` or ``"float64"``, :class:`wsutils.search.Search`)
    runs the search (the fast objective, the starts, the steps) in that precision on ``X``
    and ``W`` rounded to it; ``None`` (default) searches in ``X``'s own search dtype. The
    search only proposes ``Δ``: every reported value is the float64 relative change at the
    returned ``Δ`` (projected onto the exact ball) for the *unrounded* ``X`` and ``W``, so it
    is a certified lower bound whatever the search precision.

    Parameters
    ----------
    X
        One text ``(n, d)``, real and finite.
    W
        The attention weights, ``d × d``.
    normalisation, rows, init, takeovers
        As above and as in :func:`wsutils.sensitivity.word_sensitivity`.
    search, **settings
        The search's settings (:class:`wsutils.search.Search`, default ``Search()``), its
        fields as keywords replacing those of ``search``.

    Returns
    -------
    SensitivityResult
        The best float64 relative change found (a certified lower bound on ``S(X)``), its row
        and ``Δ``, and the same per row.

    Raises
    ------
    TypeError
        If ``rows`` is a boolean mask (pass ``np.flatnonzero(mask)``) or has a non-integer
        entry (``1.9``), ``starts``/``steps`` is not an integer, or ``X``/``W`` is complex or
        not numeric.
    ValueError
        If ``φ(X)`` is not finite (named as such) or is zero (the relative change is then
        undefined), ``init`` is neither ``(d,)`` nor ``(m, d)``, ``lr`` is NaN or not
        positive, or the other input checks of :func:`wsutils.sensitivity.search_setup` fail.
    """
    norm = Normalisation.parse(normalisation)  # the one parse of the map
    search = Search.parse(search, **settings)  # the one parse of the search
    fn = _kernel(norm)
    Xt, row_list, extra = search_setup(X, rows=rows, init=init, device=device)
    Wt, W64 = _weights(W, Xt), _weights64(W, Xt)  # the search's copy; the caller's W
    work = search.work_dtype(Xt.dtype)
    Xs, Ws = Xt.to(work), Wt.to(work)  # what the search sees
    if extra is not None:
        extra = extra.to(work)
    obj = _FastObjective(Xs, Ws, norm)
    if not math.isfinite(obj.base_norm):
        raise ValueError(
            "φ(X) is not finite (NaN or infinite entries): the scores or the "
            "normalisation's parameters are outside the range it is accurate in."
        )
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and map.")

    def objective(chunk: list[int]):
        return obj

    def constructions(r: int) -> torch.Tensor:  # each row's own take-overs as its starts
        return _constructions(Xt, W64, r, norm).to(work)

    return ascend_and_certify(
        objective,
        lambda Z: fn(Z, W64),
        Xs,
        Xt,
        row_list,
        search,
        extra=extra,
        row_starts=constructions if takeovers else None,
    )
