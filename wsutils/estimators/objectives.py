"""The fast objectives of the attention estimator
(:func:`wsutils.estimators.self_attention.attention_word_sensitivity`): ``Δ ↦`` the relative change
of attention at word ``i``, in ``O(n·d)`` per (row, ``Δ``) pair, one class per family of
normalisations (softmax, ReLU, sigmoid, and the compact-support ones: sparsemax, entmax,
hardmax), made by :func:`fast_objective`.
"""

from __future__ import annotations

import math

import torch

from .._tensor import pow2_above
from ..maps import Normalisation, attention_scores, normalise_scores, sparsemax_threshold

__all__ = ["fast_objective"]


def _entmax_threshold(
    z: torch.Tensor, alpha: float, iters: int = 64, k: int = 128
) -> torch.Tensor:
    """A lower bound of ``τ`` with ``Σ_l [(α−1)z_l − τ]_+^{1/(α−1)} = 1`` along the last axis,
    keepdim (``−inf`` entries allowed), by bisection on the ``k`` largest entries of each row.

    The threshold is non-decreasing in every entry, and dropping an entry is lowering it to
    ``−inf``: so the threshold of the ``k`` largest entries is at most that of the whole row
    (equal to it when the support has at most ``k`` entries, as for every row of the
    chapter's texts but a few). Every bisection iterate ``lo`` has mass ``≥ 1``, so
    ``lo ≤ τ`` up to the rounding of that sum; the bisection runs on ``(α−1)(z − max z)``
    (translation invariance), so 64 halvings of the bracket ``[−1, −n^{1−α}]`` reach one
    ulp of 1 whatever ``(α−1)·max z``; ``(α−1)·max z`` is added back at the end.
    Cost ``O(n·k·iters)`` for ``n`` rows, instead of ``O(n²·iters)``."""
    top = z.amax(dim=-1, keepdim=True)
    zz = (alpha - 1) * (z - top)  # shifted: the bisection keeps its digits at any α
    n = z.shape[-1]
    if k < n:
        zz = torch.topk(zz, k, dim=-1).values
    lo, hi = torch.full_like(top, -1.0), torch.full_like(top, -(float(n) ** (1 - alpha)))
    for _ in range(iters):
        mid = (lo + hi) / 2
        mass = torch.clamp(zz - mid, min=0).pow(1 / (alpha - 1)).sum(dim=-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    return lo + (alpha - 1) * top


def _support_floor(s: torch.Tensor, norm: Normalisation) -> torch.Tensor:
    """Per row ``j`` a value ``f_j`` (keepdim) such that after *any* change of one entry ``i``
    of the row, no key ``k ≠ i`` with ``s_jk ≤ f_j`` carries weight (sparsemax, entmax,
    hardmax of the already scaled scores ``s``).

    The threshold ``τ`` of sparsemax/entmax is non-decreasing in every entry and symmetric, so
    changing entry ``i`` (at worst removing it) leaves it at least the threshold of the row with
    its *largest* entry removed: ``f_j`` is that threshold (in score units). For hardmax the new
    maximum is at least the second largest entry, which is ``f_j``. A one-word row has only its
    own key: ``f = s − 1``."""
    n = s.shape[-1]
    if n == 1:
        return s - 1
    top = s.argmax(dim=-1, keepdim=True)
    rest = s.scatter(-1, top, -math.inf)  # the row without its largest entry
    if norm.name == "hardmax":
        return rest.amax(dim=-1, keepdim=True)
    if norm.name == "sparsemax":
        return sparsemax_threshold(rest)
    return _entmax_threshold(rest, norm.alpha) / (norm.alpha - 1)


#: Rows of the compact update whose sets ``C_j`` are at least this fraction of their group's
#: largest share its padding (``_FastObjective._init_compact``).
_GROUP_RATIO = 0.6


class _FastObjective:
    """``Δ ↦ ‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖`` for a batch of (row, Δ) pairs in ``O(n·d)`` each.

    A change of row ``i`` changes, in every other output row ``j``, only the weight of key
    ``i``. Write ``m_ji`` for the mean of the *other* keys under row ``j``'s weights and ``ρ``,
    ``ρ'`` for the total weight of the other keys before and after; then
    ``φ_j = ρ m_ji + (1 − ρ) x_i``, ``φ'_j = ρ' m_ji + (1 − ρ')(x_i + Δ)`` and

        ``φ'_j − φ_j = (ρ' − ρ)(m_ji − x_i) + (1 − ρ')Δ``,

    whose squared norm needs ``‖m_ji − x_i‖²`` (cached, ``n × n``) and ``⟨m_ji − x_i, Δ⟩`` (one
    ``(B, d) × (d, n)`` product). Nothing is divided by a small number, so the update is exact
    up to rounding for every score scale, including the limit where one key takes all the
    weight (where the textbook rank-one update ``(Z − E_ji)`` cancels):

    - softmax: with ``ℓ_ji = log Σ_{k≠i} exp s_jk`` (a log-sum-exp, never a difference),
      ``ρ = σ(ℓ_ji − s_ji)`` and ``ρ' = σ(ℓ_ji − s'_ji)``, ``σ`` the logistic function, and
      ``ρ' − ρ = σ(a)σ(−b) − σ(b)σ(−a)`` (``a``, ``b`` those two arguments) has no cancellation
      beyond the genuine one of a small change;
    - ReLU: ``ρ = R/(R + α)``, ``ρ' = R/(R + β)`` with ``R = Σ_{k≠i} ReLU(s_jk)``, ``α``, ``β``
      the old and new weights of key ``i``, so ``ρ' − ρ = R(α − β)/((R + α)(R + β))``; when
      ``R = 0`` the row is ``x_i`` or zero before and after, and the change is written out.

    ``m_ji − x_i`` is ``Z_j(φ_j − x_i)/R_ji`` unless ``i`` is row ``j``'s largest weight
    (then ``R_ji ≥`` that weight ``≥ E_ji``, so ``Z_j/R_ji ≤ 2``); for the largest key it is
    stored as its own vector (``n × d``). Row ``i`` itself is recomputed from its ``n`` new scores.
    No ``(B, n, d)`` array is ever formed.

    The other normalisations of eq. :eq:`eq-general-attention` (a
    :class:`wsutils.maps.Normalisation`; the factor ``c_n`` is folded into ``W`` once):

    - softmax with ``β ≠ 1`` and scalable softmax: the softmax update above, on ``c_n·s``;
    - sigmoid: weights are entrywise, so only ``p_ji`` changes in row ``j``:
      ``φ'_j − φ_j = (p'_ji − p_ji)x_i + p'_ji Δ``, with ``p'_ji − p_ji`` written as
      ``σ(a')σ(−a) − σ(a)σ(−a')`` (no cancellation beyond the genuine one);
    - sparsemax, entmax, hardmax: their threshold is non-decreasing in every score, so after
      any change of one score ``i`` of row ``j`` no key ``k ≠ i`` below ``f_j`` (the threshold
      of the row without its largest entry; for hardmax its second largest entry) carries
      weight (``_support_floor``). Each row keeps the keys of ``C_j = {k : s_jk > f_j}`` (a
      handful for sparsemax and hardmax on isotropic texts, tens for 1.5-entmax), padded to the
      largest set of its group (rows of similar set size, ``_GROUP_RATIO``), their weights and
      Gram matrix (or the keys themselves when ``K > d``); a step recomputes row ``j``'s weights
      on those keys and key ``i`` (exact: the same threshold as the full row) and the squared
      change, ``O(n·K·(min(K, d) + d))``.
      The squared change is a sum of expanded terms: its absolute rounding error is of order
      ``u·(‖p' − p‖₁√d + p'_ji‖Δ‖)²`` per row, so a change that vanishes in exact arithmetic
      can come out of the square root at about ``√u`` times that size (harmless for the
      search, which looks for large changes; every reported value is recomputed with the map).

    The families share everything but the rows ``j ≠ i`` (``_others``): the scores, row ``i``
    recomputed from its ``n`` new scores (``_finish``) and the relative change.
    """

    def __init__(self, X: torch.Tensor, W: torch.Tensor, norm: Normalisation):
        self.X = X
        self.n, self.d = n, d = X.shape
        self.sqd = math.sqrt(d)
        # the factor c_n of the scores is folded into W once (c_n = 1 is skipped: the softmax
        # and ReLU paths then run exactly as before); every family below sees z = c_n·s
        self.W = self._scaled(W, norm.scale(n))
        # the normalisation of the already scaled scores (row i is recomputed with it)
        self.inner = self._inner(norm)
        with torch.no_grad():
            # the sink's logits β (eq. eq-sink-attention): on key 0, after c_n; every score
            # below (cached, new column, new row i) is z = c_n·s + β
            bias = norm.key_bias(n, X)
            self.bias = torch.zeros(n, dtype=X.dtype, device=X.device) if bias is None else bias
            s = attention_scores(X, self.W) + self.bias
            if not bool(torch.isfinite(s).all()):
                raise ValueError(
                    f"the attention scores c·XWXᵀ/√d overflow {X.dtype}: pass "
                    "float64 input or a smaller W."
                )
            self.s = s
            self.xsq = (X**2).sum(-1)  # ‖x_i‖²
            # s'_ji = x_j W x'_i/√d and s'_ik = x'_i W x_k/√d as one (B, d) × (d, n) product
            # each: x'_i (XW)ᵀ and x'_i (XWᵀ)ᵀ, with XW and XWᵀ made once here
            self.XW, self.XWt = X @ self.W, X @ self.W.T
            self._prepare(s)

    @property
    def pair_elements(self) -> int:
        """About how many entries one (row, ``Δ``) pair holds in a step, autograd's included:
        a few dozen ``n``-long rows and ``d``-long vectors
        (:func:`wsutils.sensitivity.ascend_rows` sizes its chunks by it)."""
        return 32 * self.n + 8 * self.d

    def _scaled(self, W: torch.Tensor, c: float) -> torch.Tensor:
        return W if c == 1.0 else W * c

    def _inner(self, norm: Normalisation) -> Normalisation:
        return Normalisation(norm.name)

    def _prepare(self, s: torch.Tensor) -> None:
        """The family's cached quantities, ``Phi`` and ``base_norm`` among them."""
        raise NotImplementedError

    def _others(self, row_idx, Delta, col, xD, dd) -> torch.Tensor:
        """The squared change of every row ``j`` (row ``i``'s entry is replaced later)."""
        raise NotImplementedError

    def _normalise(self, t: torch.Tensor) -> torch.Tensor:
        return normalise_scores(t, self.inner)

    def __call__(self, row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
        xi, xp, col, xD, dd = self._inputs(row_idx, Delta)
        sq = self._others(row_idx, Delta, col, xD, dd)
        return self._finish(sq, self._row_i(row_idx, Delta, xp))

    def _inputs(self, row_idx, Delta):
        """``x_i``, ``x'_i = x_i + Δ``, the new column ``s'_ji = x_j W x'_i/√d`` ``(B, n)``,
        ``⟨x_i, Δ⟩`` and ``‖Δ‖²``."""
        xi = self.X[row_idx]  # (B, d)
        xp = xi + Delta
        col = xp @ self.XW.T / self.sqd + self.bias[row_idx][:, None]
        return xi, xp, col, (xi * Delta).sum(-1, keepdim=True), (Delta**2).sum(-1, keepdim=True)

    def _row_i(self, row_idx, Delta, xp) -> dict:
        """Row ``i`` from its ``n`` new scores ``t`` (``s'_ik``, and ``x'_i W x'_i/√d`` at
        ``k = i``): its weights ``wrow``, ``w_ii`` and its change ``diff_i``, and what the
        gradient of ``‖diff_i‖²`` reuses."""
        X, W = self.X, self.W
        t = xp @ self.XWt.T / self.sqd  # s'_ik, k ≠ i
        onehot = torch.nn.functional.one_hot(row_idx, self.n).to(X.dtype)
        xpW = xp @ W
        t = t + onehot * ((xpW * xp).sum(-1, keepdim=True) / self.sqd - t) + self.bias
        wrow = self._normalise(t)
        wi = (wrow * onehot).sum(-1, keepdim=True)
        diff = wrow @ X + wi * Delta - self.Phi[row_idx]
        return dict(t=t, onehot=onehot, xpW=xpW, wrow=wrow, wi=wi, diff=diff)

    def _finish(self, sq, r: dict):
        """The relative change from the squared rows ``j ≠ i`` (``sq``) and row ``i``
        (``r``, :meth:`_row_i`)."""
        on = r["onehot"] > 0
        sq_all = torch.where(on, (r["diff"] ** 2).sum(-1, keepdim=True), sq.clamp_min(0))
        return torch.sqrt(sq_all.sum(-1)) / self.base_norm


class _KeyWeightObjective(_FastObjective):
    """Softmax and ReLU: rows ``j ≠ i`` are two-point mixtures (the class docstring of
    :class:`_FastObjective`); the subclasses give the weights ``E`` and the change of the
    other keys' total weight."""

    def _prepare(self, s: torch.Tensor) -> None:
        X, n = self.X, self.n
        idx = torch.arange(n, device=X.device)
        kstar = self._ranked(s).argmax(dim=1)
        top = (idx, kstar)  # entries (j, k*_j): O(n) edits
        self.top = torch.zeros(n, n, dtype=torch.bool, device=X.device)
        self.top[top] = True  # top[j, i]: i is j's largest key
        E, shift = self._weights(s)
        Z = E.sum(dim=1, keepdim=True)
        self.Phi = (E / torch.where(Z > 0, Z, torch.ones_like(Z))) @ X
        self.base_norm = float(torch.linalg.vector_norm(self.Phi))
        # R_ji = Σ_{k≠i} E_jk: Z − E off the largest key (no cancellation, R ≥ E_jk*),
        # and for the largest key the sum of the others, computed directly
        E_oth = E.clone()
        E_oth[top] = 0
        R_top = E_oth.sum(dim=1)
        R = Z - E
        R[top] = R_top
        self._other_keys(s, E, E_oth, R, R_top, top, shift)
        # ratio Z_j/R_ji (≤ 2 off the largest key) and V2[j, i] = ‖m_ji − x_i‖²
        self.ratio = Z / R.clamp_min(torch.finfo(R.dtype).tiny)  # 0 where Z = 0
        self.ratio[top] = 0
        # ‖φ_j − x_i‖² by expansion (one GEMM): its absolute error ≈ 2u·d is harmless
        # here, since off the largest key it is multiplied by (Z/R)² ≤ 4 and g² ≤ 1
        M = ((self.Phi**2).sum(-1)[:, None] - 2 * self.Phi @ X.T + self.xsq[None]).clamp_min(0)
        self.V2 = self.ratio**2 * M
        # on the largest key φ_j ≈ x_k* and the expansion would cancel: the difference
        # m̄_j − x_k* is formed directly (n vectors)
        self.V2[top] = ((self.Mbar - X[kstar]) ** 2).sum(-1)

    def _others(self, row_idx, Delta, col, xD, dd):
        cross = self._cross(row_idx, Delta, xD)[0]
        return self._mixture(row_idx, col, self.V2[:, row_idx].T, cross, xD, dd)[0]

    def _cross(self, row_idx, Delta, xD):
        """``⟨m_ji − x_i, Δ⟩``, ``(B, n)``: through ``m̄_j`` where ``i`` is row ``j``'s largest
        key (``top``), else through ``Z_j/R_ji·(φ_j − x_i)`` (``ratio``, ``Z_j/R_ji``);
        returned with ``top`` and ``ratio`` for the gradient."""
        top = self.top[:, row_idx].T  # is i row j's largest key? (B, n)
        ratio = self.ratio[:, row_idx].T
        cross = torch.where(top, Delta @ self.Mbar.T - xD, ratio * (Delta @ self.Phi.T - xD))
        return cross, top, ratio

    def evaluate(self, row_idx: torch.Tensor, Delta: torch.Tensor):
        """The ``evaluate`` of :func:`wsutils.sensitivity.ascend`: the relative changes
        ``(B,)`` and a function that returns the gradient of ``F = Σ_j ‖φ'_j − φ_j‖²`` (the
        squared change, increasing in the relative change ``√F/‖φ(X)‖``: the steps use only
        its direction), written out instead of by autograd (the chain rule through the
        mixtures of ``_mixture``, the row ``i`` of ``_row_i`` and the products with ``XW``,
        ``XWᵀ``, ``m̄`` and ``φ``; ``wsutils/estimators/objectives.py``'s class docstrings)."""
        X, sqd = self.X, self.sqd
        xi, xp, col, xD, dd = self._inputs(row_idx, Delta)
        cross, top, ratio = self._cross(row_idx, Delta, xD)
        sq, dcol, dcross, dxD, ddd = self._mixture(
            row_idx, col, self.V2[:, row_idx].T, cross, xD, dd, parts=True
        )
        r = self._row_i(row_idx, Delta, xp)

        def gradient() -> torch.Tensor:
            on = r["onehot"] > 0
            keep = ~on & (sq >= 0)  # the rows j ≠ i, where clamp_min passes the gradient
            zero = torch.zeros_like(sq)
            g_col = torch.where(keep, dcol, zero)
            g_cross = torch.where(keep, dcross, zero)
            g_dd = torch.where(keep, ddd, zero).sum(-1, keepdim=True)
            g_MD = torch.where(top, g_cross, zero)
            g_PD = torch.where(top, zero, g_cross * ratio)
            g_xD = -(g_MD + g_PD).sum(-1, keepdim=True)
            if dxD is not None:  # ⟨x_i, Δ⟩ outside the cross term (ReLU's rows with R = 0)
                g_xD = g_xD + torch.where(keep, dxD, zero).sum(-1, keepdim=True)
            g = g_MD @ self.Mbar + g_PD @ self.Phi + 2 * g_dd * Delta + g_xD * xi
            # row i: ‖diff‖² with diff = wrow X + w_ii Δ − φ_i
            g_diff = 2 * r["diff"]
            g_w = g_diff @ X.T + r["onehot"] * (g_diff * Delta).sum(-1, keepdim=True)
            g = g + r["wi"] * g_diff
            g_t = self._normalise_grad(r["t"], r["wrow"], g_w)
            g_tii = torch.where(on, g_t, zero).sum(-1, keepdim=True)
            g_t = torch.where(on, zero, g_t)
            g_xp = (g_col @ self.XW + g_t @ self.XWt + g_tii * (xp @ self.W.T + r["xpW"])) / sqd
            return g + g_xp

        return self._finish(sq, r), gradient


class _SoftmaxObjective(_KeyWeightObjective):
    """Softmax (``β``, scalable softmax: on ``c_n·s``), ``ρ = σ(ℓ_ji − s_ji)``."""

    def _inner(self, norm):
        return Normalisation("softmax")

    def _ranked(self, s):
        return s

    def _weights(self, s):
        shift = s.max(dim=1, keepdim=True).values
        return torch.exp(s - shift), shift

    def _other_keys(self, s, E, E_oth, R, R_top, top, shift):
        # from the scores, not from E: exp(s − max) underflows when k* dominates
        s_oth = s.clone()
        s_oth[top] = -math.inf
        lse_top = torch.logsumexp(s_oth, dim=1, keepdim=True)  # −inf if n = 1
        lse_fin = torch.where(torch.isfinite(lse_top), lse_top, torch.zeros_like(lse_top))
        self.Mbar = torch.exp(s_oth - lse_fin) @ self.X  # 0 if n = 1 (never used then)
        self.logR = torch.log(R.clamp_min(torch.finfo(R.dtype).tiny)) + shift
        self.logR[top] = lse_top[:, 0]

    def _mixture(self, row_idx, col, V2, cross, xD, dd, parts=False):
        """The squared change of rows ``j ≠ i``, ``g²V2 + 2gw·cross + w²‖Δ‖²``, and with
        ``parts`` its partial derivatives in ``col``, ``cross``, ``⟨x_i, Δ⟩`` (none: ``None``)
        and ``‖Δ‖²`` (``dg/da = σ(a)σ(−a) = −dw/da``, ``a = log R − col``)."""
        logR = self.logR[:, row_idx].T
        a = logR - col  # ρ' = σ(a)
        b = logR - self.s[:, row_idx].T  # ρ  = σ(b)
        sa, sma = torch.sigmoid(a), torch.sigmoid(-a)
        g = sa * torch.sigmoid(-b) - torch.sigmoid(b) * sma
        w = sma  # 1 − ρ'
        sq = g**2 * V2 + 2 * g * w * cross + w**2 * dd
        if not parts:
            return sq, None, None, None, None
        d_g, d_w = 2 * (g * V2 + w * cross), 2 * (g * cross + w * dd)
        return sq, sa * sma * (d_w - d_g), 2 * g * w, None, w**2

    def _normalise(self, t):
        return torch.softmax(t, dim=-1)

    def _normalise_grad(self, t, wrow, g_w):
        return wrow * (g_w - (wrow * g_w).sum(-1, keepdim=True))


class _ReluObjective(_KeyWeightObjective):
    """ReLU attention, ``ρ = R/(R + α)``; ``R = 0`` written out."""

    def _scaled(self, W, c):
        # rownorm(ReLU(c·s)) = rownorm(ReLU(s)): a power-of-two rescaling of W (exact)
        # keeps ReLU scores finite for any finite W
        return W / pow2_above(W)

    def _ranked(self, s):
        return torch.relu(s)

    def _weights(self, s):
        return torch.relu(s), None

    def _other_keys(self, s, E, E_oth, R, R_top, top, shift):
        self.Mbar = (E_oth / torch.where(R_top > 0, R_top, 1.0)[:, None]) @ self.X
        self.E, self.R = E, R

    def _mixture(self, row_idx, col, V2, cross, xD, dd, parts=False):
        """The squared change of rows ``j ≠ i`` and with ``parts`` its partial derivatives in
        ``col``, ``cross``, ``⟨x_i, Δ⟩`` and ``‖Δ‖²`` (``R > 0``: ``dg/dβ = −R/(R + β)²``,
        ``dw/dβ = R/(R + β)²``, ``β = ReLU(col)``; ``R = 0``: no derivative in ``col``)."""
        R = self.R[:, row_idx].T
        alpha, beta = self.E[:, row_idx].T, torch.relu(col)
        pos = R > 0
        one, zero = torch.ones_like(R), torch.zeros_like(R)
        Ra = torch.where(pos, R + alpha, one)
        Rb = torch.where(pos, R + beta, one)
        g = torch.where(pos, R * (alpha - beta) / (Ra * Rb), zero)
        w = torch.where(pos, beta / Rb, zero)
        sq_pos = g**2 * V2 + 2 * g * w * cross + w**2 * dd
        # R = 0: φ_j = 1[α>0]·x_i and φ'_j = 1[β>0]·(x_i + Δ)
        p, q = (beta > 0).to(self.X.dtype), (alpha > 0).to(self.X.dtype)
        xsq = self.xsq[row_idx][:, None]
        sq_zero = (p - q) ** 2 * xsq + 2 * (p - q) * p * xD + p * dd
        sq = torch.where(pos, sq_pos, sq_zero)
        if not parts:
            return sq, None, None, None, None
        d_g, d_w = 2 * (g * V2 + w * cross), 2 * (g * cross + w * dd)
        d_col = torch.where(pos & (col > 0), R / Rb**2 * (d_w - d_g), zero)
        d_cross = torch.where(pos, 2 * g * w, zero)
        d_xD = torch.where(pos, zero, 2 * (p - q) * p)
        d_dd = torch.where(pos, w**2, p)
        return sq, d_col, d_cross, d_xD, d_dd

    def _normalise(self, t):
        a = torch.relu(t)
        mass = a.sum(dim=-1, keepdim=True)
        return a / torch.where(mass > 0, mass, torch.ones_like(mass))

    def _normalise_grad(self, t, wrow, g_w):
        mass = torch.relu(t).sum(dim=-1, keepdim=True)
        inner = (g_w - (wrow * g_w).sum(-1, keepdim=True)) / torch.where(mass > 0, mass, 1.0)
        return torch.where((t > 0) & (mass > 0), inner, torch.zeros_like(t))


class _SigmoidObjective(_FastObjective):
    """Sigmoid attention: weights are entrywise, only ``p_ji`` changes in row ``j``."""

    def _inner(self, norm):
        return Normalisation("sigmoid", bias=norm.sigmoid_bias(self.n))

    def _prepare(self, s):
        self.Phi = normalise_scores(s, self.inner) @ self.X
        self.base_norm = float(torch.linalg.vector_norm(self.Phi))

    def _others(self, row_idx, Delta, col, xD, dd):
        """Rows ``j ≠ i`` of sigmoid attention: only ``p_ji`` changes,
        ``φ'_j − φ_j = (p'_ji − p_ji)x_i + p'_ji Δ``."""
        b = self.inner.bias
        a_new, a_old = col + b, self.s[:, row_idx].T + b
        g = torch.sigmoid(a_new) * torch.sigmoid(-a_old) - torch.sigmoid(a_old) * torch.sigmoid(
            -a_new
        )
        w = torch.sigmoid(a_new)
        xsq = self.xsq[row_idx][:, None]
        return g**2 * xsq + 2 * g * w * xD + w**2 * dd


class _CompactObjective(_FastObjective):
    """Sparsemax, entmax, hardmax: row ``j``'s weights recomputed on the keys that can carry
    weight after any change of one score (``_support_floor``)."""

    @property
    def pair_elements(self) -> int:
        """The full map's ``n·d`` a pair: a group's step holds ``(B, n_g, K)`` arrays, and
        ``(B, n_g, d)`` ones when ``K > d``."""
        return self.n * self.d

    def _inner(self, norm):
        if norm.name == "entmax":
            return Normalisation("entmax", alpha=norm.alpha)
        return Normalisation(norm.name)

    def _prepare(self, s: torch.Tensor) -> None:
        """Sparsemax, entmax, hardmax: per row ``j`` the keys that can carry weight after any
        change of one score, ``C_j = {k : z_jk > f_j}`` (see the class docstring). The rows are
        sorted by ``|C_j|`` and cut into groups whose sizes stay within a factor
        ``_GROUP_RATIO`` of the group's largest (a handful of groups); each group keeps the
        ``K_g = max |C_j|`` largest scores of its rows, padded below ``f_j``, so a step costs
        ``Σ_g n_g·K_g·min(K_g, d)`` instead of ``n·K·min(K, d)`` with ``K`` the largest set of
        all rows (entmax's sets vary from a few keys to a hundred at ``n = 4096``)."""
        X, n, d, name = self.X, self.n, self.d, self.inner.name
        f = _support_floor(s, self.inner)  # (n, 1)
        tol = 64 * torch.finfo(s.dtype).eps * (1 + s.abs().amax(dim=1, keepdim=True))
        count = (s > f - tol).sum(dim=1)  # ≥ 1: the top key is in C_j
        unit = (self.inner.alpha - 1) if name == "entmax" else 1.0
        pad = f - 1 / unit  # below every possible threshold
        order = torch.argsort(count, descending=True, stable=True)
        sizes = count[order].tolist()
        self.groups, start = [], 0
        while start < n:
            K = sizes[start]
            stop = start + 1
            while stop < n and sizes[stop] >= _GROUP_RATIO * K:
                stop += 1
            rows = order[start:stop]
            zC, Cidx = torch.topk(s[rows], K, dim=1)  # each C_j: its row's |C_j| largest
            valid = torch.arange(K, device=X.device)[None] < count[rows][:, None]
            g = {
                "rows": rows,
                "Cidx": Cidx,
                "valid": valid,
                "pad": pad[rows],
                "zC": torch.where(valid, zC, pad[rows]),
            }
            g["pC"] = normalise_scores(g["zC"], self.inner)  # old weights (exact zeros off)
            XC = X[Cidx]  # (n_g, K, d)
            # the squared change: a Gram quadratic form (K ≤ d) or the vector itself (K > d)
            g["GC" if K <= d else "XC"] = XC @ XC.transpose(1, 2) if K <= d else XC
            self.groups.append(g)
            start = stop
        self.inv_order = torch.argsort(order)
        self.Phi = normalise_scores(s, self.inner) @ X
        self.base_norm = float(torch.linalg.vector_norm(self.Phi))

    def _others(self, row_idx, Delta, col, xD, dd):
        """Rows ``j ≠ i`` of sparsemax, entmax, hardmax: the row's weights on ``C_j ∪ {i}``
        recomputed (exact: no other key can enter), and the squared norm of
        ``v = Σ_k c_k x_k + c_i x_i + p'_ji Δ`` (``c = p' − p``), group by group: as a quadratic
        form in the Gram matrices of the ``C_j`` when ``K_g ≤ d``, else from ``v`` itself."""
        Gx = self.X[row_idx] @ self.X.T  # ⟨x_k, x_i⟩, (B, n)
        Dx = Delta @ self.X.T  # ⟨x_k, Δ⟩
        xsq = self.xsq[row_idx][:, None]
        out = []
        for g in self.groups:
            rows, Cidx, valid = g["rows"], g["Cidx"], g["valid"]
            B, (m, K) = row_idx.shape[0], Cidx.shape
            colg = col[:, rows]
            inC = (Cidx[None] == row_idx[:, None, None]) & valid[None]  # (B, n_g, K)
            hasI = inC.any(-1)  # (B, n_g)
            zN = torch.where(inC, colg[..., None], g["zC"][None])
            last = torch.where(hasI, g["pad"][:, 0][None], colg)
            pN = normalise_scores(torch.cat([zN, last[..., None]], dim=-1), self.inner)
            cC = pN[..., :K] - g["pC"][None]  # change of the weights on C_j
            cL = torch.where(hasI, torch.zeros_like(colg), pN[..., K])  # key i outside C_j
            wI = torch.where(hasI, (pN[..., :K] * inC).sum(-1), pN[..., K])  # new weight of i
            if "GC" in g:
                idx = Cidx.reshape(1, -1).expand(B, -1)
                Gi = Gx.gather(1, idx).reshape(B, m, K)
                Di = Dx.gather(1, idx).reshape(B, m, K)
                quad = torch.einsum("bnk,nkl,bnl->bn", cC, g["GC"], cC)
                out.append(
                    quad
                    + 2 * cL * (cC * Gi).sum(-1)
                    + cL**2 * xsq
                    + 2 * wI * ((cC * Di).sum(-1) + cL * xD)
                    + wI**2 * dd
                )
            else:
                v = (
                    torch.einsum("bnk,nkd->bnd", cC, g["XC"])
                    + cL[..., None] * self.X[row_idx][:, None]
                    + wI[..., None] * Delta[:, None]
                )
                out.append((v**2).sum(-1))
        return torch.cat(out, dim=1)[:, self.inv_order]


#: The fast objective of each family of normalisations, by name (every other name of
#: :data:`wsutils.maps.NORMALISATIONS`: the compact-support update).
FAMILIES = {
    "softmax": _SoftmaxObjective,
    "scalable": _SoftmaxObjective,
    "relu": _ReluObjective,
    "sigmoid": _SigmoidObjective,
}


def fast_objective(X: torch.Tensor, W: torch.Tensor, norm: Normalisation) -> _FastObjective:
    """The fast objective of attention with ``norm`` at the text ``X`` (a finite ``n × d``
    tensor, trusted) and weights ``W`` (``d × d``, in ``X``'s dtype): a callable
    ``(row_idx, Delta) ↦`` relative changes ``(B,)``, with ``Phi`` (``φ(X)``) and
    ``base_norm`` (``‖φ(X)‖``), made by the class of ``FAMILIES`` for ``norm.name``. A
    ValueError if the scores overflow ``X``'s dtype."""
    return FAMILIES.get(norm.name, _CompactObjective)(X, W, norm)
