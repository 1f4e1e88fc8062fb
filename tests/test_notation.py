"""One meaning per symbol (``book/notation.md``), checked against the sources.

What a test can catch: the page lists no symbol twice; every entry of its tables is a
symbol (so that the first check sees them all); the symbols of a section marked with a
chapter ("Normalisations (chapter {doc}`normalisation`)") occur in no other chapter's
mathematics outside proofs; a symbol the page defines by an equation (``D = nd``) is not
defined otherwise; and the secondary spellings that the book renamed (issue 23, item 12) do
not come back. What it cannot catch: a new symbol that a chapter defines with a second meaning
under a spelling nobody listed, or prose that uses a listed symbol loosely."""

import re
from collections import defaultdict
from pathlib import Path

import pytest

from tools.browser_check import toc_pages  # the one reader of _toc.yml

ROOT = Path(__file__).resolve().parents[1]
NOTATION = ROOT / "book" / "notation.md"
CHAPTERS = [ROOT / "book" / f"{p}.md" for p in toc_pages(ROOT / "_toc.yml") if p != "notation"]

_TOKEN = re.compile(r"\\[A-Za-z]+|[^\s{}]")  # a command or one character
_RELATION = re.compile(r"\s(?:=|\\in|\\le|\\ge|\\sim|<|>)\s|\s?:\s")


def _symbol(entry: str) -> str:
    """The symbol an entry of the page's first column names: the part before a relation
    (``D = nd`` names ``D``), without a function's arguments (``S_\\varphi(X)`` names
    ``S_\\varphi``), spaces and braces removed (``V_{i}`` and ``V_i`` are one symbol)."""
    head = _RELATION.split(entry, maxsplit=1)[0]
    head = re.sub(r"\([^()]*\)$", "", head.strip())
    out = ""
    for tok in _TOKEN.findall(head):  # a space only where a command meets a letter
        out += (
            " "
            if out[-1:].isalpha() and re.search(r"\\[A-Za-z]+$", out) and tok[0].isalpha()
            else ""
        ) + tok
    return out


def notation_entries():
    """``(symbol, section, line)`` for every ``$...$`` of the first column of every table."""
    section, out = "", []
    for no, line in enumerate(NOTATION.read_text().splitlines(), 1):
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| $"):
            first = line.split(" | ")[0][2:]
            out += [(_symbol(m), section, no) for m in re.findall(r"\$([^$]+)\$", first)]
    return out


def math_of(text: str, proofs: bool = True) -> str:
    """The mathematics of a chapter: inline ``$...$``, display ``$$...$$`` and ``{math}``
    blocks; code cells and prose dropped, and with ``proofs=False`` the ``prf:proof`` blocks
    too (a proof's bound variables are local to it, the page says)."""
    text = re.sub(r"^```\{code-cell\}.*?^```", "", text, flags=re.M | re.S)
    if not proofs:
        text = re.sub(r"^:::\{prf:proof\}.*?^:::$", "", text, flags=re.M | re.S)
    blocks = re.findall(r"^```\{math\}\n(.*?)^```", text, flags=re.M | re.S)
    text = re.sub(r"^```\{math\}.*?^```", "", text, flags=re.M | re.S)
    blocks += re.findall(r"\$\$(.*?)\$\$", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)
    blocks += re.findall(r"(?<!\\)\$([^$]+)\$", text)
    return "\n".join(blocks)


def occurs(symbol: str, math: str) -> bool:
    """``symbol`` (as :func:`_symbol` gives it) occurs in ``math`` as itself, not as part of a
    longer name: spaces and braces may sit between its parts (``\\hat m``, ``q_{d,n}``); it is
    not preceded by a letter or a backslash and not followed by a letter, a subscript or a
    prime, so ``b`` is not found in ``b_{jk}`` or ``b'``, ``m`` not in ``\\mathrm{max}``, and
    ``\\beta`` not in ``\\beta_j``; a power (``\\beta^2``) is the symbol."""
    units = _TOKEN.findall(symbol)
    body = r"[\s{}]*".join(re.escape(u) for u in units)
    pattern = r"(?<![A-Za-z\\])" + body + r"(?![A-Za-z])(?![\s{}]*[_'])"
    return re.search(pattern, math) is not None


def test_the_page_lists_no_symbol_twice():
    where = defaultdict(list)
    for symbol, section, line in notation_entries():
        where[symbol].append(f"line {line} ({section})")
    twice = {s: w for s, w in where.items() if len(w) > 1}
    assert not twice, f"listed more than once on notation.md: {twice}"


