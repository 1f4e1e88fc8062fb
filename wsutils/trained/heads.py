"""One attention head of a trained model: its weights, a random control, its map
(eq. :eq:`eq-trained-head`), the own-norm search with a rank-one update, one head or many, and
its upper certificate (:prf:ref:`prop-head-upper`) (:mod:`wsutils.trained`).

The certificate is :prf:ref:`prop-softmax-upper` with the head's own maps: a row ``j ≠ i``
changes only through its weight on key ``i`` (whose score moves by at most
``‖x_i‖‖W_K q_j‖/√d_h``) and through the changed value ``v_i + ΔW_V`` (``‖ΔW_V‖ ≤
‖x_i‖‖W_V‖₂``); row ``i`` stays in the hull of the values. Masked keys (``key_bias`` ``−inf``)
carry no weight before or after the change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from .._tensor import Array
from ..checks import check_int, check_rows, check_seed
from ..estimators.softmax_upper import distances_above, float_sum_rounding, row_spread
from ..search import Search
from ..sensitivity import SensitivityResult, ascend_and_certify, ascend_rows, certify, search_setup
from ._common import Map, _encoder, _layer_index
from .own_norm import OWN_NORM_SEARCH, _to_x, own_norm_problem


@dataclass(frozen=True)
class Head:
    """One attention head: ``W_Q``, ``W_K``, ``W_V`` (``d × d_h``), their biases (``d_h``), and
    its block ``W_O`` (``d_h × d``) of the output projection (whose bias the block adds once,
    not per head). Float64 tensors on the CPU. ``layer`` counts from 1, ``head`` from 0."""

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    b_Q: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    W_O: torch.Tensor
    layer: int
    head: int

    @property
    def d(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def d_h(self) -> int:
        return int(self.W_Q.shape[1])

    def qk_norm(self) -> float:
        """``‖W_Q W_Kᵀ‖_F``."""
        return float(torch.linalg.matrix_norm(self.W_Q @ self.W_K.T))


def _check_width(X: torch.Tensor, heads: Sequence[Head]) -> None:
    """A ValueError unless the width of the text ``X`` is every head's ``d``."""
    widths = sorted({h.d for h in heads})
    if widths != [X.shape[1]]:
        raise ValueError(
            f"X has width {X.shape[1]}, but the heads take width {', '.join(map(str, widths))}: "
            "pass the inputs of their layer (wsutils.trained.layers.layer_inputs)."
        )


