"""Every word screened against the fixed words, on long random texts (issue 63).

For each text: the fixed-word search the grid chapters run (``attention_word_sensitivity``,
words 0 and 1, the take-over constructions, the default ``Search()``, seed 0), then
:func:`wsutils.estimators.screen.screened_word_sensitivity` with the screen of issue 63
(2 starts × 30 steps), the default screen (2 × 10) and a cheaper one (1 × 10), each
certifying its 8 best words with the default search and successive halving
(``halving=SCHEDULE``). One thread, one process, the methods one after the other on each text,
so the ratios are fair on a loaded machine. Times are wall seconds; every value is a certified
lower bound (float64 at the returned ``Δ``).

``--constructions``: the normalisation chapter's grid texts instead (``d = 32``, ``n = 256`` and
``1024``, the first texts of ``point_seed("normalisation", d, n, s)``, every normalisation of
its grid at the lengths it searches every word), each screened by the default screen (2 × 10)
and by the seven constructions alone (``Screen(starts=0, steps=0, constructions=True)``), then
the 2 best words and word 1 certified by the chapter's search (``Scale.search``); the screens'
CPU seconds and the certified values side by side, after word 1's value alone (the same
search over word 1: the grid's point before every word was searched).

``--relu-far``: the ReLU chapter's far grid texts (``d = 192``, ``n = 250 … 2000``, the
texts of ``point_seed("attention", 192, n, s)``): ``sensitivity_point(rows="every")`` with the
grid's search and its 2 best words certified, under the default screen (2 × 10), one start of
10 steps and one of 5, against the fixed words 0 and 1 (the grid before every word was
searched); CPU s of each whole point.

``--miss``: how much the normalisation chapter's screen misses, on its grid texts at ``d = 32``,
``n = 256`` (``--n``; ``--maps`` for some normalisations only; the first texts of
``point_seed("normalisation", 32, n, s)``, every normalisation of its grid): the chapter's
value (its screen, ``SCREEN``: the seven constructions of every word, and for sigmoid and ReLU
attention a short search too; the ``keep`` best and word 1 certified by the chapter's search)
against the same search certifying **every** word (``rows`` = all ``n``, the constructions as
starts), with the CPU s of each; the ratio is what the screen left on the table (the referee of
issue 63 found +13.6 % for sigmoid on one text).

``python -m benchmarks bench_screen``, or ``python -m benchmarks.bench_screen --texts 2``, or
``python -m benchmarks.bench_screen --constructions --texts 2``, or
``python -m benchmarks.bench_screen --relu-far --texts 3``, or
``python -m benchmarks.bench_screen --miss --texts 3 --n 1024 --maps sigmoid,relu``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

import wsutils as ws
from wsutils.estimators.screen import Screen, screened_word_sensitivity
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.halving import SCHEDULE

#: (normalisation, d, n): the far-attention and normalisation grids' long texts
SIZES = [("raf", 192, 250), ("raf", 192, 500), ("raf", 192, 1000), ("sparsemax", 32, 1024)]
SCREENS = {"2x30": Screen(steps=30), "2x10": Screen(), "1x10": Screen(starts=1)}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def compare(texts: int) -> None:
    head = f"{'map':>9} {'d':>4} {'n':>5} {'text':>4} | {'fixed s':>7} {'S':>7} |" + "".join(
        f" {name + ' s':>7} {'S':>7} {'word':>5} |" for name in SCREENS
    )
    print(head)
    print("-" * len(head))
    for norm, d, n in SIZES:
        for t in range(texts):
            X, W = ws.sample_X(n, d, seed=3000 + t), ws.sample_W(d, seed=4000 + t)
            tf, fixed = _timed(
                lambda: attention_word_sensitivity(
                    X, W, normalisation=norm, rows=[0, 1], takeovers=True, seed=0
                )
            )
            line = f"{norm:>9} {d:>4} {n:>5} {t:>4} | {tf:7.1f} {fixed.value:7.3f} |"
            for screen in SCREENS.values():
                ts, res = _timed(
                    lambda: screened_word_sensitivity(
                        X, W, normalisation=norm, screen=screen, seed=0, halving=SCHEDULE
                    )
                )
                line += f" {ts:7.1f} {res.value:7.3f} {res.row:>5} |"
            print(line, flush=True)


def _normalisation_texts(P, d: int, n: int, texts: int):
    """The normalisation chapter's grid texts at ``(d, n)``: for every normalisation of its grid
    that searches every word there and the first ``texts`` seeds, ``(name, t, X, W, norm,
    search, seed)``: the search the chapter's with its seed (``search_seed(seed)``), ``seed``
    the point's."""
    from wsutils.experiments import normalisation as N
    from wsutils.run.seeds import point_seed, search_seed

    for name in N.CHAPTER:
        if n not in P.lengths(d, name):
            continue
        for t in range(texts):
            seed = point_seed("normalisation", d, n, t)
            X, W = ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)
            search = dict(P.search(name)["search"], seed=search_seed(seed))
            yield name, t, X, W, N.CHAPTER[name], search, seed


