"""Generalization with one changed word (chapter ``generalization``; the setting of
Bombari & Mondelli 2024, their eqs. 16 and 24, and of the authors' script ``gen.py``).

A linear read-out ``f(X; θ) = ⟨φ(X), θ⟩`` is trained on ``N`` texts by min-norm interpolation,
``θ₀ = Φ⁺Y`` (:prf:ref:`def-flip-problem`); a new text ``(X, y)`` is then learnt by
**fine-tuning** or **re-training** (eq. :eq:`eq-fine-tune`, :eq:`eq-retrain`), and
:func:`search_flip` looks for one word change ``‖Δ‖ ≤ √d`` that makes the trained model say
``−y`` (the output loss, eq. :eq:`eq-output-loss`, or a feature-alignment surrogate,
eq. :eq:`eq-align-loss`).

All linear algebra goes through the ``N × N`` Gram matrix ``K = ΦΦᵀ`` (a Cholesky solve),
never through a ``p × p`` matrix: ``θ₀ = Φᵀ K⁻¹ Y`` and ``Pφ = φ − Φᵀ K⁻¹ Φ φ``. At
``n = 120, d = 768`` the dense projector ``I − Φ⁺Φ`` would be ``92,160²`` (~68 GB).

Random features at ``k = D`` (``V`` is ``30,720²`` at ``n = 40, d = 768``, 7.5 GB in float64)
are computed by :func:`rf_preactivations` one block of rows of ``V`` at a time, each block
drawn from its own seed (so any block can be regenerated), and only the column block ``V_i``
that multiplies the perturbed word is kept: ``V flat(X_i(Δ)) = V flat(X) + V_i Δ`` is exact,
so the search never needs the rest of ``V`` again.

Two searches for the changed word: ours (:func:`search_flip`: several starts, normalised steps,
best iterate) and the authors' (:func:`authors_search`, as ``gen.py`` runs it: one start at
``x₁``, plain gradient steps with their learning rates and step counts, last iterate);
:func:`flip_runs` runs either on the same instances (``search="ours"`` or ``"authors"``).
Two synthetic data sets: :func:`planted_data` (rows rescaled to norm ``√d``, as every other
chapter) and :func:`authors_data` (``gen.py``'s: rows not rescaled, the new text built on the
planted direction ``w_⋆``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from .._tensor import Array, as_tensor, like
from ..checks import check_finite, check_int, check_seed, check_shape, check_unit_rows
from ..estimators.rf import rf_block_seed
from ..maps import Normalisation, attention, flat, normalise_scores, raf, relu_attention
from ..sensitivity import cosine_ascent, init_starts, perturb, project_ball
from ..weights import gaussian, sample_W, sample_X

__all__ = [
    "LOSSES",
    "MAPS",
    "TRAININGS",
    "SEARCHES",
    "DATA",
    "FlipResult",
    "gram_cholesky",
    "min_norm_interpolator",
    "project_out",
    "fine_tune",
    "retrain",
    "planted_data",
    "authors_data",
    "rf_block_seed",
    "rf_blocks",
    "sample_V_blocked",
    "rf_preactivations",
    "attention_features",
    "flip_grid",
    "flip_table",
    "FlipModel",
    "rf_flip_model",
    "attention_flip_model",
    "flip_target",
    "search_flip",
    "search_flips",
    "authors_search",
    "authors_searches",
    "authors_lr_steps",
    "flip_runs",
    "flip_point",
    "GENERAL",
    "flip_normalisation",
]

LOSSES = ("output", "align_ft", "align_rt")
TRAININGS = ("fine_tune", "retrain")
MAPS = ("rf", "raf", "relu")
SEARCHES = ("ours", "authors")
DATA = ("planted", "authors")

#: The map name of the general attention map :func:`wsutils.maps.attention` in this module
#: (chapter *normalisation*): ``map="attention"`` with ``normalisation=...`` (a name of
#: :data:`wsutils.maps.NORMALISATIONS`, a dict of :class:`wsutils.maps.Normalisation`'s fields, or
#: a :class:`~wsutils.maps.Normalisation`). It is not in ``MAPS``, the paper's three maps:
#: ``map="attention"`` with ``"softmax"`` (``β = 1``) gives the records of ``map="raf"`` and
#: with ``"relu"`` those of ``map="relu"``, to the last bit.
GENERAL = "attention"


def flip_normalisation(map: str, normalisation=None) -> Normalisation | None:
    """Check ``map`` (one of ``MAPS`` or :data:`GENERAL`) and its ``normalisation``: a
    :class:`~wsutils.maps.Normalisation` for ``map="attention"`` (from a name, a dict of its
    fields such as ``{"name": "scalable", "s": 2.0}``, or a Normalisation), ``None`` for the
    paper's maps, which take none."""
    if map == GENERAL:
        if normalisation is None:
            raise ValueError(
                "map='attention' needs normalisation=..., e.g. 'sparsemax' or "
                "{'name': 'scalable', 's': 1.0} (see wsutils.maps.Normalisation)."
            )
        if isinstance(normalisation, Normalisation):
            return normalisation
        if isinstance(normalisation, str):
            return Normalisation(normalisation)
        if isinstance(normalisation, dict):
            unknown = sorted(set(normalisation) - {"name", "beta", "s", "alpha", "bias"})
            if unknown or "name" not in normalisation:
                raise ValueError(
                    "a normalisation dict needs 'name' and may have 'beta', 's', "
                    f"'alpha', 'bias'; got keys {sorted(normalisation)}."
                )
            return Normalisation(**normalisation)
        raise TypeError(
            "normalisation must be a name, a dict of Normalisation fields or a "
            f"Normalisation, got {type(normalisation).__name__}."
        )
    if map not in MAPS:
        raise ValueError(f"map must be one of {MAPS} or {GENERAL!r}, got {map!r}.")
    if normalisation is not None:
        raise ValueError(
            f"normalisation applies only to map={GENERAL!r}; map={map!r} has its "
            "own (raf: softmax, relu: rownorm of ReLU). Leave it unset."
        )
    return None


def check_Ns(Ns: Sequence[int]) -> list[int]:
    """The list of training-set sizes ``N`` as Python ints (at least one, each ``≥ 1``); an
    empty list is a ValueError that says so (not a bare ``max()`` error)."""
    if isinstance(Ns, (str, bytes)) or not hasattr(Ns, "__iter__"):
        raise TypeError(f"Ns must be a list of training-set sizes N, e.g. [50, 100], got {Ns!r}.")
    Ns = [check_int("every N in Ns", N, minimum=1) for N in Ns]
    if not Ns:
        raise ValueError("Ns is empty: pass at least one training-set size N, e.g. Ns=[50, 100].")
    return Ns


