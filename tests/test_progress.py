"""The build's progress display: tqdm bars of a kernel reach the build's terminal through the
progress file (wsutils/run/progress.py and book/_ext/wsbook_sphinx.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extension():
    spec = importlib.util.spec_from_file_location(
        "wsbook_sphinx", ROOT / "book" / "_ext" / "wsbook_sphinx.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A "kernel": another process that imports wsutils and runs a bar, with the build's environment.
KERNEL = """
from tqdm.auto import tqdm
import wsutils  # installs the mirror when WSBOOK_PROGRESS is set
for _ in tqdm(range(3), desc="grid points"):
    pass
for _ in tqdm(range(5), desc="hidden", disable=True):
    pass
"""


def test_kernel_bars_reach_the_build_terminal(monkeypatch):
    ext = _extension()
    monkeypatch.delenv(ext.PROGRESS_ENV, raising=False)
    lines: list[str] = []
    progress = ext.BuildProgress(lines.append, poll=0.05, heartbeat=3600).start()
    try:
        assert os.environ[ext.PROGRESS_ENV] == progress.path  # kernels inherit it
        progress.begin("imdb")
        subprocess.run(
            [sys.executable, "-c", KERNEL], check=True, env=dict(os.environ), capture_output=True
        )
        deadline = time.monotonic() + 10
        while not any("(done)" in x for x in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        progress.end("imdb")
    finally:
        progress.stop()
    assert lines[0] == "executing imdb …"
    bars = [x for x in lines if "grid points" in x]
    assert bars and bars[-1].startswith("  imdb [") and "3/3" in bars[-1] and "(done)" in bars[-1]
    assert not any("hidden" in x for x in lines)  # disabled bars stay silent
    assert lines[-1].startswith("imdb done in ") and lines[-1].endswith(" s")
    assert ext.PROGRESS_ENV not in os.environ and not Path(progress.path).exists()


def test_heartbeat_and_partial_lines(monkeypatch):
    ext = _extension()
    monkeypatch.delenv(ext.PROGRESS_ENV, raising=False)
    lines: list[str] = []
    progress = ext.BuildProgress(lines.append, poll=0.02, heartbeat=0.1).start()
    try:
        progress.begin("attention")
        time.sleep(0.4)
        with open(progress.path, "ab") as f:
            f.write(b"half a li")  # not echoed until complete
        progress.drain()
        assert not any("half" in x for x in lines)
        with open(progress.path, "ab") as f:
            f.write(b"ne\n")
        progress.drain()
        progress.end("attention")
    finally:
        progress.stop()
    assert any(x.startswith("  attention: still executing") for x in lines)
    assert any(x.endswith("half a line") for x in lines)


def test_only_notebook_chapters_count_as_executed():
    ext = _extension()
    assert ext._executes("---\njupytext:\n  x: 1\nkernelspec:\n  name: python3\n---\n# T\n")
    assert not ext._executes("# API\n\nkernelspec: in the text\n")
    assert not ext._executes("---\ntitle: x\n---\nkernelspec:\n")


def test_no_progress_file_changes_nothing(monkeypatch):
    from wsutils.run import progress as _progress

    monkeypatch.delenv(_progress.ENV, raising=False)
    _progress.write("nothing happens")  # no file, no error
