"""How a word-sensitivity search runs: one frozen, checked settings object.

Every estimator that maximises a relative change by projected ascent
(:func:`wsutils.sensitivity.word_sensitivity`, the fast attention estimator
:func:`wsutils.estimators.self_attention.attention_word_sensitivity`, the trained heads and the
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

__all__ = [
    "Search",
    "check_halving",
    "check_unhalved",
    "check_lr",
    "check_progress",
    "check_stop",
    "parse_fixed",
    "point_search",
    "precision",
]

#: The precisions a search can run in, by name.
PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def check_lr(lr) -> float:
    """The step size of a search: a finite positive real number."""
    if isinstance(lr, (bool, np.bool_)) or not isinstance(lr, numbers.Real):
        raise TypeError(f"lr must be a real number, got {type(lr).__name__} {lr!r}.")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite positive number, got lr={lr}.")
    return float(lr)


def precision(dtype) -> str | None:
    """``dtype`` as the name of a precision of ``PRECISIONS`` (``"float32"``, ``"float64"``;
    from the name or the torch dtype), or ``None`` (the text's own search dtype,
    :func:`wsutils.sensitivity.search_dtype`): the one reader of a search's precision."""
    if dtype is None:
        return None
    for known, t in PRECISIONS.items():
        if dtype is t:
            return known
    if isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in PRECISIONS:
        return dtype.strip().lower().removeprefix("torch.")
    raise ValueError(
        "dtype must be None (the search data's own precision), torch.float32, "
        f"torch.float64, 'float32' or 'float64', got {dtype!r}."
    )


def check_progress(progress) -> bool | float:
    """A search's progress bar: ``True`` (shown from the start), ``False`` (never) or a number
    of seconds ``s ≥ 0`` as a float (shown once the search has run ``s`` seconds, so a short
    search prints nothing). A string such as ``"false"``, which ``bool`` would read as true,
    and an integer (``1``: a switch or seconds?) are TypeErrors; a negative or non-finite
    number a ValueError."""
    if isinstance(progress, (bool, np.bool_)):
        return bool(progress)
    if not isinstance(progress, (float, np.floating)):
        raise TypeError(
            f"progress must be True or False, or a float number of seconds (3.0), got "
            f"{type(progress).__name__} {progress!r}."
        )
    if not (math.isfinite(progress) and progress >= 0):
        raise ValueError(f"progress must be a finite number of seconds ≥ 0, got {progress!r}.")
    return float(progress)


