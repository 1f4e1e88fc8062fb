"""Successive halving of a word-sensitivity search: every (row, start) search takes its first
steps, then only the best go on.

A search of ``S_φ(X)`` (:prf:ref:`def-word-sensitivity`) runs ``starts`` projected ascents on
each of the ``n`` words, ``n·starts`` searches of ``steps`` steps, and keeps the best value any
of them finds. For a map of one's own every step is a forward and a backward pass of the whole
map, so that search costs ``n·starts·steps`` passes. Most of those searches end at a local
maximum below the best one, and a search's best value after ten or so steps ranks it among
the others well enough to stop the hopeless ones early (measured in ``benchmarks/
bench_generic.py``; nothing here proves it).

:func:`halving_ascent` is that pruning, the rule of successive halving (Jamieson and Talwalkar,
*Non-stochastic best arm identification and hyperparameter optimization*, AISTATS 2016): with
``halving = (t0, keep)``, once ``t0`` steps are taken only the best fraction ``keep`` of the
searches still running (ranked by the best value each has seen, over its iterates ``0, …,
t0 − 1``) go on, and again after ``2·t0``, ``4·t0``, … steps. A search that goes on takes
exactly the steps it would take without the cuts (the same step function of the same iterate
and step number), so the result is the full search's whenever the full search's best (row,
start) survives every cut; a search that is cut keeps the best iterate it had found, so every
row still gets a value.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["EVAL_ELEMENTS", "SCHEDULE", "cut", "halving_ascent", "passes"]

#: A schedule for softmax attention at the default search of 8 starts and 200 steps, which
#: cuts to a third after 10, 20, 40, … steps, about 9 % of the full search's passes. On the
#: recorded searches of 20 random texts at ``(n, d) = (100, 256)`` and 20 at ``(128, 768)``
#: (``python -m benchmarks.bench_generic --schedules``) the full search's best (row, start)
#: survived every cut on 39 of the 40 (all 20 and 19 of 20); ``(12, 1/3)`` kept it on all 40
#: at 11 % of the passes. A measurement on those texts, not a guarantee for a map of one's
#: own: compare with a full search on one text first.
SCHEDULE = (10, 1 / 3)

#: The entries of the perturbed texts one evaluation of a map of one's own holds (a chunk of
#: the searches still running): ``2**19`` (4 MB in float64) keeps a forward and backward pass
#: of softmax attention in cache. At ``(n, d) = (128, 768)`` a pass took 5.8–6.0 ms a text
#: in chunks of 4 to 16 texts against 7.3 ms in chunks of 85 (``2**23`` entries), on this
#: book's 2-core machine.
EVAL_ELEMENTS = 2**19


def cut(best_val: torch.Tensor, alive: torch.Tensor, keep: float, floor: int) -> torch.Tensor:
    """The searches of ``alive`` (indices into ``best_val``) that go on after a cut: the
    ``max(floor, ⌈keep·len(alive)⌉)`` with the largest best values (NaN ranks last), ties to
    the lower index, returned in increasing order."""
    k = min(len(alive), max(floor, math.ceil(keep * len(alive))))
    vals = torch.nan_to_num(best_val[alive].to(torch.float64), nan=-math.inf)
    order = torch.sort(-vals, stable=True).indices  # best first; equal values by index
    return torch.sort(alive[order[:k]]).values


def passes(searches: int, steps: int, halving: tuple[int, float] | None, floor: int) -> int:
    """The evaluations (one search at one iterate: a forward pass, and a backward pass but at
    the last iterate) that :func:`halving_ascent` makes for ``searches`` searches of ``steps``
    steps with ``halving`` and ``floor`` and no stopping rule; ``halving=None``: every search
    at every iterate, ``searches·(steps + 1)``."""
    if halving is None:
        return searches * (steps + 1)
    t0, keep = halving
    alive, total, next_cut = searches, 0, t0
    for t in range(steps + 1):
        total += alive
        if t < steps and t + 1 == next_cut:
            alive = min(alive, max(floor, math.ceil(keep * alive)))
            next_cut *= 2
    return total


def halving_ascent(
    evaluate: Callable[[torch.Tensor, torch.Tensor], tuple],
    Delta: torch.Tensor,
    *,
    steps: int,
    step: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    halving: tuple[int, float],
    floor: int,
    chunk: int,
    stalled: Callable[[torch.Tensor], bool] | None = None,
    tick: Callable[[int], object] | None = None,
):
    """Projected ascent from each row of ``Delta`` (``B × d``, starts in the ball) with
    successive halving (module docstring).

    ``evaluate(idx, D)`` returns, for the searches ``idx`` (indices into ``Delta``) at their
    iterates ``D``, the values ``(len(idx),)`` and a function that returns their gradient (as
    :func:`wsutils.sensitivity.ascend`'s ``evaluate``, with the searches named); it is called
    on at most ``chunk`` searches at a time. ``step(D, grad, t)`` is the step of
    :func:`wsutils.sensitivity.ascend` (:func:`wsutils.sensitivity.cosine_step`), applied to
    the searches still running with the same ``t`` as without cuts. ``halving = (t0, keep)``
    (:func:`wsutils.search.check_halving`): after ``t0``, ``2·t0``, … steps keep
    :func:`cut`'s best ``keep`` of the running searches, never fewer than ``floor`` (one row's
    starts). ``stalled(best_val)``: the search's stopping rule, asked once a step (``None``:
    every step is taken). ``tick(m)`` is called at every iterate with ``m`` the searches
    evaluated at it, so that the counts add up to :func:`passes` when no stopping rule fires.

    Returns
    -------
    tuple of torch.Tensor
        Each search's best value (``-inf`` where every value was NaN) and the iterate attaining
        it, not projected onto the exact ball; a search that was cut keeps what it had found.
    """
    t0, keep = halving
    B = Delta.shape[0]
    best_val = torch.full((B,), -math.inf, dtype=Delta.dtype, device=Delta.device)
    best = Delta.detach().clone()
    Delta = Delta.detach().clone()
    alive = torch.arange(B, device=Delta.device)
    next_cut = t0
    for t in range(steps + 1):
        last = t == steps
        evaluated = len(alive)
        grads = []
        for j in range(0, len(alive), chunk):
            idx = alive[j : j + chunk]
            vals, gradient = evaluate(idx, Delta[idx])
            with torch.no_grad():
                better = vals > best_val[idx]
                best_val[idx] = torch.where(better, vals, best_val[idx])
                best[idx[better]] = Delta[idx[better]]
            if not last:
                grads.append(gradient())
            gradient = None  # the chunk's work arrays go before the next chunk's
        if tick is not None:
            tick(evaluated)
        if last or (stalled is not None and stalled(best_val)):
            break
        with torch.no_grad():
            Delta[alive] = step(Delta[alive], torch.cat(grads), t)
        grads = []
        if t + 1 == next_cut:
            alive = cut(best_val, alive, keep, floor)
            next_cut *= 2
    return best_val, best
