"""The cheapest HTTP server we can write, for measuring HTTP *clients* (soakd's driver, Locust):
``python bench/minimal_server.py PORT`` answers every request ``200`` with a 2-byte body, keep-alive.

Written by hand on asyncio's Protocol rather than with aiohttp.web or http.server: a framework's
per-request work (routing, header objects, a thread per connection) would make the server the
bottleneck on a 2-core machine, and the bench is about the client. It parses only what it must:
the end of the headers and Content-Length. Prints "ready PORT" once it listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
HEAD_RESPONSE = RESPONSE[:-2]  # a HEAD answer carries the headers only


class Minimal(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out = []
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            total = end + 4 + length
            if len(self.buf) < total:
                break  # the body is still coming
            self.buf = self.buf[total:]
            out.append(HEAD_RESPONSE if head.startswith(b"head ") else RESPONSE)
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Minimal, "127.0.0.1", port, backlog=1024)
    print(f"ready {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(int(sys.argv[1])))
