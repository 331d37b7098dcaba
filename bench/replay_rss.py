"""Trace replay's memory against the trace's length (issue #33): the file is streamed, so a
trace of millions of rows must cost soakd no more than a short one.

Writes two synthetic Mooncake traces (``--long`` rows and ``--short`` rows, ``--gap-ms`` apart,
hash_ids shared in runs of four), then runs ``soakd run --model builtin:noop --input-shapes
seq:fixed(n=64) --replay TRACE --replay-speed S`` on each for ``--seconds`` of soak (the short
one with ``--replay-loop``), as subprocesses one after the other. Per run it prints soakd's peak
RSS (VmHWM) and its RSS at the end, the rows sent, the achieved against the intended arrival
rate and the schedule lag; then the ratio of the two peaks. The scan before the soak (sha256,
rows, span, a step back in time) is part of what is measured: it reads the whole file once.

    .venv/bin/python bench/replay_rss.py [--long 2000000] [--short 1000] [--gap-ms 1] [--speed 2]
        [--seconds 20] [--ceiling-rate 50000] [--rounds 3]

``--ceiling-rate R`` first runs the same schedule as ``--rate R --arrival constant`` and as a
trace of rows 1/R apart, every row 64 tokens as ``seq:fixed(n=64)`` draws for ``--rate`` (the
same requests), R past what the host completes, and prints the ratio of their completed rates
(the replay's overhead; goal: within 5%). The host's noise moves each side by a third from run
to run: take the median of many pairs, and ``bench/arrivals_cost.py`` for the arrivals thread's
own CPU per arrival.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def write_trace(path: Path, rows: int, gap_ms: float, input_length: int | None = None) -> None:
    """Mooncake rows ``gap_ms`` apart: input lengths 32-127 (clipped to the spec's 64), or all
    ``input_length``."""
    with open(path, "w") as fh:
        for i in range(rows):
            n_in = 32 + i % 96 if input_length is None else input_length
            fh.write(
                f'{{"timestamp": {i * gap_ms:.3f}, "input_length": {n_in}, "output_length": {1 + i % 16}, '
                f'"hash_ids": [{i // 4}, {i}]}}\n'
            )


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def soak(trace: Path, args: argparse.Namespace, loop: bool, work: Path) -> dict[str, float]:
    load = ["--replay", str(trace), "--replay-speed", str(args.speed)] + (["--replay-loop"] if loop else [])
    r, s = run_noop(load, args.seconds, work, trace.stem)
    rep = s["replay"]
    return {
        **r,
        "rows_sent": rep["rows_sent"],
        "rows_dropped": rep["rows_dropped"],
        "achieved_over_intended": rep["offered_rps"] / rep["intended_rps"],
        "lag_p99_ms": s["schedule_lag_ms"]["p99"],
        "on_time_ratio": rep["on_time_ratio"],
    }


def run_noop(load: list[str], seconds: float, work: Path, name: str) -> tuple[dict[str, float], dict[str, Any]]:
    """``soakd run --model builtin:noop`` with ``load`` flags: its peak and final RSS, its summary."""
    summary = work / f"summary-{name}.json"
    cmd = [
        sys.executable, "-m", "soakd", "run", "--model", "builtin:noop", "--input-shapes", "seq:fixed(n=64)",
        *load, "--duration", f"{seconds}s", "--warmup", "5", "--summary-json", str(summary),
        "--state-dir", str(work / f"state-{name}"), "--metrics-addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = last = 0
    while proc.poll() is None:
        try:
            peak = max(peak, status_kib(proc.pid, "VmHWM"))
            last = status_kib(proc.pid, "VmRSS")
        except (OSError, RuntimeError):  # the process is ending
            break
        time.sleep(0.2)
    _, err = proc.communicate()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"soakd exited {proc.returncode}:\n{err[-3000:]}")
    s = json.loads(summary.read_text())
    return {"peak_mib": peak / 1024, "end_mib": last / 1024, "wall_s": time.monotonic() - t0}, s


def ceiling(args: argparse.Namespace, work: Path) -> None:
    """The same schedule as ``--rate R --arrival constant`` and as a trace of rows 1/R apart, R
    past what the host completes: the completed rate of each (the replay's overhead: their ratio).
    ``--rounds`` pairs, the order alternating (rate first, then replay first), each run its own
    process; the median of each side and of the pairs' ratios."""
    rate = args.ceiling_rate
    trace = work / "ceiling.jsonl"
    # Every row 64 tokens, as `seq:fixed(n=64)` draws for --rate: the same requests, one batch key,
    # so the two differ in where their arrivals come from and nothing else.
    write_trace(trace, int(rate * args.seconds * 1.5), 1000.0 / rate, input_length=64)
    loads = {"rate": ["--rate", str(rate), "--arrival", "constant"], "replay": ["--replay", str(trace)]}
    got: dict[str, list[float]] = {"rate": [], "replay": []}
    ratios = []
    for k in range(args.rounds):
        order = ("rate", "replay") if k % 2 == 0 else ("replay", "rate")
        pair = {}
        for name in order:
            _, s = run_noop(loads[name], args.seconds, work, f"ceiling-{name}-{k}")
            pair[name] = s["throughput_rps"]
            got[name].append(pair[name])
        ratios.append(pair["replay"] / pair["rate"])
        print(
            f"ceiling round {k + 1} ({order[0]} first): rate {pair['rate']:9.1f}, replay {pair['replay']:9.1f} "
            f"req/s completed of {rate:g} offered; replay/rate {ratios[-1]:.3f}",
            flush=True,
        )
    med = {name: statistics.median(v) for name, v in got.items()}
    print(
        f"ceiling medians: rate {med['rate']:.1f}, replay {med['replay']:.1f} req/s; replay/rate median of "
        f"pairs {statistics.median(ratios):.3f} (goal: within 5% of 1)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--long", type=int, default=2_000_000)
    p.add_argument("--short", type=int, default=1000)
    p.add_argument("--gap-ms", type=float, default=1.0)
    p.add_argument("--speed", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--ceiling-rate", type=float, default=0.0, help="also compare ceilings at this rate (req/s)")
    p.add_argument("--rounds", type=int, default=3, help="ceiling pairs, in alternating order")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.ceiling_rate:
            ceiling(args, work)
        results = {}
        for name, rows in (("short", args.short), ("long", args.long)):
            trace = work / f"{name}.jsonl"
            write_trace(trace, rows, args.gap_ms)
            size = trace.stat().st_size / 2**20
            r = soak(trace, args, loop=name == "short", work=work)
            results[name] = r
            print(
                f"{name:5s} {rows:>9d} rows ({size:7.1f} MiB): peak RSS {r['peak_mib']:7.1f} MiB, at end "
                f"{r['end_mib']:7.1f} MiB; {r['rows_sent']:.0f} sent, {r['rows_dropped']:.0f} dropped; achieved/"
                f"intended {r['achieved_over_intended']:.4f}; lag p99 {r['lag_p99_ms']:.3f} ms; on time "
                f"{r['on_time_ratio']:.3f}; {r['wall_s']:.1f}s wall",
                flush=True,
            )
        ratio = results["long"]["peak_mib"] / results["short"]["peak_mib"]
        print(f"peak RSS long/short: {ratio:.3f} (goal: 1.0, the trace streamed)")


if __name__ == "__main__":
    main()
