"""One point of the generalization experiment's grid (re-exported by
:mod:`wsutils.generalization`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from .._tensor import Array
from ..checks import (
    as_tensor,
    check_finite,
    check_real,
    check_row,
    check_shape,
    check_unit_rows,
)
from ..maps import Normalisation, flat
from ..search import Search, point_search
from ..weights import sample_W
from ._common import DATA, LOSSES, METHODS, TRAININGS, check_Ns, map_normalisation
from ._features import _attention_rows, _rf_law_rows, authors_data, independent_data, planted_data
from ._linalg import _cholesky, _fine_tune, _gram_solve
from ._search import (
    FLIP_SEARCH,
    FlipModel,
    FlipResult,
    _attention_flip_model,
    _flip_target,
    authors_lr_steps,
    authors_search,
    authors_searches,
    rf_flip_model,
    search_flip,
    search_flips,
)

# ---------------------------------------------------------------------------------------------
# One point of the experiment grid
# ---------------------------------------------------------------------------------------------


def _features(
    map: str,
    Xs: torch.Tensor,
    X: torch.Tensor,
    *,
    seed: int,
    row: int,
    block_rows: int,
    progress: bool,
    norm: Normalisation | None,
):
    """Features of the training texts and of the new text, and the :class:`FlipModel`
    (``norm``: the attention map's weights, ``None`` for ``map="rf"``)."""
    n, d = X.shape
    # The texts are checked (_check_flip_data); the training texts and the new one are
    # stacked where the features are computed, never copied together first.
    if map == "rf":  # (H, V_i) from their joint law (prop-rf-texts-law): all the search reads
        Xf = torch.empty((Xs.shape[0] + 1, n * d), dtype=torch.float64)
        Xf[:-1], Xf[-1] = flat(Xs), flat(X)  # flat(cat([Xs, X])), never copied together
        H, Vi = _rf_law_rows(Xf, n * d, n, d, seed, row, block_rows, progress)
        return torch.relu(H[:-1]), torch.relu(H[-1]), rf_flip_model(H[-1], Vi)
    W = sample_W(d, seed=seed)
    F = _attention_rows(Xs, X, W, norm, 64)
    return F[:-1], F[-1], _attention_flip_model(X, W, norm, row)


def _check_flip_data(
    Xs: torch.Tensor,
    Y: torch.Tensor,
    X: torch.Tensor,
    y: float,
    Ns: list[int],
    row: int,
    unit_rows: bool,
    built: bool = False,
) -> None:
    """Input checks of :func:`flip_runs` (shapes, labels ``±1``, ``N ≤ len(Xs)``, rows of
    norm ``√d`` unless ``unit_rows`` is false). ``built``: the texts were just drawn by
    :func:`flip_point` (:func:`planted_data`, :func:`authors_data`, from checked sizes and
    seed), so their entries are finite and the planted rows of norm ``√d`` by construction:
    those two passes over the ``N × n × d`` texts are skipped, every other check stays."""
    if Xs.ndim != 3:
        raise ValueError(
            f"Xs must be the training texts as an array (N, n, d), got shape {tuple(Xs.shape)}."
        )
    Nmax, n, d = Xs.shape
    if not built:
        check_finite("Xs", Xs)
        check_shape("X", X, (n, d), "the new text, with the n words of d coordinates of Xs")
    check_shape("Y", Y, (Nmax,), "one label per training text")
    bad = sorted(set(Y.tolist()) - {-1.0, 1.0})
    if bad or float(y) not in (-1.0, 1.0):
        raise ValueError(
            f"labels must be ±1 (Y has {bad[:5] or 'only ±1'}, y = {y}); map "
            "0/1 labels with 2·label − 1."
        )
    if unit_rows and not built:
        check_unit_rows(Xs)
        check_unit_rows(X)
    if max(Ns) > Nmax:
        raise ValueError(f"every N in Ns must be between 1 and len(Xs) = {Nmax}, got {Ns}.")
    if max(Ns) >= n * d:
        raise ValueError(f"N = {max(Ns)} must be below p = n·d = {n * d} for interpolation.")
    check_row(row, n)


def _run_search(
    method: str, model: FlipModel, w: torch.Tensor, tau: float, d: int, opts
) -> FlipResult:
    """One search, on one thread: its tensors are small (``B × n × n`` scores), and on a
    loaded machine the synchronisation of several threads per step costs more than the
    arithmetic (measured: 20× slower at ``n = 40, d = 32`` with two threads under load)."""

    def readout(D):
        return model.readout(D, w)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if method == "authors":
            return authors_search(readout, d, tau, lr=opts["lr"], steps=opts["steps"])
        return search_flip(readout, d, tau, search=replace(opts, dtype="float64"))
    finally:
        torch.set_num_threads(threads)


def _search_key(loss: str, N: int, training: str) -> tuple:
    """The searches a point needs: the output loss depends on ``(N, training)``, align_rt on
    ``N``, align_ft on neither."""
    return {"output": (loss, N, training), "align_rt": (loss, N), "align_ft": (loss,)}[loss]


def _run_batched(
    method: str,
    model: FlipModel,
    Ws: torch.Tensor,
    taus: list[float],
    d: int,
    opts,
) -> list[FlipResult]:
    """Every search of a point in one batch (:func:`search_flips`, :func:`authors_searches`),
    on one thread (as :func:`_run_search`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if method == "authors":
            return authors_searches(model, Ws, taus, d, **opts)
        return search_flips(model, Ws, taus, d, search=opts)
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


def _train(Phi_all, Y, phi, y: float, Ns, trainings) -> dict:
    """The models of the flip experiment (:prf:ref:`def-flip-problem`) for checked features:
    for each ``N`` (ascending) and training, ``(θ₀, Pφ, interpolation error, θ₁)``, ``θ₀``
    the min-norm interpolator of the first ``N`` texts and ``θ₁`` its fine-tuning or
    re-training on ``(φ, y)``. The Cholesky factor of ``K`` is computed once: that of a
    leading block of ``K`` is the leading block of ``K``'s factor."""
    L_all = _cholesky(Phi_all)
    fits = {}
    for N in sorted(set(Ns)):
        Phi, YN = Phi_all[:N], Y[:N]
        L = L_all[:N, :N]
        theta0 = _min_norm(Phi, YN, L)
        Pphi = _project(Phi, phi, L)
        interp_err = float((Phi @ theta0 - YN).abs().max())
        for training in trainings:
            theta1 = (
                _fine_tune(theta0, phi, y)
                if training == "fine_tune"
                else _retrain(phi, y, theta0, Pphi)
            )
            fits[N, training] = (theta0, Pphi, interp_err, theta1)
    return fits


def trained_readouts(
    Phi: Array, Y: Array, phi: Array, y: float, *, Ns: Sequence[int], trainings=TRAININGS
) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """The read-outs ``θ₁`` that :func:`flip_runs` trains (the same arithmetic): for each
    ``N`` of ``Ns`` (ascending) and each training, ``θ₀ = Φ_N⁺Y_N`` on the first ``N`` rows of
    the training features ``Phi``, then fine-tuned or re-trained on the new text's features
    ``phi`` with label ``y``. Returns ``(Θ, keys)``: ``Θ`` float64 ``(len(keys), p)`` and
    ``keys`` the ``(N, training)`` of each row.

    Raises
    ------
    ValueError
        If the features, ``Y`` or ``y`` are not finite, ``phi`` is not as long as a row of
        ``Phi``, ``Y`` is not one label per row of ``Phi``, ``Ns``
        is not a list of sizes up to the number of rows, a training is unknown, or a Gram
        matrix is singular.
    """
    Phi, phi = as_tensor(Phi, dtype=torch.float64), as_tensor(phi, dtype=torch.float64)
    Y = as_tensor(Y, dtype=torch.float64).reshape(-1)
    check_finite("Phi", Phi)
    check_finite("phi", phi)
    check_finite("Y", Y)
    y = check_real("y", y)
    Ns = check_Ns(Ns)
    if Phi.ndim != 2 or Y.shape[0] != Phi.shape[0] or max(Ns) > Phi.shape[0]:
        raise ValueError(
            f"Phi must be (N, p) with one label of Y per row and N ≥ max(Ns) = {max(Ns)}, "
            f"got shapes {tuple(Phi.shape)} and {tuple(Y.shape)}."
        )
    if tuple(phi.shape) != (Phi.shape[1],):
        raise ValueError(
            f"phi must be the new text's features, one vector ({Phi.shape[1]},) as long as a "
            f"row of Phi, got shape {tuple(phi.shape)}."
        )
    bad = [t for t in trainings if t not in TRAININGS]
    if bad or not trainings:
        raise ValueError(f"trainings must be some of {TRAININGS}, got {list(trainings)}.")
    fits = _train(Phi[: max(Ns)], Y, phi, y, Ns, trainings)
    return torch.stack([theta1 for *_, theta1 in fits.values()]), list(fits)


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
    method: str | Sequence[str] = "ours",
    search: Search | dict | None = None,
    row: int = 0,
    unit_rows: bool = True,
    block_rows: int = 2048,
    progress: bool = False,
    normalisation=None,
    batch_searches: bool = True,
) -> dict:
    """The generalization experiment on given data (:prf:ref:`def-flip-problem`): training
    texts ``Xs`` (``N × n × d``, rows of norm ``√d`` unless ``unit_rows=False``, as in
    ``gen.py``'s synthetic data), their labels ``Y`` (``±1``), the new text ``X``
    (``n × d``) and its label ``y``. Weights of ``map`` are drawn with ``seed`` and the flip
    search with ``seed + 1``. For every ``N`` in ``Ns`` (the first ``N`` texts) every
    training and every loss: ``θ₀``, ``θ₁``, the flip search on word ``row``, and
    ``t0, t1, D0, D1`` (the outputs ``t_0, t_1`` on ``X`` and ``t_0^Δ, t_1^Δ`` on ``X_Δ``,
    with ``θ₀`` and ``θ₁``; ``gen.py`` records the same four). Random features
    (``k = D``): the texts' pre-activations and ``V_i`` are one draw of their joint law
    (:func:`rf_texts_law`, ``block_rows`` features at a time), all the experiment reads of
    ``V``.

    ``method="ours"``: :func:`search_flip` with ``search`` (a :class:`~wsutils.search.Search`
    or a dict of some of its fields; default ``FLIP_SEARCH``: 4 starts, 300 steps, step
    size 0.3, in float64, best iterate; its starts seeded by ``search.seed``, default
    ``seed + 1``); ``method="authors"``: :func:`authors_search` with ``gen.py``'s ``lr`` and
    ``steps`` (:func:`authors_lr_steps`) unless ``search`` sets them.
    ``method=["ours", "authors"]`` (a list of distinct methods) runs each on the same
    features, built once; ``search`` is then our search's, and the authors' search takes
    ``gen.py``'s.

    Returns ``{"runs": [...]}``, one dict per ``(method, N, training, loss)``, with the invariants
    (``max |Φθ₀ − Y|``, ``‖Δ‖``), the quantities of :prf:ref:`prop-flip-bound` and the two
    terms of eq. :eq:`eq-flip-identity`: ``base_term = t_0^Δ − t_0`` (bounded by
    ``rel_change·norm_phi_theta0``, ``norm_phi_theta0 = ‖φ‖·‖θ₀‖``) and
    ``sens_term = (c − 1)(y − t_0)``; ``loss``/``min_loss`` are the search's final and
    smallest loss. The align_ft search does not depend on ``N`` or the training, align_rt
    not on the training: each is run once and read out under every model it applies to.

    ``map="attention"`` (``GENERAL``) runs the same experiment with the general attention
    map and ``normalisation`` (:func:`flip_normalisation`); the records are those of the
    other maps (with ``"softmax"`` and ``"relu"`` equal to those of ``"raf"`` and ``"relu"``).

    ``batch_searches``: the point's searches (up to 10: six output, three align_rt, one
    align_ft) run as one batch, ours by :func:`search_flips` with iterations in the
    search's ``dtype`` (float64 by default; ``"float32"`` halves the bytes of every step, and
    every recorded number stays float64, computed at the returned ``Δ``), the authors' by
    :func:`authors_searches` (float64, as theirs); ``batch_searches=False`` runs them one after
    another in float64 (:func:`search_flip`, :func:`authors_search`), as before. Batched or
    not, each search follows the same path in exact arithmetic (with a stopping rule, a batch
    stops once all its searches have stalled, so a search may go further along it batched);
    float32 iterations follow it to single-precision rounding.
    """
    kw = dict(locals())  # every parameter above, by name; the map parsed once, here
    norm = map_normalisation(map, kw.pop("normalisation"))
    return _flip_runs(**kw, norm=norm, built=False)


