"""Issue 14, item 3: the sweep store verifies what it reads, refuses ambiguous keys and
removes the temporary files of killed writes."""

import json
import os
import signal
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from wsutils.run.sweep import StoreWarning, point_key, run_grid

CALLS = []


def cube(x, seed=0):
    CALLS.append(x)
    return {"y": x**3 + 0.5 * seed, "tag": f"x={x}"}


def takes_anything(a):
    CALLS.append(a)
    return {"y": 1.0}


def _only_file(store: Path) -> Path:
    files = list(store.glob("*.json"))
    assert len(files) == 1
    return files[0]


def test_every_single_digit_edit_of_a_stored_record_is_recomputed(tmp_path):
    """Today 144 of 149 such edits were returned as results: now each is detected (checksum
    over the canonical JSON of the point and the record) and the point recomputed."""
    point = {"x": 123, "seed": 45}
    truth = run_grid(cube, [point], store=tmp_path, progress=False)
    path = _only_file(tmp_path)
    text = path.read_text()
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    assert len(digits) >= 20
    for i in digits:
        edited = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :]
        path.write_text(edited)
        CALLS.clear()
        with pytest.warns(StoreWarning, match=str(path.name)):
            out = run_grid(cube, [point], store=tmp_path, progress=False)
        assert CALLS == [123], f"edit at {i} was accepted: {edited[max(0, i - 20) : i + 20]!r}"
        assert out == truth
        assert path.read_text() == text  # the file is repaired


@pytest.mark.parametrize(
    "content",
    [
        lambda s: {**s, "record": {}},  # an emptied record
        lambda s: {"key": s["key"], "record": {}},  # the old layout, emptied
        lambda s: {"key": s["key"], "record": s["record"]},  # the old layout, intact
        lambda s: {},
        lambda s: [],
        lambda s: {**s, "record": {**s["record"], "y": 0.0}},  # a changed number, same key
    ],
)
def test_tampered_or_old_records_are_recomputed(tmp_path, content):
    point = {"x": 4}
    truth = run_grid(cube, [point], store=tmp_path, progress=False)
    path = _only_file(tmp_path)
    path.write_text(json.dumps(content(json.loads(path.read_text()))))
    CALLS.clear()
    with pytest.warns(StoreWarning, match="recomputing"):
        assert run_grid(cube, [point], store=tmp_path, progress=False) == truth
    assert CALLS == [4]


def test_a_verified_record_is_read_back_without_a_warning(tmp_path):
    grid = [{"x": x, "seed": 1} for x in range(3)]
    first = run_grid(cube, grid, store=tmp_path, progress=False)
    CALLS.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_grid(cube, grid, store=tmp_path, progress=False) == first
    assert CALLS == []


def test_a_record_moved_to_another_points_file_is_recomputed(tmp_path):
    run_grid(cube, [{"x": 1}, {"x": 2}], store=tmp_path, progress=False)
    a = tmp_path / f"{point_key(cube, {'x': 1})}.json"
    b = tmp_path / f"{point_key(cube, {'x': 2})}.json"
    b.write_text(a.read_text())
    CALLS.clear()
    with pytest.warns(StoreWarning, match="another point"):
        out = run_grid(cube, [{"x": 1}, {"x": 2}], store=tmp_path, progress=False)
    assert CALLS == [2] and [r["y"] for r in out] == [1, 8]


@pytest.mark.parametrize(
    "value, match",
    [
        (np.arange(2000.0), "ndarray.*tolist"),  # repr elided: '[0. 1. ... 1999.]'
        (lambda: 1, "function.*name as a string"),
        (np.sum, "name as a string"),
        ({1: "a"}, "string keys"),
        (object(), "not a plain JSON value"),
    ],
)
def test_ambiguous_parameters_are_refused(tmp_path, value, match):
    with pytest.raises(TypeError, match=match):
        run_grid(takes_anything, [{"a": value}], store=tmp_path, progress=False)
    with pytest.raises(TypeError, match=match):
        point_key(takes_anything, {"a": value})


def test_large_arrays_with_the_same_repr_no_longer_share_a_record(tmp_path):
    """Two arrays that print alike (elided) used to get one key: the second grid read the
    first grid's result. Such parameters are now refused; their lists are distinct keys."""
    a, b = np.zeros(2000), np.zeros(2000)
    b[1000] = 1.0
    assert str(a) == str(b)
    with pytest.raises(TypeError):
        run_grid(takes_anything, [{"a": a}], store=tmp_path, progress=False)
    assert point_key(takes_anything, {"a": a.tolist()}) != point_key(
        takes_anything, {"a": b.tolist()}
    )


