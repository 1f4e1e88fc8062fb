"""Word sensitivity of a trained BERT-family model, head by head and layer by layer, and of real
one-word substitutions (the book's chapter ``trained-attention``).

- :func:`head_weights`: the per-head weights ``(W_Q, W_K, W_V, W_O)`` and biases of one
  attention head, read from the model's own modules (``encoder.layer[l].attention.self.query``
  … and ``attention.output.dense``); :func:`random_head`: a random head of the same shapes
  whose ``W_Q W_Kᵀ`` (and ``W_V``) has the trained head's Frobenius norm.
- :func:`layer_inputs`: the input of every layer (``hidden_states``, each already through the
  model's own LayerNorm) for reviews cut to ``n`` tokens, through the on-disk cache of
  :func:`wsutils.text.embeddings.embed`.
- :func:`head_map` (eq. :eq:`eq-trained-head`), :func:`block_map` (the model's own
  ``encoder.layer[l].attention``: all heads, ``W_O``, residual and LayerNorm),
  :func:`layer_map` (``encoder.layer[l]``, feed-forward part included) and :func:`stack_map`
  (layers ``1..ℓ`` in turn): differentiable torch maps ``(B, n, d) → (B, n, ·)`` usable by
  :func:`wsutils.sensitivity.word_sensitivity`, in float32 or float64.
- :func:`own_norm_problem`: the rescaling that turns the word sensitivity with the ball of
  radius ``‖x_i‖`` (:prf:ref:`def-own-norm-ws`) into the book's definition with radius ``√d``
  (:prf:ref:`def-word-sensitivity`), so that the search of ``wsutils`` (which takes any map)
  applies; the estimators that rely on a map's form (the fast attention estimator, the
  certified upper bounds of other chapters) do not; :func:`own_norm_word_sensitivity` runs the
  search of :func:`~wsutils.sensitivity.word_sensitivity` on it (values certified at ``X``
  itself) and :func:`head_word_sensitivity` runs the same search for one head with a rank-one
  update of ``Q, K, V`` (``O(n²·d_h)`` per start and step instead of ``O(n·d·d_h)``);
  :func:`heads_word_sensitivity` searches several heads in one batch and :func:`head_grid`
  every head of every layer. The fast estimator of :mod:`wsutils.estimators.attention` does not
  apply: a head is not of the form ``softmax(X W Xᵀ/√d) X`` (separate ``W_V``, biases, and the
  rescaled coordinates of :func:`own_norm_problem`).
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

import copy
import hashlib
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .._digest import module_digest
from .._tensor import Array, as_tensor
from ..checks import check_int, check_seed
from ..run.device import small_work_threads
from ..sensitivity import (
    SensitivityResult,
    ascend_rows,
    certify,
    check_lr,
    search_rows,
    search_setup,
)
from ..text.embeddings import Encoder, embed, load_model, model_key

__all__ = [
    "Head",
    "head_weights",
    "random_head",
    "layer_inputs",
    "head_map",
    "block_map",
    "layer_map",
    "stack_map",
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
]

Map = Callable[[torch.Tensor], torch.Tensor]


def _encoder(enc) -> Encoder:
    if isinstance(enc, Encoder):
        return enc
    if isinstance(enc, str):
        return load_model(enc)
    raise TypeError(
        f"enc must be a wsutils.text.embeddings.Encoder or a model name, got "
        f"{type(enc).__name__}; load one with wsutils.text.embeddings.load_model."
    )


def _layer_index(enc: Encoder, layer) -> int:
    layer = check_int("layer", layer, minimum=1)
    if layer > enc.layers:
        raise ValueError(
            f"layer must be between 1 and {enc.layers} for {enc.name} (layers are "
            f"counted from 1, as hidden_states[layer] is their output), got {layer}."
        )
    return layer


def _token_ids(name: str, x, device=None) -> torch.Tensor:
    """``x`` (a list, array or tensor of token ids) as a flat ``torch.long`` tensor; a
    TypeError unless every entry is an integer (a float id is not rounded, a bool is not an
    id)."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a {x.dtype} tensor.")
        return x.detach().to(device=device, dtype=torch.long).flatten()
    a = np.asarray(x)
    if a.size == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    if a.dtype.kind not in "iu":
        raise TypeError(
            f"{name} must hold integer token ids, got {a.dtype} entries (e.g. "
            f"{a.flatten()[0]!r}); pass ints: a float id is not rounded."
        )
    return torch.as_tensor(a.astype(np.int64), device=device).flatten()


def _check_length(enc: Encoder, n: int) -> None:
    """A ValueError for a text of ``n`` tokens beyond the model's position embeddings."""
    P = getattr(enc.model.config, "max_position_embeddings", None)
    if P is not None and n > int(P):
        raise ValueError(
            f"the text has {n} tokens, more than the model's "
            f"max_position_embeddings = {int(P)} ({enc.name}): cut it to at most "
            f"{int(P)} tokens (tokenizer(..., truncation=True, "
            f"max_length={int(P)}))."
        )


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

    (WQ, bQ), (WK, bK), (WV, bV) = (take(att.self.query), take(att.self.key), take(att.self.value))
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
    return Head(
        W_Q=c * WQ,
        W_K=c * WK,
        W_V=WV,
        b_Q=z,
        b_K=z.clone(),
        b_V=z.clone(),
        W_O=head.W_O.clone(),
        layer=head.layer,
        head=head.head,
    )


def layer_inputs(
    enc, texts: Sequence[str], n: int, *, ids: Sequence[int] | None = None, cache_dir=None
) -> np.ndarray:
    """The hidden states of every layer for ``texts`` cut to ``n`` tokens (``[CLS]``, the first
    ``n − 2`` word pieces, ``[SEP]``): a float32 array ``(L + 1, len(texts), n, d)`` whose entry
    ``ℓ − 1`` is the input of layer ``ℓ`` (entry 0 the embedding layer's output, entry ``ℓ``
    the output of layer ``ℓ``, each already through the model's own LayerNorm).

    The model runs on the cut text (no padding), so a map of layer ``ℓ`` applied to entry
    ``ℓ − 1`` computes what the model computes on that text. Every text must have at least
    ``n − 2`` word pieces (a ValueError names the short ones). Cached on disk per layer
    (:func:`wsutils.text.embeddings.embed`, keyed by the model's
    :func:`~wsutils.text.embeddings.model_key`, its live parameters included, computed once
    for all the layers; the layer, ``n``, texts and ``ids``)."""
    enc = _encoder(enc)
    n = check_int("n", n, minimum=3)
    key = None if cache_dir is False else model_key(enc)  # once, not once per layer
    out = []
    for layer in range(enc.layers + 1):
        E, mask = embed(
            list(texts),
            model=enc,
            layer=layer,
            max_length=n,
            ids=ids,
            return_mask=True,
            batch_size=64,
            cache_dir=cache_dir,
            progress=False,
            key_of_model=key,
        )
        short = np.flatnonzero(mask.sum(axis=1) < n)
        if short.size:
            raise ValueError(
                f"texts {short.tolist()} have fewer than n − 2 = {n - 2} word "
                "pieces: choose longer texts or a smaller n."
            )
        out.append(E)
    return np.stack(out)


