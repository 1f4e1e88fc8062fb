"""The verification literature's baseline for our certificates: interval bound propagation
(IBP) through softmax attention, written from the method's description (Gowal et al., 2018;
the baseline of Shi et al., *Robustness Verification for Transformers*, ICLR 2020, who certify
a classifier's margin when a word's embedding moves in an ℓp ball and bound every
intermediate quantity on the way), here for the same quantity as
:func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`: the relative change of
``φ(X) = softmax(c·XWXᵀ/√d + b)X`` when word ``i`` moves by ``‖Δ‖ ≤ √d``.

IBP gives every intermediate quantity an interval, entry by entry, and propagates them with
interval arithmetic:

1. the scores over the ball exactly (a tightened IBP: a verifier's IBP bounds ``q`` and ``k``
   entry by entry and multiplies the intervals, which is looser): a
   score ``z_jk`` with ``i`` on one side moves by at most ``c‖Wᵀx_j‖`` (key ``i``) or
   ``c‖Wx_k‖`` (query ``i``); ``z_ii``, quadratic in ``Δ``, by ``c(‖(W + Wᵀ)x_i‖√d +
   max(|λ_min|, |λ_max|)·d)/√d`` with ``λ`` the eigenvalues of ``(W + Wᵀ)/2``; the value
   ``x_i + Δ`` lies in the box ``x_i ± √d`` (each entry);
2. each softmax weight in ``[e^{l_k}/(e^{l_k} + Σ_{m≠k} e^{u_m}),
   e^{u_k}/(e^{u_k} + Σ_{m≠k} e^{l_m})]`` from the score intervals ``[l, u]`` (the exact box
   of the softmax, where a verifier's IBP splits it into exp, sum and reciprocal);
3. each output entry ``Σ_k a_jk v_km`` as a sum of products of intervals.

Every output entry then lies in ``[L, U]`` for every ``Δ`` in the ball, so the change is at
most ``‖max(U − φ, φ − L)‖_F`` (entrywise). The intervals forget that the weights of a row sum
to one and that one ``Δ`` moves them all: that is what our certificates use. Cost ``O(n²d)``
per word (every row's weights and values as intervals).

:func:`crown_upper` is a linear-relaxation baseline in the style of CROWN (Zhang et al., 2018)
and of Shi et al., 2020, forward only (weaker than CROWN's backward pass with optimised
slopes): every intermediate quantity gets two linear functions of ``Δ``, one below it and one
above, on the whole ball, built node by node:

1. a scalar nonlinearity ``f`` (``exp``, ``1/x``, ``sigmoid``) on an interval ``[l, u]`` is
   bounded by the two lines of the chord's slope that touch ``f`` from below and from above
   (the tightest lines of that slope), composed with the linear bounds of its argument;
2. a product of two bounded quantities by McCormick's planes, each plane composed with the
   factors' linear bounds by the sign of its coefficient (of the two planes of a side, the one
   whose bound over the ball is tighter);
3. a linear function ``aᵀΔ + b`` is at least ``b − √d‖a‖`` and at most ``b + √d‖a‖`` on the
   ball (the dual norm).

Rows ``j ≠ i`` move through one weight, key ``i``'s, a sigmoid of the linear score shift
``x_jᵀWΔ/√d`` (tighter than relaxing its ``exp``, sum and reciprocal one by one); row ``i``
goes through ``exp``, the sum, the reciprocal and the products, its own score's quadratic part
kept as IBP's interval. Every interval is the tighter of this and IBP's (as CROWN-IBP does), so
the bound is never above :func:`ibp_upper`'s. Both are computed in float64 without a rounding
allowance: baselines to compare with, not certificates. Cost ``O(n²d + n·d²)`` per word.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._tensor import Array
from ..checks import as_tensor, as_text, check_rows, check_shape
from ..maps import Normalisation, attention_scores

__all__ = ["ibp_upper", "crown_upper"]


def ibp_upper(
    X: Array, W: Array, *, normalisation: str | Normalisation = "raf", rows=None
) -> np.ndarray:
    """Per word ``i`` of ``rows`` (``None``: every word), interval bound propagation's bound on
    ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for softmax attention (any ``β``, scalable
    softmax, a sink's logit on key 0; module docstring). Float64, no rounding allowance. With a
    sink, row 0 is the sink's token, not a word: its entry is ``inf``, as for
    :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`."""
    p = _Problem(X, W, normalisation, "ibp_upper")
    return p.each(check_rows(rows, p.n), lambda i: p.ibp(i)[2:])


def crown_upper(
    X: Array, W: Array, *, normalisation: str | Normalisation = "raf", rows=None
) -> np.ndarray:
    """Per word ``i`` of ``rows`` (``None``: every word), the linear-relaxation (CROWN-style)
    bound on ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for softmax attention, each output
    entry's interval the tighter of the relaxation's and :func:`ibp_upper`'s (module
    docstring): never above :func:`ibp_upper`. Float64, no rounding allowance; ``inf`` at a
    sink's token."""
    p = _Problem(X, W, normalisation, "crown_upper")
    return p.each(check_rows(rows, p.n), p.crown)


class _Problem:
    """One text, its weights and its softmax attention, shared by the two baselines."""

    def __init__(self, X, W, normalisation, name: str):
        norm = Normalisation.parse(normalisation)
        if norm.name not in ("softmax", "scalable"):
            raise ValueError(f"{name} bounds softmax attention, not {norm.name!r}.")
        self.X, self.n, self.d = as_text(X, dtype=torch.float64)
        self.W = as_tensor(W, dtype=torch.float64)
        check_shape("W", self.W, (self.d, self.d), f"d × d with d = {self.d}, the width of X")
        self.c, self.r = norm.scale(self.n), math.sqrt(self.d)
        bias = norm.key_bias(self.n, self.X)
        self.sink = bias is not None
        self.z = self.c * attention_scores(self.X, self.W) + (0 if bias is None else bias)
        self.phi = torch.softmax(self.z, dim=1) @ self.X
        self.base = float(torch.linalg.vector_norm(self.phi))
        self.key_move = self.c * torch.linalg.vector_norm(self.X @ self.W, dim=1)  # c‖Wᵀx_j‖
        self.query_move = self.c * torch.linalg.vector_norm(self.X @ self.W.T, dim=1)  # c‖Wx_k‖
        eig = torch.linalg.eigvalsh((self.W + self.W.T) / 2)
        # cΔᵀWΔ/√d over the ball: ΔᵀWΔ ∈ [min(λ_min, 0), max(λ_max, 0)]·d (‖Δ‖² runs from 0
        # to d), times c/√d, its ends in order whatever the sign of c
        ends = sorted(
            self.c * v * self.r for v in (min(float(eig.min()), 0.0), max(float(eig.max()), 0.0))
        )
        self.quad = (ends[0], ends[1])
        self.self_lin = self.c * (self.X @ (self.W + self.W.T)) / self.r  # row i: h_ii
        # the score shifts' slopes in Δ: key i in row j, g_j = cWᵀx_j/√d; query i against key
        # k, h_k = cWx_k/√d (the same for every word, so computed once)
        self.G = self.c * (self.X @ self.W) / self.r
        self.G_norm = torch.linalg.vector_norm(self.G, dim=1)
        self.H = self.c * (self.X @ self.W.T) / self.r
        quad = max(abs(self.quad[0]), abs(self.quad[1]))  # |cΔᵀWΔ|/√d ≤ c·max|λ|·√d
        self.self_move = self.r * torch.linalg.vector_norm(self.self_lin, dim=1) + quad

    def each(self, words, bound) -> np.ndarray:
        """``bound(i) = (L, U)`` on the changed output for each word, as the relative change."""
        out = []
        for i in words:
            if self.sink and i == 0:
                out.append(math.inf)  # the sink's token is not a word
                continue
            L, U = bound(i)
            dev = torch.maximum(U - self.phi, self.phi - L)
            out.append(float(torch.linalg.vector_norm(dev)) / self.base)
        return np.array(out)

    def score_box(self, i: int):
        """The exact interval of every score over the ball when word ``i`` moves."""
        z = self.z
        lo, hi = z.clone(), z.clone()
        lo[:, i] -= self.key_move  # key i in every row
        hi[:, i] += self.key_move
        lo[i] = z[i] - self.query_move  # row i: its query moves against every key
        hi[i] = z[i] + self.query_move
        lo[i, i], hi[i, i] = z[i, i] - self.self_move[i], z[i, i] + self.self_move[i]
        return lo, hi

    def ibp(self, i: int, box=None):
        """IBP's weight and output intervals for word ``i``: ``(a_lo, a_hi, L, U)``; ``box``:
        :meth:`score_box` of ``i`` if already computed."""
        a_lo, a_hi = _softmax_interval(*(self.score_box(i) if box is None else box))
        v_lo, v_hi = self.X.clone(), self.X.clone()
        v_lo[i] -= self.r  # the box around x_i + Δ
        v_hi[i] += self.r
        return (a_lo, a_hi, *_matmul_interval(a_lo, a_hi, v_lo, v_hi))

    def crown(self, i: int):
        """The relaxation's output intervals for word ``i``, intersected with IBP's."""
        box = self.score_box(i)
        a_lo, a_hi, L, U = self.ibp(i, box)
        lo, hi = self._other_rows(i)
        lo, hi = self.phi + lo, self.phi + hi
        lo[i], hi[i] = self._own_row(i, a_lo[i], a_hi[i], box)
        return torch.maximum(L, lo), torch.minimum(U, hi)

    def _other_rows(self, i: int):
        """Bounds on the change of every row ``j`` (row ``i``'s entries unused): row ``j``
        moves by ``(p − p₀)(x_i − v̄_j) + pΔ``, ``p = sigmoid(t₀ + g_jᵀΔ)`` key ``i``'s weight,
        ``g_j = cWᵀx_j/√d``; each entry's two McCormick planes for ``pΔ_m``, the tighter kept."""
        X, r, z = self.X, self.r, self.z
        others = torch.arange(self.n) != i
        G, g = self.G, self.G_norm  # g_j and its norm
        t0 = z[:, i] - torch.logsumexp(z[:, others], dim=1)
        tl, tu = t0 - g * r, t0 + g * r
        k, b_lo, b_hi = _lines(torch.sigmoid, tl, tu, _sigmoid_touch)
        p0, p_lo, p_hi = torch.sigmoid(t0), torch.sigmoid(tl), torch.sigmoid(tu)
        w = X[i] - torch.softmax(z[:, others], dim=1) @ X[others]  # x_i − v̄_j
        # (p − p₀)w_jm: below by the line under p where w ≥ 0, the line over it where w < 0
        col = lambda v: v[:, None]  # noqa: E731
        under, over = col(k * t0 + b_lo - p0) * w, col(k * t0 + b_hi - p0) * w
        first_lo = torch.where(w >= 0, under, over)
        first_hi = torch.where(w >= 0, over, under)
        # pΔ_m ≥ p_lo·Δ_m − r·p + r·p_lo  and  ≥ p_hi·Δ_m + r·p − r·p_hi (Δ_m ∈ [−r, r]);
        # ≤ p_hi·Δ_m − r·p + r·p_hi  and  ≤ p_lo·Δ_m + r·p − r·p_lo; each −r·p or +r·p by the
        # line of p on the side that keeps the inequality
        planes = {
            "lo": ((p_lo, -1.0, b_hi), (p_hi, 1.0, b_lo)),
            "hi": ((p_hi, -1.0, b_lo), (p_lo, 1.0, b_hi)),
        }
        best = {}
        for side, first, sign_out in (("lo", first_lo, -1.0), ("hi", first_hi, 1.0)):
            for alpha, sign, b in planes[side]:
                K = col(k) * w + col(sign * r * k)  # the plane's slope along g_j
                const = first + col(sign * r * (k * t0 + b) - sign * r * alpha)
                norm2 = K**2 * col(g**2) + 2 * K * col(alpha) * G + col(alpha**2)
                val = const + sign_out * r * torch.sqrt(norm2.clamp(min=0))
                pick = torch.maximum if side == "lo" else torch.minimum
                best[side] = val if side not in best else pick(best[side], val)
        return best["lo"], best["hi"]

    def _own_row(self, i: int, a_lo, a_hi, box):
        """Bounds on row ``i`` after the change: ``e^{z_k}`` (less the largest score), their sum
        ``σ``, ``1/σ``, the weights ``e^{z_k}/σ`` and the output ``Σ_k a_k v_k`` with
        ``v_i = x_i + Δ``, each a pair of linear functions of ``Δ`` (module docstring);
        ``a_lo``, ``a_hi``: IBP's weight intervals, intersected with the relaxation's; ``box``:
        the scores' intervals (:meth:`score_box`)."""
        X, r, d = self.X, self.r, self.d
        slope = self.H.clone()  # row k: h_k, the score z_ik's slope
        slope[i] = self.self_lin[i]
        lo_box, hi_box = box
        zl, zu = lo_box[i], hi_box[i]
        top = float(zu.max())
        c_lo, c_hi = self.z[i] - top, self.z[i] - top  # the forms' constants (less the top)
        c_lo, c_hi = c_lo.clone(), c_hi.clone()
        c_lo[i] += self.quad[0]  # z_ii's quadratic part: its interval
        c_hi[i] += self.quad[1]
        k, b_lo, b_hi = _lines(torch.exp, zl - top, zu - top, lambda k: [torch.log(k)])
        E = _Form(k[:, None] * slope, k * c_lo + b_lo, k * c_hi + b_hi, r)
        E.clip(torch.exp(zl - top), torch.exp(zu - top))
        S = E.sum()
        S.lo_box = S.lo_box.clamp(min=torch.finfo(torch.float64).tiny)
        kR, bR_lo, bR_hi = _lines(
            torch.reciprocal, S.lo_box, S.hi_box, lambda k: [torch.rsqrt(-k)]
        )
        # 1/σ decreases: its lower line takes σ's upper form, its upper line σ's lower form
        R = _Form(
            kR * S.slope_hi,
            kR * S.const_hi + bR_lo,
            kR * S.const_lo + bR_hi,
            r,
            slope_hi=kR * S.slope_lo,
        )
        R.clip(1 / S.hi_box, 1 / S.lo_box)
        A = E.times(R)
        A.clip(a_lo, a_hi)
        # Σ_{k≠i} a_k x_km: each weight's lower form where x_km ≥ 0, its upper one elsewhere
        V = X.clone()
        V[i] = 0
        P, N = V.clamp(min=0).T, V.clamp(max=0).T
        out = _Form(
            P @ A.slope_lo + N @ A.slope_hi,
            P @ A.const_lo + N @ A.const_hi,
            P @ A.const_hi + N @ A.const_lo,
            r,
            slope_hi=P @ A.slope_hi + N @ A.slope_lo,
        )
        # a_i·(x_im + Δ_m), v_m ∈ [x_im − r, x_im + r]: McCormick, the tighter plane per entry
        own = A.row(i)
        value = _Form(torch.eye(d, dtype=X.dtype), X[i], X[i], r)
        value.clip(X[i] - r, X[i] + r)
        return out.plus(own.times(value)).box()


def _lines(f, l, u, touch):
    """The two lines of the chord's slope ``k`` that bound ``f`` on ``[l, u]`` (entrywise):
    ``(k, b_lo, b_hi)`` with ``k t + b_lo ≤ f(t) ≤ k t + b_hi`` there, ``b_lo``/``b_hi`` the
    least/largest ``f(t) − k t`` over the endpoints and the points ``touch(k)`` where
    ``f' = k`` (inside ``[l, u]``). An interval narrower than ``1e-9(1 + |l|)`` is widened to
    that (a wider interval still contains the argument)."""
    u = torch.maximum(u, l + 1e-9 * (1 + l.abs()))
    k = (f(u) - f(l)) / (u - l)
    with torch.no_grad():
        cands = [l, u] + [torch.where((t > l) & (t < u), t, l) for t in touch(k)]
    gaps = torch.stack([f(t) - k * t for t in cands])
    return k, gaps.min(dim=0).values, gaps.max(dim=0).values


def _sigmoid_touch(k):
    """Where ``sigmoid' = sigmoid(1 − sigmoid) = k``: the two logits of ``(1 ± √(1 − 4k))/2``."""
    root = torch.sqrt((1 - 4 * k).clamp(min=0))
    return [torch.logit((1 - root) / 2), torch.logit((1 + root) / 2)]


class _Form:
    """Scalars ``q_1 … q_m`` with a linear function of ``Δ`` below and one above each
    (``slope_lo[k]ᵀΔ + const_lo[k] ≤ q_k ≤ slope_hi[k]ᵀΔ + const_hi[k]`` on the ball of radius
    ``r``) and an interval ``[lo_box, hi_box]``: the two functions' extremes on the ball
    (module docstring, step 3), narrowed by :meth:`clip`."""

    def __init__(self, slope_lo, const_lo, const_hi, r, *, slope_hi=None):
        self.slope_lo = slope_lo
        self.slope_hi = slope_lo if slope_hi is None else slope_hi
        self.const_lo, self.const_hi, self.r = const_lo, const_hi, r
        self.lo_box = const_lo - r * torch.linalg.vector_norm(self.slope_lo, dim=-1)
        self.hi_box = const_hi + r * torch.linalg.vector_norm(self.slope_hi, dim=-1)

    def clip(self, lo, hi) -> None:
        """Narrow the intervals to ``[lo, hi]``, known bounds on the same scalars."""
        self.lo_box, self.hi_box = torch.maximum(self.lo_box, lo), torch.minimum(self.hi_box, hi)

    def box(self):
        return self.lo_box, self.hi_box

    def row(self, k: int) -> "_Form":
        """The scalar ``q_k`` alone."""
        f = _Form(
            self.slope_lo[k : k + 1],
            self.const_lo[k : k + 1],
            self.const_hi[k : k + 1],
            self.r,
            slope_hi=self.slope_hi[k : k + 1],
        )
        f.clip(self.lo_box[k : k + 1], self.hi_box[k : k + 1])
        return f

    def sum(self) -> "_Form":
        """``Σ_k q_k`` as one scalar."""
        f = _Form(
            self.slope_lo.sum(0, keepdim=True),
            self.const_lo.sum(0, keepdim=True),
            self.const_hi.sum(0, keepdim=True),
            self.r,
            slope_hi=self.slope_hi.sum(0, keepdim=True),
        )
        f.clip(self.lo_box.sum(0, keepdim=True), self.hi_box.sum(0, keepdim=True))
        return f

    def plus(self, other: "_Form") -> "_Form":
        f = _Form(
            self.slope_lo + other.slope_lo,
            self.const_lo + other.const_lo,
            self.const_hi + other.const_hi,
            self.r,
            slope_hi=self.slope_hi + other.slope_hi,
        )
        f.clip(self.lo_box + other.lo_box, self.hi_box + other.hi_box)
        return f

    def _scaled(self, a, side: str):
        """``a·q`` (``a`` a column of numbers) bounded on ``side``: the form of ``q`` on that
        side where ``a ≥ 0``, of the other side elsewhere. ``(slope, const)``."""
        same = (a >= 0)[..., None] if side == "lo" else (a < 0)[..., None]
        slope = torch.where(same, self.slope_lo, self.slope_hi) * a[..., None]
        const = torch.where(same[..., 0], self.const_lo, self.const_hi) * a
        return slope, const

    def times(self, other: "_Form") -> "_Form":
        """``q_k·o_k`` (broadcast) by McCormick's planes (module docstring, step 2): below,
        ``q_lo·o + o_lo·q − q_lo·o_lo`` and ``q_hi·o + o_hi·q − q_hi·o_hi``; above,
        ``q_hi·o + o_lo·q − q_hi·o_lo`` and ``q_lo·o + o_hi·q − q_lo·o_hi``; of each side the
        plane with the tighter extreme on the ball, the interval also narrowed to the
        product of the two intervals."""
        ql, qh, ol, oh = self.lo_box, self.hi_box, other.lo_box, other.hi_box
        sides = {}
        for side, pairs, sign in (
            ("lo", ((ql, ol), (qh, oh)), -1.0),
            ("hi", ((qh, ol), (ql, oh)), 1.0),
        ):
            best = None
            for qc, oc in pairs:
                s_o, c_o = other._scaled(qc + 0 * oc, side)
                s_q, c_q = self._scaled(oc + 0 * qc, side)
                slope, const = s_o + s_q, c_o + c_q - qc * oc
                ext = const + sign * self.r * torch.linalg.vector_norm(slope, dim=-1)
                if best is None:
                    best = (ext, slope, const)
                else:
                    better = ext > best[0] if side == "lo" else ext < best[0]
                    best = tuple(
                        torch.where(better[..., None] if x.ndim > better.ndim else better, x, y)
                        for x, y in zip((ext, slope, const), best)
                    )
            sides[side] = best
        f = _Form(sides["lo"][1], sides["lo"][2], sides["hi"][2], self.r, slope_hi=sides["hi"][1])
        corners = torch.stack([ql * ol, ql * oh, qh * ol, qh * oh])
        f.clip(corners.min(dim=0).values, corners.max(dim=0).values)
        return f


def _softmax_interval(lo: torch.Tensor, hi: torch.Tensor):
    """Entrywise bounds on ``softmax(z)`` over the box ``lo ≤ z ≤ hi`` (row by row): weight
    ``k`` is smallest with its own score at ``lo`` and the others' at ``hi``, and the reverse."""
    m = torch.maximum(hi.max(dim=1, keepdim=True).values, lo.max(dim=1, keepdim=True).values)
    e_lo, e_hi = torch.exp(lo - m), torch.exp(hi - m)
    s_lo, s_hi = e_lo.sum(dim=1, keepdim=True), e_hi.sum(dim=1, keepdim=True)
    a_lo = e_lo / (e_lo + (s_hi - e_hi))
    a_hi = e_hi / (e_hi + (s_lo - e_lo).clamp_min(0))
    return a_lo, a_hi.clamp(max=1.0)


def _matmul_interval(a_lo, a_hi, v_lo, v_hi):
    """Entrywise bounds on ``A V`` for ``A`` in ``[a_lo, a_hi]`` (non-negative) and ``V`` in
    ``[v_lo, v_hi]``: each product ``a·v`` at the corner that makes it smallest or largest."""
    # a ≥ 0: a·v is smallest at a_hi where v < 0 and at a_lo where v ≥ 0 (entry by entry)
    L = torch.einsum("jk,km->jm", a_hi, v_lo.clamp(max=0)) + torch.einsum(
        "jk,km->jm", a_lo, v_lo.clamp(min=0)
    )
    U = torch.einsum("jk,km->jm", a_hi, v_hi.clamp(min=0)) + torch.einsum(
        "jk,km->jm", a_lo, v_hi.clamp(max=0)
    )
    return L, U
