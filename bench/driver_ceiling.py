"""soakd's ceiling as an HTTP driver against Debian's nginx (issue #38's benchmarks), in one run.

nginx returns a fixed body (``return 200``, access log off) from one worker pinned to the last
core, so the server costs little CPU and the driver is what is measured. Three parts, each in
alternating rounds, medians printed with every round's figure:

1. **Per core, on one pinned core** (``taskset -c 0``): ``wrk`` (C), ``hey`` (Go) and soakd
   (``--api http``, closed loop, one process), each posting the same JSON body over the same
   number of connections. Each tool's requests/s is divided by the CPU its process used over
   the window (read from /proc), so a tool that idles is not flattered. Printed: soakd's per-core
   rate against hey's (goal >= 0.35x) and wrk's.
2. **Workers**: ``soakd --workers 2`` against ``--workers 1``, unpinned (goal >= 1.6x). On a
   2-core host the server takes part of the second core, so the ratio here is bounded by the
   cores the drivers can get; the CPU each used is printed beside it.
3. **Locust**, when ``.venv-locust`` has it: ``locust --processes 2`` (FastHttpUser, no wait)
   against ``soakd --workers 2``, same server, same run (goal >= 1.0x).

soakd's requests are counted on its /metrics (the merged page with ``--workers``) over a steady
window after start-up; wrk and hey report their own totals over their whole run (they start in
milliseconds). Needs ``apt-get install nginx-light hey wrk`` (or ``nginx``).

    .venv/bin/python -m bench.driver_ceiling [--rounds 3] [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.daemon_rss import free_port
from bench.http_driver import LOCUSTFILE, locust_ok, soakd_ok, wait_for

ROOT = Path(__file__).resolve().parent.parent
BODY = '{"x": 1}'
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location / {{ default_type application/json; return 200 '{{"ok": true}}'; }}
    }}
}}
"""
WRK_POST = f'wrk.method = "POST"\nwrk.body = \'{BODY}\'\nwrk.headers["Content-Type"] = "application/json"\n'

Result = tuple[float, float]  # (requests/s, cores used)


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and its live children (``--workers`` forks its drivers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def pinned(core: str | None) -> list[str]:
    return ["taskset", "-c", core] if core is not None else []


def run_tool(cmd: list[str], pattern: str) -> Result:
    """A tool that reports its own rate: (its req/s, its CPU over its whole run / wall)."""
    t0 = time.monotonic()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cpu = 0.0
    while proc.poll() is None:  # sample the CPU until it exits (psutil cannot read a reaped child)
        cpu = max(cpu, tree_cpu(proc))
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout is not None else ""
    wall = time.monotonic() - t0
    m = re.search(pattern, out)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{out[-2000:]}")
    return float(m.group(1)), cpu / wall


def measured(what: str, cmd: list[str], count: Callable[[], float], seconds: float) -> Result:
    """Start a driver, measure it over a steady window, stop it."""
    proc = psutil.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return steady(what, proc, count, seconds)
    finally:
        proc.terminate()
        proc.wait(60)


def run_soakd(
    url: str, samples: Path, state: Path, conns: int, seconds: float, *, workers: int = 1, core: str | None = None
) -> Result:
    port = free_port()
    cmd = [*pinned(core), sys.executable, "-m", "soakd", "run", "--target", f"{url}/ok", "--api", "http"]
    cmd += ["--samples", str(samples), "--concurrency", str(conns), "--warmup", "5", "--workers", str(workers)]
    cmd += ["--metrics-addr", f"127.0.0.1:{port}", "--state-dir", str(state), "--memory-interval", "5s"]
    return measured("soakd", cmd, lambda: soakd_ok(f"http://127.0.0.1:{port}/metrics"), seconds)


def run_locust(locust: Path, locustfile: Path, url: str, conns: int, seconds: float, processes: int) -> Result:
    port = free_port()
    cmd = [str(locust), "-f", str(locustfile), "--host", url, "--users", str(conns), "--spawn-rate", str(conns)]
    cmd += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING"]
    cmd += ["--processes", str(processes)]
    return measured("locust", cmd, lambda: locust_ok(f"http://127.0.0.1:{port}"), seconds)


def steady(what: str, proc: psutil.Popen, count: Callable[[], float], seconds: float, settle: float = 2.0) -> Result:
    """(requests/s, cores) of ``proc`` and its children over ``seconds`` once its load has begun."""

    def started() -> bool:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr is not None else ""
            raise SystemExit(f"{what} exited {proc.returncode}:\n{err[-2000:]}")
        return bool(count() > 0)

    wait_for(started, f"{what}'s first requests", timeout=120)
    time.sleep(settle)
    n0, c0, t0 = count(), tree_cpu(proc), time.monotonic()
    time.sleep(seconds)
    n1, c1, t1 = count(), tree_cpu(proc), time.monotonic()
    return (n1 - n0) / (t1 - t0), (c1 - c0) / (t1 - t0)


def line(name: str, rows: list[Result]) -> str:
    per = [r / c for r, c in rows]
    rps, cores = statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows)
    return (
        f"  {name:16s} {rps:9.0f} req/s on {cores:.2f}"
        f" cores = {statistics.median(per):9.0f} req/s per core  (rounds: {', '.join(f'{x:.0f}' for x in per)})"
    )


def ratio(a: list[Result], b: list[Result], per_core: bool = True) -> str:
    rs = [(x[0] / x[1]) / (y[0] / y[1]) if per_core else x[0] / y[0] for x, y in zip(a, b, strict=True)]
    return f"{statistics.median(rs):.2f}x (rounds {', '.join(f'{r:.2f}' for r in rs)})"


