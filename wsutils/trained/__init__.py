"""Word sensitivity of a trained BERT-family model, head by head and layer by layer, and of real
one-word substitutions (the book's chapters ``trained-attention`` and ``trained-substitutions``).
Every name below is defined in a module of this package by concern (``heads``, ``layers``,
``own_norm``, ``vocabulary``, ``substitutions``, ``fidelity``) and used from here,
``wsutils.trained.X``.

- :func:`head_weights`: the per-head weights ``(W_Q, W_K, W_V, W_O)`` and biases of one
  attention head, read from the model's own modules (``encoder.layer[l].attention.self.query``
  … and ``attention.output.dense``); :func:`random_head`: a random head of the same shapes
  whose ``W_Q W_Kᵀ`` (and ``W_V``) has the trained head's Frobenius norm.
- :func:`layer_inputs`: the input of every layer (``hidden_states``, each already through the
  model's own LayerNorm) for reviews cut to ``n`` tokens, through the on-disk cache of
  :func:`wsutils.text.embeddings.embed`.
- :func:`head_map` (eq. :eq:`eq-trained-head`; a logit per key, ``key_bias``, masks or biases
  keys, :func:`check_key_bias`; :func:`head_attention` gives its weights), :func:`block_map`
  (the model's own ``encoder.layer[l].attention``: all heads, ``W_O``, residual and LayerNorm),
  :func:`layer_map` (``encoder.layer[l]``, feed-forward part included) and :func:`stack_map`
  (layers ``1..ℓ`` in turn): differentiable torch maps ``(B, n, d) → (B, n, ·)`` usable by
  :func:`wsutils.sensitivity.word_sensitivity`, in float32 or float64;
  :func:`map_fidelity` checks on real hidden states that they are the model's own, within a
  stated model of float32 rounding.
- :func:`own_norm_problem`: the rescaling that turns the word sensitivity with the ball of
  radius ``‖x_i‖`` (:prf:ref:`def-own-norm-ws`) into the book's definition with radius ``√d``
  (:prf:ref:`def-word-sensitivity`), so that the search of ``wsutils`` (which takes any map)
  applies; the estimators that rely on a map's form (the fast attention estimator, the
  certified upper bounds of other chapters) do not; :func:`own_norm_word_sensitivity` runs the
  search of :func:`~wsutils.sensitivity.word_sensitivity` on it (values certified at ``X``
  itself) and :func:`head_word_sensitivity` runs the same search for one head with a rank-one
  update of ``Q, K, V`` (``O(n²·d_h)`` per start and step instead of ``O(n·d·d_h)``);
  :func:`heads_word_sensitivity` searches several heads in one batch and :func:`head_grid`
  every head of every layer. The fast estimator of :mod:`wsutils.estimators.self_attention`
  does not apply: a head is not of the form ``softmax(X W Xᵀ/√d) X`` (separate ``W_V``,
  biases, and the rescaled coordinates of :func:`own_norm_problem`).
- :func:`head_certified_upper`: an upper certificate for one head in the own-norm ball
  (:prf:ref:`prop-head-upper`), which :func:`head_word_sensitivity` returns beside its lower
  bound; :func:`head_upper_grid` bounds every head of every layer as :func:`head_grid`
  searches them; :func:`block_certified_upper` bounds the whole attention block
  (:prf:ref:`prop-block-upper`). The layer and the stack have none.
- :func:`vocabulary_changes`: the realisable word sensitivity of the first layer's heads
  (:prf:ref:`def-realisable-ws`): replace token ``i`` by **every** token of the vocabulary
  through the model's embedding layer, batched, with every token's ``q, k, v`` from one
  product cached per model (eq. :eq:`eq-vocab-factored`, checked against the model's own
  module at every call; :func:`free_vocabulary_tables` frees them);
  :func:`substitution_changes`: the relative change of the hidden states of every layer for
  a list of substitutions (full forward passes);
  :func:`pair_changes`: the same for one-word-different sentence pairs (the figure-1 chapter's).

Threads. The searches run many small batched products; on a shared machine one torch thread
(``torch.set_num_threads(1)``) was about 20 times faster than two in one measurement on a
loaded two-core machine; the chapter
sets it.

Biases. BERT's projections have biases: ``q = x W_Q + b_Q``, ``k = x W_K + b_K``,
``v = x W_V + b_V``. The maps here keep all of them, so that they equal what the model
computes. In the scores ``q_j·k_k``, the term ``q_j·b_K`` is the same for every key of row
``j`` and cancels in the softmax; ``b_Q·k_k`` does not. Since every attention row sums to one,
``b_V`` adds the same vector to every output row: it cancels in ``φ(X_i(Δ)) − φ(X)`` and
enters ``S`` only through ``‖φ(X)‖``.
"""

from __future__ import annotations

from .fidelity import MapFidelity, map_fidelity
from .heads import (
    Head,
    check_key_bias,
    head_attention,
    head_certified_upper,
    head_grid,
    head_map,
    head_upper_grid,
    head_weights,
    head_word_sensitivity,
    heads_word_sensitivity,
    random_head,
)
from .layers import block_certified_upper, block_map, layer_inputs, layer_map, stack_map
from .own_norm import own_norm_problem, own_norm_word_sensitivity
from .substitutions import pair_changes, substitution_changes
from .vocabulary import (
    VocabularyChanges,
    free_vocabulary_tables,
    vocabulary_changes,
    vocabulary_search,
)

__all__ = [
    "Head",
    "head_weights",
    "random_head",
    "layer_inputs",
    "head_map",
    "head_attention",
    "check_key_bias",
    "block_map",
    "layer_map",
    "stack_map",
    "MapFidelity",
    "map_fidelity",
    "own_norm_problem",
    "own_norm_word_sensitivity",
    "head_word_sensitivity",
    "vocabulary_changes",
    "vocabulary_search",
    "VocabularyChanges",
    "free_vocabulary_tables",
    "substitution_changes",
    "pair_changes",
    "head_grid",
    "heads_word_sensitivity",
    "head_certified_upper",
    "head_upper_grid",
    "block_certified_upper",
]
