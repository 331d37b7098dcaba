"""Builtin models have no file: their weights are seeded and their fingerprint names what it hashes,
so two demo runs are like for like and ``soakd compare`` does not call them different models."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import torch

from soakd.models.loader import load_model
from tests.conftest import REPO, soakd_cmd


def _runs(tmp_path: Path, *models: str) -> list[dict[str, Any]]:
    """Real `soakd run` processes, side by side; their summaries."""
    procs = []
    for i, model in enumerate(models):
        out = tmp_path / f"s{i}.json"
        cmd = soakd_cmd(
            "run",
            "--model",
            model,
            "--duration",
            "1s",
            "--warmup",
            "2",
            "--rate",  # the fingerprint does not depend on the load: a light one spares the parallel tier
            "5",
            "--metrics-addr",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / f"state{i}"),
            "--summary-json",
            str(out),
        )
        procs.append((out, subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    summaries = []
    for out, proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        summaries.append(json.loads(out.read_text()))
    return summaries


def test_two_runs_of_a_builtin_have_one_fingerprint(tmp_path: Path) -> None:
    """Two processes running builtin:convnet record the same model_sha256; builtin:detector another;
    the fingerprint says what the hash covers, and compare has no fingerprint warning."""
    a, b, other = _runs(tmp_path, "builtin:convnet", "builtin:convnet", "builtin:detector")
    assert a["run"]["model_sha256"] == b["run"]["model_sha256"]
    assert len(a["run"]["model_sha256"]) == 64
    assert other["run"]["model_sha256"] != a["run"]["model_sha256"]
    identity = a["run"]["model_identity"]
    assert "builtin:convnet" in identity and "no file" in identity and a["run"]["soakd_version"] in identity
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    res = subprocess.run(
        soakd_cmd("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "fingerprints differ" not in res.stdout, res.stdout


def test_builtin_weights_ignore_the_global_rng() -> None:
    """Whatever the process seeded before, the builtins' weights are the same."""
    torch.manual_seed(1)
    first = {name: load_model(f"builtin:{name}", "cpu").sha256 for name in ("convnet", "detector")}
    torch.manual_seed(2)
    torch.rand(100)
    again = {name: load_model(f"builtin:{name}", "cpu").sha256 for name in ("convnet", "detector")}
    assert first == again
    convnet = load_model("builtin:convnet", "cpu").module
    assert convnet is not None
    weights = torch.cat([p.flatten() for p in convnet.parameters()])
    assert weights.std() > 0  # seeded, not zeroed: a real network still


def test_options_are_part_of_a_builtin_identity() -> None:
    """builtin:sleep with another batch cost is another model."""
    fast = load_model("builtin:sleep", "cpu", options={"batch_ms": 2.0}).sha256
    slow = load_model("builtin:sleep", "cpu", options={"batch_ms": 8.0}).sha256
    assert fast != slow
    assert fast == load_model("builtin:sleep", "cpu", options={"batch_ms": 2.0}).sha256
