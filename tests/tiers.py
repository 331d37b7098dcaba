"""The three test tiers, as pytest markers (``-m unit``, ``-m integration``, ``-m e2e``).

- **unit**: pure code; no process started and no sleeping (both raise here).
- **integration**: soakd in this process (``run(cfg, stop=StopFlag())``, an engine, a sampler
  scheduler), real sockets and threads, short clocks; no process started (it raises here).
- **e2e**: real processes: ``soakd`` subprocesses, third-party servers, Prometheus, chromium.

A test's tier is its own marker (on the test, its class or its module) when it has one, else it
is read from the code: a test that reaches, through the helpers and fixtures of ``tests/``, a call
that starts a process is e2e; one that reaches threads, sockets or sleeps is integration; the rest
is unit. The guard below holds each test to its tier, so a wrong reading fails loudly instead of
hiding a slow test among the fast ones.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "integration", "e2e")
TESTS = Path(__file__).resolve().parent
TEST_MODULES = {p.stem for p in TESTS.glob("*.py")}

# Names whose call starts a process (or a server in one) ...
STARTS_PROCESS = {"Popen", "run", "check_output", "check_call", "call", "fork", "spawn", "execv", "system"}
PROCESS_MODULES = {"subprocess", "os", "multiprocessing"}
# ... and names that mean threads, sockets, clocks or an in-process soak.
IN_PROCESS_IO = {
    "sleep",
    "Thread",
    "socket",
    "free_port",
    "wait_for",
    "urlopen",
    "Engine",
    "StopFlag",
    "SamplerScheduler",
    "Telemetry",
    "EndpointServer",
    "ThreadingHTTPServer",
    "HTTPServer",
    "start",
    "serve_forever",
    "run_until_complete",
    "new_event_loop",
    "asyncio",
    "aiohttp",
}


Summary = tuple[set[str], bool, bool]  # (names called, starts a process, does in-process I/O)
DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _own(sub: ast.AST, acc: list[Any]) -> None:
    """What ``sub`` itself (not its children) adds to a summary being gathered in ``acc``.

    A method call (``engine.start()``) is not followed by its name: ``start`` or ``run`` names a
    dozen unrelated functions in tests/. A helper is followed when it is called by name, as a
    fixture, as a class (its methods count), or through a tests module (``report_runs.make()``)."""
    if isinstance(sub, ast.Call):
        f = sub.func
        if isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else ""
            if base in PROCESS_MODULES and f.attr in STARTS_PROCESS:
                acc[1] = True
            if base in TEST_MODULES:
                acc[0].add(f.attr)
            acc[2] = acc[2] or f.attr in IN_PROCESS_IO or base in IN_PROCESS_IO
        elif isinstance(f, ast.Name):
            acc[0].add(f.id)
            acc[2] = acc[2] or f.id in IN_PROCESS_IO
    elif isinstance(sub, ast.Name) and sub.id in {"Popen", "daemon_factory"}:
        acc[1] = True


def _scan(node: ast.AST, acc: list[Any], defs: list[tuple[ast.AST, Summary]]) -> None:
    """Add ``node``'s subtree to ``acc``; each class or function in it (nested ones too, and its
    decorators with it) gets its own summary in ``defs``. One pass over the tree: the summary of a
    definition is its whole subtree's, as ``_calls`` gives it."""
    _own(node, acc)
    for child in ast.iter_child_nodes(node):
        if isinstance(child, DEFS):
            inner: list[Any] = [set(), False, False]
            _scan(child, inner, defs)
            defs.append((child, (inner[0], inner[1], inner[2])))
            acc[0] |= inner[0]
            acc[1] = acc[1] or inner[1]
            acc[2] = acc[2] or inner[2]
        else:
            _scan(child, acc, defs)


def _calls(node: ast.AST) -> Summary:
    """(names called, starts a process directly, does in-process I/O directly) in ``node``."""
    acc: list[Any] = [set(), False, False]
    _scan(node, acc, [])
    return acc[0], acc[1], acc[2]


