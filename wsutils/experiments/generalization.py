"""The sizes of the generalization chapters at each scale (``book/generalization.md``, the
flip grid, and ``book/generalization-n.md``, the sweep in ``N`` and the authors' last
iterate).

- :class:`Scale` holds the flip grid (at the paper scale the grid of the authors' ``gen.py``:
  ``d = 768``, ``N ∈ {1100, 1200, 1300}``), its search's starts and steps, and the sweep of
  ``y·t_1^Δ`` against ``N`` on ``gen.py``'s data; ``SCALES`` gives one per scale and
  :func:`scale` picks the current one.
- :data:`SEED` is the first seed of the chapters' draws.
- :data:`FLIP_STOP` is the stopping rule of our search in every flip experiment of the
  chapters (and of ``book/imdb-generalization.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run import config

__all__ = [
    "Scale",
    "SCALES",
    "scale",
    "SEED",
    "FLIP_STOP",
    "COLLAPSE_D",
    "COLLAPSE_NS",
    "COLLAPSE_DRAWS",
]

#: The first seed of the chapters' draws.
SEED = 0

#: The stopping rule (:class:`wsutils.search.Search`'s ``stop``) of our flip search
#: (:func:`wsutils.generalization.search_flips`) in the chapters: a batch of searches ends
#: once every search's best loss has gained at most ``1e-4``, relative, over the last 10
#: steps (at most ``steps`` steps either way). ``python -m benchmarks.bench_flip_stop`` on
#: the first draw of the paper's flip grid (``d = 768``, ``N`` 1100-1300; 72 runs): random
#: features 36.7 s against 22.0 s, attention 38.5 s against 33.5 s, every run flipped or not
#: as with every step, ``y·t₁^Δ`` at most 0.033 apart (``benchmarks/README.md``).
FLIP_STOP = (10, 1e-4)


@dataclass(frozen=True)
class Scale:
    """The generalization chapters' sizes at one scale.

    Attributes
    ----------
    d, Ns, seeds
        Word width, numbers of training texts (nested) and seeds of the flip grid.
    starts, steps
        Starts and steps of our search (:func:`wsutils.generalization.search_flip`), in the
        flip grid and the sweep.
    sweep_d, sweep_n, sweep_Ns, sweep_seeds
        Word width, words, numbers of training texts and seeds of the sweep in ``N``.
    regime_Ns, regime_seeds
        Numbers of training texts (nested) and seeds of the protection study (chapter
        ``generalization-n``): random features and softmax attention at ``n = 40`` and the
        flip grid's ``d``, on planted data, output loss, both trainings.
    """

    d: int
    Ns: tuple[int, ...]
    seeds: tuple[int, ...]
    starts: int
    steps: int
    sweep_d: int
    sweep_n: int
    sweep_Ns: tuple[int, ...]
    sweep_seeds: tuple[int, ...]
    regime_Ns: tuple[int, ...]
    regime_seeds: tuple[int, ...]


#: The protection study's collapse check (random features at ``d = COLLAPSE_D``): the ``N``
#: values per ``n``, with ``N/n²`` the same across ``n`` (so ``√N/n`` is too). The same at
#: both scales: it is cheap.
COLLAPSE_D = 32
COLLAPSE_NS = {40: (10, 40, 160), 160: (160, 640, 2560)}
#: The collapse check's number of draws, enough that the ratio of two settings' mean base
#: terms has a standard error well under the check's factor (one draw's base term is spread
#: by about a third of its mean).
COLLAPSE_DRAWS = 8


SCALES = {
    "quick": Scale(
        d=128,
        Ns=(250, 300),
        seeds=(SEED,),
        starts=3,
        steps=120,
        sweep_d=32,
        sweep_n=40,
        sweep_Ns=(25, 100, 400),
        sweep_seeds=(SEED,),
        regime_Ns=(10, 40, 160, 640),
        regime_seeds=(SEED, SEED + 1),
    ),
    "paper": Scale(  # the grid of the authors' gen.py
        d=768,
        Ns=(1100, 1200, 1300),
        seeds=(SEED, SEED + 1),
        starts=4,
        steps=300,
        sweep_d=768,
        sweep_n=40,
        sweep_Ns=(25, 100, 400, 1300),
        sweep_seeds=(SEED,),
        regime_Ns=(10, 40, 160, 640, 1300),
        regime_seeds=(SEED, SEED + 1, SEED + 2),
    ),
}


def scale(name: str | None = None) -> Scale:
    """The chapters' sizes at scale ``name`` (``None``: the current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)
