"""The target seam: what the engine drives. The in-process model is one implementation; network
protocols are others. The engine never asks which it has (see :class:`Target`)."""

from soakd.targets.base import Target, WarmupResult
from soakd.targets.local import LocalModelTarget

__all__ = ["LocalModelTarget", "Target", "WarmupResult"]
