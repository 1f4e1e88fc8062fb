"""IMDb chapter at the paper's scale: one RF sweep point, old law against new, side by side.

The sweep (``book/imdb.md``) searches random features on ``r`` rows of ``n`` (the paper
scale's ``rf_rows``; :func:`wsutils.experiments.imdb.searched_rows`). Before:
``mode="blocks"`` draws all ``n`` column blocks of ``V`` to form ``V flat(X)`` and then
re-draws the ``r`` it searches (``(n + r)·k·d`` normals). After: ``mode="rows"``
(:func:`wsutils.estimators.rf.rf_rows_law`, the joint law of ``V flat(X)`` and the searched
blocks, ``prop-rf-rows-law``) draws each searched block to form ``V flat(X)`` and once more in
the search (``2r·k·d``). Both on the same text and seed, one thread, in one process,
alternately (A, B, A, B; best of the repeats).

The per-point CPU seconds are multiplied out over the chapter's paper grid (``n`` in
10…200, ``d`` in 192, 384, 768, 3 reviews, plus Gaussian texts at ``d = 192``) in
``--grid`` mode, from a fit ``t(n, d) = a·(draws)·k·d + b·rows·k·d`` per mode.

``python -m benchmarks.bench_imdb --points 100x384,150x768``

``--attention`` instead: the sweep's attention points (every row searched, the chapter's
paper-scale starts and steps) on real reviews (the first of the chapter's paper selection),
the float64 search against the float32 one (``search_dtype``; every value recomputed in
float64 either way), side by side in one process, one thread, alternately: CPU seconds and
the relative differences of ``S``, ``S_first`` and the smallest per-row value.

``python -m benchmarks.bench_imdb --attention --maps RAF --points 100x96,200x192,200x384``

``--attention --halving`` instead compares the full search (every (row, start) search runs
every step) with the chapter's successive halving
(:data:`wsutils.experiments.attention.EVERY_ROW_HALVING`), both in the chapter's precision
(:data:`wsutils.experiments.attention.SEARCH_DTYPE`): CPU seconds and the relative
differences, as above.

``python -m benchmarks.bench_imdb --attention --halving --maps relu,raf --texts 3
--points 200x96,200x384``

``--upper`` instead: the RF point (``mode="rows"``) with and without the upper certificate
(``upper=False``), which the chapter never reads: CPU seconds, and whether ``S``, every
per-row value and the lower bound agree exactly.

``python -m benchmarks.bench_imdb --upper --points 100x192,200x384``
"""

from __future__ import annotations

import argparse
import time

import torch

from wsutils.estimators.rf import rf_word_sensitivity
from wsutils.experiments.imdb import scale, searched_rows
from wsutils.weights import sample_X

PAPER = scale("paper")  # the chapter's paper-scale searches
RF_ROWS, STEPS, STARTS = PAPER.rf_rows, PAPER.rf_steps, PAPER.rf_starts
ATT_STEPS, ATT_STARTS = PAPER.steps, PAPER.starts


def one(
    n: int, d: int, mode: str, seed: int = 0, upper: bool = True
) -> tuple[float, float, object]:
    X = sample_X(n, d, seed=seed)
    t0, c0 = time.perf_counter(), time.process_time()
    r = rf_word_sensitivity(
        X,
        n * d,
        rows=searched_rows(n, RF_ROWS),
        seed=seed + 1,
        starts=STARTS,
        steps=STEPS,
        mode=mode,
        upper=upper,
    )
    return time.perf_counter() - t0, time.process_time() - c0, r


