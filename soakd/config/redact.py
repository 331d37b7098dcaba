"""Secret redaction: the one pass every output goes through before it holds a config."""

from __future__ import annotations

import re
from typing import Any

# Key-name parts that mark a credential. Matched on whole parts (``api_token``, ``apiKey``,
# ``X-Auth-Token``), so ``max_tokens`` or ``keyframes`` stay readable.
SECRET_PARTS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "authorization",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "bearer",
    }
)
REDACTED = "<redacted>"
_KEY_PART_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def is_secret_key(name: str) -> bool:
    """Whether a config key's name says its value is a credential (case-insensitive, by parts)."""
    return any(part.lower() in SECRET_PARTS for part in _KEY_PART_RE.findall(name))


def redact_secrets(data: Any) -> Any:
    """A copy of ``data`` (dicts, lists, scalars) with the value of every credential-like key
    replaced by ``"<redacted>"``, at any depth. The one redaction every output goes through:
    summary.json and the state database (the run fingerprint's ``config``), and the reports."""
    if isinstance(data, dict):
        return {
            k: REDACTED if isinstance(k, str) and is_secret_key(k) and v is not None else redact_secrets(v)
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return [redact_secrets(v) for v in data]
    return data
