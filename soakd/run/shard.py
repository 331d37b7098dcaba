"""One soak over many hosts (``--shard I/N``, ``--start-at``): the shared start, and the clock.

Every shard's schedule counts from one wall-clock instant, so the shards' arrivals interleave
as one process's only as well as the hosts' clocks agree. That is measured, not assumed: the
target's ``Date`` header (whole seconds) is read until it ticks over, which places the
server's second boundary between two local instants a poll apart, so each shard reports its
offset from the one clock every shard talks to (the target's), to a few tens of ms.
"""

from __future__ import annotations

import dataclasses
import email.utils
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from soakd.config import Config
from soakd.config.parse import parse_instant, parse_shard

log = logging.getLogger("soakd.shard")

POLL = 0.02  # seconds between Date reads: the skew's error is about half of this plus the RTT
SKEW_WARN = 0.1  # seconds: past this the shards' arrivals interleave visibly less well
MAX_POLL_SECONDS = 1.5  # a Date that has not ticked over in this long is from a stuck server
START_GATE_ENV = "SOAKD_START_GATE"  # set by a --workers parent: the file its start instant appears in
GATE_POLL = 0.05


def _date_of(url: str, timeout: float) -> float | None:
    """The server's ``Date`` (unix seconds, whole) on a GET of ``url``: any status, else None."""
    req = urllib.request.Request(url, method="GET", headers={"User-Agent": "soakd-clock"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            date = resp.headers.get("Date")
    except urllib.error.HTTPError as exc:  # a 404 or 405 still carries the server's Date
        date = exc.headers.get("Date") if exc.headers is not None else None
    except (OSError, ValueError):
        return None
    if not date:
        return None
    try:
        return email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None


def measure_skew(url: str, timeout: float = 2.0, clock: Any = time.time) -> dict[str, Any]:
    """This host's clock minus the target's (seconds; positive: this host is ahead), from the
    instant the target's Date ticks to its next second. ``error_seconds``: the half-width of
    the interval it lies in. A target that sends no Date gives ``skew_seconds`` None."""
    block: dict[str, Any] = {"source": f"Date header of {url}", "skew_seconds": None, "error_seconds": None}
    before, first = clock(), _date_of(url, timeout)
    if first is None:
        block["source"] = f"none ({url} sent no Date header)"
        return block
    last_sent, deadline = before, before + MAX_POLL_SECONDS
    while clock() < deadline:
        sent = clock()
        date = _date_of(url, timeout)
        got = clock()
        if date is None:
            break
        if date > first:  # the server's second ``date`` began after last_sent and before got
            lo, hi = last_sent - date, got - date
            block["skew_seconds"], block["error_seconds"] = round((lo + hi) / 2, 4), round((hi - lo) / 2, 4)
            return block
        last_sent = sent
        time.sleep(POLL)
    # No tick seen: the Date says the server's time was within [first, first + 1) at ``before``.
    block["skew_seconds"], block["error_seconds"] = round(before - first - 0.5, 4), 0.5
    return block


def remaining(cfg: Config, otherwise: float) -> float:
    """Seconds left of ``load.duration``: from ``--start-at`` when it is set (every shard ends at
    start + duration, however late it began or how often it was restarted), else ``otherwise``
    (the duration less what earlier segments of a resumed run already ran)."""
    start_at = parse_instant(cfg.load.start_at)
    if start_at is None or cfg.load.duration is None:
        return otherwise
    return max(0.0, start_at + cfg.load.duration - time.time())


def one_watcher(cfg: Config) -> Config:
    """The server's memory is one per soak: shard 0 watches it (``--scrape``, ``--watch-pid``,
    ``--watch-unit``) and the other shards leave it alone, so its leak verdict is judged once
    and the server is scraped once, whatever the number of shards. Each shard still samples
    its own memory (the driver's)."""
    shard, tg = parse_shard(cfg.load.shard), cfg.target
    if shard is None or shard[0] == 0 or not (tg.scrape or tg.watch_pid or tg.watch_unit):
        return cfg
    log.info("shard %d/%d: the server's memory is shard 0's to watch; not scraping or sampling it here", *shard)
    return dataclasses.replace(cfg, target=dataclasses.replace(tg, scrape=[], watch_pid=[], watch_unit=[]))


def await_gate(gate: Path, stop: threading.Event) -> str | None:
    """A ``--workers`` worker's start: say it is ready (``<gate>.ready``), then wait for the
    parent to write the one instant every worker starts from into ``<gate>`` (it does once all
    are ready; a restarted worker finds it there). None when stopped first."""
    gate.with_name(gate.name + ".ready").touch()
    while not stop.is_set():
        try:
            text = gate.read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
        stop.wait(GATE_POLL)
    return None


def wait_for_start(cfg: Config, stop: threading.Event) -> tuple[Config, dict[str, Any] | None]:
    """Measure the clock, then wait for ``--start-at`` (``stop`` cuts the wait short). The
    config to run (a ``--workers`` worker's start instant in it) and the summary's ``shard``
    block: which shard, the start, the clock's skew and how late this driver started (a late
    shard joins the schedule where it stands). None: not sharded."""
    gate = os.environ.get(START_GATE_ENV)
    if gate and not cfg.load.start_at:
        instant = await_gate(Path(gate), stop)
        if instant is None:
            return cfg, None
        cfg = dataclasses.replace(cfg, load=dataclasses.replace(cfg.load, start_at=instant))
    shard, start_at = parse_shard(cfg.load.shard), parse_instant(cfg.load.start_at)
    if shard is None and start_at is None:
        return cfg, None
    block: dict[str, Any] = {
        "index": shard[0] if shard else None,
        "count": shard[1] if shard else None,
        "start_at": cfg.load.start_at or None,
    }
    clock_block = measure_skew(cfg.target.url, cfg.target.timeout) if cfg.target.url else None
    block["clock"] = clock_block or {"source": "none (the model runs in process)", "skew_seconds": None}
    skew = block["clock"]["skew_seconds"]
    block["clock_skew_seconds"] = skew
    if skew is not None and abs(skew) > SKEW_WARN:
        log.warning(
            "this host's clock is %+.3f s off the target's (%s): shards' schedules are that far apart; "
            "synchronise the hosts' clocks (NTP)",
            skew,
            block["clock"]["source"],
        )
    block["late_seconds"] = round(_wait_until(start_at, cfg.load.start_at, stop), 3)
    return cfg, block


def _wait_until(start_at: float | None, text: str, stop: threading.Event) -> float:
    """Wait for ``start_at``; how late this driver is for it (0 when on time)."""
    if start_at is None:
        return 0.0
    delay = start_at - time.time()
    if delay > 0:
        log.info("waiting %.1f s for --start-at %s", delay, text)
        stop.wait(delay)
        return 0.0
    log.warning("started %.1f s after --start-at %s: joining the schedule where it stands", -delay, text)
    return -delay
