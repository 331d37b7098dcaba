"""Builtin leaking and fragmenting models: they keep what they promise, within their cap."""

from __future__ import annotations

import time

import pytest
import torch

from soakd.config import ConfigError
from soakd.models.loader import load_model

MIB = 1 << 20


def test_leak_host_keeps_bytes_per_call_up_to_its_cap() -> None:
    m = load_model("builtin:leak_host", "cpu", "float32", {"bytes_per_call": MIB, "max_mib": 3.5})
    x = torch.zeros(2, 16)
    for _ in range(5):
        assert m.fn(x) is x
    assert m.module is not None
    assert m.module.leaked == int(3.5 * MIB)  # capped


def test_leak_rate_follows_wall_time_not_calls() -> None:
    m = load_model("builtin:leak_cuda", "cpu", "float32", {"mib_per_s": 100.0})
    x = torch.zeros(1, 16)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        m.fn(x)
        time.sleep(0.01)
    assert m.module is not None
    leaked: int = getattr(m.module, "leaked")  # noqa: B009 - a buffer attribute mypy sees as Tensor | Module
    assert 15 * MIB < leaked < 45 * MIB  # ~100 MiB/s over ~0.3 s


def test_fragment_keeps_a_bounded_set_of_blocks() -> None:
    m = load_model("builtin:fragment_cuda", "cpu", "float32", {"keep": 4, "max_kib": 64})
    x = torch.zeros(1, 16)
    for _ in range(50):
        m.fn(x)
    assert m.module is not None and len(getattr(m.module, "_live")) == 4  # noqa: B009 - see above


@pytest.mark.parametrize(
    ("spec", "options", "key"),
    [
        ("builtin:leak_host", {"mib_per_s": -1}, "model.options.mib_per_s"),
        ("builtin:fragment_cuda", {"keep": 0}, "model.options.keep"),
        ("builtin:leak_cuda", {"rate": 1}, "model.options.rate"),
    ],
)
def test_bad_options_name_the_key(spec: str, options: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_model(spec, "cpu", "float32", options)
