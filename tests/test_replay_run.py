"""``--replay`` end to end in this process (soakd/load/replay.py): a trace's rows reach a
recording OpenAI server at their intended offsets, sized as recorded; a token model in process
gets the rows' lengths; ``--record-requests`` then ``--replay`` reproduces a run's arrivals and
sizes; an overload shows as lag and drops. docs/replay.md."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from soakd.config import load_config
from soakd.run.session import run
from soakd.run.stop import StopFlag
from tests.conftest import free_port, run_soakd

SERVER = Path(__file__).resolve().parent / "openai_fake_server.py"

# e2e: the fake OpenAI server runs in its own process.
pytestmark = pytest.mark.e2e


class Recording:
    """The fake OpenAI server in its own process, noting when each request arrived
    (``time.perf_counter``: CLOCK_MONOTONIC, soakd's clock too) and what it asked for."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.file = tmp_path / "arrivals.jsonl"
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(self.port), str(self.file)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("ready"), line

    def arrivals(self, skip: int = 0) -> list[tuple[float, dict[str, Any]]]:
        """Each POST's (arrival, body), the first ``skip`` (the warm-up's) left out."""
        lines = [json.loads(x) for x in self.file.read_text().splitlines()] if self.file.exists() else []
        return [(x["t"], x["body"]) for x in lines][skip:]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Recording]:
    rec = Recording(tmp_path)
    yield rec
    rec.close()


