"""What a reader relies on in every chapter of the toc, checked in the sources: formal
statements are labelled, figures are named, captioned and cited, and a chapter that cites
has its own bibliography. (Unresolved references are caught by the -n -W build and by the
browser check.)"""

import ast
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


MAX_LINES = 600  # a chapter longer than this is split at its own seams (issue 22)
CELL = re.compile(r"^```\{code-cell\} ipython3\n(.*?)^```\n", flags=re.M | re.S)
GLUE_CELL = ":tags: [remove-cell]\n"  # the cell a chapter glues its numbers in
MAX_CODE_COLUMNS = 88  # code cells do not scroll sideways in the rendered page
MAX_SHOWS_BULLETS = 6
MAX_SHOWS_CHARS = 66  # one line of the box at a 1280-px window (the browser check measures it)


def _shows_box(text: str) -> list[str] | None:
    """The lines inside the chapter's "What this chapter shows" admonition, or None."""
    pattern = r"^(:{3,})\{admonition\} What this chapter shows\n(.*?)^\1$"
    m = re.search(pattern, text, flags=re.M | re.S)
    if m is None:
        return None
    return [line for line in m.group(2).splitlines() if not line.startswith(":class:")]


def _rendered(line: str) -> str:
    """A bullet's text roughly as the page shows it: a role shows its title or its target,
    ``$…$`` math about half its TeX."""
    line = re.sub(r"\{[\w:]+\}`([^`<]*?)\s*<[^`>]*>`", r"\1", line)  # {ref}`title <label>`
    line = re.sub(r"\{prf:ref\}`[^`]*`", "Proposition 10", line)  # sphinx-proof: "Kind N"
    line = re.sub(r"\{[\w:]+\}`([^`]*)`", r"\1", line)
    line = re.sub(r"\$([^$]*)\$", lambda m: "x" * ((len(m.group(1)) + 1) // 2), line)
    return line.replace("**", "").replace("`", "").strip()


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_chapter_reads_like_a_lecture(page):
    """At most 600 lines; code lines at most 88 columns; a "shows" box (every chapter that
    runs code has one, fenced by three or more colons) of at most 6 one-line bullets."""
    text = page.read_text()
    lines = text.splitlines()
    shown = CELL.sub(lambda m: "" if m.group(1).startswith(GLUE_CELL) else m.group(0), text)
    n_shown = len(shown.splitlines())  # a glue cell does not render (checked below)
    assert n_shown <= MAX_LINES, f"{page.name}: {n_shown} lines (at most {MAX_LINES})"
    in_code = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_code = line.startswith("```{code-cell}") if not in_code else False
            continue
        if in_code:
            assert len(line) <= MAX_CODE_COLUMNS, (
                f"{page.name}:{number}: a code line of {len(line)} characters "
                f"(at most {MAX_CODE_COLUMNS}): {line.strip()[:60]}…"
            )
    box = _shows_box(text)
    if box is None:
        assert "```{code-cell}" not in text, f"{page.name}: a chapter without a shows box"
        return
    bullets = [line for line in box if line.strip()]
    assert all(b.startswith("- ") for b in bullets), (
        f"{page.name}: the shows box has a line that is not a one-line bullet: "
        f"{next(b for b in bullets if not b.startswith('- '))!r}"
    )
    assert 1 <= len(bullets) <= MAX_SHOWS_BULLETS, f"{page.name}: {len(bullets)} bullets"
    for b in bullets:
        shown = _rendered(b[2:])
        assert len(shown) <= MAX_SHOWS_CHARS, (
            f"{page.name}: a shows bullet of about {len(shown)} characters on the page "
            f"(at most {MAX_SHOWS_CHARS}): {b[:60]}…"
        )


def _split_cell(cell: str) -> tuple[str, str]:
    """A code cell's options (a ``---`` YAML block or ``:key:`` lines) and its code."""
    lines = cell.split("\n")
    end = lines.index("---", 1) + 1 if lines[0] == "---" else 0
    while end < len(lines) and lines[end].startswith(":"):
        end += 1
    return "\n".join(lines[:end]), "\n".join(lines[end:])


def _is_glue_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "glue_values"
    )


def _only_gluing(statements: list[ast.stmt]) -> bool:
    """Glue calls, and loops over names that glue (with the assignments they need)."""
    allowed = (
        _is_glue_call(s)
        or isinstance(s, ast.Assign)
        or (isinstance(s, ast.For) and _only_gluing(s.body))
        for s in statements
    )
    return all(allowed) and any(_is_glue_call(s) or isinstance(s, ast.For) for s in statements)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_gluing_is_out_of_the_readers_way(page):
    """The asserts stay in the cells a reader sees, the ``glue_values`` bookkeeping goes to a
    ``remove-cell`` after them (issue 54), and such a cell holds nothing but gluing, so that
    no check or computation is hidden from the page."""
    text = page.read_text()
    for m in CELL.finditer(text):
        head, code = _split_cell(m.group(1))
        where = f"{page.name}:{text[: m.start()].count(chr(10)) + 1}"
        tree = ast.parse(code)
        if m.group(1).startswith(GLUE_CELL):
            assert _only_gluing(tree.body), f"{where}: a remove-cell that does not only glue"
        elif not any(tag in head for tag in ("hide-cell", "hide-input")):
            assert not any(_is_glue_call(s) for s in ast.walk(tree)), (
                f"{where}: a visible cell glues; move its glue_values to a remove-cell after it"
            )
