"""The realisable word sensitivity of the first layer's heads (:prf:ref:`def-realisable-ws`):
every token of the vocabulary at a position, through cached tables
(eq. :eq:`eq-vocab-factored`), one text or many (:mod:`wsutils.trained`).
"""

from __future__ import annotations

import copy
import hashlib
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..checks import check_int
from ..run.device import small_work_threads
from ..text.embeddings import Encoder, load_model, model_key, token_ids
from ..text.token_rows import check_positions
from ._common import _encoder


@dataclass
class VocabularyChanges:
    """What :func:`vocabulary_changes` found at one position ``i`` of one text.

    ``values``: ``(heads, V)`` float64, the relative change of each head of the first layer
    when token ``i`` becomes vocabulary token ``v``; ``dist``: ``(V,)``, ``‖e_v − x_i‖/‖x_i‖``
    (``≤ 1``: the substitution lies in the own-norm ball); ``tokens``: the candidate token
    ids (``V`` of them); ``original``: the token at ``i``; ``seconds``: the wall time of the
    call (``table_seconds`` of it spent making rows of the cached tables, 0 when the
    candidates' rows were made by an earlier call); ``peak_bytes``: the float64 arrays the
    call holds at its largest, counted from
    their shapes (an estimate, not a measurement): the cached tables (``table_bytes``,
    ``_VocabularyTables``) plus one batch's intermediate arrays."""

    position: int
    original: int
    tokens: np.ndarray
    values: np.ndarray
    dist: np.ndarray
    seconds: float
    peak_bytes: int
    table_bytes: int = 0
    table_seconds: float = 0.0


_U64 = 2.0**-53  # float64 unit roundoff


_CANCEL_MAX = 16.0  # above it, a candidate's q, k, v are formed directly (see below)


def _check_embedding_layer(emb, d: int) -> None:
    nn = torch.nn
    ln = getattr(emb, "LayerNorm", None)
    ok = (
        all(
            isinstance(getattr(emb, name, None), nn.Embedding)
            for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")
        )
        and isinstance(ln, nn.LayerNorm)
        and tuple(ln.normalized_shape) == (d,)
        and ln.weight is not None
        and ln.bias is not None
    )
    if not ok:
        raise ValueError(
            f"the model's embedding layer ({type(emb).__name__}) is not BERT's "
            "(word, position and token-type embeddings summed, then a LayerNorm "
            "with weight and bias), which method='factored' relies on: use "
            "vocabulary_changes(..., method='direct')."
        )


