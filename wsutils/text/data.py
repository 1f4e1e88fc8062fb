"""The IMDb reviews (Maas et al., 2011) and the authors' selection of them (``utils_data.py``:
reviews with fewer than 240 WordPiece tokens; the book's chapter ``imdb``).

- :func:`load_imdb`: the reviews as a ``datasets.Dataset`` with the Hugging Face schema
  (``text``, ``label`` with 0 = negative, 1 = positive), from one of three sources
  (:func:`wsutils.run.config.imdb`, ``WSBOOK_IMDB``):

  - unset: the file embedded in the repository, ``data/imdb/imdb_test_lt240.jsonl.gz`` (the
    test split's reviews of fewer than 240 tokens; see ``data/imdb/README.md``), verified
    against its sha256 :data:`EMBEDDED_SHA256`. Offline and reproducible: the default.
  - ``hub``: ``datasets.load_dataset("stanfordnlp/imdb")``, train then test concatenated, as
    the authors scan them (needs the Hugging Face hub).
  - a path: that file (JSON lines or parquet, gzip or not).

  A local file is read here, line by line (not through the ``datasets`` cache, which keys on
  path, size and modification time and can return stale rows for a file changed in place);
  each bad line, missing or null field and unreadable file is a ``ValueError`` naming the file
  and the line or field. :func:`source_description` says which source a call uses.
- :func:`select_reviews`: the authors' selection: reviews with **fewer than 240 WordPiece
  tokens**, counted as the authors count them, ``len(tokenizer.tokenize(text)) < 240``
  (``[CLS]`` and ``[SEP]`` **not** counted), labels mapped to ``±1``, the same number of each
  label, drawn with a seed.

Every row keeps a ``review`` column: its index in the loaded dataset, a stable id of the review
for a given source (used, with the texts themselves, to key the embedding cache). The embedded
file also keeps the dataset's own review ``id`` and ``rating``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import check_int
from ..run import config
from . import _hub

__all__ = [
    "EMBEDDED_FILE",
    "EMBEDDED_SHA256",
    "HUB",
    "HUB_DATASET",
    "MAX_TOKENS",
    "Reviews",
    "embedded_path",
    "load_imdb",
    "select_reviews",
    "source_description",
    "token_lengths",
]

HUB_DATASET = "stanfordnlp/imdb"
#: The value of ``WSBOOK_IMDB`` (or of ``path``) that selects the hub dataset.
HUB = config.IMDB_HUB
#: The authors keep reviews with fewer than 240 tokens, ``[CLS]``/``[SEP]`` not counted.
MAX_TOKENS = 240
#: The embedded file, relative to the repository root (see ``data/imdb/README.md``).
EMBEDDED_FILE = "data/imdb/imdb_test_lt240.jsonl.gz"
#: Its sha256, checked on every load (``tools/make_imdb_subset.py`` prints it).
EMBEDDED_SHA256 = "7d1616f1e98705f883b8266f3f703df6680270b037063e9a72b78d67dcf40e85"


def embedded_path() -> Path:
    """The embedded review file: ``data/imdb/`` next to the ``wsutils`` package (the project is
    installed editable, so that is the clone's root)."""
    return Path(__file__).resolve().parents[2] / EMBEDDED_FILE


def _no_source_message(reason: str) -> str:
    return (
        f"No IMDb reviews available: {reason}. Either unset WSBOOK_IMDB to use the reviews "
        f"embedded in the repository ({EMBEDDED_FILE}), set it to a local copy of the reviews "
        "(JSON lines or parquet, gzip or not, with fields 'text' and 'label'), or allow the "
        "Hugging Face hub (WSBOOK_IMDB=hub, unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE, with "
        f"network) so that datasets.load_dataset({HUB_DATASET!r}) can download it."
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


def _sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it is gzip (by its magic bytes); errors name it."""
    raw = path.read_bytes()
    if not raw:
        raise ValueError(
            f"{path} is empty: it holds no reviews. Point WSBOOK_IMDB at a file "
            "with one review a line, or unset it to use the embedded reviews."
        )
    if raw[:2] != b"\x1f\x8b":
        if path.name.lower().endswith(".gz"):
            raise ValueError(
                f"{path} ends in .gz but is not gzip: compress it with gzip or "
                "rename it without .gz."
            )
        return raw
    try:
        out = gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(
            f"{path} is a damaged gzip file ({type(err).__name__}: {err}; a "
            "truncated download or copy?): copy or download it again."
        ) from None
    if not out:
        raise ValueError(f"{path} is empty once decompressed: it holds no reviews.")
    return out


def _check_row(path: Path, where: str, row: Any) -> None:
    if not isinstance(row, dict):
        raise ValueError(
            f"{path}, {where}: expected a JSON object with fields 'text' and "
            f"'label', got {type(row).__name__}."
        )
    for field in ("text", "label"):
        if field not in row:
            raise ValueError(
                f"{path}, {where}: field {field!r} is missing; every review needs "
                "'text' (the review) and 'label' (0 = negative, 1 = positive)."
            )
    text, label = row["text"], row["label"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"{path}, {where}: field 'text' must be a non-empty string, got {text!r}."
        )
    if isinstance(label, bool) or label not in (0, 1):
        raise ValueError(
            f"{path}, {where}: field 'label' must be 0 (negative) or 1 (positive), got {label!r}."
        )


def _read_jsonl(path: Path, content: bytes) -> dict[str, list]:
    try:
        # split on "\n" only: str.splitlines would also split inside a review at U+2028,
        # U+0085 etc., which JSON lines may hold unescaped
        lines = content.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}); is it a JSON-lines file?") from None
    columns: dict[str, list] = {}
    count = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}, line {lineno}: not valid JSON ({err.msg} at column "
                f"{err.colno}); fix or remove that line."
            ) from None
        _check_row(path, f"line {lineno}", row)
        if count and set(row) != set(columns):
            raise ValueError(
                f"{path}, line {lineno}: fields {sorted(row)} differ from the first "
                f"review's {sorted(columns)}; every line needs the same fields."
            )
        for k, v in row.items():
            columns.setdefault(k, []).append(v)
        count += 1
    if not count:
        raise ValueError(f"{path} holds no reviews (only blank lines).")
    return columns


def _read_parquet(path: Path, content: bytes) -> dict[str, list]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(content))
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path} is not a readable parquet file ({err}).") from None
    columns = table.to_pydict()
    if not table.num_rows:
        raise ValueError(f"{path} holds no reviews (an empty table).")
    for field in ("text", "label"):
        if field not in columns:
            raise ValueError(
                f"{path}: column {field!r} is missing; every review needs 'text' "
                "(the review) and 'label' (0 = negative, 1 = positive)."
            )
    for i in range(table.num_rows):
        _check_row(path, f"row {i}", {"text": columns["text"][i], "label": columns["label"][i]})
    return columns


@functools.lru_cache(maxsize=4)
def _load_file(path: str, digest: str) -> Any:
    """The reviews of ``path`` as an in-memory Dataset, cached by the file's content digest."""
    import datasets

    p = Path(path)
    content = _read_bytes(p)
    reader = _read_jsonl if _local_format(p) == "json" else _read_parquet
    columns = reader(p, content)
    columns.pop("review", None)
    columns["review"] = list(range(len(columns["text"])))
    return datasets.Dataset.from_dict(columns)


def _load_hub() -> Any:
    import datasets

    if _hub.offline():
        raise RuntimeError(
            _no_source_message(
                "WSBOOK_IMDB=hub but the hub is off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
            )
        )
    if not _hub.reachable():
        raise RuntimeError(_no_source_message("WSBOOK_IMDB=hub but the hub is unreachable"))
    try:
        parts = datasets.load_dataset(HUB_DATASET)
    except Exception as err:  # network, hub or cache errors: say what to do instead
        raise RuntimeError(
            _no_source_message(
                f"loading {HUB_DATASET!r} from the hub failed ({type(err).__name__}: {err})"
            )
        ) from err
    ds = datasets.concatenate_datasets([parts["train"], parts["test"]])
    labels = set(np.unique(np.asarray(ds["label"])).tolist())
    if not labels <= {0, 1}:
        raise ValueError(
            f"{HUB_DATASET}: labels must be 0 (negative) or 1 (positive), found {sorted(labels)}."
        )
    return ds.add_column("review", list(range(len(ds))))


def _resolve(path) -> Path | str:
    """``path`` (or ``WSBOOK_IMDB``) as :data:`HUB` or a file path (``None``: the embedded one)."""
    if path is None:
        path = config.imdb()
    if path is None:
        return embedded_path()
    if str(path).strip() == HUB:
        return HUB
    return Path(path).expanduser()


def load_imdb(path: str | os.PathLike | None = None) -> Any:
    """The IMDb reviews as a ``datasets.Dataset`` (columns ``text``, ``label`` ∈ {0, 1},
    ``review`` = row index, plus whatever else the source has, e.g. ``id`` and ``rating``).

    ``path`` (default: ``WSBOOK_IMDB`` via :func:`wsutils.run.config.imdb`): ``None`` the embedded
    file (checked against :data:`EMBEDDED_SHA256`), ``"hub"`` the hub dataset
    ``stanfordnlp/imdb`` (train then test), else a local file. A local file is read and
    validated here and cached by its content's sha256, so a file changed in place (same size
    and mtime) is read again (the ``datasets`` cache returned stale rows).

    Parameters
    ----------
    path
        ``None``, ``"hub"`` or a local file (JSON lines or parquet, gzip or not).

    Returns
    -------
    datasets.Dataset
        The reviews.

    Raises
    ------
    ValueError
        If a data file is bad, naming the file and the line or field: empty, truncated gzip,
        a line that is not JSON, a missing, null or out-of-range ``label``, a null or
        non-string ``text``, an unreadable parquet (instead of a bare ``StopIteration``,
        ``EOFError``, ``TypeError`` or a failure much later). Also if the embedded file
        changed or is corrupted: its sha256 differs from ``data/imdb/README.md``
        (``git checkout data/imdb``, or regenerate it with ``tools/make_imdb_subset.py``).
    RuntimeError
        At once, when the hub is asked for but off or unreachable.
    """
    where = _resolve(path)
    if where == HUB:
        return _load_hub()
    if not where.is_file():
        if where == embedded_path():
            raise ValueError(
                f"the embedded reviews {where} are missing: this wsutils is not "
                "the repository's editable install. Clone the repository and "
                "`pip install -e .` there, or set WSBOOK_IMDB to a local copy "
                "(or to 'hub')."
            )
        raise ValueError(
            f"{where} is not a file: " + _no_source_message("the local copy is missing")
        )
    digest = _sha256(where)
    if where == embedded_path() and digest != EMBEDDED_SHA256:
        raise ValueError(
            f"{where} has sha256 {digest}, not the recorded {EMBEDDED_SHA256}: the embedded "
            "reviews were changed. Restore them (git checkout -- "
            f"{EMBEDDED_FILE}), or regenerate them with tools/make_imdb_subset.py and record "
            "the new sha256 in data/imdb/README.md and wsutils.text.data.EMBEDDED_SHA256."
        )
    return _load_file(str(where), digest)


def source_description(path: str | os.PathLike | None = None) -> str:
    """Which source :func:`load_imdb` reads for ``path`` (default ``WSBOOK_IMDB``), in words,
    for the chapters to say where their numbers come from."""
    where = _resolve(path)
    if where == HUB:
        return f"the Hugging Face dataset {HUB_DATASET} (train and test)"
    if where == embedded_path():
        return (
            f"the reviews embedded in the repository ({EMBEDDED_FILE}: the test split's "
            f"reviews of fewer than {MAX_TOKENS} tokens, sha256 {EMBEDDED_SHA256[:12]}…)"
        )
    return f"the local file {Path(where).name} (WSBOOK_IMDB)"


def token_lengths(texts, tokenizer, *, batch_size: int = 512) -> np.ndarray:
    """WordPiece length of each text as the authors count it (``utils_data.py``:
    ``len(tokenizer.tokenize(text))``): ``[CLS]`` and ``[SEP]`` **not** counted, no truncation.
    A text embedded with :func:`wsutils.text.embeddings.embed` has this many tokens plus two."""
    batch_size = check_int("batch_size", batch_size, minimum=1)
    out = []
    for j in range(0, len(texts), batch_size):
        enc = tokenizer(
            list(texts[j : j + batch_size]),
            add_special_tokens=False,
            truncation=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        out.extend(len(ids) for ids in enc["input_ids"])
    return np.asarray(out, dtype=np.int64)


@dataclass(frozen=True)
class Reviews:
    """A label-balanced selection: ``texts``, labels ``y`` ∈ {−1, +1}, ``review`` (row ids in
    the loaded dataset), ``tokens`` (lengths as :func:`token_lengths` counts them,
    ``[CLS]``/``[SEP]`` not counted), and how many of the scanned reviews qualified."""

    texts: list[str]
    y: np.ndarray
    review: np.ndarray
    tokens: np.ndarray
    scanned: int
    qualified: int

    def __len__(self) -> int:
        return len(self.texts)


def select_reviews(
    ds,
    count: int,
    *,
    tokenizer,
    seed: int,
    max_tokens: int = MAX_TOKENS,
    min_tokens: int = 0,
    chunk: int = 2048,
    unique: bool = False,
) -> Reviews:
    """``count`` reviews (half of each label) with ``min_tokens ≤ length < max_tokens`` tokens
    (:func:`token_lengths`: the authors' count, ``[CLS]``/``[SEP]`` not counted), labels mapped
    to ``±1`` (positive = +1).

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
        idx = order[j : j + chunk]
        chunk_texts = ds.select(idx)["text"]
        lengths = token_lengths(chunk_texts, tokenizer)
        scanned += len(idx)
        ok = (lengths < max_tokens) & (lengths >= min_tokens)
        qualified += int(ok.sum())
        for i, length, text in zip(
            idx[ok], lengths[ok], np.asarray(chunk_texts, dtype=object)[ok]
        ):
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
            "(train and test from the hub: WSBOOK_IMDB=hub)."
        )
    rows = [r for pair in zip(picked[0], picked[1]) for r in pair]
    idx = np.array([r[0] for r in rows], dtype=np.int64)
    texts = ds.select(idx)["text"]
    y = np.where(labels[idx] == 1, 1.0, -1.0)
    return Reviews(
        texts=list(texts),
        y=y,
        review=np.asarray(ds.select(idx)["review"]),
        tokens=np.array([r[1] for r in rows], dtype=np.int64),
        scanned=scanned,
        qualified=qualified,
    )
