"""Secrets stay out: config values under credential-like keys (token, key, secret, password,
authorization) are redacted in every output a run leaves, which are written 0600."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from soakd.config import REDACTED, is_secret_key, redact_secrets
from tests.conftest import soakd_cmd

FACTORY = '''
import torch


class Echo(torch.nn.Module):
    def forward(self, x):
        return x * 1.0


def make(**options):
    """A model whose factory takes credentials, as one that pulls weights from a hub would."""
    return Echo()
'''

CONFIG = """
[model]
spec = "python:{factory}:make"
warmup = 1

[model.options]
api_token = "SEKRET-token-1"
apiKey = "SEKRET-key-2"
max_tokens = 7

[model.options.hub]
password = "SEKRET-pw-3"
Authorization = "Bearer SEKRET-auth-4"
repo = "org/model"

[input]
shapes = "16"

[load]
concurrency = 2
duration = "1s"
"""


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short run whose model options carry four credentials; returns its folder."""
    root = tmp_path_factory.mktemp("secrets")
    (root / "factory.py").write_text(FACTORY)
    (root / "soak.toml").write_text(CONFIG.format(factory=root / "factory.py"))
    proc = subprocess.run(
        soakd_cmd(
            "run",
            "--config",
            str(root / "soak.toml"),
            "--state-dir",
            str(root / "state"),
            "--run-id",
            "r1",
            "--summary-json",
            str(root / "summary.json"),
            "--metrics-addr",
            "127.0.0.1:0",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SEKRET" not in proc.stdout + proc.stderr
    return root


def outputs(root: Path) -> dict[str, bytes]:
    """Every file the run and `soakd report` leave, by name: summaries, reports and the database."""
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in (root / "state").rglob("*") if p.is_file()}
    files["summary.json"] = (root / "summary.json").read_bytes()
    for fmt in ("json", "html", "md"):
        proc = subprocess.run(
            soakd_cmd("report", "--state-dir", str(root / "state"), "--format", fmt),
            capture_output=True,
            timeout=60,
            check=True,
        )
        files[f"report --format {fmt}"] = proc.stdout
    return files


def test_no_output_holds_a_secret(soaked: Path) -> None:
    """summary.json, report.html, the database (and its WAL) and every `soakd report` format are free
    of the four credential values."""
    files = outputs(soaked)
    assert "state/soakd.db" in files and "state/r1/report.html" in files  # these were searched
    assert {name: data.count(b"SEKRET") for name, data in files.items() if b"SEKRET" in data} == {}


def test_the_config_stays_readable_around_the_secrets(soaked: Path) -> None:
    """Redaction replaces the values only: the keys, max_tokens and the other options are still there."""
    options = json.loads((soaked / "summary.json").read_text())["run"]["config"]["model"]["options"]
    assert options == {
        "api_token": REDACTED,
        "apiKey": REDACTED,
        "max_tokens": 7,
        "hub": {"password": REDACTED, "Authorization": REDACTED, "repo": "org/model"},
    }


def test_summary_and_report_are_private(soaked: Path) -> None:
    """The summary and the HTML report in the state dir, and --summary-json, are mode 0600."""
    for path in (
        soaked / "summary.json",
        soaked / "state" / "r1" / "summary.json",
        soaked / "state" / "r1" / "report.html",
    ):
        assert path.stat().st_mode & 0o777 == 0o600, path


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_token", True),
        ("HF_TOKEN", True),
        ("apiKey", True),
        ("x-api-key", True),
        ("client_secret", True),
        ("db_password", True),
        ("Authorization", True),
        ("access-token", True),
        ("max_tokens", False),
        ("keyframes", False),
        ("tokenizer", False),
        ("monkey", False),
        ("batch_ms", False),
    ],
)
def test_credentials_are_told_by_the_parts_of_a_key_name(key: str, secret: bool) -> None:
    """Whole name parts decide, case-insensitively: api_token is a secret, max_tokens is not."""
    assert is_secret_key(key) is secret


def test_redaction_reaches_into_lists_and_leaves_none_alone() -> None:
    """Nested tables inside lists are redacted; an unset (None) secret stays None; the input is not changed."""
    data: dict[str, Any] = {"hubs": [{"token": "t"}, {"name": "n"}], "password": None}
    assert redact_secrets(data) == {"hubs": [{"token": REDACTED}, {"name": "n"}], "password": None}
    assert data["hubs"][0]["token"] == "t"


def test_otlp_header_secrets_appear_nowhere(tmp_path: Path) -> None:
    """What held: a bearer token in OTEL_EXPORTER_OTLP_HEADERS reaches the collector and no output."""
    seen: list[str] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            seen.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20SEKRET-otlp-5",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[otel]\nexport_interval = "500ms"\n')
    try:
        proc = subprocess.run(
            soakd_cmd(
                "run",
                "--config",
                str(cfg),
                "--model",
                "builtin:noop",
                "--warmup",
                "1",
                "--duration",
                "2s",
                "--state-dir",
                str(tmp_path / "state"),
                "--run-id",
                "r1",
                "--summary-json",
                str(tmp_path / "summary.json"),
                "--metrics-addr",
                "127.0.0.1:0",
            ),
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        collector.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert "Bearer SEKRET-otlp-5" in seen  # the token did its job
    leaked = [
        p.name
        for p in [tmp_path / "summary.json", *(tmp_path / "state").rglob("*")]
        if p.is_file() and b"SEKRET" in p.read_bytes()
    ]
    assert leaked == [] and "SEKRET" not in proc.stdout + proc.stderr
