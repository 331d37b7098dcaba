"""`soakd report --fleet` and fleet `soakd compare`: real state dirs of short CPU soaks, one per "GPU".

The GPUs are the shared report runs (tests/report_runs.py: builtin:sleep at 2 ms and 8 ms per
batch, and one with an unmeetable SLO) plus a run of builtin:leak_host with the leak detector
scaled to seconds, stopped once the live monitor flags it.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from soakd.cli import main
from soakd.record.write import stage_summary
from soakd.report.fleet import hists_from_json
from soakd.report.inputs import load_report
from soakd.telemetry.histogram import HistSnapshot
from tests.conftest import REPO, free_port, metric_value, scrape, soakd_cmd, wait_for
from tests.report_runs import runs, soakd

# 20 MiB/s of host memory kept, judged on a seconds scale (as tests/test_leak_live.py does).
LEAK_TOML = """
[model]
spec = "builtin:leak_host"
warmup = 2
[model.options]
mib_per_s = 20.0
max_mib = 1500
[memory]
interval = "0.2s"
[state]
flush_interval = "1s"
window = "1s"
[leak]
warmup = "2s"
window = "60s"
min_span = "3s"
bin = "0.5s"
trough_span = "1s"
persistence = "2s"
evaluate_interval = "0.5s"
[leak.min_slope_bytes_per_hour]
default = 2e9
"""


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """State dirs: fast, slow, strict (SLO missed) and leak. The leak run starts first and
    overlaps the shared runs (builtin:sleep barely uses the CPU); it is stopped (SIGTERM, as
    a user ends a soak) once its monitor says host_rss is suspected."""
    tmp = tmp_path_factory.mktemp("fleet")
    cfg = tmp / "leak.toml"
    cfg.write_text(LEAK_TOML)
    leak, log, port = tmp / "leak-state", tmp / "leak.log", free_port()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            soakd_cmd("run", "--config", str(cfg), "--concurrency", "2", "--duration", "120s",
                      "--state-dir", str(leak), "--metrics-addr", f"127.0.0.1:{port}"),
            cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        shared = runs("fast", "slow", "strict")
        flagged = 'series="host_rss"'
        wait_for(
            lambda: metric_value(scrape(port), "soakd_leak_suspected", flagged) == 1,
            120,
            what=f"soakd_leak_suspected{{{flagged}}} 1",
        )
    finally:
        proc.terminate()
        proc.wait(300)
    assert proc.returncode == 0, log.read_text()[-4000:]
    for run in shared.values():
        assert run.rc in (0, 1), run.describe()  # strict misses its SLO: exit 1
    return {**{n: r.state_dir for n, r in shared.items()}, "leak": leak}


def fleet(
    *sources: Path | str, fmt: str = "json", extra: tuple[str, ...] = (), process: bool = False
) -> tuple[int, Any, str]:
    """``soakd report --fleet``: in this process (cheap), or as a real ``python -m soakd``."""
    args = ["report", "--fleet", *map(str, sources), "--format", fmt, *extra]
    if process:
        res = soakd(*args)
        rc, stdout, stderr = res.returncode, res.stdout, res.stderr
    else:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(args)
        stdout, stderr = out.getvalue(), err.getvalue()
    body = json.loads(stdout) if fmt == "json" and stdout.strip() else stdout
    return rc, body, stderr


def gpu(doc: dict[str, Any], source: Path | str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [g for g in doc["gpus"] if g["source"] == str(source)]
    (entry,) = entries
    return entry


def counts(hists: dict[str, HistSnapshot], stage: str) -> npt.NDArray[np.int64]:
    return hists[stage].counts


def test_merged_histograms_are_the_sum_of_the_gpus(gpus: dict[str, Path]) -> None:
    """Per stage, the fleet's bucket counts are the sum of each GPU's, and its percentiles are
    read from that sum: every request of every GPU, not an average of per-GPU p99s."""
    rc, doc, err = fleet(gpus["fast"], gpus["slow"])
    assert rc == 0, err
    per_gpu = [load_report(gpus[n]).hists for n in ("fast", "slow")]
    merged = hists_from_json(doc["latency_histograms"], "fleet")
    assert merged is not None and set(merged) == set(per_gpu[0]) | set(per_gpu[1])
    for stage in merged:
        expected: npt.NDArray[np.int64] = np.sum([counts(h, stage) for h in per_gpu if stage in h], axis=0)
        np.testing.assert_array_equal(counts(merged, stage), expected, err_msg=stage)
        total = HistSnapshot(
            expected,
            sum(h[stage].total for h in per_gpu if stage in h),
            max(h[stage].maximum for h in per_gpu if stage in h),
        )
        assert doc["latency_ms"][stage] == stage_summary(total), stage
    e2e = doc["latency_ms"]["e2e"]
    p99s = [gpu(doc, gpus[n])["latency_ms"]["e2e"]["p99"] for n in ("fast", "slow")]
    assert min(p99s) <= e2e["p99"] <= max(p99s)
    assert e2e["count"] == sum(gpu(doc, gpus[n])["requests"]["ok"] for n in ("fast", "slow")) == doc["requests"]["ok"]
    assert doc["fleet"]["merged_latency_exact"] is True and doc["fleet"]["verdict"] == "pass"
    # Both pass; the worst is the one with the higher p99: 8 ms batches against 2 ms.
    assert doc["fleet"]["worst_gpu"]["name"] == gpu(doc, gpus["slow"])["name"]
    assert doc["fleet"]["worst_gpu"]["reasons"] == []


def test_a_leaking_gpu_fails_the_fleet_and_is_named_worst(gpus: dict[str, Path]) -> None:
    """One GPU whose host memory grows: the fleet verdict fails (exit 1), that GPU is the worst
    and the only failed one, the others keep passing, and the verdict line says why."""
    rc, doc, err = fleet(gpus["fast"], gpus["slow"], gpus["leak"], process=True)
    assert rc == 1, err
    leak = gpu(doc, gpus["leak"])
    assert leak["leaks"]["host_rss"] is True and not leak["passed"]
    assert any("host_rss" in r for r in leak["reasons"])
    assert doc["fleet"]["verdict"] == "FAIL" and doc["fleet"]["failed_gpus"] == [leak["name"]]
    assert doc["fleet"]["worst_gpu"]["name"] == leak["name"]
    assert all(gpu(doc, gpus[n])["passed"] for n in ("fast", "slow"))
    assert f"verdict FAIL; worst GPU {leak['name']} (leak suspected: " in err


def test_one_table_per_gpu_in_markdown(gpus: dict[str, Path]) -> None:
    """The Markdown report names the worst GPU first, then a latency table per GPU."""
    rc, text, _ = fleet(gpus["fast"], gpus["leak"], fmt="md")
    assert rc == 1
    assert text.startswith("# Fleet report: 2 GPUs, verdict FAIL")
    assert f"**Worst GPU: {gpus['leak']}** (leak suspected: host_rss" in text
    for name in ("fast", "leak"):
        section = text.split(f"## {gpus[name]}: ", 1)[1]
        assert "| stage | p50 ms |" in section.split("## ", 1)[0], name
    assert "| host_rss | LEAK SUSPECTED |" in text


def test_a_missed_slo_fails_the_fleet(gpus: dict[str, Path]) -> None:
    """A GPU that misses its run's own SLO fails the fleet, named with the check it missed."""
    rc, doc, _ = fleet(gpus["fast"], gpus["strict"])
    assert rc == 1
    strict = gpu(doc, gpus["strict"])
    assert strict["reasons"] == ["SLO missed: p99 e2e"] and doc["fleet"]["worst_gpu"]["name"] == strict["name"]


