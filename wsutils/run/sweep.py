"""One sweep runner for every experiment grid in the book.

``run_grid(fn, points)`` evaluates ``fn(**point)`` for every point of a grid (a list of dicts
of plain JSON parameters, seeds included) and returns one record per point, in the order of
``points``: the point's parameters merged with the dict ``fn`` returns.

- ``executor``: any :class:`concurrent.futures.Executor`. ``None`` runs in this process, one
  point after the other. A ``ProcessPoolExecutor`` runs points in parallel; a Dask
  ``distributed.Client(...).get_executor()`` runs the same grid on a cluster.
- ``store``: a directory. Each point's record is written there as soon as it finishes (one
  JSON file, written atomically: a temporary file then ``os.replace``), so an interrupted sweep
  resumes where it stopped and a finished one is read back instead of recomputed. With a
  store, every record is returned as stored (numpy and torch numbers become plain floats, ints
  and lists), so a fresh run and a resumed one return identical records.
- ``progress``: a tqdm bar over the points.

If a point raises, the points not yet started are cancelled, those already running are still
stored as they finish, and the first error is raised.

``fn`` must be a module-level function (so that it pickles) and deterministic given its
parameters: the same seeds give the same numbers, wherever a point runs.

What the store trusts:

- **Keys are unambiguous.** A point's key is a SHA-256 over the canonical JSON (sorted keys,
  shortest round-trip floats) of its parameters, of ``fn``'s qualified name and of a digest of
  the code that runs (``_code_digest``: ``fn``'s code objects, defaults and closure, and
  recursively those of the functions, classes, plain constants and tables of settings (dicts
  named in upper case, dataclass instances) that its names and its function-level imports reach
  in its own top-level package and in ``wsutils``; read from memory, not from the source file,
  so a module edited on disk but not reloaded keeps its old key). A parameter that is not a
  plain JSON value (``None``, bools, ints, floats, strings, lists/tuples, dicts with string
  keys; numpy scalars count as their Python value) is a :class:`TypeError`: an array's or a
  callable's text form (``str``) is not a name for it (a large array prints elided, two lambdas
  print alike). With a store, ``fn`` itself must be named by its qualified name: lambdas,
  nested functions, ``functools.partial`` objects and bound methods are refused. Two functions
  with one name but different code get different keys, and so do two whose helpers in the
  package differ; what the digest does not reach (code outside those packages, data files,
  environment variables, lists and sets and ``…_CACHE`` dicts, which hold state) is *not* in
  the key: clear the store when that changes. Because tracing always misses some way of
  reaching code (an inherited method, a function as a default argument, ``pkg.sub.f()``, a
  module-level ``functools.partial``), the key also holds a digest of **every file** of
  ``fn``'s top-level package and of ``wsutils`` and of the **installed distributions** (every
  ``name==version``, and the files of a folder install): any edit to those files, and any
  other version of any installed package, gives new keys. Not covered: files edited inside
  ``site-packages`` of a regular install (reinstall instead), data files outside those
  packages, environment variables. If a package's files change on disk while a process runs
  (edited, not reloaded), that process runs its sweeps without the store, with a
  :class:`StoreWarning`: no key would name the code it runs.
- **Records are verified.** Each file holds the full point, ``fn``'s name and a SHA-256 of
  the canonical JSON of all of it and of the record. A file that does not parse, belongs to
  another point or whose checksum does not match (edited, truncated, emptied, written by an
  older ``wsutils``) is **recomputed**, with a :class:`StoreWarning` naming the file and the
  reason, and the file is overwritten with the fresh record. Recomputing is always correct
  (``fn`` is deterministic), so a damaged file costs one point's time, never a wrong number.
  The checksum detects accidents and edits, not forgery: a store is not a security boundary.
- **Half-written files are removed.** A write killed between the temporary file and
  ``os.replace`` leaves ``<key>.json.<host>-<pid>.<random>.tmp``; the next run on that store
  deletes such files whose writer process (on this host) is gone, and any older than a day.
"""

