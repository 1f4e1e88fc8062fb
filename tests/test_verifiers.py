"""The verifiers' baselines (wsutils.estimators.verifiers), IBP and the CROWN-style linear
relaxation: above every change tried on tiny texts (issue 60, part 4); how they compare with
our certificates is benchmarks/bench_verifiers.py's."""

import math

import numpy as np
import pytest
import torch
from ball_changes import changes

import wsutils as ws
from wsutils.estimators import verifiers as V
from wsutils.estimators.verifiers import crown_upper, ibp_upper
from wsutils.maps import Normalisation

BASELINES = [ibp_upper, crown_upper]


@pytest.mark.parametrize("bound_of", BASELINES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "norm",
    [
        Normalisation("softmax"),
        Normalisation("softmax", beta=2.0),
        "scalable",
        Normalisation("softmax", sink=1.0),
    ],
    ids=str,
)
def test_baselines_lie_above_every_change_tried(norm, bound_of):
    g = torch.Generator().manual_seed(0)
    for n, d in [(5, 2), (16, 4), (12, 8)]:
        X, W = ws.sample_X(n, d, seed=n).double(), 2 * ws.sample_W(d, seed=d).double()
        bound = bound_of(X, W, normalisation=norm)
        for i in range(1 if "sink" in str(norm) else 0, n):  # a sink's token: no bound
            D = torch.randn(400, d, generator=g, dtype=torch.float64)
            D *= math.sqrt(d) / D.norm(dim=1, keepdim=True)
            D[200:] *= torch.rand(200, 1, generator=g, dtype=torch.float64)
            assert float(changes(X, W, norm, i, D).max()) <= bound[i]


@pytest.mark.parametrize("bound_of", BASELINES, ids=lambda f: f.__name__)
def test_baselines_on_a_fine_grid_of_a_tiny_text(bound_of):
    X, W = ws.sample_X(6, 2, seed=5).double(), 3 * ws.sample_W(2, seed=6).double()
    bound = bound_of(X, W)
    t = torch.linspace(0, 2 * math.pi, 721, dtype=torch.float64)[:-1]
    rad = math.sqrt(2) * torch.linspace(0, 1, 41, dtype=torch.float64)
    D = (rad[:, None, None] * torch.stack([t.cos(), t.sin()], -1)[None]).reshape(-1, 2)
    for i in range(6):
        assert float(changes(X, W, Normalisation("softmax"), i, D).max()) <= bound[i]


@pytest.mark.parametrize("bound_of", BASELINES, ids=lambda f: f.__name__)
def test_baselines_refuse_other_maps(bound_of):
    X, W = ws.sample_X(5, 4, seed=1), ws.sample_W(4, seed=2)
    with pytest.raises(ValueError, match="softmax"):
        bound_of(X, W, normalisation="sparsemax")


@pytest.mark.parametrize("bound_of", BASELINES, ids=lambda f: f.__name__)
def test_baselines_give_a_sinks_own_token_no_bound(bound_of):
    X, W = ws.sample_X(8, 4, seed=1), ws.sample_W(4, seed=2)
    out = bound_of(X, W, normalisation=Normalisation("softmax", sink=3.0))
    assert out[0] == math.inf and np.isfinite(out[1:]).all()


def test_crown_is_never_above_ibp_and_below_it_somewhere():
    """Every interval is the tighter of the two, so CROWN ≤ IBP at every word; on small texts
    the relaxation itself is tighter at some word (it is not IBP under another name)."""
    below = 0
    for n, d in [(3, 2), (8, 4), (20, 16)]:
        X, W = ws.sample_X(n, d, seed=1).double(), ws.sample_W(d, seed=2).double()
        crown, ibp = crown_upper(X, W), ibp_upper(X, W)
        assert (crown <= ibp).all()
        below += int((crown < ibp * (1 - 1e-3)).sum())
    assert below > 0


@pytest.mark.parametrize(
    "f, touch, lo, hi, curve",
    [  # curve(a, b): the largest |f''| on [a, b]
        (torch.sigmoid, V._sigmoid_touch, -6.0, 4.0, lambda a, b: 0.1 + 0 * a),
        (torch.exp, lambda k: [torch.log(k)], -30.0, 3.0, lambda a, b: torch.exp(b)),
        (torch.reciprocal, lambda k: [torch.rsqrt(-k)], 0.01, 50.0, lambda a, b: 2 / a**3),
    ],
    ids=["sigmoid", "exp", "reciprocal"],
)
def test_the_relaxations_lines_bound_the_function_on_their_interval(f, touch, lo, hi, curve):
    """The two lines of `_lines` lie below and above f on a fine grid of each interval, and
    touch it (the tightest of their slope), on intervals of several widths, a narrow one too."""
    g = torch.Generator().manual_seed(0)
    a = lo + (hi - lo) * torch.rand(200, generator=g, dtype=torch.float64)
    b = a + (hi - a) * torch.rand(200, generator=g, dtype=torch.float64) ** 3
    b[0] = a[0] + 1e-12  # nearly a point
    k, b_lo, b_hi = V._lines(f, a, b, touch)
    t = a[:, None] + (b - a)[:, None] * torch.linspace(0, 1, 2001, dtype=torch.float64)
    gap = f(t) - k[:, None] * t
    scale = 1e-12 * (1 + f(t).abs() + (k[:, None] * t).abs())
    assert (gap >= b_lo[:, None] - scale).all() and (gap <= b_hi[:, None] + scale).all()
    # between grid points f − k·t departs from its extreme by at most h²/8·max|f''|
    grid = ((b - a) / 2000) ** 2 / 8 * curve(a, b) + scale.max(dim=1).values
    assert (gap.min(dim=1).values - b_lo <= grid).all()
    assert (b_hi - gap.max(dim=1).values <= grid).all()


@pytest.mark.parametrize("bound_of", BASELINES, ids=lambda f: f.__name__)
def test_baselines_above_every_change_with_a_definite_w(bound_of):
    """A positive definite (W + Wᵀ)/2 (and a negative definite one): ΔᵀWΔ runs from 0, at
    Δ = 0, to its extreme, so z_ii's quadratic part has 0 at one end of its interval (an
    interval from λ_min·d to λ_max·d missed it: the referee of issue 60's CROWN)."""
    g = torch.Generator().manual_seed(3)
    for sign in (1.0, -1.0):
        for n, d in [(4, 3), (6, 2)]:
            X = ws.sample_X(n, d, seed=n + d).double()
            W = sign * (3 * torch.eye(d, dtype=torch.float64) + 0.1 * ws.sample_W(d, seed=1))
            bound = bound_of(X, W)
            for i in range(n):
                D = torch.randn(2000, d, generator=g, dtype=torch.float64)
                D *= math.sqrt(d) / D.norm(dim=1, keepdim=True)
                D[1000:] *= torch.rand(1000, 1, generator=g, dtype=torch.float64)
                D[0] = 0
                assert float(changes(X, W, Normalisation("softmax"), i, D).max()) <= bound[i]
    p = V._Problem(X, W, "softmax", "test")
    assert p.quad[0] <= 0.0 <= p.quad[1]  # Δ = 0 lies in the quadratic part's interval
