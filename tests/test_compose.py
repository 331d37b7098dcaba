"""The compose stacks, checked the way `docker compose config` would, plus what we promise on top.

There is no Docker engine in CI, so the files are parsed and every reference is followed: images
pinned, the build's Dockerfile present, bind mounts that exist in the repo, named volumes
declared, the GPU reserved the compose way, and the Prometheus config each stack loads.
`docker compose config` also runs where the compose plugin is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

STACKS = ["docker-compose.yml", "docker-compose.host.yml"]
by_stack = pytest.mark.parametrize("name", STACKS)


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / name).read_text())
    return doc


def flag(command: list[str], name: str) -> str:
    for arg in command:
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


@by_stack
def test_images_are_pinned_and_volumes_declared(name: str) -> None:
    """Every image has an explicit version tag; every named volume is declared; every bind mount exists."""
    compose = load(name)
    declared = set(compose.get("volumes") or {})
    for svc_name, svc in compose["services"].items():
        image = svc.get("image", "")
        if "build" not in svc:
            assert re.fullmatch(r"[\w./-]+:v?\d+(\.\d+)+", image), (svc_name, image)
        for vol in svc.get("volumes", []):
            source, target, *mode = vol.split(":")
            assert target.startswith("/"), vol
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: {svc_name} mounts missing {source}"
                assert mode == ["ro"], f"{name}: {svc_name} should mount repo files read-only: {vol}"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_full_stack_builds_soakd_and_reserves_a_gpu() -> None:
    """soakd is built from the repo's Dockerfile, reserves an NVIDIA GPU, serves where Prometheus looks."""
    compose = load("docker-compose.yml")
    assert set(compose["services"]) == {"soakd", "prometheus", "grafana"}
    soakd = compose["services"]["soakd"]
    build = soakd["build"]
    context = REPO / (build if isinstance(build, str) else build.get("context", "."))
    assert (context / "Dockerfile").is_file()
    devices = soakd["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), devices
    addr = flag(soakd["command"], "--metrics-addr")
    assert addr == "0.0.0.0:9464"
    targets = _targets(REPO / "prometheus" / "prometheus.yml")
    assert "soakd:9464" in targets


def test_dockerfile_runs_soakd_unprivileged() -> None:
    """The image's entrypoint is soakd, as a non-root user, with the metrics port exposed."""
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM \S+:\S+", text, re.M), "pin the base image"
    assert re.search(r'^ENTRYPOINT \["soakd"\]', text, re.M)
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    assert re.search(r"^EXPOSE 9464", text, re.M)
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!soakd/" in ignore, "send the build only the package, not .venv or state"


def test_host_stack_watches_a_systemd_soakd_on_loopback() -> None:
    """Prometheus and Grafana only, on the host network, scraping soakd's default 127.0.0.1:9464."""
    compose = load("docker-compose.host.yml")
    assert set(compose["services"]) == {"prometheus", "grafana"}
    prom = compose["services"]["prometheus"]
    assert prom["network_mode"] == "host"
    config = flag(prom["command"], "--config.file")
    assert config.startswith("/etc/prometheus/")
    mounted = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"]}
    host_config = REPO / mounted["/etc/prometheus"] / config.removeprefix("/etc/prometheus/")
    assert host_config.is_file()
    assert _targets(host_config) == ["127.0.0.1:9464"]
    grafana = compose["services"]["grafana"]
    listen = flag(prom["command"], "--web.listen-address")
    assert grafana["environment"]["SOAKD_PROMETHEUS_URL"] == f"http://{listen}"


@by_stack
def test_prometheus_loads_the_repo_rules(name: str) -> None:
    """The Prometheus of each stack reads its config and rules from the mounted prometheus/ directory."""
    prom = load(name)["services"]["prometheus"]
    assert "./prometheus:/etc/prometheus:ro" in prom["volumes"]
    config = yaml.safe_load(
        (REPO / "prometheus" / flag(prom["command"], "--config.file").rsplit("/", 1)[1]).read_text()
    )
    assert config["rule_files"] == ["rules/*.yml"]


def _targets(config: Path) -> list[str]:
    jobs = {j["job_name"]: j for j in yaml.safe_load(config.read_text())["scrape_configs"]}
    return [t for sc in jobs["soakd"]["static_configs"] for t in sc["targets"]]


@by_stack
def test_docker_compose_config_accepts_it(name: str) -> None:
    """`docker compose config` validates the file against the compose spec (where the plugin exists)."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose plugin not installed")
    res = subprocess.run(
        [docker, "compose", "-f", name, "config", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