class _VocabularyTables:
    """The first layer's ``q, k, v`` of every vocabulary token at any position, for one model
    on one device, float64 (eq. :eq:`eq-vocab-factored`).

    BERT's embedding row of token ``v`` at position ``i`` (segment 0) is
    ``e_{vi} = γ⊙(ŵ_v + ĉ_i)/σ_{vi} + β`` with ``ŵ_v`` the centred word embedding, ``ĉ_i``
    the centred sum of the position-``i`` and segment-0 embeddings, ``γ, β, ε`` the
    LayerNorm's and ``σ_{vi}² = ‖ŵ_v + ĉ_i‖²/d + ε``. So with ``W = [W_Q W_K W_V]`` (all heads,
    ``d × 3d``) and ``b`` their biases, ``e_{vi} W + b = [A_v + (ĉ_i⊙γ) W]/σ_{vi} + βW + b``,
    ``A_v = (ŵ_v⊙γ) W``: the ``V × d × 3d`` product ``A`` is made once, row by row as
    candidates first need it, and serves every position and text; a position then costs
    ``O(V·d)`` for the rows, ``σ_{vi}`` and ``q, k, v``. ``emb64`` is a float64 copy of the
    model's own embedding module (the
    rows of the text itself, the ``direct`` method, and the check of
    :func:`_check_factored`). Rebuilt by :func:`_tables` when the model's parameters change
    (:func:`_is_current`).
    ``nbytes``: the float64 arrays held (the copy, ``W``, and ``A`` in full once set up)."""

    def __init__(self, enc: Encoder, dev: torch.device):
        emb = enc.model.embeddings
        self.dev = dev
        self.emb64 = copy.deepcopy(emb).to(dev, torch.float64).eval()
        self.H, self.dh = enc.heads, enc.hidden // enc.heads
        # the heads' blocks in order, as head_weights slices them: the model's own layout
        W, b = _live_qkv(enc)
        self.W = W.to(dev, torch.float64)  # (d, 3d)
        self.b = b.to(dev, torch.float64)  # (3d,)
        self.A = None
        self.nbytes = 8 * (sum(p.numel() for p in self.emb64.parameters()) + self.W.numel())

    def build(self) -> None:
        """Set up ``A`` (and ``‖ŵ_v‖``) if not yet done; their rows are filled on first use
        (:meth:`fill`), so a search over a subset of the vocabulary pays for that subset."""
        if self.A is not None:
            return
        _check_embedding_layer(self.emb64, self.W.shape[0])
        ln = self.emb64.LayerNorm
        self.gamma, self.beta, self.eps = ln.weight.detach(), ln.bias.detach(), float(ln.eps)
        self.shift = self.beta @ self.W + self.b
        Wd = self.emb64.word_embeddings.weight.detach()
        V = Wd.shape[0]
        self.mean = Wd.mean(1)  # (V,)
        self.A = torch.empty(3 * self.H, V, self.dh, dtype=torch.float64, device=self.dev)
        self.wnorm = torch.empty(V, dtype=torch.float64, device=self.dev)
        self.filled = torch.zeros(V, dtype=torch.bool, device=self.dev)
        self.fill_seconds = 0.0
        self.nbytes += 8 * (self.A.numel() + 2 * V)

    def fill(self, t: torch.Tensor, chunk: int = 4096) -> None:
        """Make the rows ``A_v = (ŵ_v⊙γ) W`` and ``‖ŵ_v‖`` of the tokens ``t`` not made yet."""
        import time

        need = t[~self.filled[t]].unique()
        if len(need) == 0:
            return
        t0 = time.perf_counter()
        Wd = self.emb64.word_embeddings.weight.detach()
        for j in range(0, len(need), chunk):
            c = need[j : j + chunk]
            Wc = Wd[c] - self.mean[c, None]  # ŵ_v
            self.wnorm[c] = torch.linalg.vector_norm(Wc, dim=1)
            self.A[:, c] = self._heads_layout((Wc * self.gamma) @ self.W)  # (3H, c, dh)
        self.filled[need] = True
        self.fill_seconds += time.perf_counter() - t0

    def centred_position(self, position: int) -> torch.Tensor:
        c = (
            self.emb64.position_embeddings.weight.detach()[position]
            + self.emb64.token_type_embeddings.weight.detach()[0]
        )
        return c - c.mean()  # ĉ_i

    def _heads_layout(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, 3d)`` → ``(3·heads, b, d_h)``: ``q`` of head ``h`` is entry ``h``, ``k`` entry
        ``heads + h``, ``v`` entry ``2·heads + h``."""
        return x.reshape(len(x), 3 * self.H, self.dh).transpose(0, 1)

    def factored(self, position: int) -> Callable:
        """``(t, rows, qkv) ↦ None`` at ``position`` by eq. :eq:`eq-vocab-factored`: writes
        the rows ``(b, d)`` and the ``q, k, v`` ``(3·heads, b, d_h)`` of the tokens ``t`` into
        the given buffers (from slices of the tables when ``t`` is a range). A candidate whose
        cancellation ratio ``(‖ŵ_v‖ + ‖ĉ_i‖)/‖ŵ_v + ĉ_i‖`` exceeds ``_CANCEL_MAX`` gets
        ``((ŵ_v + ĉ_i)⊙γ) W`` formed directly instead. Why: the rounding errors of ``A_v``
        and ``(ĉ_i⊙γ)W`` scale with ``‖ŵ_v‖`` and ``‖ĉ_i‖``, the direct product's with
        ``‖ŵ_v + ĉ_i‖``, so the factored
        sum's bound is at most that ratio times the direct one's (first order, as in
        :func:`_check_factored`, whose tolerance carries the parts' sizes and so holds for
        any ratio). ``16`` is a choice, not derived: it gives up at most 4 of float64's 53
        bits against the direct product (on the embedded model, every 97th token at position 3
        has a ratio ``≤ 1.6``: the fallback is for unusual tables)."""
        ch = self.centred_position(position)
        ch_norm = torch.linalg.vector_norm(ch)
        cq = self._heads_layout(((ch * self.gamma) @ self.W)[None])  # (3H, 1, dh)
        shift = self._heads_layout(self.shift[None])
        Wd = self.emb64.word_embeddings.weight.detach()
        d = Wd.shape[1]

        def rows_of(t: torch.Tensor, rows: torch.Tensor, qkv: torch.Tensor) -> None:
            self.fill(t)
            lo, hi = int(t[0]), int(t[-1]) + 1
            span = slice(lo, hi) if hi - lo == len(t) and bool((t[1:] > t[:-1]).all()) else t
            torch.sub(Wd[span], self.mean[span, None], out=rows)
            a = rows.add_(ch)  # ŵ_v + ĉ_i
            a_norm = torch.linalg.vector_norm(a, dim=1, keepdim=True)
            sig = torch.sqrt(a_norm**2 / d + self.eps)  # σ_{vi}
            if isinstance(span, slice):
                torch.add(self.A[:, span], cq, out=qkv)
            else:
                torch.index_select(self.A, 1, t, out=qkv).add_(cq)
            qkv.div_(sig[None]).add_(shift)
            bad = (self.wnorm[span] + ch_norm) > _CANCEL_MAX * a_norm[:, 0]
            if bool(bad.any()):
                qkv[:, bad] = self._heads_layout(
                    (a[bad] * self.gamma) @ self.W / sig[bad] + self.shift
                )
            a.mul_(self.gamma).div_(sig).add_(self.beta)  # the rows

        return rows_of

    def direct(self, position: int) -> Callable:
        """The same at ``position`` the plain way: the float64 copy of the model's own
        embedding module for every candidate, then ``rows W + b`` (``O(d·3d)`` per candidate
        and position)."""

        def rows_of(t: torch.Tensor, rows: torch.Tensor, qkv: torch.Tensor) -> None:
            pos = torch.full((len(t), 1), position, dtype=torch.long, device=self.dev)
            rows.copy_(
                self.emb64(
                    input_ids=t[:, None], position_ids=pos, token_type_ids=torch.zeros_like(pos)
                )[:, 0]
            )
            qkv.copy_(self._heads_layout(rows @ self.W + self.b))

        return rows_of


def _same(live: torch.Tensor, copy64: torch.Tensor, chunk: int = 4096) -> bool:
    """Whether the model's parameter ``live`` equals its cached float64 copy exactly (the copy
    was made by an exact conversion, so any change of ``live`` shows), in row chunks so that
    no full float64 copy of a large table is made."""
    if tuple(live.shape) != tuple(copy64.shape):
        return False
    live = live.detach().reshape(len(live), -1) if live.dim() else live.detach().reshape(1, 1)
    copy64 = copy64.reshape(live.shape)
    return all(
        torch.equal(live[j : j + chunk].to(copy64.device, torch.float64), copy64[j : j + chunk])
        for j in range(0, len(live), chunk)
    )


def _live_qkv(enc: Encoder) -> tuple:
    """The first layer's ``[W_Q W_K W_V]`` (``d × 3d``, all heads in order) and biases, as
    the model holds them now (not copied)."""
    att = enc.model.encoder.layer[0].attention.self
    lins = (att.query, att.key, att.value)
    return (
        torch.cat([lin.weight.detach().T for lin in lins], 1),
        torch.cat([lin.bias.detach() for lin in lins]),
    )


def _is_current(tab: "_VocabularyTables", enc: Encoder) -> bool:
    """Whether ``tab`` still describes ``enc``'s model: every parameter and buffer of its
    embedding module, the LayerNorm's ``ε``, and the first layer's query, key and value
    weights and biases equal the cached float64 copies exactly. Compared at every call
    (``O(V·d)``, no float64 copy of a whole table), so changes made in place in any way
    (``p.add_``, ``p.data.add_``, ``load_state_dict``, ``model.to``) are seen; only changes
    that leave these tensors and ``ε`` unchanged but alter the modules' code are not."""
    emb, emb64 = enc.model.embeddings, tab.emb64
    live = dict(emb.named_parameters()) | dict(emb.named_buffers())
    held = dict(emb64.named_parameters()) | dict(emb64.named_buffers())
    if type(emb) is not type(emb64) or live.keys() != held.keys():
        return False
    if getattr(getattr(emb, "LayerNorm", None), "eps", None) != getattr(
        getattr(emb64, "LayerNorm", None), "eps", None
    ):
        return False
    for name, p in live.items():
        q = held[name]
        if p.is_floating_point():
            if not _same(p, q):
                return False
        elif not torch.equal(p.detach().to(q.device), q):
            return False
    W, b = _live_qkv(enc)
    return _same(W.T, tab.W.T) and _same(b, tab.b)


