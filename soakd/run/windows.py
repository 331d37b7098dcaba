"""The one window tracker: differences of the engine's cumulative stats, read at every status
tick, feed the status line (each tick), the summary's rows (every ``stride`` ticks, bounded by
:class:`soakd.report.window_rows.WindowTable`) and the state store's rows (rolled every
``state.window``, read by the store's writer thread)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from soakd.record import types as record_types  # its WindowRow is a summary row; state's is a stored window
from soakd.report.window_rows import MAX_ROWS, WindowTable
from soakd.state import WindowRow
from soakd.telemetry.histogram import HistSnapshot


class StatsLike(Protocol):
    """What the tracker reads from the engine (``soakd.load.engine.EngineStats``)."""

    elapsed: float
    completed: dict[str, int]
    stages: dict[str, HistSnapshot]


@dataclass(frozen=True)
class Delta:
    """What happened between two reads of the engine."""

    t_end: float  # the later read's elapsed seconds
    seconds: float
    outcomes: dict[str, int]
    stages: dict[str, HistSnapshot]

    @classmethod
    def between(cls, base: StatsLike | None, stats: StatsLike) -> Delta:
        if base is None:
            return cls(stats.elapsed, stats.elapsed, dict(stats.completed), dict(stats.stages))
        return cls(
            stats.elapsed,
            max(0.0, stats.elapsed - base.elapsed),
            {k: v - base.completed.get(k, 0) for k, v in stats.completed.items()},
            {s: h - base.stages[s] if s in base.stages else h for s, h in stats.stages.items()},
        )

    @property
    def rps(self) -> float:
        return self.outcomes.get("ok", 0) / max(1e-9, self.seconds)

    def percentile_ms(self, q: float, stage: str = "e2e") -> float:
        h = self.stages.get(stage)
        return math.nan if h is None else h.percentile(q) * 1e3

    @property
    def errors(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k not in ("ok", "dropped"))

    @property
    def dropped(self) -> int:
        return self.outcomes.get("dropped", 0)


class WindowRecorder:
    """The summary's rows: one row every ``stride`` ticks (the stride doubles each time the
    bounded table merges its rows in pairs)."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.max_rows = max_rows
        self.table: WindowTable | None = None
        self._ticks = 0
        self._base: StatsLike | None = None

    @property
    def stride(self) -> int:
        return 1 << (self.table.merges if self.table is not None else 0)

    @property
    def rows(self) -> list[record_types.WindowRow]:
        return self.table.rows() if self.table is not None else []

    def start(self, stats: StatsLike) -> None:
        """The engine's stats at the start; its stages are the table's columns."""
        self._base = stats
        self.table = WindowTable(list(stats.stages), self.max_rows)

    def add(self, stats: StatsLike) -> None:
        if self._base is None or self.table is None:
            self.start(stats)
            return
        self._ticks += 1
        if self._ticks < self.stride:
            return
        d = Delta.between(self._base, stats)
        self.table.append(d.t_end, d.seconds, d.outcomes, d.stages)
        self._base, self._ticks = stats, 0


class StoreWindow:
    """The state store's open window: the writer thread upserts it at every flush; it rolls over
    every ``length`` seconds. The first non-ok outcome of each kind becomes an event."""

    def __init__(
        self,
        read: Callable[[], StatsLike],
        length: float,
        run_id: str,
        segment: Callable[[], int | None],
        event: Callable[[str, str], None],
    ) -> None:
        self.read = read
        self.length = length
        self.run_id = run_id
        self.segment = segment
        self.event = event
        self._lock = threading.Lock()
        self._t0 = time.time()
        self._base: StatsLike | None = None
        self._seen: set[str] = set()

    def start(self, stats: StatsLike) -> None:
        self._t0, self._base = time.time(), stats

    def row(self) -> tuple[int, str, WindowRow] | None:
        seg = self.segment()
        if seg is None or self._base is None:
            return None
        with self._lock:
            now, stats = time.time(), self.read()
            d = Delta.between(self._base, stats)
            row = WindowRow(t_start=self._t0, t_end=now, outcomes=d.outcomes, hists=d.stages)
            for outcome, n in d.outcomes.items():
                if n and outcome != "ok" and outcome not in self._seen:
                    self._seen.add(outcome)
                    self.event("outcome", f"first {outcome} outcome in segment {seg}")
            if now - self._t0 >= self.length:
                self._t0, self._base = now, stats
        return seg, self.run_id, row


def window_length(configured: float, duration: float | None, flush_interval: float) -> float:
    """Stored windows follow the run's length: a short soak still gets a few dozen points in its
    report (48 for a 90 s demo), a long one keeps the configured length (the store stays small).
    Never shorter than the store's flush, which closes them."""
    if duration is None:
        return configured
    return max(flush_interval, min(configured, duration / 48.0))
