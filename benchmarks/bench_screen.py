"""Every word screened against the fixed words, on long random texts (issue 63).

For each text: the fixed-word search the grid chapters run (``attention_word_sensitivity``,
words 0 and 1, the take-over constructions, the default ``Search()``, seed 0), then
:func:`wsutils.estimators.screen.screened_word_sensitivity` with the screen of issue 63
(2 starts × 30 steps), the default screen (2 × 10) and a cheaper one (1 × 10), each
certifying its 8 best words with the default search and successive halving
(``halving=SCHEDULE``). One thread, one process, the methods one after the other on each text,
so the ratios are fair on a loaded machine. Times are wall seconds; every value is a certified
lower bound (float64 at the returned ``Δ``).

``python -m benchmarks bench_screen``, or ``python -m benchmarks.bench_screen --texts 2``.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    compare(args.texts)


if __name__ == "__main__":
    main()
