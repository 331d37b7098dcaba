"""What names a run in its metrics and records, whatever its target: its id, and its load mode."""

from __future__ import annotations

import secrets
import time

from soakd.config import Config


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def load_mode(cfg: Config) -> str:
    ld = cfg.load
    if ld.replay is not None:
        return f"replay={ld.replay_speed:g}x"
    return f"rate={ld.rate}/{ld.arrival}" if ld.open_loop else f"concurrency={ld.concurrency}"
