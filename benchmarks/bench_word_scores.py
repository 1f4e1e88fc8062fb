"""Issue 35's scoring: every token of the vocabulary at one position of a real review, read
out by trained-size linear models, batched (``wsutils.generalization.word_scores``: the
features of a block of candidates in one product, then every read-out in one product) against
a naive loop over the tokens (each substituted text through the full map, then every
read-out), side by side in one process, one thread; the two answers are compared.

The text is the imdb-generalization chapter's (a held-out IMDb review embedded at layer 0 by
the embedded model, first ``n`` rows and ``d`` coordinates, rows of norm ``√d``); the maps are
random features (``k = n·d``, the chapter's ``k = D``) and softmax attention, with ``m``
read-outs (one per trained model; their values do not change the cost). The candidates' rows
(``wsutils.text.token_rows.substitution_rows``, every token) are timed apart. The naive loop
scores the first ``--naive`` tokens and its time is scaled to the vocabulary.

Run: ``.venv/bin/python -m benchmarks bench_word_scores`` (``--d 384`` for the paper's width).
"""

from __future__ import annotations

import time

import torch


def _review(model, d: int, n: int):
    from wsutils.text.data import load_imdb, select_reviews
    from wsutils.text.embeddings import embed, load_model, sample_matrix

    enc = load_model(model)
    sel = select_reviews(load_imdb(None), 4, tokenizer=enc.tokenizer, seed=0, unique=True)
    text = sel.texts[-1]
    ids = enc.tokenizer(text, padding="max_length", truncation=True, max_length=128)
    E = embed([text], model=enc, max_length=128, cache_dir=False, progress=False)[0]
    return enc, ids["input_ids"], torch.as_tensor(sample_matrix(E, n, d))


