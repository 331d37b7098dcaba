"""Leak verdicts on real traces: soakd's own host RSS/USS recorded from 4-minute runs at 1 s
(bench/leak/record_traces.py) of builtin:leak_host at slow rates and of leak-free models, judged
by `soakd analyze` with accelerated settings (a 2-minute window: time runs 180x faster, so
the default 2 MiB/h floor is 360 MiB/h of wall time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from soakd.cli import main

TRACES = Path(__file__).parent / "fixtures" / "traces"
FAST = ["--leak-warmup", "30s", "--leak-window", "120s"]
MIB_H = 2**20


def analyze(capsys: pytest.CaptureFixture[str], *names: str) -> tuple[int, dict[str, dict[str, object]]]:
    files = [str(TRACES / f"{n}.csv") for n in names]
    rc = main(["analyze", "--json", *FAST, *files])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return rc, {Path(str(r["file"])).stem: r for r in rows}


def test_a_real_leak_is_flagged_within_a_minute_of_judging(capsys: pytest.CaptureFixture[str]) -> None:
    """leak_host at 0.2 MiB/s (720 MiB/h): both host series flagged, at about that slope; exit 1."""
    rc, rows = analyze(capsys, "leak_host_0.2-host_rss", "leak_host_0.2-host_uss")
    assert rc == 1
    for r in rows.values():
        assert r["state"] == "leak"
        assert 0.7 * 720 * MIB_H < float(r["slope_bytes_per_hour"]) < 2.0 * 720 * MIB_H  # type: ignore[arg-type]
        assert float(r["first_suspected_seconds"]) <= 120  # type: ignore[arg-type]


def test_leak_free_models_are_ok_and_say_how_faint_a_leak_could_hide(capsys: pytest.CaptureFixture[str]) -> None:
    """builtin:noop and builtin:convnet: "ok", each with the smallest leak it could have shown
    (noop's quiet memory near the accelerated floor, convnet's busier one higher); exit 0."""
    rc, rows = analyze(capsys, "noop-host_rss", "noop-host_uss", "convnet-host_rss", "convnet-host_uss")
    assert rc == 0 and len(rows) == 4
    for name, r in rows.items():
        assert r["state"] == "ok" and r["leak_suspected"] is False
        detectable = float(r["detectable_slope_bytes_per_hour"])  # type: ignore[arg-type]
        # convnet's bound: 4.15e3 MiB/h since the judged history starts with the trough envelope's
        # first full window (40 s of these 3-minute histories), 1.55e3 before.
        assert 360 * MIB_H <= detectable < (1000 if name.startswith("noop") else 5000) * MIB_H
        assert str(r["reason"]).startswith("no leak above ")


@pytest.mark.parametrize(("name", "mib_per_h"), [("leak_host_0.05-host_rss", 180), ("leak_host_0.01-host_rss", 36)])
def test_a_leak_slower_than_the_floor_is_measured_not_flagged(
    capsys: pytest.CaptureFixture[str], name: str, mib_per_h: float
) -> None:
    """leak_host at 0.05 and 0.01 MiB/s is under the accelerated floor: "ok", the slope measured
    (the interpreter's own growth adds a little at the slowest rate)."""
    rc, rows = analyze(capsys, name)
    r = rows[name]
    assert rc == 0 and r["state"] == "ok" and "below the floor" in str(r["reason"])
    assert 0.8 * mib_per_h * MIB_H < float(r["slope_bytes_per_hour"]) < 1.4 * mib_per_h * MIB_H  # type: ignore[arg-type]
