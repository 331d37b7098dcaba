"""The one reader of run records: a summary, a report or a fleet JSON, from any soakd version.

A document is first checked key by key (:mod:`soakd.record.validate`: the messages name the key
and what a run writes there), then converted to its type; a key the check does not cover and
the type refuses is a :class:`~soakd.record.validate.Malformed` naming it the same way. Keys a
record does not know are dropped; keys an older soakd did not write stay ``UNSET``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

from soakd.record.types import FleetRecord, RunRecord
from soakd.record.validate import Malformed, check_fleet, check_result, is_fleet_doc, load_json

T = TypeVar("T")


def _convert(doc: Any, kind: type[T]) -> T:
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        # msgspec says "Expected `int`, got `str` - at `$.segments[0].id`": the key first, as ours do.
        text, _, where = str(exc).partition(" - at `$")
        key = where.rstrip("`").lstrip(".")
        raise Malformed(f"{key or 'the file'}: {text[:1].lower()}{text[1:]}") from None


def read_record(doc: Any) -> RunRecord:
    """A summary or report (a parsed JSON object) as a :class:`RunRecord`; Malformed naming the key."""
    return _convert(check_result(doc), RunRecord)


def read_fleet(doc: Any) -> FleetRecord:
    """A fleet JSON (a parsed JSON object) as a :class:`FleetRecord`; Malformed naming the key."""
    return _convert(check_fleet(doc), FleetRecord)


def read_any(doc: Any) -> RunRecord | FleetRecord:
    return read_fleet(doc) if is_fleet_doc(doc) else read_record(doc)


def load_record(path: str | Path) -> RunRecord | FleetRecord:
    """A summary, report or fleet JSON file (OSError when it cannot be read, Malformed when it is
    not JSON or not what a run writes)."""
    return read_any(load_json(path))
