"""examples/soak.toml documents every config key and is itself a valid config."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from soakd.config import Config, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "soak.toml"


def test_example_is_valid_and_default() -> None:
    """The example loads, and what it sets equals the built-in defaults."""
    assert load_config(EXAMPLE).to_dict() == load_config().to_dict()


def test_example_mentions_every_key() -> None:
    """Each section and key of the config appears in the example (set, or commented out)."""
    text = EXAMPLE.read_text()
    sections = re.split(r"^\[(\w+)\]\s*$", text, flags=re.MULTILINE)
    bodies = dict(zip(sections[1::2], sections[2::2], strict=True))
    for section in dataclasses.fields(Config):
        assert section.name in bodies, f"[{section.name}] missing from {EXAMPLE.name}"
        for key in dataclasses.fields(getattr(Config(), section.name)):
            assert re.search(rf"^#? ?{key.name} =", bodies[section.name], re.MULTILINE), (
                f"{section.name}.{key.name} missing from {EXAMPLE.name}"
            )