def main(argv: list[str] | None = None) -> None:
    import argparse

    import wsutils as ws
    from wsutils import generalization as G
    from wsutils.run import config
    from wsutils.text.token_rows import substitution_rows

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_word_scores")
    parser.add_argument("--d", type=int, default=96, help="width (the quick scale: 96)")
    parser.add_argument("--n", type=int, default=40, help="rows of the text")
    parser.add_argument("--m", type=int, default=4, help="read-outs (trained models)")
    parser.add_argument("--naive", type=int, default=500, help="tokens the naive loop scores")
    args = parser.parse_args([] if argv is None else argv)
    torch.set_num_threads(1)
    n, d, m, i = args.n, args.d, args.m, 1  # position 1: the review's first word
    enc, ids, X = _review(config.model(), d, n)
    c0 = time.process_time()
    rows = torch.as_tensor(substitution_rows(enc, ids, i, d))
    t_rows = time.process_time() - c0
    T = rows.shape[0]
    W = ws.sample_W(d, seed=1)
    # float64 products on both sides (the flip runs' float32 product is another rounding)
    H, Vi = G.rf_preactivations(X[None], n * d, seed=2, row=i, dtype=torch.float64)
    V = G.sample_V_blocked(n * d, n, d, seed=2, dtype=torch.float64)  # the same V, whole
    cases = {
        "RF": (G.rf_flip_model(H[0], Vi), lambda Z: ws.rf(Z, V)),
        "RAF": (G.attention_flip_model(X, W, "raf", i), lambda Z: ws.maps.flat(ws.raf(Z, W))),
    }
    print(
        f"one position of a real review, every token (T = {T}), n = {n}, d = {d}, m = {m} "
        f"read-outs, 1 thread; candidate rows: {t_rows:.2f} CPU s"
    )
    head = f"{'map':>4} {'p':>6} {'batched s':>10} {'naive s (T)':>12} {'speed-up':>8}  max |diff|"
    print(head)
    print("-" * len(head))
    for name, (model, full) in cases.items():
        p = full(X).reshape(-1).shape[0]
        thetas = torch.randn(m, p, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        c0 = time.process_time()
        got = G.word_scores(model, X[i], rows, thetas)
        t_batched = time.process_time() - c0
        c0 = time.process_time()
        naive = []
        with torch.no_grad():
            for r in rows[: args.naive]:
                Z = X.clone()
                Z[i] = r
                naive.append(full(Z).reshape(-1) @ thetas.T)
        t_naive = (time.process_time() - c0) * T / min(args.naive, T)
        diff = float((torch.stack(naive) - got[: args.naive]).abs().max())
        print(
            f"{name:>4} {p:>6} {t_batched:>10.2f} {t_naive:>12.2f} "
            f"{t_naive / t_batched:>7.1f}×  {diff:.1e}",
            flush=True,
        )
    _pruned(enc, n, d, i)


#: The word-flips chapter's τ (``base['tau']`` there).
TAU = 0.3


def _pruned(enc, n: int, d: int, i: int) -> None:
    """Random features with the word-flips chapter's pruning (``G.rf_word_bounds``, then the
    candidates it does not rule out scored exactly) against scoring every candidate, for the
    chapter's first review and its trained models (``imdb.flip_split``, the imdb chapters'
    ``gen_Ns`` at the scale whose width is ``d``, both trainings; ``k = n·d``, seed 0). The
    bound's share depends on the trained read-outs, so they are the real ones."""
    from wsutils import generalization as G
    from wsutils.experiments.imdb import SCALES, flip_split
    from wsutils.experiments.word_flips import BOUND_MARGIN, review_ids
    from wsutils.run import config
    from wsutils.text.token_rows import substitution_rows

    Ns = next(list(P.gen_Ns) for P in SCALES.values() if P.gen_d(enc.hidden) == d)
    Nmax = max(Ns)
    split = dict(Ns=Ns, held_out=Nmax, n=n, d=d, reviews=Nmax + 2, select_seed=0)
    Xs, Y, X, y, review = flip_split(**split, model=config.model(), imdb=None, max_length=128)
    X, train = torch.as_tensor(X), torch.as_tensor(Xs)
    H, _ = G.rf_preactivations(torch.cat([train, X[None]]), n * d, seed=0)
    feats = torch.relu(H)
    thetas, keys = G.trained_readouts(feats[:-1], Y, feats[-1], y, Ns=Ns)
    Vi = G.sample_V_blocked(n * d, n, d, seed=0)[:, i * d : (i + 1) * d].double()
    ids = review_ids(enc, review, imdb=None, max_length=128)
    rows = torch.as_tensor(substitution_rows(enc, ids, i, d))
    model = G.rf_flip_model(H[-1], Vi)
    c0 = time.process_time()
    exact = y * G.word_scores(model, X[i], rows, thetas)
    t_exact = time.process_time() - c0
    times, lefts = {}, {}
    for dtype in (torch.float32, torch.float64):  # a_Z's product in single or double
        c0 = time.process_time()
        L = G.rf_word_bounds(H[-1], Vi, X[i], rows, thetas, y, tau=TAU, near_dtype=dtype)
        left = torch.nonzero(~(L > BOUND_MARGIN).all(1)).flatten()
        scored = y * G.word_scores(model, X[i], rows[left], thetas) if len(left) else None
        times[dtype], lefts[dtype] = time.process_time() - c0, len(left)
        assert (L <= exact + 1e-9).all()
        assert scored is None or torch.allclose(scored, exact[left], rtol=1e-10, atol=1e-10)
    t32, t64 = times[torch.float32], times[torch.float64]
    print(
        f"RF, the {len(keys)} models trained on N in {Ns} (both trainings), review {review}: "
        f"every candidate scored {t_exact:.2f} s; bound (tau = {TAU}) then "
        f"{lefts[torch.float32]} of {len(rows)} scored {t32:.2f} s: {t_exact / t32:.1f}× "
        f"(a_Z in float64: {lefts[torch.float64]} scored, {t64:.2f} s); the bound lies "
        "below every exact output",
        flush=True,
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
