"""The exact read-out of row-normalised attention after one row of the text changes: only row
and column ``i`` of the scores move (:func:`wsutils.generalization.word_scores`)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..maps import Normalisation, normalise_scores

#: The normalisations :func:`row_column_readouts` handles: a weight ``u(z)`` of each score,
#: each row divided by its sum (``exp``: softmax, with and without the scalable factor;
#: ``relu``: ReLU attention, a row of zeros left at zero).
ROW_NORMALISED = ("softmax", "scalable", "relu")


def row_column_readouts(
    X: torch.Tensor, W: torch.Tensor, norm: Normalisation, row: int
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``readouts(Θ)`` → ``f(Δ) → (B, m)``: ``⟨φ(X_i(Δ)), θ_j⟩`` for attention
    ``φ(X) = A(X) X`` (eq. :eq:`eq-general-attention`) whose weights are a per-score weight
    ``u(z)``, ``z = c_n·x_r W x_cᵀ/√d``, normalised by row (``ROW_NORMALISED``), for a batch
    of changes ``Δ`` of row ``i = row`` and ``m`` read-outs ``θ_j`` (``Θ``: ``(m, n·d)``).

    Changing ``x_i`` into ``x' = x_i + Δ`` changes one score in each row ``r ≠ i`` (column
    ``i``) and row ``i`` whole. With ``G_{rc} = ⟨x_c, θ_r⟩`` (``θ_r`` the ``r``-th row of
    ``θ`` as ``n × d``), ``P_r = Σ_{c≠i} u(z_{rc}) G_{rc}`` and ``N_r = Σ_{c≠i} u(z_{rc})``
    made once,

    ``⟨φ(X'), θ⟩ = Σ_{r≠i} (P_r + u(z'_{ri}) ⟨x', θ_r⟩) / (N_r + u(z'_{ri}))
    + Σ_c A'_{ic} G'_{ic}``,

    with ``A'_{i·}`` row ``i``'s new weights and ``G'_{ic}`` equal to ``G_{ic}`` but
    ``G'_{ii} = ⟨x', θ_i⟩``: ``O(d² + m·n·d)`` a candidate, against ``O(n²·d)`` for the
    forward pass. For softmax each row's sums are kept relative to its largest score, so no
    exponential overflows. Trusts its caller (``X``, ``W`` float64, ``norm`` one of
    ``ROW_NORMALISED``)."""
    if norm.name not in ROW_NORMALISED:
        raise ValueError(f"row_column_readouts handles {ROW_NORMALISED}, not {norm.name!r}.")
    n, d = X.shape
    s = math.sqrt(d)
    a = norm.scale(n) / s
    soft = norm.name != "relu"
    Z = a * (X @ W @ X.T)  # n × n, z_rc
    others = torch.tensor([c for c in range(n) if c != row], dtype=torch.long, device=X.device)
    Zo = Z[:, others]  # n × (n − 1): empty for a one-word text
    shift = Zo.amax(dim=1) if soft and n > 1 else torch.zeros(n, dtype=X.dtype, device=X.device)
    U = torch.exp(Zo - shift[:, None]) if soft else torch.relu(Zo)
    N = U.sum(dim=1)
    QT, KT = (X @ W).T, W @ X.T  # z'_ri = a·x' QT[:, r]; row i's scores x' KT[:, c]/√d
    not_i = torch.ones(n, dtype=X.dtype, device=X.device)
    not_i[row] = 0

    def readouts(thetas: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        m = thetas.shape[0]
        Th = thetas.reshape(m, n, d)  # m × n × d
        G = Th @ X.T  # m × n × n
        P = (U * G[:, :, others]).sum(dim=-1)  # m × n
        Gi = G[:, row]  # m × n: row i's ⟨x_c, θ_i⟩
        # one product gives a candidate's every linear term: z'_ri/a, row i's scores·√d,
        # x'W, and ⟨x', θ_r⟩ for every model and row
        C = torch.cat([QT, KT, W, Th.reshape(m * n, d).T], dim=1)  # d × (2n + d + m·n)

        def f(Delta: torch.Tensor) -> torch.Tensor:
            xi = X[row] + Delta  # B × d
            B = len(xi)
            lin = xi @ C
            col = a * lin[:, :n]  # B × n: z'_ri
            si = lin[:, n : 2 * n] / s  # B × n: row i's new scores x' W x_c/√d
            si[:, row] = (lin[:, 2 * n : 2 * n + d] * xi).sum(dim=-1) / s
            g = lin[:, 2 * n + d :].reshape(B, m, n)  # B × m × n: ⟨x', θ_r⟩
            if soft:
                top = torch.maximum(shift, col)
                old, new = torch.exp(shift - top), torch.exp(col - top)
            else:
                old, new = torch.ones_like(col), torch.relu(col)
            den = N * old + new  # B × n; rows r ≠ i: (P_r·old + g_r·new) / den
            inv = torch.where(den > 0, 1 / torch.where(den > 0, den, 1.0), 0.0) * not_i
            rows_r = (old * inv) @ P.T + torch.einsum("bmr,br->bm", g, new * inv)
            Ai = normalise_scores(si, norm)  # row i's new weights, as the map makes them
            # row i: Σ_c A'_ic G_ic, but G'_ii = ⟨x', θ_i⟩
            return rows_r + Ai @ Gi.T + Ai[:, row : row + 1] * (g[:, :, row] - Gi[:, row])

        return f

    return readouts
