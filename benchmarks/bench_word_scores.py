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
    _pruned(G, cases["RF"][0], H[0], Vi, X, rows, i, m)


def _pruned(G, model, h, Vi, X, rows, i: int, m: int) -> None:
    """Random features with the word-flips chapter's pruning (``G.rf_word_bounds``, then the
    candidates it does not rule out scored exactly) against scoring every candidate, on
    read-outs of a trained model's size: a random direction of norm 0.55 (the trained
    ``‖θ₁‖`` at both scales), fine-tuned so that ``t₁ = y = 1`` on the text, as trained
    models are (:prf:ref:`prop-flip-bound`)."""
    g = torch.Generator().manual_seed(4)
    phi = torch.relu(h)
    thetas = torch.randn(m, h.shape[0], generator=g, dtype=torch.float64)
    thetas *= 0.55 / thetas.norm(dim=1, keepdim=True)
    thetas += (1 - thetas @ phi)[:, None] * phi / phi.dot(phi)
    c0 = time.process_time()
    exact = G.word_scores(model, X[i], rows, thetas)
    t_exact = time.process_time() - c0
    c0 = time.process_time()
    L = G.rf_word_bounds(h, Vi, X[i], rows, thetas, 1.0, tau=0.4)
    left = torch.nonzero(~(L > 1e-6).all(1)).flatten()
    scored = G.word_scores(model, X[i], rows[left], thetas) if len(left) else None
    t_pruned = time.process_time() - c0
    assert (L <= exact + 1e-9).all() and (
        scored is None or torch.allclose(scored, exact[left], rtol=1e-10, atol=1e-10)
    )
    print(
        f"RF, trained-size read-outs: every candidate scored {t_exact:.2f} s; bound (tau = "
        f"0.4) then {len(left)} of {len(rows)} scored {t_pruned:.2f} s: "
        f"{t_exact / t_pruned:.1f}×; the bound lies below every exact output",
        flush=True,
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
