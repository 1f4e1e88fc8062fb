"""The reproduction ledger (``book/ledger.md``, issue 53) is built from the chapters: every
value it pastes is glued by the chapter it names, and every statement it cites is defined by
some chapter. A row that names a value or a label no chapter defines fails here (and the
book's ``-W`` build fails on it too)."""

from __future__ import annotations

import re
from pathlib import Path

from tools.browser_check import toc_pages

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
LEDGER = (BOOK / "ledger.md").read_text()


def _glued_in(source: str, name: str) -> bool:
    """Whether the chapter ``source`` glues ``name``: as a keyword (``name=``) or a string key
    (``"name"``), or through a key template (``f"p_{x}"``, ``"yD1_{}".format``)."""
    if re.search(rf"\b{re.escape(name)}\s*=(?!=)|[\"']{re.escape(name)}[\"']", source):
        return True
    # a key template: placeholders of plain names (no format spec) and literal identifier
    # parts, at least one of them (``f"{key}_{name}"``, ``"yD1_{}"``), nothing else
    slot = r"\{(?:[A-Za-z_][A-Za-z0-9_]*)?\}"
    key = rf"[A-Za-z0-9_]*(?:{slot}[A-Za-z0-9_]*)+"
    for template in re.findall(rf"f?[\"']({key})[\"']", source):
        parts = re.split(slot, template)
        if any(parts) and re.fullmatch("[A-Za-z0-9_]+".join(map(re.escape, parts)), name):
            return True
    return False


def test_every_pasted_value_is_glued_by_its_chapter():
    pastes = re.findall(r"\{glue:text\}`([\w-]+\.md)::([A-Za-z0-9_]+)", LEDGER)
    assert len(pastes) >= 20, "the ledger pastes its numbers from the chapters"
    for doc, name in pastes:
        path = BOOK / doc
        assert path.is_file(), f"the ledger names {doc}, which is not a chapter"
        assert _glued_in(path.read_text(), name), f"{doc} glues no value {name!r}"


def test_every_cited_statement_is_defined():
    labels = set()
    for page in BOOK.glob("*.md"):
        labels |= set(re.findall(r"^:label: ([\w-]+)$", page.read_text(), flags=re.M))
    cited = re.findall(r"\{prf:ref\}`([\w-]+)`", LEDGER)
    assert cited and set(cited) <= labels, sorted(set(cited) - labels)


def test_ledger_follows_the_intro_and_the_readme_links_it():
    assert toc_pages(ROOT / "_toc.yml")[:2] == ["intro", "ledger"]
    assert "book/ledger.md" in (ROOT / "README.md").read_text()


def test_a_missing_value_would_fail():
    """The check itself: a name that no chapter glues, or one only mentioned in prose, is
    not taken for a glued value."""
    source = (BOOK / "generalization.md").read_text()
    assert _glued_in(source, "rf_headline")
    assert not _glued_in(source, "no_such_value")
