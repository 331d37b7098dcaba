"""The shape of the code that the next engineer relies on: no import circles inside soakd, no
import hidden in a function without a reason, one table of exit codes, no module over 500 lines
and no function over 80 (declarative tables aside, each named below with why)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "soakd"

MAX_MODULE_LINES = 500  # past this a module holds more than one job: split it by what it holds
MAX_FUNCTION_LINES = 80  # past this a function does several steps: name each one
# Functions allowed past MAX_FUNCTION_LINES: declarative tables only, never logic. Each says why.
LONG_TABLES = {
    # One declaration per metric and nothing else: every metric soakd exports, in one place
    # (docs/architecture.md, "metric names"); cutting it up would scatter the names, not shorten logic.
    "soakd.telemetry.catalogue:Metrics.__init__",
}


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


# The data flow, bottom up (docs/architecture.md): a module imports only from its own layer or
# below, so a change low down never needs the rendering or the CLI to make sense. A new top-level
# module or package of soakd has to be placed here first.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "errors names specs tensors",  # words every layer shares
        "config",  # what the user asked for
        "host_limits allocator request fingerprint endpoints preflight",  # the process around a run
        "telemetry models workload",  # measuring, the model, the requests
        "targets state",  # what is driven, what is kept
        "load analysis",  # driving it, judging memory
        "verdicts record summary",  # what a run concludes and the record of it
        "report",  # rendering
        "run",  # the order of a soak
        "cli __main__ store",  # the commands (store: the old import path of state)
    )
)


def _layer(module: str) -> int:
    if module == "soakd":  # the package's face: its version, nothing else
        return 0
    top = module.split(".")[1]
    for rank, layer in enumerate(LAYERS):
        if top in layer:
            return rank
    raise AssertionError(f"{module}: soakd.{top} has no layer in LAYERS (tests/test_architecture.py)")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to one in a higher layer, as ``a -> b``."""
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if _layer(b) > _layer(a))


def test_the_layer_check_finds_an_upward_import() -> None:
    """The check below can fail: the config importing the report is upward; the reverse is not."""
    assert _upward({"soakd.config.read": {"soakd.report.html"}}) == ["soakd.config.read -> soakd.report.html"]
    assert _upward({"soakd.report.html": {"soakd.config.read", "soakd.report.plots"}}) == []


def test_nothing_in_soakd_imports_upward_along_the_data_flow() -> None:
    mods = _modules()
    graph = {name: _imports(path, set(mods)) - {name} for name, path in mods.items() if name != "soakd"}
    assert _upward(graph) == []


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


def _long_functions(module: str, source: str, limit: int) -> dict[str, int]:
    """``{"module:Class.function": lines}`` for every function (methods and nested ones too)
    longer than ``limit`` lines, from its ``def`` line to its last line."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[f"{module}:{name}"] = lines
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def _long_modules(sources: dict[str, str], limit: int) -> dict[str, int]:
    """``{module: lines}`` for every module longer than ``limit`` lines."""
    lengths = {name: len(text.splitlines()) for name, text in sources.items()}
    return {name: n for name, n in lengths.items() if n > limit}


def _function(name: str, lines: int, indent: str = "") -> str:
    """The source of a function exactly ``lines`` long, its ``def`` line included."""
    return f"{indent}def {name}():\n" + f"{indent}    x = 1\n" * (lines - 1)


def test_the_size_checks_find_long_modules_and_functions() -> None:
    """The two checks below can fail: one line past a limit is reported, the limit itself is not,
    and a method or a nested function is found under its qualified name."""
    assert _long_modules({"m.big": "x = 1\n" * 501, "m.ok": "x = 1\n" * 500}, 500) == {"m.big": 501}
    source = (
        _function("at_limit", 80)
        + _function("over", 81)
        + "class C:\n"
        + _function("method", 81, "    ")
        + "def outer():\n"  # 82 lines: its own line and the 81 of inner
        + _function("inner", 81, "    ")
    )
    assert _long_functions("m", source, 80) == {"m:over": 81, "m:C.method": 81, "m:outer": 82, "m:outer.inner": 81}


def test_no_module_over_the_line_limit() -> None:
    """No module of soakd is longer than MAX_MODULE_LINES: a longer one is split by what it holds
    (as soakd/state/, soakd/config/ and soakd/run/sweep/ were)."""
    long = _long_modules({name: path.read_text() for name, path in _modules().items()}, MAX_MODULE_LINES)
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_the_line_limit() -> None:
    """No function of soakd is longer than MAX_FUNCTION_LINES, except the declarative tables in
    LONG_TABLES; and every entry there is still a long function (a stale entry goes)."""
    found: dict[str, int] = {}
    for name, path in _modules().items():
        found.update(_long_functions(name, path.read_text(), MAX_FUNCTION_LINES))
    unexpected = {k: v for k, v in found.items() if k not in LONG_TABLES}
    assert not unexpected, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {unexpected}"
    stale = LONG_TABLES - set(found)
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines: remove from LONG_TABLES: {sorted(stale)}"
