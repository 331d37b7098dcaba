"""Served models that answer badly (issue #37), each case at the cheapest tier that tests it
honestly: a target driven in this process against a misbehaving server (tests/hostile_server.py)
for what one request does, and ``soakd run`` as a subprocess where the run as a whole is the
point (its counts, its exit code, its peak RSS). Then damaged summaries for ``soakd compare`` and
``soakd report --fleet``.

The rule every case checks: a request that was sent is counted with exactly one outcome, also
when the answer is malformed, oversized, endless or still in flight at the end; whatever a server
says at start is exit 2 naming the URL, never exit 3.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from soakd.cli import main
from soakd.errors import TargetError
from soakd.request import Request
from soakd.targets.client import ClientTarget
from soakd.targets.http import HttpTarget
from soakd.targets.kserve import KServeRestTarget, V2Model
from soakd.targets.openai import MAX_LINE_BYTES, OpenAITarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.prompts import Prompt
from tests.conftest import free_port, soakd_cmd, summary_args, wait_for
from tests.hostile_server import (
    DONE,
    MIB,
    V2_ANSWER,
    V2_META,
    Handler,
    Hostile,
    answer,
    chunk,
    endless,
    models,
    nested,
    sized,
    sse,
    usage_chunk,
    v2_ready,
)

PROMPT = Prompt("hello there", None, 3, 4)
DEEP = 100_000  # arrays deep: past any JSON parser's recursion limit


def drive(
    target: ClientTarget,
    payload: Any,
    n: int = 4,
    *,
    join: float | None = None,
    sent: Callable[[], bool] | None = None,
) -> Counter[str]:
    """Open ``target``, send ``n`` requests of ``payload`` at once and wait until each has its
    outcome (``join``: instead, once ``sent()`` holds, end the run after that many seconds, as
    the engine's drain does); the outcomes counted."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def done(req: Request, t_sent: float, t_end: float, outcome: str) -> None:
        with lock:
            outcomes[outcome] += 1

    target.open()
    try:
        target.start(done)
        target.submit([Request(time.perf_counter(), 0.0, None, payload) for _ in range(n)])
        if join is not None:
            if sent is not None:
                wait_for(sent, timeout=20, interval=0.01, what="the requests on the wire")
            target.join(join)
        wait_for(lambda: sum(outcomes.values()) >= n, timeout=20, interval=0.01, what=f"{n} outcomes")
    finally:
        target.close()
    assert sum(outcomes.values()) == n, outcomes  # exactly one outcome each
    return outcomes


def openai(srv: Hostile, *, stream: bool = True, timeout: float = 10.0) -> OpenAITarget:
    return OpenAITarget(
        srv.url("/v1"), Metrics(), model=None, stream=stream, max_connections=4, timeout=timeout, chunk_timeout=5.0
    )


def openai_server(completions: Handler, listing: Handler | None = None) -> Hostile:
    return Hostile({("GET", "/v1/models"): listing or models("m"), ("POST", "/v1/chat/completions"): completions})


def tokens(target: OpenAITarget) -> tuple[float, float]:
    m = target._input_tokens._value.get(), target._output_tokens._value.get()
    return float(m[0]), float(m[1])


# =========================================================================== openai: streams


def test_a_well_formed_stream_is_ok_with_the_servers_usage() -> None:
    """The baseline the hostile cases differ from: content chunks, usage, [DONE]."""
    with openai_server(sse(chunk(), chunk(), usage_chunk(7, 2), DONE)) as srv:
        target = openai(srv)
        assert drive(target, PROMPT) == {"ok": 4}
        assert tokens(target) == (28, 8)


def test_a_stream_line_past_its_bound_is_an_error_not_a_lost_request() -> None:
    """One 50 MB ``data:`` line (aiohttp's LineTooLong): each request an error, none lost."""
    line = b"data: " + b"x" * (50 * MIB) + b"\n\n"
    with openai_server(sse(chunk(), line, DONE)) as srv:
        assert drive(openai(srv), PROMPT) == {"error": 4}
    assert MAX_LINE_BYTES < 50 * MIB


@pytest.mark.parametrize(
    "completion",
    ["1" * 400, "1e30", str(2**64), "true", "-1", '"12"', "3.5"],
    ids=["400-digits", "1e30", "2^64", "true", "negative", "string", "float"],
)
def test_a_token_count_that_is_not_one_is_an_error(completion: str) -> None:
    """usage.completion_tokens that no model could send (or that is not an integer) makes the
    answer an error: counted, never an OverflowError that loses the request or a count past
    int64 in the summary; a bool is not a count."""
    with openai_server(sse(chunk(), usage_chunk(7, completion), DONE)) as srv:
        target = openai(srv)
        assert drive(target, PROMPT) == {"error": 4}
        assert tokens(target) == (0, 0)


def test_usage_null_falls_back_to_the_streams_own_count() -> None:
    """``usage: null`` (vLLM sends it on every chunk but the last) is no usage, not a bad one."""
    with openai_server(sse(chunk(usage=None), chunk(usage=None), DONE)) as srv:
        target = openai(srv)
        assert drive(target, PROMPT, n=2) == {"ok": 2}
        assert tokens(target) == (6, 4)  # the prompt's own 3, two content chunks


def test_error_null_is_not_an_error_chunk() -> None:
    """A chunk with ``"error": null`` is a chunk; one with an error object is an error."""
    with openai_server(sse(chunk(error=None), chunk(error=None), DONE)) as srv:
        assert drive(openai(srv), PROMPT) == {"ok": 4}
    with openai_server(sse(chunk(), chunk(error={"message": "engine died"}), DONE)) as srv:
        assert drive(openai(srv), PROMPT) == {"error": 4}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_an_html_200_is_an_error_not_goodput(stream: bool) -> None:
    """A proxy's HTML page with status 200 is no completion: error, no goodput."""
    page = "<!DOCTYPE html>\n<html><body>Gateway says hello</body></html>\n"
    with openai_server(answer(page, content_type="text/html")) as srv:
        target = openai(srv, stream=stream)
        assert drive(target, PROMPT) == {"error": 4}
        assert target._goodput._value.get() == 0


def test_a_json_object_without_choices_is_an_error() -> None:
    with openai_server(answer({"id": "x", "object": "chat.completion"})) as srv:
        assert drive(openai(srv, stream=False), PROMPT) == {"error": 4}


def test_a_json_completion_to_a_stream_request_is_read_as_one() -> None:
    """A server that ignores ``stream: true`` and answers one JSON completion is still read."""
    body = {"choices": [{"message": {"content": "a b c"}}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
    with openai_server(answer(body)) as srv:
        target = openai(srv)
        assert drive(target, PROMPT) == {"ok": 4}
        assert tokens(target) == (20, 12)


def test_a_stream_with_no_event_at_all_is_an_error() -> None:
    with openai_server(sse(b": just a comment\n\n")) as srv:
        assert drive(openai(srv), PROMPT) == {"error": 4}


def test_a_deeply_nested_chunk_is_an_error() -> None:
    with openai_server(sse(b"data: " + nested(DEEP) + b"\n\n", DONE)) as srv:
        assert drive(openai(srv), PROMPT) == {"error": 4}


def test_a_stream_still_out_at_the_end_is_a_timeout() -> None:
    """``: keep-alive`` comments for ever (each resets the per-chunk timeout): the requests
    still out when the drain ends are counted as timeouts, not lost."""
    with openai_server(sse(chunk(), then_hang=True)) as srv:
        target = openai(srv, timeout=60.0)

        def on_the_wire() -> bool:
            return srv.hits["/v1/chat/completions"] >= 3

        assert drive(target, PROMPT, n=3, join=0.2, sent=on_the_wire) == {"timeout": 3}


def test_a_bad_answer_in_warm_up_is_a_failed_warm_up_not_a_crash() -> None:
    """Warm-up judges answers as the soak does: every one bad is TargetError (exit 2)."""
    with openai_server(sse(chunk(), usage_chunk(7, "1" * 400), DONE)) as srv:
        target = openai(srv)
        target.open()
        try:
            with pytest.raises(TargetError, match="every warm-up request failed"):
                target.warm_up([PROMPT], 2, threading.Event())
        finally:
            target.close()


def test_an_exception_nothing_foresaw_is_an_error() -> None:
    """A bug in a request's handling (here: counting its tokens raises) is an error, logged
    once; every request still gets its outcome, so a closed loop never stops."""

    class Broken(OpenAITarget):
        def _count_tokens(self, n_in: int, n_out: int) -> None:
            raise OverflowError("int too large to convert to float")

    with openai_server(sse(chunk(), DONE)) as srv:
        target = Broken(srv.url("/v1"), Metrics(), model=None, max_connections=2, timeout=5.0)
        assert drive(target, PROMPT, n=6) == {"error": 6}


# =========================================================================== openai: non-streamed


def test_an_answer_past_the_body_bound_is_an_error_read_no_further() -> None:
    """Not streamed: a body without end is read up to the bound, then the request is an error."""
    with openai_server(endless(first=b'{"choices": [{"message": {"content": "')) as srv:
        target = openai(srv, stream=False)
        target.max_body_bytes = 4 * MIB
        assert drive(target, PROMPT) == {"error": 4}


# =========================================================================== openai: /v1/models


@pytest.mark.parametrize(
    ("listing", "says"),
    [
        (answer({"data": 5}), "'data' is int"),
        (answer({"data": [5]}), "data[0] has no string 'id'"),
        (answer({"data": [{"id": 7}]}), "data[0] has no string 'id'"),
        (answer([1, 2]), "not an OpenAI model list"),
        (answer(nested(DEEP)), "nested too deeply"),
        (answer("<html>hi</html>", content_type="text/html"), "not JSON"),
        (sized(80 * MIB), "over the bound"),
    ],
    ids=["data-int", "data-list-of-int", "id-int", "a-list", "deep", "html", "huge"],
)
def test_a_bad_model_list_is_a_target_error_naming_the_url(listing: Handler, says: str) -> None:
    with openai_server(answer({}), listing=listing) as srv:
        target = openai(srv)
        with pytest.raises(TargetError) as err:
            target.open()
        assert f"{srv.url('/v1/models')}: " in str(err.value) and says in str(err.value)


# =========================================================================== KServe v2 REST


def kserve(srv: Hostile, shapes: str = "4") -> KServeRestTarget:
    model = V2Model(srv.url(), "m", shapes, None, samples=False)
    return KServeRestTarget(srv.url(), Metrics(), model=model, max_connections=4, timeout=5.0)


def kserve_server(meta: Any = V2_META, infer: Handler | None = None) -> Hostile:
    return Hostile(
        {
            **v2_ready(),
            ("GET", "/v2/models/m"): answer(meta),
            ("POST", "/v2/models/m/infer"): infer or answer(V2_ANSWER),
        }
    )


V2_BODY = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}'


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        ("abc", "inputs is 'abc'"),
        ([5], "inputs[0] is 5"),
        ([{"name": "x", "datatype": "FP32", "shape": ["a"]}], "inputs[0].shape is ['a']"),
        ([{"name": "x", "datatype": "FP32", "shape": 5}], "inputs[0].shape is 5"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1, 1e15]}], "inputs[0].shape"),
        ([{"name": "x", "datatype": "FP32", "shape": [-1, True]}], "inputs[0].shape"),
        ([{"name": 5, "datatype": "FP32", "shape": [-1, 4]}], "inputs[0].name is 5"),
    ],
    ids=["str", "list-of-int", "shape-str", "shape-int", "shape-float", "shape-bool", "name-int"],
)
def test_malformed_v2_metadata_is_a_target_error_naming_the_key(inputs: Any, says: str) -> None:
    with kserve_server({"name": "m", "inputs": inputs}) as srv:
        with pytest.raises(TargetError) as err:
            kserve(srv, shapes="").open()
        text = str(err.value)
        assert text.startswith(f"target.url: {srv.url('/v2/models/m')}: malformed model metadata") and says in text


