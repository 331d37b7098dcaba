"""``--api openai`` against a real server: ``transformers serve`` on CPU, in its own process and
its own virtual environment (scripts/servers-venv.sh; found at $SOAKD_SERVERS_VENV or
<repo>/.venv-servers, else these tests skip), hosting a tiny random Llama the test builds with
tests/tiny_llm.py (no hub access). A streamed soak, a non-streamed one, and the server killed and
restarted mid-soak."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, free_port, metric_value, run_soakd, wait_for

REPO = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT = 180.0  # importing transformers and torch on a shared 2-core box


def servers_python() -> Path:
    venv = Path(os.environ.get("SOAKD_SERVERS_VENV", REPO / ".venv-servers"))
    py = venv / "bin" / "python"
    if not py.is_file():
        pytest.skip(f"no servers venv at {venv} (build it with scripts/servers-venv.sh, or set SOAKD_SERVERS_VENV)")
    probe = subprocess.run([str(py), "-c", "import transformers, fastapi, uvicorn"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{venv} has no transformers[serving]: {probe.stderr.strip().splitlines()[-1:]}")
    return py


class Serve:
    """``transformers serve MODEL`` on a fixed port; ``kill()`` and ``start()`` again reuse it."""

    def __init__(self, python: Path, model: Path, log: Path) -> None:
        self.python = python
        self.model = str(model)
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Serve:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
        cli = self.python.parent / "transformers"
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [str(cli), "serve", self.model, "--device", "cpu", "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            )
        wait_for(self._answers, SERVER_START_TIMEOUT, interval=0.5, what=f"transformers serve on {self.base}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"transformers serve exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.base + "/models", timeout=2) as resp:
                return self.model in resp.read().decode()
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    py = servers_python()
    root = tmp_path_factory.mktemp("tiny-llm")
    model = root / "model"
    subprocess.run(
        [str(py), str(REPO / "tests" / "tiny_llm.py"), str(model)],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    s = Serve(py, model, root / "serve.log").start()
    yield s
    s.kill()


def soak_args(serve: Serve, tmp_path: Path, *args: str) -> list[str]:
    return [
        "--target",
        serve.base,
        "--api",
        "openai",
        "--input-shapes",
        "seq:uniform(min=4,max=16)",
        "--output-tokens",
        "8",
        "--concurrency",
        "2",
        "--warmup",
        "2",
        "--summary-json",
        str(tmp_path / "summary.json"),
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]


def summary(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "summary.json").read_text())  # type: ignore[no-any-return]


def test_streamed_soak(serve: Serve, tmp_path: Path) -> None:
    """TTFT, ITL and tokens in /metrics while it runs, and in the summary's llm block after."""
    d = Daemon(soak_args(serve, tmp_path, "--duration", "8s"), tmp_path)
    try:
        d.wait_ready()
        wait_for(
            lambda: (metric_value(d.metrics(), "soakd_inter_token_latency_seconds_count") or 0) > 10,
            20,
            what="inter-token latencies in /metrics",
        )
        text = d.metrics()
        assert (metric_value(text, "soakd_time_to_first_token_seconds_count") or 0) > 0
        assert (metric_value(text, "soakd_time_per_output_token_seconds_count") or 0) > 0
        assert (metric_value(text, "soakd_tokens_total", 'kind="output"') or 0) > 0
        assert (metric_value(text, "soakd_tokens_total", 'kind="input"') or 0) > 0
        assert (metric_value(text, "soakd_goodput_requests_total") or 0) > 0
        assert d.proc.wait(60) == 0, d.output()
    finally:
        d.stop()
    s = summary(tmp_path)
    ok = s["requests"]["ok"]
    assert ok > 5 and sum(s["requests"].values()) == ok, s["requests"]
    llm = s["llm"]
    # A random model may end early on its EOS token; never past max_tokens.
    assert 0.5 * 8 * ok <= llm["output_tokens"] <= 8 * ok
    assert llm["input_tokens"] >= 4 * ok  # the server's usage: the prompt and its chat template
    assert llm["ttft_ms"]["count"] == ok
    assert llm["itl_ms"]["count"] >= 0.5 * (llm["output_tokens"] - ok)
    assert 0 < llm["ttft_ms"]["p50"] <= s["latency_ms"]["e2e"]["p50"]
    assert llm["tpot_ms"]["p50"] > 0 and llm["output_tokens_per_second"] > 0
    assert llm["goodput_rps"] == pytest.approx(s["throughput_rps"], rel=0.02)
    assert s["target"]["model"] == serve.model  # the first (only) of GET /models


def test_non_streamed_soak(serve: Serve, tmp_path: Path) -> None:
    cfg = tmp_path / "soakd.toml"
    cfg.write_text("[target]\nstream = false\n")
    d = Daemon(["--config", str(cfg), *soak_args(serve, tmp_path, "--duration", "5s")], tmp_path)
    try:
        assert d.proc.wait(90) == 0, d.output()
    finally:
        d.stop()
    s = summary(tmp_path)
    ok = s["requests"]["ok"]
    assert ok > 5 and sum(s["requests"].values()) == ok, s["requests"]
    assert 0.5 * 8 * ok <= s["llm"]["output_tokens"] <= 8 * ok
    assert s["llm"]["ttft_ms"]["count"] == 0  # no stream, no per-token timings
    assert s["target"]["stream"] is False


