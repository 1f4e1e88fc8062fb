"""The vocabulary search of the chapter ``trained-attention``: ours against the plain way.

Ours: :func:`wsutils.trained.vocabulary_changes` (every candidate token through the model's own
embedding layer, then only ``q_i, k_i, v_i`` of the first layer's heads updated, ``O(d² + n·d)``
per candidate, batched). Baseline (the plain way): for each candidate, the text with token
``i`` replaced is embedded and every head of the first layer is recomputed in full
(:func:`wsutils.trained.head_map`, ``O(n·d·d_h + n²·d_h)`` per head and candidate), batched
likewise. Both run in float64 in one process, one after the other, on the same candidates;
the table gives wall time, the growth of the process's peak resident memory (Linux
``ru_maxrss``) and the largest difference of the values.

``python -m benchmarks.bench_trained [--n 64] [--tokens 4096] [--batch 512] [--threads 1]``;
``--tokens 0`` takes the whole vocabulary (the baseline then takes minutes).
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import torch

from wsutils import data, embeddings as em, trained as tr


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _baseline(enc, ids, position, tokens, batch):
    heads = [tr.head_map(tr.head_weights(enc, 1, h)) for h in range(enc.heads)]
    ids_t = torch.tensor(ids)
    with torch.no_grad():
        X = enc.model.embeddings(input_ids=ids_t[None]).double()[0]
        base = [phi(X) for phi in heads]
        out = []
        for j in range(0, len(tokens), batch):
            t = torch.as_tensor(tokens[j:j + batch])
            b = ids_t.expand(len(t), -1).clone()
            b[:, position] = t
            Xb = enc.model.embeddings(input_ids=b).double()
            out.append(torch.stack([torch.linalg.vector_norm((phi(Xb) - y).flatten(1), dim=1)
                                    / torch.linalg.vector_norm(y) for phi, y in
                                    zip(heads, base)]))
    return torch.cat(out, 1).numpy()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=64, help="tokens of the review (cut)")
    ap.add_argument("--tokens", type=int, default=4096, help="candidates (0: the vocabulary)")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args([] if argv is None else argv)
    torch.set_num_threads(args.threads)
    enc = em.load_model()
    sel = data.select_reviews(data.load_imdb(), 50, tokenizer=enc.tokenizer, seed=0)
    text = next(t for t in sel.texts if len(enc.tokenizer.tokenize(t)) >= args.n)
    ids = enc.tokenizer(text, truncation=True, max_length=args.n)["input_ids"]
    position = args.n // 2
    V = enc.model.config.vocab_size
    rng = np.random.default_rng(0)
    tokens = np.arange(V) if args.tokens == 0 else rng.choice(V, args.tokens, replace=False)
    tokens = tokens[tokens != ids[position]]
    rows = []
    for name, run in (("ours (rank-one update)", lambda: tr.vocabulary_changes(
            enc, ids, position, tokens=tokens, batch=args.batch).values),
                      ("baseline (full heads)", lambda: _baseline(
            enc, ids, position, tokens, args.batch))):
        rss0, t0 = _rss_mb(), time.perf_counter()
        vals = run()
        rows.append((name, time.perf_counter() - t0, _rss_mb() - rss0, vals))
    diff = float(np.abs(rows[0][3] - rows[1][3]).max())
    print(f"{enc.name}: n = {args.n}, {len(tokens)} candidates at position {position}, "
          f"{enc.heads} heads of layer 1, {args.threads} thread(s)")
    print(f"{'method':<26}{'time (s)':>10}{'peak RSS growth (MB)':>24}")
    for name, sec, mb, _ in rows:
        print(f"{name:<26}{sec:>10.2f}{mb:>24.0f}")
    print(f"largest difference of the values: {diff:.2e}; speed-up {rows[1][1] / rows[0][1]:.1f}×")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
