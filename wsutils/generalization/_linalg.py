"""Min-norm interpolation, fine-tuning and re-training through the ``N × N`` Gram matrix
(re-exported by :mod:`wsutils.generalization`).
"""

from __future__ import annotations

import torch

from .._tensor import Array, like
from ..checks import as_tensor, check_finite, check_real

# ---------------------------------------------------------------------------------------------
# Min-norm interpolation, fine-tuning, re-training (all through the N × N Gram matrix)
# ---------------------------------------------------------------------------------------------


def _matrix(name: str, Phi: Array) -> torch.Tensor:
    P = as_tensor(Phi)
    if P.ndim != 2:
        raise ValueError(
            f"{name} must be a matrix (N, p) with one feature row per text, got "
            f"shape {tuple(P.shape)}."
        )
    if P.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"{name} is {str(P.dtype).removeprefix('torch.')}; the Gram algebra runs in float32 "
            f"or float64: pass {name}.double()."
        )
    check_finite(name, P)
    return P


def _vector(name: str, v: Array, length: int, ref: torch.Tensor, hint: str) -> torch.Tensor:
    t = as_tensor(v, dtype=ref.dtype, device=ref.device).reshape(-1)
    if t.shape[0] != length:
        raise ValueError(f"{name} must have length {length} ({hint}), got {t.shape[0]}.")
    check_finite(name, t)
    return t


def gram_cholesky(Phi: Array, *, rcond: float | None = None) -> torch.Tensor:
    """Lower Cholesky factor ``L`` of the Gram matrix ``K = ΦΦᵀ`` (``N × N``).

    Raises a ValueError when ``K`` is singular or numerically so (``N > p``, a repeated text,
    features that are linearly dependent): then no interpolator of arbitrary labels exists.
    The test is on the pivots, ``min L_jj² < rcond · max K_jj`` with ``rcond = N·eps``
    by default (a pivot of ``K`` is never below its smallest eigenvalue).
    """
    return _cholesky(_matrix("Phi", Phi), rcond)


def _cholesky(P: torch.Tensor, rcond: float | None = None) -> torch.Tensor:
    """:func:`gram_cholesky` of a checked matrix (finite, ``N × p``): the same factor, the
    same refusals of a singular Gram matrix."""
    N, p = P.shape
    if N > p:
        raise ValueError(
            f"Phi has N = {N} texts but only p = {p} features: ΦΦᵀ is singular and "
            "min-norm interpolation is not defined. Use fewer texts or more features."
        )
    K = _gram(P)
    L, info = torch.linalg.cholesky_ex(K)
    eps = torch.finfo(K.dtype).eps
    rcond = N * eps if rcond is None else rcond
    scale = float(torch.diagonal(K).max())
    if int(info) != 0 or not scale > 0 or float(torch.diagonal(L).min()) ** 2 < rcond * scale:
        raise ValueError(
            f"the Gram matrix ΦΦᵀ ({N} × {N}) is singular or numerically singular: the feature "
            "rows are linearly dependent (a repeated text, or too few features), so the texts "
            "cannot all be interpolated. Remove duplicate texts or use more features."
        )
    return L


def _gram(P: torch.Tensor, blocks: int = 4) -> torch.Tensor:
    """``K = PPᵀ``, exactly symmetric: one triangle computed, then mirrored. On the CPU in
    float32 or float64 from 512 rows on, by BLAS ``syrk`` (half the products of
    ``P @ P.T``); elsewhere from its lower triangle by row blocks (block ``i`` of ``P`` times
    blocks ``≤ i``: ``(b + 1)/2b`` of the products, 5/8 for ``b = 4``; below 512 rows
    ``P @ P.T``). Each entry is the same dot product as in ``P @ P.T``, summed by the BLAS in
    an order that may differ, so ``K`` agrees with it to rounding (``benchmarks/README.md``:
    ``bench_search_steps --parts flip``)."""
    N = P.shape[0]
    if N >= 512 and P.device.type == "cpu" and P.dtype in (torch.float32, torch.float64):
        from scipy.linalg import blas

        syrk = blas.dsyrk if P.dtype == torch.float64 else blas.ssyrk
        # P row-major is Pᵀ column-major (p × N): trans=1 gives (Pᵀ)ᵀPᵀ = PPᵀ, its upper
        # triangle filled, column-major
        U = torch.from_numpy(syrk(1.0, P.contiguous().numpy().T, trans=1))
        return torch.triu(U) + torch.triu(U, 1).mT
    return _gram_by_blocks(P, blocks if N >= 512 else 1)


