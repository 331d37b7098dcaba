"""``--api http``: a served model behind one HTTP endpoint, each request's body POSTed to one URL;
2xx is ok. The body of each answer is read to its end and dropped as it comes (never held); past
``MAX_BODY_BYTES`` it is an error.

Built on :mod:`soakd.targets.http1` (a keep-alive pool and httptools), not aiohttp: this is the
protocol people drive at tens of thousands of requests per second, where aiohttp's per-request
work was the driver's whole limit (docs/shards.md). The send time is stamped once a pooled
connection is in hand, so the wait for one (and any back-off) is the ``queue`` stage. The loop
thread, up/down state and back-off are :class:`~soakd.targets.client.ClientTarget`'s.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from typing import Any

from soakd.errors import ConfigError, TargetError
from soakd.targets.answers import MAX_BODY_BYTES, BadAnswer, status_class
from soakd.targets.client import CHECK_TIMEOUT, ClientTarget, Failure, Sent
from soakd.targets.http1 import Disconnected, Endpoint, Pool

log = logging.getLogger("soakd.target")


class HttpTarget(ClientTarget):
    api = "http"
    max_body_bytes = MAX_BODY_BYTES  # the largest answer read; past it the answer is an error

    def __init__(self, *args: Any, content_type: str = "application/json", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._endpoint = Endpoint(self.url)
        except ValueError as exc:
            raise ConfigError(f"target.url: {exc}") from None
        self._post = self._endpoint.head("POST", {"Content-Type": content_type})
        self._pool: Pool | None = None

    async def _open_client(self) -> None:
        self._pool = Pool(self._endpoint, self.max_connections, max_body=self.max_body_bytes)

    async def _close_client(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def _check(self) -> None:
        # Any status shows a server: a 405 to HEAD is still an answer.
        assert self._pool is not None
        url = self.url
        try:
            status = await self._pool.request(self._endpoint.head("HEAD", {}), b"", CHECK_TIMEOUT)
        except TimeoutError:
            raise TargetError(f"target.url: {url}: no answer within {CHECK_TIMEOUT:.0f}s") from None
        except (BadAnswer, Disconnected) as exc:
            raise TargetError(f"target.url: {url}: not an HTTP server? ({type(exc).__name__}: {exc})") from None
        except OSError as exc:
            raise TargetError(f"target.url: {url}: cannot connect ({self._reason(exc)})") from None
        log.info("target %s answers (HEAD: %d)", url, status)

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        assert self._pool is not None
        body = payload if isinstance(payload, bytes) else _as_bytes(payload)
        if sent is None:
            status = await self._pool.request(self._post, body, self.timeout)
        else:
            status = await self._pool.request(self._post, body, self.timeout, lambda: _stamp(sent, self._clock))
        if 200 <= status < 300:
            return "2xx"
        self._log_once(f"status {status}", f"target answered HTTP {status}")
        return status_class(status)

    def _failure(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
            return "timeout"
        if isinstance(exc, OSError):  # refused, reset, server gone (Disconnected is one)
            return "down"
        if isinstance(exc, BadAnswer):  # not HTTP, or over the bound
            return "bad"
        return None

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, ssl.SSLCertVerificationError):  # its errno (1) would read "operation not permitted"
            return f"certificate verify failed: {exc.verify_message}"
        if isinstance(exc, ssl.SSLError):
            return f"TLS: {exc.reason or exc}".lower()
        if isinstance(exc, OSError) and not isinstance(exc, Disconnected):
            # asyncio words a refusal "Connect call failed (...)"; the errno says "connection refused".
            if exc.errno and exc.errno > 0 and not isinstance(exc, socket.gaierror):
                return os.strerror(exc.errno).lower()
            if exc.strerror:
                return exc.strerror.lower()  # DNS: "name or service not known"
        return super()._reason(exc)


def _stamp(sent: Sent, clock: Any) -> None:
    sent.t = clock()


def _as_bytes(payload: Any) -> bytes:
    if isinstance(payload, str):
        return payload.encode()
    return bytes(payload)  # bytearray, memoryview
