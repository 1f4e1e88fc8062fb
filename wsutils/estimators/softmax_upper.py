"""The upper certificate of softmax attention (:prf:ref:`prop-softmax-upper`), with or without
an attention sink (eq. :eq:`eq-sink-attention`).

Every softmax value elsewhere in the book is a lower bound: the relative change at an explicit
``Δ``. :func:`softmax_certified_upper` bounds the change over the **whole** ball
``‖Δ‖ ≤ √d`` at each word ``i``, so that ``S(X) ≤ max_i`` of its result: with the lower bounds,
a bracket. It needs no search, only the attention weights, one ``n × n`` table of distances
and the norms ``‖Wᵀx_j‖``: ``O(n²·d + n·d²)``.

The bound, row by row (chapter *attention-sink*): for a row ``j ≠ i`` write ``p_j`` for its
weight on key ``i`` and ``ψ_ji`` for the mean of its other keys under its weights, so that
``φ_j = (1 − p_j)ψ_ji + p_j x_i`` and, after the change,

    ``φ'_j − φ_j = (p'_j − p_j)(x_i − ψ_ji) + p'_j Δ``,

where the new weight ``p'_j = σ(z'_ji − ℓ_ji)`` moves only through the score
``z'_ji = z_ji + c·x_jᵀWΔ/√d``, which the ball keeps within ``w_j = c·√d‖Wᵀx_j‖/√d`` of
``z_ji`` (Cauchy–Schwarz, attained). So ``‖φ'_j − φ_j‖ ≤ max(p⁺_j − p_j, p_j − p⁻_j)·‖x_i −
ψ_ji‖ + p⁺_j√d`` with ``p^±_j = σ(z_ji ± w_j − ℓ_ji)``. Row ``i`` itself is a convex combination
of the other words and of ``x'_i``, so it moves by at most the largest distance from ``φ_i``
to one of them, ``‖x'_i − φ_i‖ ≤ ‖x_i − φ_i‖ + √d``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._tensor import Array
from ..checks import as_tensor, as_text, check_int, check_rows, check_shape
from ..maps import Normalisation, attention_scores

__all__ = [
    "JOINT_GRID",
    "JOINT_GRID_EVERY",
    "JOINT_ELEMENTS",
    "REFINE_RATE",
    "REFINE_STEPS",
    "ball_quadratic_sup",
    "distances_above",
    "float_sum_rounding",
    "largest_other",
    "log_others",
    "off_sink_exponents",
    "row_spread",
    "softmax_certified_upper",
    "sym_eigh",
]


_EIG_CACHE: list = []  # [(a float64 copy of the last W, (eigenvalues, eigenvectors))]


def float_sum_rounding(k: int) -> float:
    """``γ_k = k·u/(1 − k·u)``, ``u = 2⁻⁵³``: the relative rounding of a float64 sum of ``k``
    terms, the allowance the certificates multiply by (``1 + 2γ_k``)."""
    return k * 2.0**-53 / (1 - k * 2.0**-53)


def sym_eigh(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of ``(W + Wᵀ)/2`` in float64 (eigenvalues ascending, read-only
    for callers). The last result is cached and reused when ``W`` equals the last matrix
    exactly (an ``O(d²)`` comparison against the ``O(d³)`` eigendecomposition, which the
    take-over constructions and the softmax certificate ask for several times per text)."""
    W64 = W.to(torch.float64)
    cached = _EIG_CACHE[0] if _EIG_CACHE else None  # read the entry once
    if (
        cached is not None
        and cached[0].shape == W64.shape
        and cached[0].device == W64.device
        and torch.equal(cached[0], W64)
    ):
        return cached[1]
    out = torch.linalg.eigh((W64 + W64.T) / 2)
    _EIG_CACHE[:] = [(W64.clone(), out)]
    return out


