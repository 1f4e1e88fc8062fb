"""Random-features word sensitivity: ``wsutils.estimators.rf.rf_word_sensitivity`` against the
authors'
algorithm written here (:func:`authors_rf_sensitivity`).

Baseline, as the authors' script runs it: a dense ``D × D`` float64 ``V`` (``k = D``), the first
row only, one start ``Δ = 0.1·ξ``, 300 plain gradient steps of lr 100 on the relative change
with projection onto ``‖Δ‖ ≤ √d``, the last iterate read out. Ours, first row, twice:
``reduced`` (the default for one row: the law of the row, ``k × d`` normals drawn, a different
draw of the weights) for time and memory, and ``blocks`` on the *same* ``V`` as the baseline
(the baseline's ``V`` is filled from our column blocks; all ``k × D`` normals are drawn, block
by block) so that the two values of ``S`` are for the same weights. Each method runs in a
fresh process, after a warm-up call at a tiny size (library loading excluded), so that its
peak resident memory (``ru_maxrss``) is its own; ``Δpeak`` is the peak minus the footprint
after imports and warm-up. At the paper's largest point (no dense baseline fits) ours runs
twice: as shipped (ascent iterations in float32) and with ``search_dtype=None`` (the same
search in float64), side by side.

Run: ``.venv/bin/python -m benchmarks bench_rf`` (``make bench`` runs every benchmark).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import resource
import time

import torch

SIZES = [(64, 64), (128, 128), (176, 176)]  # (d, n) where the dense baseline fits (176: 7.6 GB)
PAPER_POINT = (768, 150)  # d, n: k = D = 115,200
F64_SEARCH = "ours, f64 search"  # the same estimator with its ascent in float64


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def authors_rf_sensitivity(
    X: torch.Tensor, V: torch.Tensor, *, steps: int = 300, lr: float = 100.0, seed: int = 0
) -> float:
    """The authors' RF search: first row, one start ``0.1·ξ``, plain projected gradient ascent,
    last iterate (brief §4–5). ``V`` is the dense ``k × D`` matrix."""
    n, d = X.shape
    radius = math.sqrt(d)
    x = X.reshape(-1)
    base = torch.relu(V @ x)
    base_norm = torch.linalg.vector_norm(base)
    g = torch.Generator().manual_seed(seed)
    Delta = 0.1 * torch.randn(d, generator=g, dtype=X.dtype)
    e = torch.zeros(n, 1, dtype=X.dtype)
    e[0] = 1
    for _ in range(steps):
        Delta.requires_grad_(True)
        xp = (X + e * Delta[None]).reshape(-1)
        val = torch.linalg.vector_norm(torch.relu(V @ xp) - base) / base_norm
        (grad,) = torch.autograd.grad(val, Delta)
        with torch.no_grad():
            Delta = Delta + lr * grad
            nrm = torch.linalg.vector_norm(Delta)
            if nrm > radius:
                Delta = Delta * (radius / nrm)
    with torch.no_grad():
        xp = (X + e * Delta[None]).reshape(-1)
        return float(torch.linalg.vector_norm(torch.relu(V @ xp) - base) / base_norm)


def _job(method: str, d: int, n: int, seed: int, threads: int, queue) -> None:
    torch.set_num_threads(threads)
    import wsutils as ws

    X = ws.sample_X(n, d, seed=seed)
    k = n * d
    _compute(method, ws.sample_X(4, 4, seed=seed), 4, 4, 16, seed)  # warm-up: load libraries
    rss0 = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    out = _compute(method, X, n, d, k, seed)
    queue.put(
        {
            "time": time.perf_counter() - t0,
            "cpu": time.process_time() - c0,
            "peak": _rss_mb(),
            "rss0": rss0,
            **out,
        }
    )


def _compute(method: str, X, n: int, d: int, k: int, seed: int) -> dict:
    from wsutils.estimators.rf import rf_weight_block, rf_word_sensitivity

    extra = {}
    if method == "baseline":
        V = torch.empty(k, n * d, dtype=torch.float64)  # one dense V, filled in place
        for j in range(n):
            V[:, j * d : (j + 1) * d] = rf_weight_block(k, n, d, j, seed=seed + 1)
        S = authors_rf_sensitivity(X, V, seed=seed)
    else:
        mode = "blocks" if method == "ours (blocks)" else "reduced"
        search = {"search_dtype": None} if method == F64_SEARCH else {}
        r = rf_word_sensitivity(
            X, k, rows=[0] if mode == "blocks" else 0, seed=seed + 1, mode=mode, **search
        )
        S = r.value
        extra = {"lower": r.lower, "upper": r.upper}
    return {"S": S, **extra}


def run(method: str, d: int, n: int, seed: int = 0, threads: int = 2) -> dict:
    """Run one method at one size in a fresh process; returns time, peak RSS and S."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_job, args=(method, d, n, seed, threads, q))
    p.start()
    out = q.get()
    p.join()
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.bench_rf [--sizes 64x64,128x128] [--threads 2] [--no-paper-point]``
    (``--sizes ""``: the paper's point alone)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_rf")
    parser.add_argument(
        "--sizes",
        default=",".join(f"{d}x{n}" for d, n in SIZES),
        help="comma-separated dxn sizes where the dense baseline fits",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads per run (the book's process pools use 1)",
    )
    parser.add_argument(
        "--no-paper-point",
        action="store_true",
        help="skip ours alone at the paper's largest point",
    )
    args = parser.parse_args([] if argv is None else argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    print(
        f"RF word sensitivity, first row, k = D; fresh process per run, {args.threads} torch "
        "thread(s); peak = ru_maxrss, Δpeak = peak − RSS after imports."
    )
    head = (
        f"{'d':>4} {'n':>4} {'method':<16} {'time s':>8} {'cpu s':>8} {'peak MB':>8} "
        f"{'Δpeak MB':>9} {'S':>8}"
    )
    print(head)
    print("-" * len(head))
    for d, n in sizes:
        rows = {
            m: run(m, d, n, threads=args.threads)
            for m in ("baseline", "ours (reduced)", "ours (blocks)")
        }
        for m, r in rows.items():
            print(
                f"{d:>4} {n:>4} {m:<16} {r['time']:>8.2f} {r['cpu']:>8.2f} {r['peak']:>8.0f} "
                f"{r['peak'] - r['rss0']:>9.0f} {r['S']:>8.4f}"
            )
        b, o, same = rows["baseline"], rows["ours (reduced)"], rows["ours (blocks)"]
        print(
            f"{'':>10} baseline/ours (reduced): time {b['time'] / o['time']:.1f}×, "
            f"cpu {b['cpu'] / o['cpu']:.1f}×, peak {b['peak'] / o['peak']:.1f}×, Δpeak "
            f"{(b['peak'] - b['rss0']) / max(o['peak'] - o['rss0'], 1):.1f}×; "
            f"same V: S ours (blocks) − baseline = {same['S'] - b['S']:+.4f}"
        )
    if args.no_paper_point:
        return
    d, n = PAPER_POINT
    rows = {m: run(m, d, n, threads=args.threads) for m in ("ours (reduced)", F64_SEARCH)}
    for m, r in rows.items():
        print(
            f"{d:>4} {n:>4} {m:<16} {r['time']:>8.2f} {r['cpu']:>8.2f} {r['peak']:>8.0f} "
            f"{r['peak'] - r['rss0']:>9.0f} {r['S']:>8.4f}   (certified {r['lower']:.4f} ≤ S ≤ "
            f"{r['upper']:.4f})"
        )
    o, f = rows["ours (reduced)"], rows[F64_SEARCH]
    print(
        f"{'':>10} the dense baseline would need {(n * d) ** 2 * 8 / 1e9:.0f} GB; time of the "
        f"float64 search / float32 search: {f['time'] / o['time']:.2f}×; S(float32) − "
        f"S(float64) = {o['S'] - f['S']:+.1e}"
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
