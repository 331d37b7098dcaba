"""``soakd sweep --replay FILE --replay-speed LIST`` (soakd/run/sweep/): each step replays the
trace at one speed, looped, and the knee is the speed at which the server falls behind, by the
criterion a sweep over rates uses (p99 rising sharply for little throughput)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from soakd.config import ConfigError, load_config
from soakd.run.sweep import plan, step_config, sweep_command

pytestmark = pytest.mark.integration


def _ns(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "sweep_concurrency": None,
        "sweep_rate": None,
        "sweep_replay_speed": None,
        "sweep_max_batch_size": None,
        "step_duration": None,
        "slo_p99_ms": None,
        "json_out": None,
        "stability_tolerance": 10.0,
        "sweep_window": "0.25s",
        "min_step": "1s",
        "max_step": "2s",
    }
    return argparse.Namespace(**{**base, **kw})


def _trace(tmp_path: Path, n: int = 2000, gap_ms: float = 1.0) -> Path:
    """``n`` rows ``gap_ms`` apart: 1,000 req/s at 1x."""
    path = tmp_path / "trace.jsonl"
    rows = (json.dumps({"timestamp": i * gap_ms, "input_length": 8, "output_length": 1}) for i in range(n))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.unit
def test_the_steps_are_speeds_and_each_loops_the_trace(tmp_path: Path) -> None:
    cfg = load_config(None, {"load.replay": str(_trace(tmp_path, 10))})
    p = plan(cfg, _ns(sweep_replay_speed="0.5,2,8"))
    assert p.mode == "replay_speed" and [s["replay_speed"] for s in p.steps] == [0.5, 2.0, 8.0]
    step = step_config(cfg, p.steps[1])
    assert (step.load.replay_speed, step.load.replay_loop, step.load.rate, step.load.duration) == (
        2.0,
        True,
        None,
        None,
    )
    assert plan(cfg, _ns()).steps == [{"replay_speed": 1.0, "max_batch_size": cfg.batcher.max_batch_size}]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("replay", "kw", "message"),
    [
        (True, {"sweep_rate": "10,20"}, "a replayed trace sets the arrivals; sweep --replay-speed LIST"),
        (True, {"sweep_replay_speed": "1,0"}, "--replay-speed: values must be > 0"),
        (False, {"sweep_replay_speed": "1,2"}, "--replay-speed: sweeps the speed of a replayed trace"),
    ],
)
def test_bad_speed_sweeps_are_config_errors(tmp_path: Path, replay: bool, kw: dict[str, object], message: str) -> None:
    cfg = load_config(None, {"load.replay": str(_trace(tmp_path, 10))} if replay else {})
    with pytest.raises(ConfigError, match=message):
        plan(cfg, _ns(**kw))


def test_the_knee_is_the_speed_at_which_the_server_falls_behind(tmp_path: Path) -> None:
    """A model serving 200 req/s (5 ms a request, batches of one) given a 1,000 req/s trace: at
    0.05x and 0.1x it keeps up; at 0.5x arrivals outrun it, p99 climbs for no throughput: the
    knee is 0.1x, and the overloaded step shows it was offered more than it served."""
    cfg = load_config(
        None,
        {
            "model.spec": "builtin:sleep",
            "model.options": {"batch_ms": 5.0},
            "model.warmup": 1,
            "input.shapes": "4",
            "batcher.max_batch_size": 1,
            "load.replay": str(_trace(tmp_path)),
            "load.drain_timeout": "2s",
        },
    )
    out, printed = tmp_path / "sweep.json", io.StringIO()
    rc = sweep_command(cfg, _ns(sweep_replay_speed="0.05,0.1,0.5", step_duration="1.5s", json_out=str(out)), printed)
    result = json.loads(out.read_text())
    steps = result["steps"]
    assert result["mode"] == "replay_speed" and [s["replay_speed"] for s in steps] == [0.05, 0.1, 0.5]
    print(printed.getvalue())
    for s in steps[:2]:  # kept up: served what arrived
        assert s["throughput_rps"] == pytest.approx(s["offered_rps"], rel=0.15)
    over = steps[2]
    assert over["offered_rps"] > 1.5 * over["throughput_rps"] and over["p99_ms"] > 5 * steps[1]["p99_ms"]
    assert result["knee"]["replay_speed"] == 0.1
    assert rc == 0 and "knee: step 1 (replay_speed 0.1" in printed.getvalue()
