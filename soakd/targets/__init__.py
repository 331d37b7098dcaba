"""The target seam: what the engine drives. The in-process model is one implementation
(:mod:`soakd.targets.local`); network protocols are others, each in its own module, imported
only when its target is used. The engine never asks which it has (see :class:`Target`)."""

from soakd.targets.base import Target, WarmupResult

__all__ = ["Target", "WarmupResult"]