from __future__ import annotations

import dataclasses
import dis
import hashlib
import importlib
import importlib.util
import json
import numbers
import os
import re
import socket
import sys
import tempfile
import time
import types
import warnings
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed, wait
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from tqdm.auto import tqdm

from .._digest import installed_digest, tree_digest
from . import config

__all__ = ["StoreWarning", "point_key", "process_pool", "run_grid"]

Record = dict[str, Any]

#: The version of the stored file layout; files of another version are recomputed.
FORMAT = 2


class StoreWarning(UserWarning):
    """A stored record failed verification and is being recomputed."""


# --- keys --------------------------------------------------------------------------------------


def _plain_param(value: Any, where: str) -> Any:
    """``value`` as a plain JSON value, or a TypeError that says what to pass instead."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, np.ndarray):
        return int(value)
    if isinstance(value, float) or isinstance(value, np.floating):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain_param(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(
                f"sweep parameter {where} has non-string keys {bad!r}; a key of a grid "
                "point must be plain JSON: use string keys."
            )
        return {k: _plain_param(v, f"{where}[{k!r}]") for k, v in value.items()}
    kind = type(value).__name__
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        hint = (
            "pass a list (x.tolist()) for a small array, or the seed and sizes it is "
            "drawn from (or a file name) and build it inside fn"
        )
    elif callable(value):
        hint = "pass its name as a string and look the function up inside fn"
    else:
        hint = "pass the numbers or strings it is made from and build it inside fn"
    raise TypeError(
        f"sweep parameter {where} is a {kind}, not a plain JSON value (number, string, bool, "
        f"None, list, dict): its text form is not a unique name, so two different points could "
        f"share a key; {hint}."
    )


def _canonical(obj: Any) -> str:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True
    )


def _fn_name(fn: Callable) -> str:
    """``module.qualname`` of ``fn``, refused unless that name designates ``fn`` itself."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    what = "pass a module-level function (def at the top of a module)"
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(
            f"a sweep with a store needs fn with a qualified name; got a "
            f"{type(fn).__name__} (a functools.partial or callable object has none): "
            f"{what} and move fixed arguments into the points."
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            f"a sweep with a store cannot name fn = {module}.{qualname}: lambdas and "
            f"nested functions share their name with others; {what}."
        )
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn:
        raise TypeError(
            f"{module}.{qualname} does not name fn itself (a bound method, a "
            f"replaced or a wrapped function): {what}."
        )
    return f"{module}.{qualname}"


def _const(c: Any) -> str:
    """A canonical text of a code constant or plain module-level value (frozensets sorted, so
    that the key does not depend on the string hash seed; object addresses dropped)."""
    if isinstance(c, (frozenset, set)):
        return f"{type(c).__name__}({sorted(_const(v) for v in c)})"
    if isinstance(c, tuple):
        return "(" + ",".join(_const(v) for v in c) + ")"
    if isinstance(c, list):
        return "[" + ",".join(_const(v) for v in c) + "]"
    if isinstance(c, dict):
        return "{" + ",".join(sorted(f"{_const(k)}:{_const(v)}" for k, v in c.items())) + "}"
    if c is None or isinstance(c, (bool, int, float, complex, str, bytes)) or c is Ellipsis:
        return f"{type(c).__name__}:{c!r}"
    text = repr(c)
    return type(c).__qualname__ if " at 0x" in text else f"{type(c).__qualname__}:{text}"


_PLAIN_GLOBALS = (bool, int, float, complex, str, bytes, tuple, frozenset)


