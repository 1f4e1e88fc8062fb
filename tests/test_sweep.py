"""The sweep runner: order, resume after an interruption (in process, and after a SIGKILL),
corrupt files, executors (a process pool and a real Dask cluster)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path

import pytest
import sweep_points
from sweep_points import rf_sensitivity, slow_rf_sensitivity

from wsutils.run.sweep import StoreWarning, point_key, run_grid

CALLS = []


def square(x, seed=0):
    CALLS.append(x)
    return {"y": x * x + seed}


FAIL_AT = {3}


def fails_at_three(x):
    CALLS.append(x)
    if x in FAIL_AT:
        raise RuntimeError("interrupted")
    return {"y": math.sqrt(x)}


def test_records_in_order_with_parameters():
    out = run_grid(square, [{"x": 3}, {"x": 1}, {"x": 2, "seed": 1}], progress=False)
    assert out == [{"x": 3, "y": 9}, {"x": 1, "y": 1}, {"x": 2, "seed": 1, "y": 5}]


def test_resume_after_interruption(tmp_path):
    grid = [{"x": x} for x in range(6)]
    CALLS.clear()
    with pytest.raises(RuntimeError, match="interrupted"):
        run_grid(fails_at_three, grid, store=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.json"))) == 3  # 0, 1, 2 finished and were kept
    assert not list(tmp_path.glob("*.tmp"))  # no half-written file
    CALLS.clear()
    FAIL_AT.clear()  # the cause of the crash is gone
    try:
        out = run_grid(fails_at_three, grid, store=tmp_path, progress=False)
    finally:
        FAIL_AT.add(3)
    assert CALLS == [3, 4, 5]  # only the missing points ran
    assert [r["y"] for r in out] == [math.sqrt(x) for x in range(6)]


def test_store_is_reused_and_corrupt_files_recomputed(tmp_path):
    grid = [{"x": x} for x in range(4)]
    CALLS.clear()
    first = run_grid(square, grid, store=tmp_path, progress=False)
    assert sorted(CALLS) == [0, 1, 2, 3]
    CALLS.clear()
    (tmp_path / f"{point_key(square, {'x': 2})}.json").write_text("{not json")
    with pytest.warns(StoreWarning, match="does not parse"):
        second = run_grid(square, grid, store=tmp_path, progress=False)
    assert CALLS == [2] and second == first


def test_process_pool_gives_identical_records():
    grid = [{"x": x, "seed": s} for x in range(3) for s in range(2)]
    with ProcessPoolExecutor(max_workers=2) as ex:
        parallel = run_grid(square, grid, executor=ex, progress=False)
    assert parallel == run_grid(square, grid, progress=False)


def test_bad_grids():
    with pytest.raises(ValueError, match="empty"):
        run_grid(square, [], progress=False)
    with pytest.raises(ValueError, match="duplicate"):
        run_grid(square, [{"x": 1}, {"x": 1}], progress=False)


# --- a real cluster, and a sweep process killed midway (issue 7) -----------------------------

QUICK_GRID = [{"n": n, "d": 4, "seed": s} for n in (4, 8) for s in (0, 1, 2)]


def test_dask_local_cluster_gives_identical_records():
    distributed = pytest.importorskip("distributed")
    local = run_grid(rf_sensitivity, QUICK_GRID, progress=False)
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        workers = client.run(os.getpid)
        assert len(set(workers.values()) - {os.getpid()}) == 2  # two real worker processes
        remote = run_grid(
            rf_sensitivity, QUICK_GRID, executor=client.get_executor(), progress=False
        )
    assert remote == local


SWEEP_SCRIPT = """
import sys
from wsutils.run.sweep import run_grid
from sweep_points import slow_rf_sensitivity
grid = [{"n": n, "d": 4, "seed": s, "pause": 0.15} for n in (4, 6, 8) for s in range(4)]
run_grid(slow_rf_sensitivity, grid, store=sys.argv[1], progress=False)
"""
KILL_GRID = [{"n": n, "d": 4, "seed": s, "pause": 0.15} for n in (4, 6, 8) for s in range(4)]


def test_sweep_killed_midway_resumes_to_identical_numbers(tmp_path, monkeypatch):
    store = tmp_path / "killed"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT, str(store)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(store.glob("*.json"))) < 3:
            assert proc.poll() is None, "the sweep process ended before it could be killed"
            assert time.monotonic() < deadline, "the sweep stored no point in 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    stored = len(list(store.glob("*.json")))
    assert 3 <= stored < len(KILL_GRID)  # killed midway, some points on disk
    for f in store.glob("*.json"):  # every stored file is complete
        json.loads(f.read_text())

    calls = []  # counted through time.sleep: a replaced rf_sensitivity is other code,
    sleep = time.sleep  # hence another key (test_sweep_store)
    monkeypatch.setattr(sweep_points.time, "sleep", lambda s: calls.append(s) or sleep(s))
    resumed = run_grid(slow_rf_sensitivity, KILL_GRID, store=store, progress=False)
    assert len(calls) == len(KILL_GRID) - stored  # only the missing points ran
    monkeypatch.undo()
    fresh = run_grid(slow_rf_sensitivity, [{**p, "pause": 0.0} for p in KILL_GRID], progress=False)
    assert [{k: v for k, v in r.items() if k != "pause"} for r in resumed] == [
        {k: v for k, v in r.items() if k != "pause"} for r in fresh
    ]


def numpy_point(x):
    import numpy as np

    return {"y": np.float32(x) / 2, "v": np.arange(x), "t": (x, x)}


def test_stored_records_read_back_identically(tmp_path):
    grid = [{"x": x} for x in range(3)]
    first = run_grid(numpy_point, grid, store=tmp_path, progress=False)
    again = run_grid(numpy_point, grid, store=tmp_path, progress=False)
    assert (
        first
        == again
        == [{"x": x, "y": x / 2, "v": list(range(x)), "t": [x, x]} for x in range(3)]
    )
    assert all(type(r["y"]) is float for r in first)


def test_a_failing_point_on_an_executor_keeps_the_finished_ones(tmp_path):
    grid = [{"x": x} for x in range(6)]
    with (
        ProcessPoolExecutor(max_workers=2) as ex,
        pytest.raises(RuntimeError, match="interrupted"),
    ):
        run_grid(fails_at_three, grid, executor=ex, store=tmp_path, progress=False)
    stored = {json.loads(f.read_text())["record"]["x"] for f in tmp_path.glob("*.json")}
    # 0, 1 and 2 started before 3 (the pool takes points in order) and are stored, although
    # 3 failed while they ran; 4 and 5 may have been cancelled.
    assert {0, 1, 2} <= stored and 3 not in stored


class _DoneAtSubmit(Executor):
    """Runs each point at submit, in this thread: every future has finished before run_grid
    reads the first one, so the error is read among finished points in any order."""

    def submit(self, fn, *args, **kwargs):
        fut = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - the point's own error, as an executor keeps it
            fut.set_exception(e)
        return fut


def test_points_finished_when_the_error_is_read_are_stored(tmp_path):
    """A point that had finished when another one's error was read is stored, not lost (it
    was, whenever ``as_completed`` yielded the error first: about 59 times in 60 here)."""
    grid = [{"x": x} for x in range(60)]
    with pytest.raises(RuntimeError, match="interrupted"):
        run_grid(fails_at_three, grid, executor=_DoneAtSubmit(), store=tmp_path, progress=False)
    stored = {json.loads(f.read_text())["record"]["x"] for f in tmp_path.glob("*.json")}
    assert stored == set(range(60)) - {3}


def test_imdb_searched_rows_spread_evenly_with_the_first_and_last():
    from wsutils.experiments.imdb import searched_rows

    assert searched_rows(10, None) is None and searched_rows(2, 1) == [0]
    assert searched_rows(10, 16) is None and searched_rows(16, 16) is None  # every row
    for n in (17, 20, 50, 200):
        rows = searched_rows(n, 16)
        assert len(rows) == 16 and rows[0] == 0 and rows[-1] == n - 1
        assert all(b > a for a, b in zip(rows, rows[1:]))
    for bad in (0, 2.5, True):
        with pytest.raises((TypeError, ValueError)):
            searched_rows(20, bad)


def test_imdb_sensitivity_point_searches_the_stated_rows():
    from wsutils.experiments.imdb import searched_rows, sensitivity_point

    kw = dict(
        n=20,
        d=8,
        source="gaussian",
        review=3,
        keep="all",
        seed=5,
        search=dict(steps=5, starts=2),
        model=None,
        imdb=None,
    )
    for m in ("raf", "relu", "rf"):
        spread = searched_rows(20, 4)  # what sweep_point passes: 4 rows spread evenly
        assert spread == [0, 6, 13, 19]
        every, some = sensitivity_point(map=m, **kw), sensitivity_point(map=m, rows=spread, **kw)
        assert every["n_rows"] == 20 and some["n_rows"] == 4
        assert some["row"] in (0, 6, 13, 19)
        for r in (every, some):  # the reported sup is recomputed with the full map
            assert r["S_row_min"] <= r["S"] * (1 + 1e-9) and r["S_first"] <= r["S"] * (1 + 1e-9)
            if m == "rf":  # its bound over every word is rf_high_probability_bound's
                assert math.isnan(r["upper"])
            else:  # Gaussian rows of norm √d: both attention maps have a certificate
                assert r["S"] <= r["upper"] < math.inf
        assert every["upper"] >= some["upper"] * (1 - 1e-12) or m == "rf"  # more rows bounded
    assert sensitivity_point(map="raf", rows=[0], **kw)["n_rows"] == 1


def test_process_pool_one_worker_is_this_process_and_bad_counts_are_refused():
    import torch

    from wsutils.run.sweep import process_pool

    assert process_pool(1) is None
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive integer"):
            process_pool(bad)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        pool = process_pool(2)
        try:
            assert pool.submit(int, "7").result() == 7
        finally:
            pool.shutdown()
        # no more processes than this process's threads: its share of the machine
        wide = process_pool(3)
        assert wide._max_workers == 2
        wide.shutdown()
        torch.set_num_threads(1)
        assert process_pool(2) is None
    finally:
        torch.set_num_threads(threads)


def test_pick_takes_the_entry_of_the_scale(monkeypatch):
    from wsutils.run import config

    table = {"quick": 1, "paper": 2}
    assert config.pick(table, "paper") == 2
    monkeypatch.setenv("WSBOOK_SCALE", "quick")
    assert config.pick(table) == 1
    with pytest.raises(ValueError, match="scale must be"):
        config.pick(table, "huge")
    with pytest.raises(ValueError, match="no entry"):
        config.pick({"quick": 1})


def test_imdb_scale_sweep_points_and_search_precision():
    from wsutils.experiments import imdb
    from wsutils.experiments.imdb import searched_rows, sensitivity_point, sweep_point

    q, p = imdb.scale("quick"), imdb.scale("paper")
    assert (q.ds(384), q.ns, q.texts, q.steps, q.starts) == ((96,), (10, 20, 40), 2, 25, 2)
    assert (p.ds(384), p.ns, p.texts, p.steps, p.starts) == (
        (96, 192, 384),
        (10, 20, 50, 100, 150, 200),
        3,
        100,
        4,
    )
    assert (p.gen_d(384), p.gen_Ns, q.gen_d(384), q.gen_Ns) == (
        384,
        (1100, 1200, 1300),
        96,
        (250, 300),
    )
    assert (p.rf_steps, p.rf_starts, p.rf_rows, p.workers, p.reviews) == (20, 2, 8, 2, 100)
    where = dict(model="m", imdb=None)
    raf, relu, rf = (sweep_point(p, m, 50, 96, "imdb", 7, **where) for m in ("raf", "relu", "rf"))
    assert raf["search"]["dtype"] == relu["search"]["dtype"] == "float32"
    assert "dtype" not in rf["search"] and raf["rows"] is None
    assert rf["rows"] == searched_rows(50, 8) and len(rf["rows"]) == 8
    from wsutils.run.seeds import point_seed  # the label names the draw, as in every build

    assert raf["seed"] == point_seed("RAF", "imdb", 96, 50, 7) and raf["map"] == "raf"
    with pytest.raises(ValueError, match="map must be one of"):
        sweep_point(p, "RAF", 50, 96, "imdb", 7, **where)
    kw = dict(n=12, d=8, source="gaussian", review=3, keep="all", seed=5)
    kw |= dict(model=None, imdb=None)
    r64 = sensitivity_point(map="raf", search=dict(steps=10, starts=2), **kw)
    r32 = sensitivity_point(map="raf", search=dict(steps=10, starts=2, dtype="float32"), **kw)
    assert r32["n_rows"] == 12 and r32["S_first"] <= r32["S"] * (1 + 1e-9)
    assert abs(r32["S"] - r64["S"]) <= 1e-4 * r64["S"]  # values certified in float64 either way
    with pytest.raises(ValueError, match="seeds its search from its own seed"):
        sensitivity_point(map="rf", search=dict(steps=2, seed=3), **kw)
    with pytest.raises(TypeError, match="unknown search setting"):
        sensitivity_point(map="raf", search=dict(steps=2, search_dtype="float32"), **kw)


class _NeverFinishes(__import__("concurrent.futures").futures.Executor):
    """An executor whose first point fails and whose other points stay pending: their
    futures accept a cancellation but never complete, as a cancelled future of Dask's
    ``Client.get_executor()`` can."""

    def submit(self, fn, *args, **kwargs):
        from concurrent.futures import Future

        class Stuck(Future):
            def cancel(self):
                return True  # accepted, yet the future never completes

        fut = Stuck()
        if not getattr(self, "_failed", False):
            self._failed = True
            fut.set_exception(RuntimeError("the first point failed"))
        return fut


def test_the_first_error_is_raised_even_when_cancelled_points_never_complete():
    """Issue 36 class 4: run_grid waited, with no timeout, on futures that it had cancelled
    after the first error; on an executor that never completes them it hung."""
    import threading

    outcome = {}

    def target():
        try:
            run_grid(
                square,
                [{"x": x} for x in range(6)],
                executor=_NeverFinishes(),
                progress=False,
                store=False,
            )
        except RuntimeError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "run_grid hung after the first error"
    assert outcome == {"error": "the first point failed"}


def test_grid_array_shapes_a_grid_and_refuses_a_ragged_one():
    from wsutils.run.records import grid_array

    recs = [{"d": d, "n": n, "s": s, "S": d * 100 + n * 10 + s} for d in (1, 2) for n in (3, 4, 5)
            for s in range(2)]  # fmt: skip
    A = grid_array(recs, "S", {"d": (1, 2), "n": (3, 4, 5)})
    assert A.shape == (2, 3, 2) and A[1, 2, 1] == 251 and A[0, 0, 0] == 130
    assert grid_array(recs, "S", {"n": (5,)}).shape == (1, 4)  # other axes fold into the last
    with pytest.raises(ValueError, match="not rectangular"):
        grid_array(recs[:-1], "S", {"d": (1, 2), "n": (3, 4, 5)})
    with pytest.raises(ValueError, match="no record at"):
        grid_array(recs, "S", {"d": (1, 2, 9), "n": (3,)})
    with pytest.raises(KeyError):
        grid_array(recs, "T", {"d": (1,)})


def test_grid_frame_is_one_row_per_point_with_nested_settings_as_columns():
    from wsutils.run.records import grid_frame

    records = [
        dict(map="raf", n=10, S=1.5, search=dict(starts=2, steps=5)),
        dict(map="rf", n=10, S=0.5, search=dict(starts=2, steps=9)),
    ]
    frame = grid_frame(records)
    assert list(frame["S"]) == [1.5, 0.5] and list(frame["search.steps"]) == [5, 9]
    assert frame.groupby("map").get_group("rf")["S"].tolist() == [0.5]
    with pytest.raises(ValueError, match="records is empty"):
        grid_frame([])
