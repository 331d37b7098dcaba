"""Arrival executors, one small class per model of load (as k6's executors): closed loop keeps N
requests in flight, open loop sends on a schedule of intended times. The engine asks nothing
else about how load arrives; :func:`executor_for` is the one place that picks."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from soakd.config import LoadConfig
from soakd.config.parse import parse_instant, parse_shard
from soakd.load.arrivals import gaps, shard_gaps
from soakd.request import Request

log = logging.getLogger("soakd.load")

# Open loop needs the arrivals thread to get the GIL back promptly after its sleep; the
# default 5 ms switch interval would put up to 5 ms of lag on every send.
_OPEN_LOOP_SWITCH_INTERVAL = 0.0005
# A shard started this many arrivals after --start-at skips them one by one to stay in step
# with the other shards; further behind, it starts its own schedule at once (and says so).
MAX_SKIPPED_ARRIVALS = 5_000_000


class Sender(Protocol):
    """The engine, as an executor sees it."""

    clock: Callable[[], float]
    started_at: float
    last_completion: float  # when the latest request finished (engine clock)

    @property
    def inflight(self) -> int: ...

    def make(self, intended: float, now: float) -> Request: ...

    def send(self, reqs: list[Request]) -> None: ...

    def observe_lag(self, lags: list[float], dropped: int) -> None: ...

    def reject(self, n: int) -> None:
        """``n`` arrivals that could not be made a request (a replayed trace's bad rows): ``bad_input``."""


class Executor(Protocol):
    open_loop: bool
    exhausted: bool  # the arrivals ended on their own (a trace replayed once)

    @property
    def target_load(self) -> float: ...

    def set_load(self, value: float) -> None: ...

    def start(self, engine: Sender) -> None: ...

    def replace(self, engine: Sender, finished: int) -> None:
        """Called (under the engine's completion lock) when ``finished`` requests completed."""

    def stop(self) -> None: ...


class ClosedLoop:
    """``concurrency`` requests in flight: each completion sends its replacement at once."""

    open_loop = False
    exhausted = False

    def __init__(self, concurrency: int, shard: tuple[int, int] | None = None) -> None:
        self._shard = shard
        self._target = self._share(concurrency)
        self._stopped = False

    def _share(self, value: float) -> int:
        """This shard's part of a soak's concurrency: N shards' parts add up to it."""
        n = int(value)
        if self._shard is not None:
            index, count = self._shard
            n = n // count + (1 if index < n % count else 0)
        return max(1, n)

    @property
    def target_load(self) -> float:
        return float(self._target)

    def set_load(self, value: float) -> None:
        """Raising it sends more at the next completion; lowering it lets completions go without
        a replacement until the count is down."""
        self._target = self._share(value)

    def start(self, engine: Sender) -> None:
        now = engine.clock()
        engine.send([engine.make(now, now) for _ in range(self._target)])

    def replace(self, engine: Sender, finished: int) -> None:
        if self._stopped:
            return
        k = max(0, self._target - (engine.inflight - finished))
        if k:
            now = engine.clock()
            engine.send([engine.make(now, now)] if k == 1 else [engine.make(now, now) for _ in range(k)])

    def stop(self) -> None:
        self._stopped = True


class ArrivalsThread:
    """An open loop's ``soakd-arrivals`` thread (the rate's and a replayed trace's): started with
    the engine, stopped and joined with it; while it runs the interpreter's switch interval is
    short so the thread gets the GIL back promptly after each sleep. Subclasses write ``_run``."""

    open_loop = True
    exhausted = False

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._old_switch = sys.getswitchinterval()

    def start(self, engine: Sender) -> None:
        sys.setswitchinterval(_OPEN_LOOP_SWITCH_INTERVAL)
        self._thread = threading.Thread(target=self._run, args=(engine,), name="soakd-arrivals", daemon=True)
        self._thread.start()

    def replace(self, engine: Sender, finished: int) -> None:
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        sys.setswitchinterval(self._old_switch)

    def _run(self, engine: Sender) -> None:
        raise NotImplementedError


class OpenLoop(ArrivalsThread):
    """Requests at intended times from a constant, Poisson or gamma process, anchored to the start
    (never to the previous send): falling behind shows as schedule lag, not a lower rate. Past
    ``max_inflight`` in flight, arrivals are dropped (counted), not delayed."""

    def __init__(self, ld: LoadConfig) -> None:
        assert ld.rate is not None
        super().__init__()
        self.ld = ld
        self._rate = float(ld.rate)  # the soak's rate: a shard sends 1/N of it
        self._shard = parse_shard(ld.shard)
        self._start_at = parse_instant(ld.start_at)
        self.skipped = 0  # arrivals due before this driver started (a late shard), not sent

    @property
    def target_load(self) -> float:
        return self._rate / (self._shard[1] if self._shard else 1)

    def set_load(self, value: float) -> None:
        """The soak's rate (a shard sends its part of it). The arrivals thread spaces its next arrivals at this rate."""
        if value <= 0:
            raise ValueError(f"rate must be > 0, got {value}")
        self._rate = float(value)

    def _schedule(self, engine: Sender) -> tuple[Iterator[float], float]:
        """This driver's unit-rate gaps and its first intended send time (engine clock). With
        ``--start-at`` the schedule counts from that instant, mapped onto the engine's clock, so
        shards on many hosts share one; a shard that starts late skips what fell due before."""
        ld = self.ld
        if self._shard is None:
            unit = gaps(1.0, ld.arrival, ld.burstiness, ld.seed)
        else:
            unit = shard_gaps(*self._shard, ld.arrival, ld.burstiness, ld.seed)
        anchor = engine.started_at
        if self._start_at is not None:
            anchor = engine.clock() + (self._start_at - time.time())
        next_t = anchor + next(unit) / self._rate
        while next_t < engine.started_at and self.skipped < MAX_SKIPPED_ARRIVALS:
            next_t += next(unit) / self._rate
            self.skipped += 1
        if next_t < engine.started_at:
            log.warning(
                "started %.0f s after --start-at: past %d skipped arrivals this shard no longer keeps step",
                engine.started_at - anchor,
                MAX_SKIPPED_ARRIVALS,
            )
            next_t = engine.started_at
        return unit, next_t

    def _run(self, engine: Sender) -> None:
        ld = self.ld
        # Gaps of a rate-1 process divided by the current rate: set_rate() takes effect at once.
        unit, next_t = self._schedule(engine)
        cap = ld.max_inflight
        lags: list[float] = []
        dropped = 0
        clock, stop = engine.clock, self._stop
        last_flush = clock()
        while not stop.is_set():
            now = clock()
            if next_t > now:
                wait = next_t - now
                time.sleep(wait if wait < 0.05 else 0.05)
                continue
            due: list[Request] = []
            inflight = engine.inflight
            while next_t <= now:
                lags.append(now - next_t)
                if inflight + len(due) >= cap:
                    dropped += 1
                else:
                    due.append(engine.make(next_t, now))
                next_t += next(unit) / self._rate
            if due:
                engine.send(due)
            if len(lags) >= 256 or now - last_flush > 0.1:
                engine.observe_lag(lags, dropped)
                lags, dropped = [], 0
                last_flush = now
        engine.observe_lag(lags, dropped)


def executor_for(ld: LoadConfig) -> Executor:
    """Open loop when a rate is set, else closed loop (the one place this is decided; a replayed
    trace's open loop is load/replay.py's, picked by the engine, which holds the trace)."""
    if ld.open_loop:
        return OpenLoop(ld)
    return ClosedLoop(ld.concurrency or 1, parse_shard(ld.shard))
