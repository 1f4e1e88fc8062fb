"""Execute the book's chapters before Sphinx reads them: several at a time, longest first, into
the jupyter-cache that ``execute_notebooks: cache`` reads.

Why: myst-nb executes one chapter at a time, each in its own kernel, while Sphinx reads it, so
on a 2-core machine one core idles through every cell that runs without a process pool. Here,
once myst-nb's configuration exists (``env-before-read-docs``), every chapter that the cache
cannot serve is executed by ``nbclient`` in its own kernel, :func:`lanes` of them at once
(longest first by :data:`EXPECTED_SECONDS` or the last measured time), and stored in the cache
with jupyter-cache's own API. myst-nb then finds every chapter in the cache and executes none:
``jupyter-book build book`` stays the command that builds the book.

What a cached page can depend on (:func:`environment_key`): the cache folder is
``_build/.jupyter_cache/<key>``, where ``key`` is a SHA-256 of the ``WSBOOK_*`` knobs (the
scale, model, reviews, chat model; a local model or review path by its files' contents, a
relative one made absolute from where the build runs and handed so to the kernels; a hub
name by the name alone), every file of ``wsutils/`` and ``data/``, the pinned requirements,
``pyproject.toml``, ``book/matplotlibrc``, the Python version and the installed distributions
(every ``name==version``, and the files of a folder install: a package installed by hand
over the pins is another key). Not covered: files edited inside ``site-packages`` of a
regular install. jupyter-cache itself keys
each chapter on its code cells and kernelspec, so a change of prose re-renders from the cache,
a change of one chapter's code re-executes that chapter only, and any change to the package,
the data, the pins or a knob starts a fresh folder (the old ones are pruned, :data:`KEEP`). The
sweep store that ``wsutils.run.sweep.run_grid`` uses during the build (``WSBOOK_SWEEP_STORE``,
set for the kernels only) lives inside the same folder, so grids are reused exactly as long as
the package and the knobs are unchanged.

Kernels talk to the build over IPC sockets (``KernelManager.transport = "ipc"``), not TCP:
ipykernel warns about unencrypted TCP, and local sockets are what a local build needs. With
more than one lane, each kernel gets ``OMP_NUM_THREADS`` = cores // lanes (two-thread
kernels that share two cores wait on each other); chapters that set their own thread count
keep it. Every kernel gets ``THP_MEM_ALLOC_ENABLE=1`` unless the environment sets it
(PyTorch's large allocations on transparent huge pages: fewer page faults).

At the end of the build, :func:`report` prints one table: chapter, wall s, CPU s (the kernel
and every process it started), and whether the cache served it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[2]
#: The cache folders live here, one per :func:`environment_key`.
CACHE_ROOT = ROOT / "_build" / ".jupyter_cache"
#: How many environment folders to keep (the newest by use); older ones are removed.
KEEP = 4
#: Knobs that are the build's own plumbing, not inputs of a chapter.
INTERNAL_ENV = ("WSBOOK_PROGRESS", "WSBOOK_SWEEP_STORE")
#: The environment variable through which the kernels' ``run_grid`` finds the sweep store.
SWEEP_ENV = "WSBOOK_SWEEP_STORE"
#: Files whose bytes are part of the key (besides every file under ``wsutils/`` and ``data/``).
KEY_FILES = ("requirements.txt", "requirements-model.txt", "pyproject.toml", "book/matplotlibrc")
#: Only an ordering hint (longest first) before a chapter has been timed on this machine:
#: wall seconds of each chapter at the paper scale, two at a time on 2 cores (``make paper``
#: on a fresh clone of 626bb2b, issue 34, 2026-12-05).
EXPECTED_SECONDS = {  # a cold make paper of acd0ced, 2026-12-07
    "relu-attention": 245,
    "imdb": 153,
    "generalization-n": 149,
    "word-flips": 133,
    "trained-substitutions": 132,
    "attention-far": 117,
    "generalization": 103,
    "random-features": 91,
    "attention-sink": 83,
    "attention": 69,
    "deep-random-features": 67,
    "normalisation": 56,
    "imdb-generalization": 52,
    "trained-attention": 47,
    "your-map": 45,
    "normalisation-boundary": 32,
    "word-sensitivity": 28,
    "figure-1": 24,
}
TIMINGS = CACHE_ROOT / "timings.json"


def _describe_path(value: str) -> str:
    """A knob's value; for a local file or folder, also a SHA-256 of every file's contents.

    A hub name (``bert-base-uncased``, ``WSBOOK_IMDB=hub``) is keyed on the name alone: the
    revision the hub would serve is not known without asking it."""
    from wsutils._digest import tree_digest

    path = Path(value).expanduser()
    if not path.exists():
        return value
    return f"{value}|{tree_digest(path)}"


#: The knobs that may name a local file or folder.
PATH_KNOBS = ("WSBOOK_MODEL", "WSBOOK_IMDB", "WSBOOK_CHAT_MODEL")


def resolve_path_knobs(env, root: Path = ROOT, cwd: Path | None = None) -> dict[str, str]:
    """``env`` with every ``WSBOOK_*`` value read as the kernels read it
    (:func:`wsutils.run.config.knob`: stripped) and every relative path knob made absolute the
    way the build means it: from
    the directory the build runs in (``cwd``). The kernels run in ``book/`` and get the
    absolute path, so the key and the kernels read the same files. A relative value that is a
    path from ``book/`` but not from ``cwd`` would load one thing in the kernels and key
    another (or a name): a ValueError that says to pass an absolute path."""
    from wsutils.run.config import knob

    cwd = Path.cwd() if cwd is None else cwd
    out = dict(env)
    for name in [k for k in out if k.startswith("WSBOOK_")]:
        out[name] = knob(name, out)  # as the kernels read it: " /abs/model\n" is /abs/model
    for name in PATH_KNOBS:
        value = out.get(name, "")  # stripped above
        if not value or Path(value).expanduser().is_absolute():
            continue
        here, there = cwd / value, root / "book" / value
        if here.exists():
            out[name] = str(here.resolve())
        elif there.exists():
            raise ValueError(
                f"{name}={value!r} is a path from book/ (where the chapters run) but not from "
                f"{cwd}, where the build runs: set {name} to an absolute path."
            )
    return out


#: The files of a ``PYTHONPATH`` folder that the key reads: what Python imports from it.
IMPORTABLE = (".py", ".pyi", ".so", ".pyd", ".pth")


def pythonpath_digest(env, root: Path = ROOT) -> str:
    """The ``PYTHONPATH`` of ``env`` as the kernels import from it: each entry, and a
    SHA-256 of its importable files (:data:`IMPORTABLE`, ``__pycache__`` left out), in order.
    The kernels inherit the build's environment and run in ``book/``, so a relative entry is
    read from there. An edited copy of a dependency placed first on ``PYTHONPATH`` changes
    the key (issue 61, item 10)."""
    from wsutils._digest import tree_digest

    h = hashlib.sha256()
    for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
        if not entry:
            continue
        path = Path(entry).expanduser()
        path = path if path.is_absolute() else root / "book" / path
        files = tree_digest(path, suffixes=IMPORTABLE) if path.exists() else "<missing>"
        h.update(f"{entry}:{files}\0".encode())
    return h.hexdigest()


def environment_key(
    env: dict[str, str] | None = None, root: Path = ROOT, cwd: Path | None = None
) -> str:
    """SHA-256 (hex, 16 characters) of everything outside a chapter that its outputs depend on:
    the knobs (:func:`resolve_path_knobs`; a local path by its files), the Python version,
    the pins, every file of ``wsutils/`` and ``data/``, the installed distributions
    (``wsutils._digest.installed_digest``: every version, and the files of a folder
    install) and the folders on ``PYTHONPATH`` (:func:`pythonpath_digest`), which is what the
    kernels import."""
    from wsutils import _digest

    env = resolve_path_knobs(os.environ if env is None else env, root, cwd)
    h = hashlib.sha256()
    knobs = {k: v for k, v in env.items() if k.startswith("WSBOOK_") and k not in INTERNAL_ENV}
    knobs.setdefault("WSBOOK_SCALE", "quick")
    for name in sorted(knobs):
        h.update(f"{name}={_describe_path(knobs[name])}\0".encode())
    h.update(f"python={sys.version_info[:3]}\0".encode())
    for name in KEY_FILES:
        path = root / name
        h.update(name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"<missing>")
    for folder in ("wsutils", "data"):  # every file, __pycache__ left out
        if (root / folder).is_dir():
            h.update(f"{folder}:{_digest.tree_digest(root / folder)}\0".encode())
    h.update(f"installed={_digest.installed_digest()}\0".encode())
    h.update(f"pythonpath={pythonpath_digest(env, root)}\0".encode())
    return h.hexdigest()[:16]


def cache_folder(env: dict[str, str] | None = None) -> Path:
    return CACHE_ROOT / environment_key(env)


def prune(keep: Path, n_keep: int = KEEP) -> None:
    """Remove all but the ``n_keep`` most recently used environment folders (``keep`` stays)."""
    if not CACHE_ROOT.is_dir():
        return
    folders = sorted(
        (p for p in CACHE_ROOT.iterdir() if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in folders[max(0, n_keep - 1) :]:
        shutil.rmtree(old, ignore_errors=True)


def available_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def lanes(n_chapters: int, cores: int | None = None) -> int:
    """Chapters executed at once: one per core, at most the number to execute."""
    if cores is None:
        cores = available_cores()
    return max(1, min(cores, n_chapters))


def longest_first(names: Iterable[str], measured: dict[str, float]) -> list[str]:
    """Chapters ordered by their last measured time, else :data:`EXPECTED_SECONDS`, longest first
    (the longest-processing-time rule: it keeps the last lane from running alone for long)."""

    def cost(name: str) -> float:
        return measured.get(name, EXPECTED_SECONDS.get(name, 60.0))

    return sorted(names, key=lambda name: (-cost(name), name))


def _load_timings() -> dict[str, dict[str, float]]:
    try:
        return json.loads(TIMINGS.read_text())
    except (OSError, ValueError):
        return {}


def _save_timings(timings: dict[str, dict[str, float]]) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    tmp = TIMINGS.with_name(f"{TIMINGS.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(timings, indent=1, sort_keys=True))
    os.replace(tmp, TIMINGS)


@dataclass
class Row:
    """One chapter of the end-of-build table."""

    docname: str
    status: str  # "executed", "cached" or "failed"
    wall: float | None = None
    cpu: float | None = None
    lane: int | None = None  # which of the parallel lanes ran it (1, 2, …)
    start: float | None = None  # seconds after the first chapter started
    end: float | None = None
    recorded: float | None = None  # a cached chapter: its wall s when it was executed


@dataclass
class Job:
    docname: str
    path: Path
    notebook: object  # nbformat.NotebookNode
    read_fmt: dict | None
    timeout: int | None


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, of its children it has waited for, and of its live descendants
    (a chapter's process-pool workers)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return float("nan")


def kernel_environment(threads: int | None, progress: str | None, store: Path) -> dict[str, str]:
    env = resolve_path_knobs(os.environ)  # the paths the key read
    env[SWEEP_ENV] = str(store)
    if progress is not None:
        env["WSBOOK_PROGRESS"] = progress
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    # PyTorch's large CPU allocations on transparent huge pages (where the kernel allows them
    # on request): a fresh weight block faults 2 MB pages instead of 4 kB ones
    # (benchmarks/bench_search_steps.py --parts thp). A value set by the user is kept.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env


@dataclass
class CellCost:
    """One code cell's cost: wall and CPU seconds (kernel and its processes)."""

    docname: str
    index: int
    line: str  # the cell's first line of code
    wall: float
    cpu: float