def alternate(rounds: int, names: list[str]) -> list[list[str]]:
    """Each round's order: rotated by one each round, so none always runs first on a cool host."""
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window per round")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--locust", default=str(ROOT / ".venv-locust" / "bin" / "locust"))
    ap.add_argument("--skip", default="", help="comma list of parts to skip: core, workers, locust")
    args = ap.parse_args()
    for tool in ("nginx", "hey", "wrk", "taskset"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool}: not installed (apt-get install nginx-light hey wrk)")
    cores = os.cpu_count() or 1
    server_core, driver_core = str(cores - 1), "0"
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        conf = Path(d) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(d=d, port=port))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        server = subprocess.Popen([*pinned(server_core), nginx, "-c", str(conf), "-p", d], stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _answers(url), "nginx")
            samples = Path(d) / "samples"
            samples.mkdir()
            (samples / "one.json").write_text(BODY)
            (Path(d) / "post.lua").write_text(WRK_POST)
            c, s = args.connections, args.seconds
            print(f"nginx 1 worker on core {server_core}; {c} connections; {args.rounds} rounds of {s:g} s", flush=True)
            if "core" not in skip:
                _per_core(args.rounds, url, Path(d), samples, c, s, driver_core)
            if "workers" not in skip:
                _workers(args.rounds, url, Path(d), samples, c, s)
            if "locust" not in skip:
                _locust(args.rounds, Path(args.locust), url, Path(d), samples, c, s)
        finally:
            server.terminate()
            server.wait(10)


def _answers(url: str) -> bool:
    import urllib.request  # only for the readiness probe

    with urllib.request.urlopen(f"{url}/ok", timeout=2) as r:
        return bool(r.status == 200)


def _per_core(rounds: int, url: str, d: Path, samples: Path, c: int, s: float, core: str) -> None:
    print(f"\n1. per core: each driver pinned to core {core}", flush=True)
    rows: dict[str, list[Result]] = {"wrk": [], "hey": [], "soakd": []}
    for r, order in enumerate(alternate(rounds, list(rows))):
        for name in order:
            if name == "wrk":
                cmd = [*pinned(core), "wrk", "-t1", f"-c{c}", f"-d{s:g}s", "-s", str(d / "post.lua"), f"{url}/ok"]
                res = run_tool(cmd, r"Requests/sec:\s+([\d.]+)")
            elif name == "hey":
                cmd = [*pinned(core), "hey", "-z", f"{s:g}s", "-c", str(c), "-m", "POST", "-d", BODY]
                res = run_tool([*cmd, "-T", "application/json", f"{url}/ok"], r"Requests/sec:\s+([\d.]+)")
            else:
                res = run_soakd(url, samples, d / f"core{r}", c, s, core=core)
            rows[name].append(res)
            print(f"  round {r + 1} {name:5s}: {res[0]:9.0f} req/s on {res[1]:.2f} cores", flush=True)
    print("medians:")
    for name, v in rows.items():
        print(line(name, v))
    print(f"  soakd/hey per core: {ratio(rows['soakd'], rows['hey'])}; goal >= 0.35x")
    print(f"  soakd/wrk per core: {ratio(rows['soakd'], rows['wrk'])}", flush=True)


def _workers(rounds: int, url: str, d: Path, samples: Path, c: int, s: float) -> None:
    print("\n2. soakd --workers 2 against --workers 1, unpinned (the server shares the host)", flush=True)
    rows: dict[str, list[Result]] = {"1": [], "2": []}
    for r, order in enumerate(alternate(rounds, list(rows))):
        for n in order:
            res = run_soakd(url, samples, d / f"w{n}-{r}", c, s, workers=int(n))
            rows[n].append(res)
            print(f"  round {r + 1} --workers {n}: {res[0]:9.0f} req/s on {res[1]:.2f} cores", flush=True)
    print("medians:")
    for n, v in rows.items():
        print(line(f"--workers {n}", v))
    print(f"  --workers 2 / --workers 1 throughput: {ratio(rows['2'], rows['1'], per_core=False)}; goal >= 1.6x")


def _locust(rounds: int, locust: Path, url: str, d: Path, samples: Path, c: int, s: float) -> None:
    if not locust.exists():
        how = "python3 -m venv .venv-locust && .venv-locust/bin/pip install locust"
        print(f"\n3. Locust: skipped, {locust} missing ({how})")
        return
    print("\n3. soakd --workers 2 against locust --processes 2", flush=True)
    locustfile = d / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    rows: dict[str, list[Result]] = {"soakd": [], "locust": []}
    for r, order in enumerate(alternate(rounds, list(rows))):
        for name in order:
            if name == "soakd":
                res = run_soakd(url, samples, d / f"l{r}", c, s, workers=2)
            else:
                res = run_locust(locust, locustfile, url, c, s, processes=2)
            rows[name].append(res)
            print(f"  round {r + 1} {name:6s}: {res[0]:9.0f} req/s on {res[1]:.2f} cores", flush=True)
    print("medians:")
    for name, v in rows.items():
        print(line(name, v))
    print(f"  soakd/Locust throughput: {ratio(rows['soakd'], rows['locust'], per_core=False)}; goal >= 1.0x")
    print(f"  soakd/Locust per core:   {ratio(rows['soakd'], rows['locust'])}")


if __name__ == "__main__":
    main()
