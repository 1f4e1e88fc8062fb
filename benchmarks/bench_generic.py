"""A map of one's own (``ws.word_sensitivity``, the generic estimator) against the built-in
softmax estimator (``attention_word_sensitivity``), on the same texts and seed (issue 53).

Softmax attention is written by hand twice: as a plain function, ``lambda Z: ws.raf(Z, W)``,
and declared word-wise, ``wsutils.tokenwise.softmax_attention(W)``
(``TokenwiseMap(tokens=[Z W, Z], mix=softmax(F_Q F_Kᵀ/√d) F_K)``). Both go through the
generic estimator with successive halving
(``halving=SCHEDULE``, :mod:`wsutils.halving`); the built-in runs its default search (every
word, 8 starts, 200 steps, its ``O(n·d)`` objective). Every search here runs the default
``Search()`` otherwise, seed 0, float64, the machine's threads; the three run one after the
other on each text, so the ratios are fair on a loaded machine. Times are wall seconds.

The value columns give each estimate and its relative difference to the built-in's: the
generic searches start from the same points and take the same steps as the built-in's
(up to rounding), so when the built-in's best (word, start) survives the cuts they end at its
value; a negative difference is a text where it did not.

``--schedules``: how the default schedule was chosen. The built-in's searches are recorded
step by step (every word, 8 starts, 200 steps) on ``--texts`` random texts a size other than
the timed ones, and each schedule ``(t0, keep)`` of a small grid is replayed on the records:
its cost (the fraction of the full search's passes) and on how many texts the full search's
best (word, start) survives every cut.

``--record PATH``: the realistic sizes the "Your own map" page quotes (issue 61, item 7): at
each size of ``--sizes`` (default ``128x384,128x768``) and ``--texts`` texts (default 1), the
three searches above and a torch layer through the adapter, ``ws.module_map`` of a
``torch.nn.TransformerEncoderLayer(d, d // 64 heads, 4d feed-forward)`` (its own map: a time,
not a value to compare) searched with halving, at the widths up to ``--layer-max-d`` (default
384: at (128, 384) it took 275–288 s, about 40× the built-in, and at (128, 768) 947 s, the
record's run with ``--layer-max-d 768``); written as JSON with the date, the machine and
the threads, which the page reads and shows (``benchmarks/records/bench_generic.json``).

``python -m benchmarks bench_generic``, or with options ``python -m benchmarks.bench_generic``
(``--texts 5``, ``--sizes 100x256,128x768``, ``--full`` adds the generic search without
halving on the first text of the first size, the baseline of the issue, minutes;
``--schedules``; ``--record benchmarks/records/bench_generic.json``).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import platform
import time

import numpy as np
import torch

import wsutils as ws
from wsutils.estimators.objectives import fast_objective
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.halving import SCHEDULE
from wsutils.maps import Normalisation
from wsutils.run.device import describe_device
from wsutils.search import Search
from wsutils.sensitivity import _row_starts, cosine_step, project_ball
from wsutils.tokenwise import softmax_attention

SIZES = [(100, 256), (128, 768)]
#: the timed texts' seeds: X from 1000 + t, W from 2000 + t; the schedules' from 100 + t, 200 + t
TIMED, RECORDED = (1000, 2000), (100, 200)
#: the generic searches' settings: the default search with halving, no bar in the table
HALVED = dict(seed=0, halving=SCHEDULE, progress=False)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def compare(sizes, texts: int, full: bool) -> None:
    head = (
        f"{'n':>4} {'d':>4} {'text':>4} | {'built-in s':>10} {'S':>9} | {'generic s':>9} "
        f"{'×':>5} {'ΔS/S':>9} | {'tokenwise s':>11} {'×':>5} {'ΔS/S':>9}"
    )
    print(head)
    print("-" * len(head))
    for (n, d), t in itertools.product(sizes, range(texts)):
        X, W = ws.sample_X(n, d, seed=TIMED[0] + t), ws.sample_W(d, seed=TIMED[1] + t)
        tb, b = _timed(lambda: attention_word_sensitivity(X, W, seed=0))
        tg, g = _timed(lambda: ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, **HALVED))
        tt, k = _timed(lambda: ws.word_sensitivity(softmax_attention(W), X, **HALVED))
        print(
            f"{n:>4} {d:>4} {t:>4} | {tb:>10.1f} {b.value:>9.5f} | {tg:>9.1f} {tg / tb:>5.2f} "
            f"{g.value / b.value - 1:>+9.1e} | {tt:>11.1f} {tt / tb:>5.2f} "
            f"{k.value / b.value - 1:>+9.1e}",
            flush=True,
        )
        if full and t == 0 and (n, d) == sizes[0]:
            tf, f = _timed(
                lambda: ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, seed=0, progress=False)
            )
            print(
                f"{'':>14} the generic search without halving: {tf:.1f} s "
                f"({tf / tb:.1f}×), S = {f.value:.5f} ({f.value / b.value - 1:+.1e})",
                flush=True,
            )


def realistic(sizes, texts: int, path: str, layer_max_d: int = 384) -> None:
    """``--record``: the page's table, timed and written to ``path`` (the module docstring)."""
    rows = []
    for (n, d), t in itertools.product(sizes, range(texts)):
        X, W = ws.sample_X(n, d, seed=TIMED[0] + t), ws.sample_W(d, seed=TIMED[1] + t)
        torch.manual_seed(TIMED[1] + t)  # the layer's initial weights
        layer = torch.nn.TransformerEncoderLayer(d, d // 64, 4 * d, batch_first=True)
        runs = {
            "built-in": lambda: attention_word_sensitivity(X, W, seed=0),
            "plain function, halving": lambda: ws.word_sensitivity(
                lambda Z: ws.raf(Z, W), X, **HALVED
            ),
            "TokenwiseMap, halving": lambda: ws.word_sensitivity(
                softmax_attention(W), X, **HALVED
            ),
            "torch layer (module_map), halving": lambda: ws.word_sensitivity(
                ws.module_map(layer), X, **HALVED
            ),
        }
        if d > layer_max_d:
            del runs["torch layer (module_map), halving"]
        for name, run in runs.items():
            seconds, res = _timed(run)
            rows.append(dict(n=n, d=d, text=t, search=name, seconds=seconds, S=res.value))
            print(
                f"{n:>4} {d:>4} {t:>3} {name:<36} {seconds:8.1f} s  S = {res.value:.5f}",
                flush=True,
            )
    out = dict(
        date=datetime.date.today().isoformat(),
        machine=f"{_cpu_name()}, {describe_device('cpu')}",
        command=f"python -m benchmarks.bench_generic --record {path} --layer-max-d {layer_max_d}",
        rows=rows,
    )
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def _cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def record(n: int, d: int, seeds: tuple[int, int]) -> np.ndarray:
    """The built-in's search on one text, every (word, start) search's value at each of its
    201 iterates: ``(201, n, 8)``, the running best (the same starts and steps as
    ``attention_word_sensitivity(X, W, seed=0)``)."""
    X, W = ws.sample_X(n, d, seed=seeds[0]), ws.sample_W(d, seed=seeds[1])
    search = Search(seed=0)
    rows = list(range(n))
    starts = _row_starts(X, rows, search, None, None)
    Delta = project_ball(torch.cat([starts[r] for r in rows]), math.sqrt(d), exact=False)
    row_idx = torch.tensor(rows).repeat_interleave(search.starts)
    obj = fast_objective(X, W, Normalisation.parse("raf"))
    step = cosine_step(math.sqrt(d), search.lr, search.steps)
    values = np.zeros((search.steps + 1, n * search.starts))
    for t in range(search.steps + 1):
        vals, gradient = obj.evaluate(row_idx, Delta)
        values[t] = vals.numpy()
        if t < search.steps:
            Delta = step(Delta, gradient(), t)
    return np.maximum.accumulate(values, axis=0).reshape(search.steps + 1, n, search.starts)


def replay(best: np.ndarray, t0: int, keep: float, floor: int = 8) -> tuple[float, bool]:
    """The schedule ``(t0, keep)`` of :func:`wsutils.halving.halving_ascent` on a record of
    :func:`record`: the fraction of the full search's passes it takes, and whether the full
    search's best (word, start) survives every cut."""
    T, P = best.shape[0] - 1, best.shape[1] * best.shape[2]
    b = best.reshape(T + 1, P)
    alive, passes, next_cut = np.arange(P), 0, t0
    for t in range(T + 1):
        passes += len(alive)
        if t < T and t + 1 == next_cut:  # ranked by the iterates 0..t, as halving_ascent
            k = min(len(alive), max(floor, math.ceil(keep * len(alive))))
            order = np.lexsort((alive, -b[t, alive]))
            alive, next_cut = np.sort(alive[order[:k]]), 2 * next_cut
    return passes / ((T + 1) * P), bool(b[T, alive].max() >= b[T].max())


def schedules(sizes, texts: int) -> None:
    records = {
        (n, d): [record(n, d, (RECORDED[0] + t, RECORDED[1] + t)) for t in range(texts)]
        for n, d in sizes
    }
    print(f"{texts} recorded texts a size; each schedule: passes / full search's, texts kept")
    for t0, keep in itertools.product((4, 6, 8, 10, 12), (1 / 4, 1 / 3, 1 / 2)):
        cells = []
        for size, recs in records.items():
            out = [replay(r, t0, keep) for r in recs]
            cells.append(
                f"{size[0]}x{size[1]}: {np.mean([c for c, _ in out]):.3f}, "
                f"{sum(k for _, k in out)}/{len(out)}"
            )
        mark = "  <- SCHEDULE" if (t0, keep) == SCHEDULE else ""
        print(f"t0 = {t0:>2}, keep = {keep:.2f}: " + "; ".join(cells) + mark, flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=None, help="texts a size (5; 20 with --schedules)")
    p.add_argument("--sizes", default=",".join(f"{n}x{d}" for n, d in SIZES))
    p.add_argument("--full", action="store_true")
    p.add_argument("--schedules", action="store_true")
    p.add_argument("--record", default=None, help="write the page's table here (JSON)")
    p.add_argument("--layer-max-d", type=int, default=384, help="the torch layer's widest d")
    args = p.parse_args(argv or [])
    if args.record and args.sizes == p.get_default("sizes"):
        args.sizes = "128x384,128x768"
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(describe_device("cpu"), f"{torch.get_num_threads()} threads")
    if args.record:
        realistic(sizes, args.texts or 1, args.record, args.layer_max_d)
    elif args.schedules:
        schedules(sizes, args.texts or 20)
    else:
        compare(sizes, args.texts or 5, args.full)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
