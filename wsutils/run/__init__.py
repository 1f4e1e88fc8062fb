"""Running the book's experiments: the knobs (config), seeds, grids on any executor (sweep),
devices, progress."""

from ._progress import install as install_progress

__all__ = ["install_progress"]
