"""The code style CI enforces: ruff's lint and format (configured in pyproject.toml) pass on
the package, tests, benchmarks, tools and build extensions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_passes():
    run = _ruff("check", "--no-cache", ".")
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_format_is_applied():
    run = _ruff("format", "--check", "--no-cache", ".")
    assert run.returncode == 0, "run `.venv/bin/ruff format .`:\n" + run.stdout + run.stderr
