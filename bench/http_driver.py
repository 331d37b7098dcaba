"""soakd as an HTTP load driver, side by side with Locust (issue #15's benchmarks), in one run:

1. **Ceiling per CPU core.** soakd (``--api http``, closed loop) and Locust's ``FastHttpUser``
   (no wait time) against the same minimal server (bench/minimal_server.py), each in its own
   process, in alternating rounds. For each round: requests completed and the client process's
   CPU seconds over a steady window (start-up left out: soakd imports torch, Locust gevent),
   read live from soakd's /metrics and Locust's web API. Printed: req/s, cores used, req/s per
   core, and the median ratio soakd/Locust per core (goal >= 1).
2. **Open loop at 2,000 req/s Poisson** to the same server: achieved rate against offered
   (goal within 1%), schedule-lag p99 (goal < 2 ms) and the client queue stage.

Locust runs from a venv of its own (default ``.venv-locust``; made by
``python3 -m venv .venv-locust && .venv-locust/bin/pip install locust``), as a user would have it.
Both drivers share 2 cores with the server here: per-core figures, not raw rates, are the
comparison; a busy machine moves both, alternation keeps the ratio fair.

    .venv/bin/python bench/http_driver.py [--rounds 3] [--seconds 15] [--users 32] [--rate 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench.daemon_rss import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TICK = os.sysconf("SC_CLK_TCK")

LOCUSTFILE = """
from locust import FastHttpUser, constant, task

class Driver(FastHttpUser):
    wait_time = constant(0)

    @task
    def post(self):
        self.client.post("/ok", data=b'{"x": 1}', headers={"Content-Type": "application/json"})
