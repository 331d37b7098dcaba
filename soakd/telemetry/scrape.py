"""The served model's own ``/metrics`` (``--scrape URL``): the configured gauges it keeps
(``target.scrape_metrics``), re-exported as ``soakd_target_metric{name}`` and judged by the
leak monitor as ``target_metric:NAME``.

One sampler per URL, on the memory interval like the other samplers; the fetch has its own short
timeout (``target.scrape_timeout``, under the scheduler's ``memory.sample_timeout``). A scrape
that fails (refused, timed out, not Prometheus text) is ``collector_up{source="scrape:URL"} 0``
with one log line until it recovers, never a crash.

Per metric name, one number: the sum over its label sets (every model, engine or GPU of the
server), so a server with many labels still gives one bounded series per name and a leak in any
of them moves it. A counter (Triton's ``nv_inference_queue_duration_us``) is kept as its rate
per second between two scrapes, since its raw total always grows; a counter that went down
(the server restarted) gives no value for that scrape. Histograms and summaries are not kept.
A configured name the server does not export is simply not sampled (logged once, after the
first scrape that worked): the defaults name metrics of several servers and versions, and a
renamed one is listed under both names. A name found on two URLs is kept from the first.
"""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from soakd.names import TARGET_METRIC_PREFIX
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.series import SeriesStore

log = logging.getLogger("soakd.telemetry")

KEPT_TYPES = ("gauge", "counter", "unknown", "untyped")
MAX_PAGE = 32 << 20  # bytes: a /metrics page larger than this is not a metrics page


def parse_page(text: str, wanted: Sequence[str]) -> dict[str, tuple[str, float]]:
    """``{name: (type, sum over label sets)}`` of the ``wanted`` families in a Prometheus text page."""
    want = set(wanted)
    out: dict[str, tuple[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type not in KEPT_TYPES:
            continue
        # The parser names a counter family without "_total" and its samples with it; an
        # untyped one keeps the name as written. A wanted name may be written either way.
        spellings = (family.name, family.name + "_total", family.name.removesuffix("_total"))
        name = next((n for n in spellings if n in want), None)
        if name is None:
            continue
        own = (family.name, family.name + "_total")
        values = [s.value for s in family.samples if s.name in own]
        if values:
            # Untyped but named as a counter ("_total", Prometheus' convention): a counter.
            untyped = family.type in ("unknown", "untyped")
            kind = "counter" if untyped and family.name.endswith("_total") else family.type
            out[name] = (kind, float(sum(values)))
    return out


class ScrapeSampler:
    """Fetches one URL per sample and keeps the configured names found there."""

    def __init__(
        self,
        metrics: Metrics,
        series: SeriesStore | None,
        url: str,
        names: Sequence[str],
        *,
        timeout: float = 1.0,
        claims: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = f"scrape:{url}"
        self.url = url
        self.names = list(dict.fromkeys(names))
        self.timeout = timeout
        self.metrics = metrics
        self.series = series
        self.claims = claims if claims is not None else {}  # name -> the URL that keeps it
        self.clock = clock
        self._counters: dict[str, tuple[float, float]] = {}  # name -> (time, total) of the last scrape
        self._missing_logged = False
        self.found: set[str] = set()

    def open(self) -> None:
        pass  # nothing to open: a server that is not up yet is a failing sample, retried

    def fetch(self) -> str:
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain;version=0.0.4"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            body: bytes = resp.read(MAX_PAGE + 1)
        if len(body) > MAX_PAGE:
            raise ValueError(f"{self.url}: page over {MAX_PAGE >> 20} MiB")
        return body.decode("utf-8", errors="replace")

    def sample(self) -> None:
        page = parse_page(self.fetch(), self.names)
        now = self.clock()
        for name, (kind, value) in page.items():
            owner = self.claims.setdefault(name, self.url)
            if owner != self.url:
                if name not in self.found:
                    log.info("scrape %s: %s is kept from %s already; not from here", self.url, name, owner)
                    self.found.add(name)
                continue
            self.found.add(name)
            if kind == "counter":
                last, self._counters[name] = self._counters.get(name), (now, value)
                if last is None or now <= last[0] or value < last[1]:  # first scrape, or a reset
                    continue
                value = (value - last[1]) / (now - last[0])
            self.metrics.target_metric.labels(name).set(value)
            if self.series is not None:
                self.series.append(TARGET_METRIC_PREFIX + name, now, value)
        if not self._missing_logged:
            self._missing_logged = True
            missing = [n for n in self.names if n not in page]
            if missing:
                why = "not exported there (yet), not sampled until it is"
                log.info("scrape %s: %s: %s", self.url, why, ", ".join(missing))

    def close(self) -> None:
        pass
