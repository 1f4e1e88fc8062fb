"""The door of every entry point: input conversion (:func:`as_tensor`, :func:`as_text`) and the
checks shared by the maps, the estimators and the bounds; each raises a ValueError or a
TypeError that says what is wrong and what to do."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ._tensor import Array, row_norms


def as_tensor(
    x: Array, *, dtype: torch.dtype | None = None, device=None, name: str = "input"
) -> torch.Tensor:
    """A torch view of ``x``: float64 for numpy input unless ``dtype`` says otherwise;
    a floating torch tensor keeps its dtype and device unless told otherwise.

    Complex input is a TypeError (casting would silently drop the imaginary part), and so is
    anything that is not numeric (strings, objects)."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(
                f"{name} is complex ({x.dtype}); wsutils works on real arrays: pass "
                "the real part explicitly if that is what you mean."
            )
        if dtype is None and not x.is_floating_point():
            dtype = torch.float64
        return x.to(dtype=dtype or x.dtype, device=device or x.device)
    a = np.asarray(x)
    if np.iscomplexobj(a):
        raise TypeError(
            f"{name} is complex ({a.dtype}); wsutils works on real arrays: pass "
            "the real part explicitly if that is what you mean."
        )
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {a.dtype}.")
    return torch.as_tensor(a, dtype=dtype or torch.float64, device=device)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite (no NaN, no infinity), as
    ``torch.isfinite(t).all()`` but in one pass without a temporary.

    The sum decides when it is finite: a NaN or an infinity in any entry makes every partial
    sum that contains it non-finite, and IEEE addition never turns a non-finite value finite
    again (``NaN + x = NaN``, ``inf + x ∈ {inf, NaN}``). A non-finite sum (a real NaN or inf,
    or finite entries whose sum overflows) falls back to the entrywise test, so the answer is
    always that of ``torch.isfinite(t).all()``. Measured: a ``1300 × 92,160`` float64 matrix,
    one thread, 4.5 s for the entrywise test, 0.04 s for the sum (``benchmarks/README.md``).
    Integer and bool tensors are always finite."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    with torch.no_grad():
        return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_finite(name: str, t: torch.Tensor) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); pass at least one entry.")
    if not all_finite(t):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} has {bad} non-finite entries (NaN or inf); clean the input first."
        )


def check_text(X: torch.Tensor) -> tuple[int, int]:
    """``X`` must be a finite ``(..., n, d)`` array with ``n, d ≥ 1``; returns ``(n, d)``."""
    if X.ndim < 2:
        raise ValueError(
            f"X must have shape (n, d) (one row per word), got shape {tuple(X.shape)}."
        )
    n, d = X.shape[-2], X.shape[-1]
    if n == 0 or d == 0:
        raise ValueError(
            f"X is empty (shape {tuple(X.shape)}); a text needs n ≥ 1 words of d ≥ 1."
        )
    check_finite("X", X)
    return n, d


def as_text(X: Array, *, dtype: torch.dtype | None = None, device=None):
    """The one door of a text: ``X`` as a tensor (:func:`as_tensor`, in
    ``dtype`` on ``device`` when given; complex or non-numeric input is a TypeError), checked
    by :func:`check_text`. Returns ``(tensor, n, d)``."""
    Xt = as_tensor(X, dtype=dtype, device=device, name="X")
    n, d = check_text(Xt)
    return Xt, n, d


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], hint: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({hint}), got {tuple(t.shape)}.")
    check_finite(name, t)


def _unit_rows_error(X: torch.Tensor, rtol: float | None) -> tuple[float, float]:
    """The largest relative distance of a row norm of ``X`` from ``√d``, and the tolerance
    :func:`check_unit_rows` holds it to (``rtol``, or its default for ``X``'s dtype)."""
    if rtol is None:
        rtol = max(1e-6, 2 * torch.finfo(X.dtype).eps) if X.is_floating_point() else 1e-6
    norms = row_norms(X, keepdim=False).to(torch.float64)
    return float((norms / math.sqrt(X.shape[-1]) - 1).abs().max()), rtol


def has_unit_rows(X: torch.Tensor, *, rtol: float | None = None) -> bool:
    """Whether every row of ``X`` has norm ``√d`` to the tolerance of
    :func:`check_unit_rows` (which raises where this is False)."""
    err, rtol = _unit_rows_error(X, rtol)
    return err <= rtol


