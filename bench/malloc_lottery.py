"""How much of a CPU model's rate glibc's heap trimming decides, with soakd nowhere in sight (#13).

The model's own offline loop (bench/limit.py's: a thread of its own, one input reused), each
round its own process pinned to one CPU with OMP_NUM_THREADS=1, in variants that differ in
allocations the model never sees:

  offline         the loop as bench/limit.py runs it
  main allocs     the same, after 8 small tensor views were made on the *main* thread before the
                  model thread started (about 0.5 KB of glibc malloc each, never touched again)
  view per call   the same loop handing the model a new view of its input each call, as soakd did
                  at batch 1 before its batch-of-one views were made once (a ~0.5 KB malloc per
                  call on the model thread)

A model whose activations are megabytes (the builtin convnet at batch 1: two 12.8 MB blocks a
call) sits on a knife edge in a thread's glibc arena: whether the heap's top is trimmed
(``madvise(MADV_DONTNEED)``) after each call, and faulted in again on the next, depends on where
small allocations happen to lie. If the rows differ, the offline loop's figure is the allocator's,
and soakd/offline on that model (bench/limit.py) measures the allocator, not soakd.
``--steady-malloc`` sets soakd.allocator.GLIBC_KEEP_BLOCKS in every process: then the rows agree.

    PYTHONPATH=. .venv/bin/python bench/malloc_lottery.py [--rounds 5] [--seconds 3] [--steady-malloc]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.limit import env, on_thread, pinned
from soakd.allocator import GLIBC_KEEP_BLOCKS

VARIANTS = ("offline", "main allocs", "view per call")
WARMUP = 20


def child(spec: str, shape: tuple[int, ...], variant: str, seconds: float) -> dict[str, float]:
    import torch

    from soakd.models.loader import load_model

    model = load_model(spec, "cpu")
    x = torch.randn(1, *shape)
    row = x[0]
    kept = [row.unsqueeze(0) for _ in range(8)] if variant == "main allocs" else []  # held to the end

    def loop() -> dict[str, float]:
        with torch.inference_mode():
            for _ in range(WARMUP):
                model.fn(x)
            before = resource.getrusage(resource.RUSAGE_SELF)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                model.fn(row.unsqueeze(0) if variant == "view per call" else x)
                n += 1
            elapsed = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_SELF)
        user, kernel = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        return {
            "rps": n / elapsed,
            "faults_per_call": (after.ru_minflt - before.ru_minflt) / n,
            "kernel_share": kernel / (user + kernel) if user + kernel > 0 else 0.0,
        }

    result = on_thread(loop)
    result["main_allocs"] = len(kept)
    return result


def run(spec: str, shape: str, variant: str, seconds: float, cpu: int, extra: dict[str, str]) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", spec, shape, variant, str(seconds)]
    out = subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        text=True,
        env=env(OMP_NUM_THREADS="1", **extra),
        preexec_fn=pinned(frozenset({cpu})),
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:convnet")
    ap.add_argument("--shape", default="3x224x224")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each runs every variant once, in turn")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per process")
    ap.add_argument("--cpu", type=int, default=None, help="the CPU every process is pinned to (default: the last)")
    ap.add_argument("--steady-malloc", action="store_true", help="glibc keeping freed blocks, in every process")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec, shape, variant, seconds = args.child
        print(json.dumps(child(spec, tuple(int(d) for d in shape.split("x")), variant, float(seconds))))
        return 0

    cpu = max(os.sched_getaffinity(0)) if args.cpu is None else args.cpu
    extra = dict(GLIBC_KEEP_BLOCKS) if args.steady_malloc else {}
    malloc = " ".join(f"{k}={v}" for k, v in extra.items()) or "glibc defaults"
    print(f"{args.model} at batch 1, {args.shape}, one process per figure on CPU {cpu}, OMP_NUM_THREADS=1, {malloc}")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            results[variant].append(run(args.model, args.shape, variant, args.seconds, cpu, extra))
    base = statistics.median(r["rps"] for r in results["offline"])
    print(f"  {'variant':<14} {'req/s':>8} {'/offline':>9} {'faults/call':>12} {'kernel':>7}  rounds (req/s)")
    for variant, rows in results.items():
        rps = statistics.median(r["rps"] for r in rows)
        faults = statistics.median(r["faults_per_call"] for r in rows)
        kernel = statistics.median(r["kernel_share"] for r in rows)
        rounds = ", ".join(f"{r['rps']:.0f}" for r in rows)
        print(f"  {variant:<14} {rps:8.1f} {rps / base:9.3f} {faults:12,.0f} {100 * kernel:6.0f}%  {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
