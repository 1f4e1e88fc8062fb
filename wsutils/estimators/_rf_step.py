"""One step of the random-features ascent as one compiled loop over the rows of ``V_i``
(numba), for :func:`wsutils.estimators.rf._relative_change_objective`.

The step needs, for every start ``b``, the value ``Σ_j (ReLU(u_j + v_jᵀΔ_b) − ReLU(u_j))²``
and the gradient of half of it, ``Σ_{j : pre_jb > 0} (pre_jb − ReLU(u_j)) v_j``. As two BLAS
products (``V_i Δᵀ``, then ``(…)ᵀ V_i``) with a handful of starts, each is a skinny product
that runs far below the machine's matmul speed; here each row ``v_j`` is read once, its ``B``
dot products taken while it is in cache and its ``B`` gradient updates made at once, and the
update is skipped for an inactive unit (``pre_jb ≤ 0``), about half of them
(``benchmarks/bench_search_steps.py``: about twice as fast at ``d = 384``).

numba is optional: :func:`usable` is false without it, on a GPU, or where PyTorch has several
threads (the compiled loop has one; the BLAS products use them all), and the caller then makes
the two products. The compiled loop sums in another order than the BLAS (each value's sum of
squares in float64, the gradient in ``V_i``'s dtype): the search only proposes ``Δ``, and
every returned value is recomputed in float64
(:func:`wsutils.estimators.rf.rf_relative_change`).
"""

from __future__ import annotations

import numpy as np
import torch

try:
    import numba
except ImportError:  # the BLAS products run instead
    numba = None

_compiled = None


def usable(Vi: torch.Tensor) -> bool:
    """Whether :func:`objective` runs for ``V_i``: numba importable, ``V_i`` a contiguous
    float32 or float64 CPU tensor, and one PyTorch thread."""
    return (
        numba is not None
        and Vi.device.type == "cpu"
        and Vi.dtype in (torch.float32, torch.float64)
        and Vi.is_contiguous()
        and torch.get_num_threads() == 1
    )


def _step(V, u, base, Delta, grad, sq):  # pragma: no cover - compiled by numba
    """``sq[b] = Σ_j (ReLU(u_j + V_j·Δ_b) − base_j)²`` (float64) and
    ``grad[b] = Σ_{j : pre > 0} (pre − base_j) V_j`` for every row ``b`` of ``Delta``."""
    k, d = V.shape
    B = Delta.shape[0]
    pre = np.empty(B, dtype=V.dtype)
    grad[:] = 0
    sq[:] = 0.0
    for j in range(k):
        for b in range(B):
            acc = u[j]
            for c in range(d):
                acc += V[j, c] * Delta[b, c]
            pre[b] = acc
        bj = base[j]
        for b in range(B):
            p = pre[b]
            if p > 0:
                df = p - bj
                sq[b] += df * df
                for c in range(d):
                    grad[b, c] += df * V[j, c]
            else:
                sq[b] += bj * bj


def _kernel():
    global _compiled
    if _compiled is None:
        # fastmath: the dot products and updates may be reordered and vectorised; every
        # input is finite (the estimator checks the text, the weights are normals).
        # cache: the machine code is kept in __pycache__, keyed by numba on this file's
        # stamp, so a book's chapters compile it once, not once a kernel
        _compiled = numba.njit(fastmath=True, nogil=True, cache=True)(_step)
    return _compiled


def objective(u: torch.Tensor, Vi: torch.Tensor, base: torch.Tensor, base_norm: torch.Tensor):
    """The ``evaluate`` of :func:`wsutils.sensitivity.ascend` for the relative change
    ``‖ReLU(u + V_i Δ) − ReLU(u)‖ / ‖ReLU(u)‖`` (``base = ReLU(u)``, ``u`` in ``V_i``'s dtype),
    its gradient that of ``½‖ReLU(u + V_i Δ) − ReLU(u)‖²`` (the same direction), both from one
    call of the compiled loop. Needs :func:`usable`."""
    kernel = _kernel()
    V, un, bn = Vi.numpy(), u.contiguous().numpy(), base.contiguous().numpy()

    def evaluate(Delta: torch.Tensor):
        D = Delta.detach().to(Vi.dtype).contiguous()
        grad = torch.empty_like(D)
        sq = np.empty(D.shape[0])
        kernel(V, un, bn, D.numpy(), grad.numpy(), sq)
        vals = torch.sqrt(torch.from_numpy(sq)).to(Vi.dtype) / base_norm
        return vals, lambda: grad

    return evaluate