def test_server_killed_and_restarted_mid_soak(serve: Serve, tmp_path: Path) -> None:
    """target_up goes 0 while the server is gone, the soak goes on, and the summary holds the down
    time. After the other soaks of the module: it restarts the shared server."""
    lenient = tmp_path / "lenient.toml"  # the outage's errors are what this test checks, not a gate
    lenient.write_text("[slo]\nmax_error_ratio = 1.0\n")
    d = Daemon([*soak_args(serve, tmp_path), "--config", str(lenient)], tmp_path)  # until stopped
    up = f'target="{serve.base}"'
    try:
        d.wait_ready()
        serve.kill()
        t_kill = time.monotonic()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 0, 10, what="target_up 0")
        serve.start()
        wait_for(lambda: metric_value(d.metrics(), "soakd_target_up", up) == 1, 20, what="target_up 1 again")
        down_for = time.monotonic() - t_kill
        ok_then = metric_value(d.metrics(), "soakd_requests_total", 'outcome="ok"') or 0
        wait_for(
            lambda: (metric_value(d.metrics(), "soakd_requests_total", 'outcome="ok"') or 0) > ok_then + 5,
            20,
            what="requests ok after the restart",
        )
        assert d.stop() == 0, d.output()
    finally:
        d.stop()
    s = summary(tmp_path)
    assert s["requests"]["error"] > 0 and s["requests"]["ok"] > 0
    tg = s["target"]
    assert tg["outages"] == 1 and tg["up"] is True
    assert 0.5 * down_for <= tg["down_seconds"] <= down_for + 1.0


EXACT_CHECK = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from soakd.config import load_config
from soakd.workload.prompts import WORDS, PromptSource

bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator([" ".join(WORDS[i::7]) for i in range(7)] * 3, trainers.BpeTrainer(vocab_size=300))
bpe.save(sys.argv[2] + "/tokenizer.json")
for path in sys.argv[1:]:
    cfg = load_config(None, {"target.url": "http://127.0.0.1:1/v1", "target.api": "openai",
                             "input.shapes": "seq:uniform(min=1,max=300)", "target.tokenizer": path})
    source = PromptSource(cfg)
    tok = Tokenizer.from_file(path + "/tokenizer.json")
    for _ in range(300):
        _, p = source.next()
        n = len(tok.encode(p.text, add_special_tokens=False).ids)
        assert n == p.input_tokens, (path, n, p.input_tokens)
    print(path, "exact" if source.exact else "approximate")
"""


def test_tokenizer_makes_prompts_of_exact_length(serve: Serve, tmp_path: Path) -> None:
    """--tokenizer DIR: each synthetic prompt re-encodes to exactly its drawn length, for the
    model's WordLevel tokenizer and a byte-level BPE. Run with the servers' python, which has the
    `tokenizers` package that soakd's own environment does not."""
    bpe = tmp_path / "bpe"
    bpe.mkdir()
    res = subprocess.run(
        [str(serve.python), "-c", EXACT_CHECK, serve.model, str(bpe)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(" exact") == 2, res.stdout


REPLAY_EXACT = """
import sys
from tokenizers import Tokenizer
from soakd.config import load_config
from soakd.workload.replay_prompts import PromptSizer
from soakd.workload.traces import Row

cfg = load_config(None, {"target.url": "http://127.0.0.1:1/v1", "target.api": "openai", "load.replay": sys.argv[2],
                         "target.tokenizer": sys.argv[1], "load.replay_block_tokens": 16})
size = PromptSizer(cfg)
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
prompts = [size(Row(0.0, n, 4, i, (1, 2, 3) if i % 2 else (1, 2, 9)))[1] for i, n in enumerate(range(40, 80))]
for p in prompts:
    assert len(tok.encode(p.text, add_special_tokens=False).ids) == p.input_tokens, p
shared = [tok.encode(p.text, add_special_tokens=False).ids[:32] for p in prompts]
assert all(s == shared[0] for s in shared), "rows sharing hash ids 1 and 2 share their first 32 tokens"
print("exact" if size.exact else "approximate")
"""


def test_replay_prompts_are_exact_and_share_hash_blocks(serve: Serve, tmp_path: Path) -> None:
    """--replay with --tokenizer: each prompt re-encodes to exactly its row's input_length, and
    rows sharing hash ids share those blocks' tokens (the servers' python has `tokenizers`); then
    a Mooncake trace replayed against transformers serve: every row answered, max_tokens as
    recorded (the server's usage counts the output tokens)."""
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 100 * i, "input_length": 8 + i, "output_length": 1 + i % 3, "hash_ids": [0]} for i in range(12)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = subprocess.run(
        [str(serve.python), "-c", REPLAY_EXACT, serve.model, str(trace)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert res.returncode == 0 and "exact" in res.stdout, res.stdout + res.stderr
    args = ["--target", serve.base, "--api", "openai", "--replay", str(trace), "--replay-speed", "2", "--warmup", "1"]
    args += ["--summary-json", str(tmp_path / "summary.json"), "--state-dir", str(tmp_path / "state")]
    done = run_soakd(*args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    s = summary(tmp_path)
    assert s["requests"]["ok"] == len(rows) and s["replay"]["rows_sent"] == len(rows)
    assert s["llm"]["output_tokens"] <= sum(int(str(r["output_length"])) for r in rows)
