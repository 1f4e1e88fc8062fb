"""Build-time choices for the book's HTML, loaded by ``_config.yml`` (``sphinx: local_extensions:``).

MathJax: ``make mathjax`` unpacks the npm package ``mathjax@3`` into ``_static/mathjax/`` at
the repository root (ignored by git). When ``_static/mathjax/es5/tex-mml-chtml.js`` exists at
build time, that folder is copied into the build's ``_static/`` and ``mathjax_path`` points to
it, so the pages render their mathematics offline; otherwise Sphinx's CDN address is kept.

Colab: Colab opens ``.ipynb`` files, not MyST ``.md`` chapters. The publishing workflow writes
each chapter as a notebook (``tools/colab_notebooks.py``) to the branch :data:`COLAB_BRANCH`,
and every page's Colab button is pointed there.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

STATIC = Path(__file__).resolve().parents[2] / "_static"  # <repo>/_static
MATHJAX_ENTRY = "mathjax/es5/tex-mml-chtml.js"
#: The branch that holds the Colab notebooks (``book/NAME.ipynb``), written by the workflow.
COLAB_BRANCH = "colab"

logger = logging.getLogger(__name__)


def use_local_mathjax(app: Sphinx, config: Config) -> None:
    if not (STATIC / MATHJAX_ENTRY).is_file():
        logger.info("MathJax: no local copy (make mathjax), pages load it from the CDN")
        return
    config.mathjax_path = MATHJAX_ENTRY
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    logger.info(f"MathJax: local copy {STATIC / MATHJAX_ENTRY}")


def _buttons(items):
    for item in items or []:
        yield item
        yield from _buttons(item.get("buttons"))


def colab_notebook_links(app: Sphinx, pagename, templatename, context, doctree) -> None:
    """Point the Colab button of a ``.md`` chapter at its notebook on :data:`COLAB_BRANCH`."""
    for button in _buttons(context.get("header_buttons")):
        url = button.get("url", "")
        if button.get("text") == "Colab" and url.endswith(".md") and "/blob/" in url:
            head, tail = url.split("/blob/", 1)
            path = tail.split("/", 1)[1]  # drop the branch
            button["url"] = f"{head}/blob/{COLAB_BRANCH}/{path[:-3]}.ipynb"


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", use_local_mathjax, priority=900)
    # after sphinx-book-theme's launch buttons (priority 501)
    app.connect("html-page-context", colab_notebook_links, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
