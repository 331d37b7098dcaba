"""`soakd run --help` says, for every flag, what it does, its unit, the key it overrides and that
key's default, all read from the key's one declaration in soakd/config/schema.py (one place for
the help text and the defaults)."""

from __future__ import annotations

import re

from soakd.cli import RUN_FLAGS, build_parser
from soakd.config import Config, config_keys


def _run_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    text: str = sub.choices["run"].format_help()
    return re.sub(r"\s+", " ", text)


def test_every_run_flag_says_what_it_does_its_unit_and_its_default() -> None:
    """Each flag's help has a meaning of its own (not only "overrides KEY"), the unit of a number
    and the default that Config() holds for its key."""
    text = _run_help()
    for flag, (key, _kw) in RUN_FLAGS.items():
        section, name = key.split(".")
        info = config_keys()[section][name]
        assert len(info.description.split()) >= 3, flag
        assert f"{flag}" in text and " ".join(info.description.split()) in text, flag
        default = getattr(getattr(Config(), section), name)
        assert f"overrides {key}; default: " in text, flag
        if isinstance(default, int) and not isinstance(default, bool):
            assert f"overrides {key}; default: {default})" in text, flag
        if info.duration is None and isinstance(default, (int, float)) and not isinstance(default, bool):
            assert info.unit or key == "load.burstiness", f"{flag}: a number with no unit"
    assert "(overrides model.spec; default: builtin:convnet)" in text
    assert "overrides memory.interval; default: 10s)" in text  # durations as a user writes them
    assert "overrides leak.window; default: 6h)" in text
    assert "(unit: requests/s; within (0, 1e+06]; overrides load.rate; default: none)" in text
    assert "(unit: calls; >= 0; overrides model.warmup; default: 50)" in text


def test_every_key_has_help_text() -> None:
    """Every config key, flag or not, declares what it means: the one place its help lives."""
    for section, keys in config_keys().items():
        for name, info in keys.items():
            assert len(info.description.split()) >= 3, (
                f'{section}.{name}: declare it as `{name}: Annotated[TYPE, doc("what it does", unit=...)] = DEFAULT`'
            )