_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tables(enc: Encoder, dev: torch.device) -> _VocabularyTables:
    """The :class:`_VocabularyTables` of ``enc``'s model on ``dev``, cached (one per model,
    keyed by the model object itself through a weak reference: the entry goes when the model
    is freed, and a new model never finds an old model's tables). Rebuilt when
    :func:`_is_current` finds the embedding module or the first layer's ``W_Q, W_K, W_V``
    changed, or when ``dev`` differs."""
    att = getattr(
        getattr(getattr(enc.model, "encoder", None), "layer", [None])[0], "attention", None
    )
    if not (
        hasattr(enc.model, "embeddings")
        and all(
            isinstance(getattr(getattr(att, "self", None), w, None), torch.nn.Linear)
            for w in ("query", "key", "value")
        )
    ):
        raise ValueError(
            f"vocabulary_changes needs a BERT-family model (an `embeddings` "
            f"module and encoder.layer[0].attention.self.query/key/value), got "
            f"{type(enc.model).__name__}; neither method applies to it."
        )
    tab = _TABLES.get(enc.model)
    if tab is None or tab.dev != dev or not _is_current(tab, enc):
        _TABLES.pop(enc.model, None)
        tab = _TABLES[enc.model] = _VocabularyTables(enc, dev)
    return tab


