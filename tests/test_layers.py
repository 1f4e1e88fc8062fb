"""The package shows its layers: read from the source with ``ast``, not by importing it.

(a) No ``_private`` name (one leading underscore, not a dunder) is imported from another
    subpackage of ``wsutils``; the top-level modules (``maps``, ``weights``, ``sensitivity``,
    ``checks``, …) and ``wsutils/__init__`` together count as the package root. The one
    exception: ``wsutils._tensor`` and ``wsutils._digest`` are the package's shared internals,
    and their public names may be imported from anywhere in ``wsutils``.
(b) No import cycle among the modules of ``wsutils`` through module-level imports.
(c) An import inside a function may break such a cycle only where :data:`DEFERRED` says why
    (today none does; the imports inside functions only defer an import).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "wsutils"
SHARED = {"wsutils._tensor", "wsutils._digest"}

#: ``(module, imported module)`` pairs whose import inside a function breaks a cycle, each
#: with the reason the shared code cannot move to the lower layer.
DEFERRED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    """Every module of wsutils, dotted (``wsutils.estimators.rf``; a package is its
    ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> str:
    """The subpackage a module belongs to (``estimators``, ``run``, …), ``""`` for the root."""
    parts = module.split(".")
    if len(parts) == 2 and module not in _packages():
        return ""  # a top-level module file
    return parts[1] if len(parts) > 1 else ""


def _packages() -> set[str]:
    return {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imports(module: str):
    """``(lineno, target module, imported name or None, at module level)`` for every import
    of a wsutils module in ``module``; ``from X import name`` where ``X.name`` is a module
    targets that module (name ``None``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function |= {id(n) for n in ast.walk(node) if n is not node}
    for node in ast.walk(tree):
        top = id(node) not in in_function
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "wsutils":
                    yield node.lineno, alias.name, None, top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "wsutils":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    yield node.lineno, sub, None, top
                else:
                    yield node.lineno, target, alias.name, top


def _rel(module: str) -> str:
    return str(MODULES[module].relative_to(PACKAGE.parent))


def test_the_module_list_is_read():
    assert {"wsutils", "wsutils.maps", "wsutils.estimators.rf", "wsutils.run.sweep"} <= set(
        MODULES
    )
    assert _layer("wsutils.maps") == "" and _layer("wsutils") == ""
    assert _layer("wsutils.estimators.rf") == "estimators" and _layer("wsutils.trained") == (
        "trained"
    )


def test_no_private_name_crosses_a_subpackage():
    bad = []
    for module in MODULES:
        for lineno, target, name, _ in _imports(module):
            if _layer(target) == _layer(module):
                continue
            private_path = [p for p in target.split(".") if _private(p)]
            if target in SHARED and not (name and _private(name)):
                continue  # the shared internals' public names
            if private_path or (name and _private(name)):
                what = f"{target}.{name}" if name else target
                bad.append(
                    f"{_rel(module)}:{lineno}: {module} (layer {_layer(module) or 'root'!r}) "
                    f"imports {what} (layer {_layer(target) or 'root'!r})"
                )
    assert not bad, (
        "private names imported across subpackages of wsutils; make each a public, "
        "documented function of its module (or use an existing public one):\n  " + "\n  ".join(bad)
    )


def _graph(module_level_only: bool = True) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for _, target, _, top in _imports(module):
            if (top or not module_level_only) and target in MODULES and target != module:
                graph[module].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, …, a]``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_cycle_among_module_level_imports():
    cycle = _cycle(_graph())
    assert cycle is None, (
        "import cycle among wsutils modules (module-level imports): "
        + " -> ".join(cycle)
        + "; break it by moving the shared code to the lower layer (or, if that is not "
        "possible, import inside the function and list it in DEFERRED with the reason)"
    )


def test_an_import_inside_a_function_that_breaks_a_cycle_says_why():
    """An import inside a function that would close a cycle at module level is allowed only
    with its reason in :data:`DEFERRED` (the others defer an import, they break nothing)."""
    graph = _graph()
    found = {}
    for module in MODULES:
        for lineno, target, _, top in _imports(module):
            if top or target not in MODULES or target == module:
                continue
            trial = {m: set(t) for m, t in graph.items()}
            trial[module].add(target)
            cycle = _cycle(trial)
            if cycle is not None:
                found[(module, target)] = f"{_rel(module)}:{lineno}: " + " -> ".join(cycle)
    unexplained = sorted(set(found) - set(DEFERRED))
    assert not unexplained, (
        "imports inside functions that break an import cycle, without a reason in DEFERRED "
        "(add it, or move the shared code to the lower layer):\n  "
        + "\n  ".join(found[k] for k in unexplained)
    )
    gone = sorted(set(DEFERRED) - set(found))
    assert not gone, f"DEFERRED lists imports that no longer break a cycle: {gone}"
