"""``--target URL --api http``: soakd as the client of a real HTTP server in its own process
(tests/http_target_server.py), over real sockets: answers, bad answers, a server that is not
there, one that dies and comes back, one that stalls, and its memory watched by pid."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon, free_port, metric_value, run_soakd, soak, soakd_cmd, wait_for

SERVER = Path(__file__).resolve().parent / "http_target_server.py"
MINIMAL = Path(__file__).resolve().parent.parent / "bench" / "minimal_server.py"


class Server:
    """The test server on a fixed port; ``kill()`` and ``start()`` again reuse that port."""

    def __init__(self, port: int, *args: str) -> None:
        self.port = port
        self.args = args
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(self.port), *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("ready"), line
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url("/stats"), timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(free_port()).start()
    yield s
    s.kill()


@pytest.fixture
def bodies(tmp_path: Path) -> Path:
    d = tmp_path / "bodies"
    d.mkdir()
    for i in range(3):
        (d / f"req{i}.json").write_text(json.dumps({"inputs": list(range(i + 1))}))
    (d / "notes.txt").write_text("not a body: only .json files are sent")
    return d


def http_soak(url: str, bodies: Path, tmp_path: Path, *args: str, rc: int = 0) -> dict[str, Any]:
    """A soak of ``url`` with ``bodies`` to its end (exit ``rc``); its summary."""
    return soak(tmp_path, "--target", url, "--api", "http", "--samples", str(bodies), *args, rc=rc)


def test_closed_loop_soak_measures_every_stage(server: Server, bodies: Path, tmp_path: Path) -> None:
    """A closed-loop soak completes requests with e2e/queue/inference timings, and its warm-up
    requests reach the server but none of the counts."""
    s = http_soak(server.url("/ok"), bodies, tmp_path, "--concurrency", "4", "--duration", "3s", "--warmup", "5")
    ok = s["requests"]["ok"]
    assert ok > 50 and s["throughput_rps"] > 0
    assert sum(s["requests"].values()) == ok
    for stage in ("e2e", "queue", "inference"):
        assert s["latency_ms"][stage]["count"] == ok, stage
    assert s["latency_ms"]["e2e"]["p50"] >= s["latency_ms"]["inference"]["p50"]
    assert server.stats()["requests"] == ok + 5  # the 5 warm-up POSTs are the only ones not counted
    assert s["cold_start"]["warmup_runs"] == 5
    assert s["target"] == {**s["target"], "url": server.url("/ok"), "up": True, "down_seconds": 0.0, "outages": 0}
    assert s["target"]["responses"]["2xx"] == ok
    assert s["run"]["target"] == {"url": server.url("/ok"), "api": "http", "model": None}
    assert s["run"]["model_sha256"] is None


def test_bad_responses_are_errors_by_status_class(server: Server, bodies: Path, tmp_path: Path) -> None:
    """4xx and 5xx answers count as errors; the status classes say which."""
    s = http_soak(
        server.url("/mixed"), bodies, tmp_path, "--concurrency", "4", "--duration", "2s", "--warmup", "0", rc=1
    )
    assert s["slo"]["failed"] == ["error ratio (default)"]  # half the answers failed
    resp, req = s["target"]["responses"], s["requests"]
    assert req["ok"] == resp["2xx"] > 0
    assert req["error"] == resp["4xx"] + resp["5xx"]
    # The server answers 200, 200, 404, 503 in turn.
    assert abs(resp["4xx"] - resp["5xx"]) <= 4 and abs(resp["2xx"] - 2 * resp["4xx"]) <= 8
    assert s["latency_ms"]["e2e"]["count"] == req["ok"]  # failed answers stay out of the percentiles


def _garbage_server() -> tuple[socket.socket, int]:
    """A TCP listener that answers every connection with bytes that are not HTTP."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock, int(sock.getsockname()[1])


