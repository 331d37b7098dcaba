"""``soakd analyze``: JSON lines or a table per trace file, many files, no torch, clear errors,
and exit codes a CI gate can use (1: a leak judged, 0: none, 2: bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from soakd.analysis.corpus import generate
from soakd.cli import main


def write_trace(path: Path, t: np.ndarray, v: np.ndarray) -> Path:
    rows = "".join(f"{a:.1f},{b:.0f}\n" for a, b in zip(t, v, strict=True))
    path.write_text("timestamp_seconds,bytes\n" + rows)
    return path


def write_pattern(tmp: Path, pattern: str, seed: int, name: str | None = None) -> Path:
    tr = generate(pattern, seed)
    return write_trace(tmp / (name or f"{pattern}-{seed}.csv"), 1.7e9 + tr.t, tr.v)


def test_json_lines_one_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A leaking trace is suspected, a leak-free one is not; one JSON object per line; exit 1."""
    leak = write_pattern(tmp_path, "sawtooth_creep", 1)
    ok = write_pattern(tmp_path, "step", 1)
    assert main(["analyze", "--json", str(leak), str(ok)]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["file"] for r in rows] == [str(leak), str(ok)]
    assert rows[0]["leak_suspected"] is True and rows[0]["slope_bytes_per_hour"] > 0
    assert rows[0]["p_value"] < 0.01 and rows[0]["first_suspected_seconds"] > 0
    assert rows[1]["leak_suspected"] is False and rows[1]["first_suspected_seconds"] is None
    assert [r["state"] for r in rows] == ["leak", "ok"]
    # The clear verdict says how faint a leak could have hidden in this trace.
    assert 0 < rows[1]["detectable_slope_bytes_per_hour"] < 50 * 2**20
    assert rows[1]["reason"].startswith("no leak above ") and rows[1]["reason"].endswith(" h")
    assert rows[1]["judged_seconds"] > 3600


