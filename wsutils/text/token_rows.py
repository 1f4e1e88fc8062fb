"""The rows one token substitution can put into a text: the real words that can flip a trained
model (scored by :func:`wsutils.generalization.word_scores`).

Layer 0 of a BERT-family model embeds each token on its own: the word, position and segment
embeddings of the token are summed and layer-normalised, row by row, with nothing mixed
across positions. So replacing token ``i`` of a text by token ``v`` changes row ``i`` of its
layer-0 embedding and no other, and that row is a function of ``(v, i)`` alone
(``tests/test_token_rows.py`` checks both against :func:`wsutils.text.embeddings.embed`). The
texts of the flip experiment are the first ``n`` rows and ``d`` coordinates of that embedding,
each row rescaled to norm ``√d`` (:func:`wsutils.text.embeddings.sample_matrix`), so a
substitution at a position ``i < n`` changes exactly row ``i`` of the text too:
``X' = X_i(x'_v − x_i)`` in the notation of :prf:ref:`def-word-sensitivity`, with ``x'_v`` the
row :func:`substitution_rows` gives. Unlike the ball of that definition, ``‖x'_v − x_i‖`` can
reach ``2√d``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import check_int
from .embeddings import Encoder, load_model, sample_matrix, token_ids

__all__ = ["check_positions", "check_vocabulary", "substitution_rows"]


def check_positions(embeddings, ids: torch.Tensor, who: str) -> torch.Tensor:
    """The layer-0 rows of the text ``ids`` (1-D) from the embedding module ``embeddings``,
    once it is seen to number a text's positions ``0..n−1`` itself, as BERT's does: a row
    built for one position with ``position_ids = i`` is then that text's row ``i``. RoBERTa's
    module numbers positions from ``padding_idx + 1``, so rows built with ``position_ids = i``
    would be off by one position (by 1.8 on rows of norm 4.5): a ValueError naming ``who``.
    The same module on the same inputs twice, with the positions given or left to it: equal
    unless the numbering differs."""
    ids = ids[None]
    zeros = torch.zeros_like(ids)
    own = embeddings(input_ids=ids, token_type_ids=zeros)
    given = embeddings(
        input_ids=ids,
        token_type_ids=zeros,
        position_ids=torch.arange(ids.shape[1], device=ids.device)[None],
    )
    if not torch.equal(own, given):
        raise ValueError(
            f"the model's embedding module does not number a text's positions 0..n-1 (as "
            "BERT's does; e.g. RoBERTa's counts from padding_idx + 1): "
            f"{who} supports BERT's numbering only."
        )
    return own[0]


def check_vocabulary(enc: Encoder) -> int:
    """The size of ``enc``'s vocabulary, once its tokenizer and its word embeddings are seen to
    agree: a ValueError when the tokenizer has ids the embedding has no row for, or the
    embedding rows the tokenizer can never produce (a model paired with another tokenizer;
    its scores would be of other words than the ones decoded)."""
    rows = int(enc.model.embeddings.word_embeddings.num_embeddings)
    words = len(enc.tokenizer)
    if rows != words or rows != enc.vocab_size:
        raise ValueError(
            f"{enc.name}: the tokenizer has {words} tokens but the word embeddings have "
            f"{rows} rows (config vocab_size {enc.vocab_size}); the model and its tokenizer "
            "must come from the same checkpoint."
        )
    return rows


def substitution_rows(
    model: str | Encoder | None,
    input_ids,
    position: int,
    d: int,
    *,
    tokens=None,
    batch: int = 8192,
) -> np.ndarray:
    """The row ``x'_v`` that the flip experiment's text holds at ``position`` when token
    ``position`` of ``input_ids`` is replaced by ``v``, for every ``v`` of ``tokens`` (default:
    the whole vocabulary, in id order): the layer-0 embedding of ``v`` at that position
    (segment 0, the model's own embedding module in its own precision, as
    :func:`wsutils.text.embeddings.embed` computes it), cut to its first ``d`` coordinates and
    rescaled to norm ``√d`` (:func:`wsutils.text.embeddings.sample_matrix`). The row of the
    original token is the text's own row ``x_i``.

    Returns
    -------
    numpy.ndarray
        ``(len(tokens), d)`` float64, rows of norm ``√d``.

    Raises
    ------
    TypeError
        If ``input_ids`` or ``tokens`` holds non-integer ids.
    ValueError
        If the model's tokenizer and word embeddings disagree (:func:`check_vocabulary`), its
        embedding module numbers positions otherwise than BERT's (:func:`check_positions`:
        RoBERTa's), the text is longer than the model's positions, ``position`` is not a
        position of the text, an id lies outside the vocabulary, ``d`` exceeds the model's
        width or ``batch`` is below one.
    """
    enc = model if isinstance(model, Encoder) else load_model(model)
    V = check_vocabulary(enc)
    ids = token_ids("input_ids", input_ids, vocab=V)
    enc.check_length(len(ids))
    position = check_int("position", position, minimum=0)
    if position >= len(ids):
        raise ValueError(
            f"position must be a position of the text, below its {len(ids)} tokens; "
            f"got {position}."
        )
    d = check_int("d", d, minimum=1)
    if d > enc.hidden:
        raise ValueError(f"d = {d} coordinates asked, but the model's width is {enc.hidden}.")
    tokens = torch.arange(V) if tokens is None else token_ids("tokens", tokens, vocab=V)
    batch = check_int("batch", batch, minimum=1)
    out = np.empty((len(tokens), d), dtype=np.float64)
    with torch.no_grad():
        check_positions(enc.model.embeddings, ids.to(enc.device), "substitution_rows")
        for j in range(0, len(tokens), batch):
            t = tokens[j : j + batch].to(enc.device)[:, None]  # (B, 1): one token per text
            rows = enc.model.embeddings(
                input_ids=t,
                token_type_ids=torch.zeros_like(t),
                position_ids=torch.full_like(t, position),
            )[:, 0]
            out[j : j + len(t)] = sample_matrix(rows.float().cpu().numpy(), len(t), d)
    return out