def test_every_entry_names_a_symbol():
    entries = notation_entries()
    assert len(entries) > 60, len(entries)  # the parser sees the tables
    for symbol, _, line in entries:
        bad = re.search(r"[=<>]|\\[lr]Vert|\\le\b", symbol)
        assert symbol and len(symbol) <= 40 and not bad, (
            f"notation.md line {line}: {symbol!r} is not a symbol (write the symbol, then "
            "its definition in the meaning column)"
        )


def test_helpers_catch_what_they_should():
    assert _symbol(r"D = nd") == "D" and _symbol(r"S_\varphi(X)") == r"S_\varphi"
    assert _symbol(r"X \in \R^{n\times d}") == "X" and _symbol(r"V_{i}") == "V_i"
    assert occurs("b", "a + b") and not occurs("b", "b_{jk} + b_Q + b'")
    assert occurs(r"\beta", r"\beta\mu + \beta x") and not occurs(r"\beta", r"\beta_j")
    assert occurs(r"\beta", r"\beta^2") and not occurs(r"\beta", r"\betax")
    assert not occurs("m", r"\mathrm{op} + \max") and occurs("m", "m > 0")
    assert _symbol(r"\hat m(d, n)") == r"\hat m" and _symbol(r"\mathcal V") == r"\mathcal V"
    assert occurs(r"\hat m", r"\hat m(d, n)") and occurs("q_d,n", "q_{d,n}")
    assert math_of("a $x$ b\n$$y$$\n```{code-cell} ipython3\n$z$\n```\n") == "y\nx"


def _scoped():
    """``{chapter: symbols}`` for the sections of the page marked "(chapter {doc}`X`)" or
    "(chapters {doc}`X` and {doc}`Y`)" (a section shared by the chapters it names)."""
    out = defaultdict(set)
    for symbol, section, _ in notation_entries():
        m = re.search(r"\(chapters? ([^)]*)\)", section)
        for chapter in re.findall(r"\{doc\}`([\w-]+)`", m.group(1)) if m else ():
            out[chapter].add(symbol)
    return out


# known uses of a scoped symbol elsewhere, each with its reason: {(page, symbol): why}
KNOWN = {
    ("relu-attention", "b"): "S ≈ a/√n + b√d/n, two constants of a model in the paragraph "
    "on tolerances that issue 23 item 11 rewrites: rename them there",
}


