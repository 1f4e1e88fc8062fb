"""The four feature maps of the paper, eqs. :eq:`eq-rf`–:eq:`eq-relu-attention`, with frozen
random weights.

Each map accepts a numpy array or a torch tensor ``X`` of shape ``(n, d)`` (or a batch
``(..., n, d)``) and returns the same kind: numpy in, numpy out; torch in, torch out and
differentiable. Computation is in float64 unless ``dtype`` says otherwise (a floating torch
input keeps its own dtype), on the input's device.

======================  ======================================  ==========================
map                     formula                                 label in the book
======================  ======================================  ==========================
:func:`rf`              ``ReLU(V flat(X)) ∈ R^k``               :eq:`eq-rf`
:func:`drf`             ``ReLU(V_L ··· ReLU(V_1 flat(X)))``     :eq:`eq-drf`
:func:`raf`             ``softmax(X W Xᵀ/√d) X ∈ R^{n×d}``      :eq:`eq-raf`
:func:`relu_attention`  ``N(ReLU(X W Xᵀ/√d)) X``                :eq:`eq-relu-attention`
:func:`attention`       ``norm(β·X W Xᵀ/√d) X``, a named norm   :eq:`eq-general-attention`
======================  ======================================  ==========================

:func:`attention` is the one attention map with a named row normalisation (softmax with an
inverse temperature ``β``, scalable softmax, sparsemax, α-entmax, sigmoid, ReLU, hardmax;
:class:`Normalisation`, chapter *normalisation*); :func:`raf` and :func:`relu_attention` are
its two cases that the paper names, and equal it to the last bit.

``flat`` is row-major: ``flat(X) = (x_1, …, x_n)``, so column block ``i`` of ``V`` (columns
``i·d … (i+1)·d − 1``) multiplies word ``i``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ._tensor import Array, like, pow2_above, row_norms
from .checks import all_finite, as_tensor, as_text, check_finite, check_shape

__all__ = [
    "LABELS",
    "flat",
    "rf",
    "drf",
    "raf",
    "relu_attention",
    "attention_scores",
    "normalise_rows",
    "NORMALISATIONS",
    "ENTMAX_MIN_ALPHA",
    "Normalisation",
    "normalise_scores",
    "sparsemax",
    "sparsemax_threshold",
    "attention",
    "softmax_attention",
    "general_attention",
]


def flat(X: torch.Tensor) -> torch.Tensor:
    """Row-major flattening of the last two axes: ``(..., n, d) → (..., n·d)``."""
    return X.reshape(*X.shape[:-2], X.shape[-2] * X.shape[-1])


def attention_scores(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The score matrix ``X W Xᵀ / √d`` (torch, batched, unchecked)."""
    d = X.shape[-1]
    return (X @ W) @ X.transpose(-1, -2) / math.sqrt(d)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Attention is computed in at least float32: half precision overflows at scores of 65504
    and rounds the weights to 3 digits."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _rf(X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return torch.relu(flat(X) @ V.T)


def _drf(X: torch.Tensor, Vs: Sequence[torch.Tensor]) -> torch.Tensor:
    h = flat(X)
    for V in Vs:
        h = torch.relu(h @ V.T)
    return h


