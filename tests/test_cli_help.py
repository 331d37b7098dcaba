"""`soakd run --help` says, for every flag, what it does, the key it overrides and that key's
default as the config itself holds it (one place for defaults)."""

from __future__ import annotations

import re

from soakd.cli import RUN_FLAGS, build_parser
from soakd.config import Config


def _run_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    text: str = sub.choices["run"].format_help()
    return re.sub(r"\s+", " ", text)


def test_every_run_flag_says_what_it_does_and_its_default() -> None:
    """Each flag's help has a meaning of its own (not only "overrides KEY") and the default that
    Config() holds for its key."""
    text = _run_help()
    for flag, (key, _kw, what) in RUN_FLAGS.items():
        assert len(what.split()) >= 3, flag
        section, name = key.split(".")
        default = getattr(getattr(Config(), section), name)
        assert f"{' '.join(what.split())} (overrides {key}; default: " in text, flag
        if isinstance(default, int) and not isinstance(default, bool):
            assert f"(overrides {key}; default: {default})" in text, flag
    assert "(overrides model.spec; default: builtin:convnet)" in text
    assert "(overrides memory.interval; default: 10s)" in text  # durations with their unit
