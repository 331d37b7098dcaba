"""``--api openai``: an OpenAI-compatible LLM server (vLLM, SGLang, TGI, ``transformers serve``).

Each request POSTs ``/chat/completions`` (or ``/completions``) with the prompt the
:class:`~soakd.workload.prompts.PromptSource` drew, streamed over SSE by default. Per measured
request the target records, into the metric catalogue (whose histograms the summary's ``llm``
block reads, so the engine never knows of tokens):

- TTFT: from the request's intended send time (as e2e) to the first non-empty content delta;
- ITL: the gaps between content chunks (one chunk is one token on vLLM and ``transformers
  serve``; a server that sends several per chunk shows longer gaps);
- TPOT: (last content chunk - first) / (output tokens - 1);
- tokens: ``usage`` when the server sends it (asked for with ``stream_options``), else the
  prompt's own count and the content chunks;
- goodput: an ok request within ``slo.ttft_ms`` and ``slo.tpot_ms``.

aiohttp has no SSE client, so the stream is read here: ``data:`` lines, one JSON chunk each,
until ``data: [DONE]`` or the end of the body (``transformers serve`` sends no ``[DONE]``).
A server that stops sending mid-stream hits the per-chunk read timeout (aiohttp's
``sock_read``): the request is a timeout, never a hang. Non-streaming (``target.stream =
false``) reads one JSON answer: tokens and goodput (its TTFT is the whole answer's time), no
ITL or TPOT.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import aiohttp

from soakd.errors import TargetError
from soakd.targets.client import Failure, Sent
from soakd.targets.http import AiohttpTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.prompts import WORDS_PER_TOKEN, Prompt

log = logging.getLogger("soakd.target")

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
FLUSH_GAPS = 256  # inter-token gaps held per request before they go into the histogram


class BadAnswer(aiohttp.ClientError):
    """A 2xx answer that is not a completion (not JSON, an ``error`` chunk): counted as an error."""


class OpenAITarget(AiohttpTarget):
    api = "openai"

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        model: str | None,
        endpoint: str = "chat",
        stream: bool = True,
        chunk_timeout: float = 10.0,
        ttft_slo_ms: float | None = None,
        tpot_slo_ms: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, metrics, **kwargs)
        self.base = url.rstrip("/")
        self.model = model
        self.endpoint = endpoint
        self.stream = stream
        self._post_url = self.base + ("/chat/completions" if endpoint == "chat" else "/completions")
        self._stream_timeout = aiohttp.ClientTimeout(total=self.timeout, sock_read=chunk_timeout)
        self._whole_timeout = aiohttp.ClientTimeout(total=self.timeout)
        self._ttft = metrics.ttft.labels("")
        self._itl = metrics.itl.labels("")
        self._tpot = metrics.tpot.labels("")
        self._input_tokens = metrics.tokens.labels("input")
        self._output_tokens = metrics.tokens.labels("output")
        self._goodput = metrics.goodput
        self._ttft_limit = math.inf if ttft_slo_ms is None else ttft_slo_ms / 1e3
        self._tpot_limit = math.inf if tpot_slo_ms is None else tpot_slo_ms / 1e3

    async def _check(self) -> None:
        """GET {base}/models: the server speaks the API, and serves the model (default: its first)."""
        url = self.base + "/models"
        resp = await self._reachable("GET", url)
        async with resp:
            if resp.status != 200:
                raise TargetError(
                    f"target.url: {url}: HTTP {resp.status} (an OpenAI-compatible API base answers GET /models; "
                    "is the URL the API base, e.g. http://host:8000/v1?)"
                )
            try:
                data = await resp.json(content_type=None)
            except (ValueError, aiohttp.ClientError):
                raise TargetError(f"target.url: {url}: the answer is not JSON") from None
        listed = data.get("data") if isinstance(data, dict) else None
        ids = [m["id"] for m in listed or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if self.model is None:
            if not ids:
                raise TargetError(f"target.url: {url}: lists no models; name one with --target-model")
            self.model = ids[0]
        elif self.model not in ids:
            raise TargetError(
                f"target.model: {self.model!r} is not served at {url} (it lists: {', '.join(ids) or 'none'})"
            )
        how = "streamed" if self.stream else "not streamed"
        log.info("target %s serves %s (%s, %s)", self.base, self.model, self.endpoint, how)

    def _body(self, p: Prompt) -> bytes:
        body: dict[str, Any] = {"model": self.model, "stream": self.stream}
        if self.endpoint == "chat":
            body["messages"] = p.messages if p.messages is not None else [{"role": "user", "content": p.text}]
        else:
            body["prompt"] = p.text
        if p.max_tokens is not None:
            body["max_tokens"] = p.max_tokens
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return json.dumps(body).encode()

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        timeout = self._stream_timeout if self.stream else self._whole_timeout
        self.sending(sent)
        async with self.session.post(
            self._post_url, data=self._body(payload), headers=JSON_HEADERS, timeout=timeout
        ) as resp:
            if not 200 <= resp.status < 300:
                await resp.read()
                return self._answered(resp.status)
            if self.stream:
                await self._read_stream(resp, payload, sent)
            else:
                await self._read_whole(resp, payload, sent)
            return "2xx"

    async def _read_stream(self, resp: aiohttp.ClientResponse, p: Prompt, sent: Sent | None) -> None:
        clock = self._clock
        first = last = 0.0
        chunks = 0
        usage: dict[str, Any] | None = None
        gaps: list[float] = []
        try:
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):  # blank separators, ": keep-alive", event:/id: fields
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = _json(data)
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                if not _content(chunk):
                    continue
                now = clock()
                if chunks:
                    gaps.append(now - last)
                    if len(gaps) >= FLUSH_GAPS and sent is not None:
                        self._itl.observe_many(gaps)
                        gaps.clear()
                else:
                    first = now
                last = now
                chunks += 1
        except ValueError as exc:  # aiohttp: a line past its buffer limit
            raise BadAnswer(f"unreadable stream: {exc}") from None
        if sent is None:  # warm-up: nothing recorded
            return
        out_tokens = _tokens(usage, "completion_tokens", chunks)
        self._count_tokens(_tokens(usage, "prompt_tokens", p.input_tokens), out_tokens)
        ttft = first - sent.intended if chunks else math.inf
        tpot = (last - first) / (out_tokens - 1) if chunks and out_tokens > 1 else None
        if chunks:
            self._ttft.observe(ttft)
            if gaps:
                self._itl.observe_many(gaps)
            if tpot is not None:
                self._tpot.observe(tpot)
        if ttft <= self._ttft_limit and (tpot is None or tpot <= self._tpot_limit):
            self._goodput.inc()

    async def _read_whole(self, resp: aiohttp.ClientResponse, p: Prompt, sent: Sent | None) -> None:
        answer = _json(await resp.read())
        if sent is None:
            return
        text = _content(answer)
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        estimate = round(len(text.split()) / WORDS_PER_TOKEN) if text else 0
        n_in = _tokens(usage, "prompt_tokens", p.input_tokens)
        self._count_tokens(n_in, _tokens(usage, "completion_tokens", estimate))
        if self._clock() - sent.intended <= self._ttft_limit:  # the first token came with the last
            self._goodput.inc()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "model": self.model, "endpoint": self.endpoint, "stream": self.stream}

    def _count_tokens(self, n_in: int, n_out: int) -> None:
        self._input_tokens.inc(n_in)
        self._output_tokens.inc(n_out)

    def _failure(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, BadAnswer):
            return "bad"
        return super()._failure(exc)


def _json(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        raise BadAnswer(f"not JSON: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise BadAnswer(f"not a JSON object: {data[:80]!r}")
    if "error" in obj:  # vLLM and others report a failure mid-stream as an error chunk
        err = obj["error"]
        raise BadAnswer(f"error: {err.get('message', err) if isinstance(err, dict) else err}")
    return obj


def _content(obj: dict[str, Any]) -> str:
    """The text of a chunk or answer: chat ``delta``/``message`` content (or reasoning), or ``text``."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, dict):
            text = part.get("content") or part.get("reasoning_content")
            return text if isinstance(text, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _tokens(usage: dict[str, Any] | None, key: str, fallback: int) -> int:
    value = usage.get(key) if usage is not None else None
    return value if isinstance(value, int) and value >= 0 else fallback
