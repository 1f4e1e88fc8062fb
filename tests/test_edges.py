"""Issue 51: the edges of the code added since the last round of bad inputs. Each test here
failed on d7e7616 (a crash, a torch error where a ValueError naming the argument is due, a
silent NaN or a stale answer) and holds now."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import wsutils as ws
import wsutils.generalization as G
from wsutils.estimators.drf import arccos_map, drf_limit_change
from wsutils.estimators.rf import rf_certified_lower
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.run.glue import _plain
from wsutils.run.records import grid_array
from wsutils.run.sweep import process_pool, run_grid
from wsutils.search import Search

EPS64 = torch.finfo(torch.float64).eps


# --- item 2: one-word texts, bad rows and dtypes of the flip models ---------------------------


@pytest.mark.parametrize("norm", ["raf", "relu"])
def test_attention_flip_model_of_a_one_word_text(norm):
    """``n = 1``: the model builds, and its three read-outs (the full forward pass, the
    row-and-column one, the candidates' one) agree; each is a sum of ``n·d`` products of
    numbers of order ``√d``, so they agree to ``n·d·ε`` relative (a few rounding steps more
    for the normalisation): ``1e3·n·d·ε``."""
    X, W = ws.sample_X(1, 4, seed=0), ws.sample_W(4, seed=1)
    model = G.attention_flip_model(X, W, norm, 0)
    D = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    w = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    full = model.phi_row(D) @ w
    tol = 1e3 * 4 * EPS64 * float(full.abs().max() + 1)
    torch.testing.assert_close(model.readout(D, w), full, rtol=0, atol=tol)
    torch.testing.assert_close(model.readouts(w[None])(D)[:, 0], full, rtol=0, atol=tol)
    scores = G.word_scores(model, X[0], X[0] + D, w[None])
    torch.testing.assert_close(scores[:, 0], full, rtol=0, atol=tol)


@pytest.mark.parametrize("row", [-1, 5, True, 0.0, 1.5])
def test_attention_flip_model_refuses_bad_rows(row):
    X, W = ws.sample_X(5, 4, seed=0), ws.sample_W(4, seed=1)
    with pytest.raises(ValueError, match="row"):
        G.attention_flip_model(X, W, "raf", row)


def test_flip_models_refuse_other_dtypes():
    X, W = ws.sample_X(5, 4, seed=0), ws.sample_W(4, seed=1)
    with pytest.raises(ValueError, match="X is float32"):
        G.attention_flip_model(X.float(), W, "raf", 0)
    with pytest.raises(ValueError, match="W must be"):
        G.attention_flip_model(X, W[:3], "raf", 0)
    h, Vi = torch.randn(6, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="Vi is float32"):
        G.rf_flip_model(h, Vi.float())


def test_flip_runs_refuses_a_float_row():
    Xs, Y, X, y = G.planted_data(3, 4, 3, seed=0)
    with pytest.raises(ValueError, match="row"):
        G.flip_runs("raf", Xs, Y, X, y, Ns=[2], seed=0, row=1.0)


# --- item 3: one check of the position numbering for every row built from token ids ---------


def test_substitution_rows_refuses_roberta_numbering(tmp_path):
    """RoBERTa numbers positions from ``padding_idx + 1``: rows made with
    ``position_ids = i`` would be another position's, so substitution_rows refuses, with the
    check vocabulary_changes uses (``check_positions``)."""
    pytest.importorskip("transformers")
    from tiny_bert import save_tiny_bert, tiny_roberta

    from wsutils.text import embeddings as em
    from wsutils.text.token_rows import substitution_rows

    torch.manual_seed(0)
    bert = em.load_model(str(save_tiny_bert(tmp_path)))
    rob = tiny_roberta(bert)
    ids = bert.tokenizer("i love the movie")["input_ids"]
    assert substitution_rows(bert, ids, 2, 8, tokens=[5, 6]).shape == (2, 8)
    with pytest.raises(ValueError, match="number a text's positions"):
        substitution_rows(rob, ids, 2, 8, tokens=[5, 6])


# --- item 4: a search's keywords replace a dict's fields; switches are bools -----------------


def test_search_keywords_replace_a_dicts_fields():
    assert Search.parse({"steps": 3}, steps=9).steps == 9
    assert Search.parse({"steps": 3, "starts": 2}, steps=9).starts == 2
    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    r = attention_word_sensitivity(X, W, search={"steps": 3}, steps=4)
    assert math.isfinite(r.value)
    assert math.isfinite(ws.rf_word_sensitivity(X, 24, search={"steps": 3}, steps=4).value)


@pytest.mark.parametrize("value", ["false", "True", 1, 0, None])
def test_search_progress_is_a_bool_or_seconds(value):
    with pytest.raises(TypeError, match="progress must be True or False, or a float"):
        Search(progress=value)
    assert Search(progress=np.bool_(True)).progress is True
    assert Search(progress=np.float32(2.5)).progress == 2.5
    assert Search(progress=0.0).bar() == {"disable": False, "delay": 0.0}
    assert Search().bar() == {"disable": True}
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="progress must be a finite number"):
            Search(progress=bad)


# --- item 5: Dask runs a failed grid's points again ------------------------------------------


def test_dask_reruns_the_points_of_a_failed_grid(tmp_path):
    distributed = pytest.importorskip("distributed")
    from sweep_points import fails_until

    flag = tmp_path / "ready"
    grid = [{"x": x, "flag": str(flag)} for x in range(3)]
    with (
        distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        for store in (None, tmp_path / "store"):
            flag.unlink(missing_ok=True)
            with pytest.raises(RuntimeError, match="not ready"):
                run_grid(
                    fails_until,
                    grid,
                    executor=client.get_executor(),
                    store=store or False,
                    progress=False,
                )
            flag.touch()
            out = run_grid(
                fails_until,
                grid,
                executor=client.get_executor(),
                store=store or False,
                progress=False,
            )
            assert [r["y"] for r in out] == [0, 1, 4]


# --- item 6: a pool's workers die with their parent; numpy integers are integers -------------

POOL_SCRIPT = """
import os, sys, torch
torch.set_num_threads(2)
from wsutils.run.sweep import process_pool
pool = process_pool(2)
futs = [pool.submit(os.getpid) for _ in range(8)]
print(" ".join(str(p) for p in sorted({f.result() for f in futs})), flush=True)
import time; time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for its new parent to reap it is dead too
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_exit_when_their_parent_is_killed():
    proc = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and proc.pid not in pids
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "a worker outlived its killed parent"
    finally:
        proc.kill()


def test_process_pool_takes_numpy_integers():
    pool = process_pool(np.int64(1))
    assert pool is None
    with pytest.raises(ValueError, match="positive integer"):
        process_pool(np.bool_(True))


# --- item 7: grid_array refuses a repeated axis value ----------------------------------------


@pytest.mark.parametrize("ns", [[10, 10], [10, 20, 10]])
def test_grid_array_refuses_repeated_axis_values(ns):
    recs = [{"n": n, "v": float(n)} for n in (10, 20)]
    with pytest.raises(ValueError, match="axis 'n' repeats the value 10"):
        grid_array(recs, "v", {"n": ns})


# --- item 8: a knob read one way by the kernels and by the cache key -------------------------


def test_cache_key_reads_a_spaced_model_path_as_the_kernels_do(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "book" / "_ext"))
    try:
        import wsbook_execute as wx
    finally:
        sys.path.pop(0)
    from wsutils.run import config

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    plain = {"WSBOOK_MODEL": str(folder)}
    for spaced in (f" {folder}", f"{folder} ", f"{folder}\n"):
        env = {"WSBOOK_MODEL": spaced}
        assert config.knob("WSBOOK_MODEL", env) == str(folder)
        assert wx.resolve_path_knobs(env)["WSBOOK_MODEL"] == str(folder)
        assert wx.environment_key(env) == wx.environment_key(plain)
    before = wx.environment_key({"WSBOOK_MODEL": f" {folder}\n"})
    (folder / "config.json").write_text('{"edited": 1}')
    assert wx.environment_key({"WSBOOK_MODEL": f" {folder}\n"}) != before


