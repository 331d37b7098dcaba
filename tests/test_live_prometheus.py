"""The dashboards and rules against a real Prometheus scraping a real soakd.

One session for the module: three soakd runs (an in-process model in open loop, so schedule lag
has data too; a network soak of tests/http_target_server.py with its process watched and its
/metrics scraped, for the served-model panels; and an --api openai soak of
tests/openai_fake_server.py, streamed, for the LLM panels) and Prometheus scraping them (scrape
and rule evaluation every second, the repo's rule files loaded). Then every PromQL expression of
every dashboard panel goes through Prometheus' HTTP API with Grafana's variables substituted, as
Grafana would send it, with $instance selecting every soakd run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from soakd.config import LeakConfig
from tests.conftest import REPO, Daemon, free_port, metric_value, wait_for

PROMETHEUS = shutil.which("prometheus")
# timing: the healthy soak must stay under its p99 SLO alert, which a CPU shared with other tests breaks.
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="needs Prometheus (Debian package prometheus)"),
    pytest.mark.timing,
]

DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
# Panels on these metrics need a CUDA device / NVML: they may be empty on a CPU-only host.
GPU_METRIC = re.compile(r"\bsoakd_(torch_cuda|gpu|target_gpu)_\w+")
HTTP_SERVER = REPO / "tests" / "http_target_server.py"
OPENAI_SERVER = REPO / "tests" / "openai_fake_server.py"
# How long non-GPU panels may take to get data (leak verdicts need warm-up plus a window).
DATA_DEADLINE_S = 75.0


@dataclass
class Stack:
    soakd: Daemon
    net: Daemon  # the network soak: --target ... --api http --watch-pid --scrape
    llm: Daemon  # the LLM soak: --api openai, streamed, for the TTFT/ITL/TPOT/tokens/goodput panels
    server: subprocess.Popen[str]
    llm_server: subprocess.Popen[str]
    prom_url: str
    prom_proc: subprocess.Popen[bytes]
    prom_log: Path
    started: float

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.soakd.port}"

    @property
    def net_instance(self) -> str:
        return f"127.0.0.1:{self.net.port}"

    @property
    def llm_instance(self) -> str:
        return f"127.0.0.1:{self.llm.port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.prom_url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422: bad query; the body says why
            return json.load(exc)

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("live-prom")
    # Leak judgement scaled from hours down to seconds, so the verdict panels have data
    # (only the settings this soakd knows).
    scaled = {"min_span": "8s", "bin": "2s", "trough_span": "4s", "persistence": "0s", "evaluate_interval": "1s"}
    known = {f.name for f in dataclasses.fields(LeakConfig)}
    config_toml = tmp / "soak.toml"
    config_toml.write_text("[leak]\n" + "".join(f'{k} = "{v}"\n' for k, v in scaled.items() if k in known))
    soakd = Daemon(
        [
            "--config",
            str(config_toml),
            "--model",
            "builtin:noop",
            "--warmup",
            "2",
            "--rate",
            "200",
            "--arrival",
            "poisson",
            "--memory-interval",
            "1s",
            "--leak-warmup",
            "5s",
            "--leak-window",
            "20s",
            "--state-dir",
            str(tmp / "state"),
        ],
        tmp,
    )
    # The served model: the plain HTTP target server, whose /metrics a vLLM-like page.
    server_port = free_port()
    server = subprocess.Popen([sys.executable, str(HTTP_SERVER), str(server_port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline().startswith("ready"), "target server"
    bodies = tmp / "bodies"
    bodies.mkdir()
    (bodies / "a.json").write_text('{"inputs": [1, 2, 3]}')
    net = Daemon(
        [
            "--config",
            str(config_toml),
            "--target",
            f"http://127.0.0.1:{server_port}/ok",
            "--api",
            "http",
            "--samples",
            str(bodies),
            "--warmup",
            "0",
            "--rate",
            "50",
            "--memory-interval",
            "1s",
            "--leak-warmup",
            "5s",
            "--leak-window",
            "20s",
            "--watch-pid",
            str(server.pid),
            "--scrape",
            f"http://127.0.0.1:{server_port}/metrics",
            "--state-dir",
            str(tmp / "net-state"),
        ],
        tmp,
    )
    # A streaming LLM server (the suite's fake OpenAI-compatible one) for the LLM panels.
    llm_port = free_port()
    llm_server = subprocess.Popen(
        [sys.executable, str(OPENAI_SERVER), str(llm_port)], stdout=subprocess.PIPE, text=True
    )
    assert llm_server.stdout is not None and llm_server.stdout.readline().startswith("ready"), "openai server"
    llm = Daemon(
        [
            "--target",
            f"http://127.0.0.1:{llm_port}/v1",
            "--api",
            "openai",
            "--input-shapes",
            "seq:fixed(n=16)",
            "--output-tokens",
            "8",
            "--rate",
            "20",
            "--warmup",
            "0",
            "--state-dir",
            str(tmp / "llm-state"),
        ],
        tmp,
    )
    prom_port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                "rule_files": [str(REPO / "prometheus" / "rules" / "*.yml")],
                "scrape_configs": [
                    {
                        "job_name": "soakd",
                        # Labelled as the drivers' PodMonitor labels shards of one soak, so the
                        # shard rules (prometheus/rules/soakd-shards.yml) sum these three live.
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{d.port}"], "labels": {"soak": "live", "shard": str(i)}}
                            for i, d in enumerate((soakd, net, llm))
                        ],
                    },
                ],
            }
        )
    )
    prom_log = tmp / "prometheus.log"
    with prom_log.open("w") as log:
        prom = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    s = Stack(soakd, net, llm, server, llm_server, f"http://127.0.0.1:{prom_port}", prom, prom_log, time.monotonic())
    try:
        _wait_serving(soakd)
        _wait_serving(net)
        _wait_serving(llm)

        def prometheus_ready() -> bool:
            if prom.poll() is not None:
                raise AssertionError(f"prometheus exited ({prom.returncode}):\n{prom_log.read_text()}")
            with urllib.request.urlopen(f"{s.prom_url}/-/ready", timeout=2) as resp:
                status: int = resp.status  # urlopen's response is untyped
                return status == 200

        wait_for(prometheus_ready, 30, what="Prometheus to be ready")
        wait_for(lambda: len(_values(s.query('up{job="soakd"} == 1'))) == 3, 30, what="Prometheus to scrape soakd")
        yield s
    finally:
        net.stop()
        llm.stop()
        for srv in (server, llm_server):
            srv.kill()
            srv.wait()
        prom.terminate()
        try:
            prom.wait(20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        soakd.stop()


def _wait_serving(soakd: Daemon, timeout: float = 90.0) -> None:
    """Until soakd counts requests; fail at once, with its output, if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if soakd.proc.poll() is not None:
            pytest.fail(f"soakd exited ({soakd.proc.returncode}):\n{soakd.output()}")
        try:
            if (metric_value(soakd.metrics(), "soakd_requests_total", 'outcome="ok"') or 0) > 0:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.3)
    pytest.fail(f"soakd served no request within {timeout}s:\n{soakd.output()}")


