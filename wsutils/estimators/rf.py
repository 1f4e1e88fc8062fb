"""Random features without the ``k × D`` matrix: the exact estimator of ``S_RF`` and its
certified bounds (chapter ``random-features``).

Only the ``k × d`` column block ``V_i`` of ``V`` multiplies word ``i``, so
``V flat(X_i(Δ)) = V flat(X) + V_i Δ``. Two ways of drawing what the estimator needs, both
exact in law for ``V`` with i.i.d. ``N(0, 1/D)`` entries (:prf:ref:`prop-rf-row-law`):

``reduced`` (one row ``i``)
    ``(V flat(X), V_i)`` has the law of ``(V_i x_i + σ_{−i} z, V_i)`` with
    ``σ_{−i} = ‖flat(X_{−i})‖/√D`` and ``z ~ N(0, I_k)`` independent of ``V_i``, because
    ``V_{−i} flat(X_{−i})`` is a Gaussian vector independent of ``V_i``. Memory ``O(k·d)``.
``rows`` (several rows ``S = {i_1, …, i_m}``, one joint law)
    ``(V flat(X), V_{i_1}, …, V_{i_m})`` has the law of
    ``(Σ_{i∈S} V_i x_i + σ_S z, V_{i_1}, …, V_{i_m})`` with ``σ_S = ‖flat(X_{−S})‖/√D``
    (the rows outside ``S``) and ``z ~ N(0, I_k)`` independent of the blocks
    (:func:`rf_rows_law`): only the searched blocks are drawn, not all ``n``. The blocks are
    those of ``blocks`` mode (:func:`rf_weight_block`), so every row searched sees the same
    ``V_i`` in both modes; with every row searched ``σ_S = 0`` and ``g`` is that of
    ``blocks`` mode to the last bit. Memory ``O(k·d)``.
``blocks`` (several or all rows, one joint ``V``)
    ``V`` is drawn column block by column block, block ``j`` from its own seed
    (:func:`rf_weight_block`), so ``V flat(X) = Σ_j V_j x_j`` is streamed and each ``V_i``
    is regenerated when row ``i`` is searched; ``k × D`` is never held. Memory ``O(k·d)``.
    The normals are drawn in single precision (Gaussians rounded to 24 bits) and the map is
    computed in double.

In both modes the weights are a function of the seed alone (``reduced``: float64 normals;
``blocks``: float32 normals from the block's own seed), whatever the dtype or device of ``X``,
and every reported number (value, bounds, ``Δ``) is computed in float64 from ``X`` converted to
float64 (a float16 or float32 text gives exactly the numbers of its float64 copy).

The bounds are functions of the drawn ``(V flat(X), V_i)``:
:func:`rf_certified_upper` (:prf:ref:`lem-rf-deterministic`),
:func:`rf_certified_lower` (:prf:ref:`thm-rf-lower`), and the high-probability constant of
:prf:ref:`thm-rf-upper`, :func:`rf_high_probability_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .._tensor import Array
from ..checks import (
    as_tensor,
    check_finite,
    check_int,
    check_preactivations,
    check_seed,
    check_text,
)
from ..maps import flat
from ..run.device import check_fits, optional_device, small_work_threads
from ..search import Search, parse_fixed
from ..sensitivity import (
    SensitivityResult,
    ascend,
    check_rows,
    project_ball,
    search_setup,
    sphere_starts,
    sphere_step,
)
from . import _rf_step

__all__ = [
    "RFSensitivityResult",
    "rf_block_seed",
    "rf_weight_block",
    "rf_row_law",
    "rf_preactivation",
    "rf_certified_upper",
    "rf_certified_lower",
    "rf_high_probability_bound",
    "rf_relative_change",
    "RF_SEARCH",
    "rf_search",
    "rf_word_sensitivity",
    "rf_rows_law",
    "rf_rows_noise_seed",
    "PRECISIONS",
]


@dataclass(repr=False)  # the one-line summary of SensitivityResult
class RFSensitivityResult(SensitivityResult):
    """:class:`~wsutils.sensitivity.SensitivityResult` plus the certified bounds.

    ``upper`` (the base class's) is ``max_i S̄_i`` over the searched rows, the largest upper
    certificate (:func:`rf_certified_upper`; ``None`` with ``upper=False``), ``lower`` is
    ``max_i S̲_i``, the largest lower certificate (:func:`rf_certified_lower`): for the drawn
    weights, ``lower ≤ value ≤ sup_{searched i, ‖Δ‖≤√d} (relative change) ≤ upper``.
    ``per_row_upper``/``per_row_lower`` hold the upper and lower certificates ``S̄_i``/``S̲_i``
    (the book's overline and underline S_i); ``phi_norm`` is ``‖φ_RF(X)‖``;
    ``mode`` is ``"reduced"``, ``"blocks"`` or ``"rows"`` (module docstring); ``k`` the width.
    """

    lower: float = math.nan
    per_row_lower: dict[int, float] = field(default_factory=dict)
    phi_norm: float = math.nan
    mode: str = ""
    k: int = 0


#: The default search of :func:`rf_word_sensitivity`: 2 starts (plus the ``±Δ`` of
#: :prf:ref:`thm-rf-lower`), 30 steps, iterations in float32 (each step is two passes over the
#: ``k × d`` block ``V_i``, limited by memory bandwidth); the seed of the starts is the
#: weights' ``seed + 1`` unless the search sets one.
RF_SEARCH = Search(starts=2, steps=30, dtype="float32")


def rf_block_seed(seed: int, block: int) -> int:
    """The seed of column block ``block`` of ``V`` in ``blocks`` mode (from ``SeedSequence``).
    ``seed`` is checked by ``wsutils.checks.check_seed`` (in ``[0, 2**63)``)."""
    seed = check_seed(seed)
    block = check_int("block", block, minimum=0)
    return int(np.random.SeedSequence([seed, block]).generate_state(1)[0])


def rf_weight_block(
    k: int,
    n: int,
    d: int,
    block: int,
    *,
    seed: int,
    device=None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Column block ``V_i`` (``k × d``, entries ``N(0, 1/D)``, ``D = n·d``) of the ``blocks``-mode
    ``V``: ``torch.cat([rf_weight_block(..., j) for j in range(n)], 1)`` is the whole ``V``.

    The weights are single-precision numbers (normals drawn and scaled in float32, six times
    faster than double on CPU; every block is drawn twice per search, see the module
    docstring), returned in ``dtype`` (float64: their exact values). They are a function of
    ``(seed, block)`` alone: the normals are float32 whatever ``dtype``, so every ``dtype``
    gives the same numbers (exactly, for float32 and float64). The estimator keeps them in
    float32 and does every product that enters a reported number in float64 (``_mm64``)."""
    k, n, d = (check_int(name, v, minimum=1) for name, v in (("k", k), ("n", n), ("d", d)))
    block = check_int("block", block)
    if not 0 <= block < n:
        raise ValueError(f"block {block} is out of range for a text of n = {n} words.")
    check_fits(k * d * (4 + dtype.itemsize), f"a {k} × {d} weight block", hint="use a smaller k")
    g = torch.Generator().manual_seed(rf_block_seed(seed, block))
    out = torch.randn(k, d, generator=g, dtype=torch.float32).mul_(1 / math.sqrt(n * d))
    return out.to(device=device, dtype=dtype)


def _blocks64(A: torch.Tensor, block: int = 8192):
    """Yield ``(start, rows)``: the rows of a tall ``A`` (any float dtype) a block at a time, in
    float64, so that no float64 copy of the whole ``A`` is made (a no-op when ``A`` is float64).
    A non-float64 ``A`` is converted into one reused buffer (a fresh block per step costs ten
    times the copy in page faults), so each yielded block is valid only until the next one."""
    if A.dtype == torch.float64:
        for s in range(0, A.shape[0], block):
            yield s, A[s : s + block]
        return
    buf = torch.empty(min(block, A.shape[0]), *A.shape[1:], dtype=torch.float64, device=A.device)
    for s in range(0, A.shape[0], block):
        rows = A[s : s + block]
        yield s, buf[: rows.shape[0]].copy_(rows)


def _mm64(A: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """``A @ M`` in float64 for a tall ``A`` of any float dtype (:func:`_blocks64`)."""
    M = M.to(torch.float64)
    out = torch.empty(A.shape[0], *M.shape[1:], dtype=torch.float64, device=A.device)
    for s, B in _blocks64(A):
        out[s : s + B.shape[0]] = B @ M
    return out


def rf_preactivation(X: Array, k: int, *, seed: int, device=None) -> torch.Tensor:
    """``V flat(X) = Σ_j V_j x_j`` for the ``blocks``-mode ``V``, streamed block by block
    (computed in float64, returned in ``X``'s dtype)."""
    Xt = as_tensor(X, device=optional_device(device))
    n, d = check_text(Xt)
    k = check_int("k", k, minimum=1)
    u = torch.zeros(k, dtype=torch.float64, device=Xt.device)
    for j in range(n):
        u += _mm64(
            rf_weight_block(k, n, d, j, seed=seed, device=Xt.device, dtype=torch.float32), Xt[j]
        )
    return u.to(Xt.dtype)


def rf_rows_noise_seed(seed: int) -> int:
    """The seed of the Gaussian vector ``z`` of :func:`rf_rows_law` (from ``SeedSequence``,
    with a key of another length than :func:`rf_block_seed`'s, so it is none of the blocks')."""
    seed = check_seed(seed)
    return int(np.random.SeedSequence([seed, 0, 1]).generate_state(1)[0])


def rf_rows_law(X: Array, k: int, rows: Sequence[int], *, seed: int, device=None) -> torch.Tensor:
    """``g`` with ``(g, V_{i_1}, …, V_{i_m})`` distributed as ``(V flat(X), V_{i_1}, …,
    V_{i_m})`` for the rows ``S = rows`` (``rows`` mode of the module docstring; the several-row
    form of :prf:ref:`prop-rf-row-law`, stated in the IMDb chapter as
    :prf:ref:`prop-rf-rows-law`): ``g = Σ_{i∈S} V_i x_i + σ_S z`` with ``V_i`` the
    ``blocks``-mode blocks (:func:`rf_weight_block`, drawn once each here and regenerated by
    the search), ``σ_S = ‖flat(X_{−S})‖/√D`` and ``z`` float64 normals from
    :func:`rf_rows_noise_seed`. When ``S`` is every row, ``σ_S = 0``, no ``z`` is added and
    ``g`` equals :func:`rf_preactivation` exactly (same blocks, same order of summation).
    Returns ``g`` in float64; ``X`` is converted to float64 first."""
    Xt = as_tensor(X, device=optional_device(device)).to(torch.float64)
    n, d = check_text(Xt)
    k = check_int("k", k, minimum=1)
    row_list = _check_rows(rows)
    row_list = [row_list] if isinstance(row_list, int) else row_list
    if not row_list:
        raise ValueError("rows is empty: pass the rows whose blocks the search will use.")
    for r in row_list:
        check_rows(r, n)
    if len(set(row_list)) != len(row_list):
        raise ValueError(f"rows has repeated entries: {row_list}.")
    seed = check_seed(seed)
    D = n * d
    u = torch.zeros(k, dtype=torch.float64, device=Xt.device)
    for j in sorted(row_list):  # the order of rf_preactivation's sum
        u += _mm64(
            rf_weight_block(k, n, d, j, seed=seed, device=Xt.device, dtype=torch.float32), Xt[j]
        )
    out = torch.ones(n, dtype=torch.bool, device=Xt.device)
    out[row_list] = False
    rest = float((Xt[out] ** 2).sum())  # ‖flat(X_{−S})‖², exactly 0 when S = all rows
    if rest > 0:
        g = torch.Generator().manual_seed(rf_rows_noise_seed(seed))
        z = torch.randn(k, generator=g, dtype=torch.float64).to(Xt.device)
        u += math.sqrt(rest / D) * z
    return u


#: The values of ``precision`` (:func:`rf_row_law`, :func:`rf_word_sensitivity` and the DRF
#: estimators of :mod:`wsutils.estimators.drf`): the dtype the weights are drawn in.
PRECISIONS = {"float64": torch.float64, "float32": torch.float32}


def _precision(precision) -> torch.dtype:
    """``precision`` (``"float64"``/``"float32"`` or the torch dtype) as a torch dtype."""
    if precision in PRECISIONS.values():
        return precision
    if isinstance(precision, str) and precision.strip().lower() in PRECISIONS:
        return PRECISIONS[precision.strip().lower()]
    raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}.")


def rf_row_law(X: Array, k: int, row: int, *, seed: int, device=None, precision: str = "float64"):
    """One draw of ``(V flat(X), V_i)`` for ``i = row`` from the law of
    :prf:ref:`prop-rf-row-law`: ``V_i`` with i.i.d. ``N(0, 1/D)`` entries and
    ``g = V flat(X) = V_i x_i + σ_{−i} z``, ``σ_{−i} = ‖flat(X_{−i})‖/√D``. Returns
    ``(g, V_i)``, ``g`` in float64 (``g`` is what the functions below take as their argument
    ``u``).

    ``precision="float64"`` (default): ``V_i`` and ``z`` are float64 normals, ``V_i`` is
    returned in float64. ``"float32"``: they are drawn and scaled in single precision (four
    times faster; Gaussians rounded to 24 bits, as the ``blocks`` mode's weights) and ``V_i``
    is returned in float32, its exact values; ``g`` is computed in float64 from them. The two
    precisions draw different weights from one seed; either is a function of ``seed`` alone,
    whatever ``X``'s dtype or device; ``X`` is converted to float64 first."""
    Xt = as_tensor(X, device=optional_device(device)).to(torch.float64)
    n, d = check_text(Xt)
    k = check_int("k", k, minimum=1)
    row = check_int("row", row)
    check_rows(row, n)
    seed = check_seed(seed)
    draw = _precision(precision)
    D = n * d
    check_fits(k * d * draw.itemsize, f"a {k} × {d} weight block", hint="use a smaller k")
    g = torch.Generator().manual_seed(seed)
    Vi = torch.randn(k, d, generator=g, dtype=draw).div_(math.sqrt(D)).to(Xt.device)
    z = torch.randn(k, generator=g, dtype=draw).to(Xt.device, torch.float64)
    rest = float(torch.linalg.vector_norm(flat(Xt)) ** 2 - torch.linalg.vector_norm(Xt[row]) ** 2)
    sigma = math.sqrt(max(rest, 0.0) / D)
    gx = Vi @ Xt[row] if draw == torch.float64 else _mm64(Vi, Xt[row])
    return gx + sigma * z, Vi


def rf_relative_change(u: torch.Tensor, Vi: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
    """``‖ReLU(u + V_i Δ) − ReLU(u)‖ / ‖ReLU(u)‖`` for a batch ``Delta`` (``B × d``) or one
    ``Δ``: the relative change of :prf:ref:`def-word-sensitivity` for ``φ_RF``, with
    ``u`` the pre-activations ``g = V flat(X)``. Computed in float64 whatever ``Vi``'s dtype.

    Raises a ValueError when ``u`` does not have one entry per row of ``V_i``, when ``Δ`` is
    not ``d`` long (or ``B × d``) with ``d = V_i.shape[1]``, or when it holds a NaN or an
    infinity."""
    check_preactivations("u", u, Vi)
    d = Vi.shape[1]
    if Delta.ndim not in (1, 2) or Delta.shape[-1] != d:
        raise ValueError(
            f"Delta must be one perturbation of length d = {d} or a batch (B, {d}), "
            f"got shape {tuple(Delta.shape)}."
        )
    check_finite("Delta", Delta)
    single = Delta.ndim == 1
    Dm = Delta.reshape(-1, Vi.shape[1])
    u = u.to(torch.float64)
    base = torch.relu(u)
    diff = torch.relu(u[:, None] + _mm64(Vi, Dm.T)) - base[:, None]
    out = torch.linalg.vector_norm(diff, dim=0) / torch.linalg.vector_norm(base)
    return out[0] if single else out


def _syrk_into(G: torch.Tensor, B: torch.Tensor) -> None:
    """``G += BᵀB`` for a ``d × d`` accumulator ``G`` of ``B``'s dtype, only its upper triangle
    filled on the CPU (BLAS ``syrk``: half the products of ``B.T @ B``; :func:`_symmetric`
    completes it), the whole matrix elsewhere."""
    if B.shape[0] == 0:
        return
    if B.device.type != "cpu" or B.dtype not in (torch.float32, torch.float64):
        G += B.T @ B
        return
    from scipy.linalg import blas

    syrk = blas.ssyrk if B.dtype == torch.float32 else blas.dsyrk
    # B row-major is Bᵀ column-major; G's transpose is column-major and its lower triangle is
    # G's upper one, which syrk (lower=1 on the transpose) updates in place
    syrk(1.0, B.contiguous().numpy().T, beta=1.0, c=G.numpy().T, lower=1, overwrite_c=1)


def _symmetric(G: torch.Tensor | None) -> torch.Tensor | None:
    """The full symmetric matrix from the upper triangle :func:`_syrk_into` filled."""
    if G is None or G.device.type != "cpu":
        return G
    return torch.triu(G) + torch.triu(G, 1).T


def _grams(A: torch.Tensor, active: torch.Tensor | None, full: bool = True):
    """``AᵀA`` and, if ``active`` is given, ``A_Jᵀ A_J`` (rows ``J = active``), in float64,
    accumulated over row blocks (:func:`_blocks64`, BLAS ``syrk``) so that no copy of ``A`` is
    made. ``full=False`` (with ``active``) skips the rows outside ``J`` and returns
    ``(None, A_JᵀA_J)``: the same ``A_JᵀA_J``, for a caller that needs no upper certificate."""
    d = A.shape[1]
    G = torch.zeros(d, d, dtype=torch.float64, device=A.device)
    GJ = torch.zeros_like(G) if active is not None else None
    for s, B in _blocks64(A):
        if active is None:
            _syrk_into(G, B)
            continue
        m = active[s : s + B.shape[0]]
        _syrk_into(GJ, B[m])
        if full:
            _syrk_into(G, B[~m])
    if GJ is not None and not full:
        return None, _symmetric(GJ)
    if GJ is not None:
        G += GJ
    return _symmetric(G), _symmetric(GJ)


def _top(G: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Top singular value and right singular vector from a Gram matrix (``eigh``, float64)."""
    evals, evecs = torch.linalg.eigh(G)
    return math.sqrt(max(float(evals[-1]), 0.0)), evecs[:, -1]


def _upper_from(G, u, d) -> float:
    return math.sqrt(d) * _top(G)[0] / float(torch.linalg.vector_norm(torch.relu(u)))


def _lower_from(GJ, u, Vi) -> tuple[float, torch.Tensor]:
    """:prf:ref:`thm-rf-lower` at ``v``, the top eigenvector of ``GJ`` (``≈ (V_i)_Jᵀ(V_i)_J``):
    ``Δ = ±√d v`` with the sign of the larger ``‖ReLU(±a)‖``, ``a = (V_i v)_J``, and the
    certificate ``√(d/2)·‖a‖/‖ReLU(g)‖`` with ``‖a‖`` computed in float64 from that ``v`` (the
    proof holds for every unit ``v``; at the top singular vector ``‖a‖ = ‖(V_i)_J‖_op``, so
    a ``v`` a little off the top costs the certificate only the square of its error)."""
    d = Vi.shape[1]
    _, v = _top(GJ)
    v = v / torch.linalg.vector_norm(v)
    a = _mm64(Vi, v)[u > 0]
    if float(torch.linalg.vector_norm(torch.relu(-a))) > float(
        torch.linalg.vector_norm(torch.relu(a))
    ):
        v = -v
    Delta = project_ball(math.sqrt(d) * v[None], math.sqrt(d))[0]
    norm_a = float(torch.linalg.vector_norm(a))
    return math.sqrt(d / 2) * norm_a / float(torch.linalg.vector_norm(torch.relu(u))), Delta


def _check_active(u: torch.Tensor) -> torch.Tensor:
    active = u > 0
    if not bool(active.any()):
        raise ValueError("no unit is active (V flat(X) ≤ 0 everywhere): φ_RF(X) = 0, S undefined.")
    return active


def rf_certified_upper(u: torch.Tensor, Vi: torch.Tensor) -> float:
    """The upper certificate ``S̄_i = √d ‖V_i‖_op / ‖ReLU(g)‖`` (:prf:ref:`lem-rf-deterministic`),
    ``u`` the pre-activations ``g = V flat(X)``: since ReLU is 1-Lipschitz, every ``‖Δ‖ ≤ √d``
    gives a relative change at most ``S̄_i`` for these weights.

    ``‖V_i‖_op`` is the square root of the top eigenvalue of the Gram matrix ``V_iᵀV_i``,
    computed in float64 (a relative rounding error of order ``1e-13``)."""
    check_preactivations("u", u, Vi)
    _check_active(u)
    G, _ = _grams(Vi, None)
    return _upper_from(G, u, Vi.shape[1])


def rf_certified_lower(u: torch.Tensor, Vi: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The explicit perturbation of :prf:ref:`thm-rf-lower` and the bound it certifies.

    With ``u`` the pre-activations ``g = V flat(X)``: ``J = {j : g_j > 0}`` (active units),
    ``v_J`` the top right singular vector of the rows ``J`` of ``V_i``, ``s_J = ‖(V_i)_J‖_op``;
    of ``Δ = ±√d v_J`` the sign with the larger ``‖ReLU((V_i Δ)_J)‖`` is returned, with the
    lower certificate ``S̲_i = √(d/2)·s_J / ‖ReLU(g)‖``: the relative change at the returned
    ``Δ`` is at least ``S̲_i``. Returns ``(S̲_i, Δ)``, ``S̲_i`` with ``s_J`` computed as
    ``‖(V_i)_J v‖`` in float64 at the computed ``v ≈ v_J`` (what the proof certifies for that
    ``v``; below the exact ``s_J`` by the square of ``v``'s rounding error). A ValueError when
    ``u`` is not one pre-activation per row of ``V_i`` (or either is not finite)."""
    check_preactivations("u", u, Vi)
    _, GJ = _grams(Vi, _check_active(u))
    return _lower_from(GJ, u, Vi)


def rf_high_probability_bound(n: int, d: int, k: int, delta: float) -> float:
    """``C(k, d, n, δ)/√n`` of :prf:ref:`thm-rf-upper`: with probability ``≥ 1 − δ`` over ``V``,
    ``S_RF(X) ≤ (√k + √d + ε_V) / (√n (√(k/2 − 1) − ε_g))`` with ``ε_V = √(2 log(4n/δ))`` and
    ``ε_g = √(2 log(2/δ))`` (infinite if the denominator is ``≤ 0``)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}.")
    if min(n, d, k) < 1:
        raise ValueError(f"n, d, k must be positive, got n={n}, d={d}, k={k}.")
    t = math.sqrt(2 * math.log(4 * n / delta))
    s = math.sqrt(2 * math.log(2 / delta))
    den = math.sqrt(max(k / 2 - 1, 0.0)) - s
    if den <= 0:
        return math.inf
    return (math.sqrt(k) + math.sqrt(d) + t) / (math.sqrt(n) * den)


def _ascend(
    u: torch.Tensor,
    Vi: torch.Tensor,
    starts: torch.Tensor,
    steps: int,
    work_dtype: torch.dtype | None = torch.float32,
    stop: tuple[int, float] | None = None,
):
    """Projected ascent of the relative change from each row of ``starts``: the one ascent of
    every search (:func:`wsutils.sensitivity.ascend`) with this map's own gradient, every
    step landing on the sphere ``‖Δ‖ = √d`` along the gradient
    (:func:`~wsutils.sensitivity.sphere_step`: the fixed point of plain projected gradient
    ascent with a large step, as the authors' lr 100 is). Keeps the best iterate.

    ``stop = (m, rtol)``: stop before ``steps`` once the best value over all starts has gained
    at most ``rtol`` (relative) over the last ``m`` steps (the rule of every search,
    :func:`wsutils.sensitivity.stalled`; :func:`rf_word_sensitivity`). ``None`` (default):
    every step is taken.

    The iterations run in ``work_dtype`` (float32 by default: each step is two passes over the
    ``k × d`` matrix ``V_i``, limited by memory bandwidth, and single precision halves the
    bytes; three times faster at ``k = 192000``, ``d = 768``). The search only proposes ``Δ``:
    the caller re-evaluates the best iterate of every start in float64
    (:func:`rf_relative_change`), so rounding can at worst pick a slightly worse candidate."""
    if work_dtype is not None:
        Vi = Vi.to(work_dtype)
    u = u.to(Vi.dtype)
    radius = math.sqrt(Vi.shape[1])
    Delta = project_ball(starts.to(Vi.dtype), radius, exact=False)
    return ascend(
        _relative_change_objective(u, Vi), Delta, steps=steps, step=sphere_step(radius), stop=stop
    )


def _relative_change_objective(u: torch.Tensor, Vi: torch.Tensor):
    """The ``evaluate`` of :func:`wsutils.sensitivity.ascend` for row ``i``'s relative change
    ``‖ReLU(u + V_i Δ) − ReLU(u)‖ / ‖ReLU(u)‖`` (:func:`rf_relative_change`, in ``Vi``'s
    dtype), with its gradient written by hand: that of ``½‖ReLU(u + V_i Δ) − ReLU(u)‖²``,
    ``V_iᵀ (1[pre > 0] ⊙ diff)``, the same direction. Both in one pass over ``V_i``, a block
    of about ``2²⁰`` entries at a time (its rows' two products while the block is in cache:
    each step reads ``V_i`` from memory once, not twice). On one CPU thread with numba
    installed, the step is one compiled loop over the rows of ``V_i`` instead
    (:mod:`wsutils.estimators._rf_step`: the skinny products cost more than the reads)."""
    base = torch.relu(u)
    base_norm = torch.linalg.vector_norm(base)
    if _rf_step.usable(Vi):
        return _rf_step.objective(u, Vi, base, base_norm)
    return _blocked_objective(u, Vi, base, base_norm)


def _blocked_objective(u, Vi, base, base_norm):
    """:func:`_relative_change_objective` by BLAS products, a block of rows of ``V_i`` at a
    time (any device, any number of threads)."""
    block = max(256, (1 << 20) // Vi.shape[1])

    def evaluate(Delta: torch.Tensor):
        sq = torch.zeros(Delta.shape[0], dtype=Vi.dtype, device=Vi.device)
        grad = torch.zeros_like(Delta)
        for s in range(0, Vi.shape[0], block):
            Vb = Vi[s : s + block]
            pre = u[s : s + block, None] + Vb @ Delta.T  # rows × B
            diff = torch.relu(pre) - base[s : s + block, None]
            sq += (diff * diff).sum(0)
            grad += (diff * (pre > 0)).T @ Vb
        return torch.sqrt(sq) / base_norm, lambda: grad

    return evaluate


def _search_row(u, Vi, *, starts, steps, g, d, search_dtype, upper=True, stop=None):
    radius = math.sqrt(d)
    G, GJ = _grams(Vi, _check_active(u), full=upper)  # one pass over V_i for both bounds
    upper = _upper_from(G, u, d) if upper else math.nan
    lower, Delta_star = _lower_from(GJ, u, Vi)
    xi = sphere_starts(torch.randn(max(starts, 1), d, generator=g, dtype=u.dtype), radius)
    S = torch.cat([Delta_star[None].cpu(), -Delta_star[None].cpu(), xi]).to(Vi.device)
    _, best = _ascend(u, Vi, S, steps, work_dtype=search_dtype, stop=stop)
    # the best iterate of every start, re-evaluated in float64 after the exact projection
    # (‖Δ‖ ≤ √d in exact arithmetic and under every norm routine)
    best = project_ball(best.to(u.dtype), radius)
    vals = rf_relative_change(u, Vi, best)
    j = int(torch.argmax(vals))
    return float(vals[j]), best[j].cpu(), upper, lower, S.shape[0]


def rf_word_sensitivity(
    X: Array,
    k: int,
    *,
    rows: int | Sequence[int] | None = 0,
    seed: int = 0,
    search: Search | dict | None = None,
    mode: str = "auto",
    check_norms: bool = True,
    device=None,
    precision: str = "float64",
    upper: bool = True,
    **settings,
) -> RFSensitivityResult:
    """Estimate ``S_RF(X)`` (:prf:ref:`def-word-sensitivity`) for ``φ_RF = ReLU(V flat(X))``,
    ``V ∈ R^{k×D}`` i.i.d. ``N(0, 1/D)`` drawn from ``seed``, without ever forming ``V``.

    ``rows``: one row (default ``0``, the authors' first row), a list of rows, or ``None`` for
    all rows. ``mode``: ``"reduced"`` (one row only: exact law of :prf:ref:`prop-rf-row-law`),
    ``"blocks"`` (one joint ``V`` drawn block by block, see the module docstring),
    ``"rows"`` (the joint law of ``V flat(X)`` and the searched blocks only,
    :func:`rf_rows_law`: ``m`` blocks drawn instead of ``n``; for every row, ``blocks``), or
    ``"auto"`` (``reduced`` for one row, ``blocks`` otherwise). The three modes sample the
    same law of ``(V flat(X), V_i)`` for a searched row ``i``, but not the same draw.

    For each row, the search starts from the explicit ``±Δ`` of :prf:ref:`thm-rf-lower`, the
    authors' ``0.1·ξ`` and ``starts − 1`` random points of the sphere ``‖Δ‖ = √d``, takes
    ``steps`` projected gradient steps (moving to the sphere along the gradient) and keeps the
    best iterate. The result carries the certified bounds ``lower ≤ value ≤ upper``. Memory
    ``O(k·d)``. ``search`` (a :class:`~wsutils.search.Search`, default :data:`RF_SEARCH`:
    2 starts, 30 steps, float32; ``settings``: its fields as keywords, ``steps=40``): the
    starts, steps, ``dtype`` of the ascent iterations (``"float32"``; ``"float64"``; ``None``
    keeps ``V_i``'s own precision; bounds and values are float64 either way), ``progress``
    (a bar over the rows) and ``stop``; the seed of the random starts is ``search.seed``, by
    default ``seed + 1``. The step is not a setting (every step lands on the sphere) and every
    start is searched to the end, so a ``lr``, ``max_batch_elements`` or ``halving`` other
    than :data:`RF_SEARCH`'s is a ValueError.
    ``precision``: the dtype of the ``reduced``-mode draw (:func:`rf_row_law`; ``"float64"``
    by default, ``"float32"`` draws single-precision weights, four times faster, a different
    draw); the ``blocks`` mode always draws single-precision weights and ignores it.

    ``upper=False`` skips the upper certificate (``upper`` is ``None``, ``per_row_upper``
    empty) and with it the Gram matrix of the inactive rows of ``V_i``; ``S``, ``lower`` and
    the search are unchanged. ``search.stop=(m, rtol)`` (an integer ``m ≥ 1`` and
    ``rtol ≥ 0``) ends a row's search once the best value over its starts has gained at most
    ``rtol``, relative, over the last ``m`` steps (``_ascend``); ``None`` (default) takes all
    ``steps``. The value is still the float64 relative change at the best iterate, a
    certified lower bound.

    ``X`` may require grad: the estimator is not differentiable and works on a detached
    float64 copy. A float16/float32 ``X`` is accepted: the weights and every reported number
    are float64, identical to those of ``X.double()`` (low-precision arithmetic would report
    "certified" values above the true relative change).

    Parameters
    ----------
    X
        One text ``(n, d)``, real and finite, rows of norm ``√d`` (unless
        ``check_norms=False``).
    k : int
        The number of random features.
    rows, seed, search, mode, precision, upper, settings
        As above; ``device``: where the work runs (:func:`wsutils.run.device.pick_device`).

    Returns
    -------
    RFSensitivityResult
        ``value`` (a certified lower bound on ``S_RF(X)``), ``lower``, ``upper`` and the
        per-row values and perturbations.

    Raises
    ------
    TypeError
        Before any work, if ``k``, ``rows`` or ``seed`` is not an
        integer (``2.7`` is not truncated), ``rows`` is a boolean mask (pass
        ``np.flatnonzero(mask)``: a mask read as indices searches rows 0 and 1), or ``X`` is
        complex (the imaginary part would be dropped).
    ValueError
        If a size or ``seed`` is out of range (seeds in ``[0, 2**63)``), the search sets a
        ``lr`` or ``max_batch_elements`` (:func:`rf_search`), or ``device="cuda"`` is asked
        for without a GPU; :class:`~wsutils.search.Search` checks its own fields (a ``dtype``
        that is not a precision, ``starts < 1``) when it is made.
    wsutils.run.device.DoesNotFit
        Before any work, if the weights and work arrays need more memory than is available
        (the message gives the estimate).
    """
    k = check_int("k (the number of random features)", k, minimum=1)
    search = rf_search(search, **settings)
    starts, steps = search.starts, search.steps
    seed = check_seed(seed)
    rows = _check_rows(rows)
    work = None if search.dtype is None else PRECISIONS[search.dtype]
    draw = _precision(precision)
    if mode not in ("auto", "reduced", "blocks", "rows"):
        raise ValueError(f"mode must be 'auto', 'reduced', 'blocks' or 'rows', got {mode!r}.")
    Xt, row_list, _ = search_setup(
        _float64_text(X, device), rows=rows, starts=starts, steps=steps, check_norms=check_norms
    )
    d = Xt.shape[1]
    if mode == "auto":
        mode = "reduced" if len(row_list) == 1 else "blocks"
    if mode == "reduced" and len(row_list) != 1:
        raise ValueError(
            "mode='reduced' samples one row's law; pass a single row, or use "
            "mode='blocks' for several rows under one joint V."
        )
    _check_rf_memory(k, d, starts, mode, work, Xt.device, draw)
    with small_work_threads(k * d):
        return _rf_word_sensitivity(
            Xt,
            k,
            row_list,
            mode,
            seed=seed,
            starts=starts,
            steps=steps,
            bar=search.bar(),
            search_dtype=work,
            precision=draw,
            upper=bool(upper),
            stop=search.stop,
            start_seed=search.start_seed(seed + 1),
        )


def rf_search(search: Search | dict | None = None, /, **settings) -> Search:
    """The search of :func:`rf_word_sensitivity`: ``search`` (default :data:`RF_SEARCH`) with
    ``settings`` (:func:`wsutils.search.parse_fixed`). Every step of this ascent lands on the
    sphere and each row's starts are one batch, searched to the end, so a ``lr``,
    ``max_batch_elements`` or ``halving`` other than :data:`RF_SEARCH`'s, which it would not
    use, is a ValueError."""
    fixed = ("lr", "max_batch_elements", "halving")
    return parse_fixed(search, RF_SEARCH, fixed, "the random-feature search", **settings)


def _check_rows(rows):
    """``rows`` as ``None``, an int or a list of ints; a boolean mask, ``1.9`` or a string is a
    TypeError (nothing is truncated or read as an index)."""
    if rows is None:
        return None
    if isinstance(rows, (str, bytes)):
        raise TypeError(f"rows must be a row index, a list of row indices or None, got {rows!r}.")
    if np.ndim(rows) == 0:
        return check_int("rows", rows.item() if isinstance(rows, torch.Tensor) else rows)
    items = rows.tolist() if isinstance(rows, (np.ndarray, torch.Tensor)) else list(rows)
    if any(isinstance(r, (bool, np.bool_)) for r in items):
        raise TypeError(
            "rows is a boolean mask; pass the row indices instead, e.g. "
            "np.flatnonzero(mask).tolist()."
        )
    return [check_int(f"rows[{i}]", r) for i, r in enumerate(items)]


def _float64_text(X, device) -> torch.Tensor:
    """``X`` as a detached float64 tensor on ``device`` (``None``: where it is); complex or
    non-numeric input is a TypeError (``wsutils.checks.as_tensor``)."""
    if isinstance(X, torch.Tensor):
        X = X.detach()
    return as_tensor(X, dtype=torch.float64, device=optional_device(device), name="X")


def _rf_bytes(
    k: int,
    d: int,
    starts: int,
    mode: str,
    work: torch.dtype | None,
    draw: torch.dtype = torch.float64,
) -> int:
    """Peak bytes of one row's search: ``V_i`` (in ``draw`` in ``reduced`` mode, float32 in
    ``blocks``), its copy in the search precision if that differs, and about eight ``k × B``
    float64 work arrays (``B = starts + 2`` candidate perturbations)."""
    vi = draw if mode == "reduced" else torch.float32
    copy = 0 if work is None or work == vi else work.itemsize
    return k * d * (vi.itemsize + copy) + 8 * k * (starts + 2) * 8 + 4 * d * d * 8


def _check_rf_memory(k, d, starts, mode, work, device, draw=torch.float64) -> None:
    need = _rf_bytes(k, d, starts, mode, work, draw)
    hint = "use a smaller k (the width) or fewer starts"
    if device.type == "cpu":
        check_fits(need, f"rf_word_sensitivity with k = {k}, d = {d}", hint=hint)
    else:  # the weights are drawn on the CPU, then moved
        check_fits(k * d * 8, f"drawing a {k} × {d} weight block", hint=hint)
        check_fits(need, f"rf_word_sensitivity with k = {k}, d = {d}", device, hint=hint)


def _rf_word_sensitivity(
    Xt,
    k,
    row_list,
    mode,
    *,
    seed,
    starts,
    steps,
    bar,
    search_dtype,
    precision=torch.float64,
    upper=True,
    stop=None,
    start_seed=None,
):
    n, d = Xt.shape
    g = torch.Generator().manual_seed(seed + 1 if start_seed is None else start_seed)
    if mode == "reduced":
        u, Vi = rf_row_law(Xt, k, row_list[0], seed=seed, device=Xt.device, precision=precision)
    elif mode == "rows":
        u = rf_rows_law(Xt, k, row_list, seed=seed, device=Xt.device)
    else:
        u = rf_preactivation(Xt, k, seed=seed, device=Xt.device)
    phi_norm = float(torch.linalg.vector_norm(torch.relu(u)))
    if not phi_norm > 0:
        raise ValueError("‖φ_RF(X)‖ = 0 for this draw: the relative change is undefined.")
    per_row, per_up, per_lo = {}, {}, {}
    best = (-1.0, row_list[0], torch.zeros(d, dtype=torch.float64))
    n_starts = 0
    for r in tqdm(row_list, desc="rf rows", leave=False, **bar):
        if mode in ("blocks", "rows"):
            Vi = rf_weight_block(k, n, d, r, seed=seed, device=Xt.device, dtype=torch.float32)
        val, Delta, up, lo, n_starts = _search_row(
            u,
            Vi,
            starts=starts,
            steps=steps,
            g=g,
            d=d,
            search_dtype=search_dtype,
            upper=upper,
            stop=stop,
        )
        per_row[r], per_up[r], per_lo[r] = val, up, lo
        if val > best[0]:
            best = (val, r, Delta)
        del Vi
    value, row, Delta = best
    return RFSensitivityResult(
        value=value,
        row=row,
        Delta=Delta.numpy().copy(),
        per_row=per_row,
        starts=n_starts,
        steps=steps,
        seed=seed,
        upper=max(per_up.values()) if upper else None,
        lower=max(per_lo.values()),
        per_row_upper=per_up if upper else {},
        per_row_lower=per_lo,
        phi_norm=phi_norm,
        mode=mode,
        k=k,
    )
