"""The rehearsal of the device call (bench/gpu_rehearse.sh, issue #36): its import check names a
module-level import of a package the device image lacks, the packages it may install are the
image's, and a step's GPU-only claims gate on a GPU but not on the CPU rehearsal. CI runs the
rehearsal itself (.ci/run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import imports as gpu_imports
from bench.gpu import steps as gpu_steps
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 only
    import tomli as tomllib


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _image() -> set[str]:
    lines = (REPO / "bench" / "gpu" / "image_packages.txt").read_text().splitlines()
    return {_norm(line) for line in lines if line and not line.startswith("#")}


def _carried() -> set[str]:
    """The distributions bench/gpu_wheels.sh downloads (NAME==VERSION on its pip line)."""
    text = (REPO / "bench" / "gpu_wheels.sh").read_text()
    return {_norm(n) for n in re.findall(r"([A-Za-z][A-Za-z0-9_.-]*)==", text)}


def _import_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env_path = f"{REPO}:{tmp_path}"
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu.imports", *args],
        cwd=REPO,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e  # the check runs in a fresh interpreter, as gpu_check.sh runs it
def test_the_import_check_names_a_module_level_import_the_image_lacks(tmp_path: Path) -> None:
    """A module that imports tritonclient at module level fails the check (exit 1) with the module
    and the package named, when tritonclient is absent as on the device image."""
    (tmp_path / "needs_triton.py").write_text("import tritonclient.grpc\n")
    res = _import_check(tmp_path, "--absent", "image", "--also", "needs_triton")
    assert res.returncode == 1, res.stderr
    assert "cannot import what the steps run: needs_triton: ModuleNotFoundError" in res.stderr
    assert "tritonclient" in res.stderr


@pytest.mark.e2e  # the check runs in a fresh interpreter, as gpu_check.sh runs it
def test_what_the_steps_run_imports_without_the_packages_the_image_lacks(tmp_path: Path) -> None:
    """soakd's CLI, run session, sweep, samplers and the bench steps import with tritonclient and
    python-rapidjson absent (they load only when a kserve-v2 target is used)."""
    res = _import_check(tmp_path, "--absent", "image")
    assert res.returncode == 0, res.stderr


def test_every_soakd_dependency_is_on_the_image_carried_or_imported_only_when_used() -> None:
    """pyproject's dependencies: in the image's package list, or a wheel of bench/gpu_wheels.sh, or
    named in IMAGE_LACKS (what the import check blocks to stand in for the image)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {_norm(re.split(r"[\[<>=;! ]", d, maxsplit=1)[0]) for d in deps if "python_version <" not in d}
    lacking = names - _image() - _carried()
    assert lacking <= {_norm(n) for n in gpu_imports.IMAGE_LACKS}, sorted(lacking)
    assert not _carried() & _image(), "a carried wheel the image already has"


def test_the_rehearsal_installs_only_packages_of_the_image() -> None:
    """Every name on gpu_rehearse.sh's install line is in the image's list (the script checks the
    rest: what pip brought along)."""
    line = next(x for x in (REPO / "bench" / "gpu_rehearse.sh").read_text().splitlines() if x.startswith("need=("))
    specs = line[len("need=(") : -1].replace("'", "").split()
    names = {_norm(re.split(r"[<>=]", s, maxsplit=1)[0]) for s in specs}
    assert "torch" in names and names <= _image(), sorted(names - _image())


def test_device_claims_gate_on_a_gpu_but_not_on_the_cpu_rehearsal() -> None:
    r = gpu_steps.Result(checks={"soakd run exit 0": True}, device_checks={"fixtures recorded": False})
    on_gpu = r.payload(rehearse=False)
    assert on_gpu["checks"] == {"soakd run exit 0": True, "fixtures recorded": False}
    rehearsal = r.payload(rehearse=True)
    assert rehearsal["checks"] == {"soakd run exit 0": True}
    assert rehearsal["details"]["device_checks_not_gated"] == {"fixtures recorded": False}


def test_a_held_split_ratio_ignores_one_high_scrape() -> None:
    """The fragmentation comparison reads the level a series settles at: one mid-batch scrape of the
    ConvNet at 0.4 does not outrank a churn model held at 0.2 (the flaky peak comparison)."""
    convnet = [(float(t), 0.01) for t in range(20)]
    convnet[15] = (15.0, 0.4)
    churn = [(float(t), 0.2) for t in range(20)]
    assert gpu_steps.settled_median(convnet) == 0.01
    assert gpu_steps.settled_median(churn) == 0.2
    assert gpu_steps.settled_median([]) is None


@pytest.mark.e2e  # runs bench/gpu_check.sh
def test_gpu_check_stops_at_once_naming_the_import_when_its_python_lacks_a_package(tmp_path: Path) -> None:
    """In the rehearsal, a python3 that lacks a package the steps import (APScheduler, as if
    gpu_wheels.sh stopped carrying it): exit 1 before any step, the module and package named,
    nothing bootstrapped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SOAKD_GPU_REHEARSE": "1",
        "SOAKD_GPU_ABSENT": "apscheduler",
        "SOAKD_SITE": str(tmp_path / "site"),
    }
    res = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "No module named 'apscheduler'" in res.stderr and "nothing bootstrapped" in res.stderr
    assert ("running" not in res.stdout and not (REPO / ".venv").exists()) or "creating .venv" not in res.stderr
