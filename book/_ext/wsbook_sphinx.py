"""Build-time choices for the book's HTML, loaded by ``_config.yml`` (``sphinx:
local_extensions:``).

MathJax: ``make mathjax`` unpacks the npm package ``mathjax@3`` into ``_static/mathjax/`` at
the repository root (ignored by git). When ``_static/mathjax/es5/tex-mml-chtml.js`` exists at
build time, that folder is copied into the build's ``_static/`` and ``mathjax_path`` points to
it, so the pages render their mathematics offline; otherwise Sphinx's CDN address is kept.

Colab: Colab opens ``.ipynb`` files, not MyST ``.md`` chapters. The publishing workflow writes
each chapter as a notebook (``tools/colab_notebooks.py``) to the branch :data:`COLAB_BRANCH`,
and every page's Colab button is pointed there.

Progress: ``jupyter-book build book`` executes each chapter while Sphinx reads it, and prints
one line per chapter. :class:`BuildProgress` prints, on the build's terminal, "executing
<chapter>" when a chapter's execution starts, "<chapter> done in N s" when it ends, a line
every :data:`HEARTBEAT` seconds while a chapter runs without other news, and the status lines
of the chapter's ``tqdm`` bars (its long grids): it sets ``WSBOOK_PROGRESS`` to a progress file
before any kernel starts, the kernels inherit it, ``wsutils`` mirrors every bar there
(``wsutils/run/progress.py``), and a thread of the build echoes each new line.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # the sibling module, as Sphinx loads this one
import wsbook_execute  # noqa: E402

STATIC = Path(__file__).resolve().parents[2] / "_static"  # <repo>/_static
MATHJAX_ENTRY = "mathjax/es5/tex-mml-chtml.js"
#: The branch that holds the Colab notebooks (``book/NAME.ipynb``), written by the workflow.
COLAB_BRANCH = "colab"

logger = logging.getLogger(__name__)

#: The environment variable the kernels inherit (read by ``wsutils.run.progress``).
PROGRESS_ENV = "WSBOOK_PROGRESS"
#: Seconds without news from a running chapter before a "still executing" line.
HEARTBEAT = 60.0


class BuildProgress:
    """The progress file, the thread that echoes it, and the chapter being executed.

    ``write`` prints one line (the build's logger; a list's ``append`` in tests)."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        poll: float = 0.5,
        heartbeat: float = HEARTBEAT,
        export: bool = True,
    ) -> None:
        """``export``: set ``WSBOOK_PROGRESS`` in this process, for kernels that inherit it
        (myst-nb's own execution); the chapter executor passes the path to its kernel."""
        self.write, self.poll, self.heartbeat, self.export = write, poll, heartbeat, export
        fd, self.path = tempfile.mkstemp(prefix="wsbook-progress-", suffix=".log")
        os.close(fd)
        self.doc: str | None = None
        self.t0 = self.last = time.monotonic()
        self._pos = 0
        self._partial = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wsbook-progress", daemon=True)
        self._saved_env = os.environ.get(PROGRESS_ENV)

    def start(self) -> "BuildProgress":
        if self.export:
            os.environ[PROGRESS_ENV] = self.path  # before any kernel starts: they inherit it
        self._thread.start()
        return self

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def begin(self, docname: str) -> None:
        self.drain()
        with self._lock:
            self.doc, self.t0 = docname, time.monotonic()
            self.last = self.t0
        self.write(f"executing {docname} …")

    def end(self, docname: str) -> None:
        self.drain()
        with self._lock:
            if self.doc != docname:
                return
            self.doc = None
            seconds = time.monotonic() - self.t0
        self.write(f"{docname} done in {seconds:.0f} s")

    def drain(self) -> None:
        """Echo the complete lines written to the progress file since the last call."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._pos)
                    chunk = f.read()
            except OSError:
                return
            self._pos += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            doc = self.doc
            prefix = f"  {doc} [{time.monotonic() - self.t0:.0f} s] " if doc else "  "
            if lines:
                self.last = time.monotonic()
        for line in lines:
            text = line.decode("utf-8", "replace").strip()
            if text:
                self.write(prefix + text)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.drain()
            with self._lock:
                doc, quiet = self.doc, time.monotonic() - self.last
            if doc is not None and quiet >= self.heartbeat:
                with self._lock:
                    self.last = time.monotonic()
                self.write(f"  {doc}: still executing, {self.elapsed():.0f} s")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.drain()
        if self.export:
            if self._saved_env is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = self._saved_env
        Path(self.path).unlink(missing_ok=True)


def _executes(source: str) -> bool:
    """Whether myst-nb executes this source: a MyST notebook (front matter with a kernelspec)."""
    if not source.startswith("---"):
        return False
    end = source.find("\n---", 3)
    return end > 0 and "kernelspec:" in source[:end]


def _cache_mode(app: Sphinx) -> bool:
    return app.config.nb_execution_mode == "cache"


def keyed_cache(app: Sphinx, config: Config) -> None:
    """``execute_notebooks: cache``: the cache folder of this environment (wsbook_execute)."""
    if config.nb_execution_mode != "cache":
        return
    folder = wsbook_execute.cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)  # the most recently used folder: pruning keeps it
    wsbook_execute.prune(keep=folder)
    config.nb_execution_cache_path = str(folder)
    logger.info(f"execution cache: {folder}")


def start_progress(app: Sphinx) -> None:
    if not _cache_mode(app):  # myst-nb executes while reading: follow it chapter by chapter
        app._wsbook_progress = BuildProgress(logger.info).start()


def prefill(app: Sphinx, env, docnames: list[str]) -> None:
    """Execute every chapter the cache lacks before Sphinx reads any (wsbook_execute)."""
    if not _cache_mode(app):
        return
    from myst_nb.core.read import create_nb_reader

    jobs = []
    for docname in sorted(docnames):
        path = Path(env.doc2path(docname))
        text = path.read_text(encoding="utf8")
        if not _executes(text):
            continue
        reader = create_nb_reader(str(path), env.myst_config, env.mystnb_config, text)
        if reader is None:
            continue
        notebook = reader.read(text)
        timeout = notebook.metadata.get("mystnb", {}).get(
            "execution_timeout", env.mystnb_config.execution_timeout
        )
        jobs.append(wsbook_execute.Job(docname, path, notebook, reader.read_fmt, timeout))

    def progress(docname: str) -> BuildProgress:
        bar = BuildProgress(logger.info, export=False).start()
        bar.begin(docname)
        return bar

    runner = wsbook_execute.Prefill(Path(env.mystnb_config.execution_cache_path), logger.info)
    app._wsbook_runner = runner
    start = time.monotonic()
    try:
        runner.run(jobs, progress)
    finally:
        app._wsbook_prefill_seconds = time.monotonic() - start


def report(app: Sphinx, exception) -> None:
    runner = getattr(app, "_wsbook_runner", None)
    if runner is None or not runner.rows:
        return
    lines = wsbook_execute.format_table(runner.rows[name] for name in sorted(runner.rows))
    seconds = getattr(app, "_wsbook_prefill_seconds", 0.0)
    logger.info(
        "chapters (wall s of each chapter's own kernel; CPU s of that kernel and its "
        f"processes); executing took {seconds:.0f} s wall in all:"
    )
    for line in lines:
        logger.info("  " + line)
    if runner.cells:
        logger.info("the costliest cells (wall s, CPU s, first line of code):")
        for line in wsbook_execute.costliest_cells(runner.cells):
            logger.info("  " + line)


class ExecutionTable(SphinxDirective):
    """``{wsbook-execution-table}``: this build's execution table (chapter, the wall seconds
    of its kernel, executed now or a cache hit), from the build's own records
    (:class:`wsbook_execute.Prefill`), as a table; a paragraph says so when this build
    executed nothing through them (e.g. ``execute_notebooks: off``)."""

    def run(self):
        from docutils import nodes

        runner = getattr(self.env.app, "_wsbook_runner", None)
        if runner is None or not runner.rows:
            return [nodes.paragraph(text="This build kept no execution records.")]
        rows = wsbook_execute.execution_rows(runner.rows[n] for n in sorted(runner.rows))
        header = ("chapter", "seconds", "this build")
        table = nodes.table(classes=["wsbook-execution"])
        group = nodes.tgroup(cols=3)
        table += group
        group += [nodes.colspec(colwidth=w) for w in (3, 1, 1)]

        def row(cells, cls=nodes.entry):
            r = nodes.row()
            for c in cells:
                r += cls("", nodes.paragraph(text=c))
            return r

        head, body = nodes.thead(), nodes.tbody()
        head += row(header)
        for cells in rows:
            body += row(cells)
        group += [head, body]
        return [table]


def chapter_started(app: Sphinx, docname: str, source: list[str]) -> None:
    progress = getattr(app, "_wsbook_progress", None)
    if progress is not None and source and _executes(source[0]):
        progress.begin(docname)


def chapter_read(app: Sphinx, doctree) -> None:
    progress = getattr(app, "_wsbook_progress", None)
    if progress is not None:
        progress.end(app.env.docname)


def stop_progress(app: Sphinx, exception) -> None:
    progress = getattr(app, "_wsbook_progress", None)
    if progress is not None:
        progress.stop()
        app._wsbook_progress = None


def use_local_mathjax(app: Sphinx, config: Config) -> None:
    if not (STATIC / MATHJAX_ENTRY).is_file():
        logger.info("MathJax: no local copy (make mathjax), pages load it from the CDN")
        return
    config.mathjax_path = MATHJAX_ENTRY
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    logger.info(f"MathJax: local copy {STATIC / MATHJAX_ENTRY}")


def _buttons(items):
    for item in items or []:
        yield item
        yield from _buttons(item.get("buttons"))


def colab_notebook_links(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Point the Colab button of a ``.md`` chapter at its notebook on :data:`COLAB_BRANCH`."""
    for button in _buttons(context.get("header_buttons")):
        url = button.get("url", "")
        if button.get("text") == "Colab" and url.endswith(".md") and "/blob/" in url:
            head, tail = url.split("/blob/", 1)
            path = tail.split("/", 1)[1]  # drop the branch
            button["url"] = f"{head}/blob/{COLAB_BRANCH}/{path[:-3]}.ipynb"


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", use_local_mathjax, priority=900)
    app.connect("config-inited", keyed_cache)
    # after sphinx-book-theme's launch buttons (priority 501)
    app.connect("html-page-context", colab_notebook_links, priority=600)
    app.connect("builder-inited", start_progress)
    app.connect("env-before-read-docs", prefill)
    app.connect("source-read", chapter_started)
    app.connect("doctree-read", chapter_read)
    app.connect("build-finished", stop_progress)
    app.connect("build-finished", report)
    app.add_directive("wsbook-execution-table", ExecutionTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
