"""Shared fixtures: free ports, a soakd subprocess, GPU skipping."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests import tiers
from tests.tiers import hold_to_tier  # noqa: F401  (an autouse fixture: every test is held to its tier)

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


CLOCK = tiers.TierClock()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    tiers.assign(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in item.keywords`: a checkout named gpu/
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    item_tier = next((t for t in tiers.TIERS if t in report.keywords), "unit")
    CLOCK.seconds[item_tier] += report.duration
    CLOCK.counts[item_tier] += int(report.when == "call")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each tier's count and summed test time (setup, call and teardown), after the summary."""
    if not any(CLOCK.counts.values()):
        return
    terminalreporter.section("time per tier")
    for t in tiers.TIERS:
        terminalreporter.write_line(f"{t:<12} {CLOCK.counts[t]:>4} tests  {CLOCK.seconds[t]:8.1f} s")


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test (and every soakd it starts) runs in its own folder: a default ./soakd-state or
    summary file lands there, never in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _restore_global_state() -> Iterator[None]:
    """What an in-process soakd changes for the whole interpreter is put back after each test:
    root logging handlers and level, the SIGINT/SIGTERM/SIGHUP handlers, and the GIL switch
    interval (open loop shortens it)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    switch = sys.getswitchinterval()
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)
    for sig, handler in signals.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
    sys.setswitchinterval(switch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def soakd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "soakd", *args]


def run_soakd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``soakd run ARGS`` to its end, on a free metrics port, its output captured."""
    return subprocess.run(
        soakd_cmd("run", "--metrics-addr", f"127.0.0.1:{free_port()}", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def summary_args(cwd: Path) -> tuple[Path, list[str]]:
    """A fresh summary JSON path in ``cwd`` and the flags that write it there, with the state
    store in ``cwd/state``."""
    out = cwd / f"summary-{time.monotonic_ns()}.json"
    return out, ["--summary-json", str(out), "--state-dir", str(cwd / "state")]


def soak(cwd: Path, *args: str, timeout: float = 60, rc: int = 0) -> dict[str, Any]:
    """``soakd run ARGS`` to its end (exit ``rc`` asserted, its output shown otherwise); its
    summary. A soak whose requests fail on purpose exits 1 by the default error gate."""
    out, extra = summary_args(cwd)
    res = run_soakd(*args, *extra, timeout=timeout)
    assert res.returncode == rc, res.stdout + res.stderr
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def scrape(port: int, path: str = "/metrics", timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        body: bytes = resp.read()  # urlopen's response is untyped
        return body.decode()


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll until ``predicate()`` returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # not up yet
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_exc!r})")


def metric_value(exposition: str, name: str, labels: str = "") -> float | None:
    """Value of ``name{labels}`` in a text exposition (labels as written, e.g. 'outcome="ok"')."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in exposition.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == want:
            return float(value)
    return None


class Daemon:
    """A ``soakd run`` subprocess with its metrics port, stopped (SIGTERM) at the end."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None, *, summary: bool = False) -> None:
        """``summary``: write a summary JSON (read it with :meth:`summary`) and keep the state
        store in ``cwd/state``."""
        self.port = free_port()
        self.log = cwd / f"soakd-{self.port}.log"
        self.summary_path: Path | None = None
        if summary:
            self.summary_path, extra = summary_args(cwd)
            args = [*args, *extra]
        self._fh = self.log.open("w")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            soakd_cmd("run", "--metrics-addr", f"127.0.0.1:{self.port}", *args),
            cwd=cwd,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env=full_env,
        )

    def metrics(self) -> str:
        return scrape(self.port)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until measurement has started (the first steady-state request is counted)."""

        def started() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"soakd exited early ({self.proc.returncode}):\n{self.output()}")
            v = metric_value(self.metrics(), "soakd_requests_total", 'outcome="ok"')
            return v is not None and v > 0

        wait_for(started, timeout, what="soakd to start serving requests")

    def summary(self) -> dict[str, Any]:
        """The summary JSON of a daemon started with ``summary=True``, once it has exited."""
        assert self.summary_path is not None, "started without summary=True"
        return json.loads(self.summary_path.read_text())  # type: ignore[no-any-return]

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._fh.close()
        return rc


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    started: list[Daemon] = []

    def start(*args: str, env: dict[str, str] | None = None, summary: bool = False) -> Daemon:
        d = Daemon(list(args), tmp_path, env, summary=summary)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
