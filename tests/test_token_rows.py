"""wsutils.text.token_rows on the tiny random BERT: one substitution changes one row of the
layer-0 embedding and of the flip experiment's text, and that row is substitution_rows';
bad input gets a clear error."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from tiny_bert import save_tiny_bert  # noqa: E402

from wsutils.text import embeddings as em  # noqa: E402
from wsutils.text.token_rows import check_vocabulary, substitution_rows  # noqa: E402


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    torch.manual_seed(0)
    return em.load_model(str(save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))))


TEXT = "i love the movie and it was very good"


def _ids(enc, text=TEXT, max_length=16):
    return enc.tokenizer(text, padding="max_length", max_length=max_length)["input_ids"]


def test_one_substitution_changes_one_row(enc):
    """Layer 0 embeds each token on its own: the text with token ``i`` replaced by ``v`` has
    the original's rows everywhere but ``i`` (to the bit: the same rows, the same kernel),
    and its row ``i`` cut and rescaled is ``substitution_rows``' row of ``v`` (another batch
    shape, so to float32 rounding)."""
    ids = _ids(enc)
    i, n, d = 3, 12, 20
    V = check_vocabulary(enc)
    tokens = [v for v in range(V) if v != ids[i]][:6]
    texts = [ids] + [ids[:i] + [v] + ids[i + 1 :] for v in tokens]
    with torch.no_grad():
        t = torch.tensor(texts)
        E = enc.model.embeddings(input_ids=t, token_type_ids=torch.zeros_like(t)).numpy()
    others = [r for r in range(len(ids)) if r != i]
    for j in range(1, len(texts)):
        np.testing.assert_array_equal(E[j][others], E[0][others])
        assert not np.array_equal(E[j][i], E[0][i])
    rows = substitution_rows(enc, ids, i, d, tokens=tokens)
    assert rows.shape == (len(tokens), d) and rows.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), math.sqrt(d), rtol=1e-12)
    X = em.sample_matrix(E[0], n, d)
    for j, v in enumerate(tokens):
        Xv = em.sample_matrix(E[j + 1], n, d)
        np.testing.assert_array_equal(np.delete(Xv, i, 0), np.delete(X, i, 0))
        np.testing.assert_allclose(Xv[i], rows[j], rtol=1e-5, atol=1e-5)
    own = substitution_rows(enc, ids, i, d, tokens=[ids[i]])[0]
    np.testing.assert_allclose(own, X[i], rtol=1e-5, atol=1e-5)
    # the whole vocabulary by default, in id order, in any batch size
    every = substitution_rows(enc, ids, i, d, batch=7)
    assert every.shape == (V, d)
    np.testing.assert_array_equal(every[tokens], rows)


def test_substitution_rows_refuse_bad_input(enc):
    ids = _ids(enc)
    V = enc.vocab_size
    for args, kw, err, msg in [
        ((ids, len(ids), 8), {}, ValueError, "position must be a position of the text"),
        ((ids, -1, 8), {}, ValueError, "position"),
        ((ids, 2, 8), dict(tokens=[V]), ValueError, r"each in \[0, "),
        ((ids, 2, 8), dict(tokens=[1.0]), TypeError, "integer token ids"),
        ((ids, 2, 8), dict(tokens=[]), ValueError, "at least one token id"),
        ((ids + [0] * 60, 2, 8), {}, ValueError, "max_position_embeddings"),
        ((ids, 2, enc.hidden + 1), {}, ValueError, "width"),
        ((ids, 2, 8), dict(batch=0), ValueError, "batch"),
    ]:
        with pytest.raises(err, match=msg):
            substitution_rows(enc, *args, **kw)


def test_a_model_with_another_tokenizer_is_refused(tmp_path):
    """A tokenizer with fewer tokens than the word embeddings have rows: every score would be
    of a word other than the one decoded."""
    torch.manual_seed(1)
    path = save_tiny_bert(tmp_path, vocab_size=60)
    enc = em.load_model(str(path))
    with pytest.raises(ValueError, match="same checkpoint"):
        substitution_rows(enc, _ids(enc), 1, 8)
