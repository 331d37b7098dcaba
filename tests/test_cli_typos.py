"""Typos on the command line: a mistyped subcommand or flag gets the closest right one, the list
of subcommands, and exit 2; a bare ``soakd --flags`` still means ``soakd run``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from soakd.cli import COMMANDS
from tests.conftest import REPO, soakd_cmd


def soakd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(soakd_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=120)


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("soakd: error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_mistyped_subcommand_lists_the_subcommands() -> None:
    """`soakd rnu`: 'did you mean run?' and every subcommand named, not 'unrecognized arguments'."""
    line = error_line(soakd("rnu"))
    assert "unknown command 'rnu'" in line and "did you mean run?" in line
    for command in COMMANDS:
        assert command in line
    assert "did you mean compare?" in error_line(soakd("compre", "a.json", "b.json"))
    assert "did you mean" not in error_line(soakd("frobnicate"))  # nothing close: just the list


@pytest.mark.parametrize(
    ("args", "typo", "meant"),
    [
        (["run", "--duraton", "2s"], "--duraton", "--duration"),
        (["run", "--modle=builtin:noop"], "--modle", "--model"),
        (["--duraton", "2s"], "--duraton", "--duration"),  # bare soakd: run's flags
        (["report", "--state-dri", "x"], "--state-dri", "--state-dir"),  # not 'required: --state-dir'
        (["compare", "a.json", "b.json", "--confg", "x"], "--confg", "--config"),
    ],
)
def test_mistyped_flag_gets_the_closest_flag(args: list[str], typo: str, meant: str) -> None:
    """A misspelled flag is named with the flag the user meant (difflib), exit 2."""
    line = error_line(soakd(*args))
    assert f"unrecognized argument {typo} (did you mean {meant}?)" in line


def test_bare_soakd_with_flags_still_runs(tmp_path: Path) -> None:
    """`soakd --model ... --duration 1s` is `soakd run ...`; an abbreviated flag still works."""
    out = tmp_path / "s.json"
    res = soakd(
        "--model",
        "builtin:noop",
        "--dur",
        "1s",
        "--warmup",
        "1",
        "--metrics-addr",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path / "state"),
        "--summary-json",
        str(out),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(out.read_text())["run"]["model"] == "builtin:noop"
