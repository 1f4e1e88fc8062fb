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

Random features at ``k = D`` (``V`` is ``30,720²`` at ``n = 40, d = 768``, 7.5 GB in float64):
``V flat(X_i(Δ)) = V flat(X) + V_i Δ`` is exact, so the experiment reads ``V`` only through
the pre-activations ``H`` of the texts and the column block ``V_i`` of the perturbed word.
:func:`flip_runs` draws that pair from its joint law (:func:`rf_texts_law`,
:prf:ref:`prop-rf-texts-law`: ``B·(B + d)·k`` products instead of ``B·D·k``);
:func:`rf_preactivations` computes ``H`` from the whole ``V``, one block of rows at a time,
each block drawn from its own seed (so any block can be regenerated), for the experiments
that change every word.

Two searches for the changed word: ours (:func:`search_flip`: several starts, normalised steps,
best iterate) and the authors' (:func:`authors_search`, as ``gen.py`` runs it: one start at
``x₁``, plain gradient steps with their learning rates and step counts, last iterate);
:func:`flip_runs` runs either on the same instances (``method="ours"`` or ``"authors"``).
Three synthetic data sets: :func:`planted_data` (rows rescaled to norm ``√d``, as every other
chapter), :func:`independent_data` (the same texts, labels independent of them) and
:func:`authors_data` (``gen.py``'s: rows not rescaled, the new text built on the planted
direction ``w_⋆``).

:func:`word_scores` reads the trained models on every one-word substitution of a text (real
tokens, not a search in the ball).
"""

from __future__ import annotations

from ..estimators.rf import rf_block_seed
from ._common import DATA, GENERAL, LOSSES, MAPS, METHODS, TRAININGS, check_Ns, flip_normalisation

__all__ = [
    "LOSSES",
    "MAPS",
    "TRAININGS",
    "METHODS",
    "DATA",
    "FlipResult",
    "FLIP_SEARCH",
    "gram_cholesky",
    "min_norm_interpolator",
    "project_out",
    "fine_tune",
    "retrain",
    "planted_data",
    "independent_data",
    "authors_data",
    "rf_block_seed",
    "rf_blocks",
    "sample_V_blocked",
    "rf_preactivations",
    "rf_texts_law",
    "rf_texts_noise_seed",
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
    "check_Ns",
    "trained_readouts",
    "word_scores",
    "rf_word_bounds",
    "row_column_readouts",
]

# The code lives in private modules by concern (the shared names in ``_common``); every
# public name is re-exported here, so ``wsutils.generalization.X`` is the one address of each
# (the API page documents it here).
from ._features import (  # noqa: E402
    attention_features,
    authors_data,
    independent_data,
    planted_data,
    rf_blocks,
    rf_preactivations,
    rf_texts_law,
    rf_texts_noise_seed,
    sample_V_blocked,
)
from ._flip import flip_grid, flip_point, flip_runs, flip_table, trained_readouts  # noqa: E402
from ._linalg import fine_tune, gram_cholesky, min_norm_interpolator, project_out, retrain  # noqa: E402
from ._readouts import row_column_readouts  # noqa: E402
from ._search import (  # noqa: E402
    FLIP_SEARCH,
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
from ._word_bounds import rf_word_bounds  # noqa: E402
from ._words import word_scores  # noqa: E402
