"""`--api http`'s own client (soakd/targets/http1.py) against a scripted server on a real socket:
every way an answer can end is read as a user would count it, and the pool holds its bounds."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from soakd.targets.answers import BadAnswer
from soakd.targets.http import HttpTarget
from soakd.targets.http1 import Disconnected, Endpoint, Pool
from soakd.telemetry.catalogue import Metrics

# What the server answers to a request for each path (None: say nothing).
ANSWERS: dict[str, bytes | None] = {
    "/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    "/hints": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
    "/chunked": b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    "/close": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    "/until-close": b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 300,
    "/declared-big": b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n" + b"x" * 10,
    "/big": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"y" * 1024 + b"\r\n",
    "/cut": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
    "/garbage": b"SSH-2.0-OpenSSH_9.2\r\n",
    "/stall": None,
}


class Scripted(asyncio.Protocol):
    """Answers each request by its path; counts connections open and requests seen."""

    open = 0
    requests = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buf = b""
        Scripted.open += 1

    def connection_lost(self, exc: Exception | None) -> None:
        Scripted.open -= 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            lengths = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
            length = lengths[0] if lengths else 0
            if len(rest) < length:
                return
            self.buf = rest[length:]
            Scripted.requests += 1
            method, path = head.split(b" ")[:2]
            answer = ANSWERS[path.decode()]
            if answer is None:
                continue
            if method == b"HEAD":
                answer = answer.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
            self.transport.write(answer)
            if path in (b"/close", b"/until-close", b"/cut", b"/big", b"/garbage"):
                self.transport.close()


def with_scripted_server(test: Callable[[str], Awaitable[None]]) -> None:
    async def scripted_session() -> None:
        Scripted.open = Scripted.requests = 0
        server = await asyncio.get_running_loop().create_server(Scripted, "127.0.0.1", 0)
        try:
            await test(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(scripted_session())


def post_head(base: str, path: str) -> bytes:
    return Endpoint(base + path).head("POST", {"Content-Type": "application/json"})


def test_each_way_an_answer_ends_is_read_and_the_connection_kept_only_when_it_can_be() -> None:
    async def pool_checks(base: str) -> None:
        pool = Pool(Endpoint(base), limit=4, max_body=512)
        assert await pool.request(post_head(base, "/ok"), b'{"x": 1}', 5.0) == 200
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200
        assert await pool.request(post_head(base, "/chunked"), b"{}", 5.0) == 503
        assert await pool.request(post_head(base, "/hints"), b"{}", 5.0) == 201  # the answer after the hints
        assert pool.connections == 1 and Scripted.open == 1  # four answers on one kept connection
        assert await pool.request(post_head(base, "/close"), b"{}", 5.0) == 200
        assert await pool.request(post_head(base, "/until-close"), b"{}", 5.0) == 200
        head = Endpoint(base + "/ok").head("HEAD", {})
        assert await pool.request(head, b"", 5.0) == 200  # declares 2 bytes, sends none
        with pytest.raises(BadAnswer, match="of 1000000000 bytes, over the bound of 512 bytes"):
            await pool.request(post_head(base, "/declared-big"), b"{}", 5.0)
        with pytest.raises(BadAnswer, match="over the bound of 512"):
            await pool.request(post_head(base, "/big"), b"{}", 5.0)
        with pytest.raises(Disconnected):
            await pool.request(post_head(base, "/cut"), b"{}", 5.0)
        with pytest.raises(BadAnswer, match="not valid HTTP"):
            await pool.request(post_head(base, "/garbage"), b"{}", 5.0)
        with pytest.raises(TimeoutError):
            await pool.request(post_head(base, "/stall"), b"{}", 0.2)
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200
        await asyncio.sleep(0.05)  # let the server see the closes
        assert pool.connections == 1 and Scripted.open == 1  # every failed connection was closed
        assert Scripted.requests == 13
        pool.close()

    with_scripted_server(pool_checks)


def test_requests_past_the_limit_wait_for_a_connection_within_their_deadline() -> None:
    async def pool_checks(base: str) -> None:
        pool = Pool(Endpoint(base), limit=2)
        ok = await asyncio.gather(*(pool.request(post_head(base, "/ok"), b"{}", 5.0) for _ in range(50)))
        assert ok == [200] * 50 and Scripted.open == 2
        stalls = [asyncio.ensure_future(pool.request(post_head(base, "/stall"), b"{}", 0.3)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):  # no connection frees in time: the wait is in the deadline
            await pool.request(post_head(base, "/ok"), b"{}", 0.1)
        for s in stalls:
            with pytest.raises(TimeoutError):
                await s
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200  # the stalled ones made room
        assert pool.connections == 1
        pool.close()

    with_scripted_server(pool_checks)


def test_a_kept_connection_the_server_ends_is_not_a_failed_request() -> None:
    """The server closes an idle keep-alive connection (its own timeout), before or just as the
    next request takes it: that request goes out on a new connection and is answered."""

    async def pool_checks(base: str) -> None:
        pool = Pool(Endpoint(base), limit=4)
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200
        (kept,) = pool._idle
        assert kept.transport is not None
        kept.transport.close()  # closing, as after the server's FIN: its connection_lost has not run yet
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200
        for conn in list(pool._idle):  # ended by the server while idle, seen before the next request
            assert conn.transport is not None
            conn.transport.close()
        await asyncio.sleep(0.05)
        assert pool.connections == 0
        assert await pool.request(post_head(base, "/ok"), b"{}", 5.0) == 200
        assert pool.connections == 1 and Scripted.requests == 3
        pool.close()

    with_scripted_server(pool_checks)


def test_a_burst_surplus_idles_out_while_a_trickle_keeps_one_connection() -> None:
    async def pool_checks(base: str) -> None:
        pool = Pool(Endpoint(base), limit=64, keepalive=0.3)
        await asyncio.gather(*(pool.request(post_head(base, "/ok"), b"{}", 5.0) for _ in range(32)))
        after_burst = Scripted.open
        loop = asyncio.get_running_loop()
        t_end = loop.time() + 1.2
        while loop.time() < t_end:  # one request at a time: the newest idle connection carries it
            await pool.request(post_head(base, "/ok"), b"{}", 5.0)
            await asyncio.sleep(0.02)
        assert after_burst == 32 and Scripted.open == 1 and pool.connections == 1
        pool.close()

    with_scripted_server(pool_checks)


def test_a_url_it_cannot_use_is_named() -> None:
    with pytest.raises(ValueError, match="ftp://h/: not an http"):
        Endpoint("ftp://h/")
    with pytest.raises(ValueError, match="port is not a number"):
        Endpoint("http://h:99999/")
    ep = Endpoint("http://[::1]:8080/v1/predict?x=1")
    assert ep.head("POST", {}) == b"POST /v1/predict?x=1 HTTP/1.1\r\nHost: [::1]:8080\r\nContent-Length: "


def test_https_is_verified_against_the_trusted_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    """An https:// target: answered over TLS when its certificate is trusted (``SSL_CERT_FILE``,
    as a private CA is given to OpenSSL), refused with the verification error when it is not."""
    fixtures = Path(__file__).parent / "fixtures"
    cert, key = fixtures / "tls-127.0.0.1.crt", fixtures / "tls-127.0.0.1.key"

    async def tls_session(trusted: bool) -> int | str:
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        server = await asyncio.get_running_loop().create_server(Scripted, "127.0.0.1", 0, ssl=server_ctx)
        base = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        if trusted:
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        else:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        pool = Pool(Endpoint(base), limit=2)
        try:
            return await pool.request(post_head(base, "/ok"), b"{}", 5.0)
        except ssl.SSLCertVerificationError as exc:  # as the target's health and logs word it
            return HttpTarget(base, Metrics(), max_connections=1, timeout=5.0)._reason(exc)
        finally:
            pool.close()
            server.close()

    assert asyncio.run(tls_session(trusted=True)) == 200
    assert asyncio.run(tls_session(trusted=False)) == "certificate verify failed: self-signed certificate"
