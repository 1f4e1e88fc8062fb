"""The IBP baseline (wsutils.estimators.verifiers): above every change tried on tiny texts
(issue 60, part 4); how it compares with our certificates is benchmarks/bench_verifiers.py's."""

import math

import numpy as np
import pytest
import torch
from ball_changes import changes

import wsutils as ws
from wsutils.estimators.verifiers import ibp_upper
from wsutils.maps import Normalisation


@pytest.mark.parametrize(
    "norm", [Normalisation("softmax"), Normalisation("softmax", beta=2.0), "scalable"], ids=str
)
def test_ibp_lies_above_every_change_tried(norm):
    g = torch.Generator().manual_seed(0)
    for n, d in [(5, 2), (16, 4)]:
        X, W = ws.sample_X(n, d, seed=n).double(), 2 * ws.sample_W(d, seed=d).double()
        bound = ibp_upper(X, W, normalisation=norm)
        for i in range(n):
            D = torch.randn(400, d, generator=g, dtype=torch.float64)
            D *= math.sqrt(d) / D.norm(dim=1, keepdim=True)
            D[200:] *= torch.rand(200, 1, generator=g, dtype=torch.float64)
            assert float(changes(X, W, norm, i, D).max()) <= bound[i]


def test_ibp_on_a_fine_grid_of_a_tiny_text():
    X, W = ws.sample_X(6, 2, seed=5).double(), 3 * ws.sample_W(2, seed=6).double()
    bound = ibp_upper(X, W)
    t = torch.linspace(0, 2 * math.pi, 721, dtype=torch.float64)[:-1]
    rad = math.sqrt(2) * torch.linspace(0, 1, 41, dtype=torch.float64)
    D = (rad[:, None, None] * torch.stack([t.cos(), t.sin()], -1)[None]).reshape(-1, 2)
    for i in range(6):
        assert float(changes(X, W, Normalisation("softmax"), i, D).max()) <= bound[i]


def test_ibp_refuses_other_maps():
    X, W = ws.sample_X(5, 4, seed=1), ws.sample_W(4, seed=2)
    with pytest.raises(ValueError, match="softmax"):
        ibp_upper(X, W, normalisation="sparsemax")


def test_ibp_gives_a_sinks_own_token_no_bound():
    X, W = ws.sample_X(8, 4, seed=1), ws.sample_W(4, seed=2)
    out = ibp_upper(X, W, normalisation=Normalisation("softmax", sink=3.0))
    assert out[0] == math.inf and np.isfinite(out[1:]).all()
