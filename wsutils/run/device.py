"""Choosing where the heavy computations run.

Every heavy function of ``wsutils`` takes ``device`` (the weight samplers, the estimator) or
computes on the device of its input (the maps). Weights are always drawn on the CPU and then
moved, so the same seed gives the same weights on every device. :func:`pick_device` turns a
user's choice into a :class:`torch.device`, ``"auto"`` meaning CUDA when present, else the CPU.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

__all__ = [
    "DoesNotFit",
    "available_memory",
    "check_fits",
    "describe_device",
    "optional_device",
    "pick_device",
    "small_work_threads",
]


def pick_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or ``None``): ``cuda`` when a CUDA GPU is visible, else ``cpu``; any other
    value is checked and returned as a :class:`torch.device`.

    Raises a ValueError for a device name torch does not know, or for a CUDA device on a
    machine without one (pass ``"cpu"`` or ``"auto"`` there).
    """
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device={device!r} is not a torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from err
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"device={device!r} asks for a CUDA GPU but none is visible; "
                "use device='cpu' or device='auto'."
            )
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r}: only {count} CUDA device(s) are visible.")
    elif dev.type != "cpu":
        raise ValueError(f"device={device!r}: wsutils runs on 'cpu' or 'cuda' devices only.")
    return dev


def optional_device(device) -> torch.device | None:
    """The ``device=`` argument of the samplers and estimators: ``None`` stays ``None`` (the
    caller's default, e.g. the input's device); anything else goes through
    :func:`pick_device`, so ``device="cuda"`` without a GPU is a ValueError that says what to
    pass instead of torch's ``AssertionError``.

    Raises
    ------
    ValueError
        As :func:`pick_device`: an unknown device name, or CUDA on a machine without one.
    """
    return None if device is None else pick_device(device)


class DoesNotFit(ValueError, MemoryError):
    """A computation refused before allocating because it needs more memory than is available
    (both a ValueError, the project's error for bad input, and a MemoryError)."""


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def available_memory(device=None) -> int | None:
    """Bytes that can be allocated now on ``device`` (``None``: the CPU): for CUDA the free
    memory ``torch.cuda.mem_get_info`` reports; for the CPU ``psutil``'s ``available`` if
    installed, else ``MemAvailable`` of ``/proc/meminfo`` (free memory plus reclaimable
    cache), else free pages times page size (``os.sysconf``). ``None`` if none is readable."""
    dev = torch.device("cpu") if device is None else torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


#: Below this many bytes :func:`check_fits` does not look at the memory (it is cheap, not free).
SMALL_BYTES = 64 * 2**20


def check_fits(nbytes: int, what: str, device=None, *, hint: str = "") -> None:
    """Refuse, before allocating, a computation that needs ``nbytes`` bytes on ``device``
    (``None``: the CPU) when fewer are available (:func:`available_memory`): a
    :class:`DoesNotFit` naming ``what``, the memory it needs and the memory available."""
    if nbytes < SMALL_BYTES:
        return
    free = available_memory(device)
    if free is not None and nbytes > free:
        where = "the CPU" if device is None or torch.device(device).type == "cpu" else str(device)
        raise DoesNotFit(
            f"{what} needs about {_gib(nbytes)} of memory, but {where} has "
            f"{_gib(free)} available; {hint or 'use smaller sizes'}."
        )


def describe_device(device: str | torch.device | None = "auto") -> str:
    """A one-line description of ``device`` for benchmark tables, e.g.
    ``"cuda:0 (NVIDIA H200)"`` or ``"cpu (2 threads)"``."""
    dev = pick_device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"cpu ({torch.get_num_threads()} threads)"


@contextmanager
def small_work_threads(elements: int, threshold: int = 1 << 22):
    """Run torch single-threaded while the work is small (``elements`` below ``threshold``):
    on a loaded machine, small matrix products with several threads spend most of their time
    waiting for each other (measured: 30× slower at ``k·d ≈ 10⁴``). Restores the setting."""
    before = torch.get_num_threads()
    if elements < threshold and before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