def softmax_attention(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The kernel of :func:`raf`, ``softmax(X W Xᵀ/√d) X`` (eq. :eq:`eq-raf`), on torch
    tensors (batched, differentiable). Trusts its caller: ``X`` ``(..., n, d)`` and ``W``
    ``d × d`` finite real tensors on one device, unchecked (:func:`raf` is the checked entry
    point). Computed in float32 at least, returned in ``X``'s dtype.

    Raises
    ------
    ValueError
        If the scores overflow the compute dtype (softmax of ``inf`` is NaN, and no rescaling
        keeps softmax unchanged).
    """
    cd = _compute_dtype(X.dtype)
    Xc, Wc = X.to(cd), W.to(cd)
    s = attention_scores(Xc, Wc)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(
            f"the attention scores XWXᵀ/√d overflow {cd} (|score| > "
            f"{torch.finfo(cd).max:.3g}): pass float64 input or a smaller W."
        )
    return (torch.softmax(s, dim=-1) @ Xc).to(X.dtype)


def _relu_attention(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Row-normalised ReLU attention (trusted input). ``rownorm(ReLU(c·s)) = rownorm(ReLU(s))``
    for ``c > 0``, so the scores are computed from ``X`` and ``W`` divided by powers of two
    (exact): the same floats as without the scaling, but no overflow for any finite input."""
    cd = _compute_dtype(X.dtype)
    Xc, Wc = X.to(cd), W.to(cd)
    Xs = Xc / pow2_above(Xc)
    A = torch.relu(attention_scores(Xs, Wc / pow2_above(Wc)))
    mass = A.sum(dim=-1, keepdim=True)
    # rownorm(A): each row divided by its sum; an all-zero row stays zero.
    A = A / torch.where(mass > 0, mass, torch.ones_like(mass))
    return (A @ Xc).to(X.dtype)


def _prepare(X: Array, dtype, weights: dict[str, Array]):
    Xt, n, d = as_text(X, dtype=dtype)
    ws = {k: as_tensor(v, dtype=Xt.dtype, device=Xt.device, name=k) for k, v in weights.items()}
    return Xt, n, d, ws


def rf(X: Array, V: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Random features ``φ_RF(X) = ReLU(V flat(X))`` (eq. :eq:`eq-rf`).

    ``V`` is ``k × (n·d)``; the paper draws it with i.i.d. ``N(0, 1/D)`` entries, ``D = n·d``
    (:func:`wsutils.weights.sample_V`). Returns a vector of length ``k``.

    Raises
    ------
    TypeError
        If ``X`` or a weight is complex (the imaginary part would be dropped) or not numeric.
    ValueError
        If ``X`` is not a finite ``(..., n, d)`` array, ``V`` not a finite ``k × (n·d)``
        matrix, or the output is not finite.
    """
    Xt, n, d, w = _prepare(X, dtype, {"V": V})
    Vt = w["V"]
    if Vt.ndim != 2 or Vt.shape[1] != n * d:
        raise ValueError(
            f"V must have shape (k, n·d) = (k, {n * d}) for X of shape (n, d) = ({n}, {d}), "
            f"got {tuple(Vt.shape)}."
        )
    check_finite("V", Vt)
    return like(_finite(_rf(Xt, Vt), "random-features"), X)


def drf(X: Array, Vs: Sequence[Array], *, dtype: torch.dtype | None = None) -> Array:
    """Deep random features: ``ReLU(V_L ··· ReLU(V_1 flat(X)))`` (eq. :eq:`eq-drf`).

    ``Vs[0]`` is ``k_1 × (n·d)`` and ``Vs[l]`` is ``k_{l+1} × k_l``; the paper draws every layer
    ``D × D`` with He scaling ``N(0, 2/D)`` (:func:`wsutils.weights.sample_Vs`).

    Raises
    ------
    TypeError
        If ``X`` or a weight is complex (the imaginary part would be dropped) or not numeric.
    ValueError
        If ``Vs`` is empty, a layer does not fit its input width or is not finite, ``X`` is
        not a finite ``(..., n, d)`` array, or the output is not finite.
    """
    if len(Vs) == 0:
        raise ValueError("Vs is empty: a deep random-features map needs at least one layer.")
    Xt, n, d, w = _prepare(X, dtype, {str(i): V for i, V in enumerate(Vs)})
    fan_in = n * d
    for i in range(len(Vs)):
        Vt = w[str(i)]
        if Vt.ndim != 2 or Vt.shape[1] != fan_in:
            raise ValueError(
                f"Vs[{i}] must have shape (k_{i + 1}, {fan_in}) (its input width), "
                f"got {tuple(Vt.shape)}."
            )
        check_finite(f"Vs[{i}]", Vt)
        fan_in = Vt.shape[0]
    return like(_finite(_drf(Xt, [w[str(i)] for i in range(len(Vs))]), "deep random-features"), X)


def _attention(X: Array, W: Array, dtype, kernel) -> Array:
    Xt, n, d, w = _prepare(X, dtype, {"W": W})
    check_shape("W", w["W"], (d, d), f"d × d with d = {d}, the width of X")
    return like(_finite(kernel(Xt, w["W"]), "attention"), X)


def raf(X: Array, W: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Random attention features ``φ_RAF(X) = softmax(X W Xᵀ/√d) X`` (eq. :eq:`eq-raf`).

    ``W`` is ``d × d`` with i.i.d. ``N(0, 1/d)`` entries (:func:`wsutils.weights.sample_W`);
    softmax is row-wise. Returns ``n × d``. Half-precision input is computed in float32 and
    returned in its own dtype; scores that overflow (``|XWXᵀ/√d|`` beyond the dtype's range) are
    a ValueError, never NaN.

    Raises
    ------
    TypeError
        If ``X`` or a weight is complex (the imaginary part would be dropped) or not numeric.
    ValueError
        If the scores overflow (NaN attention rows otherwise) or the output is not finite,
        or ``X``/``W`` is not finite or of the wrong shape.
    """
    return _attention(X, W, dtype, softmax_attention)


def relu_attention(X: Array, W: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Row-normalised ReLU attention ``N(ReLU(X W Xᵀ/√d)) X`` (eq. :eq:`eq-relu-attention`).

    ``N`` (the book's ``rownorm``) divides each row by its sum; a row whose scores are all
    ``≤ 0`` stays zero. Returns ``n × d``. Since ``rownorm(ReLU(c·s)) = rownorm(ReLU(s))`` for
    ``c > 0``, the scores are formed from ``X`` and ``W`` rescaled by powers of two: any finite
    input gives finite output, in every dtype (half precision is computed in float32):
    rows of norm ``≥ 1e154`` and huge ``W`` are computed exactly, not returned as zeros.

    Raises
    ------
    TypeError
        If ``X`` or a weight is complex (the imaginary part would be dropped) or not numeric.
    ValueError
        If ``X``/``W`` is not finite or of the wrong shape.
    """
    return _attention(X, W, dtype, _relu_attention)


def normalise_rows(X: Array) -> Array:
    """Rescale every row of ``X`` to norm ``√d`` (the paper's normalisation).

    The norms are computed without overflow (``wsutils._tensor.row_norms``), so rows of any
    finite size are rescaled (rows of norm ``≥ 1e154`` used to come back as zeros).

    Raises
    ------
    TypeError
        If ``X`` is complex (the imaginary part would be dropped) or not numeric.
    ValueError
        If a row is zero (it has no direction to keep) or ``X`` is not finite.
    """
    Xt, n, d = as_text(X)
    norms = row_norms(Xt)
    if bool((norms == 0).any()):
        raise ValueError(
            "X has an all-zero row, which cannot be rescaled to norm √d; drop it first."
        )
    return like(Xt * (math.sqrt(d) / norms), X)


# ----------------------------------------------------------------------------------------------
# The general attention map: one score matrix, a named row normalisation (chapter normalisation)

#: The label the book prints for each of the paper's three feature maps, by name (random
#: features, :func:`rf`; softmax attention, :func:`raf`; ReLU attention,
#: :func:`relu_attention`). The names are those every grid point takes (``map="raf"``).
LABELS = {"rf": "RF", "raf": "RAF", "relu": "ReLU attention"}

#: The row normalisations of :func:`attention` (eq. :eq:`eq-general-attention`).
NORMALISATIONS = ("softmax", "scalable", "sparsemax", "entmax", "sigmoid", "relu", "hardmax")


def _positive(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}.")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}.")
    return value


#: The smallest α of α-entmax accepted, since the bisection's error grows like ``u/(α − 1)``
#: (measured against a 60-digit reference on scores of size 5: 8e-15 at ``α − 1 = 1e-3``,
#: 7e-12 at 1e-6, 1e-5 at 1e-12); below it, softmax (the ``α → 1`` limit) is the answer.
ENTMAX_MIN_ALPHA = 1 + 1e-4


@dataclass(frozen=True)
class Normalisation:
    """A row normalisation of the scores ``s = X W Xᵀ/√d`` (eq. :eq:`eq-general-attention`).

    ``name`` is one of :data:`NORMALISATIONS`; every normalisation sees ``z = c_n·s`` with
    ``c_n = β`` (``β`` the inverse temperature, default 1), times ``s·log n`` for ``"scalable"``
    (Nakanishi's scalable softmax, ``s`` default 1; ``n`` the row length):

    - ``"softmax"``, ``"scalable"``: ``softmax(z)``;
    - ``"sparsemax"``: the Euclidean projection of ``z`` onto the simplex (:func:`sparsemax`);
    - ``"entmax"``: α-entmax, ``[(α−1)z − τ]_+^{1/(α−1)}`` summing to one (``alpha`` ≥
      :data:`ENTMAX_MIN_ALPHA`, default 1.5; the ``entmax`` package: its exact sort-based
      ``entmax15`` for α = 1.5, its bisection otherwise, on ``z − max z`` so that a large
      ``(α−1)z`` keeps its digits); α = 2 is sparsemax, α → 1 softmax, α → ∞ hardmax;
    - ``"sigmoid"``: ``σ(z + b)`` entrywise (rows do not sum to one), ``b = bias``, default
      ``−log n``;
    - ``"relu"``: ``rownorm(ReLU(z))``, the paper's ReLU attention (``β`` has no effect);
    - ``"hardmax"``: uniform on the row's largest entries (the ``β → ∞`` limit of softmax;
      ``β`` has no effect).

    ``s`` is accepted only for ``"scalable"``, ``alpha`` only for ``"entmax"``, ``bias`` only
    for ``"sigmoid"``: anything else is a ValueError, never silently ignored.

    ``sink`` (softmax and scalable softmax only) is the margin ``b`` of an **attention sink** on
    position 0 (eq. :eq:`eq-sink-attention`, chapter *attention-sink*): every query's scaled
    score on key 0 is raised by ``b`` (a logit, added after ``c_n``), so the text's row 0 is
    the sink's key and its value (zero, small or a real token's row, as the text makes it).
    ``None`` (default) is no sink; ``sink=0`` is the same map as ``None``.

    Raises
    ------
    TypeError
        If ``beta``, ``s``, ``alpha``, ``bias`` or ``sink`` is not a real number.
    ValueError
        If ``name`` is unknown, a parameter is given to a normalisation it does not apply
        to, ``beta``/``s`` is not finite and positive, or ``alpha`` is not finite or below
        :data:`ENTMAX_MIN_ALPHA` (``1 + 1e-4``: entmax's bisection loses ``u/(α − 1)``).
    """

    name: str = "softmax"
    beta: float = 1.0
    s: float | None = None
    alpha: float | None = None
    bias: float | None = None
    sink: float | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or self.name not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {self.name!r}.")
        object.__setattr__(self, "beta", _positive("beta", self.beta))
        for key, owner in (("s", "scalable"), ("alpha", "entmax"), ("bias", "sigmoid")):
            if getattr(self, key) is not None and self.name != owner:
                raise ValueError(
                    f"{key} applies only to normalisation={owner!r}, not "
                    f"{self.name!r}; leave it unset."
                )
        if self.name == "scalable":
            object.__setattr__(self, "s", _positive("s", 1.0 if self.s is None else self.s))
        if self.name == "entmax":
            a = 1.5 if self.alpha is None else self.alpha
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Real):
                raise TypeError(f"alpha must be a real number > 1, got {a!r}.")
            if not (math.isfinite(float(a)) and float(a) >= ENTMAX_MIN_ALPHA):
                raise ValueError(
                    f"alpha must be a finite number ≥ {ENTMAX_MIN_ALPHA} (the "
                    f"bisection's error grows like u/(α − 1): 8e-15 at α − 1 = "
                    f"1e-3, 7e-12 at 1e-6, 1e-5 at 1e-12; α → 1 is softmax: use "
                    f"normalisation='softmax'), got {a}."
                )
            object.__setattr__(self, "alpha", float(a))
        if self.name == "sigmoid" and self.bias is not None:
            b = self.bias
            if (
                isinstance(b, (bool, np.bool_))
                or not isinstance(b, numbers.Real)
                or not math.isfinite(float(b))
            ):
                raise ValueError(f"bias must be a finite real number, got {b!r}.")
            object.__setattr__(self, "bias", float(b))
        if self.sink is not None:
            b = self.sink
            if isinstance(b, (bool, np.bool_)) or not isinstance(b, numbers.Real):
                raise TypeError(f"sink must be a real number (the margin b), got {b!r}.")
            if not math.isfinite(float(b)):
                raise ValueError(f"sink must be a finite margin b, got {b}.")
            if self.name not in ("softmax", "scalable"):
                raise ValueError(
                    f"sink applies to softmax and scalable softmax, not {self.name!r}; "
                    "leave it unset."
                )
            object.__setattr__(self, "sink", float(b))

    @classmethod
    def parse(cls, normalisation) -> Normalisation:
        """The one way in: a :class:`Normalisation` from any of the ways the book names an
        attention map. ``normalisation`` is a Normalisation (returned as it is), a name of
        :data:`NORMALISATIONS`, the paper's ``"raf"`` (random attention features: softmax,
        ``β = 1``, eq. :eq:`eq-raf`; ``"relu"`` is already a name, eq.
        :eq:`eq-relu-attention`), or a dict of the fields (``{"name": "scalable", "s": 2.0}``).

        Raises
        ------
        TypeError
            If ``normalisation`` is none of these types.
        ValueError
            If the name is unknown, a dict has other keys or no ``"name"``, or a field is out
            of range (see the class)."""
        if isinstance(normalisation, cls):
            return normalisation
        if isinstance(normalisation, str):
            if normalisation == "raf":
                return cls("softmax")
            if normalisation not in NORMALISATIONS:
                raise ValueError(
                    f"normalisation must be one of {NORMALISATIONS} or the paper's 'raf' "
                    f"(softmax), a dict of Normalisation's fields or a Normalisation, got "
                    f"{normalisation!r}."
                )
            return cls(normalisation)
        if isinstance(normalisation, dict):
            fields = {"name", "beta", "s", "alpha", "bias", "sink"}
            if not set(normalisation) <= fields or "name" not in normalisation:
                raise ValueError(
                    "a normalisation dict needs 'name' and may have 'beta', 's', 'alpha', "
                    f"'bias', 'sink'; got keys {sorted(normalisation)}."
                )
            if not isinstance(normalisation["name"], str):
                raise TypeError(f"a normalisation dict's 'name' is a name, got {normalisation!r}.")
            name = cls.parse(normalisation["name"]).name  # "raf" is softmax
            return cls(**{**normalisation, "name": name})
        raise TypeError(
            "normalisation must be a name, a dict of Normalisation fields or a "
            f"Normalisation, got {type(normalisation).__name__}."
        )

    def scale(self, n: int) -> float:
        """The factor ``c_n`` multiplying the scores in a row of length ``n``."""
        c = self.beta
        if self.name == "scalable":
            c = c * self.s * math.log(n)
        return c

    def key_bias(self, n: int, like: torch.Tensor) -> torch.Tensor | None:
        """The logits added to the scaled scores of every row, ``(n,)``: the sink's margin
        ``b`` on key 0 and zero elsewhere (``None`` without a sink), in ``like``'s dtype and
        device."""
        if self.sink is None:
            return None
        bias = torch.zeros(n, dtype=like.dtype, device=like.device)
        bias[0] = self.sink
        return bias

    def sigmoid_bias(self, n: int) -> float:
        """``b``: ``bias`` if given, else ``−log n`` (sigmoid attention only)."""
        return -math.log(n) if self.bias is None else self.bias

    @property
    def row_stochastic(self) -> bool:
        """Whether every row of weights sums to one (all but ``"sigmoid"``; a ReLU row with no
        positive score is zero)."""
        return self.name != "sigmoid"


def sparsemax_threshold(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax's threshold ``τ`` with ``Σ_k [z_k − τ]_+ = 1`` along the last axis
    (:func:`sparsemax` is ``[z − τ]_+``; sort-based, exact up to rounding), keepdim. Trusts
    its caller: ``z`` a finite floating tensor, unchecked. Computed from ``z − max z``
    (translation invariance), on the ``k`` largest entries only (``torch.topk``), ``k``
    doubled until every row's support is shorter than ``k`` or ``k = n``: the same formula as
    a full sort, since only the support enters."""
    top = z.amax(dim=-1, keepdim=True).detach()
    n = z.shape[-1]
    k = min(n, 32)
    while True:
        zs = torch.topk(z - top, k, dim=-1, sorted=True).values
        r = torch.arange(1, k + 1, dtype=z.dtype, device=z.device)
        css = zs.cumsum(dim=-1)
        # the support is {1, …, K}: the largest K with 1 + K·z_(K) > Σ_{l ≤ K} z_(l) (K ≥ 1)
        inside = 1 + r * zs > css
        K = inside.sum(dim=-1, keepdim=True)
        if k == n or not bool(inside[..., -1].any()):
            break
        k = min(n, 4 * k)
    return (css.gather(-1, K - 1) - 1) / K.to(z.dtype) + top


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """Sparsemax along the last axis (Martins & Astudillo 2016): the Euclidean projection of
    ``z`` onto the probability simplex, ``[z − τ]_+`` with ``τ`` from a sort (torch,
    differentiable almost everywhere, batched).

    Raises
    ------
    ValueError
        If ``z`` is not a floating tensor with at least one entry on its last axis, or holds
        NaN or an infinity (the threshold has no meaning there)."""
    if not isinstance(z, torch.Tensor) or not z.is_floating_point() or z.ndim == 0:
        raise ValueError(f"z must be a floating torch tensor of scores, got {type(z).__name__}.")
    if z.shape[-1] == 0 or not all_finite(z):
        raise ValueError(
            "z must hold at least one score on its last axis, all finite (no NaN or inf); "
            f"got shape {tuple(z.shape)}."
        )
    return _sparsemax(z)


def _sparsemax(z: torch.Tensor) -> torch.Tensor:
    """:func:`sparsemax` without the checks, for the hot path (trusted scores)."""
    return torch.clamp(z - sparsemax_threshold(z), min=0)


def _hardmax(z: torch.Tensor) -> torch.Tensor:
    """Uniform weights on the largest entries of each row (the ``β → ∞`` limit of softmax)."""
    mask = (z == z.amax(dim=-1, keepdim=True)).to(z.dtype)
    return mask / mask.sum(dim=-1, keepdim=True)


def _rownorm_relu(z: torch.Tensor) -> torch.Tensor:
    a = torch.relu(z)
    mass = a.sum(dim=-1, keepdim=True)
    return a / torch.where(mass > 0, mass, torch.ones_like(mass))


def normalise_scores(s: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    """The attention weights ``norm(c_n·s + β)`` of eq. :eq:`eq-general-attention` for a score
    tensor ``(..., n_q, n)`` (torch, differentiable, unchecked); ``n`` is the last axis and
    ``β`` the sink's logits (:meth:`Normalisation.key_bias`; none without a sink)."""
    n = s.shape[-1]
    c = norm.scale(n)
    z = s if c == 1.0 else s * c
    bias = norm.key_bias(n, z)
    if bias is not None:  # the sink (eq. eq-sink-attention): a logit on key 0
        z = z + bias
    name = norm.name
    if name in ("softmax", "scalable"):
        return torch.softmax(z, dim=-1)
    if name == "sparsemax":
        return _sparsemax(z)
    if name == "entmax":
        try:
            from entmax import entmax15, entmax_bisect
        except ImportError as e:  # an optional dependency (pyproject extra "entmax")
            raise ImportError(
                "normalisation='entmax' needs the entmax package: "
                "pip install 'entmax>=1.3' (or make env)."
            ) from e
        if norm.alpha == 1.5:  # exact, sort-based (on the k largest, k doubled as needed)
            return entmax15(z, dim=-1, k=min(n, 64))
        # translation invariant: shifted so that (α − 1)z keeps its digits at large α (at
        # α = 1e20 the unshifted bisection returns NaN)
        return entmax_bisect(z - z.detach().amax(dim=-1, keepdim=True), alpha=norm.alpha, dim=-1)
    if name == "sigmoid":
        return torch.sigmoid(z + norm.sigmoid_bias(n))
    if name == "hardmax":
        return _hardmax(z)
    return _rownorm_relu(z)


def general_attention(X: torch.Tensor, W: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    """The kernel of :func:`attention`, ``norm(c_n·X W Xᵀ/√d) X`` (eq.
    :eq:`eq-general-attention`), for a :class:`Normalisation` ``norm``, on torch tensors
    (batched, differentiable). Trusts its caller: ``X`` ``(..., n, d)`` and ``W`` ``d × d``
    finite real tensors on one device, unchecked (:func:`attention` is the checked entry
    point). ReLU attention is the kernel of :func:`relu_attention` (``rownorm(ReLU(c·s))``
    does not depend on ``c > 0``); softmax with ``β = 1`` performs the very operations of
    :func:`softmax_attention`, so both are equal to the last bit.

    Raises
    ------
    ValueError
        If the scaled scores overflow the compute dtype or the output is not finite.
    """
    if norm.name == "relu":
        return _relu_attention(X, W)
    cd = _compute_dtype(X.dtype)
    Xc, Wc = X.to(cd), W.to(cd)
    s = attention_scores(Xc, Wc)
    c = norm.scale(s.shape[-1])
    # two reductions instead of an elementwise pass: a NaN or an inf reaches amax or amin
    hi, lo = float(s.detach().amax()), float(s.detach().amin())
    if not (math.isfinite(hi) and math.isfinite(lo)) or not math.isfinite(c * max(hi, -lo)):
        raise ValueError(
            f"the attention scores c·XWXᵀ/√d overflow {cd}: pass float64 input "
            "or a smaller W (or β)."
        )
    return _finite((normalise_scores(s, norm) @ Xc).to(X.dtype), norm.name)


def _finite(out: torch.Tensor, what: str) -> torch.Tensor:
    """``out``, or a ValueError if any entry is NaN or infinite (a map never returns them)."""
    if not all_finite(out.detach()):  # one pass, no temporary
        raise ValueError(
            f"the output of the {what} map is not finite "
            f"({int((~torch.isfinite(out.detach())).sum())} NaN or infinite "
            "entries): the inputs or weights are too large for its dtype, or its "
            "parameters outside the range where it is accurate."
        )
    return out


def attention(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "softmax",
    beta: float = 1.0,
    s: float | None = None,
    alpha: float | None = None,
    bias: float | None = None,
    sink: float | None = None,
    dtype: torch.dtype | None = None,
) -> Array:
    """Attention with a named row normalisation, ``φ(X) = norm(c_n·X W Xᵀ/√d) X``
    (eq. :eq:`eq-general-attention`; the normalisations and their parameters are those of
    :class:`Normalisation`: ``beta`` the inverse temperature, ``s`` scalable softmax's factor,
    ``alpha`` entmax's α, ``bias`` sigmoid attention's bias, default ``−log n``, ``sink`` the
    margin of an attention sink on position 0, eq. :eq:`eq-sink-attention`).

    ``normalisation`` is a name from :data:`NORMALISATIONS` or a :class:`Normalisation` (then
    ``beta``, ``s``, ``alpha``, ``bias`` must be left at their defaults). ``"softmax"`` with
    ``β = 1`` is :func:`raf` and ``"relu"`` is :func:`relu_attention`, to the last bit. Same
    input conventions as :func:`raf`; returns ``n × d``.

    Raises
    ------
    ValueError
        If the scores overflow, the output is not finite (NaN or infinite entries are never
        returned), or a parameter is out of range (e.g. entmax's ``alpha`` below
        :data:`ENTMAX_MIN_ALPHA`, where its bisection is no longer accurate: use softmax).
    """
    norm = _as_normalisation(normalisation, beta=beta, s=s, alpha=alpha, bias=bias, sink=sink)
    return _attention(X, W, dtype, lambda Xt, Wt: general_attention(Xt, Wt, norm))


def _as_normalisation(
    normalisation, *, beta=1.0, s=None, alpha=None, bias=None, sink=None
) -> Normalisation:
    """:meth:`Normalisation.parse`, with :func:`attention`'s loose parameters for a name."""
    if isinstance(normalisation, str):
        name = Normalisation.parse(normalisation).name
        return Normalisation(name, beta=beta, s=s, alpha=alpha, bias=bias, sink=sink)
    loose = (s, alpha, bias, sink)
    if not (isinstance(beta, numbers.Real) and beta == 1.0) or loose != (None,) * 4:
        raise ValueError(
            "normalisation is a Normalisation already: set beta, s, alpha, bias and "
            "sink in it, not beside it."
        )
    return Normalisation.parse(normalisation)