class _Reader:
    """Which functions of tests/ (by name, helpers and fixtures alike) start a process or do
    in-process I/O, through the calls they make: a fixpoint over every module's functions."""

    def __init__(self) -> None:
        self.funcs: dict[str, list[Summary]] = {}
        # Each definition's summary by (file, line of its def and of its first decorator), so a
        # test's own body is read from the same parse instead of from inspect.getsource.
        self.at: dict[tuple[str, int], Summary] = {}
        for path in sorted(TESTS.glob("*.py")):
            defs: list[tuple[ast.AST, Summary]] = []
            _scan(ast.parse(path.read_text()), [set(), False, False], defs)
            for node, summary in defs:
                assert isinstance(node, DEFS)
                # A class counts by what all its methods do (it is followed when called by name).
                self.funcs.setdefault(node.name, []).append(summary)
                for line in (node.lineno, *(d.lineno for d in node.decorator_list[:1])):
                    self.at[(str(path), line)] = summary
        self.process: set[str] = set()
        self.io: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, bodies in self.funcs.items():
                for called, proc, io in bodies:
                    if name not in self.process and (proc or called & self.process):
                        self.process.add(name)
                        changed = True
                    if name not in self.io and (io or called & self.io):
                        self.io.add(name)
                        changed = True

    def _summary(self, fn: Any) -> Summary | None:
        code = getattr(fn, "__code__", None)
        if code is not None:
            found = self.at.get((code.co_filename, code.co_firstlineno))
            if found is not None:
                return found
        try:
            return _calls(ast.parse(textwrap.dedent(inspect.getsource(fn))))
        except (OSError, TypeError, SyntaxError):
            return None

    def tier(self, item: pytest.Item) -> str:
        fn = getattr(item, "function", None)
        reached: set[str] = set(getattr(item, "fixturenames", ()))
        proc = io = False
        summary = self._summary(fn) if fn is not None else None
        if summary is not None:
            called, proc, io = summary
            reached |= called
        if proc or reached & self.process:
            return "e2e"
        if io or reached & self.io:
            return "integration"
        return "unit"


def assign(items: list[pytest.Item]) -> None:
    """Give every collected test exactly one tier marker."""
    reader: _Reader | None = None
    for item in items:
        if any(item.get_closest_marker(t) is not None for t in TIERS):
            continue
        reader = reader or _Reader()
        item.add_marker(getattr(pytest.mark, reader.tier(item)))


def tier_of(item: pytest.Item) -> str:
    for t in TIERS:
        if item.get_closest_marker(t) is not None:
            return t
    return "unit"


class TierViolation(AssertionError):
    pass


@pytest.fixture(autouse=True)
def hold_to_tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A unit test may neither start a process nor sleep; an integration test may not start a
    process. Either raises, naming the marker the test needs."""
    tier = tier_of(request.node)
    # Only the test's own thread is held: a server thread of a module-scoped fixture may sleep.
    main = threading.current_thread()
    if tier != "e2e":
        popen_init = subprocess.Popen.__init__

        def no_process(self: Any, *a: Any, **k: Any) -> None:
            if threading.current_thread() is main:
                raise TierViolation(f"{request.node.nodeid} is a {tier} test but starts a process: mark it e2e")
            popen_init(self, *a, **k)

        monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    if tier == "unit":
        real_sleep = time.sleep

        def no_sleep(seconds: float) -> None:
            if threading.current_thread() is main:
                raise TierViolation(f"{request.node.nodeid} is a unit test but sleeps: mark it integration")
            real_sleep(seconds)

        monkeypatch.setattr(time, "sleep", no_sleep)
    yield


class TierClock:
    """Summed test time per tier (setup, call and teardown), for the closing lines."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(TIERS, 0.0)
        self.counts = dict.fromkeys(TIERS, 0)