@pytest.mark.parametrize("page", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_scoped_symbols_stay_in_their_chapter(page):
    math = math_of(page.read_text(), proofs=False)
    scoped = _scoped()
    own = scoped.get(page.stem, set())  # a section shared with this chapter is its own too
    for chapter, symbols in scoped.items():
        if chapter == page.stem:
            continue
        found = sorted(s for s in symbols - own if occurs(s, math) and (page.stem, s) not in KNOWN)
        assert not found, (
            f"{page.name} uses {found}, which notation.md reserves for the "
            f"chapter {chapter}: rename them (or, with a reason, list them in "
            "KNOWN)"
        )


def test_known_exceptions_are_still_needed():
    for (stem, symbol), why in KNOWN.items():
        math = math_of((ROOT / "book" / f"{stem}.md").read_text(), proofs=False)
        assert occurs(symbol, math), f"{stem}: {symbol!r} is gone; drop it from KNOWN ({why})"


# the renamed secondary uses (issue 23, item 12): (pattern in a chapter's mathematics, why)
FORBIDDEN = [
    (r"R_\\psi", "the realisable word sensitivity is R_\\varphi; \\psi is the arc-cosine map"),
    (r"D_r\b", "D is nd; the diagonal of row scales is \\Lambda_r"),
    (r"\\mu_j", "\\mu_i is ReLU attention's; the doubling's margin of key i in row j is m_j"),
    (r"\\sigma\(", "the logistic function is \\operatorname{sigmoid}"),
    (
        r"\\alpha_j|\\beta_j|\\alpha\s*=\s*\(b_",
        "ReLU attention's column of key i is b_{\\cdot i}, "
        "its entries b_{ji} and b'_{ji}; \\alpha is the entmax order, \\beta the temperature",
    ),
    (
        r"(?<![A-Za-z\\])u\s*=\s*2\^",
        "the float32 unit roundoff is \\varepsilon_{32}; u is the top eigenvector",
    ),
    (
        r"(?<![A-Za-z\\_])W\s*=\s*\[W_Q",
        "W is the d×d attention weight; all heads' weights are W_{QKV}",
    ),
    (r"\\times\s*m\}", "m is the margin; a map's output width is d_{\\mathrm{out}}"),
    (r"(?<![A-Za-z\\])m\s*=\s*\\frac\s*1\s*n", "the mean row is \\bar x"),
    (r"W\^\\top\s*m(?![A-Za-z])", "the mean row is \\bar x"),
    (
        r"(?<![A-Za-z\\_])(?<!\\hat )m\(",
        "m is the margin, not a map (the kernel map of the DRF proof is \\Psi)",
    ),
    (r"(?<![A-Za-z\\])L\s*=\s*12\b", "L is the depth of deep random features"),
    (
        r"(?<![A-Za-z\\])r\(\\Delta\)",
        "r is the DRF ratio; hardmax's count of changed rows is n_\\Delta",
    ),
    (r"\\sigma_S\b|X_\{-S\}", "S is the word sensitivity; a set of searched rows is \\mathcal S"),
    (
        r"\\to\s*v\}|\\Delta_v\b|e_\{?v",
        "v is the read-out direction; a candidate token is t', its row x_{t'i}",
    ),
    (
        r"sigmoid\}?\([^)]*\+\s*b\)",
        "b_{jk} are ReLU attention's scores; the sigmoid bias is b_{\\mathrm{sig}}",
    ),
    (
        r"(?<![A-Za-z\\_{])e\^\\top|\|\s*e\s*=",
        "e is Euler's number, e_i a basis vector; "
        "ReLU's compressed eigenvector is u_{\\mathcal K}",
    ),
]


@pytest.mark.parametrize("page", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_renamed_spellings_do_not_come_back(page):
    math = math_of(page.read_text())
    for pattern, why in FORBIDDEN:
        hit = re.search(pattern, math)
        assert hit is None, f"{page.name}: {hit.group(0)!r} in its mathematics: {why}"


def test_forbidden_patterns_still_match_what_they_forbid():
    samples = [
        r"R_\psi",
        r"D_r Z",
        r"\mu_j > 0",
        r"\sigma(y)",
        r"\alpha_j",
        r"u = 2^{-24}",
        r"W = [W_Q\ W_K]",
        r"\R^{n\times m}",
        r"m = \frac1n \sum_j x_j",
        r"W^\top m",
        r"m(T_{l-1})",
        r"L = 12",
        r"\sqrt{r(\Delta)/n}",
        r"\sigma_S = \|\flat(X_{-S})\|",
        r"X(t_{i\to v})",
        r"\operatorname{sigmoid}(z_k + b)",
        r"\|\tilde x_i\|\,e^\top \tilde x_i",
    ]
    for (pattern, _), sample in zip(FORBIDDEN, samples, strict=True):
        assert re.search(pattern, sample), (pattern, sample)


def _page_definitions():
    """``{symbol: definition}`` for the entries the page writes as ``symbol = definition``."""
    out = {}
    for line in NOTATION.read_text().splitlines():
        if line.startswith("| $"):
            for m in re.findall(r"\$([^$]+)\$", line.split(" | ")[0][2:]):
                parts = re.split(r"\s=\s", m, maxsplit=1)
                if len(parts) == 2:
                    out[_symbol(m)] = parts[1]
    return out


def _flat(s: str) -> str:
    """``s`` without spaces, braces and thin spaces, with one spelling of the norm bars."""
    return re.sub(r"[\s{}]|\\[,;!]", "", re.sub(r"\\[lr]?Vert", r"\\|", s))


# ``symbol = …`` in a chapter that states a fact about the symbol, not a second definition
FACTS = {("t_1", "y"), ("t_1^\\Delta", "y\\cdotf(X_\\Delta")}


def second_definitions(math: str) -> list:
    """``(symbol, what follows its '=')`` for every ``symbol = …`` in ``math`` (a symbol the
    page defines by an equation: ``D = nd``, ``κ = …``, ``g = …``) that is neither the page's
    definition, nor a number, nor a listed fact."""
    out = []
    for symbol, definition in _page_definitions().items():
        body = r"[\s{}]*".join(re.escape(u) for u in _TOKEN.findall(symbol))
        pattern = r"(?<![A-Za-z\\_^])" + body + r"(?![A-Za-z])(?![\s{}]*[_'^])\s*=\s*([^\n$]*)"
        for m in re.finditer(pattern, math):
            got = _flat(m.group(1))
            if not (
                got.startswith(_flat(definition)[:6])
                or re.match(r"[\d.]", got)
                or any(symbol == s and got.startswith(f) for s, f in FACTS)
            ):
                out.append((symbol, m.group(1)[:40]))
    return out


@pytest.mark.parametrize("page", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_defined_symbols_keep_their_definition(page):
    found = second_definitions(math_of(page.read_text(), proofs=False))
    assert not found, f"{page.name} defines again what notation.md defines: {found}"


def test_a_second_definition_is_caught():
    assert _page_definitions()["D"] == "nd"
    assert second_definitions(r"D = \operatorname{diag}(r)") == [("D", r"\operatorname{diag}(r)")]
    assert second_definitions(r"\kappa = \|X\|_{\mathrm{op}}/\sqrt d, D = nd, D = 30{,}720") == []
    assert second_definitions(r"D_r = \operatorname{diag}(r)") == []  # another symbol
