"""The names the generalization modules share: the losses, trainings, maps, methods and data
sets they accept, and the two checks of a grid point's arguments (re-exported by
:mod:`wsutils.generalization`)."""

from __future__ import annotations

from typing import Sequence

from ..checks import check_int
from ..maps import LABELS, Normalisation

LOSSES = ("output", "align_ft", "align_rt")
TRAININGS = ("fine_tune", "retrain")
MAPS = tuple(LABELS)  # the paper's three maps: "rf", "raf", "relu"
METHODS = ("ours", "authors")
DATA = ("planted", "independent", "authors")

#: The map name of the general attention map :func:`wsutils.maps.attention` in this module
#: (chapter *normalisation*): ``map="attention"`` with ``normalisation=...`` (a name of
#: :data:`wsutils.maps.NORMALISATIONS`, a dict of :class:`wsutils.maps.Normalisation`'s fields, or
#: a :class:`~wsutils.maps.Normalisation`). It is not in ``MAPS``, the paper's three maps:
#: ``map="attention"`` with ``"softmax"`` (``β = 1``) gives the records of ``map="raf"`` and
#: with ``"relu"`` those of ``map="relu"``, to the last bit.
GENERAL = "attention"


def flip_normalisation(map: str, normalisation=None) -> Normalisation | None:
    """Check ``map`` (one of ``MAPS`` or ``GENERAL``) and its ``normalisation``: a
    :class:`~wsutils.maps.Normalisation` for ``map="attention"`` (from a name, a dict of its
    fields such as ``{"name": "scalable", "s": 2.0}``, or a Normalisation), ``None`` for the
    paper's maps, which take none."""
    if map == GENERAL:
        if normalisation is None:
            raise ValueError(
                "map='attention' needs normalisation=..., e.g. 'sparsemax' or "
                "{'name': 'scalable', 's': 1.0} (see wsutils.maps.Normalisation)."
            )
        return Normalisation.parse(normalisation)
    if map not in MAPS:
        raise ValueError(f"map must be one of {MAPS} or {GENERAL!r}, got {map!r}.")
    if normalisation is not None:
        raise ValueError(
            f"normalisation applies only to map={GENERAL!r}; map={map!r} has its "
            "own (raf: softmax, relu: rownorm of ReLU). Leave it unset."
        )
    return None


def map_normalisation(map: str, normalisation=None) -> Normalisation | None:
    """The one parse of a flip point's map: :func:`flip_normalisation`'s checks, and the
    :class:`~wsutils.maps.Normalisation` of every attention map (``"raf"``: softmax,
    ``"relu"``: rownorm of ReLU, ``"attention"``: the one given); ``None`` for ``"rf"``."""
    norm = flip_normalisation(map, normalisation)
    return norm if norm is not None or map == "rf" else Normalisation.parse(map)


def check_Ns(Ns: Sequence[int]) -> list[int]:
    """The list of training-set sizes ``N`` as Python ints (at least one, each ``≥ 1``); an
    empty list is a ValueError that says so (not a bare ``max()`` error)."""
    if isinstance(Ns, (str, bytes)) or not hasattr(Ns, "__iter__"):
        raise TypeError(f"Ns must be a list of training-set sizes N, e.g. [50, 100], got {Ns!r}.")
    Ns = [check_int("every N in Ns", N, minimum=1) for N in Ns]
    if not Ns:
        raise ValueError("Ns is empty: pass at least one training-set size N, e.g. Ns=[50, 100].")
    return Ns
