"""The word-sensitivity chapter's search (``ws.word_sensitivity`` on its four maps, every word,
three starts and the random direction as a fourth) at ``steps`` against the former paper-scale
``steps = 300``, side by side in one process, one thread, on the chapter's paper-scale text
(``n = 40``, ``d = 64``, seeds 0–4 as in the chapter).

The printed relative difference ``S(300)/S(steps) − 1`` is what the chapter's values move by
when it runs ``steps``. Both values are certified lower bounds (float64 relative changes at a
``Δ`` in the ball); the longer search need not find the larger one, since the cosine-decayed
step size of ``ws.word_sensitivity`` depends on ``steps``.

Run: ``.venv/bin/python -m benchmarks bench_word_sensitivity`` (``--steps 150``).
"""

from __future__ import annotations

import math
import time

import torch

REFERENCE = 300  # the chapter's former paper-scale steps


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

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_word_sensitivity")
    parser.add_argument("--steps", type=int, default=150, help="the shorter search")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    X, maps, Delta = _setup()
    print(
        f"ws.word_sensitivity, n = 40, d = 64, all words, starts = 3 + 1, 1 thread; "
        f"steps {REFERENCE} against {args.steps}"
    )
    head = (
        f"{'map':<15} {'cpu ' + str(REFERENCE):>9} {'cpu ' + str(args.steps):>9} "
        f"{'S ' + str(REFERENCE):>10} {'S ' + str(args.steps):>10} {'rel. diff':>10}"
    )
    print(head)
    print("-" * len(head))
    for name, phi in maps.items():
        out = {}
        for steps in (REFERENCE, args.steps):
            c0 = time.process_time()
            r = ws.word_sensitivity(phi, X, steps=steps, starts=3, seed=0, init=Delta[None])
            out[steps] = (time.process_time() - c0, r.value)
        (c_ref, s_ref), (c_new, s_new) = out[REFERENCE], out[args.steps]
        print(
            f"{name:<15} {c_ref:>9.1f} {c_new:>9.1f} {s_ref:>10.5f} {s_new:>10.5f} "
            f"{s_ref / s_new - 1:>+10.2e}",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
