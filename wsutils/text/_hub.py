"""Is the Hugging Face hub usable? Answered at once, so that a missing model or dataset fails
with wsutils' message instead of after the libraries' retries (~25 s with no network)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

_TRUE = ("1", "true", "yes", "on")


def offline(*names: str) -> bool:
    """Whether any of the environment flags ``names`` (default: both HF flags) is set."""
    names = names or ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in names)


def reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the hub endpoint (``HF_ENDPOINT`` or huggingface.co) succeeds."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False