def constructions(texts: int) -> None:
    """The ``--constructions`` comparison (the module docstring)."""
    from wsutils.estimators.screen import screen_words
    from wsutils.experiments import normalisation as N
    from wsutils.run.seeds import search_seed

    P, d = N.scale("paper"), 32
    only = Screen(starts=0, steps=0, constructions=True)
    head = f"{'map':>9} {'n':>5} {'text':>4} | {'word 1':>7} | {'2x10 cpu':>8} {'S':>7} |"
    print(head + f" {'constr cpu':>10} {'S':>7} |")
    print("-" * (len(head) + 21))
    for n in (256, 1024):
        for name, t, X, W, norm, search, seed in _normalisation_texts(P, d, n, texts):
            word1 = attention_word_sensitivity(
                X, W, normalisation=norm, rows=[0], takeovers=True, search=search
            ).value
            line = f"{name:>9} {n:>5} {t:>4} | {word1:7.4f} |"
            for screen in (Screen(), only):
                t0 = time.process_time()
                screen_words(X, W, normalisation=norm, screen=screen, seed=search_seed(seed))
                cpu = time.process_time() - t0
                res = screened_word_sensitivity(
                    X,
                    W,
                    normalisation=norm,
                    screen=dataclasses.replace(screen, keep=2),
                    search=search,
                    also=[0],
                )
                line += f" {cpu:{8 if screen is not only else 10}.2f} {res.value:7.4f} |"
            print(line, flush=True)


def miss(texts: int, n: int = 256, maps: str | None = None) -> None:
    """The ``--miss`` comparison (the module docstring), at length ``n``, for the
    normalisations ``maps`` (comma-separated labels; ``None``: all)."""
    from wsutils.experiments import normalisation as N

    P, d = N.scale("paper"), 32
    only = None if maps is None else set(maps.split(","))
    print(
        f"{'map':>9} {'text':>4} | {'screen cpu':>10} {'S':>7} | {'every cpu':>9} {'S':>7} | ratio"
    )
    for name, t, X, W, norm, search, _ in _normalisation_texts(P, d, n, texts):
        if only is not None and name not in only:
            continue
        screen = Screen.parse(P.search(name)["screen"])  # the chapter's screen
        t0 = time.process_time()
        screened = screened_word_sensitivity(
            X, W, normalisation=norm, screen=screen, search=search, also=[0]
        ).value
        t1 = time.process_time()
        every = attention_word_sensitivity(
            X, W, normalisation=norm, rows=list(range(n)), takeovers=True, search=search
        ).value
        t2 = time.process_time()
        print(
            f"{name:>9} {t:>4} | {t1 - t0:10.2f} {screened:7.4f} | {t2 - t1:9.2f} "
            f"{every:7.4f} | {every / screened:.4f}",
            flush=True,
        )


def relu_far(texts: int) -> None:
    """The ``--relu-far`` comparison (the module docstring)."""
    from wsutils.experiments import attention as A
    from wsutils.run.seeds import point_seed

    P, d = A.scale("paper"), 192
    screens = {"2x10": {}, "1x10": dict(starts=1), "1x5": dict(starts=1, steps=5)}
    print(
        f"{'n':>5} {'text':>4} |"
        + "".join(f" {k + ' s':>7} {'S':>8} |" for k in screens)
        + f" {'fixed s':>7} {'S':>8}"
    )
    for n in P.far_every():
        for t in range(texts):
            seed, line = point_seed("attention", d, n, t), f"{n:>5} {t:>4} |"
            p = dict(normalisation="relu", d=d, n=n, seed=seed, certificates=False)
            for screen in screens.values():
                t0 = time.process_time()
                r = A.sensitivity_point(
                    **p,
                    rows="every",
                    search=P.search("relu")["search"],
                    screen=dict(screen, keep=P.first_rows),
                )
                line += f" {time.process_time() - t0:7.1f} {r['S']:8.5f} |"
            t0 = time.process_time()
            r = A.sensitivity_point(**p, **P.search("relu"))
            print(line + f" {time.process_time() - t0:7.1f} {r['S']:8.5f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2)
    parser.add_argument("--n", type=int, default=256, help="--miss: the length (256)")
    parser.add_argument("--maps", help="--miss: normalisations, comma-separated (all)")
    modes = {"constructions": constructions, "relu_far": relu_far, "miss": miss}
    which = parser.add_mutually_exclusive_group()
    for mode in modes:
        which.add_argument("--" + mode.replace("_", "-"), action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    mode = next((mode for mode in modes if getattr(args, mode)), None)
    if mode == "miss":
        miss(args.texts, args.n, args.maps)
    else:
        modes.get(mode, compare)(args.texts)


if __name__ == "__main__":
    main()
