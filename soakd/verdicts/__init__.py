"""Verdicts on a run's figures: the SLO gate (``slo.py``) and the memory series' leak verdicts
(``memory.py``). Computed here, rendered by ``soakd/report/``."""
