"""The trained models' outputs on every one-word substitution of a text, exactly (the
substitutions' rows: :mod:`wsutils.text.token_rows`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from ..checks import as_tensor, check_finite, check_int
from ..maps import Normalisation

if TYPE_CHECKING:
    from ._search import FlipModel


def word_scores(
    model: FlipModel, x: torch.Tensor, rows, thetas, *, batch: int = 512
) -> torch.Tensor:
    """The outputs ``t_j(v) = ⟨φ(X_i(x'_v − x_i)), θ_j⟩`` of linear read-outs of ``model``'s
    features (:class:`FlipModel`, seen from word ``i``) on the text with row ``i`` replaced by
    each candidate row ``x'_v``: ``x`` is the text's own row ``x_i`` (``d``), ``rows`` the
    candidates ``(T, d)`` (:func:`wsutils.text.token_rows.substitution_rows`; not limited to
    the ball ``‖Δ‖ ≤ √d``), ``thetas`` the read-outs ``(m, p)``, one per trained model.

    Every candidate is scored, none is guessed: ``batch`` candidates at a time, by
    ``model.readouts`` where the model has one (softmax and ReLU attention:
    :func:`row_column_readouts`, ``O(d² + m·n·d)`` a candidate), else their features
    ``φ(X_i(Δ))`` (``model.phi_row``, float64) multiplied by every ``θ_j`` in one product, so
    the features of a candidate are made once for all the read-outs.

    Returns
    -------
    torch.Tensor
        ``(T, m)`` float64 on the CPU: entry ``[v, j]`` is ``t_j(v)``.

    Raises
    ------
    ValueError
        If ``x``, ``rows`` or ``thetas`` are not finite or not of the shapes above (``rows``
        and ``thetas`` may not be empty), or ``batch`` is below one.
    """
    x = as_tensor(x, dtype=torch.float64, name="x")
    rows = as_tensor(rows, dtype=torch.float64, name="rows")
    thetas = as_tensor(thetas, dtype=torch.float64, name="thetas")
    batch = check_int("batch", batch, minimum=1)
    if x.ndim != 1 or rows.ndim != 2 or rows.shape[1] != x.shape[0] or rows.shape[0] == 0:
        raise ValueError(
            f"x must be one row (d,) and rows the candidates (T, d), T ≥ 1, got shapes "
            f"{tuple(x.shape)} and {tuple(rows.shape)}."
        )
    for name, t in (("x", x), ("rows", rows), ("thetas", thetas)):
        check_finite(name, t)
    with torch.no_grad():
        p = model.phi_row(torch.zeros(1, x.shape[0], dtype=torch.float64)).shape[1]
        if thetas.ndim != 2 or thetas.shape[1] != p or thetas.shape[0] == 0:
            raise ValueError(
                f"thetas must be the read-outs (m, p) of the model's {p} features, m ≥ 1, "
                f"got shape {tuple(thetas.shape)}."
            )
        read = model.readouts or (lambda D, Th: model.phi_row(D) @ Th.T)
        out = torch.empty(rows.shape[0], thetas.shape[0], dtype=torch.float64)
        for j in range(0, rows.shape[0], batch):
            Delta = rows[j : j + batch] - x
            out[j : j + len(Delta)] = read(Delta, thetas).cpu()
    return out


#: The normalisations :func:`row_column_readouts` handles: a weight ``u(z)`` of each score,
#: each row divided by its sum (``exp``: softmax, with and without the scalable factor;
#: ``relu``: ReLU attention, a row of zeros left at zero).
ROW_NORMALISED = ("softmax", "scalable", "relu")


def row_column_readouts(
    X: torch.Tensor, W: torch.Tensor, norm: Normalisation, row: int
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``readouts(Δ, Θ) → (B, m)``: ``⟨φ(X_i(Δ)), θ_j⟩`` for attention
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
    a = norm.scale(n) / math.sqrt(d)
    soft = norm.name != "relu"
    Z = a * (X @ W @ X.T)  # n × n, z_rc
    others = torch.tensor([c for c in range(n) if c != row], device=X.device)
    Zo = Z[:, others]
    shift = Zo.amax(dim=1) if soft else torch.zeros(n, dtype=X.dtype, device=X.device)
    U = torch.exp(Zo - shift[:, None]) if soft else torch.relu(Zo)
    N = U.sum(dim=1)
    QT, KT = (X @ W).T, W @ X.T  # z'_ri = a·x' QT[:, r], z'_ic = a·x' KT[:, c]
    not_i = torch.ones(n, dtype=X.dtype, device=X.device)
    not_i[row] = 0

    def readouts(Delta: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
        Th = thetas.reshape(-1, n, d)  # m × n × d
        G = Th @ X.T  # m × n × n
        P = (U * G[:, :, others]).sum(dim=-1)  # m × n
        xi = X[row] + Delta  # B × d
        col = a * (xi @ QT)  # B × n: z'_ri
        zi = a * (xi @ KT)  # B × n: z'_ic
        zi[:, row] = a * ((xi @ W) * xi).sum(dim=-1)
        g = torch.einsum("bd,mrd->bmr", xi, Th)  # B × m × n: ⟨x', θ_r⟩
        if soft:
            top = torch.maximum(shift, col)
            old, new = torch.exp(shift - top), torch.exp(col - top)
        else:
            old, new = torch.ones_like(col), torch.relu(col)
        den = (N * old + new)[:, None]  # B × 1 × n
        num = P * old[:, None] + new[:, None] * g
        rows_r = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
        Ai = torch.softmax(zi, dim=-1) if soft else _rownorm(torch.relu(zi))
        Gi = G[:, row].expand(len(xi), -1, -1).clone()  # B × m × n
        Gi[:, :, row] = g[:, :, row]
        return (rows_r * not_i).sum(dim=-1) + (Ai[:, None] * Gi).sum(dim=-1)

    return readouts


def _rownorm(u: torch.Tensor) -> torch.Tensor:
    mass = u.sum(dim=-1, keepdim=True)
    return u / torch.where(mass > 0, mass, torch.ones_like(mass))