class _CodeHasher:
    """The digest of :func:`_code_digest`: walks ``fn``'s code objects and what their names
    reach inside ``roots`` (top-level package names)."""

    def __init__(self, roots: set[str]):
        self.h = hashlib.sha256()
        self.roots = roots
        self.seen: set[int] = set()
        self.imports: list[tuple[str, str, int, tuple]] = []  # (package, name, level, fromlist)

    def feed(self, *parts: Any) -> None:
        for p in parts:
            b = p if isinstance(p, bytes) else str(p).encode()
            self.h.update(len(b).to_bytes(8, "little") + b)

    def inside(self, obj: Any) -> bool:
        mod = getattr(obj, "__module__", None)
        return isinstance(mod, str) and mod.split(".")[0] in self.roots

    def code(self, code: types.CodeType, scope: dict, names: set[str]) -> None:
        self.feed(
            "code",
            code.co_code,
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
        )
        names.update(code.co_names)
        level = fromlist = None
        for ins in dis.get_instructions(code):  # imports inside the function: follow them
            if ins.opname == "LOAD_CONST":
                level, fromlist = fromlist, ins.argval
            elif ins.opname == "IMPORT_NAME":
                self.imports.append(
                    (
                        scope.get("__package__") or "",
                        ins.argval,
                        level if isinstance(level, int) else 0,
                        tuple(fromlist or ()),
                    )
                )
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, scope, names)
            else:
                self.feed(_const(c))

    def obj(self, obj: Any) -> None:
        if id(obj) in self.seen:
            self.feed("seen", getattr(obj, "__qualname__", type(obj).__name__))
            return
        self.seen.add(id(obj))
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is not None and not isinstance(obj, types.FunctionType):
            self.feed("wrapper", type(obj).__qualname__)
            self.obj(wrapped)
            return
        if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            self.obj(obj.__func__)
            return
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    self.obj(f)
            return
        if isinstance(obj, type):
            self.feed(
                "class", obj.__module__, obj.__qualname__, [b.__qualname__ for b in obj.__mro__]
            )
            for k, v in sorted(vars(obj).items()):
                if isinstance(v, (types.FunctionType, staticmethod, classmethod, property)):
                    self.feed(k)
                    self.obj(v)
                elif isinstance(v, _PLAIN_GLOBALS) and not k.startswith("__"):
                    self.feed(k, _const(v))
            return
        if not isinstance(obj, types.FunctionType):
            self.feed("object", _const(obj))
            return
        self.feed(
            "function",
            obj.__module__,
            obj.__qualname__,
            _const(obj.__defaults__),
            _const(tuple(sorted((obj.__kwdefaults__ or {}).items()))),
        )
        names: set[str] = set()
        self.code(obj.__code__, obj.__globals__, names)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if self.inside(value) or isinstance(value, type):
                self.obj(value) if self.inside(value) else self.feed(_const(value))
            else:
                self.feed("cell", _const(value))
        self.names(obj.__globals__, names)

    def names(self, scope: dict, names: set[str]) -> None:
        """Follow the names a code object uses: globals of the package (functions, classes,
        plain constants) and, for a module of the package, its attributes of those names."""
        modules = []
        for name in sorted(names):
            if name not in scope:
                continue
            value = scope[name]
            if isinstance(value, types.ModuleType):
                if value.__name__.split(".")[0] in self.roots:
                    modules.append(value)
            elif self.inside(value) and (callable(value) or isinstance(value, type)):
                self.feed("global", name)
                self.obj(value)
            elif self._readable(name, value):
                self.feed("global", name)
                self.value(value)
        modules += self.imported()
        for mod in modules:
            for name in sorted(names):
                value = getattr(mod, name, None)
                if value is not None and self.inside(value) and callable(value):
                    self.feed("attribute", mod.__name__, name)
                    self.obj(value)
                elif self._readable(name, value):
                    self.feed("attribute", mod.__name__, name)
                    self.value(value)

    def _readable(self, name: str, value: Any) -> bool:
        """A module-level value whose contents the code may read: a plain constant, a
        dataclass instance of the package, or a table of settings (a dict named in upper
        case, as constants are; a module's cache is named ``…_CACHE`` and left out, as are
        lists and sets, which hold state rather than settings)."""
        if isinstance(value, _PLAIN_GLOBALS):
            return True
        if isinstance(value, dict):
            return name.lstrip("_").isupper() and not name.endswith("CACHE")
        return (
            self.inside(value) and dataclasses.is_dataclass(value) and not isinstance(value, type)
        )

    def value(self, value: Any) -> None:
        """A readable value: the code of the package's functions it holds, the text of the
        rest (:func:`_const`)."""
        if isinstance(value, dict):
            for k in sorted(value, key=_const):
                self.feed("entry", _const(k))
                self.value(value[k])
        elif self.inside(value) and callable(value) and not dataclasses.is_dataclass(value):
            self.obj(value)
        else:
            self.feed(_const(value))

    def imported(self) -> list[types.ModuleType]:
        """The package's modules imported inside the code walked so far, and what their
        ``from … import`` names reach (followed like globals)."""
        modules = []
        pending, self.imports = self.imports, []
        for package, name, level, fromlist in pending:
            try:
                full = importlib.util.resolve_name("." * level + name, package) if level else name
            except (ImportError, ValueError):
                continue
            if full.split(".")[0] not in self.roots:
                continue
            module = sys.modules.get(full) or importlib.import_module(full)
            modules.append(module)
            for attr in fromlist:
                value = getattr(module, attr, None)
                if isinstance(value, types.ModuleType):
                    modules.append(value)
                elif value is not None and self.inside(value) and callable(value):
                    self.feed("imported", full, attr)
                    self.obj(value)
                elif self._readable(attr, value):
                    self.feed("imported", full, attr)
                    self.value(value)
        return modules


