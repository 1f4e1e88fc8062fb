"""What a reader relies on in every chapter of the toc, checked in the sources: formal
statements are labelled, figures are named, captioned and cited, and a chapter that cites
has its own bibliography. (Unresolved references are caught by the -n -W build and by the
browser check.)"""

import re
from pathlib import Path

import pytest

from tools.browser_check import toc_pages  # the one reader of _toc.yml

ROOT = Path(__file__).resolve().parents[1]


def _pages():
    return [ROOT / "book" / f"{page}.md" for page in toc_pages(ROOT / "_toc.yml")]


PAGES = _pages()


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_statements_labelled_figures_cited_bibliography(page):
    text = page.read_text()
    # every sphinx-proof statement (``` or ::: fences) carries a :label:; a proof follows its
    # statement and is never cited on its own, so it needs none
    for m in re.finditer(r"^(`{3,}|:{3,})\{prf:(\w+)\}[^\n]*\n((?::[^\n]*\n)*)", text, flags=re.M):
        if m.group(2) not in ("ref", "proof"):
            assert ":label:" in m.group(3), f"{page.name}: a prf:{m.group(2)} block has no :label:"
    # every figure made by a cell has a name and a caption, and the chapter cites it
    for m in re.finditer(r"^:\s+figure:\n((?::\s{3,}[^\n]*\n)+)", text, flags=re.M):
        meta = m.group(1)
        name = re.search(r"name:\s*(\S+)", meta)
        assert name, f"{page.name}: a figure cell has no name"
        assert "caption:" in meta, f"{page.name}: figure {name.group(1)} has no caption"
        assert f"{{numref}}`{name.group(1)}`" in text, (
            f"{page.name}: figure {name.group(1)} is never cited with {{numref}}"
        )
    # a chapter that cites has its own bibliography
    if "{footcite" in text:
        assert "{footbibliography}" in text, f"{page.name}: footcite without footbibliography"
