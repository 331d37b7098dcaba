"""``--api http``: POST each request's body to one URL, from one asyncio event-loop thread.

aiohttp does the HTTP: the keep-alive pool bounded by ``TCPConnector(limit=...)`` (requests past
it wait inside aiohttp for a connection), the per-request ``ClientTimeout``, parsing. Written here
only what aiohttp does not do:

- the thread that owns the loop, since the engine and its executors are threads, and the hand-over
  into it (``call_soon_threadsafe``);
- the send time: a trace hook on "request headers sent", so the wait for a pooled connection (and
  any back-off) is the request's ``queue`` stage and the rest is ``inference``;
- up/down state with its outages (``soakd_target_up``, ``/healthz``, the summary's down time);
- a short, growing back-off while the server refuses connections: aiohttp retries nothing, and a
  closed loop would otherwise reconnect as fast as the refusals come back.

Every submitted request ends in exactly one ``done`` call (a cancelled one as ``dropped``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal, TypeVar

import aiohttp

from soakd.errors import TargetError
from soakd.request import Request
from soakd.targets.base import Done, WarmupResult
from soakd.telemetry.catalogue import RESPONSE_CLASSES, Metrics

log = logging.getLogger("soakd.target")

BACKOFF_MIN = 0.05  # seconds a request waits after the first refused connection
BACKOFF_MAX = 1.0  # the wait doubles per refusal up to this: a dead server sees ~concurrency tries/s
CHECK_TIMEOUT = 10.0  # the start check: an answer (any status) within this long

T = TypeVar("T")


def _reason(exc: BaseException) -> str:
    """One short phrase for a failed connection: the OS error where there is one."""
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, OSError):
        # asyncio words a refusal "Connect call failed (...)"; the errno says "connection refused".
        if os_error.errno and os_error.errno > 0 and not isinstance(os_error, socket.gaierror):
            return os.strerror(os_error.errno).lower()
        if os_error.strerror:
            return os_error.strerror.lower()  # DNS: "name or service not known"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


class HttpTarget:
    """A served model behind one HTTP endpoint. ``open()`` starts the client and checks the URL."""

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        max_connections: int,
        timeout: float,
        content_type: str = "application/json",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.url = url
        self.spec = f"http:{url}"
        self.max_connections = max_connections
        self.timeout = timeout
        self._headers = {"Content-Type": content_type}
        self._clock = clock
        self._up = metrics.target_up.labels(url)
        self._responses = {c: metrics.target_responses.labels(url, c) for c in RESPONSE_CLASSES}
        self._counts = dict.fromkeys(RESPONSE_CLASSES, 0)  # the summary's copy (loop thread writes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ident: int | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._done: Done | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._submit_lock = threading.Lock()
        self._submitted = 0  # any thread, under _submit_lock
        self._finished = 0  # loop thread only
        self._died: BaseException | None = None
        self._logged: set[str] = set()
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

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> float:
        """Start the loop thread and the client, and check that the URL answers HTTP (any status:
        a 405 to HEAD still shows a server). Returns the seconds it took; TargetError naming the
        URL when nothing answers."""
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

        self._thread = threading.Thread(target=run, name="soakd-http-target", daemon=True)
        self._thread.start()
        ready.wait()
        self._call(self._make_session(), 10.0)

    async def _make_session(self) -> None:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(self._on_headers_sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            trace_configs=[trace],
        )

    async def _on_headers_sent(self, session: aiohttp.ClientSession, ctx: Any, params: Any) -> None:
        sent = ctx.trace_request_ctx  # None for the start check and warm-up, which keep no times
        if sent is not None:
            sent["t"] = self._clock()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop thread and wait for its result here."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _check(self) -> None:
        assert self._session is not None
        try:
            async with self._session.head(self.url, timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT)) as resp:
                log.info("target %s answers (HEAD: %d)", self.url, resp.status)
        except TimeoutError:
            raise TargetError(f"target.url: {self.url}: no answer within {CHECK_TIMEOUT:.0f}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise TargetError(f"target.url: {self.url}: cannot connect ({_reason(exc)})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TargetError(
                f"target.url: {self.url}: not an HTTP server? ({type(exc).__name__}: {_reason(exc)})"
            ) from None

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
                log.debug("http target: shutdown: %s", exc)
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
        if self._session is not None:
            await self._session.close()
            self._session = None

    def dead(self) -> BaseException | None:
        return self._died

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._pending() > 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._pending() == 0

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

    async def _post(self, body: Any, sent: dict[str, float]) -> int:
        assert self._session is not None
        async with self._session.post(self.url, data=body, headers=self._headers, trace_request_ctx=sent) as resp:
            await resp.read()
            return resp.status

    async def _one(self, req: Request) -> None:
        sent = {"t": 0.0}
        outcome, cls = "error", "none"
        try:
            if self._next_try:  # the server refused lately: wait out the back-off first
                wait = self._next_try - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
            status = await self._post(req.tensor, sent)
            cls = f"{status // 100}xx" if 200 <= status < 600 else "none"
            if 200 <= status < 300:
                outcome = "ok"
            else:
                self._log_once(f"status {status}", f"target answered HTTP {status}")
            self._mark_up()
        except TimeoutError:  # before OSError: TimeoutError is one (aiohttp's timeouts derive from it)
            outcome = "timeout"
        except (aiohttp.ClientConnectionError, OSError) as exc:  # refused, reset, server gone
            self._mark_down(exc)
        except aiohttp.ClientError as exc:  # an answer that is not valid HTTP
            self._log_once(type(exc).__name__, f"bad answer from target: {type(exc).__name__}: {_reason(exc)}")
        except asyncio.CancelledError:  # close() with requests still out: counted, then let go
            self._finish(req, sent, "dropped", "none")
            raise
        self._finish(req, sent, outcome, cls)

    def _finish(self, req: Request, sent: dict[str, float], outcome: str, cls: str) -> None:
        t_end = self._clock()
        self._responses[cls].inc()
        self._counts[cls] += 1
        with self._submit_lock:
            self._finished += 1
        done = self._done
        if done is None:
            return
        try:
            done(req, sent["t"] or t_end, t_end, outcome)
        except Exception as exc:  # the engine's bookkeeping failed: the run must stop, not hang
            self._died = exc
            log.exception("http target: completing a request failed")

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
        reason = _reason(exc)
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

    def warm_up(self, bodies: Sequence[Any], runs: int, stop: threading.Event) -> WarmupResult:
        """``runs`` requests one after another, outside measurement (no ``done``, no counters);
        TargetError when every one failed."""
        res = WarmupResult()
        if runs <= 0 or not bodies:
            return res
        t0 = self._clock()
        for i in range(runs):
            if stop.is_set():
                res.stopped = True
                break
            t = self._clock()
            kind = self._call(self._warm_one(bodies[i % len(bodies)]), self.timeout + 5.0)
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

    async def _warm_one(self, body: Any) -> str | None:
        """None when the request got a 2xx, else what went wrong."""
        try:
            status = await self._post(body, {"t": 0.0})
        except TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            return _reason(exc)
        return None if 200 <= status < 300 else f"HTTP {status}"

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
            "api": "http",
            "up": up,
            "down_seconds": round(down, 3),
            "outages": outages,
            "responses": dict(self._counts),
            "max_connections": self.max_connections,
            "timeout_seconds": self.timeout,
        }
