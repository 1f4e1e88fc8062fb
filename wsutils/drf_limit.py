"""Deep random features: the infinite-width limit of the word sensitivity (arc-cosine kernel)
and a finite-width estimator that never forms the ``k × D`` first layer
(chapter ``deep-random-features``).

He-scaled ReLU layers (:func:`wsutils.weights.sample_Vs`) keep the mean square of a unit
equal to ``‖x‖²/D`` and map the angle ``θ`` between two inputs by the degree-one arc-cosine
kernel :func:`arccos_map` (:prf:ref:`lem-drf-kernel`). The relative change of the output
therefore tends to ``√(ρ² + 1 − 2ρ cos θ_L)``, a function of the norm ratio ``ρ`` and the angle
only (:prf:ref:`thm-drf-limit`), and :func:`drf_limit_sensitivity` maximises it over the ball.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._tensor import Array, as_tensor
from .checks import check_text, check_unit_rows
from .sensitivity import _rows, project_ball, sphere_starts

__all__ = ["arccos_map", "drf_limit_change", "drf_limit_sensitivity", "drf_row_law",
           "drf_row_sensitivity", "drf_point"]


def arccos_map(cos_theta: Array, L: int = 1) -> np.ndarray:
    """``κ^{∘L}``: ``L`` applications of ``κ(c) = (sin θ + (π − θ) cos θ)/π``, ``θ = arccos c``
    (:prf:ref:`lem-drf-kernel`): the cosine of the angle between two inputs after ``L``
    He-scaled ReLU layers of infinite width."""
    if L < 0:
        raise ValueError(f"L must be ≥ 0, got {L}.")
    c = np.clip(np.asarray(cos_theta, dtype=np.float64), -1.0, 1.0)
    for _ in range(L):
        th = np.arccos(c)
        c = np.clip((np.sin(th) + (np.pi - th) * np.cos(th)) / np.pi, -1.0, 1.0)
    return c


def _angle_map(theta: np.ndarray, L: int) -> np.ndarray:
    """``L`` steps of :func:`arccos_map` on angles, without cancellation near ``θ = 0``:
    ``1 − κ(cos θ) = 2 sin²(θ/2) − (sin θ − θ cos θ)/π`` and ``θ' = 2 asin(√((1 − κ)/2))``."""
    for _ in range(L):
        one_minus = 2 * np.sin(theta / 2) ** 2 - (np.sin(theta) - theta * np.cos(theta)) / np.pi
        theta = 2 * np.arcsin(np.sqrt(np.clip(one_minus / 2, 0.0, 1.0)))
    return theta