def test_unreachable_target_at_start_is_exit_2(bodies: Path) -> None:
    """Connection refused, or a port that does not speak HTTP: exit 2 naming the URL, no traceback."""
    sock, port = _garbage_server()
    refused, garbage = f"http://127.0.0.1:{free_port()}/predict", f"http://127.0.0.1:{port}/"
    procs = [
        subprocess.Popen(
            soakd_cmd(
                "run",
                "--metrics-addr",
                f"127.0.0.1:{free_port()}",
                "--target",
                url,
                "--api",
                "http",
                "--samples",
                str(bodies),
                "--duration",
                "2s",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for url in (refused, garbage)
    ]  # side by side: each start costs seconds on a busy CI host
    try:
        (_, err_refused), (_, err_garbage) = (p.communicate(timeout=60) for p in procs)
    finally:
        sock.close()
    assert [p.returncode for p in procs] == [2, 2], err_refused + err_garbage
    assert f"{refused}: cannot connect (connection refused)" in err_refused and "Traceback" not in err_refused
    assert f"{garbage}: not an HTTP server" in err_garbage and "Traceback" not in err_garbage


def test_server_that_stops_answering_is_a_timeout(bodies: Path, tmp_path: Path) -> None:
    """A server that holds requests for 1 s, with [target] timeout 0.3 s: those requests end as
    timeouts at 0.3 s (their latency recorded), the soak never hangs on them."""
    srv = Server(free_port(), "--pause-every", "1.5", "--pause-ms", "1000").start()
    cfg = tmp_path / "soak.toml"
    cfg.write_text(
        '[target]\ntimeout = "0.3s"\n[slo]\nmax_error_ratio = 1.0\n'
    )  # the timeouts are the point, not a gate
    try:
        s = http_soak(
            srv.url("/stall"),
            bodies,
            tmp_path,
            "--config",
            str(cfg),
            "--concurrency",
            "4",
            "--duration",
            "3s",
            "--warmup",
            "0",
        )
    finally:
        srv.kill()
    req = s["requests"]
    assert req["timeout"] >= 4 and req["ok"] > 0
    assert s["target"]["responses"]["none"] == req["timeout"]
    assert s["latency_ms"]["e2e"]["count"] == req["ok"] + req["timeout"]
    assert 290.0 <= s["latency_ms"]["e2e"]["max"] < 600.0  # cut at the timeout, not the 1 s pause


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--api", "grpc"], "target.api: expected http, openai or kserve-v2, got 'grpc'"),
        (["--api", "kserve-v2"], "target.model: --api kserve-v2 needs the served model's name"),
        (["--api", "http", "--model", "builtin:noop"], "--model and --target: choose one"),
        (["--api", "http"], "input.samples"),  # no --samples at all
        (["--api", "http", "--samples", "EMPTY"], "EMPTY: no .json files"),
    ],
)
def test_target_usage_errors_are_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    """Each mistake is one line naming the key or dir, exit 2."""
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "EMPTY" / "a.txt").write_text("x")
    res = run_soakd("--target", "http://127.0.0.1:9/x", *args, "--duration", "1s")
    assert res.returncode == 2, res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr


def _healthz(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.read().decode()  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        body: bytes = exc.read()
        return body.decode()


def _lenient(tmp_path: Path) -> Path:
    """An error gate that lets an outage through: where the outage itself is what a test checks."""
    path = tmp_path / "lenient.toml"
    path.write_text("[slo]\nmax_error_ratio = 1.0\n")
    return path


def test_server_killed_and_restarted_mid_soak(server: Server, bodies: Path, tmp_path: Path) -> None:
    """The soak goes on through an outage: errors counted, target_up 0 then 1, /healthz says why,
    and the summary holds the down time."""
    d = Daemon(
        [
            "--target",
            server.url("/ok"),
            "--api",
            "http",
            "--samples",
            str(bodies),
            "--concurrency",
            "4",
            "--duration",
            "9s",
            "--warmup",
            "2",
            "--config",
            str(_lenient(tmp_path)),
        ],
        tmp_path,
        summary=True,
    )
    up = f'target="{server.url("/ok")}"'
    try:
        d.wait_ready()
        assert metric_value(d.metrics(), "soakd_target_up", up) == 1
        server.kill()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 0, 10, what="target_up 0")
        assert "target down: " + server.url("/ok") in _healthz(d.port)
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{d.port}/status", timeout=5).read())
        assert status["target"]["up"] is False and status["target"]["outages"] == 1
        time.sleep(2.0)
        server.start()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 1, 10, what="target_up 1 again")
        assert _healthz(d.port).strip() == "ok"
        assert d.proc.wait(40) == 0, d.output()
    finally:
        d.stop()
    s = d.summary()
    assert s["requests"]["error"] > 0 and s["requests"]["ok"] > 0
    assert server.stats()["requests"] > 0  # the restarted server got the soak's requests
    tg = s["target"]
    assert tg["outages"] == 1 and tg["up"] is True
    assert 1.8 <= tg["down_seconds"] <= 8.0
    assert tg["responses"]["none"] == s["requests"]["error"]
    assert d.log.read_text().count("is down") == 1  # one line per outage, not one per refused request