# ---------------------------------------------------------------------------------------------
# Min-norm interpolation, fine-tuning, re-training (all through the N × N Gram matrix)
# ---------------------------------------------------------------------------------------------


def _matrix(name: str, Phi: Array) -> torch.Tensor:
    P = as_tensor(Phi)
    if P.ndim != 2:
        raise ValueError(
            f"{name} must be a matrix (N, p) with one feature row per text, got "
            f"shape {tuple(P.shape)}."
        )
    check_finite(name, P)
    return P


def _vector(name: str, v: Array, length: int, ref: torch.Tensor, hint: str) -> torch.Tensor:
    t = as_tensor(v, dtype=ref.dtype, device=ref.device).reshape(-1)
    if t.shape[0] != length:
        raise ValueError(f"{name} must have length {length} ({hint}), got {t.shape[0]}.")
    check_finite(name, t)
    return t


def gram_cholesky(Phi: Array, *, rcond: float | None = None) -> torch.Tensor:
    """Lower Cholesky factor ``L`` of the Gram matrix ``K = ΦΦᵀ`` (``N × N``).

    Raises a ValueError when ``K`` is singular or numerically so (``N > p``, a repeated text,
    features that are linearly dependent): then no interpolator of arbitrary labels exists.
    The test is on the pivots, ``min L_jj² < rcond · max K_jj`` with ``rcond = N·eps``
    by default (a pivot of ``K`` is never below its smallest eigenvalue).
    """
    P = _matrix("Phi", Phi)
    N, p = P.shape
    if N > p:
        raise ValueError(
            f"Phi has N = {N} texts but only p = {p} features: ΦΦᵀ is singular and "
            "min-norm interpolation is not defined. Use fewer texts or more features."
        )
    K = P @ P.T
    L, info = torch.linalg.cholesky_ex(K)
    eps = torch.finfo(K.dtype).eps
    rcond = N * eps if rcond is None else rcond
    scale = float(torch.diagonal(K).max())
    if int(info) != 0 or not scale > 0 or float(torch.diagonal(L).min()) ** 2 < rcond * scale:
        raise ValueError(
            f"the Gram matrix ΦΦᵀ ({N} × {N}) is singular or numerically singular: the feature "
            "rows are linearly dependent (a repeated text, or too few features), so the texts "
            "cannot all be interpolated. Remove duplicate texts or use more features."
        )
    return L