def rf_upper(points: list[tuple[int, int]], repeats: int) -> None:
    """The sweep's RF point (``mode="rows"``) with and without the upper certificate, which
    the chapter never reads: CPU seconds and whether ``S`` and every per-row value agree."""
    print(
        f"torch {torch.__version__}, 1 thread; RF sweep point, {RF_ROWS} rows, {STARTS} "
        f"starts, {STEPS} steps, k = n·d, mode='rows'; upper=True vs upper=False"
    )
    print(f"{'n':>5}{'d':>5}  {'upper CPU s':>12}{'no upper':>10}{'ratio':>7}  {'S':>9}  same")
    total = [0.0, 0.0]
    for n, d in points:
        best = {}
        for _ in range(repeats):
            for up in (True, False):
                _, cpu, r = one(n, d, "rows", upper=up)
                if up not in best or cpu < best[up][0]:
                    best[up] = (cpu, r)
        (cu, ru), (cn, rn) = best[True], best[False]
        total[0] += cu
        total[1] += cn
        same = ru.value == rn.value and ru.per_row == rn.per_row and ru.lower == rn.lower
        print(
            f"{n:>5}{d:>5}  {cu:>12.1f}{cn:>10.1f}{cu / cn:>6.2f}×  {ru.value:>9.4f}  {same}",
            flush=True,
        )
    print(f"total: {total[0]:.1f} → {total[1]:.1f} CPU s ({total[0] / total[1]:.2f}×)")


def _units(n: int, d: int, mode: str) -> tuple[float, float]:
    """(block draws, searched rows), each in units of ``k·d`` normals (``k = n·d``)."""
    m = min(n, RF_ROWS)
    draws = n + m if mode == "blocks" or n <= RF_ROWS else 2 * m
    return draws * n * d * d, m * n * d * d


