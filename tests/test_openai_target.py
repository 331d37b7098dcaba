"""``--api openai`` against a small fake server in its own process (tests/openai_fake_server.py)
for what a real server does not do on demand: usage sent or not, a stream that stalls mid-answer,
an error chunk, a model it does not serve. tests/test_openai_serve.py soaks a real one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, run_soakd, soak, summary_args
from tests.report_runs import soakd

SERVER = Path(__file__).resolve().parent / "openai_fake_server.py"
USAGE_PROMPT_TOKENS = 7  # what the fake's usage says, whatever the prompt


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    yield f"http://127.0.0.1:{port}/v1"
    proc.kill()
    proc.wait()


def openai_args(base: str, tmp_path: Path, config: str = "") -> list[str]:
    """The flags of a soak of the fake at ``base``; ``config``: TOML for a ``--config`` file."""
    args = ["--target", base, "--api", "openai"]
    if config:
        cfg = tmp_path / "soakd.toml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    return args


def openai_soak(base: str, tmp_path: Path, *args: str, config: str = "", rc: int = 0) -> dict[str, Any]:
    """A soak of the fake to its end (exit ``rc`` asserted); its summary."""
    return soak(tmp_path, *openai_args(base, tmp_path, config), *args, timeout=90, rc=rc)


def run_openai(base: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``soakd run`` against the fake to its end, whatever its exit; its output."""
    return run_soakd(*openai_args(base, tmp_path), *args, timeout=90)


SHORT = ("--concurrency", "2", "--duration", "2s", "--warmup", "2", "--input-shapes", "seq:fixed(n=20)")


def test_tokens_from_usage_and_per_token_timings(base: str, tmp_path: Path) -> None:
    """The server's usage is what is counted; TTFT, ITL and TPOT come once per request (ITL once
    per gap between content chunks); the default model is the first the server lists."""
    s = openai_soak(base, tmp_path, *SHORT, "--output-tokens", "8")
    ok = s["requests"]["ok"]
    assert ok > 10 and sum(s["requests"].values()) == ok
    llm = s["llm"]
    assert llm["input_tokens"] == USAGE_PROMPT_TOKENS * ok  # usage, not soakd's 20
    assert llm["output_tokens"] == 8 * ok
    assert llm["ttft_ms"]["count"] == ok and llm["tpot_ms"]["count"] == ok
    assert llm["itl_ms"]["count"] == 7 * ok
    assert 1.0 <= llm["itl_ms"]["p50"] <= 100  # the fake sends a chunk every 2 ms
    assert llm["ttft_ms"]["p50"] <= s["latency_ms"]["e2e"]["p50"]
    assert llm["output_tokens_per_second"] == pytest.approx(8 * ok / s["duration_seconds"], rel=0.01)
    assert llm["goodput_rps"] == pytest.approx(s["throughput_rps"], rel=0.01)  # no SLO: every ok one
    assert s["target"]["model"] == "fake-llm"