"""


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (children not counted: neither tool forks here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up within {timeout:.0f}s")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read()
        return data


def soakd_ok(metrics_url: str) -> float:
    for line in get(metrics_url).decode().splitlines():
        if line.startswith('soakd_requests_total{outcome="ok"}'):
            return float(line.split()[-1])
    return 0.0


def locust_ok(web: str) -> float:
    stats = json.loads(get(f"{web}/stats/requests"))
    agg = [s for s in stats["stats"] if s["name"] == "Aggregated"]
    return float(agg[0]["num_requests"] - agg[0]["num_failures"]) if agg else 0.0


def steady(
    what: str, proc: subprocess.Popen[bytes], count: Callable[[], float], settle: float, seconds: float
) -> tuple[float, float]:
    """(requests/s, cores) of ``proc`` over ``seconds`` after ``settle`` seconds of load."""

    def started() -> bool:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr is not None else ""
            raise SystemExit(f"{what} exited {proc.returncode}:\n{err[-2000:]}")
        return bool(count() > 0)

    wait_for(started, "the driver's first requests")
    time.sleep(settle)
    n0, c0, t0 = count(), cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    n1, c1, t1 = count(), cpu_seconds(proc.pid), time.monotonic()
    wall = t1 - t0
    return (n1 - n0) / wall, (c1 - c0) / wall


def run_soakd(url: str, samples: Path, state: Path, users: int, seconds: float) -> tuple[float, float]:
    port = free_port()
    cmd = [sys.executable, "-m", "soakd", "run", "--target", f"{url}/ok", "--api", "http"]
    cmd += ["--samples", str(samples), "--concurrency", str(users), "--warmup", "10"]
    cmd += ["--metrics-addr", f"127.0.0.1:{port}", "--state-dir", str(state)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return steady("soakd", proc, lambda: soakd_ok(f"http://127.0.0.1:{port}/metrics"), 2.0, seconds)
    finally:
        proc.terminate()
        proc.wait(60)


def run_locust(locust: Path, locustfile: Path, url: str, users: int, seconds: float) -> tuple[float, float]:
    port = free_port()
    cmd = [str(locust), "-f", str(locustfile), "--host", url, "--users", str(users), "--spawn-rate", str(users)]
    cmd += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return steady("locust", proc, lambda: locust_ok(f"http://127.0.0.1:{port}"), 2.0, seconds)
    finally:
        proc.terminate()
        proc.wait(60)


def open_loop(url: str, samples: Path, state: Path, rate: float, seconds: float) -> dict[str, object]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "soakd", "run", "--target", f"{url}/ok", "--api", "http"]
        cmd += ["--samples", str(samples), "--rate", str(rate), "--arrival", "poisson", "--warmup", "10"]
        cmd += ["--duration", f"{seconds:g}s", "--metrics-addr", f"127.0.0.1:{free_port()}"]
        cmd += ["--state-dir", str(state), "--summary-json", out.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        summary: dict[str, object] = json.loads(Path(out.name).read_text())
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="steady window per round")
    ap.add_argument("--users", type=int, default=32, help="concurrency (soakd) and users (Locust)")
    ap.add_argument("--rate", type=float, default=2000.0, help="open-loop rate")
    ap.add_argument("--open-seconds", type=float, default=30.0)
    ap.add_argument("--locust", default=str(ROOT / ".venv-locust" / "bin" / "locust"))
    args = ap.parse_args()
    locust = Path(args.locust)
    if not locust.exists():
        raise SystemExit(f"{locust}: no Locust; python3 -m venv .venv-locust && .venv-locust/bin/pip install locust")

    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "minimal_server.py"), str(port)], stdout=subprocess.PIPE)
    assert server.stdout is not None
    server.stdout.readline()  # "ready PORT"
    url = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory() as d:
            samples = Path(d) / "samples"
            samples.mkdir()
            (samples / "one.json").write_text('{"x": 1}')
            locustfile = Path(d) / "locustfile.py"
            locustfile.write_text(LOCUSTFILE)
            rows: dict[str, list[tuple[float, float]]] = {"soakd": [], "locust": []}
            for r in range(args.rounds):
                for name in ("soakd", "locust") if r % 2 == 0 else ("locust", "soakd"):
                    if name == "soakd":
                        res = run_soakd(url, samples, Path(d) / f"state{r}", args.users, args.seconds)
                    else:
                        res = run_locust(locust, locustfile, url, args.users, args.seconds)
                    rows[name].append(res)
                    print(
                        f"round {r + 1} {name:6s}: {res[0]:8.0f} req/s on {res[1]:.2f} cores = "
                        f"{res[0] / res[1]:8.0f} req/s per core",
                        flush=True,
                    )
            per_core = {k: statistics.median(rps / cores for rps, cores in v) for k, v in rows.items()}
            ratios = [s[0] / s[1] / (lo[0] / lo[1]) for s, lo in zip(rows["soakd"], rows["locust"], strict=True)]
            print(f"\nclosed loop, {args.users} connections, medians of {args.rounds} alternating rounds:")
            for k, v in rows.items():
                print(
                    f"  {k:6s}: {statistics.median(x[0] for x in v):8.0f} req/s, "
                    f"{statistics.median(x[1] for x in v):.2f} cores, {per_core[k]:8.0f} req/s per core"
                )
            print(
                f"  soakd/Locust per core: median {statistics.median(ratios):.2f} "
                f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}; goal >= 1)"
            )

            s = open_loop(url, samples, Path(d) / "open", args.rate, args.open_seconds)
            achieved, offered = float(s["throughput_rps"]), float(s["offered_rps"])  # type: ignore[arg-type]
            lag = s["schedule_lag_ms"]
            queue = s["latency_ms"]["queue"]  # type: ignore[index]
            print(
                f"\nopen loop, Poisson {args.rate:g} req/s for {args.open_seconds:g}s: achieved {achieved:.1f} "
                f"req/s of {offered:.1f} offered ({100 * (achieved / offered - 1):+.2f}%; "
                f"{100 * (achieved / args.rate - 1):+.2f}% of the configured rate; goal within 1%)"
            )
            print(
                f"  schedule lag p50 {lag['p50']:.3f} ms, p99 {lag['p99']:.3f} ms (goal < 2 ms); "  # type: ignore[index]
                f"client queue stage p50 {queue['p50']:.3f} ms, p99 {queue['p99']:.3f} ms; "
                f"requests {s['requests']}"
            )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