def free_vocabulary_tables(enc=None) -> int:
    """Free the tables that :func:`vocabulary_changes` caches (for ``enc``'s model, or for
    every model when ``enc`` is None) and return the bytes they held. They are otherwise held
    as long as their model lives, and :func:`wsutils.text.embeddings.load_model` keeps the models
    it loads for the whole process: about ``8·(V·3d + (V + P + T)·d + 3d²)`` bytes per model
    (``P`` positions, ``T`` segments; 0.72 GiB for ``bert-base-uncased``, 0.35 GiB for the
    embedded model)."""
    if enc is None:
        freed = sum(t.nbytes for t in _TABLES.values())
        _TABLES.clear()
        return int(freed)
    tab = _TABLES.pop(_encoder(enc).model, None)
    return 0 if tab is None else int(tab.nbytes)


def _check_factored(tab: _VocabularyTables, rows, t: torch.Tensor, position: int) -> None:
    """The guard of eq. :eq:`eq-vocab-factored`: for the candidates ``t``, its rows and
    ``q, k, v`` against the model's own embedding module (float64 copy) and ``rows W + b``.

    Rounding model (first order in the unit roundoff ``u``; Higham's bound for a sum of ``m``
    terms, error ``≤ m·u·Σ|terms|``): with ``s = max_k(|w_k| + |p_k| + |t_k|)`` for the row's
    word, position and segment embeddings and ``r = s/σ``, each of the two evaluations of a
    LayerNorm row has its centred sum within ``(d + 6)·u·s``, ``σ`` within relative
    ``(d + 6)·u·(r + 1)`` (using ``mean|â| ≤ σ``), hence every entry within
    ``(d + 9)·u·(‖γ‖_∞·r·(3 + 2r) + ‖β‖_∞)`` of the exact value; the two differ by at most
    twice that (``tol``). Their products with ``W`` then differ by at most ``tol·Σ_k|W_km|``
    plus twice the dot-product bound ``(d + 4)·u·(|terms|·|W|)``. A model whose embedding
    layer is not of this form misses by far more (e.g. a different ``ε`` or a missing
    segment embedding moves rows by ``≳ 10⁻⁶``)."""
    Wd = tab.emb64.word_embeddings.weight.detach()
    d = Wd.shape[1]
    p = tab.emb64.position_embeddings.weight.detach()[position]
    s0 = tab.emb64.token_type_embeddings.weight.detach()[0]
    r_f, r_m = (torch.empty(len(t), d, dtype=torch.float64, device=tab.dev) for _ in "fm")
    qkv_f, qkv_m = (
        torch.empty(3 * tab.H, len(t), tab.dh, dtype=torch.float64, device=tab.dev) for _ in "fm"
    )
    rows(t, r_f, qkv_f)
    tab.direct(position)(t, r_m, qkv_m)
    w = Wd[t]
    s = (w.abs() + p.abs() + s0.abs()).amax(1, keepdim=True)
    w_c, c_c = w - w.mean(1, keepdim=True), tab.centred_position(position)  # ŵ_v, ĉ_i
    a = w_c + c_c
    sig = torch.sqrt((a * a).mean(1, keepdim=True) + tab.eps)
    r = s / sig
    tol = 2 * (d + 9) * _U64 * (tab.gamma.abs().max() * r * (3 + 2 * r) + tab.beta.abs().max())
    Wabs = tab.W.abs()
    parts = w_c.abs() + c_c.abs()
    tol_qkv = tol * Wabs.sum(0) + 2 * (d + 4) * _U64 * (
        (parts * tab.gamma.abs() / sig + tab.beta.abs() + r_m.abs()) @ Wabs + tab.b.abs()
    )
    tol_qkv = tab._heads_layout(tol_qkv)
    if not (
        bool(((r_f - r_m).abs() <= tol).all()) and bool(((qkv_f - qkv_m).abs() <= tol_qkv).all())
    ):
        worst = (
            float(((r_f - r_m).abs() / tol).max()),
            float(((qkv_f - qkv_m).abs() / tol_qkv).max()),
        )
        raise ValueError(
            "the model's embedding layer does not compute "
            "LayerNorm(word + position + segment) row by row as "
            f"method='factored' assumes (rows off by {worst[0]:.3g}, q, k, v by "
            f"{worst[1]:.3g} times their rounding bounds): use "
            "vocabulary_changes(..., method='direct')."
        )


