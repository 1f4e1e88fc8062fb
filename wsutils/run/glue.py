"""Numbers for the prose: many values glued in one call (``myst_nb.glue``).

A chapter computes its numbers in code and the prose shows them with ``{glue:text}`name```;
:func:`glue_values` glues a whole table of them at once, each as a plain Python number so a
format spec such as ``:.2f`` applies (a ``numpy.float64`` or a 0-d tensor is converted first).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["counted", "glue_figure", "glue_values"]


def counted(k: int, noun: str) -> str:
    """``k`` of ``noun`` as the prose says it: ``"one review"``, ``"3 reviews"`` (``noun``
    singular, its plural with an ``s``), so a page never shows "1 reviews" or "review(s)"."""
    return f"one {noun}" if k == 1 else f"{k} {noun}s"


def _plain(name: str, value: Any) -> Any:
    """``value`` as the plain Python object the prose formats: ``bool``, ``int``, ``float``
    (from numpy scalars and one-element tensors as well), or ``str``; sequences of numbers stay
    as they are (a figure may glue a list). A NaN or infinite float is refused: a number in
    the prose is always a finite, computed one."""
    if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0:
        value = value.item()
    elif type(value).__module__.startswith("torch") and value.numel() == 1:
        value = value.item()  # a one-element tensor
    if isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"glue value {name!r} is {value}: the prose needs a finite number.")
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        bad = [v for v in np.ravel(np.asarray(value, dtype=object)) if _not_finite(v)]
        if bad:
            raise ValueError(
                f"glue value {name!r} holds {bad[0]}: every number in the prose is finite."
            )
    return value


def _not_finite(v: Any) -> bool:
    """Whether ``v`` is a real number (not a bool) that is NaN or infinite."""
    return (
        isinstance(v, numbers.Real)
        and not isinstance(v, (bool, np.bool_))
        and not math.isfinite(float(v))
    )


def glue_values(values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
    """Glue every ``name: value`` of ``values`` and ``more`` for the prose, without display
    (``myst_nb.glue(name, value, display=False)`` each), as plain Python numbers (``bool``,
    ``int``, ``float`` from numpy scalars and one-element tensors, or ``str``; sequences stay
    as they are).

    Parameters
    ----------
    values, **more
        The names the prose uses in ``{glue:text}`` and their values; a name given twice is
        refused.

    Raises
    ------
    ValueError
        A name given both in ``values`` and as a keyword, or a NaN or infinite number.
    """
    from myst_nb import glue

    table = dict(values or {})
    twice = sorted(set(table) & set(more))
    if twice:
        raise ValueError(f"glue_values: {twice} given twice.")
    table.update(more)
    for name, value in table.items():
        glue(name, _plain(name, value), display=False)


def glue_figure(name: str, fig) -> None:
    """Glue the matplotlib figure ``fig`` under ``name`` without displaying it
    (``myst_nb.glue(name, fig, display=False)``), for another page to paste with
    ``{glue:any} name`` and ``:doc: chapter.md`` (myst-nb's ``glue:figure`` reads only the
    page's own keys)."""
    from myst_nb import glue

    glue(name, fig, display=False)
