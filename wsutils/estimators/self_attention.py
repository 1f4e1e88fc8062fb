"""The fast word-sensitivity estimator of softmax, ReLU and every other attention of
eq. :eq:`eq-general-attention`.

:func:`attention_word_sensitivity` runs the search of
:func:`wsutils.sensitivity.word_sensitivity` (same starts, steps and step sizes, so the same
answer up to rounding), but evaluates ``φ(X_i(Δ)) − φ(X)`` in ``O(n·d)`` per start and step:
a change of row ``i`` touches only row ``i`` and column ``i`` of the score matrix, so every
other output row is a two-point mixture of cached quantities
(:mod:`wsutils.estimators.objectives`), evaluated without cancellation for every score scale.
With ``takeovers=True`` it also starts every row from the constructions of
:mod:`wsutils.estimators.takeover`.

``normalisation`` is anything :meth:`wsutils.maps.Normalisation.parse` reads: the paper's
``"raf"`` (softmax) and ``"relu"``, any other row normalisation of the normalisation chapter
by name, dict or :class:`wsutils.maps.Normalisation`. Every ``Δ`` returned lies in the ball
exactly (:func:`wsutils.sensitivity.project_ball`) and every reported value is computed in
float64 whatever the input's dtype.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .._tensor import Array
from ..maps import Normalisation
from ..search import Search
from ..sensitivity import (
    SensitivityResult,
    ascend_and_certify,
    search_setup,
)
from .objectives import fast_objective
from .takeover import caller_weights, constructions, kernel
from .upper import attention_certified_upper

__all__ = [
    "attention_word_sensitivity",
]


def attention_word_sensitivity(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "raf",
    rows: int | Sequence[int] | None = None,
    init: Array | None = None,
    takeovers: bool = False,
    search: Search | dict | None = None,
    upper: bool = True,
    device=None,
    **settings,
) -> SensitivityResult:
    """Estimate ``S(X)`` for softmax (``normalisation="raf"``, eq. :eq:`eq-raf`), ReLU
    attention (``"relu"``, eq. :eq:`eq-relu-attention`) or any normalisation of
    eq. :eq:`eq-general-attention` (a name, dict or :class:`wsutils.maps.Normalisation`) with
    weights ``W``.

    The search is exactly that of :func:`wsutils.sensitivity.word_sensitivity` (same starts
    from ``seed``, same steps, best iterate kept, every requested row searched, ``init`` extra
    starts), with the relative change evaluated in ``O(n·d)`` per start and step instead of
    ``O(n²·d + n·d²)`` (``_FastObjective``, stable for every score scale). ``takeovers=True``
    adds every construction of :func:`wsutils.estimators.takeover.certified_lower_bound` for
    the row being searched as extra starts (so the estimate is at least that certificate, up
    to rounding). Every reported
    value (``value`` and ``per_row``) is recomputed with the full map in float64 from the
    returned ``Delta``/``per_row_Delta``, with the caller's ``W`` (exactly; the search alone
    uses ``W`` in ``X``'s dtype).

    ``search.dtype`` (``"float32"`` or ``"float64"``, :class:`wsutils.search.Search`)
    runs the search (the fast objective, the starts, the steps) in that precision on ``X``
    and ``W`` rounded to it; ``None`` (default) searches in ``X``'s own search dtype. The
    search only proposes ``Δ``: every reported value is the float64 relative change at the
    returned ``Δ`` (projected onto the exact ball) for the *unrounded* ``X`` and ``W``, so it
    is a certified lower bound whatever the search precision.

    Parameters
    ----------
    X
        One text ``(n, d)``, real and finite.
    W
        The attention weights, ``d × d``.
    normalisation, rows, init, takeovers
        As above and as in :func:`wsutils.sensitivity.word_sensitivity`. With a sink
        (``Normalisation(..., sink=b)``, eq. :eq:`eq-sink-attention`) row 0 is the sink's
        token: its norm is free, and ``rows=None`` searches the words ``1, …, n − 1``.
    search, **settings
        The search's settings (:class:`wsutils.search.Search`, default ``Search()``), its
        fields as keywords replacing those of ``search``.
    upper
        Also bound every searched row from above where the library can
        (:func:`wsutils.estimators.upper.attention_certified_upper`: softmax at any ``β``,
        scalable softmax, with or without a sink; ReLU attention under
        :prf:ref:`prop-relu-low`'s conditions), at ``O(n²d)``; ``False`` skips it.

    Returns
    -------
    SensitivityResult
        The best float64 relative change found (a certified lower bound on ``S(X)``), its row
        and ``Δ``, and the same per row; ``upper``/``per_row_upper`` the upper certificates
        of the searched rows (``None``/empty for the other normalisations, or with
        ``upper=False``), so that with every word searched ``value ≤ S(X) ≤ upper``.

    Raises
    ------
    TypeError
        If ``rows`` is a boolean mask (pass ``np.flatnonzero(mask)``) or has a non-integer
        entry (``1.9``), ``starts``/``steps`` is not an integer, or ``X``/``W`` is complex or
        not numeric.
    ValueError
        If ``φ(X)`` is not finite (named as such) or is zero (the relative change is then
        undefined), ``init`` is neither ``(d,)`` nor ``(m, d)``, ``lr`` is NaN or not
        positive, or the other input checks of :func:`wsutils.sensitivity.search_setup` fail.
    """
    norm = Normalisation.parse(normalisation)  # the one parse of the map
    search = Search.parse(search, **settings)  # the one parse of the search
    fn = kernel(norm)
    sink = norm.sink is not None  # row 0 is the sink's token: any norm, not searched by default
    Xt, row_list, extra = search_setup(X, rows=rows, init=init, sink=sink, device=device)
    W64 = caller_weights(W, Xt)  # the caller's W, read once
    Wt = W64.to(Xt.dtype)  # the search's copy (search_weights)
    work = search.work_dtype(Xt.dtype)
    Xs, Ws = Xt.to(work), Wt.to(work)  # what the search sees
    if extra is not None:
        extra = extra.to(work)
    obj = fast_objective(Xs, Ws, norm)
    if not math.isfinite(obj.base_norm):
        raise ValueError(
            "φ(X) is not finite (NaN or infinite entries): the scores or the "
            "normalisation's parameters are outside the range it is accurate in."
        )
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and map.")

    def objective(chunk: list[int]):
        return obj

    def row_constructions(r: int) -> torch.Tensor:  # each row's own take-overs, its starts
        return constructions(Xt, W64, r, norm).to(work)

    result = ascend_and_certify(
        objective,
        lambda Z: fn(Z, W64),
        Xs,
        Xt,
        row_list,
        search,
        extra=extra,
        row_starts=row_constructions if takeovers else None,
        pair_elements=obj.pair_elements,
    )
    if not upper:
        return result
    bounds = attention_certified_upper(
        Xt.detach().to("cpu", torch.float64), W64.detach().cpu(), row_list, normalisation=norm
    )
    if bounds is None:
        return result
    return result.with_upper(dict(zip(row_list, bounds.tolist())))