def _gram_solve(L: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.cholesky_solve(B.reshape(L.shape[0], -1), L).reshape(B.shape)


def min_norm_interpolator(Phi: Array, Y: Array, *, L: torch.Tensor | None = None) -> Array:
    """``θ₀ = Φ⁺Y = Φᵀ(ΦΦᵀ)⁻¹Y``, the min-norm solution of ``Φθ = Y`` (eq. :eq:`eq-theta0`).

    ``Phi`` is ``N × p`` with ``N ≤ p``; ``L`` may pass a precomputed :func:`gram_cholesky`.
    """
    P = _matrix("Phi", Phi)
    Yt = _vector("Y", Y, P.shape[0], P, "one label per row of Phi")
    L = gram_cholesky(P) if L is None else L
    return like(P.T @ _gram_solve(L, Yt), Phi)


def project_out(Phi: Array, phi: Array, *, L: torch.Tensor | None = None) -> Array:
    """``Pφ = φ − Φᵀ(ΦΦᵀ)⁻¹Φφ``: the part of ``φ`` orthogonal to the rows of ``Φ``
    (``P = I − Φ⁺Φ``, eq. :eq:`eq-retrain`), without forming the ``p × p`` projector."""
    P = _matrix("Phi", Phi)
    f = _vector("phi", phi, P.shape[1], P, "the feature vector of one text, p = Phi.shape[1]")
    L = gram_cholesky(P) if L is None else L
    return like(f - P.T @ _gram_solve(L, P @ f), phi)


def fine_tune(theta0: Array, phi: Array, y: float) -> Array:
    """Fine-tuning (eq. :eq:`eq-fine-tune`): ``θ₁ = θ₀ + φ (y − ⟨φ, θ₀⟩)/‖φ‖²``, the closest
    ``θ`` to ``θ₀`` with ``⟨φ, θ⟩ = y``."""
    th = as_tensor(theta0)
    if th.ndim != 1:
        raise ValueError(f"theta0 must be a vector, got shape {tuple(th.shape)}.")
    check_finite("theta0", th)
    f = _vector("phi", phi, th.shape[0], th, "the length of theta0")
    nrm2 = float(f @ f)
    if not nrm2 > 0:
        raise ValueError("φ(X) = 0: no parameter can fit the new label; the text has no features.")
    return like(th + f * (float(y) - float(f @ th)) / nrm2, theta0)


def retrain(
    Phi: Array,
    Y: Array,
    phi: Array,
    y: float,
    *,
    L: torch.Tensor | None = None,
    rtol: float = 1e-10,
) -> Array:
    """Re-training (eq. :eq:`eq-retrain`): the min-norm interpolator of the ``N + 1`` texts,
    ``θ₁ = θ₀ + Pφ (y − ⟨φ, θ₀⟩)/‖Pφ‖²``, computed with the ``N × N`` Gram matrix only.

    Raises a ValueError when ``φ`` lies in the row space of ``Φ`` (``‖Pφ‖ ≤ rtol·‖φ‖``).
    """
    P = _matrix("Phi", Phi)
    L = gram_cholesky(P) if L is None else L
    theta0 = as_tensor(min_norm_interpolator(P, Y, L=L))
    f = _vector("phi", phi, P.shape[1], P, "the feature vector of one text, p = Phi.shape[1]")
    Pf = as_tensor(project_out(P, f, L=L))
    nrm2 = float(Pf @ Pf)
    if not nrm2 > (rtol * float(torch.linalg.vector_norm(f))) ** 2:
        raise ValueError(
            "φ(X) lies in the span of the training features (‖Pφ‖ ≈ 0): the new "
            "text is a combination of the old ones and cannot get its own label."
        )
    return like(theta0 + Pf * (float(y) - float(f @ theta0)) / nrm2, Phi)


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
    Xf = flat(X).to(dtype)
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


def _attention_kind(kind: str, normalisation=None):
    """The map ``φ(X, W)`` and the :class:`~wsutils.maps.Normalisation` of its weights for an
    attention ``kind``: ``"raf"`` (:func:`~wsutils.maps.raf`, softmax), ``"relu"``
    (:func:`~wsutils.maps.relu_attention`, rownorm of ReLU) or :data:`GENERAL` with
    ``normalisation`` (:func:`~wsutils.maps.attention`; :func:`flip_normalisation`)."""
    if kind == GENERAL:
        norm = flip_normalisation(kind, normalisation)
        return (lambda Z, Wt: attention(Z, Wt, normalisation=norm)), norm
    if normalisation is not None:
        flip_normalisation(kind, normalisation)  # refuses it, saying why
    fn = {"raf": raf, "relu": relu_attention}.get(kind)
    if fn is None:
        raise ValueError(f"kind must be 'raf', 'relu' or {GENERAL!r}, got {kind!r}.")
    return fn, Normalisation("softmax" if kind == "raf" else "relu")


def attention_features(
    Xs: Array, W: Array, kind: str, *, chunk: int = 64, normalisation=None
) -> torch.Tensor:
    """Flattened features ``flat(φ(X))`` of a batch of texts for ``kind`` ``"raf"``
    (eq. :eq:`eq-raf`) or ``"relu"`` (eq. :eq:`eq-relu-attention`), or ``"attention"`` with
    ``normalisation`` (eq. :eq:`eq-general-attention`, :func:`wsutils.maps.attention`), in
    chunks of texts."""
    fn, _ = _attention_kind(kind, normalisation)
    X = as_tensor(Xs)
    Wt = as_tensor(W, dtype=X.dtype)
    with torch.no_grad():
        return torch.cat([flat(fn(X[j : j + chunk], Wt)) for j in range(0, X.shape[0], chunk)])


# ---------------------------------------------------------------------------------------------
# The flip search
# ---------------------------------------------------------------------------------------------


@dataclass
class FlipResult:
    """What a search found: ``Delta`` (``‖Delta‖ ≤ √d``), the read-out value
    ``⟨φ(X_i(Δ)), w⟩`` it returns and its loss ``(value − target)²``; ``start`` is the start
    that won (0 is the authors' start ``Δ = 0``); ``min_loss`` is the smallest loss of any
    iterate (for :func:`search_flip` the returned one; for :func:`authors_search`, which
    returns the last iterate, it can be far below ``loss``)."""

    Delta: torch.Tensor
    value: float
    loss: float
    start: int
    min_loss: float = math.nan


def flip_target(
    loss: str,
    *,
    theta1: torch.Tensor,
    phi: torch.Tensor,
    y: float,
    Pphi: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Read-out vector ``w`` and target ``τ`` of the search loss ``(⟨φ(X_Δ), w⟩ − τ)²``:
    ``"output"`` (eq. :eq:`eq-output-loss`): ``w = θ₁, τ = −y``; ``"align_ft"``
    (eq. :eq:`eq-align-loss`): ``w = φ/‖φ‖², τ = −1``; ``"align_rt"``: ``w = Pφ/‖Pφ‖², τ = −1``."""
    if loss == "output":
        return theta1, -float(y)
    if loss == "align_ft":
        return phi / (phi @ phi), -1.0
    if loss == "align_rt":
        if Pphi is None:
            raise ValueError("loss 'align_rt' needs Pphi = project_out(Phi, phi).")
        return Pphi / (Pphi @ Pphi), -1.0
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")


def search_flip(
    readout: Callable[[torch.Tensor], torch.Tensor],
    d: int,
    target: float,
    *,
    dtype: torch.dtype = torch.float64,
    device=None,
    starts: int = 4,
    steps: int = 300,
    lr: float = 0.3,
    seed: int = 0,
    init: torch.Tensor | None = None,
) -> FlipResult:
    """Projected gradient descent on ``Δ ∈ R^d`` for ``(⟨φ(X_i(Δ)), w⟩ − τ)²``
    (eq. :eq:`eq-output-loss` / :eq:`eq-align-loss`), over the ball ``‖Δ‖ ≤ √d``.

    ``readout`` maps a batch of perturbations ``(B, d)`` to the values ``⟨φ(X_i(Δ)), w⟩``
    (``(B,)``), e.g. ``lambda D: model.readout(D, w)`` with ``w, τ`` from :func:`flip_target`.
    ``starts`` searches run in one batch: ``Δ = 0`` (the authors' start), then uniform points
    on the sphere ``‖Δ‖ = √d``, plus the rows of ``init``. Each step moves by
    ``lr·√d``·(cosine decay) along the normalised negative gradient and projects back. The best
    iterate over all steps and starts is kept.
    """
    d = check_int("d", d, minimum=1)
    starts = check_int("starts", starts, minimum=1)
    steps = check_int("steps", steps, minimum=0)
    radius = math.sqrt(d)
    g = torch.Generator().manual_seed(check_seed(seed))
    Delta = torch.randn(starts, d, generator=g, dtype=dtype)
    Delta *= radius / torch.linalg.vector_norm(Delta, dim=-1, keepdim=True)
    Delta[0] = 0.0
    if init is not None:
        Delta = torch.cat([Delta, init_starts(init, d, dtype=dtype)])
    Delta = project_ball(Delta.to(device), radius)
    neg_loss, best_Delta = cosine_ascent(
        lambda D: -((readout(D) - target) ** 2), Delta, radius, steps=steps, lr=lr
    )
    with torch.no_grad():  # the winner by the loss at the returned (projected) Δ itself
        values = readout(best_Delta)
        losses = (values - target) ** 2
    j = int(torch.argmin(losses))
    value, loss = float(values[j]), float(losses[j])
    return FlipResult(Delta=best_Delta[j], value=value, loss=loss, start=j, min_loss=loss)


def _flip_starts(d: int, starts: int, seed: int) -> torch.Tensor:
    """The starts of :func:`search_flip` (float64): ``Δ = 0``, then ``starts − 1`` uniform
    points of the sphere ``‖Δ‖ = √d`` from ``seed``, on the exact ball."""
    g = torch.Generator().manual_seed(check_seed(seed))
    Delta = torch.randn(starts, d, generator=g, dtype=torch.float64)
    Delta *= math.sqrt(d) / torch.linalg.vector_norm(Delta, dim=-1, keepdim=True)
    Delta[0] = 0.0
    return project_ball(Delta, math.sqrt(d))


_FLIP_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _flip_dtype(value) -> torch.dtype:
    if value in _FLIP_DTYPES.values():
        return value
    if isinstance(value, str) and value.strip().lower().removeprefix("torch.") in _FLIP_DTYPES:
        return _FLIP_DTYPES[value.strip().lower().removeprefix("torch.")]
    raise ValueError(
        f"search_dtype must be torch.float32, torch.float64, 'float32' or "
        f"'float64', got {value!r}."
    )


def search_flips(
    model: FlipModel,
    Ws: torch.Tensor,
    targets: Sequence[float],
    d: int,
    *,
    starts: int = 4,
    steps: int = 300,
    lr: float = 0.3,
    seed: int = 0,
    search_dtype: torch.dtype | str = torch.float64,
) -> list[FlipResult]:
    """``len(targets)`` searches of :func:`search_flip` in one batch: search ``j`` minimises
    ``(⟨φ(X_i(Δ)), Ws[j]⟩ − targets[j])²`` (eq. :eq:`eq-output-loss` /
    :eq:`eq-align-loss`) over ``‖Δ‖ ≤ √d`` from the starts :func:`search_flip` uses with
    ``seed`` (the same for every ``j``), with the same steps
    (:func:`wsutils.sensitivity.cosine_ascent`). The rows of the batch do not interact (the
    loss is a sum over rows), so each search follows, in exact arithmetic, the path it follows
    alone; one step of the ``S·starts`` rows reads the weights once instead of ``S`` times.

    ``search_dtype``: the precision of the iterations (float32: half the bytes per step). The
    search only proposes ``Δ``: the best iterate of every start is projected onto the exact
    ball in float64 and read out again in float64, the start with the smallest float64 loss
    wins, and every returned number (``value``, ``loss``) is float64. Returns one
    :class:`FlipResult` per target, in order."""
    d = check_int("d", d, minimum=1)
    starts = check_int("starts", starts, minimum=1)
    steps = check_int("steps", steps, minimum=0)
    dtype = _flip_dtype(search_dtype)
    Ws = as_tensor(Ws, dtype=torch.float64)
    if Ws.ndim != 2:
        raise ValueError(
            f"Ws must be the read-out vectors as a matrix (S, p), got shape {tuple(Ws.shape)}."
        )
    tau = torch.as_tensor(list(targets), dtype=torch.float64).reshape(-1)
    S = Ws.shape[0]
    if tau.shape[0] != S or S == 0:
        raise ValueError(
            f"need one target per read-out vector, got {tau.shape[0]} targets for {S} vectors."
        )
    check_finite("Ws", Ws)
    check_finite("targets", tau)
    radius = math.sqrt(d)
    batched = _batched_readout(model)
    idx = torch.arange(S).repeat_interleave(starts)
    Delta = _flip_starts(d, starts, seed).repeat(S, 1).to(dtype)
    f, td = batched(Ws, dtype), tau.to(dtype)[idx]
    _, best = cosine_ascent(
        lambda D: -((f(D, idx) - td) ** 2), Delta, radius, steps=steps, lr=lr, exact_result=False
    )
    best = project_ball(best.to(torch.float64), radius)
    with torch.no_grad():
        vals = f(best, idx) if dtype == torch.float64 else batched(Ws, torch.float64)(best, idx)
    loss = (vals - tau[idx]) ** 2
    out = []
    for j in range(S):
        grp = loss[j * starts : (j + 1) * starts]
        a = int(torch.argmin(torch.where(torch.isnan(grp), math.inf, grp)))
        b = j * starts + a
        out.append(
            FlipResult(
                Delta=best[b],
                value=float(vals[b]),
                loss=float(loss[b]),
                start=a,
                min_loss=float(loss[b]),
            )
        )
    return out


def _batched_readout(model: FlipModel):
    """``model.batched``, or a loop over ``model.readout`` where the model has none."""
    if model.batched is not None:
        return model.batched

    def batched(W, dt):
        Wd = W.to(dt)

        def f(Delta, idx):
            return torch.stack(
                [
                    model.readout(Delta[b : b + 1], Wd[int(idx[b])])[0]
                    for b in range(Delta.shape[0])
                ]
            )

        return f

    return batched


def authors_searches(
    model: FlipModel, Ws: torch.Tensor, targets: Sequence[float], d: int, *, lr: float, steps: int
) -> list[FlipResult]:
    """``len(targets)`` runs of :func:`authors_search` in one batch, in float64: run ``j``
    takes the read-out vector ``Ws[j]`` and target ``targets[j]``; the rows of the batch do not
    interact (the loss is a sum over rows and the projection acts row by row), so each run
    follows, in exact arithmetic, the path of :func:`authors_search` alone (same start
    ``Δ = 0``, same plain steps, last iterate returned, ``min_loss`` along the path)."""
    steps = check_int("steps", steps, minimum=0)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}.")
    Ws = as_tensor(Ws, dtype=torch.float64)
    tau = torch.as_tensor(list(targets), dtype=torch.float64).reshape(-1)
    if Ws.ndim != 2 or tau.shape[0] != Ws.shape[0] or tau.shape[0] == 0:
        raise ValueError(
            f"need Ws as a matrix (S, p) and one target per row, got shape "
            f"{tuple(Ws.shape)} and {tau.shape[0]} targets."
        )
    S, radius = Ws.shape[0], math.sqrt(d)
    idx = torch.arange(S)
    f = _batched_readout(model)(Ws, torch.float64)
    Delta = torch.zeros(S, d, dtype=torch.float64)
    min_loss = torch.full((S,), math.inf, dtype=torch.float64)
    for _ in range(steps):
        Delta.requires_grad_(True)
        loss = (f(Delta, idx) - tau) ** 2
        (grad,) = torch.autograd.grad(loss.sum(), Delta)
        min_loss = torch.minimum(min_loss, loss.detach())
        with torch.no_grad():
            Delta = project_ball(Delta.detach() - lr * grad, radius)
    with torch.no_grad():
        vals = f(Delta, idx)
    loss = (vals - tau) ** 2
    return [
        FlipResult(
            Delta=Delta[j],
            value=float(vals[j]),
            loss=float(loss[j]),
            start=0,
            min_loss=min(float(min_loss[j]), float(loss[j])),
        )
        for j in range(S)
    ]


def authors_lr_steps(map: str, n: int) -> tuple[float, int]:
    """The learning rate and step count of ``gen.py``'s search: random features ``lr = 100``,
    300 steps; softmax and ReLU attention ``lr = 1``, ``50·n`` steps (and so, by our choice,
    attention with any normalisation, ``map="attention"``)."""
    if map not in MAPS and map != GENERAL:
        raise ValueError(f"map must be one of {MAPS}, got {map!r}.")
    return (100.0, 300) if map == "rf" else (1.0, 50 * check_int("n", n, minimum=1))


def authors_search(
    readout: Callable[[torch.Tensor], torch.Tensor],
    d: int,
    target: float,
    *,
    lr: float,
    steps: int,
    dtype: torch.dtype = torch.float64,
) -> FlipResult:
    """The search of the authors' ``gen.py``: one start at ``x₁`` (``Δ = 0``), ``steps`` plain
    gradient steps ``Δ ← Π(Δ − lr·∇(⟨φ(X_1(Δ)), w⟩ − τ)²)`` with ``Π`` the projection onto the
    ball ``‖Δ‖ ≤ √d`` centred at ``x₁`` (eq. :eq:`eq-output-loss` / :eq:`eq-align-loss`), and
    the **last** iterate returned, whatever its loss. ``min_loss`` records the smallest loss
    along the path (``gen.py`` prints it at every step but keeps the last iterate)."""
    steps = check_int("steps", steps, minimum=0)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}.")
    radius = math.sqrt(d)
    Delta = torch.zeros(1, d, dtype=dtype)
    min_loss = math.inf
    for _ in range(steps):
        Delta.requires_grad_(True)
        loss = (readout(Delta)[0] - target) ** 2
        (grad,) = torch.autograd.grad(loss, Delta)
        min_loss = min(min_loss, float(loss.detach()))
        with torch.no_grad():
            Delta = project_ball(Delta.detach() - lr * grad, radius)
    with torch.no_grad():
        value = float(readout(Delta)[0])
    loss = (value - target) ** 2
    return FlipResult(
        Delta=Delta[0], value=value, loss=loss, start=0, min_loss=min(min_loss, loss)
    )


# ---------------------------------------------------------------------------------------------
# One point of the experiment grid
# ---------------------------------------------------------------------------------------------


@dataclass
class FlipModel:
    """A frozen feature map seen from one word: ``phi_row(Δ)`` gives the flattened features
    ``φ(X_i(Δ))`` for a batch ``(B, d)``, ``readout(Δ, w)`` gives ``⟨φ(X_i(Δ)), w⟩`` (the
    search needs only this, and for attention it costs ``O(B(n² + nd))`` instead of a full
    forward pass). ``change_bound`` is a certified bound on ``‖φ(X_i(Δ)) − φ(X)‖`` over the
    ball (RF only; ``nan`` otherwise)."""

    phi_row: Callable[[torch.Tensor], torch.Tensor]
    readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    change_bound: float = math.nan
    #: ``batched(Ws, dtype)`` → ``f(Δ, idx)``: ``f(Δ, idx)_b = ⟨φ(X_i(Δ_b)), Ws[idx_b]⟩``,
    #: several read-out vectors ``Ws`` (``S × p``) in one batch, computed in ``dtype``
    #: (:func:`search_flips`); ``None``: :func:`search_flips` loops over ``readout``.
    batched: Callable | None = None


def rf_flip_model(h: torch.Tensor, Vi: torch.Tensor) -> FlipModel:
    """RF seen from word ``i``: ``φ(X_i(Δ)) = ReLU(h + V_i Δ)`` with ``h = V flat(X)``
    (eq. :eq:`eq-rf`); ReLU is 1-Lipschitz, so ``‖φ(X_i(Δ)) − φ(X)‖ ≤ ‖V_i‖_op √d``."""
    d = Vi.shape[1]

    def phi_row(Delta):
        return torch.relu(h + Delta @ Vi.T)

    bound = float(torch.linalg.matrix_norm(Vi, ord=2)) * math.sqrt(d)

    def batched(Ws, dtype):
        hd, Vd, Wd = h.to(dtype), Vi.to(dtype), Ws.to(dtype)

        def f(Delta, idx):
            return (torch.relu(hd + Delta @ Vd.T) * Wd[idx]).sum(-1)

        return f

    return FlipModel(phi_row, lambda Delta, w: phi_row(Delta) @ w, bound, batched)


def attention_flip_model(
    X: torch.Tensor, W: torch.Tensor, kind: str, row: int, *, normalisation=None
) -> FlipModel:
    """RAF (``kind="raf"``, eq. :eq:`eq-raf`), ReLU attention (``"relu"``,
    eq. :eq:`eq-relu-attention`) or attention with a named normalisation (``"attention"`` with
    ``normalisation``, eq. :eq:`eq-general-attention`; see :func:`flip_normalisation`) seen
    from word ``i = row``. Changing ``x_i`` changes only row ``i`` and column ``i`` of the
    scores ``S = XWXᵀ/√d``; with ``G = Θ X_Δᵀ`` (``Θ`` = ``w`` as an ``n × d`` matrix) the
    read-out is ``⟨A(Δ) X_Δ, Θ⟩ = Σ_rc A_rc G_rc``, ``A(Δ)`` the normalised scores
    (:func:`wsutils.maps.normalise_scores` for ``"attention"``)."""
    fn, norm = _attention_kind(kind, normalisation)
    n, d = X.shape
    s = math.sqrt(d)
    Q = X @ W
    S0 = Q @ X.T / s

    def phi_row(Delta):
        rows = torch.full((Delta.shape[0],), row, dtype=torch.long, device=Delta.device)
        return flat(fn(perturb(X, rows, Delta), W))

    def readout(Delta, w):
        B = Delta.shape[0]
        Th = w.reshape(n, d)
        xi = X[row] + Delta  # (B, d)
        qi = xi @ W
        S = S0.expand(B, n, n).clone()
        S[:, :, row] = xi @ Q.T / s  # column i: x_r W x_i'
        S[:, row, :] = qi @ X.T / s  # row i: x_i' W x_c
        S[:, row, row] = (qi * xi).sum(-1) / s
        A = normalise_scores(S, norm)
        G = (Th @ X.T).expand(B, n, n).clone()
        G[:, :, row] = xi @ Th.T  # θ_r · x_i'
        return (A * G).sum(dim=(-1, -2))

    def batched(Ws, dtype):
        # readout for one Θ per row of the batch (Θ_b = Ws[idx_b] as n × d), in dtype
        Xd, Wd, Qd, S0d = X.to(dtype), W.to(dtype), Q.to(dtype), S0.to(dtype)
        Th = Ws.to(dtype).reshape(-1, n, d)
        G0 = Th @ Xd.T  # S × n × n: θ_r · x_c

        def f(Delta, idx):
            B = Delta.shape[0]
            xi = Xd[row] + Delta
            qi = xi @ Wd
            S = S0d.expand(B, n, n).clone()
            S[:, :, row] = xi @ Qd.T / s
            S[:, row, :] = qi @ Xd.T / s
            S[:, row, row] = (qi * xi).sum(-1) / s
            A = normalise_scores(S, norm)
            G = G0[idx]
            G[:, :, row] = torch.einsum("bd,brd->br", xi, Th[idx])
            return (A * G).sum(dim=(-1, -2))

        return f

    return FlipModel(phi_row, readout, batched=batched)


def _features(
    map: str,
    Xs: torch.Tensor,
    X: torch.Tensor,
    *,
    seed: int,
    row: int,
    block_rows: int,
    progress: bool,
    normalisation: Normalisation | None = None,
):
    """Features of the training texts and of the new text, and the :class:`FlipModel`."""
    n, d = X.shape
    allX = torch.cat([Xs, X[None]])
    if map == "rf":
        H, Vi = rf_preactivations(
            allX, n * d, seed=seed, row=row, block_rows=block_rows, progress=progress
        )
        return torch.relu(H[:-1]), torch.relu(H[-1]), rf_flip_model(H[-1], Vi)
    W = sample_W(d, seed=seed)
    F = attention_features(allX, W, map, normalisation=normalisation)
    return F[:-1], F[-1], attention_flip_model(X, W, map, row, normalisation=normalisation)


def _check_flip_data(
    Xs: torch.Tensor,
    Y: torch.Tensor,
    X: torch.Tensor,
    y: float,
    Ns: list[int],
    row: int,
    unit_rows: bool,
) -> None:
    """Input checks of :func:`flip_runs` (shapes, labels ``±1``, ``N ≤ len(Xs)``, rows of
    norm ``√d`` unless ``unit_rows`` is false)."""
    if Xs.ndim != 3:
        raise ValueError(
            f"Xs must be the training texts as an array (N, n, d), got shape {tuple(Xs.shape)}."
        )
    Nmax, n, d = Xs.shape
    check_finite("Xs", Xs)
    check_shape("X", X, (n, d), "the new text, with the n words of d coordinates of Xs")
    check_shape("Y", Y, (Nmax,), "one label per training text")
    bad = sorted(set(Y.tolist()) - {-1.0, 1.0})
    if bad or float(y) not in (-1.0, 1.0):
        raise ValueError(
            f"labels must be ±1 (Y has {bad[:5] or 'only ±1'}, y = {y}); map "
            "0/1 labels with 2·label − 1."
        )
    if unit_rows:
        check_unit_rows(Xs)
        check_unit_rows(X)
    if max(Ns) > Nmax:
        raise ValueError(f"every N in Ns must be between 1 and len(Xs) = {Nmax}, got {Ns}.")
    if max(Ns) >= n * d:
        raise ValueError(f"N = {max(Ns)} must be below p = n·d = {n * d} for interpolation.")
    if not 0 <= row < n:
        raise ValueError(f"row {row} is out of range for texts of n = {n} words.")


def _run_search(
    search: str, model: FlipModel, w: torch.Tensor, tau: float, d: int, opts: dict
) -> FlipResult:
    """One search, on one thread: its tensors are small (``B × n × n`` scores), and on a
    loaded machine the synchronisation of several threads per step costs more than the
    arithmetic (measured: 20× slower at ``n = 40, d = 32`` with two threads under load)."""

    def readout(D):
        return model.readout(D, w)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if search == "authors":
            return authors_search(readout, d, tau, lr=opts["lr"], steps=opts["steps"])
        return search_flip(readout, d, tau, **opts)
    finally:
        torch.set_num_threads(threads)


def _search_key(loss: str, N: int, training: str) -> tuple:
    """The searches a point needs: the output loss depends on ``(N, training)``, align_rt on
    ``N``, align_ft on neither."""
    return {"output": (loss, N, training), "align_rt": (loss, N), "align_ft": (loss,)}[loss]


def _run_batched(
    search: str,
    model: FlipModel,
    Ws: torch.Tensor,
    taus: list[float],
    d: int,
    opts: dict,
    search_dtype,
) -> list[FlipResult]:
    """Every search of a point in one batch (:func:`search_flips`, :func:`authors_searches`),
    on one thread (as :func:`_run_search`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if search == "authors":
            return authors_searches(model, Ws, taus, d, **opts)
        return search_flips(model, Ws, taus, d, search_dtype=search_dtype, **opts)
    finally:
        torch.set_num_threads(threads)


def _min_norm(P: torch.Tensor, Y: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """:func:`min_norm_interpolator` for checked inputs (no check here)."""
    return P.T @ _gram_solve(L, Y)


def _project(P: torch.Tensor, f: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """:func:`project_out` for checked inputs (no check here)."""
    return f - P.T @ _gram_solve(L, P @ f)


def _retrain(
    f: torch.Tensor, y: float, theta0: torch.Tensor, Pf: torch.Tensor, rtol: float = 1e-10
) -> torch.Tensor:
    """:func:`retrain` from ``θ₀`` and ``Pφ`` already computed (checked inputs): the same
    formula, the same refusal."""
    nrm2 = float(Pf @ Pf)
    if not nrm2 > (rtol * float(torch.linalg.vector_norm(f))) ** 2:
        raise ValueError(
            "φ(X) lies in the span of the training features (‖Pφ‖ ≈ 0): the new "
            "text is a combination of the old ones and cannot get its own label."
        )
    return theta0 + Pf * (float(y) - float(f @ theta0)) / nrm2


def flip_runs(
    map: str,
    Xs: Array,
    Y: Array,
    X: Array,
    y: float,
    *,
    Ns: Sequence[int],
    seed: int,
    losses: Sequence[str] = LOSSES,
    trainings: Sequence[str] = TRAININGS,
    search: str = "ours",
    starts: int = 4,
    steps: int | None = None,
    lr: float | None = None,
    row: int = 0,
    unit_rows: bool = True,
    block_rows: int = 2048,
    progress: bool = False,
    normalisation=None,
    batch_searches: bool = True,
    search_dtype: torch.dtype | str = "float64",
) -> dict:
    """The generalization experiment on given data (:prf:ref:`def-flip-problem`): training
    texts ``Xs`` (``N × n × d``, rows of norm ``√d`` unless ``unit_rows=False``, as in
    ``gen.py``'s synthetic data), their labels ``Y`` (``±1``), the new text ``X``
    (``n × d``) and its label ``y``. Weights of ``map`` are drawn with ``seed`` and the flip
    search with ``seed + 1``. For every ``N`` in ``Ns`` (the first ``N`` texts) every
    training and every loss: ``θ₀``, ``θ₁``, the flip search on word ``row``, and
    ``t0, t1, D0, D1`` (the outputs ``t_0, t_1`` on ``X`` and ``t_0^Δ, t_1^Δ`` on ``X_Δ``,
    with ``θ₀`` and ``θ₁``; ``gen.py`` records the same four).

    ``search="ours"``: :func:`search_flip` (``starts`` starts, ``steps`` steps, default 300,
    step size ``lr``, default 0.3, best iterate); ``search="authors"``: :func:`authors_search`
    with ``gen.py``'s ``lr`` and ``steps`` (:func:`authors_lr_steps`) unless given.
    ``search=["ours", "authors"]`` (a list of distinct searches) runs each on the same
    features, built once; ``starts``, ``steps`` and ``lr`` are then our search's, and the
    authors' search takes ``gen.py``'s.

    Returns ``{"runs": [...]}``, one dict per ``(search, N, training, loss)``, with the invariants
    (``max |Φθ₀ − Y|``, ``‖Δ‖``), the quantities of :prf:ref:`prop-flip-bound` and the two
    terms of eq. :eq:`eq-flip-identity`: ``base_term = t_0^Δ − t_0`` (bounded by
    ``rel_change·norm_phi_theta0``, ``norm_phi_theta0 = ‖φ‖·‖θ₀‖``) and
    ``sens_term = (c − 1)(y − t_0)``; ``loss``/``min_loss`` are the search's final and
    smallest loss. The align_ft search does not depend on ``N`` or the training, align_rt
    not on the training: each is run once and read out under every model it applies to.

    ``map="attention"`` (:data:`GENERAL`) runs the same experiment with the general attention
    map and ``normalisation`` (:func:`flip_normalisation`); the records are those of the
    other maps (with ``"softmax"`` and ``"relu"`` equal to those of ``"raf"`` and ``"relu"``).

    ``batch_searches``: the point's searches (up to 10: six output, three align_rt, one
    align_ft) run as one batch, ours by :func:`search_flips` with iterations in
    ``search_dtype`` (float64 by default; ``"float32"`` halves the bytes of every step, and
    every recorded number stays float64, computed at the returned ``Δ``), the authors' by
    :func:`authors_searches` (float64, as theirs); ``batch_searches=False`` runs them one after
    another in float64 (:func:`search_flip`, :func:`authors_search`), as before. Batched or
    not, each search follows the same path in exact arithmetic; float32 iterations follow it to
    single-precision rounding.
    """
    norm = flip_normalisation(map, normalisation)
    search_dtype = _flip_dtype(search_dtype)
    bad = [x for x in losses if x not in LOSSES] + [x for x in trainings if x not in TRAININGS]
    if bad:
        raise ValueError(f"unknown losses/trainings {bad}; use {LOSSES} and {TRAININGS}.")
    searches = [search] if isinstance(search, str) else list(search)
    if (
        not searches
        or any(not isinstance(s, str) or s not in SEARCHES for s in searches)
        or len(set(searches)) != len(searches)
    ):
        raise ValueError(
            f"search must be one of {SEARCHES} or a list of distinct ones, got {search!r}."
        )
    Ns = check_Ns(Ns)
    Xs, X = as_tensor(Xs, dtype=torch.float64), as_tensor(X, dtype=torch.float64)
    Y = as_tensor(Y, dtype=torch.float64).reshape(-1)
    _check_flip_data(Xs, Y, X, y, Ns, row, unit_rows)
    y = float(y)
    Nmax = max(Ns)
    n, d = X.shape
    Phi_all, phi, model = _features(
        map,
        Xs[:Nmax],
        X,
        seed=seed,
        row=row,
        block_rows=block_rows,
        progress=progress,
        normalisation=norm,
    )
    several = len(searches) > 1
    all_opts = {}
    for s_name in searches:
        if s_name == "authors":
            lr0, steps0 = authors_lr_steps(map, n)
            all_opts[s_name] = dict(
                lr=lr0 if lr is None or several else lr,
                steps=steps0 if steps is None or several else steps,
            )
        else:
            all_opts[s_name] = dict(
                starts=starts,
                steps=300 if steps is None else steps,
                lr=0.3 if lr is None else lr,
                seed=seed + 1,
            )
    check_finite("phi", phi)  # the door: Phi_all is checked by gram_cholesky
    norm_phi = float(torch.linalg.vector_norm(phi))
    runs: list[dict] = []
    # The Cholesky factor of a leading block of K is the leading block of K's factor.
    L_all = gram_cholesky(Phi_all)
    fits = {}
    targets: dict = {}  # search key -> (w, τ), in the order first met
    for N in sorted(set(Ns)):
        Phi, YN = Phi_all[:N], Y[:N]
        L = L_all[:N, :N]
        # Phi_all, Y and phi were checked at the door (_check_flip_data, _features): the
        # helpers below trust them (no check_finite pass over the N × p matrix per call)
        theta0 = _min_norm(Phi, YN, L)
        Pphi = _project(Phi, phi, L)
        interp_err = float((Phi @ theta0 - YN).abs().max())
        for training in trainings:
            theta1 = (
                fine_tune(theta0, phi, y)
                if training == "fine_tune"
                else _retrain(phi, y, theta0, Pphi)
            )
            fits[N, training] = (theta0, Pphi, interp_err, theta1)
            for loss in losses:
                key = _search_key(loss, N, training)
                if key not in targets:
                    targets[key] = flip_target(loss, theta1=theta1, phi=phi, y=y, Pphi=Pphi)
    for search in searches:
        opts = all_opts[search]
        cache = {}
        if batch_searches:
            keys = list(targets)
            found = _run_batched(
                search,
                model,
                torch.stack([targets[k][0] for k in keys]),
                [targets[k][1] for k in keys],
                d,
                opts,
                search_dtype,
            )
            cache = dict(zip(keys, found))
        runs += _flip_records(
            search, model, cache, targets, fits, Ns, trainings, losses, phi, y, d, opts, norm_phi
        )
    return {"runs": runs}


def _flip_records(
    search, model, cache, targets, fits, Ns, trainings, losses, phi, y, d, opts, norm_phi
) -> list[dict]:
    """The records of :func:`flip_runs` for one search (``cache``: the searches already run,
    by key; the others run here one by one)."""
    runs = []
    for N in sorted(set(Ns)):
        for training in trainings:
            theta0, Pphi, interp_err, theta1 = fits[N, training]
            t0 = float(phi @ theta0)
            for loss in losses:
                key = _search_key(loss, N, training)
                if key not in cache:
                    w, tau = targets[key]
                    cache[key] = _run_search(search, model, w, tau, d, opts)
                res = cache[key]
                with torch.no_grad():
                    phiD = model.phi_row(res.Delta[None])[0]
                v = phi / (phi @ phi) if training == "fine_tune" else Pphi / (Pphi @ Pphi)
                D0, c = float(phiD @ theta0), float(phiD @ v)
                runs.append(
                    dict(
                        N=N,
                        training=training,
                        loss=loss,
                        search=search,
                        y=y,
                        t0=t0,
                        t1=float(phi @ theta1),
                        D0=D0,
                        D1=float(phiD @ theta1),
                        norm_Delta=float(torch.linalg.vector_norm(res.Delta)),
                        interp_err=interp_err,
                        c=c,
                        rel_change=float(torch.linalg.vector_norm(phiD - phi)) / norm_phi,
                        S_bound=model.change_bound / norm_phi,
                        rho=norm_phi * float(torch.linalg.vector_norm(v)),
                        norm_phi_theta0=norm_phi * float(torch.linalg.vector_norm(theta0)),
                        base_term=D0 - t0,
                        sens_term=(c - 1) * (y - t0),
                        search_loss=res.loss,
                        min_loss=res.min_loss,
                        start=res.start,
                    )
                )
    return runs


def flip_point(
    *,
    map: str,
    n: int,
    d: int,
    Ns: Sequence[int],
    seed: int,
    losses: Sequence[str] = LOSSES,
    trainings: Sequence[str] = TRAININGS,
    search: str = "ours",
    data: str = "planted",
    starts: int = 4,
    steps: int | None = None,
    lr: float | None = None,
    row: int = 0,
    block_rows: int = 2048,
    progress: bool = False,
    normalisation=None,
    batch_searches: bool = True,
    search_dtype: str = "float64",
) -> dict:
    """One grid point for :func:`wsutils.run.sweep.run_grid` on synthetic data: ``max(Ns) + 1``
    texts from :func:`planted_data` (``data="planted"``, rows of norm ``√d``) or
    :func:`authors_data` (``data="authors"``, ``gen.py``'s), drawn with seed ``seed``, then
    :func:`flip_runs` with weights seed ``seed + 3`` (search seed ``seed + 4``) and
    ``search`` (one search, or a list such as ``["ours", "authors"]``: both on features built
    once). The same ``seed`` gives the same texts for every map and both searches.
    ``map="attention"`` takes a ``normalisation`` (a name or a dict of
    :class:`~wsutils.maps.Normalisation`'s fields, so that the point stays plain JSON for
    :func:`wsutils.run.sweep.run_grid`; :func:`flip_normalisation`). ``batch_searches`` and
    ``search_dtype`` (``"float32"`` or ``"float64"``) as in :func:`flip_runs`."""
    flip_normalisation(map, normalisation)
    if data not in DATA:
        raise ValueError(f"data must be one of {DATA}, got {data!r}.")
    Ns = check_Ns(Ns)
    Nmax = max(Ns)
    if Nmax >= n * d:
        raise ValueError(f"N = {Nmax} must be below p = n·d = {n * d} for interpolation.")
    make = planted_data if data == "planted" else authors_data
    Xs, Y, X, y = make(Nmax, n, d, seed=seed)
    return flip_runs(
        map,
        Xs,
        Y,
        X,
        y,
        Ns=Ns,
        seed=seed + 3,
        losses=losses,
        trainings=trainings,
        search=search,
        starts=starts,
        steps=steps,
        lr=lr,
        row=row,
        unit_rows=data == "planted",
        block_rows=block_rows,
        progress=progress,
        normalisation=normalisation,
        batch_searches=batch_searches,
        search_dtype=search_dtype,
    )


def flip_grid(
    *,
    d: int,
    Ns: Sequence[int],
    seeds: Sequence[int],
    configs: Sequence[tuple[str, int]] = (("rf", 40), ("raf", 40), ("raf", 120), ("relu", 120)),
    **search,
) -> list[dict]:
    """The points of the generalization experiment: one per ``(map, n, seed)``; the grid of
    the authors' ``gen.py`` is ``d = 768``, ``Ns = (1100, 1200, 1300)`` and the default
    ``configs``. ``search`` passes ``search``, ``data``, ``starts``, ``steps``, ``lr``,
    ``losses``, ``trainings`` to :func:`flip_point`."""
    Ns = check_Ns(Ns)
    return [
        dict(map=m, n=n, d=d, Ns=list(Ns), seed=s, **search) for (m, n) in configs for s in seeds
    ]


def flip_table(records: Sequence[dict]) -> list[dict]:
    """Flatten :func:`wsutils.run.sweep.run_grid` records of :func:`flip_point` into one row per
    run, with ``map``, ``n``, ``d``, ``seed``, ``data`` and the run's own fields (and
    ``normalisation``, as the point gave it, for points that have one: ``map="attention"``)."""
    rows = []
    for rec in records:
        extra = (
            {"normalisation": rec["normalisation"]} if rec.get("normalisation") is not None else {}
        )
        for run in rec["runs"]:
            rows.append(
                {
                    "map": rec["map"],
                    "n": rec["n"],
                    "d": rec["d"],
                    "seed": rec["seed"],
                    "data": rec.get("data", "planted"),
                    **extra,
                    **run,
                }
            )
    return rows