def _flip_runs(
    map,
    Xs,
    Y,
    X,
    y,
    *,
    Ns,
    seed,
    losses,
    trainings,
    method,
    search,
    row,
    unit_rows,
    block_rows,
    progress,
    norm,
    batch_searches,
    built: bool,
) -> dict:
    """:func:`flip_runs` with the map parsed (``norm``, ``map_normalisation``); ``built``
    as in :func:`_check_flip_data`."""
    bad = [x for x in losses if x not in LOSSES] + [x for x in trainings if x not in TRAININGS]
    if bad:
        raise ValueError(f"unknown losses/trainings {bad}; use {LOSSES} and {TRAININGS}.")
    methods = [method] if isinstance(method, str) else list(method)
    if (
        not methods
        or any(not isinstance(s, str) or s not in METHODS for s in methods)
        or len(set(methods)) != len(methods)
    ):
        raise ValueError(
            f"method must be one of {METHODS} or a list of distinct ones, got {method!r}."
        )
    # the settings the caller set: all of a Search's, a dict's own (the rest FLIP_SEARCH's)
    given = set(search) if isinstance(search, dict) else {"lr", "steps"} if search else set()
    ours = Search.parse(search, default=FLIP_SEARCH)
    ours = replace(ours, seed=ours.start_seed(seed + 1))
    Ns = check_Ns(Ns)
    Xs, X = as_tensor(Xs, dtype=torch.float64), as_tensor(X, dtype=torch.float64)
    Y = as_tensor(Y, dtype=torch.float64).reshape(-1)
    _check_flip_data(Xs, Y, X, y, Ns, row, unit_rows, built)
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
        norm=norm,
    )
    several = len(methods) > 1
    all_opts = {}
    for m_name in methods:
        if m_name == "authors":
            lr0, steps0 = authors_lr_steps(map, n)
            all_opts[m_name] = dict(
                lr=ours.lr if "lr" in given and not several else lr0,
                steps=ours.steps if "steps" in given and not several else steps0,
            )
        else:
            all_opts[m_name] = ours
    # the door for the features (finite texts can still give overflowing features): every
    # helper below trusts them, no check again per N, training or loss
    check_finite("the training texts' features", Phi_all)
    check_finite("phi", phi)
    norm_phi = float(torch.linalg.vector_norm(phi))
    runs: list[dict] = []
    fits = _train(Phi_all, Y, phi, y, Ns, trainings)
    targets: dict = {}  # search key -> (w, τ), in the order first met
    for (N, training), (_, Pphi, _, theta1) in fits.items():
        for loss in losses:
            key = _search_key(loss, N, training)
            if key not in targets:
                targets[key] = _flip_target(loss, theta1, phi, y, Pphi)
    for m_name in methods:
        opts = all_opts[m_name]
        cache = {}
        if batch_searches:
            keys = list(targets)
            found = _run_batched(
                m_name,
                model,
                torch.stack([targets[k][0] for k in keys]),
                [targets[k][1] for k in keys],
                d,
                opts,
            )
            cache = dict(zip(keys, found))
        runs += _flip_records(
            m_name, model, cache, targets, fits, Ns, trainings, losses, phi, y, d, opts, norm_phi
        )
    return {"runs": runs}


