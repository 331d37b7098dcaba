"""A lean HTTP/1.1 client for ``--api http``: a bounded pool of keep-alive connections on asyncio's
``Protocol``, responses parsed by httptools (llhttp, the parser of Node.js and of uvicorn).

Written by hand because the well-kept clients' per-request work is the driver's limit. A soak
POSTs the same headers to one URL millions of times; aiohttp builds request and response objects,
multidicts, a URL and cookie handling for each, about 85 µs of CPU a request here, and soakd on it
drove 0.20x what Go's ``hey`` does per core (docs/shards.md). Here the request head is made once,
and an answer is its status, its body counted and dropped, and whether the connection can be
kept. The part that must be exactly right, parsing HTTP, is httptools'. Not done, since a soak of
one URL needs none of it: redirects, cookies, proxies, compression, ``Expect: 100-continue``.

The pool hands out the most recently released idle connection first (LIFO), so a one-off burst's
surplus idles out after ``keepalive`` seconds and the pool follows the load (what
``soakd.targets.aiohttp_client`` reorders aiohttp's pool for). A request past ``limit``
connections waits for one; the deadline covers that wait, the connect and the answer, as
aiohttp's ``ClientTimeout(total=...)`` does.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from soakd.targets.answers import MAX_BODY_BYTES, BadAnswer, short, status_class

KEEPALIVE = 15.0  # seconds an idle connection is kept (aiohttp's default, under nginx's 75 s)


class Disconnected(ConnectionError):
    """The server closed the connection before its answer was complete."""

    def __init__(self) -> None:
        super().__init__("server disconnected")


class Endpoint:
    """Where requests go, parsed once: the address to connect to and the request head's parts."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: not an http:// or https:// URL")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{url}: the port is not a number from 0 to 65535") from None
        self.port = port or (443 if self.tls else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if port is None else f"{host}:{port}"

    def head(self, method: str, headers: dict[str, str]) -> bytes:
        """The request line and headers up to ``Content-Length: `` (its value and the blank line follow)."""
        lines = [f"{method} {self.path} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time (no pipelining)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None
        self.idle_since = 0.0
        self.closed = False
        self.used = False  # a request has been sent on it
        self.error: Exception | None = None  # why it closed before a request began, if known
        self._head = False  # the request was HEAD: its answer has no body, whatever it declares
        self._status = 0
        self._size = 0  # body bytes read (and dropped)
        self._declared = -1  # Content-Length, -1 if none
        self._chunked = False  # Transfer-Encoding given: the body ends with its last chunk, not the connection
        self._complete = False
        self._keep = False

    # ------------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.lost(self)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self._status and self._declared < 0 and not self._chunked and not self._head:
                waiter.set_result(self._status)  # an answer whose body ends with the connection
            else:
                waiter.set_exception(Disconnected())

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: the connection is not usable
            if waiter is None and self.error is None:
                self.error = BadAnswer(f"not valid HTTP (the server spoke first: {short(data[:40])})")
            self.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.abort()
            waiter.set_exception(BadAnswer(f"not valid HTTP ({exc})", status_class(self._status)))
            return
        limit = self._pool.max_body
        if self._declared > limit or self._size > limit:
            self.abort()  # read no further: a 1 GiB answer costs at most the bound
            said = (
                f"answer of {self._declared} bytes, over the bound of {limit} bytes"
                if self._declared > limit
                else f"answer over the bound of {limit} bytes (read no further)"
            )
            waiter.set_exception(BadAnswer(said, status_class(self._status)))
        elif self._complete:
            waiter.set_result(self._status)

    # ------------------------------------------------------------------ httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 14 and name.lower() == b"content-length":
            if value.strip().isdigit():  # llhttp itself rejects a malformed length
                self._declared = int(value)
        elif len(name) == 17 and name.lower() == b"transfer-encoding":
            self._chunked = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if self._head:
            self._complete, self._keep = True, False  # no body follows; not reused (llhttp would wait for one)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200 and self._status != 101:  # 103 Early Hints and the like: the answer follows
            self._status, self._size, self._declared, self._chunked = 0, 0, -1, False
            return
        self._complete, self._keep = True, self._parser.should_keep_alive()

    # ------------------------------------------------------------------ the pool's side

    def begin(self, waiter: asyncio.Future[int], head: bool) -> None:
        self.used = True
        self.waiter = waiter
        self._head = head
        self._status = self._size = 0
        self._declared = -1
        self._chunked = self._complete = self._keep = False

    @property
    def reusable(self) -> bool:
        return self._complete and self._keep and not self.closed

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()  # connection_lost follows, and tells the pool


class Pool:
    """Up to ``limit`` keep-alive connections to ``endpoint``; :meth:`request` sends one request.

    Runs on one event loop: the one running when it is made (timers and waiters are its)."""

    def __init__(
        self,
        endpoint: Endpoint,
        limit: int,
        *,
        max_body: int = MAX_BODY_BYTES,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.max_body = max_body
        self.keepalive = keepalive
        self._loop = asyncio.get_running_loop()
        self._idle: list[_Conn] = []  # the newest released last: taken from the end (LIFO)
        self._busy: set[_Conn] = set()
        self._count = 0  # connections open or opening
        self._waiters: deque[asyncio.Future[_Conn | None]] = deque()
        self._ssl = ssl.create_default_context() if endpoint.tls else None
        self._sweep_every = min(1.0, keepalive / 2)
        self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)

    async def request(self, head: bytes, body: bytes, timeout: float, on_sent: Callable[[], None] | None = None) -> int:
        """Send ``head`` (from :meth:`Endpoint.head`) with ``body``; the answer's status once its
        body is read. Raises TimeoutError past ``timeout``, OSError when the connection fails,
        :class:`Disconnected` when the server closes it first, BadAnswer for an answer that is
        not HTTP or is over ``max_body``. ``on_sent`` is called once a connection is in hand,
        just before the request goes out (its send time)."""
        loop = self._loop
        deadline = loop.time() + timeout
        conn = self._idle.pop() if self._idle else await self._acquire(deadline)
        while conn.closed or conn.transport is None or conn.transport.is_closing():
            # Closed under us: its place is free (lost() found it in neither list).
            self._count -= 1
            self._wake()
            if not conn.used:  # a new connection the server closed, or spoke on, before the request
                raise conn.error or Disconnected()
            # A kept connection the server ended (its keep-alive timeout) as it was taken: not
            # a failure of this request, which takes the next one.
            conn = self._idle.pop() if self._idle else await self._acquire(deadline)
        self._busy.add(conn)
        waiter: asyncio.Future[int] = loop.create_future()
        conn.begin(waiter, head.startswith(b"HEAD "))
        if on_sent is not None:
            on_sent()
        assert conn.transport is not None
        conn.transport.write(b"".join((head, str(len(body)).encode(), b"\r\n\r\n", body)))
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            status = await waiter
        except BaseException:  # failed, timed out or cancelled: the answer may still come, so drop it
            conn.abort()
            self._done_with(conn)
            raise
        finally:
            timer.cancel()
        if conn.reusable:
            self._release(conn)
        else:
            conn.abort()
            self._done_with(conn)
        return status

    async def _acquire(self, deadline: float) -> _Conn:
        """A connection: a new one while under ``limit``, else the next one released."""
        while True:
            if self._idle:
                return self._idle.pop()
            if self._count < self.limit:
                self._count += 1
                try:
                    return await asyncio.wait_for(self._connect(), max(0.0, deadline - self._loop.time()))
                except BaseException:
                    self._count -= 1
                    self._wake()
                    raise
            waiter: asyncio.Future[_Conn | None] = self._loop.create_future()
            self._waiters.append(waiter)
            timer = self._loop.call_at(deadline, _expire, waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    given = waiter.result()  # handed on as it timed out or was cancelled: pass it on
                    if given is None:
                        self._wake()
                    else:
                        self._hand_on(given)
                raise
            finally:
                timer.cancel()
            if conn is not None:
                return conn
            # None: a connection closed, so there is room to open one (loop round)

    async def _connect(self) -> _Conn:
        ep = self.endpoint
        infos = await self._loop.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
        error: OSError | None = None
        for family, type_, proto, _, addr in infos:
            try:
                sock = socket.socket(family, type_, proto)
            except OSError as exc:
                error = exc
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self._loop.sock_connect(sock, addr)
                _, conn = await self._loop.create_connection(
                    lambda: _Conn(self), sock=sock, ssl=self._ssl, server_hostname=ep.host if self._ssl else None
                )
                return conn
            except OSError as exc:  # the next address (IPv6 then IPv4 for localhost), as aiohttp does
                sock.close()
                error = exc
            except BaseException:
                sock.close()
                raise
        raise error or OSError(f"{ep.host}: no address")

    def _release(self, conn: _Conn) -> None:
        self._busy.discard(conn)
        conn.waiter = None
        conn.idle_since = self._loop.time()
        self._hand_on(conn)

    def _hand_on(self, conn: _Conn) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def _done_with(self, conn: _Conn) -> None:
        """``conn`` is closed (or closing) and will not be reused: its place in the pool is free."""
        if conn in self._busy:
            self._busy.discard(conn)
            self._count -= 1
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def lost(self, conn: _Conn) -> None:
        """The connection closed (by either side). An idle one leaves the pool here; a busy one
        is ended by its request."""
        if conn in self._busy:
            return
        try:
            self._idle.remove(conn)
        except ValueError:
            return  # never handed to the pool (failed in the connect)
        self._count -= 1
        self._wake()

    def _sweep(self) -> None:
        """Close the connections idle past ``keepalive`` (the oldest are first in the list)."""
        cutoff = self._loop.time() - self.keepalive
        while self._idle and self._idle[0].idle_since < cutoff:
            conn = self._idle.pop(0)  # out of the pool first: lost() then finds it in neither list
            self._count -= 1
            conn.abort()
        self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)

    def close(self) -> None:
        self._sweeper.cancel()
        for conn in list(self._idle) + list(self._busy):
            conn.abort()
        self._idle.clear()

    @property
    def connections(self) -> int:
        """Connections open or opening."""
        return self._count


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
