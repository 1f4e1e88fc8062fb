"""Successive halving of a search (wsutils.halving): the searches that go on take the steps
they take without the cuts, the cut keeps the best, a cut search keeps its best iterate, the
work follows the schedule, and the settings are checked."""

import math
import re

import pytest
import torch

import wsutils as ws
from wsutils.estimators import self_attention as at
from wsutils.estimators.drf import drf_row_sensitivity
from wsutils.halving import cut, halving_ascent, passes
from wsutils.search import Search
from wsutils.sensitivity import cosine_step


def test_cut_keeps_the_best_ties_to_the_lower_index_nan_last():
    best = torch.tensor([1.0, 5.0, math.nan, 5.0, 2.0, -math.inf])
    alive = torch.tensor([0, 1, 2, 3, 4, 5])
    assert cut(best, alive, 0.5, 1).tolist() == [1, 3, 4]
    assert cut(best, alive, 0.1, 2).tolist() == [1, 3]  # the floor
    assert cut(best, alive, 0.1, 1).tolist() == [1]  # equal values: the lower index
    assert cut(best, torch.tensor([2, 4, 0]), 0.5, 1).tolist() == [0, 4]  # NaN ranks last
    assert cut(best, alive, 0.5, 10).tolist() == alive.tolist()  # never more than alive


def _exact_problem(B: int, d: int):
    """Searches whose values and steps are exact in float64 (small dyadic numbers): the value
    of a search is a fixed linear function of its iterate, the step adds the gradient's sign
    pattern scaled by 1/8, so every trajectory can be compared with ``==``."""
    g = torch.Generator().manual_seed(0)
    A = torch.randint(-4, 5, (B, d), generator=g).to(torch.float64)
    start = torch.randint(-8, 9, (B, d), generator=g).to(torch.float64) / 8
    seen: list[torch.Tensor] = []  # the searches evaluated, step by step

    def evaluate(idx, D):
        seen.append(idx.clone())
        return (A[idx] * D).sum(-1), lambda: A[idx].clone()

    def step(D, grad, t):
        return D + torch.sign(grad) * (t % 3 + 1) / 8

    return start, evaluate, step, seen


def test_the_searches_that_go_on_take_their_own_steps():
    B, d, steps = 24, 5, 20
    start, evaluate, step, _ = _exact_problem(B, d)
    full_val, full_best = halving_ascent(
        evaluate, start, steps=steps, step=step, halving=(steps + 1, 0.5), floor=1, chunk=7
    )
    start, evaluate, step, seen = _exact_problem(B, d)
    val, best = halving_ascent(
        evaluate, start, steps=steps, step=step, halving=(3, 0.5), floor=2, chunk=7
    )
    evaluations = torch.bincount(torch.cat(seen), minlength=B)
    alive = torch.nonzero(evaluations == steps + 1).flatten()  # the searches never cut
    assert 2 <= len(alive) < B
    # the survivors of every cut: their best values and iterates are the full search's
    assert torch.equal(val[alive], full_val[alive])
    assert torch.equal(best[alive], full_best[alive])
    # a search that was cut keeps the best of what it saw: never above the full search's
    assert bool((val <= full_val).all())


def test_the_work_follows_the_schedule():
    B, d, steps, chunk = 40, 3, 30, 6
    start, evaluate, step, seen = _exact_problem(B, d)
    halving_ascent(
        evaluate, start, steps=steps, step=step, halving=(4, 0.25), floor=3, chunk=chunk
    )
    assert sum(len(i) for i in seen) == passes(B, steps, (4, 0.25), 3)
    # counted by hand: 40 searches for iterates 0-3, then 10 (4-7), then 3 (the floor) to 30
    assert passes(B, steps, (4, 0.25), 3) == 40 * 4 + 10 * 4 + 3 * 23
    assert passes(B, steps, None, 3) == B * (steps + 1)
    assert max(len(i) for i in seen) <= chunk


