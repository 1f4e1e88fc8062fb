"""The real-word flip experiment (wsutils.experiments.word_flips) on the embedded model and
the repository's reviews, at a tiny size: every model interpolates the held-out review, and the
substitution a point reports as its most flipping one gives, through the full map and a model
trained again from scratch, the output the point recorded."""

from __future__ import annotations

import pytest
import torch

from wsutils import generalization as G
from wsutils.experiments.imdb import flip_texts
from wsutils.experiments.word_flips import review_ids, word_flip_point
from wsutils.maps import Normalisation
from wsutils.text.embeddings import load_model
from wsutils.text.token_rows import substitution_rows
from wsutils.weights import sample_W

POINT = dict(n=8, d=16, Ns=[6], seed=0, reviews=8, select_seed=0, held_out=6)


def test_the_reported_substitution_is_what_the_full_map_gives():
    r = word_flip_point(**POINT, positions=[2, 5], tau=0.0)  # RF: few ruled out
    assert r["tokens"] == 30522 and r["y"] in (-1.0, 1.0)
    assert [run["map"] for run in r["runs"]] == ["rf"] * 2 + ["raf"] * 2 + ["relu"] * 2
    X_all, Y, _ = flip_texts(n=8, d=16, reviews=8, select_seed=0, max_length=128)
    X, y = torch.as_tensor(X_all[6]), float(Y[6])
    train = torch.as_tensor(X_all[:6])
    enc = load_model(None)
    ids = review_ids(enc, r["review"], imdb=None, max_length=128)
    for run in r["runs"]:
        map = run["map"]
        assert abs(run["t1"] - y) < 1e-8  # the trained model interpolates X
        assert run["best_position"] in (2, 5)
        p, v = run["best_position"], run["best_token"]
        Xv = X.clone()
        Xv[p] = torch.as_tensor(substitution_rows(enc, ids, p, 16, tokens=[v])[0])
        texts = torch.cat([train, X[None], Xv[None]])
        if map == "rf":
            H, _ = G.rf_preactivations(texts, 8 * 16, seed=0)
            F = torch.relu(H)
        else:
            F = G.attention_features(texts, sample_W(16, seed=0), Normalisation.parse(map))
        theta0 = G.min_norm_interpolator(F[:6], torch.as_tensor(Y[:6]))  # from scratch
        if run["training"] == "fine_tune":
            theta1 = G.fine_tune(theta0, F[6], y)
        else:
            theta1 = G.retrain(F[:6], torch.as_tensor(Y[:6]), F[6], y)
        assert float(F[7] @ theta1) == pytest.approx(run["best_t1"], rel=1e-6, abs=1e-9)
        assert (run["flips"] > 0) == (y * run["best_t1"] < 0)


def test_pruning_changes_nothing_but_the_count_scored():
    """Random features: the candidates a stronger bound rules out (more units scored exactly,
    ``tau``) change no flip (nor the most flipping word, where one flips); every candidate
    is ruled out or scored, and the ruled-out candidates scored anyway lie above their
    bound."""
    weak, strong = (
        word_flip_point(maps=["rf"], **POINT, positions=[2, 5], tau=tau) for tau in (0.0, 0.4)
    )
    for a, b in zip(weak["runs"], strong["runs"]):
        assert b["ruled_out"] > a["ruled_out"] > 0
        for r in (a, b):
            assert r["ruled_out"] + r["scored"] == 2 * 30522
            assert r["bound_min"] > 0  # ruled out: the bound cannot reach the sign
        keys = ("flips", "flipped_positions") + (
            ("best_position", "best_token", "best_t1") if a["flips"] else ()
        )
        for key in keys:
            assert a[key] == b[key], key
    assert weak["bound_gap"] >= 0 and strong["bound_gap"] >= 0
    assert weak["in_ball"] == strong["in_ball"] > 0


def test_maps_scored_together_as_alone():
    """The candidate rows are made once for every map: scored together or one map at a
    time, every run is the same."""
    both = word_flip_point(maps=["raf", "rf"], **POINT, positions=[3])
    alone = [word_flip_point(maps=[m], **POINT, positions=[3]) for m in ("raf", "rf")]
    assert both["runs"] == alone[0]["runs"] + alone[1]["runs"]
    for key in ("in_ball", "certified_positions", "certificate", "bound_gap"):
        assert both[key] == alone[1][key], key
    assert alone[0]["certificate"] is None and set(both["map_seconds"]) == {"raf", "rf"}


def test_word_flip_point_refuses_bad_input():
    for bad, msg in [
        (dict(maps=["sparsemax"]), "maps must be distinct ones of"),
        (dict(maps=[]), "maps must be distinct ones of"),
        (dict(maps=["raf", "raf"]), "maps must be distinct ones of"),
        (dict(maps=["raf"], positions=[0]), "word positions"),
        (dict(maps=["raf"], held_out=3), "held_out"),
        (dict(maps=["raf"], trainings=["sgd"]), "trainings"),
    ]:
        with pytest.raises(ValueError, match=msg):
            word_flip_point(**{**POINT, **bad})
