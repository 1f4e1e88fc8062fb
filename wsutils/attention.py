"""Attention-specific word sensitivity: the take-over constructions, the certificate of
:prf:ref:`thm-raf-high`, and a fast estimator for RAF and ReLU attention.

- :func:`row_takeover` and :func:`key_takeover` build explicit perturbations ``Δ`` with
  ``‖Δ‖ ≤ √d`` (:prf:ref:`def-takeover`); :func:`takeover_candidates` stacks them with a few
  blends; :func:`certified_lower_bound` is the best relative change they attain, a certified
  lower bound on ``S(X)``.
- :func:`takeover_certificate` computes every quantity of :prf:ref:`thm-raf-high` (margin,
  self-weight, ``κ(X) = ‖X‖_op/√d``, ``‖A‖_F``) and the lower bound the theorem proves.
- :func:`attention_word_sensitivity` runs the search of
  :func:`wsutils.sensitivity.word_sensitivity` (same starts, steps and step sizes, so the same
  answer up to rounding), but evaluates ``φ(X_i(Δ)) − φ(X)`` in ``O(n·d)`` per start and step:
  a change of row ``i`` touches only row ``i`` and column ``i`` of the score matrix, so every
  other output row is a rank-one update of its cached numerator and normaliser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ._tensor import Array, as_tensor, like
from .checks import check_shape, check_text, check_unit_rows
from .maps import attention_scores, raf, relu_attention
from .sensitivity import SensitivityResult, _ascend, project_ball, relative_change, search_setup

__all__ = [
    "KINDS", "row_takeover", "key_takeover", "takeover_candidates", "certified_lower_bound",
    "TakeoverCertificate", "takeover_certificate", "attention_word_sensitivity",
]

KINDS = ("raf", "relu")


def _prepare(X: Array, W: Array, row: int | None = None, device=None):
    Xt = as_tensor(X, device=device)
    n, d = check_text(Xt)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    Wt = as_tensor(W, dtype=Xt.dtype, device=Xt.device)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    if row is not None and not 0 <= int(row) < n:
        raise ValueError(f"row {row} is out of range for a text of n = {n} words.")
    return Xt, Wt, n, d


def _map(kind: str):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} (softmax or ReLU attention), got {kind!r}.")
    return raf if kind == "raf" else relu_attention


def _top_eigvec(W: torch.Tensor) -> tuple[float, torch.Tensor]:
    evals, evecs = torch.linalg.eigh((W + W.T) / 2)
    return float(evals[-1]), evecs[:, -1]


def row_takeover(X: Array, W: Array, row: int) -> Array:
    """The row take-over ``Δ = √d·u`` (:prf:ref:`def-takeover`): ``u`` is a unit top
    eigenvector of ``(W + Wᵀ)/2``, with the sign that makes ``uᵀx_row ≥ 0``."""
    Xt, Wt, n, d = _prepare(X, W, row)
    _, u = _top_eigvec(Wt)
    if float(u @ Xt[int(row)]) < 0:
        u = -u
    return like(project_ball(math.sqrt(d) * u[None], math.sqrt(d))[0], X)


def key_takeover(X: Array, W: Array, row: int) -> Array:
    """The key take-over ``Δ = √d·Wᵀm/‖Wᵀm‖`` (:prf:ref:`def-takeover`), ``m`` the mean row of
    ``X``: it raises the score of key ``row`` in every query row at once."""
    Xt, Wt, n, d = _prepare(X, W, row)
    v = Wt.T @ Xt.mean(dim=0)
    norm = float(torch.linalg.vector_norm(v))
    if norm == 0:
        raise ValueError("Wᵀm = 0 (the mean row is in the kernel of Wᵀ): the key take-over "
                         "has no direction; use row_takeover instead.")
    return like(project_ball(math.sqrt(d) * v[None] / norm, math.sqrt(d))[0], X)


def takeover_candidates(X: Array, W: Array, row: int,
                        blends: Sequence[float] = (0.25, 0.5, 0.75)) -> Array:
    """The constructions of :prf:ref:`def-takeover` as an ``m × d`` array: the row take-over
    (both signs of ``u``), the key take-over, and for each ``t`` in ``blends`` the direction
    ``(1 − t)·Δ_row + t·Δ_key`` rescaled to norm ``√d``. Every row has norm ``≤ √d``."""
    Xt, Wt, n, d = _prepare(X, W, row)
    r = as_tensor(row_takeover(Xt, Wt, row))
    k = as_tensor(key_takeover(Xt, Wt, row))
    cands = [r, -r, k]
    for t in blends:
        v = (1 - t) * r + t * k
        cands.append(v * math.sqrt(d) / torch.linalg.vector_norm(v).clamp_min(1e-300))
    return like(project_ball(torch.stack(cands), math.sqrt(d)), X)


def certified_lower_bound(X: Array, W: Array, row: int, *, kind: str = "raf") -> float:
    """``max_Δ ‖φ(X_row(Δ)) − φ(X)‖/‖φ(X)‖`` over :func:`takeover_candidates`: an explicit
    ``Δ`` in the ball, hence a certified lower bound on ``S_φ(X)`` (:prf:ref:`def-word-sensitivity`).
    ``kind`` is ``"raf"`` (eq. :eq:`eq-raf`) or ``"relu"`` (eq. :eq:`eq-relu-attention`)."""
    fn = _map(kind)
    Xt, Wt, n, d = _prepare(X, W, row)
    phi = lambda Z: fn(Z, Wt)  # noqa: E731
    return max(relative_change(phi, Xt, row, D) for D in as_tensor(takeover_candidates(Xt, Wt, row)))


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


def takeover_certificate(X: Array, W: Array, row: int) -> TakeoverCertificate:
    """Evaluate :prf:ref:`thm-raf-high` at ``(X, W, row)``:
    ``S ≥ [(1+√2)·a'_ii − 1 − κ‖a_i‖] / (κ‖A‖_F)`` with ``a'_ii = 1/(1 + e^{−margin})``."""
    Xt, Wt, n, d = _prepare(X, W, row)
    check_unit_rows(Xt)
    i = int(row)
    lam, _ = _top_eigvec(Wt)
    Delta = as_tensor(row_takeover(Xt, Wt, i))
    Xp = Xt.clone()
    Xp[i] += Delta
    s = attention_scores(Xp, Wt)[i]
    others = torch.cat([s[:i], s[i + 1:]])
    lse = float(torch.logsumexp(others, 0)) if n > 1 else -math.inf
    margin = float(s[i]) - lse
    a_self = float(torch.softmax(s, 0)[i])
    A = torch.softmax(attention_scores(Xt, Wt), dim=-1)
    kappa = float(torch.linalg.matrix_norm(Xt, ord=2)) / math.sqrt(d)
    A_fro = float(torch.linalg.matrix_norm(A))
    a_row = float(torch.linalg.vector_norm(A[i]))
    bound = ((1 + math.sqrt(2)) * a_self - 1 - kappa * a_row) / (kappa * A_fro)
    exact = relative_change(lambda Z: raf(Z, Wt), Xt, i, Delta)
    return TakeoverCertificate(lam=lam, self_score=float(s[i]), lse_others=lse, margin=margin,
                               self_weight=a_self, kappa=kappa, A_fro=A_fro, a_row=a_row,
                               bound=bound, exact=exact)


class _FastObjective:
    """``Δ ↦ ‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖`` for a batch of (row, Δ) pairs in ``O(n·d)`` each.

    Cached once: scores ``s = XWXᵀ/√d``, weights ``E`` (``exp(s − max_row s)`` for softmax,
    ``ReLU(s)`` for ReLU attention), normalisers ``Z`` and outputs ``Φ = φ(X)``. For row
    ``j ≠ i`` only the weight of key ``i`` changes (old ``α``, new ``β``):
    ``φ'_j − φ_j = [(α − β)(φ_j − x_i) + βΔ] / (Z_j − α + β)``, whose squared norm needs only
    ``‖φ_j − x_i‖²`` (cached) and ``⟨φ_j − x_i, Δ⟩``. Row ``i`` is recomputed from its ``n``
    new scores. No ``(B, n, d)`` array is ever formed.
    """

    def __init__(self, X: torch.Tensor, W: torch.Tensor, kind: str):
        self.X, self.W, self.kind = X, W, kind
        self.n, self.d = X.shape
        self.sqd = math.sqrt(self.d)
        with torch.no_grad():
            s = attention_scores(X, W)
            if kind == "raf":
                self.shift = s.max(dim=1).values
                E = torch.exp(s - self.shift[:, None])
            else:
                self.shift = torch.zeros(self.n, dtype=X.dtype, device=X.device)
                E = torch.relu(s)
            self.E, self.Z = E, E.sum(dim=1)
            Zs = torch.where(self.Z > 0, self.Z, torch.ones_like(self.Z))
            self.Phi = (E / Zs[:, None]) @ X
            self.base_norm = float(torch.linalg.vector_norm(self.Phi))
            self.P = (self.Phi ** 2).sum(-1)                        # ‖φ_j‖²
            # M[j, i] = ‖φ_j − x_i‖²
            self.M = (self.P[:, None] - 2 * self.Phi @ X.T + (X ** 2).sum(-1)[None]).clamp_min(0)

    def _normalise(self, t: torch.Tensor) -> torch.Tensor:
        if self.kind == "raf":
            return torch.softmax(t, dim=-1)
        a = torch.relu(t)
        mass = a.sum(dim=-1, keepdim=True)
        return a / torch.where(mass > 0, mass, torch.ones_like(mass))

    def __call__(self, row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        X, W, Phi = self.X, self.W, self.Phi
        xi = X[row_idx]                                   # (B, d)
        xp = xi + Delta                                   # x'_i
        col = (xp @ W.T) @ X.T / self.sqd                 # s'_{j i} = x_j W x'_i/√d, (B, n)
        # other rows: only the weight of key i changes
        Ei = self.E[:, row_idx].T                         # old weight α, (B, n)
        if self.kind == "raf":
            c = torch.maximum(self.shift[None], col)
            scale = torch.exp(self.shift[None] - c)
            alpha, beta = scale * Ei, torch.exp(col - c)
            Zp = scale * (self.Z[None] - Ei).clamp_min(0) + beta
        else:
            alpha, beta = Ei, torch.relu(col)
            Zp = (self.Z[None] - Ei).clamp_min(0) + beta
        # ‖U_j‖² with U_j = (α − β)(φ_j − x_i) + βΔ, expanded so that no (B, n, d) array is
        # formed: ‖φ_j − x_i‖² is cached, ⟨φ_j − x_i, Δ⟩ is one (B, d) × (d, n) product.
        gap = alpha - beta
        cross = Delta @ Phi.T - (xi * Delta).sum(-1, keepdim=True)
        dd = (Delta ** 2).sum(-1, keepdim=True)
        Usq = (gap ** 2 * self.M[:, row_idx].T + beta ** 2 * dd + 2 * gap * beta * cross)
        pos = Zp > 0
        sq = torch.where(pos, Usq.clamp_min(0) / torch.where(pos, Zp, torch.ones_like(Zp)) ** 2,
                         self.P[None])
        # row i: its n new scores
        t = (xp @ W) @ X.T / self.sqd                     # s'_{i k}, k ≠ i
        onehot = torch.nn.functional.one_hot(row_idx, self.n).to(X.dtype)
        t = t + onehot * ((xp @ W * xp).sum(-1, keepdim=True) / self.sqd - t)
        w = self._normalise(t)
        wi = (w * onehot).sum(-1, keepdim=True)
        new_i = w @ X + wi * Delta
        diff_i = new_i - Phi[row_idx]
        sq = sq * (1 - onehot) + onehot * (diff_i ** 2).sum(-1, keepdim=True)
        return torch.sqrt(sq.sum(-1)) / self.base_norm


def attention_word_sensitivity(
    X: Array,
    W: Array,
    *,
    kind: str = "raf",
    rows: int | Sequence[int] | None = None,
    starts: int = 8,
    steps: int = 200,
    seed: int = 0,
    init: Array | None = None,
    takeovers: bool = False,
    lr: float = 0.5,
    max_batch_elements: int = 2**23,
    device=None,
    progress: bool = False,
) -> SensitivityResult:
    """Estimate ``S(X)`` for softmax (``kind="raf"``, eq. :eq:`eq-raf`) or ReLU attention
    (``kind="relu"``, eq. :eq:`eq-relu-attention`) with weights ``W``.

    The search is exactly that of :func:`wsutils.sensitivity.word_sensitivity` (same starts
    from ``seed``, same steps, best iterate kept, every requested row searched, ``init`` extra
    starts), with the relative change evaluated in ``O(n·d)`` per start and step instead of
    ``O(n²·d + n·d²)``. ``takeovers=True`` adds the constructions of
    :func:`takeover_candidates` for the row being searched as extra starts.
    The reported ``value`` is recomputed with the full map from the returned ``Delta``.
    """
    fn = _map(kind)
    Xt, Wt, n, d = _prepare(X, W, device=device)
    Xt, row_list, extra = search_setup(Xt, rows=rows, starts=starts, steps=steps, init=init)
    obj = _FastObjective(Xt, Wt, kind)
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and map.")

    def objective(chunk: list[int]):
        return obj

    if takeovers:
        per_row, best = {}, (-1.0, row_list[0], torch.zeros(d, dtype=Xt.dtype))
        for r in row_list:
            cands = as_tensor(takeover_candidates(Xt, Wt, r))
            init_r = cands if extra is None else torch.cat([extra, cands])
            pr, b = _ascend(objective, Xt, [r], starts=starts, steps=steps, seed=seed + r,
                            extra=init_r, lr=lr, max_batch_elements=max_batch_elements,
                            progress=False)
            per_row.update(pr)
            if b[0] > best[0]:
                best = b
        S = starts + init_r.shape[0]
    else:
        per_row, best = _ascend(objective, Xt, row_list, starts=starts, steps=steps, seed=seed,
                                extra=extra, lr=lr, max_batch_elements=max_batch_elements,
                                progress=progress)
        S = starts + (0 if extra is None else extra.shape[0])
    _, row, Delta_best = best
    value = relative_change(lambda Z: fn(Z, Wt), Xt, row, Delta_best)
    return SensitivityResult(value=value, row=row, Delta=Delta_best.numpy().copy(),
                             per_row=per_row, starts=S, steps=steps, seed=seed)