def _pair(value, name: str, form: str, first: str, second: str, ok) -> tuple[int, float]:
    """``value`` read as ``form``, a pair (a list, as JSON gives it, too): an integer
    ``first ≥ 1`` and a real number ``second`` for which ``ok(second)`` holds; anything else is
    a ValueError naming ``name``."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"{name} must be None or {form}, got {value!r}.")
    a, b = check_int(first, value[0], minimum=1), value[1]
    if isinstance(b, (bool, np.bool_)) or not isinstance(b, numbers.Real) or not ok(b):
        raise ValueError(f"{second}, got {b!r}.")
    return a, float(b)


def check_stop(stop) -> tuple[int, float] | None:
    """A search's stopping rule: ``None`` (take every step) or ``(m, rtol)``, an integer
    ``m ≥ 1`` and a finite ``rtol ≥ 0`` (a list ``[m, rtol]``, as JSON gives it, is read as the
    pair): stop once the best value has gained at most ``rtol``, relative, over the last ``m``
    steps."""
    if stop is None:
        return None
    return _pair(
        stop,
        "stop",
        "(m, rtol)",
        "stop window m",
        "stop tolerance rtol must be a finite number ≥ 0",
        lambda rtol: math.isfinite(rtol) and rtol >= 0,
    )


def check_halving(halving) -> tuple[int, float] | None:
    """A search's successive halving (:func:`wsutils.halving.halving_ascent`): ``None`` (every
    search runs every step) or ``(t0, keep)``, an integer ``t0 ≥ 1`` and a fraction
    ``0 < keep < 1`` (a list, as JSON gives it, is read as the pair): at steps ``t0, 2·t0,
    4·t0, …`` only the best ``keep`` of the (row, start) searches still running go on."""
    if halving is None:
        return None
    return _pair(
        halving,
        "halving",
        "(t0, keep)",
        "halving's first cut t0",
        "halving's kept fraction must be a number in (0, 1)",
        lambda keep: 0 < keep < 1,
    )


def check_unhalved(search: "Search", who: str) -> "Search":
    """``search`` for a search of a single target, which has no (row, start) searches to
    rank and so no successive halving: a ``halving`` other than ``None`` is a ValueError
    naming ``who`` (never silently ignored)."""
    if search.halving is not None:
        raise ValueError(
            f"{who} takes no halving (it has no searches of several words to rank); leave it "
            "unset."
        )
    return search


@dataclass(frozen=True)
class Search:
    """The settings of a projected-ascent search (:func:`wsutils.sensitivity.ascend_rows`).

    ``starts`` random starts per row (``≥ 1``: the first the authors' ``0.1·ξ``, the others
    uniform on the sphere ``‖Δ‖ = √d``), ``steps`` cosine-decayed steps (``≥ 0``) of size at
    most ``lr·√d`` (``lr`` finite, positive), the ``seed`` of the starts (in ``[0, 2**63)``;
    ``None``: the estimator's own rule, :meth:`start_seed`), the ``dtype`` the search runs in
    (``None``: the text's own search dtype; ``"float32"`` or ``"float64"``, or the torch
    dtype, stored by name), ``max_batch_elements`` (the largest ``starts × n × d`` batch one
    step forms, ``≥ 1``), ``progress`` (a bar over the steps: :func:`check_progress`) and the
    stopping rule ``stop`` (:func:`check_stop`: ``None`` takes every step; ``(m, rtol)`` ends
    a row's search once the best value over its starts has gained at most ``rtol``, relative,
    over the last ``m`` steps) and ``halving`` (:func:`check_halving`: ``None`` runs every
    (row, start) search to the end; ``(t0, keep)`` keeps, after ``t0, 2·t0, 4·t0, …`` steps,
    only the best fraction ``keep`` of the searches still running,
    :func:`wsutils.halving.halving_ascent`). Checked when made, so an estimator that takes
    one checks nothing again.
    """

    starts: int = 8
    steps: int = 200
    lr: float = 0.5
    seed: int | None = None
    dtype: str | None = None
    max_batch_elements: int = 2**23
    progress: bool | float = False
    stop: tuple[int, float] | None = None
    halving: tuple[int, float] | None = None

    def __post_init__(self):
        checked = {
            "starts": check_int("starts", self.starts, minimum=1),
            "steps": check_int("steps", self.steps, minimum=0),
            "lr": check_lr(self.lr),
            "seed": None if self.seed is None else check_seed(self.seed),
            "dtype": precision(self.dtype),
            "max_batch_elements": check_int(
                "max_batch_elements", self.max_batch_elements, minimum=1
            ),
            "progress": check_progress(self.progress),
            "stop": check_stop(self.stop),
            "halving": check_halving(self.halving),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def parse(
        cls, search: Search | dict | None = None, /, *, default: Search | None = None, **fields
    ) -> Search:
        """The one way in: a :class:`Search` from ``search`` (a Search; a dict of some of its
        fields, the others ``default``'s; ``None``: ``default`` itself) with ``fields``
        (keywords of the same names) replacing its own. ``default`` is the estimator's own
        search (``None``: ``Search()``). An unknown name is a TypeError that lists the
        fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = dict(search) if isinstance(search, dict) else {}
        unknown = sorted((set(given) | set(fields)) - names)
        if unknown:
            raise TypeError(
                f"unknown search setting(s) {unknown}; a Search has {sorted(names)} "
                "(wsutils.search.Search)."
            )
        if search is None or isinstance(search, dict):
            base = cls() if default is None else default
            given.update(fields)  # the keywords replace the dict's own fields
            return dataclasses.replace(base, **given) if given else base
        if not isinstance(search, cls):
            raise TypeError(
                f"search must be a wsutils.search.Search, a dict of its fields or None, got "
                f"{type(search).__name__}."
            )
        return dataclasses.replace(search, **fields) if fields else search

    def start_seed(self, default: int) -> int:
        """The seed of the starts: ``seed``, or the estimator's own ``default`` when it is
        ``None`` (``0`` for the projected ascent of :mod:`wsutils.sensitivity`, the weights'
        seed ``+ 1`` for the random-feature estimators)."""
        return default if self.seed is None else self.seed

    def bar(self) -> dict:
        """The keywords of the search's ``tqdm`` bar: ``disable`` and ``delay`` from
        ``progress`` (:func:`check_progress`)."""
        if self.progress is False:
            return {"disable": True}
        return {"disable": False, "delay": 0.0 if self.progress is True else self.progress}

    def work_dtype(self, default: torch.dtype) -> torch.dtype:
        """The torch dtype the search runs in: ``dtype``, or ``default`` (the text's
        own search dtype) when it is ``None``."""
        return default if self.dtype is None else PRECISIONS[self.dtype]


def parse_fixed(
    search: Search | dict | None, default: Search, fixed: tuple[str, ...], who: str, /, **settings
) -> Search:
    """The search of an estimator that fixes some of a :class:`Search`'s fields itself (the
    random-feature searches step onto the sphere, so they take no ``lr``): ``search``
    (default ``default``) read by :meth:`Search.parse` with ``settings``; a field of ``fixed``
    set to anything but ``default``'s is a ValueError naming ``who`` (never silently
    ignored)."""
    search = Search.parse(search, default=default, **settings)
    unused = [f for f in fixed if getattr(search, f) != getattr(default, f)]
    if unused:
        raise ValueError(
            f"{who} takes no {' or '.join(unused)} (it sets {', '.join(fixed)} itself); "
            f"leave {'it' if len(unused) == 1 else 'them'} unset."
        )
    return search


def point_search(search: dict | None) -> dict:
    """The search settings of a grid point (:func:`wsutils.run.sweep.run_grid` takes plain
    JSON): a dict of :class:`Search`'s fields, ``{"steps": 50, "dtype": "float32"}``, or
    ``None`` (the point's own defaults), checked here. ``seed`` is not among them: a point
    seeds its search from its own ``seed``, so that one number names the point."""
    if search is None:
        return {}
    if not isinstance(search, dict):
        raise TypeError(
            f"a grid point's search is a dict of wsutils.search.Search's fields, e.g. "
            f"{{'starts': 4, 'steps': 100}}, got {type(search).__name__}."
        )
    if "seed" in search:
        raise ValueError(
            "a grid point seeds its search from its own seed: leave 'seed' out of search."
        )
    Search.parse(search)  # every field checked (an unknown name is a TypeError)
    return dict(search)