def test_a_metadata_shape_past_the_memory_bound_is_refused_before_any_allocation() -> None:
    """``[-1, 10**15]`` FP32 (4 PB a tensor): the bound ``--input-shapes`` is held to applies."""
    meta = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 10**15]}]}
    with kserve_server(meta) as srv:
        target = kserve(srv, shapes="")
        with pytest.raises(TargetError) as err:
            target.open()
        assert "input.shapes:" in str(err.value) and "half this host's RAM" in str(err.value)
        assert "PiB" in str(err.value)


def test_deeply_nested_metadata_is_a_target_error() -> None:
    with kserve_server(nested(DEEP)) as srv, pytest.raises(TargetError, match="nested too deeply"):
        kserve(srv).open()


@pytest.mark.parametrize(
    "infer",
    [
        answer("<html>oops</html>", content_type="text/html"),
        answer({"error": "model crashed"}),
        answer({"model_name": "m"}),
        answer(nested(DEEP)),
    ],
    ids=["html", "error", "no-outputs", "deep"],
)
def test_a_2xx_that_is_no_v2_answer_is_an_error(infer: Handler) -> None:
    with kserve_server(infer=infer) as srv:
        target = kserve(srv)
        assert drive(target, V2_BODY) == {"error": 4}
        assert target.summary()["responses"]["2xx"] == 4  # the server's status, still counted