def test_numpy_scalars_are_their_python_values():
    assert point_key(cube, {"x": np.int64(3), "seed": np.float64(0.5)}) == point_key(
        cube, {"x": 3, "seed": 0.5}
    )
    assert point_key(cube, {"x": 3}) != point_key(cube, {"x": 3.0})
    assert point_key(cube, {"x": True}) != point_key(cube, {"x": 1})


def test_functions_without_a_unique_name_are_refused_with_a_store(tmp_path):
    def nested(x):
        return {"y": x}

    import functools

    for fn, match in [
        (lambda x: {"y": x}, "lambda"),
        (nested, "nested"),
        (functools.partial(cube, seed=1), "partial"),
    ]:
        with pytest.raises(TypeError, match=match):
            run_grid(fn, [{"x": 1}], store=tmp_path, progress=False)
    # without a store nothing is named, so a lambda still runs
    assert run_grid(lambda x: {"y": x}, [{"x": 1}], progress=False) == [{"x": 1, "y": 1}]


def _module_with(name: str, body: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(body, mod.__dict__)
    return mod


def test_a_same_named_function_does_not_receive_the_first_grids_result(tmp_path):
    """A function redefined under the same module and name (a notebook cell run again with a
    different body) used to read the first definition's stored records."""
    name = "wsbook_sweep_probe"
    try:
        first = _module_with(name, "def f(x):\n    return {'y': x + 1}\n").f
        assert run_grid(first, [{"x": 1}], store=tmp_path, progress=False)[0]["y"] == 2
        second = _module_with(name, "def f(x):\n    return {'y': x * 100}\n").f
        assert (first.__module__, first.__qualname__) == (second.__module__, second.__qualname__)
        assert run_grid(second, [{"x": 1}], store=tmp_path, progress=False)[0]["y"] == 100
        with pytest.raises(TypeError, match="does not name fn itself"):
            run_grid(first, [{"x": 1}], store=tmp_path, progress=False)  # replaced
    finally:
        sys.modules.pop(name, None)


KILLED_WRITE = """
import os, signal, sys
import wsutils.run.sweep as sweep
def die(*a):
    os.kill(os.getpid(), signal.SIGKILL)
sweep.os.replace = die              # the write is killed after the temporary file, before replace
from test_sweep_store import cube
sweep.run_grid(cube, [{"x": 2}], store=sys.argv[1], progress=False)
"""


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL")
def test_the_tmp_file_of_a_killed_write_is_removed_on_the_next_run(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITE, str(tmp_path)], env=env, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    left = list(tmp_path.glob("*.tmp"))
    assert len(left) == 1 and not list(tmp_path.glob("*.json"))
    foreign = tmp_path / "notes.tmp"  # not ours: left alone
    foreign.write_text("x")
    out = run_grid(cube, [{"x": 2}], store=tmp_path, progress=False)
    assert out[0]["y"] == 8
    assert list(tmp_path.glob("*.tmp")) == [foreign]
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_a_running_writers_tmp_file_is_kept(tmp_path):
    """A temporary file of a live process (this test's own parent, say) is not touched."""
    run_grid(cube, [{"x": 5}], store=tmp_path, progress=False)
    from wsutils.run import sweep

    live = tmp_path / f"{'a' * 24}.json.{sweep._HOST}-{os.getppid()}.abcd1234.tmp"
    live.write_text("{")
    run_grid(cube, [{"x": 5}], store=tmp_path, progress=False)
    assert live.exists()


def test_the_key_follows_the_code_that_runs_not_the_file_on_disk(tmp_path, monkeypatch):
    """A module edited on disk but not reloaded (a notebook without autoreload) runs its old
    code: its results must not be stored under the new code's key, where a later process
    (running the new code) would read them back as valid. Since issue 36 the key holds the
    package's files, so such a process runs without the store, with a warning."""
    import importlib

    name = "wsbook_edited_on_disk_probe"
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{name}.py").write_text("def f(x):\n    return {'y': x + 1}\n")
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    store = tmp_path / "store"
    try:
        m = importlib.import_module(name)
        before = point_key(m.f, {"x": 1})
        (src / f"{name}.py").write_text("def f(x):\n    return {'y': x * 100}  # new\n")
        # the old code still runs, and no key names it any more: run without the store
        with pytest.warns(StoreWarning, match="changed on disk"):
            assert run_grid(m.f, [{"x": 1}], store=store, progress=False)[0]["y"] == 2
        assert not list(store.glob("*.json")) if store.exists() else True
        importlib.invalidate_caches()
        m = importlib.reload(m)  # now the new code runs, and is right
        assert point_key(m.f, {"x": 1}) != before
        with pytest.warns(StoreWarning, match="wsbook_edited_on_disk_probe changed on disk"):
            assert run_grid(m.f, [{"x": 1}], store=store, progress=False)[0]["y"] == 100
    finally:
        sys.modules.pop(name, None)


def test_the_key_covers_what_fn_calls_and_reads_in_its_package(tmp_path):
    """``fn``'s key follows the functions, classes and constants it reaches through its
    module's globals inside its own package (and wsutils): a changed helper is a new key."""
    name = "wsbook_helper_probe"
    body = "def f(x):\n    return {'y': helper(x) + OFFSET}\n"
    try:
        keys = []
        for helper, offset in (("x + 1", 0), ("x + 2", 0), ("x + 1", 1)):
            m = _module_with(
                name, f"OFFSET = {offset}\ndef helper(x):\n    return {helper}\n" + body
            )
            keys.append(point_key(m.f, {"x": 1}))
            assert (
                run_grid(m.f, [{"x": 1}], store=tmp_path, progress=False)[0]["y"]
                == eval(helper, {"x": 1}) + offset
            )
        assert len(set(keys)) == 3
        m = _module_with(name, "OFFSET = 0\ndef helper(x):\n    return x + 1\n" + body)
        assert point_key(m.f, {"x": 1}) == keys[0]  # the same code, the same key
    finally:
        sys.modules.pop(name, None)


def test_the_key_follows_imports_made_inside_a_function(monkeypatch):
    """A grid-point function that imports its estimator inside its body (to keep a module's
    import light) gets a new key when that estimator's code changes."""
    from wsutils.estimators import rf
    from wsutils.experiments import imdb
    from wsutils.run.sweep import _code_digest

    before = _code_digest(imdb.sensitivity_point)  # imports rf_word_sensitivity inside
    monkeypatch.setattr(rf.rf_word_sensitivity, "__code__", (lambda *a, **k: None).__code__)
    assert _code_digest(imdb.sensitivity_point) != before


def test_the_key_covers_module_level_tables_the_code_reads(monkeypatch):
    """A module-level dict of settings (here the normalisation chapter's table of maps) is
    part of the key of a function that reads it."""
    from wsutils.experiments import normalisation as nm
    from wsutils.run.sweep import _code_digest

    before = _code_digest(nm.normalisation_point)
    other = next(k for k in nm.CHAPTER if k != "tempered")
    monkeypatch.setitem(nm.CHAPTER, "tempered", nm.CHAPTER[other])
    assert _code_digest(nm.normalisation_point) != before


# Issue 36 class 3: the key followed fn's own source and the helpers it names, and missed
# code reached another way. Each route below changes the result in a fresh process; the
# store must not return the old record.
ROUTES = {
    "inherited": (
        "class Base:\n    def value(self, x):\n        return x + {c}\n"
        "class Child(Base):\n    pass\n"
        "def point(x):\n    return {{'y': Child().value(x)}}\n"
    ),
    "default": (
        "def helper(x):\n    return x + {c}\ndef point(x, f=helper):\n    return {{'y': f(x)}}\n"
    ),
    "dotted": ("import routepkg.sub\ndef point(x):\n    return {{'y': routepkg.sub.helper(x)}}\n"),
    "partial": (
        "import functools\n"
        "def helper(x, c):\n    return x + c\n"
        "ADD = functools.partial(helper, c={c})\n"
        "def point(x):\n    return {{'y': ADD(x)}}\n"
    ),
}

_RUN = """
import json, sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
import routepkg
from wsutils.run.sweep import run_grid
print(json.dumps(run_grid(routepkg.point, [{"x": 1}], store=sys.argv[2], progress=False)))
"""


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_change_reached_by_any_route_is_a_new_key_in_a_fresh_process(tmp_path, route):
    pkg = tmp_path / "src" / "routepkg"
    pkg.mkdir(parents=True)
    store = tmp_path / "store"
    got = []
    for c in (1, 10):
        (pkg / "__init__.py").write_text(ROUTES[route].format(c=c))
        (pkg / "sub.py").write_text(f"def helper(x):\n    return x + {c}\n")
        out = subprocess.run(
            [sys.executable, "-c", _RUN, str(tmp_path / "src"), str(store)],
            capture_output=True,
            text=True,
            check=True,
        )
        got.append(json.loads(out.stdout.strip().splitlines()[-1])[0]["y"])
    assert got == [2, 11], (route, got)
