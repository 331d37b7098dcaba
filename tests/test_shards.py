"""``--shard I/N`` and ``--start-at``: one soak's load split over drivers on many hosts.

Each shard draws the soak's one arrival process and sends the arrivals whose index is I mod N,
from one wall-clock instant: the shards' requests together are that one process's, as the
target sees them.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from soakd.config import ConfigError, load_config
from soakd.config.parse import parse_instant
from soakd.load.arrivals import gaps, shard_gaps
from soakd.load.executors import ClosedLoop, OpenLoop
from soakd.run.shard import START_GATE_ENV, measure_skew, one_watcher
from soakd.workload.replay import open_trace
from soakd.workload.trace_index import BAD_LINE
from soakd.workload.traces import RowCounts
from tests.conftest import REPO, free_port, soakd_cmd, wait_for

SERVER = REPO / "tests" / "http_target_server.py"


@pytest.mark.parametrize(("arrival", "burstiness"), [("poisson", 1.0), ("constant", 1.0), ("gamma", 4.0)])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_the_shards_arrivals_together_are_the_one_process(arrival: str, burstiness: float, n: int) -> None:
    one = np.cumsum(list(itertools.islice(gaps(1.0, arrival, burstiness, seed=7), 20_000)))
    shards = [
        np.cumsum(list(itertools.islice(shard_gaps(i, n, arrival, burstiness, seed=7, chunk=1000), 20_000 // n)))
        for i in range(n)
    ]
    together = np.sort(np.concatenate(shards))
    np.testing.assert_allclose(together, one[: together.size], rtol=1e-9)
    for i, own in enumerate(shards):  # shard i holds arrivals i, i + n, i + 2n, ...
        np.testing.assert_allclose(own, one[i::n][: own.size], rtol=1e-9)


@pytest.mark.parametrize(("concurrency", "n"), [(8, 3), (5, 5), (100, 7)])
def test_the_shards_concurrency_adds_up_to_the_soaks(concurrency: int, n: int) -> None:
    parts = [ClosedLoop(concurrency, (i, n)).target_load for i in range(n)]
    assert sum(parts) == concurrency and max(parts) - min(parts) <= 1


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"load.shard": "2/2"}, "load.shard: expected I/N with 0 <= I < N"),
        ({"load.shard": "one/two"}, "load.shard: expected I/N"),
        ({"load.shard": "0/5000"}, "load.shard: at most 4096 shards"),
        ({"load.shard": "0/4", "load.concurrency": "3"}, "load.concurrency: 3 is less than the 4 shards"),
        ({"load.start_at": "tomorrow"}, "load.start_at: expected an ISO 8601 instant"),
        ({"load.start_at": "2026-12-05T14:00:00"}, "load.start_at: '2026-12-05T14:00:00' has no time zone"),
    ],
)
def test_bad_shard_and_start_name_the_key(overrides: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert needle in str(info.value)


def test_start_at_reads_iso_and_unix_seconds() -> None:
    assert parse_instant("2026-12-05T14:00:00Z") == parse_instant("2026-12-05T15:00:00+01:00") == 1796479200.0
    assert parse_instant("1796479200.5") == 1796479200.5
    assert parse_instant("") is None


def test_only_shard_0_watches_the_servers_memory() -> None:
    over = {
        "target.url": "http://lb:8000/v1",
        "target.api": "openai",
        "input.shapes": "seq:fixed(n=128)",
        "load.rate": "100",
    }
    watch = {"target.scrape": ["http://lb:8000/metrics"], "target.watch_pid": ["4242"]}
    first = one_watcher(load_config(None, {**over, **watch, "load.shard": "0/4"}))
    assert first.target.scrape == ["http://lb:8000/metrics"] and first.target.watch_pid == [4242]
    other = one_watcher(load_config(None, {**over, **watch, "load.shard": "3/4"}))
    assert other.target.scrape == [] and other.target.watch_pid == [] and other.target.url == "http://lb:8000/v1"
    alone = one_watcher(load_config(None, {**over, **watch}))
    assert alone.target.scrape == ["http://lb:8000/metrics"]


@pytest.fixture
def target() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    yield f"http://127.0.0.1:{port}", proc
    proc.kill()
    proc.wait()


def test_clock_skew_against_the_targets_date_header(target: tuple[str, subprocess.Popen[str]]) -> None:
    """Same host, same clock: the skew is zero within its stated error (a poll and a round trip)."""
    url, _ = target
    block = measure_skew(url + "/ok")
    assert block["skew_seconds"] is not None and block["error_seconds"] < 0.1
    assert abs(block["skew_seconds"]) <= block["error_seconds"] + 0.01


RATE = 50.0
DURATION = 5.0


@pytest.mark.timing  # arrival offsets bounded in ms: run alone, after the parallel e2e tests
def test_two_shards_from_one_start_interleave_as_one_poisson_process(
    target: tuple[str, subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Two shard processes, one start instant: at the server their requests are the soak's one
    seeded Poisson schedule (nine in ten expected arrivals met within 5 ms) and their gaps are
    exponential at the soak's rate; each shard reports its clock and its half; the two state
    dirs merge into the whole soak. The instant comes through the start gate a --workers parent
    uses (written once both are up: a process start here can take half a minute on a busy
    machine), from where it is --start-at's path: it becomes load.start_at."""
    url, _ = target
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    (bodies / "a.json").write_text('{"x": 1}')
    procs = []
    for i in range(2):
        args = [
            "--target", url + "/ok", "--api", "http", "--samples", str(bodies), "--warmup", "2",
            "--rate", str(RATE), "--shard", f"{i}/2", "--duration", f"{DURATION}s",
            "--state-dir", str(tmp_path / f"s{i}"), "--summary-json", str(tmp_path / f"s{i}.json"),
            "--metrics-addr", f"127.0.0.1:{free_port()}",
        ]  # fmt: skip
        env = {**os.environ, START_GATE_ENV: str(tmp_path / f"start-{i}")}
        cmd = soakd_cmd("run", *args)
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        )
    wait_for(lambda: all((tmp_path / f"start-{i}.ready").exists() for i in range(2)), 180, what="both shards up")
    start_at = time.time() + 1.0
    for i in range(2):
        (tmp_path / f"start-{i}").write_text(f"{start_at:.3f}\n")
    for p in procs:
        out, _ = p.communicate(timeout=90)
        assert p.returncode == 0, out[-3000:]
    summaries = [json.loads((tmp_path / f"s{i}.json").read_text()) for i in range(2)]
    for i, s in enumerate(summaries):
        assert (s["shard"]["index"], s["shard"]["count"]) == (i, 2)
        assert abs(s["shard"]["clock_skew_seconds"]) <= s["shard"]["clock"]["error_seconds"] + 0.05
    # A shard that came up after --start-at (a slow start on a busy machine) skipped what fell
    # due before it: the comparison starts once both were sending.
    lo, hi = max(s["shard"]["late_seconds"] for s in summaries) + 0.3, DURATION - 0.5
    assert lo < 2.0, "a shard started too late for the test to judge"
    with urllib.request.urlopen(url + "/arrivals", timeout=5) as resp:
        seen = np.sort(np.asarray(json.loads(resp.read()))) - start_at
    expected = np.cumsum(list(itertools.islice(gaps(1.0, "poisson", seed=0), 2000))) / RATE
    expected, inner = expected[(expected > lo) & (expected < hi)], seen[(seen > lo) & (seen < hi)]
    assert abs(inner.size - expected.size) <= 2, (inner.size, expected.size)  # none missing, none extra
    idx = np.searchsorted(seen, expected).clip(1, seen.size - 1)
    off = np.minimum(np.abs(seen[idx] - expected), np.abs(seen[idx - 1] - expected))
    assert np.percentile(off, 90) < 0.005 and off.max() < 0.05, np.percentile(off, [50, 90, 100])
    assert stats.kstest(np.diff(inner), stats.expon(scale=1 / RATE).cdf).pvalue > 0.001
    sent = [sum(s["requests"].values()) for s in summaries]
    assert abs(sent[0] - sent[1]) < 0.2 * sum(sent)
    merged = subprocess.run(
        soakd_cmd("report", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1")),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    doc = json.loads(merged.stdout)
    assert doc["merge"]["complete"] and doc["merge"]["shards_expected"] == 2
    assert sum(doc["requests"].values()) == sum(sent)
    assert [e["clock_skew_seconds"] for e in doc["shards"]] == [s["shard"]["clock_skew_seconds"] for s in summaries]


class _Clock:
    """What OpenLoop._schedule reads of the engine: its clock and when it started."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at

    def clock(self) -> float:
        return self.started_at


def test_a_shard_that_starts_late_joins_the_schedule_where_it_stands() -> None:
    """10 s after --start-at, shard 1/2 skips the arrivals that fell due and sends next the
    first of its own that the one process has after now: still in step with the other shard."""
    rate = 100.0
    cfg = load_config(None, {"load.rate": str(rate), "load.shard": "1/2", "load.start_at": f"{time.time() - 10:.6f}"})
    loop = OpenLoop(cfg.load)
    engine = _Clock(started_at=1000.0)
    start_at = parse_instant(cfg.load.start_at)
    assert start_at is not None
    before = time.time()
    _, first = loop._schedule(engine)  # type: ignore[arg-type]
    now = before - start_at  # where the schedule stood at the call (to a few ms)
    sent = first - engine.started_at + now  # the first send, in the schedule's time
    one = np.cumsum(list(itertools.islice(gaps(1.0, "poisson", seed=0), 5000))) / rate
    mine = one[1::2]  # shard 1 of 2: arrivals 1, 3, 5, ...
    k = int(np.argmin(np.abs(mine - sent)))
    assert abs(mine[k] - sent) < 0.01  # one of its own arrivals of the one process
    assert loop.skipped == k  # every one before it skipped, ...
    assert mine[k - 1] < now + 0.01 and mine[k] >= now - 0.01  # ... and those alone: they were past


def test_replayed_rows_split_by_index_each_row_once(tmp_path: Path) -> None:
    """``--replay`` with ``--shard I/N`` (and so ``--workers N``): row i in time order goes to
    shard i mod N, so the shards' rows together are the trace, none twice; every shard keeps the
    whole trace's clock (its first row and span), so their schedules line up."""
    trace = tmp_path / "trace.jsonl"
    # out of order within the sort window, and one bad row: the split is of the rows as replayed
    stamps = [0, 40, 20, 60, 80, 100, 130, 120, 150, 170, 200]
    lines = [json.dumps({"timestamp": t, "input_length": 10 + k, "output_length": 5}) for k, t in enumerate(stamps)]
    trace.write_text("\n".join([*lines[:4], "{not json", *lines[4:]]) + "\n")
    base = {"load.replay": str(trace), "load.replay_sort_window": "4"}
    whole_trace, whole_info = open_trace(load_config(None, base))
    whole = [(r.t, r.line) for r in whole_trace.rows(RowCounts())]
    assert len(whole) == len(stamps)
    for n in (1, 2, 3, 4):
        sent: list[tuple[float, int]] = []
        for i in range(n):
            part_trace, info = open_trace(load_config(None, {**base, "load.shard": f"{i}/{n}"}))
            assert (info.first_t, info.span_seconds, info.rows) == (whole_info.first_t, whole_info.span_seconds, 11)
            part = [(r.t, r.line) for r in part_trace.rows(RowCounts())]
            assert part == whole[i::n]
            # The replay walks the scan's index, not rows(): the same split, and the bad row in each.
            assert part_trace.index is not None
            records = np.concatenate(list(part_trace.index.chunks(part_trace.shard)))
            assert [(t, line) for t, line in records[["t", "line"]].tolist() if line != BAD_LINE] == part
            assert (records["line"] == BAD_LINE).sum() == 1
            sent += part
        assert sorted(sent) == sorted(whole) and len(set(sent)) == len(sent), n
