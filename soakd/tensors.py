"""Torch, for the modules that a served target's soak also runs: they load it only where a model
runs in soakd's own process, so ``soakd run --target URL`` starts without it (about 1 s of CPU
and 190 MB of RSS less per driver process, and per worker under ``--workers``)."""

from __future__ import annotations

import sys
from typing import Any


def is_tensor(x: object) -> bool:
    """``isinstance(x, torch.Tensor)`` without importing torch: no tensor exists before it is."""
    torch: Any = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
