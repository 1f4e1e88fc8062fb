"""tools/sphinx_js_dedup.py (loaded by _config.yml): an inline script that an extension adds
after the HTML builder is made (sphinx-thebe's ``const THEBE_JS_URL``) is written once per
page, not twice (a ``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared`` in
every page's console under Sphinx 7). Each build runs in its own process: the extension
patches the builder class."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LATE_SCRIPT = """
def add(app, env, docnames):           # as sphinx-thebe's init_thebe_core
    app.add_js_file(None, body='const LATE_CONST = 1')

def setup(app):
    app.connect("env-before-read-docs", add)
"""


def _build(tmp: Path, extensions: list[str]) -> str:
    src, out = tmp / "src", tmp / "out"
    src.mkdir()
    (src / "late_script.py").write_text(LATE_SCRIPT)
    (src / "conf.py").write_text(
        "import sys\nsys.path[:0] = [%r, %r]\nextensions = %r\n"
        % (str(src), str(ROOT / "tools"), extensions)
    )
    (src / "index.rst").write_text("Title\n=====\n\ntext\n")
    subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(out)],
        check=True,
        capture_output=True,
    )
    return (out / "index.html").read_text()


@pytest.mark.parametrize("fixed", [False, True], ids=["sphinx alone", "with sphinx_js_dedup"])
def test_an_inline_script_added_after_the_builder_is_written_once(tmp_path, fixed):
    import sphinx

    html = _build(tmp_path, ["late_script"] + (["sphinx_js_dedup"] if fixed else []))
    count = html.count("const LATE_CONST = 1")
    if fixed or sphinx.version_info[:3] >= (8, 2, 2):
        assert count == 1
    else:
        assert count == 2  # the bug the extension works around: the check can fail


def test_the_book_loads_the_extension():
    import yaml

    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["sphinx"]["local_extensions"].get("sphinx_js_dedup") == "tools"
