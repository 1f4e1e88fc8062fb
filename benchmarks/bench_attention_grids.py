"""The attention chapters' grid points at the paper's scale: each point as the chapters ran it
before against what they run now, side by side in one process, one thread, on the same point.

- ``grid``: a point of the paper's grid (:func:`wsutils.experiments.attention.grid_points`)
  as :func:`baseline_point` computed it before (the search in float64, every certificate,
  ``‖φ(X)‖`` from one more full map) against
  :func:`~wsutils.experiments.attention.sensitivity_point` now (the search in the precision
  of ``SEARCH_DTYPE``, float32 for softmax attention, ``‖φ(X)‖`` from the certification);
  ``S`` is certified in float64 on the float64 text either way.
- ``far``: the same at ``d = 192`` and the far ``n``, now also with ``certificates=False``
  (the far grids read ``S``, ``phi_norm`` and ``kappa`` only).
- ``phase``: :func:`wsutils.experiments.attention.takeover_point`, ``certificate=True``
  against ``False`` (the phase diagram reads the self-weight only).
- ``norm``: :func:`wsutils.experiments.normalisation.normalisation_point` at the normalisation
  chapter's costliest width and length, ``(32, 4096)``, the search in float64 (before)
  against the precision of its ``SEARCH_DTYPE`` (now); ``S`` and ``certified`` are float64.
- ``rf``: :func:`wsutils.experiments.attention.rf_point` with the ReLU chapter's search
  (``starts=4, steps=60``), every step and the upper certificate (before) against
  ``upper=False`` and the stopping rule ``stop=[10, 1e-4]``; ``S`` may differ by what the
  steps after the stop would have added.
- ``rf32``: :func:`~wsutils.experiments.attention.rf_point` as the ReLU chapter runs it
  (``upper=False``, the stopping rule), the weights drawn in float64 (before) against
  ``precision="float32"`` (after): a different draw of the same law, so ``S`` differs by
  the spread between draws, not by rounding; both values are float64 relative changes.
- ``relu32``: a point of the ReLU chapter's every-word grid (seed 0 of each ``(d, n)``,
  :func:`~wsutils.experiments.attention.grid_points`), the search in float64 (before, until
  2026-12-07) against float32 (after, ``SEARCH_DTYPE["relu"]``); ``S`` is certified in
  float64 on the float64 text either way, so the two differ only where the searches' paths do.
- ``halving``: a point of the softmax chapter's every-word grid (seed 0 of each ``(d, n)``),
  the certifying search run to the end (before, until 2026-12-07) against its successive
  halving ``SEARCH_HALVING["raf"]`` (after); a cut search keeps its best iterate, so ``S``
  can only be lower where the full search's best (word, start) was cut.

CPU seconds (``time.process_time``) per point; the order of the two runs alternates between
repeats. ``python -m benchmarks bench_attention_grids`` (all parts, one repeat) or
``python -m benchmarks.bench_attention_grids --parts rf --repeats 2``.

``--cells`` instead estimates the CPU seconds of each grid cell of the two chapters at the
paper's scale, before and after: seed 0 of every ``(d, n)`` of the cell, timed both ways,
summed and multiplied by the cell's seeds (the RF grid only at the widths ``--rf-ds``, the
others' share estimated as ``n·d²``, the cost of its ``k × d`` blocks).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.estimators.takeover import certified_lower_bound, takeover_certificate
from wsutils.experiments.attention import (
    SCALES,
    SEARCH_DTYPE,
    rf_point,
    sensitivity_point,
    takeover_point,
)
from wsutils.maps import raf, relu_attention
from wsutils.run.device import describe_device
from wsutils.run.seeds import point_seed
from wsutils.weights import sample_W, sample_X

SEARCH = dict(rows=2, starts=4, steps=100)  # the chapters' paper-scale search


def baseline_point(
    kind: str, d: int, n: int, seed: int, rows: int = 2, starts: int = 4, steps: int = 100
) -> dict:
    """``sensitivity_point`` as the chapters ran it before (commit 0f465b4): the search in
    float64, the certificates at every point, ``‖φ(X)‖`` from its own full map."""
    torch.set_num_threads(1)
    X, W = sample_X(n, d, seed=seed), sample_W(d, seed=seed + 1)
    searched = list(range(min(rows, n)))
    res = attention_word_sensitivity(
        X,
        W,
        normalisation=kind,
        rows=searched,
        starts=starts,
        steps=steps,
        seed=seed,
        takeovers=True,
    )
    cert = max(certified_lower_bound(X, W, r, normalisation=kind) for r in searched)
    phi = (raf if kind == "raf" else relu_attention)(X, W)
    out = {
        "S": res.value,
        "certified": cert,
        "phi_norm": float(torch.linalg.vector_norm(phi)) / math.sqrt(d),
        "kappa": float(torch.linalg.matrix_norm(X, ord=2)) / math.sqrt(d),
    }
    if kind == "raf":
        c = takeover_certificate(X, W, 0)
        out.update(bound=c.bound, self_weight=c.self_weight, margin=c.margin, A_fro=c.A_fro)
    return out


RF_SEARCH = dict(starts=4, steps=60)
RF_NEW = dict(upper=False, search=RF_SEARCH | dict(stop=[10, 1e-4]))

PARTS = {
    "grid": dict(
        points=[
            (k, d, n)
            for k in ("raf", "relu")
            for d, n in ((768, 250), (768, 50), (384, 100), (192, 50))
        ],
        read=("S", "phi_norm", "certified"),
    ),
    "far": dict(
        points=[("raf", 192, 2000), ("raf", 192, 4000), ("relu", 192, 4000)],
        read=("S", "phi_norm", "kappa"),
    ),
    "phase": dict(points=[(768, 3000), (256, 3000), (768, 1000)], read=("self_weight",)),
    "norm": dict(
        points=[
            (name, 32, 4096)
            for name in ("softmax", "tempered", "scalable", "sparsemax", "entmax", "sigmoid")
        ],
        read=("S", "certified"),
    ),
    "rf": dict(points=[(768, 250), (384, 250), (192, 250)], read=("S",)),
    "rf32": dict(points=[(768, 250), (384, 150)], read=("S",)),
    "relu32": dict(
        points=[(d, n) for d in (192, 384, 768) for n in (10, 20, 50, 100, 150, 200, 250)],
        read=("S",),
    ),
    "halving": dict(
        points=[(d, n) for d in (192, 384, 768) for n in (10, 20, 50, 100, 150, 200, 250)],
        read=("S",),
    ),
}


def _calls(part: str, point):
    """``(label, before, after)``: two zero-argument calls of the same point."""
    if part in ("grid", "far"):
        kind, d, n = point
        p = dict(normalisation=kind, d=d, n=n, seed=point_seed("attention", d, n, 0))
        rows, search = SEARCH["rows"], dict(starts=SEARCH["starts"], steps=SEARCH["steps"])
        new = dict(search=search | dict(dtype=SEARCH_DTYPE[kind]), certificates=part == "grid")
        return (
            f"{kind} {d}x{n}",
            lambda: baseline_point(**p, **SEARCH),
            lambda: sensitivity_point(**p, rows=rows, **new),
        )
    if part in ("halving", "relu32"):  # the every-word grid as the chapters run it
        kind = "raf" if part == "halving" else "relu"
        d, n = point
        g = SCALES["paper"]
        search = g.search(kind)["search"]
        p = dict(normalisation=kind, d=d, n=n, seed=point_seed("attention", d, n, 0))
        p |= dict(rows="every", screen=dict(keep=g.first_rows))
        before = (  # halving: the search to the end; relu32: in float64
            {k: v for k, v in search.items() if k != "halving"}
            if part == "halving"
            else search | dict(dtype=None)
        )
        return (
            f"{kind} {d}x{n}",
            lambda: sensitivity_point(**p, search=before),
            lambda: sensitivity_point(**p, search=search),
        )
    if part == "norm":
        from wsutils.experiments import normalisation as N

        name, d, n = point
        p = dict(
            normalisation=name,
            d=d,
            n=n,
            seed=point_seed("normalisation", d, n, 0),
            rows=1,
        )
        search = dict(starts=2, steps=30)
        return (
            f"{name} {d}x{n}",
            lambda: N.normalisation_point(**p, search=search),
            lambda: N.normalisation_point(**p, search=search | dict(dtype=N.SEARCH_DTYPE[name])),
        )
    if part == "phase":
        d, n = point
        p = dict(d=d, n=n, seed=point_seed("phase", d, n, 0))
        return (
            f"{d}x{n}",
            lambda: takeover_point(**p),
            lambda: takeover_point(**p, certificate=False),
        )
    d, n = point
    p = dict(d=d, n=n, seed=point_seed("attention", d, n, 0))
    if part == "rf32":
        return (
            f"{d}x{n}",
            lambda: rf_point(**p, **RF_NEW),
            lambda: rf_point(**p, **RF_NEW, precision="float32"),
        )
    return f"{d}x{n}", lambda: rf_point(**p, search=RF_SEARCH), lambda: rf_point(**p, **RF_NEW)


def _cells(rf_ds: list[int], only: list[str]) -> None:
    import os

    os.environ["WSBOOK_SCALE"] = "paper"
    from wsutils.experiments.attention import scale as attention_scale

    g = attention_scale("paper")
    far_ns, phase_d, phase_n = g.n_far, g.phase_ds, g.phase_ns
    cells = {
        f"grid {k}": [("grid", (k, d, n)) for d in g.ds for n in g.ns] for k in ("raf", "relu")
    }
    cells.update({f"far {k}": [("far", (k, 192, n)) for n in far_ns] for k in ("raf", "relu")})
    cells["phase"] = [("phase", (d, n)) for d in phase_d for n in phase_n]
    cells["rf"] = [("rf", (d, n)) for d in rf_ds for n in g.ns]
    print(f"{'cell':>10} {'points':>6} {'before s':>9} {'after s':>8}  (seed 0 timed × seeds)")
    for name, todo in cells.items():
        if only and name not in only:
            continue
        tb = ta = 0.0
        for part, point in todo:
            _, before, after = _calls(part, point)
            tb += _timed(before)[1]
            ta += _timed(after)[1]
        scale = g.seeds
        if name == "rf":  # the widths not timed, in proportion to Σ n·d² over the grid
            scale *= sum(d * d for d in g.ds) / sum(d * d for d in rf_ds)
        print(f"{name:>10} {len(todo):>6} {tb * scale:>9.0f} {ta * scale:>8.0f}", flush=True)


def _timed(f):
    t = time.process_time()
    out = f()
    return out, time.process_time() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {list(PARTS)}")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--cells", action="store_true", help="estimate every grid cell instead")
    p.add_argument("--rf-ds", default="768", help="widths of the RF grid timed by --cells")
    p.add_argument("--only", default="", help="--cells: only these cells (comma-separated)")
    args = p.parse_args(argv or [])
    torch.set_num_threads(1)
    print(describe_device("cpu"))
    if args.cells:
        _cells([int(v) for v in args.rf_ds.split(",")], [c for c in args.only.split(",") if c])
        return
    print(
        f"{'part':>6} {'point':>14} {'before s':>9} {'after s':>8} {'ratio':>6}  "
        "largest relative difference of the values read"
    )
    for part in args.parts.split(","):
        spec = PARTS[part]
        for point in spec["points"]:
            label, before, after = _calls(part, point)
            tb = ta = 0.0
            for r in range(args.repeats):
                order = (before, after) if r % 2 == 0 else (after, before)
                (o1, t1), (o2, t2) = _timed(order[0]), _timed(order[1])
                (ob, tb_), (oa, ta_) = ((o1, t1), (o2, t2)) if r % 2 == 0 else ((o2, t2), (o1, t1))
                tb, ta = tb + tb_, ta + ta_
            diff = {k: abs(oa[k] - ob[k]) / abs(ob[k]) for k in spec["read"]}
            values = ", ".join(f"{k} {ob[k]:.4f} -> {oa[k]:.4f}" for k in spec["read"])
            print(
                f"{part:>6} {label:>14} {tb / args.repeats:>9.2f} {ta / args.repeats:>8.2f} "
                f"{tb / ta:>6.2f}  "
                + ", ".join(f"{k} {v:.1e}" for k, v in diff.items())
                + f"  ({values})",
                flush=True,
            )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