def _qkv(head: Head, X: torch.Tensor):
    WQ, WK, WV, bQ, bK, bV = (
        t.to(dtype=X.dtype, device=X.device)
        for t in (head.W_Q, head.W_K, head.W_V, head.b_Q, head.b_K, head.b_V)
    )
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
    """A model's module as a map of its hidden states, in the input's dtype: the live modules
    in their own dtype; in another (float64, for the certified values of the estimators) a
    copy, made again whenever the live modules' parameters have changed since it was made
    (:func:`wsutils._digest.module_digest` of the live modules at every call in that dtype:
    ``O(parameters)``, against the ``O(batch·n·parameters)`` of the call itself)."""

    def __init__(self, modules, pick: Callable):
        self.live = list(modules)
        self.dtype = next(self.live[0].parameters()).dtype
        self.copies: dict = {}  # dtype → (digest of the live modules, copy)
        self.pick = pick

    def _for(self, dtype):
        if dtype == self.dtype:
            return self.live
        digest = module_digest(*self.live)
        held = self.copies.get(dtype)
        if held is None or held[0] != digest:
            self.copies[dtype] = held = (digest, [copy.deepcopy(m).to(dtype) for m in self.live])
        return held[1]

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        mods = self._for(X.dtype)
        single = X.ndim == 2  # one text: the modules want a batch
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


def own_norm_word_sensitivity(
    phi: Map,
    X: Array,
    *,
    rows=None,
    starts: int = 4,
    steps: int = 50,
    seed: int = 0,
    lr: float = 0.5,
    dtype: torch.dtype = torch.float32,
    device=None,
    max_batch_elements: int = 2**23,
) -> SensitivityResult:
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
    Zs, row_list, _ = search_setup(
        Z.to(dtype), rows=rows, starts=starts, steps=steps, check_norms=False, device=device
    )
    seed, lr = check_seed(seed), check_lr(lr)
    max_batch_elements = check_int("max_batch_elements", max_batch_elements, minimum=1)
    with torch.no_grad():
        base = phi_Z(Zs[None])[0]
    found = search_rows(
        phi_Z,
        Zs,
        base,
        row_list,
        starts=starts,
        steps=steps,
        seed=seed,
        extra=None,
        lr=lr,
        max_batch_elements=max_batch_elements,
    )
    res = certify(
        phi_Z,
        Z.to(Zs.device),
        found,
        starts=starts,
        steps=steps,
        seed=seed,
        max_batch_elements=max_batch_elements,
    )  # at X itself, in float64
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
        D = Delta * self.r[row_idx][:, None]  # Δ in X's coordinates
        one = torch.nn.functional.one_hot(row_idx, n).to(D.dtype)[:, :, None]
        Q = self.Q + one * (D @ self.WQ)[:, None]
        K = self.K + one * (D @ self.WK)[:, None]
        V = self.V + one * (D @ self.WV)[:, None]
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale, -1) @ V
        diff = (out - self.base).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm


