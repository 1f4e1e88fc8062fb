"""Collect the book's MyST chapters (``book/*.md``) as nbval notebooks.

nbval 0.11 only collects ``*.ipynb``; here each chapter that myst-nb would execute (a full
jupytext header with a kernelspec) is read with jupytext and handed to nbval's own collector,
so every code cell becomes a pytest item and a failing ``assert`` fails ``pytest --nbval``.
The chapters keep no outputs, so nbval compares nothing: their asserts are the checks.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import jupytext
from nbval.plugin import IPyNbFile

BOOK = Path(__file__).parent / "book"


def _is_chapter(path: Path) -> bool:
    if path.suffix != ".md" or path.parent != BOOK:
        return False
    meta = jupytext.read(path).metadata
    return "kernelspec" in meta and "jupytext" in meta


class MystChapter(IPyNbFile):
    """A MyST chapter, converted in memory by jupytext, run by nbval cell by cell."""

    def collect(self):
        nb = jupytext.read(self.path)
        with mock.patch("nbval.plugin.nbformat.read", return_value=nb):
            yield from super().collect()


def pytest_collect_file(file_path: Path, parent):
    opt = parent.config.option
    if (opt.nbval or opt.nbval_lax) and _is_chapter(file_path):
        return MystChapter.from_parent(parent, path=file_path)
    return None
