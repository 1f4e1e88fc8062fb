"""One digest of what a torch module computes with, read from the live tensors: the
mechanism by which every cache and copy of a model in ``wsutils`` notices that the model
changed (the embedding cache's key, the float64 copies of the module maps of
:mod:`wsutils.trained`, the check in the workers of a pooled vocabulary search).

``module_digest`` reads every parameter and buffer (``O(parameters)``: with the
configuration and tokenizer, 0.12 CPU s for the embedded model's 22.7 M parameters in one
measurement, ``benchmarks/bench_stale_checks.py``): meant for a check at a cache lookup or
once per worker task, not per step of an inner loop.

With :mod:`wsutils._tensor`, one of the package's two shared internals: any module of
``wsutils``, in any subpackage, may import its public names (``tests/test_layers.py``)."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["module_digest"]


def module_digest(*modules: torch.nn.Module) -> str:
    """SHA-256 over each module's ``repr`` (its structure and settings such as a LayerNorm's
    ``ε``) and every named parameter and buffer: name, dtype, shape and bytes, as they are
    now. Any change in place (``p.mul_``, ``p.data``, ``load_state_dict``, a numpy view)
    changes it; an equal copy (``copy.deepcopy``, the same weights loaded again) does not."""
    h = hashlib.sha256()
    for m in modules:
        text = repr(m).encode()
        h.update(len(text).to_bytes(8, "little") + text)
        tensors = list(m.named_parameters()) + list(m.named_buffers())
        for name, t in tensors:
            t = t.detach()
            h.update(f"\0{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
            flat = t.reshape(-1).contiguous().cpu()
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()
