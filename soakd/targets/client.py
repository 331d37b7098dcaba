"""What every network target shares, whatever its protocol (plain HTTP, OpenAI, KServe v2 over
REST or gRPC): one asyncio event-loop thread that owns the client, the hand-over of requests into
it, up/down state with its outages, the back-off while the server refuses connections, warm-up
and the summary's ``target`` block.

A protocol is a subclass that opens its client (``_open_client``), checks the target at start
(``_check``), performs one request (``_exchange``) and says what a failure was (``_failure``).
Written here, not taken from a library, because it is the glue between the engine's threads and an
asyncio client: aiohttp and grpc.aio retry nothing and know nothing of a soak's up/down state.

Every submitted request ends in exactly one ``done`` call, whatever happened to it: an answer
that is not valid for the protocol, and any exception in its handling (a bug included, logged
once with its traceback), is ``error``; a request still out when the drain ends (``join``) is
``timeout`` (``dropped`` if it never left the client), and one cancelled by ``close`` is
``dropped``. None is lost, so a closed loop never stops for want of a completion.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypeVar

from soakd.errors import TargetError
from soakd.request import Request
from soakd.targets.base import Done, WarmupResult
from soakd.telemetry.catalogue import RESPONSE_CLASSES, Metrics

log = logging.getLogger("soakd.target")

BACKOFF_MIN = 0.05  # seconds a request waits after the first refused connection
BACKOFF_MAX = 1.0  # the wait doubles per refusal up to this: a dead server sees ~concurrency tries/s
CHECK_TIMEOUT = 10.0  # the start check: an answer within this long

T = TypeVar("T")

# What a failed request was, as ``_failure`` sorts it: ``down`` marks the target down (refused,
# reset, server gone), ``timeout`` and ``bad`` (an answer that is not valid for the protocol) are
# counted and the target stays up.
Failure = Literal["timeout", "down", "bad"]


class Sent:
    """When a request left the client (set by the protocol once it is on the wire, after any wait
    for a pooled connection); 0.0 until then. ``intended``: when the arrival process meant to send
    it, which per-token latencies (a stream's time to first token) count from, as e2e does."""

    __slots__ = ("intended", "t")

    def __init__(self, intended: float = 0.0) -> None:
        self.intended = intended
        self.t = 0.0


class ClientTarget:
    """A served model behind ``url``. ``open()`` starts the loop thread and the client and checks
    the target; the engine then ``submit``s requests and gets each back through ``done``."""

    api = "?"  # the --api name, set by each protocol

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        max_connections: int,
        timeout: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.url = url
        self.spec = f"{self.api}:{url}"
        self.max_connections = max_connections
        self.timeout = timeout
        self._clock = clock
        self._up = metrics.target_up.labels(url)
        self._responses = {c: metrics.target_responses.labels(url, c) for c in RESPONSE_CLASSES}
        self._counts = dict.fromkeys(RESPONSE_CLASSES, 0)  # the summary's copy (loop thread writes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ident: int | None = None
        self._thread: threading.Thread | None = None
        self._done: Done | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._submit_lock = threading.Lock()
        self._submitted = 0  # any thread, under _submit_lock
        self._finished = 0  # loop thread only
        self._died: BaseException | None = None
        self._logged: set[str] = set()
        self._expiring = False  # join() ran out: what it cancels is counted as timed out
        # Up/down: written on the loop thread; _state_lock gives readers a consistent view.
        self._state_lock = threading.Lock()
        self._down_since: float | None = None
        self._down_reason = ""
        self._down_total = 0.0
        self._outages = 0
        self._backoff = 0.0
        self._next_try = 0.0

    @property
    def batches(self) -> Literal[False]:
        return False

    # ------------------------------------------------------------------ what a protocol provides

    async def _open_client(self) -> None:
        """Create the client (session, channel) on the loop thread."""
        raise NotImplementedError

    async def _close_client(self) -> None:
        raise NotImplementedError

    async def _check(self) -> None:
        """The start check: raise TargetError naming the URL when the target cannot serve."""
        raise NotImplementedError

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        """One request; returns its response class (``2xx``.. ``5xx``: anything but 2xx is an
        error answer, which the protocol logs once with ``_log_once``, saying what it was).
        ``sent`` (None in warm-up) gets the time the request left the client. Raises on
        failure, sorted by ``_failure``."""
        raise NotImplementedError

    def _failure(self, exc: BaseException) -> Failure | None:
        """What ``exc`` from ``_exchange`` was; None: not a request failure (a bug, re-raised)."""
        if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
            return "timeout"
        if isinstance(exc, OSError):
            return "down"
        return None

    def _reason(self, exc: BaseException) -> str:
        """One short phrase for a failure, for logs and /healthz."""
        text = str(exc) or type(exc).__name__
        return text.splitlines()[0][:200]

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> float:
        """Start the loop thread and the client and run the start check. Returns the seconds it
        took; TargetError naming the URL when the target cannot serve."""
        t0 = self._clock()
        self._start_loop()
        try:
            self._call(self._check(), CHECK_TIMEOUT + 5.0)
        except BaseException:
            self.close()
            raise
        self._up.set(1)
        return self._clock() - t0

    def _start_loop(self) -> None:
        if self._thread is not None:
            return
        loop = self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._loop_ident = threading.get_ident()
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            except BaseException as exc:  # the loop itself failed: the session reports it as dead
                self._died = exc
                raise

        self._thread = threading.Thread(target=run, name=f"soakd-{self.api}-target", daemon=True)
        self._thread.start()
        ready.wait()
        self._call(self._open_client(), 10.0)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop thread and wait for its result here."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self, done: Done) -> None:
        self._done = done

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            try:
                self._call(self._shutdown(), 10.0)
            except Exception as exc:  # closing must not hide the run's own outcome
                log.debug("%s target: shutdown: %s", self.api, exc)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10.0)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._close_client()

    def dead(self) -> BaseException | None:
        return self._died

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the requests out to finish. Those still out then are ended
        and counted: ``timeout`` (they were sent and had no answer by the end of the drain), or
        ``dropped`` for those that never left the client; so a run's counts hold every request
        it sent, also against a server that never finishes an answer. False if any were ended."""
        deadline = time.monotonic() + timeout
        while self._pending() > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._pending() == 0:
            return True
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                self._call(self._expire(), 10.0)
            except Exception as exc:  # the loop is wedged: the run's own outcome says so
                log.warning("%s target: ending the requests still out failed: %s", self.api, exc)
        return False

    async def _expire(self) -> None:
        """Cancel every request still out, counted as ``timeout`` (see :meth:`_one`)."""
        tasks = list(self._tasks)
        if not tasks:
            return
        self._expiring = True
        try:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._expiring = False
        log.warning(
            "%d requests still out at the end of the drain (no answer from %s): counted as timeouts",
            len(tasks),
            self.url,
        )

    def _pending(self) -> int:
        with self._submit_lock:
            return self._submitted - self._finished

    # ------------------------------------------------------------------ requests

    def submit(self, reqs: Sequence[Request]) -> None:
        with self._submit_lock:
            self._submitted += len(reqs)
        if threading.get_ident() == self._loop_ident:  # a closed-loop resend from a completion
            self._spawn(reqs)
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._spawn, reqs)

    def _spawn(self, reqs: Sequence[Request]) -> None:
        assert self._loop is not None
        for req in reqs:
            task = self._loop.create_task(self._one(req))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _one(self, req: Request) -> None:
        sent = Sent(req.intended)
        outcome, cls = "error", "none"
        try:
            if self._next_try:  # the server refused lately: wait out the back-off first
                wait = self._next_try - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
            cls = await self._exchange(req.tensor, sent)
            if cls == "2xx":
                outcome = "ok"
            self._mark_up()
        except asyncio.CancelledError:  # join() ran out (timeout) or close(): counted, then let go
            late = self._expiring and sent.t > 0.0  # sent, and no answer by the end of the drain
            self._finish(req, sent, "timeout" if late else "dropped", "none")
            raise
        except Exception as exc:  # every failure is counted: never a lost request or a dead loop
            kind = self._failure(exc)
            cls = getattr(exc, "cls", cls)  # an answer judged bad after its status: its class
            if kind == "timeout":
                outcome = "timeout"
            elif kind == "down":
                self._mark_down(exc)
            elif kind == "bad":
                self._log_once(type(exc).__name__, f"bad answer from target: {type(exc).__name__}: {self._reason(exc)}")
            else:  # not a failure the protocol knows: a bug, or an answer nothing foresaw
                self._log_unexpected(exc)
        self._finish(req, sent, outcome, cls)

    def _finish(self, req: Request, sent: Sent, outcome: str, cls: str) -> None:
        t_end = self._clock()
        self._responses[cls].inc()
        self._counts[cls] += 1
        with self._submit_lock:
            self._finished += 1
        done = self._done
        if done is None:
            return
        try:
            done(req, sent.t or t_end, t_end, outcome)
        except Exception as exc:  # the engine's bookkeeping failed: the run must stop, not hang
            self._died = exc
            log.exception("%s target: completing a request failed", self.api)

    def _log_unexpected(self, exc: BaseException) -> None:
        key = f"unexpected {type(exc).__name__}"
        if key not in self._logged:
            self._logged.add(key)
            log.error(
                "%s target: a request failed unexpectedly, counted as an error (%s; further ones are counted, "
                "not logged)",
                self.api,
                self.url,
                exc_info=exc,
            )

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s (%s; further ones are counted, not logged)", message, self.url)

    def _mark_up(self) -> None:
        if self._down_since is None:
            return
        now = self._clock()
        with self._state_lock:
            down_for = now - self._down_since
            self._down_total += down_for
            self._down_since = None
            self._backoff = self._next_try = 0.0
        self._up.set(1)
        log.info("target %s is back after %.1fs down", self.url, down_for)

    def _mark_down(self, exc: BaseException) -> None:
        now = self._clock()
        reason = self._reason(exc)
        with self._state_lock:
            self._backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, 2 * self._backoff))
            self._next_try = now + self._backoff
            if self._down_since is not None:
                return
            self._down_since = now
            self._down_reason = reason
            self._outages += 1
        self._up.set(0)
        log.warning(
            "target %s is down: %s (counted as errors; retrying with back-off up to %.0fs)",
            self.url,
            reason,
            BACKOFF_MAX,
        )

    # ------------------------------------------------------------------ warm-up, health, summary

    def warm_up(self, payloads: Sequence[Any], runs: int, stop: threading.Event) -> WarmupResult:
        """``runs`` requests one after another, outside measurement (no ``done``, no counters);
        TargetError when every one failed."""
        res = WarmupResult()
        if runs <= 0 or not payloads:
            return res
        t0 = self._clock()
        for i in range(runs):
            if stop.is_set():
                res.stopped = True
                break
            t = self._clock()
            kind = self._call(self._warm_one(payloads[i % len(payloads)]), self.timeout + 5.0)
            if i == 0:
                res.first_seconds = self._clock() - t
            res.calls += 1
            if kind is not None:
                res.failures += 1
                res.failure_kinds[kind] = res.failure_kinds.get(kind, 0) + 1
        res.total_seconds = self._clock() - t0
        if res.calls and res.failures == res.calls:
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(res.failure_kinds.items()))
            raise TargetError(f"target.url: {self.url}: every warm-up request failed ({kinds})")
        return res

    async def _warm_one(self, payload: Any) -> str | None:
        """None when the request succeeded, else what went wrong."""
        try:
            cls = await self._exchange(payload, None)
        except Exception as exc:
            kind = self._failure(exc)
            if kind is None:
                self._log_unexpected(exc)
                return f"{type(exc).__name__}: {self._reason(exc)}"
            return "timeout" if kind == "timeout" else self._reason(exc)
        return None if cls == "2xx" else cls

    def down_reason(self) -> str | None:
        """Why the target is down now (for /healthz), or None while it answers."""
        with self._state_lock:
            since, reason = self._down_since, self._down_reason
        if since is None:
            return None
        return f"target down: {self.url}: {reason} (for {self._clock() - since:.0f}s)"

    def summary(self) -> dict[str, Any]:
        """The summary's ``target`` block: where, how it answered, how long it was down."""
        with self._state_lock:
            down = self._down_total + (self._clock() - self._down_since if self._down_since is not None else 0.0)
            outages, up = self._outages, self._down_since is None
        return {
            "url": self.url,
            "api": self.api,
            "up": up,
            "down_seconds": round(down, 3),
            "outages": outages,
            "responses": dict(self._counts),
            "max_connections": self.max_connections,
            "timeout_seconds": self.timeout,
        }