def test_installed_digest_reads_every_site_folder_on_the_path(monkeypatch, tmp_path):
    """A user site or a system site folder on ``sys.path`` is where the kernel imports from:
    it is among the folders the key reads."""
    from wsutils import _digest

    user = tmp_path / "lib" / "site-packages"
    user.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(user), *sys.path])
    assert _digest.install_folders()[0] == str(user)


# --- item 9: the flip API checks at the door --------------------------------------------------


def _flip_features():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 9, dtype=torch.float64, generator=g), torch.tensor(
        [1.0, -1.0, 1.0, -1.0], dtype=torch.float64
    )


@pytest.mark.parametrize("y", [math.nan, math.inf])
def test_trained_readouts_refuses_a_non_finite_label(y):
    Phi, Y = _flip_features()
    with pytest.raises(ValueError, match="y must be finite"):
        G.trained_readouts(Phi[:3], Y[:3], Phi[3], y, Ns=[3])


def test_trained_readouts_refuses_nan_labels_and_a_short_phi():
    Phi, Y = _flip_features()
    Y[1] = math.nan
    with pytest.raises(ValueError, match="Y has 1 non-finite"):
        G.trained_readouts(Phi[:3], Y[:3], Phi[3], 1.0, Ns=[3])
    Phi, Y = _flip_features()
    with pytest.raises(ValueError, match="phi must be"):
        G.trained_readouts(Phi[:3], Y[:3], Phi[3, :8], 1.0, Ns=[3])


