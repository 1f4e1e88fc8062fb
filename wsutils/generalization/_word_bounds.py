"""Proved lower bounds on the trained random-features models' outputs at every one-word
substitution of a text (:prf:ref:`prop-word-bound`): the candidates they rule out need not be
scored."""

from __future__ import annotations

import torch

from ..checks import as_tensor, check_int, check_preactivations, check_real
from ._words import check_candidates


def rf_word_bounds(
    h,
    Vi,
    x,
    rows,
    thetas,
    y: float,
    *,
    tau: float = 0.3,
    batch: int = 512,
    near_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Lower bounds ``L[v, j] ≤ y·t_j(v)`` on the outputs ``t_j(v) = ⟨ReLU(h + V_i Δ_v), θ_j⟩``
    of random features (eq. :eq:`eq-rf`, seen from word ``i``: ``h = V flat(X)``, the book's
    pre-activations ``g``; ``V_i`` the word's ``k × d`` block) on the text with row ``x``
    replaced by each candidate row (``Δ_v = rows[v] − x``), eq. :eq:`eq-word-bound` of
    :prf:ref:`prop-word-bound`:

    ``L = y·t_j(x) + y⟨θ_j ⊙ 1[h > 0], V_i Δ⟩ + y Σ_{l ∈ Z} θ_jl r_l − Δᵀ M Δ``, with ``r_l ≥ 0``
    the exact ReLU remainders of the units ``Z`` where ``|h_l| ≤ tau`` and some model has
    ``y·θ_jl < 0`` (a unit with ``y·θ_jl ≥ 0`` for every model only raises every output, and
    is left out), and one quadratic form for every model, ``M = V_iᵀ diag(ω) V_i``,
    ``ω_l = max_j max(0, −y·θ_jl) / 4|h_l|`` over the units with ``|h_l| > tau`` (0 on the
    others): a larger ``ω`` than a model's own only lowers its bound.

    Where ``L[v, j] > 0`` the substitution ``v`` cannot flip model ``j``. Costs ``O(k·d²)``
    once and ``O(d² + (m + s)·d)`` a candidate (``s`` units in ``Z``), against ``O(k·d)`` a
    candidate for the exact output. In float64 but for ``a_Z = V_Z Δ`` (``s·d`` a candidate,
    most of the cost), computed in ``near_dtype`` (``torch.float32`` or ``torch.float64``):
    its rounding, at most ``ε_d·Σ_q |Δ_q||V_lq| ≤ ε_d‖Δ‖‖V_l‖`` a unit in any order of the
    sums (``ε_d = (d+2)u/(1 − (d+2)u)``, ``u`` the type's unit roundoff; Higham, *Accuracy and
    Stability of Numerical Algorithms*, §3.1: ``d`` products, and one more rounding each for
    ``Δ`` and ``V_l``), moves each ``r_l`` by no more (``r_l`` is 1-Lipschitz in ``a_l``), so
    ``L`` is lowered by ``ε_d‖Δ‖ Σ_{l ∈ Z} |θ_jl|‖V_l‖``.

    The range where that rounding bound is proved: every non-zero entry of ``Δ`` and of
    ``V_Z``, and every product of two of them, is a normal number of ``near_dtype`` and
    ``d·max|Δ|·max|V_Z|`` does not overflow it (Higham's model holds for normal numbers
    only). A batch of candidates outside that range for float32 (rows near ``2e38``, a
    subnormal ``Δ``) is computed in float64; outside it for float64 too, it is refused. A unit
    whose ``ω_l`` would overflow (``|h_l|`` tiny) is put in ``Z``, where its remainder is
    exact, whatever ``tau`` is.

    Returns
    -------
    torch.Tensor
        ``(T, m)`` float64 on the CPU.

    Raises
    ------
    ValueError
        If the arrays are not finite or not of the shapes above (``h`` (k,), ``Vi`` (k, d),
        ``x`` (d,), ``rows`` (T, d), ``thetas`` (m, k), none empty), ``y`` is not ±1, ``tau``
        is negative, ``batch`` is below one, ``near_dtype`` is neither float32 nor float64,
        or a batch lies outside float64's proved range (above).
    """
    h = as_tensor(h, dtype=torch.float64, name="h")
    Vi = as_tensor(Vi, dtype=torch.float64, name="Vi")
    check_preactivations("h", h, Vi)
    k, d = Vi.shape
    x, rows, thetas = check_candidates(x, rows, thetas, k, d)
    if y not in (-1, 1):
        raise ValueError(f"y must be a label, +1 or -1, got {y!r}.")
    tau = check_real("tau", tau)
    if tau < 0:
        raise ValueError(f"tau must be at least 0, got {tau}.")
    batch = check_int("batch", batch, minimum=1)
    if near_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"near_dtype must be torch.float32 or torch.float64, got {near_dtype!r}.")
    on = (h > 0).double()
    t_x = torch.relu(h) @ thetas.T  # (m,)
    g = (thetas * on) @ Vi  # (m, d)
    hurt = (-y * thetas).clamp_min(0)  # (m, k): the models a unit's remainder can lower
    worst = hurt.amax(dim=0)  # (k,)
    # near: |h_l| ≤ tau, or so small that ω_l = worst_l/4|h_l| overflows (exact instead)
    near = (h.abs() <= tau) | ~torch.isfinite(worst / (4 * h.abs()))
    exact = near & (worst > 0)  # Z
    Vs, hs, ons, ths = Vi[exact], h[exact], on[exact], thetas[:, exact]
    Vc, hc, hurt_c = Vi[~near], h[~near], hurt[:, ~near]
    omega = (hurt_c / (4 * hc.abs())).amax(dim=0)  # (k - |near|,), |h_l| > tau ≥ 0
    M = (Vc.T * omega) @ Vc  # (d, d), one form for every model
    V_extent = _extent(Vs)
    weight = ths.abs() @ torch.linalg.vector_norm(Vs, dim=1)  # (m,): Σ_l |θ_jl|‖V_l‖
    # r_l = ReLU(σ_l(h_l + a_l)), σ_l = −1 where h_l > 0 (ReLU(z) − z = ReLU(−z)), else +1
    sign = 1 - 2 * ons
    hs_signed = sign * hs
    signed = sign[:, None] * Vs  # float64; a copy in near_dtype for the batches in its range
    low = {torch.float64: signed, near_dtype: signed.to(near_dtype)}
    out = torch.empty(rows.shape[0], thetas.shape[0], dtype=torch.float64)
    for j in range(0, rows.shape[0], batch):
        D = rows[j : j + batch] - x
        dt = _near_range(D, V_extent, near_dtype)
        # the rounding of a_Z in dt, per unit of ‖Δ‖ and per model
        du = (d + 2) * torch.finfo(dt).eps / 2  # (d + 2)u, far below 1 for these types
        slack = du / (1 - du) * weight  # (m,): ε_d Σ_l |θ_jl|‖V_l‖
        r = (D.to(dt) @ low[dt].T).double().add_(hs_signed).relu_()  # σ⊙a, then r
        first = t_x + D @ g.T + r @ ths.T
        quad = ((D @ M) * D).sum(dim=1, keepdim=True)
        rounding = torch.linalg.vector_norm(D, dim=1, keepdim=True) * slack
        out[j : j + len(D)] = y * first - quad - rounding
    if torch.isnan(out).any():
        raise ValueError(
            "the bound is NaN for some candidates: h, V_i or the rows are too large for "
            "float64 (an intermediate product overflows); rescale the inputs."
        )
    return out


def _extent(t: torch.Tensor) -> tuple[float, float]:
    """The smallest non-zero and the largest magnitude of ``t``'s entries (``(inf, 0)`` when
    every entry is zero)."""
    if t.numel() == 0:  # no unit in Z: nothing computed in the near dtype
        return float("inf"), 0.0
    a = t.abs()
    lo, hi = (float(v) for v in torch.aminmax(a))  # one pass
    if hi == 0:
        return float("inf"), 0.0
    if lo == 0:  # exact zeros (the text's own token): the smallest of the others
        lo = float(torch.where(a > 0, a, torch.inf).min())
    return lo, hi


def _near_range(D: torch.Tensor, V_extent, near_dtype: torch.dtype) -> torch.dtype:
    """The dtype a batch's ``a_Z = V_Z Δ`` is computed in: ``near_dtype`` where the batch lies
    in the range where :func:`rf_word_bounds`' rounding bound is proved (the non-zero entries
    of ``Δ`` and ``V_Z`` and their products normal numbers of the dtype, and
    ``d·max|Δ|·max|V_Z|`` below its largest number), else float64; a ValueError outside
    float64's range. ``V_extent``: :func:`_extent` of ``V_Z``."""
    (a_min, a_max), (b_min, b_max) = _extent(D), V_extent
    for dt in dict.fromkeys((near_dtype, torch.float64)):
        info = torch.finfo(dt)
        if a_max == 0 or b_max == 0:  # a_Z = 0 exactly
            return dt
        if (
            min(a_min, b_min, a_min * b_min) >= info.tiny
            and D.shape[-1] * a_max * b_max <= info.max
        ):
            return dt
    raise ValueError(
        "the rows' changes Δ or V_i hold numbers outside float64's normal range (a subnormal "
        "entry or product, or an overflowing sum): the rounding bound of rf_word_bounds is "
        "not proved there; rescale the inputs."
    )
