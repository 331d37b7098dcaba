"""The Grafana dashboards and provisioning: current with their generator, provisioning-friendly, complete."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.telemetry.catalogue import Metrics
from tests.conftest import REPO

GRAFANA = REPO / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
NVML_METRIC = re.compile(r"\bsoakd_gpu_\w+")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def data_panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def recorded_names() -> set[str]:
    out = set()
    for path in (REPO / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out |= {r["record"] for r in group["rules"] if "record" in r}
    return out


by_name = pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)


def test_generated_json_is_current(tmp_path: Path) -> None:
    """The committed dashboards are what grafana/generate.py produces (edit the generator, then rerun it)."""
    gen = str(GRAFANA / "generate.py")
    res = subprocess.run([sys.executable, gen, "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # And the generator writes exactly the committed set of files.
    subprocess.run([sys.executable, gen, "--out", str(tmp_path)], check=True, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in DASHBOARDS]


def test_overview_and_memory_dashboards_exist() -> None:
    """An overview and a memory dashboard, each with a stable uid for links and bookmarks."""
    uids = {load(p)["uid"] for p in DASHBOARDS}
    assert uids == {"soakd-overview", "soakd-memory"}


@by_name
def test_datasource_is_a_variable_used_everywhere(path: Path) -> None:
    """A `datasource` variable picks the Prometheus, and every panel and target goes through ${datasource}."""
    d = load(path)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for p in data_panels(d):
        assert p["datasource"] == DS_REF, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DS_REF, (p["title"], t)
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == DS_REF, v["name"]
    # No data source is pinned by uid anywhere (only the built-in annotation's Grafana one).
    uids = set(re.findall(r'"uid": "([^"]*)"', path.read_text())) - {d["uid"]}
    assert uids <= {"${datasource}", "-- Grafana --"}, uids


@by_name
def test_templated_by_job_instance_and_gpu(path: Path) -> None:
    """$job, $instance and $gpu (multi, All) exist; soakd queries filter by instance, NVML ones by GPU."""
    d = load(path)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name in ("job", "instance", "gpu"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"], name
    for p in data_panels(d):
        for t in p["targets"]:
            expr = t["expr"]
            if "soakd_" in expr or re.search(r"\bup\b|scrape_", expr):
                assert 'instance=~"$instance"' in expr, (p["title"], expr)
            if NVML_METRIC.search(expr):
                assert 'gpu=~"$gpu"' in expr, (p["title"], expr)


@by_name
def test_every_panel_has_a_unit(path: Path) -> None:
    """Every panel says what its numbers are (bytes, s, percentunit, reqps, ...)."""
    for p in data_panels(load(path)):
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert isinstance(unit, str) and unit, p["title"]
        if p["type"] == "heatmap":
            assert p["options"]["yAxis"]["unit"] == unit, p["title"]


@by_name
def test_panel_ids_are_unique_and_the_grid_does_not_overlap(path: Path) -> None:
    """Unique panel ids, refIds unique per panel, panels inside the 24-column grid without overlapping."""
    d = load(path)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]


@by_name
def test_queries_read_only_metrics_that_exist(path: Path) -> None:
    """Every soakd_ metric a panel reads is in the catalogue; every recorded series is in the rules."""
    known = {f.name for f in Metrics().registry.collect()}
    recorded = recorded_names()
    for p in data_panels(load(path)):
        for t in p["targets"]:
            code = re.sub(r'"[^"]*"', '""', t["expr"])  # label values are not names
            tokens = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", code))
            for tok in tokens:
                if ":" in tok:
                    assert tok in recorded, (p["title"], tok)
                elif tok.startswith("soakd_"):
                    assert re.sub(r"_(bucket|sum|count|total)$", "", tok) in known, (p["title"], tok)


def test_overview_covers_what_an_operator_watches() -> None:
    """Overview: run, phase, throughput, per-stage latency and heatmap, lag, batching, leaks, collectors."""
    d = load(GRAFANA / "dashboards" / "soakd-overview.json")
    text = json.dumps(d)
    for metric in (
        "soakd_run_info",
        "soakd_phase_info",
        "soakd_requests_total",
        "soakd_request_duration_seconds",
        "soakd_schedule_lag_seconds",
        "soakd_batch_size",
        "soakd_queue_depth",
        "soakd_leak_suspected",
        "soakd_leak_slope_bytes_per_hour",
        "soakd_memory_exhaustion_eta_seconds",
        "soakd_collector_up",
    ):
        assert metric in text, metric
    assert any(p["type"] == "heatmap" for p in d["panels"])


def test_memory_dashboard_covers_allocator_vram_and_host() -> None:
    """Memory: allocator (allocated ... OOMs), VRAM per GPU and process, RSS/USS, malloc, GC."""
    text = (GRAFANA / "dashboards" / "soakd-memory.json").read_text()
    for metric in (
        "soakd_torch_cuda_allocated_bytes",
        "soakd_torch_cuda_reserved_bytes",
        "soakd_torch_cuda_inactive_split_bytes",
        "soakd_torch_cuda_fragmentation_ratio",
        "soakd_torch_cuda_alloc_retries_total",
        "soakd_torch_cuda_ooms_total",
        "soakd_gpu_memory_used_bytes",
        "soakd_gpu_process_memory_bytes",
        "soakd_process_resident_memory_bytes",
        "soakd_process_unique_memory_bytes",
        "soakd_malloc_in_use_bytes",
        "soakd_malloc_free_bytes",
        "soakd_python_gc_collections_total",
    ):
        assert metric in text, metric


def test_served_model_and_llm_panels() -> None:
    """A network target: up/down and answers, the watched process's host and GPU memory, the
    scraped server gauges, their leak verdicts; LLM streams: TTFT, ITL, TPOT at p50/p90/p99,
    tokens/s by kind, goodput."""
    overview = (GRAFANA / "dashboards" / "soakd-overview.json").read_text()
    memory = (GRAFANA / "dashboards" / "soakd-memory.json").read_text()
    for metric in ("soakd_target_up", "soakd_target_responses_total", "soakd_target_process_resident_memory_bytes"):
        assert metric in overview, metric
    for metric in (
        "soakd_target_process_resident_memory_bytes",
        "soakd_target_process_unique_memory_bytes",
        "soakd_target_gpu_process_memory_bytes",
        "soakd_target_metric",
    ):
        assert metric in memory, metric
    assert 'series=~\\"target_.*\\"' in memory
    exprs = [t["expr"] for p in data_panels(load(GRAFANA / "dashboards" / "soakd-overview.json")) for t in p["targets"]]
    for hist in ("time_to_first_token", "inter_token_latency", "time_per_output_token"):
        on_it = [e for e in exprs if f"soakd_{hist}_seconds_bucket" in e]
        quantiles = {q for e in on_it for q in re.findall(r"quantile\(([\d.]+)", e)}
        assert quantiles == {"0.5", "0.9", "0.99"}, hist
    assert any("soakd_tokens_total" in e and "kind" in e for e in exprs)
    assert any("soakd_goodput_requests_total" in e for e in exprs)


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards() -> None:
    """A Prometheus data source and a file provider whose path is where compose mounts grafana/dashboards."""
    sources = [
        ds
        for f in (GRAFANA / "provisioning" / "datasources").glob("*.yml")
        for ds in yaml.safe_load(f.read_text())["datasources"]
    ]
    assert [ds["type"] for ds in sources] == ["prometheus"]
    assert sources[0]["isDefault"] is True and sources[0]["url"]
    providers = [
        p
        for f in (GRAFANA / "provisioning" / "dashboards").glob("*.yml")
        for p in yaml.safe_load(f.read_text())["providers"]
    ]
    assert len(providers) == 1 and providers[0]["type"] == "file"
    dash_path = providers[0]["options"]["path"]
    for compose in ("docker-compose.yml", "docker-compose.host.yml"):
        grafana = yaml.safe_load((REPO / compose).read_text())["services"]["grafana"]
        assert f"./grafana/dashboards:{dash_path}:ro" in grafana["volumes"], compose
        assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"], compose
        # The data source URL comes from the environment compose sets.
        assert "SOAKD_PROMETHEUS_URL" in sources[0]["url"]
        assert grafana["environment"]["SOAKD_PROMETHEUS_URL"].startswith("http"), compose
