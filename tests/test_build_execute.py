"""The book build's chapter executor (book/_ext/wsbook_execute.py): what the execution cache is
keyed on, the order and number of chapters run at once, and a real execution of small
notebooks into a jupyter-cache over IPC kernels."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _executor():
    """The module as Sphinx loads it: ``book/_ext`` on the path (``local_extensions``)."""
    folder = str(ROOT / "book" / "_ext")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("wsbook_execute")


ex = _executor()


def _tree(tmp_path: Path) -> Path:
    """A copy of what the key reads: wsutils/, data/ and the pinned files."""
    root = tmp_path / "repo"
    (root / "wsutils").mkdir(parents=True)
    (root / "wsutils" / "maps.py").write_text("x = 1\n")
    (root / "data").mkdir()
    (root / "data" / "reviews.txt").write_text("a review\n")
    (root / "book").mkdir()
    for name in ex.KEY_FILES:
        (root / name).write_text(f"{name} v1\n")
    return root


def test_the_key_follows_every_input_of_a_chapter(tmp_path):
    root = _tree(tmp_path)
    env = {"WSBOOK_SCALE": "paper"}
    key = ex.environment_key(env, root)
    assert ex.environment_key(dict(env), root) == key  # deterministic
    assert ex.environment_key({"WSBOOK_SCALE": "quick"}, root) != key  # the scale
    assert ex.environment_key({}, root) == ex.environment_key({"WSBOOK_SCALE": "quick"}, root)
    assert ex.environment_key({**env, "WSBOOK_MODEL": "bert-base-uncased"}, root) != key
    # the build's own plumbing is not an input
    assert (
        ex.environment_key({**env, "WSBOOK_PROGRESS": "/x", "WSBOOK_SWEEP_STORE": "/y"}, root)
        == key
    )
    (root / "wsutils" / "maps.py").write_text("x = 2\n")  # the package
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    (root / "wsutils" / "sub").mkdir()
    (root / "wsutils" / "sub" / "new.py").write_text("")  # a new module
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    (root / "requirements.txt").write_text("torch==9\n")  # a pin
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    (root / "data" / "reviews.txt").write_text("another review\n")  # the data
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    pycache = root / "wsutils" / "__pycache__"
    pycache.mkdir()
    (pycache / "maps.cpython-311.pyc").write_bytes(b"\0")  # not bytecode
    assert ex.environment_key(env, root) == key


def test_a_local_model_folder_is_keyed_on_its_files(tmp_path):
    root = _tree(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {"WSBOOK_MODEL": str(model)}
    key = ex.environment_key(env, root)
    (model / "config.json").write_text('{"layer_norm_eps": 1e-5}')
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    stat = (model / "config.json").stat()
    (model / "config.json").write_text('{"layer_norm_eps": 2e-5}')  # same size,
    os.utime(model / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same time
    assert ex.environment_key(env, root) != key


def test_a_relative_model_folder_is_keyed_as_the_kernels_load_it(tmp_path):
    """Issue 36 class 1: a relative WSBOOK_MODEL was resolved from the checkout for the key
    (where it did not exist: the name alone) and from book/ by the kernels, so editing the
    folder the kernels loaded left the key unchanged. A relative path is made absolute from
    where the build runs, for the key and the kernels alike; one that exists only from book/
    is refused."""
    root = _tree(tmp_path)
    (root / "book" / "m").mkdir()
    (root / "book" / "m" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="absolute path"):
        ex.environment_key({"WSBOOK_MODEL": "m"}, root, cwd=root)
    (root / "m").mkdir()
    (root / "m" / "config.json").write_text("{}")
    env = {"WSBOOK_MODEL": "m"}
    key = ex.environment_key(env, root, cwd=root)
    (root / "m" / "config.json").write_text('{"layer_norm_eps": 1e-5}')
    assert ex.environment_key(env, root, cwd=root) != key
    resolved = ex.resolve_path_knobs(env, root, cwd=root)
    assert resolved["WSBOOK_MODEL"] == str((root / "m").resolve())  # what the kernels get


def test_the_key_follows_the_installed_distributions(tmp_path, monkeypatch):
    """Issue 36 class 1: another version of a package the chapters import, installed by hand
    without a change of the pins, served yesterday's pages."""
    from wsutils import _digest

    root = _tree(tmp_path)
    key = ex.environment_key({}, root)
    monkeypatch.setattr(_digest, "installed_digest", lambda: "numpy==0.0 installed by hand")
    assert ex.environment_key({}, root) != key