def vocabulary_changes(
    enc,
    input_ids,
    position: int,
    *,
    tokens=None,
    batch: int = 2048,
    method: str = "factored",
    device=None,
) -> VocabularyChanges:
    """The realisable word sensitivity of the heads of the first layer at one position
    (:prf:ref:`def-realisable-ws`): for each candidate token ``v`` (default: the whole
    vocabulary but the token already there), replace token ``position`` of ``input_ids``
    (one text, ``[CLS]``…``[SEP]``, no padding, segment 0) by ``v`` through the model's own
    embedding layer and record ``‖φ_h(X') − φ_h(X)‖/‖φ_h(X)‖`` for every head ``h`` of
    layer 1 (:func:`head_map`), in float64: ``X`` is the float64 copy of the model's
    embedding module applied to the text.

    Exact, not a bound: the embedding output is per position, so ``X'`` is ``X`` with row
    ``position`` replaced, and only ``q_i, k_i, v_i`` change. A candidate's ``q_i, k_i, v_i``:
    ``method="factored"`` (default) by eq. :eq:`eq-vocab-factored` from tables made once per
    model (``_VocabularyTables``, ``O(V·d·3d)`` once, then ``O(d)`` per candidate,
    checked at every call against the model's own module for the token already there and up
    to 7 candidates, with a tolerance derived from float64 rounding
    (``_check_factored``); ``method="direct"``: each candidate's row
    through the float64 copy of the model's embedding module, then times ``W_Q, W_K, W_V``
    (``O(d²)`` per candidate and position; the baseline of ``benchmarks/bench_trained.py``).
    The two agree to float64 rounding. Both read the model through tables cached per model
    (``_tables``): compared exactly with the model's parameters at every call and rebuilt if
    any changed; they hold ``table_bytes`` (``8·V·3d`` for ``A`` plus the float64 copy of
    the embedding module and ``W``: 0.72 GiB for ``bert-base-uncased``) as long as the model
    lives, which for a model from :func:`wsutils.text.embeddings.load_model` is the process:
    :func:`free_vocabulary_tables` frees them. Then the scores of row and column ``i``
    (``O(n·d)`` per candidate): every other output row ``j`` moves by
    ``(ρ' − ρ)(m_j − v_i) + (1 − ρ')(v'_i − v_i)`` with ``m_j`` the mean of the other values
    under row ``j``'s weights and ``ρ``, ``ρ'`` their total weight before and after, as in
    :mod:`wsutils.estimators.self_attention`; batched over ``batch`` candidates.

    Raises
    ------
    TypeError
        If ``input_ids`` or ``tokens`` holds non-integer ids (a float id is not rounded, a
        bool is not an id).
    ValueError
        If the text is longer than the model's ``max_position_embeddings``, ``position`` is
        not below its length, ``tokens`` is empty or outside the vocabulary, ``method`` is
        unknown, or the model's embedding layer is not BERT's (see ``method``)."""
    import time

    enc = _encoder(enc)
    if method not in ("factored", "direct"):
        raise ValueError(f"method must be 'factored' or 'direct', got {method!r}.")
    dev = torch.device(device) if device is not None else enc.device
    V = enc.vocab_size
    ids = token_ids("input_ids", input_ids, dev, vocab=V)
    n = len(ids)
    enc.check_length(n)
    position = check_int("position", position, minimum=0)
    if position >= n:
        raise ValueError(f"position must be below n = {n}, got {position}.")
    batch = check_int("batch", batch, minimum=1)
    if tokens is None:
        tokens = torch.arange(V)
        tokens = tokens[tokens != int(ids[position])]
    tokens = token_ids("tokens", tokens, vocab=V)
    t0 = time.perf_counter()
    f64 = torch.float64
    tab = _tables(enc, dev)
    i, H, dh, d = position, tab.H, tab.dh, enc.hidden
    if method == "factored":
        with torch.no_grad():  # the table rows first: (4096 × d)(d × 3d) products, threaded
            tab.build()
            filled = tab.fill_seconds
            tab.fill(tokens.to(dev))
    # one batch's largest arrays are (heads, batch, n): below ~4M entries every operation is
    # short, and with two threads on a loaded machine each one waits for the other (measured
    # on the embedded model, n = 32: 5.6 s per position with 2 threads, 1.4 s with 1)
    with torch.no_grad(), small_work_threads(H * min(batch, len(tokens)) * max(n, dh)):
        if method == "factored":
            rows_of = tab.factored(i)
            guard = torch.cat(
                [
                    ids[i : i + 1],
                    tokens[torch.linspace(0, len(tokens) - 1, min(7, len(tokens))).long()].to(dev),
                ]
            )
            _check_factored(tab, rows_of, guard, i)
        else:
            rows_of = tab.direct(i)
        # the candidates' rows are made with position_ids = i (tests/test_token_rows.py)
        X = check_positions(tab.emb64, ids, "vocabulary_changes")
        Q, K, Vv = tab._heads_layout(X @ tab.W + tab.b).split(H)  # (H, n, dh)
        sc = 1 / math.sqrt(dh)
        s = Q @ K.transpose(-1, -2) * sc  # (H, n, n)
        base = torch.softmax(s, -1) @ Vv  # (H, n, dh)
        base_norm = torch.linalg.vector_norm(base.flatten(1), dim=1)[:, None]  # (H, 1)
        xi_norm = torch.linalg.vector_norm(X[i])
        # rows j ≠ i: m_j, the mean of the other values under row j's weights (formed
        # directly, no cancellation), ℓ_j = log Σ_{k≠i} exp s_jk, and ‖m_j − v_i‖²
        s_oth = s.clone()
        s_oth[..., i] = -math.inf
        lse = torch.logsumexp(s_oth, -1)[:, None]  # (H, 1, n)
        Mv = torch.softmax(s_oth, -1) @ Vv - Vv[:, i : i + 1]  # m_j − v_i
        Mv2 = (Mv**2).sum(-1)[:, None]  # (H, 1, n)
        b_arg = lse - s[:, None, :, i]  # ρ = σ(b)
        rho, rho_c = torch.sigmoid(b_arg), torch.sigmoid(-b_arg)  # ρ, 1 − ρ
        Qs_T, Ks_T, Mv_T = (x.transpose(1, 2) for x in (Q * sc, K * sc, Mv))
        base_i = base[:, i : i + 1]
        values = torch.empty(H, len(tokens), dtype=f64, device=dev)
        dist = torch.empty(len(tokens), dtype=f64, device=dev)
        work: dict[int, tuple] = {}  # the arrays of one batch, made once per batch size
        for j in range(0, len(tokens), batch):
            t = tokens[j : j + batch].to(dev)
            b = len(t)
            if b not in work:
                work[b] = (
                    torch.empty(b, d, dtype=f64, device=dev),  # rows
                    torch.empty(3 * H, b, dh, dtype=f64, device=dev),  # q, k, v
                    *(torch.empty(H, b, dh, dtype=f64, device=dev) for _ in "do"),
                    *(torch.empty(H, b, n, dtype=f64, device=dev) for _ in "agct"),
                )
            rows, qkv, dv, out_i, a_arg, g, cross, sm = work[b]
            rows_of(t, rows, qkv)  # (b, d), (3H, b, dh)
            q, k, v = qkv.split(H)  # (H, b, dh)
            torch.sub(v, Vv[:, i : i + 1], out=dv)  # v'_i − v_i
            # rows j ≠ i: a = ℓ_j − s'_ji, ρ' = σ(a); ρ' − ρ = σ(a)(1 − ρ) − ρ σ(−a)
            torch.baddbmm(lse, k, Qs_T, alpha=-1, out=a_arg)  # (H, b, n)
            torch.sigmoid(a_arg, out=g).mul_(rho_c)
            w = a_arg.neg_().sigmoid_()  # 1 − ρ'
            g.addcmul_(w, rho, value=-1)  # ρ' − ρ
            torch.bmm(dv, Mv_T, out=cross)  # (m_j − v_i)·dv
            sq = cross.mul_(w).mul_(2).addcmul_(g, Mv2).mul_(g)  # g²‖·‖² + 2gw(·)
            sq.addcmul_(w.mul_(w), (dv * dv).sum(-1, keepdim=True))  # + w²‖dv‖²
            sq[..., i] = 0
            sq = sq.sum(-1)  # (H, b): j ≠ i
            # row i: the new query against the new keys, then its new output
            torch.bmm(q, Ks_T, out=sm)  # (H, b, n)
            sm[..., i] = (q * k).sum(-1) * sc
            sm.sub_(sm.amax(-1, keepdim=True)).exp_()
            sm.div_(sm.sum(-1, keepdim=True))  # softmax
            torch.bmm(sm, Vv, out=out_i).addcmul_(sm[..., i : i + 1], dv).sub_(base_i)
            sq += out_i.mul_(out_i).sum(-1)
            torch.div(sq.clamp_min_(0).sqrt_(), base_norm, out=values[:, j : j + b])
            torch.div(
                torch.linalg.vector_norm(rows.sub_(X[i]), dim=-1), xi_norm, out=dist[j : j + b]
            )
        # one batch's arrays: rows, q, k, v, dv, out_i and two temporaries (dv², q·k): 8·b·d;
        # a, g, cross, e: 4·b·heads·n; direct: the module's temporaries too (its gather, two
        # sums, LayerNorm, rows·W: 7·b·d)
        B = min(batch, len(tokens))
        peak = 8 * ((8 if method == "factored" else 15) * B * d + 4 * B * H * n)
    return VocabularyChanges(
        position=position,
        original=int(ids[position]),
        tokens=tokens.numpy(),
        values=values.cpu().numpy(),
        dist=dist.cpu().numpy(),
        seconds=time.perf_counter() - t0,
        peak_bytes=int(tab.nbytes + peak),
        table_bytes=int(tab.nbytes),
        table_seconds=tab.fill_seconds - filled if method == "factored" else 0.0,
    )


