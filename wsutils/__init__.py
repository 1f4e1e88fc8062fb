"""wsutils: the mathematics of *Towards Understanding the Word Sensitivity of Attention Layers:
A Study via Random Features* (Bombari & Mondelli, ICML 2024), as used by the wsbook chapters.

Modules: :mod:`wsutils.config` (the three environment knobs), :mod:`wsutils.maps` (RF, DRF,
RAF, ReLU attention), :mod:`wsutils.weights` (seeded weight samplers),
:mod:`wsutils.sensitivity` (the word-sensitivity estimator).
"""

from .maps import drf, flat, normalize_rows, raf, relu_attention, rf
from .sensitivity import SensitivityResult, relative_change, word_sensitivity
from .weights import sample_V, sample_Vs, sample_W, sample_X

__version__ = "0.1.0"
__all__ = [
    "rf", "drf", "raf", "relu_attention", "flat", "normalize_rows",
    "sample_V", "sample_Vs", "sample_W", "sample_X",
    "word_sensitivity", "relative_change", "SensitivityResult",
]