def drf_limit_change(n: int, L: int, r: Array, c: Array) -> np.ndarray:
    """The wide-limit relative change (:prf:ref:`thm-drf-limit`) of ``L`` He-scaled ReLU layers
    for a text of ``n`` words with rows of norm ``√d`` and ``‖Δ‖ = r√d``,
    ``⟨x_i, Δ⟩ = r c d``: ``√(ρ² + 1 − 2ρ κ^{∘L}(cos θ₀))`` with ``ρ² = 1 + (2rc + r²)/n`` and
    ``cos θ₀ = (1 + rc/n)/ρ``. It does not depend on ``d``. Evaluated in the cancellation-free
    form ``(ρ − 1)² + 4ρ sin²(θ_L/2)``, ``θ₀ = atan2(r√(1 − c²/n)/√n, 1 + rc/n)``."""
    r = np.asarray(r, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    rho2_minus_1 = (2 * r * c + r ** 2) / n
    rho = np.sqrt(1 + rho2_minus_1)
    theta0 = np.arctan2(r * np.sqrt(np.clip(1 - c ** 2 / n, 0.0, None)) / np.sqrt(n), 1 + r * c / n)
    theta = _angle_map(theta0, L)
    sq = (rho2_minus_1 / (rho + 1)) ** 2 + 4 * rho * np.sin(theta / 2) ** 2
    return np.sqrt(sq)


def drf_limit_sensitivity(n: int, L: int, *, grid: int = 401) -> tuple[float, float, float]:
    """``S_∞(n, L) = max_{0 ≤ r ≤ 1, −1 ≤ c ≤ 1} drf_limit_change(n, L, r, c)``
    (:prf:ref:`thm-drf-limit`), by a grid over ``(r, c)`` refined three times around the best
    point. Returns ``(S_∞, r*, c*)``."""
    if n < 1 or L < 0:
        raise ValueError(f"need n ≥ 1 and L ≥ 0, got n={n}, L={L}.")
    r_lo, r_hi, c_lo, c_hi = 0.0, 1.0, -1.0, 1.0
    best = (-1.0, 0.0, 0.0)
    for _ in range(4):
        R, C = np.meshgrid(np.linspace(r_lo, r_hi, grid), np.linspace(c_lo, c_hi, grid))
        F = drf_limit_change(n, L, R, C)
        j = np.unravel_index(np.argmax(F), F.shape)
        if F[j] > best[0]:
            best = (float(F[j]), float(R[j]), float(C[j]))
        hr, hc = 4 * (r_hi - r_lo) / grid, 4 * (c_hi - c_lo) / grid
        r_lo, r_hi = max(0.0, best[1] - hr), min(1.0, best[1] + hr)
        c_lo, c_hi = max(-1.0, best[2] - hc), min(1.0, best[2] + hc)
    return best


def drf_row_law(X: Array, L: int, k: int, row: int, *, seed: int, device=None):
    """One draw of what ``L`` He-scaled ReLU layers of width ``k`` need for row ``i = row``:
    the first layer through :prf:ref:`prop-rf-row-law` (``b = A x_i + σ z``, ``A`` the ``k × d``
    block with ``N(0, 2/D)`` entries, ``σ² = 2‖flat(X_{−i})‖²/D``) and ``L − 1`` dense
    ``k × k`` layers with ``N(0, 2/k)`` entries. Returns ``(b, A, [V_2, …, V_L])``."""
    Xt = as_tensor(X, device=device)
    n, d = check_text(Xt)
    _rows(row, n)
    if L < 1 or k < 1:
        raise ValueError(f"need L ≥ 1 layers of width k ≥ 1, got L={L}, k={k}.")
    D = n * d
    g = torch.Generator().manual_seed(int(seed))
    A = torch.randn(k, d, generator=g, dtype=Xt.dtype) * math.sqrt(2 / D)
    z = torch.randn(k, generator=g, dtype=Xt.dtype)
    rest = float((Xt ** 2).sum() - (Xt[row] ** 2).sum())
    b = A @ Xt[row].cpu() + math.sqrt(2 * max(rest, 0.0) / D) * z
    Vs = [torch.randn(k, k, generator=g, dtype=Xt.dtype) * math.sqrt(2 / k) for _ in range(L - 1)]
    dev = Xt.device
    return b.to(dev), A.to(dev), [V.to(dev) for V in Vs]


def _drf_out(b, A, Vs, Delta):
    h = torch.relu(b[None] + Delta @ A.T)                      # B × k
    for V in Vs:
        h = torch.relu(h @ V.T)
    return h


def drf_row_sensitivity(X: Array, L: int, k: int, *, row: int = 0, seed: int = 0,
                        starts: int = 4, steps: int = 60, init: Array | None = None,
                        check_norms: bool = True, device=None) -> tuple[float, np.ndarray]:
    """Best relative change found for one row of a width-``k`` DRF (law of
    :func:`drf_row_law`), by projected gradient ascent on the sphere ``‖Δ‖ = √d`` (each step
    moves to the sphere along the normalised gradient) from the authors' ``0.1·ξ``,
    ``starts − 1`` random points of the sphere and the rows of ``init``; best iterate kept.
    A certified lower bound on the row's sensitivity for that draw. Returns ``(value, Δ)``."""
    Xt = as_tensor(X, device=device)
    n, d = check_text(Xt)
    if check_norms:
        check_unit_rows(Xt)
    if starts < 1 or steps < 0:
        raise ValueError(f"need starts ≥ 1 and steps ≥ 0, got starts={starts}, steps={steps}.")
    b, A, Vs = drf_row_law(Xt, L, k, row, seed=seed, device=Xt.device)
    radius = math.sqrt(d)
    g = torch.Generator().manual_seed(int(seed) + 1)
    xi = sphere_starts(torch.randn(starts, d, generator=g, dtype=Xt.dtype), radius)
    if init is not None:
        xi = torch.cat([xi, as_tensor(init, dtype=Xt.dtype).reshape(-1, d).cpu()])
    Delta = project_ball(xi.to(Xt.device), radius)
    with torch.no_grad():
        base = _drf_out(b, A, Vs, torch.zeros(1, d, dtype=Xt.dtype, device=Xt.device))
        base_norm = torch.linalg.vector_norm(base)
    best_val = torch.full((Delta.shape[0],), -1.0, dtype=Xt.dtype, device=Xt.device)
    best = Delta.clone()
    for t in range(steps + 1):
        Delta.requires_grad_(True)
        vals = torch.linalg.vector_norm(_drf_out(b, A, Vs, Delta) - base, dim=1) / base_norm
        with torch.no_grad():
            better = vals > best_val
            best_val = torch.where(better, vals, best_val)
            best[better] = Delta[better]
        if t == steps:
            break
        (grad,) = torch.autograd.grad(vals.sum(), Delta)
        with torch.no_grad():
            gn = torch.linalg.vector_norm(grad, dim=1, keepdim=True)
            step = project_ball(radius * grad / gn.clamp_min(1e-300), radius)
            Delta = torch.where(gn > 0, step, Delta.detach())
    j = int(torch.argmax(best_val))
    return float(best_val[j]), best[j].detach().cpu().numpy().copy()


def drf_point(*, n: int, d: int, L: int, k: int, seed: int, steps: int = 20) -> dict:
    """One grid point of the deep-random-features chapter (for :func:`wsutils.sweep.run_grid`):
    an isotropic text from ``seed``, weights from ``seed + 1``, first word, the ascent of
    :func:`drf_row_sensitivity` started also at the wide-limit maximiser ``Δ = x_1``. Returns
    the finite-width estimate ``S``, the wide limit ``S_inf`` and the seconds it took."""
    import time

    from .device import small_work_threads
    from .weights import sample_X

    t0 = time.perf_counter()
    X = sample_X(n, d, seed=seed)
    with small_work_threads(k * max(k, d), threshold=1 << 23):
        S, _ = drf_row_sensitivity(X, L, k, row=0, seed=seed + 1, starts=2, steps=steps,
                                   init=X[0])
    return {"S": S, "S_inf": drf_limit_sensitivity(n, L)[0],
            "seconds": time.perf_counter() - t0}
