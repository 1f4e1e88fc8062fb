"""Generalization with one changed word (chapter ``generalization``; the setting of
Bombari & Mondelli 2024, their eqs. 16 and 24, and of the authors' script ``gen.py``).

A linear read-out ``f(X; θ) = ⟨φ(X), θ⟩`` is trained on ``N`` texts by min-norm interpolation,
``θ₀ = Φ⁺Y`` (:prf:ref:`def-flip-problem`); a new text ``(X, y)`` is then learnt by
**fine-tuning** or **re-training** (eq. :eq:`eq-fine-tune`, :eq:`eq-retrain`), and
:func:`search_flip` looks for one word change ``‖Δ‖ ≤ √d`` that makes the trained model say
``−y`` (the output loss, eq. :eq:`eq-output-loss`, or a feature-alignment surrogate,
eq. :eq:`eq-align-loss`).

All linear algebra goes through the ``N × N`` Gram matrix ``K = ΦΦᵀ`` (a Cholesky solve),
never through a ``p × p`` matrix: ``θ₀ = Φᵀ K⁻¹ Y`` and ``Pφ = φ − Φᵀ K⁻¹ Φ φ``. At
``n = 120, d = 768`` the dense projector ``I − Φ⁺Φ`` would be ``92,160²`` (~68 GB).

Random features at ``k = D`` (``V`` is ``30,720²`` at ``n = 40, d = 768``, 7.5 GB in float64)
are computed by :func:`rf_preactivations` one block of rows of ``V`` at a time, each block
drawn from its own seed (so any block can be regenerated), and only the column block ``V_i``
that multiplies the perturbed word is kept: ``V flat(X_i(Δ)) = V flat(X) + V_i Δ`` is exact,
so the search never needs the rest of ``V`` again.

Two searches for the changed word: ours (:func:`search_flip`: several starts, normalised steps,
best iterate) and the authors' (:func:`authors_search`, as ``gen.py`` runs it: one start at
``x₁``, plain gradient steps with their learning rates and step counts, last iterate);
:func:`flip_runs` runs either on the same instances (``search="ours"`` or ``"authors"``).
Two synthetic data sets: :func:`planted_data` (rows rescaled to norm ``√d``, as every other
chapter) and :func:`authors_data` (``gen.py``'s: rows not rescaled, the new text built on the
planted direction ``w_⋆``).
"""

from __future__ import annotations

from typing import Sequence

from ..checks import check_int
from ..estimators.rf import rf_block_seed
from ..maps import Normalisation

__all__ = [
    "LOSSES",
    "MAPS",
    "TRAININGS",
    "SEARCHES",
    "DATA",
    "FlipResult",
    "gram_cholesky",
    "min_norm_interpolator",
    "project_out",
    "fine_tune",
    "retrain",
    "planted_data",
    "authors_data",
    "rf_block_seed",
    "rf_blocks",
    "sample_V_blocked",
    "rf_preactivations",
    "attention_features",
    "flip_grid",
    "flip_table",
    "FlipModel",
    "rf_flip_model",
    "attention_flip_model",
    "flip_target",
    "search_flip",
    "search_flips",
    "authors_search",
    "authors_searches",
    "authors_lr_steps",
    "flip_runs",
    "flip_point",
    "GENERAL",
    "flip_normalisation",
]

LOSSES = ("output", "align_ft", "align_rt")
TRAININGS = ("fine_tune", "retrain")
MAPS = ("rf", "raf", "relu")
SEARCHES = ("ours", "authors")
DATA = ("planted", "authors")

#: The map name of the general attention map :func:`wsutils.maps.attention` in this module
#: (chapter *normalisation*): ``map="attention"`` with ``normalisation=...`` (a name of
#: :data:`wsutils.maps.NORMALISATIONS`, a dict of :class:`wsutils.maps.Normalisation`'s fields, or
#: a :class:`~wsutils.maps.Normalisation`). It is not in ``MAPS``, the paper's three maps:
#: ``map="attention"`` with ``"softmax"`` (``β = 1``) gives the records of ``map="raf"`` and
#: with ``"relu"`` those of ``map="relu"``, to the last bit.
GENERAL = "attention"


def flip_normalisation(map: str, normalisation=None) -> Normalisation | None:
    """Check ``map`` (one of ``MAPS`` or :data:`GENERAL`) and its ``normalisation``: a
    :class:`~wsutils.maps.Normalisation` for ``map="attention"`` (from a name, a dict of its
    fields such as ``{"name": "scalable", "s": 2.0}``, or a Normalisation), ``None`` for the
    paper's maps, which take none."""
    if map == GENERAL:
        if normalisation is None:
            raise ValueError(
                "map='attention' needs normalisation=..., e.g. 'sparsemax' or "
                "{'name': 'scalable', 's': 1.0} (see wsutils.maps.Normalisation)."
            )
        if isinstance(normalisation, Normalisation):
            return normalisation
        if isinstance(normalisation, str):
            return Normalisation(normalisation)
        if isinstance(normalisation, dict):
            unknown = sorted(set(normalisation) - {"name", "beta", "s", "alpha", "bias"})
            if unknown or "name" not in normalisation:
                raise ValueError(
                    "a normalisation dict needs 'name' and may have 'beta', 's', "
                    f"'alpha', 'bias'; got keys {sorted(normalisation)}."
                )
            return Normalisation(**normalisation)
        raise TypeError(
            "normalisation must be a name, a dict of Normalisation fields or a "
            f"Normalisation, got {type(normalisation).__name__}."
        )
    if map not in MAPS:
        raise ValueError(f"map must be one of {MAPS} or {GENERAL!r}, got {map!r}.")
    if normalisation is not None:
        raise ValueError(
            f"normalisation applies only to map={GENERAL!r}; map={map!r} has its "
            "own (raf: softmax, relu: rownorm of ReLU). Leave it unset."
        )
    return None


def check_Ns(Ns: Sequence[int]) -> list[int]:
    """The list of training-set sizes ``N`` as Python ints (at least one, each ``≥ 1``); an
    empty list is a ValueError that says so (not a bare ``max()`` error)."""
    if isinstance(Ns, (str, bytes)) or not hasattr(Ns, "__iter__"):
        raise TypeError(f"Ns must be a list of training-set sizes N, e.g. [50, 100], got {Ns!r}.")
    Ns = [check_int("every N in Ns", N, minimum=1) for N in Ns]
    if not Ns:
        raise ValueError("Ns is empty: pass at least one training-set size N, e.g. Ns=[50, 100].")
    return Ns


# The code lives in private modules by concern; every public name is re-exported here, so
# ``wsutils.generalization.X`` is the one address of each (the API page documents it here).
from ._features import (  # noqa: E402
    attention_features,
    authors_data,
    planted_data,
    rf_blocks,
    rf_preactivations,
    sample_V_blocked,
)
from ._flip import flip_grid, flip_point, flip_runs, flip_table  # noqa: E402
from ._linalg import fine_tune, gram_cholesky, min_norm_interpolator, project_out, retrain  # noqa: E402
from ._search import (  # noqa: E402
    FlipModel,
    FlipResult,
    attention_flip_model,
    authors_lr_steps,
    authors_search,
    authors_searches,
    flip_target,
    rf_flip_model,
    search_flip,
    search_flips,
)