def test_a_v2_answer_is_ok_and_error_null_is_none() -> None:
    with kserve_server(infer=answer({**V2_ANSWER, "error": None})) as srv:
        assert drive(kserve(srv), V2_BODY) == {"ok": 4}


def test_a_v2_answer_past_the_body_bound_is_an_error() -> None:
    with kserve_server(infer=endless(first=b'{"outputs": [')) as srv:
        target = kserve(srv)
        target.max_body_bytes = 2 * MIB
        assert drive(target, V2_BODY) == {"error": 4}


# =========================================================================== --api http


def http_target(srv: Hostile) -> HttpTarget:
    return HttpTarget(srv.url("/predict"), Metrics(), max_connections=2, timeout=10.0)


def test_an_http_answer_is_read_to_its_end_without_being_held() -> None:
    """Under the bound, any size is ok (the body is dropped as it comes)."""
    with Hostile({("POST", "/predict"): sized(8 * MIB), ("HEAD", "/predict"): answer("")}) as srv:
        assert drive(http_target(srv), b"{}") == {"ok": 4}


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_http_answer_past_the_bound_is_an_error(declared: bool) -> None:
    handler = answer(b"x" * (3 * MIB)) if declared else endless()
    with Hostile({("POST", "/predict"): handler, ("HEAD", "/predict"): answer("")}) as srv:
        target = http_target(srv)
        target.max_body_bytes = 2 * MIB
        assert drive(target, b"{}") == {"error": 4}


