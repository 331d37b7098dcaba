"""What a soak of days needs from systemd: sd_notify, the watchdog, and a log file SIGHUP re-opens.

sd_notify speaks systemd's datagram protocol on ``$NOTIFY_SOCKET`` directly (a path, or an
abstract socket written ``@name``), so there is no libsystemd dependency. Without the variable
every notification is a no-op. Watchdog pings are withheld while the run is unhealthy (see
:mod:`soakd.run.health`), so a hung inference or a stuck driver call gets us restarted.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from types import FrameType

log = logging.getLogger("soakd.daemon")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Notifier:
    """systemd's notify protocol over a unix datagram socket; silent without ``NOTIFY_SOCKET``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        if addr.startswith(("@", "/")):
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._failed = False
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        # The watchdog is ours only when WATCHDOG_PID is unset or names this process.
        mine = not pid or pid == str(os.getpid())
        self.watchdog_usec = int(usec) if usec.isdigit() and int(usec) > 0 and mine else None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half the watchdog timeout, as sd_watchdog_enabled(3) advises."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
            return True
        except OSError as exc:  # systemd gone (or a test's socket closed): never fatal
            if not self._failed:
                self._failed = True
                log.warning("sd_notify to %r failed: %s", self.address.replace("\0", "@"), exc)
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class Watchdog:
    """Pings ``WATCHDOG=1`` every interval while ``health`` says ok; withholds it otherwise."""

    def __init__(self, notifier: Notifier, health: Callable[[], tuple[bool, str]], interval: float) -> None:
        self.notifier = notifier
        self.health = health
        self.interval = interval
        self.pings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soakd-watchdog", daemon=True)
        self._withholding = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            ok, reason = self.health()
            if self._stop.is_set():
                return
            if ok:
                if self._withholding:
                    log.info("watchdog: healthy again, pinging")
                self._withholding = False
                self.notifier.watchdog()
                self.pings += 1
            elif not self._withholding:
                self._withholding = True
                log.error("watchdog: withholding pings: %s", reason)
                self.notifier.status(f"unhealthy: {reason}")


class ReopenableFileHandler(logging.FileHandler):
    """A log file that SIGHUP re-opens, so logrotate can move it away."""

    def reopen(self) -> None:
        with self.lock or threading.RLock():
            if self.stream is not None:
                self.stream.close()
            self.stream = self._open()


def install_sighup(handler: Callable[[], ReopenableFileHandler | None]) -> Callable[[], None]:
    """SIGHUP re-opens the log file (logrotate); returns the function that restores the old handler."""

    def on_hup(signum: int, frame: FrameType | None) -> None:
        # Re-open from a thread: the signal may land while the main thread holds the handler.
        h = handler()
        if h is not None:
            threading.Thread(target=h.reopen, name="soakd-reopen-log", daemon=True).start()

    old = signal.signal(signal.SIGHUP, on_hup)

    def restore() -> None:
        signal.signal(signal.SIGHUP, old)

    return restore
