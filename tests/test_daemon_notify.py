"""soakd under a real unix datagram socket playing systemd: READY, STATUS, WATCHDOG, STOPPING.

The daemon is a real subprocess; the test binds an abstract socket (as systemd does) and passes
it in NOTIFY_SOCKET with WATCHDOG_USEC=2s, so soakd must ping every second.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from soakd.run.systemd import Notifier
from tests.conftest import scrape, wait_for


class FakeSystemd:
    """Collects sd_notify datagrams on an abstract unix socket, with their arrival times."""

    def __init__(self) -> None:
        self.name = f"@soakd-test-{os.getpid()}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []

    def env(self, watchdog_usec: int = 2_000_000) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.name, "WATCHDOG_USEC": str(watchdog_usec)}

    def pump(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                return
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def lines(self, prefix: str) -> list[tuple[float, str]]:
        self.pump()
        return [(t, m) for t, m in self.messages if m.startswith(prefix)]

    def wait(self, prefix: str, count: int = 1, timeout: float = 60.0) -> list[tuple[float, str]]:
        def enough() -> list[tuple[float, str]] | None:
            found = self.lines(prefix)
            return found if len(found) >= count else None

        return wait_for(enough, timeout, interval=0.05, what=f"{count} x {prefix!r} on NOTIFY_SOCKET")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def systemd() -> Iterator[FakeSystemd]:
    s = FakeSystemd()
    yield s
    s.close()


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_notify_lifecycle_under_a_fake_systemd(daemon_factory, systemd: FakeSystemd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """READY after warmup, STATUS with throughput and p99, a ping a second, /healthz and /status,
    SIGHUP re-opens the log file, and SIGTERM gives STOPPING=1 and exit 0."""
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[metrics]\nstatus_interval = "1s"\n[phases]\nramp = "2s"\n[state]\nflush_interval = "500ms"\n')
    log_file = tmp_path / "soakd.log"
    d = daemon_factory(
        "--config",
        str(cfg),
        "--model",
        "builtin:noop",
        "--warmup",
        "3",
        "--rate",
        "200",
        "--state-dir",
        str(tmp_path / "state"),
        "--log-file",
        str(log_file),
        env=systemd.env(),
    )
    ready = systemd.wait("READY=1")[0][0]
    # Model load and warmup finish before READY: the warmup gauge is already set.
    assert "soakd_warmup_seconds" in scrape(d.port)
    pings = systemd.wait("WATCHDOG=1", count=4, timeout=30)
    assert pings[0][0] > ready
    times = [ready] + [t for t, _ in pings]
    assert all(b - a < 2.0 for a, b in itertools.pairwise(times)), times  # inside WATCHDOG_USEC
    status = systemd.wait("STATUS=", count=2)
    assert any("req/s" in m and "p99" in m and "leak" in m for _, m in status), status

    code, body = _http(d.port, "/healthz")
    assert (code, body.strip()) == (200, "ok")
    code, body = _http(d.port, "/status")
    st = json.loads(body)
    assert code == 200 and st["healthy"] is True
    assert st["phase"] in ("ramp", "steady") and st["run_id"] and st["uptime_seconds"] > 0
    assert st["throughput_rps"] > 0 and st["p99_ms"] is not None
    assert isinstance(st["leak"], dict) and st["target_load"]["rate"] > 0
    wait_for(lambda: json.loads(_http(d.port, "/status")[1])["phase"] == "steady", 20, what="ramp -> steady")
    assert 'soakd_phase_info{phase="steady"} 1.0' in scrape(d.port)

    rotated = tmp_path / "soakd.log.1"
    log_file.rename(rotated)
    d.proc.send_signal(signal.SIGHUP)
    wait_for(log_file.exists, 10, what="log file re-opened after SIGHUP")

    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0, d.output()
    systemd.wait("STOPPING=1")
    assert "soakd.daemon: ready (watchdog ping every 1.0s)" in rotated.read_text()
    assert "received SIGTERM" in log_file.read_text()


def test_a_hung_model_stops_the_watchdog_pings(daemon_factory, systemd: FakeSystemd, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """When inference hangs for good, pings stop (systemd would restart us), /healthz says why, and
    SIGTERM still exits 0 after the bounded drain."""
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[model.options]\nafter = 100\n[daemon]\nstall_timeout = "1s"\n[load]\ndrain_timeout = "1s"\n')
    d = daemon_factory(
        "--config",
        str(cfg),
        "--model",
        "builtin:hang",
        "--warmup",
        "2",
        "--rate",
        "100",
        "--state-dir",
        str(tmp_path / "state"),
        env=systemd.env(),
    )
    systemd.wait("READY=1")

    def silent_for_4s() -> bool:
        assert d.proc.poll() is None, d.output()
        pings = systemd.lines("WATCHDOG=1")
        last = pings[-1][0] if pings else systemd.lines("READY=1")[0][0]
        return time.monotonic() - last > 4.0

    wait_for(silent_for_4s, 30, what="watchdog pings to stop")
    code, body = _http(d.port, "/healthz")
    assert code == 503 and "stalled" in body
    assert any("unhealthy" in m for _, m in systemd.lines("STATUS="))
    d.proc.send_signal(signal.SIGTERM)
    # The requests the hung model never took are dropped: the default error gate fails the run.
    assert d.proc.wait(30) == 1, d.output()
    systemd.wait("STOPPING=1")


def test_notifier_is_silent_without_notify_socket() -> None:
    """No NOTIFY_SOCKET: nothing is sent and no watchdog is asked for."""
    n = Notifier({})
    assert not n.enabled and not n.ready() and n.watchdog_interval is None


def test_watchdog_belongs_to_the_pid_systemd_names(systemd: FakeSystemd) -> None:
    """WATCHDOG_PID naming another process disables pings; naming us gives half of WATCHDOG_USEC."""
    other = Notifier({**systemd.env(), "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None
    mine = Notifier({**systemd.env(3_000_000), "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval == 1.5
    assert mine.ready("hello") and mine.status("x")
    systemd.wait("READY=1")
    assert any(m == "STATUS=hello" for _, m in systemd.lines("STATUS="))


def test_notifier_sends_to_a_socket_path(tmp_path: Path) -> None:
    """A filesystem socket path works as well as an abstract one."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        assert Notifier({"NOTIFY_SOCKET": str(path)}).stopping()
        sock.settimeout(5)
        assert sock.recv(100) == b"STOPPING=1"
    finally:
        sock.close()
