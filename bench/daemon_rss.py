"""The daemon's own memory over a run (issue #6): `soakd run --model builtin:noop --rate 1000`
as a subprocess, its RSS read from /proc every few seconds, and the slope after warm-up.

Goal: flat within 1 MiB/h after warm-up over one hour (``--duration 1h --warmup 10m``). The
default is a shorter run; its slope is noisier (a few MiB/h of allocator settling reads as
creep over minutes), so judge the hour-long figure.

    .venv/bin/python bench/daemon_rss.py [--duration 3m] [--warmup 60s] [--rate 1000]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from soakd.config import parse_duration


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


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
    args = ap.parse_args()
    duration, warmup, interval = (parse_duration(v) for v in (args.duration, args.warmup, args.interval))
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "soakd", "run", "--model", "builtin:noop", "--rate", str(args.rate),
               "--arrival", "poisson", "--warmup", "50", "--metrics-addr", f"127.0.0.1:{free_port()}",
               "--state-dir", str(Path(d) / "state"), "--memory-interval", "5s"]
        log = open(Path(d) / "soakd.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        t0 = time.monotonic()
        ts: list[float] = []
        rss: list[int] = []
        try:
            while (now := time.monotonic() - t0) < duration:
                if proc.poll() is not None:
                    raise SystemExit(f"soakd exited early:\n{(Path(d) / 'soakd.log').read_text()}")
                ts.append(now)
                rss.append(rss_bytes(proc.pid))
                time.sleep(interval)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
            log.close()
        t, r = np.asarray(ts), np.asarray(rss, dtype=np.float64)
        keep = t >= warmup
        if keep.sum() < 3:
            raise SystemExit("run too short for a slope after warm-up")
        slope, _ = np.polyfit(t[keep] / 3600.0, r[keep] / 2**20, 1)
        mib = r / 2**20
        print(f"builtin:noop at {args.rate:g} req/s for {duration:.0f}s (exit {rc}): RSS {mib[keep][0]:.1f} MiB "
              f"after {warmup:.0f}s warm-up, {mib[-1]:.1f} MiB at the end, max {mib.max():.1f} MiB")
        print(f"slope after warm-up: {slope:+.2f} MiB/h over {(t[-1] - warmup) / 60:.1f} min "
              f"({keep.sum()} reads; goal: within ±1 MiB/h over an hour)")


if __name__ == "__main__":
    main()
