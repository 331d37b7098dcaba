"""The daemon's own memory over a run (issue #6): `soakd run --model builtin:noop --rate 1000`
as a subprocess, its RSS read from /proc every few seconds, and the slope after warm-up. With
``--http-target`` soakd drives bench/minimal_server.py over ``--api http`` instead (issue #15):
the network client's memory, its pool and per-request tasks included.

Goal: flat within 1 MiB/h after warm-up over one hour (``--duration 1h --warmup 10m``). The
default is a shorter run; its slope is noisier (a few MiB/h of allocator settling reads as
creep over minutes), so judge the hour-long figure.

/metrics is scraped every ``--scrape`` seconds, as Prometheus would during a real soak, so the
exposition path is part of what is measured. Besides the RSS slope the bench prints the slope
of each half after warm-up (settling shows as a first half steeper than the second) and
soakd's own glibc figures from /metrics (bytes in use against bytes held from the OS), which
tell growing data from allocator retention.

    .venv/bin/python bench/daemon_rss.py [--duration 3m] [--warmup 60s] [--rate 1000] [--scrape 15s]
        [--http-target]   (prints the slope of each kind of mapping: heap, thread arenas, pymalloc, stacks)
        [--stall-at 2m --stall-for 2s] [--max-inflight 1024]

``--stall-at`` stops the HTTP server (SIGSTOP) for ``--stall-for`` at that moment and prints the
RSS before and after: in the open loop every request due while the server is stopped stays in
flight, up to ``load.max_inflight``, so the stall sets the high-water mark of live request
objects that an unlucky moment of a real soak would set later (pymalloc keeps an arena until
it is entirely empty). Put it inside the warm-up to measure the slope after that mark.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from soakd.config import parse_duration


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """The named unlabelled samples from one /metrics scrape (the whole page is read)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in names:
                out[name] = float(value)
    return out


MALLOC = ("soakd_malloc_in_use_bytes", "soakd_malloc_arena_bytes")
INFLIGHT = "soakd_inflight_requests"

_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
_ARENA_ALIGN = 64 << 20  # glibc maps each thread arena's heap at a 64 MiB-aligned address


def rss_by_mapping(pid: int) -> dict[str, int]:
    """Resident bytes by kind of mapping, from /proc/PID/smaps: which one grows tells a growing
    malloc heap (the main ``[heap]``, or a thread arena) from pymalloc's arenas, thread
    stacks (8 MiB) or shared libraries."""
    out: dict[str, int] = {}
    kind = ""
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            m = _MAPPING.match(line)
            if m:
                start, end, name = int(m.group(1), 16), int(m.group(2), 16), m.group(4).strip()
                size = end - start
                if name.startswith("/"):
                    kind = "files"
                elif name:
                    kind = name.strip("[]").split(":")[0]  # heap, stack, vdso, anon:...
                elif start % _ARENA_ALIGN == 0 and size <= _ARENA_ALIGN:
                    kind = "thread-arenas"
                elif size in (8 << 20, (8 << 20) + 4096):
                    kind = "thread-stacks"
                elif size % (1 << 20) == 0:
                    # pymalloc maps 1 MiB arenas; the kernel merges neighbours into one mapping
                    # (7 and 3 MiB ones held request objects), so any whole number of MiB.
                    kind = "pymalloc-arenas"
                else:
                    kind = "anon-other"
            elif line.startswith("Rss:") and kind:
                out[kind] = out.get(kind, 0) + int(line.split()[1]) * 1024
    return out


