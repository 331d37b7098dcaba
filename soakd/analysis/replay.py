"""The live monitor's hysteresis (:class:`Persistence`) and a recorded trace judged look by look
as the monitor would have judged it (:func:`replay`: `soakd analyze`, the leak benches). Apart
from :mod:`soakd.analysis.detector`, which judges one look."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from soakd.analysis.detector import Grid
from soakd.analysis.judgement import Judgement
from soakd.analysis.pages import held_early
from soakd.analysis.params import DetectorParams
from soakd.analysis.trend import Array


@dataclass
class Persistence:
    """Flips to suspected on the first positive judgement; clears after ``hold`` seconds in
    which the judgements no longer hold the verdict (hysteresis)."""

    hold: float
    suspected: bool = False
    _since: float | None = None  # when a suspected verdict stopped holding

    def update(self, now: float, positive: bool, refuted: bool = False) -> bool:
        """Feed one judgement (``Judgement.keeps``, ``Judgement.refutes``); returns True when
        the verdict flipped."""
        if not self.suspected:
            if positive:
                self.suspected, self._since = True, None
                return True
            return False
        if positive:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        if refuted or now - self._since >= self.hold:
            self.suspected, self._since = False, None
            return True
        return False


@dataclass
class Replay:
    """A recorded trace judged as the live monitor would have judged it."""

    final: Judgement
    suspected: bool
    first_suspected_at: float | None  # seconds from the start of the trace
    flips: list[tuple[float, bool]] = field(default_factory=list)
    evaluations: int = 0
    first_paged_at: float | None = None  # the first suspicion fast enough to page (``page_above``)
    paged: bool = False  # the suspicion that holds at the end has paged (as the live state "leak")


def replay(
    t: Array,
    v: Array,
    params: DetectorParams,
    floor: float,
    *,
    step: float = 600.0,
    stop_on_flag: bool = False,
    page_above: float = 0.0,
    in_bytes: bool = True,
) -> Replay:
    """Judge a trace every ``step`` seconds (rounded to whole bins) from its start, up to its end
    (or, with ``stop_on_flag``, up to its first flag: what a power benchmark needs).

    ``page_above`` (bytes/hour: headroom / ``leak.horizon``) is the live monitor's page rule
    without its evidence: a suspected verdict pages at the first look whose slope's 90% lower
    bound reaches it, once the rise has gone on as long as the goals allow for its rate
    (:mod:`soakd.analysis.pages`; not at the last look: the end of a run has no later; not for a
    gauge in its own unit, ``in_bytes`` False)."""
    if t.size == 0:
        return Replay(Judgement(False, math.nan, 1.0, "no data"), False, None)
    t0, t_end = float(t[0]), float(t[-1])
    grid = Grid(t, v, params, t0, t_end)
    every = max(1, round(step / params.bin))
    first = math.ceil(params.warmup / params.bin) + params.spans[0]
    looks = list(range(min(first, grid.nbins), grid.nbins, every))
    if not looks or looks[-1] != grid.nbins:
        looks.append(grid.nbins)
    state = Persistence(params.persistence)
    flips: list[tuple[float, bool]] = []
    first_at: float | None = None
    paged_at: float | None = None
    paged = False  # within the suspicion that holds now
    j = Judgement(False, math.nan, 1.0, "warming up")
    for m in looks:
        j = grid.look(m, floor)
        at = m * params.bin
        if state.update(t0 + at, j.keeps(state.suspected), j.refutes):
            flips.append((at, state.suspected))
            paged = paged and state.suspected
            if state.suspected and first_at is None:
                first_at = at
                if stop_on_flag:
                    break
        # A page needs a look that is sure of the rise, not one that only holds an older verdict;
        # the end of a run has no later, and pages what is still held (as `soakd analyze` reads it).
        last = m == looks[-1]
        held = held_early(j, final=last, in_bytes=in_bytes)
        fast = (j.positive or last) and j.slope_lower_bytes_per_hour >= page_above and not held
        if state.suspected and fast:
            paged_at = at if paged_at is None else paged_at
            paged = True
    return Replay(j, state.suspected, first_at, flips, len(looks), paged_at, paged)
