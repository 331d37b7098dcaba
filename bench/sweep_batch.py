"""The seed article's batching table, measured: `soakd sweep` over max batch size 1/4/8/16/32
for builtin:convnet (issue #5). On a GPU at 224x224; on CPU at a smaller input so it finishes.

Prints the sweep table (throughput, p50/p90/p99, mean batch, peak host and GPU memory,
stability, bottleneck), the knee and the recommendation under --slo-p99-ms.

    .venv/bin/python bench/sweep_batch.py [--device auto] [--step-duration 5s] [--slo-p99-ms 50]
"""

from __future__ import annotations

import argparse
import sys

import torch

from soakd.config import load_config
from soakd.run.sweep import sweep_command


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-sizes", default="1,4,8,16,32")
    ap.add_argument("--concurrency", default="2x", help="default 2x: twice each step's max batch size")
    ap.add_argument("--shape", default=None, help="default: 3x224x224 on CUDA, 3x16x16 on CPU")
    ap.add_argument("--step-duration", default="5s", help="fixed time per step; 'stable' waits for stability")
    ap.add_argument("--slo-p99-ms", type=float, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # on a busy small box, 1 avoids OpenMP threads fighting
    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    shape = args.shape or ("3x224x224" if cuda else "3x16x16")
    cfg = load_config(
        None,
        {
            "model.spec": "builtin:convnet",
            "model.device": args.device,
            "input.shapes": shape,
            "model.warmup": 50,
            "batcher.max_queue_delay_ms": 5.0,
        },
    )
    ns = argparse.Namespace(
        sweep_concurrency=args.concurrency,
        sweep_rate=None,
        sweep_max_batch_size=args.batch_sizes,
        step_duration=None if args.step_duration == "stable" else args.step_duration,
        slo_p99_ms=args.slo_p99_ms,
        json_out=args.json,
        stability_tolerance=10.0,
        sweep_window="2s",
        min_step="10s",
        max_step="60s",
    )
    where = f"{'cuda' if cuda else 'cpu'} ({torch.get_num_threads()} CPU threads)"
    print(
        f"builtin:convnet {shape} on {where}, closed loop "
        f"concurrency {ns.sweep_concurrency}, max batch size {args.batch_sizes}",
        flush=True,
    )
    return sweep_command(cfg, ns)


if __name__ == "__main__":
    sys.exit(main())
