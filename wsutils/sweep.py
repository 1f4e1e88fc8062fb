"""One sweep runner for every experiment grid in the book.

``run_grid(fn, points)`` evaluates ``fn(**point)`` for every point of a grid (a list of dicts
of JSON-serialisable parameters, seeds included) and returns one record per point, in the
order of ``points``: the point's parameters merged with the dict ``fn`` returns.

- ``executor``: any :class:`concurrent.futures.Executor`. ``None`` runs in this process, one
  point after the other. A ``ProcessPoolExecutor`` runs points in parallel; a Dask
  ``distributed.Client(...).get_executor()`` runs the same grid on a cluster.
- ``store``: a directory. Each point's record is written there as soon as it finishes (one
  JSON file, written atomically: a temporary file then ``os.replace``), so an interrupted sweep
  resumes where it stopped and a finished one is read back instead of recomputed. A file that
  does not parse or does not belong to its point is recomputed, never used. With a store,
  every record is returned as stored (numpy and torch numbers become plain floats, ints and
  lists), so a fresh run and a resumed one return identical records.
- ``progress``: a tqdm bar over the points.

If a point raises, the points not yet started are cancelled, those already running are still
stored as they finish, and the first error is raised.

``fn`` must be a module-level function (so that it pickles) and deterministic given its
parameters: the same seeds give the same numbers, wherever a point runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import Executor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tqdm.auto import tqdm

__all__ = ["point_key", "run_grid"]

Record = dict[str, Any]


def point_key(fn: Callable, point: Mapping[str, Any]) -> str:
    """A stable name for one grid point of ``fn``: its qualified name and its parameters."""
    blob = json.dumps({"fn": f"{fn.__module__}.{fn.__qualname__}", "point": dict(point)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _load(path: Path, key: str) -> Record | None:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key or "record" not in stored:
        return None
    return stored["record"]


def _plain(value: Any) -> Any:
    """JSON fallback for numpy and torch numbers and arrays."""
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch tensors
        return value.tolist()
    raise TypeError(
        f"a sweep record holds a {type(value).__name__}, which cannot be stored as JSON; "
        "return numbers, strings, lists or dicts (or run without store=)."
    )


def _as_stored(record: Record) -> Record:
    """``record`` as it reads back from the store."""
    return json.loads(json.dumps(record, default=_plain))


def _save(path: Path, key: str, record: Record) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "record": record}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _evaluate(fn: Callable[..., Mapping[str, Any]], point: Mapping[str, Any]) -> Record:
    out = fn(**point)
    if not isinstance(out, Mapping):
        raise TypeError(f"{fn.__qualname__} must return a dict of results, got {type(out).__name__}.")
    clash = set(out) & set(point)
    if clash:
        raise ValueError(f"{fn.__qualname__} returned keys {sorted(clash)} that are also parameters.")
    return {**point, **out}


def _run_on(executor: Executor, fn, points: list[Record], todo: list[int], finish) -> None:
    futures = {executor.submit(_evaluate, fn, points[i]): i for i in todo}
    error: BaseException | None = None
    try:
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            exc = fut.exception()
            if exc is None:
                finish(futures[fut], fut.result())
            elif error is None:  # stop starting points; keep storing the running ones
                error = exc
                for other in futures:
                    other.cancel()
    except BaseException:  # an interrupt: start nothing more
        for other in futures:
            other.cancel()
        raise
    if error is not None:
        raise error


def run_grid(
    fn: Callable[..., Mapping[str, Any]],
    points: Iterable[Mapping[str, Any]],
    *,
    executor: Executor | None = None,
    store: str | os.PathLike | None = None,
    progress: bool = True,
    desc: str | None = None,
) -> list[Record]:
    """Evaluate ``fn(**point)`` on every point; see the module docstring."""
    points = [dict(p) for p in points]
    if not points:
        raise ValueError("the grid is empty: pass at least one point.")
    keys = [point_key(fn, p) for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("the grid has duplicate points; each point must differ (seeds included).")
    folder = Path(store) if store is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    results: dict[int, Record] = {}
    todo = []
    for i, key in enumerate(keys):
        cached = _load(folder / f"{key}.json", key) if folder is not None else None
        if cached is not None:
            results[i] = cached
        else:
            todo.append(i)
    bar = tqdm(total=len(points), initial=len(results), desc=desc or fn.__name__,
               disable=not progress, leave=False)

    def finish(i: int, record: Record) -> None:
        if folder is not None:
            record = _as_stored(record)
            _save(folder / f"{keys[i]}.json", keys[i], record)
        results[i] = record
        bar.update()

    try:
        if executor is None:
            for i in todo:
                finish(i, _evaluate(fn, points[i]))
        else:
            _run_on(executor, fn, points, todo, finish)
    finally:
        bar.close()
    return [results[i] for i in range(len(points))]