def _gram_by_blocks(P: torch.Tensor, blocks: int) -> torch.Tensor:
    """``PPᵀ`` from its lower triangle by ``blocks`` row blocks, mirrored (any device)."""
    N = P.shape[0]
    edges = [round(i * N / blocks) for i in range(blocks + 1)]
    K = torch.empty((N, N), dtype=P.dtype, device=P.device)
    for r0, r1 in zip(edges[:-1], edges[1:]):
        K[r0:r1, :r1] = P[r0:r1] @ P[:r1].T
    return torch.tril(K) + torch.tril(K, -1).mT


def _gram_solve(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.cholesky_solve(B.reshape(L.shape[0], -1), L).reshape(B.shape)


def min_norm_interpolator(Phi: Array, Y: Array, *, L: torch.Tensor | None = None) -> Array:
    """``θ₀ = Φ⁺Y = Φᵀ(ΦΦᵀ)⁻¹Y``, the min-norm solution of ``Φθ = Y`` (eq. :eq:`eq-theta0`).

    ``Phi`` is ``N × p`` with ``N ≤ p``; ``L`` may pass a precomputed :func:`gram_cholesky`.
    """
    P = _matrix("Phi", Phi)
    Yt = _vector("Y", Y, P.shape[0], P, "one label per row of Phi")
    L = gram_cholesky(P) if L is None else L
    return like(P.T @ _gram_solve(L, Yt), Phi)


def project_out(Phi: Array, phi: Array, *, L: torch.Tensor | None = None) -> Array:
    """``Pφ = φ − Φᵀ(ΦΦᵀ)⁻¹Φφ``: the part of ``φ`` orthogonal to the rows of ``Φ``
    (``P = I − Φ⁺Φ``, eq. :eq:`eq-retrain`), without forming the ``p × p`` projector."""
    P = _matrix("Phi", Phi)
    f = _vector("phi", phi, P.shape[1], P, "the feature vector of one text, p = Phi.shape[1]")
    L = gram_cholesky(P) if L is None else L
    return like(f - P.T @ _gram_solve(L, P @ f), phi)


def fine_tune(theta0: Array, phi: Array, y: float) -> Array:
    """Fine-tuning (eq. :eq:`eq-fine-tune`): ``θ₁ = θ₀ + φ (y − ⟨φ, θ₀⟩)/‖φ‖²``, the closest
    ``θ`` to ``θ₀`` with ``⟨φ, θ⟩ = y``."""
    y = check_real("y", y)
    th = as_tensor(theta0)
    if th.ndim != 1:
        raise ValueError(f"theta0 must be a vector, got shape {tuple(th.shape)}.")
    check_finite("theta0", th)
    f = _vector("phi", phi, th.shape[0], th, "the length of theta0")
    return like(_fine_tune(th, f, y), theta0)


def _fine_tune(th: torch.Tensor, f: torch.Tensor, y: float) -> torch.Tensor:
    """:func:`fine_tune` of checked tensors (``θ₀``, ``φ`` finite, of one length; ``y`` a
    real number): the same formula, the same refusal of ``φ = 0``."""
    nrm2 = float(f @ f)
    if not nrm2 > 0:
        raise ValueError("φ(X) = 0: no parameter can fit the new label; the text has no features.")
    return th + f * (float(y) - float(f @ th)) / nrm2


def retrain(
    Phi: Array,
    Y: Array,
    phi: Array,
    y: float,
    *,
    L: torch.Tensor | None = None,
    rtol: float = 1e-10,
) -> Array:
    """Re-training (eq. :eq:`eq-retrain`): the min-norm interpolator of the ``N + 1`` texts,
    ``θ₁ = θ₀ + Pφ (y − ⟨φ, θ₀⟩)/‖Pφ‖²``, computed with the ``N × N`` Gram matrix only.

    Raises a ValueError when ``φ`` lies in the row space of ``Φ`` (``‖Pφ‖ ≤ rtol·‖φ‖``).
    """
    y = check_real("y", y)
    P = _matrix("Phi", Phi)
    L = gram_cholesky(P) if L is None else L
    theta0 = as_tensor(min_norm_interpolator(P, Y, L=L))
    f = _vector("phi", phi, P.shape[1], P, "the feature vector of one text, p = Phi.shape[1]")
    Pf = as_tensor(project_out(P, f, L=L))
    nrm2 = float(Pf @ Pf)
    if not nrm2 > (rtol * float(torch.linalg.vector_norm(f))) ** 2:
        raise ValueError(
            "φ(X) lies in the span of the training features (‖Pφ‖ ≈ 0): the new "
            "text is a combination of the old ones and cannot get its own label."
        )
    return like(theta0 + Pf * (float(y) - float(f @ theta0)) / nrm2, Phi)
