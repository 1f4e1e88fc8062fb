"""Word sensitivity of a trained BERT-family model, head by head and layer by layer, and of real
one-word substitutions (the book's chapter ``trained-attention``).

- :func:`head_weights`: the per-head weights ``(W_Q, W_K, W_V, W_O)`` and biases of one
  attention head, read from the model's own modules (``encoder.layer[l].attention.self.query``
  … and ``attention.output.dense``); :func:`random_head`: a random head of the same shapes
  whose ``W_Q W_Kᵀ`` (and ``W_V``) has the trained head's Frobenius norm.
- :func:`layer_inputs`: the input of every layer (``hidden_states``, each already through the
  model's own LayerNorm) for reviews cut to ``n`` tokens, through the on-disk cache of
  :func:`wsutils.embeddings.embed`.
- :func:`head_map` (eq. :eq:`eq-trained-head`), :func:`block_map` (the model's own
  ``encoder.layer[l].attention``: all heads, ``W_O``, residual and LayerNorm),
  :func:`layer_map` (``encoder.layer[l]``, feed-forward part included) and :func:`stack_map`
  (layers ``1..ℓ`` in turn): differentiable torch maps ``(B, n, d) → (B, n, ·)`` usable by
  :func:`wsutils.sensitivity.word_sensitivity`, in float32 or float64.
- :func:`own_norm_problem`: the rescaling that turns the word sensitivity with the ball of
  radius ``‖x_i‖`` (:prf:ref:`def-own-norm-ws`) into the book's definition with radius ``√d``
  (:prf:ref:`def-word-sensitivity`), so that the search of ``wsutils`` (which takes any
  map) applies; the estimators that rely on a map's form (the fast attention estimator, the
  certified upper bounds of other chapters) do not;
  :func:`own_norm_word_sensitivity` runs the search of
  :func:`~wsutils.sensitivity.word_sensitivity` on it (values certified at ``X`` itself)
  and :func:`head_word_sensitivity` runs the same search for one head with a rank-one update
  of ``Q, K, V`` (``O(n²·d_h)`` per start and step instead of ``O(n·d·d_h)``);
  :func:`heads_word_sensitivity` searches several heads in one batch and :func:`head_grid`
  every head of every layer. The fast estimator of :mod:`wsutils.attention` does not apply:
  a head is not of the form ``softmax(X W Xᵀ/√d) X`` (separate ``W_V``, biases, and the
  rescaled coordinates of :func:`own_norm_problem`).
- :func:`vocabulary_changes`: the realisable word sensitivity of the first layer's heads
  (:prf:ref:`def-realisable-ws`): replace token ``i`` by **every** token of the vocabulary
  through the model's own embedding layer, batched; :func:`substitution_changes`: the relative
  change of the hidden states of every layer for a list of substitutions (full forward passes);
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

import copy
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ._tensor import Array, as_tensor
from .checks import check_int, check_seed
from .embeddings import Encoder, embed, load_model
from .sensitivity import (SensitivityResult, _ascend, certify, check_lr,
                          search_rows, search_setup)

__all__ = ["Head", "head_weights", "random_head", "layer_inputs", "head_map", "block_map",
           "layer_map", "stack_map", "own_norm_problem", "own_norm_word_sensitivity",
           "head_word_sensitivity", "vocabulary_changes", "VocabularyChanges",
           "substitution_changes", "pair_changes", "head_grid",
           "heads_word_sensitivity"]

Map = Callable[[torch.Tensor], torch.Tensor]


def _encoder(enc) -> Encoder:
    if isinstance(enc, Encoder):
        return enc
    if isinstance(enc, str):
        return load_model(enc)
    raise TypeError(f"enc must be a wsutils.embeddings.Encoder or a model name, got "
                    f"{type(enc).__name__}; load one with wsutils.embeddings.load_model.")


def _layer_index(enc: Encoder, layer) -> int:
    layer = check_int("layer", layer, minimum=1)
    if layer > enc.layers:
        raise ValueError(f"layer must be between 1 and {enc.layers} for {enc.name} (layers are "
                         f"counted from 1, as hidden_states[layer] is their output), got {layer}.")
    return layer


@dataclass(frozen=True)
class Head:
    """One attention head: ``W_Q``, ``W_K``, ``W_V`` (``d × d_h``), their biases (``d_h``), and
    its block ``W_O`` (``d_h × d``) of the output projection (whose bias the block adds once,
    not per head). Float64 tensors on the CPU. ``layer`` counts from 1, ``head`` from 0."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    b_Q: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    W_O: torch.Tensor
    layer: int
    head: int

    @property
    def d(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def d_h(self) -> int:
        return int(self.W_Q.shape[1])

    def qk_norm(self) -> float:
        """``‖W_Q W_Kᵀ‖_F``."""
        return float(torch.linalg.matrix_norm(self.W_Q @ self.W_K.T))


def head_weights(enc, layer: int, head: int) -> Head:
    """The weights of head ``head`` (from 0) of layer ``layer`` (from 1), read from the model's
    own ``nn.Linear`` modules: ``query``/``key``/``value`` compute ``x Wᵀ + b`` with ``W`` of
    shape ``(heads·d_h, d)``, so ``W_Q`` is the transpose of the head's block of rows;
    ``attention.output.dense`` gives ``W_O`` (the head's block of columns, transposed)."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    head = check_int("head", head, minimum=0)
    if head >= enc.heads:
        raise ValueError(f"head must be between 0 and {enc.heads - 1}, got {head}.")
    att = enc.model.encoder.layer[layer - 1].attention
    dh = enc.hidden // enc.heads
    rows = slice(head * dh, (head + 1) * dh)

    def take(lin):
        W = lin.weight.detach()[rows].T.to("cpu", torch.float64).clone()
        b = lin.bias.detach()[rows].to("cpu", torch.float64).clone()
        return W, b

    (WQ, bQ), (WK, bK), (WV, bV) = (take(att.self.query), take(att.self.key),
                                    take(att.self.value))
    WO = att.output.dense.weight.detach()[:, rows].T.to("cpu", torch.float64).clone()
    return Head(W_Q=WQ, W_K=WK, W_V=WV, b_Q=bQ, b_K=bK, b_V=bV, W_O=WO, layer=layer, head=head)


def random_head(head: Head, *, seed: int) -> Head:
    """A random head of the same shapes (the control of the chapter ``trained-attention``):
    ``W_Q``, ``W_K``, ``W_V`` with i.i.d. normal entries, ``W_Q`` and ``W_K`` rescaled by one
    common factor so that ``‖W_Q W_Kᵀ‖_F`` equals the trained head's, ``W_V`` rescaled to the
    trained ``‖W_V‖_F``; no biases. Seeded."""
    seed = check_seed(seed)
    g = torch.Generator().manual_seed(seed)
    d, dh = head.d, head.d_h
    WQ, WK, WV = (torch.randn(d, dh, generator=g, dtype=torch.float64) for _ in range(3))
    c = math.sqrt(head.qk_norm() / float(torch.linalg.matrix_norm(WQ @ WK.T)))
    WV = WV * (float(torch.linalg.matrix_norm(head.W_V)) / float(torch.linalg.matrix_norm(WV)))
    z = torch.zeros(dh, dtype=torch.float64)
    return Head(W_Q=c * WQ, W_K=c * WK, W_V=WV, b_Q=z, b_K=z.clone(), b_V=z.clone(),
                W_O=head.W_O.clone(), layer=head.layer, head=head.head)


def layer_inputs(enc, texts: Sequence[str], n: int, *, ids: Sequence[int] | None = None,
                 cache_dir=None) -> np.ndarray:
    """The hidden states of every layer for ``texts`` cut to ``n`` tokens (``[CLS]``, the first
    ``n − 2`` word pieces, ``[SEP]``): a float32 array ``(L + 1, len(texts), n, d)`` whose entry
    ``ℓ − 1`` is the input of layer ``ℓ`` (entry 0 the embedding layer's output, entry ``ℓ``
    the output of layer ``ℓ``, each already through the model's own LayerNorm).

    The model runs on the cut text (no padding), so a map of layer ``ℓ`` applied to entry
    ``ℓ − 1`` computes what the model computes on that text. Every text must have at least
    ``n − 2`` word pieces (a ValueError names the short ones). Cached on disk per layer
    (:func:`wsutils.embeddings.embed`, keyed by the model, layer, ``n``, texts and ``ids``)."""
    enc = _encoder(enc)
    n = check_int("n", n, minimum=3)
    out = []
    for layer in range(enc.layers + 1):
        E, mask = embed(list(texts), model=enc, layer=layer, max_length=n, ids=ids,
                        return_mask=True, cache_dir=cache_dir, progress=False)
        short = np.flatnonzero(mask.sum(axis=1) < n)
        if short.size:
            raise ValueError(f"texts {short.tolist()} have fewer than n − 2 = {n - 2} word "
                             "pieces: choose longer texts or a smaller n.")
        out.append(E)
    return np.stack(out)


def _qkv(head: Head, X: torch.Tensor):
    WQ, WK, WV, bQ, bK, bV = (t.to(dtype=X.dtype, device=X.device) for t in
                              (head.W_Q, head.W_K, head.W_V, head.b_Q, head.b_K, head.b_V))
    return X @ WQ + bQ, X @ WK + bK, X @ WV + bV


def head_map(head: Head) -> Map:
    """The trained head as a map (eq. :eq:`eq-trained-head`):
    ``φ(X) = softmax((X W_Q + b_Q)(X W_K + b_K)ᵀ/√d_h)(X W_V + b_V)``, ``(…, n, d) → (…, n, d_h)``,
    in the dtype of ``X``: the head's slice of ``attention.self``'s output."""
    scale = 1 / math.sqrt(head.d_h)

    def phi(X: torch.Tensor) -> torch.Tensor:
        Q, K, V = _qkv(head, X)
        return torch.softmax(Q @ K.transpose(-1, -2) * scale, dim=-1) @ V
    return phi


class _ModuleMap:
    """A model's module as a map of its hidden states, in the input's dtype (a float64 copy of
    the module is made once, for the float64 values of the estimators)."""

    def __init__(self, modules, pick: Callable):
        self.modules = {torch.float32: modules}
        self.pick = pick

    def _for(self, dtype):
        if dtype not in self.modules:
            self.modules[dtype] = [copy.deepcopy(m).to(dtype) for m in self.modules[torch.float32]]
        return self.modules[dtype]

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        mods = self._for(X.dtype)
        single = X.ndim == 2                      # one text: the modules want a batch
        X = X[None] if single else X
        for m in mods:
            X = self.pick(m(X))
        return X[0] if single else X


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def block_map(enc, layer: int) -> Map:
    """The whole attention block of layer ``layer`` (from 1): the model's own
    ``encoder.layer[layer − 1].attention`` (all heads, ``W_O``, the residual and the
    LayerNorm), ``(B, n, d) → (B, n, d)``, no attention mask (texts without padding)."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap([enc.model.encoder.layer[layer - 1].attention], _first)


def layer_map(enc, layer: int) -> Map:
    """The full transformer layer ``layer`` (from 1), the model's own
    ``encoder.layer[layer − 1]`` (attention block and feed-forward part):
    hidden states ``ℓ − 1 → ℓ``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap([enc.model.encoder.layer[layer - 1]], _first)


def stack_map(enc, layer: int) -> Map:
    """Layers ``1..layer`` in turn: the embedding output (hidden states 0) to hidden states
    ``layer``. A one-token substitution changes one row of its input exactly
    (:func:`vocabulary_changes`), so it is the map to compare substitutions with at ``layer``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap(list(enc.model.encoder.layer[:layer]), _first)


def own_norm_problem(phi: Map, X: Array, *, device=None):
    """The rescaling behind :prf:ref:`def-own-norm-ws`: returns ``(Z, phi_Z, r)`` with
    ``r_j = ‖x_j‖/√d``, ``Z = diag(r)⁻¹ X`` (every row of norm ``√d``) and
    ``phi_Z(Z') = φ(diag(r) Z')``. Moving row ``i`` of ``Z`` by ``Δ'`` with ``‖Δ'‖ ≤ √d`` moves
    row ``i`` of ``X`` by ``Δ = r_i Δ'``, ``‖Δ‖ ≤ ‖x_i‖``, and ``phi_Z(Z) = φ(X)``, so
    ``S_{phi_Z}(Z)`` in the book's definition (radius ``√d``) is the own-norm sensitivity of
    ``φ`` at ``X``. ``Z`` and ``r`` are float64 tensors."""
    Xt = as_tensor(X, dtype=torch.float64, device=device, name="X")
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    if not bool(torch.isfinite(Xt).all()):
        raise ValueError("X has non-finite entries (NaN or inf).")
    d = Xt.shape[1]
    r = torch.linalg.vector_norm(Xt, dim=1, keepdim=True) / math.sqrt(d)
    if not bool((r > 0).all()):
        raise ValueError("a row of X is zero: its own-norm ball is a point; drop that row.")
    Z = Xt / r

    def phi_Z(Zb: torch.Tensor) -> torch.Tensor:
        return phi(Zb * r.to(Zb.dtype))
    return Z, phi_Z, r


def _to_x(res: SensitivityResult, r: torch.Tensor) -> SensitivityResult:
    scale = r[:, 0].cpu().numpy()
    res.per_row_Delta = {i: D * scale[i] for i, D in res.per_row_Delta.items()}
    res.Delta = res.per_row_Delta[res.row]
    return res


def own_norm_word_sensitivity(phi: Map, X: Array, *, rows=None, starts: int = 4,
                              steps: int = 50, seed: int = 0, lr: float = 0.5,
                              dtype: torch.dtype = torch.float32, device=None,
                              max_batch_elements: int = 2**23) -> SensitivityResult:
    """``Ŝ^own_φ(X)``, a certified lower bound on ``S^own_φ(X)`` (:prf:ref:`def-own-norm-ws`):
    the search of :func:`wsutils.sensitivity.word_sensitivity` (same starts from ``seed``,
    same steps and step sizes) on :func:`own_norm_problem`, run in ``dtype``; the best iterate
    of every row is then projected onto the exact ball in float64 and its relative change
    recomputed in float64 at ``X`` itself (:func:`wsutils.sensitivity.certify` on ``Z`` in
    float64, not on ``Z`` rounded to ``dtype``), so every reported value is attained by the
    returned ``Δ`` at the given ``X``, up to float64 rounding. ``Delta``/``per_row_Delta``
    are returned in the coordinates of ``X`` (``‖Δ‖ ≤ ‖x_i‖`` up to the rounding of one
    multiplication)."""
    Z, phi_Z, r = own_norm_problem(phi, X, device=device)
    Zs, row_list, _ = search_setup(Z.to(dtype), rows=rows, starts=starts, steps=steps,
                                   check_norms=False, device=device)
    seed, lr = check_seed(seed), check_lr(lr)
    max_batch_elements = check_int("max_batch_elements", max_batch_elements, minimum=1)
    with torch.no_grad():
        base = phi_Z(Zs[None])[0]
    found = search_rows(phi_Z, Zs, base, row_list, starts=starts, steps=steps, seed=seed,
                        extra=None, lr=lr, max_batch_elements=max_batch_elements)
    res = certify(phi_Z, Z.to(Zs.device), found, starts=starts, steps=steps, seed=seed,
                  max_batch_elements=max_batch_elements)       # at X itself, in float64
    return _to_x(res, r)


class _HeadObjective:
    """Relative change of one head for a batch of (row, Δ') in the own-norm coordinates,
    by a rank-one update: only ``q_i``, ``k_i``, ``v_i`` change."""

    def __init__(self, head: Head, X: torch.Tensor, r: torch.Tensor):
        self.X, self.r = X, r.to(X.dtype)[:, 0]
        self.WQ, self.WK, self.WV = (t.to(X) for t in (head.W_Q, head.W_K, head.W_V))
        self.scale = 1 / math.sqrt(head.d_h)
        with torch.no_grad():
            self.Q, self.K, self.V = _qkv(head, X)
            self.base = torch.softmax(self.Q @ self.K.T * self.scale, -1) @ self.V
            self.base_norm = float(torch.linalg.vector_norm(self.base))

    def __call__(self, row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        n = self.X.shape[0]
        D = Delta * self.r[row_idx][:, None]                      # Δ in X's coordinates
        one = torch.nn.functional.one_hot(row_idx, n).to(D.dtype)[:, :, None]
        Q = self.Q + one * (D @ self.WQ)[:, None]
        K = self.K + one * (D @ self.WK)[:, None]
        V = self.V + one * (D @ self.WV)[:, None]
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale, -1) @ V
        diff = (out - self.base).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm


def head_word_sensitivity(head: Head, X: Array, *, rows=None, starts: int = 4,
                          steps: int = 50, seed: int = 0, lr: float = 0.5,
                          dtype: torch.dtype = torch.float32,
                          max_batch_elements: int = 2**23, device=None) -> SensitivityResult:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of one head (:func:`head_map`) at ``X``: the
    search of :func:`wsutils.sensitivity.word_sensitivity` (same starts from ``seed``, same
    steps, best iterate kept; so the same answer as :func:`own_norm_word_sensitivity` up to
    rounding), with ``q_i, k_i, v_i`` updated in place of recomputing ``X W_Q`` … for every
    start and step. Every reported value is recomputed with :func:`head_map` in float64;
    ``Delta`` is in the coordinates of ``X``."""
    Z, phi_Z, r = own_norm_problem(head_map(head), X, device=device)
    Zs, row_list, _ = search_setup(Z.to(dtype), rows=rows, starts=starts, steps=steps,
                                   check_norms=False, device=device)
    seed, lr = check_seed(seed), check_lr(lr)
    obj = _HeadObjective(head, (Zs * r.to(Zs)), r.to(Zs))
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and head.")
    found = _ascend(lambda chunk: obj, Zs, row_list, starts=starts, steps=steps, seed=seed,
                    extra=None, lr=lr, max_batch_elements=max_batch_elements, progress=False)
    res = certify(phi_Z, Z.to(Zs.device), found, starts=starts, steps=steps, seed=seed,
                  max_batch_elements=max_batch_elements)       # at X itself, in float64
    return _to_x(res, r)


@dataclass
class VocabularyChanges:
    """What :func:`vocabulary_changes` found at one position ``i`` of one text.

    ``values``: ``(heads, V)`` float64, the relative change of each head of the first layer
    when token ``i`` becomes vocabulary token ``v``; ``dist``: ``(V,)``, ``‖e_v − x_i‖/‖x_i‖``
    (``≤ 1``: the substitution lies in the own-norm ball); ``tokens``: the candidate token
    ids (``V`` of them); ``original``: the token at ``i``; ``seconds`` and ``peak_bytes``: the
    wall time and the size of one batch's float64 intermediate arrays (bytes, counted from
    their shapes: an estimate, not a measurement)."""

    position: int
    original: int
    tokens: np.ndarray
    values: np.ndarray
    dist: np.ndarray
    seconds: float
    peak_bytes: int


def _position_rows(enc: Encoder, tokens: torch.Tensor, position: int, dtype) -> torch.Tensor:
    """The embedding layer's output for each token alone at ``position`` (segment 0): the
    model's own ``embeddings`` module with ``position_ids``. BERT's embedding output is per
    position (word + position + type embeddings, then a LayerNorm of that row), so this is
    the row ``position`` of the embedded text with that token there."""
    pos = torch.full((len(tokens), 1), position, dtype=torch.long, device=enc.device)
    with torch.no_grad():
        rows = enc.model.embeddings(input_ids=tokens[:, None].to(enc.device), position_ids=pos,
                                    token_type_ids=torch.zeros_like(pos))
    return rows[:, 0].to(dtype)


def vocabulary_changes(enc, input_ids, position: int, *, tokens=None, batch: int = 2048,
                       device=None) -> VocabularyChanges:
    """The realisable word sensitivity of the heads of the first layer at one position
    (:prf:ref:`def-realisable-ws`): for each candidate token ``v`` (default: the whole
    vocabulary but the token already there), replace token ``position`` of ``input_ids``
    (one text, ``[CLS]``…``[SEP]``, no padding) by ``v`` through the model's own embedding
    layer and record ``‖φ_h(X') − φ_h(X)‖/‖φ_h(X)‖`` for every head ``h`` of layer 1
    (:func:`head_map`), in float64.

    Exact, not a bound: the embedding output is per position, so ``X'`` is ``X`` with row
    ``position`` replaced, and only ``q_i, k_i, v_i`` change; each candidate costs
    ``O(d² + n·d)`` (its row through all heads' ``W_Q, W_K, W_V``, then the scores of row and
    column ``i``; every other output row ``j`` moves by
    ``(ρ' − ρ)(m_j − v_i) + (1 − ρ')(v'_i − v_i)`` with ``m_j`` the mean of the other values
    under row ``j``'s weights and ``ρ``, ``ρ'`` their total weight before and after, as in
    :mod:`wsutils.attention`), batched over ``batch`` candidates."""
    import time

    enc = _encoder(enc)
    dev = torch.device(device) if device is not None else enc.device
    ids = torch.as_tensor(input_ids, dtype=torch.long).flatten().to(enc.device)
    n = len(ids)
    position = check_int("position", position, minimum=0)
    if position >= n:
        raise ValueError(f"position must be below n = {n}, got {position}.")
    batch = check_int("batch", batch, minimum=1)
    V = int(enc.model.config.vocab_size)
    if tokens is None:
        tokens = torch.tensor([v for v in range(V) if v != int(ids[position])])
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
    if len(tokens) == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= V:
        raise ValueError(f"tokens must be a non-empty list of ids in [0, {V}).")
    t0 = time.perf_counter()
    f64 = torch.float64
    with torch.no_grad():
        X = enc.model.embeddings(input_ids=ids[None],
                                 token_type_ids=torch.zeros_like(ids)[None])[0].to(dev, f64)
    heads = [head_weights(enc, 1, h) for h in range(enc.heads)]
    dh, H = heads[0].d_h, len(heads)
    WQ, WK, WV = (torch.cat([getattr(h, w) for h in heads], 1).to(dev)
                  for w in ("W_Q", "W_K", "W_V"))
    bQ, bK, bV = (torch.cat([getattr(h, b) for h in heads]).to(dev) for b in ("b_Q", "b_K", "b_V"))
    Q, K, Vv = ((X @ W + b).reshape(n, H, dh).transpose(0, 1)                # (H, n, dh)
                for W, b in ((WQ, bQ), (WK, bK), (WV, bV)))
    sc = 1 / math.sqrt(dh)
    base = torch.softmax(Q @ K.transpose(-1, -2) * sc, -1) @ Vv               # (H, n, dh)
    base_norm = torch.linalg.vector_norm(base.flatten(1), dim=1)              # (H,)
    xi_norm = torch.linalg.vector_norm(X[position])
    i = position
    s = Q @ K.transpose(-1, -2) * sc                                          # (H, n, n)
    # rows j ≠ i: m_j, the mean of the other values under row j's weights (formed directly,
    # no cancellation), ℓ_j = log Σ_{k≠i} exp s_jk, and ‖m_j − v_i‖²
    s_oth = s.clone()
    s_oth[..., i] = -math.inf
    lse = torch.logsumexp(s_oth, -1)                                          # (H, n)
    Mv = torch.softmax(s_oth, -1) @ Vv - Vv[:, i:i + 1]                       # m_j − v_i
    Mv2 = (Mv ** 2).sum(-1)                                                   # (H, n)
    b_arg = lse - s[..., i]                                                   # ρ = σ(b)
    notme = torch.ones(n, dtype=f64, device=dev)
    notme[i] = 0
    vals, dists, peak = [], [], 0
    for j in range(0, len(tokens), batch):
        rows = _position_rows(enc, tokens[j:j + batch], position, f64).to(dev)    # (B, d)
        q, k, v = ((rows @ W + b).reshape(-1, H, dh)                          # (B, H, dh)
                   for W, b in ((WQ, bQ), (WK, bK), (WV, bV)))
        dv = v - Vv[:, i]                                                     # (B, H, dh)
        s_col = torch.einsum("hnd,bhd->bhn", Q, k) * sc                       # s'_ji
        a_arg = lse[None] - s_col                                             # ρ' = σ(a)
        g = (torch.sigmoid(a_arg) * torch.sigmoid(-b_arg[None])
             - torch.sigmoid(b_arg[None]) * torch.sigmoid(-a_arg))            # ρ' − ρ
        w = torch.sigmoid(-a_arg)                                             # 1 − ρ'
        cross = torch.einsum("hnd,bhd->bhn", Mv, dv)
        sq = g ** 2 * Mv2[None] + 2 * g * w * cross + w ** 2 * (dv ** 2).sum(-1, keepdim=True)
        sq = (sq.clamp_min(0) * notme).sum(-1)                                # (B, H)
        # row i: the new query against the new keys, then its new output
        t = torch.einsum("bhd,hnd->bhn", q, K) * sc
        t[..., i] = (q * k).sum(-1) * sc
        a = torch.softmax(t, -1)
        out_i = torch.einsum("bhn,hnd->bhd", a, Vv) + a[..., i:i + 1] * dv     # (B, H, dh)
        sq = sq + ((out_i - base[None, :, i]) ** 2).sum(-1)
        vals.append(torch.sqrt(sq) / base_norm)
        dists.append(torch.linalg.vector_norm(rows - X[i], dim=-1) / xi_norm)
        # rows, q, k, v, dv, out_i: B·d each; s_col, a_arg, g, w, cross, sq, t, a and one
        # temporary: B·H·n each (float64)
        peak = max(peak, 8 * (6 * rows.numel() + 9 * s_col.numel()))
    return VocabularyChanges(position=position, original=int(ids[position]),
                             tokens=tokens.numpy(), values=torch.cat(vals).T.cpu().numpy(),
                             dist=torch.cat(dists).cpu().numpy(),
                             seconds=time.perf_counter() - t0, peak_bytes=int(peak))


def substitution_changes(enc, input_ids, position: int, tokens, *,
                         batch: int = 64) -> np.ndarray:
    """For each token ``v`` of ``tokens``: the text ``input_ids`` with token ``position``
    replaced by ``v``, run through the whole model (its own embeddings and layers, float32);
    returns ``(len(tokens), L)`` float64, entry ``[v, ℓ − 1]`` the relative change
    ``‖H_ℓ' − H_ℓ‖/‖H_ℓ‖`` of the hidden states of layer ``ℓ`` (all positions).
    For ``ℓ ≥ 2`` every row of the layer's input changes, so these are full forward passes,
    on the model's device (:func:`wsutils.embeddings.load_model` ``device=``)."""
    enc = _encoder(enc)
    ids = torch.as_tensor(input_ids, dtype=torch.long).flatten().to(enc.device)
    position = check_int("position", position, minimum=0)
    if position >= len(ids):
        raise ValueError(f"position must be below n = {len(ids)}, got {position}.")
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
    out = []
    with torch.no_grad():
        H = torch.stack(enc.model(input_ids=ids[None], output_hidden_states=True)
                        .hidden_states[1:]).double()                          # (L, 1, n, d)
        for j in range(0, len(tokens), batch):
            t = tokens[j:j + batch].to(enc.device)
            b = ids.expand(len(t), -1).clone()
            b[:, position] = t
            Hs = torch.stack(enc.model(input_ids=b, output_hidden_states=True)
                             .hidden_states[1:]).double()                     # (L, B, n, d)
            num = torch.linalg.vector_norm((Hs - H).flatten(2), dim=-1)
            out.append((num / torch.linalg.vector_norm(H.flatten(2), dim=-1)).T)
    return torch.cat(out).cpu().numpy()


def pair_changes(enc, pairs) -> dict[str, np.ndarray]:
    """The real change of the model on one-word-different sentence pairs
    (:class:`wsutils.text_attention.Pair`, e.g. :func:`wsutils.text_attention.one_word_pairs`):
    for each pair, ``heads`` ``(P, heads)``: the relative change of every head of layer 1
    (:func:`head_map` on the embedding output); ``layers`` ``(P, L)``: the relative change of
    the hidden states of every layer (all positions); ``dist`` ``(P,)``:
    ``‖x'_j − x_j‖/‖x_j‖`` for the changed row ``j`` of the embedding output (``≤ 1``: inside
    the own-norm ball of :prf:ref:`def-own-norm-ws`). Batched by sentence length; runs on the
    model's device."""
    enc = _encoder(enc)
    heads = [head_map(head_weights(enc, 1, h)) for h in range(enc.heads)]
    P = len(pairs)
    out = {"heads": np.empty((P, enc.heads)), "layers": np.empty((P, enc.layers)),
           "dist": np.empty(P)}
    by_len: dict[int, list[int]] = {}
    for k, p in enumerate(pairs):
        by_len.setdefault(len(p.ids), []).append(k)
    for ks in by_len.values():
        a = torch.tensor([pairs[k].ids for k in ks], device=enc.device)
        b = torch.tensor([pairs[k].ids_changed for k in ks], device=enc.device)
        with torch.no_grad():
            ha = torch.stack(enc.model(input_ids=a, output_hidden_states=True).hidden_states)
            hb = torch.stack(enc.model(input_ids=b, output_hidden_states=True).hidden_states)
        ha, hb = ha.double(), hb.double()
        rel = (torch.linalg.vector_norm((hb - ha).flatten(2), dim=-1)
               / torch.linalg.vector_norm(ha.flatten(2), dim=-1))          # (L + 1, B)
        out["layers"][ks] = rel[1:].T.cpu().numpy()
        for h, phi in enumerate(heads):
            ya, yb = phi(ha[0]), phi(hb[0])
            out["heads"][ks, h] = (torch.linalg.vector_norm((yb - ya).flatten(1), dim=-1)
                                   / torch.linalg.vector_norm(ya.flatten(1), dim=-1)).cpu().numpy()
        j = torch.tensor([pairs[k].j for k in ks], device=enc.device)
        r = torch.arange(len(ks), device=enc.device)
        out["dist"][ks] = (torch.linalg.vector_norm(hb[0, r, j] - ha[0, r, j], dim=-1)
                           / torch.linalg.vector_norm(ha[0, r, j], dim=-1)).cpu().numpy()
    return out


class _HeadsObjective:
    """:class:`_HeadObjective` for several heads at once: search index ``k`` is head
    ``k // n``, row ``k % n`` (one batch for all the heads of a layer)."""

    def __init__(self, heads: Sequence[Head], X: torch.Tensor, r: torch.Tensor):
        self.n = X.shape[0]
        self.r = r.to(X.dtype)[:, 0]
        stack = lambda name: torch.stack([getattr(h, name) for h in heads]).to(X)
        self.WQ, self.WK, self.WV = stack("W_Q"), stack("W_K"), stack("W_V")   # (H, d, dh)
        self.scale = 1 / math.sqrt(heads[0].d_h)
        with torch.no_grad():
            self.Q = X @ self.WQ + stack("b_Q")[:, None]                       # (H, n, dh)
            self.K = X @ self.WK + stack("b_K")[:, None]
            self.V = X @ self.WV + stack("b_V")[:, None]
            self.base = torch.softmax(self.Q @ self.K.transpose(-1, -2) * self.scale, -1) @ self.V
            self.base_norm = torch.linalg.vector_norm(self.base.flatten(1), dim=1)  # (H,)

    def __call__(self, idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        h, i = idx // self.n, idx % self.n
        D = (Delta * self.r[i][:, None])[:, None]                             # (B, 1, d)
        one = torch.nn.functional.one_hot(i, self.n).to(Delta.dtype)[:, :, None]
        Q = self.Q[h] + one * (D @ self.WQ[h])
        K = self.K[h] + one * (D @ self.WK[h])
        V = self.V[h] + one * (D @ self.WV[h])
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale, -1) @ V
        diff = (out - self.base[h]).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm[h]


def heads_word_sensitivity(heads: Sequence[Head], X: Array, *, rows=None, starts: int = 2,
                           steps: int = 20, seed: int = 0, lr: float = 0.5,
                           dtype: torch.dtype = torch.float32,
                           max_batch_elements: int = 2**23, device=None) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of several heads at the same ``X``, one value
    per head: the search of :func:`head_word_sensitivity` (same starts, steps and step sizes)
    for all the heads in one batch (so its random starts differ from separate calls), every
    value recomputed with :func:`head_map` in float64 at the best ``Δ`` of each head."""
    heads = list(heads)
    if not heads:
        raise ValueError("heads is empty: pass at least one Head.")
    Z, _, r = own_norm_problem(head_map(heads[0]), X, device=device)
    n = Z.shape[0]
    Zs, row_list, _ = search_setup(Z.to(dtype), rows=rows, starts=starts, steps=steps,
                                   check_norms=False, device=device)
    seed, lr = check_seed(seed), check_lr(lr)
    obj = _HeadsObjective(heads, Zs * r.to(Zs), r.to(Zs))
    dummy = Zs.expand(len(heads), -1, -1).reshape(len(heads) * n, -1)       # index h·n + i
    idx = [h * n + i for h in range(len(heads)) for i in row_list]
    found = _ascend(lambda chunk: obj, dummy, idx, starts=starts, steps=steps, seed=seed,
                    extra=None, lr=lr, max_batch_elements=max_batch_elements, progress=False)
    out = np.empty(len(heads))
    for h, head in enumerate(heads):
        _, phi_Z, _ = own_norm_problem(head_map(head), X, device=device)
        res = certify(phi_Z, Z.to(Zs.device), {i: found[h * n + i] for i in row_list},
                      starts=starts, steps=steps, seed=seed,
                      max_batch_elements=max_batch_elements)
        out[h] = res.value
    return out


def head_grid(enc, inputs, rows, *, control: bool = False, starts: int = 2, steps: int = 20,
              seed: int = 0, device=None) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of every head of every layer, ``(L, heads)``:
    ``inputs`` is ``(L + 1, n, d)`` (one text, :func:`layer_inputs`); the heads of layer
    ``ℓ`` are searched at ``inputs[ℓ − 1]`` over ``rows`` by :func:`heads_word_sensitivity`
    (seed :func:`wsutils.seeds.point_seed` ``(seed, ℓ)``). ``control=True`` searches
    :func:`random_head` of each head instead (seed ``point_seed("random head", seed, ℓ, h)``)."""
    from .seeds import point_seed

    enc = _encoder(enc)
    out = np.empty((enc.layers, enc.heads))
    for layer in range(1, enc.layers + 1):
        X = np.asarray(inputs[layer - 1], dtype=np.float64)
        heads = [head_weights(enc, layer, h) for h in range(enc.heads)]
        if control:
            heads = [random_head(hd, seed=point_seed("random head", seed, layer, hd.head))
                     for hd in heads]
        out[layer - 1] = heads_word_sensitivity(heads, X, rows=rows, starts=starts,
                                                steps=steps, seed=point_seed("heads", seed,
                                                                             layer),
                                                device=device)
    return out