def head_weights(enc, layer: int, head: int) -> Head:
    """The weights of head ``head`` (from 0) of layer ``layer`` (from 1), read from the model's
    own ``nn.Linear`` modules: ``query``/``key``/``value`` compute ``x Wᵀ + b`` with ``W`` of
    shape ``(heads·d_h, d)``, so ``W_Q`` is the transpose of the head's block of rows;
    ``attention.output.dense`` gives ``W_O`` (the head's block of columns, transposed)."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    head = check_int("head", head, minimum=0)
    if head >= enc.heads:
        raise ValueError(f"head must be between 0 and {enc.heads - 1}, got {head}.")
    att = enc.model.encoder.layer[layer - 1].attention
    dh = enc.hidden // enc.heads
    rows = slice(head * dh, (head + 1) * dh)

    def take(lin):
        W = lin.weight.detach()[rows].T.to("cpu", torch.float64).clone()
        b = lin.bias.detach()[rows].to("cpu", torch.float64).clone()
        return W, b

    (WQ, bQ), (WK, bK), (WV, bV) = (take(att.self.query), take(att.self.key), take(att.self.value))
    WO = att.output.dense.weight.detach()[:, rows].T.to("cpu", torch.float64).clone()
    return Head(W_Q=WQ, W_K=WK, W_V=WV, b_Q=bQ, b_K=bK, b_V=bV, W_O=WO, layer=layer, head=head)


def random_head(head: Head, *, seed: int) -> Head:
    """A random head of the same shapes (the control of the chapter ``trained-attention``):
    ``W_Q``, ``W_K``, ``W_V`` with i.i.d. normal entries, ``W_Q`` and ``W_K`` rescaled by one
    common factor so that ``‖W_Q W_Kᵀ‖_F`` equals the trained head's, ``W_V`` rescaled to the
    trained ``‖W_V‖_F``; no biases. Seeded."""
    seed = check_seed(seed)
    g = torch.Generator().manual_seed(seed)
    d, dh = head.d, head.d_h
    WQ, WK, WV = (torch.randn(d, dh, generator=g, dtype=torch.float64) for _ in range(3))
    c = math.sqrt(head.qk_norm() / float(torch.linalg.matrix_norm(WQ @ WK.T)))
    WV = WV * (float(torch.linalg.matrix_norm(head.W_V)) / float(torch.linalg.matrix_norm(WV)))
    z = torch.zeros(dh, dtype=torch.float64)
    return Head(
        W_Q=c * WQ,
        W_K=c * WK,
        W_V=WV,
        b_Q=z,
        b_K=z.clone(),
        b_V=z.clone(),
        W_O=head.W_O.clone(),
        layer=head.layer,
        head=head.head,
    )


def _qkv(head: Head, X: torch.Tensor):
    WQ, WK, WV, bQ, bK, bV = (
        t.to(dtype=X.dtype, device=X.device)
        for t in (head.W_Q, head.W_K, head.W_V, head.b_Q, head.b_K, head.b_V)
    )
    return X @ WQ + bQ, X @ WK + bK, X @ WV + bV


def check_key_bias(key_bias, n: int) -> torch.Tensor | None:
    """``key_bias`` as a float64 tensor of shape ``(n,)``, or ``None``: a logit added to every
    query's score on each key (``−inf`` masks a key: the head "with its sink removed" of
    chapter *attention-sink*). NaN, ``+inf``, a wrong shape and a bias that masks every key
    are refused."""
    if key_bias is None:
        return None
    b = torch.as_tensor(np.asarray(key_bias, dtype=np.float64))
    if b.shape != (n,):
        raise ValueError(
            f"key_bias must have shape ({n},), one logit per key, got {tuple(b.shape)}."
        )
    if bool(torch.isnan(b).any()) or bool((b == math.inf).any()):
        raise ValueError("key_bias holds NaN or +inf: pass finite logits, or -inf to mask a key.")
    if not bool(torch.isfinite(b).any()):
        raise ValueError("key_bias masks every key: leave at least one key unmasked.")
    return b


def head_map(head: Head, key_bias=None) -> Map:
    """The trained head as a map (eq. :eq:`eq-trained-head`):
    ``φ(X) = softmax((X W_Q + b_Q)(X W_K + b_K)ᵀ/√d_h + β)(X W_V + b_V)``,
    ``(…, n, d) → (…, n, d_h)``, in the dtype of ``X``: the head's slice of
    ``attention.self``'s output. ``key_bias`` ``β`` (``(n,)``, default none): a logit added to
    every query's score on each key (:func:`check_key_bias`; ``−inf`` masks a key)."""
    bias = None if key_bias is None else torch.as_tensor(key_bias)

    def phi(X: torch.Tensor) -> torch.Tensor:
        Q, K, V = _qkv(head, X)
        return _weights(head, Q, K, bias) @ V

    return phi


def _weights(head: Head, Q: torch.Tensor, K: torch.Tensor, bias) -> torch.Tensor:
    """``softmax(Q Kᵀ/√d_h + β)``, the weights of :func:`head_map` (``β`` a logit per key or
    ``None``)."""
    s = (
        Q @ K.transpose(-1, -2) * (1 / math.sqrt(head.d_h))
    )  # 1/√d_h as a factor, as _HeadObjective
    return torch.softmax(s if bias is None else s + bias.to(s), dim=-1)


