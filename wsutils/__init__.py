"""wsutils: the mathematics of *Towards Understanding the Word Sensitivity of Attention Layers:
A Study via Random Features* (Bombari & Mondelli, ICML 2024), as used by the wsbook chapters.

Modules: :mod:`wsutils.config` (the environment knobs), :mod:`wsutils.maps` (RF, DRF, RAF,
ReLU attention), :mod:`wsutils.weights` (seeded weight samplers), :mod:`wsutils.sensitivity`
(the generic word-sensitivity estimator), :mod:`wsutils.rf_sensitivity` and
:mod:`wsutils.drf_limit` (random features without the ``k×D`` matrix, certified bounds, the
wide limit), :mod:`wsutils.attention` (take-over constructions, the fast attention estimator),
:mod:`wsutils.generalization`, the real-text modules :mod:`wsutils.data`,
:mod:`wsutils.embeddings`, :mod:`wsutils.imdb`, :mod:`wsutils.text_attention`,
:mod:`wsutils.chat`, and :mod:`wsutils.sweep` (grids on any executor).

The random-features estimator lives in ``wsutils.rf_sensitivity``, not ``wsutils.rf``: a
submodule named ``rf`` would shadow the map :func:`wsutils.rf` once imported.
"""

from . import _progress
from .maps import drf, flat, normalize_rows, raf, relu_attention, rf
from .attention import attention_word_sensitivity, certified_lower_bound
from .rf_sensitivity import rf_word_sensitivity
from .sensitivity import SensitivityResult, relative_change, word_sensitivity
from .weights import sample_V, sample_Vs, sample_W, sample_X

_progress.install()  # tqdm bars to the book build's terminal, only when WSBOOK_PROGRESS is set

__version__ = "0.1.0"
__all__ = [
    "rf", "drf", "raf", "relu_attention", "flat", "normalize_rows",
    "sample_V", "sample_Vs", "sample_W", "sample_X",
    "word_sensitivity", "relative_change", "SensitivityResult",
    "rf_word_sensitivity", "attention_word_sensitivity", "certified_lower_bound",
]
