"""One digest of what a torch module computes with, read from the live tensors: the
mechanism by which every cache and copy of a model in ``wsutils`` notices that the model
changed (the embedding cache's key, the float64 copies of the module maps of
:mod:`wsutils.trained`, the check in the workers of a pooled vocabulary search).

``module_digest`` reads every parameter and buffer (``O(parameters)``: with the
configuration and tokenizer, 0.12 CPU s for the embedded model's 22.7 M parameters in one
measurement, ``benchmarks/bench_stale_checks.py``): meant for a check at a cache lookup or
once per worker task, not per step of an inner loop.

:func:`tree_digest` and :func:`installed_digest` key the caches on code and installed
packages: the sweep store (:mod:`wsutils.run.sweep`) and the book's execution cache.

With :mod:`wsutils._tensor`, one of the package's two shared internals: any module of
``wsutils``, in any subpackage, may import its public names (``tests/test_layers.py``)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import urllib.parse
from importlib import metadata
from pathlib import Path

import torch

__all__ = ["module_digest", "tree_digest", "installed_digest"]


def module_digest(*modules: torch.nn.Module) -> str:
    """SHA-256 over each module's ``repr`` (its structure and settings such as a LayerNorm's
    ``ε``) and every named parameter and buffer: name, dtype, shape and bytes, as they are
    now. Any change in place (``p.mul_``, ``p.data``, ``load_state_dict``, a numpy view)
    changes it; an equal copy (``copy.deepcopy``, the same weights loaded again) does not."""
    h = hashlib.sha256()
    for m in modules:
        text = repr(m).encode()
        h.update(len(text).to_bytes(8, "little") + text)
        tensors = list(m.named_parameters()) + list(m.named_buffers())
        for name, t in tensors:
            t = t.detach()
            h.update(f"\0{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
            flat = t.reshape(-1).contiguous().cpu()
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()


def tree_digest(path: str | os.PathLike, suffixes: tuple[str, ...] | None = None) -> str:
    """SHA-256 over every file under ``path`` (a folder, or one file): its path relative to
    ``path`` and its bytes, in sorted order; ``__pycache__`` folders and ``.pyc`` files are
    left out (they follow the sources). ``suffixes``: only the files of a folder whose name
    ends in one of them (``None``: every file)."""
    root = Path(path)
    files = (
        [root]
        if root.is_file()
        else sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and (suffixes is None or p.suffix in suffixes)
        )
    )
    h = hashlib.sha256()
    for p in files:
        if "__pycache__" in p.parts or p.suffix == ".pyc":
            continue
        name = p.name if p == root else str(p.relative_to(root))
        h.update(name.encode() + b"\0")
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def install_folders() -> list[str]:
    """The folders this interpreter imports installed distributions from, in import order:
    its own purelib and platlib, and every ``site-packages``/``dist-packages`` folder on
    ``sys.path`` (the user site, a ``--system-site-packages`` venv's system folders). A
    package upgraded in any of them changes :func:`installed_digest`. Other folders on
    ``sys.path`` are left out: the checkout's ``wsutils.egg-info``, found when the working
    directory is the checkout, installs nothing."""
    own = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    on_path = [p for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages")]
    return list(dict.fromkeys(on_path + own))  # sys.path's order first: what is imported


@functools.lru_cache(maxsize=1)
def installed_digest() -> str:
    """SHA-256 of the installed Python distributions as this interpreter sees them: every
    ``name==version``, and for a distribution installed from a local folder (``pip install
    -e .`` or ``pip install ./dir``, whose version says nothing of its files) the
    :func:`tree_digest` of each top-level package it provides. A package upgraded or
    downgraded by hand, or a folder install edited in place, changes it. Files edited inside
    ``site-packages`` of a regular install are not read (that would cost seconds): reinstall
    instead. Computed once per process (about 0.6 s): what a process has imported does not
    change under it."""
    h = hashlib.sha256()
    paths = install_folders()
    found: dict[str, metadata.Distribution] = {}
    for d in metadata.distributions(path=paths):
        found.setdefault((d.metadata["Name"] or "?").lower(), d)
    dists = sorted(found.items())  # found: the first of each name in import order
    for name, dist in dists:
        h.update(f"{name}=={dist.version}\0".encode())
        info = json.loads(dist.read_text("direct_url.json") or "{}")
        url = info.get("url", "")
        if "dir_info" not in info or not url.startswith("file://"):
            continue
        source = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
        tops = (dist.read_text("top_level.txt") or "").split() or [name.replace("-", "_")]
        for top in sorted(tops):
            for folder in (source / top, source / "src" / top, source / f"{top}.py"):
                if folder.exists():
                    h.update(f"{top}:{tree_digest(folder)}\0".encode())
                    break
    return h.hexdigest()
