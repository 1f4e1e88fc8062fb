"""Grid records before and after a change of the API (issue 33): the same points, two trees.

Each grid-point function of the book (one or more small points of every family: the attention
and ReLU grids, the take-over and RF points, the normalisation chapter, the flip experiment on
every map, the authors' search, the deep and plain random features, the IMDb sweep) runs with
the same seeds under an older ``wsutils`` (``--ref``, a directory or a git revision, default
``HEAD``) and under this tree's, each in a child process with one torch thread, and every field
of every record is compared. The redesign of issue 33 must leave them **identical** (the same
float, bit for bit, on one machine: both trees run here, so no BLAS difference enters); a field
that differs is printed with both values, and the command exits with status 1 (run alone).

Parameters that a step renames are translated for the newer tree (``RENAMED``: the old name,
then the new one), and so are the record fields that carry them; the wall-clock and CPU
timings that points record are not compared.

    .venv/bin/python -m benchmarks.bench_records --ref 4624176
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: Parameter names that the redesign changes: old name → new name.
RENAMED = {"kind": "normalisation", "name": "normalisation"}

#: The IMDb sweep's map labels before the redesign → the maps' names (``wsutils.maps.LABELS``).
LABELLED = {"RF": "rf", "RAF": "raf", "ReLU attention": "relu"}

#: Record fields that the redesign renames: old name → new name (the flip runs' ``search``,
#: the method that found them, is ``method``).
FIELDS = {**RENAMED, "search": "method"}

#: Grid points that the redesign moves: (new module, name) → (old module, name), for a tree
#: from before the move.
MOVED = {
    ("wsutils.experiments.deep_random_features", "drf_point"): (
        "wsutils.estimators.drf",
        "drf_point",
    ),
    ("wsutils.experiments.random_features", "rf_point"): ("wsutils.estimators.rf", "rf_point"),
}

#: Search settings that the redesign gathers into one ``search`` dict of the grid point
#: (:class:`wsutils.search.Search`'s fields): the old parameter → the field.
GROUPED = {
    "starts": "starts",
    "steps": "steps",
    "lr": "lr",
    "search_dtype": "dtype",
    "stop": "stop",
}

#: Fields that measure time, not the answer.
TIMINGS = {"seconds", "cpu", "cpu_seconds", "wall", "wall_seconds", "time", "elapsed"}

#: The points: (module, function, keyword arguments). Small sizes, every family.
POINTS = [
    ("wsutils.experiments.attention", "sensitivity_point",
     dict(kind="raf", d=16, n=8, seed=11, rows=2, starts=2, steps=20, search_dtype="float32")),
    ("wsutils.experiments.attention", "sensitivity_point",
     dict(kind="relu", d=16, n=8, seed=12, rows=2, starts=2, steps=20)),
    ("wsutils.experiments.attention", "takeover_point", dict(d=16, n=8, seed=13)),
    ("wsutils.experiments.attention", "rf_point", dict(d=8, n=6, seed=14, starts=2, steps=10)),
    ("wsutils.experiments.attention", "rf_point",
     dict(d=8, n=6, seed=15, starts=2, steps=40, stop=[3, 1e-3], upper=False)),
    ("wsutils.experiments.normalisation", "normalisation_point",
     dict(name="sparsemax", d=16, n=8, seed=16, starts=2, steps=20)),
    ("wsutils.experiments.normalisation", "normalisation_point",
     dict(name="tempered", d=16, n=8, seed=17, starts=2, steps=20)),
    ("wsutils.experiments.normalisation", "normalisation_point",
     dict(name="entmax", d=16, n=8, seed=18, starts=2, steps=20)),
    ("wsutils.experiments.normalisation", "phase_point", dict(d=8, n=10, seed=19)),
    ("wsutils.generalization", "flip_point",
     dict(map="raf", n=6, d=8, Ns=[12], seed=20, starts=2, steps=20)),
    ("wsutils.generalization", "flip_point",
     dict(map="relu", n=6, d=8, Ns=[12], seed=21, starts=2, steps=20)),
    ("wsutils.generalization", "flip_point",
     dict(map="rf", n=6, d=8, Ns=[12], seed=22, starts=2, steps=20)),
    ("wsutils.generalization", "flip_point",
     dict(map="attention", normalisation="sparsemax", n=6, d=8, Ns=[12], seed=23, starts=2,
          steps=20)),
    ("wsutils.generalization", "flip_point",
     dict(map="raf", n=6, d=8, Ns=[12], seed=24, starts=2, steps=20, search="authors")),
    ("wsutils.experiments.deep_random_features", "drf_point",
     dict(n=6, d=8, L=2, k=64, seed=25, steps=10)),
    ("wsutils.experiments.random_features", "rf_point",
     dict(family="isotropic", n=6, d=8, seed=26, steps=10)),
    ("", "authors_point", dict(kind="raf", n=6, d=8, seed=27)),
    ("", "authors_point", dict(kind="relu", n=6, d=8, seed=28)),
    ("wsutils.experiments.imdb", "sensitivity_point",
     dict(map="RAF", n=8, d=16, source="imdb", review=0, keep="all", seed=29, steps=10,
          starts=1, model=None, imdb=None)),
    ("wsutils.experiments.imdb", "sensitivity_point",
     dict(map="RF", n=8, d=16, source="imdb", review=1, keep="all", seed=30, steps=10,
          starts=2, rows=3, model=None, imdb=None)),
]  # fmt: skip


def authors_point(kind: str, n: int, d: int, seed: int) -> dict:
    """The authors' search (:func:`wsutils.estimators.authors.authors_estimator`) at a
    sampled text, 20 steps, as a record."""
    import wsutils as ws
    from wsutils.estimators import authors

    X, W = ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)
    params = inspect.signature(authors.authors_estimator).parameters
    key = "kind" if "kind" in params else RENAMED["kind"]
    return authors.authors_estimator(X, W, seed=seed, steps=20, **{key: kind})._asdict()


def _call(module: str, name: str, kwargs: dict):
    import importlib

    if not module:
        fn = globals()[name]
    else:
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # a tree from before the move
            old_module, old_name = MOVED[(module, name)]
            fn = getattr(importlib.import_module(old_module), old_name)
    params = inspect.signature(fn).parameters
    kw = {}
    for k, v in kwargs.items():
        if k not in params and k in RENAMED and RENAMED[k] in params:
            k = RENAMED[k]
        kw[k] = v
    if isinstance(kw.get("map"), str) and kw["map"] in LABELLED:  # the IMDb sweep's labels
        labels = getattr(importlib.import_module("wsutils.maps"), "LABELS", None)
        kw["map"] = kw["map"] if labels is None else LABELLED[kw["map"]]
    if isinstance(kw.get("rows"), int) and "Sequence" in str(params["rows"].annotation):
        # a grid point's rows were a count (the first k words; the IMDb sweep: k spread
        # evenly), now word indices as the estimators read them
        k = kw["rows"]
        spread = getattr(importlib.import_module(fn.__module__), "searched_rows", None)
        kw["rows"] = list(range(k)) if spread is None else spread(kw["n"], k)
    if "method" in params and isinstance(kw.get("search"), (str, list)):  # the flip's method
        kw["method"] = kw.pop("search")
    if "search" in params and "starts" not in params:  # the search as one dict of settings
        grouped = {GROUPED[k]: kw.pop(k) for k in list(kw) if k in GROUPED}
        if grouped:
            kw["search"] = grouped
    return fn(**kw)


def _plain(x):
    """A record as JSON-able values (arrays as lists, floats kept exact via ``repr``)."""
    import numpy as np

    if isinstance(x, dict):
        return {FIELDS.get(str(k), str(k)): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist"):
        return _plain(np.asarray(x).tolist())
    if isinstance(x, float):
        return {"float": x.hex()}
    return x


def child() -> None:
    import torch

    torch.set_num_threads(1)
    out = [_plain(_call(m, f, kw)) for m, f, kw in POINTS]
    print(json.dumps(out))


def relative_difference(fa: float, fb: float) -> float:
    """``|fa − fb| / max(|fa|, |fb|)`` (0 for equal values, NaN and NaN included; ``inf``
    for NaN against a number)."""
    if fa == fb or (math.isnan(fa) and math.isnan(fb)):
        return 0.0
    if math.isnan(fa) or math.isnan(fb) or math.isinf(fa) or math.isinf(fb):
        return math.inf
    return abs(fa - fb) / max(abs(fa), abs(fb))


def differences(a, b, path="", rtol: float = 0.0) -> list[str]:
    """Every field where the records ``a`` and ``b`` differ (timings aside); floats by more
    than ``rtol``, relative (:func:`relative_difference`; ``0``: bit for bit)."""
    if isinstance(a, dict) and isinstance(b, dict) and set(a) == {"float"} == set(b):
        fa, fb = float.fromhex(a["float"]), float.fromhex(b["float"])
        rel = relative_difference(fa, fb)
        return [] if rel <= rtol else [f"{path}: {fa!r} → {fb!r} (relative {rel:.1e})"]
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        out = []
        for k in keys:
            if k in TIMINGS:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'new' if k in b else 'old'}")
                continue
            out += differences(a[k], b[k], f"{path}.{k}", rtol)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} → {len(b)} entries"]
        pairs = enumerate(zip(a, b))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]", rtol)]
    return [] if a == b else [f"{path}: {a!r} → {b!r}"]


def records(tree: str) -> list:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["WSBOOK_SCALE"] = "quick"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]  # this file, their wsutils
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if res.returncode:
        raise SystemExit(f"the points failed under {tree}:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _tree(ref: str) -> str:
    """A directory holding ``ref``'s ``wsutils`` (with ``data/`` and ``pyproject.toml`` beside
    it, as in a clone): ``ref`` itself when it is a directory, else extracted from the git
    revision with ``git archive``."""
    if Path(ref).is_dir():
        return str(Path(ref).resolve())
    tmp = tempfile.mkdtemp(prefix="bench_records_")
    tar = subprocess.run(
        ["git", "-C", str(HERE), "archive", ref, "wsutils", "data", "pyproject.toml"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
    return tmp


def main() -> int:
    """Compare the trees; returns 1 when a record differs (the exit status when run alone)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ref", default="HEAD", help="a directory or git revision (default HEAD)")
    ap.add_argument("--new", default=str(HERE), help="the tree to compare (default this one)")
    ap.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        help="floats may differ by this much, relative (default 0: bit for bit); a change "
        "that rounds differently (issue 34's BLAS syrk, larger batches) states its tolerance",
    )
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    old, new = records(_tree(args.ref)), records(_tree(args.new))
    bad = 0
    for (m, f, kw), a, b in zip(POINTS, old, new, strict=True):
        diffs = differences(a, b, rtol=args.rtol)
        label = f"{m.rsplit('.', 1)[-1]}.{f}({', '.join(f'{k}={v}' for k, v in kw.items())})"
        same = "identical" if not differences(a, b) else f"within rtol {args.rtol:g}"
        print(f"{same if not diffs else 'DIFFERENT'}  {label}")
        for line in diffs[:10]:
            print(f"    {line}")
        bad += bool(diffs)
    kind = "identical" if args.rtol == 0 else f"the same to rtol {args.rtol:g}"
    print(f"{len(POINTS) - bad} of {len(POINTS)} points {kind} ({args.ref} → {args.new}).")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