def test_config_slo_applies_to_every_gpu_and_to_the_merged_fleet(gpus: dict[str, Path], tmp_path: Path) -> None:
    """--config's [slo] replaces each run's own and is also checked on the merged requests."""
    cfg = tmp_path / "slo.toml"
    cfg.write_text("[slo]\np99_ms = 5000\nmax_error_ratio = 0.01\n")
    rc, doc, _ = fleet(gpus["fast"], gpus["strict"], extra=("--config", str(cfg)))
    assert rc == 0 and doc["fleet"]["verdict"] == "pass"  # strict's own 0.001 ms limit no longer applies
    assert [c["name"] for c in doc["slo"]["checks"]] == ["p99 e2e", "error ratio"] and doc["slo"]["passed"]
    cfg.write_text("[slo]\np99_ms = 0.001\n")
    rc, doc, _ = fleet(gpus["fast"], gpus["slow"], extra=("--config", str(cfg)))
    assert rc == 1 and doc["slo"]["failed"] == ["p99 e2e"]


def test_a_fleet_json_merges_again_exactly(gpus: dict[str, Path], tmp_path: Path) -> None:
    """A fleet JSON is a source too (several clusters' fleets merge): its GPUs keep their names
    and histograms, so the result equals the fleet built from all state dirs at once."""
    part = tmp_path / "part.json"
    rc, _, err = fleet(gpus["fast"], gpus["slow"], extra=("--output", str(part)))
    assert rc == 0 and f"report: {part}" in err
    _, direct, _ = fleet(gpus["fast"], gpus["slow"], gpus["leak"])
    rc, again, _ = fleet(part, gpus["leak"])
    assert rc == 1
    assert [g["name"] for g in again["gpus"]] == [g["name"] for g in direct["gpus"]]
    assert again["latency_histograms"] == direct["latency_histograms"]
    assert again["latency_ms"] == direct["latency_ms"] and again["fleet"] == direct["fleet"]


