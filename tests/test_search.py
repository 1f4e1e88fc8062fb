"""The settings of a search (wsutils.search.Search): checked once when made, one parser for
a Search, a dict or keywords, and the same numbers whichever way the settings are given."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils.estimators import self_attention as at
from wsutils.search import Search, precision
from wsutils.trained import own_norm_word_sensitivity


def test_defaults_and_fields_are_checked_when_made():
    s = Search()
    assert (s.starts, s.steps, s.lr, s.seed, s.dtype, s.stop) == (8, 200, 0.5, None, None, None)
    assert s.start_seed(0) == 0 and s.start_seed(7) == 7 and Search(seed=3).start_seed(7) == 3
    assert Search(stop=[5, 0]).stop == (5, 0.0)  # a JSON list is read as the pair
    assert Search(dtype=torch.float32).dtype == "float32" == Search(dtype="torch.float32").dtype
    for bad, err in [
        (dict(starts=0), ValueError),
        (dict(steps=-1), ValueError),
        (dict(starts=2.0), TypeError),
        (dict(lr=math.nan), ValueError),
        (dict(lr=0.0), ValueError),
        (dict(seed=-1), ValueError),
        (dict(dtype="float16"), ValueError),
        (dict(max_batch_elements=0), ValueError),
        (dict(stop=(0, 1e-3)), ValueError),
        (dict(stop=(5, -1.0)), ValueError),
        (dict(stop=(5, math.inf)), ValueError),
        (dict(stop=5), ValueError),
    ]:
        with pytest.raises(err):
            Search(**bad)
    with pytest.raises(AttributeError):
        s.steps = 3  # frozen
    with pytest.raises(ValueError, match="^dtype must be"):
        Search(dtype=torch.float16)
    with pytest.raises(ValueError, match="^dtype must be"):
        precision("half")
    assert precision(torch.float64) == "float64" and precision(None) is None


def test_parse_reads_a_search_a_dict_or_keywords():
    base = Search(starts=3, steps=7)
    assert Search.parse(None) == Search()
    assert Search.parse(base) is base
    assert Search.parse(base, seed=5) == Search(starts=3, steps=7, seed=5)
    assert Search.parse({"starts": 3, "steps": 7}) == base
    assert Search.parse({"starts": 3}, steps=7) == base
    with pytest.raises(TypeError, match="unknown search setting"):
        Search.parse(None, search_dtype="float32")
    with pytest.raises(TypeError, match="unknown search setting"):
        Search.parse({"step": 3})
    with pytest.raises(TypeError, match="must be a wsutils.search.Search"):
        Search.parse(3)


def test_keywords_and_a_search_give_the_same_numbers():
    X, W = ws.sample_X(6, 8, seed=1), ws.sample_W(8, seed=2)
    s = Search(starts=3, steps=12, seed=4, lr=0.3)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    a = ws.word_sensitivity(phi, X, search=s)
    b = ws.word_sensitivity(phi, X, starts=3, steps=12, seed=4, lr=0.3)
    assert a.value == b.value and a.row == b.row
    assert (a.starts, a.steps, a.seed) == (3, 12, 4)
    c = at.attention_word_sensitivity(X, W, search=s)
    e = at.attention_word_sensitivity(X, W, search=Search(starts=3), steps=12, seed=4, lr=0.3)
    assert c.value == e.value
    f = own_norm_word_sensitivity(phi, X, search=s)  # s searches in X's own precision
    g = own_norm_word_sensitivity(phi, X, starts=3, steps=12, seed=4, lr=0.3, dtype=None)
    assert f.value == g.value


def test_a_float32_search_is_certified_in_float64():
    """``dtype="float32"`` runs the generic search on a rounded copy; the value is the
    float64 relative change at the returned Δ, which lies in the ball."""
    X, W = ws.sample_X(7, 16, seed=3), ws.sample_W(16, seed=4)
    phi = lambda Z: ws.relu_attention(Z, W)  # noqa: E731
    res = ws.word_sensitivity(phi, X, starts=2, steps=15, dtype="float32")
    for r, D in res.per_row_Delta.items():
        assert D.dtype == np.float64 and np.linalg.norm(D) <= math.sqrt(16)
        assert res.per_row[r] == pytest.approx(ws.relative_change(phi, X, r, D), rel=1e-12)


def test_the_stopping_rule_cuts_the_same_trajectory():
    """``stop=(m, rtol)`` in :func:`wsutils.sensitivity.cosine_ascent` ends the ascent at the
    first step where every search gained at most ``rtol`` over ``m`` steps: with a tolerance
    every step meets, after ``m`` steps, and the best value is that of the full run's first
    ``m + 1`` iterates (the schedule is the full run's: stopping only cuts it); with ``rtol =
    0`` on an objective that keeps rising, never. Starts are grouped per search (``group``)."""
    from wsutils.sensitivity import cosine_ascent

    d = 6
    target = torch.arange(1.0, d + 1, dtype=torch.float64)
    target *= math.sqrt(d) / torch.linalg.vector_norm(target)
    seen = []

    def values(D):
        v = -((D - target) ** 2).sum(-1)  # rises as Δ nears a point on the sphere
        seen.append(v.detach().clone())
        return v

    D0 = torch.randn(4, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    full, _ = cosine_ascent(values, D0.clone() * 0.1, math.sqrt(d), steps=30, lr=0.05)
    trace = torch.stack(seen)
    for m in (1, 4):
        seen.clear()
        best, _ = cosine_ascent(
            values, D0.clone() * 0.1, math.sqrt(d), steps=30, lr=0.05, stop=(m, 1e9), group=2
        )
        assert len(seen) == m + 1
        assert torch.equal(best, trace[: m + 1].amax(dim=0))
    seen.clear()
    never, _ = cosine_ascent(
        values, D0.clone() * 0.1, math.sqrt(d), steps=30, lr=0.05, stop=(3, 0.0)
    )
    assert len(seen) == 31 and torch.equal(never, full)


def test_the_sphere_step_lands_on_the_sphere_and_holds_still_without_a_gradient():
    """:func:`wsutils.sensitivity.sphere_step` (the random-feature searches' step) moves each
    row to ``radius·g/‖g‖``, within the ball's ``exact=False`` margin, and leaves a row whose
    gradient is zero or not finite where it was."""
    from wsutils.sensitivity import sphere_step

    d, radius = 5, math.sqrt(5)
    Delta = torch.full((4, d), 0.1, dtype=torch.float64)
    grad = torch.randn(4, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad[1] = 0
    grad[2, 0] = math.inf
    grad[3, 1] = math.nan
    moved = sphere_step(radius)(Delta, grad, 0)
    unit = grad[0] / torch.linalg.vector_norm(grad[0])
    assert torch.allclose(moved[0], radius * unit, rtol=1e-14, atol=0)
    assert float(torch.linalg.vector_norm(moved[0])) <= radius
    assert torch.equal(moved[1:], Delta[1:])


def test_one_ascent_for_a_hand_gradient_and_autograd():
    """:func:`wsutils.sensitivity.ascend` takes the gradient from its objective: a hand-written
    one and autograd's give the same iterates, the best value of each row is the largest it
    saw, and the best iterate is where it saw it."""
    from wsutils.sensitivity import ascend, autograd_values, sphere_step

    d = 4
    target = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    seen = []

    def values(D):
        return D @ target - 0.1 * (D**2).sum(-1)

    def by_hand(D):
        seen.append(D.clone())
        return values(D), lambda: target - 0.2 * D

    D0 = torch.randn(3, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    kw = dict(steps=5, step=sphere_step(math.sqrt(d)))
    best_h, at_h = ascend(by_hand, D0.clone(), **kw)
    best_a, at_a = ascend(autograd_values(values), D0.clone(), **kw)
    assert torch.allclose(best_h, best_a, rtol=1e-12) and torch.allclose(at_h, at_a, rtol=1e-12)
    trace = torch.stack([values(D) for D in seen])  # 6 evaluations, one per step and the last
    assert len(seen) == 6 and torch.equal(best_h, trace.amax(dim=0))
    assert torch.equal(values(at_h), best_h)


def test_word_sensitivity_takes_the_stopping_rule():
    """The generic search stops early under ``Search.stop`` and still certifies its value."""
    X = ws.sample_X(6, 4, seed=3)
    W = ws.sample_W(4, seed=4)
    early = at.attention_word_sensitivity(X, W, rows=[0], starts=2, steps=40, stop=(1, 1e9))
    full = at.attention_word_sensitivity(X, W, rows=[0], starts=2, steps=40)
    assert 0 < early.value <= full.value * (1 + 1e-9)  # a prefix of the same trajectory
    again = ws.relative_change(lambda Z: ws.maps.raf(Z, W), X, 0, early.Delta)
    assert early.value == pytest.approx(again, rel=1e-12)


def test_more_starts_are_nested_and_never_worse():
    """Issue 61, item 6: a search with more starts (same seed) begins with the smaller one's
    random starts, bit for bit, at any n·d (also where torch fills a draw that is not a
    multiple of 16 differently), so with the same steps, no halving and no stopping rule it
    never finds less (up to the rounding of the same paths in batches of another shape), on
    several texts; and a longer search started also from the shorter one's answer never ends
    below it."""
    import torch

    import wsutils as ws
    from wsutils.search import Search
    from wsutils.sensitivity import BATCH_RTOL, _row_starts

    for n, d in [(12, 16), (12, 12), (5, 12), (7, 50), (3, 4), (2, 4)]:  # any n·d
        X = ws.sample_X(n, d, seed=1)
        rows = list(range(n))
        small = _row_starts(X, rows, Search(starts=3, seed=5), None, None)
        large = _row_starts(X, rows, Search(starts=6, seed=5), None, None)
        assert all(torch.equal(large[r][:3], small[r]) for r in rows), (n, d)
        one = lambda r: X[:0] if r is None else X[:1]  # noqa: E731  (row_starts given)
        small = _row_starts(X, rows, Search(starts=3, seed=5), None, one)
        large = _row_starts(X, rows, Search(starts=6, seed=5), None, one)
        assert all(torch.equal(large[r][:3], small[r][:3]) for r in rows), (n, d)
    n, d = 12, 12
    for seed in range(3):
        X, W = ws.sample_X(n, d, seed=10 + seed), ws.sample_W(d, seed=20 + seed)
        phi = lambda Z: ws.raf(Z, W)  # noqa: E731
        values = [
            ws.word_sensitivity(phi, X, starts=s, steps=25, seed=seed, progress=False).value
            for s in (2, 4, 8)
        ]
        assert all(b >= a * (1 - BATCH_RTOL) for a, b in zip(values, values[1:])), values
        short = ws.word_sensitivity(phi, X, starts=2, steps=10, seed=seed, progress=False)
        longer = ws.word_sensitivity(
            phi, X, starts=4, steps=20, seed=seed, init=short.Delta, progress=False
        )
        assert longer.value >= short.value * (1 - BATCH_RTOL)
