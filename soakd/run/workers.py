"""``soakd run --workers N``: one soak of a served model driven by N driver processes on a host.

One process sends from one core (its event loop and the GIL); N ``soakd run --shard I/N``
processes from one ``--start-at`` send the soak's one arrival process between them (each the
arrivals whose index is its own mod N; concurrency split). This parent keeps what is one per
soak: the state dir (each worker's run in a folder of it, merged at the end), ``/metrics``
(the workers' pages merged exactly at each scrape, plus each worker's health), ``/healthz``,
the summary and the exit code. Worker 0 alone watches the server's memory (``--scrape``,
``--watch-*``), so its leak verdict is judged once. A worker that dies is counted and started
again (at most MAX_RESTARTS times each): it resumes its run, so nothing it flushed is lost.
SIGINT/SIGTERM go to every worker, which drain as one soakd does.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec
import psutil
from prometheus_client import CollectorRegistry

from soakd.config import Config
from soakd.endpoints import EndpointServer
from soakd.errors import Exit, RunFailed
from soakd.record.types import SloBlock
from soakd.record.write import LLM_TIMINGS, write_json_atomic
from soakd.report.fleet import FleetSourceError
from soakd.report.gate import print_verdict
from soakd.report.merge import build_merged, load_parts
from soakd.run.shard import START_GATE_ENV
from soakd.run.stop import StopFlag
from soakd.run.worker_metrics import MergedMetrics
from soakd.state import default_state_dir

log = logging.getLogger("soakd.workers")

MAX_RESTARTS = 3  # per worker: a driver that keeps dying is a fault to report, not to hide
START_MARGIN = 1.0  # seconds from the last worker ready to the shared start (without --start-at)
SCRAPE_TIMEOUT = 2.0
# Flags each worker gets from this parent instead of the user's: where it writes and listens.
OWN_KEYS = frozenset(
    {
        "load.workers",
        "load.shard",
        "load.start_at",
        "state.dir",
        "state.run_id",
        "metrics.addr",
        "output.summary_json",
        "output.log_file",
        "output.record_requests",
    }
)


def worker_record_path(path: str, index: int) -> str:
    """Worker ``index``'s own request log beside the one asked for (``requests.jsonl`` ->
    ``requests.worker-0.jsonl``): N processes must not write one file, and each log, replayed or
    read alone, is that worker's share in its own time order."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.worker-{index}{p.suffix}"))


@dataclass
class Worker:
    index: int
    dir: Path
    port: int
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    deaths: list[str] = field(default_factory=list)
    done: bool = False

    @property
    def gate(self) -> Path:
        return self.dir / "start"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, START_GATE_ENV: str(self.gate)}
        with (self.dir / "worker.log").open("ab") as logf:
            cmd = [sys.executable, "-m", "soakd", *self.args]
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, env=env)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_args(flags: dict[str, Any], run_flags: dict[str, str], config: str | None) -> list[str]:
    """The user's own run flags, as given, less those the parent sets per worker."""
    args = ["run"] + (["--config", config] if config else [])
    for key, value in flags.items():
        if key in OWN_KEYS:
            continue
        for v in value if isinstance(value, list) else [value]:
            args += [run_flags[key], str(v)]
    return args


def run_workers(
    cfg: Config, flags: dict[str, Any], run_flags: dict[str, str], config: str | None, out: TextIO = sys.stdout
) -> int:
    """The parent of a ``--workers N`` soak; returns the exit code (the merged gate's)."""
    n = cfg.load.workers
    run_id = cfg.state.run_id or time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
    root = default_state_dir(cfg.state.dir) / run_id
    base = worker_args(flags, run_flags, config)
    workers = []
    for i in range(n):
        port, wdir = _free_port(), root / f"worker-{i}"
        own = ["--workers", "1", "--shard", f"{i}/{n}", "--run-id", f"w{i}"]
        own += ["--start-at", cfg.load.start_at] if cfg.load.start_at else []  # else the parent's gate
        own += ["--state-dir", str(wdir), "--metrics-addr", f"127.0.0.1:{port}"]
        own += ["--summary-json", str(wdir / "summary.json")]
        if cfg.output.log_file:  # each its own: N processes must not write one file
            own += ["--log-file", str(wdir / "soakd.log")]
        if cfg.output.record_requests:
            own += ["--record-requests", worker_record_path(cfg.output.record_requests, i)]
        workers.append(Worker(i, wdir, port, [*base, *own]))
    merged = MergedMetrics(n)
    registry = CollectorRegistry()
    registry.register(merged)
    server = EndpointServer(
        cfg.metrics.addr, registry, health=lambda: _health(merged), status=lambda: _status(workers, merged)
    )
    server.start()
    log.info("serving the merged metrics of %d workers on http://%s/metrics", n, server.address)
    if cfg.output.record_requests:
        logs = ", ".join(worker_record_path(cfg.output.record_requests, i) for i in range(n))
        log.info("output.record_requests: each worker writes its own request log: %s", logs)
    stop = StopFlag()
    restore = stop.install()
    try:
        for w in workers:
            w.start()
        _supervise(workers, merged, stop, cfg)
    finally:
        restore()
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        server.close()
    return _conclude(cfg, workers, merged, root, out)


