"""Every word screened, the best few certified: the fast estimator's way for long texts.

A search over a few fixed words (the chapters' first one or two) finds the most that *those*
words move the map. In a long text the word that moves it most can be elsewhere, and a slope in
``n`` read from fixed words can be steeper than ``S``'s (issue 63 measured 1.4-5x more over
every word at n = 4096 on the normalisation grid). Searching every word with the
full search costs ``n`` times one word's; :func:`screened_word_sensitivity` instead

1. **screens** every word with a short, cheap search of the fast objective
   (:class:`Screen`: a few starts and steps, in float32 by default), ranking the words by the
   value each reached (an estimate: not recomputed with the full map);
2. **certifies** the ``keep`` best words with the full estimator
   (:func:`~wsutils.estimators.self_attention.attention_word_sensitivity`, the take-over
   constructions and the screen's own ``Δ`` among each word's starts), each value recomputed
   in float64 with the full map: a certified lower bound on ``S``.

The kept words are certified in one search, each from the random starts and constructions
that ``attention_word_sensitivity(rows=[r], takeovers=True)`` gives it (seeded by the row) plus
the ``keep`` screened ``Δ``; searches never interact, so without ``halving`` a kept word gets at
least the value the fixed-word search with the same settings gives it. ``halving``
(:data:`wsutils.halving.SCHEDULE`) cuts the hopeless (word, start) searches, at the price of
that guarantee.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .._tensor import Array
from ..checks import check_int
from ..maps import Normalisation
from ..search import Search, precision
from ..sensitivity import SensitivityResult, ascend_rows, project_ball, search_setup
from .objectives import fast_objective
from .self_attention import attention_word_sensitivity
from .takeover import caller_weights, word_constructions
from .upper import attention_certified_upper

__all__ = ["Screen", "screen_words", "screened_word_sensitivity"]


@dataclass(frozen=True)
class Screen:
    """How every word is screened before the best are certified: ``starts`` random starts
    (``≥ 0``) and ``steps`` cosine-decayed steps (``≥ 0``) of the fast objective per word, in
    ``dtype`` (``"float32"``, ``"float64"`` or ``None``: the text's own search dtype), then the
    ``keep`` best words (``≥ 1``) are certified.

    ``constructions=True`` also evaluates, for every word, the seven constructions of
    :func:`~wsutils.estimators.takeover.word_constructions` (the take-over candidates of
    :prf:ref:`def-takeover` and the doubling ``Δ = x_i``) with the fast objective, no
    gradient; a word's screened value is the larger of the two. ``starts=0`` (then
    ``steps=0``) screens by the constructions alone: seven evaluations a word instead of a
    search. On 30 of the normalisation chapter's texts (``python -m benchmarks.bench_screen
    --constructions``, recorded in ``benchmarks/README.md``) it cost 0.1–0.3 of the default
    screen's CPU time and certified within 0.1 % of it on 14, more on 8 (up to 10 %), less on
    8 (0.1–12 %), four of them ReLU attention's (all of its texts: its best ``Δ`` is rarely a
    construction). Either screen can miss the best word.

    The defaults (2 starts, 10 steps, float32, 8 words) against the screen of 2 starts × 30
    steps that issue 63 measured, on the eight texts of ``python -m benchmarks.bench_screen``
    (softmax at d = 192, n = 250, 500, 1000; sparsemax at d = 32, n = 1024; two texts each):
    the same certified value on six, 1.6 % and 3.3 % lower on the two at n = 500, at 0.4–0.8
    of the time. The screen only ranks the words:
    it can miss the best one, and a larger screen can rank them differently."""

    starts: int = 2
    steps: int = 10
    keep: int = 8
    dtype: str | None = "float32"
    constructions: bool = False

    def __post_init__(self):
        object.__setattr__(self, "starts", check_int("starts", self.starts, minimum=0))
        object.__setattr__(self, "steps", check_int("steps", self.steps, minimum=0))
        object.__setattr__(self, "keep", check_int("keep", self.keep, minimum=1))
        object.__setattr__(self, "dtype", precision(self.dtype))
        if not isinstance(self.constructions, bool):
            raise TypeError(f"constructions must be True or False, got {self.constructions!r}.")
        if self.starts == 0 and not self.constructions:
            raise ValueError(
                "a screen with starts=0 has nothing to rank the words by: give it random "
                "starts (starts >= 1) or constructions=True."
            )
        if self.starts == 0 and self.steps:
            raise ValueError(
                f"steps={self.steps} with starts=0: the steps ascend from the random starts "
                "only; set steps=0 for a screen by the constructions alone."
            )

    @classmethod
    def parse(cls, screen: Screen | dict | None = None) -> Screen:
        """A :class:`Screen` from a Screen, a dict of some of its fields, or ``None`` (the
        defaults). An unknown name is a TypeError that lists the fields."""
        if screen is None:
            return cls()
        if isinstance(screen, cls):
            return screen
        if not isinstance(screen, dict):
            raise TypeError(
                f"screen must be a wsutils.estimators.screen.Screen, a dict of its fields or "
                f"None, got {type(screen).__name__}."
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(screen) - names)
        if unknown:
            raise TypeError(f"unknown screen setting(s) {unknown}; a Screen has {sorted(names)}.")
        return cls(**screen)


def screen_words(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "raf",
    screen: Screen | dict | None = None,
    seed: int = 0,
    device=None,
) -> tuple[list[int], np.ndarray, torch.Tensor]:
    """Step 1 of :func:`screened_word_sensitivity`: every word searched briefly with the fast
    objective (:class:`Screen`'s starts and steps, random starts from ``seed``).

    Returns the words (every row; with a sink, rows ``1, …, n − 1``), the value each reached
    (the fast objective's relative change at its best ``Δ``, in the screen's dtype: an
    estimate for ranking, not certified) and those ``Δ`` (one row per word, float64, on the
    exact ball).
    """
    screen = Screen.parse(screen)
    norm = Normalisation.parse(normalisation)
    Xt, rows, _ = search_setup(X, rows=None, sink=norm.sink is not None, device=device)
    W64 = caller_weights(W, Xt)
    search = Search(
        starts=max(screen.starts, 1), steps=screen.steps, dtype=screen.dtype, seed=seed
    )
    work = search.work_dtype(Xt.dtype)
    Xs, Ws = Xt.to(work), W64.to(Xt.dtype).to(work)
    obj = fast_objective(Xs, Ws, norm)
    d = Xt.shape[1]
    index = torch.tensor(rows, device=Xs.device)
    values = torch.full((len(rows),), -math.inf, dtype=torch.float64)
    Delta = torch.zeros(len(rows), d, dtype=work, device=Xs.device)
    if screen.constructions:
        C = word_constructions(Xt, W64.to(Xt.dtype))[index.cpu()].to(Xs.device, work)
        values, Delta = _best_construction(obj, index, C, search.max_batch_elements)
    if screen.starts:
        found = ascend_rows(lambda chunk: obj, Xs, rows, search, pair_elements=obj.pair_elements)
        D = torch.stack([found[r] for r in rows]).to(Xs.device)
        D = project_ball(D, math.sqrt(d), exact=False)
        with torch.no_grad():
            v = obj(index, D).to(torch.float64).cpu()
        better = v > values
        values = torch.where(better, v, values)
        Delta = torch.where(better.to(Xs.device)[:, None], D, Delta)
    Delta64 = project_ball(Delta.to(torch.float64).cpu(), math.sqrt(d))
    return rows, values.detach().numpy(), Delta64


def _best_construction(obj, index: torch.Tensor, C: torch.Tensor, max_elements: int):
    """Each word's best of its constructions ``C`` (``B × m × d``, word ``index[b]``) under the
    fast objective ``obj``, a chunk of words at a time (``max_elements`` entries a chunk,
    ``obj.pair_elements`` a pair): the values (float64, CPU) and the ``Δ`` (``B × d``)."""
    B, m, d = C.shape
    chunk = max(1, max_elements // (m * obj.pair_elements))
    values = torch.empty(B, dtype=torch.float64)
    best = torch.empty(B, d, dtype=C.dtype, device=C.device)
    with torch.no_grad():
        for s in range(0, B, chunk):
            idx, Cs = index[s : s + chunk], C[s : s + chunk]
            v = obj(idx.repeat_interleave(m), Cs.reshape(-1, d)).reshape(-1, m)
            top = v.argmax(dim=1)
            values[s : s + chunk] = v.gather(1, top[:, None])[:, 0].to(torch.float64).cpu()
            best[s : s + chunk] = Cs[torch.arange(Cs.shape[0], device=C.device), top]
    return values, best


def screened_word_sensitivity(
    X: Array,
    W: Array,
    *,
    normalisation: str | Normalisation = "raf",
    screen: Screen | dict | None = None,
    search: Search | dict | None = None,
    also: Sequence[int] = (),
    upper: bool = True,
    device=None,
    **settings,
) -> SensitivityResult:
    """Estimate ``S(X)`` over **every** word of a long text: screen every word
    (:func:`screen_words`), then certify the ``screen.keep`` best with
    :func:`~wsutils.estimators.self_attention.attention_word_sensitivity` (``search``, the
    take-over constructions and the word's screened ``Δ`` among its starts). The words are
    those of :prf:ref:`def-word-sensitivity`; the value is a certified lower bound on ``S``.

    Parameters
    ----------
    X, W, normalisation, device
        As :func:`~wsutils.estimators.self_attention.attention_word_sensitivity`.
    screen
        A :class:`Screen` or a dict of its fields (``None``: ``Screen()``).
    search, **settings
        The certifying search (:class:`wsutils.search.Search`, default ``Search()``); its
        seed (``None``: 0) also seeds the screen.
    also
        Words certified whatever the screen says (e.g. a word a bound is computed at), each
        from the search's own starts and the constructions; the value is then at least the
        fixed-word search's over ``also`` with the same settings (without ``halving``).
    upper
        Also bound **every** word from above where the library can
        (:func:`wsutils.estimators.upper.attention_certified_upper`); ``False`` skips it.

    Returns
    -------
    SensitivityResult
        The best certified value over the kept words, its row and ``Δ``; ``per_row`` and
        ``per_row_Delta`` hold the kept words only (the ones certified); ``starts`` counts
        the random starts, the ``keep`` screened ``Δ`` and the constructions;
        ``per_row_upper`` every word's upper certificate and ``upper`` their largest, so
        ``value ≤ S(X) ≤ upper`` (``None`` where the map has none).
    """
    screen = Screen.parse(screen)
    search = Search.parse(search, **settings)
    seed = search.start_seed(0)
    rows, values, Delta = screen_words(
        X, W, normalisation=normalisation, screen=screen, seed=seed, device=device
    )
    order = np.argsort(-np.nan_to_num(values, nan=-np.inf), kind="stable")[: screen.keep]
    kept = [rows[j] for j in order]
    extra = [int(r) for r in dict.fromkeys(also) if int(r) not in kept]
    result = attention_word_sensitivity(
        X,
        W,
        normalisation=normalisation,
        rows=kept + extra,
        init=Delta[order],
        takeovers=True,
        search=search,
        upper=False,
        device=device,
    )
    if not upper:
        return result
    X64 = torch.as_tensor(X).detach().to("cpu", torch.float64)
    every = sorted(set(rows) | set(result.per_row))  # every word, and the words of ``also``
    bounds = attention_certified_upper(
        X64, caller_weights(W, X64).detach().cpu(), every, normalisation=normalisation
    )
    return result if bounds is None else result.with_upper(dict(zip(every, bounds.tolist())))
