"""Loading models as users bring them: TorchScript, torch.export, a Python factory; and the errors."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from soakd.config import ConfigError
from soakd.errors import ModelLoadError
from soakd.models.loader import load_model
from tests.conftest import soakd_cmd


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.fc(x)  # Module.__call__ is untyped
        return y.softmax(-1)


def test_torchscript_model_runs_end_to_end(tmp_path: Path) -> None:
    """A scripted model file soaks through the CLI, and its sha256 is the file's."""
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(Tiny()), str(path))
    out = tmp_path / "s.json"
    res = subprocess.run(
        soakd_cmd(
            "run",
            "--model",
            f"torchscript:{path}",
            "--input-shapes",
            "8",
            "--duration",
            "1s",
            "--warmup",
            "3",
            "--metrics-addr",
            "127.0.0.1:0",
            "--summary-json",
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(out.read_text())
    assert summary["requests"]["ok"] > 0
    import hashlib

    assert summary["run"]["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_python_factory_from_a_file(tmp_path: Path) -> None:
    """`python:FILE.py:FACTORY` imports the file and calls the factory with [model.options]."""
    src = tmp_path / "mymodel.py"
    src.write_text(
        textwrap.dedent("""
        import torch
        def make(width=4):
            net = torch.nn.Sequential(torch.nn.Linear(width, 2))
            net.soakd_input_shape = str(width)
            return net
    """)
    )
    m = load_model(f"python:{src}:make", "cpu", options={"width": 6})
    assert m.default_shape == "6"
    assert m.fn(torch.zeros(2, 6)).shape == (2, 2)
    with pytest.raises(ConfigError, match=r"model.options.depth"):
        load_model(f"python:{src}:make", "cpu", options={"depth": 3})


def test_python_factory_may_return_a_plain_callable(tmp_path: Path) -> None:
    """A factory that returns a function on a batch is soaked as is."""
    src = tmp_path / "fnmodel.py"
    src.write_text("def make():\n    return lambda x: x * 2\n")
    m = load_model(f"python:{src}:make", "cpu")
    assert torch.equal(m.fn(torch.ones(1, 3)), torch.full((1, 3), 2.0))
    assert m.module is None


def test_exported_program_loads(tmp_path: Path) -> None:
    """A torch.export `.pt2` program loads and runs on a batch of the exported shape."""
    path = tmp_path / "tiny.pt2"
    ep = torch.export.export(Tiny().eval(), (torch.zeros(4, 8),))
    torch.export.save(ep, str(path))
    m = load_model(f"export:{path}", "cpu")
    assert m.fn(torch.zeros(4, 8)).shape == (4, 3)
    assert len(m.sha256) == 64


def test_corrupt_model_file_is_named(tmp_path: Path) -> None:
    """A file that is not TorchScript gives an error naming it, and the CLI exits 2."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"bad\.pt"):
        load_model(f"torchscript:{bad}", "cpu")
    res = subprocess.run(
        soakd_cmd("run", "--model", f"torchscript:{bad}", "--input-shapes", "8", "--metrics-addr", "127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "bad.pt" in res.stderr


def test_cuda_requested_without_cuda_is_a_config_error() -> None:
    """Asking for cuda on a host without it names model.device."""
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    with pytest.raises(ConfigError, match=r"model\.device"):
        load_model("builtin:noop", "cuda")


def test_factory_that_raises_is_a_load_error(tmp_path: Path) -> None:
    """A factory that raises is the user's model to fix: exit 2 naming the spec, not a crash (3)."""
    src = tmp_path / "broken.py"
    src.write_text("def make():\n    raise RuntimeError('weights missing')\n")
    res = subprocess.run(
        soakd_cmd(
            "run",
            "--model",
            f"python:{src}:make",
            "--metrics-addr",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "factory raised RuntimeError: weights missing" in res.stderr