def head_attention(head: Head, X: Array, key_bias=None) -> torch.Tensor:
    """The attention weights of :func:`head_map` at one text ``X`` (``n × d``), float64
    ``n × n``: row ``j`` is query ``j``'s weights over the keys (``key_bias`` as in
    :func:`head_map`)."""
    Xt = torch.as_tensor(np.asarray(X, dtype=np.float64))
    if Xt.ndim != 2:
        raise ValueError(f"X must be one text (n, d), got shape {tuple(Xt.shape)}.")
    _check_width(Xt, [head])
    Q, K, _ = _qkv(head, Xt)
    return _weights(head, Q, K, check_key_bias(key_bias, Xt.shape[0]))


class _HeadObjective:
    """Relative change of one head for a batch of (row, Δ') in the own-norm coordinates,
    by a rank-one update: only ``q_i``, ``k_i``, ``v_i`` change."""

    def __init__(self, head: Head, X: torch.Tensor, r: torch.Tensor):
        self.X, self.r = X, r.to(X.dtype)[:, 0]
        self.WQ, self.WK, self.WV = (t.to(X) for t in (head.W_Q, head.W_K, head.W_V))
        self.scale = 1 / math.sqrt(head.d_h)
        with torch.no_grad():
            self.Q, self.K, self.V = _qkv(head, X)
            self.base = torch.softmax(self.Q @ self.K.T * self.scale, -1) @ self.V
            self.base_norm = float(torch.linalg.vector_norm(self.base))

    def __call__(self, row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        n = self.X.shape[0]
        D = Delta * self.r[row_idx][:, None]  # Δ in X's coordinates
        one = torch.nn.functional.one_hot(row_idx, n).to(D.dtype)[:, :, None]
        Q = self.Q + one * (D @ self.WQ)[:, None]
        K = self.K + one * (D @ self.WK)[:, None]
        V = self.V + one * (D @ self.WV)[:, None]
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale, -1) @ V
        diff = (out - self.base).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm


#: The search of all the heads of a layer at once (:func:`heads_word_sensitivity`) by default.
HEADS_SEARCH = Search(starts=2, steps=20, dtype="float32")


