"""Leak verdicts: the trend detector, the live monitor, its evidence, and ``soakd analyze``.

Nothing here imports torch at module level: ``soakd analyze`` must start fast.
"""
