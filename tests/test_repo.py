"""The repository stands on its own: no file names a location on a particular machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top-level folders that only exist on some machine (a user's home, a scratch or mount point,
# a CI worker's work folder). Built from words, so that this file does not name one itself;
# /usr/bin/env, /dev/null, /proc/... are system paths, not locations of the project, and pass.
_PLACES = (
    "work",
    "home",
    "root",
    "tmp",
    "Users",
    "mnt",
    "scratch",
    "opt",
    "data",
    "var",
    "private",
    "media",
    "srv",
    "nfs",
    "gpfs",
    "lustre",
)
# An absolute path starts a token: after a start of line, space, quote, bracket, '=', ',',
# ':' or 'file://'; "https://host/home/..." (a URL's path) does not match.
MACHINE_PATH = re.compile(
    r"(?:^|[\s\"'`(\[{=,:]|file://)(/(?:" + "|".join(_PLACES) + r")/[^\s\"'`)\]}]*)"
    r"|\b([A-Za-z]:\\\\?(?:Users|home)\\\\?[^\s\"'`]*)",
    re.MULTILINE,
)
# The project's private neighbour folder ("shared", beside the clone on the build machines),
# named relative to the repository: a reader's clone has nothing beside it.
OUTSIDE = re.compile(r"(\.\./|\bcd \.\.[^)\n]*\)/)" + "sha" + r"red/")


def _repo_files() -> list[Path]:
    """Tracked files and untracked files git does not ignore (what a commit would hold)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    names = sorted({n for n in out.stdout.decode().split("\0") if n})
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def _text(path: Path) -> str | None:
    raw = path.read_bytes()
    if b"\0" in raw[:8192]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_pattern_finds_machine_paths_and_spares_system_paths():
    w = "/" + "work"
    bad = [
        f"WSBOOK_IMDB={w}/shared/x.gz",
        f"see '{w}/shared/notes'",
        "path: /" + "home/ann/x",
        f"cd {'/' + 'tmp'}/build",
        f"file://{w}/x.html",
        "C:\\" + "Users\\ann\\x",
    ]
    good = [
        "#!/usr/bin/env bash",
        "> /dev/null",
        "/proc/cpuinfo",
        "https://example.org/home/x",
        "a" + w + "/b",
        "~" + w + "/x",
        "../book/data",
        "$(mktemp -d)/x",
    ]
    for s in bad:
        assert MACHINE_PATH.search(s), s
    for s in good:
        assert not MACHINE_PATH.search(s), s
    sh = "sha" + "red"
    assert OUTSIDE.search(f"../{sh}/data/x.gz") and OUTSIDE.search(f"$(cd .. && pwd)/{sh}/x")
    assert not OUTSIDE.search(f"{sh}/notes") and not OUTSIDE.search("../book/x")


def test_no_file_names_a_machine_path():
    found = []
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        for m in MACHINE_PATH.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {(m.group(1) or m.group(2))!r}")
        for m in OUTSIDE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r} (outside the clone)")
    assert not found, (
        "files name absolute paths of a particular machine (a reader's clone "
        "has none of them; use a path relative to the repository or an "
        "environment variable):\n" + "\n".join(found)
    )