def _code_digest(fn: Callable) -> str:
    """SHA-256 of the code that runs when ``fn`` is called: its code object (bytecode,
    constants, names; not line numbers or the file name), defaults and closure, and,
    recursively, those of the functions and classes (and the plain constants) that its
    names reach in its own top-level package and in :mod:`wsutils`. Read from the objects in
    memory, not from the source file, so a module edited on disk but not reloaded keeps the
    key of the code that actually runs. This tracing misses ways of reaching code (an
    inherited method, a function as a default argument, ``pkg.sub.f()``, a module-level
    ``functools.partial``); :func:`_store_digest` adds what it misses."""
    hasher = _CodeHasher(_roots(fn))
    hasher.obj(fn)
    return hasher.h.hexdigest()


def _roots(fn: Callable) -> set[str]:
    """The top-level packages whose code the key covers: :mod:`wsutils` and ``fn``'s own."""
    mod = getattr(fn, "__module__", None)
    return {"wsutils"} | ({mod.split(".")[0]} if isinstance(mod, str) else set())


def _package_path(root: str) -> Path | None:
    """The folder (or file) of the top-level package or module ``root``, if it has one."""
    module = sys.modules.get(root)
    where = getattr(module, "__path__", None)
    if where:
        return Path(list(where)[0])
    origin = getattr(module, "__file__", None)
    return Path(origin) if origin else None


#: The ``wsutils._digest.tree_digest`` of each package as this process first saw it
#: (``wsutils`` when this module was imported, another package at its first sweep).
_LOADED: dict[str, str] = {}


def _files_digest(root: str) -> str:
    path = _package_path(root)
    return tree_digest(path) if path is not None and path.exists() else "<no files>"


def _changed_roots(fn: Callable) -> list[str]:
    """The packages of ``fn``'s key whose files changed on disk since this process first saw
    them (:data:`_LOADED`)."""
    changed = []
    for root in sorted(_roots(fn)):
        now = _files_digest(root)
        if _LOADED.setdefault(root, now) != now:
            changed.append(root)
    return changed


