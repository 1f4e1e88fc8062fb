"""wsutils: the mathematics of *Towards Understanding the Word Sensitivity of Attention Layers:
A Study via Random Features* (Bombari & Mondelli, ICML 2024), as used by the wsbook chapters.

Modules: :mod:`wsutils.run.config` (the environment knobs), :mod:`wsutils.maps` (RF, DRF, RAF,
ReLU attention), :mod:`wsutils.weights` (seeded weight samplers), :mod:`wsutils.sensitivity`
(the generic word-sensitivity estimator, with :mod:`wsutils.halving` and
:mod:`wsutils.tokenwise` to make it faster, and :mod:`wsutils.modules` for a torch module),
:mod:`wsutils.estimators.rf` and :mod:`wsutils.estimators.drf` (random features without the
``k×D`` matrix, certified bounds, the wide limit), :mod:`wsutils.estimators.takeover`
(take-over constructions and their certificates), :mod:`wsutils.estimators.self_attention`
(the fast attention estimator),
:mod:`wsutils.generalization`, the real-text modules
:mod:`wsutils.text.data`, :mod:`wsutils.text.embeddings`, :mod:`wsutils.experiments.imdb`,
:mod:`wsutils.text.word_attention`, :mod:`wsutils.text.chat`, and :mod:`wsutils.run.sweep`
(grids on any executor).

The random-features estimator lives in ``wsutils.estimators.rf``, not ``wsutils.rf``: a
submodule named ``rf`` would shadow the map :func:`wsutils.rf` once imported.
"""

from .estimators.rf import rf_word_sensitivity
from .estimators.self_attention import attention_word_sensitivity
from .estimators.takeover import certified_lower_bound
from .maps import drf, flat, normalise_rows, raf, relu_attention, rf
from .modules import module_map
from .run.progress import install as _install_progress
from .sensitivity import SensitivityResult, relative_change, word_sensitivity
from .tokenwise import TokenwiseMap
from .weights import sample_V, sample_Vs, sample_W, sample_X

_install_progress()  # tqdm bars to the book build's terminal, only when WSBOOK_PROGRESS is set

__version__ = "0.1.0"
__all__ = [
    "rf",
    "drf",
    "raf",
    "relu_attention",
    "flat",
    "normalise_rows",
    "sample_V",
    "sample_Vs",
    "sample_W",
    "sample_X",
    "word_sensitivity",
    "TokenwiseMap",
    "module_map",
    "relative_change",
    "SensitivityResult",
    "rf_word_sensitivity",
    "attention_word_sensitivity",
    "certified_lower_bound",
]
