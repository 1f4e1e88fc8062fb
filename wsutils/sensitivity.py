"""Word sensitivity ``S_φ(X)`` (definition :prf:ref:`def-word-sensitivity`) and a generic
estimator of it for any differentiable torch map.

``S_φ(X) = sup_{i, ‖Δ‖ ≤ √d} ‖φ(X_i(Δ)) − φ(X)‖ / ‖φ(X)‖`` where ``X_i(Δ)`` is ``X`` with
row ``i`` replaced by ``x_i + Δ``. Any ``Δ`` in the ball gives a *lower* bound on ``S``; the
estimator searches for a good one by projected gradient ascent from several starts, keeps the
best iterate seen (not the last one) and takes the sup over the requested rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ._tensor import Array, as_tensor
from .checks import check_finite, check_text, check_unit_rows

__all__ = ["SensitivityResult", "cosine_ascent", "perturb", "project_ball", "relative_change",
           "search_setup", "sphere_starts", "word_sensitivity"]

Map = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SensitivityResult:
    """What :func:`word_sensitivity` found.

    ``value`` is the best relative change found, ``row`` the word and ``Delta`` (a numpy vector
    with ``‖Delta‖ ≤ √d``) the perturbation attaining it: ``value`` is a certified lower bound
    on ``S_φ(X)``. ``per_row`` maps each searched row to its best value.
    """

    value: float
    row: int
    Delta: np.ndarray
    per_row: dict[int, float] = field(default_factory=dict)
    starts: int = 0
    steps: int = 0
    seed: int = 0

    def __float__(self) -> float:
        return float(self.value)


def perturb(X: torch.Tensor, rows: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
    """``X_i(Δ)`` for a batch: ``X`` is ``(n, d)``, ``rows`` ``(B,)`` and ``Delta`` ``(B, d)``;
    returns ``(B, n, d)`` with row ``rows[b]`` of copy ``b`` moved by ``Delta[b]``."""
    onehot = torch.nn.functional.one_hot(rows, X.shape[-2]).to(X.dtype)
    return X + onehot[:, :, None] * Delta[:, None, :]


def project_ball(Delta: torch.Tensor, radius: float) -> torch.Tensor:
    """Euclidean projection of each row of ``Delta`` onto ``{‖Δ‖ ≤ radius}``, exact in floating
    point: the returned norms never exceed ``radius``."""
    norm = torch.linalg.vector_norm(Delta, dim=-1, keepdim=True)
    Delta = torch.where(norm > radius, Delta * (radius / norm), Delta)
    shrink = 1 - 4 * torch.finfo(Delta.dtype).eps
    for _ in range(8):  # rounding can leave a norm one ulp above the radius
        over = torch.linalg.vector_norm(Delta, dim=-1, keepdim=True) > radius
        if not bool(over.any()):
            break
        Delta = torch.where(over, Delta * shrink, Delta)
    return Delta


def _norms(t: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.linalg.vector_norm(t.reshape(batch, -1), dim=-1)


def relative_change(phi: Map, X: Array, row: int, Delta: Array) -> float:
    """``‖φ(X_i(Δ)) − φ(X)‖ / ‖φ(X)‖`` for one row ``i = row`` and one ``Δ``
    (the quantity inside the sup of :prf:ref:`def-word-sensitivity`)."""
    Xt = as_tensor(X)
    n, d = check_text(Xt)
    Dt = as_tensor(Delta, dtype=Xt.dtype, device=Xt.device).reshape(1, -1)
    if Dt.shape[1] != d:
        raise ValueError(f"Delta must have length d = {d}, got {Dt.shape[1]}.")
    if not 0 <= int(row) < n:
        raise ValueError(f"row {row} is out of range for a text of n = {n} words.")
    # X and X_i(Δ) go through φ as one batch, so that Δ = 0 gives exactly 0.
    pair = torch.cat([Xt[None], perturb(Xt, torch.tensor([int(row)], device=Xt.device), Dt)])
    with torch.no_grad():
        base, pert = phi(pair)
        return float(torch.linalg.vector_norm(pert - base) / torch.linalg.vector_norm(base))


def _rows(rows, n: int) -> list[int]:
    if rows is None:
        return list(range(n))
    rows = [int(rows)] if np.ndim(rows) == 0 else [int(r) for r in rows]
    if not rows:
        raise ValueError("rows is empty: pass None (all rows) or at least one row index.")
    bad = [r for r in rows if not 0 <= r < n]
    if bad:
        raise ValueError(f"rows {bad} are out of range for a text of n = {n} words.")
    return rows


def search_setup(X: Array, *, rows, starts: int, steps: int, init: Array | None = None,
                 check_norms: bool = True, device=None):
    """Validate what every word-sensitivity estimator takes: a single text ``X`` (``n × d``,
    finite, rows of norm ``√d`` unless ``check_norms=False``), ``starts ≥ 1``, ``steps ≥ 0``,
    the rows to search (``None``: all) and extra starts ``init`` (``m × d``, projected onto the
    ball). Returns ``(X as a tensor, the list of rows, init as an m × d tensor or None)``."""
    Xt = as_tensor(X, device=device)
    n, d = check_text(Xt)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if check_norms:
        check_unit_rows(Xt)
    if starts < 1 or steps < 0:
        raise ValueError(f"need starts ≥ 1 and steps ≥ 0, got starts={starts}, steps={steps}.")
    extra = None
    if init is not None:
        extra = as_tensor(init, dtype=Xt.dtype, device=Xt.device).reshape(-1, d)
        check_finite("init", extra)
        extra = project_ball(extra, math.sqrt(d))
    return Xt, _rows(rows, n), extra


def _batched(phi: Map, batched: bool) -> Map:
    if batched:
        return phi
    return lambda Xb: torch.stack([phi(x) for x in Xb])


def word_sensitivity(
    phi: Map,
    X: Array,
    *,
    rows: int | Sequence[int] | None = None,
    starts: int = 8,
    steps: int = 200,
    seed: int = 0,
    init: Array | None = None,
    lr: float = 0.5,
    batched: bool = True,
    max_batch_elements: int = 2**23,
    check_norms: bool = True,
    device=None,
    progress: bool = False,
) -> SensitivityResult:
    """Estimate ``S_φ(X)`` (:prf:ref:`def-word-sensitivity`) by projected gradient ascent.

    For every requested row ``i`` (default: all), ``starts`` searches run in one batch: the
    first from the authors' start ``0.1·ξ`` (``ξ`` standard normal), the others from uniform
    points on the sphere ``‖Δ‖ = √d``, plus one search from each row of ``init`` (an ``m × d``
    array of candidate perturbations, e.g. the constructions of later chapters). Each step
    moves ``Δ`` by ``lr·√d·cos``-decayed multiples of the normalised gradient of
    ``‖φ(X_i(Δ)) − φ(X)‖`` and projects back onto the ball ``‖Δ‖ ≤ √d``. The best iterate of
    every search is kept, and the result is the best over starts and rows.

    ``phi`` maps a torch tensor ``(B, n, d)`` to ``(B, ...)``; set ``batched=False`` for a map
    that only takes a single ``(n, d)`` text. ``X`` must have rows of norm ``√d``
    (``check_norms=False`` skips that check). Same ``seed``, same result.
    """
    Xt, row_list, extra = search_setup(X, rows=rows, starts=starts, steps=steps, init=init,
                                       check_norms=check_norms, device=device)
    S = starts + (0 if extra is None else extra.shape[0])
    phi_b = _batched(phi, batched)

    with torch.no_grad():
        base = phi(Xt)
        base_norm = float(torch.linalg.vector_norm(base))
    if not base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and map.")

    def objective(chunk: list[int]):
        def values(row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
            out = phi_b(perturb(Xt, row_idx, Delta))
            return _norms(out - base, len(row_idx)) / base_norm
        return values

    per_row, best = _ascend(objective, Xt, row_list, starts=starts, steps=steps, seed=seed,
                            extra=extra, lr=lr, max_batch_elements=max_batch_elements,
                            progress=progress)
    value, row, Delta_best = best
    return SensitivityResult(value=value, row=row, Delta=Delta_best.numpy().copy(),
                             per_row=per_row, starts=S, steps=steps, seed=seed)


def sphere_starts(xi: torch.Tensor, radius: float) -> torch.Tensor:
    """Turn standard-normal draws ``xi`` of shape ``(..., s, d)`` into the estimators' starts,
    in place: the first is the authors' start ``0.1·ξ``, the others are uniform on the sphere
    ``‖Δ‖ = radius``."""
    xi[..., 1:, :] *= radius / torch.linalg.vector_norm(xi[..., 1:, :], dim=-1, keepdim=True)
    xi[..., :1, :] *= 0.1
    return xi


def cosine_ascent(values, Delta: torch.Tensor, radius: float, *, steps: int, lr: float):
    """Projected gradient ascent of ``values(Delta) -> (B,)`` from each row of ``Delta``
    (``B × d``) over the ball ``‖Δ‖ ≤ radius``: step ``t`` moves by
    ``lr·radius·(1 + cos(πt/steps))/2`` along the normalised gradient and projects back
    (:func:`project_ball`). Returns the best value of each search and the iterate attaining it
    (the best iterate, not the last). Minimise a loss by passing ``-loss``."""
    best_val = torch.full((Delta.shape[0],), -math.inf, dtype=Delta.dtype, device=Delta.device)
    best_Delta = Delta.clone()
    for t in range(steps + 1):
        Delta.requires_grad_(True)
        vals = values(Delta)
        with torch.no_grad():
            better = vals > best_val
            best_val = torch.where(better, vals, best_val)
            best_Delta[better] = Delta[better]
        if t == steps:
            break
        (grad,) = torch.autograd.grad(vals.sum(), Delta)
        with torch.no_grad():
            eta = lr * radius * 0.5 * (1 + math.cos(math.pi * t / steps))
            gnorm = torch.linalg.vector_norm(grad, dim=-1, keepdim=True).clamp_min(1e-300)
            Delta = project_ball(Delta.detach() + eta * grad / gnorm, radius)
    return best_val.detach(), best_Delta.detach()


def _ascend(objective, Xt: torch.Tensor, row_list: list[int], *, starts: int, steps: int,
            seed: int, extra: torch.Tensor | None, lr: float, max_batch_elements: int,
            progress: bool):
    """The search shared by :func:`word_sensitivity` and the fast attention estimator
    (:func:`wsutils.attention.attention_word_sensitivity`): ``objective(chunk)`` returns a
    function ``values(row_idx, Delta) -> (B,)`` of relative changes for the rows of ``chunk``.
    Same seed, same starts and same steps whichever objective is used."""
    n, d = Xt.shape
    radius = math.sqrt(d)
    S = starts + (0 if extra is None else extra.shape[0])
    g = torch.Generator().manual_seed(int(seed))
    rows_per_chunk = max(1, max_batch_elements // (S * n * d))
    chunks = [row_list[j:j + rows_per_chunk] for j in range(0, len(row_list), rows_per_chunk)]
    per_row: dict[int, float] = {}
    best = (-1.0, row_list[0], torch.zeros(d, dtype=Xt.dtype))
    for chunk in tqdm(chunks, desc="word sensitivity", disable=not progress, leave=False):
        R = len(chunk)
        xi = sphere_starts(torch.randn(R, starts, d, generator=g, dtype=Xt.dtype), radius)
        Delta = xi.to(Xt.device)
        if extra is not None:
            Delta = torch.cat([Delta, extra.expand(R, -1, -1)], dim=1)
        Delta = project_ball(Delta.reshape(R * S, d), radius)
        row_idx = torch.tensor(chunk, device=Xt.device).repeat_interleave(S)
        values = objective(chunk)
        best_val, best_Delta = cosine_ascent(lambda D: values(row_idx, D), Delta, radius,
                                             steps=steps, lr=lr)
        vals = best_val.reshape(R, S).cpu()
        for j, r in enumerate(chunk):
            per_row[r] = float(vals[j].max())
        k = int(torch.argmax(best_val))
        if float(best_val[k]) > best[0]:
            best = (float(best_val[k]), chunk[k // S], best_Delta[k].detach().cpu())
    return per_row, best