def _values(resp: Any) -> list[float]:
    """The sample values of an instant query's answer (vector or scalar)."""
    assert resp.get("status") == "success", resp
    data = resp["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(r["value"][1]) for r in data["result"]]


def _has_data(resp: Any) -> bool:
    return any(not math.isnan(v) for v in _values(resp))


VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def grafana_substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana variables ($x, ${x}, ${x:fmt}, [[x]]) the way the dashboard is used."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise AssertionError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return VAR.sub(repl, expr)


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expr) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((d["title"], p["title"], t["expr"]))
    return out


def test_dashboards_were_found() -> None:
    """There is something to check: both dashboards, with dozens of queries."""
    assert {p.name for p in DASHBOARDS} >= {"soakd-overview.json", "soakd-memory.json"}
    assert len(panel_queries()) > 40


def test_every_panel_query_parses_and_non_gpu_panels_show_data(stack: Stack) -> None:
    """Every dashboard query is valid PromQL; every one not on GPU metrics returns data from a live soak."""
    values = {
        "job": "soakd",
        "instance": f"{stack.instance}|{stack.net_instance}|{stack.llm_instance}",  # Grafana's multi-value regex
        "gpu": ".*",
        "stage": "e2e",
        "__rate_interval": "20s",
        "__interval": "2s",
        "__range": "1m",
    }
    pending: dict[str, list[str]] = {}  # expr -> the panels that use it
    gpu_empty: dict[str, list[str]] = {}
    for dash, title, raw in panel_queries():
        expr = grafana_substitute(raw, values)
        resp = stack.query(expr)
        assert resp.get("status") == "success", f"{dash} / {title}: {expr}\n{resp.get('error')}"
        where = f"{dash} / {title}"
        if GPU_METRIC.search(expr):
            if not _has_data(resp):
                gpu_empty.setdefault(expr, []).append(where)
        elif not _has_data(resp):
            pending.setdefault(expr, []).append(where)
    # Rates, recording rules and leak verdicts need a few evaluations: poll the rest.
    deadline = stack.started + DATA_DEADLINE_S
    while pending and time.monotonic() < deadline:
        time.sleep(2)
        pending = {e: w for e, w in pending.items() if not _has_data(stack.query(e))}
    # A quantile of events that did not happen in its window (no GC pause in 10 minutes) is NaN:
    # Grafana shows a gap, which is the truth. Accept that only when the event count is flat.
    pending = {e: w for e, w in pending.items() if not _no_events(stack, e)}
    assert not pending, "panels without data from a live soakd:\n" + "\n".join(
        f"  {', '.join(sorted(set(w)))}: {e}" for e, w in pending.items()
    )
    assert stack.soakd.proc.poll() is None, stack.soakd.output()
    assert stack.net.proc.poll() is None, stack.net.output()
    assert stack.llm.proc.poll() is None, stack.llm.output()
    gpu_panels = sorted({w for ws in gpu_empty.values() for w in ws})
    print("GPU panels without data on this host:", *gpu_panels, sep="\n  ")  # shown with -s


