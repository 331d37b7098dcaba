"""``soakd sweep``: step through load settings and find the batching trade-off.

The model is loaded and warmed up once; each step then runs its own Engine (concurrency or
rate x max batch size) until it is stable, i.e. throughput and p99 of the last three windows
are each within ``--tolerance`` percent of their mean, after ``--min-step`` and at most
``--max-step`` (or for a fixed ``--step-duration``). A step that never settles is kept and
marked ``stable: false``. Each step's figures come from its last three windows.

Then the knee (where p99 rises sharply for little throughput) and the recommendation: the
step with the highest throughput whose p99 meets the SLO (goodput under the SLO). Exit 1 when
an SLO is given and no step meets it.

- :mod:`soakd.run.sweep.planner`: the steps, from the flags
- :mod:`soakd.run.sweep.step`: one step on its own Engine, until stable
- :mod:`soakd.run.sweep.results`: figures, bottleneck, error gate, knee, recommendation, table
- :mod:`soakd.run.sweep.command`: :func:`sweep_command`, the order of it all
"""

from __future__ import annotations

from soakd.run.sweep.command import sweep_command
from soakd.run.sweep.planner import SweepPlan, plan, step_config
from soakd.run.sweep.results import (
    BUSY,
    KNEE_MIN_P99_RISE,
    KNEE_RATIO,
    bottleneck,
    find_knee,
    judge_errors,
    print_table,
    recommend,
    step_figures,
)
from soakd.run.sweep.step import Mark, StepResult, SweepTarget, is_stable, run_step

__all__ = [
    "BUSY",
    "KNEE_MIN_P99_RISE",
    "KNEE_RATIO",
    "Mark",
    "StepResult",
    "SweepPlan",
    "SweepTarget",
    "bottleneck",
    "find_knee",
    "is_stable",
    "judge_errors",
    "plan",
    "print_table",
    "recommend",
    "run_step",
    "step_config",
    "step_figures",
    "sweep_command",
]
