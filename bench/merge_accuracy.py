"""Merged percentiles against the percentiles of every raw latency (issue #38's merge bench).

``python -m bench.merge_accuracy [--workers 2,3] [--rate 600] [--seconds 10] [--rounds 2]`` runs
``soakd run --api http --workers N --record-requests`` against bench/minimal_server.py (one
process per run). Each worker logs every request with its e2e latency; the bench takes the exact
percentiles of all of them (nearest rank) and prints, per run and quantile:

- merged/raw: the merged summary's percentile over the raw one. The histograms add bucket by
  bucket, so this is the bucket's rounding alone: within one bucket (2% wide, reported at its
  middle) is the goal;
- mean-of-workers/raw: what averaging each driver's own percentile (as some load tools do) would
  have printed instead.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.replay_rss import free_port

BUCKET = 1.02  # soakd/telemetry/histogram.py: BUCKET_GROWTH
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}  # the summary's keys


def exact(values: list[float], q: float) -> float:
    return values[max(1, math.ceil(q * len(values))) - 1]


def one_run(url: str, workers: int, rate: float, seconds: float, work: Path) -> dict[str, list[float]]:
    """merged/raw and mean-of-workers/raw for each quantile of one ``--workers`` soak."""
    (work / "bodies").mkdir(parents=True)
    (work / "bodies" / "a.json").write_text('{"x": 1}')
    log, summary = work / "requests.jsonl", work / "summary.json"
    cmd = [
        sys.executable, "-m", "soakd", "run", "--target", url, "--api", "http", "--samples", str(work / "bodies"),
        "--rate", str(rate), "--workers", str(workers), "--duration", f"{seconds}s", "--warmup", "5",
        "--record-requests", str(log), "--summary-json", str(summary), "--state-dir", str(work / "state"),
        "--metrics-addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode not in (0, 1):
        raise SystemExit(f"soakd exited {done.returncode}:\n{done.stderr[-3000:]}")
    merged = json.loads(summary.read_text())
    raw: list[float] = []
    parts = []
    for i, w in enumerate(merged["workers"]):
        rows = [json.loads(line) for line in log.with_name(f"requests.worker-{i}.jsonl").read_text().splitlines()[1:]]
        raw += [r["e2e_ms"] for r in rows if "e2e_ms" in r]
        parts.append(json.loads(Path(w["state_dir"], "summary.json").read_text())["latency_ms"]["e2e"])
    raw.sort()
    if len(raw) != merged["latency_ms"]["e2e"]["count"]:
        raise SystemExit(f"{len(raw)} latencies logged, {merged['latency_ms']['e2e']['count']} in the histograms")
    out: dict[str, list[float]] = {}
    for key, q in QUANTILES.items():
        truth = exact(raw, q)
        mean_of = sum(p[key] for p in parts) / len(parts)
        out[key] = [merged["latency_ms"]["e2e"][key] / truth, mean_of / truth, truth, float(len(raw))]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="2,3", help="comma-separated worker counts")
    p.add_argument("--rate", type=float, default=600.0, help="the soak's rate (req/s), split over the workers")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("minimal_server.py")), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    worst = 0.0
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("ready")
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.rounds):
                for n in (int(x) for x in args.workers.split(",")):
                    res = one_run(f"http://127.0.0.1:{port}/", n, args.rate, args.seconds, Path(tmp, f"r{k}-w{n}"))
                    for key, (merged, mean_of, truth, count) in res.items():
                        buckets = abs(math.log(merged)) / math.log(BUCKET)
                        worst = max(worst, buckets)
                        print(
                            f"round {k + 1} workers {n} {key:>6}: raw {truth:8.3f} ms of {count:.0f}; merged/raw "
                            f"{merged:.4f} ({buckets:.2f} buckets); mean of workers' {key}/raw {mean_of:.4f}",
                            flush=True,
                        )
    finally:
        server.kill()
    print(f"worst merged/raw: {worst:.2f} buckets (goal: within 1; a bucket is {BUCKET - 1:.0%} wide)")


if __name__ == "__main__":
    main()
