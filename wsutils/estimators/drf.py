"""Deep random features: the infinite-width limit of the word sensitivity (arc-cosine kernel)
and a finite-width estimator that never forms the ``k × D`` first layer
(chapter ``deep-random-features``).

He-scaled ReLU layers (:func:`wsutils.weights.sample_Vs`) keep the mean square of a unit
equal to ``‖x‖²/D`` and map the angle ``ϑ`` between two inputs by the degree-one arc-cosine
kernel :func:`arccos_map` (:prf:ref:`lem-drf-kernel`). The relative change of the output
therefore tends to ``√(ν² + 1 − 2ν cos ϑ_L)``, a function of the norm ratio ``ν`` and the angle
only (:prf:ref:`thm-drf-limit`), and :func:`drf_limit_sensitivity` maximises it over the ball.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._tensor import Array
from ..checks import as_text, check_int, check_real, check_seed
from ..search import Search, parse_fixed
from ..sensitivity import (
    ascend,
    autograd_values,
    check_rows,
    project_ball,
    search_dtype,
    search_setup,
    sphere_starts,
    sphere_step,
)
from .rf import PRECISIONS, _precision  # noqa: F401 (PRECISIONS: the values it takes)

__all__ = [
    "DRF_SEARCH",
    "arccos_map",
    "drf_limit_change",
    "drf_limit_sensitivity",
    "drf_row_law",
    "drf_row_sensitivity",
]


def arccos_map(cos_theta: Array, L: int = 1) -> np.ndarray:
    """``ψ^{∘L}``: ``L`` applications of ``ψ(cos ϑ) = (sin ϑ + (π − ϑ) cos ϑ)/π``, ``ϑ ∈ [0, π]``
    (:prf:ref:`lem-drf-kernel`): the cosine of the angle between two inputs after ``L``
    He-scaled ReLU layers of infinite width."""
    L = check_int("L", L, minimum=0)
    c = np.asarray(cos_theta, dtype=np.float64)
    if np.isnan(c).any():
        raise ValueError("cos_theta holds NaN: pass cosines in [-1, 1].")
    c = np.clip(c, -1.0, 1.0)
    for _ in range(L):
        th = np.arccos(c)
        c = np.clip((np.sin(th) + (np.pi - th) * np.cos(th)) / np.pi, -1.0, 1.0)
    return c


def _angle_map(theta: np.ndarray, L: int) -> np.ndarray:
    """``L`` steps of :func:`arccos_map` on angles, without cancellation near ``ϑ = 0``:
    ``1 − ψ(cos ϑ) = 2 sin²(ϑ/2) − (sin ϑ − ϑ cos ϑ)/π`` and ``ϑ' = 2 asin(√((1 − ψ)/2))``,
    with ``√((1 − ψ)/2) = u √(1 − w/u²)``, ``u = sin(ϑ/2)``, ``w = (sin ϑ − ϑ cos ϑ)/(2π)``:
    no square of a tiny angle is formed (``ϑ ≈ 1e-158`` would square to a subnormal
    number and lose its relative precision)."""
    for _ in range(L):
        u = np.sin(theta / 2)
        w = (np.sin(theta) - theta * np.cos(theta)) / (2 * np.pi)
        safe = np.where(u > 0, u, 1.0)  # u = 0 only at ϑ = 0, where w = 0 too
        ratio = w / safe / safe
        theta = 2 * np.arcsin(np.clip(u * np.sqrt(np.clip(1 - ratio, 0.0, None)), 0.0, 1.0))
    return theta


def drf_limit_change(n: int, L: int, r: Array, c: Array) -> np.ndarray:
    """The wide-limit relative change (:prf:ref:`thm-drf-limit`) of ``L`` He-scaled ReLU layers
    for a text of ``n`` words with rows of norm ``√d`` and ``‖Δ‖ = r√d``,
    ``⟨x_i, Δ⟩ = r η d`` (the argument ``c`` is the book's ``η``):
    ``√(ν² + 1 − 2ν ψ^{∘L}(cos ϑ₀))`` with ``ν² = 1 + (2rη + r²)/n`` and
    ``cos ϑ₀ = (1 + rη/n)/ν``. It does not depend on ``d``. Evaluated in the cancellation-free
    form ``√((ν − 1)² + 4ν sin²(ϑ_L/2))``, ``ϑ₀ = atan2(r√(1 − η²/n)/√n, 1 + rη/n)``, as
    ``hypot(ν − 1, 2√ν sin(ϑ_L/2))``: no square underflows for a tiny ``r`` (squaring
    ``r ≈ 1e-157`` lands among the subnormal numbers, whose relative error is large)."""
    n = check_real("n", n, positive=True)  # a real n: the formula is used as n's function
    L = check_int("L", L, minimum=0)
    r = np.asarray(r, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    if not (np.isfinite(r).all() and np.isfinite(c).all()):
        raise ValueError("r and c must be finite (r = ‖Δ‖/√d ≥ 0, c = η in [-1, 1]).")
    rho2_minus_1 = (2 * r * c + r**2) / n
    rho = np.sqrt(1 + rho2_minus_1)
    theta0 = np.arctan2(r * np.sqrt(np.clip(1 - c**2 / n, 0.0, None)) / np.sqrt(n), 1 + r * c / n)
    theta = _angle_map(theta0, L)
    return np.hypot(rho2_minus_1 / (rho + 1), 2 * np.sqrt(rho) * np.sin(theta / 2))


def drf_limit_sensitivity(n: int, L: int, *, grid: int = 401) -> tuple[float, float, float]:
    """``S_∞(n, L) = max_{0 ≤ r ≤ 1, −1 ≤ η ≤ 1} drf_limit_change(n, L, r, η)``
    (:prf:ref:`thm-drf-limit`), by a grid over ``(r, η)`` refined three times around the best
    point. Returns ``(S_∞, r*, η*)``."""
    n, L = check_int("n", n, minimum=1), check_int("L", L, minimum=0)
    grid = check_int("grid", grid, minimum=2)
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


def _draw_law(
    X64: torch.Tensor, L: int, k: int, row: int, seed: int, precision: torch.dtype = torch.float64
):
    """:func:`drf_row_law` on trusted input; drawn on the CPU, so that the weights depend on
    ``seed`` alone (never on the caller's dtype or device).

    ``precision`` float64: float64 normals, weights returned in float64. float32: the normals
    are drawn and scaled in float32 (four times faster on a CPU), so the weights ``A``, ``V_l``
    and the noise ``z`` are single-precision numbers (Gaussians rounded to 24 bits), returned
    in float32; ``b = A x_i + σ z`` is computed in float64 from their exact values. The two
    precisions draw different weights from one seed. ``b`` is float64 in both."""
    n, d = X64.shape
    D = n * d
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(k, d, generator=g, dtype=precision).mul_(math.sqrt(2 / D))
    z = torch.randn(k, generator=g, dtype=precision)
    Xc = X64.cpu()
    rest = float((Xc**2).sum() - (Xc[row] ** 2).sum())
    b = A.to(torch.float64) @ Xc[row] + math.sqrt(2 * max(rest, 0.0) / D) * z.to(torch.float64)
    Vs = [
        torch.randn(k, k, generator=g, dtype=precision).mul_(math.sqrt(2 / k))
        for _ in range(L - 1)
    ]
    return b, A, Vs


def drf_row_law(
    X: Array, L: int, k: int, row: int, *, seed: int, device=None, precision: str = "float64"
):
    """One draw of what ``L`` He-scaled ReLU layers of width ``k`` need for row ``i = row``:
    the first layer through :prf:ref:`prop-rf-row-law` (``b = A x_i + σ z``, ``A`` the ``k × d``
    block with ``N(0, 2/D)`` entries, ``σ² = 2‖flat(X_{−i})‖²/D``) and ``L − 1`` dense
    ``k × k`` layers with ``N(0, 2/k)`` entries. Returns ``(b, A, [V_2, …, V_L])`` in ``X``'s
    search dtype (:func:`wsutils.sensitivity.search_dtype`); the draw itself is in
    ``precision`` (``"float64"``, the default, or ``"float32"``: single-precision weights, see
    ``_draw_law``) on the CPU, so it depends on ``seed`` and ``precision`` only."""
    Xt, n, d = as_text(X, device=device)
    dt = search_dtype(Xt.dtype)
    row = _one_row(row, n)
    L = check_int("L (the number of layers)", L, minimum=1)
    k = check_int("k (the width of each layer)", k, minimum=1)
    b, A, Vs = _draw_law(Xt.to(torch.float64), L, k, row, check_seed(seed), _precision(precision))
    dev = Xt.device
    return b.to(dev, dt), A.to(dev, dt), [V.to(dev, dt) for V in Vs]


def _one_row(row, n: int) -> int:
    rows = check_rows(row, n)
    if len(rows) != 1:
        raise ValueError(f"row must be a single row index, got {rows}.")
    return rows[0]


def _drf_out(b, A, Vs, Delta):
    h = torch.relu(b[None] + Delta @ A.T)  # B × k
    for V in Vs:
        h = torch.relu(h @ V.T)
    return h


def _check_base(base: torch.Tensor) -> torch.Tensor:
    """``‖φ(X)‖``; zero (no unit of the last layer active) is a ValueError."""
    norm = torch.linalg.vector_norm(base)
    if not float(norm) > 0:
        raise ValueError(
            "no unit of the last layer is active at X (φ(X) = 0 for this draw): "
            "the relative change is undefined; try another seed or a wider k."
        )
    return norm


def _drf_out64(b64, A, Vs, Delta64):
    """:func:`_drf_out` in float64 for weights of any float dtype, taken at their exact values.
    Layers that are not float64 are converted into one reused ``k × k`` float64 buffer (no
    float64 copy of the network, and no fresh allocation per layer)."""
    h = torch.relu(b64[None] + Delta64 @ A.to(torch.float64).T)
    buf = None
    for V in Vs:
        if V.dtype != torch.float64:
            if buf is None or buf.shape != V.shape:
                buf = torch.empty(V.shape, dtype=torch.float64, device=V.device)
            V = buf.copy_(V)
        h = torch.relu(h @ V.T)
    return h


#: The default search of :func:`drf_row_sensitivity`: 4 starts (the first the authors'
#: ``0.1·ξ``), 60 steps, each landing on the sphere; the starts' seed is the weights' ``seed + 1``.
DRF_SEARCH = Search(starts=4, steps=60)


def drf_row_sensitivity(
    X: Array,
    L: int,
    k: int,
    *,
    row: int = 0,
    seed: int = 0,
    search: Search | dict | None = None,
    init: Array | None = None,
    check_norms: bool = True,
    device=None,
    precision: str = "float64",
) -> tuple[float, np.ndarray]:
    """Best relative change found for one row of a width-``k`` DRF (law of
    :func:`drf_row_law`), by projected gradient ascent on the sphere ``‖Δ‖ = √d`` (each step
    moves to the sphere along the normalised gradient) from the authors' ``0.1·ξ``,
    ``starts − 1`` random points of the sphere and the rows of ``init`` (a vector of length
    ``d`` or an ``m × d`` array); best iterate kept. ``search``: a
    :class:`~wsutils.search.Search` or a dict of its fields (default :data:`DRF_SEARCH`: 4
    starts, 60 steps), of which this search reads ``starts``, ``steps``, ``stop`` and ``seed``
    (default ``seed + 1``); its precision is set by ``precision`` and each step lands on the
    sphere, so a ``lr``, ``dtype``, ``max_batch_elements`` or ``progress`` other than
    :data:`DRF_SEARCH`'s is a ValueError (:func:`wsutils.search.parse_fixed`). The search runs
    in ``X``'s search dtype; the best iterate of every start is re-evaluated in float64 and
    the best of those is returned: a certified lower bound on the row's sensitivity for that
    draw. Returns
    ``(value, Δ)`` with ``Δ`` a float64 vector in the ball exactly. If no unit of the last
    layer is active at ``X`` (``φ(X) = 0``) the relative change is undefined: ValueError.

    ``precision="float32"`` draws the weights in single precision (``_draw_law``: a different
    draw from the same seed) and runs the search in float32 whatever ``X``'s dtype; the best
    iterate of every start is still re-evaluated in float64 at the weights' exact values, so
    the value is a certified lower bound for the drawn weights. Each step is two passes over
    the ``L − 1`` dense ``k × k`` layers, limited by memory bandwidth, so half the bytes is
    about twice as fast, and the draw is four times faster
    (``python -m benchmarks.bench_drf``).

    Returns
    -------
    tuple of (float, numpy.ndarray)
        The certified lower bound and the float64 ``Δ`` attaining it.

    Raises
    ------
    TypeError
        If ``L``, ``k``, ``row`` or ``seed`` is not an integer, or ``X``
        is complex or not numeric.
    ValueError
        If no unit of the last layer is active at ``X`` (``φ(X) = 0``: the relative change
        divides by a zero base output; it used to return ``−1.0``), or an input check of
        :func:`wsutils.sensitivity.search_setup` fails.
    """
    fixed = ("lr", "dtype", "max_batch_elements", "progress", "halving")
    search = parse_fixed(search, DRF_SEARCH, fixed, "the deep random-feature search")
    starts, steps = search.starts, search.steps
    Xt, rows, extra = search_setup(
        X, rows=row, starts=starts, steps=steps, init=init, check_norms=check_norms, device=device
    )
    if len(rows) != 1:
        raise ValueError(f"row must be a single row index, got {rows}.")
    L = check_int("L (the number of layers)", L, minimum=1)
    k = check_int("k (the width of each layer)", k, minimum=1)
    seed = check_seed(seed)
    draw = _precision(precision)
    n, d = Xt.shape
    dt, dev = (Xt.dtype if draw == torch.float64 else torch.float32), Xt.device
    b64, A64, Vs64 = _draw_law(Xt.to(torch.float64), L, k, rows[0], seed, draw)
    if draw == torch.float64:
        with torch.no_grad():
            base64 = _drf_out(b64, A64, Vs64, torch.zeros(1, d, dtype=torch.float64))
        _check_base(base64)
    # the search's copies (the drawn tensors themselves on the CPU when the dtypes agree);
    # A64, Vs64 are the drawn weights in their own precision, read exactly by _drf_out64
    b, A, Vs = b64.to(dev, dt), A64.to(dev, dt), [V.to(dev, dt) for V in Vs64]
    radius = math.sqrt(d)
    g = torch.Generator().manual_seed(search.start_seed((seed + 1) % 2**63))
    xi = sphere_starts(torch.randn(starts, d, generator=g, dtype=torch.float64), radius)
    xi = xi.to(dt)
    if extra is not None:
        xi = torch.cat([xi, extra.cpu().to(dt)])
    Delta = project_ball(xi.to(dev), radius, exact=False)
    with torch.no_grad():
        base = _drf_out(b, A, Vs, torch.zeros(1, d, dtype=dt, device=dev))
        base_norm = _check_base(base)

    def values(D: torch.Tensor) -> torch.Tensor:  # the relative change at each row of D
        return torch.linalg.vector_norm(_drf_out(b, A, Vs, D) - base, dim=1) / base_norm

    _, best = ascend(
        autograd_values(values),
        Delta,
        steps=steps,
        step=sphere_step(radius),
        stop=search.stop,
    )
    # every start's best iterate, in float64 on the exact ball, re-evaluated in float64
    D64 = project_ball(best.detach().cpu().to(torch.float64), radius)
    with torch.no_grad():
        if draw == torch.float64:
            out64 = _drf_out(b64, A64, Vs64, D64)
        else:  # φ(X) in the same float64 pass over the layers as the candidates
            both = _drf_out64(b64, A64, Vs64, torch.cat([torch.zeros(1, d, dtype=D64.dtype), D64]))
            base64, out64 = both[:1], both[1:]
        vals64 = torch.linalg.vector_norm(out64 - base64, dim=1) / _check_base(base64)
    j = int(torch.argmax(vals64))
    return float(vals64[j]), D64[j].numpy().copy()
