"""The IMDb reviews (Maas et al., 2011) and the paper's selection of them (brief §4).

- :func:`load_imdb`: the reviews as a ``datasets.Dataset`` with the Hugging Face schema
  (``text``, ``label`` with 0 = negative, 1 = positive), from a local copy named by the caller
  or by ``WSBOOK_IMDB`` (JSON lines or parquet, gzip or not), else from
  ``datasets.load_dataset("stanfordnlp/imdb")`` (train and test concatenated, as the authors
  do). Offline with no local copy it fails at once with a message naming both fixes.
- :func:`select_reviews`: the paper's selection: reviews with **fewer than 240 WordPiece
  tokens**, counted with the chosen model's tokenizer **including** ``[CLS]`` and ``[SEP]``
  (``len(tokenizer(text)["input_ids"]) < 240``), labels mapped to ``±1``, the same number of
  each label, drawn with a seed.

Every row keeps a ``review`` column: its index in the loaded dataset, a stable id of the review
for a given source (used, with the texts themselves, to key the embedding cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import _hub, config

__all__ = ["HUB_DATASET", "MAX_TOKENS", "Reviews", "load_imdb", "select_reviews", "token_lengths"]

HUB_DATASET = "stanfordnlp/imdb"
MAX_TOKENS = 240  # the paper keeps reviews with fewer than 240 tokens ([CLS]/[SEP] counted)


def _no_source_message(reason: str) -> str:
    return (
        f"No IMDb reviews available: {reason}. Either set WSBOOK_IMDB to a local copy of the "
        "reviews (JSON lines or parquet, gzip or not, with fields 'text' and 'label'; in this "
        "project: WSBOOK_IMDB=/work/shared/data/imdb/imdb_test.jsonl.gz), or allow the Hugging "
        f"Face hub (unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE, with network) so that "
        f"datasets.load_dataset({HUB_DATASET!r}) can download it."
    )


def _local_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "json"
    if name.endswith(".parquet"):
        return "parquet"
    raise ValueError(
        f"{path} is neither JSON lines (.jsonl, .json, .ndjson) nor parquet (.parquet), gzip or "
        "not: convert it, or point WSBOOK_IMDB at such a file."
    )


def load_imdb(path: str | os.PathLike | None = None) -> Any:
    """The IMDb reviews as a ``datasets.Dataset`` (columns ``text``, ``label`` ∈ {0, 1},
    ``review`` = row index, plus whatever else the source has).

    ``path`` (default: ``WSBOOK_IMDB`` via :func:`wsutils.config.imdb`) names a local copy;
    without one, the hub dataset ``stanfordnlp/imdb`` (train then test). Offline with no
    local copy, a ``RuntimeError`` at once, naming both fixes.
    """
    import datasets

    if path is None:
        path = config.imdb()
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ValueError(f"{path} is not a file: " + _no_source_message("the local copy is missing"))
        ds = datasets.load_dataset(_local_format(path), data_files=str(path), split="train")
        source = str(path)
    else:
        if _hub.offline():
            raise RuntimeError(_no_source_message(
                "WSBOOK_IMDB is not set and the hub is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"))
        if not _hub.reachable():
            raise RuntimeError(_no_source_message("WSBOOK_IMDB is not set and the hub is unreachable"))
        try:
            parts = datasets.load_dataset(HUB_DATASET)
        except Exception as err:  # network, hub or cache errors: say what to do instead
            raise RuntimeError(_no_source_message(
                f"loading {HUB_DATASET!r} from the hub failed ({type(err).__name__}: {err})")) from err
        ds = datasets.concatenate_datasets([parts["train"], parts["test"]])
        source = HUB_DATASET
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise ValueError(f"{source} lacks the column(s) {sorted(missing)}; the IMDb schema is "
                         "'text' (the review) and 'label' (0 = negative, 1 = positive).")
    labels = set(np.unique(np.asarray(ds["label"])).tolist())
    if not labels <= {0, 1}:
        raise ValueError(f"{source}: labels must be 0 (negative) or 1 (positive), found {sorted(labels)}.")
    if "review" not in ds.column_names:
        ds = ds.add_column("review", list(range(len(ds))))
    return ds


def token_lengths(texts, tokenizer, *, batch_size: int = 512) -> np.ndarray:
    """WordPiece length of each text with ``[CLS]`` and ``[SEP]`` counted (no truncation)."""
    out = []
    for j in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[j:j + batch_size]), add_special_tokens=True, truncation=False,
                        return_attention_mask=False, return_token_type_ids=False, verbose=False)
        out.extend(len(ids) for ids in enc["input_ids"])
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class Reviews:
    """A label-balanced selection: ``texts``, labels ``y`` ∈ {−1, +1}, ``review`` (row ids in
    the loaded dataset), ``tokens`` (lengths, ``[CLS]``/``[SEP]`` counted), and how many of the
    scanned reviews qualified."""

    texts: list[str]
    y: np.ndarray
    review: np.ndarray
    tokens: np.ndarray
    scanned: int
    qualified: int

    def __len__(self) -> int:
        return len(self.texts)


def select_reviews(ds, count: int, *, tokenizer, seed: int, max_tokens: int = MAX_TOKENS,
                   min_tokens: int = 0, chunk: int = 2048, unique: bool = False) -> Reviews:
    """``count`` reviews (half of each label) with ``min_tokens ≤ length < max_tokens`` tokens
    (``[CLS]``/``[SEP]`` counted), labels mapped to ``±1`` (positive = +1).

    The reviews are visited in a seeded random order and tokenized chunk by chunk until both
    labels have ``count/2`` qualifying reviews, so the same seed gives the same selection and
    a small ``count`` does not tokenize the whole corpus. The result alternates the labels
    (−1, +1, −1, …). ``count`` must be even; a ValueError says how many qualify when too few do.
    ``unique=True`` skips a review whose text equals one already picked (IMDb holds a few
    duplicate reviews; two equal texts make a Gram matrix of features singular).
    """
    count = int(count)
    if count < 2 or count % 2:
        raise ValueError(f"count must be a positive even number (half per label), got {count}.")
    if not 0 <= min_tokens < max_tokens:
        raise ValueError(f"need 0 ≤ min_tokens < max_tokens, got {min_tokens} and {max_tokens}.")
    half = count // 2
    order = np.random.default_rng(int(seed)).permutation(len(ds))
    labels = np.asarray(ds["label"])
    picked: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    scanned = qualified = 0
    seen: set[str] = set()
    for j in range(0, len(order), chunk):
        idx = order[j:j + chunk]
        chunk_texts = ds.select(idx)["text"]
        lengths = token_lengths(chunk_texts, tokenizer)
        scanned += len(idx)
        ok = (lengths < max_tokens) & (lengths >= min_tokens)
        qualified += int(ok.sum())
        for i, length, text in zip(idx[ok], lengths[ok], np.asarray(chunk_texts, dtype=object)[ok]):
            lab = int(labels[i])
            if len(picked[lab]) < half and not (unique and text in seen):
                picked[lab].append((int(i), int(length)))
                seen.add(text)
        if all(len(v) >= half for v in picked.values()):
            break
    if any(len(v) < half for v in picked.values()):
        raise ValueError(
            f"only {len(picked[0])} negative and {len(picked[1])} positive reviews have between "
            f"{min_tokens} and {max_tokens - 1} tokens; {count} reviews ({half} per label) were "
            "asked for. Ask for fewer, relax the length window, or use the full dataset "
            "(train and test from the hub)."
        )
    rows = [r for pair in zip(picked[0], picked[1]) for r in pair]
    idx = np.array([r[0] for r in rows], dtype=np.int64)
    texts = ds.select(idx)["text"]
    y = np.where(labels[idx] == 1, 1.0, -1.0)
    return Reviews(texts=list(texts), y=y, review=np.asarray(ds.select(idx)["review"]),
                   tokens=np.array([r[1] for r in rows], dtype=np.int64),
                   scanned=scanned, qualified=qualified)
