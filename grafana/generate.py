#!/usr/bin/env python3
# ruff: noqa: E501 - a table of panels reads best one target per line
"""Generate soakd's Grafana dashboards: ``grafana/dashboards/*.json``.

Edit the panels here, then run ``python3 grafana/generate.py`` and commit both this file and
the JSON; ``python3 grafana/generate.py --check`` (run by the tests) fails when the committed
JSON is stale. Standard library only, and nothing from soakd, so it runs anywhere.

Every dashboard is templated by data source (``$datasource``, a data source variable, so
provisioning works whatever the Prometheus data source is called), ``$job``, ``$instance``
(one per soakd: a fleet of hosts, each running one soakd per GPU) and ``$gpu`` (NVML panels). Latency
quantiles come from the recording rules in ``prometheus/rules/soakd-recording.yml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "dashboards"

DS = {"type": "prometheus", "uid": "${datasource}"}
# Selectors every query starts from.
SEL = 'job=~"$job", instance=~"$instance"'
GPU_SEL = SEL + ', gpu=~"$gpu"'
# torch allocator series follow $instance only: each soakd drives one device, and its torch
# name ("cuda:0" under CUDA_VISIBLE_DEVICES=N, systemd/soakd@.service) is not the GPU's number.
DEV_SEL = SEL

Json = dict[str, Any]


def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str = "time_series") -> Json:
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": fmt,
    }


def panel(
    title: str,
    targets: list[Json],
    unit: str,
    *,
    kind: str = "timeseries",
    w: int = 12,
    h: int = 8,
    description: str = "",
    min_: float | None = None,
    max_: float | None = None,
    mappings: list[Json] | None = None,
    options: Json | None = None,
    custom: Json | None = None,
    thresholds: list[tuple[str, float | None]] | None = None,
    stack: bool = False,
) -> Json:
    defaults: Json = {"unit": unit}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if mappings:
        defaults["mappings"] = mappings
    if thresholds:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": c, "value": v} for c, v in thresholds],
        }
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if stack else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            **(custom or {}),
        }
    elif custom:
        defaults["custom"] = custom
    opts: Json = options or {}
    if kind == "timeseries" and not options:
        opts = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    refs = iter("ABCDEFGHIJKLMNOP")
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [{**t, "refId": next(refs)} for t in targets],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": opts,
        "gridPos": {"w": w, "h": h},
    }


def stat(
    title: str,
    targets: list[Json],
    unit: str,
    *,
    w: int = 4,
    h: int = 4,
    text: str = "value",
    description: str = "",
    mappings: list[Json] | None = None,
    thresholds: list[tuple[str, float | None]] | None = None,
) -> Json:
    return panel(
        title,
        targets,
        unit,
        kind="stat",
        w=w,
        h=h,
        description=description,
        mappings=mappings,
        thresholds=thresholds,
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": text,
            "colorMode": "value" if thresholds else "none",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    )


def state_timeline(
    title: str, targets: list[Json], mappings: list[Json], *, w: int = 12, h: int = 8, description: str = ""
) -> Json:
    return panel(
        title,
        targets,
        "none",
        kind="state-timeline",
        w=w,
        h=h,
        description=description,
        mappings=mappings,
        options={
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.8,
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
        },
        custom={"fillOpacity": 80, "lineWidth": 0},
    )


def value_map(pairs: dict[str, tuple[str, str]]) -> list[Json]:
    """{"0": ("ok", "green")} -> a Grafana value mapping."""
    return [
        {
            "type": "value",
            "options": {
                v: {"text": text, "color": color, "index": i} for i, (v, (text, color)) in enumerate(pairs.items())
            },
        }
    ]


def row(title: str) -> Json:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def layout(panels: list[Json]) -> list[Json]:
    """Assign ids and gridPos x/y: left to right, wrapping at 24 columns, rows start a new line."""
    x = y = line_h = 0
    out = []
    for pid, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > 24:
            y += line_h
            x = line_h = 0
        p = {"id": pid, **p, "gridPos": {"x": x, "y": y, "w": w, "h": h}}
        out.append(p)
        x += w
        line_h = max(line_h, h)
        if p["type"] == "row":
            y += h
            x = line_h = 0
    return out


def query_var(name: str, label: str, query: str, *, multi: bool = True, all_value: str = ".+") -> Json:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,  # on time range change: new soaks and hosts appear without a reload
        "sort": 1,
        "multi": multi,
        "includeAll": True,
        "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "hide": 0,
    }


def templating(extra: list[Json] | None = None) -> Json:
    return {
        "list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Data source",
                "query": "prometheus",
                "current": {},
                "options": [],
                "refresh": 1,
                "regex": "",
                "hide": 0,
                "multi": False,
                "includeAll": False,
            },
            query_var("job", "Job", "label_values(soakd_build_info, job)"),
            query_var("instance", "soakd", 'label_values(soakd_build_info{job=~"$job"}, instance)'),
            # Hosts without a GPU have no values here; "All" (.*) then matches nothing harmlessly.
            query_var(
                "gpu",
                "GPU",
                'label_values(soakd_gpu_memory_total_bytes{job=~"$job", instance=~"$instance"}, gpu)',
                all_value=".*",
            ),
            *(extra or []),
        ]
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Json],
    *,
    extra_vars: list[Json] | None = None,
    links_to: tuple[str, str] | None = None,
) -> Json:
    links = []
    if links_to:
        links.append(
            {
                "type": "link",
                "title": links_to[1],
                "url": f"/d/{links_to[0]}?${{__url_time_range}}&${{__all_variables}}",
                "icon": "dashboard",
                "targetBlank": False,
                "keepTime": True,
                "includeVars": True,
                "asDropdown": False,
                "tags": [],
                "tooltip": "",
            }
        )
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["soakd"],
        "timezone": "",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: line up a latency spike with a memory step
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "schemaVersion": 39,
        "version": 1,
        "links": links,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": templating(extra_vars),
        "panels": layout(panels),
    }


# ---------------------------------------------------------------------------------------------
# Overview

STAGES = ["e2e", "queue", "inference", "preprocess", "postprocess"]
OK_BAD = value_map({"0": ("down", "red"), "1": ("up", "green")})


def leak_verdicts(sel: str) -> str:
    """Per series: 0 no trend, 1 leak suspected (paged), 2 a finding (a rise not worth a page:
    creep or allocator retention); a soakd without soakd_leak_finding reads 0 or 1."""
    by = "max by (instance, series)"
    return (
        f"{by} (soakd_leak_suspected{{{sel}}}) + 2 * "
        f"({by} (soakd_leak_finding{{{sel}}}) or {by} (soakd_leak_suspected{{{sel}}}) * 0)"
    )


LEAK_STATES = value_map({"0": ("no trend", "green"), "1": ("leak suspected", "red"), "2": ("finding", "yellow")})


def overview() -> Json:
    lat = "instance_stage:soakd_request_duration_seconds"
    stage_var: Json = {
        "type": "custom",
        "name": "stage",
        "label": "Stage (heatmap, percentiles)",
        "query": ",".join(STAGES),
        "current": {"selected": True, "text": "e2e", "value": "e2e"},
        "options": [{"selected": s == "e2e", "text": s, "value": s} for s in STAGES],
        "multi": False,
        "includeAll": False,
        "hide": 0,
    }
    panels: list[Json] = [
        row("Run"),
        {
            **panel(
                "Run",
                [target(f"soakd_run_info{{{SEL}}}", instant=True, fmt="table")],
                "none",
                kind="table",
                w=24,
                h=5,
                description="The run fingerprint: model, device, torch and CUDA versions, load mode.",
                options={"showHeader": True, "cellHeight": "sm"},
            ),
            "transformations": [
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "Value": True, "__name__": True},
                        "indexByName": {
                            "instance": 0,
                            "run_id": 1,
                            "model": 2,
                            "device": 3,
                            "device_name": 4,
                            "mode": 5,
                        },
                    },
                }
            ],
        },
        stat(
            "Phase",
            [target(f"soakd_phase_info{{{SEL}}} == 1", "{{instance}} {{phase}}", instant=True)],
            "none",
            text="name",
            description="loading, warmup, ramp, steady, probe, draining, done.",
        ),
        stat("Running for", [target(f"time() - soakd_run_start_time_seconds{{{SEL}}}", "{{instance}}")], "s"),
        stat("soakd version", [target(f"soakd_build_info{{{SEL}}}", "{{version}}", instant=True)], "none", text="name"),
        stat(
            "Model load",
            [target(f"soakd_model_load_seconds{{{SEL}}}", "{{instance}}")],
            "s",
            description="Time to load the model and move it to the device.",
        ),
        stat(
            "First inference",
            [target(f"soakd_first_inference_seconds{{{SEL}}}", "{{instance}}")],
            "s",
            description="The cold-start inference right after load.",
        ),
        stat("Warmup", [target(f"soakd_warmup_seconds{{{SEL}}}", "{{instance}}")], "s"),
        row("Throughput"),
        panel(
            "Throughput by outcome",
            [
                target(
                    f"sum by (instance, outcome) (rate(soakd_requests_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} {{outcome}}",
                ),
            ],
            "reqps",
            w=12,
            min_=0,
            description="Completed requests per second, by outcome.",
        ),
        panel(
            "Error ratio",
            [
                target(
                    f'sum by (instance) (rate(soakd_requests_total{{{SEL}, outcome=~"error|timeout|oom|bad_input"}}'
                    f"[$__rate_interval]))\n/\nsum by (instance) (rate(soakd_requests_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}}",
                ),
            ],
            "percentunit",
            w=6,
            min_=0,
            description="Failed (error, timeout, oom, bad_input) over all requests. SoakdErrorRatioHigh pages above 1%.",
        ),
        panel(
            "In flight",
            [
                target(f"soakd_inflight_requests{{{SEL}}}", "{{instance}}"),
            ],
            "short",
            w=6,
            min_=0,
            description="Requests sent and not yet completed.",
        ),
        row("Latency"),
        panel(
            "$stage latency percentiles",
            [
                target(f'{lat}:p50_rate1m{{{SEL}, stage="$stage"}}', "{{instance}} p50"),
                target(f'{lat}:p90_rate1m{{{SEL}, stage="$stage"}}', "{{instance}} p90"),
                target(f'{lat}:p99_rate1m{{{SEL}, stage="$stage"}}', "{{instance}} p99"),
                target(f'{lat}:p999_rate1m{{{SEL}, stage="$stage"}}', "{{instance}} p99.9"),
            ],
            "s",
            w=12,
            min_=0,
            description="Quantiles over 1 minute windows (recording rules). Pick the stage above.",
        ),
        panel(
            "p99 latency by stage",
            [
                target(f"{lat}:p99_rate1m{{{SEL}}}", "{{instance}} {{stage}}"),
                target("soakd:latency_slo_p99_seconds", "SLO (e2e)"),
            ],
            "s",
            w=12,
            min_=0,
            description="e2e = queue + inference (+ pre/post-processing). The SLO line is soakd:latency_slo_p99_seconds.",
        ),
        panel(
            "$stage latency heatmap",
            [
                target(
                    f'sum by (le) (instance_stage_le:soakd_request_duration_seconds_bucket:rate1m{{{SEL}, stage="$stage"}})',
                    "{{le}}",
                    fmt="heatmap",
                ),
            ],
            "s",
            kind="heatmap",
            w=12,
            description="Requests per second in each latency bucket; bimodal shapes show batching and GC stalls.",
            options={
                "calculate": False,
                "cellGap": 0,
                "color": {
                    "mode": "scheme",
                    "scheme": "Spectral",
                    "scale": "exponential",
                    "exponent": 0.5,
                    "fill": "dark-orange",
                    "reverse": False,
                    "steps": 64,
                },
                "yAxis": {"unit": "s", "axisPlacement": "left"},
                "rowsFrame": {"layout": "auto"},
                "cellValues": {"unit": "reqps"},
                "tooltip": {"mode": "single", "yHistogram": True},
                "legend": {"show": True},
                "filterValues": {"le": 1e-9},
            },
        ),
        panel(
            "p50 latency by stage",
            [
                target(f"{lat}:p50_rate1m{{{SEL}}}", "{{instance}} {{stage}}"),
            ],
            "s",
            w=12,
            min_=0,
        ),
        row("Load generation and batching"),
        panel(
            "Schedule lag (open loop)",
            [
                target(f"instance:soakd_schedule_lag_seconds:p50_rate1m{{{SEL}}}", "{{instance}} p50"),
                target(f"instance:soakd_schedule_lag_seconds:p99_rate1m{{{SEL}}}", "{{instance}} p99"),
            ],
            "s",
            w=8,
            min_=0,
            description="How late requests were sent against their intended time. Growing lag: the load generator "
            "cannot keep up, and latency counted from the intended start includes it.",
        ),
        panel(
            "Batch size",
            [
                target(
                    f"histogram_quantile(0.5, sum by (instance, le) (rate(soakd_batch_size_bucket{{{SEL}}}[$__rate_interval])))",
                    "{{instance}} p50",
                ),
                target(
                    f"histogram_quantile(0.99, sum by (instance, le) (rate(soakd_batch_size_bucket{{{SEL}}}[$__rate_interval])))",
                    "{{instance}} p99",
                ),
                target(
                    f"sum by (instance) (rate(soakd_batch_size_sum{{{SEL}}}[$__rate_interval]))\n/\n"
                    f"sum by (instance) (rate(soakd_batch_size_count{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} mean",
                ),
            ],
            "short",
            w=8,
            min_=0,
            description="Requests per model batch from the dynamic batcher.",
        ),
        panel(
            "Queue depth",
            [
                target(f"soakd_queue_depth{{{SEL}}}", "{{instance}} queued"),
            ],
            "short",
            w=8,
            min_=0,
            description="Requests waiting in the batcher.",
        ),
        row("Served model"),
        state_timeline(
            "Target up",
            [target(f"soakd_target_up{{{SEL}}}", "{{instance}} {{target}}")],
            OK_BAD,
            w=8,
            description="A network target (--target URL): 0 after a refused or reset connection, until it answers "
            "again. SoakdTargetDown fires after 1 minute down.",
        ),
        panel(
            "Target answers by status class",
            [
                target(
                    f"sum by (instance, class) (rate(soakd_target_responses_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} {{class}}",
                ),
            ],
            "reqps",
            w=8,
            min_=0,
            stack=True,
            description="HTTP answers per second by class; none: no HTTP answer (refused, reset, timed out).",
        ),
        panel(
            "Served model memory (watched)",
            [
                target(f"soakd_target_process_resident_memory_bytes{{{SEL}}}", "{{instance}} pid {{pid}} RSS"),
                target(f"soakd_target_process_unique_memory_bytes{{{SEL}}}", "{{instance}} pid {{pid}} USS"),
            ],
            "bytes",
            w=8,
            min_=0,
            description="--watch-pid / --watch-unit: the server process's host memory. A new pid is a restart "
            "(the unit's new MainPID). Memory dashboard: its GPU memory and scraped gauges.",
        ),
        row("LLM streams"),
        *[
            panel(
                title,
                [
                    target(
                        f"histogram_quantile({q}, sum by (instance, le) (rate({metric}_bucket{{{SEL}}}[$__rate_interval])))",
                        f"{{{{instance}}}} p{round(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ],
                "s",
                w=8,
                min_=0,
                description=description,
            )
            for title, metric, description in (
                (
                    "Time to first token",
                    "soakd_time_to_first_token_seconds",
                    "From the intended send time to the first content token of a streamed answer.",
                ),
                (
                    "Inter-token latency",
                    "soakd_inter_token_latency_seconds",
                    "Gaps between consecutive tokens of a stream.",
                ),
                (
                    "Time per output token",
                    "soakd_time_per_output_token_seconds",
                    "Per request: (e2e - TTFT) / (output tokens - 1).",
                ),
            )
        ],
        panel(
            "Tokens per second",
            [
                target(
                    f"sum by (instance, kind) (rate(soakd_tokens_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} {{kind}}",
                ),
            ],
            "short",
            w=8,
            min_=0,
            description="Input (prompt) and output tokens per second, from the server's usage or the stream.",
        ),
        panel(
            "Goodput",
            [
                target(
                    f"sum by (instance) (rate(soakd_goodput_requests_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} goodput",
                ),
                target(
                    f"sum by (instance) (rate(soakd_requests_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} all requests",
                ),
            ],
            "reqps",
            w=8,
            min_=0,
            description="Requests per second that met every per-request SLO of [slo] (TTFT, TPOT), beside all "
            "completed requests.",
        ),
        panel(
            "Goodput share",
            [
                target(
                    f"sum by (instance) (rate(soakd_goodput_requests_total{{{SEL}}}[$__rate_interval]))\n/\n"
                    f"sum by (instance) (rate(soakd_requests_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}}",
                ),
            ],
            "percentunit",
            w=8,
            min_=0,
            max_=1,
            description="Share of completed requests that met the per-request SLOs.",
        ),
        row("Memory verdicts"),
        state_timeline(
            "Leak verdicts",
            [
                target(leak_verdicts(SEL), "{{instance}} {{series}}"),
            ],
            LEAK_STATES,
            w=12,
            description="soakd's own trend test per memory series, after warm-up. SoakdMemoryLeakSuspected "
            "fires when one stays red for 15 minutes; yellow is a rise not worth a page (slow creep, "
            "allocator retention: SoakdMemoryGrowthFinding, info).",
        ),
        panel(
            "Memory trend per hour",
            [
                target(f"soakd_leak_slope_bytes_per_hour{{{SEL}}}", "{{instance}} {{series}}"),
            ],
            "bytes",
            w=12,
            description="Robust slope of each memory series, in bytes per hour.",
        ),
        panel(
            "Time to exhaustion",
            [
                target(f"soakd_memory_exhaustion_eta_seconds{{{SEL}}}", "{{instance}} {{series}}", instant=True),
            ],
            "s",
            kind="bargauge",
            w=12,
            h=8,
            min_=0,
            description="At the current slope, time until the series reaches its limit (Infinity: never).",
            thresholds=[("red", None), ("orange", 6 * 3600), ("green", 24 * 3600)],
            options={
                "displayMode": "basic",
                "orientation": "horizontal",
                "showUnfilled": True,
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            },
        ),
        panel(
            "Trend p-value",
            [
                target(f"soakd_leak_p_value{{{SEL}}}", "{{instance}} {{series}}"),
            ],
            "none",
            w=12,
            min_=0,
            max_=1,
            description="Lower is more certain the trend is real.",
            custom={"scaleDistribution": {"type": "log", "log": 10}},
        ),
        row("GPU"),
        panel(
            "GPU utilization",
            [
                target(f"soakd_gpu_utilization_ratio{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}"),
            ],
            "percentunit",
            w=12,
            min_=0,
            max_=1,
        ),
        panel(
            "VRAM used",
            [
                target(
                    f"soakd_gpu_memory_used_bytes{{{GPU_SEL}}}\n/\nsoakd_gpu_memory_total_bytes{{{GPU_SEL}}}",
                    "{{instance}} GPU {{gpu}}",
                ),
            ],
            "percentunit",
            w=12,
            min_=0,
            max_=1,
            description="Memory dashboard: the breakdown.",
        ),
        row("Collector health"),
        state_timeline(
            "Samplers",
            [
                target(f"soakd_collector_up{{{SEL}}}", "{{instance}} {{source}}"),
            ],
            OK_BAD,
            w=8,
            description="1 when the source's last sample succeeded. SoakdCollectorDown fires after 10 minutes down.",
        ),
        panel(
            "Sample duration",
            [
                target(f"soakd_collector_duration_seconds{{{SEL}}}", "{{instance}} {{source}}"),
            ],
            "s",
            w=8,
            min_=0,
        ),
        panel(
            "Since last good sample",
            [
                target(f"time() - soakd_collector_last_success_timestamp_seconds{{{SEL}}}", "{{instance}} {{source}}"),
            ],
            "s",
            w=8,
            min_=0,
        ),
        state_timeline(
            "Scrapes",
            [
                target(f"up{{{SEL}}}", "{{instance}}"),
            ],
            OK_BAD,
            w=12,
            description="Prometheus reaching soakd's /metrics. SoakdDown fires after 5 minutes down.",
        ),
        panel(
            "Scrape duration",
            [
                target(f"scrape_duration_seconds{{{SEL}}}", "{{instance}}"),
            ],
            "s",
            w=12,
            min_=0,
        ),
    ]
    return dashboard(
        "soakd-overview",
        "soakd / Overview",
        "A soak at a glance: run, throughput, per-stage latency, batching, leak verdicts, collector health.",
        panels,
        extra_vars=[stage_var],
        links_to=("soakd-memory", "soakd / Memory"),
    )


# ---------------------------------------------------------------------------------------------
# Memory


def memory() -> Json:
    panels: list[Json] = [
        row("torch CUDA caching allocator"),
        panel(
            "Allocated vs reserved",
            [
                target(
                    f'soakd_torch_cuda_allocated_bytes{{{DEV_SEL}, pool="all"}}', "{{instance}} {{device}} allocated"
                ),
                target(f'soakd_torch_cuda_active_bytes{{{DEV_SEL}, pool="all"}}', "{{instance}} {{device}} active"),
                target(
                    f'soakd_torch_cuda_requested_bytes{{{DEV_SEL}, pool="all"}}', "{{instance}} {{device}} requested"
                ),
                target(f'soakd_torch_cuda_reserved_bytes{{{DEV_SEL}, pool="all"}}', "{{instance}} {{device}} reserved"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="Reserved is what the caching allocator holds from CUDA; allocated is what tensors use.",
        ),
        panel(
            "Inactive split blocks",
            [
                target(f"soakd_torch_cuda_inactive_split_bytes{{{DEV_SEL}}}", "{{instance}} {{device}} {{pool}}"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="Freed pieces of split blocks that cannot be returned: fragmentation.",
        ),
        panel(
            "Fragmentation",
            [
                target(f"soakd_torch_cuda_fragmentation_ratio{{{DEV_SEL}}}", "{{instance}} {{device}} {{kind}}"),
            ],
            "percentunit",
            w=8,
            min_=0,
            max_=1,
            description="reserved_unallocated = 1 - allocated/reserved; inactive_split = inactive split / reserved. "
            "SoakdAllocatorFragmentationHigh fires on inactive_split above 25% for 30 minutes.",
        ),
        panel(
            "Largest free block",
            [
                target(f"soakd_torch_cuda_largest_free_block_bytes{{{DEV_SEL}}}", "{{instance}} {{device}}"),
                target(f"soakd_torch_cuda_device_free_bytes{{{DEV_SEL}}}", "{{instance}} {{device}} device free"),
            ],
            "bytes",
            w=8,
            min_=0,
            description="The biggest allocation that fits without cudaMalloc, and free device memory.",
        ),
        panel(
            "Segments",
            [
                target(f"soakd_torch_cuda_segments{{{DEV_SEL}}}", "{{instance}} {{device}} {{pool}}"),
            ],
            "short",
            w=8,
            min_=0,
        ),
        panel(
            "Allocation retries and OOMs",
            [
                target(
                    f"increase(soakd_torch_cuda_alloc_retries_total{{{DEV_SEL}}}[$__rate_interval])",
                    "{{instance}} {{device}} retries",
                ),
                target(
                    f"increase(soakd_torch_cuda_ooms_total{{{DEV_SEL}}}[$__rate_interval])",
                    "{{instance}} {{device}} OOMs",
                ),
            ],
            "short",
            w=12,
            min_=0,
            description="Retries: the allocator freed its cache and retried (slow, near OOM). Any OOM pages.",
        ),
        panel(
            "cudaMalloc / cudaFree",
            [
                target(
                    f"rate(soakd_torch_cuda_device_allocs_total{{{DEV_SEL}}}[$__rate_interval])",
                    "{{instance}} {{device}} malloc",
                ),
                target(
                    f"rate(soakd_torch_cuda_device_frees_total{{{DEV_SEL}}}[$__rate_interval])",
                    "{{instance}} {{device}} free",
                ),
            ],
            "ops",
            w=12,
            min_=0,
            description="A steady cache should call neither; churn here costs latency.",
        ),
        row("VRAM (NVML)"),
        panel(
            "VRAM per GPU",
            [
                target(f"soakd_gpu_memory_used_bytes{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}} used"),
                target(f"soakd_gpu_memory_reserved_bytes{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}} driver reserved"),
                target(f"soakd_gpu_memory_total_bytes{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}} total"),
            ],
            "bytes",
            w=12,
            min_=0,
        ),
        panel(
            "VRAM used by soakd",
            [
                target(f"soakd_gpu_process_memory_bytes{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}} pid {{pid}}"),
                target(
                    f'soakd_torch_cuda_reserved_bytes{{{DEV_SEL}, pool="all"}}',
                    "{{instance}} {{device}} torch reserved",
                ),
            ],
            "bytes",
            w=12,
            min_=0,
            description="What NVML charges to this process, next to what torch reserved: the difference is the "
            "CUDA context, cuBLAS/cuDNN workspaces and other non-torch allocations.",
        ),
        panel(
            "GPU power",
            [
                target(f"soakd_gpu_power_watts{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}"),
            ],
            "watt",
            w=8,
            min_=0,
        ),
        panel(
            "GPU temperature",
            [
                target(f"soakd_gpu_temperature_celsius{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}"),
            ],
            "celsius",
            w=8,
        ),
        panel(
            "SM clock",
            [
                target(f"soakd_gpu_sm_clock_hertz{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}"),
            ],
            "hertz",
            w=8,
            min_=0,
        ),
        state_timeline(
            "Clock event reasons (throttling)",
            [
                target(f"soakd_gpu_clock_event_reason_active{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}} {{reason}}"),
            ],
            value_map({"0": ("inactive", "transparent"), "1": ("active", "orange")}),
            w=24,
        ),
        row("Host memory"),
        panel(
            "soakd resident and unique memory",
            [
                target(f"soakd_process_resident_memory_bytes{{{SEL}}}", "{{instance}} RSS"),
                target(f"soakd_process_unique_memory_bytes{{{SEL}}}", "{{instance}} USS"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="USS: pages only this process holds; the best host leak signal.",
        ),
        panel(
            "glibc malloc",
            [
                target(f"soakd_malloc_in_use_bytes{{{SEL}}}", "{{instance}} in use"),
                target(f"soakd_malloc_free_bytes{{{SEL}}}", "{{instance}} free (held)"),
                target(f"soakd_malloc_arena_bytes{{{SEL}}}", "{{instance}} arena"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="In use growing: a leak. Free (held) growing with in use flat: heap fragmentation.",
        ),
        panel(
            "Host memory available",
            [
                target(f"soakd_host_memory_available_bytes{{{SEL}}}", "{{instance}}"),
            ],
            "bytes",
            w=8,
            min_=0,
        ),
        panel(
            "Python allocations (tracemalloc)",
            [
                target(f"soakd_tracemalloc_traced_bytes{{{SEL}}}", "{{instance}}"),
            ],
            "bytes",
            w=8,
            min_=0,
            description="Zero unless tracemalloc is enabled.",
        ),
        panel(
            "Threads and open files",
            [
                target(f"soakd_process_threads{{{SEL}}}", "{{instance}} threads"),
                target(f"soakd_process_open_fds{{{SEL}}}", "{{instance}} open fds"),
            ],
            "short",
            w=8,
            min_=0,
        ),
        row("Python GC and CPU"),
        panel(
            "GC collections",
            [
                target(
                    f"sum by (instance, generation) (rate(soakd_python_gc_collections_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} gen {{generation}}",
                ),
            ],
            "ops",
            w=6,
            min_=0,
        ),
        panel(
            "Time in GC",
            [
                target(
                    f"sum by (instance, generation) (rate(soakd_python_gc_pause_seconds_sum{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} gen {{generation}}",
                ),
            ],
            "percentunit",
            w=6,
            min_=0,
            stack=True,
            description="Share of wall time soakd spends in stop-the-world GC pauses.",
        ),
        panel(
            "GC pause p99 (10 minute window)",
            [
                target(
                    f"histogram_quantile(0.99, sum by (instance, generation, le) "
                    f"(rate(soakd_python_gc_pause_seconds_bucket{{{SEL}}}[10m])))",
                    "{{instance}} gen {{generation}}",
                ),
            ],
            "s",
            w=6,
            min_=0,
            description="Pauses land in request latency. A 10 minute window: pauses are rare, and a shorter one "
            "shows gaps between them.",
        ),
        panel(
            "CPU",
            [
                target(f"rate(soakd_process_cpu_seconds_total{{{SEL}}}[$__rate_interval])", "{{instance}}"),
            ],
            "short",
            w=6,
            min_=0,
            description="CPU cores busy in soakd (1 = one core).",
        ),
        row("Served model (watched process)"),
        panel(
            "Served model resident and unique memory",
            [
                target(f"soakd_target_process_resident_memory_bytes{{{SEL}}}", "{{instance}} pid {{pid}} RSS"),
                target(f"soakd_target_process_unique_memory_bytes{{{SEL}}}", "{{instance}} pid {{pid}} USS"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="--watch-pid / --watch-unit, from /proc. The first watched process is the leak series "
            "target_rss / target_uss; a unit's restart starts a new pid (and a new level the verdict judges from).",
        ),
        panel(
            "Served model GPU memory",
            [
                target(f"soakd_target_gpu_process_memory_bytes{{{GPU_SEL}}}", "{{instance}} pid {{pid}} GPU {{gpu}}"),
            ],
            "bytes",
            w=12,
            min_=0,
            description="NVML's per-process list for the watched processes (leak series target_gpu_memory: the main "
            "process over all GPUs). Empty for a process without a CUDA context, or in a container that cannot "
            "see the host's pids.",
        ),
        panel(
            "Server gauges (scraped)",
            [
                target(f"soakd_target_metric{{{SEL}}}", "{{instance}} {{name}}"),
            ],
            "short",
            w=12,
            description="--scrape URL: the served model's own gauges (target.scrape_metrics), summed over their "
            "labels; counters as their rate per second. Each is the leak series target_metric:NAME.",
        ),
        state_timeline(
            "Served model leak verdicts",
            [
                target(leak_verdicts(SEL + ', series=~"target_.*"'), "{{instance}} {{series}}"),
            ],
            LEAK_STATES,
            w=12,
            description="The trend test on the served model's series. SoakdTargetLeakSuspected fires after 15 "
            "minutes suspected; yellow is a rise not worth a page (SoakdMemoryGrowthFinding, info).",
        ),
        row("Leak verdicts"),
        panel(
            "Memory trend per hour",
            [
                target(f"soakd_leak_slope_bytes_per_hour{{{SEL}}}", "{{instance}} {{series}}"),
            ],
            "bytes",
            w=12,
            description="Robust slope per series after warm-up, in bytes per hour.",
        ),
        state_timeline(
            "Leak verdicts",
            [
                target(leak_verdicts(SEL), "{{instance}} {{series}}"),
            ],
            LEAK_STATES,
            w=12,
        ),
    ]
    return dashboard(
        "soakd-memory",
        "soakd / Memory",
        "Where the memory is: torch's caching allocator, VRAM per GPU and for soakd, host RSS/USS, malloc, GC.",
        panels,
        links_to=("soakd-overview", "soakd / Overview"),
    )


def dashboards() -> dict[str, Json]:
    return {"soakd-overview.json": overview(), "soakd-memory.json": memory()}


def render(d: Json) -> str:
    return json.dumps(d, indent=2, sort_keys=False) + "\n"


def stale(out_dir: Path = OUT_DIR) -> Iterator[str]:
    for name, d in dashboards().items():
        path = out_dir / name
        if not path.exists() or path.read_text() != render(d):
            yield name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed JSON differs from the generator")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    if args.check:
        bad = list(stale(args.out))
        for name in bad:
            print(f"{args.out / name} is stale: run python3 grafana/generate.py", file=sys.stderr)
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, d in dashboards().items():
        (args.out / name).write_text(render(d))
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
