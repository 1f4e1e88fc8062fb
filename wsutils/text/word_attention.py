"""Attention of a real BERT model between the words of a sentence (the paper's Figure 1), and
how much it moves when one word changes.

- :func:`word_attention`: the attention matrix of one layer (default: the first), averaged over
  heads, restricted to the word tokens (``[CLS]``/``[SEP]`` rows and columns dropped, *not*
  renormalised: the authors' ``attentions[0][0][:, 1:-1, 1:-1].mean(0)``).
- :func:`one_word_pairs`: real sentences from reviews and a copy with one word replaced by
  another word drawn from the same reviews, so that both tokenize to the same length.
- :func:`attention_shift`: how far the attention rows of the *other* words move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_int, check_seed
from ..maps import attention_scores, normalise_rows
from .embeddings import Encoder, token_ids

__all__ = [
    "Pair",
    "attention_shift",
    "head_averaged_attention",
    "one_word_pairs",
    "pair_shifts",
    "raf_attention",
    "word_attention",
]


def _batch_ids(enc: Encoder, input_ids) -> torch.Tensor:
    """Token ids ``(T,)`` or ``(B, T)`` as a ``(B, T)`` long tensor on the model's device, each
    in the vocabulary and ``T`` within its positions (a clear error otherwise)."""
    ids = token_ids("input_ids", input_ids, enc.device, vocab=enc.vocab_size, flat=False)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (T,) or (B, T), got shape {tuple(ids.shape)}.")
    enc.check_length(ids.shape[1])
    return ids


def head_averaged_attention(enc: Encoder, input_ids, *, layer: int = 0) -> np.ndarray:
    """Attention probabilities of ``layer`` averaged over heads, ``(B, T, T)``, for token ids
    ``(B, T)`` without padding. Layer 0 runs only the embeddings and the first self-attention
    module (the model's own code, eager); deeper layers run the model with
    ``output_attentions=True``."""
    if not 0 <= layer < enc.layers:
        raise ValueError(f"layer must be between 0 and {enc.layers - 1}, got {layer}.")
    ids = _batch_ids(enc, input_ids)
    with torch.no_grad():
        if layer == 0:
            h = enc.model.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
            _, weights = enc.model.encoder.layer[0].attention.self(h)
        else:
            out = enc.model(
                input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True
            )
            weights = out.attentions[layer] if out.attentions else None
    if weights is None:
        raise RuntimeError(
            f"{enc.name} returned no attentions: load it with "
            "attn_implementation='eager' (wsutils.text.embeddings.load_model does)."
        )
    return weights.mean(dim=1).double().cpu().numpy()


def raf_attention(enc: Encoder, input_ids, W) -> np.ndarray:
    """The attention matrix of random attention features (eq. :eq:`eq-raf`) on the model's
    layer-0 embeddings: ``softmax(X W Xᵀ/√d)`` with ``X`` the embeddings of the tokens, rows
    rescaled to norm ``√d`` (``d`` = hidden size, ``W`` a ``d × d`` matrix), ``(B, T, T)``."""
    ids = _batch_ids(enc, input_ids)
    W = torch.as_tensor(np.asarray(W, dtype=np.float64), device=enc.device)
    if W.shape != (enc.hidden, enc.hidden) or not bool(torch.isfinite(W).all()):
        raise ValueError(
            f"W must be a finite {enc.hidden} × {enc.hidden} matrix (the model's hidden size), "
            f"got shape {tuple(W.shape)}"
            + ("." if W.shape != (enc.hidden, enc.hidden) else " with NaN or inf entries.")
        )
    with torch.no_grad():
        X = enc.model.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids)).double()
        X = normalise_rows(X)
        A = torch.softmax(attention_scores(X, W.to(X.dtype)), dim=-1)
    return A.cpu().numpy()


def pair_shifts(attend, pairs) -> dict[str, np.ndarray]:
    """:func:`attention_shift` for every pair, batched by sentence length: arrays ``tv`` and
    ``rerouting`` (one value per pair, in order). ``attend`` maps token ids ``(B, T)`` to
    attention matrices ``(B, T, T)``, e.g. ``lambda ids: head_averaged_attention(enc, ids)``."""
    if not len(pairs):
        raise ValueError("pairs is empty: pass at least one Pair (e.g. from one_word_pairs).")
    out = {"tv": np.empty(len(pairs)), "rerouting": np.empty(len(pairs))}
    by_len: dict[int, list[int]] = {}
    for k, p in enumerate(pairs):
        by_len.setdefault(len(p.ids), []).append(k)
    for ks in by_len.values():
        ids = torch.tensor([x for k in ks for x in (pairs[k].ids, pairs[k].ids_changed)])
        A = attend(ids)
        for m, k in enumerate(ks):
            shift = attention_shift(A[2 * m], A[2 * m + 1], pairs[k].j)
            for key in out:
                out[key][k] = shift[key]
    return out


def word_attention(enc: Encoder, text: str, *, layer: int = 0) -> tuple[list[str], np.ndarray]:
    """The word tokens of ``text`` and the head-averaged attention among them,
    ``A[i, j]`` = weight of query word ``i`` on key word ``j`` (rows do not sum to one: the
    mass on ``[CLS]``/``[SEP]`` is left out, as in the paper's figure)."""
    ids = enc.tokenizer(text, return_tensors="pt")["input_ids"]
    if ids.shape[1] <= 2:
        raise ValueError(f"text has no word tokens besides [CLS] and [SEP]: {text!r}.")
    A = head_averaged_attention(enc, ids, layer=layer)[0]
    return enc.tokenizer.convert_ids_to_tokens(ids[0, 1:-1].tolist()), A[1:-1, 1:-1]


@dataclass(frozen=True)
class Pair:
    """Token ids (``[CLS]``/``[SEP]`` included) of a sentence and of its copy with the token at
    position ``j`` (an index into the ids) replaced."""

    ids: list[int]
    ids_changed: list[int]
    j: int


def _whole_word(tok: str) -> bool:
    return tok.isalpha() and not tok.startswith("##")


def one_word_pairs(
    texts, tokenizer, *, count: int, seed: int, min_words: int = 6, max_words: int = 20
) -> list[Pair]:
    """``count`` pairs of real sentences (from ``texts``, split at ``.``/``!``/``?``) of
    ``min_words``–``max_words`` word tokens, and the same sentence with one whole word
    (alphabetic, not split into pieces) replaced by another whole word drawn at random from the
    words of ``texts`` (by frequency). Seeded; a ValueError when too few sentences qualify."""
    count = check_int("count", count, minimum=1)
    min_words = check_int("min_words", min_words, minimum=1)
    max_words = check_int("max_words", max_words, minimum=min_words)
    rng = np.random.default_rng(check_seed(seed))
    sentences, pool = [], []
    for text in texts:
        for s in re.split(r"(?<=[.!?])\s+|<br\s*/?>", text):
            toks = tokenizer.tokenize(s)
            pool.extend(t for t in toks if _whole_word(t))
            if min_words <= len(toks) <= max_words:
                sentences.append(toks)
    if len(sentences) < count:
        raise ValueError(
            f"only {len(sentences)} sentences of {min_words}–{max_words} tokens in "
            f"the texts given; {count} pairs asked. Pass more texts or ask fewer."
        )
    pool_ids = np.array(tokenizer.convert_tokens_to_ids(pool))
    pairs = []
    for k in rng.permutation(len(sentences)):
        toks = sentences[k]
        slots = [
            i
            for i, t in enumerate(toks)
            if _whole_word(t) and not (i + 1 < len(toks) and toks[i + 1].startswith("##"))
        ]
        if not slots:
            continue
        i = int(rng.choice(slots))
        ids = tokenizer.convert_tokens_to_ids(["[CLS]", *toks, "[SEP]"])
        new = int(pool_ids[rng.integers(len(pool_ids))])
        while new == ids[i + 1]:
            new = int(pool_ids[rng.integers(len(pool_ids))])
        changed = list(ids)
        changed[i + 1] = new
        pairs.append(Pair(ids=ids, ids_changed=changed, j=i + 1))
        if len(pairs) == count:
            return pairs
    raise ValueError(f"only {len(pairs)} sentences have a whole word to replace; {count} asked.")


def attention_shift(A: np.ndarray, B: np.ndarray, j: int) -> dict[str, float]:
    """How the attention of the other words moves when token ``j`` changes, for two
    ``(T, T)`` attention matrices (``[CLS]`` first, ``[SEP]`` last). Over the query words
    ``i ≠ j``:

    - ``tv``: the mean total-variation distance ``½‖A_i − B_i‖₁`` of the full rows;
    - ``rerouting``: the same after dropping the key ``j`` and renormalising, i.e. how the
      attention *among the unchanged tokens* is redistributed (zero if only the weight on the
      changed word moved and the rest scaled uniformly).
    """
    A, B = np.asarray(A, dtype=float), np.asarray(B, dtype=float)
    T = A.shape[-1] if A.ndim else 0
    if A.shape != (T, T) or B.shape != (T, T) or T < 4 or not 0 < j < T - 1:
        raise ValueError(
            f"need two (T, T) matrices, T ≥ 4 (a query word besides j), and 0 < j < T − 1, "
            f"got {A.shape}, {B.shape}, j={j}."
        )
    if not (np.isfinite(A).all() and np.isfinite(B).all()):
        raise ValueError("A and B must be finite attention matrices: they hold NaN or inf.")
    queries = [i for i in range(1, T - 1) if i != j]
    keys = [k for k in range(T) if k != j]
    tv = 0.5 * np.abs(A[queries] - B[queries]).sum(axis=1)
    a, b = A[np.ix_(queries, keys)], B[np.ix_(queries, keys)]
    a, b = a / a.sum(axis=1, keepdims=True), b / b.sum(axis=1, keepdims=True)
    rer = 0.5 * np.abs(a - b).sum(axis=1)
    return {"tv": float(tv.mean()), "rerouting": float(rer.mean())}
