"""The replay executor on its own thread against a recording sender (soakd/load/replay.py): a
malformed row mid-trace is a ``bad_input`` outcome and the soak goes on; the per-minute counts
hold every row, sent or dropped, and every completion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from soakd.config import LoadConfig
from soakd.load import replay
from soakd.load.replay import ReplayLoop
from soakd.request import Request
from soakd.workload.replay import ReplaySource
from soakd.workload.trace_index import RowReader
from soakd.workload.traces import Row, Trace, scan
from tests.conftest import wait_for

pytestmark = pytest.mark.integration


class Recorder:
    """The engine as the executor sees it: requests completed at once, one by one."""

    def __init__(self, loop: ReplayLoop) -> None:
        self.clock = time.perf_counter
        self.started_at = self.last_completion = self.clock()
        self.loop = loop
        self.sent: list[Request] = []
        self.rejected = 0
        self.dropped = 0

    @property
    def inflight(self) -> int:
        return 0

    def make(self, intended: float, now: float) -> Request:
        raise AssertionError("a replay makes its requests from its rows")

    def send(self, reqs: list[Request]) -> None:
        self.sent += reqs
        self.last_completion = self.clock()
        self.loop.replace(self, len(reqs))

    def observe_lag(self, lags: list[float], dropped: int) -> None:
        self.dropped += dropped

    def reject(self, n: int) -> None:
        self.rejected += n


def _trace(tmp_path: Path) -> Path:
    lines = [json.dumps({"timestamp": 2 * i, "input_length": 8, "output_length": 1}) for i in range(30)]
    lines[10] = '{"timestamp": 20, "input_length": -3, "output_length": 1}'  # line 11: a negative count
    lines[20] = "{not json"  # line 21
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_rows_mid_trace_are_bad_input_with_their_lines_and_the_soak_goes_on(tmp_path: Path) -> None:
    trace = Trace(str(_trace(tmp_path)))
    info = scan(trace)
    source = ReplaySource(trace, info, sizer=lambda row: ((row.input_tokens,), row), base=None, describe="test")
    loop = ReplayLoop(LoadConfig(replay=str(trace.path), replay_speed=1.0, replay_loop=True), source)
    engine = Recorder(loop)
    loop.start(engine)
    try:
        wait_for(lambda: len(engine.sent) >= 3 * 28, timeout=30, interval=0.01, what="three passes")
    finally:
        loop.stop()
    assert info.bad == 2 and info.bad_lines == [
        "line 11: input_length must be a whole number >= 0, got -3",
        "line 21: not JSON (object keys must be strings (byte 1))",
    ]
    rows: list[Row] = [r.tensor for r in engine.sent]
    assert 11 not in {r.line for r in rows} and 21 not in {r.line for r in rows}
    assert engine.rejected == loop.counts.bad >= 2 * (len(engine.sent) // 28)  # each pass meets both
    s = loop.summary(1.0)
    assert s["rows_bad"] == 2 and s["rows_bad_met"] == engine.rejected
    minutes = s["arrivals"]
    assert minutes["bucket_seconds"] == 60.0
    assert sum(minutes["intended"]) == sum(minutes["sent"]) == sum(minutes["completed"]) == len(engine.sent)


class Full(Recorder):
    """An engine at its in-flight cap for the whole trace: every row due is dropped."""

    def __init__(self, loop: ReplayLoop) -> None:
        super().__init__(loop)
        self.lags: list[float] = []

    @property
    def inflight(self) -> int:
        return 10**9

    def observe_lag(self, lags: list[float], dropped: int) -> None:
        self.lags += lags
        self.dropped += dropped


class CountingReader(RowReader):
    """The trace file's reader, counting the rows it reads."""

    reads = 0

    def row(self, offset: int, line: int) -> Row:
        CountingReader.reads += 1
        return super().row(offset, line)


def test_rows_dropped_at_the_cap_are_counted_and_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that falls behind drops what it cannot send without reading it (the scan's index
    holds its time): every row an arrival, due in its minute, its lag observed, none sent, and the
    trace file not read once; the bad rows still counted where they stood."""
    monkeypatch.setattr(replay, "RowReader", CountingReader)
    trace = Trace(str(_trace(tmp_path)))
    info = scan(trace)
    source = ReplaySource(trace, info, sizer=lambda row: ((row.input_tokens,), row), base=None, describe="test")
    loop = ReplayLoop(LoadConfig(replay=str(trace.path), replay_speed=100.0, max_inflight=4), source)
    engine = Full(loop)
    loop.start(engine)
    try:
        wait_for(lambda: loop.exhausted, timeout=30, interval=0.01, what="the trace's end")
    finally:
        loop.stop()
    assert CountingReader.reads == 0 and engine.sent == []
    assert loop.dropped == engine.dropped == len(engine.lags) == info.rows == 28
    assert engine.rejected == loop.counts.bad == 2
    s = loop.summary(1.0)
    assert sum(s["arrivals"]["intended"]) == 28 and sum(s["arrivals"]["sent"]) == 0