def test_the_report_shows_per_token_latency_and_tokens(base: str, tmp_path: Path) -> None:
    """The run's report (Markdown and HTML) carries TTFT/ITL/TPOT and the token counts of its
    summary (test_report_html checks that an in-process run's report has no such section)."""
    s = openai_soak(base, tmp_path, *SHORT, "--output-tokens", "8")
    md = soakd("report", "--state-dir", str(tmp_path / "state"), "--format", "md")
    assert md.returncode == 0, md.stderr
    section = md.stdout.split("## Per-token latency (ms)", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    llm = s["llm"]
    assert f"{llm['ttft_ms']['p50']:.3f}" in rows["TTFT"] and f"| {llm['itl_ms']['count']} |" in rows["ITL"]
    assert "TPOT" in rows
    assert f"out {llm['output_tokens']} " in section
    html = next((tmp_path / "state").glob("*/report.html")).read_text()
    assert 'id="llm"' in html and f"{llm['tpot_ms']['p99']:.3f}" in html


def test_tokens_counted_from_the_stream_without_usage(base: str, tmp_path: Path) -> None:
    """No usage: output tokens are the content chunks, input tokens the prompt's requested length;
    a stream that ends without [DONE] is complete."""
    s = openai_soak(
        base, tmp_path, *SHORT, "--target-model", "fake-nousage", "--output-tokens", "seq:uniform(min=3,max=5)"
    )
    ok = s["requests"]["ok"]
    assert ok > 10 and sum(s["requests"].values()) == ok
    llm = s["llm"]
    assert llm["input_tokens"] == 20 * ok
    assert 3 * ok < llm["output_tokens"] < 5 * ok  # drawn per request
    assert llm["itl_ms"]["count"] == llm["output_tokens"] - ok


def test_goodput_counts_requests_within_the_slos(base: str, tmp_path: Path) -> None:
    """A TPOT limit below what the server does: no request is good, throughput stays."""
    s = openai_soak(base, tmp_path, *SHORT, "--output-tokens", "8", config="[slo]\ntpot_ms = 0.001\n")
    assert s["requests"]["ok"] > 10
    assert s["llm"]["goodput_rps"] == 0 and s["llm"]["goodput_requests"] == 0


def test_a_stream_that_stalls_is_a_timeout_not_a_hang(base: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    s = openai_soak(
        base,
        tmp_path,
        "--concurrency",
        "2",
        "--duration",
        "2s",
        "--warmup",
        "0",
        "--input-shapes",
        "seq:fixed(n=5)",
        "--target-model",
        "fake-stall",
        config="[target]\nchunk_timeout = 0.5\n",
        rc=1,  # every request timed out: the default error gate fails the soak
    )
    assert time.monotonic() - t0 < 30
    assert s["slo"]["failed"] == ["error ratio (default)"]
    assert s["requests"]["timeout"] >= 2 and s["requests"]["ok"] == 0
    assert s["llm"]["ttft_ms"]["count"] == 0  # nothing is recorded for a request that never ended
    assert s["target"]["up"] is True  # a stalled stream is not a dead server


def test_an_error_chunk_is_an_error(base: str, tmp_path: Path) -> None:
    out, extra = summary_args(tmp_path)
    res = run_openai(base, tmp_path, *SHORT, "--target-model", "fake-error", "--warmup", "0", *extra)
    assert res.returncode == 1, res.stderr  # every request failed: the default error gate
    assert "SLO FAIL error ratio (default)" in res.stdout
    s = json.loads(out.read_text())
    assert s["requests"]["error"] > 0 and s["requests"]["ok"] == 0
    assert "engine died" in res.stderr  # logged once, with the server's words


def test_not_streamed(base: str, tmp_path: Path) -> None:
    """stream = false: tokens from the answer's usage; no per-token timings."""
    config = '[target]\nstream = false\nopenai_endpoint = "completions"\n'
    s = openai_soak(base, tmp_path, *SHORT, "--output-tokens", "4", config=config)
    ok = s["requests"]["ok"]
    assert ok > 10 and s["llm"]["output_tokens"] == 4 * ok
    assert s["llm"]["input_tokens"] == USAGE_PROMPT_TOKENS * ok
    assert s["llm"]["ttft_ms"]["count"] == 0 and s["llm"]["itl_ms"]["count"] == 0
    assert s["target"]["stream"] is False and s["target"]["endpoint"] == "completions"


def test_a_model_the_server_does_not_list_is_exit_2(base: str, tmp_path: Path) -> None:
    res = run_openai(base, tmp_path, *SHORT, "--target-model", "no-such-llm")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no-such-llm" in res.stderr and "fake-llm" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--input-shapes", "3x224x224"), ("input.shapes", "seq:")),
        (("--input-shapes", "seq:fixed(n=4)", "--output-tokens", "lots"), ("target.output_tokens", "lots")),
        (("--input-shapes", "seq:fixed(n=4)", "--tokenizer", "/no/such/dir"), ("target.tokenizer", "/no/such/dir")),
    ],
)
def test_bad_openai_input_is_exit_2(base: str, tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]) -> None:
    res = run_openai(base, tmp_path, "--duration", "1s", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    for w in words:
        assert w in res.stderr
    assert "Traceback" not in res.stderr


def test_chat_jsonl_and_prompt_files_from_samples(base: str, tmp_path: Path) -> None:
    d = tmp_path / "prompts"
    d.mkdir()
    (d / "a.txt").write_text("tell me a story about a fox")
    (d / "b.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3})
        + "\n\n"
        + json.dumps({"prompt": "the quick brown fox"})
        + "\n"
    )
    s = openai_soak(
        base,
        tmp_path,
        "--concurrency",
        "1",
        "--duration",
        "2s",
        "--warmup",
        "0",
        "--samples",
        str(d),
        "--output-tokens",
        "5",
        "--target-model",
        "fake-nousage",
    )
    ok = s["requests"]["ok"]
    assert ok >= 6 and sum(s["requests"].values()) == ok
    # The cycle a.txt (5 tokens out), chat (its own max_tokens 3), prompt (5): 13 per three.
    assert 13 * (ok // 3) <= s["llm"]["output_tokens"] <= 13 * (ok // 3) + 10
    (d / "c.jsonl").write_text('{"nothing": 1}\n')
    res = run_openai(base, tmp_path, "--duration", "1s", "--samples", str(d))
    assert res.returncode == 2 and "c.jsonl:1" in res.stderr


def test_synthetic_prompts_without_a_tokenizer_are_words_per_token(tmp_path: Path) -> None:
    """Without --tokenizer a prompt of N tokens is 0.75 N words, and says N tokens (the count used
    when the server sends no usage); output lengths are drawn within the spec."""
    from soakd.config import load_config  # in-process: the source alone, no server needed
    from soakd.workload.prompts import PromptSource  # in-process: the source alone, no server needed

    cfg = load_config(
        None,
        {
            "target.url": "http://127.0.0.1:1/v1",
            "target.api": "openai",
            "input.shapes": "seq:uniform(min=8,max=400)",
            "target.output_tokens": "uniform(min=2,max=9)",
        },
    )
    source = PromptSource(cfg)
    for _ in range(200):
        _, p = source.next()
        assert p.text is not None and p.max_tokens is not None and 2 <= p.max_tokens <= 9
        assert 8 <= p.input_tokens <= 400
        assert len(p.text.split()) == max(1, round(p.input_tokens * 0.75))


def test_open_loop_ttft_counts_from_the_intended_send(base: str, tmp_path: Path) -> None:
    """Open loop past what one connection carries: requests wait in the client's pool (the queue
    stage), and TTFT, counted from the intended send as e2e is, includes that wait."""
    s = openai_soak(
        base,
        tmp_path,
        "--rate",
        "100",
        "--duration",
        "2s",
        "--warmup",
        "0",
        "--input-shapes",
        "seq:fixed(n=8)",
        "--output-tokens",
        "8",
        config="[target]\nmax_connections = 1\n",
    )
    queue_p50 = s["latency_ms"]["queue"]["p50"]
    assert queue_p50 > 100  # the pool is the bottleneck: the wait dwarfs a 20 ms stream
    assert s["llm"]["ttft_ms"]["p50"] >= queue_p50
    assert s["llm"]["ttft_ms"]["p50"] <= s["latency_ms"]["e2e"]["p50"]


@pytest.mark.timing  # a one-second stall of a loaded CPU moves run A's tail
def test_compare_judges_per_token_latency(base: str, tmp_path: Path) -> None:
    """``soakd compare`` of two LLM soaks: a server whose first token comes 50 ms later is a
    TTFT regression, judged on the requests (not on the gaps between tokens); its token gaps
    and time per output token are as before, so they are not; a run against itself passes."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Requests in flight together share the server's stalls, so compare counts about one
    # independent latency per e2e time (duration / e2e, whatever the concurrency): bounding A's
    # p99 takes some 370 of them. Four tokens keep e2e near 10 ms, some 900 in 10 s, so a host
    # twice as slow still bounds it (eight tokens, 25 ms, left it at the edge on a loaded CI).
    load = ("--concurrency", "4", "--duration", "10s", "--warmup", "2", "--input-shapes", "seq:fixed(n=20)")
    slow = ("--target-model", "fake-slow-start")
    # Both soaks run at once (the async fake server serves both): each sees the same host, so a
    # stall on a loaded machine lands on both sides of the comparison rather than on one.
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(
                soak, tmp_path / side, *openai_args(base, tmp_path), *load, "--output-tokens", "4", *extra, timeout=90
            )
            for side, extra in (("a", ()), ("b", slow))
        ]
        for run in runs:
            run.result()
    a, b = (str(next((tmp_path / side).glob("*.json"))) for side in ("a", "b"))
    same = soakd("compare", a, a)
    assert same.returncode == 0 and same.stdout.rstrip().endswith("no regression"), same.stdout + same.stderr
    assert "p99 TTFT" in same.stdout and "goodput" in same.stdout
    worse = soakd("compare", a, b)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    regressions = worse.stdout.rstrip().splitlines()[-1].removeprefix("regression: ").split(", ")
    assert "p99 TTFT" in regressions, worse.stdout
    assert "p99 ITL" not in regressions and "p99 TPOT" not in regressions, worse.stdout
    ttft = next(line for line in worse.stdout.splitlines() if line.startswith("p99 TTFT"))
    assert "histogram sampling error" in ttft