def _encoder_digest(enc: Encoder) -> str:
    """One SHA-256 of :func:`wsutils.text.embeddings.model_key` (configuration, tokenizer and
    live parameters): what a worker's copy of the model must match."""
    import json

    return hashlib.sha256(json.dumps(model_key(enc), sort_keys=True).encode()).hexdigest()


def _review_vocabulary(
    model,
    text: str,
    n: int,
    positions: Sequence[int],
    tokens,
    batch: int,
    digest: str | None = None,
) -> tuple[list, list, float]:
    """One text of :func:`vocabulary_search` (module level, so that a process pool can run
    it; ``model``: the Encoder, or its name in a worker): its ids, one
    :class:`VocabularyChanges` per position, and this call's CPU time. ``digest``: the
    caller's :func:`_encoder_digest`; a worker whose model differs refuses (``O(parameters)``
    once per text)."""
    import time

    c0 = time.process_time()
    enc = _encoder(model)
    if digest is not None and _encoder_digest(enc) != digest:
        raise ValueError(
            f"this worker's copy of {enc.name} differs from the caller's model (its "
            "parameters, configuration or tokenizer were changed in memory after "
            "the workers loaded it from disk or forked): pass executor=None, or "
            "save the changed model with save_pretrained and load that folder, "
            "then make a new pool."
        )
    ids = enc.tokenizer(text, truncation=True, max_length=n)["input_ids"]
    if len(ids) != n:
        raise ValueError(
            f"a text has {len(ids)} tokens, fewer than n = {n}: pass texts of at "
            f"least n − 2 WordPiece tokens."
        )
    out = []
    for i in positions:
        tok = None if tokens is None else tokens[tokens != ids[i]]
        out.append(vocabulary_changes(enc, ids, i, tokens=tok, batch=batch))
    return ids, out, time.process_time() - c0


