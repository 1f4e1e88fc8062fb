"""The flip searches and the frozen feature maps they read (re-exported by
:mod:`wsutils.generalization`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..checks import (
    as_tensor,
    check_dtype,
    check_finite,
    check_int,
    check_preactivations,
    check_real,
    check_row,
    check_seed,
    check_text,
)
from ..maps import Normalisation, flat, normalise_scores
from ..search import Search, check_unhalved
from ..sensitivity import cosine_ascent, init_starts, perturb, project_ball
from ._common import GENERAL, LOSSES, MAPS
from ._features import _attention_fn
from ._readouts import ROW_NORMALISED, row_column_readouts


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
    #: ``batched(Ws, dtype)`` → ``f(Δ, idx)`` — ``f(Δ, idx)_b = ⟨φ(X_i(Δ_b)), Ws[idx_b]⟩``,
    #: several read-out vectors ``Ws`` (``S × p``) in one batch, computed in ``dtype``
    #: (:func:`search_flips`); ``None``: :func:`search_flips` loops over ``readout``.
    batched: Callable | None = None
    #: ``readouts(Θ)`` → ``f(Δ)`` → ``(B, m)``, ``⟨φ(X_i(Δ_b)), Θ_j⟩`` for every change and
    #: every read-out, ``Θ``'s share made once (:func:`wsutils.generalization.word_scores`);
    #: ``None``: ``phi_row(Δ) @ Θᵀ``.
    readouts: Callable | None = None
    #: the width ``d`` of the word the model changes (``None``: not known; a row of another
    #: width is then refused where the model first fails on it).
    d: int | None = None

    def features(self, d: int) -> int:
        """The number ``p`` of features, from one evaluation at ``Δ = 0`` of width ``d``; a
        width the model does not take is a ValueError that names both."""
        if self.d is not None and d != self.d:
            raise ValueError(
                f"the model changes a word of width d = {self.d}, got width {d}: pass rows "
                f"and d of the model's width."
            )
        try:
            with torch.no_grad():
                return self.phi_row(torch.zeros(1, d, dtype=torch.float64))[0].numel()
        except RuntimeError as err:
            raise ValueError(
                f"the model does not take a change of width d = {d} ({err}); pass the width "
                "of the model's words."
            ) from err


def rf_flip_model(h: torch.Tensor, Vi: torch.Tensor) -> FlipModel:
    """RF seen from word ``i``: ``φ(X_i(Δ)) = ReLU(h + V_i Δ)`` with ``h = V flat(X)``
    (eq. :eq:`eq-rf`); ReLU is 1-Lipschitz, so ``‖φ(X_i(Δ)) − φ(X)‖ ≤ ‖V_i‖_op √d``.
    A ValueError when ``h`` is not one pre-activation per row of ``V_i`` or either holds a
    NaN or an infinity, or when the two differ in dtype."""
    check_preactivations("h", h, Vi)
    check_dtype("Vi", Vi, h.dtype, " (the dtype of h)")
    d = Vi.shape[1]

    def phi_row(Delta):
        return torch.relu(h + Delta @ Vi.T)

    # ‖V_i‖_op² is the largest eigenvalue of the d × d Gram matrix (an SVD of V_i is k/d
    # times the work)
    bound = math.sqrt(float(torch.linalg.eigvalsh(Vi.T @ Vi)[-1].clamp_min(0)) * d)

    def batched(Ws, dtype):
        hd, Vd, Wd = h.to(dtype), Vi.to(dtype), Ws.to(dtype)

        def f(Delta, idx):
            return (torch.relu(hd + Delta @ Vd.T) * Wd[idx]).sum(-1)

        return f

    return FlipModel(phi_row, lambda Delta, w: phi_row(Delta) @ w, bound, batched, d=d)


def attention_flip_model(
    X: torch.Tensor, W: torch.Tensor, normalisation: str | Normalisation, row: int
) -> FlipModel:
    """RAF (``normalisation="raf"``, eq. :eq:`eq-raf`), ReLU attention (``"relu"``,
    eq. :eq:`eq-relu-attention`) or attention with any other normalisation (a name, dict or
    :class:`~wsutils.maps.Normalisation`, eq. :eq:`eq-general-attention`) seen
    from word ``i = row``. Changing ``x_i`` changes only row ``i`` and column ``i`` of the
    scores ``S = XWXᵀ/√d``; with ``G = Θ X_Δᵀ`` (``Θ`` = ``w`` as an ``n × d`` matrix) the
    read-out is ``⟨A(Δ) X_Δ, Θ⟩ = Σ_rc A_rc G_rc``, ``A(Δ)`` the normalised scores
    (:func:`wsutils.maps.normalise_scores`).

    ``X`` ``(n, d)`` and ``W`` ``(d, d)`` float64 (a numpy array is read as float64), finite;
    ``row`` an ``int`` in ``[0, n)``; ``n = 1`` is allowed. Else a ValueError that names the
    argument."""
    X, W = as_tensor(X, name="X"), as_tensor(W, name="W")
    if X.ndim != 2:
        raise ValueError(f"X must be one text (n, d), got shape {tuple(X.shape)}.")
    n, d = check_text(X)
    if tuple(W.shape) != (d, d):
        raise ValueError(f"W must be (d, d) = ({d}, {d}) for X of width d, got {tuple(W.shape)}.")
    check_finite("W", W)
    check_dtype("X", X, torch.float64, " (the flip model computes in float64)")
    check_dtype("W", W, torch.float64, " (the flip model computes in float64)")
    row = check_row(row, n)
    return _attention_flip_model(X, W, Normalisation.parse(normalisation), row)


def _attention_flip_model(
    X: torch.Tensor, W: torch.Tensor, norm: Normalisation, row: int
) -> FlipModel:
    """:func:`attention_flip_model` for a parsed map (the flip point's own path)."""
    fn = _attention_fn(norm)
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

    readouts = row_column_readouts(X, W, norm, row) if norm.name in ROW_NORMALISED else None
    return FlipModel(phi_row, readout, batched=batched, readouts=readouts, d=d)


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
    return _flip_target(loss, theta1, phi, check_real("y", y), Pphi)


def _flip_target(loss: str, theta1, phi, y: float, Pphi) -> tuple[torch.Tensor, float]:
    """:func:`flip_target` with ``y`` a checked real number."""
    if loss == "output":
        return theta1, -y
    if loss == "align_ft":
        return phi / (phi @ phi), -1.0
    if loss == "align_rt":
        if Pphi is None:
            raise ValueError("loss 'align_rt' needs Pphi = project_out(Phi, phi).")
        return Pphi / (Pphi @ Pphi), -1.0
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")


#: The flip searches' settings by default (:func:`search_flip`, :func:`search_flips`): 4
#: starts, 300 steps of size at most ``0.3·√d``, in float64; seed 0 (the flip experiment's
#: :func:`~wsutils.generalization.flip_runs`: its own ``seed + 1``) unless set.
FLIP_SEARCH = Search(starts=4, steps=300, lr=0.3, dtype="float64")


def search_flip(
    readout: Callable[[torch.Tensor], torch.Tensor],
    d: int,
    target: float,
    *,
    search: Search | dict | None = None,
    init: torch.Tensor | None = None,
    device=None,
    **settings,
) -> FlipResult:
    """Projected gradient descent on ``Δ ∈ R^d`` for ``(⟨φ(X_i(Δ)), w⟩ − τ)²``
    (eq. :eq:`eq-output-loss` / :eq:`eq-align-loss`), over the ball ``‖Δ‖ ≤ √d``.

    ``readout`` maps a batch of perturbations ``(B, d)`` to the values ``⟨φ(X_i(Δ)), w⟩``
    (``(B,)``), e.g. ``lambda D: model.readout(D, w)`` with ``w, τ`` from :func:`flip_target`.
    ``starts`` searches run in one batch: ``Δ = 0`` (the authors' start), then uniform points
    on the sphere ``‖Δ‖ = √d``, plus the rows of ``init``. Each step moves by
    ``lr·√d``·(cosine decay) along the normalised negative gradient and projects back. The best
    iterate over all steps and starts is kept. ``search`` (default ``FLIP_SEARCH``;
    ``settings``: its fields as keywords) gives the starts, steps, ``lr``, seed and the
    precision ``dtype`` of the whole search.
    """
    search = check_unhalved(
        Search.parse(search, default=FLIP_SEARCH, **settings), "the flip search"
    )
    d = check_int("d", d, minimum=1)
    target = check_real("target", target)
    starts, steps, lr = search.starts, search.steps, search.lr
    dtype = search.work_dtype(torch.float64)
    radius = math.sqrt(d)
    g = torch.Generator().manual_seed(search.start_seed(0))
    Delta = torch.randn(starts, d, generator=g, dtype=dtype)
    Delta *= radius / torch.linalg.vector_norm(Delta, dim=-1, keepdim=True)
    Delta[0] = 0.0
    if init is not None:
        Delta = torch.cat([Delta, init_starts(init, d, dtype=dtype)])
    Delta = project_ball(Delta.to(device), radius)
    neg_loss, best_Delta = cosine_ascent(
        lambda D: -((readout(D) - target) ** 2),
        Delta,
        radius,
        steps=steps,
        lr=lr,
        stop=search.stop,
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


def search_flips(
    model: FlipModel,
    Ws: torch.Tensor,
    targets: Sequence[float],
    d: int,
    *,
    search: Search | dict | None = None,
    **settings,
) -> list[FlipResult]:
    """``len(targets)`` searches of :func:`search_flip` in one batch: search ``j`` minimises
    ``(⟨φ(X_i(Δ)), Ws[j]⟩ − targets[j])²`` (eq. :eq:`eq-output-loss` /
    :eq:`eq-align-loss`) over ``‖Δ‖ ≤ √d`` from the starts :func:`search_flip` uses with
    ``seed`` (the same for every ``j``), with the same steps
    (:func:`wsutils.sensitivity.cosine_ascent`). The rows of the batch do not interact (the
    loss is a sum over rows), so each search follows, in exact arithmetic, the path it follows
    alone; one step of the ``S·starts`` rows reads the weights once instead of ``S`` times.
    With ``search.stop`` the batch stops together, once every search has stalled: a search
    may go further along its path than alone, never less far.

    ``search`` (default ``FLIP_SEARCH``; ``settings``: its fields as keywords) gives the
    starts, steps, ``lr`` and seed; its ``dtype`` is the precision of the iterations
    (float32: half the bytes per step). The
    search only proposes ``Δ``: the best iterate of every start is projected onto the exact
    ball in float64 and read out again in float64, the start with the smallest float64 loss
    wins, and every returned number (``value``, ``loss``) is float64. Returns one
    :class:`FlipResult` per target, in order."""
    search = check_unhalved(
        Search.parse(search, default=FLIP_SEARCH, **settings), "the flip search"
    )
    d = check_int("d", d, minimum=1)
    starts, steps, lr = search.starts, search.steps, search.lr
    dtype = search.work_dtype(torch.float64)
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
    p = model.features(d)
    if Ws.shape[1] != p:
        raise ValueError(
            f"Ws has rows of width {Ws.shape[1]}, but the model's features have p = {p} "
            "entries: pass one read-out vector of the features' length per search."
        )
    radius = math.sqrt(d)
    batched = _batched_readout(model)
    idx = torch.arange(S).repeat_interleave(starts)
    Delta = _flip_starts(d, starts, search.start_seed(0)).repeat(S, 1).to(dtype)
    f, td = batched(Ws, dtype), tau.to(dtype)[idx]
    _, best = cosine_ascent(
        lambda D: -((f(D, idx) - td) ** 2),
        Delta,
        radius,
        steps=steps,
        lr=lr,
        exact_result=False,
        stop=search.stop,
        group=starts,
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
