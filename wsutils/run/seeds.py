"""Seeds for the points of a grid, derived from the point itself.

Reusing one seed at every grid point makes the points dependent: the same seed at ``n = 50``
and ``n = 100`` draws nested texts ``X`` (the first 50 rows are shared) and identical weights
``W``, so a slope fitted across ``n`` does not rest on independent points. :func:`point_seed`
gives each point its own stream: it hashes the whole key, e.g. ``(d, n, s)``, with numpy's
``SeedSequence`` (the library's own tool for independent streams), so different keys give
statistically independent seeds and the same key always gives the same seed, on every machine.
"""

from __future__ import annotations

import hashlib
import numbers

import numpy as np

__all__ = ["point_seed", "search_seed"]


def _entropy(key) -> int:
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(
            f"a seed key must be a non-negative integer or a string, got the bool {key!r}."
        )
    if isinstance(key, numbers.Integral):
        if int(key) < 0:
            raise ValueError(f"a seed key must be a non-negative integer or a string, got {key}.")
        return int(key)
    if isinstance(key, str):
        return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:16], "little")
    raise TypeError(
        f"a seed key must be a non-negative integer or a string, got {type(key).__name__} {key!r}."
    )


def point_seed(*keys: int | str) -> int:
    """A seed in ``[0, 2**63)`` for the grid point named by ``keys`` (e.g. ``point_seed(d, n, s)``
    or ``point_seed("raf", d, n, s)``): equal keys give equal seeds, different keys give
    independent streams (:class:`numpy.random.SeedSequence` over the keys in order)."""
    if not keys:
        raise ValueError("point_seed needs at least one key, e.g. point_seed(d, n, s).")
    state = np.random.SeedSequence([_entropy(k) for k in keys]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def search_seed(seed: int) -> int:
    """The seed of a search's random starts on the text drawn from ``seed``:
    ``point_seed("search", seed)``, a stream of its own. The starts and the text are both
    ``torch.randn`` draws, so seeding the search with the text's own seed would make a word's
    random starts the text's own words (and the weights' rows, with ``seed + 1``)."""
    return point_seed("search", seed)
