"""Trace replay as an executor: an open loop whose intended send times come from a trace file.

Each row's intended time is its offset from the trace's first row divided by the speed,
anchored to the soak's start (never to the previous send): falling behind shows as schedule
lag and, past ``load.max_inflight``, as drops, never as a quietly lower rate. The rows' times
come from the index the scan wrote (:mod:`soakd.workload.trace_index`), a chunk at a time, so
memory does not grow with the trace; a row's text is read only when it is sent, so a dropped row
costs what an arrival of ``--rate`` costs. ``load.replay_loop`` wraps it: each pass starts one span plus one mean gap
after the one before; without it the executor is ``exhausted`` at the trace's end and the run
ends there (docs/replay.md).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from soakd.config import LoadConfig
from soakd.errors import ConfigError
from soakd.load.executors import ArrivalsThread, Sender
from soakd.load.minutes import MinuteCounts, aligned
from soakd.request import Request
from soakd.workload.trace_index import BAD_LINE, RECORD, Records, RowReader
from soakd.workload.traces import Row, RowCounts, Trace, TraceInfo

log = logging.getLogger("soakd")

ON_TIME_S = 0.001  # the summary's on-time share: sent within this of the intended time


@runtime_checkable
class RowSource(Protocol):
    """The request source of a replay: the trace, and a payload made to each row's size."""

    trace: Trace
    info: TraceInfo

    @property
    def by_length(self) -> Callable[[int | None], tuple[Any, Any]] | None: ...

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
        # The arrivals thread's own: the schedule's anchor and speed, lags and drops not yet flushed.
        self._anchor = (0.0, 0.0)
        self._speed_now = self._speed
        self._lags: list[float] = []
        self._times: list[float] = []  # intended times (engine clock) of the arrivals since the last flush
        self._cap = ld.max_inflight
        self._dropped = 0
        self._last_flush = 0.0
        self._chunk: Records = np.empty(0, dtype=RECORD)
        self._inputs: list[int] | None = None  # the chunk's input tokens as a list, made once it sends
        self._by_length: Callable[[int | None], tuple[Any, Any]] | None = None  # the source's, read once a soak

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

    def _passes(self) -> Iterator[tuple[npt.NDArray[np.float64], Records]]:
        """The index's records, a chunk at a time, each with its rows' times on the trace's clock
        from its first row, passes wrapped (bad rows before the first row at minus infinity)."""
        info, trace = self.source.info, self.source.trace
        if trace.index is None:
            raise ConfigError(f"load.replay: {info.path}: the trace was not scanned before the soak")
        period = info.span_seconds + info.mean_gap
        while not self._stop.is_set():
            base = self.passes * period - info.first_t
            self.passes += 1
            for records in trace.index.chunks(trace.shard):
                yield records["t"] + base, records
            if not self.ld.replay_loop:
                return

    def _run(self, engine: Sender) -> None:
        try:
            with RowReader(self.source.trace) as reader:
                self._arrivals(engine, reader)
        except (ConfigError, OSError) as exc:  # the file changed under the soak: end the trace, say why
            log.error("load.replay: the trace ended early: %s", exc)
        finally:
            self.exhausted = True

    def _arrivals(self, engine: Sender, reader: RowReader) -> None:
        """Each chunk's rows as they come due, walked as plain floats: rows come due one or two at
        a time while the replay keeps up, and a numpy call costs more than that much work."""
        clock, stop, sleep = engine.clock, self._stop, time.sleep
        self._anchor = (engine.started_at, 0.0)  # (engine clock, trace clock) of one point of the schedule
        self._speed_now = self._speed
        self._lags, self._times, self._dropped, self._last_flush = [], [], 0, clock()
        self._by_length, self._cap = self.source.by_length, self.ld.max_inflight
        ended = True
        for x, records in self._passes():
            xs, lines = x.tolist(), records["line"].tolist()
            has_bad = BAD_LINE in lines
            self._chunk, self._inputs = records, None
            i, n = 0, len(xs)
            wall, at = self._anchor
            speed = self._speed_now
            while i < n:
                if stop.is_set():
                    ended = False
                    break
                if self._speed != speed and math.isfinite(xs[i]):  # continuous at the next row
                    self._anchor = wall, at = wall + (xs[i] - at) / speed, xs[i]
                    self._speed_now = speed = self._speed
                now = clock()
                limit = at + (now - wall) * speed  # rows at or before this trace time are due
                if xs[i] > limit:
                    wait = wall + (xs[i] - at) / speed - now
                    sleep(wait if wait < 0.05 else 0.05)
                    continue
                j = i + 1
                while j < n and xs[j] <= limit:
                    j += 1
                if has_bad and BAD_LINE in lines[i:j]:
                    self._due_with_bad(engine, reader, now, i, xs[i:j], lines[i:j])
                else:
                    self._due(engine, reader, now, i, xs[i:j])
                i = j
            if not ended:
                break
        self._flush(engine, clock())
        if ended:
            log.info("load.replay: the trace ended after %d pass%s", self.passes, "es" if self.passes > 1 else "")

    def _due_with_bad(
        self, engine: Sender, reader: RowReader, now: float, first: int, xs: list[float], lines: list[int]
    ) -> None:
        """Due rows with bad ones among them: each bad row counted where it stood."""
        run = 0  # rows before the next bad one
        for k, line in enumerate(lines):
            if line == BAD_LINE:
                if run:
                    self._due(engine, reader, now, first + k - run, xs[k - run : k])
                self.counts.bad += 1
                run = 0
            else:
                run += 1
        if run:
            self._due(engine, reader, now, first + len(lines) - run, xs[len(lines) - run :])

    def _due(self, engine: Sender, reader: RowReader, now: float, first: int, xs: list[float]) -> None:
        """Rows ``first``... of the chunk, due by ``now`` (their times ``xs``, in order): each an
        arrival, its intended time and lag kept for the next flush; sent while fewer than
        ``max_inflight`` are in flight, dropped past it."""
        wall, at = self._anchor
        speed = self._speed_now
        lags, times = self._lags, self._times
        held = len(times)
        for x in xs:
            t = wall + (x - at) / speed
            times.append(t)
            lags.append(now - t)
        if now - times[-1] <= ON_TIME_S:  # the latest are the ones on time
            self.on_time += len(times) - bisect.bisect_left(times, now - ON_TIME_S, held)
        k = self._cap - engine.inflight
        if k < len(xs):
            self._dropped += len(xs) - max(k, 0)
        if k > 0:
            self._send(engine, reader, now, first, times[held : held + k])
        if len(lags) >= 256 or now - self._last_flush > 0.1:
            self._flush(engine, now)

    def _flush(self, engine: Sender, now: float) -> None:
        """The arrivals since the last flush: their lags and drops to the engine, each to its
        minute of the report's plot (a run of them in one minute at once, as nearly always)."""
        times, t0 = self._times, engine.started_at
        if times:
            intended = self.per_minute["intended"]
            if int((times[0] - t0) * intended.per_second) == int((times[-1] - t0) * intended.per_second):
                intended.add(times[0] - t0, len(times))
            else:
                for t in times:
                    intended.add(t - t0)
        self.dropped += self._dropped
        engine.observe_lag(self._lags, self._dropped)
        self._lags, self._times, self._dropped, self._last_flush = [], [], 0, now
        self._count_bad(engine)

    def _send(self, engine: Sender, reader: RowReader, now: float, first: int, times: list[float]) -> None:
        """Rows ``first``... of the chunk, sent, each with its intended time: made from the index's
        token counts where the payload needs nothing else, else from the row read from the file."""
        due: list[Request] = []
        by_length = self._by_length
        if by_length is not None:
            if self._inputs is None:
                self._inputs = self._chunk["input"].tolist()
            inputs = self._inputs
            for q, t in enumerate(times, first):
                n = inputs[q]
                key, payload = by_length(n if n >= 0 else None)
                due.append(Request(t, now, key, payload))
        else:
            make = self.source.for_row
            records = self._chunk[first : first + len(times)]
            for t, offset, line in zip(times, records["offset"].tolist(), records["line"].tolist(), strict=True):
                try:
                    row = reader.row(offset, line)
                except ValueError as exc:  # the file changed under the soak: a bad row now
                    self.counts.add_bad(line, str(exc))
                    continue
                key, payload = make(row)
                due.append(Request(t, now, key, payload))
        if due:
            self.sent += len(due)
            self.per_minute["sent"].add(now - engine.started_at, len(due))
            engine.send(due)

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