# =========================================================================== whole runs (subprocess)


def run(args: Sequence[str], cwd: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``soakd run ARGS`` to its end; its output and its summary (empty when none was written)."""
    out, extra = summary_args(cwd)
    res = subprocess.run(
        soakd_cmd("run", "--metrics-addr", f"127.0.0.1:{free_port()}", *args, *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    summary = json.loads(out.read_text()) if out.exists() else {}
    assert "Traceback" not in res.stderr, res.stderr
    return res, summary


def openai_run(srv: Hostile, *args: str) -> list[str]:
    return ["--target", srv.url("/v1"), "--api", "openai", "--input-shapes", "seq:fixed(n=8)", "--warmup", "0", *args]


def config(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "soakd.toml"
    path.write_text(text)
    return ["--config", str(path)]


@pytest.mark.parametrize(
    "stream",
    [(b"data: " + b"x" * (50 * MIB) + b"\n\n", DONE), (chunk(), usage_chunk(7, "1" * 400), DONE)],
    ids=["50MB-line", "400-digit-tokens"],
)
def test_a_run_against_bad_streams_counts_every_request(stream: tuple[bytes, ...], tmp_path: Path) -> None:
    """The issue's two critical cases, a 50 MB ``data:`` line and a 400-digit token count, in a
    closed loop with the issue's SLOs: every request is counted as an error, the loop keeps
    sending (more requests than the concurrency), the run ends in time and the error SLO is
    missed (exit 1), not met on nothing."""
    slo = config(tmp_path, "[slo]\nmax_error_ratio = 0.001\np99_ms = 1000\n")
    with openai_server(sse(*stream)) as srv:
        t0 = time.monotonic()
        res, s = run(openai_run(srv, "--concurrency", "2", "--duration", "2s", *slo), tmp_path)
        took = time.monotonic() - t0
    assert res.returncode == 1, res.stderr
    req = s["requests"]
    assert req.get("ok", 0) == 0 and req["error"] > 2, req
    assert sum(req.values()) == req["error"]
    assert took < 30


def test_a_run_whose_streams_never_end_counts_them_as_timeouts(tmp_path: Path) -> None:
    """A server that sends ``: keep-alive`` for ever: the requests still out at the end of the
    drain are timeouts in the summary, the error SLO is missed (exit 1), and the run ends
    within duration + drain, not at the 30 s request timeout."""
    with openai_server(sse(chunk(), then_hang=True)) as srv:
        t0 = time.monotonic()
        cfg = config(tmp_path, '[load]\ndrain_timeout = "1s"\n[slo]\nmax_error_ratio = 0.001\n')
        res, s = run(openai_run(srv, "--concurrency", "3", "--duration", "1s", *cfg), tmp_path)
        took = time.monotonic() - t0
    assert res.returncode == 1, res.stderr
    assert s["requests"] == {**dict.fromkeys(s["requests"], 0), "timeout": 3}, s["requests"]
    assert took < 30


@pytest.mark.parametrize("body", [nested(DEEP), b'{"data": 5}'], ids=["deep", "data-int"])
def test_a_bad_model_list_is_exit_2_naming_the_url(body: bytes, tmp_path: Path) -> None:
    with openai_server(answer({}), listing=answer(body)) as srv:
        res, _ = run(openai_run(srv, "--duration", "1s"), tmp_path)
    assert res.returncode == 2, res.stderr
    assert f"target.url: {srv.url('/v1/models')}: " in res.stderr


def test_a_petabyte_metadata_shape_is_exit_2(tmp_path: Path) -> None:
    meta = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 10**15]}]}
    with kserve_server(meta) as srv:
        res, _ = run(["--target", srv.url(), "--api", "kserve-v2", "--target-model", "m", "--duration", "1s"], tmp_path)
    assert res.returncode == 2, res.stderr
    assert "input.shapes:" in res.stderr and "half this host's RAM" in res.stderr


PEAK_RSS = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def peak_rss(args: Sequence[str], timeout: float = 90) -> tuple[int, int]:
    """``soakd run ARGS`` under a parent of its own: its exit code and its peak RSS in bytes
    (the kernel's high-water mark of the only child that parent had)."""
    res = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *soakd_cmd("run", "--metrics-addr", f"127.0.0.1:{free_port()}", *args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    rc, rss = res.stdout.split()
    return int(rc), int(rss)


@pytest.fixture
def bodies(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "bodies"
    d.mkdir()
    (d / "a.json").write_text('{"inputs": [1, 2, 3]}')
    yield d


def test_1_gib_answers_keep_soakds_peak_rss_under_1_gib(bodies: Path, tmp_path: Path) -> None:
    """The issue's 3.4 GB: every POST answered with 1 GiB (no Content-Length), concurrency 2.
    soakd reads each up to the body bound and drops it: errors, and a peak RSS far below 1 GiB."""
    with Hostile({("POST", "/predict"): sized(1024 * MIB), ("HEAD", "/predict"): answer("")}) as srv:
        out, extra = summary_args(tmp_path)
        args = ["--target", srv.url("/predict"), "--api", "http", "--samples", str(bodies)]
        rc, rss = peak_rss([*args, "--concurrency", "2", "--duration", "3s", "--warmup", "0", *extra])
    s = json.loads(out.read_text())
    assert rc in (0, 1), rc
    assert s["requests"]["error"] >= 2 and s["requests"].get("ok", 0) == 0, s["requests"]
    assert rss < 1024 * MIB, f"peak RSS {rss / MIB:.0f} MiB"


# =========================================================================== damaged files: compare, fleet

GOOD: dict[str, Any] = {
    "throughput_rps": 100.0,
    "duration_seconds": 10.0,
    "requests": {"ok": 1000, "error": 0},
    "latency_ms": {"e2e": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p999": 4.0, "max": 5.0, "mean": 1.5, "count": 1000}},
    "batch_size": {"mean": 1.0},
    "windows": [{"t": 5.0, "seconds": 5.0, "throughput_rps": 100.0, "ok": 500, "errors": 0, "latency_ms": {}}],
    "memory": {"host_rss": {"slope_bytes_per_hour": 0.0, "leak_suspected": False}},
    "run": {"host": "h", "device": "cpu", "config": {}},
    "slo": {"passed": True, "failed": [], "checks": []},
}

DAMAGE: list[tuple[str, Any, str]] = [
    ("latency_ms", "fast", "latency_ms: expected an object"),
    ("latency_ms", {"e2e": "fast"}, "latency_ms.e2e: expected an object"),
    ("latency_ms", {"e2e": {"p99": "slow"}}, "latency_ms.e2e.p99: expected a number"),
    ("windows", "many", "windows: expected a list"),
    ("windows", [5], "windows[0]: expected an object"),
    ("windows", [{"latency_ms": {"e2e": {"p99": [1]}}}], "windows[0].latency_ms.e2e.p99"),
    ("llm", "tokens", "llm: expected an object or null"),
    ("llm", {"itl_ms": {"count": "many"}}, "llm.itl_ms.count"),
    ("run", "abc", "run: expected an object or null"),
    ("run", {"config": 5}, "run.config: expected an object"),
    ("requests", 5, "requests: expected an object"),
    ("requests", {"ok": "1000"}, "requests.ok: expected a count"),
    ("requests", {"ok": True}, "requests.ok: expected a count"),
    ("requests", {"ok": 10**30}, "requests.ok: expected a count"),
    ("memory", "lots", "memory: expected an object"),
    ("memory", {"host_rss": 5}, "memory.host_rss: expected an object"),
    ("memory", {"host_rss": {"slope_bytes_per_hour": "up"}}, "memory.host_rss.slope_bytes_per_hour"),
    ("throughput_rps", "fast", "throughput_rps: expected a number"),
    ("slo", {"failed": 5}, "slo.failed"),
]


def cli(*args: str) -> tuple[int, str]:
    """``soakd ARGS`` through its entry point in this process (the offline commands load no
    model): the exit code and stderr a user gets."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, err.getvalue()


def damaged(tmp_path: Path, key: str, value: Any) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(GOOD))
    bad.write_text(json.dumps({**GOOD, key: value}))
    return good, bad


def test_the_good_summary_compares_and_makes_a_fleet(tmp_path: Path) -> None:
    """The damaged cases below differ from this one by one key."""
    good, _ = damaged(tmp_path, "x", 1)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**GOOD, "run": {"host": "g", "device": "cpu"}}))
    assert cli("compare", str(good), str(other))[0] == 0
    assert cli("report", "--fleet", str(good), str(other))[0] == 0


@pytest.mark.parametrize(("key", "value", "says"), DAMAGE, ids=[f"{d[0]}-{i}" for i, d in enumerate(DAMAGE)])
def test_compare_on_a_damaged_summary_is_exit_2_naming_file_and_key(
    key: str, value: Any, says: str, tmp_path: Path
) -> None:
    good, bad = damaged(tmp_path, key, value)
    rc, err = cli("compare", str(good), str(bad))
    assert rc == 2 and f"{bad}: " in err and says in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("key", "value", "says"), DAMAGE, ids=[f"{d[0]}-{i}" for i, d in enumerate(DAMAGE)])
def test_a_fleet_of_a_damaged_summary_is_exit_2_naming_file_and_key(
    key: str, value: Any, says: str, tmp_path: Path
) -> None:
    good, bad = damaged(tmp_path, key, value)
    rc, err = cli("report", "--fleet", str(good), str(bad))
    assert rc == 2 and f"{bad}: " in err and says in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["compare", "fleet"])
def test_deeply_nested_json_is_exit_2_naming_the_file(command: str, tmp_path: Path) -> None:
    good, _ = damaged(tmp_path, "x", 1)
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"latency_ms": ' + nested(DEEP) + b"}")
    args = ("compare", str(good), str(deep)) if command == "compare" else ("report", "--fleet", str(good), str(deep))
    rc, err = cli(*args)
    assert rc == 2 and f"{deep}: " in err and "nested too deeply" in err, err


def test_a_damaged_gpu_of_a_fleet_json_is_exit_2_naming_it(tmp_path: Path) -> None:
    """A fleet JSON whose GPU entry's report is damaged: compare and a fleet of fleets name it."""
    fleet = {
        "fleet": {"gpus": 1},
        "latency_ms": None,
        "requests": {"ok": 1},
        "gpus": [{"name": "g0", "report": {**GOOD, "requests": {"ok": "x"}}}],
    }
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    rc, err = cli("compare", str(path), str(path))
    assert rc == 2 and "gpus[0].report.requests.ok" in err, err
    rc, err = cli("report", "--fleet", str(path))
    assert rc == 2 and "gpus[0].report.requests.ok" in err, err
