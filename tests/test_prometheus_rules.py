"""The shipped Prometheus config and rules: valid for promtool, unit-tested, in the mixin style."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from soakd.telemetry.catalogue import Metrics
from tests.conftest import REPO

PROM = REPO / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
CONFIGS = [PROM / "prometheus.yml", PROM / "prometheus.host.yml"]
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def rules() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def catalogue_names() -> set[str]:
    """Every metric family soakd exports (base names, as Prometheus' text format announces them)."""
    return {family.name for family in Metrics().registry.collect()}


def metric_names(expr: str) -> set[str]:
    """soakd_* metric names an expression reads, with _bucket/_sum/_count/_total/_created stripped."""
    code = re.sub(r'"[^"]*"', '""', expr)  # label values are not names
    tokens = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", code)  # recording rule names (with ':') are not metrics
    names = {t for t in tokens if re.fullmatch(r"soakd_[a-z0-9_]+", t)}
    return {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in names}


@needs_promtool
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_prometheus_config_is_valid(config: Path) -> None:
    """promtool accepts each shipped Prometheus config, rule files included."""
    res = promtool("check", "config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(RULE_FILES)} rule files found" in res.stdout, res.stdout


@needs_promtool
def test_rule_files_are_valid() -> None:
    """promtool accepts every rule file."""
    res = promtool("check", "rules", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    """Every alert fires when and only when its promtool test says, with the labels and text given."""
    assert TEST_FILES
    res = promtool("test", "rules", *[p.name for p in TEST_FILES], cwd=PROM / "tests")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_alerts_follow_the_mixin_style() -> None:
    """Alert names are CamelCase with a Soakd prefix; each has a severity and a summary and description."""
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)), names
    for a in alerts():
        assert re.fullmatch(r"Soakd[A-Z][A-Za-z0-9]*", a["alert"]), a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning", "info"), a
        assert a["annotations"]["summary"].strip() and a["annotations"]["description"].strip(), a


def test_the_required_alerts_exist() -> None:
    """Leak, VRAM/host exhaustion, fragmentation, retries, OOMs, p99, errors, throughput, collectors, down."""
    assert {a["alert"] for a in alerts()} >= {
        "SoakdMemoryLeakSuspected",
        "SoakdGPUMemoryExhaustionPredicted",
        "SoakdHostMemoryExhaustionPredicted",
        "SoakdAllocatorFragmentationHigh",
        "SoakdAllocatorRetries",
        "SoakdCUDAOutOfMemory",
        "SoakdLatencyP99AboveSLO",
        "SoakdErrorRatioHigh",
        "SoakdThroughputCollapsed",
        "SoakdCollectorDown",
        "SoakdDown",
        "SoakdTargetDown",
        "SoakdTargetLeakSuspected",
        "SoakdMemoryGrowthFinding",
    }
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    assert "predict_linear" in exprs["SoakdGPUMemoryExhaustionPredicted"]
    assert "predict_linear" in exprs["SoakdHostMemoryExhaustionPredicted"]
    # A served model's leak alerts once, as itself; soakd's own leak alert leaves it out.
    assert 'series=~"target_.*"' in exprs["SoakdTargetLeakSuspected"]
    assert 'series!~"target_.*"' in exprs["SoakdMemoryLeakSuspected"]
    assert {a["alert"]: a.get("for") for a in alerts()}["SoakdTargetDown"] == "1m"
    # Slow creep and allocator retention are findings: an info alert, never a page (#39).
    assert {a["alert"]: a["labels"]["severity"] for a in alerts()}["SoakdMemoryGrowthFinding"] == "info"


def test_every_alert_has_a_quiet_and_a_firing_case() -> None:
    """Each alert is tested where it must not fire (yet) and where it fires with labels and annotations."""
    quiet: set[str] = set()
    firing: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                exp = check.get("exp_alerts") or []
                if not exp:
                    quiet.add(check["alertname"])
                    continue
                for e in exp:
                    assert "severity" in e["exp_labels"], (case["name"], e)
                    assert {"summary", "description"} <= set(e["exp_annotations"]), (case["name"], e)
                firing.add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - quiet == set(), "alerts without a must-not-fire case"
    assert names - firing == set(), "alerts without a firing case"


def test_rules_read_only_metrics_soakd_exports() -> None:
    """Every soakd_ metric a rule reads is in the metric catalogue (a rename breaks this, not a page)."""
    known = catalogue_names()
    for r in rules():
        missing = metric_names(r["expr"]) - known
        assert not missing, (r.get("alert") or r.get("record"), missing)


def test_alert_windows_outlast_a_sawtooth() -> None:
    """Memory alerts extrapolate over hours and must hold a while: a GC or allocator saw-tooth cannot page."""

    def minutes(d: str) -> int:
        m = re.fullmatch(r"(\d+)([mh])", d)
        assert m, d
        return int(m.group(1)) * (60 if m.group(2) == "h" else 1)

    for a in alerts():
        if "predict_linear" in a["expr"]:
            window = re.search(r"predict_linear\([^\[]+\[(\w+)\]", a["expr"])
            assert window and minutes(window.group(1)) >= 60, a["alert"]
            assert minutes(a["for"]) >= 15, a["alert"]


def test_docs_explain_every_alert() -> None:
    """The alert table in docs/dashboards.md says what each alert means and what to do."""
    page = (REPO / "docs" / "dashboards.md").read_text()
    section = page.split("## Alerts", 1)[1].split("\n## ", 1)[0]
    for a in alerts():
        assert a["alert"] in section, a["alert"]
