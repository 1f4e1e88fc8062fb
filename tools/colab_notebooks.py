"""Notebooks for the Colab button: every executable chapter of the toc as ``book/NAME.ipynb``,
with a first cell that installs the book's package when (and only when) it runs on Colab.

    python tools/colab_notebooks.py OUT [--toc _toc.yml] [--repo https://github.com/ORG/REPO]

Colab opens ``.ipynb`` files from GitHub but not MyST ``.md`` chapters, and starts without
``wsutils``. The publishing workflow writes these notebooks to the ``colab`` branch, and
``book/_ext/wsbook_sphinx.py`` points each page's Colab button there. The chapters themselves
stay free of install cells.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from browser_check import toc_pages  # noqa: E402

INSTALL = """\
# On Colab only: install this book's package (and myst-nb, for `glue`) from its repository.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "myst-nb",
                    "wsutils @ git+{repo}@main"], check=True)"""


def repository_url() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def convert(chapter: Path, repo: str) -> nbformat.NotebookNode | None:
    """The chapter as a notebook with the install cell first, or None if it is not executable."""
    nb = jupytext.read(chapter)
    if "kernelspec" not in nb.metadata or "jupytext" not in nb.metadata:
        return None
    nb.metadata.pop("jupytext", None)
    cell = nbformat.v4.new_code_cell(INSTALL.format(repo=repo))
    cell.metadata["tags"] = ["colab-install"]
    nb.cells.insert(0, cell)
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--toc", type=Path, default=ROOT / "_toc.yml")
    ap.add_argument("--repo", default=None, help="repository URL (default: _config.yml's)")
    args = ap.parse_args(argv)
    repo = args.repo or repository_url()
    written = 0
    for page in toc_pages(args.toc):
        nb = convert(ROOT / "book" / f"{page}.md", repo)
        if nb is None:
            continue
        target = args.out / "book" / f"{page}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written += 1
    print(f"{written} Colab notebooks in {args.out / 'book'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