def head_word_sensitivity(
    head: Head,
    X: Array,
    *,
    rows=None,
    starts: int = 4,
    steps: int = 50,
    seed: int = 0,
    lr: float = 0.5,
    dtype: torch.dtype = torch.float32,
    max_batch_elements: int = 2**23,
    device=None,
) -> SensitivityResult:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of one head (:func:`head_map`) at ``X``: the
    search of :func:`wsutils.sensitivity.word_sensitivity` (same starts from ``seed``, same
    steps, best iterate kept; so the same answer as :func:`own_norm_word_sensitivity` up to
    rounding), with ``q_i, k_i, v_i`` updated in place of recomputing ``X W_Q`` … for every
    start and step. Every reported value is recomputed with :func:`head_map` in float64;
    ``Delta`` is in the coordinates of ``X``."""
    Z, phi_Z, r = own_norm_problem(head_map(head), X, device=device)
    Zs, row_list, _ = search_setup(
        Z.to(dtype), rows=rows, starts=starts, steps=steps, check_norms=False, device=device
    )
    seed, lr = check_seed(seed), check_lr(lr)
    obj = _HeadObjective(head, (Zs * r.to(Zs)), r.to(Zs))
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and head.")
    found = ascend_rows(
        lambda chunk: obj,
        Zs,
        row_list,
        starts=starts,
        steps=steps,
        seed=seed,
        extra=None,
        lr=lr,
        max_batch_elements=max_batch_elements,
        progress=False,
    )
    res = certify(
        phi_Z,
        Z.to(Zs.device),
        found,
        starts=starts,
        steps=steps,
        seed=seed,
        max_batch_elements=max_batch_elements,
    )  # at X itself, in float64
    return _to_x(res, r)


@dataclass
class VocabularyChanges:
    """What :func:`vocabulary_changes` found at one position ``i`` of one text.

    ``values``: ``(heads, V)`` float64, the relative change of each head of the first layer
    when token ``i`` becomes vocabulary token ``v``; ``dist``: ``(V,)``, ``‖e_v − x_i‖/‖x_i‖``
    (``≤ 1``: the substitution lies in the own-norm ball); ``tokens``: the candidate token
    ids (``V`` of them); ``original``: the token at ``i``; ``seconds``: the wall time of the
    call (``table_seconds`` of it spent making rows of the cached tables, 0 when the
    candidates' rows were made by an earlier call); ``peak_bytes``: the float64 arrays the
    call holds at its largest, counted from
    their shapes (an estimate, not a measurement): the cached tables (``table_bytes``,
    ``_VocabularyTables``) plus one batch's intermediate arrays."""

    position: int
    original: int
    tokens: np.ndarray
    values: np.ndarray
    dist: np.ndarray
    seconds: float
    peak_bytes: int
    table_bytes: int = 0
    table_seconds: float = 0.0


_U64 = 2.0**-53  # float64 unit roundoff
_CANCEL_MAX = 16.0  # above it, a candidate's q, k, v are formed directly (see below)


def _check_embedding_layer(emb, d: int) -> None:
    nn = torch.nn
    ln = getattr(emb, "LayerNorm", None)
    ok = (
        all(
            isinstance(getattr(emb, name, None), nn.Embedding)
            for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")
        )
        and isinstance(ln, nn.LayerNorm)
        and tuple(ln.normalized_shape) == (d,)
        and ln.weight is not None
        and ln.bias is not None
    )
    if not ok:
        raise ValueError(
            f"the model's embedding layer ({type(emb).__name__}) is not BERT's "
            "(word, position and token-type embeddings summed, then a LayerNorm "
            "with weight and bias), which method='factored' relies on: use "
            "vocabulary_changes(..., method='direct')."
        )


class _VocabularyTables:
    """The first layer's ``q, k, v`` of every vocabulary token at any position, for one model
    on one device, float64 (eq. :eq:`eq-vocab-factored`).

    BERT's embedding row of token ``v`` at position ``i`` (segment 0) is
    ``e_{vi} = γ⊙(ŵ_v + ĉ_i)/σ_{vi} + β`` with ``ŵ_v`` the centred word embedding, ``ĉ_i``
    the centred sum of the position-``i`` and segment-0 embeddings, ``γ, β, ε`` the
    LayerNorm's and ``σ_{vi}² = ‖ŵ_v + ĉ_i‖²/d + ε``. So with ``W = [W_Q W_K W_V]`` (all heads,
    ``d × 3d``) and ``b`` their biases, ``e_{vi} W + b = [A_v + (ĉ_i⊙γ) W]/σ_{vi} + βW + b``,
    ``A_v = (ŵ_v⊙γ) W``: the ``V × d × 3d`` product ``A`` is made once, row by row as
    candidates first need it, and serves every position and text; a position then costs
    ``O(V·d)`` for the rows, ``σ_{vi}`` and ``q, k, v``. ``emb64`` is a float64 copy of the
    model's own embedding module (the
    rows of the text itself, the ``direct`` method, and the check of
    :func:`_check_factored`). Rebuilt by :func:`_tables` when the model's parameters change
    (:func:`_is_current`).
    ``nbytes``: the float64 arrays held (the copy, ``W``, and ``A`` in full once set up)."""

    def __init__(self, enc: Encoder, dev: torch.device):
        emb = enc.model.embeddings
        self.dev = dev
        self.emb64 = copy.deepcopy(emb).to(dev, torch.float64).eval()
        self.H, self.dh = enc.heads, enc.hidden // enc.heads
        # the heads' blocks in order, as head_weights slices them: the model's own layout
        W, b = _live_qkv(enc)
        self.W = W.to(dev, torch.float64)  # (d, 3d)
        self.b = b.to(dev, torch.float64)  # (3d,)
        self.A = None
        self.nbytes = 8 * (sum(p.numel() for p in self.emb64.parameters()) + self.W.numel())

    def build(self) -> None:
        """Set up ``A`` (and ``‖ŵ_v‖``) if not yet done; their rows are filled on first use
        (:meth:`fill`), so a search over a subset of the vocabulary pays for that subset."""
        if self.A is not None:
            return
        _check_embedding_layer(self.emb64, self.W.shape[0])
        ln = self.emb64.LayerNorm
        self.gamma, self.beta, self.eps = ln.weight.detach(), ln.bias.detach(), float(ln.eps)
        self.shift = self.beta @ self.W + self.b
        Wd = self.emb64.word_embeddings.weight.detach()
        V = Wd.shape[0]
        self.mean = Wd.mean(1)  # (V,)
        self.A = torch.empty(3 * self.H, V, self.dh, dtype=torch.float64, device=self.dev)
        self.wnorm = torch.empty(V, dtype=torch.float64, device=self.dev)
        self.filled = torch.zeros(V, dtype=torch.bool, device=self.dev)
        self.fill_seconds = 0.0
        self.nbytes += 8 * (self.A.numel() + 2 * V)

    def fill(self, t: torch.Tensor, chunk: int = 4096) -> None:
        """Make the rows ``A_v = (ŵ_v⊙γ) W`` and ``‖ŵ_v‖`` of the tokens ``t`` not made yet."""
        import time

        need = t[~self.filled[t]].unique()
        if len(need) == 0:
            return
        t0 = time.perf_counter()
        Wd = self.emb64.word_embeddings.weight.detach()
        for j in range(0, len(need), chunk):
            c = need[j : j + chunk]
            Wc = Wd[c] - self.mean[c, None]  # ŵ_v
            self.wnorm[c] = torch.linalg.vector_norm(Wc, dim=1)
            self.A[:, c] = self._heads_layout((Wc * self.gamma) @ self.W)  # (3H, c, dh)
        self.filled[need] = True
        self.fill_seconds += time.perf_counter() - t0

    def centred_position(self, position: int) -> torch.Tensor:
        c = (
            self.emb64.position_embeddings.weight.detach()[position]
            + self.emb64.token_type_embeddings.weight.detach()[0]
        )
        return c - c.mean()  # ĉ_i

    def _heads_layout(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, 3d)`` → ``(3·heads, b, d_h)``: ``q`` of head ``h`` is entry ``h``, ``k`` entry
        ``heads + h``, ``v`` entry ``2·heads + h``."""
        return x.reshape(len(x), 3 * self.H, self.dh).transpose(0, 1)

    def factored(self, position: int) -> Callable:
        """``(t, rows, qkv) ↦ None`` at ``position`` by eq. :eq:`eq-vocab-factored`: writes
        the rows ``(b, d)`` and the ``q, k, v`` ``(3·heads, b, d_h)`` of the tokens ``t`` into
        the given buffers (from slices of the tables when ``t`` is a range). A candidate whose
        cancellation ratio ``(‖ŵ_v‖ + ‖ĉ_i‖)/‖ŵ_v + ĉ_i‖`` exceeds ``_CANCEL_MAX`` gets
        ``((ŵ_v + ĉ_i)⊙γ) W`` formed directly instead. Why: the rounding errors of ``A_v``
        and ``(ĉ_i⊙γ)W`` scale with ``‖ŵ_v‖`` and ``‖ĉ_i‖``, the direct product's with
        ``‖ŵ_v + ĉ_i‖``, so the factored
        sum's bound is at most that ratio times the direct one's (first order, as in
        :func:`_check_factored`, whose tolerance carries the parts' sizes and so holds for
        any ratio). ``16`` is a choice, not derived: it gives up at most 4 of float64's 53
        bits against the direct product (on the embedded model, every 97th token at position 3
        has a ratio ``≤ 1.6``: the fallback is for unusual tables)."""
        ch = self.centred_position(position)
        ch_norm = torch.linalg.vector_norm(ch)
        cq = self._heads_layout(((ch * self.gamma) @ self.W)[None])  # (3H, 1, dh)
        shift = self._heads_layout(self.shift[None])
        Wd = self.emb64.word_embeddings.weight.detach()
        d = Wd.shape[1]

        def rows_of(t: torch.Tensor, rows: torch.Tensor, qkv: torch.Tensor) -> None:
            self.fill(t)
            lo, hi = int(t[0]), int(t[-1]) + 1
            span = slice(lo, hi) if hi - lo == len(t) and bool((t[1:] > t[:-1]).all()) else t
            torch.sub(Wd[span], self.mean[span, None], out=rows)
            a = rows.add_(ch)  # ŵ_v + ĉ_i
            a_norm = torch.linalg.vector_norm(a, dim=1, keepdim=True)
            sig = torch.sqrt(a_norm**2 / d + self.eps)  # σ_{vi}
            if isinstance(span, slice):
                torch.add(self.A[:, span], cq, out=qkv)
            else:
                torch.index_select(self.A, 1, t, out=qkv).add_(cq)
            qkv.div_(sig[None]).add_(shift)
            bad = (self.wnorm[span] + ch_norm) > _CANCEL_MAX * a_norm[:, 0]
            if bool(bad.any()):
                qkv[:, bad] = self._heads_layout(
                    (a[bad] * self.gamma) @ self.W / sig[bad] + self.shift
                )
            a.mul_(self.gamma).div_(sig).add_(self.beta)  # the rows

        return rows_of

    def direct(self, position: int) -> Callable:
        """The same at ``position`` the plain way: the float64 copy of the model's own
        embedding module for every candidate, then ``rows W + b`` (``O(d·3d)`` per candidate
        and position)."""

        def rows_of(t: torch.Tensor, rows: torch.Tensor, qkv: torch.Tensor) -> None:
            pos = torch.full((len(t), 1), position, dtype=torch.long, device=self.dev)
            rows.copy_(
                self.emb64(
                    input_ids=t[:, None], position_ids=pos, token_type_ids=torch.zeros_like(pos)
                )[:, 0]
            )
            qkv.copy_(self._heads_layout(rows @ self.W + self.b))

        return rows_of


def _same(live: torch.Tensor, copy64: torch.Tensor, chunk: int = 4096) -> bool:
    """Whether the model's parameter ``live`` equals its cached float64 copy exactly (the copy
    was made by an exact conversion, so any change of ``live`` shows), in row chunks so that
    no full float64 copy of a large table is made."""
    if tuple(live.shape) != tuple(copy64.shape):
        return False
    live = live.detach().reshape(len(live), -1) if live.dim() else live.detach().reshape(1, 1)
    copy64 = copy64.reshape(live.shape)
    return all(
        torch.equal(live[j : j + chunk].to(copy64.device, torch.float64), copy64[j : j + chunk])
        for j in range(0, len(live), chunk)
    )


def _live_qkv(enc: Encoder) -> tuple:
    """The first layer's ``[W_Q W_K W_V]`` (``d × 3d``, all heads in order) and biases, as
    the model holds them now (not copied)."""
    att = enc.model.encoder.layer[0].attention.self
    lins = (att.query, att.key, att.value)
    return (
        torch.cat([lin.weight.detach().T for lin in lins], 1),
        torch.cat([lin.bias.detach() for lin in lins]),
    )


def _is_current(tab: "_VocabularyTables", enc: Encoder) -> bool:
    """Whether ``tab`` still describes ``enc``'s model: every parameter and buffer of its
    embedding module, the LayerNorm's ``ε``, and the first layer's query, key and value
    weights and biases equal the cached float64 copies exactly. Compared at every call
    (``O(V·d)``, no float64 copy of a whole table), so changes made in place in any way
    (``p.add_``, ``p.data.add_``, ``load_state_dict``, ``model.to``) are seen; only changes
    that leave these tensors and ``ε`` unchanged but alter the modules' code are not."""
    emb, emb64 = enc.model.embeddings, tab.emb64
    live = dict(emb.named_parameters()) | dict(emb.named_buffers())
    held = dict(emb64.named_parameters()) | dict(emb64.named_buffers())
    if type(emb) is not type(emb64) or live.keys() != held.keys():
        return False
    if getattr(getattr(emb, "LayerNorm", None), "eps", None) != getattr(
        getattr(emb64, "LayerNorm", None), "eps", None
    ):
        return False
    for name, p in live.items():
        q = held[name]
        if p.is_floating_point():
            if not _same(p, q):
                return False
        elif not torch.equal(p.detach().to(q.device), q):
            return False
    W, b = _live_qkv(enc)
    return _same(W.T, tab.W.T) and _same(b, tab.b)


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tables(enc: Encoder, dev: torch.device) -> _VocabularyTables:
    """The :class:`_VocabularyTables` of ``enc``'s model on ``dev``, cached (one per model,
    keyed by the model object itself through a weak reference: the entry goes when the model
    is freed, and a new model never finds an old model's tables). Rebuilt when
    :func:`_is_current` finds the embedding module or the first layer's ``W_Q, W_K, W_V``
    changed, or when ``dev`` differs."""
    att = getattr(
        getattr(getattr(enc.model, "encoder", None), "layer", [None])[0], "attention", None
    )
    if not (
        hasattr(enc.model, "embeddings")
        and all(
            isinstance(getattr(getattr(att, "self", None), w, None), torch.nn.Linear)
            for w in ("query", "key", "value")
        )
    ):
        raise ValueError(
            f"vocabulary_changes needs a BERT-family model (an `embeddings` "
            f"module and encoder.layer[0].attention.self.query/key/value), got "
            f"{type(enc.model).__name__}; neither method applies to it."
        )
    tab = _TABLES.get(enc.model)
    if tab is None or tab.dev != dev or not _is_current(tab, enc):
        _TABLES.pop(enc.model, None)
        tab = _TABLES[enc.model] = _VocabularyTables(enc, dev)
    return tab


