"""The bounds of a config's numbers. Each follows from the machine or the protocol, and says so
in its error (:mod:`soakd.config.validate`; the host's own bounds: :mod:`soakd.host_limits`)."""

from __future__ import annotations

MAX_INT = 2**63 - 1  # the database and numpy hold 64-bit integers

# Open-loop arrivals are stamped one at a time by one thread, about 1 µs each (200,000/s
# measured with a flat RSS); above one per microsecond the sender can never catch up, and the
# schedule's lag (and its memory) grows without bound.
MAX_RATE = 1_000_000.0
# Gamma gaps have shape 1/burstiness. At burstiness 100 (shape 0.01) one gap in 2,000 underflows
# to exactly 0 in float64; at 1000, half of them do: arrivals in unbounded bursts at one instant.
MAX_BURSTINESS = 100.0
# A shard of --shard I/N draws every arrival of the soak's one process (vectorised) and keeps one
# in N: past 4096 shards it would draw thousands of gaps per request it sends.
MAX_SHARDS = 4096
# --workers: driver processes on one host, each about one core busy at its limit; past 64 a
# host's cores run out long before the parent's scrape of every worker each flush does.
MAX_WORKERS = 64
REQUEST_BYTES = 512  # one request in flight: its record (slots), timings and queue entries
TENSOR_OVERHEAD_BYTES = 1024  # a pooled tensor's Python and torch objects, beside its data
RING_SERIES = 32  # memory series soakd keeps a ring for (its own, the GPU's, scraped gauges)
RING_SAMPLE_BYTES = 16  # one (unix time, value) pair of float64
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
TOKEN_BYTES = 8  # token ids are int64
MIN_TIMER = 0.001  # seconds: finer timers than this are below what a thread's wake-up can keep
MIN_FLUSH_INTERVAL = 0.1  # seconds: each state flush is one SQLite transaction
MIN_MEMORY_INTERVAL = 0.1  # seconds: one round of every memory collector takes milliseconds
MAX_RESAMPLES = 1_000_000  # bootstrap resamples: past 10^6 a 95% interval's third digit holds still
MODEL_THREADS_PER_CPU = 4  # model threads beyond this per core only queue for the cores and the GIL


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
