"""deploy/kubernetes/drivers/: one soak driven by an Indexed Job's pods (``--shard I/N``), as
``kubectl kustomize`` renders it (offline). Schema validation of every object is
tests/test_kubernetes.py's (it renders every kustomization, this one included)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from soakd.config import load_config
from soakd.telemetry.catalogue import Metrics
from tests.conftest import REPO
from tests.test_kubernetes import flags, one, render

DRIVERS = "drivers"


def job() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    objs = render(DRIVERS)
    j = one(objs, "Job")
    ctr = next(c for c in j["spec"]["template"]["spec"]["containers"] if c["name"] == "soakd")
    return objs, j, ctr


def shards(ctr: dict[str, Any]) -> int:
    m = re.fullmatch(r"\$\(JOB_COMPLETION_INDEX\)/(\d+)", flags(ctr)["--shard"])
    assert m, flags(ctr)["--shard"]
    return int(m.group(1))


def env(ctr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in ctr["env"]}


def configmap(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    assert name in cms, f"{name} is not a ConfigMap the kustomization emits"
    return dict(cms[name]["data"])


def test_an_indexed_job_whose_pod_i_is_shard_i_of_n() -> None:
    """Pod I runs --shard I/N with N the Job's completions and parallelism (every shard at
    once); the index comes from the pod's completion-index label; a dead driver is restarted
    a bounded number of times."""
    _, j, ctr = job()
    spec = j["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == shards(ctr) >= 2
    assert 0 < spec["backoffLimit"] <= 4 * spec["completions"]
    assert spec["template"]["spec"]["restartPolicy"] == "OnFailure"
    ref = env(ctr)["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.labels['batch.kubernetes.io/job-completion-index']"


def test_every_shard_starts_from_the_one_instant_of_a_configmap() -> None:
    objs, _, ctr = job()
    assert flags(ctr)["--start-at"] == "$(START_AT)"
    ref = env(ctr)["START_AT"]["valueFrom"]["configMapKeyRef"]
    assert "start_at" in configmap(objs, ref["name"]) and ref["key"] == "start_at"


def test_each_shard_keeps_its_state_in_its_own_folder_of_one_claim() -> None:
    """The state dir is the pod's own folder (shard-I) on a ReadWriteMany claim that outlives
    the Job, where `soakd report --merge` finds every shard; drivers ask for no GPU."""
    objs, j, ctr = job()
    pod = j["spec"]["template"]["spec"]
    mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == flags(ctr)["--state-dir"])
    assert "$(JOB_COMPLETION_INDEX)" in mount["subPathExpr"]
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = one(objs, "PersistentVolumeClaim")
    assert vol["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert not any("nvidia.com/gpu" in r for r in ctr["resources"].values())
    assert "cpu" not in ctr["resources"]["limits"]


def test_pod_security() -> None:
    _, j, ctr = job()
    pod = j["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in ctr["volumeMounts"] if m["name"] in ("state", "tmp")}
    assert {flags(ctr)["--state-dir"], env(ctr)["HOME"]["value"]} <= writable


@pytest.mark.parametrize("index", ["first", "last"])
def test_the_config_is_valid_for_every_shard(index: str, tmp_path: Path) -> None:
    """The mounted soak.toml passes soakd's validation with each pod's flags (the shard, the
    start instant); one seed, and the state resumes after a restart."""
    objs, j, ctr = job()
    vol = next(v for v in j["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    path = tmp_path / "soak.toml"
    path.write_text(configmap(objs, vol["configMap"]["name"])["soak.toml"])
    n = shards(ctr)
    start = configmap(objs, env(ctr)["START_AT"]["valueFrom"]["configMapKeyRef"]["name"])["start_at"]
    i = 0 if index == "first" else n - 1
    cfg = load_config(str(path), {"load.shard": f"{i}/{n}", "load.start_at": start})
    assert cfg.target.url and cfg.load.rate is not None and cfg.load.rate >= n
    assert cfg.state.resume is True


def test_the_podmonitor_labels_each_drivers_series_with_its_soak_and_shard() -> None:
    """The PodMonitor selects the Job's pods and labels their series soak (a pod label every
    driver carries) and shard (the completion index), the labels the summing rules group by;
    neither shadows a label of soakd's own metrics."""
    objs, j, _ = job()
    mon = one(objs, "PodMonitor")
    labels = j["spec"]["template"]["metadata"]["labels"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[mon["spec"]["jobLabel"]] == "soakd"
    (ep,) = mon["spec"]["podMetricsEndpoints"]
    targets = {r["targetLabel"]: r.get("sourceLabels") for r in ep["relabelings"]}
    assert targets["soak"] == ["__meta_kubernetes_pod_label_soakd_io_soak"] and labels["soakd.io/soak"]
    assert targets["shard"] == ["__meta_kubernetes_pod_label_batch_kubernetes_io_job_completion_index"]
    metrics = Metrics(CollectorRegistry())
    own = {n for m in vars(metrics).values() for n in getattr(m, "_labelnames", ())}
    assert not set(targets) & own


def test_the_summing_rules_group_by_soak() -> None:
    """Every rule of soakd-shards.yml sums or counts by soak and reads only drivers' series."""
    doc = yaml.safe_load((REPO / "prometheus" / "rules" / "soakd-shards.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        assert rule["record"].startswith("soak"), rule["record"]
        expr = rule["expr"]
        assert re.search(r"by \([^)]*\bsoak\b", expr) or expr.startswith("histogram_quantile(0."), rule["record"]
        for selector in re.findall(r"(soakd_[a-z_]+|up)\{([^}]*)\}", expr):
            assert 'soak!=""' in selector[1], (rule["record"], selector)