def grid_estimate(measured: dict, h: int = 384, texts: int = 3) -> dict:
    """CPU s of the chapter's RF sweep at the paper's scale (``d ∈ {h/4, h/2, h}``,
    ``n ∈ {10, 20, 50, 100, 150, 200}``, ``texts`` reviews per point and as many Gaussian
    texts at ``d = h/4``), from ``t = a·draws + b·rows`` fitted by least squares to the measured
    ``{(n, d, mode): cpu_s}`` (``draws``, ``rows`` from :func:`_units`)."""
    import numpy as np

    A = np.array([_units(n, d, mode) for (n, d, mode) in measured])
    a, b = np.linalg.lstsq(A, np.array(list(measured.values())), rcond=None)[0]
    grid = [(n, d) for d in (h // 4, h // 2, h) for n in (10, 20, 50, 100, 150, 200)]
    grid += [(n, h // 4) for n in (10, 20, 50, 100, 150, 200)]
    return {
        mode: texts * sum(a * u + b * v for u, v in (_units(n, d, mode) for n, d in grid))
        for mode in ("blocks", "rows")
    } | {"a": a, "b": b}


def _variants(m: str, halving: bool) -> dict[str, dict]:
    """The two searches compared, A then B: float64 against float32, or (``halving``) the
    full search against the chapter's halving, in the chapter's precision for ``m``."""
    from wsutils.experiments.attention import EVERY_ROW_HALVING, SEARCH_DTYPE

    base = dict(steps=ATT_STEPS, starts=ATT_STARTS)
    if halving:
        full = base | dict(dtype=SEARCH_DTYPE[m])
        return {"full": full, "halving": full | dict(halving=EVERY_ROW_HALVING)}
    return {"float64": base | dict(dtype=None), "float32": base | dict(dtype="float32")}


def attention(
    points: list[tuple[int, int]], maps: list[str], repeats: int, texts: int, halving=False
) -> None:
    """Two searches side by side on the sweep's attention points (real reviews): float64
    against float32, or the full search against successive halving (``halving``)."""
    from wsutils.experiments.imdb import sensitivity_point
    from wsutils.run import config
    from wsutils.run.seeds import point_seed
    from wsutils.text import data
    from wsutils.text import embeddings as em

    model = config.model()
    imdb = None if config.imdb() is None else str(config.imdb())
    enc = em.load_model(model)
    sel = data.select_reviews(data.load_imdb(imdb), 100, tokenizer=enc.tokenizer, seed=0)
    A, B = _variants("raf", halving)
    print(
        f"torch {torch.__version__}, 1 thread; attention sweep point ({model}), every row, "
        f"{ATT_STARTS} starts, {ATT_STEPS} steps; {A} vs {B} search"
    )
    print(
        f"{'map':>15}{'n':>5}{'d':>5}{'rev':>6}  {A[:7] + ' CPU s':>14}{B[:7] + ' CPU s':>14}"
        f"{'ratio':>7}  {'S ' + A[:7]:>10}{'|ΔS|/S':>9}{'|ΔS_first|':>11}{'|Δmin|':>9}"
    )
    total = {A: 0.0, B: 0.0}
    worst = 0.0
    for m in maps:
        for n, d in points:
            for r in sel.review[:texts]:
                p = dict(map=m, n=n, d=d, source="imdb", review=int(r), keep="all")
                p |= dict(seed=point_seed(m, "imdb", d, n, int(r)), model=model, imdb=imdb)
                p |= dict(rows=None)
                best = {}
                for _ in range(repeats):
                    for name, search in _variants(m, halving).items():
                        c0 = time.process_time()
                        out = sensitivity_point(**p, search=search)
                        cpu = time.process_time() - c0
                        if name not in best or cpu < best[name][0]:
                            best[name] = (cpu, out)
                (ca, a), (cb, b) = best[A], best[B]
                total[A] += ca
                total[B] += cb
                rel = {k: abs(b[k] - a[k]) / a[k] for k in ("S", "S_first", "S_row_min")}
                worst = max(worst, *rel.values())
                print(
                    f"{m:>15}{n:>5}{d:>5}{int(r):>6}  {ca:>14.1f}{cb:>14.1f}"
                    f"{ca / cb:>6.2f}×  {a['S']:>10.4f}{rel['S']:>9.1e}"
                    f"{rel['S_first']:>11.1e}{rel['S_row_min']:>9.1e}",
                    flush=True,
                )
    print(
        f"total: {A} {total[A]:.1f} CPU s, {B} {total[B]:.1f} CPU s "
        f"({total[A] / total[B]:.2f}×); largest relative difference {worst:.1e}"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="100x384,150x768", help="n x d, comma separated")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--attention", action="store_true", help="float64 vs float32 search")
    ap.add_argument("--maps", default="raf", help="attention maps (raf, relu), comma separated")
    ap.add_argument("--texts", type=int, default=1, help="reviews per attention point")
    ap.add_argument("--upper", action="store_true", help="RF: with vs without upper bound")
    ap.add_argument("--halving", action="store_true", help="attention: full vs halving")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.upper:
        pts = [tuple(int(v) for v in spec.split("x")) for spec in args.points.split(",")]
        rf_upper(pts, args.repeats)
        return
    if args.attention:
        pts = [tuple(int(v) for v in spec.split("x")) for spec in args.points.split(",")]
        attention(pts, args.maps.split(","), args.repeats, args.texts, args.halving)
        return
    print(
        f"torch {torch.__version__}, 1 thread; RF sweep point, {RF_ROWS} rows, "
        f"{STARTS} starts, {STEPS} steps, k = n·d"
    )
    print(
        f"{'n':>5}{'d':>5}  {'blocks CPU s':>13}{'rows CPU s':>12}{'ratio':>7}"
        f"  {'S blocks':>9}{'S rows':>9}  {'lower ≤ S ≤ upper (rows)':>28}"
    )
    measured = {}
    for spec in args.points.split(","):
        n, d = (int(v) for v in spec.split("x"))
        best = {}
        for _ in range(args.repeats):
            for mode in ("blocks", "rows"):
                wall, cpu, r = one(n, d, mode)
                if mode not in best or cpu < best[mode][1]:
                    best[mode] = (wall, cpu, r)
        (_, cb, rb), (_, cr, rr) = best["blocks"], best["rows"]
        measured[n, d, "blocks"], measured[n, d, "rows"] = cb, cr
        print(
            f"{n:>5}{d:>5}  {cb:>13.1f}{cr:>12.1f}{cb / cr:>6.1f}×  {rb.value:>9.4f}"
            f"{rr.value:>9.4f}  {rr.lower:>9.4f} ≤ {rr.value:.4f} ≤ {rr.upper:.4f}",
            flush=True,
        )
    if len(measured) >= 4:
        est = grid_estimate(measured)
        print(
            f"fit: {est['a'] * 1e9:.2f} s per 1e9 normals drawn, {est['b'] * 1e9:.2f} s per "
            f"1e9 (k·d per searched row); the chapter's paper RF grid (72 points, h = 384): "
            f"blocks {est['blocks']:.0f} CPU s, rows {est['rows']:.0f} CPU s"
        )


if __name__ == "__main__":
    main()