def _store_digest(fn: Callable) -> str | None:
    """The conservative part of a stored point's key: every file of ``fn``'s package and of
    :mod:`wsutils` (``wsutils._digest.tree_digest``: any edit to any of their files changes
    the key, whichever way the code reaches it) and the installed distributions
    (``wsutils._digest.installed_digest``: every version, and the files of a folder
    install), beside the traced :func:`_code_digest`. ``None`` when a package's files changed
    on disk since this process loaded them: the code running is then not the code on disk,
    no key names it, and the sweep runs without the store (restart the kernel)."""
    if _changed_roots(fn):
        return None
    h = hashlib.sha256()
    for root in sorted(_roots(fn)):
        h.update(f"{root}:{_LOADED[root]}\0".encode())
    h.update(installed_digest().encode())
    return h.hexdigest()


_LOADED["wsutils"] = _files_digest("wsutils")


def _plain_point(point: Mapping[str, Any]) -> dict[str, Any]:
    bad = [k for k in point if not isinstance(k, str)]
    if bad:
        raise TypeError(f"grid point keys must be parameter names (strings), got {bad!r}.")
    return {k: _plain_param(v, repr(k)) for k, v in point.items()}


def point_key(fn: Callable, point: Mapping[str, Any]) -> str:
    """The store's name for one grid point of ``fn``: a SHA-256 (24 hex digits) over the
    canonical JSON of ``fn``'s qualified name, its code digest and the point's parameters.
    A TypeError for a parameter that is not plain JSON or an ``fn`` without a unique name
    (module docstring)."""
    files = _store_digest(fn) or "<changed on disk since import>"
    return _key(_fn_name(fn), _code_digest(fn) + files, _plain_point(point))


def _key(fn_name: str, code: str, plain: dict) -> str:
    blob = {"fn": fn_name, "code": code, "point": plain}
    return hashlib.sha256(_canonical(blob).encode()).hexdigest()[:24]


# --- the stored files --------------------------------------------------------------------------


