"""The README stays true (issue 53): its layout table names every public module of each
``wsutils`` package and no other, and it links to no host that nothing here publishes to."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _layout_rows() -> dict[str, set[str]]:
    """``{folder: names}`` for each layout row whose first cell is one ``wsutils`` folder: the
    backticked lower-case names of its second cell (``scale()`` and the like excluded)."""
    rows = {}
    for line in README.splitlines():
        m = re.match(r"\|\s*`(wsutils/(?:[a-z_]+/)?)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([a-z_0-9]+)`", m.group(2)))
    return rows


def test_layout_table_lists_every_public_module():
    rows = _layout_rows()
    packages = sorted(
        f"{p.parent.relative_to(ROOT)}/" for p in (ROOT / "wsutils").rglob("__init__.py")
    )
    assert sorted(rows) == packages, "one layout row per wsutils package"
    for folder, names in rows.items():
        public = {p.stem for p in (ROOT / folder).glob("*.py") if not p.stem.startswith("_")}
        assert names == public, (folder, sorted(names ^ public))


def test_no_invented_host():
    assert "github.io" not in README, "say where the Pages workflow publishes, not a host"
    assert (ROOT / ".github" / "workflows" / "book.yml").is_file()


def test_build_times_are_the_measured_ones():
    """The README's paper-scale times are figures of ``benchmarks/README.md`` (cold: a
    ``make paper`` run; warm: the same build again from its cache)."""
    m = re.search(r"\*\*(\d+) s\*\* from a cold start.*?\*\*(\d+) s\*\* warm", README, re.S)
    assert m, "the README gives the paper-scale build time, cold and warm"
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    cold, warm = m.groups()
    assert re.search(rf"\*\*`make paper` on a fresh clone[^*]*: {cold} s\*\*", bench), cold
    assert re.search(rf"\*\*A warm `make book`[^*]*: {warm} s\*\*", bench), warm
