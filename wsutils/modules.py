"""A torch module as a map the estimators measure (:func:`module_map`): evaluated in eval mode,
in the precision of its input, words first, on the real words of a padded text.

A researcher's layer is rarely the map :func:`wsutils.sensitivity.word_sensitivity` wants as
it stands: it may be in training mode (dropout: another function at every call), in float32
(every value is certified in float64), built with ``batch_first=False`` (torch's default: it
reads the batch axis as the words), return a tuple or a Hugging Face output object, or take a
padded batch with an attention mask. :func:`module_map` wraps it so that none of that is the
user's job, and never changes the module itself (its mode, dtype and parameters stay as they
are).
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import torch

from ._digest import module_digest

__all__ = ["ModuleMap", "module_map"]


def _output(out) -> torch.Tensor:
    """The hidden states a module returned: a tensor itself, the first entry of a tuple or
    list (Hugging Face layers, ``nn.MultiheadAttention``), or ``last_hidden_state`` (a Hugging
    Face model's output object); a TypeError names anything else."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    hidden = getattr(out, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    raise TypeError(
        f"the module returned a {type(out).__name__}, neither a tensor, a tuple whose first "
        "entry is one, nor an object with last_hidden_state: wrap the module in a function "
        "that returns the hidden states (B, n, d)."
    )


def _reads_batch_first(modules) -> bool:
    """``False`` when one of the modules itself declares ``batch_first=False`` (torch's
    transformer layers and ``nn.MultiheadAttention`` by default; ``nn.TransformerEncoder``
    through its first layer), else ``True``. Only the modules passed are read, never their
    submodules: a module of one's own that transposes around a sequence-first layer inside it
    reads ``(B, n, d)`` itself (pass ``batch_first`` to say otherwise)."""
    for mod in modules:
        first = mod.layers[0] if isinstance(mod, torch.nn.TransformerEncoder) else mod
        attention = getattr(first, "self_attn", None)  # torch's encoder and decoder layers
        declared = getattr(first, "batch_first", getattr(attention, "batch_first", True))
        if declared is False:
            return False
    return True


def _mask_argument(module: torch.nn.Module) -> str:
    """The keyword a module takes a key mask by: torch's ``src_key_padding_mask`` (boolean,
    ``True`` on padding) or Hugging Face's ``attention_mask`` (additive); a ValueError for a
    module that takes neither."""
    params = inspect.signature(module.forward).parameters
    for name in ("src_key_padding_mask", "attention_mask"):
        if name in params:
            return name
    raise ValueError(
        f"{type(module).__name__}.forward takes no key mask (neither src_key_padding_mask nor "
        "attention_mask): measure the unpadded text instead (its real words only)."
    )


