"""``y·t_1^Δ`` against the number of training texts ``N``, both searches, on ``gen.py``'s data.

The table the generalization chapter's sweep draws at the quick scale (``d = 32``), here at
the current ``WSBOOK_SCALE``'s grid (paper: ``d = 768``, ``n = 40``,
``N ∈ {25, …, 1300}``): random features, softmax and ReLU attention, fine-tuning, output
loss, our search and the authors' (``gen.py``: one start, plain steps, last iterate).
With ``WSBOOK_FLIP_STORE=folder`` every point is stored there, so a stopped run resumes;
``WSBOOK_FLIP_DATA=planted`` uses the book's rescaled rows instead of ``gen.py``'s data.
``WSBOOK_SCALE=paper nice python -m benchmarks flip_vs_N``.
"""

from __future__ import annotations

import os
import time


def main() -> None:
    from wsutils import generalization as G
    from wsutils.generalization import report as FR
    from wsutils.maps import LABELS
    from wsutils.run import config
    from wsutils.run.sweep import run_grid

    grid = config.by_scale(
        quick=dict(d=32, n=40, Ns=[25, 50, 100, 200, 400], seeds=[0]),
        paper=dict(d=768, n=40, Ns=[25, 50, 100, 200, 400, 800, 1300], seeds=[0]),
    )
    data = os.environ.get("WSBOOK_FLIP_DATA", "authors")
    points = FR.sweep_points(**grid, data=data, search=dict(starts=4, steps=300))
    points.sort(key=lambda p: p["map"] == "rf")  # the costly random features last
    t = time.perf_counter()
    records = run_grid(G.flip_point, points, store=os.environ.get("WSBOOK_FLIP_STORE"))
    runs = G.flip_table(records)
    print(
        f"d = {grid['d']}, n = {grid['n']}, data = {data}, {time.perf_counter() - t:.0f} s",
        flush=True,
    )
    for key in ("yD1", "base", "sens", "scale"):
        table = FR.sweep_table(runs, key)
        print(f"\n{key}:  N = " + " ".join(f"{N:>7}" for N in grid["Ns"]))
        for m in ("rf", "raf", "relu"):
            for s in G.SEARCHES:
                if key != "yD1" and s == "authors":
                    continue
                print(
                    f"{LABELS[m]:>15} {s:>7}: "
                    + " ".join(f"{table[m, s, N]:+7.2f}" for N in grid["Ns"])
                )


if __name__ == "__main__":
    main()