#: Texts of a :func:`vocabulary_search` that failed part-way (a killed pool worker, an
#: interrupt), keyed by everything that determines them (:func:`_text_key`), so that a rerun
#: resumes; an entry goes when a rerun uses it.
_FINISHED_CACHE: dict[str, tuple] = {}


def _text_key(digest: str, text: str, n: int, positions, tokens, batch: int) -> str:
    h = hashlib.sha256()
    for part in (digest, text, str(n), repr(list(positions)), str(batch)):
        b = part.encode()
        h.update(len(b).to_bytes(8, "little") + b)
    h.update(b"none" if tokens is None else np.ascontiguousarray(tokens, np.int64).tobytes())
    return h.hexdigest()


def vocabulary_search(
    enc,
    texts: Sequence[str],
    n: int,
    positions: Sequence[int],
    *,
    tokens=None,
    batch: int = 2048,
    executor=None,
) -> tuple[list, float]:
    """:func:`vocabulary_changes` at each of ``positions`` of each text of ``texts``, cut to
    ``n`` tokens by the model's tokenizer (``[CLS]`` … ``[SEP]``; a shorter text is a
    ``ValueError``): the realisable word sensitivity's search over a set of review-positions
    (:prf:ref:`def-realisable-ws`). ``tokens``: the candidate ids (at each position the token
    already there is left out), or ``None`` for the whole vocabulary.

    ``executor``: a ``concurrent.futures`` process pool (e.g. of one-thread workers) over
    which the texts are spread; each worker reads the model by its name
    (:func:`wsutils.text.embeddings.load_model`: inherited from this process under ``fork``,
    loaded once per worker otherwise) and holds its own copy of the tables. Each worker
    checks that its model is the caller's (:func:`wsutils.text.embeddings.model_key`: the live
    parameters, configuration and tokenizer; ``O(parameters)`` per text) and refuses
    otherwise, so pooled and in-process results are the same numbers.

    Resuming. If the call fails part-way (a killed worker: ``BrokenProcessPool``; an
    interrupt), the texts already finished are kept in this process, keyed by the model's
    digest, the text, ``n``, ``positions``, ``tokens`` and ``batch``, and the error says how
    many: the same call again (with a new pool, or none) computes only the others.

    Returns ``[(text index, ids, VocabularyChanges), …]`` in the order (text, position), the
    same with or without an executor, and the CPU seconds of the calls (``process_time``
    summed over the calls: the processes' CPU time with a process pool; a thread pool would
    count a process's time once per thread; a resumed text counts its first run's).

    Raises
    ------
    TypeError
        If ``tokens`` holds non-integer ids (``10.7`` is not rounded to 10).
    ValueError
        If ``texts`` or ``positions`` is empty, a position is not below ``n``, ``n`` exceeds
        the model's ``max_position_embeddings``, a text has fewer than ``n`` tokens, the
        executor's workers cannot load ``enc`` by its name (not from ``load_model``), or a
        worker's copy of the model differs from ``enc`` (changed in memory).
    concurrent.futures.process.BrokenProcessPool
        If a worker died; the message says how many texts were kept for the rerun.
    """
    enc = _encoder(enc)
    n = check_int("n", n, minimum=3)
    positions = [check_int("positions[]", i, minimum=0) for i in positions]
    if not texts or not positions or max(positions) >= n:
        raise ValueError(f"pass at least one text and positions in [0, {n}).")
    enc.check_length(n)
    if tokens is not None:
        tokens = token_ids("tokens", tokens, vocab=enc.vocab_size).numpy()
    texts = list(texts)
    digest = _encoder_digest(enc)
    keys = [_text_key(digest, t, n, positions, tokens, batch) for t in texts]
    done: dict[int, tuple] = {
        r: _FINISHED_CACHE[k] for r, k in enumerate(keys) if k in _FINISHED_CACHE
    }
    todo = [r for r in range(len(texts)) if r not in done]
    if executor is not None:
        try:
            same = load_model(enc.name) is enc
        except (OSError, RuntimeError, ValueError):  # the name loads nothing
            same = False
        if not same:
            raise ValueError(
                "with an executor, the workers load the model by its name: pass "
                "the Encoder that wsutils.text.embeddings.load_model returned for it "
                "(not, e.g., a random_model), or executor=None."
            )
    try:
        if executor is None:
            for r in todo:
                done[r] = _review_vocabulary(enc, texts[r], n, positions, tokens, batch)
        else:
            from concurrent.futures import as_completed

            futures = {
                executor.submit(
                    _review_vocabulary, enc.name, texts[r], n, positions, tokens, batch, digest
                ): r
                for r in todo
            }
            try:
                for fut in as_completed(futures):
                    done[futures[fut]] = fut.result()
            finally:
                for fut in futures:
                    fut.cancel()
    except BaseException as err:
        for r, res in done.items():
            _FINISHED_CACHE[keys[r]] = res
        kept = f"{len(done)} of {len(texts)} texts finished and kept: the same call resumes"
        from concurrent.futures.process import BrokenProcessPool

        if isinstance(err, BrokenProcessPool):
            raise BrokenProcessPool(f"{err} ({kept} with a new pool or executor=None).") from err
        if hasattr(err, "add_note"):
            err.add_note(f"vocabulary_search: {kept}.")
        raise
    for k in keys:
        _FINISHED_CACHE.pop(k, None)
    found = [(r, done[r][0], vc) for r in range(len(texts)) for vc in done[r][1]]
    return found, float(sum(done[r][2] for r in range(len(texts))))
