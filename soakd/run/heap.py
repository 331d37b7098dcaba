"""soakd's own garbage collector kept off the soak's schedule.

With torch loaded a soakd process holds some 220,000 objects tracked by the cyclic collector,
nearly all of them made before the soak (modules, the model, the config). A full (generation 2)
collection walks every one of them: 127-146 ms here, long enough for a 20,000 req/s open loop to
fill ``load.max_inflight`` and drop requests, and it comes back whenever enough objects have
been promoted since the last one. ``gc.freeze`` moves what exists when the soak begins into a
generation the collector never walks, so a full collection during the soak costs what the soak
itself allocated. Objects are still freed by reference counting as before; only reference cycles
among the frozen ones wait until :func:`frozen_heap` ends, which is why it collects first.
``bench/replay_rss.py`` (the 1M-row trace at 20,000 req/s) shows the difference: docs/replay.md.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then freeze every object alive for the block (the soak); unfreeze after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
