"""The generalization experiment's data and features (re-exported by
:mod:`wsutils.generalization`).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from .._tensor import Array
from ..checks import as_tensor, check_finite, check_int, check_seed
from ..estimators.rf import rf_block_seed, rf_weight_block
from ..maps import Normalisation, attention, flat
from ..weights import gaussian, sample_X
from ._linalg import _gram

# ---------------------------------------------------------------------------------------------
# Data and features
# ---------------------------------------------------------------------------------------------


def planted_data(N: int, n: int, d: int, *, seed: int, dtype=torch.float64):
    """Synthetic labelled texts with rows rescaled (the book's variant of ``gen.py``'s data):
    ``N + 1`` texts of i.i.d. rows of norm ``√d`` (:func:`wsutils.weights.sample_X`), a planted
    direction ``w_⋆ ∈ R^D`` with i.i.d. ``N(0, 1/D)`` entries and labels
    ``y = sign⟨flat(X), w_⋆⟩`` (``gen.py``'s labels). The new text is drawn like the others.

    Returns ``(Xs, Y, X, y)``: ``N`` training texts ``(N, n, d)``, their labels, and the new
    text ``(n, d)`` with its label.
    """
    N = check_int("N", N, minimum=1)
    seed = check_seed(seed)
    D = n * d
    allX = sample_X((N + 1) * n, d, seed=seed, dtype=dtype).reshape(N + 1, n, d)
    w = gaussian((D,), 1 / math.sqrt(D), seed=seed + 1, dtype=dtype)
    labels = torch.sign(flat(allX) @ w)
    labels[labels == 0] = 1.0
    return allX[:N], labels[:N], allX[N], float(labels[N])


def independent_data(N: int, n: int, d: int, *, seed: int, dtype=torch.float64):
    """The texts of :func:`planted_data` (same ``seed``, same texts) with labels drawn
    independently of them: i.i.d. uniform ``±1`` (seed ``seed + 2``). No word carries any
    information about a label, so no rule is there to be learnt, and a one-word flip of a
    model trained on these labels cannot be the right answer of a learnt rule.

    Returns ``(Xs, Y, X, y)`` as :func:`planted_data`.
    """
    Xs, _, X, _ = planted_data(N, n, d, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(check_seed(seed + 2))
    labels = torch.randint(0, 2, (N + 1,), generator=g).to(dtype) * 2 - 1
    return Xs, labels[:N], X, float(labels[N])


def authors_data(N: int, n: int, d: int, *, seed: int, dtype=torch.float64):
    """``gen.py``'s synthetic data (``--dataset synthetic``): ``N`` training texts with i.i.d.
    ``N(0, 1)`` entries, **not** rescaled; ``w_⋆ ∈ R^D`` with i.i.d. ``N(0, 1/D)`` entries;
    labels ``Y = sign⟨flat(X), w_⋆⟩``; the new text ``x = w_⋆ + (I − w_⋆w_⋆ᵀ)g``, ``g`` standard
    normal (``gen.py`` uses the matrix ``I − w_⋆w_⋆ᵀ``, not a projector: ``‖w_⋆‖ ≠ 1``), with
    label ``y = sign⟨x, w_⋆⟩`` (``+1`` but with probability about ``e^{−D}``).

    Returns ``(Xs, Y, X, y)`` as :func:`planted_data`. The ``D × D`` matrix is never formed.
    """
    N = check_int("N", N, minimum=1)
    seed = check_seed(seed)
    D = n * d
    Xs = gaussian((N, n, d), 1.0, seed=seed, dtype=dtype)
    w = gaussian((D,), 1 / math.sqrt(D), seed=seed + 1, dtype=dtype)
    g = gaussian((D,), 1.0, seed=seed + 2, dtype=dtype)
    x = w + g - w * (w @ g)
    Y = torch.sign(flat(Xs) @ w)
    Y[Y == 0] = 1.0
    y = 1.0 if float(x @ w) >= 0 else -1.0
    return Xs, Y, x.reshape(n, d), y


def rf_blocks(
    k: int,
    n: int,
    d: int,
    *,
    seed: int,
    block_rows: int = 2048,
    dtype: torch.dtype = torch.float32,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(start, V_b)``: the row blocks of the RF weights ``V ∈ R^{k×D}``, entries
    ``N(0, 1/D)`` (eq. :eq:`eq-rf`), block ``b`` drawn from :func:`rf_block_seed`.
    Only one block is alive at a time. The normals are float32 whatever ``dtype`` (for
    speed; :func:`wsutils.weights.gaussian` with ``draw=torch.float32``), so ``V`` is a
    function of the seed alone."""
    if k < 1 or block_rows < 1:
        raise ValueError(f"need k ≥ 1 and block_rows ≥ 1, got k={k}, block_rows={block_rows}.")
    D = n * d
    for b, start in enumerate(range(0, k, block_rows)):
        rows = min(block_rows, k - start)
        yield (
            start,
            gaussian(
                (rows, D),
                1 / math.sqrt(D),
                seed=rf_block_seed(seed, b),
                dtype=dtype,
                draw=torch.float32,
            ),
        )


def sample_V_blocked(
    k: int,
    n: int,
    d: int,
    *,
    seed: int,
    block_rows: int = 2048,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The whole ``V`` that :func:`rf_blocks` streams (for small sizes and tests)."""
    return torch.cat(
        [V for _, V in rf_blocks(k, n, d, seed=seed, block_rows=block_rows, dtype=dtype)]
    )


def rf_preactivations(
    Xs: Array,
    k: int,
    *,
    seed: int,
    row: int = 0,
    block_rows: int = 2048,
    dtype: torch.dtype = torch.float32,
    progress: bool = False,
):
    """``H = V flat(X)`` for a batch of texts ``Xs`` (``B × n × d``) and the column block
    ``V_i`` (``k × d``) of word ``i = row``, with ``V`` streamed by :func:`rf_blocks`.

    Returns ``(H, V_i)`` in float64: ``φ_RF = ReLU(H)`` and ``φ_RF(X_i(Δ)) = ReLU(h + V_i Δ)``
    exactly. The product runs in ``dtype`` (float32 by default: half the memory, twice the
    matmul speed and five times the sampling speed of float64 on CPU; the map is then the RF map
    of the float32 weights, every later step is float64). Peak memory is one block
    (``block_rows × D``) plus ``H``.
    """
    X = as_tensor(Xs)
    if X.ndim != 3:
        raise ValueError(f"Xs must be a batch of texts (B, n, d), got shape {tuple(X.shape)}.")
    B, n, d = X.shape
    if not 0 <= row < n:
        raise ValueError(f"row {row} is out of range for texts of n = {n} words.")
    check_finite("Xs", X)
    return _rf_rows(flat(X).to(dtype), k, n, d, seed, row, block_rows, dtype, progress)


def _rf_rows(Xf, k, n, d, seed, row, block_rows, dtype, progress):
    """:func:`rf_preactivations` of the flattened texts ``Xf`` (``B × n·d``, in ``dtype``)."""
    B = Xf.shape[0]
    H = torch.empty(B, k, dtype=torch.float64)
    Vi = torch.empty(k, d, dtype=torch.float64)
    nblocks = -(-k // block_rows)
    for start, V in tqdm(
        rf_blocks(k, n, d, seed=seed, block_rows=block_rows, dtype=dtype),
        total=nblocks,
        desc="RF features",
        disable=not progress,
        leave=False,
    ):
        stop = start + V.shape[0]
        H[:, start:stop] = Xf @ V.T
        Vi[start:stop] = V[:, row * d : (row + 1) * d]
        del V
    return H, Vi


def rf_texts_noise_seed(seed: int, block: int) -> int:
    """The seed of block ``block`` of the normals ``Z`` of :func:`rf_texts_law` (from
    ``SeedSequence``, with a key of another form than those of
    :func:`~wsutils.estimators.rf.rf_block_seed` and
    :func:`~wsutils.estimators.rf.rf_rows_noise_seed`, so it is none of their seeds)."""
    return int(np.random.SeedSequence([check_seed(seed), 2, block]).generate_state(1)[0])


def rf_texts_law(
    Xs: Array,
    k: int,
    *,
    seed: int,
    row: int = 0,
    block_rows: int = 2048,
    progress: bool = False,
):
    """One draw of ``(H, V_i)`` from the joint law of ``H = (V flat(X_b))_b`` over a batch
    of texts ``Xs`` (``B × n × d``) and the column block ``V_i`` of word ``i = row``, ``V``
    with i.i.d. ``N(0, 1/D)`` entries (eq. :eq:`eq-rf`; :prf:ref:`prop-rf-texts-law`):
    ``H = X_i V_iᵀ + F Z`` with ``X_i`` the rows ``i`` of the texts (``B × d``), ``V_i``
    the ``blocks``-mode block (:func:`wsutils.estimators.rf.rf_weight_block`), ``F`` a factor
    of ``K_{−i} = flat(X_{−i}) flat(X_{−i})ᵀ / D`` (``_rest_factor``) and ``Z`` standard
    normals, drawn ``block_rows`` columns at a time from :func:`rf_texts_noise_seed`.

    The search of the flip experiment reads ``V`` only through ``H`` and ``V_i``
    (``φ_RF(X_i(Δ)) = ReLU(h + V_i Δ)``), so a draw of this pair is a draw of everything it
    uses, at ``O(B·(B + d)·k)`` instead of the ``O(B·D·k)`` of :func:`rf_preactivations`
    (``B = 1301``, ``D = 30,720``: 16 times fewer products, 15 times fewer normals). It is
    another draw than :func:`rf_preactivations`'s, of the same law. The normals are float32
    (as every block of ``V``); ``X_i V_iᵀ`` and ``K_{−i}`` are computed in float64, the
    Gaussian part ``F Z`` in float32 (rounded as :func:`rf_preactivations`'s float32
    products are). Returns ``(H, V_i)`` in float64, ``V_i`` the exact float32 weights."""
    X = as_tensor(Xs)
    if X.ndim != 3:
        raise ValueError(f"Xs must be a batch of texts (B, n, d), got shape {tuple(X.shape)}.")
    B, n, d = X.shape
    if not 0 <= row < n:
        raise ValueError(f"row {row} is out of range for texts of n = {n} words.")
    check_finite("Xs", X)
    k = check_int("k", k, minimum=1)
    return _rf_law_rows(flat(X).to(torch.float64), k, n, d, seed, row, block_rows, progress)


def _rest_factor(Xf: torch.Tensor, row: int, d: int) -> torch.Tensor:
    """``F`` (``B × r``) with ``FFᵀ = K_{−i} = flat(X_{−i}) flat(X_{−i})ᵀ / D`` for the
    flattened texts ``Xf`` (``B × D``, float64) without word ``i = row``: the scaled columns
    themselves when there are no more of them than texts (``r = D − d``), the Cholesky factor
    of ``K_{−i}`` otherwise (``r = B``), or, when ``K_{−i}`` is singular (two texts equal
    but for word ``i``), ``U Λ^{1/2}`` from its eigendecomposition."""
    B, D = Xf.shape
    rest = torch.ones(D, dtype=torch.bool)
    rest[row * d : (row + 1) * d] = False
    if D - d <= B:
        return Xf[:, rest] / math.sqrt(D)
    Xi = Xf[:, ~rest]
    K = (_gram(Xf) - Xi @ Xi.T) / D
    L, info = torch.linalg.cholesky_ex(K)
    if int(info) == 0:
        return L
    lam, U = torch.linalg.eigh(K)
    return U * lam.clamp_min(0).sqrt()


def _rf_law_rows(Xf, k, n, d, seed, row, block_rows, progress):
    """:func:`rf_texts_law` of the flattened float64 texts ``Xf`` (``B × n·d``)."""
    if block_rows < 1:
        raise ValueError(f"need block_rows ≥ 1, got {block_rows}.")
    B = Xf.shape[0]
    Vi = rf_weight_block(k, n, d, row, seed=seed, dtype=torch.float64)
    Xi = Xf[:, row * d : (row + 1) * d]
    F = _rest_factor(Xf, row, d).to(torch.float32)
    H = torch.empty(B, k, dtype=torch.float64)
    starts = range(0, k, block_rows)
    for b, start in enumerate(tqdm(starts, desc="RF features", disable=not progress, leave=False)):
        stop = min(start + block_rows, k)
        part = Xi @ Vi[start:stop].T
        if F.shape[1]:
            g = torch.Generator().manual_seed(rf_texts_noise_seed(seed, b))
            Z = torch.randn(F.shape[1], stop - start, generator=g, dtype=torch.float32)
            part += F @ Z
        H[:, start:stop] = part
    return H, Vi


def _attention_fn(norm: Normalisation):
    """``φ(X, W)`` with the weights of ``norm`` (:func:`wsutils.maps.attention`: for softmax
    and ReLU attention the very floats of :func:`~wsutils.maps.raf` and
    :func:`~wsutils.maps.relu_attention`)."""
    return lambda Z, Wt: attention(Z, Wt, normalisation=norm)


def attention_features(
    Xs: Array, W: Array, normalisation: str | Normalisation, *, chunk: int = 64
) -> torch.Tensor:
    """Flattened features ``flat(φ(X))`` of a batch of texts for the attention map of
    ``normalisation``: ``"raf"`` (eq. :eq:`eq-raf`), ``"relu"`` (eq. :eq:`eq-relu-attention`)
    or any other name, dict or :class:`~wsutils.maps.Normalisation`
    (eq. :eq:`eq-general-attention`, :func:`wsutils.maps.attention`), in chunks of texts."""
    norm = Normalisation.parse(normalisation)
    X = as_tensor(Xs)
    return _attention_rows(X, None, as_tensor(W, dtype=X.dtype), norm, chunk)


def _attention_rows(
    Xs: torch.Tensor, X: torch.Tensor | None, W: torch.Tensor, norm: Normalisation, chunk: int
) -> torch.Tensor:
    """:func:`attention_features` of the texts ``Xs`` followed by the text ``X`` (if not
    ``None``), written chunk by chunk into one preallocated ``(B, n·d)`` tensor: the chunks
    are those of ``torch.cat([Xs, X[None]])`` (so the same floats), but neither that copy of
    the texts nor a concatenation of the chunks' outputs is made (two passes over ``B × n·d``
    fewer)."""
    fn = _attention_fn(norm)
    B = Xs.shape[0] + (X is not None)
    out = None
    with torch.no_grad():
        for j in range(0, B, chunk):
            part = Xs[j : j + chunk]
            if X is not None and j + chunk >= B:
                part = torch.cat([part, X[None]])
            F = flat(fn(part, W))
            if out is None:
                out = torch.empty((B, F.shape[-1]), dtype=F.dtype, device=F.device)
            out[j : j + F.shape[0]] = F
    return out