def free_vocabulary_tables(enc=None) -> int:
    """Free the tables that :func:`vocabulary_changes` caches (for ``enc``'s model, or for
    every model when ``enc`` is None) and return the bytes they held. They are otherwise held
    as long as their model lives, and :func:`wsutils.text.embeddings.load_model` keeps the models
    it loads for the whole process: about ``8·(V·3d + (V + P + T)·d + 3d²)`` bytes per model
    (``P`` positions, ``T`` segments; 0.72 GiB for ``bert-base-uncased``, 0.35 GiB for the
    embedded model)."""
    if enc is None:
        freed = sum(t.nbytes for t in _TABLES.values())
        _TABLES.clear()
        return int(freed)
    tab = _TABLES.pop(_encoder(enc).model, None)
    return 0 if tab is None else int(tab.nbytes)


def _check_factored(tab: _VocabularyTables, rows, t: torch.Tensor, position: int) -> None:
    """The guard of eq. :eq:`eq-vocab-factored`: for the candidates ``t``, its rows and
    ``q, k, v`` against the model's own embedding module (float64 copy) and ``rows W + b``.

    Rounding model (first order in the unit roundoff ``u``; Higham's bound for a sum of ``m``
    terms, error ``≤ m·u·Σ|terms|``): with ``s = max_k(|w_k| + |p_k| + |t_k|)`` for the row's
    word, position and segment embeddings and ``r = s/σ``, each of the two evaluations of a
    LayerNorm row has its centred sum within ``(d + 6)·u·s``, ``σ`` within relative
    ``(d + 6)·u·(r + 1)`` (using ``mean|â| ≤ σ``), hence every entry within
    ``(d + 9)·u·(‖γ‖_∞·r·(3 + 2r) + ‖β‖_∞)`` of the exact value; the two differ by at most
    twice that (``tol``). Their products with ``W`` then differ by at most ``tol·Σ_k|W_km|``
    plus twice the dot-product bound ``(d + 4)·u·(|terms|·|W|)``. A model whose embedding
    layer is not of this form misses by far more (e.g. a different ``ε`` or a missing
    segment embedding moves rows by ``≳ 10⁻⁶``)."""
    Wd = tab.emb64.word_embeddings.weight.detach()
    d = Wd.shape[1]
    p = tab.emb64.position_embeddings.weight.detach()[position]
    s0 = tab.emb64.token_type_embeddings.weight.detach()[0]
    r_f, r_m = (torch.empty(len(t), d, dtype=torch.float64, device=tab.dev) for _ in "fm")
    qkv_f, qkv_m = (
        torch.empty(3 * tab.H, len(t), tab.dh, dtype=torch.float64, device=tab.dev) for _ in "fm"
    )
    rows(t, r_f, qkv_f)
    tab.direct(position)(t, r_m, qkv_m)
    w = Wd[t]
    s = (w.abs() + p.abs() + s0.abs()).amax(1, keepdim=True)
    w_c, c_c = w - w.mean(1, keepdim=True), tab.centred_position(position)  # ŵ_v, ĉ_i
    a = w_c + c_c
    sig = torch.sqrt((a * a).mean(1, keepdim=True) + tab.eps)
    r = s / sig
    tol = 2 * (d + 9) * _U64 * (tab.gamma.abs().max() * r * (3 + 2 * r) + tab.beta.abs().max())
    Wabs = tab.W.abs()
    parts = w_c.abs() + c_c.abs()
    tol_qkv = tol * Wabs.sum(0) + 2 * (d + 4) * _U64 * (
        (parts * tab.gamma.abs() / sig + tab.beta.abs() + r_m.abs()) @ Wabs + tab.b.abs()
    )
    tol_qkv = tab._heads_layout(tol_qkv)
    if not (
        bool(((r_f - r_m).abs() <= tol).all()) and bool(((qkv_f - qkv_m).abs() <= tol_qkv).all())
    ):
        worst = (
            float(((r_f - r_m).abs() / tol).max()),
            float(((qkv_f - qkv_m).abs() / tol_qkv).max()),
        )
        raise ValueError(
            "the model's embedding layer does not compute "
            "LayerNorm(word + position + segment) row by row as "
            f"method='factored' assumes (rows off by {worst[0]:.3g}, q, k, v by "
            f"{worst[1]:.3g} times their rounding bounds): use "
            "vocabulary_changes(..., method='direct')."
        )


