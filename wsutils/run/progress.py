"""Progress of long computations for a terminal that is not the kernel's: the book build.

While ``jupyter-book build book`` runs, the chapters execute in Jupyter kernels whose output
goes into the pages, not to the terminal. The book's Sphinx extension
(``book/_ext/wsbook_sphinx.py``) sets :data:`ENV` to the path of a progress file before any
kernel starts (kernels inherit the build's environment) and echoes the lines written there to
the terminal. :func:`install` (called when ``wsutils`` is imported) makes every ``tqdm`` bar of
the process (the bars of :func:`wsutils.run.sweep.run_grid`,
:func:`wsutils.text.embeddings.embed`, …) append its status line to that file, at most every
:data:`INTERVAL` seconds per bar and once when it closes. Without :data:`ENV` nothing changes.
"""

from __future__ import annotations

import os
import time

#: The environment variable naming the progress file.
ENV = "WSBOOK_PROGRESS"
#: Seconds between two lines of one bar (its last line is always written).
INTERVAL = 5.0

_installed = False


def write(line: str) -> None:
    """Append ``line`` to the progress file named by :data:`ENV` (no-op when it is unset).
    One ``O_APPEND`` write per line, so lines of concurrent processes do not interleave."""
    path = os.environ.get(ENV)
    if not path:
        return
    data = (" ".join(line.split()) + "\n").encode("utf-8", "replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:  # progress is a courtesy: never fail a computation for it
        pass


def _status(bar) -> str:
    try:
        d = dict(bar.format_dict)
        d["ncols"] = 80  # a bounded bar, whatever the kernel's terminal width
        return bar.format_meter(**d)
    except Exception:  # noqa: BLE001 - a bar that cannot format itself writes its count
        return f"{getattr(bar, 'desc', '')}: {getattr(bar, 'n', '?')}"


def install() -> bool:
    """Mirror every tqdm bar to the progress file when :data:`ENV` is set; returns whether it
    did (once per process; idempotent)."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return _installed
    from tqdm import std

    update, close = std.tqdm.update, std.tqdm.close

    def mirrored_update(self, n=1):
        out = update(self, n)
        if not getattr(self, "disable", True):
            now = time.monotonic()
            if now - getattr(self, "_wsbook_last", 0.0) >= INTERVAL:
                self._wsbook_last = now
                write(_status(self))
        return out

    def mirrored_close(self):
        if not getattr(self, "disable", True) and not getattr(self, "_wsbook_closed", False):
            self._wsbook_closed = True
            write(_status(self) + " (done)")
        return close(self)

    std.tqdm.update = mirrored_update
    std.tqdm.close = mirrored_close
    _installed = True
    return True
