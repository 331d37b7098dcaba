"""Request bodies for a network target: the ``.json`` files of ``--samples DIR``, sent as they are.

The files are read once at start (the same walk as :mod:`soakd.workload.samples`), so the event
loop never waits on a disk; a body set past :data:`MAX_TOTAL_BYTES` is refused rather than held.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import cycle
from pathlib import Path
from typing import Any

from soakd.errors import ConfigError
from soakd.workload.samples import walk_samples

MAX_TOTAL_BYTES = 256 * 1024 * 1024


class BodySource:
    """Cycles through the bodies in name order; the engine's ``RequestSource`` for ``--api http``."""

    preprocess = None  # bodies go out as they are
    bad_log = None

    def __init__(self, root: str, extensions: tuple[str, ...] = (".json",)) -> None:
        self.root = root
        paths = [p for p in walk_samples(root) if Path(p).suffix.lower() in extensions]
        self.paths = paths
        self.bodies: list[Any] = []  # bytes, or what encode() made of them
        total = 0
        for path in paths:
            try:
                body = Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(f"input.samples: {path}: cannot read ({exc.strerror})") from None
            total += len(body)
            if total > MAX_TOTAL_BYTES:
                raise ConfigError(
                    f"input.samples: {root}: the {' or '.join(extensions)} bodies pass "
                    f"{MAX_TOTAL_BYTES >> 20} MiB; use a smaller set"
                )
            self.bodies.append(body)
        if not self.bodies:
            raise ConfigError(f"input.samples: {root}: no {' or '.join(extensions)} files to send")
        self.total_bytes = total
        self._next = cycle(self.bodies).__next__

    def encode(self, encode: Callable[[str, bytes], Any]) -> None:
        """Turn each body, once, into what the protocol sends (``encode(path, body)``: a gRPC
        message for a JSON file), so the hot path does no parsing."""
        self.bodies = [encode(p, b) for p, b in zip(self.paths, self.bodies, strict=True)]
        self._next = cycle(self.bodies).__next__

    def next(self) -> tuple[Any, Any]:
        return None, self._next()

    def pooled(self) -> list[Any]:
        return list(self.bodies)

    def warmup_inputs(self) -> list[tuple[Any, Any]]:
        """Every body, for a network target's warm-up requests."""
        return [(None, b) for b in self.bodies]