def slope_mib_per_hour(t: np.ndarray, mib: np.ndarray) -> float:
    return float(np.polyfit(t / 3600.0, mib, 1)[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", default="3m")
    ap.add_argument("--warmup", default="60s", help="left out of the slope")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--interval", default="2s", help="RSS read interval")
    ap.add_argument("--scrape", default="15s", help="/metrics scrape interval, as Prometheus would")
    ap.add_argument(
        "--http-target",
        action="store_true",
        help="drive bench/minimal_server.py over --api http instead of builtin:noop in-process",
    )
    ap.add_argument("--stall-at", default=None, help="with --http-target: stop the server at this moment")
    ap.add_argument("--stall-for", default="2s", help="how long --stall-at stops the server")
    ap.add_argument("--max-inflight", type=int, default=None, help="load.max_inflight (soakd's default: 1024)")
    args = ap.parse_args()
    if args.stall_at is not None and not args.http_target:
        ap.error("--stall-at needs --http-target (it stops the HTTP server)")
    stall_at = parse_duration(args.stall_at) if args.stall_at is not None else None
    stall_for = parse_duration(args.stall_for)
    duration, warmup, interval, every = (
        parse_duration(v) for v in (args.duration, args.warmup, args.interval, args.scrape)
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    server: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory() as d:
        what = ["--model", "builtin:noop"]
        if args.http_target:
            sport = free_port()
            server_py = str(Path(__file__).with_name("minimal_server.py"))
            server = subprocess.Popen([sys.executable, server_py, str(sport)], stdout=subprocess.PIPE)
            assert server.stdout is not None
            server.stdout.readline()  # "ready PORT"
            (Path(d) / "samples").mkdir()
            (Path(d) / "samples" / "one.json").write_text('{"x": 1}')
            target = f"http://127.0.0.1:{sport}/ok"
            what = ["--target", target, "--api", "http", "--samples", str(Path(d) / "samples")]
        cmd = [
            sys.executable,
            "-m",
            "soakd",
            "run",
            *what,
            "--rate",
            str(args.rate),
            "--arrival",
            "poisson",
            "--warmup",
            "50",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(Path(d) / "state"),
            "--memory-interval",
            "5s",
        ]
        if args.max_inflight is not None:
            (Path(d) / "soakd.toml").write_text(f"[load]\nmax_inflight = {args.max_inflight}\n")
            cmd += ["--config", str(Path(d) / "soakd.toml")]
        log = open(Path(d) / "soakd.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        t0 = time.monotonic()
        ts: list[float] = []
        rss: list[int] = []
        malloc: list[tuple[float, dict[str, float]]] = []  # (t, figures) after warm-up
        mappings: list[tuple[float, dict[str, int]]] = []  # (t, resident bytes by mapping kind)
        next_scrape = 0.0
        inflight_max = 0.0  # the most requests in flight seen at a scrape
        stall: tuple[float, float] | None = None  # RSS (MiB) before the stall and 30 s after it
        stall_maps: tuple[dict[str, int], dict[str, int]] = ({}, {})
        try:
            while (now := time.monotonic() - t0) < duration:
                if proc.poll() is not None:
                    raise SystemExit(f"soakd exited early:\n{(Path(d) / 'soakd.log').read_text()}")
                ts.append(now)
                rss.append(rss_bytes(proc.pid))
                if server is not None and stall_at is not None and stall is None and now >= stall_at:
                    before, before_maps = rss[-1] / 2**20, rss_by_mapping(proc.pid)
                    server.send_signal(signal.SIGSTOP)
                    time.sleep(stall_for)
                    inflight_max = max(inflight_max, scrape(url, (INFLIGHT,)).get(INFLIGHT, 0.0))
                    server.send_signal(signal.SIGCONT)
                    time.sleep(30)
                    stall = (before, rss_bytes(proc.pid) / 2**20)
                    stall_maps = (before_maps, rss_by_mapping(proc.pid))
                    continue
                if now >= next_scrape:
                    next_scrape = now + every
                    if now >= warmup:
                        mappings.append((now, rss_by_mapping(proc.pid)))
                    try:
                        figures = scrape(url, (*MALLOC, INFLIGHT))
                    except OSError:
                        figures = {}  # not serving yet (model loading)
                    inflight_max = max(inflight_max, figures.pop(INFLIGHT, 0.0))
                    if now >= warmup and len(figures) == len(MALLOC):
                        malloc.append((now, figures))
                time.sleep(interval)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
            log.close()
            if server is not None:
                server.terminate()
                server.wait(10)
        t, r = np.asarray(ts), np.asarray(rss, dtype=np.float64)
        keep = t >= warmup
        if keep.sum() < 3:
            raise SystemExit("run too short for a slope after warm-up")
        mib = r / 2**20
        slope = slope_mib_per_hour(t[keep], mib[keep])
        what_name = "--api http to bench/minimal_server.py" if args.http_target else "builtin:noop"
        mid = (warmup + t[-1]) / 2
        first, second = keep & (t < mid), t >= mid
        print(
            f"{what_name} at {args.rate:g} req/s for {duration:.0f}s, /metrics scraped every {every:g}s "
            f"(exit {rc}): RSS {mib[keep][0]:.1f} MiB after {warmup:.0f}s warm-up, {mib[-1]:.1f} MiB at the "
            f"end, max {mib.max():.1f} MiB"
        )
        print(
            f"slope after warm-up: {slope:+.2f} MiB/h over {(t[-1] - warmup) / 60:.1f} min "
            f"({keep.sum()} reads; goal: within ±1 MiB/h over an hour)"
        )
        print(f"  most requests in flight at a scrape: {inflight_max:.0f}")
        if stall is not None:
            print(
                f"  server stopped {stall_for:g}s at {stall_at:.0f}s: RSS {stall[0]:.1f} -> {stall[1]:.1f} MiB "
                f"30 s after ({stall[1] - stall[0]:+.1f} MiB)"
            )
            for kind in sorted(set(stall_maps[0]) | set(stall_maps[1])):
                delta = (stall_maps[1].get(kind, 0) - stall_maps[0].get(kind, 0)) / 2**20
                if abs(delta) >= 0.1:
                    print(f"    {kind:<14} {delta:+.2f} MiB")
        if first.sum() >= 3 and second.sum() >= 3:
            print(
                f"  first half {slope_mib_per_hour(t[first], mib[first]):+.2f} MiB/h, "
                f"second half {slope_mib_per_hour(t[second], mib[second]):+.2f} MiB/h"
            )
        if len(malloc) >= 3:
            mt = np.asarray([m[0] for m in malloc])
            for name in MALLOC:
                v = np.asarray([m[1][name] for m in malloc]) / 2**20
                print(f"  {name}: {v[0]:.2f} -> {v[-1]:.2f} MiB, slope {slope_mib_per_hour(mt, v):+.2f} MiB/h")
        if len(mappings) >= 3:
            mt = np.asarray([m[0] for m in mappings])
            kinds = sorted({k for _, m in mappings for k in m})
            print("  resident by mapping (after warm-up):")
            for kind in kinds:
                v = np.asarray([m[1].get(kind, 0) for m in mappings], dtype=np.float64) / 2**20
                print(f"    {kind:<14} {v[0]:8.2f} -> {v[-1]:8.2f} MiB, slope {slope_mib_per_hour(mt, v):+.2f} MiB/h")


if __name__ == "__main__":
    main()
