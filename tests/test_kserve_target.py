"""``--target URL --api kserve-v2``: soakd as the client of KServe's own ``ModelServer`` (the
``kserve`` package, in its own venv and process: tests/kserve_server.py) over REST and gRPC:
soaks with every stage timed, a server that leaks host memory flagged on ``target_rss``, a server
that stalls seen in open-loop percentiles, and the start checks (model name, input shape).

The server's venv is built by scripts/servers-venv.sh (CI runs it); found at $SOAKD_SERVERS_VENV
or <repo>/.venv-servers, else these tests skip saying so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port, metric_value, run_soakd, soak, soakd_cmd, wait_for

SERVER = Path(__file__).resolve().parent / "kserve_server.py"
VENV = Path(os.environ.get("SOAKD_SERVERS_VENV") or REPO / ".venv-servers")
FAST_LEAK = ("--memory-interval", "250ms", "--leak-warmup", "3s", "--leak-window", "15s")  # test_leak_live's
STALL_MS, STALL_EVERY = 200, 40  # the stally model's every 40th request sleeps 200 ms


def _servers_python() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no servers venv at {VENV} (make it with scripts/servers-venv.sh, or set SOAKD_SERVERS_VENV)")
    probe = subprocess.run([str(py), "-c", "import kserve, torch"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{py} cannot import kserve and torch: {probe.stderr.strip().splitlines()[-1:]}")
    return py


class KServe:
    """tests/kserve_server.py on two free ports: ``tiny``, ``leaky`` and ``stally``."""

    def __init__(self, log: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log = log
        self.lengths = log.parent / "lengths.txt"  # the seqy model's: each request's sequence length
        self.start()

    def start(self) -> None:
        log = self.log
        self.proc = subprocess.Popen(
            [
                str(_servers_python()),
                str(SERVER),
                str(self.http_port),
                str(self.grpc_port),
                "--stall-ms",
                str(STALL_MS),
                "--stall-every",
                str(STALL_EVERY),
                "--lengths-file",
                str(self.lengths),
            ],
            stdout=log.open("a"),  # kserve logs every request: a file, never an unread pipe
            stderr=subprocess.STDOUT,
        )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"kserve server exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.rest}/v2/health/ready", timeout=2):
                    pass
                socket.create_connection(("127.0.0.1", self.grpc_port), timeout=2).close()
            except OSError:
                return False
            return True

        wait_for(up, timeout=120, what="the kserve server to answer on both ports")

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServe]:
    server = KServe(tmp_path_factory.mktemp("kserve") / "server.log")
    yield server
    server.stop()


def run_kserve(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return run_soakd("--api", "kserve-v2", *args, timeout=timeout)


def kserve_soak(url: str, model: str, tmp_path: Path, *args: str, rc: int = 0) -> dict[str, Any]:
    """A soak of ``model`` at ``url`` to its end (exit ``rc``); its summary."""
    return soak(tmp_path, "--api", "kserve-v2", "--target", url, "--target-model", model, *args, timeout=90, rc=rc)


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_soak_times_every_stage(proto: str, kserve: KServe, tmp_path: Path) -> None:
    """A closed-loop soak over REST, and one over gRPC: requests answered ok, each stage timed,
    the target up throughout; the input named from the model's metadata (x), its shape too."""
    url = kserve.rest if proto == "rest" else kserve.grpc
    s = kserve_soak(url, "tiny", tmp_path, "--concurrency", "4", "--duration", "3s", "--warmup", "5")
    ok = s["requests"]["ok"]
    assert ok > 50 and sum(s["requests"].values()) == ok  # no error: the request fits the model
    for stage in ("e2e", "queue", "inference"):
        assert s["latency_ms"][stage]["count"] == ok, stage
    assert s["latency_ms"]["e2e"]["p50"] >= s["latency_ms"]["inference"]["p50"] > 0
    assert s["target"] == {**s["target"], "url": url, "api": "kserve-v2", "up": True, "outages": 0}
    assert s["target"]["responses"]["2xx"] == ok
    assert s["run"]["target"] == {"url": url, "api": "kserve-v2", "model": "tiny"}