def test_longest_first_and_lanes():
    names = ["figure-1", "imdb", "random-features", "new-chapter"]  # unknown: 60 s
    assert ex.longest_first(names, {}) == ["imdb", "random-features", "new-chapter", "figure-1"]
    assert ex.longest_first(names, {"figure-1": 5000.0})[0] == "figure-1"  # measured wins
    assert ex.lanes(10, cores=2) == 2
    assert ex.lanes(1, cores=16) == 1
    assert ex.lanes(0, cores=2) == 1


def test_table_has_a_row_per_chapter_a_total_and_the_lanes():
    rows = [
        ex.Row("attention", "executed", 12.0, 20.0, 1, 0.0, 12.0),
        ex.Row("imdb", "cached"),
        ex.Row("figure-1", "executed", 5.0, 6.0, 2, 0.0, 5.0),
        ex.Row("rf", "executed", 9.0, 9.5, 2, 5.0, 14.0),
    ]
    lines = ex.format_table(rows)
    assert lines[0].split() == [
        "chapter",
        "wall",
        "s",
        "CPU",
        "s",
        "lane",
        "from–to",
        "s",
        "cache",
    ]
    assert lines[2].split() == ["attention", "12", "20", "1", "0–12", "executed"]
    assert lines[3].split() == ["imdb", "–", "–", "–", "–", "hit"]
    assert "3 executed, 1 from the cache" in lines[6]
    assert lines[7] == "lane 1: attention; ends at 12 s"
    assert lines[8] == "lane 2: figure-1 → rf; ends at 14 s  (the critical path)"
    assert ex.lane_summary([ex.Row("imdb", "cached")]) == []


def _job(tmp_path: Path, name: str, source: str):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return ex.Job(name, path, nbformat.read(path, as_version=4), None, 120)


BURN = """
import os, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print(os.environ["WSBOOK_SWEEP_STORE"], os.environ.get("OMP_NUM_THREADS"))
"""


def test_chapters_are_executed_into_the_cache_and_then_served_from_it(tmp_path, capfd):
    cache = tmp_path / "cache"
    lines: list[str] = []
    jobs = [_job(tmp_path, "one", BURN), _job(tmp_path, "two", "print(1 + 1)")]
    runner = ex.Prefill(cache, lines.append)
    runner.run(jobs, lambda name: None)
    assert {r.docname: r.status for r in runner.rows.values()} == {
        "one": "executed",
        "two": "executed",
    }
    one = runner.rows["one"]
    # /proc counts CPU time in clock ticks (1/100 s): two readings lose up to a tick each
    tick = 2 / os.sysconf("SC_CLK_TCK")
    assert one.wall > 0 and one.cpu >= 0.3 - tick  # the kernel's own CPU time
    out = jobs[0].notebook.cells[0].outputs[0]["text"].split()
    assert out[0] == str(cache / "sweeps")  # the build's sweep store
    assert out[1] == ("1" if ex.lanes(2) > 1 else "None")
    assert "without encryption" not in capfd.readouterr().err  # IPC, not TCP
    burn = [c for c in runner.cells if c.docname == "one"]
    assert len(burn) == 1 and burn[0].cpu >= 0.3 - tick and burn[0].line == "import os, time"
    assert ex.costliest_cells(runner.cells, n=1)[0].startswith("one ")
    # a second build finds both in the cache and executes nothing
    again = ex.Prefill(cache, lines.append)
    fresh = [_job(tmp_path, "one", BURN), _job(tmp_path, "two", "print(1 + 1)")]
    again.run(fresh, lambda name: pytest.fail("nothing should execute"))
    assert {r.status for r in again.rows.values()} == {"cached"}
    # the ledger's execution table: a hit shows the seconds recorded when the chapter ran
    assert again.rows["one"].recorded == pytest.approx(one.wall)
    table = dict((name, (s, how)) for name, s, how in ex.execution_rows(again.rows.values()))
    assert table["one"] == (f"{one.wall:.0f}", "cache hit")
    first = dict((name, (s, how)) for name, s, how in ex.execution_rows(runner.rows.values()))
    assert first["two"] == (f"{runner.rows['two'].wall:.0f}", "executed")
    # an edited code cell is a different notebook
    assert not again.is_cached(_job(tmp_path, "two", "print(2 + 2)").notebook)


