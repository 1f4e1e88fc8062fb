"""A map declared word-wise (wsutils.tokenwise.TokenwiseMap): it is the map it declares, its
declaration is checked, and a search through ``mix`` alone measures the same relative changes
and certifies them with the whole map."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils.sensitivity import BATCH_RTOL, map_objective, relative_changes
from wsutils.tokenwise import TokenwiseMap, replace_rows, softmax_attention


def test_it_is_the_map_it_declares():
    X, W = ws.sample_X(9, 6, seed=1), ws.sample_W(6, seed=2)
    phi = softmax_attention(W)
    assert torch.equal(phi(X[None]), phi.mix(phi.tokens(X[None])))
    # softmax attention: ws.raf's map, up to the rounding of another order of operations
    assert torch.allclose(phi(X[None])[0], ws.raf(X, W), rtol=BATCH_RTOL, atol=0)


def test_replace_rows():
    F = torch.arange(12.0).reshape(4, 3)
    out = replace_rows(F, torch.tensor([0, 2]), -torch.ones(2, 3))
    assert out.shape == (2, 4, 3)
    assert torch.equal(out[0, 0], -torch.ones(3)) and torch.equal(out[1, 2], -torch.ones(3))
    assert torch.equal(out[0, 1:], F[1:]) and torch.equal(out[1, [0, 1, 3]], F[[0, 1, 3]])


def test_the_objective_measures_the_whole_maps_relative_change():
    n, d = 10, 8
    X, W = ws.sample_X(n, d, seed=3), ws.sample_W(d, seed=4)
    phi = softmax_attention(W)
    base = phi(X[None])[0]
    ours = phi.word_objective(X, base, float(torch.linalg.vector_norm(base)))(None)
    whole = map_objective(phi, X, base)(None)
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(n)
    D = torch.randn(n, d, generator=g, dtype=torch.float64)
    D *= math.sqrt(d) / torch.linalg.vector_norm(D, dim=1, keepdim=True)
    a, b = ours(rows, D), whole(rows, D)
    # the changed word's tokens computed alone: the same numbers up to the kernels' rounding
    assert torch.allclose(a, b, rtol=BATCH_RTOL, atol=0)


def test_a_search_through_mix_is_certified_by_the_whole_map():
    n, d = 12, 8
    X, W = ws.sample_X(n, d, seed=5), ws.sample_W(d, seed=6)
    phi = softmax_attention(W)
    res = ws.word_sensitivity(phi, X, starts=3, steps=30, seed=0)
    rows = sorted(res.per_row)
    D = torch.as_tensor(np.stack([res.per_row_Delta[r] for r in rows]))
    again = relative_changes(phi, X, rows, D, alone=True)
    assert [res.per_row[r] for r in rows] == again.tolist()  # the same evaluations
    assert res.value == max(res.per_row.values())
    # and with halving
    halved = ws.word_sensitivity(phi, X, starts=3, steps=30, seed=0, halving=(4, 0.25))
    assert sorted(halved.per_row) == list(range(n))


@pytest.mark.parametrize(
    "tokens, words",
    [
        (lambda Z: Z - Z.mean(dim=-2, keepdim=True), "mixes the words"),
        (lambda Z: Z + torch.arange(Z.shape[-2], dtype=Z.dtype)[:, None], "or the position"),
    ],
)
def test_a_false_declaration_is_refused(tokens, words):
    X, W = ws.sample_X(7, 4, seed=0), ws.sample_W(4, seed=1)
    phi = TokenwiseMap(tokens, lambda F: ws.raf(F, W))
    with pytest.raises(ValueError, match=words):
        ws.word_sensitivity(phi, X, starts=2, steps=3)
    # the same map as a plain function is searched as any other
    assert math.isfinite(ws.word_sensitivity(lambda Z: phi(Z), X, starts=2, steps=3).value)
