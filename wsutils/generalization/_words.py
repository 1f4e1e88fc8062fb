"""The trained models' outputs on every one-word substitution of a text, exactly (the
substitutions' rows: :mod:`wsutils.text.token_rows`)."""

from __future__ import annotations

import torch

from ..checks import as_tensor, check_finite, check_int
from ._search import FlipModel


def word_scores(
    model: FlipModel, x: torch.Tensor, rows, thetas, *, batch: int = 1024
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
    batch = check_int("batch", batch, minimum=1)
    x = as_tensor(x, dtype=torch.float64, name="x")
    with torch.no_grad():
        d = x.shape[0] if x.ndim == 1 else 0  # a wrong x is refused by check_candidates
        p = model.features(d) if d else 0
        x, rows, thetas = check_candidates(x, rows, thetas, p)
        if model.readouts is not None:
            read = model.readouts(thetas)
        else:
            read = lambda D: model.phi_row(D) @ thetas.T  # noqa: E731
        out = torch.empty(rows.shape[0], thetas.shape[0], dtype=torch.float64)
        for j in range(0, rows.shape[0], batch):
            Delta = rows[j : j + batch] - x
            out[j : j + len(Delta)] = read(Delta).cpu()
    return out


def check_candidates(x, rows, thetas, p: int, d: int | None = None):
    """The arguments :func:`word_scores` and :func:`rf_word_bounds` share, as float64 tensors
    ``(x, rows, thetas)``: ``x`` the text's row ``(d,)`` (``d``: the width the model needs;
    default ``x``'s own), ``rows`` the candidates ``(T, d)`` with ``T ≥ 1``, ``thetas`` the
    read-outs ``(m, p)`` of the model's ``p`` features with ``m ≥ 1``, all finite; else a
    ValueError that names the argument."""
    x = as_tensor(x, dtype=torch.float64, name="x")
    rows = as_tensor(rows, dtype=torch.float64, name="rows")
    thetas = as_tensor(thetas, dtype=torch.float64, name="thetas")
    d = (x.shape[-1] if x.ndim else 0) if d is None else d
    if x.shape != (d,) or rows.ndim != 2 or rows.shape[1] != d or rows.shape[0] == 0:
        raise ValueError(
            f"x must be one row ({d},) and rows the candidates (T, {d}), T ≥ 1, got shapes "
            f"{tuple(x.shape)} and {tuple(rows.shape)}."
        )
    if thetas.ndim != 2 or thetas.shape[1] != p or thetas.shape[0] == 0:
        raise ValueError(
            f"thetas must be the read-outs (m, {p}) of the model's {p} features, m ≥ 1, "
            f"got shape {tuple(thetas.shape)}."
        )
    for name, t in (("x", x), ("rows", rows), ("thetas", thetas)):
        check_finite(name, t)
    return x, rows, thetas