class ModuleMap:
    """The map of :func:`module_map`: ``(B, n, d) → (B, m, d)`` (or ``(n, d) → (m, d)``), with
    ``m = n`` or, given ``words``, the number of real words.

    Attributes
    ----------
    modules
        The user's modules, applied in turn (never changed).
    words
        ``None``, or the boolean mask ``(n,)`` of the real words of a padded text
        (:attr:`rows`: their indices, to pass as ``rows=m.rows`` so that only real words are
        changed).
    """

    def __init__(self, modules, *, words=None, batch_first: bool | None = None):
        if isinstance(modules, torch.nn.Module):
            mods = [modules]
        elif isinstance(modules, (list, tuple)):
            mods = list(modules)
        else:
            mods = []
        if not mods or not all(isinstance(m, torch.nn.Module) for m in mods):
            raise TypeError(
                "module_map takes a torch.nn.Module or a sequence of them (applied in turn), "
                f"got {type(modules).__name__}."
            )
        self.modules = mods
        self.batch_first = _reads_batch_first(mods) if batch_first is None else bool(batch_first)
        self.words = None
        self._mask_names: list[str] = []
        if words is not None:
            w = np.asarray(words)
            if w.ndim != 1 or w.dtype != bool or not w.any():
                raise ValueError(
                    "words must be a boolean mask (n,) of the text's real words, with at least "
                    "one True (for a Hugging Face batch: attention_mask[b] == 1)."
                )
            self.words = torch.as_tensor(w)
            self._mask_names = [_mask_argument(m) for m in mods]
        self._copies: dict = {}  # dtype → (digest of the user's modules, eval-mode copies)

    @property
    def rows(self) -> list[int]:
        """The indices of the real words (``words``), or ``None``: every row."""
        return None if self.words is None else np.flatnonzero(self.words.numpy()).tolist()

    def _for(self, dtype: torch.dtype) -> list[torch.nn.Module]:
        """The modules to evaluate in ``dtype``: the user's own where they already are in that
        dtype and in eval mode, else copies in ``dtype`` and eval mode, made again whenever the
        user's parameters have changed since (``wsutils._digest.module_digest``,
        ``O(parameters)`` a call)."""
        own = {p.dtype for mod in self.modules for p in mod.parameters()}  # as they are now
        if own == {dtype} and not any(m.training for mod in self.modules for m in mod.modules()):
            return self.modules
        digest = module_digest(*self.modules)
        held = self._copies.get(dtype)
        if held is None or held[0] != digest:
            copies = [copy.deepcopy(m).to(dtype).eval() for m in self.modules]
            self._copies[dtype] = held = (digest, copies)
        return held[1]

    def _mask_kwargs(self, name: str, B: int, dtype: torch.dtype, device) -> dict:
        pad = ~self.words.to(device)
        if name == "src_key_padding_mask":
            return {name: pad[None].expand(B, -1)}
        additive = torch.zeros(pad.shape, dtype=dtype, device=device)
        additive[pad] = torch.finfo(dtype).min
        return {name: additive[None, None, None].expand(B, 1, 1, -1)}

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        if not isinstance(X, torch.Tensor) or X.ndim not in (2, 3):
            raise ValueError(
                "the map takes one text (n, d) or a batch (B, n, d) as a torch tensor, got "
                f"{type(X).__name__} of shape {tuple(getattr(X, 'shape', ()))}."
            )
        single = X.ndim == 2
        Z = X[None] if single else X
        if self.words is not None and Z.shape[1] != self.words.shape[0]:
            raise ValueError(
                f"the text has {Z.shape[1]} rows, but words marks {self.words.shape[0]}."
            )
        B = Z.shape[0]
        for k, m in enumerate(self._for(Z.dtype)):
            kw = {}
            if self.words is not None:
                kw = self._mask_kwargs(self._mask_names[k], B, Z.dtype, Z.device)
            inp = Z if self.batch_first else Z.transpose(0, 1)
            out = _output(m(inp, **kw))
            Z = out if self.batch_first else out.transpose(0, 1)
        if self.words is not None:
            Z = Z[:, self.words.to(Z.device)]
        return Z[0] if single else Z


def module_map(modules, *, words=None, batch_first: bool | None = None) -> ModuleMap:
    """A torch module (or modules applied in turn) as a map for the estimators
    (:func:`wsutils.sensitivity.word_sensitivity`,
    :func:`wsutils.trained.own_norm_word_sensitivity`).

    - **Eval mode, the module untouched.** A module in training mode (dropout) is evaluated
      through a copy in eval mode; the user's module keeps its mode, dtype and parameters.
    - **The input's precision.** The module runs in the dtype of the text it is given, through
      a copy in that dtype when it is in another (the search's float32, the certificate's
      float64); copies are made again when the module's parameters change.
    - **Words first.** ``batch_first=None`` reads it from the module passed (torch's
      transformer layers are ``batch_first=False`` by default: the map then swaps the first two
      axes), not from its submodules; ``True``/``False`` says it.
    - **Outputs.** A tensor, the first entry of a tuple (a Hugging Face layer), or
      ``last_hidden_state``.
    - **A padded text.** ``words``: the boolean mask ``(n,)`` of the real words (a Hugging
      Face batch's ``attention_mask[b] == 1``). Every call then masks the padding keys, through
      ``src_key_padding_mask`` (torch) or the additive ``attention_mask`` (Hugging Face: 0 on
      the words, the dtype's most negative number on the padding), and returns the real words'
      rows only; search the real words with ``rows=m.rows``. The relative change is then the
      real words' own, as on the unpadded text. This is for encoder layers (bidirectional
      attention: torch's ``TransformerEncoderLayer``/``TransformerEncoder``, BERT's layers),
      checked on both in ``tests/test_modules.py``. A decoder (causal) layer combines its own
      mask with the key mask in ways this adapter does not check: measure its unpadded text.

    Example: ``m = ws.module_map(layer, words=mask)`` then
    ``ws.word_sensitivity(m, X, rows=m.rows)``.
    """
    return ModuleMap(modules, words=words, batch_first=batch_first)