def test_grpc_target_up_and_answers_on_metrics(kserve: KServe, tmp_path: Path, daemon_factory: Any) -> None:
    """While a gRPC soak runs, /metrics says the target is up and counts its answers as 2xx."""
    d = daemon_factory(
        "--target", kserve.grpc, "--api", "kserve-v2", "--target-model", "tiny", "--input-shapes", "16",
        "--concurrency", "2", "--duration", "20s", "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    d.wait_ready()
    text = d.metrics()
    assert metric_value(text, "soakd_target_up", f'target="{kserve.grpc}"') == 1
    answered = metric_value(text, "soakd_target_responses_total", f'class="2xx",target="{kserve.grpc}"')
    assert answered is not None and answered > 0
    assert d.stop() == 0


def test_leaking_server_is_flagged_on_target_rss(kserve: KServe, tmp_path: Path, daemon_factory: Any) -> None:
    """The leaky model keeps 1 MiB per request: at 10 req/s the server's RSS, watched by pid,
    is judged a leak within the accelerated window; soakd's own host_rss is not."""
    d = daemon_factory(
        "--target", kserve.rest, "--api", "kserve-v2", "--target-model", "leaky",
        "--rate", "10", "--duration", "90s", "--watch-pid", str(kserve.proc.pid),
        *FAST_LEAK, "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    started = time.monotonic()
    d.wait_ready()

    def flagged() -> str | None:
        text = d.metrics()
        return text if metric_value(text, "soakd_leak_suspected", 'series="target_rss"') == 1 else None

    text = wait_for(
        flagged,
        timeout=80 - (time.monotonic() - started),
        what='soakd_leak_suspected{series="target_rss"} 1',
    )
    slope = metric_value(text, "soakd_leak_slope_bytes_per_hour", 'series="target_rss"')
    assert slope is not None and slope > 10 * 2**20 * 3600 * 0.5  # ~36 GiB/h put in; half is plenty
    assert metric_value(text, "soakd_leak_suspected", 'series="host_rss"') in (0, None)
    assert "leak suspected in target_rss" in d.output()
    assert d.stop() == 0


def test_stalling_server_shows_in_open_loop_percentiles(kserve: KServe, tmp_path: Path) -> None:
    """Every 40th request holds the server 200 ms. In open loop at 50 req/s the ~10 requests due
    during each stall wait behind it and are timed from when they were due: p99 reaches the
    stall and p90 shows the requests behind it. A client that timed from the actual send
    (coordinated omission) would see one slow request in 40, and a p90 of a few ms."""
    s = kserve_soak(kserve.rest, "stally", tmp_path, "--rate", "50", "--duration", "6s", "--warmup", "0")
    e2e = s["latency_ms"]["e2e"]
    assert s["requests"]["ok"] > 200 and e2e["count"] == s["requests"]["ok"]
    assert e2e["p99"] >= STALL_MS * 0.95
    assert e2e["p90"] >= STALL_MS * 0.4, e2e  # ~140 ms: the 4th of each 40 is due 60 ms into a stall


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_a_replayed_trace_sizes_each_request_by_its_row(proto: str, kserve: KServe, tmp_path: Path) -> None:
    """A model whose sequence length varies (``seqy``, ids ``[-1, -1]``): each row of the trace is
    sent as a tensor of its input length, clipped to ``--input-shapes`` (32: the maximum)."""
    lengths = [3 + (7 * i) % 40 for i in range(30)]  # 3..42: some past the maximum
    trace = tmp_path / "trace.jsonl"
    rows = ({"timestamp": 10 * i, "input_length": n, "output_length": 1} for i, n in enumerate(lengths))
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kserve.lengths.unlink(missing_ok=True)
    url = kserve.rest if proto == "rest" else kserve.grpc
    s = kserve_soak(url, "seqy", tmp_path, "--replay", str(trace), "--input-shapes", "32", "--warmup", "0")
    assert s["requests"]["ok"] == len(lengths) and s["replay"]["rows_clipped"] == sum(n > 32 for n in lengths)
    sent = [int(x) for x in kserve.lengths.read_text().split()]
    assert sorted(sent) == sorted(min(n, 32) for n in lengths)


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_samples_are_whole_requests(proto: str, kserve: KServe, tmp_path: Path) -> None:
    """--samples DIR: v2 JSON infer requests, POSTed as they are over REST and sent as the
    ModelInfer messages they stand for over gRPC; a file that is not one is exit 2 over gRPC."""
    url = kserve.rest if proto == "rest" else kserve.grpc
    samples = tmp_path / "requests"
    samples.mkdir()
    for i in range(2):
        tensor = {"name": "x", "shape": [i + 1, 16], "datatype": "FP32", "data": [0.5] * 16 * (i + 1)}
        (samples / f"r{i}.json").write_text(json.dumps({"inputs": [tensor]}))
    s = kserve_soak(url, "tiny", tmp_path, "--samples", str(samples), "--concurrency", "2", "--duration", "2s")
    assert s["requests"]["ok"] > 20 and s["requests"]["ok"] == sum(s["requests"].values())
    assert s["run"]["input"] == f"samples {samples}"
    if proto == "grpc":
        (samples / "r9.json").write_text('{"inputs": [{"name": "x"}]}')
        res = run_kserve("--target", url, "--target-model", "tiny", "--samples", str(samples), "--duration", "1s")
        assert res.returncode == 2 and "r9.json: not a KServe v2 JSON infer request" in res.stderr, res.stderr


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_error_answers_are_counted_by_class(proto: str, kserve: KServe, tmp_path: Path) -> None:
    """One sample in three does not fit the model: the server answers HTTP 400, or gRPC
    INVALID_ARGUMENT (class 4xx); those requests are errors, the rest ok, the target stays up."""
    url = kserve.rest if proto == "rest" else kserve.grpc
    samples = tmp_path / "requests"
    samples.mkdir()
    for i, n in enumerate((16, 16, 3)):  # 3 values: the model refuses them
        tensor = {"name": "x", "shape": [1, n], "datatype": "FP32", "data": [0.5] * n}
        (samples / f"r{i}.json").write_text(json.dumps({"inputs": [tensor]}))
    s = kserve_soak(url, "tiny", tmp_path, "--samples", str(samples), "--concurrency", "3", "--duration", "2s", rc=1)
    assert s["slo"]["failed"] == ["error ratio (default)"]  # a third of the requests failed
    req, resp = s["requests"], s["target"]["responses"]
    assert req["ok"] == resp["2xx"] > 20 and req["error"] == resp["4xx"] > 10
    assert abs(req["ok"] - 2 * req["error"]) <= 6  # the bodies go out in turn
    assert s["target"]["outages"] == 0


def test_grpc_server_killed_and_restarted_mid_soak(tmp_path: Path, daemon_factory: Any) -> None:
    """gRPC UNAVAILABLE marks the target down (target_up 0, errors of class none); the channel
    reconnects within soakd's back-off once the server is back on the same port."""
    server = KServe(tmp_path / "server.log")
    try:
        lenient = tmp_path / "lenient.toml"  # the outage's errors are the point here, not a failed gate
        lenient.write_text("[slo]\nmax_error_ratio = 1.0\n")
        d = daemon_factory(
            "--target", server.grpc, "--api", "kserve-v2", "--target-model", "tiny", "--concurrency", "2",
            "--duration", "60s", "--config", str(lenient), summary=True,
        )  # fmt: skip
        d.wait_ready()
        up = f'target="{server.grpc}"'
        server.stop()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 0, 10, what="target_up 0")
        server.start()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 1, 30, what="target_up 1 again")
        before = metric_value(d.metrics(), "soakd_requests_total", 'outcome="ok"') or 0
        wait_for(
            lambda: (metric_value(d.metrics(), "soakd_requests_total", 'outcome="ok"') or 0) > before + 50,
            10,
            what="requests answered again",
        )
        assert d.stop() == 0
    finally:
        server.stop()
    s = d.summary()
    assert s["target"]["outages"] == 1 and s["target"]["down_seconds"] > 0 and s["target"]["up"] is True
    assert s["requests"]["error"] == s["target"]["responses"]["none"] > 0