def log_others(z: torch.Tensor, A: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``ℓ[j, c] = log Σ_{k≠i} exp z_jk`` for the keys ``i = cols[c]``, ``n × len(cols)``:
    ``L_j + log(1 − a_ji)`` where that has no cancellation (``a_ji ≤ 1/2``), and a log-sum-exp
    over the row without ``i`` for the one key of each row that may hold more than half of it
    (its largest)."""
    n = z.shape[0]
    L = torch.logsumexp(z, dim=1, keepdim=True)
    ell = L + torch.log1p(-A[:, cols].clamp(max=0.5))
    top = z.argmax(dim=1)
    pos = torch.full((n,), -1, dtype=torch.long)
    pos[cols] = torch.arange(len(cols))
    js = torch.nonzero(pos[top] >= 0).flatten()  # rows whose largest key is among cols
    masked = z[js].clone()
    masked[torch.arange(len(js)), top[js]] = -math.inf
    ell[js, pos[top[js]]] = torch.logsumexp(masked, dim=1)  # −inf for a one-word text
    return ell


def largest_other(v: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """For each entry of ``own`` (a value of ``v``'s), the largest entry of ``v`` once that one
    is left out: the second largest where it is the largest, else the largest."""
    top2 = torch.topk(v, min(2, len(v))).values
    return torch.where(own == top2[0], top2[-1], top2[0])


def distances_above(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``D[j, k] ≥ ‖a_j − b_k‖`` for the rows of ``A`` and ``B`` (float64), from one matrix
    product: ``‖a‖² + ‖b‖² − 2aᵀb`` errs by at most ``γ_{d+2}(‖a‖ + ‖b‖)²`` in floating point
    (each term a length-``d`` sum, then two additions; Higham §3.1), which is added before the
    square root, so the result is never below the exact distance."""
    d = A.shape[1]
    na, nb = torch.linalg.vector_norm(A, dim=1), torch.linalg.vector_norm(B, dim=1)
    sq = (na**2)[:, None] + (nb**2)[None, :] - 2 * (A @ B.T)
    k = (d + 2) * 2.0**-53
    slack = k / (1 - k) * (na[:, None] + nb[None, :]) ** 2
    return torch.sqrt(sq.clamp_min(0) + slack)


def ball_quadratic_sup(A: torch.Tensor, G: torch.Tensor, r: float, eig=None, solution=False):
    """For a float64 symmetric ``A`` (``d × d``) and each row ``g`` of ``G`` (``m × d``), an
    upper bound on ``max_{‖Δ‖ ≤ r} ΔᵀAΔ + gᵀΔ`` (:prf:ref:`lem-ball-quadratic`):
    ``μr² + ¼ gᵀ(μI − A)⁻¹g`` at a ``μ > max(λ_max(A), 0)`` chosen per row near the minimiser
    (bisection on the secular equation ``¼ Σ_k (q_kᵀg)²/(μ − λ_k)² = r²``; any such ``μ`` is
    valid, and their infimum is the maximum itself). The quadratic form is evaluated through
    an approximate solution ``y`` of ``(μI − A)y = g`` as
    ``2gᵀy − yᵀMy + ‖g − My‖²/(μ − λ̄)``, which is at least ``gᵀM⁻¹g`` for every ``y``
    (``λ̄ ≥ λ_max(A)``: ``eigh``'s top eigenvalue raised by a bound on its error), with the
    float64 rounding of these sums added (Higham's ``γ``). ``eig``: ``torch.linalg.eigh(A)``
    when the caller has it (:func:`sym_eigh`). Batched: ``A`` may be ``b × d × d`` with ``G``
    ``b × m × d`` (one matrix for each batch of rows; the result ``b × m``). With
    ``solution=True`` also the approximate ``y ≈ (μI − A)⁻¹g`` (``G``'s shape): ``y/2`` is
    near the maximiser where the constraint binds."""
    d = A.shape[-1]
    u = 2.0**-53
    gam = (d + 3) * u / (1 - (d + 3) * u)
    lam, Q = torch.linalg.eigh(A) if eig is None else eig
    norm_a = torch.linalg.matrix_norm(A)[..., None]  # one per matrix, beside its rows
    top = lam[..., -1:] + 4 * d * u * norm_a  # ≥ λ_max(A)
    floor = top.clamp_min(0.0)
    GQ = G @ Q
    C = GQ**2
    gn = torch.linalg.vector_norm(G, dim=-1)
    lo = floor.expand(gn.shape) + 1e-9 * (1 + floor)
    hi = floor + gn / (2 * r) + 1.0 + 1e-9 * (1 + floor)  # the slope r² − ¼Σ C/(μ−λ)² > 0
    lam_rows = lam[..., None, :]
    for _ in range(100):  # the slope of μr² + ¼ Σ C/(μ − λ) increases in μ
        mid = (lo + hi) / 2
        slope = r * r - 0.25 * (C / (mid[..., None] - lam_rows) ** 2).sum(-1)
        lo, hi = torch.where(slope < 0, mid, lo), torch.where(slope < 0, hi, mid)
    mu = hi  # μ > floor ≥ max(λ_max, 0): a valid point, near the minimiser
    Y = (GQ / (mu[..., None] - lam_rows)) @ Q.transpose(-1, -2)  # y ≈ (μI − A)⁻¹g
    AY = Y @ A
    MY = mu[..., None] * Y - AY
    res = G - MY
    E = gam * (G.abs() + mu[..., None] * Y.abs() + Y.abs() @ A.abs())  # ≥ |error| of MY, res
    gy = (G * Y).sum(-1) + gam * (G.abs() * Y.abs()).sum(-1)
    yMy = (Y * MY).sum(-1) - (Y.abs() * E).sum(-1) - gam * (Y.abs() * MY.abs()).sum(-1)
    rn = torch.linalg.vector_norm(res, dim=-1) * (1 + gam) + torch.linalg.vector_norm(E, dim=-1)
    quad = 2 * gy - yMy + rn**2 / (mu - top)
    value = (mu * r * r + 0.25 * quad) * (1 + 8 * u)
    return (value, Y) if solution else value


_JOINT_CACHE: list = []  # [(Xt, Wt, cols, joint)]: the last text's own-score sups


def _own_joint(Xt, Wt, cols, Xc, Ws, WsX, Wx0) -> torch.Tensor:
    """``x_iᵀWx_i − x_iᵀWx_0 + sup_{‖Δ‖≤√d} ΔᵀW_sΔ + ∇_iᵀΔ`` for the words ``cols``
    (:func:`ball_quadratic_sup`), kept for the last text, weights and words: it does not
    depend on the margin, and a grid asks for it at every margin of a text. The key is the
    inputs themselves (compared exactly, ``O(nd + d²)``)."""
    cols_t = torch.as_tensor(cols)
    if _JOINT_CACHE:
        X0, W0, c0, joint = _JOINT_CACHE[0]
        if (
            X0.shape == Xt.shape
            and W0.shape == Wt.shape
            and c0.shape == cols_t.shape
            and torch.equal(c0, cols_t)
            and torch.equal(X0, Xt)
            and torch.equal(W0, Wt)
        ):
            return joint
    sqd = math.sqrt(Xt.shape[1])
    joint = (Xc @ Wt * Xc).sum(1) - Xc @ Wx0
    joint = joint + ball_quadratic_sup(Ws, 2 * WsX - Wx0, sqd, eig=sym_eigh(Wt))
    _JOINT_CACHE[:] = [(Xt.clone(), Wt.clone(), cols_t.clone(), joint)]
    return joint


def off_sink_exponents(Xt: torch.Tensor, Wt: torch.Tensor, c: float, cols) -> torch.Tensor:
    """The exponents of :prf:ref:`prop-sink-rows`, part 2, at margin ``b_0 = 0``: ``[c, k]``,
    for the word ``i = cols[c]`` and every key ``k``, bounds ``z'_ik − z'_i0 + b_0`` over the
    ball ``‖Δ‖ ≤ √d``: ``c·[x_iᵀW(x_k − x_0) + √d‖W(x_k − x_0)‖]/√d`` for ``k ≠ i`` and
    for the word itself the smaller of
    ``c·[x_iᵀW_s x_i + 2√d‖W_s x_i‖ + λ₊d − x_iᵀWx_0 + √d‖Wx_0‖]/√d`` (the three parts' sups
    added: ``W_s = (W + Wᵀ)/2``, ``λ₊`` its largest eigenvalue or 0, raised by a bound on
    ``eigh``'s error) and ``c·[x_iᵀWx_i − x_iᵀWx_0 + sup_{‖Δ‖≤√d} ΔᵀW_sΔ + gᵀΔ]/√d`` with
    ``g = 2W_s x_i − Wx_0``, the sup bounded by :func:`ball_quadratic_sup`; ``−inf`` for the
    sink's own key ``k = 0``. So ``1 − a'_i0 ≤ exp(logsumexp_k(row) −
    b_0)``, and the certificate controls row ``i`` once ``b_0`` passes that log-sum-exp
    (float64 rows ``Xt``, the sink's token first)."""
    d = Xt.shape[1]
    m = len(cols)
    sqd = math.sqrt(d)
    x0 = Xt[0]
    WY = (Xt - x0) @ Wt.T  # rows (W(x_k − x_0))ᵀ
    Xc = Xt[cols]
    expo = c * (Xc @ WY.T + sqd * torch.linalg.vector_norm(WY, dim=1)[None, :]) / sqd
    Ws = (Wt + Wt.T) / 2
    # λ₊, raised by a bound on eigh's error (backward stable: O(u‖W_s‖_F)), cached per W
    top = float(sym_eigh(Wt)[0][-1])
    lam = max(top + 4 * d * 2.0**-53 * float(torch.linalg.matrix_norm(Ws)), 0.0)
    WsX = Xc @ Ws
    Wx0 = Wt @ x0
    self_sup = (
        (WsX * Xc).sum(1)
        + 2 * sqd * torch.linalg.vector_norm(WsX, dim=1)
        + lam * d
        - Xc @ Wx0
        + sqd * torch.linalg.vector_norm(Wx0)
    )
    # the same sup as one quadratic over the ball, the linear and quadratic parts together
    joint = _own_joint(Xt, Wt, cols, Xc, Ws, WsX, Wx0)
    expo[torch.arange(m), cols] = c * torch.minimum(self_sup, joint) / sqd  # the word's own key
    expo[:, 0] = -math.inf  # the sink's own key is not counted
    return expo


def _sink_row_bound(Xt, Wt, c: float, b0: float, cols, to_sink) -> torch.Tensor:
    """For each word ``i`` of ``cols``, a bound on ``‖φ'_i − φ_i‖`` from the sink
    (:prf:ref:`prop-sink-rows`): ``φ'_i − x_0`` is a mixture of ``v − x_0`` over the keys
    ``v ≠ x_0`` with total weight ``1 − a'_i0 ≤ Σ_{k≥1} exp(z'_ik − z'_i0)``, each exponent
    at most :func:`off_sink_exponents` ``− b_0``. So ``‖φ'_i − φ_i‖ ≤ (1 − a'_i0)·max_v
    ‖v − x_0‖ + ‖φ_i − x_0‖`` (``to_sink``: the last term, for the words of ``cols``)."""
    expo = off_sink_exponents(Xt, Wt, c, cols) - b0
    off_sink = torch.exp(torch.logsumexp(expo, dim=1)).clamp(max=1.0)  # ≥ 1 − a'_i0
    Yn = torch.linalg.vector_norm(Xt - Xt[0], dim=1)  # ‖x_k − x_0‖
    far = largest_other(Yn[1:], Yn[cols])  # max over words k ≠ i
    reach = torch.maximum(far, Yn[cols] + math.sqrt(Xt.shape[1]))  # ‖x'_i − x_0‖ ≤ … + √d
    return off_sink * reach + to_sink


#: Intervals per side of each row's score shift in the joint bound (:prf:ref:`prop-softmax-joint`):
#: the sup of each row's term is bounded on ``JOINT_GRID`` intervals of ``[0, w_j]`` and of
#: ``[−w_j, 0]``; more intervals, a tighter bound at the word where the multiplier is chosen
#: (not always at the others; on texts at ``d = 192``, ``n = 250`` and ``1000``: 7.2 with 8,
#: 6.2 with 16, 5.9–6.0 with 32, against a row-wise 16–23).
JOINT_GRID = 32

#: The joint bound's intervals a side where the chapters bound every word of a long text
#: (``n`` in the thousands, ``O(n²)`` words × rows): half :data:`JOINT_GRID`'s cost there, and
#: 2–12 % looser on the same texts (6.4 against 6.1 at ``d = 192``, ``n = 2000``).
JOINT_GRID_EVERY = 16

#: The most entries of one chunk of the joint bound's ``n × words × (2·JOINT_GRID + 1)`` grid.
JOINT_ELEMENTS = 2**22

#: The step size of the per-row multipliers' search (Adam on ``log ω_j`` and ``η_j``; ``refine``).
REFINE_RATE = 0.1

#: The steps of that search the book and ``bench_verifiers`` take (``refine=REFINE_STEPS``):
#: on the attention grid's texts at ``d = 192``, ``n = 250``, 150 steps lower its value by
#: under 1 % more.
REFINE_STEPS = 50


def softmax_certified_upper(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "raf",
    rows=None,
    joint: bool = True,
    grid: int = JOINT_GRID,
    refine: int = 0,
) -> np.ndarray:
    """Per word ``i``, an upper bound on ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for
    softmax attention (eq. :eq:`eq-raf`; any ``β``, scalable softmax, and a sink of margin
    ``b`` on position 0, eq. :eq:`eq-sink-attention`), so ``S(X) ≤ max_i`` of the result over
    the words: the smaller of :prf:ref:`prop-softmax-upper` (each row ``j ≠ i`` at its own
    worst ``Δ``) and, with ``joint=True``, :prf:ref:`prop-softmax-joint` (the rows share one
    ``Δ``: their score shifts lie in one ball). With a sink, row 0 is the sink's token, not a
    word, and the propositions do not bound it: its entry is ``inf``. Computed in float64 and
    enlarged by the relative rounding of its float64 sums, ``2γ_{n+d}`` (Higham's
    ``γ_k = ku/(1 − ku)``); not covered (besides the chapter's unproved remainder: ``exp``,
    ``log``, ``sigmoid``, ``eigh``, and for the joint bound the SVD of ``‖XW‖₂`` or, with
    ``refine``, the SVD ``c·XW = USVᵀ``, the forming of ``(US)ᵀΩUS`` and ``(US)ᵀη`` and
    the cancellation in each row's ``h² − η_j t − ω_j t²``):
    cancellation in ``φ(X) = AX`` itself, where ``‖φ(X)‖`` is small against ``‖A|X|‖`` and
    its computed value can be far off.

    Parameters
    ----------
    X
        One text ``(n, d)``, finite (the rows need not have norm ``√d``: a sink row may be
        zero; the ball's radius is ``√d``).
    W
        The attention weights, ``d × d``.
    normalisation
        A softmax :class:`wsutils.maps.Normalisation` (or anything its ``parse`` reads):
        ``"raf"``/``"softmax"`` with any ``beta``, ``"scalable"``, each with or without
        ``sink``.
    rows
        The words to bound (indices; ``None``: every row). The cost is ``O(n²d)`` for the
        weights, then ``O(n·d)`` per word, so a few words of a long text are cheap; the joint
        bound adds ``O(n·JOINT_GRID)`` per word, at one multiplier: the best of a search at
        the first word (word 1 with a sink), so the same for any ``rows``.
    joint
        Also compute :prf:ref:`prop-softmax-joint` and keep the smaller of the two at each
        word; ``False``: the row-wise bound alone.
    grid
        The joint bound's intervals a side (:data:`JOINT_GRID` by default): its cost grows
        with them; its value falls at the word where the multiplier is chosen (usually, not
        always, at the others).
    refine
        With ``joint=True``: steps of a search for two multipliers per row at each word, one
        for the squared shift and one for the shift (:prf:ref:`prop-softmax-joint` with
        ``Ω = diag(ω_j)`` and ``η``; ``0``, the default: the one multiplier alone), started
        from the one multiplier and ``η = 0`` and kept only where it is smaller. Each step
        costs an ``eigh`` of size ``min(n, d)`` a word: for a few words.

    Returns
    -------
    numpy.ndarray
        One entry per word of ``rows`` (``(n,)`` for every row): it bounds the relative
        change of any ``Δ`` at that row.

    Raises
    ------
    ValueError
        If ``X`` is not one finite ``n × d`` text, ``W`` not ``d × d``, the normalisation is
        not a softmax, or ``φ(X) = 0``.
    """
    norm = Normalisation.parse(normalisation)
    if norm.name not in ("softmax", "scalable"):
        raise ValueError(
            f"softmax_certified_upper bounds softmax attention, not {norm.name!r}; for ReLU "
            "attention use wsutils.estimators.relu.relu_certified_upper."
        )
    Xt, n, d = as_text(X, dtype=torch.float64)
    if Xt.ndim != 2:
        raise ValueError(f"X must be one text of shape (n, d), got {tuple(Xt.shape)}.")
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    c, r = norm.scale(n), math.sqrt(d)
    bias = norm.key_bias(n, Xt)
    z = c * attention_scores(Xt, Wt) + (0 if bias is None else bias)
    A = torch.softmax(z, dim=1)
    Phi = A @ Xt
    base = float(torch.linalg.vector_norm(Phi))
    if not base > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X.")
    cols = torch.as_tensor(check_rows(rows, n))  # None: every word
    XW = Xt @ Wt
    w = c * torch.linalg.vector_norm(XW, dim=1)  # c·√d‖Wᵀx_j‖/√d, per row j
    terms = _RowTerms(Xt, Wt, z, A, Phi, w, c, r, norm.sink if bias is not None else None)
    grid = check_int("grid", grid, minimum=1)
    refine = check_int("refine", refine, minimum=0)
    if refine and not joint:
        raise ValueError("refine searches the joint bound's multipliers: leave joint=True.")
    chunk = max(1, JOINT_ELEMENTS // (n * (2 * grid + 1))) if joint else n
    if joint:
        R = c * float(torch.linalg.matrix_norm(XW, ord=2))  # ‖t‖ ≤ R over the ball
        if bias is not None and n < 2:
            raise ValueError("a text with a sink needs a word besides the sink's token (n ≥ 2).")
        first = torch.tensor([1 if bias is not None else 0])  # the first word, whatever rows
        lam = _best_multiplier(*terms(first), R, grid)
    if refine:  # the score shifts t = c·XWΔ/√d = Cy, ‖y‖ ≤ 1 (C = US from the SVD of c·XW)
        U, sv, _ = torch.linalg.svd(c * XW, full_matrices=False)
        C = U * sv

    def bound(chunk_cols):
        """The numerator at the words ``chunk_cols``: the row-wise bound, or the smallest of
        it and the joint bound's (one multiplier, then one per row), on one grid of shifts."""
        args = terms(chunk_cols)
        value = _row_wise(*args)
        if not joint:
            return value
        cells, u_own = _joint_grid(*args, grid), args[-1]
        value = torch.minimum(torch.sqrt(_joint_value(*cells, u_own, R, lam)), value)
        if refine:
            value = value.minimum(
                torch.sqrt(_per_row(cells[0], cells[2], u_own, w, C, lam, refine))
            )
        return value

    total = torch.cat([bound(cols[s : s + chunk]) for s in range(0, len(cols), chunk)])
    if bias is not None:  # the sink's token is not a word: no bound at row 0
        total = torch.where(cols == 0, math.inf, total)
    return (total / base * (1 + 2 * float_sum_rounding(n + d))).numpy()


def row_spread(z, A, Phi, V, cols, v_norm):
    """For the rows ``j`` and the words ``i = cols[c]`` of an attention ``Φ = A V`` with
    scores ``z`` (``A = softmax(z)``, values ``V``, their norms ``v_norm``): the scores
    ``z_ji``, ``ℓ_ji = log Σ_{k≠i} e^{z_jk}``, the weights ``a_ji`` and an upper bound on
    ``‖v_i − v̄_ji‖``, the distance from value ``i`` to the mean of the others in row ``j``
    (:prf:ref:`prop-softmax-upper`, :prf:ref:`prop-head-upper`): ``‖v_i − φ_j‖/(1 − a_ji)``
    or, when smaller, ``‖v_i‖ + max_{k≠i} ‖v_k‖``. Each ``n × len(cols)``."""
    n, m = z.shape[0], len(cols)
    dist = distances_above(Phi, V[cols])  # [j, c] ≥ ‖φ_j − v_i‖, i = cols[c]
    ell = log_others(z, A, cols)
    zc = z[:, cols]
    one_minus_p = torch.sigmoid(ell - zc)  # 1 − a_ji = σ(ℓ_ji − z_ji), no cancellation
    far = largest_other(v_norm, v_norm[cols])  # max_{k≠i} ‖v_k‖
    crude = (v_norm[cols] + far)[None, :].expand(n, m)
    spread = torch.where(one_minus_p > 0, dist / one_minus_p, crude).minimum(crude)
    return zc, ell, 1 - one_minus_p, spread


class _RowTerms:
    """The quantities of :prf:ref:`prop-softmax-upper` at a set of words (``cols``): for each
    row ``j`` and word ``i``, the score ``z_ji``, ``ℓ_ji = log Z_ji``, the weight ``a_ji``, the
    spread ``D_ji ≥ ‖x_i − x̄_ji‖`` and the shift bound ``w_j``, and row ``i``'s own bound."""

    def __init__(self, Xt, Wt, z, A, Phi, w, c, r, sink):
        self.Xt, self.Wt, self.z, self.A, self.Phi = Xt, Wt, z, A, Phi
        self.w, self.c, self.r, self.sink = w, c, r, sink
        self.x_norm = torch.linalg.vector_norm(Xt, dim=1)

    def __call__(self, cols: torch.Tensor):
        Xt, z, A, Phi, r = self.Xt, self.z, self.A, self.Phi, self.r
        m = len(cols)
        zc, ell, p, spread = row_spread(z, A, Phi, Xt, cols, self.x_norm)
        # row i: the largest distance from φ_i to a vertex, x_k (k ≠ i) or x'_i
        own = distances_above(Phi[cols], Xt)  # [c, k] ≥ ‖φ_i − x_k‖
        at = torch.arange(m)
        self_dist = own[at, cols].clone()
        to_sink = own[:, 0].clone()
        own[at, cols] = -math.inf
        u_own = torch.maximum(own.max(dim=1).values, self_dist + r)
        if self.sink is not None:  # a sink: row i keeps most of its weight on key 0
            u_own = torch.minimum(
                u_own, _sink_row_bound(Xt, self.Wt, self.c, self.sink, cols, to_sink)
            )
        return cols, zc, ell, p, spread, self.w, r, u_own


def _row_term(zc, ell, p, spread, w, r, t):
    """Row ``j``'s bound at a score shift ``t`` (broadcast over the last axis):
    ``|a'(t) − a|·D + a'(t)·r`` with ``a'(t) = σ(z + t − ℓ)`` (:prf:ref:`prop-softmax-upper`)."""
    a = torch.sigmoid(zc[..., None] + t - ell[..., None])
    return (a - p[..., None]).abs() * spread[..., None] + a * r


def _row_wise(cols, zc, ell, p, spread, w, r, u_own):
    """:prf:ref:`prop-softmax-upper`'s numerator at the words ``cols``:
    ``max(a⁺ − a, a − a⁻)·D + a⁺·r`` for each row ``j ≠ i``, row ``i``'s own bound."""
    p_hi = torch.sigmoid(zc + w[:, None] - ell)
    p_lo = torch.sigmoid(zc - w[:, None] - ell)
    u = torch.maximum(p_hi - p, p - p_lo) * spread + p_hi * r  # u[j, c], j ≠ i
    u[cols, torch.arange(len(cols))] = u_own
    return torch.sqrt((u**2).sum(dim=0))


def _joint_grid(cols, zc, ell, p, spread, w, r, u_own, grid: int):
    """Each row's squared term on ``grid`` intervals per side of ``[−w_j, w_j]``:
    the largest at the interval's ends (the term is monotone on each side of 0), and the
    smallest ``t²`` on it; row ``i`` itself left out (``keep`` is False there)."""
    T = _cell_ends(w, grid)  # (n, K): the middle point 0 up to rounding (h is largest at
    # an interval's ends on either side of it)
    H = _row_term(zc, ell, p, spread, w, r, T[:, None, :]) ** 2  # (n, m, K)
    top = torch.maximum(H[..., :-1], H[..., 1:])
    t2 = torch.minimum(T[:, :-1].abs(), T[:, 1:].abs())[:, None, :] ** 2
    keep = torch.ones(zc.shape, dtype=torch.bool)
    keep[cols, torch.arange(len(cols))] = False
    return top, t2, keep


def _cell_ends(w, grid: int) -> torch.Tensor:
    """The signed ends of each row's ``grid`` intervals per side of ``[−w_j, w_j]``
    (rows × ``2·grid + 1``)."""
    return w[:, None] * torch.linspace(-1.0, 1.0, 2 * grid + 1, dtype=torch.float64)[None, :]


def _rows_sup(top, t2, keep, lam):
    """``Σ_{j≠i} sup_t (h_ji(t)² − λ_j t²)`` on the grid's cells, per word: ``lam`` one
    multiplier, or one per row and word (``rows × words × 1``)."""
    return ((top - lam * t2).amax(dim=2) * keep).sum(dim=0)


def _joint_value(top, t2, keep, u_own, R, lam: float):
    """:prf:ref:`prop-softmax-joint`'s bound on the squared numerator at multiplier ``lam``."""
    return lam * R**2 + _rows_sup(top, t2, keep, lam) + u_own**2


def _per_row(top, keep, u_own, w, C, lam: float, steps: int):
    """:prf:ref:`prop-softmax-joint` with one quadratic multiplier ``ω_j ≥ 0`` and one linear
    multiplier ``η_j`` per row at each word of the grid's cells (:func:`_joint_grid`;
    ``ω_i = η_i = 0``): Adam on ``log ω_j`` and ``η_j`` (in units of the row's largest squared
    term over ``w_j``) from the one multiplier ``lam`` and ``η = 0``, for ``steps`` steps; the
    bound (squared numerator) at the best iterate. The shifts are ``t = Cy`` over ``‖y‖ ≤ 1``
    (``C = US`` from the SVD ``B = USVᵀ`` of ``B = c·XW``), so the multipliers' term is the
    trust-region sup of ``ηᵀCy + yᵀCᵀΩCy``, bounded at every iterate by
    :func:`ball_quadratic_sup` (its rounding covered). Any multipliers give a valid bound, so
    the search only decides how tight it is; its gradient is the envelope one, ``(t*, t*²)``
    at the sup's maximiser ``t* = Cy*``."""
    mask = keep.T.to(torch.float64)  # (words, rows): ω_i = η_i = 0 at each word's own row
    ends = _cell_ends(w, top.shape[2] // 2)
    unit = (top.amax(dim=2) / w[:, None].clamp_min(1e-300)).T.clamp_min(1e-300)  # (words, rows)
    theta = torch.full(mask.shape, math.log(lam), dtype=torch.float64, requires_grad=True)
    eta_u = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([theta, eta_u], lr=REFINE_RATE)

    def value(theta, eta_u):
        om, eta = theta.exp(), eta_u * unit  # (words, rows)
        rows = _cells_sup(top, ends, om, eta) * keep
        om, eta = om * mask, eta * mask
        ball, t_star = _shift_ball_sup(C, om.detach(), eta.detach())
        surrogate = (eta * t_star + om * t_star**2).sum(dim=1)  # the envelope gradient
        return rows.sum(dim=0) + u_own**2 + ball + (surrogate - surrogate.detach())

    best = torch.full((mask.shape[0],), math.inf, dtype=torch.float64)
    for _ in range(steps):
        v = value(theta, eta_u)
        best = torch.minimum(best, v.detach())
        opt.zero_grad()
        v.sum().backward()
        opt.step()
    with torch.no_grad():
        return torch.minimum(best, value(theta, eta_u))


def _cells_sup(top, ends, om, eta) -> torch.Tensor:
    """For each row ``j`` and word (``rows × words``), a bound on the sup of
    ``h_ji(t)² − η_j t − ω_j t²`` over ``|t| ≤ w_j`` from the grid's cells (:func:`_joint_grid`,
    whose ``top`` bounds ``h²`` on each cell; ``ends``: :func:`_cell_ends`): each cell's ``top``
    plus the largest of the concave ``−η_j t − ω_j t²`` on it, at its vertex ``−η_j/(2ω_j)``
    clipped into the cell (``om > 0`` and ``eta``: words × rows)."""
    vertex = (-eta / (2 * om)).T[:, :, None]
    t = torch.minimum(torch.maximum(vertex, ends[:, None, :-1]), ends[:, None, 1:])
    return (top - eta.T[:, :, None] * t - om.T[:, :, None] * t**2).amax(dim=2)


def _shift_ball_sup(C, om, eta) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``om`` and ``eta`` (words × rows), an upper bound on
    ``sup_{‖y‖≤1} ηᵀCy + yᵀCᵀdiag(ω)Cy`` (:func:`ball_quadratic_sup`, its rounding covered)
    and the shifts ``t* = Cy*`` at an approximate maximiser: half its solve ``(μI − M)⁻¹g``,
    filled up to the sphere along the top eigenvector when ``g`` is too small to reach it
    (only the search's direction: the bound never uses it)."""
    M = torch.einsum("nk,mn,nl->mkl", C, om, C)
    g = eta @ C
    lam, Q = torch.linalg.eigh(M)
    value, Y = ball_quadratic_sup(M, g[:, None, :], 1.0, eig=(lam, Q), solution=True)
    y, q = Y[:, 0] / 2, Q[:, :, -1]
    short, qy = (1 - (y**2).sum(dim=1)).clamp_min(0), (y * q).sum(dim=1)
    # the smaller root of ‖y + step·q‖ = 1, on the side y already leans to along q
    step = (
        torch.where(qy < 0, -1.0, 1.0)
        * short
        / ((qy**2 + short).sqrt() + qy.abs()).clamp_min(1e-300)
    )
    y = y + torch.where(lam[:, -1] > 0, step, 0.0)[:, None] * q
    return value[:, 0], y @ C.T


def _best_multiplier(cols, zc, ell, p, spread, w, r, u_own, R, grid, steps: int = 40) -> float:
    """The multiplier ``λ ≥ 0`` that makes :prf:ref:`prop-softmax-joint` smallest at the one
    word of ``cols``, by golden-section search on ``log λ`` (the bound is convex in ``λ``: a
    sum of maxima of affine functions of it). Any ``λ`` gives a valid bound."""
    top, t2, keep = _joint_grid(cols, zc, ell, p, spread, w, r, u_own, grid)
    scale = float(top.max()) / max(float(t2.max()), 1e-300)  # where λt² meets the terms

    def value(log_lam: float) -> float:
        return float(_joint_value(top, t2, keep, u_own, R, math.exp(log_lam))[0])

    lo, hi = math.log(scale) - 20.0, math.log(scale) + 10.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = value(a), value(b)
    for _ in range(steps):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = value(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = value(b)
    return math.exp((lo + hi) / 2)
