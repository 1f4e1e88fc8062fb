"""The sweep runner: order, resume after an interruption, corrupt files, executors."""

import json
import math
from concurrent.futures import ProcessPoolExecutor

import pytest

from wsutils.sweep import point_key, run_grid

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
    assert len(list(tmp_path.glob("*.json"))) == 3          # 0, 1, 2 finished and were kept
    assert not list(tmp_path.glob("*.tmp"))                 # no half-written file
    CALLS.clear()
    FAIL_AT.clear()                                         # the cause of the crash is gone
    try:
        out = run_grid(fails_at_three, grid, store=tmp_path, progress=False)
    finally:
        FAIL_AT.add(3)
    assert CALLS == [3, 4, 5]                               # only the missing points ran
    assert [r["y"] for r in out] == [math.sqrt(x) for x in range(6)]


def test_store_is_reused_and_corrupt_files_recomputed(tmp_path):
    grid = [{"x": x} for x in range(4)]
    CALLS.clear()
    first = run_grid(square, grid, store=tmp_path, progress=False)
    assert sorted(CALLS) == [0, 1, 2, 3]
    CALLS.clear()
    (tmp_path / f"{point_key(square, {'x': 2})}.json").write_text("{not json")
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