def _flip_records(
    method, model, cache, targets, fits, Ns, trainings, losses, phi, y, d, opts, norm_phi
) -> list[dict]:
    """The records of :func:`flip_runs` for one method (``cache``: the searches already run,
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
                    cache[key] = _run_search(method, model, w, tau, d, opts)
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
                        method=method,
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
    method: str | Sequence[str] = "ours",
    data: str = "planted",
    search: dict | None = None,
    row: int = 0,
    block_rows: int = 2048,
    progress: bool = False,
    normalisation=None,
    batch_searches: bool = True,
) -> dict:
    """One grid point for :func:`wsutils.run.sweep.run_grid` on synthetic data: ``max(Ns) + 1``
    texts from :func:`planted_data` (``data="planted"``, rows of norm ``√d``),
    :func:`independent_data` (``data="independent"``: the same texts, labels independent of
    them) or
    :func:`authors_data` (``data="authors"``, ``gen.py``'s), drawn with seed ``seed``, then
    :func:`flip_runs` with weights seed ``seed + 3`` (search seed ``seed + 4``) and
    ``method`` (one method, or a list such as ``["ours", "authors"]``: both on features built
    once); ``search``: a dict of :class:`~wsutils.search.Search`'s fields
    (:func:`wsutils.search.point_search`, no ``seed``), ``{"steps": 100, "dtype": "float32"}``.
    The same ``seed`` gives the same texts for every map and both methods.
    ``map="attention"`` takes a ``normalisation`` (a name or a dict of
    :class:`~wsutils.maps.Normalisation`'s fields, so that the point stays plain JSON for
    :func:`wsutils.run.sweep.run_grid`; :func:`flip_normalisation`). ``batch_searches`` as
    in :func:`flip_runs`."""
    norm = map_normalisation(map, normalisation)  # the one parse of the map
    search = point_search(search)
    if data not in DATA:
        raise ValueError(f"data must be one of {DATA}, got {data!r}.")
    Ns = check_Ns(Ns)
    Nmax = max(Ns)
    if Nmax >= n * d:
        raise ValueError(f"N = {Nmax} must be below p = n·d = {n * d} for interpolation.")
    make = {"planted": planted_data, "independent": independent_data, "authors": authors_data}[
        data
    ]
    Xs, Y, X, y = make(Nmax, n, d, seed=seed)
    return _flip_runs(
        map,
        Xs,
        Y,
        X,
        y,
        Ns=Ns,
        seed=seed + 3,
        losses=losses,
        trainings=trainings,
        method=method,
        search=search,
        row=row,
        unit_rows=data != "authors",
        block_rows=block_rows,
        progress=progress,
        norm=norm,
        batch_searches=batch_searches,
        built=True,
    )


def flip_grid(
    *,
    d: int,
    Ns: Sequence[int],
    seeds: Sequence[int],
    configs: Sequence[tuple[str, int]] = (("rf", 40), ("raf", 40), ("raf", 120), ("relu", 120)),
    **params,
) -> list[dict]:
    """The points of the generalization experiment: one per ``(map, n, seed)``; the grid of
    the authors' ``gen.py`` is ``d = 768``, ``Ns = (1100, 1200, 1300)`` and the default
    ``configs``. ``params`` passes the other parameters of :func:`flip_point` (``method``,
    ``data``, ``search``, ``losses``, ``trainings``, …) to every point."""
    Ns = check_Ns(Ns)
    return [
        dict(map=m, n=n, d=d, Ns=list(Ns), seed=s, **params) for (m, n) in configs for s in seeds
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
