"""The word-sensitivity chapter's search (``ws.word_sensitivity`` on its four maps, every word,
three starts and the random direction as a fourth) as the chapter runs it, ``steps`` with the
successive halving ``HALVING``, against the uncut search of ``steps`` (the chapter until
2026-12-07) and the uncut search of ``2 · steps`` (the reference; ``300``, the former
paper-scale count), side by side in one process, one thread, on the chapter's paper-scale text
(``n = 40``, ``d = 64``, seeds 0–4 as in the chapter).

The printed relative difference ``S(reference)/S(chapter) − 1`` is what the chapter's values
would move by with the longer, uncut search; the chapter's ``STEPS_TOL`` bounds it. All values
are certified lower bounds (float64 relative changes at a ``Δ`` in the ball); the longer search
need not find the larger one, since the cosine-decayed step size of ``ws.word_sensitivity``
depends on ``steps``.

Run: ``.venv/bin/python -m benchmarks bench_word_sensitivity`` (``--steps 150``).
"""

from __future__ import annotations

import math
import time

import torch


def _setup(n: int = 40, d: int = 64, seed: int = 0):
    import wsutils as ws

    X = ws.sample_X(n, d, seed=seed)
    V = ws.sample_V(n * d, n, d, seed=seed + 1)
    Vs = ws.sample_Vs(n, d, 2, seed=seed + 2)
    W = ws.sample_W(d, seed=seed + 3)
    maps = {
        "RF": lambda Z: ws.rf(Z, V),
        "DRF (L=2)": lambda Z: ws.drf(Z, Vs),
        "RAF": lambda Z: ws.raf(Z, W),
        "ReLU attention": lambda Z: ws.relu_attention(Z, W),
    }
    g = torch.Generator().manual_seed(seed + 4)
    Delta = torch.randn(d, generator=g, dtype=torch.float64)
    Delta *= math.sqrt(d) / torch.linalg.vector_norm(Delta)
    return X, maps, Delta


def main(argv: list[str] | None = None) -> None:
    import argparse

    import wsutils as ws
    from wsutils.experiments.word_sensitivity import HALVING

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_word_sensitivity")
    parser.add_argument("--steps", type=int, default=150, help="the chapter's steps")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    X, maps, Delta = _setup()
    runs = {  # label: (steps, halving)
        f"{2 * args.steps} uncut": (2 * args.steps, None),
        f"{args.steps} uncut": (args.steps, None),
        f"{args.steps} halving": (args.steps, HALVING),
    }
    print(
        f"ws.word_sensitivity, n = 40, d = 64, all words, starts = 3 + 1, 1 thread; "
        f"halving = {HALVING}; CPU s and S per search"
    )
    head = f"{'map':<15} " + " ".join(f"{k:>22}" for k in runs) + f" {'rel. diff':>10}"
    print(head)
    print("-" * len(head))
    for name, phi in maps.items():
        out = {}
        for label, (steps, halving) in runs.items():
            c0 = time.process_time()
            r = ws.word_sensitivity(
                phi, X, steps=steps, starts=3, seed=0, init=Delta[None], halving=halving
            )
            out[label] = (time.process_time() - c0, r.value)
        ref, now = (out[k][1] for k in (list(runs)[0], list(runs)[-1]))
        cells = " ".join(f"{c:>8.1f} s {v:>11.5f}" for c, v in out.values())
        print(f"{name:<15} {cells} {ref / now - 1:>+10.2e}", flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
