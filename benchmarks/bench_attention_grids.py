"""The attention chapters' grid points at the paper's scale: each point as the chapter ran it
before (the defaults of the per-point functions: every certificate, every step) against the
options the chapters now pass, side by side in one process, one thread, on the same point.

- ``far``: :func:`wsutils.experiments.attention.sensitivity_point` at ``d = 192`` and the far
  ``n`` (softmax and ReLU), ``certificates=True`` (before) against ``False`` (the far grids
  read ``S``, ``phi_norm`` and ``kappa`` only); the values read must be equal.
- ``phase``: :func:`wsutils.experiments.attention.takeover_point`, ``certificate=True``
  against ``False`` (the phase diagram reads the self-weight only).
- ``f32``: :func:`wsutils.experiments.attention.sensitivity_point` on grid points of both
  maps, the search in float64 (before) against float32 (``search_dtype="float32"``, the
  chapters' grids now); ``S`` is certified in float64 on the float64 text either way, and
  may differ where the two searches take different paths.
- ``rf``: :func:`wsutils.experiments.attention.rf_point` with the ReLU chapter's search
  (``starts=4, steps=60``), every step and the upper certificate (before) against
  ``upper=False`` and the stopping rule ``stop=[10, 1e-4]``; ``S`` may differ by what the
  steps after the stop would have added.

CPU seconds (``time.process_time``) per point; the order of the two runs alternates between
repeats. ``python -m benchmarks bench_attention_grids`` (all parts, one repeat) or
``python -m benchmarks.bench_attention_grids --parts rf --repeats 2``.
"""

from __future__ import annotations

import argparse
import time

import torch

from wsutils.experiments.attention import rf_point, sensitivity_point, takeover_point
from wsutils.run.device import describe_device
from wsutils.run.seeds import point_seed

SEARCH = dict(rows=2, starts=4, steps=100)          # the chapters' paper-scale search
RF_SEARCH = dict(starts=4, steps=60)
RF_NEW = dict(upper=False, stop=[10, 1e-4])

PARTS = {
    "far": dict(points=[("raf", 192, 2000), ("raf", 192, 4000), ("relu", 192, 4000)],
                read=("S", "phi_norm", "kappa")),
    "phase": dict(points=[(768, 3000), (256, 3000), (768, 1000)], read=("self_weight",)),
    "f32": dict(points=[(k, d, n) for k in ("raf", "relu")
                        for d, n in ((768, 250), (384, 100), (192, 50), (192, 4000))],
                read=("S",)),
    "rf": dict(points=[(768, 250), (384, 250), (192, 250)], read=("S",)),
}


def _calls(part: str, point):
    """``(label, before, after)``: two zero-argument calls of the same point."""
    if part == "far":
        kind, d, n = point
        p = dict(kind=kind, d=d, n=n, seed=point_seed("attention", d, n, 0), **SEARCH)
        return (f"{kind} {d}x{n}", lambda: sensitivity_point(**p),
                lambda: sensitivity_point(**p, certificates=False))
    if part == "f32":
        kind, d, n = point
        p = dict(kind=kind, d=d, n=n, seed=point_seed("attention", d, n, 0), **SEARCH)
        return (f"{kind} {d}x{n}", lambda: sensitivity_point(**p),
                lambda: sensitivity_point(**p, search_dtype="float32"))
    if part == "phase":
        d, n = point
        p = dict(d=d, n=n, seed=point_seed("phase", d, n, 0))
        return (f"{d}x{n}", lambda: takeover_point(**p),
                lambda: takeover_point(**p, certificate=False))
    d, n = point
    p = dict(d=d, n=n, seed=point_seed("attention", d, n, 0), **RF_SEARCH)
    return f"{d}x{n}", lambda: rf_point(**p), lambda: rf_point(**p, **RF_NEW)


def _timed(f):
    t = time.process_time()
    out = f()
    return out, time.process_time() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {list(PARTS)}")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv or [])
    torch.set_num_threads(1)
    print(describe_device("cpu"))
    print(f"{'part':>6} {'point':>14} {'before s':>9} {'after s':>8} {'ratio':>6}  "
          "largest relative difference of the values read")
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
            print(f"{part:>6} {label:>14} {tb / args.repeats:>9.2f} {ta / args.repeats:>8.2f} "
                  f"{tb / ta:>6.2f}  " + ", ".join(f"{k} {v:.1e}" for k, v in diff.items()),
                  flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