def test_a_server_down_for_most_of_the_run_fails_the_default_gate(bodies: Path, tmp_path: Path) -> None:
    """With no [slo], a served model that dies early and stays down exits 1, the down share named
    as the default gate: soakd backs off while it is down, so few requests fail, but the soak did."""
    srv = Server(free_port()).start()
    d = Daemon(
        ["--target", srv.url("/ok"), "--api", "http", "--samples", str(bodies), "--concurrency", "2",
         "--duration", "6s", "--warmup", "2"],
        tmp_path,
        summary=True,
    )  # fmt: skip
    try:
        d.wait_ready()
        srv.kill()
        assert d.proc.wait(40) == 1, d.output()
    finally:
        d.stop()
    s = d.summary()
    assert "target down (default)" in s["slo"]["failed"]
    check = next(c for c in s["slo"]["checks"] if c["name"] == "target down (default)")
    assert check["observed"] > 0.5 and check["limit"] == 0.01
    assert "SLO FAIL target down (default)" in d.log.read_text()


def test_requests_piling_up_behind_a_stopped_server_show_in_flight(
    server: Server, bodies: Path, tmp_path: Path
) -> None:
    """Open loop at 200 req/s: while the server is stopped (SIGSTOP) the requests due stay in
    flight and ``soakd_inflight_requests`` climbs with them (it once moved only on completions,
    so it stood still exactly then); once the server goes on they drain."""
    args = ["--target", server.url("/ok"), "--api", "http", "--samples", str(bodies)]
    d = Daemon([*args, "--rate", "200", "--duration", "30s", "--warmup", "0"], tmp_path)

    def inflight() -> float:
        value = metric_value(d.metrics(), "soakd_inflight_requests")
        assert value is not None, "no soakd_inflight_requests on /metrics"
        return value

    try:
        d.wait_ready()
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: inflight() >= 100, 10, what="100 in flight")
        finally:
            server.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: inflight() < 20, 15, what="drained")
    finally:
        d.stop()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def _inflight(d: Daemon) -> float:
    return metric_value(d.metrics(), "soakd_inflight_requests") or 0.0


@pytest.mark.timing  # RSS steps and stalls measured against the wall clock
def test_a_stalled_server_raises_soakds_rss_once_not_per_stall(bodies: Path, tmp_path: Path) -> None:
    """soakd's own memory under server stalls is a high-water mark, not a leak. Open loop at
    1,000 req/s against bench/minimal_server.py; the server stopped three times until soakd has
    1,000 requests in flight, then let drain: the first stall fills load.max_inflight (1024
    requests alive at once) and steps soakd's RSS by some MiB (pymalloc keeps an arena until it
    is entirely empty); the second and third reuse that memory and add less than a third of the
    first step between them."""
    port = free_port()
    srv = subprocess.Popen([sys.executable, str(MINIMAL), str(port)], stdout=subprocess.PIPE, text=True)
    assert srv.stdout is not None and srv.stdout.readline().startswith("ready")
    args = ["--target", f"http://127.0.0.1:{port}/ok", "--api", "http", "--samples", str(bodies)]
    d = Daemon([*args, "--rate", "1000", "--arrival", "poisson", "--duration", "60s", "--warmup", "0"], tmp_path)
    rss: list[float] = []
    try:
        d.wait_ready()
        time.sleep(8)  # past start-up's own allocations
        rss.append(_rss_mib(d.proc.pid))
        for _ in range(3):
            srv.send_signal(signal.SIGSTOP)
            # Stalled until load.max_inflight is (nearly) full, then until the backlog drains:
            # conditions on soakd's live in-flight gauge, not fixed sleeps.
            wait_for(lambda: _inflight(d) >= 1000, 30, what="the stall to fill max_inflight")
            srv.send_signal(signal.SIGCONT)
            wait_for(lambda: _inflight(d) < 50, 30, what="the backlog to drain")
            rss.append(_rss_mib(d.proc.pid))
    finally:
        d.stop()
        srv.kill()
        srv.wait()
    first, later = rss[1] - rss[0], rss[3] - rss[1]
    assert first > 3, rss  # the premise: a stall with 1024 requests in flight costs some MiB
    assert later < first / 3, rss