def vocabulary_changes(
    enc,
    input_ids,
    position: int,
    *,
    tokens=None,
    batch: int = 2048,
    method: str = "factored",
    device=None,
) -> VocabularyChanges:
    """The realisable word sensitivity of the heads of the first layer at one position
    (:prf:ref:`def-realisable-ws`): for each candidate token ``v`` (default: the whole
    vocabulary but the token already there), replace token ``position`` of ``input_ids``
    (one text, ``[CLS]``…``[SEP]``, no padding, segment 0) by ``v`` through the model's own
    embedding layer and record ``‖φ_h(X') − φ_h(X)‖/‖φ_h(X)‖`` for every head ``h`` of
    layer 1 (:func:`head_map`), in float64: ``X`` is the float64 copy of the model's
    embedding module applied to the text.

    Exact, not a bound: the embedding output is per position, so ``X'`` is ``X`` with row
    ``position`` replaced, and only ``q_i, k_i, v_i`` change. A candidate's ``q_i, k_i, v_i``:
    ``method="factored"`` (default) by eq. :eq:`eq-vocab-factored` from tables made once per
    model (``_VocabularyTables``, ``O(V·d·3d)`` once, then ``O(d)`` per candidate,
    checked at every call against the model's own module for the token already there and up
    to 7 candidates, with a tolerance derived from float64 rounding
    (``_check_factored``); ``method="direct"``: each candidate's row
    through the float64 copy of the model's embedding module, then times ``W_Q, W_K, W_V``
    (``O(d²)`` per candidate and position; the baseline of ``benchmarks/bench_trained.py``).
    The two agree to float64 rounding. Both read the model through tables cached per model
    (``_tables``): compared exactly with the model's parameters at every call and rebuilt if
    any changed; they hold ``table_bytes`` (``8·V·3d`` for ``A`` plus the float64 copy of
    the embedding module and ``W``: 0.72 GiB for ``bert-base-uncased``) as long as the model
    lives, which for a model from :func:`wsutils.text.embeddings.load_model` is the process:
    :func:`free_vocabulary_tables` frees them. Then the scores of row and column ``i``
    (``O(n·d)`` per candidate): every other output row ``j`` moves by
    ``(ρ' − ρ)(m_j − v_i) + (1 − ρ')(v'_i − v_i)`` with ``m_j`` the mean of the other values
    under row ``j``'s weights and ``ρ``, ``ρ'`` their total weight before and after, as in
    :mod:`wsutils.estimators.attention`; batched over ``batch`` candidates.

    Raises
    ------
    TypeError
        If ``input_ids`` or ``tokens`` holds non-integer ids (a float id is not rounded, a
        bool is not an id).
    ValueError
        If the text is longer than the model's ``max_position_embeddings``, ``position`` is
        not below its length, ``tokens`` is empty or outside the vocabulary, ``method`` is
        unknown, or the model's embedding layer is not BERT's (see ``method``)."""
    import time

    enc = _encoder(enc)
    if method not in ("factored", "direct"):
        raise ValueError(f"method must be 'factored' or 'direct', got {method!r}.")
    dev = torch.device(device) if device is not None else enc.device
    ids = _token_ids("input_ids", input_ids, dev)
    n = len(ids)
    _check_length(enc, n)
    position = check_int("position", position, minimum=0)
    if position >= n:
        raise ValueError(f"position must be below n = {n}, got {position}.")
    batch = check_int("batch", batch, minimum=1)
    V = int(enc.model.config.vocab_size)
    if tokens is None:
        tokens = torch.arange(V)
        tokens = tokens[tokens != int(ids[position])]
    tokens = _token_ids("tokens", tokens)
    if len(tokens) == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= V:
        raise ValueError(f"tokens must be a non-empty list of ids in [0, {V}).")
    t0 = time.perf_counter()
    f64 = torch.float64
    tab = _tables(enc, dev)
    i, H, dh, d = position, tab.H, tab.dh, enc.hidden
    if method == "factored":
        with torch.no_grad():  # the table rows first: (4096 × d)(d × 3d) products, threaded
            tab.build()
            filled = tab.fill_seconds
            tab.fill(tokens.to(dev))
    # one batch's largest arrays are (heads, batch, n): below ~4M entries every operation is
    # short, and with two threads on a loaded machine each one waits for the other (measured
    # on the embedded model, n = 32: 5.6 s per position with 2 threads, 1.4 s with 1)
    with torch.no_grad(), small_work_threads(H * min(batch, len(tokens)) * max(n, dh)):
        if method == "factored":
            rows_of = tab.factored(i)
            guard = torch.cat(
                [
                    ids[i : i + 1],
                    tokens[torch.linspace(0, len(tokens) - 1, min(7, len(tokens))).long()].to(dev),
                ]
            )
            _check_factored(tab, rows_of, guard, i)
        else:
            rows_of = tab.direct(i)
        X = tab.emb64(input_ids=ids[None], token_type_ids=torch.zeros_like(ids)[None])[0]
        # the candidates' rows are made with position_ids = i: the module must number the
        # text's positions 0..n-1 by itself (RoBERTa's starts at padding_idx + 1). The same
        # module on the same inputs and shapes, so equal unless the numbering differs.
        if not torch.equal(
            X,
            tab.emb64(
                input_ids=ids[None],
                position_ids=torch.arange(n, device=dev)[None],
                token_type_ids=torch.zeros_like(ids)[None],
            )[0],
        ):
            raise ValueError(
                "the model's embedding module does not number a text's "
                "positions 0..n-1 (as BERT's does; e.g. RoBERTa's counts from "
                "padding_idx + 1): vocabulary_changes supports BERT's numbering "
                "only, by either method."
            )
        Q, K, Vv = tab._heads_layout(X @ tab.W + tab.b).split(H)  # (H, n, dh)
        sc = 1 / math.sqrt(dh)
        s = Q @ K.transpose(-1, -2) * sc  # (H, n, n)
        base = torch.softmax(s, -1) @ Vv  # (H, n, dh)
        base_norm = torch.linalg.vector_norm(base.flatten(1), dim=1)[:, None]  # (H, 1)
        xi_norm = torch.linalg.vector_norm(X[i])
        # rows j ≠ i: m_j, the mean of the other values under row j's weights (formed
        # directly, no cancellation), ℓ_j = log Σ_{k≠i} exp s_jk, and ‖m_j − v_i‖²
        s_oth = s.clone()
        s_oth[..., i] = -math.inf
        lse = torch.logsumexp(s_oth, -1)[:, None]  # (H, 1, n)
        Mv = torch.softmax(s_oth, -1) @ Vv - Vv[:, i : i + 1]  # m_j − v_i
        Mv2 = (Mv**2).sum(-1)[:, None]  # (H, 1, n)
        b_arg = lse - s[:, None, :, i]  # ρ = σ(b)
        rho, rho_c = torch.sigmoid(b_arg), torch.sigmoid(-b_arg)  # ρ, 1 − ρ
        Qs_T, Ks_T, Mv_T = (x.transpose(1, 2) for x in (Q * sc, K * sc, Mv))
        base_i = base[:, i : i + 1]
        values = torch.empty(H, len(tokens), dtype=f64, device=dev)
        dist = torch.empty(len(tokens), dtype=f64, device=dev)
        work: dict[int, tuple] = {}  # the arrays of one batch, made once per batch size
        for j in range(0, len(tokens), batch):
            t = tokens[j : j + batch].to(dev)
            b = len(t)
            if b not in work:
                work[b] = (
                    torch.empty(b, d, dtype=f64, device=dev),  # rows
                    torch.empty(3 * H, b, dh, dtype=f64, device=dev),  # q, k, v
                    *(torch.empty(H, b, dh, dtype=f64, device=dev) for _ in "do"),
                    *(torch.empty(H, b, n, dtype=f64, device=dev) for _ in "agct"),
                )
            rows, qkv, dv, out_i, a_arg, g, cross, sm = work[b]
            rows_of(t, rows, qkv)  # (b, d), (3H, b, dh)
            q, k, v = qkv.split(H)  # (H, b, dh)
            torch.sub(v, Vv[:, i : i + 1], out=dv)  # v'_i − v_i
            # rows j ≠ i: a = ℓ_j − s'_ji, ρ' = σ(a); ρ' − ρ = σ(a)(1 − ρ) − ρ σ(−a)
            torch.baddbmm(lse, k, Qs_T, alpha=-1, out=a_arg)  # (H, b, n)
            torch.sigmoid(a_arg, out=g).mul_(rho_c)
            w = a_arg.neg_().sigmoid_()  # 1 − ρ'
            g.addcmul_(w, rho, value=-1)  # ρ' − ρ
            torch.bmm(dv, Mv_T, out=cross)  # (m_j − v_i)·dv
            sq = cross.mul_(w).mul_(2).addcmul_(g, Mv2).mul_(g)  # g²‖·‖² + 2gw(·)
            sq.addcmul_(w.mul_(w), (dv * dv).sum(-1, keepdim=True))  # + w²‖dv‖²
            sq[..., i] = 0
            sq = sq.sum(-1)  # (H, b): j ≠ i
            # row i: the new query against the new keys, then its new output
            torch.bmm(q, Ks_T, out=sm)  # (H, b, n)
            sm[..., i] = (q * k).sum(-1) * sc
            sm.sub_(sm.amax(-1, keepdim=True)).exp_()
            sm.div_(sm.sum(-1, keepdim=True))  # softmax
            torch.bmm(sm, Vv, out=out_i).addcmul_(sm[..., i : i + 1], dv).sub_(base_i)
            sq += out_i.mul_(out_i).sum(-1)
            torch.div(sq.clamp_min_(0).sqrt_(), base_norm, out=values[:, j : j + b])
            torch.div(
                torch.linalg.vector_norm(rows.sub_(X[i]), dim=-1), xi_norm, out=dist[j : j + b]
            )
        # one batch's arrays: rows, q, k, v, dv, out_i and two temporaries (dv², q·k): 8·b·d;
        # a, g, cross, e: 4·b·heads·n; direct: the module's temporaries too (its gather, two
        # sums, LayerNorm, rows·W: 7·b·d)
        B = min(batch, len(tokens))
        peak = 8 * ((8 if method == "factored" else 15) * B * d + 4 * B * H * n)
    return VocabularyChanges(
        position=position,
        original=int(ids[position]),
        tokens=tokens.numpy(),
        values=values.cpu().numpy(),
        dist=dist.cpu().numpy(),
        seconds=time.perf_counter() - t0,
        peak_bytes=int(tab.nbytes + peak),
        table_bytes=int(tab.nbytes),
        table_seconds=tab.fill_seconds - filled if method == "factored" else 0.0,
    )


