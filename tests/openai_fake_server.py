"""A small OpenAI-compatible server for ``--api openai`` edge cases, in its own process:
``python tests/openai_fake_server.py PORT [RECORD]``. It prints "ready PORT" once it listens.
With RECORD, a file, each POST's arrival (``time.perf_counter()``: CLOCK_MONOTONIC, the same
clock as soakd's in another process) and its body are appended there as one JSON line.

Its behaviour follows the requested model (GET /v1/models lists them in this order):

- ``fake-llm``: streams ``max_tokens`` (default 8) content chunks, 2 ms apart, after a role-only
  chunk, then a usage chunk (``prompt_tokens`` = 7 whatever the prompt, so a test can tell the
  server's count from soakd's) and ``data: [DONE]``; non-streamed: one answer with that usage.
- ``fake-nousage``: the same stream without usage and without ``[DONE]`` (the body just ends,
  as ``transformers serve`` does); each content chunk holds one word.
- ``fake-stall``: two content chunks, then nothing more while the connection stays open.
- ``fake-error``: an ``error`` chunk after one content chunk.
- ``fake-slow-start``: ``fake-llm`` with its first content chunk 50 ms late (a slower prefill:
  TTFT up, the gaps between tokens as before).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web

MODELS = ("fake-llm", "fake-nousage", "fake-stall", "fake-error", "fake-slow-start")
USAGE_PROMPT_TOKENS = 7


def _chunk(model: str, content: str | None, chat: bool, **extra: object) -> bytes:
    if chat:
        choice: dict[str, object] = {"index": 0, "delta": {"content": content} if content is not None else {}}
    else:
        choice = {"index": 0, "text": content or ""}
    body = {"id": "x", "object": "chunk", "model": model, "choices": [choice], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]})


RECORD: list[str] = []  # the RECORD file, when given


async def complete(request: web.Request) -> web.StreamResponse:
    arrived = time.perf_counter()
    body = await request.json()
    if RECORD:
        with open(RECORD[0], "a") as fh:
            fh.write(json.dumps({"t": arrived, "body": body}) + "\n")
    model = body.get("model")
    if model not in MODELS:
        return web.json_response({"error": {"message": f"no model {model}"}}, status=404)
    chat = request.path.endswith("/chat/completions")
    n = int(body.get("max_tokens") or 8)
    usage = {"prompt_tokens": USAGE_PROMPT_TOKENS, "completion_tokens": n, "total_tokens": USAGE_PROMPT_TOKENS + n}
    if not body.get("stream"):
        text = " ".join(["tok"] * n)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
        return web.json_response({"id": "x", "model": model, "choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if chat:
        await resp.write(_chunk(model, None, chat))  # role only: not a token
    if model == "fake-stall":
        for _ in range(2):
            await resp.write(_chunk(model, " tok", chat))
        await asyncio.sleep(3600)
    if model == "fake-error":
        await resp.write(_chunk(model, " tok", chat))
        await resp.write(b'data: {"error": {"message": "engine died"}}\n\n')
        return resp
    if model == "fake-slow-start":
        await asyncio.sleep(0.05)
    for _ in range(n):
        await asyncio.sleep(0.002)
        await resp.write(_chunk(model, " tok", chat))
    if model in ("fake-llm", "fake-slow-start"):
        await resp.write(_chunk(model, "", chat, usage=usage))
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def main() -> None:
    port = int(sys.argv[1])
    RECORD.extend(sys.argv[2:3])
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print(f"ready {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
