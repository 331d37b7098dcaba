"""What every HTTP protocol's client reads the same way, whatever client it is built on (aiohttp
for openai and kserve-v2 REST, :mod:`soakd.targets.http1` for ``--api http``): the bound on an
answer, status classes, JSON with bounded depth, a short repr for log lines, and
:class:`BadAnswer`."""

from __future__ import annotations

import json
import reprlib
from typing import Any

MAX_BODY_BYTES = 64 * 1024 * 1024  # an answer past this is an error, read no further (docs/limits.md)

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 60
_SHORT.maxlevel = 3


def short(value: Any) -> str:
    """``value`` as a short repr for a log line, however large or deeply nested it is."""
    return _SHORT.repr(value)


class BadAnswer(Exception):
    """An answer that is not valid for the protocol (not HTTP, not JSON, an ``error`` in a 2xx,
    too large, a line past its bound): counted as ``error``. ``cls``: the answer's status class,
    when it had one."""

    def __init__(self, message: str, cls: str = "none") -> None:
        super().__init__(message)
        self.cls = cls


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 200 <= status < 600 else "none"


def parse_json(data: bytes, what: str = "answer") -> Any:
    """JSON from a server, bounded in depth by the interpreter's recursion limit: ValueError
    naming what is wrong (not JSON, nested too deeply), never RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"the {what} is JSON nested too deeply") from None
    except ValueError:  # UnicodeDecodeError included
        raise ValueError(f"the {what} is not JSON: {short(data[:80])}") from None
