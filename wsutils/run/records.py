"""A grid's records as arrays and tables: what a chapter reads from
:func:`wsutils.run.sweep.run_grid`.

``run_grid`` returns one record (a dict: the point's parameters and its results) per point.
A chapter mostly wants one field over the grid's axes, ``S`` at every ``(d, n, seed)`` say:
:func:`grid_array` gives it, checking that the grid is complete and rectangular instead of
leaving a comprehension to drop a cell silently. Where the grid is not rectangular (the
IMDb sweep: RF on some rows, attention on all, a Gaussian control at one width),
:func:`grid_frame` gives the records as a ``pandas.DataFrame``, one row per point, to
group and select by name.
"""

from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import numpy as np

__all__ = ["grid_array", "grid_frame"]


def grid_array(records: Sequence[Mapping], key: str, axes: Mapping[str, Sequence]) -> np.ndarray:
    """The field ``key`` of ``records`` as an array over the grid ``axes``: ``axes`` maps
    parameter names to their values, in order (``{"d": P.ds, "n": P.ns}``), and the result
    has one axis per name plus a last axis over the records of each cell, in their order
    (the seeds, when the points list them last): shape ``(len(ds), len(ns), seeds)``.

    Raises
    ------
    KeyError
        If a record lacks ``key`` or a parameter of ``axes``.
    ValueError
        If ``axes`` is empty, an axis repeats a value (``{"n": [10, 10]}``: one cell would be
        read twice), a cell has no record, or the cells have different numbers of records (a
        grid that is not rectangular: read it cell by cell instead).
    """
    names = list(axes)
    if not names:
        raise ValueError("axes is empty: name at least one parameter, e.g. {'n': P.ns}.")
    for name, values in axes.items():
        seen = []
        for v in values:
            if v in seen:
                raise ValueError(
                    f"axis {name!r} repeats the value {v!r} ({list(values)}): each value of an "
                    "axis names one cell; pass each once."
                )
            seen.append(v)
    cells: dict[tuple, list] = {cell: [] for cell in itertools.product(*axes.values())}
    for r in records:
        cell = tuple(r[a] for a in names)
        if cell in cells:
            cells[cell].append(r[key])
    counts = {cell: len(v) for cell, v in cells.items()}
    empty = [cell for cell, c in counts.items() if c == 0]
    if empty:
        raise ValueError(f"no record at {dict(zip(names, empty[0]))} ({len(empty)} cells empty).")
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"the grid is not rectangular: {min(counts.values())} to {max(counts.values())} "
            f"records per cell of {names}; read it cell by cell."
        )
    shape = tuple(len(v) for v in axes.values())
    return np.array(list(cells.values()), dtype=float).reshape(*shape, -1)


def grid_frame(records: Sequence[Mapping]):
    """The records as a ``pandas.DataFrame``, one row per point, one column per field;
    a nested dict of settings (a point's ``search``) becomes columns ``search.starts``,
    ``search.steps``, … (``pandas.json_normalize``, one level). An empty grid is a
    ValueError (there is nothing to read)."""
    import pandas as pd

    if len(records) == 0:
        raise ValueError("records is empty: run the grid first (wsutils.run.sweep.run_grid).")
    return pd.json_normalize(list(records), max_level=1)