def soak_in_process(tmp_path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """One soak in this process to its end (exit 0 asserted); its summary."""
    out = tmp_path / f"summary-{time.monotonic_ns()}.json"
    cfg = load_config(
        None,
        {
            "metrics.addr": f"127.0.0.1:{free_port()}",
            "state.dir": str(tmp_path / "state"),
            "output.summary_json": str(out),
            "model.warmup": 0,
            "model.offline_probe": 0,
            **overrides,
        },
    )
    printed = io.StringIO()
    rc = run(cfg, out=printed, stop=StopFlag())
    assert rc == 0, printed.getvalue()
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def mooncake(tmp_path: Path, n: int, gap_ms: float) -> tuple[Path, list[dict[str, Any]]]:
    """``n`` rows ``gap_ms`` apart (irregular: every third gap doubled), rows in threes sharing
    their first hash block."""
    rows, t = [], 0.0
    for i in range(n):
        rows.append(
            {"timestamp": t, "input_length": 30 + i % 7, "output_length": 1 + i % 4, "hash_ids": [i // 3, 1000 + i]}
        )
        t += gap_ms * (2 if i % 3 == 2 else 1)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


@pytest.mark.timing
@pytest.mark.parametrize("speed", [1.0, 10.0])
def test_rows_arrive_at_their_offsets_sized_as_recorded(server: Recording, tmp_path: Path, speed: float) -> None:
    path, rows = mooncake(tmp_path, 60, gap_ms=40.0)
    s = soak_in_process(
        tmp_path,
        {
            "target.url": f"http://127.0.0.1:{server.port}/v1",
            "target.api": "openai",
            "target.model": "fake-llm",
            "load.replay": str(path),
            "load.replay_speed": speed,
            "load.replay_block_tokens": 16,
            "model.warmup": 3,  # the first rows' prompts, one by one: the pool holds a connection
        },
    )
    arrivals = server.arrivals(skip=3)
    assert s["requests"]["ok"] == len(rows) == len(arrivals)
    got = np.array([t for t, _ in arrivals])
    want = np.array([r["timestamp"] for r in rows]) / 1000 / speed
    off = got - want
    late_ms = (off - np.median(off)) * 1000  # against the schedule, anchored where most rows sit
    print("arrival offsets from the trace (ms):", np.round(late_ms, 2).tolist())
    # Bounds for a shared 2-core CI host (load 9 when measured: the server's own process waits
    # for a core too). Most arrivals sit within a few ms of the trace and none comes early: the
    # offsets and the speed are applied. A stall of the host is caught up, not carried: CI once
    # held rows 2-11 of the 10x run for 50 ms (4 ms apart, a fifth of the trace), then sent them
    # at once, and every row after was on time again.
    assert np.percentile(np.abs(late_ms), 50) < 2.0, late_ms
    assert late_ms.min() > -5.0, late_ms
    assert np.mean(late_ms > 15.0) <= 0.3, late_ms
    assert late_ms.max() < 100.0, late_ms
    assert 0 < s["replay"]["on_time_ratio"] <= 1  # sent within 1 ms by soakd's clock: 0.5-0.8 at load 9-12
    # Rows a few ms apart may reach the server in either order over different connections, so
    # sizes are matched as a multiset of (max_tokens, prompt words), not position by position.
    bodies = [b for _, b in arrivals]
    words = [b["messages"][0]["content"].split() for b in bodies]
    sent = Counter((b["max_tokens"], len(w)) for b, w in zip(bodies, words, strict=True))
    # no tokenizer: 0.75 words a token
    assert sent == Counter((r["output_length"], round(r["input_length"] * 0.75)) for r in rows)
    groups = Counter(" ".join(w[:12]) for w in words)  # rows sharing a hash block share its 12 words
    assert sorted(groups.values()) == [3] * (len(rows) // 3), groups
    assert len({" ".join(w[12:]) for w in words}) == len(rows)  # and nothing past it
    rep = s["replay"]
    assert (rep["rows"], rep["rows_sent"], rep["passes"], rep["format"]) == (60, 60, 1, "mooncake")
    assert s["run"]["trace"]["sha256"] == rep["sha256"]


def test_record_then_replay_reproduces_arrivals_and_sizes(tmp_path: Path) -> None:
    """A token model in process: the trace's lengths (clipped to the spec's maximum), recorded;
    the recorded log replayed gives the same intended times and lengths."""
    path, rows = mooncake(tmp_path, 40, gap_ms=25.0)
    log1, log2 = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    common = {"model.spec": "builtin:noop", "input.shapes": "seq:fixed(n=34)"}
    s1 = soak_in_process(
        tmp_path, {**common, "load.replay": str(path), "load.replay_speed": 5.0, "output.record_requests": str(log1)}
    )
    assert s1["replay"]["rows_clipped"] == sum(r["input_length"] > 34 for r in rows)
    assert s1["record_requests"]["requests"] == 40
    # The log holds the times as sent (5x): replayed at 1x it sends them again as they were.
    s2 = soak_in_process(tmp_path, {**common, "load.replay": str(log1), "output.record_requests": str(log2)})
    assert s2["replay"]["format"] == "soakd"

    def recorded(p: Path) -> list[tuple[float, int]]:
        lines = [json.loads(x) for x in p.read_text().splitlines()[1:]]
        return sorted((x["t"], x["in"]) for x in lines)

    first, second = recorded(log1), recorded(log2)
    assert [n for _, n in first] == [min(34, r["input_length"]) for r in rows]
    assert [n for _, n in second] == [n for _, n in first]
    assert [t for t, _ in second] == pytest.approx([t for t, _ in first], abs=1e-5)
    assert [t for t, _ in first] == pytest.approx([r["timestamp"] / 1000 / 5 for r in rows], abs=1e-5)


def test_an_overload_shows_as_lag_and_drops_not_a_lower_rate(tmp_path: Path) -> None:
    """A model taking 20 ms a batch of one against rows 1 ms apart: the arrivals keep to the
    trace (offered at its rate), past max_inflight they are dropped and counted."""
    path, _ = mooncake(tmp_path, 300, gap_ms=1.0)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:150], "{garbage\n", *lines[150:]]))  # line 151: bad, mid-soak
    s = soak_in_process(
        tmp_path,
        {
            "model.spec": "builtin:sleep",
            "model.options": {"batch_ms": 20.0},
            "input.shapes": "4",
            "batcher.max_batch_size": 1,
            "load.replay": str(path),
            "load.max_inflight": 20,
            "load.drain_timeout": "5s",
            "slo.max_error_ratio": "none",
        },
    )
    rep = s["replay"]
    assert rep["rows_sent"] + rep["rows_dropped"] == 300
    assert rep["rows_dropped"] > 100 and s["requests"]["dropped"] >= rep["rows_dropped"]
    assert s["latency_ms"]["e2e"]["p99"] > 100  # latency counts from the intended time
    # The bad row: counted as bad_input with its line, the soak went on past it.
    assert s["requests"]["bad_input"] == rep["rows_bad"] == rep["rows_bad_met"] == 1
    assert rep["bad_lines"][0].startswith("line 151: not JSON")
    # Per minute (one minute here): every row due, those sent, and the completions.
    minutes = rep["arrivals"]
    assert minutes["intended"] == [300] and minutes["sent"] == [rep["rows_sent"]]
    assert minutes["completed"][0] == sum(v for k, v in s["requests"].items() if k not in ("dropped", "bad_input"))
    page = next((tmp_path / "state").glob("*/report.html")).read_text()
    assert '<h2 id="replay">' in page and "trace (intended)" in page  # the plot, in the run's own report


@pytest.mark.parametrize(
    ("text", "args", "said"),
    [
        ("Timestamp,Model,Request tokens\n1,m,2\n", (), "lacks column(s) Response tokens"),
        (
            '{"timestamp": 5, "input_length": 3, "output_length": 1}\n' * 2
            + '{"timestamp": 1, "input_length": 3, "output_length": 1}\n',
            (),
            "line 3: the timestamp steps back",
        ),
        ('{"timestamp": 5, "input_length": 3, "output_length": 1}\n', ("--rate", "10"), "remove load.rate"),
    ],
)
def test_a_bad_trace_or_flag_is_exit_2_naming_file_and_line(
    tmp_path: Path, text: str, args: tuple[str, ...], said: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    res = run_soakd("--model", "builtin:noop", "--replay", str(path), *args, "--state-dir", str(tmp_path / "s"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert said in res.stderr and "Traceback" not in res.stderr
    if not args:
        assert str(path) in res.stderr
