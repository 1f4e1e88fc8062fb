"""How a word-sensitivity search runs: one frozen, checked settings object.

Every estimator that maximises a relative change by projected ascent
(:func:`wsutils.sensitivity.word_sensitivity`, the fast attention estimator
:func:`wsutils.estimators.attention.attention_word_sensitivity`, the trained heads and the
own-norm search of :mod:`wsutils.trained`) takes a :class:`Search`, or its fields as keywords
(``steps=50`` is ``search=Search(steps=50)``), read once by :meth:`Search.parse`. The search
only *proposes* a ``Δ``: every value an estimator reports is recomputed in float64 at that
``Δ`` whatever ``Search.dtype`` is (:func:`wsutils.sensitivity.certify`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from .checks import check_int, check_seed

__all__ = ["Search", "check_lr", "precision"]

#: The precisions a search can run in, by name.
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def check_lr(lr) -> float:
    """The step size of a search: a finite positive real number."""
    if isinstance(lr, (bool, np.bool_)) or not isinstance(lr, numbers.Real):
        raise TypeError(f"lr must be a real number, got {type(lr).__name__} {lr!r}.")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite positive number, got lr={lr}.")
    return float(lr)


def precision(dtype, name: str = "dtype") -> str | None:
    """``dtype`` as the name of a precision of ``PRECISIONS`` (``"float32"``, ``"float64"``;
    from the name or the torch dtype), or ``None`` (the text's own search dtype,
    :func:`wsutils.sensitivity.search_dtype`): the one reader of a search's precision.
    ``name`` is the parameter the message names."""
    if dtype is None:
        return None
    for known, t in PRECISIONS.items():
        if dtype is t:
            return known
    if isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in PRECISIONS:
        return dtype.strip().lower().removeprefix("torch.")
    raise ValueError(
        f"{name} must be None (the search data's own precision), torch.float32, "
        f"torch.float64, 'float32' or 'float64', got {dtype!r}."
    )


@dataclass(frozen=True)
class Search:
    """The settings of a projected-ascent search (:func:`wsutils.sensitivity.ascend_rows`).

    ``starts`` random starts per row (``≥ 1``: the first the authors' ``0.1·ξ``, the others
    uniform on the sphere ``‖Δ‖ = √d``), ``steps`` cosine-decayed steps (``≥ 0``) of size at
    most ``lr·√d`` (``lr`` finite, positive), the ``seed`` of the starts (in ``[0, 2**63)``),
    the ``dtype`` the search runs in (``None``: the text's own search dtype; ``"float32"`` or
    ``"float64"``, or the torch dtype, stored by name), ``max_batch_elements`` (the largest
    ``starts × n × d`` batch one step forms, ``≥ 1``) and ``progress`` (a bar over the chunks
    of rows). Checked when made, so an estimator that takes one checks nothing again.
    """

    starts: int = 8
    steps: int = 200
    lr: float = 0.5
    seed: int = 0
    dtype: str | None = None
    max_batch_elements: int = 2**23
    progress: bool = False

    def __post_init__(self):
        checked = {
            "starts": check_int("starts", self.starts, minimum=1),
            "steps": check_int("steps", self.steps, minimum=0),
            "lr": check_lr(self.lr),
            "seed": check_seed(self.seed),
            "dtype": precision(self.dtype),
            "max_batch_elements": check_int(
                "max_batch_elements", self.max_batch_elements, minimum=1
            ),
            "progress": bool(self.progress),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def parse(cls, search: Search | dict | None = None, /, **fields) -> Search:
        """The one way in: a :class:`Search` from ``search`` (a Search, a dict of its fields,
        or ``None`` for the defaults) with ``fields`` (keywords of the same names) replacing
        its own. An unknown name is a TypeError that lists the fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = dict(search) if isinstance(search, dict) else {}
        unknown = sorted((set(given) | set(fields)) - names)
        if unknown:
            raise TypeError(
                f"unknown search setting(s) {unknown}; a Search has {sorted(names)} "
                "(wsutils.search.Search)."
            )
        if search is None or isinstance(search, dict):
            return cls(**{**given, **fields})
        if not isinstance(search, cls):
            raise TypeError(
                f"search must be a wsutils.search.Search, a dict of its fields or None, got "
                f"{type(search).__name__}."
            )
        return dataclasses.replace(search, **fields) if fields else search

    def work_dtype(self, default: torch.dtype) -> torch.dtype:
        """The torch dtype the search runs in: ``dtype``, or ``default`` (the text's
        own search dtype) when it is ``None``."""
        return default if self.dtype is None else PRECISIONS[self.dtype]
