"""Trace replay as an executor: an open loop whose intended send times come from a trace file.

Each row's intended time is its offset from the trace's first row divided by the speed,
anchored to the soak's start (never to the previous send): falling behind shows as schedule
lag and, past ``load.max_inflight``, as drops, never as a quietly lower rate. The rows are read
from the file as they come due (:class:`soakd.workload.traces.Trace`), so memory does not grow
with the trace. ``load.replay_loop`` wraps it: each pass starts one span plus one mean gap
after the one before; without it the executor is ``exhausted`` at the trace's end and the run
ends there (docs/replay.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from soakd.config import LoadConfig
from soakd.errors import ConfigError
from soakd.load.executors import ArrivalsThread, Sender
from soakd.load.minutes import MinuteCounts, aligned
from soakd.request import Request
from soakd.workload.traces import Row, RowCounts, Trace, TraceInfo

log = logging.getLogger("soakd")

ON_TIME_S = 0.001  # the summary's on-time share: sent within this of the intended time


@runtime_checkable
class RowSource(Protocol):
    """The request source of a replay: the trace, and a payload made to each row's size."""

    trace: Trace
    info: TraceInfo

    def for_row(self, row: Row) -> tuple[Any, Any]: ...


class ReplayLoop(ArrivalsThread):
    """The executor of ``--replay``: one ``soakd-arrivals`` thread streams the rows and sends
    each at its intended time."""

    def __init__(self, ld: LoadConfig, source: RowSource) -> None:
        super().__init__()
        self.ld = ld
        self.source = source
        self._speed = float(ld.replay_speed)
        self.exhausted = False  # the trace ended (no --replay-loop): the run ends with it
        self.sent = 0
        self.dropped = 0
        self.on_time = 0  # arrivals whose send came within ON_TIME_S of the intended time
        self.passes = 0  # passes begun
        self.counts = RowCounts()  # bad and skipped rows met while replaying, every pass summed
        self._bad_counted = self._bad_logged = 0  # bad rows counted as bad_input, bad lines logged
        # The report's plot: rows due per minute (sent or dropped), sent, and completed (any outcome).
        self.per_minute = {"intended": MinuteCounts(), "sent": MinuteCounts(), "completed": MinuteCounts()}

    @property
    def target_load(self) -> float:
        return self._speed

    def set_load(self, value: float) -> None:
        """The speed (a ramp or probe scales it): rows from the next one on are spaced by it."""
        if value <= 0:
            raise ValueError(f"replay speed must be > 0, got {value}")
        self._speed = float(value)

    def replace(self, engine: Sender, finished: int) -> None:
        """Under the engine's completion lock: the completions per minute (one writer at a time)."""
        self.per_minute["completed"].add(engine.last_completion - engine.started_at, finished)

    # ------------------------------------------------------------------ the arrivals thread

    def _offsets(self) -> Iterator[tuple[float, Row]]:
        """(seconds on the trace's clock from its first row, passes wrapped, the row)."""
        info = self.source.info
        period = info.span_seconds + info.mean_gap
        while not self._stop.is_set():
            base = self.passes * period - info.first_t
            self.passes += 1
            for row in self.source.trace.rows(self.counts):
                yield base + row.t, row
            if not self.ld.replay_loop:
                return

    def _run(self, engine: Sender) -> None:
        try:
            self._arrivals(engine)
        except (ConfigError, OSError) as exc:  # the file changed under the soak: end the trace, say why
            log.error("load.replay: the trace ended early: %s", exc)
        finally:
            self.exhausted = True

    def _arrivals(self, engine: Sender) -> None:
        rows = self._offsets()
        clock, stop, cap = engine.clock, self._stop, self.ld.max_inflight
        make = self.source.for_row
        speed = self._speed
        anchor_wall, anchor_x = engine.started_at, 0.0  # re-anchored when the speed changes
        t0, intended, sent = engine.started_at, self.per_minute["intended"].add, self.per_minute["sent"].add
        lags: list[float] = []
        dropped = 0
        last_flush = clock()
        pending = next(rows, None)
        while pending is not None and not stop.is_set():
            x, row = pending
            if self._speed != speed:  # the schedule stays continuous at the next row's time
                anchor_wall, anchor_x = anchor_wall + (x - anchor_x) / speed, x
                speed = self._speed
            next_t = anchor_wall + (x - anchor_x) / speed
            now = clock()
            if next_t > now:
                wait = next_t - now
                time.sleep(wait if wait < 0.05 else 0.05)
                continue
            due: list[Request] = []
            inflight = engine.inflight
            while pending is not None and next_t <= now:
                lag = now - next_t
                lags.append(lag)
                intended(next_t - t0)
                if lag <= ON_TIME_S:
                    self.on_time += 1
                if inflight + len(due) >= cap:
                    dropped += 1
                else:
                    key, payload = make(row)
                    due.append(Request(next_t, now, key, payload))
                pending = next(rows, None)
                if pending is not None:
                    x, row = pending
                    next_t = anchor_wall + (x - anchor_x) / speed
            if due:
                self.sent += len(due)
                sent(now - t0, len(due))
                engine.send(due)
            if len(lags) >= 256 or now - last_flush > 0.1:
                self.dropped += dropped
                engine.observe_lag(lags, dropped)
                lags, dropped = [], 0
                last_flush = now
                self._count_bad(engine)
        self.dropped += dropped
        engine.observe_lag(lags, dropped)
        self._count_bad(engine)
        if pending is None:
            log.info("load.replay: the trace ended after %d pass%s", self.passes, "es" if self.passes > 1 else "")

    def _count_bad(self, engine: Sender) -> None:
        """Bad rows met since the last call: each a ``bad_input`` outcome; a line the scan before
        the soak did not name (the file changed under it) is logged with its number."""
        counts = self.counts
        if counts.bad == self._bad_counted:
            return
        engine.reject(counts.bad - self._bad_counted)
        self._bad_counted = counts.bad
        for line in counts.bad_lines[self._bad_logged :]:
            if line not in self.source.info.bad_lines:
                log.warning("load.replay: %s: %s (counted as bad_input)", self.source.info.path, line)
        self._bad_logged = len(counts.bad_lines)

    # ------------------------------------------------------------------ the summary

    def summary(self, elapsed: float) -> dict[str, Any]:
        """The summary's ``replay`` block: the trace's fingerprint and how it was replayed."""
        info = self.source.info
        arrivals = self.sent + self.dropped
        intended_rps = (info.rows / (info.span_seconds + info.mean_gap)) * self._speed
        return {
            **info.fingerprint(),
            "speed": self._speed,
            "loop": self.ld.replay_loop,
            "passes": self.passes,
            "rows_sent": self.sent,
            "rows_dropped": self.dropped,
            "rows_skipped": info.skipped,
            "rows_bad": info.bad,
            "bad_lines": list(info.bad_lines),
            "rows_bad_met": self.counts.bad,
            "on_time_ratio": round(self.on_time / arrivals, 6) if arrivals else None,
            "intended_rps": round(intended_rps, 3),
            "offered_rps": round(arrivals / elapsed, 3) if elapsed > 0 else None,
            "arrivals": aligned(self.per_minute),
        }


def replay_executor(ld: LoadConfig, source: object) -> ReplayLoop:
    """The executor of ``load.replay``: the request source must hold the trace (``--replay``
    builds a :class:`~soakd.workload.replay.ReplaySource`)."""
    if not isinstance(source, RowSource):
        raise ConfigError("load.replay: this command cannot replay a trace (its request source holds none)")
    return ReplayLoop(ld, source)
