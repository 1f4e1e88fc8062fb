"""The API page (book/api.md) lists every public module of wsutils, and every public name has
a docstring, so the page autodoc builds from it is complete."""

import importlib
import pkgutil
import re
from pathlib import Path

import wsutils

API_PAGE = Path(__file__).resolve().parents[1] / "book" / "api.md"
INTERNAL = {"checks"}  # input validation shared by the modules, not an API of its own


def _defines_names(name: str) -> bool:
    """A subpackage whose ``__init__`` only groups modules (a docstring) has no API of its own;
    one whose ``__all__`` re-exports names from its own modules has (autodoc documents every
    name of ``__all__`` on its page)."""
    module = importlib.import_module(f"wsutils.{name}")
    return any(
        getattr(v, "__module__", None) == module.__name__
        for n, v in vars(module).items()
        if not n.startswith("_")
    ) or bool(_reexported(name))


def _reexported(name: str) -> set[str]:
    """The names of ``wsutils.<name>``'s ``__all__`` defined in its own submodules."""
    module = importlib.import_module(f"wsutils.{name}")
    inside = f"{module.__name__}."
    return {
        n
        for n in getattr(module, "__all__", ())
        if getattr(getattr(module, n), "__module__", "").startswith(inside)
    }


def _documented_by_parent(name: str) -> bool:
    """A module whose public names all appear in its package's ``__all__`` is documented on
    its package's page, not on its own."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return False
    module = importlib.import_module(f"wsutils.{name}")
    own = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    }
    return bool(own) and own <= _reexported(parent)


def _public_modules() -> list[str]:
    """Every module and subpackage of wsutils (dotted, below ``wsutils.``) with public names."""
    names = [
        m.name.removeprefix("wsutils.")
        for m in pkgutil.walk_packages(wsutils.__path__, prefix="wsutils.")
    ]
    return sorted(
        n
        for n in names
        if not any(part.startswith("_") for part in n.split("."))
        and n not in INTERNAL
        and _defines_names(n)
        and not _documented_by_parent(n)
    )


def test_every_public_module_is_on_the_api_page():
    documented = set(
        re.findall(
            r"^\.\. automodule:: wsutils\.([\w.]+)\s*\n\s+:members:",
            API_PAGE.read_text(),
            flags=re.M,
        )
    )
    missing = set(_public_modules()) - documented
    assert not missing, f"add an automodule block for {sorted(missing)} to {API_PAGE}"
    assert documented <= set(_public_modules()) | INTERNAL, "the page lists a module that is gone"


def test_every_public_name_is_documented():
    undocumented = []
    exported = set()
    for name in _public_modules():
        module = importlib.import_module(f"wsutils.{name}")
        assert module.__doc__, f"wsutils.{name} has no module docstring"
        names = getattr(module, "__all__", None)
        if names is None:  # then autodoc lists the public objects defined in the module
            names = [
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
            ]
        exported |= set(names)
        undocumented += [f"{name}.{n}" for n in names if not getattr(module, n).__doc__]
    assert not undocumented, f"public names without a docstring: {undocumented}"
    # the names re-exported by the package are documented in their module
    assert set(wsutils.__all__) <= exported