def test_served_model_panels_show_the_network_soak(stack: Stack) -> None:
    """The served-model series reach Prometheus from the network soak alone: target up, the
    watched server's RSS, a scraped server gauge and a verdict on a target_ series."""
    sel = f'instance="{stack.net_instance}"'
    for expr, want in (
        (f"soakd_target_up{{{sel}}}", 1.0),
        (f'soakd_target_metric{{{sel}, name="vllm:num_requests_waiting"}}', 3.0),
        (f'soakd_target_process_resident_memory_bytes{{{sel}, pid="{stack.server.pid}"}} > 0', None),
        (f'soakd_leak_slope_bytes_per_hour{{{sel}, series="target_rss"}}', None),
    ):
        got = wait_for(lambda e=expr: _values(stack.query(e)), DATA_DEADLINE_S, what=expr)  # type: ignore[misc]
        if want is not None:
            assert got == [want], expr
    assert not _values(stack.query(f'soakd_target_up{{instance="{stack.instance}"}}'))  # in-process: none


def _no_events(stack: Stack, expr: str) -> bool:
    """True when ``expr`` is a histogram_quantile whose histogram counted nothing in its window."""
    m = re.search(r"rate\((\w+)_bucket(\{[^}]*\})\[(\w+)\]\)", expr)
    if "histogram_quantile" not in expr or m is None:
        return False
    counts = _values(stack.query(f"sum(increase({m[1]}_count{m[2]}[{m[3]}]))"))
    return bool(counts) and all(c == 0 for c in counts)


def test_every_rule_loads_and_evaluates_healthy(stack: Stack) -> None:
    """Prometheus loads every recording and alerting rule in prometheus/rules and evaluates each cleanly."""
    expected = 0
    for path in (REPO / "prometheus" / "rules").glob("*.yml"):
        expected += len(re.findall(r"^\s*- (record|alert):", path.read_text(), flags=re.M))

    def all_evaluated() -> list[dict[str, Any]]:
        rules = [r for g in stack.api("rules")["data"]["groups"] for r in g["rules"]]
        return (
            rules
            if rules
            and all(
                r.get("lastEvaluation", "").startswith("2") and not r["lastEvaluation"].startswith("0001")
                for r in rules
            )
            else []
        )

    rules = wait_for(all_evaluated, 30, what="every rule to be evaluated")
    assert len(rules) == expected
    unhealthy = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not unhealthy, unhealthy


def test_variable_queries_find_the_soak(stack: Stack) -> None:
    """The $job and $instance pickers list the running soakd; $gpu's query is valid (empty on CPU)."""
    values = {"job": "soakd", "instance": stack.instance}
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert m, var["definition"]
            selector = grafana_substitute(m.group(1), values)
            resp = stack.api(f"label/{m.group(2)}/values", **{"match[]": selector})
            assert resp["status"] == "success", (var["name"], resp)
            found = resp["data"]
            if var["name"] == "job":
                assert found == ["soakd"]
            elif var["name"] == "instance":
                assert found == sorted([stack.instance, stack.net_instance, stack.llm_instance])


def test_every_recording_rule_has_data(stack: Stack) -> None:
    """Each recorded series (the dashboards' and the alerts' inputs) has a value from the live soak."""
    names = [
        n
        for path in (REPO / "prometheus" / "rules").glob("*.yml")
        for n in re.findall(r"^\s*- record: (\S+)", path.read_text(), flags=re.M)
    ]
    assert names
    missing = names
    deadline = time.monotonic() + 30
    while missing and time.monotonic() < deadline:
        missing = [n for n in missing if not _has_data(stack.query(n))]
        if missing:
            time.sleep(1)
    assert not missing


def test_healthy_cpu_soak_raises_no_alert(stack: Stack) -> None:
    """On a healthy CPU soak nothing is pending or firing: GPU samplers that cannot run are not 'down'.

    The leak verdicts are left out: this session judges leaks over seconds, where start-up growth
    may well look like one.
    """
    wait_for(
        lambda: all(
            r.get("lastEvaluation", "0001").startswith("2")
            for g in stack.api("rules")["data"]["groups"]
            for r in g["rules"]
        ),
        30,
        what="every rule to be evaluated",
    )
    alerts = [
        a
        for a in stack.api("alerts")["data"]["alerts"]
        if a["labels"]["alertname"] not in ("SoakdMemoryLeakSuspected", "SoakdTargetLeakSuspected")
    ]
    assert not alerts, alerts