def test_a_failing_chapter_fails_the_build_and_is_not_cached(tmp_path):
    from sphinx.errors import ExtensionError

    cache = tmp_path / "cache"
    runner = ex.Prefill(cache, lambda line: None)
    bad = _job(tmp_path, "bad", "assert 1 == 2, 'the claim does not hold'")
    with pytest.raises(ExtensionError, match="the claim does not hold"):
        runner.run([bad], lambda name: None)
    assert runner.rows["bad"].status == "failed"
    assert not ex.Prefill(cache, lambda line: None).is_cached(
        _job(tmp_path, "bad", "assert 1 == 2, 'the claim does not hold'").notebook
    )
    shutil.rmtree(cache)


def test_run_grid_uses_the_build_store_only_when_the_build_sets_one(tmp_path, monkeypatch):
    from sweep_points import rf_sensitivity

    from wsutils.run import config
    from wsutils.run.sweep import run_grid

    point = dict(n=3, d=4, steps=2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(config.SWEEP_STORE_ENV, raising=False)
    run_grid(rf_sensitivity, [dict(point, seed=0)], progress=False)
    assert not any(tmp_path.iterdir())  # no store
    monkeypatch.setenv(config.SWEEP_STORE_ENV, str(tmp_path / "store"))
    first = run_grid(rf_sensitivity, [dict(point, seed=1)], progress=False)
    assert len(list((tmp_path / "store").glob("*.json"))) == 1
    assert run_grid(rf_sensitivity, [dict(point, seed=1)], progress=False) == first
    run_grid(rf_sensitivity, [dict(point, seed=2)], progress=False, store=False)  # opted out
    assert len(list((tmp_path / "store").glob("*.json"))) == 1


def test_a_pythonpath_folder_is_keyed_on_its_modules(tmp_path):
    """Issue 61 item 10: the kernels inherit PYTHONPATH, so an edited copy of a dependency
    placed first on it must change the key; bytecode and other files do not."""
    root = _tree(tmp_path)
    dep = tmp_path / "shadow" / "transformers"
    dep.mkdir(parents=True)
    (dep / "__init__.py").write_text("x = 1\n")
    env = {"WSBOOK_SCALE": "paper", "PYTHONPATH": str(dep.parent)}
    key = ex.environment_key(env, root)
    assert ex.environment_key({"WSBOOK_SCALE": "paper"}, root) != key  # the path itself
    (dep / "__init__.py").write_text("x = 2\n")  # the edited copy
    assert ex.environment_key(env, root) != key
    key = ex.environment_key(env, root)
    (dep / "notes.txt").write_text("not imported\n")
    (dep / "__pycache__").mkdir()
    (dep / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert ex.environment_key(env, root) == key
    (root / "book" / "rel").mkdir()  # a relative entry: read from book/, as the kernels do
    (root / "book" / "rel" / "m.py").write_text("y = 1\n")
    rel = {"WSBOOK_SCALE": "paper", "PYTHONPATH": "rel"}
    key = ex.environment_key(rel, root)
    (root / "book" / "rel" / "m.py").write_text("y = 2\n")
    assert ex.environment_key(rel, root) != key
