"""SIGINT/SIGTERM as a flag every long step polls: loading, warm-up, the soak, the drain."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


class StopFlag:
    """Set by SIGINT/SIGTERM; the run loop and warm-up poll ``event``."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None

    @property
    def name(self) -> str:
        return "" if self.signal is None else signal.Signals(self.signal).name

    def install(self) -> Callable[[], None]:
        """Handle the signals (main thread only); returns the function that restores the old ones."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: FrameType | None) -> None:
            self.signal = signum
            self.event.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore
