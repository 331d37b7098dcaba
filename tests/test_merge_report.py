"""``soakd report --merge``: one split_soak driven by many drivers, merged exactly.

The same requests are written once into one state dir (one driver measured them all) and
split by index over three shard dirs (``--shard I/3`` keeps every third arrival), through the
real state writer; the merged report must then hold the same buckets and percentiles as the
single one, and name a shard that is missing or did not finish.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from soakd.cli import main
from soakd.report.command import compare_command
from soakd.report.fleet import hists_from_json
from soakd.report.inputs import load_report
from soakd.run.summary import llm_block
from soakd.state import StateStore, WindowRow
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.histogram import LogHistogram

N_SHARDS = 3
WINDOWS = 4
PER_WINDOW = 3000
T0 = 1_800_000_000.0
# In process, no threads (the state writer flushes on the test's thread): the tier reader takes
# ``main`` for the process-starting helpers of other modules that share its name.
pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def _write_driver(
    state: Path, run_id: str, shard: str, windows: list[tuple[np.ndarray, np.ndarray, int]], finished: bool = True
) -> None:
    """One driver's run: per window, e2e and queue latencies of its requests and its errors."""
    clock = Clock()
    store = StateStore(state, clock=clock)
    config = {"load": {"shard": shard}, "slo": {"p99_ms": 1000.0}}
    seg = store.begin_segment(run_id, {"run_id": run_id, "model": "builtin:sleep", "config": config})
    for i, (e2e, queue, errors) in enumerate(windows):
        hists = {}
        for stage, values in (("e2e", e2e), ("queue", queue)):
            h = LogHistogram()
            h.observe_many(values)
            hists[stage] = h.snapshot()
        row = WindowRow(T0 + i, T0 + i + 1, {"ok": len(e2e), "error": errors}, hists)
        store.write_window(seg, run_id, row)
    store.flush()
    clock.t = T0 + len(windows)
    if finished:
        store.end_segment(seg, "completed", finished=True)
    store.close()


