"""The publishing workflow (.github/workflows/book.yml) cannot run here: check that it parses,
that it does what the README promises, and that every command it calls exists."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"


def _workflow():
    return yaml.safe_load(WORKFLOW.read_text())


def _runs(job):
    return "\n".join(step.get("run", "") for step in job["steps"])


def _make_targets():
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def test_triggers_and_jobs():
    wf = _workflow()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert on["push"]["branches"] == ["main"]
    jobs = wf["jobs"]
    assert set(jobs["deploy"]["needs"]) == {"book", "test"}
    assert "make test" in _runs(jobs["test"])
    book = jobs["book"]
    assert book["env"]["WSBOOK_SCALE"] == "paper"
    assert "make book" in _runs(book) and "touch _build/html/.nojekyll" in _runs(book)
    upload = [
        s for s in book["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")
    ]
    assert upload and upload[0]["with"]["path"] == "_build/html"
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}


def test_every_command_it_calls_exists():
    targets = _make_targets()
    for name, job in _workflow()["jobs"].items():
        run = _runs(job)
        for target in re.findall(r"\bmake ([\w-]+)", run):
            assert target in targets, f"job {name} calls `make {target}`, not in the Makefile"
        for script in re.findall(r"\bpython (tools/[\w/]+\.py)", run):
            assert (ROOT / script).is_file(), f"job {name} calls {script}, which does not exist"
        for pin in re.findall(r"\^(\w+)==", run):
            assert re.search(rf"^{pin}==", (ROOT / "requirements.txt").read_text(), flags=re.M), (
                f"job {name} takes the {pin} pin from requirements.txt, which has none"
            )


def _load(path: Path, name: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_colab_notebooks_and_their_buttons(tmp_path):
    import nbformat

    colab = _load(ROOT / "tools" / "colab_notebooks.py", "colab_notebooks")
    assert colab.main([str(tmp_path)]) == 0
    written = sorted(p.stem for p in (tmp_path / "book").glob("*.ipynb"))
    assert "word-sensitivity" in written and "api" not in written  # chapters only
    nb = nbformat.read(tmp_path / "book" / "word-sensitivity.ipynb", as_version=4)
    nbformat.validate(nb)
    assert "google.colab" in nb.cells[0].source and colab.repository_url() in nb.cells[0].source
    assert "kernelspec" in nb.metadata

    ext = _load(ROOT / "book" / "_ext" / "wsbook_sphinx.py", "wsbook_sphinx")
    url = "https://colab.research.google.com/github/o/r/blob/main/book/word-sensitivity.md"
    context = {
        "header_buttons": [
            {
                "type": "group",
                "buttons": [
                    {"text": "Binder", "url": "https://mybinder.org/v2/gh/o/r/main?urlpath=x.md"},
                    {"text": "Colab", "url": url},
                ],
            }
        ]
    }
    ext.colab_notebook_links(None, "word-sensitivity", "page.html", context, None)
    binder, button = context["header_buttons"][0]["buttons"]
    assert button["url"] == (
        "https://colab.research.google.com/github/o/r/blob/"
        f"{ext.COLAB_BRANCH}/book/word-sensitivity.ipynb"
    )
    assert binder["url"].endswith("x.md")  # Binder opens the MyST chapter itself
    # the workflow pushes the notebooks to the branch the buttons point at
    assert f" {ext.COLAB_BRANCH}\n" in _runs(_workflow()["jobs"]["colab"]) + "\n"
