"""Our softmax certificates against interval bound propagation and linear relaxation (issue 60,
part 4).

On the attention chapter's grid texts (``point_seed("attention", d, n, s)``, the first
``--texts`` of each point of ``grid_points("raf")`` at the scale ``--scale``), at the words the
grid's point certifies (``sensitivity_point`` with the grid's search: its lower bound ``S``):
interval bound propagation (:func:`wsutils.estimators.verifiers.ibp_upper`), the CROWN-style
linear relaxation (:func:`wsutils.estimators.verifiers.crown_upper`), the row-wise
certificate (:prf:ref:`prop-softmax-upper`, ``joint=False``) and the default, the smaller of it
and :prf:ref:`prop-softmax-joint`, and that with one multiplier per row searched at each word
(``refine=--refine``); each as its ratio to ``S`` and its CPU seconds. One thread, one process,
the five bounds one after the other on each text. With ``--every``, also the refined bound's
largest value over **every** word (an upper bound on ``S(X)`` itself, the bracket's upper side:
:func:`_every_word`).

With ``--far N``, instead, one long text (``d = 192``, ``n = N``, the far grid's first seed):
every word screened, the best two certified
(:func:`~wsutils.estimators.screen.screened_word_sensitivity`), and the one multiplier's and
the refined bound at those words over its ``S`` (``JOINT_GRID_EVERY`` intervals, as
attention-far's far grid).

``python -m benchmarks.bench_verifiers --scale paper --texts 1 [--every]``;
``python -m benchmarks.bench_verifiers --far 4000``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import wsutils as ws
from wsutils.estimators.screen import screened_word_sensitivity
from wsutils.estimators.softmax_upper import (
    JOINT_GRID_EVERY,
    REFINE_STEPS,
    softmax_certified_upper,
)
from wsutils.estimators.verifiers import crown_upper, ibp_upper
from wsutils.run.seeds import point_seed


def _timed(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def _every_word(X, W, steps: int, batch: int = 16) -> float:
    """The largest refined bound over every word: the words in decreasing order of the one
    multiplier's bound, ``batch`` at a time, until that bound is at most the largest refined
    value so far (each word's bound is the smaller of the two, so the words left cannot
    exceed it)."""
    cheap = softmax_certified_upper(X, W)
    order = cheap.argsort()[::-1]
    best = 0.0
    for s in range(0, len(order), batch):
        words = order[s : s + batch]
        if cheap[words[0]] <= best:
            break
        best = max(best, float(softmax_certified_upper(X, W, rows=words, refine=steps).max()))
    return best


def _far(n: int, steps: int, d: int = 192) -> None:
    """The one multiplier's and the refined bound over the lower bound found on one long
    text, at the two words its every-word screen certifies."""
    seed = point_seed("attention", d, n, 0)
    X, W = ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)
    found, t_found = _timed(
        lambda: screened_word_sensitivity(X, W, screen=dict(keep=2), upper=False)
    )
    rows, S = sorted(found.per_row), found.value
    print(f"d = {d}, n = {n}: S = {S:.4f} at words {rows} ({t_found:.0f} CPU s)")
    for refine in (0, steps):
        up, t_up = _timed(
            lambda: softmax_certified_upper(X, W, rows=rows, grid=JOINT_GRID_EVERY, refine=refine)
        )
        print(f"refine = {refine}: bound / S = {up.max() / S:.3f} ({t_up:.1f} CPU s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="paper", choices=("quick", "paper"))
    parser.add_argument("--texts", type=int, default=1)
    parser.add_argument("--refine", type=int, default=REFINE_STEPS)
    parser.add_argument("--every", action="store_true")
    parser.add_argument("--far", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.far:
        return _far(args.far, args.refine)
    os.environ["WSBOOK_SCALE"] = args.scale  # grid_points reads the scale from it
    from wsutils.experiments import attention as A

    seeds = {}
    for p in A.grid_points("raf"):
        seeds.setdefault((p["d"], p["n"]), []).append(p)
    print(
        f"{'d':>4} {'n':>4} {'S':>7} | {'IBP/S':>7} {'s':>5} | {'CROWN/S':>7} {'s':>5} |"
        f" {'row/S':>6} {'s':>5} |"
        f" {'joint/S':>7} {'s':>5} | {'refined/S':>9} {'s':>5}"
        + (f" | {'every/S':>7} {'s':>6}" if args.every else "")
    )
    for (d, n), points in sorted(seeds.items()):
        for p in points[: args.texts]:
            r = A.sensitivity_point(**dict(p, certificates=False))
            rows = r["certified_rows"]
            X, W = ws.sample_X(n, d, seed=p["seed"]), ws.sample_W(d, seed=p["seed"] + 1)
            ibp, t_ibp = _timed(lambda: ibp_upper(X, W, rows=rows).max())
            crown, t_crown = _timed(lambda: crown_upper(X, W, rows=rows).max())
            row, t_row = _timed(lambda: softmax_certified_upper(X, W, rows=rows, joint=False))
            joint, t_joint = _timed(lambda: softmax_certified_upper(X, W, rows=rows))
            refined, t_ref = _timed(
                lambda: softmax_certified_upper(X, W, rows=rows, refine=args.refine)
            )
            S = r["S"]
            every = ""
            if args.every:
                top, t_every = _timed(lambda: _every_word(X, W, args.refine))
                every = f" | {top / S:7.3f} {t_every:6.1f}"
            print(
                f"{d:>4} {n:>4} {S:7.4f} | {ibp / S:7.2f} {t_ibp:5.2f} |"
                f" {crown / S:7.2f} {t_crown:5.2f} |"
                f" {row.max() / S:6.2f} {t_row:5.2f} | {joint.max() / S:7.3f} {t_joint:5.2f} |"
                f" {refined.max() / S:9.3f} {t_ref:5.2f}" + every,
                flush=True,
            )


if __name__ == "__main__":
    main()
