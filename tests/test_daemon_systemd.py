"""The shipped unit files pass `systemd-analyze verify` and carry the settings a soak relies on.

verify insists that ExecStart's binary exists, so each unit is checked as a copy whose
ExecStart points at this checkout's `soakd` (the venv's entry point) instead of /opt/soakd.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

UNITS = REPO / "systemd"
pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")


def _soakd_exe() -> str:
    exe = Path(sys.executable).with_name("soakd")
    if not exe.exists():
        pytest.skip("no soakd entry point next to this python (pip install -e .)")
    return str(exe)


def _copy(unit: str, dest: Path) -> Path:
    text = (UNITS / unit).read_text()
    assert "/opt/soakd/bin/soakd" in text
    out = dest / unit
    out.write_text(text.replace("/opt/soakd/bin/soakd", _soakd_exe()))
    return out


@pytest.mark.parametrize("unit,verify_as", [("soakd.service", "soakd.service"), ("soakd@.service", "soakd@0.service")])
def test_units_pass_systemd_analyze_verify(unit: str, verify_as: str, tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit (the template as instance 0) without a warning."""
    _copy(unit, tmp_path)
    res = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / verify_as)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == "", res.stderr


@pytest.mark.parametrize("unit", ["soakd.service", "soakd@.service"])
def test_units_declare_notify_watchdog_restart_and_hardening(unit: str) -> None:
    """Type=notify with a watchdog, restarts on failure but not on config errors, and hardened."""
    lines = {line.strip() for line in (UNITS / unit).read_text().splitlines()}
    for setting in (
        "Type=notify",
        "Restart=on-failure",
        "RestartPreventExitStatus=1 2",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
    ):
        assert setting in lines, setting
    keys = {line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("#")}
    assert {"WatchdogSec", "TimeoutStartSec", "StateDirectory", "CacheDirectory", "EnvironmentFile"} <= keys


def _exec_start_args(unit: str, instance: str, env: dict[str, str]) -> list[str]:
    """ExecStart's arguments after the binary, as systemd would pass them: %i expanded and
    ``$VAR`` words split from the environment files (unset ones vanish)."""
    line = next(ln for ln in (UNITS / unit).read_text().splitlines() if ln.startswith("ExecStart="))
    words = line.split("=", 1)[1].replace("%i", instance).split()[1:]
    out: list[str] = []
    for w in words:
        out.extend(env.get(w[1:], "").split() if w.startswith("$") else [w])
    return out


def test_template_instances_get_their_own_metrics_port() -> None:
    """soakd@0 and soakd@1 side by side must not both ask for one port (the second would exit 2);
    a port set in the instance's env file wins over the template's."""
    from soakd.cli import _overrides, build_parser
    from soakd.config import load_config

    def addr(instance: str, env: dict[str, str]) -> str:
        args = _exec_start_args("soakd@.service", instance, env)
        i = args.index("--config")
        del args[i : i + 2]  # /etc/soakd/soakd.toml is not on this machine
        return load_config(None, _overrides(build_parser().parse_args(args))).metrics.addr

    addrs = [addr(str(n), {}) for n in range(8)]
    assert addrs[0] == "127.0.0.1:9470" and len(set(addrs)) == 8
    assert addr("1", {"SOAKD_INSTANCE_OPTS": "--metrics-addr 0.0.0.0:9571"}) == "0.0.0.0:9571"
