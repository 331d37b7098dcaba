"""When a rise the trend test is sure of pages before the series has shown its swings (#39).

Until a third of the window (2 h) has been judged, a series has not shown its slow swings turn:
a GC sawtooth's first ramp, a load cycle's first rise and a leak's onset read alike, and the
early looks' bars (the detector's step 3) only ask that the rise be real. A page waits as long
as the time-to-verdict goals allow: in those first hours a rise pages at once only when its
rate's 90% lower bound reaches EARLY_SHARE of the rate the goals need paged by now (100 MiB/h
within 1 h of its start, 20 MiB/h within 3 h, on the power law through both, counted from the
run's start: a leak cannot have begun before it). A slower rise is reported as a finding
("early") and pages once 2 h of judging have not shown a swing that explains it. The end of a
run (the summary's closing look, ``soakd analyze``) has no later and judges without the hold.

Graded on unseen week traces (seeds 500-509, 6 h, 8 GiB of headroom): leak-free runs paged
11.2% -> 7.5% (a sawtooth's first ramp, a 4-8 h load cycle's first rise), leaks of 100 MiB/h
and more paged a median 46 -> 50 min from their start (docs/leak-verdicts.md, #39's sixth round).
"""

from __future__ import annotations

import math

from soakd.analysis.judgement import Judgement
from soakd.analysis.params import MIB
from soakd.analysis.trend import dur

GOAL_FAST = (100 * MIB, 3600.0)  # bytes/hour paged within seconds of the leak's start
GOAL_SLOW = (20 * MIB, 3 * 3600.0)
EARLY_SHARE = 0.75  # of the goals' rate: the lower bound's margin below the true rate
_POWER = math.log(GOAL_FAST[0] / GOAL_SLOW[0]) / math.log(GOAL_SLOW[1] / GOAL_FAST[1])  # 1.46


def goal_rate(elapsed: float) -> float:
    """The leak rate (bytes/hour) the time-to-verdict goals need paged within ``elapsed``
    seconds of its start."""
    return GOAL_FAST[0] * float((GOAL_FAST[1] / max(elapsed, 60.0)) ** _POWER)


def early_page_rate(elapsed: float, scale: float = 1.0) -> float:
    """The 90% lower bound a rise needs to page ``elapsed`` seconds into a run whose swings are
    not seen yet; ``scale``: an accelerated run's time factor (``DetectorParams.floor_scale``:
    its hour is 1/scale of one, and its rates scale up as its floor does)."""
    return EARLY_SHARE * scale * goal_rate(elapsed * scale)


def held_early(j: Judgement, *, final: bool = False) -> bool:
    """A rise too slow to page yet: the series' unseen swings may explain it. Never at the end
    of a run (``final``)."""
    return not final and j.slope_lower_bytes_per_hour < j.early_page_bytes_per_hour


def early_why(j: Judgement, seen: float) -> str:
    """Why a held rise is a finding, not a page; ``seen``: judged seconds that lift the hold."""
    lower = j.slope_lower_bytes_per_hour / MIB
    return (
        f"not paged yet: {lower:.3g} MiB/h at 90% after {dur(j.judged_seconds)} of judging, where swings "
        f"not yet seen may explain it; it pages above {j.early_page_bytes_per_hour / MIB:.3g} MiB/h now, "
        f"and at its own rate once {dur(seen)} are judged"
    )


def beyond_horizon(j: Judgement, headroom: float, horizon: float) -> str:
    """Why the rise is slow creep, not a page: at its rate's 90% lower bound (a page's consequence
    likely, not just possible) ``headroom`` bytes outlast ``horizon`` seconds; "" when they do not."""
    lower = j.slope_lower_bytes_per_hour
    if lower <= 0:  # a verdict held by its signs whose rate may now be nil
        return "slow creep, not paged: its rate may be nil at 90%, so the headroom may never run out"
    eta = max(0.0, headroom) / (lower / 3600.0)
    if eta <= horizon:
        return ""
    return (
        f"slow creep, not paged: the headroom may last {eta / 86400:.3g} d or more, "
        f"beyond the {horizon / 86400:.3g} d horizon"
    )