def check_unit_rows(X: torch.Tensor, *, rtol: float | None = None) -> None:
    """Rows of ``X`` must have norm ``√d`` (the paper's normalisation; chapter word-sensitivity).

    ``rtol`` defaults to ``max(1e-6, 2·eps)`` of ``X``'s dtype: a row rescaled to ``√d`` and
    then rounded to the dtype is off by at most one unit roundoff per entry, so a float16 text
    (``eps ≈ 1e-3``) is accepted as normalised when it is, and a float64 one is held to 1e-6.
    Norms are computed without overflow (``wsutils._tensor.row_norms``)."""
    err, rtol = _unit_rows_error(X, rtol)
    d = X.shape[-1]
    if err > rtol:
        raise ValueError(
            f"rows of X must have norm √d = {math.sqrt(d):.6g}; the worst row is off by a "
            f"relative {err:.3g}. Rescale with wsutils.normalise_rows(X). For a trained "
            "model's hidden states, whose rows have norms of their own, rescaling measures the "
            "map at inputs the model never sees: measure in the ball of each word's own norm "
            "instead, wsutils.trained.own_norm_word_sensitivity(phi, X)."
        )


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """``value`` as a Python ``int``: an integer (Python or numpy, or a float with no fractional
    part is refused too: ``2.0`` is a float) of at least ``minimum``. A bool, a float such as
    ``2.7`` or a string is a TypeError; nothing is truncated."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}; "
            "pass an int (nothing is rounded or truncated)."
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
    return value


def check_row(row, n: int, name: str = "row") -> int:
    """A word's index as a Python ``int`` in ``[0, n)``: a bool, a float (``0.0`` too), a
    negative index (which torch would read from the end) or one past the last word is a
    ValueError that names it."""
    if (
        isinstance(row, (bool, np.bool_))
        or not isinstance(row, numbers.Integral)
        or not 0 <= int(row) < n
    ):
        raise ValueError(
            f"{name} must be an integer word index in [0, {n}) for a text of n = {n} words, "
            f"got {type(row).__name__} {row!r} (negative indices are not read from the end)."
        )
    return int(row)


def check_dtype(name: str, t: torch.Tensor, dtype: torch.dtype, hint: str = "") -> None:
    """``t`` must hold ``dtype``: a tensor of another precision is a ValueError that names it
    and says how to convert (nothing is cast silently, and nothing fails later inside torch
    on a dtype mismatch)."""
    if t.dtype != dtype:
        want = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"{name} is {str(t.dtype).removeprefix('torch.')}, but {want} is needed"
            f"{hint}: pass {name}.to(torch.{want})."
        )


def check_preactivations(name: str, u: torch.Tensor, Vi: torch.Tensor) -> None:
    """Random features seen from one word: the pre-activations ``name`` (``k``) and the block
    ``V_i`` (``k × d``) fit together and are finite; a ValueError that says what to pass."""
    if Vi.ndim != 2 or u.ndim != 1 or u.shape[0] != Vi.shape[0]:
        raise ValueError(
            f"{name} must hold one pre-activation per row of V_i: got {name} of shape "
            f"{tuple(u.shape)} and V_i of shape {tuple(Vi.shape)} (want (k,) and (k, d))."
        )
    check_finite(name, u)
    check_finite("Vi", Vi)


def check_real(name: str, value, *, positive: bool = False) -> float:
    """``value`` as a finite Python ``float`` (a label, a target, a radius); ``positive``: also
    above zero. A NaN or an infinity would otherwise come back as a NaN answer, and a negative
    radius as a reversed vector: each is a ValueError that says what to pass."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}; pass a finite number.")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value}.")
    return value


#: Seeds are integers in ``[0, SEED_LIMIT)`` — torch's generator takes at most 64 bits, and
#: ``−1`` would otherwise wrap to ``2**64 − 1`` (a second name for one stream).
SEED_LIMIT = 2**63


def check_seed(seed, name: str = "seed") -> int:
    """A seed as a Python ``int`` in ``[0, 2**63)``; anything else is an error that says so."""
    seed = check_int(name, seed)
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(
            f"{name} must be in [0, 2**63), got {seed}; use a non-negative integer "
            "(wsutils.run.seeds.point_seed derives one from a grid point)."
        )
    return seed


def check_rows(rows, n: int) -> list[int]:
    """The rows ``i`` to search, checked, as a list: ``rows`` is ``None`` (all), one index
    or a sequence of indices in ``[0, n)``.
    A boolean mask is refused (reading ``True``/``False`` as rows 1/0 would search the wrong
    words): pass ``np.flatnonzero(mask)``. Non-integers (``1.9``) are refused, not truncated.

    Raises
    ------
    TypeError
        If ``rows`` is a boolean mask, a string, or has a non-integer entry.
    ValueError
        If ``rows`` is empty or an index is outside ``[0, n)``.
    """
    if rows is None:
        return list(range(n))
    if isinstance(rows, torch.Tensor):
        if rows.dtype == torch.bool:
            rows = rows.cpu().numpy()
        else:
            rows = rows.tolist()
    if isinstance(rows, np.ndarray) and rows.dtype == bool:
        raise TypeError(
            "rows is a boolean mask; pass the row indices instead, e.g. rows=np.flatnonzero(mask)."
        )
    if isinstance(rows, (str, bytes)):
        raise TypeError(f"rows must be None, an int or a sequence of ints, got {rows!r}.")
    if np.ndim(rows) == 0:
        rows = [check_int("row", rows.item() if isinstance(rows, np.ndarray) else rows)]
    else:
        items = list(rows)
        if items and all(isinstance(r, (bool, np.bool_)) for r in items):
            raise TypeError(
                "rows is a boolean mask; pass the row indices instead, e.g. "
                "rows=np.flatnonzero(mask)."
            )
        rows = [check_int("rows entry", r) for r in items]
    if not rows:
        raise ValueError("rows is empty: pass None (all rows) or at least one row index.")
    bad = [r for r in rows if not 0 <= r < n]
    if bad:
        raise ValueError(f"rows {bad} are out of range for a text of n = {n} words.")
    return rows
