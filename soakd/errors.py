"""The error types every part raises, and the one table of exit codes.

Anything that exits (the CLI, ``report``, ``compare``, ``analyze``, the run session) imports its
codes from here, so that systemd units, CI scripts and the docs have one source to agree with.
This module imports nothing of soakd's: every other module may import it.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """Process exit codes (DESIGN.md: the contract CI gates and systemd units rely on)."""

    OK = 0  # success, SLO met, no regression, no leak judged
    FAIL = 1  # SLO missed, regression found, or (analyze) a leak judged
    USAGE = 2  # usage, config or input error; a model or target that cannot be loaded or reached
    CRASH = 3  # soakd itself failed (a bug): distinct from 1 so systemd restarts a crash only


class SoakdError(Exception):
    """Base of the errors a user can cause and fix: the CLI prints the message and exits 2."""


class ConfigError(SoakdError, ValueError):
    """Invalid configuration; the message names the key path or file."""


class StateError(SoakdError):
    """The state dir cannot be used at all (not creatable, not writable, locked); the message says
    why. Exit 2: a restart would not help, so systemd must not loop on it."""


class ModelLoadError(SoakdError, RuntimeError):
    """The model could not be loaded, or rejects the configured input; the message names the spec."""


class TargetError(SoakdError, RuntimeError):
    """A network target cannot be reached or used at start; the message names the URL."""


class RunFailed(Exception):
    """The run could not go on (a model worker thread ended): one line, exit 3, no traceback."""