def _encoder_digest(enc: Encoder) -> str:
    """One SHA-256 of :func:`wsutils.text.embeddings.model_key` (configuration, tokenizer and
    live parameters): what a worker's copy of the model must match."""
    import json

    return hashlib.sha256(json.dumps(model_key(enc), sort_keys=True).encode()).hexdigest()


def _review_vocabulary(
    model,
    text: str,
    n: int,
    positions: Sequence[int],
    tokens,
    batch: int,
    digest: str | None = None,
) -> tuple[list, list, float]:
    """One text of :func:`vocabulary_search` (module level, so that a process pool can run
    it; ``model``: the Encoder, or its name in a worker): its ids, one
    :class:`VocabularyChanges` per position, and this call's CPU time. ``digest``: the
    caller's :func:`_encoder_digest`; a worker whose model differs refuses (``O(parameters)``
    once per text)."""
    import time

    c0 = time.process_time()
    enc = _encoder(model)
    if digest is not None and _encoder_digest(enc) != digest:
        raise ValueError(
            f"this worker's copy of {enc.name} differs from the caller's model (its "
            "parameters, configuration or tokenizer were changed in memory after "
            "the workers loaded it from disk or forked): pass executor=None, or "
            "save the changed model with save_pretrained and load that folder, "
            "then make a new pool."
        )
    ids = enc.tokenizer(text, truncation=True, max_length=n)["input_ids"]
    if len(ids) != n:
        raise ValueError(
            f"a text has {len(ids)} tokens, fewer than n = {n}: pass texts of at "
            f"least n − 2 WordPiece tokens."
        )
    out = []
    for i in positions:
        tok = None if tokens is None else tokens[tokens != ids[i]]
        out.append(vocabulary_changes(enc, ids, i, tokens=tok, batch=batch))
    return ids, out, time.process_time() - c0


#: Texts of a :func:`vocabulary_search` that failed part-way (a killed pool worker, an
#: interrupt), keyed by everything that determines them (:func:`_text_key`), so that a rerun
#: resumes; an entry goes when a rerun uses it.
_FINISHED_CACHE: dict[str, tuple] = {}