@pytest.mark.parametrize("proto", ["rest", "grpc"])
def test_start_check_mistakes_are_exit_2(proto: str, kserve: KServe, tmp_path: Path) -> None:
    """A model the server does not have, a shape or a datatype the model's metadata refuses:
    one line naming both sides, exit 2, before any request is sent."""
    url = kserve.rest if proto == "rest" else kserve.grpc
    int64 = tmp_path / "int64.toml"
    int64.write_text('[target]\ndatatype = "INT64"\n')
    cases = [
        (["--target-model", "nope"], "target.model: 'nope': no such model at " + url),
        (["--target-model", "tiny", "--input-shapes", "32"], "input.shapes: 32 does not fit model 'tiny'"),
        (["--target-model", "tiny", "--config", str(int64)], "target.datatype: INT64, but model 'tiny'"),
    ]
    base = ["run", "--api", "kserve-v2", "--target", url, "--duration", "2s"]
    procs = [
        subprocess.Popen(
            soakd_cmd(*base, "--metrics-addr", f"127.0.0.1:{free_port()}", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args, _ in cases
    ]  # side by side: each start costs seconds on a busy CI host
    errs = []
    for proc, (_, says) in zip(procs, cases, strict=True):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, err
        assert says in err and "Traceback" not in err, err
        errs.append(err)
    assert "input 'x' has shape [-1, 16]" in errs[1]  # the model's side, from its metadata
    assert "declares input 'x' as FP32" in errs[2]


def test_refused_and_usage_errors_are_exit_2() -> None:
    """No server at the URL, no model name, grpc:// for another api: exit 2 naming it."""
    port = free_port()
    cases = [
        (["--target", f"grpc://127.0.0.1:{port}", "--target-model", "m"], f"grpc://127.0.0.1:{port}: cannot connect"),
        (["--target", f"http://127.0.0.1:{port}", "--target-model", "m"], f"127.0.0.1:{port}/v2/health/ready: cannot"),
        (["--target", f"grpc://127.0.0.1:{port}"], "target.model: --api kserve-v2 needs"),
        (["--target", "grpc://127.0.0.1", "--target-model", "m"], "target.url: expected grpc://HOST:PORT"),
    ]
    for args, says in cases:
        res = run_kserve(*args, "--duration", "1s", timeout=60)
        assert res.returncode == 2, res.stderr
        assert says in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = subprocess.run(
        soakd_cmd("run", "--api", "http", "--target", f"grpc://127.0.0.1:{port}", "--samples", "."),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "grpc:// is for --api kserve-v2" in res.stderr, res.stderr