def _supervise(workers: list[Worker], merged: MergedMetrics, stop: StopFlag, cfg: Config) -> None:
    """Scrape and watch the workers until every one has ended; restart the dead (bounded);
    on SIGINT/SIGTERM pass the signal on and wait for their drain."""
    interval = min(cfg.state.flush_interval, 2.0)
    drain_deadline: float | None = None
    opened = bool(cfg.load.start_at)
    while not all(w.done for w in workers):
        # A worker that stays down for good (past its restarts) must not hold the others back.
        if not opened and all(w.done or w.gate.with_name("start.ready").exists() for w in workers):
            # Every worker is loaded and warmed up: one instant for all, a moment ahead.
            instant = f"{time.time() + START_MARGIN:.3f}"
            for w in workers:
                w.gate.write_text(instant + "\n")
            opened = True
            log.info("%d workers ready: the soak starts at %s", len(workers), instant)
        if stop.event.is_set() and drain_deadline is None:
            log.info("received %s: stopping %d workers", stop.name, len(workers))
            for w in workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.send_signal(stop.signal or signal.SIGTERM)
            drain_deadline = time.monotonic() + cfg.load.drain_timeout + 15.0
        for w in workers:
            _check(w, merged, stopping=drain_deadline is not None)
        if drain_deadline is not None and time.monotonic() > drain_deadline:
            raise RunFailed(f"workers {[w.index for w in workers if not w.done]} did not drain in time")
        stop.event.wait(interval if opened else 0.1) if drain_deadline is None else time.sleep(0.2)


def _check(w: Worker, merged: MergedMetrics, *, stopping: bool) -> None:
    if w.done or w.proc is None:
        return
    rc = w.proc.poll()
    if rc is None:
        try:
            with urllib.request.urlopen(w.url("/metrics"), timeout=SCRAPE_TIMEOUT) as resp:
                merged.update(w.index, resp.read().decode())
            merged.up[w.index] = True
            merged.cpu_seconds[w.index] = sum(psutil.Process(w.proc.pid).cpu_times()[:2])
        except (OSError, ValueError, psutil.Error):
            merged.up[w.index] = False  # still loading, or stuck: /healthz says which worker
        return
    merged.up[w.index] = False
    if rc in (Exit.OK, Exit.FAIL) or stopping:
        w.done = True
        return
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited {rc}"
    w.deaths.append(how)
    if len(w.deaths) > MAX_RESTARTS:
        log.error("worker %d %s; past %d restarts it stays down (%s)", w.index, how, MAX_RESTARTS, w.dir / "worker.log")
        w.done = True
        return
    log.warning("worker %d %s: starting it again (restart %d of at most %d)", w.index, how, len(w.deaths), MAX_RESTARTS)
    merged.restarts[w.index] += 1
    w.start()


def _status(workers: list[Worker], merged: MergedMetrics) -> dict[str, Any]:
    """``/status``: each worker's process, address and health."""
    return {
        "workers": [
            {
                "index": w.index,
                "pid": None if w.proc is None else w.proc.pid,
                "metrics": w.url("/metrics"),
                "up": merged.up[w.index],
                "restarts": len(w.deaths),
                "deaths": list(w.deaths),
                "done": w.done,
                "state_dir": str(w.dir),
            }
            for w in workers
        ]
    }


def _health(merged: MergedMetrics) -> tuple[bool, str]:
    down = [str(i) for i, up in enumerate(merged.up) if not up]
    return (False, f"workers down: {', '.join(down)}") if down else (True, "ok")


def _conclude(cfg: Config, workers: list[Worker], merged: MergedMetrics, root: Path, out: TextIO) -> int:
    """The merged summary of the workers' runs: printed, written, and its gate the exit code."""
    try:
        data, _ = build_merged(load_parts([str(w.dir) for w in workers]))
    except FleetSourceError as exc:  # a worker that never started its run: named
        raise RunFailed(f"--workers: cannot merge the workers' runs: {exc}") from None
    data["workers"] = [
        {"index": w.index, "state_dir": str(w.dir), "restarts": len(w.deaths), "deaths": w.deaths} for w in workers
    ]
    died = [f"worker {w.index} ({', '.join(w.deaths)})" for w in workers if w.deaths]
    write_json_atomic(root / "summary.json", data)
    if cfg.output.summary_json:
        write_json_atomic(cfg.output.summary_json, data)
    e2e = data["latency_ms"].get("e2e") or {}
    print(
        f"soakd: {len(workers)} workers, {sum(data['requests'].values())} requests, "
        f"{data['throughput_rps']:.1f} req/s, e2e p99 {e2e.get('p99')} ms",
        file=out,
    )
    llm = data.get("llm")
    if llm:
        timings = ", ".join(f"{name} p99 {(llm.get(key) or {}).get('p99')} ms" for name, key in LLM_TIMINGS)
        print(f"  {timings}; tokens out {llm['output_tokens']}", file=out)
    if died:
        print(f"workers restarted: {'; '.join(died)}", file=out)
    print_verdict(msgspec.convert(data["slo"], SloBlock), out)
    print(f"state: {root} (soakd report --merge {root}/worker-*)", file=out)
    return Exit.OK if data["slo"]["passed"] else Exit.FAIL
