"""Events counted per minute of a soak in bounded memory: the replay report's plot of the trace's
arrivals per minute beside the achieved ones (docs/replay.md).

A day at one minute a bucket is 1,440 numbers; past :data:`MAX_BUCKETS` neighbouring buckets
merge and the width doubles (two minutes, four...), so a soak of any length holds at most that
many numbers per series.
"""

from __future__ import annotations

BUCKET_SECONDS = 60.0
MAX_BUCKETS = 2880  # two days at one minute a bucket; longer soaks get wider buckets


class MinuteCounts:
    """Counts per bucket of ``width`` seconds from the soak's start. One thread writes
    (:meth:`add`); any thread may read a consistent copy (:meth:`snapshot`)."""

    def __init__(self, width: float = BUCKET_SECONDS, cap: int = MAX_BUCKETS) -> None:
        if width <= 0 or cap < 2:
            raise ValueError(f"a bucket width > 0 and at least 2 buckets, got {width}, {cap}")
        self.width = width
        self.cap = cap
        self._inv = 1.0 / width
        self.counts: list[int] = []

    def add(self, seconds: float, n: int = 1) -> None:
        """``n`` events at ``seconds`` from the start (earlier than the start: the first bucket)."""
        i = int(seconds * self._inv) if seconds > 0 else 0
        counts = self.counts
        if i >= len(counts):
            while i >= self.cap:
                self._coarsen()
                i = int(seconds * self._inv)
            counts = self.counts
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += n

    def _coarsen(self) -> None:
        """Merge neighbouring buckets: half as many, twice as wide (counts first, then width,
        which is the order :meth:`snapshot` checks)."""
        old = self.counts
        self.counts = [sum(old[k : k + 2]) for k in range(0, len(old), 2)]
        self.width *= 2
        self._inv = 1.0 / self.width

    def snapshot(self) -> tuple[float, list[int]]:
        """(bucket width in seconds, the counts): read while the writer may merge buckets."""
        while True:
            width = self.width
            counts = list(self.counts)
            if self.width == width:
                return width, counts

    @property
    def per_second(self) -> float:
        """Buckets per second: ``int(seconds * per_second)`` is a time's bucket (for now)."""
        return self._inv

    @property
    def total(self) -> int:
        return sum(self.counts)


def rebin(width: float, counts: list[int], to: float) -> list[int]:
    """Counts of ``width``-second buckets as buckets of ``to`` seconds (a multiple of it)."""
    k = max(1, round(to / width))
    if k == 1:
        return list(counts)
    return [sum(counts[i : i + k]) for i in range(0, len(counts), k)]


def aligned(series: dict[str, MinuteCounts]) -> dict[str, object]:
    """The series on one bucket width (the widest) and one length: the summary's
    ``replay.arrivals`` block (``bucket_seconds`` and a list of counts per name)."""
    snaps = {name: s.snapshot() for name, s in series.items()}
    width = max((w for w, _ in snaps.values()), default=BUCKET_SECONDS)
    out = {name: rebin(w, c, width) for name, (w, c) in snaps.items()}
    n = max((len(c) for c in out.values()), default=0)
    block: dict[str, object] = {"bucket_seconds": width}
    for name, c in out.items():
        block[name] = c + [0] * (n - len(c))
    return block