def test_word_scores_and_search_flips_refuse_another_width():
    X, W = ws.sample_X(5, 4, seed=0), ws.sample_W(4, seed=1)
    model = G.attention_flip_model(X, W, "raf", 0)
    with pytest.raises(ValueError, match="width d = 4, got width 5"):
        G.word_scores(model, torch.zeros(5), torch.zeros(2, 5), torch.zeros(1, 20))
    with pytest.raises(ValueError, match="width d = 4, got width 3"):
        G.search_flips(model, torch.zeros(1, 20), [1.0], 3)
    # a model of unknown width fails on the probe, as a ValueError
    own = G.FlipModel(phi_row=lambda D: D @ torch.ones(4, 2, dtype=D.dtype), readout=None)
    with pytest.raises(ValueError, match="does not take a change of width d = 3"):
        G.search_flips(own, torch.zeros(1, 2), [1.0], 3)


# --- item 10: the RF word bound outside float32's range ---------------------------------------


def _rf_case(scale_rows: float, k: int = 40, d: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Vi = torch.randn(k, d, dtype=torch.float64, generator=g)
    h = torch.randn(k, dtype=torch.float64, generator=g)
    x = torch.randn(d, dtype=torch.float64, generator=g)
    rows = x + scale_rows * torch.randn(5, d, dtype=torch.float64, generator=g)
    thetas = torch.randn(3, k, dtype=torch.float64, generator=g)
    return h, Vi, x, rows, thetas


def _exact(h, Vi, x, rows, thetas):
    return torch.relu(h + (rows - x) @ Vi.T) @ thetas.T


@pytest.mark.parametrize("scale_rows", [1e-310, 1e-300, 2e38 / 4])
def test_rf_word_bounds_stay_below_the_exact_outputs_at_range_edges(scale_rows):
    """Rows near float32's largest number (``2e38``) or changes ``Δ`` of subnormal size: the
    batch is computed in float64, where the rounding bound is proved, and the bound lies
    below the exact output. The exact output is itself computed in float64, with at most
    ``(k + d)·ε`` relative rounding per model (``k + d`` products in its sums), which is
    the slack granted."""
    h, Vi, x, rows, thetas = _rf_case(scale_rows)
    for y in (1, -1):
        L = G.rf_word_bounds(h, Vi, x, rows, thetas, y, tau=0.3)
        exact = y * _exact(h, Vi, x, rows, thetas)
        assert torch.isfinite(L).all()
        size = (torch.relu(h + (rows - x) @ Vi.T).abs() @ thetas.abs().T) + 1e-300
        slack = (Vi.shape[0] + Vi.shape[1]) * EPS64 * size
        assert bool((L <= exact + slack).all())


def test_rf_word_bounds_with_a_tiny_preactivation_and_tau_zero():
    h, Vi, x, rows, thetas = _rf_case(0.5)
    h[0] = 1e-308
    L = G.rf_word_bounds(h, Vi, x, rows, thetas, 1, tau=0.0)
    assert not torch.isnan(L).any()
    size = torch.relu(h + (rows - x) @ Vi.T).abs() @ thetas.abs().T
    assert bool((L <= _exact(h, Vi, x, rows, thetas) + 64 * EPS64 * size).all())


# --- item 11: the last round's bad inputs -------------------------------------------------------


def test_left_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="cos_theta holds NaN"):
        arccos_map(np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match="n must be positive"):
        drf_limit_change(0, 1, 0.5, 0.1)
    with pytest.raises(ValueError, match="holds nan"):
        _plain("xs", [1.0, float("nan")])
    assert _plain("xs", [1.0, 2.0]) == [1.0, 2.0]
    g = torch.Generator().manual_seed(0)
    Vi = torch.randn(10, 3, dtype=torch.float64, generator=g)
    with pytest.raises(ValueError, match="one pre-activation per row of V_i"):
        rf_certified_lower(torch.ones(9, dtype=torch.float64), Vi)
    with pytest.raises(ValueError, match="Phi is float16"):
        G.gram_cholesky(torch.randn(3, 8, generator=g).half())
    model = G.rf_flip_model(torch.ones(10, dtype=torch.float64), Vi)
    with pytest.raises(ValueError, match="width d = 3, got width 4"):
        G.search_flips(model, torch.zeros(1, 10), [1.0], 4)


# --- item 12: a map that overflows somewhere is named as such --------------------------------


def test_an_infinite_change_is_reported_as_such():
    X = ws.sample_X(4, 3, seed=0)

    def blows_up(Z):  # finite near X, +inf once word 0 has moved far
        far = (Z[..., :1, :] - X[0]).abs().amax(dim=-1, keepdim=True) > 0.5
        return torch.where(far, torch.full_like(Z, math.inf), Z)

    with pytest.raises(ValueError, match=r"\+inf at some iterate"):
        ws.word_sensitivity(blows_up, X, seed=0, starts=4, steps=20)