def head_word_sensitivity(
    head: Head,
    X: Array,
    *,
    rows=None,
    search: Search | dict | None = None,
    device=None,
    **settings,
) -> SensitivityResult:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of one head (:func:`head_map`) at ``X``: the
    search of :func:`wsutils.sensitivity.word_sensitivity` (same starts from ``seed``, same
    steps, best iterate kept; so the same answer as :func:`own_norm_word_sensitivity` up to
    rounding), with ``q_i, k_i, v_i`` updated in place of recomputing ``X W_Q`` … for every
    start and step. Every reported value is recomputed with :func:`head_map` in float64;
    ``Delta`` is in the coordinates of ``X``. ``search`` (default
    ``OWN_NORM_SEARCH``, float32)
    and ``settings`` (its fields as keywords) as in
    :func:`wsutils.sensitivity.word_sensitivity`. ``upper``/``per_row_upper``: the upper
    certificate of :prf:ref:`prop-head-upper` at every searched row
    (:func:`wsutils.trained.head_certified_upper`), so the result is a bracket."""
    search = Search.parse(search, default=OWN_NORM_SEARCH, **settings)
    Z, phi_Z, r = own_norm_problem(head_map(head), X, device=device)
    _check_width(Z, [head])
    Zs, row_list, _ = search_setup(
        Z.to(search.work_dtype(Z.dtype)), rows=rows, check_norms=False, device=device
    )
    obj = _HeadObjective(head, (Zs * r.to(Zs)), r.to(Zs))
    if not obj.base_norm > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and head.")
    # searched on the rounded copy Zs, certified at X itself in float64
    res = ascend_and_certify(lambda chunk: obj, phi_Z, Zs, Z.to(Zs.device), row_list, search)
    X64 = torch.as_tensor(X).detach().to("cpu", torch.float64)  # the bracket at X itself
    bounds = head_certified_upper(head, X64, rows=row_list)
    return _to_x(res, r).with_upper(dict(zip(row_list, bounds.tolist())))


class _HeadsObjective:
    """:class:`_HeadObjective` for several heads at once: search index ``k`` is head
    ``k // n``, row ``k % n`` (one batch for all the heads of a layer)."""

    def __init__(self, heads: Sequence[Head], X: torch.Tensor, r: torch.Tensor, key_bias=None):
        self.n = X.shape[0]
        self.r = r.to(X.dtype)[:, 0]
        self.bias = 0 if key_bias is None else key_bias.to(X)  # (n,): a logit per key

        def stack(name):
            return torch.stack([getattr(h, name) for h in heads]).to(X)

        self.WQ, self.WK, self.WV = stack("W_Q"), stack("W_K"), stack("W_V")  # (H, d, dh)
        self.scale = 1 / math.sqrt(heads[0].d_h)
        with torch.no_grad():
            self.Q = X @ self.WQ + stack("b_Q")[:, None]  # (H, n, dh)
            self.K = X @ self.WK + stack("b_K")[:, None]
            self.V = X @ self.WV + stack("b_V")[:, None]
            s = self.Q @ self.K.transpose(-1, -2) * self.scale + self.bias
            self.base = torch.softmax(s, -1) @ self.V
            self.base_norm = torch.linalg.vector_norm(self.base.flatten(1), dim=1)  # (H,)

    def __call__(self, idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        h, i = idx // self.n, idx % self.n
        D = (Delta * self.r[i][:, None])[:, None]  # (B, 1, d)
        one = torch.nn.functional.one_hot(i, self.n).to(Delta.dtype)[:, :, None]
        Q = self.Q[h] + one * (D @ self.WQ[h])
        K = self.K[h] + one * (D @ self.WK[h])
        V = self.V[h] + one * (D @ self.WV[h])
        out = torch.softmax(Q @ K.transpose(-1, -2) * self.scale + self.bias, -1) @ V
        diff = (out - self.base[h]).flatten(1)
        return torch.linalg.vector_norm(diff, dim=1) / self.base_norm[h]


def heads_word_sensitivity(
    heads: Sequence[Head],
    X: Array,
    *,
    rows=None,
    search: Search | dict | None = None,
    key_bias=None,
    device=None,
    **settings,
) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of several heads at the same ``X``, one value
    per head: the search of :func:`head_word_sensitivity` (same starts, steps and step sizes)
    for all the heads in one batch (so its random starts differ from separate calls), every
    value recomputed with :func:`head_map` in float64 at the best ``Δ`` of each head.
    ``search`` default ``HEADS_SEARCH``; ``key_bias`` a logit per key added to every head's
    scores (:func:`check_key_bias`; ``−inf`` masks a key, e.g. an attention sink)."""
    search = Search.parse(search, default=HEADS_SEARCH, **settings)
    heads = list(heads)
    if not heads:
        raise ValueError("heads is empty: pass at least one Head.")
    Z, _, r = own_norm_problem(head_map(heads[0]), X, device=device)
    _check_width(Z, heads)
    n = Z.shape[0]
    bias = check_key_bias(key_bias, n)
    Zs, row_list, _ = search_setup(
        Z.to(search.work_dtype(Z.dtype)), rows=rows, check_norms=False, device=device
    )
    obj = _HeadsObjective(heads, Zs * r.to(Zs), r.to(Zs), key_bias=bias)
    dummy = Zs.expand(len(heads), -1, -1).reshape(len(heads) * n, -1)  # index h·n + i
    idx = [h * n + i for h in range(len(heads)) for i in row_list]
    found = ascend_rows(lambda chunk: obj, dummy, idx, replace(search, progress=False))
    out = np.empty(len(heads))
    for h, head in enumerate(heads):
        _, phi_Z, _ = own_norm_problem(head_map(head, bias), X, device=device)
        res = certify(phi_Z, Z.to(Zs.device), {i: found[h * n + i] for i in row_list}, search)
        out[h] = res.value
    return out


def head_grid(
    enc,
    inputs,
    rows,
    *,
    control: bool = False,
    search: Search | dict | None = None,
    seed: int = 0,
    key_bias=None,
    device=None,
) -> np.ndarray:
    """``S^own`` (:prf:ref:`def-own-norm-ws`) of every head of every layer, ``(L, heads)``:
    ``inputs`` is ``(L + 1, n, d)`` (one text, :func:`layer_inputs`); the heads of layer
    ``ℓ`` are searched at ``inputs[ℓ − 1]`` over ``rows`` by :func:`heads_word_sensitivity`
    with ``search`` (default ``HEADS_SEARCH``; its starts seeded by
    :func:`wsutils.run.seeds.point_seed` ``(seed, ℓ)`` for layer ``ℓ``). ``control=True`` searches
    :func:`random_head` of each head instead (seed ``point_seed("random head", seed, ℓ, h)``).
    ``key_bias`` (``(n,)``, a logit per key, ``−inf`` to mask one) is added to every head's
    scores (:func:`check_key_bias`)."""
    from ..run.seeds import point_seed

    enc = _encoder(enc)
    search = Search.parse(search, default=HEADS_SEARCH)
    if search.seed is not None:
        raise ValueError("head_grid seeds each layer's search from seed: leave search.seed unset.")
    out = np.empty((enc.layers, enc.heads))
    for layer in range(1, enc.layers + 1):
        X = np.asarray(inputs[layer - 1], dtype=np.float64)
        heads = [head_weights(enc, layer, h) for h in range(enc.heads)]
        if control:
            heads = [
                random_head(hd, seed=point_seed("random head", seed, layer, hd.head))
                for hd in heads
            ]
        out[layer - 1] = heads_word_sensitivity(
            heads,
            X,
            rows=rows,
            search=replace(search, seed=point_seed("heads", seed, layer)),
            key_bias=key_bias,
            device=device,
        )
    return out


def head_certified_upper(head: Head, X: Array, *, key_bias=None, rows=None) -> np.ndarray:
    """Per word ``i`` of ``rows`` (``None``: every word), an upper bound on
    ``sup_{‖Δ‖≤‖x_i‖} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for the head map
    (:func:`wsutils.trained.head_map`, eq. :eq:`eq-trained-head`, with ``key_bias`` a
    logit per key, ``−inf`` masking it): :prf:ref:`prop-head-upper`, so ``S^own`` of the head
    (:prf:ref:`def-own-norm-ws`) over those words is at most their largest entry.

    Computed in float64 from the head's float64 weights and enlarged by the relative rounding
    of its float64 sums, ``2γ_{n+d+d_h}``, as
    :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper` is, with the same
    remainder not covered: ``exp``, ``log``, ``sigmoid`` and ``‖W_V‖₂``'s SVD, and
    cancellation in ``φ(X)`` itself (a value bias ``b_V`` that nearly cancels ``XW_V`` leaves a
    computed ``‖φ(X)‖`` that can be far off; the referee of issue 60 built one, 488 times too
    small, with ``W_Q = W_K = 0``). Cost ``O(n²d_h + n·d·d_h)``.

    Raises
    ------
    ValueError
        If ``X`` is not one finite ``n × d`` text of the head's width, a row of ``X`` is
        zero, ``key_bias`` is refused by :func:`~wsutils.trained.check_key_bias`, or
        ``φ(X) = 0``.
    """
    Xt = _own_norm_text(X, [head])
    cols = torch.as_tensor(check_rows(rows, len(Xt)))  # None: every word
    u, Phi = _head_row_bounds(head, Xt, cols, key_bias=key_bias)
    base = float(torch.linalg.vector_norm(Phi))
    if not base > 0:
        raise ValueError("‖φ(X)‖ = 0: the relative change is undefined for this X and head.")
    total = torch.sqrt((u**2).sum(dim=0))
    return (total / base * (1 + 2 * float_sum_rounding(Xt.shape[0] + head.d + head.d_h))).numpy()


def _own_norm_text(X: Array, heads: Sequence[Head]) -> torch.Tensor:
    """``X`` as a float64 CPU text for the heads' certificates: one finite ``n × d`` text of
    the heads' width with no zero row (its own-norm ball would be a point); a ValueError that
    says which otherwise."""
    Xt = torch.as_tensor(X).detach().to("cpu", torch.float64)
    if Xt.ndim != 2 or not bool(torch.isfinite(Xt).all()):
        raise ValueError(f"X must be one finite text (n, d), got shape {tuple(Xt.shape)}.")
    _check_width(Xt, heads)
    if not bool((torch.linalg.vector_norm(Xt, dim=1) > 0).all()):
        raise ValueError("a row of X is zero: its own-norm ball is a point; drop that row.")
    return Xt


def _head_row_bounds(head: Head, Xt: torch.Tensor, cols: torch.Tensor, *, key_bias=None):
    """The row terms of :prf:ref:`prop-head-upper`: ``u[j, c] ≥ ‖φ_j(X_i(Δ)) − φ_j(X)‖`` for
    every ``‖Δ‖ ≤ ‖x_i‖``, word ``i = cols[c]`` and output row ``j`` (absolute, not divided by
    ``‖φ(X)‖``), with ``φ(X)`` itself: ``(u, φ(X))``, in float64 without the rounding
    allowance (the callers add it). ``Xt`` is checked by ``_own_norm_text``."""
    n = Xt.shape[0]
    rho = torch.linalg.vector_norm(Xt, dim=1)  # the own-norm radii ‖x_i‖
    bias = check_key_bias(key_bias, n)
    Q, K, V = _qkv(head, Xt)
    c = 1 / math.sqrt(head.d_h)
    z = Q @ K.T * c + (0 if bias is None else bias)
    A = torch.softmax(z, dim=1)
    Phi = A @ V
    m = len(cols)
    live = torch.ones(n, dtype=torch.bool) if bias is None else bias > -math.inf
    omega = rho[cols] * float(torch.linalg.matrix_norm(head.W_V, ord=2))  # ≥ ‖ΔW_V‖
    # rows j ≠ i: ‖v_i − v̄_ji‖ bounded as for prop-softmax-upper
    zc, ell, p, spread = row_spread(z, A, Phi, V, cols, torch.linalg.vector_norm(V, dim=1))
    w = c * torch.linalg.vector_norm(Q @ head.W_K.T, dim=1)[:, None] * rho[cols][None, :]
    p_hi = torch.sigmoid(zc + w - ell)
    p_lo = torch.sigmoid(zc - w - ell)
    u = torch.maximum(p_hi - p, p - p_lo) * spread + p_hi * omega[None, :]
    # row i: the largest distance from φ_i to a value it can mix, v_k (k ≠ i, live) or v'_i
    own = distances_above(Phi[cols], V)  # [c, k] ≥ ‖φ_i − v_k‖
    at = torch.arange(m)
    self_dist = own[at, cols].clone()
    own[:, ~live] = -math.inf
    own[at, cols] = -math.inf
    with_self = torch.where(live[cols], self_dist + omega, torch.full_like(omega, -math.inf))
    u[cols, at] = torch.maximum(own.max(dim=1).values, with_self)
    return u, Phi


def head_upper_grid(enc, inputs, rows, *, control: bool = False, seed: int = 0, key_bias=None):
    """:func:`head_certified_upper` of every head of every layer, the largest over ``rows``:
    ``(L, heads)``, beside :func:`wsutils.trained.head_grid`'s lower bounds at the
    same arguments (``inputs`` ``(L + 1, n, d)``, one text; ``control=True``: the same random
    heads, seeded as there)."""
    from ..run.seeds import point_seed

    enc = _encoder(enc)
    out = np.empty((enc.layers, enc.heads))
    for layer in range(1, enc.layers + 1):
        X = np.asarray(inputs[layer - 1], dtype=np.float64)
        for h in range(enc.heads):
            head = head_weights(enc, layer, h)
            if control:
                head = random_head(head, seed=point_seed("random head", seed, layer, h))
            out[layer - 1, h] = head_certified_upper(head, X, key_bias=key_bias, rows=rows).max()
    return out
