"""A soak of a model in process loads no network client, gRPC stub or OpenTelemetry SDK: the GPU
check's image has none of them (issue #36), and each costs start-up time. A soak of a served model
loads no torch: its driver runs no model, and torch costs each driver process (and each
``--workers`` worker) about 1 s of CPU and 190 MB of RSS. End-to-end: a fresh interpreter runs
``soakd run`` and ``soakd sweep`` and reports what it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.e2e

HEAVY = ("aiohttp", "grpc", "tritonclient", "rapidjson", "opentelemetry", "torch")
REPO = Path(__file__).resolve().parent.parent

PROBE = """
import json, runpy, sys
args, heavy = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
sys.argv = ["soakd", *args]
code = 0
try:
    runpy.run_module("soakd", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("PROBE", json.dumps({"rc": code, "loaded": sorted({m.split(".")[0] for m in sys.modules} & heavy)}))
"""


def _imports_of(tmp_path: Path, *args: str, heavy: tuple[str, ...] = HEAVY) -> dict[str, object]:
    """Run ``soakd ARGS`` in a fresh interpreter; its exit code and which of ``heavy`` it loaded."""
    probe = [sys.executable, "-c", PROBE, json.dumps(list(args)), json.dumps(heavy)]
    res = subprocess.run(probe, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    line = [x for x in res.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, res.stdout + res.stderr
    return json.loads(line[-1][len("PROBE ") :])  # type: ignore[no-any-return]


def test_a_builtin_soak_imports_no_protocol_client(tmp_path: Path) -> None:
    """`soakd run --model builtin:noop` finishes (exit 0) without importing aiohttp, grpc,
    tritonclient, rapidjson or the OpenTelemetry SDK."""
    got = _imports_of(
        tmp_path,
        "run",
        "--model",
        "builtin:noop",
        "--duration",
        "1s",
        "--warmup",
        "2",
        "--metrics-addr",
        f"127.0.0.1:{free_port()}",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert got == {"rc": 0, "loaded": ["torch"]}


def test_a_sweep_imports_no_protocol_client(tmp_path: Path) -> None:
    """`soakd sweep` of a builtin model also starts without the protocol modules."""
    got = _imports_of(
        tmp_path,
        "sweep",
        "--model",
        "builtin:noop",
        "--concurrency",
        "1,2",
        "--step-duration",
        "1s",
        "--warmup",
        "2",
    )
    assert got == {"rc": 0, "loaded": ["torch"]}


def _server(script: str, path: str) -> Iterator[str]:
    """tests/SCRIPT on a free port (it prints "ready" once it listens); its URL at ``path``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / script), str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def openai_server() -> Iterator[str]:
    yield from _server("openai_fake_server.py", "/v1")


@pytest.fixture
def plain_http_server() -> Iterator[str]:
    yield from _server("http_target_server.py", "/ok")


def test_a_served_model_soak_and_sweep_import_no_torch(tmp_path: Path, openai_server: str) -> None:
    """`soakd run --target URL --api openai` and `soakd sweep` of it finish (exit 0) with aiohttp,
    the client they use, and without torch, gRPC, tritonclient or the OpenTelemetry SDK."""
    target = ["--target", openai_server, "--api", "openai", "--input-shapes", "seq:fixed(n=16)", "--warmup", "2"]
    run = _imports_of(
        tmp_path,
        "run",
        *target,
        "--duration",
        "1s",
        "--metrics-addr",
        f"127.0.0.1:{free_port()}",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert run == {"rc": 0, "loaded": ["aiohttp"]}
    sweep = _imports_of(tmp_path, "sweep", *target, "--concurrency", "1,2", "--step-duration", "1s")
    assert sweep == {"rc": 0, "loaded": ["aiohttp"]}


def test_a_plain_http_soak_imports_no_aiohttp(tmp_path: Path, plain_http_server: str) -> None:
    """`soakd run --api http` finishes (exit 0) on soakd's own HTTP/1.1 client: no aiohttp, whose
    per-request work was the driver's whole limit (docs/shards.md), and nothing else heavy."""
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    (bodies / "a.json").write_text('{"x": 1}')
    run = _imports_of(
        tmp_path,
        "run",
        *("--target", plain_http_server, "--api", "http", "--samples", str(bodies), "--warmup", "2"),
        *("--duration", "1s", "--metrics-addr", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state")),
    )
    assert run == {"rc": 0, "loaded": []}


def test_a_run_refused_before_its_soak_draws_nothing(tmp_path: Path) -> None:
    """A soak of a target that refuses the connection ends with exit 2 before its soak, without
    importing matplotlib (the report's plots, 0.3 s of CPU) or torch."""
    refused = f"grpc://127.0.0.1:{free_port()}"
    args = ("run", "--api", "kserve-v2", "--target", refused, "--target-model", "m")
    assert _imports_of(tmp_path, *args, heavy=("matplotlib", "torch")) == {"rc": 2, "loaded": []}
