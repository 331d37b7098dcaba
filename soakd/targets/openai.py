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
What a server sends is bounded (docs/limits.md): a line over ``MAX_LINE_BYTES``, a line that is
no SSE field (an HTML page), a stream without a ``data:`` event, an ``error`` that is not null,
and a ``usage`` count that is not an integer within 0..``MAX_TOKENS`` make the request an
error (:class:`~soakd.targets.answers.BadAnswer`), never a lost one.
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
from aiohttp.http_exceptions import LineTooLong

from soakd.errors import TargetError
from soakd.targets.aiohttp_client import AiohttpTarget, read_body
from soakd.targets.answers import BadAnswer, parse_json, short
from soakd.targets.client import Failure, Sent
from soakd.telemetry.catalogue import Metrics
from soakd.workload.prompts import WORDS_PER_TOKEN, Prompt

log = logging.getLogger("soakd.target")

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
FLUSH_GAPS = 256  # inter-token gaps held per request before they go into the histogram
MAX_LINE_BYTES = 1024 * 1024  # one SSE line (one chunk); longer: the request is an error
# One request's token count: past it a server's usage is not a count (an int64 sum of them
# stays exact for 2**32 requests; no model's context comes near 2**31 tokens).
MAX_TOKENS = 2**31
SSE_FIELDS = frozenset((b"data", b"event", b"id", b"retry"))


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
                data = parse_json(await read_body(resp, self.max_body_bytes))
            except (ValueError, BadAnswer, aiohttp.ClientError) as exc:
                raise TargetError(f"target.url: {url}: {exc}") from None
        ids = _model_ids(data, url)
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
            if self.stream and resp.content_type != "application/json":
                await self._read_stream(resp, payload, sent)
            else:  # asked to stream, a server may still answer with one JSON completion
                await self._read_whole(resp, payload, sent)
            return "2xx"

    async def _read_stream(self, resp: aiohttp.ClientResponse, p: Prompt, sent: Sent | None) -> None:
        clock = self._clock
        first = last = 0.0
        chunks = events = 0
        usage: dict[str, Any] | None = None
        gaps: list[float] = []
        content = resp.content
        while True:
            try:
                raw = await content.readline(max_line_length=MAX_LINE_BYTES)
            except (LineTooLong, ValueError):  # aiohttp: a line past the bound
                raise BadAnswer(f"a stream line over {MAX_LINE_BYTES} bytes", "2xx") from None
            if not raw:
                break
            line = raw.strip()
            if not line or line.startswith(b":"):  # blank separators, ": keep-alive" comments
                continue
            field, _, value = line.partition(b":")
            if field != b"data":
                if field not in SSE_FIELDS:  # HTML, a JSON answer, anything but an event stream
                    raise BadAnswer(f"not an event stream: {short(line[:80])}", "2xx")
                continue
            events += 1
            data = value.strip()
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
        if not events:
            raise BadAnswer("the stream ended without a single data: event", "2xx")
        out_tokens = _tokens(usage, "completion_tokens", chunks)
        in_tokens = _tokens(usage, "prompt_tokens", p.input_tokens)
        if sent is None:  # warm-up: nothing recorded
            return
        self._count_tokens(in_tokens, out_tokens)
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
        answer = _json(await read_body(resp, self.max_body_bytes))
        if not isinstance(answer.get("choices"), list):
            raise BadAnswer(f"not a completion (no choices): {short(answer)}", "2xx")
        text = _content(answer)
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        estimate = round(len(text.split()) / WORDS_PER_TOKEN) if text else 0
        n_in = _tokens(usage, "prompt_tokens", p.input_tokens)
        n_out = _tokens(usage, "completion_tokens", estimate)
        if sent is None:
            return
        self._count_tokens(n_in, n_out)
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


def _model_ids(data: Any, url: str) -> list[str]:
    """The model ids a ``GET /models`` answer lists; TargetError naming the URL and what is
    wrong when it is not an OpenAI model list."""
    if not isinstance(data, dict):
        raise TargetError(f"target.url: {url}: not an OpenAI model list (the answer is {type(data).__name__})")
    listed = data.get("data")
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise TargetError(
            f"target.url: {url}: not an OpenAI model list ('data' is {type(listed).__name__}: {short(listed)})"
        )
    ids = []
    for i, m in enumerate(listed):
        mid = m.get("id") if isinstance(m, dict) else None
        if not isinstance(mid, str):
            raise TargetError(f"target.url: {url}: not an OpenAI model list (data[{i}] has no string 'id': {short(m)})")
        ids.append(mid)
    return ids


def _json(data: bytes) -> dict[str, Any]:
    try:
        obj = parse_json(data)
    except ValueError as exc:
        raise BadAnswer(str(exc), "2xx") from None
    if not isinstance(obj, dict):
        raise BadAnswer(f"not a JSON object: {short(data[:80])}", "2xx")
    err = obj.get("error")
    if err is not None:  # vLLM and others report a failure mid-stream as an error chunk
        said = err.get("message", err) if isinstance(err, dict) else err
        raise BadAnswer(f"error: {said if isinstance(said, str) else short(said)}"[:300], "2xx")
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
    """``usage[key]``, or ``fallback`` where the server gives none; an answer whose count is not
    an integer within 0..MAX_TOKENS (a bool, a float, 1e30, a 400-digit number) is BadAnswer."""
    value = usage.get(key) if usage is not None else None
    if value is None:
        return fallback
    if type(value) is not int or not 0 <= value <= MAX_TOKENS:  # bool is an int subclass: not a count
        raise BadAnswer(f"usage.{key} is {short(value)}, not a token count (an integer 0..{MAX_TOKENS})", "2xx")
    return value
