"""Network targets over HTTP, with aiohttp: :class:`AiohttpTarget` (what every HTTP protocol
shares) and ``--api http`` (:class:`HttpTarget`: POST each request's body to one URL).

aiohttp does the HTTP: the keep-alive pool bounded by ``TCPConnector(limit=...)`` (requests past
it wait inside aiohttp for a connection), the per-request ``ClientTimeout``, parsing. Written here
only the send time: the connector stamps it once a pooled connection is in hand (the headers go
out next), so the wait for a connection (and any back-off) is the request's ``queue`` stage and
the rest is ``inference``. Not a ``TraceConfig``: aiohttp then builds trace objects for every
signal of every request, ~6% of the client's CPU at a few thousand req/s. The loop thread,
up/down state and back-off are :class:`~soakd.targets.client.ClientTarget`'s.
"""

from __future__ import annotations

import json
import logging
import os
import reprlib
import socket
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from soakd.errors import TargetError
from soakd.targets.client import CHECK_TIMEOUT, ClientTarget, Failure, Sent

log = logging.getLogger("soakd.target")


MAX_BODY_BYTES = 64 * 1024 * 1024  # an answer past this is an error, read no further (docs/limits.md)

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlevel = 3


def short(value: Any) -> str:
    """``value`` as a short repr for a log line, however large or deeply nested it is."""
    return _SHORT.repr(value)


class BadAnswer(aiohttp.ClientError):
    """An answer that is not valid for the protocol (not JSON, an ``error`` in a 2xx, too large,
    a line past its bound): counted as ``error``. ``cls``: the answer's status class, when it
    had one."""

    def __init__(self, message: str, cls: str = "none") -> None:
        super().__init__(message)
        self.cls = cls