def _checksum(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def _load(path: Path, key: str, fn_name: str, point: dict) -> tuple[Record | None, str | None]:
    """``(record, None)`` for a verified file, ``(None, None)`` for none, ``(None, why)`` for a
    file that fails verification."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot be read ({err})"
    try:
        stored = json.loads(text)
    except ValueError:
        return None, "does not parse as JSON (truncated or edited)"
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        return None, f"is not a format-{FORMAT} sweep record (an older wsutils wrote it?)"
    body = {k: stored.get(k) for k in ("format", "key", "fn", "point", "record")}
    if stored.get("sha256") != _checksum(body):
        return None, "does not match its checksum (edited or corrupted)"
    if (body["key"], body["fn"], _canonical(body["point"])) != (key, fn_name, _canonical(point)):
        return None, "belongs to another point"
    record = body["record"]
    if not isinstance(record, dict) or any(
        k not in record or _canonical(record[k]) != _canonical(v) for k, v in point.items()
    ):
        return None, "holds a record without its point's parameters"
    return record, None


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


_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TMP = re.compile(r"[0-9a-f]{24}\.json\.([0-9a-f]{8})-(\d+)\.[^/]*\.tmp")
_LEGACY_TMP = re.compile(r"[0-9a-f]{24}\.json[^.]+\.tmp")  # before FORMAT 2: no host, no pid
_STALE_SECONDS = 86400.0


def _alive(pid: int) -> bool:
    if os.name == "nt":  # no signal 0 there; rely on the age rule
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_stale_tmp(folder: Path) -> list[Path]:
    """Delete the temporary files of killed writes (module docstring); returns them."""
    removed = []
    now = time.time()
    for tmp in folder.glob("*.tmp"):
        m = _TMP.fullmatch(tmp.name)
        try:
            old = now - tmp.stat().st_mtime > _STALE_SECONDS
        except FileNotFoundError:
            continue
        if m:
            host, pid = m.group(1), int(m.group(2))
            dead = host == _HOST and pid != os.getpid() and not _alive(pid)
            if not (dead or old):
                continue
        elif not _LEGACY_TMP.fullmatch(tmp.name):
            continue  # not a file this module writes
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _save(path: Path, key: str, fn_name: str, point: dict, record: Record) -> None:
    body = {"format": FORMAT, "key": key, "fn": fn_name, "point": point, "record": record}
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f"{path.name}.{_HOST}-{os.getpid()}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_canonical({**body, "sha256": _checksum(body)}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- running -----------------------------------------------------------------------------------


def _evaluate(fn: Callable[..., Mapping[str, Any]], point: Mapping[str, Any]) -> Record:
    out = fn(**point)
    if not isinstance(out, Mapping):
        raise TypeError(
            f"{fn.__qualname__} must return a dict of results, got {type(out).__name__}."
        )
    clash = set(out) & set(point)
    if clash:
        raise ValueError(
            f"{fn.__qualname__} returned keys {sorted(clash)} that are also parameters."
        )
    return {**point, **out}


def _run_on(executor: Executor, fn, points: list[Record], todo: list[int], finish) -> None:
    """Run the points ``todo`` on ``executor``, storing each result as it comes. After the
    first error every other point is cancelled; those that refuse (already running) are waited
    on, and every point that finished, before or after the error, is stored (one that finished
    while the error was being read is not lost), then the first error is raised. A future that
    accepted its
    cancellation is never waited on: some executors, Dask's ``Client.get_executor()`` among
    them, do not complete it, and waiting on it hung."""
    # Dask's executor keys a task by its arguments (pure tasks) and serves a key's erred result
    # again on a rerun: each submission there is a new task (pure=False), as on a pool.
    extra = {"pure": False} if type(executor).__module__.startswith("distributed") else {}
    futures = {executor.submit(_evaluate, fn, points[i], **extra): i for i in todo}
    stored = set()
    try:
        for fut in as_completed(futures):
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                break
            if not fut.cancelled():
                finish(futures[fut], fut.result())
                stored.add(fut)
        else:
            return
    except BaseException:  # an interrupt: start nothing more, wait for nothing
        for other in futures:
            other.cancel()
        raise
    running = [f for f in futures if not f.done() and not f.cancel()]
    wait(running)  # running points finish
    for f in futures:  # store every finished point not stored yet
        if f not in stored and f.done() and not f.cancelled() and f.exception() is None:
            finish(futures[f], f.result())
    raise exc


def run_grid(
    fn: Callable[..., Mapping[str, Any]],
    points: Iterable[Mapping[str, Any]],
    *,
    executor: Executor | None = None,
    store: str | os.PathLike | None | bool = None,
    progress: bool = True,
    desc: str | None = None,
) -> list[Record]:
    """Evaluate ``fn(**point)`` on every point; see the module docstring.

    ``store=None`` uses the book build's store (:func:`wsutils.run.config.sweep_store`) when
    the build set one, else no store; ``store=False`` never stores. The ``*.tmp`` files of a
    killed store write are removed on the next run on that store (writer gone, or older than
    a day).

    Parameters
    ----------
    fn
        A module-level, deterministic function of the point's parameters, returning a dict.
    points
        The grid: plain JSON parameters, seeds included, no two points alike.
    executor, store, progress, desc
        Where the points run (``None``: here, one after the other), the store folder, and
        the tqdm bar and its label.

    Returns
    -------
    list of dict
        One record per point, in the order of ``points``: its parameters merged with what
        ``fn`` returned.

    Raises
    ------
    TypeError
        If a parameter is not plain JSON (an array, a lambda, an object), or with a store,
        ``fn`` is a lambda, a nested function, a ``functools.partial`` or a replaced function
        (their text forms collide: a second grid would read the first grid's records). The
        message says what to pass (a list, a name, a module-level function).
    ValueError
        If the grid is empty or has duplicate points.
    Exception
        The first error a point raised (the points not yet started are cancelled).

    Warns
    -----
    StoreWarning
        For a stored record that is corrupt, edited, emptied, of another point or of an older
        layout: it is recomputed and the file rewritten (recomputing is always correct; an
        error would stop a long sweep for something it can repair).
    """
    if store is None:
        store = config.sweep_store()
    elif store is False:
        store = None
    points = [dict(p) for p in points]
    if not points:
        raise ValueError("the grid is empty: pass at least one point.")
    plain = [_plain_point(p) for p in points]
    names = [_canonical(p) for p in plain]
    if len(set(names)) != len(names):
        raise ValueError("the grid has duplicate points; each point must differ (seeds included).")
    folder = Path(store) if store is not None else None
    results: dict[int, Record] = {}
    todo = list(range(len(points)))
    if folder is not None:
        fn_name = _fn_name(fn)
        files = _store_digest(fn)
        if files is None:
            warnings.warn(
                f"sweep store: the files of {', '.join(_changed_roots(fn))} changed on disk "
                "since this process imported them, so no key names the code that runs; "
                "running without the store (restart the kernel or process to use it).",
                StoreWarning,
                stacklevel=2,
            )
            folder = None
    if folder is not None:
        code = _code_digest(fn) + files  # once: it walks fn's package
        keys = [_key(fn_name, code, p) for p in plain]
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(folder)
        todo = []
        for i, key in enumerate(keys):
            path = folder / f"{key}.json"
            cached, why = _load(path, key, fn_name, plain[i])
            if cached is not None:
                results[i] = cached
                continue
            if why is not None:
                warnings.warn(
                    f"sweep store: {path} {why}; recomputing point {plain[i]} and "
                    "overwriting the file.",
                    StoreWarning,
                    stacklevel=2,
                )
            todo.append(i)
    bar = tqdm(
        total=len(points),
        initial=len(results),
        desc=desc or fn.__name__,
        disable=not progress,
        leave=False,
    )

    def finish(i: int, record: Record) -> None:
        if folder is not None:
            record = _as_stored(record)
            _save(folder / f"{keys[i]}.json", keys[i], fn_name, plain[i], record)
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


def process_pool(workers: int) -> ProcessPoolExecutor | None:
    """An executor for :func:`run_grid` with ``workers`` processes, each with one torch
    thread (the grid points' matrices are small: one thread per process is fastest), or
    ``None`` (run in this process) for ``workers == 1``.

    At most as many processes as this process has torch threads: the share of the machine it
    was given (the book's build runs ``lanes`` chapters at once and gives each kernel
    ``cores // lanes`` threads, ``OMP_NUM_THREADS``). More would only take turns on the same
    cores: four processes on two cores spent 12 % more CPU a random-features point than two
    (``benchmarks/bench_search_steps.py --parts pool``). ``None`` when that leaves one.

    Each worker exits within a second of its parent's death, however the parent died.

    Raises
    ------
    ValueError
        ``workers`` is not a positive integer (a Python or numpy integer).
    """
    import torch

    if (
        isinstance(workers, (bool, np.bool_))
        or not isinstance(workers, numbers.Integral)
        or workers < 1
    ):
        raise ValueError(f"workers must be a positive integer, got {workers!r}.")
    workers = min(int(workers), torch.get_num_threads())
    if workers == 1:
        return None
    return ProcessPoolExecutor(workers, initializer=_worker_start, initargs=(os.getpid(),))


def _worker_start(parent: int) -> None:
    """A :func:`process_pool` worker's start: one torch thread, and a daemon thread that ends
    the worker once its parent ``parent`` is gone (a parent killed by SIGKILL runs no
    shutdown, and its workers would otherwise live on, reparented, for ever)."""
    import threading

    import torch

    torch.set_num_threads(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="wsutils-parent-watch", daemon=True).start()