@pytest.fixture(scope="module")
def split_soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``whole``: one state dir with every request; ``shards``: the same requests, request k in
    shard k % 3 (as --shard thins arrivals by index), errors likewise."""
    tmp = tmp_path_factory.mktemp("merge")
    rng = np.random.default_rng(38)
    e2e = [rng.lognormal(np.log(0.02), 0.6, PER_WINDOW) for _ in range(WINDOWS)]
    queue = [v * rng.uniform(0.0, 0.3, PER_WINDOW) for v in e2e]
    errors = [7, 0, 12, 5]
    _write_driver(tmp / "whole", "whole", "", list(zip(e2e, queue, errors, strict=True)))
    shards = []
    for i in range(N_SHARDS):
        part = [
            (e[i::N_SHARDS], q[i::N_SHARDS], len(range(err)[i::N_SHARDS]))
            for e, q, err in zip(e2e, queue, errors, strict=True)
        ]
        _write_driver(tmp / f"shard-{i}", f"run-{i}", f"{i}/{N_SHARDS}", part)
        shards.append(tmp / f"shard-{i}")
    unfinished = tmp / "unfinished-2"
    part = [(e[2::N_SHARDS], q[2::N_SHARDS], 0) for e, q in zip(e2e, queue, strict=True)]
    _write_driver(unfinished, "run-2b", f"2/{N_SHARDS}", part, finished=False)
    return {"tmp": tmp, "whole": tmp / "whole", "shards": shards, "unfinished": unfinished}


def merged_report(*args: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["report", *args])
    text = out.getvalue()
    return rc, json.loads(text) if text.startswith("{") else text, err.getvalue()


def test_shards_merge_into_the_same_buckets_and_percentiles_as_one_driver(split_soak: dict[str, Any]) -> None:
    rc, merged, err = merged_report("--merge", *map(str, split_soak["shards"]))
    assert rc == 0, err
    whole = load_report(split_soak["whole"])
    hists = hists_from_json(merged["latency_histograms"], "merged")
    assert hists is not None and set(hists) == set(whole.hists) == {"e2e", "queue"}
    for stage, h in whole.hists.items():
        np.testing.assert_array_equal(hists[stage].counts, h.counts, err_msg=stage)
        assert hists[stage].maximum == h.maximum
        single = whole.data["latency_ms"][stage]
        for key in ("p50", "p90", "p99", "p999", "max", "count"):
            assert merged["latency_ms"][stage][key] == single[key], (stage, key)
        assert merged["latency_ms"][stage]["mean"] == pytest.approx(single["mean"], rel=1e-9)  # float sums
    assert merged["requests"] == whole.data["requests"]
    assert merged["requests"]["ok"] == WINDOWS * PER_WINDOW and merged["requests"]["error"] == 24
    assert merged["throughput_rps"] == pytest.approx(whole.data["throughput_rps"], abs=0.01)
    assert merged["merge"]["complete"] is True and merged["merge"]["latency_exact"] is True
    assert merged["slo"]["passed"] is True and "shards complete" in [c["name"] for c in merged["slo"]["checks"]]


def test_each_shard_has_its_share_health_and_time_range(split_soak: dict[str, Any]) -> None:
    rc, merged, _ = merged_report("--merge", *map(str, reversed(split_soak["shards"])))
    assert rc == 0
    shards = merged["shards"]
    assert [s["shard"]["index"] for s in shards] == [0, 1, 2]  # in shard order, however given
    assert sum(s["share"] for s in shards) == pytest.approx(1.0)
    assert all(s["share"] == pytest.approx(1 / 3, abs=0.01) for s in shards)
    assert all(s["failed"] is None and s["restarts"] == 0 for s in shards)
    assert {(s["started_at"], s["ended_at"]) for s in shards} == {("2027-01-15T08:00:00Z", "2027-01-15T08:00:04Z")}
    assert merged["merge"]["start_spread_seconds"] == 0.0


def test_a_missing_shard_is_named_and_fails_the_gate(split_soak: dict[str, Any]) -> None:
    rc, merged, err = merged_report("--merge", str(split_soak["shards"][0]), str(split_soak["shards"][2]))
    assert rc == 1
    assert merged["merge"]["missing_shards"] == ["shard 1/3"]
    assert "shards complete" in merged["slo"]["failed"]
    assert "shards complete" in err


def test_a_shard_that_did_not_finish_is_named_and_fails_the_gate(split_soak: dict[str, Any]) -> None:
    rc, merged, _ = merged_report("--merge", *map(str, split_soak["shards"][:2]), str(split_soak["unfinished"]))
    assert rc == 1
    (failed,) = merged["merge"]["failed_shards"]
    assert str(split_soak["unfinished"]) in failed and "did not finish" in failed
    assert merged["merge"]["missing_shards"] == []


def test_the_same_shard_twice_is_a_usage_error(split_soak: dict[str, Any]) -> None:
    rc, _, err = merged_report("--merge", *map(str, split_soak["shards"]), str(split_soak["unfinished"]))
    assert rc == 2
    assert "shard 2/3 given twice" in err and str(split_soak["unfinished"]) in err


def test_slo_gate_and_compare_take_the_merged_report(split_soak: dict[str, Any], tmp_path: Path) -> None:
    rc, merged, _ = merged_report("--merge", *map(str, split_soak["shards"]))
    assert rc == 0
    cfg = tmp_path / "slo.toml"
    cfg.write_text(f"[slo]\np99_ms = {merged['latency_ms']['e2e']['p99'] * 0.9}\n")
    rc, strict, _ = merged_report("--merge", *map(str, split_soak["shards"]), "--config", str(cfg))
    assert rc == 1 and strict["slo"]["failed"] == ["p99 e2e"]
    merged_json, whole_json = tmp_path / "merged.json", tmp_path / "whole.json"
    merged_json.write_text(json.dumps(merged))
    assert merged_report("--state-dir", str(split_soak["whole"]), "--output", str(whole_json))[0] == 0
    out = io.StringIO()
    rc = compare_command(argparse.Namespace(a=str(whole_json), b=str(merged_json), config=None), out)
    assert rc == 0, out.getvalue()  # the same requests: no regression
    assert "p99" in out.getvalue() and "REGRESSION" not in out.getvalue()
    slower = {**merged, "latency_histograms": None, "throughput_rps": merged["throughput_rps"] / 2}
    slower_json = tmp_path / "slower.json"
    slower_json.write_text(json.dumps(slower))
    out = io.StringIO()
    rc = compare_command(argparse.Namespace(a=str(merged_json), b=str(slower_json), config=None), out)
    assert rc == 1 and "REGRESSION" in out.getvalue(), out.getvalue()


def test_a_merged_json_merges_again_exactly(split_soak: dict[str, Any], tmp_path: Path) -> None:
    rc, first, _ = merged_report("--merge", *map(str, split_soak["shards"][:2]))
    assert rc == 1  # shard 2 missing
    path = tmp_path / "first.json"
    path.write_text(json.dumps(first))
    rc, again, _ = merged_report("--merge", str(path), str(split_soak["shards"][2]))
    assert rc == 0 and again["merge"]["missing_shards"] == []  # shards 0 and 1 are in first.json
    direct = merged_report("--merge", *map(str, split_soak["shards"]))[1]
    assert again["latency_histograms"] == direct["latency_histograms"]
    assert again["requests"] == direct["requests"]


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_markdown_and_html_show_the_shards(split_soak: dict[str, Any], fmt: str) -> None:
    rc, text, _ = merged_report("--merge", *map(str, split_soak["shards"]), "--format", fmt)
    assert rc == 0
    assert "Shards" in text and "every part present and healthy" in text
    for i in range(N_SHARDS):
        assert f"{i}/{N_SHARDS}" in text


# --------------------------------------------------------------------------- --api openai


def _write_llm_driver(state: Path, run_id: str, shard: str, streams: list[tuple[float, np.ndarray, int]]) -> None:
    """A streaming driver's run: its requests in the state, and the summary its end wrote, whose
    ``llm`` block soakd's own ``llm_block`` makes from the stream metrics it recorded."""
    _write_driver(state, run_id, shard, [(np.asarray([t for t, _, _ in streams]), np.zeros(len(streams)), 0)])
    metrics = Metrics()
    for ttft, gaps, tokens in streams:
        metrics.ttft.labels("").observe(ttft)
        metrics.itl.labels("").observe_many(gaps)
        metrics.tpot.labels("").observe(float(gaps.mean()))
        metrics.tokens.labels("output").inc(tokens)
        metrics.tokens.labels("input").inc(16)
        metrics.goodput.inc()
    summary = {
        "run_id": run_id,
        "requests": {"ok": len(streams)},
        "latency_ms": {},
        "llm": msgspec.to_builtins(llm_block(metrics, 1.0)),
    }
    (state / run_id).mkdir(exist_ok=True)
    (state / run_id / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(scope="module")
def llm_soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One streaming soak's requests measured by one driver, and the same split over 3 shards by
    index (a stream and all its token gaps go to one shard)."""
    tmp = tmp_path_factory.mktemp("llm")
    rng = np.random.default_rng(3838)
    streams = [
        (float(rng.lognormal(np.log(0.08), 0.5)), rng.lognormal(np.log(0.01), 0.4, n), int(n) + 1)
        for n in rng.integers(4, 40, 900)
    ]
    _write_llm_driver(tmp / "whole", "whole", "", streams)
    for i in range(N_SHARDS):
        _write_llm_driver(tmp / f"shard-{i}", f"run-{i}", f"{i}/{N_SHARDS}", streams[i::N_SHARDS])
    return {"whole": tmp / "whole", "shards": [tmp / f"shard-{i}" for i in range(N_SHARDS)], "tmp": tmp}


def test_ttft_itl_tpot_merge_into_the_same_buckets_and_percentiles_as_one_driver(llm_soak: dict[str, Any]) -> None:
    rc, merged, err = merged_report("--merge", *map(str, llm_soak["shards"]))
    assert rc == 0, err
    whole = load_report(llm_soak["whole"]).record.llm_block
    assert whole is not None and whole.histograms is not None
    single, hists = hists_from_json(whole.histograms, "whole"), hists_from_json(merged["llm"]["histograms"], "merged")
    assert single is not None and hists is not None and set(hists) == set(single) == {"ttft", "itl", "tpot"}
    for name, h in single.items():
        np.testing.assert_array_equal(hists[name].counts, h.counts, err_msg=name)
        assert hists[name].maximum == h.maximum
    for key in ("ttft_ms", "itl_ms", "tpot_ms"):
        mine = msgspec.to_builtins(getattr(whole, key))
        for q in ("p50", "p90", "p99", "p999", "max", "count"):
            assert merged["llm"][key][q] == mine[q], (key, q)
        assert merged["llm"][key]["mean"] == pytest.approx(mine["mean"], rel=1e-9)
    assert merged["llm"]["output_tokens"] == whole.output_tokens and merged["llm"]["goodput_requests"] == 900
    assert merged["llm"]["input_tokens"] == whole.input_tokens == 900 * 16
    # A merged JSON merges again exactly, its llm block with it.
    path = llm_soak["tmp"] / "merged.json"
    path.write_text(json.dumps(merged))
    assert merged_report("--merge", str(path))[1]["llm"]["histograms"] == merged["llm"]["histograms"]


def test_a_part_without_llm_histograms_leaves_the_timings_unmerged_and_says_so(llm_soak: dict[str, Any]) -> None:
    old = llm_soak["tmp"] / "old"
    shutil.copytree(llm_soak["shards"][2], old)
    summary_path = old / "run-2" / "summary.json"
    summary = json.loads(summary_path.read_text())
    del summary["llm"]["histograms"]  # a summary from before the histograms were kept
    summary_path.write_text(json.dumps(summary))
    rc, merged, _ = merged_report("--merge", *map(str, llm_soak["shards"][:2]), str(old))
    assert rc == 0
    assert merged["llm"]["ttft_ms"] is None and merged["llm"]["output_tokens"] > 0
    assert any("no merged TTFT/ITL/TPOT" in n and str(old) in n for n in merged["merge"]["notes"])
