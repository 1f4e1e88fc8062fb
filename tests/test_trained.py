"""wsutils.trained on a tiny random BERT saved and reloaded through the real transformers path
(as tests/test_text.py builds it): the maps equal the model's own modules on real hidden
states, the rescaling to the own-norm ball, the fast head estimator against the generic one,
and the vocabulary search against full forward passes."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tiny_bert import save_tiny_bert, tiny_roberta  # noqa: E402

from wsutils import trained as tr  # noqa: E402
from wsutils.run.seeds import point_seed  # noqa: E402
from wsutils.sensitivity import relative_change  # noqa: E402
from wsutils.text import embeddings as em  # noqa: E402

TEXTS = ["i love her smile and the movie was very good", "the plot is bad and the actor awful"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny batched products: one torch thread (two that wait on a shared machine were ~20×
    slower in our runs); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def enc(tmp_path_factory, one_thread):
    """A 2-layer random BERT (hidden 32, 4 heads of width 8), biases made non-zero."""
    torch.manual_seed(0)

    def nonzero_biases(model):  # the library initialises biases to zero; a trained model's are not
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)

    path = save_tiny_bert(
        tmp_path_factory.mktemp("tiny-bert-trained"), edit=nonzero_biases, initializer_range=0.2
    )
    return em.load_model(str(path))


@pytest.fixture(scope="module")
def H(enc, tmp_path_factory):
    return tr.layer_inputs(enc, TEXTS, 8, cache_dir=tmp_path_factory.mktemp("cache"))


def test_layer_inputs_are_the_models_hidden_states(enc, H):
    assert H.shape == (enc.layers + 1, 2, 8, enc.hidden)
    batch = enc.tokenizer(TEXTS, truncation=True, max_length=8, return_tensors="pt")
    with torch.no_grad():
        hs = enc.model(**batch, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(H, torch.stack(hs).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fewer than"):
        tr.layer_inputs(enc, ["i love her"], 8, cache_dir=False)


@pytest.mark.parametrize("layer", [1, 2])
def test_head_map_is_the_models_attention(enc, H, layer):
    X = torch.as_tensor(H[layer - 1])
    with torch.no_grad():
        ctx, _ = enc.model.encoder.layer[layer - 1].attention.self(X)
    dh = enc.hidden // enc.heads
    for h in range(enc.heads):
        head = tr.head_weights(enc, layer, h)
        assert float(head.b_Q.abs().max()) > 0  # the fixture's biases are in the map
        out = tr.head_map(head)(X.double())
        np.testing.assert_allclose(
            out.numpy(), ctx[..., h * dh : (h + 1) * dh].double().numpy(), rtol=1e-4, atol=1e-5
        )


def test_map_fidelity_accepts_the_models_maps_and_its_control_fails(enc, H):
    """map_fidelity on the fixture's hidden states: every map within its float32 tolerance,
    the head maps without b_Q (the control) more than 100 tolerances off; a batch of texts
    in place of one text's (L + 1, n, d) slice is refused."""
    fid = tr.map_fidelity(enc, H[:, 0])
    assert fid.faithful and fid.head < fid.head_tol and fid.layer < fid.layer_tol
    assert fid.head_without_bQ > 100 * fid.head_tol
    assert not tr.MapFidelity(1.0, 0.5, 100.0, 0.0, 1.0).faithful  # a deviation over its tol
    with pytest.raises(ValueError, match="one text's hidden states"):
        tr.map_fidelity(enc, H)


