"""The browser check (``make browser-check``, tools/browser_check.py): it must catch each kind
of breakage on a small hand-made site, pass a clean page, and pass on the built book when one
is there. Skipped, with the reason, where no Chromium is installed."""

import importlib.util
import struct
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "browser_check", ROOT / "tools" / "browser_check.py"
)
browser_check = sys.modules["browser_check"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(browser_check)

CHROMIUM = browser_check.find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium installed (apt-get install -y chromium, or set CHROMIUM): "
    "the browser check cannot run",
)


def _png(width: int, height: int, pixel) -> bytes:
    """A PNG of ``width × height`` RGB pixels, ``pixel(x, y) -> (r, g, b)``."""
    raw = b"".join(
        b"\0" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height)
    )

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _page(body: str) -> str:
    return (
        f"<!doctype html><html><body><main><section id='s'>{body}</section></main></body></html>"
    )


BROKEN = {
    "traceback": (
        "<div class='cell_output'><div class='output traceback'><pre>"
        "Traceback (most recent call last): ValueError</pre></div></div>",
        "error output",
    ),
    "missing-figure": (
        "<figure><img src='nowhere.png'><figcaption>a</figcaption></figure>",
        "did not load",
    ),
    "blank-figure": ("<figure><img src='blank.png'><figcaption>b</figcaption></figure>", "blank"),
    "raw-tex": (
        "<p>the bound <span class='math notranslate'>\\(\\sqrt{n}\\)</span></p>",
        "math not rendered",
    ),
    "raw-dollars": ("<p>we have $$\\frac{1}{n}$$ here</p>", "raw TeX"),
    "question-marks": ("<p>see Figure ?? for details</p>", "unresolved reference"),
    "dead-xref": (
        "<p>see <span class='xref std std-ref'>fig-first-look</span></p>",
        "unresolved reference",
    ),
    # a script included twice (sphinx-thebe's under Sphinx 7): the console's SyntaxError
    "script-twice": (
        "<p>text</p><script>const THEBE_JS_URL = 'a';</script>"
        "<script>const THEBE_JS_URL = 'a';</script>",
        "console error: SyntaxError: Identifier 'THEBE_JS_URL' has already been",
    ),
    "console-error": (
        "<p>text</p><script>console.error('broken widget')</script>",
        "console error: broken widget",
    ),
    "missing-script": ("<p>text</p><script src='nowhere.js'></script>", "console error"),
    # a code line wider than its column scrolls sideways and hides its end (issue 53)
    "wide-code": (
        "<div class='cell_input'><div class='highlight' style='width: 300px'>"
        "<pre style='overflow-x: auto; white-space: pre'>"
        + "x = 1  # "
        + "a" * 200
        + "</pre></div></div>",
        "code scrolls sideways",
    ),
    # a column one word wide (issue 62: the ledger's cells wrapped to two to four words a line)
    "narrow-table": (
        "<table style='width: 260px'><tr><th style='width: 50px'>claim</th><th>number</th></tr>"
        "<tr><td>the number that decides it runs down many lines</td><td>0.42</td></tr></table>",
        "table: a cell wraps",
    ),
    # the front door's first screen (issue 62): the intro's figure below 900 px
    "intro": (
        "<h1>Intro</h1><div style='height: 1200px'>a long first paragraph</div>"
        "<figure><img src='plot.png' width='300'><figcaption>the summary</figcaption></figure>",
        "first screen: the summary figure ends at",
    ),
    "ledger": ("<h1>Ledger</h1><p>no table at all</p>", "first screen: the abstract's table is"),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "plot.png").write_bytes(_png(60, 40, lambda x, y: (255 * (x > y), 80, 255 * (y > 20))))
    (root / "blank.png").write_bytes(_png(60, 40, lambda x, y: (255, 255, 255)))
    (root / "clean.html").write_text(
        _page(
            "<h1>Clean</h1><p>Prices in code: <code>\\alpha ?? $$</code>.</p>"
            "<figure><img src='plot.png' width='300'><figcaption>a real plot</figcaption></figure>"
            "<div class='cell_input'><div class='highlight'><pre>x = 1  # fits</pre></div></div>"
            "<table><tr><th>n</th><th>a column wide enough to wrap in</th></tr><tr><td>16</td>"
            "<td>" + "a cell of many words that wraps in a wide column " * 8 + "</td></tr></table>"
            # a narrow column whose one line has a subscript and a box raised by most of a
            # line (inline math's shape): one line, not a wrap
            "<table style='width: 300px'><tr><th style='width: 40px'>q<sub>d,n</sub></th>"
            "<th>" + "a wide column of words " * 6 + "</th></tr><tr><td>a<sub>0</sub>"
            "<span style='vertical-align: 0.9em'>+</span></td><td>x</td></tr></table>"
        )
    )
    for name, (body, _) in BROKEN.items():
        (root / f"{name}.html").write_text(_page(body))
    return root


def test_clean_page_passes_and_gets_a_screenshot(site, tmp_path):
    [report] = browser_check.check_site(site, ["clean"], tmp_path, CHROMIUM)
    assert report.problems == []
    assert report.screenshot.read_bytes().startswith(b"\x89PNG")


def test_each_breakage_is_reported(site):
    reports = browser_check.check_site(site, list(BROKEN), None, CHROMIUM)
    for r in reports:
        expected = BROKEN[r.page][1]
        assert any(expected in p for p in r.problems), (r.page, r.problems)


def test_toc_pages_lists_every_file():
    pages = browser_check.toc_pages(ROOT / "_toc.yml")
    assert pages[0] == "intro" and "word-sensitivity" in pages
    assert all((ROOT / "book" / f"{p}.md").is_file() for p in pages)


def test_built_book_passes(tmp_path):
    html = ROOT / "_build" / "html"
    pages = browser_check.toc_pages(ROOT / "_toc.yml")
    if not all((html / f"{p}.html").is_file() for p in pages):
        pytest.skip(
            "no complete build in _build/html: run `make book` (or "
            "`WSBOOK_SCALE=quick make book`) first, then `make browser-check`"
        )
    if not (ROOT / "_static" / "mathjax" / "es5" / "tex-mml-chtml.js").is_file():
        pytest.skip(
            "the build loads MathJax from its CDN (no local copy: `make mathjax`, then "
            "`make book`), which a machine offline cannot reach: its math would not render"
        )
    reports = browser_check.check_site(html, pages, tmp_path, CHROMIUM)
    assert {r.page: r.problems for r in reports if r.problems} == {}
