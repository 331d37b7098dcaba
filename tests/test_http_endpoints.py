"""The HTTP endpoints under a crowd and under rude clients: 200 scrapers at once are all answered
promptly, a client that hangs up costs no traceback, an idle connection is closed, and what held
(501 for other methods, 404 for path tricks, 414/431 for oversized requests) still holds."""

from __future__ import annotations

import selectors
import socket
import struct
import time
import typing
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from soakd.endpoints import EndpointServer

NOOP = ("--model", "builtin:noop", "--warmup", "1", "--concurrency", "2", "--duration", "120s")


def raw(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks: list[bytes] = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def burst(port: int, n: int, limit: float = 90.0) -> tuple[int, int, float]:
    """Open ``n`` connections in one burst (microseconds apart, as a fleet's scrapers land on the
    same tick), then GET /metrics on each: (answered, failed, slowest seconds)."""
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE)
    answered = failed = 0
    slowest = 0.0
    while answered + failed < n and time.monotonic() - t0 < limit:
        for key, events in sel.select(1):
            s = typing.cast(socket.socket, key.fileobj)
            try:
                if events & selectors.EVENT_WRITE:
                    s.send(b"GET /metrics HTTP/1.0\r\n\r\n")
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                data = s.recv(65536)
            except OSError:
                data, failed = b"", failed + 1
            else:
                if data:
                    continue
                answered += 1
                slowest = time.monotonic() - t0
            sel.unregister(s)
            s.close()
    return answered, failed, slowest


def test_two_hundred_concurrent_scrapes_are_all_answered_promptly(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """200 scrapes in one burst against a busy open-loop soak: every one is answered within seconds
    (with http.server's backlog of 5, half were reset and the slowest took 28 s)."""
    d = daemon_factory("--model", "builtin:noop", "--warmup", "1", "--rate", "100000", "--duration", "120s")
    d.wait_ready()
    for _ in range(2):
        answered, failed, slowest = burst(d.port, 200)
        assert (answered, failed) == (200, 0)
        assert slowest < 10.0, f"slowest scrape took {slowest:.1f}s"
    assert "Traceback" not in d.output()


def test_clients_that_hang_up_mid_response_cost_no_traceback(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Fifty clients that reset the connection before reading the answer: the log stays clean and the
    endpoint keeps serving."""
    d = daemon_factory(*NOOP)
    d.wait_ready()
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.close()
    time.sleep(1.0)
    assert "soakd_requests_total" in d.metrics()
    out = d.output()
    assert "Traceback" not in out and "BrokenPipe" not in out and "ConnectionReset" not in out, out


def test_what_held_other_methods_path_tricks_and_oversized_requests(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Read-only and strict: POST/PUT/DELETE 501, path tricks 404, a huge request line 414, huge headers 431."""
    d = daemon_factory(*NOOP)
    d.wait_ready()
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert status_of(raw(d.port, f"{method} /metrics HTTP/1.0\r\n\r\n".encode())) == 501
    for path in ("/../etc/passwd", "/metrics/../../x", "/%2e%2e/", "/status.json", "/metrics%00"):
        assert status_of(raw(d.port, f"GET {path} HTTP/1.0\r\n\r\n".encode())) == 404, path
    assert status_of(raw(d.port, b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n")) == 414
    headers = b"".join(b"X-%d: y\r\n" % i for i in range(200))
    assert status_of(raw(d.port, b"GET /metrics HTTP/1.0\r\n" + headers + b"\r\n")) == 431
    assert "Traceback" not in d.output()


def test_an_idle_connection_is_closed() -> None:
    """A client that connects and sends nothing is disconnected after the idle timeout, freeing its thread."""
    server = EndpointServer("127.0.0.1:0", CollectorRegistry(), idle_timeout=0.5)
    server.start()
    try:
        port = int(server.address.rpartition(":")[2])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            t0 = time.monotonic()
            assert s.recv(1024) == b""  # the server closed it
            assert time.monotonic() - t0 < 5
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            assert resp.status == 200  # and still serves others
    finally:
        server.close()


def test_the_server_listens_on_ipv6_loopback() -> None:
    """`[::1]:PORT` serves over IPv6 and reports its address with brackets."""
    try:
        server = EndpointServer("[::1]:0", CollectorRegistry())
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server.start()
    try:
        assert server.address.startswith("[::1]:")
        port = int(server.address.rpartition(":")[2])
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.close()


def test_a_missing_page_is_404_not_an_error() -> None:
    """urllib sees 404 for an unknown path (the handler's own answer, not a 500)."""
    server = EndpointServer("127.0.0.1:0", CollectorRegistry())
    server.start()
    try:
        port = int(server.address.rpartition(":")[2])
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
        assert info.value.code == 404
    finally:
        server.close()