@pytest.mark.timing  # schedule lag bound in ms
def test_open_loop_stall_counts_from_intended_send_time(bodies: Path, tmp_path: Path) -> None:
    """A server that pauses 500 ms every 2 s, 4 connections, 100 req/s: the few requests the
    server held are not the only slow ones; every request scheduled during the pause waits for a
    connection, and its latency counts from when it should have gone (no coordinated omission)."""
    srv = Server(free_port(), "--pause-every", "2", "--pause-ms", "500").start()
    cfg = tmp_path / "soak.toml"
    cfg.write_text("[target]\nmax_connections = 4\n")
    try:
        s = http_soak(
            srv.url("/stall"),
            bodies,
            tmp_path,
            "--config",
            str(cfg),
            "--rate",
            "100",
            "--arrival",
            "constant",
            "--duration",
            "6s",
            "--warmup",
            "0",
        )
        held = srv.stats()["held"]
    finally:
        srv.kill()
    lat, total = s["latency_ms"], s["requests"]["ok"]
    assert total > 450
    assert held <= 4 * 5  # at most the 4 connections' requests per pause reached the server then
    assert held < 0.05 * total
    assert lat["e2e"]["p90"] >= 125.0  # yet >= 10% of requests were late by a quarter of the pause
    assert lat["queue"]["p90"] >= 100.0  # the client's wait for a connection, as its own stage
    assert lat["inference"]["p90"] < 0.2 * lat["e2e"]["p90"]  # what a from-actual-send tool would report
    assert s["schedule_lag_ms"]["p99"] < 100.0  # the arrivals kept their schedule throughout


def test_watch_pid_samples_the_server_process(server: Server, bodies: Path, tmp_path: Path) -> None:
    """--watch-pid: the server's RSS and USS in /metrics and as the target_rss leak series; a
    watched pid that exits is a source down, not a crash."""
    short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
    d = Daemon(
        [
            "--target",
            server.url("/ok"),
            "--api",
            "http",
            "--samples",
            str(bodies),
            "--concurrency",
            "2",
            "--duration",
            "5s",
            "--warmup",
            "0",
            "--memory-interval",
            "0.5s",
            "--watch-pid",
            str(server.pid),
            "--watch-pid",
            str(short.pid),
        ],
        tmp_path,
        summary=True,
    )
    pid = f'pid="{server.pid}"'
    try:
        d.wait_ready()
        rss = wait_for(
            lambda: metric_value(d.metrics(), "soakd_target_process_resident_memory_bytes", pid), 10, what="target RSS"
        )
        assert 5 << 20 < rss < 1 << 30  # a Python http.server: some MiB
        uss = metric_value(d.metrics(), "soakd_target_process_unique_memory_bytes", pid)
        assert uss is not None and 0 < uss <= rss
        assert metric_value(d.metrics(), "soakd_collector_up", f'source="target_process:{server.pid}"') == 1
        short.wait(10)
        wait_for(
            lambda: metric_value(d.metrics(), "soakd_collector_up", f'source="target_process:{short.pid}"') == 0,
            10,
            what="the exited pid's collector down",
        )
        assert d.proc.wait(40) == 0, d.output()
    finally:
        d.stop()
        short.kill()
    s = d.summary()
    assert s["memory"]["target_rss"]["samples"] >= 5
    assert "target_uss" in s["memory"]
    assert d.log.read_text().count(f"target_process:{short.pid}: sample failed") == 1
