"""The general attention map (every normalisation against a direct formula), sparsemax and
entmax, and the fast estimator for every row-wise normalisation (chapter normalisation)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from justified import assert_justified, stochastic_upper

import wsutils as ws
from wsutils.estimators import objectives as ob
from wsutils.estimators import self_attention as at
from wsutils.estimators import takeover as tk
from wsutils.maps import NORMALISATIONS, Normalisation, attention, sparsemax

CASES = [
    Normalisation("softmax"),
    Normalisation("softmax", beta=3.0),
    Normalisation("scalable", s=0.7),
    Normalisation("sparsemax"),
    Normalisation("sparsemax", beta=2.0),
    Normalisation("entmax", alpha=1.5),
    Normalisation("entmax", alpha=1.2),
    Normalisation("sigmoid"),
    Normalisation("sigmoid", bias=0.5),
    Normalisation("relu"),
    Normalisation("hardmax"),
]


def _text(n, d, seed=0):
    return ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)


def _sparsemax_direct(z):
    """Sparsemax of one vector by its definition: the Euclidean projection onto the simplex,
    by trying every support size (Martins & Astudillo 2016, Algorithm 1)."""
    zs = np.sort(z)[::-1]
    for k in range(len(z), 0, -1):
        tau = (zs[:k].sum() - 1) / k
        if zs[k - 1] > tau:
            return np.maximum(z - tau, 0)
    raise AssertionError


def _direct(norm, s):
    """The weights of every normalisation from its textbook formula, row by row (numpy)."""
    n = s.shape[-1]
    z = norm.scale(n) * s
    out = np.zeros_like(z)
    for j, row in enumerate(z):
        if norm.name in ("softmax", "scalable"):
            e = np.exp(row - row.max())
            out[j] = e / e.sum()
        elif norm.name == "sparsemax":
            out[j] = _sparsemax_direct(row)
        elif norm.name == "entmax":
            a = norm.alpha  # τ by a long bisection in extended precision
            lo, hi = (a - 1) * row.max() - 1, (a - 1) * row.max()
            for _ in range(200):
                mid = (lo + hi) / 2
                mass = (np.maximum((a - 1) * row - mid, 0) ** (1 / (a - 1))).sum()
                lo, hi = (mid, hi) if mass >= 1 else (lo, mid)
            out[j] = np.maximum((a - 1) * row - lo, 0) ** (1 / (a - 1))
        elif norm.name == "sigmoid":
            out[j] = 1 / (1 + np.exp(-(row + norm.sigmoid_bias(n))))
        elif norm.name == "relu":
            r = np.maximum(row, 0)
            out[j] = r / r.sum() if r.sum() > 0 else r
        else:
            m = row == row.max()
            out[j] = m / m.sum()
    return out


@pytest.mark.parametrize("norm", CASES, ids=repr)
def test_every_normalisation_against_its_formula(norm):
    X, W = _text(11, 6, 3)
    s = (X @ W @ X.T / math.sqrt(6)).numpy()
    want = _direct(norm, s) @ X.numpy()
    got = attention(X.numpy(), W.numpy(), normalisation=norm)
    assert isinstance(got, np.ndarray) and got.shape == (11, 6)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("norm", CASES, ids=repr)
def test_rows_sum_to_one_where_they_should(norm):
    X, W = _text(13, 5, 4)
    A = ws.maps.normalise_scores(ws.maps.attention_scores(X, W), norm)
    assert bool((A >= 0).all())
    if norm.row_stochastic:
        np.testing.assert_allclose(A.sum(-1).numpy(), 1.0, rtol=1e-12)
    else:
        assert bool((A.sum(-1) > 0).all())


def test_raf_and_relu_attention_are_the_general_map_to_the_last_bit():
    for seed in range(3):
        X, W = _text(17, 9, seed)
        for dt in (torch.float64, torch.float32):
            Xd, Wd = X.to(dt), W.to(dt)
            assert torch.equal(attention(Xd, Wd), ws.raf(Xd, Wd))
            assert torch.equal(attention(Xd, Wd, normalisation="relu"), ws.relu_attention(Xd, Wd))
            # β > 0 leaves rownorm(ReLU(β·s)) unchanged
            assert torch.equal(
                attention(Xd, Wd, normalisation="relu", beta=3.0), ws.relu_attention(Xd, Wd)
            )


def test_sparsemax_matches_the_package_and_is_sparse():
    from entmax import sparsemax as pkg_sparsemax

    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 40, generator=g, dtype=torch.float64) * 3
    p = sparsemax(z)
    torch.testing.assert_close(p, pkg_sparsemax(z, dim=-1), rtol=1e-12, atol=1e-14)
    assert bool(((p == 0).sum(-1) > 0).all())  # every row has zero weights


def test_sparsemax_one_hot_exactly_when_the_gap_exceeds_one():
    # a gap of 1 + 2⁻¹⁰ (representable) between the top score and the rest: exactly one-hot,
    # whatever n; a gap of 1 − 2⁻¹⁰: the second key has weight 2⁻¹¹
    for n in (2, 10, 1000):
        z = torch.zeros(n, dtype=torch.float64)
        z[3 % n] = 1 + 2.0**-10
        assert torch.equal(
            sparsemax(z), torch.nn.functional.one_hot(torch.tensor(3 % n), n).to(torch.float64)
        )
    z = torch.tensor([1 - 2.0**-10, 0.0, -5.0], dtype=torch.float64)
    assert sparsemax(z).tolist() == [1 - 2.0**-11, 2.0**-11, 0.0]


def test_entmax_limits_and_sparsity():
    X, W = _text(9, 4, 6)
    sp = attention(X, W, normalisation="sparsemax")
    e2 = attention(X, W, normalisation="entmax", alpha=2.0)
    torch.testing.assert_close(e2, sp, rtol=1e-9, atol=1e-12)  # α = 2: sparsemax
    e1 = attention(X, W, normalisation="entmax", alpha=1 + 1e-4)
    torch.testing.assert_close(e1, ws.raf(X, W), rtol=0, atol=5e-3)  # α → 1: softmax
    A = ws.maps.normalise_scores(
        ws.maps.attention_scores(X, W) * 4, Normalisation("entmax", alpha=1.5)
    )
    assert bool(((A == 0).sum(-1) > 0).any())


def test_hardmax_is_the_large_beta_limit_of_softmax():
    X, W = _text(12, 7, 8)
    hard = attention(X, W, normalisation="hardmax")
    top2 = torch.topk(ws.maps.attention_scores(X, W), 2, dim=-1).values
    gap = float((top2[:, 0] - top2[:, 1]).min())  # the smallest top-two gap of a row
    for t in (5.0, 20.0):
        soft = attention(X, W, beta=t / gap)
        # ‖softmax(βz) − e_top‖₁ ≤ 2(n − 1)e^{−β·gap}, and every row of X has norm √d
        bound = 2 * 11 * math.exp(-t) * math.sqrt(7)
        assert 0 < float((soft - hard).abs().max()) <= bound
    # ties: uniform on the tied maxima, as the limit is
    z = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.float64)
    assert ws.maps._hardmax(z).tolist() == [[0.0, 0.5, 0.5, 0.0]]


def test_scalable_is_softmax_at_beta_s_log_n():
    X, W = _text(20, 5, 2)
    torch.testing.assert_close(
        attention(X, W, normalisation="scalable", s=0.5),
        attention(X, W, beta=0.5 * math.log(20)),
        rtol=1e-13,
        atol=0,
    )


def test_bad_arguments_are_refused():
    X, W = _text(5, 3)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        attention(X, W, normalisation="softmx")
    with pytest.raises(ValueError, match="s applies only"):
        attention(X, W, s=2.0)
    with pytest.raises(ValueError, match="alpha applies only"):
        attention(X, W, normalisation="sparsemax", alpha=1.5)
    with pytest.raises(ValueError, match="bias applies only"):
        attention(X, W, normalisation="softmax", bias=0.0)
    with pytest.raises(ValueError, match="alpha must be a finite number ≥ 1.0001"):
        attention(X, W, normalisation="entmax", alpha=1.0)
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        attention(X, W, beta=0.0)
    with pytest.raises(TypeError, match="beta must be a real number"):
        attention(X, W, beta=True)
    with pytest.raises(ValueError, match="not beside it"):
        attention(X, W, normalisation=Normalisation("softmax"), beta=2.0)
    with pytest.raises(ValueError, match="d × d"):
        attention(X, W[:2], normalisation="sparsemax")
    with pytest.raises(ValueError, match="overflow"):
        attention(X, W * 1e200, beta=1e200)
    assert set(NORMALISATIONS) == {c.name for c in CASES}


@pytest.mark.parametrize("norm", CASES, ids=repr)
def test_fast_objective_equals_full_map(norm):
    n, d = 12, 5
    X, W = _text(n, d, 3)
    obj = ob.fast_objective(X, W, norm)
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([0, 4, 11, 4, 7])
    Delta = torch.randn(5, d, generator=g, dtype=torch.float64) * 1.5
    Delta[3] = tk.row_takeover(X, W, 4)  # a take-over: the large-change regime
    fast = obj(rows, Delta)
    for b in range(5):
        full = ws.relative_change(
            lambda Z: attention(Z, W, normalisation=norm), X, int(rows[b]), Delta[b]
        )
        np.testing.assert_allclose(float(fast[b]), full, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "norm",
    [
        Normalisation("sparsemax"),
        Normalisation("entmax"),
        Normalisation("scalable"),
        Normalisation("sigmoid"),
        Normalisation("hardmax"),
    ],
    ids=repr,
)
def test_fast_estimator_and_generic_are_each_justified(norm):
    """Different floating-point computations, so each answer is checked on its own
    (``justified``, issue 23 item 13), within ``[certified_lower_bound, upper]``: both start
    from the take-over constructions; ``upper`` is ``stochastic_upper`` (sigmoid's weights
    are in [0, 1] but not row-stochastic); ``tol`` is the fast update's agreement with the
    full map in ``test_fast_objective_equals_full_map`` above (rtol 1e-9)."""
    X, W = _text(10, 6, 5)
    phi = lambda Z: attention(Z, W, normalisation=norm)  # noqa: E731
    cands = torch.cat([tk.takeover_candidates(X, W, r) for r in range(10)])
    lower = {r: tk.certified_lower_bound(X, W, r, normalisation=norm) for r in range(10)}
    upper = stochastic_upper(X, phi(X), row_stochastic=norm.name != "sigmoid")
    gen = ws.word_sensitivity(phi, X, init=cands, steps=20, starts=3, seed=7)
    fast = at.attention_word_sensitivity(
        X, W, normalisation=norm, init=cands, steps=20, starts=3, seed=7
    )
    for res in (gen, fast):
        assert_justified(res, phi, X, lower=lower, upper=upper, tol=2e-9 * max(lower.values()))


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e6])
def test_fast_objective_stable_at_every_score_scale(scale):
    """Large scores: one key takes (almost) every row; the compact sparsemax update and the
    softmax update still equal the full map."""
    X, W = _text(9, 4, 11)
    for norm in (
        Normalisation("sparsemax", beta=scale),
        Normalisation("softmax", beta=scale),
        Normalisation("hardmax"),
        Normalisation("sigmoid", beta=scale),
    ):
        obj = ob.fast_objective(X, W, norm)
        Delta = tk.takeover_candidates(X, W, 2)
        fast = obj(torch.full((Delta.shape[0],), 2), Delta)
        for b in range(Delta.shape[0]):
            full = ws.relative_change(
                lambda Z: attention(Z, W, normalisation=norm), X, 2, Delta[b]
            )
            np.testing.assert_allclose(float(fast[b]), full, rtol=1e-8, atol=1e-10)


def test_required_margin_is_the_propositions():
    from wsutils.experiments.normalisation import required_margin

    eps = 0.01
    for n in (2, 10, 1000):
        m = required_margin("softmax", n, eps)
        # softmax with the other n − 1 scores tied at −m: self-weight exactly 1 − ε
        z = torch.full((n,), -m, dtype=torch.float64)
        z[0] = 0.0
        np.testing.assert_allclose(float(torch.softmax(z, 0)[0]), 1 - eps, rtol=1e-12)
        ms = required_margin("scalable", n, eps)
        np.testing.assert_allclose(ms * math.log(n), m, rtol=1e-12)
    assert required_margin("sparsemax", 5) == 1.0
    assert required_margin(Normalisation("entmax", alpha=1.25, beta=2.0), 5) == 2.0
    assert required_margin("hardmax", 5) == 0.0
    with pytest.raises(ValueError, match="no margin condition"):
        required_margin("relu", 5)
    with pytest.raises(ValueError, match="eps"):
        required_margin("softmax", 5, 0.0)


def test_row_margin_and_phase_point():
    from wsutils.experiments.normalisation import phase_point, row_margin

    X, W = _text(30, 16, 9)
    r = row_margin(X, W, 0, "sparsemax")
    Xp = X.clone()
    Xp[0] += tk.row_takeover(X, W, 0)
    s = (Xp @ W @ Xp.T / 4.0)[0]
    np.testing.assert_allclose(r["margin"], float(s[0] - s[1:].max()), rtol=1e-12)
    assert (r["others_weight"] == 0.0) == (r["margin"] > 1)
    p = phase_point(16, 30, 9)
    assert p["margin"] == r["margin"] and p["a_sparsemax"] == r["self_weight"]


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 14),
    d=st.integers(1, 6),
    seed=st.integers(0, 10**5),
    log_beta=st.floats(-2, 3),
    name=st.sampled_from(["sparsemax", "entmax", "hardmax"]),
)
def test_compact_update_exact_for_random_texts(n, d, seed, log_beta, name):
    """The keys outside C_j never carry weight after a one-word change: the compact update
    equals the full map for random sizes, score scales and perturbations (random and take-over)."""
    X, W = _text(n, d, seed)
    norm = Normalisation(name, beta=10.0**log_beta)
    obj = ob.fast_objective(X, W, norm)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n, (4,), generator=g)
    Delta = ws.sensitivity.project_ball(
        torch.randn(4, d, generator=g, dtype=torch.float64) * 2, math.sqrt(d)
    )
    Delta[0] = tk.row_takeover(X, W, int(rows[0]))
    fast = obj(rows, Delta)
    for b in range(4):
        full = ws.relative_change(
            lambda Z: attention(Z, W, normalisation=norm), X, int(rows[b]), Delta[b]
        )
        # the squared change is a sum of expanded terms, exact to u·M² (M ≤ 3√d per row, u
        # the unit roundoff): a change that vanishes in exact arithmetic comes out as at most
        # about √(u·n)·3√d/‖φ(X)‖_F ≈ 1e-7 here, through the square root
        np.testing.assert_allclose(float(fast[b]), full, rtol=1e-8, atol=1e-7)


@pytest.mark.parametrize("name", ["softmax", "scalable", "sparsemax", "entmax", "hardmax"])
@pytest.mark.parametrize("n, d, seed", [(40, 4, 1), (300, 8, 2), (200, 3, 5)])
def test_doubling_bound(name, n, d, seed):
    """prop-norm-double: the doubling Δ = x_i changes φ by at least the bound, from the scores;
    and the bound is the direct formula (1/n)Σ_j (3ℓ_j − 2)_+² with ℓ_j from μ_j."""
    from wsutils.experiments.normalisation import CHAPTER, doubling_bound

    X, W = _text(n, d, seed)
    norm = CHAPTER[name]
    b = doubling_bound(X, W, 2, name)
    change = ws.relative_change(lambda Z: attention(Z, W, normalisation=norm), X, 2, X[2])
    assert change >= b["bound"] * (1 - 1e-12)
    s = (X @ W @ X.T / math.sqrt(d)).numpy()
    mu = np.array([2 * s[j, 2] - np.delete(s[j], 2).max() for j in range(n) if j != 2])
    if name in ("softmax", "scalable"):
        lb = 1 / (1 + (n - 1) * np.exp(-norm.scale(n) * mu))
    else:
        c = {"hardmax": 0.0, "sparsemax": 1.0, "entmax": 2.0}[name]
        lb = (mu > c).astype(float)
    f = np.maximum(3 * lb - 2, 0)
    np.testing.assert_allclose(b["bound"], math.sqrt((f**2).sum() / n), rtol=1e-12)
    with pytest.raises(ValueError, match="covers"):
        doubling_bound(X, W, 0, "relu")


def test_doubling_bound_positive_for_hardmax_at_small_d():
    """The bound of prop-norm-double is not vacuous: at d = 3 many rows make key i the winner."""
    from wsutils.experiments.normalisation import doubling_bound

    X, W = _text(500, 3, 4)
    assert doubling_bound(X, W, 0, "hardmax")["bound"] > 0.1


@pytest.mark.parametrize("name", ["sparsemax", "entmax", "hardmax"])
@pytest.mark.parametrize("n, d", [(400, 8), (300, 64)])
def test_compact_update_in_groups_equals_full_map(name, n, d):
    """Large texts: the rows fall into several groups of their own set size (and K > d uses
    the vector form, K ≤ d the Gram form); every group still equals the full map."""
    X, W = _text(n, d, 21)
    norm = Normalisation(name)
    obj = ob.fast_objective(X, W, norm)
    if name == "entmax":
        assert len(obj.groups) > 1
    g = torch.Generator().manual_seed(3)
    rows = torch.tensor([0, 7, 123, 7])
    Delta = ws.sensitivity.project_ball(
        torch.randn(4, d, generator=g, dtype=torch.float64), math.sqrt(d)
    )
    Delta[1] = tk.key_takeover(X, W, 7)
    Delta[2] = tk.row_takeover(X, W, 123)
    fast = obj(rows, Delta)
    for b in range(4):
        full = ws.relative_change(
            lambda Z: attention(Z, W, normalisation=norm), X, int(rows[b]), Delta[b]
        )
        np.testing.assert_allclose(float(fast[b]), full, rtol=1e-8, atol=1e-7)


def test_entmax_threshold_on_the_largest_entries_is_a_lower_bound():
    """The bisection on the k largest entries: at most the whole row's threshold, and equal to
    it (to rounding) when the support has at most k entries; the package agrees."""
    from entmax.activations import _entmax_threshold_and_support

    g = torch.Generator().manual_seed(5)
    z = torch.randn(40, 500, generator=g, dtype=torch.float64) * 3
    tau_pkg, supp = _entmax_threshold_and_support(z / 2, dim=-1)  # α = 1.5: z/2 − τ
    full = ob._entmax_threshold(z, 1.5, k=500)
    np.testing.assert_allclose(full.numpy(), tau_pkg.numpy(), rtol=0, atol=1e-12)
    for k in (5, 64):
        part = ob._entmax_threshold(z, 1.5, k=k)
        assert bool((part <= full + 1e-12).all())
        fits = supp[:, 0] <= k
        np.testing.assert_allclose(part[fits].numpy(), full[fits].numpy(), rtol=0, atol=1e-12)
    assert bool((supp[:, 0] > 5).any())  # k = 5 truncates some rows


def test_margin_interval_brackets_the_self_weight():
    """prop-norm-margin 1, 2: 1/(1+(n−1)e^{−cm}) ≤ a ≤ 1/(1+e^{−cm}); so a ≥ a_min fails below the
    necessary margin and holds above the sufficient one, for random rows."""
    from wsutils.experiments.normalisation import margin_interval

    g = torch.Generator().manual_seed(1)
    for name in ("softmax", "scalable"):
        norm = ws.experiments.normalisation.CHAPTER[name]
        for n in (2, 10, 1000):
            nec, suf = margin_interval(name, n, 0.9)
            for m, takes in ((nec - 1e-6, False), (suf + 1e-6, True)):
                z = -m - torch.rand(n, generator=g, dtype=torch.float64) * 3
                z[0] = 0.0
                z[1] = -m  # the largest competitor: margin m
                a = float(torch.softmax(norm.scale(n) * z, 0)[0])
                assert (a >= 0.9) == takes
    assert margin_interval("sparsemax", 10, 1) == (1.0, 1.0)
    with pytest.raises(ValueError, match="one-hot"):
        margin_interval("sparsemax", 10, 0.9)
    with pytest.raises(ValueError, match="covers"):
        margin_interval("relu", 10, 0.9)


def test_takeover_margin_model():
    """The cosine law behind the model: P(t > q_{d,n}) = 1 − 2^{−1/(n−1)} by simulation of
    uniform unit vectors; the median maximum grows with n and stays ≤ 1; the margin model is
    the mean self-score minus the mean ‖v‖ times q."""
    from wsutils.experiments.normalisation import takeover_margin_model

    g = torch.Generator().manual_seed(0)
    for d in (2, 8, 64):
        qs = [takeover_margin_model(d, n)["q"] for n in (10, 100, 10**4)]
        assert qs == sorted(qs) and 0 < qs[0] and qs[-1] <= 1
        u = torch.randn(200_000, d, generator=g, dtype=torch.float64)
        t = u[:, 0] / torch.linalg.vector_norm(u, dim=1)
        p = float((t > qs[0]).double().mean())
        np.testing.assert_allclose(p, 1 - 2 ** (-1 / 9), atol=4e-3)  # ±5 s.e. at 2e5 draws
        r = takeover_margin_model(d, 100)
        np.testing.assert_allclose(r["margin"], r["self_score"] - r["v_norm"] * r["q"], rtol=1e-12)
    big = takeover_margin_model(128, 1000)  # large d: √(2d) and √(3.5 d), roughly
    assert abs(big["self_score"] - math.sqrt(256)) < 3 and abs(big["v_norm"] - math.sqrt(448)) < 2


def test_cosine_law_tail_and_median_maximum_by_simulation():
    """obs-norm-phase's model, beyond the one quantile above: the law
    P(υ > q) = ½·I_{1−q²}((d−1)/2, ½) in the tail (q = 0.5, 0.8), and q_{d,n} as the median
    of the largest of n − 1 simulated cosines (P(max ≤ q_{d,n}) = ½)."""
    from scipy import special

    from wsutils.experiments.normalisation import takeover_margin_model

    g = torch.Generator().manual_seed(7)
    for d in (3, 8):
        u = torch.randn(400_000, d, generator=g, dtype=torch.float64)
        t = u[:, 0] / torch.linalg.vector_norm(u, dim=1)
        for q in (0.5, 0.8):
            law = 0.5 * special.betainc((d - 1) / 2, 0.5, 1 - q * q)
            se = math.sqrt(law * (1 - law) / t.numel())
            assert abs(float((t > q).double().mean()) - law) < 5 * se  # 5 binomial s.e.
    for d, n in ((4, 100), (16, 300)):
        q = takeover_margin_model(d, n)["q"]
        u = torch.randn(2000, n - 1, d, generator=g, dtype=torch.float64)
        top = (u[..., 0] / torch.linalg.vector_norm(u, dim=-1)).amax(dim=1)
        frac = float((top <= q).double().mean())
        assert abs(frac - 0.5) < 5 * math.sqrt(0.25 / 2000)  # 5 binomial s.e.
    # the quantile function behind sd: symmetric, and P(υ > τ) = p below zero too
    from wsutils.experiments.normalisation import _cosine_quantile

    p = np.array([0.05, 0.3, 0.5, 0.7, 0.95])
    tau = _cosine_quantile(8, p)
    np.testing.assert_allclose(tau, -tau[::-1], atol=1e-12)
    u = torch.randn(400_000, 8, generator=g, dtype=torch.float64)
    t = (u[:, 0] / torch.linalg.vector_norm(u, dim=1)).numpy()
    emp = np.array([(t > x).mean() for x in tau])
    assert np.all(np.abs(emp - p) < 5 * np.sqrt(p * (1 - p) / t.size))


def test_entmax_refuses_inaccurate_alpha_and_is_finite_at_large_alpha(monkeypatch):
    """Near α = 1 the bisection's error grows like u/(α − 1) (1e-5 at α − 1 = 1e-12): refused,
    softmax is that limit. At α = 1e20 the output used to be all NaN with no error: it is the
    hardmax limit. A map whose output is not finite is a ValueError that says so."""
    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    for a in (1 + 1e-12, 1 + 1e-6, 1 + 0.99e-4):
        with pytest.raises(ValueError, match="alpha"):
            Normalisation("entmax", alpha=a)
    Normalisation("entmax", alpha=ws.maps.ENTMAX_MIN_ALPHA)
    big = attention(X, W, normalisation="entmax", alpha=1e20)
    np.testing.assert_allclose(big, attention(X, W, normalisation="hardmax"), rtol=1e-12)
    S = at.attention_word_sensitivity(
        X, W, normalisation=Normalisation("entmax", alpha=1e20), starts=1, steps=3
    )
    assert math.isfinite(S.value)
    monkeypatch.setattr(ws.maps, "normalise_scores", lambda s, norm: s * math.nan)
    with pytest.raises(ValueError, match="not finite"):
        attention(X, W, normalisation="entmax", alpha=2.5)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax", "sigmoid"])
def test_float32_search_keeps_every_certificate_in_float64(name):
    """normalisation_point(search={"dtype": "float32"}): the search only proposes Δ; S, the
    certificate and the other fields read from the float64 text are those of the float64
    point (the certificate exactly, S as a search: loosely), and S ≥ the certificate."""
    from wsutils.experiments.normalisation import SEARCH_DTYPE, normalisation_point

    p = dict(normalisation=name, d=8, n=48, seed=4, rows=[0])
    r64 = normalisation_point(**p, search=dict(starts=2, steps=15))
    r32 = normalisation_point(**p, search=dict(starts=2, steps=15, dtype="float32"))
    assert r32["certified"] == r64["certified"] and r32["margin"] == r64["margin"]
    assert r32["certified"] <= r32["S"] * (1 + 1e-9)
    assert abs(r32["S"] / r64["S"] - 1) < 1e-2  # a search, not one path: loose
    assert SEARCH_DTYPE["relu"] is None and SEARCH_DTYPE["hardmax"] is None


def test_scale_is_the_chapters_sizes(monkeypatch):
    """scale() picks SCALES by WSBOOK_SCALE; the paper grid, its seeds per point and the
    prose that names them are those the chapter computed before its sizes moved here."""
    from wsutils.experiments import normalisation as nm

    monkeypatch.setenv("WSBOOK_SCALE", "paper")
    paper = nm.scale()
    assert paper is nm.SCALES["paper"] and nm.scale("quick") is nm.SCALES["quick"]
    with pytest.raises(ValueError, match="scale"):
        nm.scale("huge")
    assert dict(paper.grid) == {32: (16, 64, 256, 1024), 128: (16, 128), 768: (16, 128)}
    assert paper.d_fit == 32
    assert paper.search("softmax") == dict(
        rows="every",
        search=dict(starts=2, steps=30, dtype="float32"),
        screen=dict(starts=0, steps=0, constructions=True, keep=2),
    )
    assert paper.search("relu")["search"]["dtype"] is None
    assert paper.search("relu")["screen"] == dict(constructions=True, starts=2, steps=10, keep=2)
    assert paper.search("sigmoid")["screen"] == dict(
        constructions=True, starts=2, steps=30, keep=2
    )
    assert [paper.seeds(32, n) for n in (16, 1024)] == [3, 3]
    assert paper.seeds(128, 16) == 2 and paper.seeds(32, 1024, "entmax") == 3
    assert paper.lengths(32, "entmax") == (16, 64, 256)
    assert paper.lengths(32, "sparsemax") == (16, 64, 256, 1024)
    assert paper.grid_text() == (
        "d = 32: n = 16, 64, 256, 1024 (3 seeds); "
        "d = 128: n = 16, 128 (2 seeds); d = 768: n = 16, 128 (2 seeds)"
    )
    quick = nm.scale("quick")
    assert quick.grid_text() == "d = 16: n = 16, 64, 256 (3 seeds)" and quick.workers == 1
    for P in (quick, paper):  # the flip experiment lies beyond softmax's boundary
        assert math.log(P.flip_n) > math.sqrt(2 * P.flip_d) + 1


def test_parse_is_the_one_way_in():
    """Issue 33 step 1: every way the book names a map reads the same Normalisation."""
    from wsutils.maps import Normalisation as N

    sparse = N("sparsemax")
    assert N.parse(sparse) is sparse
    assert N.parse("raf") == N.parse("softmax") == N("softmax")
    assert N.parse("relu") == N("relu")
    assert N.parse({"name": "scalable", "s": 2.0}) == N("scalable", s=2.0)
    assert N.parse({"name": "raf", "beta": 2.0}) == N("softmax", beta=2.0)
    with pytest.raises(ValueError, match="the paper's 'raf'"):
        N.parse("softermax")
    with pytest.raises(ValueError, match="needs 'name'"):
        N.parse({"s": 2.0})
    with pytest.raises(TypeError, match="normalisation must be a name"):
        N.parse(3)
    # the parsers that read through it: the estimators, the flip experiment, the chapter's
    from wsutils.estimators.takeover import certified_lower_bound
    from wsutils.experiments.normalisation import _norm
    from wsutils.generalization import flip_normalisation

    assert _norm("softmax") == flip_normalisation("attention", "raf")
    assert _norm("tempered") == N("softmax", beta=2.0)
    X, W = ws.sample_X(5, 4, seed=0), ws.sample_W(4, seed=1)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        certified_lower_bound(X, W, 0, normalisation="softermax")


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "relu", "hardmax"])
def test_grid_point_searches_every_word(name):
    """The chapter's grid point (rows="every", its screen): word 1 and the screen's best are
    certified by one search, S is the best of them (so never below word 1's value in that
    search) and the constructions at every certified word are below S. With no steps (each
    start its own best iterate: a float32 path in another batch shape may round apart),
    word 1's value is at least the fixed-word search's (its starts are a superset: the same
    random starts, seeded alike, and the screened Δ), up to the rounding of two float64
    certifications."""
    from tests.rounding import gamma
    from wsutils.experiments import normalisation as nm

    p = dict(normalisation=name, d=8, n=40, seed=5)
    P = nm.scale("quick")
    r = nm.normalisation_point(**p, **P.search(name))
    assert 0 in r["certified_rows"] and len(r["certified_rows"]) in (P.keep, P.keep + 1)
    assert r["S"] >= r["S_word1"] and r["certified"] <= r["S"] * (1 + 1e-9)
    still = dict(starts=2, steps=0)
    r = nm.normalisation_point(**p, rows="every", search=still, screen=P.search(name)["screen"])
    fixed = nm.normalisation_point(**p, rows=[0], search=still)
    assert r["S_word1"] >= fixed["S"] * (1 - 2 * gamma(40 * 8))
    with pytest.raises(ValueError, match="rows='every'"):
        nm.normalisation_point(**p, rows=[0], screen=dict(keep=2))
