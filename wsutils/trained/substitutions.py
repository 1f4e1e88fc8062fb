"""The relative change of every layer's hidden states for substitutions and one-word sentence
pairs, by full forward passes (:mod:`wsutils.trained`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_int
from ..text.embeddings import token_ids
from ._common import _encoder
from .heads import head_map, head_weights


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
        If the text is longer than the model's ``max_position_embeddings``, ``position``
        is not below its length, an id lies outside the vocabulary, ``tokens`` is empty or
        ``batch`` is below one."""
    enc = _encoder(enc)
    V = enc.vocab_size
    ids = token_ids("input_ids", input_ids, enc.device, vocab=V)
    enc.check_length(len(ids))
    position = check_int("position", position, minimum=0)
    if position >= len(ids):
        raise ValueError(f"position must be below n = {len(ids)}, got {position}.")
    tokens = token_ids("tokens", tokens, vocab=V)
    batch = check_int("batch", batch, minimum=1)
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
    (:class:`wsutils.text.word_attention.Pair`, e.g.
    :func:`wsutils.text.word_attention.one_word_pairs`):
    for each pair, ``heads`` ``(P, heads)``: the relative change of every head of layer 1
    (:func:`head_map` on the embedding output); ``layers`` ``(P, L)``: the relative change of
    the hidden states of every layer (all positions); ``dist`` ``(P,)``:
    ``‖x'_j − x_j‖/‖x_j‖`` for the changed row ``j`` of the embedding output (``≤ 1``: inside
    the own-norm ball of :prf:ref:`def-own-norm-ws`). Batched by sentence length; runs on the
    model's device."""
    enc = _encoder(enc)
    if not len(pairs):
        raise ValueError("pairs is empty: pass at least one Pair (e.g. from one_word_pairs).")
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
