"""The network client's keep-alive pool follows the load: connections a burst opened close once
they sit idle past the keep-alive timeout, instead of staying open for the rest of the soak."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from soakd.targets.aiohttp_client import _StampingConnector

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


class Counting(asyncio.Protocol):
    """A keep-alive server that counts the client's open connections, as `ss` would."""

    open = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        Counting.open += 1

    def connection_lost(self, exc: Exception | None) -> None:
        Counting.open -= 1

    def data_received(self, data: bytes) -> None:
        self.transport.write(RESPONSE * data.count(b"\r\n\r\n"))


async def _burst_then_trickle() -> tuple[int, int]:
    Counting.open = 0
    server = await asyncio.get_running_loop().create_server(Counting, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    connector = _StampingConnector(time.perf_counter, limit=64, keepalive_timeout=0.5)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with session.get(url) as resp:
                await resp.read()

        await asyncio.gather(*(one() for _ in range(32)))  # a burst: 32 at once
        await asyncio.sleep(0.05)
        after_burst = Counting.open
        # Then one request at a time for 2 s: one connection carries it all.
        t_end = time.perf_counter() + 2.0
        while time.perf_counter() < t_end:
            await one()
            await asyncio.sleep(0.02)
        after_trickle = Counting.open
    server.close()
    await server.wait_closed()
    return after_burst, after_trickle


def test_a_burst_surplus_idles_out_while_a_trickle_keeps_one_connection() -> None:
    after_burst, after_trickle = asyncio.run(_burst_then_trickle())
    assert after_burst == 32
    # aiohttp's own FIFO reuse would touch all 32 every 32 requests and keep them all open.
    assert after_trickle <= 2, f"{after_trickle} connections still open after 2 s of one-at-a-time requests"
