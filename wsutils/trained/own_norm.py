"""The word sensitivity with the word's own norm (:prf:ref:`def-own-norm-ws`): the rescaling
to the book's definition and the search on it (:mod:`wsutils.trained`).
"""

from __future__ import annotations

import math

import torch

from .._tensor import Array
from ..checks import as_tensor
from ..search import Search
from ..sensitivity import (
    SensitivityResult,
    ascend_and_certify,
    check_map_at_door,
    map_objective,
    search_setup,
)
from ._common import Map

#: The default search of :func:`own_norm_word_sensitivity` and of one trained head
#: (:func:`wsutils.trained.heads.head_word_sensitivity`): 4 starts, 50 steps, in float32
#: (every value certified in float64).
OWN_NORM_SEARCH = Search(starts=4, steps=50, dtype="float32")


def own_norm_problem(phi: Map, X: Array, *, device=None):
    """The rescaling behind :prf:ref:`def-own-norm-ws`: returns ``(Z, phi_Z, r)`` with
    ``r_j = ‖x_j‖/√d``, ``Z = diag(r)⁻¹ X`` (every row of norm ``√d``) and
    ``phi_Z(Z') = φ(diag(r) Z')``. Moving row ``i`` of ``Z`` by ``Δ'`` with ``‖Δ'‖ ≤ √d`` moves
    row ``i`` of ``X`` by ``Δ = r_i Δ'``, ``‖Δ‖ ≤ ‖x_i‖``, and ``phi_Z(Z) = φ(X)``, so
    ``S_{phi_Z}(Z)`` in the book's definition (radius ``√d``) is the own-norm sensitivity of
    ``φ`` at ``X``. ``Z`` and ``r`` are float64 tensors."""
    Xt = as_tensor(X, dtype=torch.float64, device=device, name="X")
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if not bool(torch.isfinite(Xt).all()):
        raise ValueError("X has non-finite entries (NaN or inf).")
    d = Xt.shape[1]
    r = torch.linalg.vector_norm(Xt, dim=1, keepdim=True) / math.sqrt(d)
    if not bool((r > 0).all()):
        raise ValueError("a row of X is zero: its own-norm ball is a point; drop that row.")
    Z = Xt / r

    def phi_Z(Zb: torch.Tensor) -> torch.Tensor:
        return phi(Zb * r.to(Zb.dtype))

    return Z, phi_Z, r


def _to_x(res: SensitivityResult, r: torch.Tensor) -> SensitivityResult:
    scale = r[:, 0].cpu().numpy()
    res.per_row_Delta = {i: D * scale[i] for i, D in res.per_row_Delta.items()}
    res.Delta = res.per_row_Delta[res.row]
    res.ball = "‖x_i‖"  # the word's own norm (def-own-norm-ws)
    return res


def own_norm_word_sensitivity(
    phi: Map,
    X: Array,
    *,
    rows=None,
    search: Search | dict | None = None,
    device=None,
    **settings,
) -> SensitivityResult:
    """``Ŝ^own_φ(X)``, a certified lower bound on ``S^own_φ(X)`` (:prf:ref:`def-own-norm-ws`):
    the search of :func:`wsutils.sensitivity.word_sensitivity` (same starts from ``seed``,
    same steps and step sizes) on :func:`own_norm_problem`, run in ``search.dtype`` (default
    ``OWN_NORM_SEARCH``, float32; ``settings``: its fields as keywords); the best iterate
    of every row is then projected onto the exact ball in float64 and its relative change
    recomputed in float64 at ``X`` itself (:func:`wsutils.sensitivity.certify` on ``Z`` in
    float64, not on ``Z`` rounded to ``dtype``), so every reported value is attained by the
    returned ``Δ`` at the given ``X``, up to float64 rounding. ``Delta``/``per_row_Delta``
    are returned in the coordinates of ``X`` (``‖Δ‖ ≤ ‖x_i‖`` up to the rounding of one
    multiplication)."""
    search = Search.parse(search, default=OWN_NORM_SEARCH, **settings)
    Z, phi_Z, r = own_norm_problem(phi, X, device=device)
    # before any search: a module in training mode, or one that fails in float64 (the
    # certificate's precision) or in the search's, is refused with the fix that works
    check_map_at_door(phi_Z, phi_Z, Z, search.work_dtype(Z.dtype), module=phi)
    Zs, row_list, _ = search_setup(
        Z.to(search.work_dtype(Z.dtype)), rows=rows, check_norms=False, device=device
    )
    with torch.no_grad():
        try:
            base = phi_Z(Zs[None])[0]
        except RuntimeError as e:  # a torch shape mismatch, typically
            raise ValueError(
                f"phi cannot be applied to X of shape {tuple(Z.shape)}: {e}. X must have the "
                "width the map takes (the model's hidden size for its layers)."
            ) from e
    # searched on the rounded copy Zs, certified at X itself in float64
    objective = map_objective(phi_Z, Zs, base)
    res = ascend_and_certify(objective, phi_Z, Zs, Z.to(Zs.device), row_list, search)
    return _to_x(res, r)
