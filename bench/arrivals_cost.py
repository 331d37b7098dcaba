"""The arrivals thread's CPU per arrival: the same schedule as ``--rate R --arrival constant`` and as
a Mooncake trace of rows 1/R apart (issue #33: replay's overhead against ``--rate``).

Each side runs in its own process, the order alternating round by round, against a sender that
does no work, so the figure is the arrivals thread's own (``time.thread_time`` over the soak)
and not the host's noise in completing requests, which moves ``bench/replay_rss.py
--ceiling-rate`` by a third from run to run. Two modes:

- ``drop``: the sender is always at ``max_inflight``: every arrival is counted and dropped (a
  replay far past what the host completes);
- ``send``: nothing is in flight: every arrival is made into a request (``--rate`` draws its
  token sequence from the run's ``seq:`` source, the replay sizes it from the row).

As in a soak, the heap is frozen first (soakd/run/heap.py).

    .venv/bin/python bench/arrivals_cost.py [--rate 250000] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPEC = "seq:fixed(n=64)"


class Sender:
    """What the arrivals thread sees of the engine: full (every arrival dropped) or empty."""

    def __init__(self, full: bool, make: Any) -> None:
        from soakd.request import Request

        self._request = Request
        self.clock = time.perf_counter
        self.started_at = self.last_completion = self.clock()
        self.inflight = 10**9 if full else 0
        self._make = make
        self.arrivals = self.sent = 0

    def make(self, intended: float, now: float) -> Any:
        """As ``Engine.make``: the run's next input, as a request."""
        key, tensor = self._make()
        return self._request(intended, now, key, tensor)

    def send(self, reqs: list[Any]) -> None:
        self.sent += len(reqs)

    def observe_lag(self, lags: list[float], dropped: int) -> None:
        self.arrivals += len(lags)

    def reject(self, n: int) -> None:
        pass


def child(kind: str, mode: str, rate: float, seconds: float, trace: str) -> None:
    from soakd.config import LoadConfig
    from soakd.load.executors import ArrivalsThread, OpenLoop
    from soakd.load.replay import ReplayLoop
    from soakd.specs import parse_seq_spec
    from soakd.workload.replay import ReplaySource, TokenSizer
    from soakd.workload.seqlen import SeqLenSource
    from soakd.workload.traces import Trace, scan

    loop: ArrivalsThread
    cap = 4 if mode == "drop" else 10**9  # send: every arrival made into a request, none dropped
    if kind == "rate":
        loop = OpenLoop(LoadConfig(rate=rate, arrival="constant", max_inflight=cap))
    else:
        tr = Trace(trace)
        info = scan(tr)
        sizer = TokenSizer(parse_seq_spec(SPEC), pad=False, seed=0)
        loop = ReplayLoop(
            LoadConfig(replay=trace, max_inflight=cap), ReplaySource(tr, info, sizer=sizer, base=None, describe="")
        )
    engine = Sender(mode == "drop", SeqLenSource(SPEC).next)
    cpu: list[float] = []
    run = loop._run

    def timed(eng: Any) -> None:
        start = time.thread_time()
        try:
            run(eng)
        finally:
            cpu.append(time.thread_time() - start)

    setattr(loop, "_run", timed)  # noqa: B010 (the thread's own CPU, measured on it)
    gc.collect()
    gc.freeze()
    loop.start(engine)
    time.sleep(seconds)
    loop.stop()
    while not cpu:
        time.sleep(0.01)
    print(json.dumps({"arrivals": engine.arrivals, "sent": engine.sent, "cpu_s": cpu[0]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=250_000.0, help="arrivals per second (default 250000)")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", nargs=3, metavar=("KIND", "MODE", "TRACE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.rate, args.seconds, args.child[2])
        return
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        with trace.open("w") as fh:
            for i in range(int(args.rate * args.seconds * 1.2)):
                fh.write(
                    f'{{"timestamp": {i * 1000.0 / args.rate:.4f}, "input_length": {32 + i % 96}, '
                    f'"output_length": 1, "hash_ids": [{i // 4}, {i}]}}\n'
                )
        for mode in ("drop", "send"):
            us: dict[str, list[float]] = {"rate": [], "replay": []}
            for k in range(args.rounds):
                for kind in ("rate", "replay") if k % 2 == 0 else ("replay", "rate"):
                    cmd = [sys.executable, __file__, "--rate", str(args.rate), "--seconds", str(args.seconds),
                           "--child", kind, mode, str(trace)]  # fmt: skip
                    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
                    us[kind].append(got["cpu_s"] / max(got["arrivals"], 1) * 1e6)
                    print(f"{mode} round {k + 1} {kind:6s}: {got['arrivals']} arrivals, {got['sent']} sent, "
                          f"{us[kind][-1]:.2f} us of the arrivals thread's CPU each", flush=True)  # fmt: skip
            med = {kind: statistics.median(v) for kind, v in us.items()}
            print(f"{mode}: median us per arrival: rate {med['rate']:.2f}, replay {med['replay']:.2f}; "
                  f"replay/rate {med['replay'] / med['rate']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