def _text_key(digest: str, text: str, n: int, positions, tokens, batch: int) -> str:
    h = hashlib.sha256()
    for part in (digest, text, str(n), repr(list(positions)), str(batch)):
        b = part.encode()
        h.update(len(b).to_bytes(8, "little") + b)
    h.update(b"none" if tokens is None else np.ascontiguousarray(tokens, np.int64).tobytes())
    return h.hexdigest()


def vocabulary_search(
    enc,
    texts: Sequence[str],
    n: int,
    positions: Sequence[int],
    *,
    tokens=None,
    batch: int = 2048,
    executor=None,
) -> tuple[list, float]:
    """:func:`vocabulary_changes` at each of ``positions`` of each text of ``texts``, cut to
    ``n`` tokens by the model's tokenizer (``[CLS]`` … ``[SEP]``; a shorter text is a
    ``ValueError``): the realisable word sensitivity's search over a set of review-positions
    (:prf:ref:`def-realisable-ws`). ``tokens``: the candidate ids (at each position the token
    already there is left out), or ``None`` for the whole vocabulary.

    ``executor``: a ``concurrent.futures`` process pool (e.g. of one-thread workers) over
    which the texts are spread; each worker reads the model by its name
    (:func:`wsutils.text.embeddings.load_model`: inherited from this process under ``fork``,
    loaded once per worker otherwise) and holds its own copy of the tables. Each worker
    checks that its model is the caller's (:func:`wsutils.text.embeddings.model_key`: the live
    parameters, configuration and tokenizer; ``O(parameters)`` per text) and refuses
    otherwise, so pooled and in-process results are the same numbers.

    Resuming. If the call fails part-way (a killed worker: ``BrokenProcessPool``; an
    interrupt), the texts already finished are kept in this process, keyed by the model's
    digest, the text, ``n``, ``positions``, ``tokens`` and ``batch``, and the error says how
    many: the same call again (with a new pool, or none) computes only the others.

    Returns ``[(text index, ids, VocabularyChanges), …]`` in the order (text, position), the
    same with or without an executor, and the CPU seconds of the calls (``process_time``
    summed over the calls: the processes' CPU time with a process pool; a thread pool would
    count a process's time once per thread; a resumed text counts its first run's).

    Raises
    ------
    TypeError
        If ``tokens`` holds non-integer ids (``10.7`` is not rounded to 10).
    ValueError
        If ``texts`` or ``positions`` is empty, a position is not below ``n``, ``n`` exceeds
        the model's ``max_position_embeddings``, a text has fewer than ``n`` tokens, the
        executor's workers cannot load ``enc`` by its name (not from ``load_model``), or a
        worker's copy of the model differs from ``enc`` (changed in memory).
    concurrent.futures.process.BrokenProcessPool
        If a worker died; the message says how many texts were kept for the rerun.
    """
    enc = _encoder(enc)
    n = check_int("n", n, minimum=3)
    positions = [check_int("positions[]", i, minimum=0) for i in positions]
    if not texts or not positions or max(positions) >= n:
        raise ValueError(f"pass at least one text and positions in [0, {n}).")
    _check_length(enc, n)
    if tokens is not None:
        tokens = _token_ids("tokens", tokens).numpy()
    texts = list(texts)
    digest = _encoder_digest(enc)
    keys = [_text_key(digest, t, n, positions, tokens, batch) for t in texts]
    done: dict[int, tuple] = {
        r: _FINISHED_CACHE[k] for r, k in enumerate(keys) if k in _FINISHED_CACHE
    }
    todo = [r for r in range(len(texts)) if r not in done]
    if executor is not None:
        try:
            same = load_model(enc.name) is enc
        except (OSError, RuntimeError, ValueError):  # the name loads nothing
            same = False
        if not same:
            raise ValueError(
                "with an executor, the workers load the model by its name: pass "
                "the Encoder that wsutils.text.embeddings.load_model returned for it "
                "(not, e.g., a random_model), or executor=None."
            )
    try:
        if executor is None:
            for r in todo:
                done[r] = _review_vocabulary(enc, texts[r], n, positions, tokens, batch)
        else:
            from concurrent.futures import as_completed

            futures = {
                executor.submit(
                    _review_vocabulary, enc.name, texts[r], n, positions, tokens, batch, digest
                ): r
                for r in todo
            }
            try:
                for fut in as_completed(futures):
                    done[futures[fut]] = fut.result()
            finally:
                for fut in futures:
                    fut.cancel()
    except BaseException as err:
        for r, res in done.items():
            _FINISHED_CACHE[keys[r]] = res
        kept = f"{len(done)} of {len(texts)} texts finished and kept: the same call resumes"
        from concurrent.futures.process import BrokenProcessPool

        if isinstance(err, BrokenProcessPool):
            raise BrokenProcessPool(f"{err} ({kept} with a new pool or executor=None).") from err
        if hasattr(err, "add_note"):
            err.add_note(f"vocabulary_search: {kept}.")
        raise
    for k in keys:
        _FINISHED_CACHE.pop(k, None)
    found = [(r, done[r][0], vc) for r in range(len(texts)) for vc in done[r][1]]
    return found, float(sum(done[r][2] for r in range(len(texts))))


def substitution_changes(enc, input_ids, position: int, tokens, *, batch: int = 64) -> np.ndarray:
    """For each token ``v`` of ``tokens``: the text ``input_ids`` with token ``position``
    replaced by ``v``, run through the whole model (its own embeddings and layers, float32);
    returns ``(len(tokens), L)`` float64, entry ``[v, ℓ − 1]`` the relative change
    ``‖H_ℓ' − H_ℓ‖/‖H_ℓ‖`` of the hidden states of layer ``ℓ`` (all positions).
    For ``ℓ ≥ 2`` every row of the layer's input changes, so these are full forward passes,
    on the model's device (:func:`wsutils.text.embeddings.load_model` ``device=``).

    Raises
    ------
    TypeError
        If ``input_ids`` or ``tokens`` holds non-integer ids.
    ValueError
        If the text is longer than the model's ``max_position_embeddings`` or ``position``
        is not below its length."""
    enc = _encoder(enc)
    ids = _token_ids("input_ids", input_ids, enc.device)
    _check_length(enc, len(ids))
    position = check_int("position", position, minimum=0)
    if position >= len(ids):
        raise ValueError(f"position must be below n = {len(ids)}, got {position}.")
    tokens = _token_ids("tokens", tokens)
    out = []
    with torch.no_grad():
        H = torch.stack(
            enc.model(input_ids=ids[None], output_hidden_states=True).hidden_states[1:]
        ).double()  # (L, 1, n, d)
        for j in range(0, len(tokens), batch):
            t = tokens[j : j + batch].to(enc.device)
            b = ids.expand(len(t), -1).clone()
            b[:, position] = t
            Hs = torch.stack(
                enc.model(input_ids=b, output_hidden_states=True).hidden_states[1:]
            ).double()  # (L, B, n, d)
            num = torch.linalg.vector_norm((Hs - H).flatten(2), dim=-1)
            out.append((num / torch.linalg.vector_norm(H.flatten(2), dim=-1)).T)
    return torch.cat(out).cpu().numpy()


