"""The steps a sweep runs, from its flags: load values x max batch sizes, and how long each
step runs (a fixed ``--step-duration``, or until stable between ``--min-step`` and
``--max-step``)."""

from __future__ import annotations

import argparse
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from soakd.config import Config, ConfigError, parse_duration


@dataclass
class SweepPlan:
    mode: str  # "concurrency", "rate" or "replay_speed"
    steps: list[dict[str, Any]]  # each {"concurrency" | "rate" | "replay_speed": v, "max_batch_size": b}
    step_duration: float | None
    window: float
    min_step: float
    max_step: float
    tolerance: float  # fraction
    slo_p99_ms: float | None
    one_axis: bool = True  # one load value or one batch size (or load tied to batch size, 2x)


def _parse_list(text: str | None, flag: str, kind: Callable[[str], Any]) -> list[Any] | None:
    if text is None:
        return None
    values: list[Any] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            v = kind(part)
        except ValueError:
            example = "1,4,8 or 2x" if kind is _Concurrency else "1,4,8"
            raise ConfigError(f"{flag}: cannot parse {part!r} in {text!r} (expected e.g. {example})") from None
        if (v.value if isinstance(v, _Concurrency) else v) <= 0:
            raise ConfigError(f"{flag}: values must be > 0, got {part!r}")
        values.append(v)
    if not values:
        raise ConfigError(f"{flag}: empty list")
    return values


class _Concurrency:
    """A --concurrency item: ``16`` requests in flight, or ``2x``: twice each step's max batch
    size, so every batch size is fed the same way (the seed article's batch-size table)."""

    def __init__(self, text: str) -> None:
        self.per_batch = text.endswith("x")
        self.value = float(text[:-1]) if self.per_batch else int(text)

    def of(self, max_batch_size: int) -> int:
        return max(1, round(self.value * max_batch_size)) if self.per_batch else int(self.value)


def _duration_arg(text: str, flag: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if seconds <= 0:
        raise ConfigError(f"{flag}: must be > 0, got {text!r}")
    return seconds


def plan(cfg: Config, ns: argparse.Namespace) -> SweepPlan:
    """The steps a sweep runs, from its flags (the config's own settings fill a missing axis)."""
    conc = _parse_list(ns.sweep_concurrency, "--concurrency", _Concurrency)
    rate = _parse_list(ns.sweep_rate, "--rate", float)
    batch = _parse_list(ns.sweep_max_batch_size, "--max-batch-size", int) or [cfg.batcher.max_batch_size]
    speed = _parse_list(getattr(ns, "sweep_replay_speed", None), "--replay-speed", float)
    if conc and rate:
        raise ConfigError("--concurrency and --rate: sweep one load mode (closed or open loop), not both")
    if cfg.load.replay is not None:  # the trace sets the arrivals: its steps are speeds (docs/replay.md)
        if conc or rate:
            raise ConfigError("--concurrency, --rate: a replayed trace sets the arrivals; sweep --replay-speed LIST")
        mode, loads = "replay_speed", speed or [cfg.load.replay_speed]
    elif speed:
        raise ConfigError("--replay-speed: sweeps the speed of a replayed trace; give it with --replay FILE")
    elif rate or (not conc and cfg.load.open_loop):
        mode, loads = "rate", rate or [cfg.load.rate]
    else:
        mode, loads = "concurrency", conc or [_Concurrency(str(cfg.load.concurrency or 8))]
    steps = [
        {mode: load.of(b) if isinstance(load, _Concurrency) else load, "max_batch_size": b}
        for load, b in itertools.product(loads, batch)
    ]
    tol = float(getattr(ns, "stability_tolerance", 10.0))
    if not 0 < tol < 100:
        raise ConfigError(f"--tolerance: expected a percentage in (0, 100), got {tol}")
    fixed = _duration_arg(ns.step_duration, "--step-duration") if ns.step_duration else None
    window = _duration_arg(getattr(ns, "sweep_window", "2s"), "--window")
    if fixed is not None:
        window = min(window, fixed / 4)  # a first window to discard, then three to measure
    min_step = _duration_arg(getattr(ns, "min_step", "10s"), "--min-step")
    max_step = _duration_arg(getattr(ns, "max_step", "60s"), "--max-step")
    if max_step < min_step:
        raise ConfigError(f"--max-step: must be >= --min-step ({min_step}s), got {max_step}s")
    slo = ns.slo_p99_ms if ns.slo_p99_ms is not None else cfg.slo.p99_ms
    return SweepPlan(
        mode,
        steps,
        fixed,
        window,
        max(min_step, 4 * window),
        max(max_step, 4 * window),
        tol / 100.0,
        slo,
        one_axis=len(loads) == 1 or len(batch) == 1,
    )


def step_config(cfg: Config, step: dict[str, Any]) -> Config:
    c = copy.deepcopy(cfg)
    c.load.concurrency = step.get("concurrency")
    c.load.rate = step.get("rate")
    if "replay_speed" in step:  # a step runs until stable: the trace wraps for as long as it takes
        c.load.replay_speed = step["replay_speed"]
        c.load.replay_loop = True
    c.load.duration = None
    c.batcher.max_batch_size = step["max_batch_size"]
    return c