def test_exit_0_when_no_trace_leaks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Leak-free traces only: exit 0, each "ok" with its detectable slope in the table."""
    files = [str(write_pattern(tmp_path, p, 3)) for p in ("noise", "sawtooth", "periodic")]
    assert main(["analyze", *files]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 3 and all(" ok " in r and "no leak above " in r for r in rows), rows


def test_table_without_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    leak = write_pattern(tmp_path, "creep", 2)
    assert main(["analyze", str(leak)]) == 1
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["file", "verdict", "MiB/h"]
    assert row.startswith(str(leak)) and " LEAK " in row


def test_leak_warmup_and_window_flags_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A warm-up longer than the trace leaves nothing to judge: "not judged", never "ok", exit 0."""
    path = write_pattern(tmp_path, "creep", 0)
    assert main(["analyze", "--json", "--leak-warmup", "7h", str(path)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["leak_suspected"] is False and row["slope_bytes_per_hour"] is None
    assert row["state"] == "not_judged" and row["detectable_slope_bytes_per_hour"] is None
    assert row["reason"] == "not judged: warming up"


def test_too_short_trace_is_not_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """20 minutes of a steep leak, under the default 30 min warm-up: "not judged" in the table."""
    t = np.arange(0.0, 1200.0, 10.0)
    path = write_trace(tmp_path / "short.csv", t, 1e9 + 500 * 2**20 * t / 3600)
    assert main(["analyze", str(path)]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert " not judged " in row and " ok " not in row


def test_config_floor_by_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file named after a series takes that series' floor from leak.min_slope_bytes_per_hour."""
    t = np.arange(0.0, 6 * 3600.0, 10.0)
    v = 1e9 + 20 * 2**20 * t / 3600
    path = write_trace(tmp_path / "host_rss.csv", t, v)
    cfg = tmp_path / "soakd.toml"
    cfg.write_text("[leak.min_slope_bytes_per_hour]\nhost_rss = 1e9\n")
    assert main(["analyze", "--json", "--config", str(cfg), str(path)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["leak_suspected"] is False and "below the floor" in row["reason"]
    assert row["state"] == "ok" and row["detectable_slope_bytes_per_hour"] >= 1e9


def test_hundreds_of_files_in_one_process_without_torch(tmp_path: Path) -> None:
    """200 files in one `soakd analyze` process that never imports torch."""
    t = np.arange(0.0, 1.5 * 3600.0, 60.0)
    rng = np.random.default_rng(0)
    files = []
    for i in range(200):
        slope = 50 * 2**20 if i % 2 else 0.0
        v = 1e9 + slope * t / 3600 + rng.normal(0, 2**20, t.size)
        files.append(str(write_trace(tmp_path / f"trace-{i:03d}.csv", t, v)))
    code = (
        "import sys; from soakd.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "analyze", "--json", *files], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr  # leaks judged
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 200
    assert sum(r["leak_suspected"] for r in rows[1::2]) == 100
    # At most 2 of the 100 flat ones (the false-alarm rate is bench/leak/detection.py's to measure).
    assert sum(r["leak_suspected"] for r in rows[0::2]) <= 2


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        ("t,v\n1,2\n", ":1:", "expected the header 'timestamp_seconds,bytes'"),
        ("", ":1:", "an empty file"),
        ("timestamp_seconds,bytes\n1,100\n2,abc\n", ":3:", "not a number"),
        ("timestamp_seconds,bytes\n1,100\n2,100,3\n", ":3:", "expected 2 columns"),
        ("timestamp_seconds,bytes\n5,100\n4,100\n", ":3:", "goes back in time"),
        ("timestamp_seconds,bytes\n1,nan\n", ":2:", "not a finite number"),
    ],
)
def test_bad_input_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, where: str, what: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    good = write_pattern(tmp_path, "noise", 0)
    assert main(["analyze", "--json", str(bad), str(good)]) == 2
    out, err = capsys.readouterr()
    assert f"{bad}{where}" in err and what in err
    assert [json.loads(line)["file"] for line in out.splitlines()] == [str(good)]  # the others still judged


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.csv"
    assert main(["analyze", str(missing)]) == 2
    assert f"{missing}: no such file" in capsys.readouterr().err


def test_analyze_imports_no_torch() -> None:
    """The analyze path (CLI, config, detector) stays free of torch: it must start fast."""
    code = (
        "import sys; from soakd.cli import build_parser; import soakd.analysis.offline; "
        "import soakd.config; print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.parametrize(
    ("t", "what"),
    [
        ([1.7e18, 1.7e18 + 6e11, 1.7e18 + 1.2e12], "timestamps must be in seconds"),  # epoch nanoseconds
        ([0.0, 60.0, 1e13], "over the bound of 10000000 bins"),  # one absurd gap
    ],
)
def test_a_span_it_cannot_bin_is_refused_not_allocated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], t: list[float], what: str
) -> None:
    """Epoch-nanosecond timestamps or a 1e13 s gap would ask numpy for terabytes of bins: exit 2
    naming the file and the span, at once, and the other files are still judged."""
    bad = write_trace(tmp_path / "ns.csv", np.array(t), np.array([1.0, 2.0, 3.0]) * 2**30)
    good = write_pattern(tmp_path, "noise", 0)
    assert main(["analyze", "--json", str(bad), str(good)]) == 2
    out, err = capsys.readouterr()
    assert f"{bad}: timestamps span" in err and what in err
    assert [json.loads(line)["file"] for line in out.splitlines()] == [str(good)]


def test_headroom_applies_the_live_page_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--headroom judges as the live monitor pages: 5 MiB/h against 64 GiB outlasts the 30 d
    horizon by far, a finding ("creep", exit 0) where no headroom makes it a leak (exit 1); against
    100 MiB it is a leak again. A size that is not one is refused, naming the flag (exit 2)."""
    rng = np.random.default_rng(3)
    t = np.arange(0.0, 4 * 3600.0, 10.0)
    v = 1e9 + rng.normal(0.0, 0.3 * 2**20, t.size) + t / 3600.0 * 5 * 2**20
    path = write_trace(tmp_path / "host_rss.csv", 1.7e9 + t, v)
    assert main(["analyze", "--json", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["state"] == "leak"
    assert main(["analyze", "--json", "--headroom", "64GiB", str(path)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["state"], row["finding"], row["leak_suspected"]) == ("ok", "creep", True)
    assert row["reason"].startswith("slow creep, not paged")
    assert main(["analyze", "--json", "--headroom", "100 MiB", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["state"] == "leak"
    assert main(["analyze", "--headroom", "64GB", str(path)]) == 2
    assert "--headroom" in capsys.readouterr().err