def test_a_search_with_halving_is_certified_and_cheaper():
    n, d = 12, 8
    X, W = ws.sample_X(n, d, seed=3), ws.sample_W(d, seed=4)
    texts = []

    def phi(Z):
        texts.append(Z.shape[0])
        return ws.raf(Z, W)

    search = Search(starts=4, steps=24, seed=1)
    ws.word_sensitivity(phi, X, search=search)
    full_texts, texts[:] = sum(texts), []
    halved = ws.word_sensitivity(phi, X, search=search, halving=(3, 0.25))
    # the door's two evaluations of φ(X), the batch check (9 texts), φ(X), and the
    # certification (X and each row's Δ) besides
    overhead = 2 + 9 + 1 + (1 + n)
    assert full_texts == passes(n * 4, 24, None, 4) + overhead
    assert sum(texts) == passes(n * 4, 24, (3, 0.25), 4) + overhead < full_texts / 3
    assert sorted(halved.per_row) == list(range(n))  # every row keeps a value
    for r, v in halved.per_row.items():  # each a float64 relative change at its Δ
        again = ws.relative_change(lambda Z: ws.raf(Z, W), X, r, halved.per_row_Delta[r])
        assert math.isclose(v, again, rel_tol=1e-12)
        assert float(torch.linalg.vector_norm(torch.as_tensor(halved.per_row_Delta[r]))) <= (
            math.sqrt(d)
        )
    # the fast estimator takes the same setting
    fast = at.attention_word_sensitivity(X, W, search=search, halving=(3, 0.25))
    assert sorted(fast.per_row) == list(range(n))


def test_halving_settings_are_checked_and_refused_where_unused():
    assert Search(halving=[8, 0.25]).halving == (8, 0.25)
    for bad, err in [
        ((0, 0.5), ValueError),
        ((8, 0.0), ValueError),
        ((8, 1.0), ValueError),
        ((8, math.nan), ValueError),
        ((8.0, 0.5), TypeError),
        (8, ValueError),
        ("8,0.5", ValueError),
    ]:
        with pytest.raises(err):
            Search(halving=bad)
    X = ws.sample_X(6, 4, seed=0)
    with pytest.raises(ValueError, match="halving"):
        ws.rf_word_sensitivity(X, 24, halving=(2, 0.5))
    with pytest.raises(ValueError, match="halving"):
        drf_row_sensitivity(X, 2, 24, search=dict(halving=(2, 0.5)))
    from wsutils.generalization._search import search_flip

    with pytest.raises(ValueError, match="takes no halving"):
        search_flip(lambda D: D.sum(-1), 4, 1.0, halving=(2, 0.5))


def test_progress_after_a_delay(capsys):
    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=5, starts=2, progress=1e6)
    assert "word sensitivity" not in capsys.readouterr().err  # a short search: no bar
    ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=5, starts=2, progress=0.0)
    assert "word sensitivity" in capsys.readouterr().err


def test_cosine_step_is_the_step_of_a_halved_search():
    # the halved search's step is cosine_step of the full schedule: one step from one iterate
    d = 4
    D = torch.ones(2, d, dtype=torch.float64)
    g = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]], dtype=torch.float64)
    a = cosine_step(math.sqrt(d), 0.5, 10)(D, g, 3)
    b = cosine_step(math.sqrt(d), 0.5, 10)(D[1:], g[1:], 3)
    assert torch.equal(a[1:], b)


def test_progress_with_halving_counts_the_work_left(capsys):
    """Issue 61, item 7: with halving the bar counts evaluations, as many as the cuts leave
    (``passes``), not every search to its last step, so its time left is the halved search's."""
    from wsutils.halving import passes

    n, starts, steps, halving = 6, 2, 12, (3, 0.5)
    X, W = ws.sample_X(n, 4, seed=0), ws.sample_W(4, seed=1)
    ws.word_sensitivity(
        lambda Z: ws.raf(Z, W), X, steps=steps, starts=starts, halving=halving, progress=0.0
    )
    total = passes(n * starts, steps, halving, starts)
    assert total < n * starts * (steps + 1)
    assert f"{total}/{total}" in capsys.readouterr().err  # every pass ticked, no catch-up
    ws.word_sensitivity(  # a stopping rule that fires: the bar ends at the work done
        lambda Z: ws.raf(Z, W),
        X,
        steps=steps,
        starts=starts,
        halving=halving,
        stop=(1, 1.0),
        progress=0.0,
    )
    shown = re.findall(r"\| *(\d+)/(\d+) \[", capsys.readouterr().err)
    done, end = map(int, shown[-1])  # the bar's last state
    assert done == end < total
