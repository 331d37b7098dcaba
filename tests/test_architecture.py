"""The shape of the code that the next engineer relies on: no import circles inside soakd, no
import hidden in a function without a reason, and one table of exit codes."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "soakd"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: annotations only, never run."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _imports(path: Path, known: set[str]) -> set[str]:
    """The soakd modules ``path`` imports when it runs (anywhere in it, functions included)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else node.module)
    return {m for m in out if m in known}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as a path of module names, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    """The check below can fail: a two-module loop and a three-module loop are both reported."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_soakd() -> None:
    """No module of soakd imports, directly or through others, a module that imports it back
    (package __init__ files that only re-export are not part of a circle through their children)."""
    mods = _modules()
    known = set(mods)
    graph = {name: _imports(path, known) - {name} for name, path in mods.items()}
    for name in list(graph):  # a package's face imports its children; children importing siblings is not a loop
        if mods[name].name == "__init__.py":
            graph[name] = set()
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


def test_every_import_inside_a_function_says_why() -> None:
    """An import inside a function (startup cost, an optional dependency) carries a comment on its
    line or the line above."""
    unexplained = []
    for name, path in _modules().items():
        src = path.read_text().splitlines()
        tree = ast.parse("\n".join(src))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line, above = src[node.lineno - 1], src[node.lineno - 2] if node.lineno > 1 else ""
                    if "#" not in line and not above.strip().startswith("#"):
                        unexplained.append(f"{name}:{node.lineno}: {line.strip()}")
    assert not unexplained, "imports inside functions without a comment saying why:\n" + "\n".join(unexplained)


def test_exit_codes_are_defined_once() -> None:
    """Only soakd/errors.py defines exit codes; everything else imports ``Exit``."""
    offenders = []
    for name, path in _modules().items():
        if name == "soakd.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                names = [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
                offenders += [f"{name}: {n}" for n in names if n.startswith("EXIT_")]
    assert not offenders, offenders