def pair_changes(enc, pairs) -> dict[str, np.ndarray]:
    """The real change of the model on one-word-different sentence pairs
    (:class:`wsutils.text.attention.Pair`, e.g. :func:`wsutils.text.attention.one_word_pairs`):
    for each pair, ``heads`` ``(P, heads)``: the relative change of every head of layer 1
    (:func:`head_map` on the embedding output); ``layers`` ``(P, L)``: the relative change of
    the hidden states of every layer (all positions); ``dist`` ``(P,)``:
    ``‖x'_j − x_j‖/‖x_j‖`` for the changed row ``j`` of the embedding output (``≤ 1``: inside
    the own-norm ball of :prf:ref:`def-own-norm-ws`). Batched by sentence length; runs on the
    model's device."""
    enc = _encoder(enc)
    heads = [head_map(head_weights(enc, 1, h)) for h in range(enc.heads)]
    P = len(pairs)
    out = {
        "heads": np.empty((P, enc.heads)),
        "layers": np.empty((P, enc.layers)),
        "dist": np.empty(P),
    }
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
        rel = torch.linalg.vector_norm((hb - ha).flatten(2), dim=-1) / torch.linalg.vector_norm(
            ha.flatten(2), dim=-1
        )  # (L + 1, B)
        out["layers"][ks] = rel[1:].T.cpu().numpy()
        for h, phi in enumerate(heads):
            ya, yb = phi(ha[0]), phi(hb[0])
            out["heads"][ks, h] = (
                (
                    torch.linalg.vector_norm((yb - ya).flatten(1), dim=-1)
                    / torch.linalg.vector_norm(ya.flatten(1), dim=-1)
                )
                .cpu()
                .numpy()
            )
        j = torch.tensor([pairs[k].j for k in ks], device=enc.device)
        r = torch.arange(len(ks), device=enc.device)
        out["dist"][ks] = (
            (
                torch.linalg.vector_norm(hb[0, r, j] - ha[0, r, j], dim=-1)
                / torch.linalg.vector_norm(ha[0, r, j], dim=-1)
            )
            .cpu()
            .numpy()
        )
    return out


class _HeadsObjective:
    """:class:`_HeadObjective` for several heads at once: search index ``k`` is head
    ``k // n``, row ``k % n`` (one batch for all the heads of a layer)."""

    def __init__(self, heads: Sequence[Head], X: torch.Tensor, r: torch.Tensor):
        self.n = X.shape[0]
        self.r = r.to(X.dtype)[:, 0]

        def stack(name):
            return torch.stack([getattr(h, name) for h in heads]).to(X)

        self.WQ, self.WK, self.WV = stack("W_Q"), stack("W_K"), stack("W_V")  # (H, d, dh)
        self.scale = 1 / math.sqrt(heads[0].d_h)
        with torch.no_grad():
            self.Q = X @ self.WQ + stack("b_Q")[:, None]  # (H, n, dh)
            self.K = X @ self.WK + stack("b_K")[:, None]
            self.V = X @ self.WV + stack("b_V")[:, None]
            self.base = torch.softmax(self.Q @ self.K.transpose(-1, -2) * self.scale, -1) @ self.V
            self.base_norm = torch.linalg.vector_norm(self.base.flatten(1), dim=1)  # (H,)

    def __call__(self, idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        h, i = idx // self.n, idx % self.n
        D = (Delta * self.r[i][:, None])[:, None]  # (B, 1, d)
        one = torch.nn.functional.one_hot(i, self.n).to(Delta.dtype)[:, :, None]
        Q = self.Q[h] + one * (D @ self.WQ[h])
        K = self.K[h] + one * (D @ self.WK[h])
        V = self.V[h] + one * (D @ self.WV[h])
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale, -1) @ V
        diff = (out - self.base[h]).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm[h]


def heads_word_sensitivity(
    heads: Sequence[Head],
    X: Array,
    *,
    rows=None,
    starts: int = 2,
    steps: int = 20,
    seed: int = 0,
    lr: float = 0.5,
    dtype: torch.dtype = torch.float32,
    max_batch_elements: int = 2**23,
    device=None,
) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of several heads at the same ``X``, one value
    per head: the search of :func:`head_word_sensitivity` (same starts, steps and step sizes)
    for all the heads in one batch (so its random starts differ from separate calls), every
    value recomputed with :func:`head_map` in float64 at the best ``Δ`` of each head."""
    heads = list(heads)
    if not heads:
        raise ValueError("heads is empty: pass at least one Head.")
    Z, _, r = own_norm_problem(head_map(heads[0]), X, device=device)
    n = Z.shape[0]
    Zs, row_list, _ = search_setup(
        Z.to(dtype), rows=rows, starts=starts, steps=steps, check_norms=False, device=device
    )
    seed, lr = check_seed(seed), check_lr(lr)
    obj = _HeadsObjective(heads, Zs * r.to(Zs), r.to(Zs))
    dummy = Zs.expand(len(heads), -1, -1).reshape(len(heads) * n, -1)  # index h·n + i
    idx = [h * n + i for h in range(len(heads)) for i in row_list]
    found = ascend_rows(
        lambda chunk: obj,
        dummy,
        idx,
        starts=starts,
        steps=steps,
        seed=seed,
        extra=None,
        lr=lr,
        max_batch_elements=max_batch_elements,
        progress=False,
    )
    out = np.empty(len(heads))
    for h, head in enumerate(heads):
        _, phi_Z, _ = own_norm_problem(head_map(head), X, device=device)
        res = certify(
            phi_Z,
            Z.to(Zs.device),
            {i: found[h * n + i] for i in row_list},
            starts=starts,
            steps=steps,
            seed=seed,
            max_batch_elements=max_batch_elements,
        )
        out[h] = res.value
    return out


def head_grid(
    enc,
    inputs,
    rows,
    *,
    control: bool = False,
    starts: int = 2,
    steps: int = 20,
    seed: int = 0,
    device=None,
) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of every head of every layer, ``(L, heads)``:
    ``inputs`` is ``(L + 1, n, d)`` (one text, :func:`layer_inputs`); the heads of layer
    ``ℓ`` are searched at ``inputs[ℓ − 1]`` over ``rows`` by :func:`heads_word_sensitivity`
    (seed :func:`wsutils.run.seeds.point_seed` ``(seed, ℓ)``). ``control=True`` searches
    :func:`random_head` of each head instead (seed ``point_seed("random head", seed, ℓ, h)``)."""
    from ..run.seeds import point_seed

    enc = _encoder(enc)
    out = np.empty((enc.layers, enc.heads))
    for layer in range(1, enc.layers + 1):
        X = np.asarray(inputs[layer - 1], dtype=np.float64)
        heads = [head_weights(enc, layer, h) for h in range(enc.heads)]
        if control:
            heads = [
                random_head(hd, seed=point_seed("random head", seed, layer, hd.head))
                for hd in heads
            ]
        out[layer - 1] = heads_word_sensitivity(
            heads,
            X,
            rows=rows,
            starts=starts,
            steps=steps,
            seed=point_seed("heads", seed, layer),
            device=device,
        )
    return out
