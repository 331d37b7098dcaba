"""The aiohttp protocols' base: :class:`AiohttpTarget`, what openai and kserve-v2 over REST share
(``--api http`` has a leaner client of its own: :mod:`soakd.targets.http`).

aiohttp does the HTTP: the keep-alive pool bounded by ``TCPConnector(limit=...)`` (requests past
it wait inside aiohttp for a connection), the per-request ``ClientTimeout``, parsing. Written here
only the send time: the connector stamps it once a pooled connection is in hand (the headers go
out next), so the wait for a connection (and any back-off) is the request's ``queue`` stage and
the rest is ``inference``. Not a ``TraceConfig``: aiohttp then builds trace objects for every
signal of every request, ~6% of the client's CPU at a few thousand req/s. The loop thread,
up/down state and back-off are :class:`~soakd.targets.client.ClientTarget`'s.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from soakd.errors import TargetError
from soakd.targets.answers import MAX_BODY_BYTES, BadAnswer, status_class
from soakd.targets.client import CHECK_TIMEOUT, ClientTarget, Failure, Sent

log = logging.getLogger("soakd.target")


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
        if isinstance(exc, BadAnswer):
            return "bad"
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