def _first_line(source: str) -> str:
    lines = [x.strip() for x in source.splitlines()]
    code = [x for x in lines if x and not x.startswith("#")]
    return (code or lines or [""])[0][:60]


def execute_one(job: Job, *, env: dict[str, str]) -> tuple[object, float, float, list]:
    """Execute one chapter in a fresh kernel over IPC; returns (notebook, wall s, CPU s, the
    cells' :class:`CellCost`).

    Raises nbclient's ``CellExecutionError`` (or a timeout) when a cell fails."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    # IPC sockets are files named <ip>-<port>: an absolute prefix of this chapter's own, since
    # the kernel runs in book/ and the build elsewhere, and two kernels start at once.
    sockets = tempfile.mkdtemp(prefix="wsbook-kernel-")
    config.KernelManager.ip = os.path.join(sockets, job.docname)
    cpu = {"seconds": float("nan"), "cell": (0.0, 0.0)}
    cells: list[CellCost] = []

    def cpu_now() -> float:
        if client.km is None or client.km.provisioner is None:
            return float("nan")
        seconds = process_cpu_seconds(client.km.provisioner.pid)
        if not seconds <= cpu["seconds"]:  # the largest reading (NaN at first)
            cpu["seconds"] = seconds
        return cpu["seconds"]

    def before(**_kwargs) -> None:  # nbclient hooks, while the kernel is up
        cpu["cell"] = (time.monotonic(), cpu_now())

    def after(cell=None, cell_index=0, **_kwargs) -> None:
        t0, c0 = cpu["cell"]
        cells.append(
            CellCost(
                job.docname,
                cell_index,
                _first_line(cell.source if cell else ""),
                time.monotonic() - t0,
                cpu_now() - c0,
            )
        )

    # record_timing=False: cell metadata is part of the cache key (jupyter-cache hashes it)
    client = NotebookClient(
        job.notebook,
        timeout=job.timeout,
        allow_errors=False,
        record_timing=False,
        config=config,
        on_cell_execute=before,
        on_cell_executed=after,
        resources={"metadata": {"path": str(job.path.parent)}},
    )
    start = time.monotonic()
    try:
        client.execute(env=env)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return job.notebook, time.monotonic() - start, cpu["seconds"], cells


class Prefill:
    """Execute the chapters the cache lacks, :func:`lanes` at a time, and cache them."""

    def __init__(self, cache_path: Path, write: Callable[[str], None]) -> None:
        from jupyter_cache import get_cache

        self.cache_path = cache_path
        self.cache = get_cache(str(cache_path))
        self.write = write
        self.rows: dict[str, Row] = {}
        self.cells: list[CellCost] = []

    def is_cached(self, notebook) -> bool:
        return self.cached_record(notebook) is not None

    def cached_record(self, notebook):
        """The cache's record of ``notebook`` (its code unchanged), or ``None``."""
        try:
            return self.cache.match_cache_notebook(notebook)
        except KeyError:
            return None

    def run(self, jobs: list[Job], progress_factory) -> None:
        todo = []
        for job in jobs:
            record = self.cached_record(job.notebook)
            if record is not None:
                seconds = (record.data or {}).get("execution_seconds")
                self.rows[job.docname] = Row(job.docname, "cached", recorded=seconds)
            else:
                todo.append(job)
        if not todo:
            return
        timings = _load_timings()
        from wsutils.run.config import scale as knob_scale

        scale = knob_scale()
        measured = timings.get(scale, {})
        order = {
            name: i for i, name in enumerate(longest_first([j.docname for j in todo], measured))
        }
        todo.sort(key=lambda j: order[j.docname])
        n_lanes = lanes(len(todo))
        threads = max(1, available_cores() // n_lanes) if n_lanes > 1 else None
        self.write(
            f"executing {len(todo)} chapter(s), {n_lanes} at a time, longest first"
            + (f", {threads} thread(s) each" if threads else "")
            + ": "
            + ", ".join(j.docname for j in todo)
        )
        failures = []
        t0 = time.monotonic()
        free_lanes = list(range(1, n_lanes + 1))
        with ThreadPoolExecutor(n_lanes, thread_name_prefix="wsbook-chapter") as pool:
            pending = {}
            queue = list(todo)

            def submit(job: Job) -> None:
                progress = progress_factory(job.docname)
                env = kernel_environment(
                    threads, progress.path if progress else None, self.cache_path / "sweeps"
                )
                future = pool.submit(execute_one, job, env=env)
                pending[future] = (job, progress, free_lanes.pop(0), time.monotonic() - t0)

            while queue and len(pending) < n_lanes:
                submit(queue.pop(0))
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    job, progress, lane, began = pending.pop(future)
                    free_lanes.append(lane)
                    free_lanes.sort()
                    if progress is not None:
                        progress.stop()
                    try:
                        notebook, wall, cpu, cells = future.result()
                    except Exception as err:  # a failing cell: report, start nothing new
                        failures.append((job, err))
                        self.rows[job.docname] = Row(job.docname, "failed")
                        self.write(f"{job.docname} FAILED: {type(err).__name__}")
                        queue.clear()
                        continue
                    self._store(job, notebook, wall)
                    self.cells += cells
                    self.rows[job.docname] = Row(
                        job.docname, "executed", wall, cpu, lane, began, time.monotonic() - t0
                    )
                    measured[job.docname] = round(wall, 1)
                    self.write(f"{job.docname} done in {wall:.0f} s ({cpu:.0f} CPU s)")
                    if queue:
                        submit(queue.pop(0))
        timings[scale] = measured
        _save_timings(timings)
        if failures:
            job, err = failures[0]
            from sphinx.errors import ExtensionError

            raise ExtensionError(f"executing {job.path} failed:\n{err}")

    def _store(self, job: Job, notebook, wall: float) -> None:
        from jupyter_cache.base import CacheBundleIn

        if job.read_fmt is not None:
            record = self.cache.add_nb_to_project(str(job.path), read_data=job.read_fmt)
        else:
            record = self.cache.add_nb_to_project(str(job.path))
        self.cache.cache_notebook_bundle(
            CacheBundleIn(notebook, record.uri, data={"execution_seconds": wall}),
            check_validity=False,
            overwrite=True,
        )


def costliest_cells(cells: Iterable[CellCost], n: int = 12) -> list[str]:
    """The ``n`` code cells of the largest CPU time, one line each."""
    top = sorted(cells, key=lambda c: -(c.cpu if c.cpu == c.cpu else c.wall))[:n]
    return [
        f"{c.docname:<22} cell {c.index:>3} {c.wall:7.0f} s {c.cpu:7.0f} CPU s  {c.line}"
        for c in top
    ]


def format_table(rows: Iterable[Row]) -> list[str]:
    """The end-of-build table, one line a chapter (its wall and CPU seconds, the lane that ran
    it and when, in seconds from the first chapter's start), a total, and one line per lane:
    its chapters in order and when it ended; the lane that ends last is the build's critical
    path."""
    rows = list(rows)
    lines = [
        f"{'chapter':<24} {'wall s':>8} {'CPU s':>8}  {'lane':>4} {'from–to s':>11}  cache",
        f"{'-' * 24} {'-' * 8} {'-' * 8}  {'-' * 4} {'-' * 11}  --------",
    ]
    for r in rows:
        wall = f"{r.wall:8.0f}" if r.wall is not None else f"{'–':>8}"
        cpu = f"{r.cpu:8.0f}" if r.cpu is not None else f"{'–':>8}"
        lane = f"{r.lane:>4}" if r.lane is not None else f"{'–':>4}"
        span = f"{r.start:5.0f}–{r.end:<5.0f}" if r.start is not None else f"{'–':>11}"
        status = {"executed": "executed", "cached": "hit", "failed": "FAILED"}[r.status]
        lines.append(f"{r.docname:<24} {wall} {cpu}  {lane} {span}  {status}")
    executed = [r for r in rows if r.status == "executed"]
    if executed:
        lines.append(
            f"{'all executed':<24} {sum(r.wall for r in executed):8.0f} "
            f"{sum(r.cpu for r in executed if r.cpu == r.cpu):8.0f}  "
            f"({len(executed)} executed, {len(rows) - len(executed)} from the cache)"
        )
    lines += lane_summary(rows)
    return lines


def lane_summary(rows: Iterable[Row]) -> list[str]:
    """One line per lane of the executed chapters, in the order it ran them, with the time it
    ended; the last to end is marked as the critical path."""
    by_lane: dict[int, list[Row]] = {}
    for r in rows:
        if r.lane is not None and r.end is not None:
            by_lane.setdefault(r.lane, []).append(r)
    if not by_lane:
        return []
    ends = {lane: max(r.end for r in rs) for lane, rs in by_lane.items()}
    last = max(ends, key=ends.get)
    out = []
    for lane in sorted(by_lane):
        order = " → ".join(r.docname for r in sorted(by_lane[lane], key=lambda r: r.start))
        mark = "  (the critical path)" if lane == last and len(by_lane) > 1 else ""
        out.append(f"lane {lane}: {order}; ends at {ends[lane]:.0f} s{mark}")
    return out


def execution_rows(rows: Iterable[Row]) -> list[tuple[str, str, str]]:
    """The ledger's execution table (issue 53), one ``(chapter, seconds, this build)`` per
    chapter: the wall seconds of its kernel when it last ran, and whether this build executed
    it or took it from the execution cache (a hit: its seconds are those recorded when it
    ran)."""
    out = []
    for r in rows:
        seconds = r.wall if r.status == "executed" else r.recorded
        shown = "–" if seconds is None else f"{seconds:.0f}"
        status = {"executed": "executed", "cached": "cache hit", "failed": "FAILED"}[r.status]
        out.append((r.docname, shown, status))
    return out
