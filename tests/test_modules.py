"""``ws.module_map`` (issue 61, item 3): a torch module measured as it is, the module untouched;
a padded text measured on its real words."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import wsutils as ws


def _layer(*, train: bool, dtype=torch.float32, batch_first=False, seed=0):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.1, batch_first=batch_first
    ).to(dtype)
    return layer.train() if train else layer.eval()


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_float32_training_layer_is_measured_and_left_untouched():
    """torch's defaults (float32, training mode, batch_first=False): refused as they stand,
    measured through the adapter; the value is the relative change at the returned Δ, that of
    the layer's float64 eval-mode copy read words first, and the layer keeps its mode, dtype
    and parameters."""
    X = ws.sample_X(6, 16, seed=1)
    layer = _layer(train=True)
    before = _state(layer)
    with pytest.raises(ValueError):
        ws.word_sensitivity(layer, X, starts=1, steps=2)
    m = ws.module_map(layer)
    res = ws.word_sensitivity(m, X, starts=2, steps=5, seed=0)
    again = ws.relative_change(m, X, res.row, torch.as_tensor(res.Delta))
    assert math.isclose(res.value, again, rel_tol=1e-10)
    ref = copy.deepcopy(layer).double().eval()
    with torch.no_grad():
        want = ref(X[:, None])[:, 0]  # one text, read (n, B, d)
        got = m(X)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert layer.training and next(layer.parameters()).dtype == torch.float32
    assert all(torch.equal(v, _state(layer)[k]) for k, v in before.items())


def test_copies_follow_the_modules_parameters():
    """A change of the module's parameters after the map is made is seen at the next call
    (the float64 copy is made again)."""
    X = ws.sample_X(5, 16, seed=2)
    layer = _layer(train=False)
    m = ws.module_map(layer)
    first = m(X)
    with torch.no_grad():
        next(layer.parameters()).mul_(2.0)
    assert not torch.allclose(m(X), first)


def test_outputs_tuples_and_objects():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return (2 * x, None)

    class Output:
        def __init__(self, h):
            self.last_hidden_state = h

    class Hf(torch.nn.Module):
        def forward(self, x):
            return Output(3 * x)

    class Bad(torch.nn.Module):
        def forward(self, x):
            return {"h": x}

    X = ws.sample_X(4, 8, seed=3)
    torch.testing.assert_close(ws.module_map(Pair())(X), 2 * X)
    torch.testing.assert_close(ws.module_map(Hf())(X), 3 * X)
    with pytest.raises(TypeError, match="last_hidden_state"):
        ws.module_map(Bad())(X)


def _padded(n_real=5, n_pad=3, d=16):
    X = ws.sample_X(n_real + n_pad, d, seed=4)
    words = torch.tensor([True] * n_real + [False] * n_pad).numpy()
    return X, words


def test_a_padded_text_is_measured_on_its_real_words_torch_layer():
    """With ``words`` the map masks the padding keys (``src_key_padding_mask``) and returns
    the real rows: the same map, to rounding, as the layer on the unpadded text, and so the
    same relative change for every change of a real word."""
    X, words = _padded()
    layer = _layer(train=False, dtype=torch.float64, batch_first=True)
    m = ws.module_map(layer, words=words)
    assert m.rows == [0, 1, 2, 3, 4]
    with torch.no_grad():
        torch.testing.assert_close(m(X), layer(X[:5][None])[0], rtol=1e-10, atol=1e-10)
    D = 2.0 * torch.ones(16, dtype=torch.float64)
    padded = ws.relative_change(m, X, 2, D)
    alone = ws.relative_change(layer, X[:5], 2, D)
    assert padded == pytest.approx(alone, rel=1e-9)
    res = ws.word_sensitivity(m, X, rows=m.rows, starts=1, steps=3)
    assert res.row in m.rows


def test_a_padded_text_is_measured_on_its_real_words_hf_layer():
    """The same for a layer of the embedded BERT model (additive ``attention_mask``)."""
    from wsutils.run import config
    from wsutils.text import embeddings as em

    enc = em.load_model(config.EMBEDDED_MODEL)
    layer = enc.model.encoder.layer[0]
    X, words = _padded(d=enc.hidden)
    m = ws.module_map(layer, words=words)
    alone = ws.module_map(layer)
    torch.testing.assert_close(m(X), alone(X[:5]), rtol=1e-9, atol=1e-9)
    D = torch.ones(enc.hidden, dtype=torch.float64)
    assert ws.relative_change(m, X, 1, D) == pytest.approx(
        ws.relative_change(alone, X[:5], 1, D), rel=1e-8
    )


def test_bad_arguments_name_the_fix():
    X, words = _padded()
    layer = _layer(train=False, dtype=torch.float64, batch_first=True)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ws.module_map(lambda Z: Z)
    with pytest.raises(ValueError, match="boolean mask"):
        ws.module_map(layer, words=[1, 1, 0])
    with pytest.raises(ValueError, match="at least one True"):
        ws.module_map(layer, words=[False, False])
    with pytest.raises(ValueError, match="takes no key mask"):
        ws.module_map(torch.nn.Linear(16, 16), words=words)
    with pytest.raises(ValueError, match="words marks 8"):
        ws.module_map(layer, words=words)(X[:6])


def test_the_layout_is_read_from_the_module_passed_not_its_submodules():
    """A module of one's own that takes (B, n, d) and transposes around a sequence-first layer
    inside it is not transposed again (the referee's case: it was, and the words stopped
    interacting); torch's TransformerEncoder is read through its first layer."""

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _layer(train=False, dtype=torch.float64, batch_first=False)

        def forward(self, x):  # (B, n, d)
            return self.inner(x.transpose(0, 1)).transpose(0, 1)

    X = ws.sample_X(5, 16, seed=6)
    w = Wrapped()
    with torch.no_grad():
        torch.testing.assert_close(ws.module_map(w)(X), w(X[None])[0], rtol=1e-12, atol=1e-12)
    layer = _layer(train=False, dtype=torch.float64)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    with torch.no_grad():
        want = enc(X[:, None])[:, 0]
    torch.testing.assert_close(ws.module_map(enc)(X), want, rtol=1e-12, atol=1e-12)
