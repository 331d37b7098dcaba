"""Small misbehaving HTTP servers for tests/test_hostile_servers.py: an aiohttp app on its own
event-loop thread in the test process, on a free 127.0.0.1 port, whose routes are whatever
handlers a test gives it. soakd runs against it in-process (a target driven by the test) or as
a subprocess (``soakd run --target ...``).

``Hostile({("GET", "/v1/models"): handler, ...})`` as a context manager; ``url(path)``;
``hits[path]`` counts the requests each path got (read with ``wait_for``, never a sleep).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MIB = 1024 * 1024


class Hostile:
    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.hits: Counter[str] = Counter()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hostile-server", daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> Hostile:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * MIB)
        for (method, path), handler in self.routes.items():
            app.router.add_route(method, path, self._counted(path, handler))
        self._runner = web.AppRunner(app, shutdown_timeout=0.2, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def _counted(self, path: str, handler: Handler) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            self.hits[path] += 1
            return await handler(request)

        return run

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


# --------------------------------------------------------------------------- handlers


def answer(body: bytes | str | Any, status: int = 200, content_type: str = "application/json") -> Handler:
    """Always the same answer: bytes or str as they are, anything else as JSON."""
    data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else json.dumps(body).encode()

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=data, status=status, content_type=content_type)

    return handler


def endless(block: bytes = b"x" * MIB, content_type: str = "application/json", first: bytes = b"") -> Handler:
    """A 200 whose body never ends (chunked, no Content-Length): ``first``, then ``block`` again
    and again until the client goes away."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        try:
            if first:
                await resp.write(first)
            while True:
                await resp.write(block)
        except (ConnectionError, RuntimeError):  # the client closed: what a bound does
            pass
        return resp

    return handler


def sized(n: int, block: bytes = b"x" * MIB) -> Handler:
    """A 200 of exactly ``n`` bytes, chunked (no Content-Length), sent as it is made."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        left = n
        try:
            while left > 0:
                await resp.write(block[: min(left, len(block))])
                left -= len(block)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp

    return handler


def sse(*lines: bytes, then_hang: bool = False) -> Handler:
    """A 200 event stream of ``lines`` as they are (each with its own line ends), then the end of
    the body, or (``then_hang``) ``: keep-alive`` comments every 50 ms for ever."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for line in lines:
                await resp.write(line)
            while then_hang:
                await resp.write(b": keep-alive\n\n")
                await asyncio.sleep(0.05)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp

    return handler


def chunk(content: str | None = "tok", **extra: Any) -> bytes:
    """One chat-completion SSE event."""
    body = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + json.dumps({**body, **extra}).encode() + b"\n\n"


def usage_chunk(prompt: Any = 7, completion: Any = 3) -> bytes:
    """The last chunk of a stream with ``include_usage``: the counts as given, raw JSON text."""
    text = f'{{"id": "x", "choices": [], "usage": {{"prompt_tokens": {prompt}, "completion_tokens": {completion}}}}}'
    return b"data: " + text.encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models(*ids: str) -> Handler:
    return answer({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})


def nested(depth: int) -> bytes:
    """JSON nested ``depth`` arrays deep."""
    return b"[" * depth + b"]" * depth


def v2_ready() -> dict[tuple[str, str], Handler]:
    """The routes a KServe v2 REST server answers before metadata: server and model ready."""
    return {
        ("GET", "/v2/health/ready"): answer({"ready": True}),
        ("GET", "/v2/models/m/ready"): answer({"name": "m", "ready": True}),
    }


V2_META = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}
V2_ANSWER = {"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]}
