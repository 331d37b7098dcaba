"""Live leak verdicts from a real `soakd run`, scraped over HTTP: a model that leaks host memory
is flagged on /metrics and in the state store's events; builtin:noop is not. The CUDA leak
model writes a memory snapshot (GPU only)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import metric_value, wait_for

# Seconds instead of hours, from the command line alone: memory sampled every 250 ms, a 3 s
# warm-up floor and a 15 s window, which scale every other leak time scale down with them
# (DetectorParams.scaled: a window of 15 s runs time 1440x faster than the default 6 h, and the
# default floor of 2 MiB/h grows with it; evaluations every second). The documented demo
# (1 s, 10 s, 45 s: flagged within 75 s) is the same run 3x slower; the properties checked
# here, flagged with its evidence or never flagged, do not depend on the clock's pace.
FAST_FLAGS = ("--memory-interval", "250ms", "--leak-warmup", "3s", "--leak-window", "15s")


def write_config(tmp_path: Path, model: str, options: str = "") -> Path:
    cfg = tmp_path / "soakd.toml"
    cfg.write_text(f'[model]\nspec = "{model}"\nwarmup = 2\n{options}\n')
    return cfg


def run_args(cfg: Path, state: Path, *extra: str) -> list[str]:
    return ["--config", str(cfg), "--concurrency", "2", *FAST_FLAGS, "--state-dir", str(state), *extra]


def events(state: Path, kind: str) -> list[dict[str, Any]]:
    with sqlite3.connect(state / "soakd.db") as db:
        rows = db.execute("SELECT detail FROM events WHERE kind = ?", (kind,)).fetchall()
    return [json.loads(r[0]) for r in rows]


def test_host_leak_is_flagged_on_metrics_and_in_events(daemon_factory: Any, tmp_path: Path) -> None:
    """Flagged on /metrics within 40 s with slope, ETA and the detectable slope; the stored
    event carries the host evidence."""
    cfg = write_config(
        tmp_path, "builtin:leak_host", "[model.options]\nmib_per_s = 20.0\nmax_mib = 1500\n[memory]\ntracemalloc = true"
    )
    state = tmp_path / "state"
    started = time.monotonic()
    d = daemon_factory(*run_args(cfg, state, "--duration", "60s"))
    d.wait_ready()

    def flagged() -> str | None:
        text = d.metrics()
        return text if metric_value(text, "soakd_leak_suspected", 'series="host_rss"') == 1 else None

    text = wait_for(
        flagged, timeout=40 - (time.monotonic() - started), what='soakd_leak_suspected{series="host_rss"} 1'
    )
    detectable = metric_value(text, "soakd_leak_detectable_slope_bytes_per_hour", 'series="host_rss"')
    assert detectable is not None and 0 < detectable < 20 * 2**20 * 3600
    slope = metric_value(text, "soakd_leak_slope_bytes_per_hour", 'series="host_rss"')
    assert slope is not None and slope > 20 * 2**20 * 3600 * 0.5  # about 72 GiB/h
    eta = metric_value(text, "soakd_memory_exhaustion_eta_seconds", 'series="host_rss"')
    assert eta is not None and 0 < eta < float("inf")
    # The log line and the event follow the evidence (malloc_trim, tracemalloc's comparison).
    wait_for(lambda: "leak suspected in host_rss" in d.output(), timeout=20, what="the log line")
    assert d.stop() == 0
    (detail,) = [e for e in events(state, "leak_suspected") if e["series"] == "host_rss"]
    assert detail["slope_bytes_per_hour"] > 0
    assert detail["allocator_retention"] is False  # malloc_trim gave nothing back: the model holds it
    assert "soakd/models/leaky.py" in detail["top_growing_sites"][0]["site"]  # tracemalloc's evidence


def test_noop_is_not_flagged(daemon_factory: Any, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "builtin:noop")
    d = daemon_factory(*run_args(cfg, tmp_path / "state", "--duration", "40s"))
    d.wait_ready()

    def judged() -> str | None:
        text = d.metrics()
        slope = metric_value(text, "soakd_leak_slope_bytes_per_hour", 'series="host_rss"')
        return text if slope is not None and slope == slope else None  # judged: not NaN

    wait_for(judged, timeout=25, what="a host_rss verdict")
    deadline = time.monotonic() + 12  # a dozen evaluations, most of a window judged
    while time.monotonic() < deadline:
        text = d.metrics()
        for series in ("host_rss", "host_uss", "malloc_in_use"):
            assert metric_value(text, "soakd_leak_suspected", f'series="{series}"') in (0, None), series
        time.sleep(1)
    assert "leak suspected" not in d.output()
    assert d.stop() == 0


@pytest.mark.gpu
def test_cuda_leak_writes_a_memory_snapshot(daemon_factory: Any, tmp_path: Path) -> None:
    """leak_cuda on the GPU: torch_cuda_allocated flagged, a memory_viz snapshot in the state dir."""
    import pickle

    cfg = write_config(tmp_path, "builtin:leak_cuda", "[model.options]\nmib_per_s = 50.0\nmax_mib = 4000")
    state = tmp_path / "state"
    d = daemon_factory(*run_args(cfg, state, "--device", "cuda", "--duration", "90s"))
    d.wait_ready()
    wait_for(
        lambda: metric_value(d.metrics(), "soakd_leak_suspected", 'series="torch_cuda_allocated"') == 1,
        timeout=75,
        what='soakd_leak_suspected{series="torch_cuda_allocated"} 1',
    )
    snaps = wait_for(lambda: list(state.glob("leak-torch_cuda_allocated-*.pickle")), timeout=10, what="a snapshot file")
    with snaps[0].open("rb") as fh:
        snap = pickle.load(fh)
    assert snap.get("segments")  # what memory_viz reads
    assert any(s.get("frames") for s in snap.get("device_traces", [[]])[0]), "allocation history recorded"
    assert d.stop() == 0
