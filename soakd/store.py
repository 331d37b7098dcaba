"""Kept for old imports (``from soakd.store import StateStore``): the state store is :mod:`soakd.state`."""

from __future__ import annotations

from soakd.state import *  # noqa: F403
from soakd.state import __all__ as __all__
