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
    upload = [s for s in book["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
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
            assert re.search(rf"^{pin}==", (ROOT / "requirements.txt").read_text(), flags=re.M), \
                f"job {name} takes the {pin} pin from requirements.txt, which has none"
