"""``soakd sweep``: load (or connect) and warm up once, run each step on the same target, then
judge, find the knee, recommend, write the JSON and print the table."""

from __future__ import annotations

import argparse
import copy
import logging
import sys
from typing import Any, TextIO

from soakd.allocator import demo_allocator
from soakd.config import Config, ConfigError
from soakd.record.write import write_json_atomic
from soakd.run import served
from soakd.run.heap import frozen_heap
from soakd.run.identity import new_run_id
from soakd.run.stop import StopFlag
from soakd.run.sweep.planner import SweepPlan, plan
from soakd.run.sweep.results import find_knee, judge_errors, print_table, recommend, step_figures
from soakd.run.sweep.step import SweepTarget, run_step
from soakd.telemetry.catalogue import Metrics

log = logging.getLogger("soakd.sweep")


def sweep_command(cfg: Config, ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Load (or connect) and warm up once (the run session's own steps), then each step on the
    same target."""
    sweep = plan(cfg, ns)
    if cfg.target.url is not None:
        return _sweep_network(cfg, ns, sweep, out)
    from soakd.run import steps as shared  # torch and the model's modules: a model in this process

    demo_allocator(cfg)  # before the model's threads start
    model, target = shared.load_target(cfg)
    try:
        biggest = max(s["max_batch_size"] for s in sweep.steps)
        warm = shared.warm_up(cfg, target, shared.request_source(cfg, model), biggest, StopFlag().event)
        st = SweepTarget(target, lambda c: shared.request_source(c, model), model)
        return _sweep(cfg, ns, sweep, st, shared.cold_start(model, warm, cfg.model.warmup), out)
    finally:
        target.close()


def _sweep_network(cfg: Config, ns: argparse.Namespace, sweep: SweepPlan, out: TextIO) -> int:
    """A served model: the server batches, so only the load is swept; one client for all steps,
    its pool sized for the largest step."""
    if len({s["max_batch_size"] for s in sweep.steps}) > 1:
        raise ConfigError("--max-batch-size: a served model batches on the server; sweep --concurrency or --rate")
    early = served.read_inputs(cfg)
    replay = served.open_replay(cfg)  # a bad trace: exit 2 before anything connects
    opened = copy.deepcopy(cfg)
    if sweep.mode == "concurrency":
        opened.load.concurrency = max(int(s["concurrency"]) for s in sweep.steps)
        opened.load.rate = None
    target, connect_s = served.open_network_target(opened, Metrics())
    try:
        source = served.network_source(cfg, target, early, replay)
        warm = served.warm_up_target(cfg, target, source, StopFlag().event)
        st = SweepTarget(target, lambda _c: source)
        return _sweep(cfg, ns, sweep, st, served.target_cold_start(connect_s, warm, cfg.model.warmup), out)
    finally:
        target.close()


def _sweep(
    cfg: Config, ns: argparse.Namespace, sweep: SweepPlan, st: SweepTarget, cold: dict[str, Any], out: TextIO
) -> int:
    how = (
        f"{sweep.step_duration:g}s each"
        if sweep.step_duration is not None
        else f"until stable within {100 * sweep.tolerance:g}% ({sweep.min_step:g}-{sweep.max_step:g}s)"
    )
    log.info("sweep: %d steps over %s and max batch size, %s", len(sweep.steps), sweep.mode, how)

    steps: list[dict[str, Any]] = []
    for i, settings in enumerate(sweep.steps):
        try:
            with frozen_heap():
                figures = step_figures(i, run_step(st, cfg, sweep, settings))
        except KeyboardInterrupt:
            log.warning("interrupted: reporting the %d step(s) that finished", len(steps))
            break
        steps.append(figures)
        log.info(
            "step %d %s: %.1f req/s, p99 %s ms, %s%s",
            i,
            settings,
            figures["throughput_rps"],
            figures["p99_ms"],
            figures["bottleneck"],
            "" if figures["stable"] else " (unstable)",
        )
    if not steps:
        return 130  # interrupted before any step finished (128 + SIGINT)
    judge_errors(steps, cfg.slo)
    knee = find_knee(steps if sweep.one_axis else sorted(steps, key=lambda s: s["throughput_rps"]))
    rec = recommend(steps, sweep.slo_p99_ms, knee, prefer_stable=sweep.step_duration is None)
    run_id = new_run_id()
    if st.model is not None:
        from soakd.run.steps import run_fingerprint  # loaded already: the model is in this process

        run_fp = run_fingerprint(cfg, run_id, st.model)
    else:
        run_fp = served.target_fingerprint(cfg, run_id)
    result = {
        "mode": sweep.mode,
        "slo_p99_ms": sweep.slo_p99_ms,
        "step_duration_seconds": sweep.step_duration,
        "stability_tolerance_pct": round(100 * sweep.tolerance, 3),
        "steps": steps,
        "knee": knee,
        "recommendation": rec,
        "cold_start": cold,
        "run": run_fp,
    }
    if ns.json_out:
        write_json_atomic(ns.json_out, result)
        log.info("sweep written to %s", ns.json_out)
    print_table(result, out)
    return 1 if rec is None else 0
