"""Input shapes a user gets wrong: refused before the run with a line naming the value and the
fix, never read as something else and never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from soakd.config import ConfigError, load_config
from soakd.specs import parse_shape_mix
from tests.conftest import REPO, soakd_cmd


def soakd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(soakd_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def assert_one_line_usage_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("soakd: ")]
    assert len(errors) == 1, res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


class TestCommaMeansMix:
    def test_commas_between_bare_numbers_are_refused(self) -> None:
        """`3,224,224` is not three 1-D shapes: the error suggests 3x224x224."""
        with pytest.raises(ValueError, match=r"did you mean '3x224x224'"):
            parse_shape_mix("3,224,224")

    def test_mixes_still_parse(self) -> None:
        """A weighted mix, an unweighted mix of multi-dimensional shapes, one 1-D shape, and a
        weighted mix of 1-D shapes all keep their meaning."""
        assert parse_shape_mix("3x224x224=0.6,3x96x96=0.4") == [((3, 224, 224), 0.6), ((3, 96, 96), 0.4)]
        assert parse_shape_mix("3x8x8,3x4x4") == [((3, 8, 8), 0.5), ((3, 4, 4), 0.5)]
        assert parse_shape_mix("16") == [((16,), 1.0)]
        assert parse_shape_mix("16=1,32=3") == [((16,), 0.25), ((32,), 0.75)]

    def test_run_refuses_comma_shapes(self, tmp_path: Path) -> None:
        """`soakd run --input-shapes 3,224,224` exits 2 before loading anything."""
        res = soakd(
            "run",
            "--model",
            "builtin:noop",
            "--input-shapes",
            "3,224,224",
            "--duration",
            "1s",
            "--metrics-addr",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path / "state"),
        )
        assert_one_line_usage_error(res, "input.shapes", "3x224x224")

    def test_check_config_refuses_comma_shapes(self, tmp_path: Path) -> None:
        """check-config says the same about a file."""
        cfg = tmp_path / "soak.toml"
        cfg.write_text('[input]\nshapes = "3,224,224"\n')
        assert_one_line_usage_error(soakd("check-config", str(cfg)), "input.shapes", "3x224x224")


def _linear16(tmp_path: Path) -> Path:
    path = tmp_path / "linear16.pt"
    torch.jit.save(torch.jit.script(nn.Linear(16, 4)), str(path))
    return path


class TestModelFileWithoutShape:
    def test_check_config_refuses_torchscript_without_a_shape(self, tmp_path: Path) -> None:
        """A TorchScript file has no default input shape: check-config says to give one."""
        cfg = tmp_path / "soak.toml"
        cfg.write_text(f'[model]\nspec = "torchscript:{_linear16(tmp_path)}"\n')
        assert_one_line_usage_error(soakd("check-config", str(cfg)), "input.shapes", "linear16.pt", "--input-shapes")
        cfg.write_text(f'[model]\nspec = "torchscript:{_linear16(tmp_path)}"\n[input]\nshapes = "16"\n')
        res = soakd("check-config", str(cfg))
        assert res.returncode == 0, res.stderr

    def test_export_without_a_shape_is_a_config_error(self, tmp_path: Path) -> None:
        """The same for a torch.export program."""
        path = tmp_path / "m.pt2"
        torch.export.save(torch.export.export(nn.Linear(16, 4).eval(), (torch.zeros(2, 16),)), str(path))
        with pytest.raises(ConfigError, match=r"input\.shapes: export:.*m\.pt2 has no default input shape"):
            load_config(None, {"model.spec": f"export:{path}"})
        load_config(None, {"model.spec": f"export:{path}", "input.shapes": "16"})


def test_model_that_rejects_the_input_exits_2(tmp_path: Path) -> None:
    """A TorchScript Linear(16, 4) fed 3x224x224: exit 2 with the model's own message in one
    line that names the shape, not exit 3 and a traceback."""
    res = soakd(
        "run",
        "--model",
        f"torchscript:{_linear16(tmp_path)}",
        "--input-shapes",
        "3x224x224",
        "--duration",
        "2s",
        "--warmup",
        "2",
        "--metrics-addr",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path / "state"),
        timeout=180,
    )
    assert_one_line_usage_error(res, "3x224x224", "torchscript:", "linear16.pt")
    line = next(x for x in res.stderr.splitlines() if x.startswith("soakd: "))
    assert "mat1 and mat2 shapes cannot be multiplied" in line, line  # the model's own words