async def read_body(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, read as it comes and never past ``limit`` bytes: a larger one (by its
    ``Content-Length``, or as counted) is :class:`BadAnswer` and its connection is closed, so a
    server's 1 GiB answer costs soakd at most ``limit`` bytes per connection."""
    cls = status_class(resp.status)
    declared = resp.content_length
    if declared is not None and declared > limit:
        resp.close()
        raise BadAnswer(f"answer of {declared} bytes, over the bound of {limit} bytes", cls)
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        if len(buf) + len(chunk) > limit:
            resp.close()
            raise BadAnswer(f"answer over the bound of {limit} bytes (read no further)", cls)
        buf += chunk
    return bytes(buf)


async def discard_body(resp: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> int:
    """Read the body to its end holding none of it; its size. Past ``limit`` bytes: BadAnswer,
    as :func:`read_body`."""
    cls = status_class(resp.status)
    declared = resp.content_length
    if declared is not None and declared > limit:
        resp.close()
        raise BadAnswer(f"answer of {declared} bytes, over the bound of {limit} bytes", cls)
    n = 0
    async for chunk in resp.content.iter_any():
        n += len(chunk)
        if n > limit:
            resp.close()
            raise BadAnswer(f"answer over the bound of {limit} bytes (read no further)", cls)
    return n


def parse_json(data: bytes, what: str = "answer") -> Any:
    """JSON from a server, bounded in depth by the interpreter's recursion limit: ValueError
    naming what is wrong (not JSON, nested too deeply), never RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"the {what} is JSON nested too deeply") from None
    except ValueError:  # UnicodeDecodeError included
        raise ValueError(f"the {what} is not JSON: {short(data[:80])}") from None


# The request the running task is sending: each asyncio task has its own context, so the
# connector (shared by all) stamps the right one. None for the start check and warm-up.
SENDING: ContextVar[Sent | None] = ContextVar("soakd_sending", default=None)


class _StampingConnector(aiohttp.TCPConnector):
    """Stamps each request's send time, and hands out the most recently released idle
    connection first (LIFO).

    aiohttp >= 3.11 reuses the *oldest* idle connection (FIFO, aio-libs/aiohttp#9672): every
    pooled connection is then touched every few requests and none ever reaches the keep-alive
    timeout, so a one-off burst (a GC pause, a stall of the server) leaves the pool at its
    high-water mark for the rest of the soak. Over 24 h the bursts only grow, up to ``limit``:
    all 256 connections held open to the watched server after 35 min at 1,000 req/s with about
    one request in flight (docs/network-targets.md). With LIFO the surplus idles out after
    ``keepalive_timeout`` and the pool follows the load, as urllib3's and Go's pools do. (soakd's
    own RSS under an http target steps up once to a high-water mark of Python objects, the
    requests in flight at a busy moment, whatever the pool does: docs/network-targets.md.)
    Written by hand because aiohttp has no option for it: the reorder touches the private
    ``_conns`` (a deque per key in 3.11+; older versions are LIFO already)."""

    def __init__(self, clock: Callable[[], float], limit: int, keepalive_timeout: float = 15.0) -> None:
        super().__init__(limit=limit, keepalive_timeout=keepalive_timeout)  # 15 s: aiohttp's default
        self._clock = clock

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        sent = SENDING.get()
        if sent is not None:
            sent.t = self._clock()
        return conn

    def _release(self, key: Any, protocol: Any, *args: Any, **kwargs: Any) -> None:
        super()._release(key, protocol, *args, **kwargs)
        conns = getattr(self, "_conns", {}).get(key)
        # FIFO pool (a deque, taken from the left): move what was just released to the front.
        if conns and hasattr(conns, "appendleft") and conns[-1][0] is protocol:
            conns.appendleft(conns.pop())


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 200 <= status < 600 else "none"


class AiohttpTarget(ClientTarget):
    """An HTTP protocol: one ``aiohttp.ClientSession`` with a bounded pool that stamps send times.
    A protocol's ``_exchange`` calls ``self.sending(sent)`` before its request."""

    _session: aiohttp.ClientSession | None = None
    max_body_bytes = MAX_BODY_BYTES  # the largest answer read; past it the answer is an error

    async def _open_client(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=_StampingConnector(self._clock, self.max_connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )

    async def _close_client(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    def sending(sent: Sent | None) -> None:
        """The next request this task makes is ``sent``'s: the connector stamps its send time."""
        SENDING.set(sent)

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "open() first"
        return self._session

    def _failure(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, TimeoutError):  # aiohttp's timeouts derive from it (and from OSError)
            return "timeout"
        if isinstance(exc, aiohttp.ClientConnectionError | OSError):  # refused, reset, server gone
            return "down"
        if isinstance(exc, aiohttp.ClientError | HttpProcessingError):  # an answer that is not valid HTTP
            return "bad"
        return None

    def _reason(self, exc: BaseException) -> str:
        os_error = getattr(exc, "os_error", None)
        if isinstance(os_error, OSError):
            # asyncio words a refusal "Connect call failed (...)"; the errno says "connection refused".
            if os_error.errno and os_error.errno > 0 and not isinstance(os_error, socket.gaierror):
                return os.strerror(os_error.errno).lower()
            if os_error.strerror:
                return os_error.strerror.lower()  # DNS: "name or service not known"
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            return "server disconnected"
        return super()._reason(exc)

    def _answered(self, status: int) -> str:
        """The response class of an HTTP status, a non-2xx logged once."""
        if not 200 <= status < 300:
            self._log_once(f"status {status}", f"target answered HTTP {status}")
        return status_class(status)

    async def _reachable(self, method: str, url: str) -> aiohttp.ClientResponse:
        """``method url`` for the start check; TargetError naming the URL when nothing answers HTTP.
        The caller reads (and releases) the response."""
        try:
            return await self.session.request(method, url, timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT))
        except TimeoutError:
            raise TargetError(f"target.url: {url}: no answer within {CHECK_TIMEOUT:.0f}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise TargetError(f"target.url: {url}: cannot connect ({self._reason(exc)})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise TargetError(
                f"target.url: {url}: not an HTTP server? ({type(exc).__name__}: {self._reason(exc)})"
            ) from None


class HttpTarget(AiohttpTarget):
    """``--api http``: a served model behind one HTTP endpoint; 2xx is ok. The body is read to
    its end and dropped as it comes (never held); past ``MAX_BODY_BYTES`` it is an error."""

    api = "http"

    def __init__(self, *args: Any, content_type: str = "application/json", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers = {"Content-Type": content_type}

    async def _check(self) -> None:
        # Any status shows a server: a 405 to HEAD is still an answer.
        resp = await self._reachable("HEAD", self.url)
        async with resp:
            log.info("target %s answers (HEAD: %d)", self.url, resp.status)

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        self.sending(sent)
        async with self.session.post(self.url, data=payload, headers=self._headers) as resp:
            await discard_body(resp, self.max_body_bytes)
            return self._answered(resp.status)