def test_key_bias_cancels_and_value_bias_shifts(enc, H):
    head = tr.head_weights(enc, 1, 0)
    X = torch.as_tensor(H[0, 0]).double()
    out = tr.head_map(head)(X)
    moved = tr.Head(**{**head.__dict__, "b_K": head.b_K + 3.0})
    torch.testing.assert_close(tr.head_map(moved)(X), out, rtol=1e-12, atol=1e-12)
    shifted = tr.Head(**{**head.__dict__, "b_V": head.b_V + 1.0})
    torch.testing.assert_close(tr.head_map(shifted)(X), out + 1.0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", [1, 2])
def test_block_layer_and_stack_maps(enc, H, layer):
    X = torch.as_tensor(H[layer - 1])
    with torch.no_grad():
        block = enc.model.encoder.layer[layer - 1].attention(X)[0]
        np.testing.assert_allclose(
            tr.block_map(enc, layer)(X).numpy(), block.numpy(), rtol=1e-6, atol=1e-6
        )
        np.testing.assert_allclose(
            tr.layer_map(enc, layer)(X).numpy(), H[layer], rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(
            tr.stack_map(enc, layer)(torch.as_tensor(H[0])).numpy(), H[layer], rtol=1e-4, atol=1e-4
        )
        # the float64 copy computes the same map
        y64 = tr.layer_map(enc, layer)(X.double())
    assert y64.dtype == torch.float64
    np.testing.assert_allclose(y64.numpy(), H[layer], rtol=1e-4, atol=1e-4)


def test_own_norm_problem(enc, H):
    phi = tr.head_map(tr.head_weights(enc, 1, 1))
    X = H[0, 0].astype(np.float64)
    Z, phi_Z, r = tr.own_norm_problem(phi, X)
    d = X.shape[1]
    np.testing.assert_allclose(
        torch.linalg.vector_norm(Z, dim=1).numpy(), math.sqrt(d), rtol=1e-12
    )
    torch.testing.assert_close(phi_Z(Z), phi(torch.as_tensor(X)), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="zero"):
        tr.own_norm_problem(phi, np.zeros((3, d)))


def test_fast_head_estimator_and_generic_are_each_justified(enc, H):
    """The rank-one head objective and the full head map are different floating-point
    computations, so the two searches need not follow one path on every machine (issue 23
    item 13). Each answer's values are the head map's relative changes at its own Δ, and at
    each of those Δ the rank-one objective gives the full map's value."""
    head = tr.head_weights(enc, 2, 3)
    X = H[1, 0].astype(np.float64)
    kw = dict(rows=[1, 4], starts=3, steps=15, seed=5, dtype=torch.float64)
    fast = tr.head_word_sensitivity(head, X, **kw)
    slow = tr.own_norm_word_sensitivity(tr.head_map(head), X, **kw)
    Z, _, scale = tr.own_norm_problem(tr.head_map(head), X)
    obj = tr.heads._HeadObjective(head, Z * scale, scale)
    for res in (fast, slow):
        for r in (1, 4):
            D = res.per_row_Delta[r]
            v = relative_change(tr.head_map(head), X, r, D)
            assert res.per_row[r] == pytest.approx(v, rel=1e-9)
            Dz = torch.as_tensor(D) / scale[r, 0]  # Δ in the own-norm coordinates
            assert float(obj(torch.tensor([r]), Dz[None])[0]) == pytest.approx(v, rel=1e-9)
    # the Δ is in X's coordinates, within the own-norm ball, and attains the value
    D = fast.Delta
    assert np.linalg.norm(D) <= np.linalg.norm(X[fast.row]) * (1 + 1e-12)
    v = relative_change(tr.head_map(head), X, fast.row, D)
    assert v == pytest.approx(fast.value, rel=1e-9)


def test_own_norm_search_is_word_sensitivity_and_certified_at_X(enc, H):
    from wsutils.sensitivity import word_sensitivity

    phi = tr.layer_map(enc, 2)
    X = H[1, 0].astype(np.float64)
    kw = dict(rows=[2, 5], starts=2, steps=6, seed=4)
    mine = tr.own_norm_word_sensitivity(phi, X, dtype=torch.float64, **kw)
    Z, phi_Z, r = tr.own_norm_problem(phi, X)
    ref = word_sensitivity(phi_Z, Z, check_norms=False, **kw)
    for i in (2, 5):
        assert mine.per_row[i] == pytest.approx(ref.per_row[i], rel=1e-10)
    # searched in float32, the value is attained at X itself (float64), inside the ball
    res = tr.own_norm_word_sensitivity(phi, X, **kw)
    assert np.linalg.norm(res.Delta) <= np.linalg.norm(X[res.row]) * (1 + 1e-12)
    assert relative_change(phi, X, res.row, res.Delta) == pytest.approx(res.value, rel=1e-12)


def test_random_head_norms(enc):
    head = tr.head_weights(enc, 1, 2)
    rnd = tr.random_head(head, seed=3)
    assert rnd.qk_norm() == pytest.approx(head.qk_norm(), rel=1e-12)
    assert float(torch.linalg.matrix_norm(rnd.W_V)) == pytest.approx(
        float(torch.linalg.matrix_norm(head.W_V)), rel=1e-12
    )
    assert float(rnd.b_Q.abs().max()) == 0
    assert not torch.equal(rnd.W_Q, tr.random_head(head, seed=4).W_Q)


def _emb64(enc):
    """A float64 copy of the model's own embedding module (the definition's ``X(t)``)."""
    return copy.deepcopy(enc.model.embeddings).double().eval()


def test_vocabulary_changes_equal_full_forward(enc):
    ids = enc.tokenizer(TEXTS[0], truncation=True, max_length=8)["input_ids"]
    pos = 3
    res = tr.vocabulary_changes(enc, ids, pos, batch=7)
    V = enc.model.config.vocab_size
    assert res.values.shape == (enc.heads, V - 1) and ids[pos] not in res.tokens
    assert res.peak_bytes > res.table_bytes > 0
    emb64 = _emb64(enc)
    with torch.no_grad():
        X = emb64(input_ids=torch.tensor([ids]))[0]
        X32 = enc.model.embeddings(input_ids=torch.tensor([ids])).double()[0]
    # the float64 copy is the model's float32 layer up to float32 rounding
    np.testing.assert_allclose(X.numpy(), X32.numpy(), rtol=0, atol=1e-5)
    for b in range(0, V - 1, 5):
        changed = list(ids)
        changed[pos] = int(res.tokens[b])
        with torch.no_grad():
            Xc = emb64(input_ids=torch.tensor([changed]))[0]
        # the embedding output is per position: only row pos changes
        np.testing.assert_array_equal(np.delete(Xc.numpy(), pos, 0), np.delete(X.numpy(), pos, 0))
        for h in range(enc.heads):
            phi = tr.head_map(tr.head_weights(enc, 1, h))
            want = float(
                torch.linalg.vector_norm(phi(Xc) - phi(X)) / torch.linalg.vector_norm(phi(X))
            )
            # both float64, sums of at most n·d = 256 terms (u·256 ≈ 3e-14 each), through a
            # softmax and a ratio whose values here are ≥ 1e-3 (asserted): 1e-9 relative
            assert want > 1e-3
            assert res.values[h, b] == pytest.approx(want, rel=1e-9)
        dist = float(torch.linalg.vector_norm(Xc[pos] - X[pos]) / torch.linalg.vector_norm(X[pos]))
        assert res.dist[b] == pytest.approx(dist, rel=1e-9)
    with pytest.raises(ValueError, match="position"):
        tr.vocabulary_changes(enc, ids, len(ids))
    with pytest.raises(ValueError, match="method"):
        tr.vocabulary_changes(enc, ids, pos, method="fast")


@pytest.mark.parametrize("tokens", [None, [30, 5, 17, 6, 7, 8, 2]])
def test_factored_equals_direct(enc, tokens, monkeypatch):
    """The cached factored rows (ranges of the tables, and gathered subsets), the direct way,
    and the fallback for nearly cancelling parts (forced by a cancellation bound of 0) agree
    to float64 rounding."""
    ids = enc.tokenizer(TEXTS[1], truncation=True, max_length=8)["input_ids"]
    fac = tr.vocabulary_changes(enc, ids, 2, tokens=tokens, batch=4)
    dire = tr.vocabulary_changes(enc, ids, 2, tokens=tokens, batch=4, method="direct")
    np.testing.assert_array_equal(fac.tokens, dire.tokens)
    np.testing.assert_allclose(fac.values, dire.values, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(fac.dist, dire.dist, rtol=1e-10, atol=1e-13)
    monkeypatch.setattr(tr.vocabulary, "_CANCEL_MAX", 0.0)
    forced = tr.vocabulary_changes(enc, ids, 2, tokens=tokens, batch=4)
    np.testing.assert_allclose(forced.values, fac.values, rtol=1e-10, atol=1e-13)


def test_factored_guard_and_cache(enc):
    ids = enc.tokenizer(TEXTS[1], truncation=True, max_length=8)["input_ids"]
    other = em.Encoder(
        name=enc.name,
        identity=enc.identity,
        tokenizer=enc.tokenizer,
        model=copy.deepcopy(enc.model),
    )
    before = tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
    # the cache follows the model's parameters: a changed query weight is used at once
    with torch.no_grad():
        other.model.encoder.layer[0].attention.self.query.weight.mul_(2)
    after = tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
    assert not np.allclose(after.values, before.values)
    np.testing.assert_allclose(
        after.values,
        tr.vocabulary_changes(other, ids, 4, tokens=[5, 6], method="direct").values,
        rtol=1e-10,
    )
    # also a change that bypasses autograd's version counter (p.data), and load_state_dict
    for change in (
        lambda m: m.encoder.layer[0].attention.self.query.bias.data.add_(0.5),
        lambda m: m.embeddings.word_embeddings.weight.data[5].mul_(1.5),
        lambda m: m.load_state_dict(enc.model.state_dict()),
    ):
        stale = tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
        change(other.model)
        now = tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
        assert not np.allclose(now.values, stale.values)
        fresh = em.Encoder(
            name=enc.name,
            identity=enc.identity,
            tokenizer=enc.tokenizer,
            model=copy.deepcopy(other.model),
        )
        np.testing.assert_allclose(
            now.values,
            tr.vocabulary_changes(fresh, ids, 4, tokens=[5, 6], method="direct").values,
            rtol=1e-10,
        )
        held = tr.free_vocabulary_tables(fresh)
        assert held > 0 and tr.free_vocabulary_tables(fresh) == 0
    # a formula that no longer matches the module is caught by the check, even when it is
    # off by far less than float32 rounding (relative 1e-9 in γ, or ε = 1e-5 for 1e-12)
    for field, value in (("gamma", lambda t: t.gamma * (1 + 1e-9)), ("eps", lambda t: 1e-5)):
        tab = tr.vocabulary._tables(other, other.device)
        good = getattr(tab, field)
        setattr(tab, field, value(tab))
        with pytest.raises(ValueError, match="does not compute"):
            tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
        setattr(tab, field, good)
        tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
    # an embedding layer without BERT's LayerNorm: refused, the direct way still runs
    other.model.embeddings.LayerNorm = torch.nn.Identity()
    with pytest.raises(ValueError, match="method='direct'"):
        tr.vocabulary_changes(other, ids, 4, tokens=[5, 6])
    assert tr.vocabulary_changes(other, ids, 4, tokens=[5, 6], method="direct").values.shape == (
        enc.heads,
        2,
    )


def test_vocabulary_changes_refuses_other_position_numbering(enc):
    """RoBERTa's embedding module numbers positions from padding_idx + 1: the candidates'
    rows (position_ids = i) would then not be the model's, so both methods refuse it."""
    rob = tiny_roberta(enc)
    ids = enc.tokenizer(TEXTS[1], truncation=True, max_length=8)["input_ids"]
    for method in ("factored", "direct"):
        with pytest.raises(ValueError, match="number"):
            tr.vocabulary_changes(rob, ids, 2, tokens=[5, 6], method=method)


def test_substitution_changes(enc):
    ids = enc.tokenizer(TEXTS[1], truncation=True, max_length=8)["input_ids"]
    toks = [5, 9, 12]
    out = tr.substitution_changes(enc, ids, 2, toks, batch=2)
    assert out.shape == (3, enc.layers)
    for b, t in enumerate(toks):
        changed = list(ids)
        changed[2] = t
        with torch.no_grad():
            h0 = enc.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            h1 = enc.model(
                input_ids=torch.tensor([changed]), output_hidden_states=True
            ).hidden_states
        for layer in range(1, enc.layers + 1):
            want = float((h1[layer] - h0[layer]).norm() / h0[layer].norm())
            assert out[b, layer - 1] == pytest.approx(want, rel=1e-4)


def test_bad_input(enc):
    with pytest.raises(ValueError, match="layer"):
        tr.head_weights(enc, 0, 0)
    with pytest.raises(ValueError, match="layer"):
        tr.block_map(enc, enc.layers + 1)
    with pytest.raises(ValueError, match="head"):
        tr.head_weights(enc, 1, enc.heads)
    with pytest.raises(TypeError):
        tr.head_weights(enc, 1.5, 0)
    with pytest.raises(TypeError, match="Encoder"):
        tr.head_weights(3, 1, 0)


def test_pair_changes(enc):
    from wsutils.text import word_attention as ta

    texts = [
        "i love her much. the movie was good and the plot great! "
        "this actor is very bad. it is a film of the review."
    ] * 3
    pairs = ta.one_word_pairs(texts, enc.tokenizer, count=3, seed=0, min_words=4)
    out = tr.pair_changes(enc, pairs)
    assert out["heads"].shape == (3, enc.heads) and out["layers"].shape == (3, enc.layers)
    for k, p in enumerate(pairs):
        want = tr.substitution_changes(enc, p.ids, p.j, [p.ids_changed[p.j]])[0]
        np.testing.assert_allclose(out["layers"][k], want, rtol=1e-4)
        res = tr.vocabulary_changes(enc, p.ids, p.j, tokens=[p.ids_changed[p.j]])
        np.testing.assert_allclose(out["heads"][k], res.values[:, 0], rtol=1e-4)
        assert out["dist"][k] == pytest.approx(res.dist[0], rel=1e-4)


def test_heads_batch_matches_single_head_values(enc, H):
    heads = [tr.head_weights(enc, 2, h) for h in range(enc.heads)]
    X = H[1, 1].astype(np.float64)
    vals = tr.heads_word_sensitivity(heads, X, rows=[2, 5], starts=2, steps=10, seed=1)
    assert vals.shape == (enc.heads,)
    # one head in the batch: the very search of head_word_sensitivity
    for h in (0, 3):
        one = tr.heads_word_sensitivity(
            [heads[h]], X, rows=[2, 5], starts=2, steps=10, seed=1, dtype=torch.float64
        )
        single = tr.head_word_sensitivity(
            heads[h], X, rows=[2, 5], starts=2, steps=10, seed=1, dtype=torch.float64
        )
        assert one[0] == pytest.approx(single.value, rel=1e-8)
    grid = tr.head_grid(enc, H[:, 0], [1, 3], search=dict(steps=3))
    assert grid.shape == (enc.layers, enc.heads) and (grid > 0).all()


def test_vocabulary_search_is_vocabulary_changes_at_every_position_with_or_without_a_pool(enc):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    texts = ["a good film with a fine cast and a plot", "the worst film i have ever seen here"]
    tokens = np.arange(0, 12)
    found, cpu = tr.vocabulary_search(enc, texts, 6, [1, 3], tokens=tokens)
    assert [(r, vc.position) for r, _, vc in found] == [(0, 1), (0, 3), (1, 1), (1, 3)]
    assert cpu > 0
    for r, ids, vc in found:
        assert ids == enc.tokenizer(texts[r], truncation=True, max_length=6)["input_ids"]
        assert list(vc.tokens) == [t for t in tokens if t != ids[vc.position]]
        one = tr.vocabulary_changes(enc, ids, vc.position, tokens=vc.tokens)
        np.testing.assert_array_equal(vc.values, one.values)
    with ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("fork"),
        initializer=torch.set_num_threads,
        initargs=(1,),
    ) as ex:
        pooled, _ = tr.vocabulary_search(enc, texts, 6, [1, 3], tokens=tokens, executor=ex)
        for (r, ids, vc), (r2, ids2, vc2) in zip(found, pooled):
            assert (r, ids, vc.position) == (r2, ids2, vc2.position)
            np.testing.assert_array_equal(vc.values, vc2.values)
        with pytest.raises(ValueError, match="by its name"):  # not from load_model
            tr.vocabulary_search(
                em.random_model(enc, seed=1), texts, 6, [1], tokens=tokens, executor=ex
            )
    with pytest.raises(ValueError, match="fewer than n"):
        tr.vocabulary_search(enc, ["film"], 6, [1], tokens=tokens)
    with pytest.raises(ValueError, match="positions"):
        tr.vocabulary_search(enc, texts, 6, [6], tokens=tokens)


def test_texts_longer_than_the_models_positions_are_a_value_error(enc):
    """The fixture has 64 positions: a longer text is refused by name, not by a torch size
    mismatch or an IndexError deep inside."""
    P = int(enc.model.config.max_position_embeddings)
    ids = [2] + [5] * P + [3]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tr.vocabulary_changes(enc, ids, 1, tokens=[6, 7])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tr.vocabulary_changes(enc, ids, 1, tokens=[6, 7], method="direct")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tr.substitution_changes(enc, ids, 1, [6, 7])
    long_text = " ".join(["good"] * (P + 10))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tr.vocabulary_search(enc, [long_text], P + 2, [1], tokens=[6, 7])


def test_non_integer_token_ids_are_a_type_error(enc):
    """No silent truncation: 100.7 is not token 100, a float id array is not an id array."""
    ids = enc.tokenizer(TEXTS[0], truncation=True, max_length=8)["input_ids"]
    with pytest.raises(TypeError, match="tokens"):
        tr.vocabulary_changes(enc, ids, 1, tokens=[10.7])
    with pytest.raises(TypeError, match="input_ids"):
        tr.vocabulary_changes(enc, np.asarray(ids, dtype=float), 1, tokens=[10])
    with pytest.raises(TypeError, match="input_ids"):
        tr.substitution_changes(enc, [float(i) for i in ids], 1, [10])
    with pytest.raises(TypeError, match="tokens"):
        tr.substitution_changes(enc, ids, 1, [10.0])
    with pytest.raises(TypeError, match="tokens"):
        tr.vocabulary_search(enc, TEXTS[:1], 6, [1], tokens=[10.5])
    with pytest.raises(TypeError, match="tokens"):
        tr.vocabulary_changes(enc, ids, 1, tokens=[True, False])
    # integer arrays of any integer type, lists and tensors stay accepted
    a = tr.vocabulary_changes(enc, np.asarray(ids, dtype=np.int32), 1, tokens=[10, 11])
    b = tr.vocabulary_changes(enc, torch.tensor(ids), 1, tokens=np.array([10, 11], np.uint8))
    np.testing.assert_array_equal(a.values, b.values)


def _copy_of(enc) -> em.Encoder:
    """The fixture's encoder with its own copy of the model (a test may change it in place)."""
    return em.Encoder(
        name=enc.name,
        identity=enc.identity,
        tokenizer=enc.tokenizer,
        model=copy.deepcopy(enc.model),
    )


@pytest.mark.parametrize("make", [tr.block_map, tr.layer_map, tr.stack_map])
def test_float64_copy_of_a_module_map_follows_in_place_changes(enc, H, make):
    """The float32 map is the live module; its float64 copy used to be made once and kept, so
    after an in-place change the certified float64 value came from the old module."""
    mine = _copy_of(enc)
    phi = make(mine, 1)
    X = torch.as_tensor(H[0])
    before = phi(X.double())
    with torch.no_grad():
        mine.model.encoder.layer[0].attention.output.dense.weight.data.mul_(1.5)
    after = phi(X.double())
    torch.testing.assert_close(after, make(mine, 1)(X.double()), rtol=0, atol=0)
    torch.testing.assert_close(after.float(), phi(X), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)


def test_layer_inputs_follow_a_model_changed_in_memory(enc, tmp_path):
    """The embedding cache used to key on the weight files only: a model changed in memory
    got its old hidden states back."""
    mine = _copy_of(enc)
    H0 = tr.layer_inputs(mine, TEXTS, 8, cache_dir=tmp_path)
    with torch.no_grad():
        mine.model.embeddings.word_embeddings.weight.mul_(1.5)
    H1 = tr.layer_inputs(mine, TEXTS, 8, cache_dir=tmp_path)
    np.testing.assert_array_equal(H1, tr.layer_inputs(mine, TEXTS, 8, cache_dir=False))
    assert not np.allclose(H0, H1)


def _spawn_or_fork(kind):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context(kind),
        initializer=torch.set_num_threads,
        initargs=(1,),
    )


@pytest.mark.parametrize("when", ["fork pool made before the change", "spawn pool"])
def test_pooled_vocabulary_search_follows_the_callers_model(enc, when):
    """The workers load the model by its name (or keep the copy they forked): after an
    in-place change of the caller's model they used to return values of the old one."""
    texts = ["a good film with a fine cast and a plot"]
    tokens = np.arange(0, 12)
    mine = em.load_model(enc.name)  # the cached Encoder itself: changed, then restored
    w = mine.model.embeddings.word_embeddings.weight
    saved = w.detach().clone()
    ex = _spawn_or_fork(when.split()[0])
    try:
        if when.startswith("fork"):
            ex.submit(int, 0).result()  # the worker exists: it holds the old model
        with torch.no_grad():
            w.mul_(1.5)
        here, _ = tr.vocabulary_search(mine, texts, 6, [1, 3], tokens=tokens)
        try:
            pooled, _ = tr.vocabulary_search(mine, texts, 6, [1, 3], tokens=tokens, executor=ex)
        except ValueError as err:  # a refusal is allowed, a wrong number not
            assert "differs" in str(err)
        else:
            for (_, _, a), (_, _, b) in zip(here, pooled):
                np.testing.assert_array_equal(a.values, b.values)
    finally:
        ex.shutdown()
        with torch.no_grad():
            w.copy_(saved)
        tr.free_vocabulary_tables(mine)


def _exit_on(word_id, orig):
    import os

    def changes(enc, ids, i, **kw):
        if word_id in list(ids):
            os._exit(3)  # the worker is killed
        return orig(enc, ids, i, **kw)

    return changes


def test_a_killed_pool_worker_keeps_the_finished_texts(enc, monkeypatch):
    """``BrokenProcessPool`` used to discard every text already computed: they are kept, and
    a rerun (pooled or not) computes only the rest."""
    from concurrent.futures.process import BrokenProcessPool

    tokens = np.arange(0, 12)
    texts = [
        "i love her smile and the movie was good",
        "the film is bad",
        "the plot is bad and the actor awful",
    ]
    want, _ = tr.vocabulary_search(enc, texts, 6, [1, 3], tokens=tokens)
    film = enc.tokenizer.convert_tokens_to_ids("film")
    monkeypatch.setattr(tr.vocabulary, "vocabulary_changes", _exit_on(film, tr.vocabulary_changes))
    with _spawn_or_fork("fork") as ex, pytest.raises(BrokenProcessPool, match="kept"):
        tr.vocabulary_search(enc, texts, 6, [1, 3], tokens=tokens, executor=ex)
    monkeypatch.undo()
    calls = []
    orig = tr.vocabulary_changes
    monkeypatch.setattr(
        tr.vocabulary,
        "vocabulary_changes",
        lambda e, ids, i, **kw: calls.append(list(ids)) or orig(e, ids, i, **kw),
    )
    got, _ = tr.vocabulary_search(enc, texts, 6, [1, 3], tokens=tokens)
    assert enc.tokenizer(texts[0], truncation=True, max_length=6)["input_ids"] not in calls
    assert 0 < len(calls) <= 4
    for (r, ids, a), (r2, ids2, b) in zip(want, got):
        assert (r, ids, a.position) == (r2, ids2, b.position)
        np.testing.assert_array_equal(a.values, b.values)


def test_experiment_sizes_and_rows(enc, monkeypatch):
    """The trained chapters' sizes: one table per scale (``WSBOOK_SCALE`` picks it), the
    figure-1 chapter's review pool and pair count shared with it; :func:`rows_of` spaces word
    rows evenly without ``[CLS]`` and ``[SEP]``; :func:`long_reviews` keeps the first texts
    that fill ``n`` tokens."""
    from wsutils.experiments import figure1, trained

    for name in ("quick", "paper"):
        P, F = trained.scale(name), figure1.scale(name)
        assert (P.reviews_pool, P.pairs) == (F.reviews, F.pairs)
        assert P.used <= P.pairs and P.deep <= P.vocab_reviews * P.positions
    monkeypatch.setenv("WSBOOK_SCALE", "paper")
    assert trained.scale() == trained.SCALES["paper"]
    with pytest.raises(ValueError):
        trained.scale("huge")
    assert trained.rows_of(32, 4) == [1, 11, 20, 30]
    assert trained.rows_of(5, 3) == [1, 2, 3]
    with pytest.raises(ValueError, match="k = 8 word rows"):  # not fewer rows, silently
        trained.rows_of(4, 8)
    lengths = [len(enc.tokenizer.tokenize(t)) for t in TEXTS]
    assert trained.long_reviews(TEXTS, enc.tokenizer, max(lengths) + 2, 1) == [
        lengths.index(max(lengths))
    ]
    with pytest.raises(ValueError, match="only 1 of the"):  # not fewer texts, silently
        trained.long_reviews(TEXTS, enc.tokenizer, max(lengths) + 2, 2)
    assert trained.long_reviews(TEXTS, enc.tokenizer, 3, 1) == [0]


def test_key_bias_masks_a_key_as_if_it_were_not_there(enc, H):
    """A key with logit −inf gets no weight, and the masked head is the head over the other
    keys (the text without that key's column, the same queries), within float64 rounding;
    bad biases are refused by name."""
    head = tr.head_weights(enc, 1, 2)
    X = torch.as_tensor(H[0, 0], dtype=torch.float64)
    mask = np.zeros(8)
    mask[[0, 7]] = -np.inf  # [CLS] and [SEP]
    A = tr.head_attention(head, X, mask)
    assert float(A[:, [0, 7]].abs().max()) == 0.0  # exp(−inf) is exactly 0
    torch.testing.assert_close(A.sum(dim=1), torch.ones(8, dtype=torch.float64))
    Q, K, V = (
        X @ W + b for W, b in ((head.W_Q, head.b_Q), (head.W_K, head.b_K), (head.W_V, head.b_V))
    )
    keep = list(range(1, 7))
    direct = torch.softmax(Q @ K[keep].T / math.sqrt(head.d_h), dim=1) @ V[keep]
    torch.testing.assert_close(tr.head_map(head, torch.as_tensor(mask))(X), direct)
    for bad, match in (
        ([0.0] * 7, "shape"),
        ([np.nan] + [0.0] * 7, "NaN"),
        ([-np.inf] * 8, "every"),
    ):
        with pytest.raises(ValueError, match=match):
            tr.head_attention(head, X, bad)


def test_head_sinks_with_and_without_the_sink(enc, H):
    """The attention-sink chapter's per-head record on the fixture: the masked search differs
    from the unmasked one only through the mask (a zero bias gives the same values), every
    value is a certified lower bound of its own map, and the sink mass is the weight on the
    sink positions."""
    from wsutils.experiments.sink import head_sinks, sink_positions

    ids = enc.tokenizer(TEXTS[0], truncation=True, max_length=8)["input_ids"]
    tokens = enc.tokenizer.convert_ids_to_tokens(ids)
    assert sink_positions(tokens) == [0, 7]
    assert sink_positions(["[CLS]", "a", ",", "##.", "b", "[SEP]"]) == [0, 2, 3, 5]
    out = head_sinks(enc, H[:, 0], tokens, [0, 1, 3], search=dict(steps=3), seed=1)
    assert out["rows"] == [1, 3] and out["sinks"] == [0, 7]
    assert out["mass"].shape == out["S"].shape == out["S_masked"].shape == (2, 4)
    assert ((out["mass"] > 0) & (out["mass"] < 1)).all() and (out["value"] > 0).all()
    grid = tr.head_grid(
        enc, H[:, 0], [1, 3], search=dict(steps=3), seed=point_seed("sink heads", 1)
    )
    np.testing.assert_array_equal(out["S"], grid)  # the same search, the same code
    zero = tr.head_grid(
        enc,
        H[:, 0],
        [1, 3],
        search=dict(steps=3),
        seed=point_seed("sink heads", 1),
        key_bias=np.zeros(8),
    )
    np.testing.assert_array_equal(zero, grid)  # adding 0.0 to a score is exact
    with pytest.raises(ValueError, match="sink position"):
        head_sinks(enc, H[:, 0], tokens, [0, 7], search=dict(steps=3), seed=1)
    with pytest.raises(ValueError, match="tokens"):
        head_sinks(enc, H[:, 0], tokens[:5], [1], search=dict(steps=3), seed=1)


def _synthetic_head(d=6, dh=3, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    return tr.Head(
        W_Q=draw(d, dh), W_K=draw(d, dh), W_V=draw(d, dh), b_Q=draw(dh), b_K=draw(dh),
        b_V=draw(dh), W_O=draw(dh, d), layer=1, head=0,
    )  # fmt: skip


def _changes(head, X, i, D, key_bias=None):
    """The exact relative change of the head at each row of ``D`` moved into word ``i``."""
    phi = tr.head_map(head, key_bias)
    base = phi(X)
    Xi = X.expand(D.shape[0], *X.shape).clone()
    Xi[:, i] += D
    return (phi(Xi) - base).flatten(1).norm(dim=1) / base.norm()


@pytest.mark.parametrize("masked", [None, 2, 0])
def test_head_certificate_lies_above_every_change_tried(masked):
    """prop-head-upper: above the change of many random Δ in each word's own ball (its sphere
    too), a masked key included (``masked``: that key's bias is −inf)."""
    g = torch.Generator().manual_seed(1)
    n, d = 7, 6
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.5, 2.0, n)[:, None]
    bias = None if masked is None else torch.where(torch.arange(n) == masked, -math.inf, 0.3)
    for seed in range(3):
        head = _synthetic_head(d, 3, seed)
        up = tr.head_certified_upper(head, X, key_bias=bias)
        for i in range(n):
            D = torch.randn(400, d, generator=g, dtype=torch.float64)
            D *= X[i].norm() / D.norm(dim=1, keepdim=True)
            D[200:] *= torch.rand(200, 1, generator=g, dtype=torch.float64)
            assert float(_changes(head, X, i, D, bias).max()) <= up[i]


def test_head_certificate_on_a_fine_grid_of_a_tiny_head():
    """d = 2: every Δ of a fine polar grid of the own-norm disk stays below the bound."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(4, 2, generator=g, dtype=torch.float64)
    head = _synthetic_head(2, 2, seed=5, scale=2.0)
    up = tr.head_certified_upper(head, X)
    t = torch.linspace(0, 2 * math.pi, 721, dtype=torch.float64)[:-1]
    for i in range(4):
        rad = X[i].norm() * torch.linspace(0, 1, 41, dtype=torch.float64)
        D = (rad[:, None, None] * torch.stack([t.cos(), t.sin()], -1)[None]).reshape(-1, 2)
        assert float(_changes(head, X, i, D).max()) <= up[i]


def test_head_search_returns_a_bracket(enc, H):
    head = tr.head_weights(enc, 2, 1)
    X = H[1, 0].astype(np.float64)
    r = tr.head_word_sensitivity(head, X, rows=[1, 4], starts=2, steps=10, seed=0)
    assert sorted(r.per_row_upper) == [1, 4] and r.value <= r.upper
    np.testing.assert_allclose(
        [r.per_row_upper[1], r.per_row_upper[4]],
        tr.head_certified_upper(head, X, rows=[1, 4]),
        rtol=1e-9,
    )
    grid = tr.head_grid(enc, H[:, 0], [1, 3], search=dict(steps=3))
    upper = tr.head_upper_grid(enc, H[:, 0], [1, 3])
    assert upper.shape == grid.shape and (grid <= upper).all()
    control = tr.head_grid(enc, H[:, 0], [1, 3], search=dict(steps=3), control=True)
    assert (control <= tr.head_upper_grid(enc, H[:, 0], [1, 3], control=True)).all()


def test_head_certificate_is_exact_where_one_key_is_left():
    """Two words, key 0 masked: both rows weigh key 1 alone, so a change of word 1 moves both
    rows by ``ΔW_V`` and ``S_1 = ‖x_1‖‖W_V‖₂/‖v_1‖`` exactly (the top singular direction);
    the certificate must equal it up to its rounding allowance (and so is not ``inf``)."""
    head = _synthetic_head(4, 3, seed=2)
    X = torch.randn(2, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    bias = torch.tensor([-math.inf, 0.0], dtype=torch.float64)
    v1 = X[1] @ head.W_V + head.b_V
    exact = float(X[1].norm() * torch.linalg.matrix_norm(head.W_V, ord=2) / v1.norm())
    up = tr.head_certified_upper(head, X, key_bias=bias, rows=[1])[0]
    # the allowance: row 1's distance ‖φ_1 − v_1‖ = 0 is bounded by √(γ_{d+2})·2‖v_1‖
    # (softmax_upper.distances_above), the rest by a relative 2γ
    k = (4 + 2) * 2.0**-53
    e = math.sqrt(k / (1 - k)) * 2 * float(v1.norm())
    omega = exact * float(v1.norm())
    slack = math.sqrt(omega**2 + (omega + e) ** 2) / (math.sqrt(2) * float(v1.norm()))
    assert exact <= up <= slack * (1 + 1e-12)


def test_head_certificate_refuses_bad_input():
    head = _synthetic_head()
    X = torch.randn(5, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="width"):
        tr.head_certified_upper(head, X[:, :4])
    X[2] = 0
    with pytest.raises(ValueError, match="zero"):
        tr.head_certified_upper(head, X)
    X[2, 0] = math.nan
    with pytest.raises(ValueError, match="finite"):
        tr.head_certified_upper(head, X)


def _block_changes(phi, X, i, D):
    """The exact relative change of the block map at each row of ``D`` added to word ``i``."""
    with torch.no_grad():
        base = phi(X[None])[0]
        Xi = X.expand(D.shape[0], *X.shape).clone()
        Xi[:, i] += D
        return (phi(Xi) - base).flatten(1).norm(dim=1) / base.norm()


@pytest.mark.parametrize("layer", [1, 2])
def test_block_certificate_lies_above_every_change_tried(enc, H, layer):
    """prop-block-upper: above the change of random Δ in each word's own ball (and on its
    sphere) and of the search's best Δ, for the model's own block (float64 copy), a trained
    LayerNorm scale (γ not all one) included."""
    mine = _copy_of(enc)
    with torch.no_grad():
        ln = mine.model.encoder.layer[layer - 1].attention.output.LayerNorm
        ln.weight.data.uniform_(0.5, 1.5)
    X = torch.as_tensor(H[layer - 1, 0], dtype=torch.float64)
    phi = tr.block_map(mine, layer)
    up = tr.block_certified_upper(mine, layer, X)
    assert up.shape == (X.shape[0],) and np.isfinite(up).all()
    g = torch.Generator().manual_seed(layer)
    for i in range(X.shape[0]):
        D = torch.randn(300, X.shape[1], generator=g, dtype=torch.float64)
        D *= X[i].norm() / D.norm(dim=1, keepdim=True)
        D[150:] *= torch.rand(150, 1, generator=g, dtype=torch.float64)
        assert float(_block_changes(phi, X, i, D).max()) <= up[i]
    found = tr.own_norm_word_sensitivity(phi, X.numpy(), rows=[0, 3], starts=2, steps=30, seed=0)
    assert found.value <= max(up[0], up[3])
    np.testing.assert_allclose(
        tr.block_certified_upper(mine, layer, X, rows=[3, 0]), up[[3, 0]], rtol=1e-9
    )


def test_block_certificate_is_below_the_layernorm_cap_where_the_heads_move_little(enc, H):
    """Far from saturation the bound is the Lipschitz chain, not the cap ``2√d·max|γ|`` per
    row: with the value weights scaled down the heads move little and the bound is well below
    the cap; there every change tried (random, on the sphere, the search's best), with a
    LayerNorm scale not all one, stays below it, so an error in the heads' terms, ``W_O``, the
    residual or the scale (e.g. ``e_ji`` ten times too small) fails here (the referee's
    mutations of issue 60 passed the saturated test above)."""
    mine = _copy_of(enc)
    with torch.no_grad():
        for lay in mine.model.encoder.layer:
            lay.attention.self.value.weight.data.mul_(0.03)
            lay.attention.output.LayerNorm.weight.data.uniform_(0.5, 1.5)
    X = torch.as_tensor(H[0, 0], dtype=torch.float64)
    phi = tr.block_map(mine, 1)
    up = tr.block_certified_upper(mine, 1, X)
    B = phi(X[None])[0].detach()
    g = float(mine.model.encoder.layer[0].attention.output.LayerNorm.weight.abs().max())
    cap = 2 * g * math.sqrt(X.shape[1]) * math.sqrt(X.shape[0]) / float(B.norm())
    assert (up < 0.6 * cap).all()  # the chain acts: below the cap
    gen = torch.Generator().manual_seed(7)
    for i in range(X.shape[0]):
        D = torch.randn(300, X.shape[1], generator=gen, dtype=torch.float64)
        D *= X[i].norm() / D.norm(dim=1, keepdim=True)
        D[150:] *= torch.rand(150, 1, generator=gen, dtype=torch.float64)
        D[0] = -X[i]  # the word removed
        assert float(_block_changes(phi, X, i, D).max()) <= up[i]
    rows = list(range(X.shape[0]))
    found = tr.own_norm_word_sensitivity(phi, X.numpy(), rows=rows, starts=4, steps=60, seed=1)
    assert found.value <= up.max()
    for r, v in found.per_row.items():
        assert v <= up[r]


def test_block_rows_bound_every_row_of_the_layernorms_input(enc, H):
    """prop-block-upper before the LayerNorm: each row ``j`` of ``Y`` (heads, ``W_O``, residual,
    computed by the model's own modules) moves by at most ``e_ji``, and ``e_ji`` is what the
    heads' terms give (not only the cap): row by row, on random changes and ``Δ = −x_i``, with
    the heads moving much (the fixture) and little (value weights ×0.03). The referee's
    mutation ``e_ji/10`` fails here."""
    from wsutils.trained.layers import _block_rows

    for scale in (1.0, 0.03):
        mine = _copy_of(enc)
        with torch.no_grad():
            mine.model.encoder.layer[0].attention.self.value.weight.data.mul_(scale)
        att = copy.deepcopy(mine.model.encoder.layer[0].attention).double().eval()
        X = torch.as_tensor(H[0, 0], dtype=torch.float64)
        n = X.shape[0]
        heads = [tr.head_weights(mine, 1, h) for h in range(mine.heads)]
        e = _block_rows(mine, 1, heads, X, torch.arange(n))[0]

        def pre_norm(Xs):  # Y = dense(heads) + X, before the block's LayerNorm
            with torch.no_grad():
                return att.output.dense(att.self(Xs)[0]) + Xs

        gen = torch.Generator().manual_seed(11)
        worst = 0.0
        for i in range(n):
            D = torch.randn(200, X.shape[1], generator=gen, dtype=torch.float64)
            D *= X[i].norm() / D.norm(dim=1, keepdim=True)
            D[100:] *= torch.rand(100, 1, generator=gen, dtype=torch.float64)
            D[0] = -X[i]
            Xi = X.expand(len(D), *X.shape).clone()
            Xi[:, i] += D
            moved = (pre_norm(Xi) - pre_norm(X[None])).norm(dim=-1)  # (changes, rows)
            assert (moved <= e[:, i] * (1 + 1e-9)).all()
            worst = max(worst, float((moved / e[:, i]).max()))
        assert worst > 0.1  # the bound is met within a factor 10 somewhere (not vacuous)


def test_block_certificate_refuses_bad_input(enc, H):
    X = torch.as_tensor(H[0, 0], dtype=torch.float64)
    with pytest.raises(ValueError, match="width"):
        tr.block_certified_upper(enc, 1, X[:, :4])
    Y = X.clone()
    Y[1] = 0
    with pytest.raises(ValueError, match="zero"):
        tr.block_certified_upper(enc, 1, Y)
    with pytest.raises(ValueError):
        tr.block_certified_upper(enc, 3, X)  # the fixture has 2 layers
