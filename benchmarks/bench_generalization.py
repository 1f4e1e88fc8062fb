"""Generalization experiment: the N × N Gram route against the authors' dense route.

1. Linear algebra at a size where the dense route fits: ``θ₀``, ``Pφ`` and the re-trained
   ``θ₁`` from ``N`` feature rows of length ``p``. Baseline (written here, as the authors'
   ``gen.py``): ``Φ⁺ = pinv(Φ)``, the dense ``p × p`` projector ``I − Φ⁺Φ``, and ``pinv`` of
   the stacked ``N + 1`` rows. Ours: :mod:`wsutils.generalization` (Cholesky of ``ΦΦᵀ``).
   Each method runs in its own fresh process (peak memory = the process's peak RSS above
   the RSS it had once ``Φ`` was built); the two run alternately, so machine load hits both.
2. The whole generalization experiment at the current ``WSBOOK_SCALE`` (paper: ``d = 768``,
   ``N ∈ {1100, 1200, 1300}``, RF ``n = 40``, RAF ``n ∈ {40, 120}``, ReLU attention
   ``n = 120``, both trainings, three losses): wall time and peak memory, with a progress bar.

``python -m benchmarks bench_generalization``; ``WSBOOK_SCALE=paper`` for part 2 at paper scale.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time

import numpy as np

N_DENSE, P_DENSE = 1000, 8192


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kB


def _problem(N: int, p: int):
    rng = np.random.default_rng(0)
    Phi = np.maximum(rng.standard_normal((N, p)), 0)  # ReLU-like features with a mean
    return Phi, np.sign(rng.standard_normal(N)), np.maximum(rng.standard_normal(p), 0), 1.0


def _dense(Phi, Y, phi, y):
    Phip = np.linalg.pinv(Phi)
    theta0 = Phip @ Y
    P_o = np.identity(Phi.shape[1]) - Phip @ Phi
    Pphi = P_o @ phi
    theta1 = np.linalg.pinv(np.vstack([Phi, phi])) @ np.append(Y, y)
    return theta0, Pphi, theta1


def _ours(Phi, Y, phi, y):
    from wsutils import generalization as G

    L = G.gram_cholesky(Phi)
    return (
        G.min_norm_interpolator(Phi, Y, L=L),
        G.project_out(Phi, phi, L=L),
        G.retrain(Phi, Y, phi, y, L=L),
    )


def _measure(which: str, N: int, p: int):
    import torch

    torch.set_num_threads(2)
    Phi, Y, phi, y = _problem(N, p)
    base = _rss_gb()
    t = time.perf_counter()
    out = (_dense if which == "dense" else _ours)(Phi, Y, phi, y)
    elapsed = time.perf_counter() - t
    return elapsed, _rss_gb() - base, [np.asarray(o) for o in out]


def _experiment():
    import torch

    from wsutils import generalization as G
    from wsutils.run import config
    from wsutils.run.sweep import run_grid

    torch.set_num_threads(2)
    grid = config.by_scale(
        quick=dict(d=128, Ns=[250, 300], seeds=[0], search=dict(starts=3, steps=120)),
        paper=dict(d=768, Ns=[1100, 1200, 1300], seeds=[0], search=dict(starts=4, steps=300)),
    )
    points = G.flip_grid(**grid)
    t = time.perf_counter()
    records = run_grid(G.flip_point, points, progress=True, desc="generalization experiment")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return (
        time.perf_counter() - t,
        ru.ru_utime + ru.ru_stime,
        _rss_gb(),
        G.flip_table(records),
        grid,
    )


def main() -> None:
    ctx = mp.get_context("spawn")
    rows = {}
    for which in ("dense", "ours", "dense", "ours"):  # alternate: same load for both
        with ctx.Pool(1) as pool:
            rows.setdefault(which, []).append(pool.apply(_measure, (which, N_DENSE, P_DENSE)))
    (_, _, d_out), (_, _, o_out) = rows["dense"][0], rows["ours"][0]
    err = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(d_out, o_out))
    print(
        f"θ₀, Pφ, re-trained θ₁ from N = {N_DENSE} rows of p = {P_DENSE} features "
        f"(each in a fresh process; best of 2)"
    )
    print(f"{'method':<34}{'time (s)':>10}{'peak extra memory (GB)':>26}")
    stats = {}
    for which, label in (("dense", "dense pinv + p×p projector"), ("ours", "N×N Gram (Cholesky)")):
        t = min(r[0] for r in rows[which])
        m = min(r[1] for r in rows[which])
        stats[which] = (t, m)
        print(f"{label:<34}{t:>10.2f}{m:>26.3f}")
    print(
        f"ratio dense/ours: time {stats['dense'][0] / stats['ours'][0]:.1f}×, "
        f"memory {stats['dense'][1] / max(stats['ours'][1], 1e-3):.1f}× "
        f"(ours' extra memory floored at 1 MB); max relative difference {err:.1e}"
    )
    print(
        "(the dense projector alone at n = 120, d = 768 would be 92,160² × 8 B = "
        f"{92160**2 * 8 / 1e9:.0f} GB)"
    )

    with ctx.Pool(1) as pool:
        elapsed, cpu, peak, table, grid = pool.apply(_experiment)
    print(
        f"\ngeneralization experiment, d = {grid['d']}, N ∈ {grid['Ns']}, seeds {grid['seeds']}, "
        f"{grid['search']['starts']} starts × {grid['search']['steps']} steps: "
        f"{elapsed:.0f} s wall, {cpu:.0f} s CPU "
        f"(2 threads; on a shared machine wall time is inflated), peak RSS {peak:.2f} GB"
    )
    print(
        f"{'map':<6}{'n':>5}{'N':>6}  {'training':<10}{'loss':<10}"
        f"{'y·t0':>7}{'y·D0':>8}{'y·D1':>8}"
    )
    for r in table:
        print(
            f"{r['map']:<6}{r['n']:>5}{r['N']:>6}  {r['training']:<10}{r['loss']:<10}"
            f"{r['y'] * r['t0']:>7.3f}{r['y'] * r['D0']:>8.3f}{r['y'] * r['D1']:>8.3f}"
        )


if __name__ == "__main__":
    main()
