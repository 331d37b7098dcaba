"""One look's judgement of one memory series (:mod:`soakd.analysis.detector` makes it; the live
monitor, replays and ``soakd analyze`` read it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z90 = 1.2815515655446004  # a leak at (threshold + Z90) standard errors is flagged 90% of the time


@dataclass(frozen=True)
class Judgement:
    positive: bool
    slope_bytes_per_hour: float  # nan until there is enough data
    p_value: float  # run-wide: below alpha is a leak; 1.0 until there is enough data
    reason: str  # why it is (not) positive, for logs, events and `soakd analyze`
    start: float = math.nan  # first time judged (after the warm-up, configured or found)
    bins: int = 0  # trough points judged
    last_value: float = math.nan
    holds: bool = False  # enough to keep a verdict that is already suspected
    detectable_bytes_per_hour: float = math.nan  # caught with 90% probability at this noise
    judged_seconds: float = 0.0  # span of data judged
    building: bool = False  # suspicion is building (p within 20x of alpha)
    levelling: bool = False  # not judged: the data show warm-up lasting past its floor
    slope_se_bytes_per_hour: float = math.nan  # the shown slope's standard error at the noise
    jumps_lower_bytes_per_hour: float = math.nan  # a rise made of jumps: its rate's 90% bound on their count
    early_page_bytes_per_hour: float = 0.0  # the 90% bound a page needs for the rise's age (soakd.analysis.pages)
    rise_seconds: float = math.inf  # how long the troughs have risen at that bound (pages.rise_age)

    @property
    def slope_lower_bytes_per_hour(self) -> float:
        """A one-sided 90% lower bound on the rate: what a page's consequence is judged on (a
        short span's slope that just crossed the threshold is as likely too steep as not)."""
        se = self.slope_se_bytes_per_hour
        normal = self.slope_bytes_per_hour - Z90 * (se if math.isfinite(se) else 0.0)
        counted = self.jumps_lower_bytes_per_hour
        return min(normal, counted) if math.isfinite(counted) else normal

    @property
    def judged(self) -> bool:
        return math.isfinite(self.slope_bytes_per_hour)

    def keeps(self, suspected: bool) -> bool:
        """The judgement to feed the persistence rule, given the current verdict."""
        return self.holds if suspected else self.positive

    @property
    def refutes(self) -> bool:
        """Judged, nothing holds and the troughs do not rise at all, or the data now call the
        rise warm-up: a suspected verdict clears at once (persistence rides out doubt, not
        evidence against)."""
        if not self.judged:  # the rise judged earlier is now seen to be warm-up levelling off
            return self.levelling
        return not self.holds and self.slope_bytes_per_hour <= 0