def test_a_summary_json_has_a_table_but_no_merged_percentiles(gpus: dict[str, Path]) -> None:
    """A summary JSON holds percentiles, not histograms: it gets its row and verdict, and the
    fleet says it has no merged percentiles rather than averaging them."""
    summary = runs("fast")["fast"].summary_path
    rc, doc, _ = fleet(summary, gpus["slow"])
    assert rc == 0
    assert doc["latency_ms"] is None and doc["fleet"]["merged_latency_exact"] is False
    assert str(summary) in doc["fleet"]["notes"][0]
    assert gpu(doc, summary)["latency_ms"]["e2e"]["p99"] is not None
    assert doc["requests"]["ok"] == sum(g["requests"]["ok"] for g in doc["gpus"])


def test_compare_two_fleets(gpus: dict[str, Path], tmp_path: Path) -> None:
    """Fleet against fleet: merged figures and each GPU by name; a fleet against itself is no
    regression; the slow GPU standing in for the fast one is."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert fleet(gpus["fast"], extra=("--output", str(a)))[0] == 0
    res = soakd("compare", str(a), str(a))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "== all GPUs merged" in res.stdout and "fleet: no regression" in res.stdout
    doc = json.loads(a.read_text())
    _, slow, _ = fleet(gpus["slow"])
    slow["gpus"][0]["name"] = doc["gpus"][0]["name"]  # the same pod, a slower release
    b.write_text(json.dumps(slow))
    res = soakd("compare", str(a), str(b))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{doc['gpus'][0]['name']}: throughput" in res.stdout and "merged: throughput" in res.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--fleet", "/no/such/dir"), "/no/such/dir: no such state dir or JSON file"),
    (("--fleet", "{tmp}"), "no state database"),
    (("--fleet", "{tmp}/other.json"), "not a soakd summary, report or fleet JSON"),
    (("--fleet", "{tmp}", "--format", "html"), "--format html is not available for a fleet"),
    (("--fleet", "{tmp}", "--run-id", "r1"), "--run-id names one run"),
    ((), "one of the arguments --state-dir --fleet --merge is required"),
])  # fmt: skip
def test_bad_fleet_input_is_a_one_line_usage_error(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    """Exit 2 with a line naming the bad source or flag; never a traceback."""
    (tmp_path / "other.json").write_text('{"hello": 1}')
    res = soakd("report", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


def test_compare_refuses_a_fleet_against_a_single_run(gpus: dict[str, Path], tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    assert fleet(gpus["fast"], extra=("--output", str(a)))[0] == 0
    res = soakd("compare", str(a), str(runs("slow")["slow"].summary_path))
    assert res.returncode == 2 and "is a fleet report and the other is not" in res.stderr
