"""Analysis of recorded runs: leak verdicts, sweeps and knee detection, SLO checks.

Nothing here imports torch at module level: ``soakd analyze`` must start fast.
"""
