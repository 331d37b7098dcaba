"""The one writer of run records (summary, report, fleet JSON), the figures as the JSON holds them
(ms, rounded), and atomic file writes."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from soakd.record.types import Percentiles
from soakd.telemetry.histogram import HistSnapshot

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
# An LLM soak's per-token timings: (label, key under the summary's ``llm``).
LLM_TIMINGS = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"))


def seconds_to_ms(seconds: float) -> float | None:
    """Milliseconds rounded for JSON; None for NaN (an empty histogram has no percentile)."""
    return None if math.isnan(seconds) else round(seconds * 1e3, 4)


def stage_summary(snap: HistSnapshot) -> dict[str, Any]:
    """:func:`percentiles` as plain JSON values, for the blocks still assembled as mappings."""
    out: dict[str, Any] = msgspec.to_builtins(percentiles(snap))
    return out


def percentiles(snap: HistSnapshot) -> Percentiles:
    """A timing's figures over a run as the record holds them (``stage_summary``, typed)."""
    p = {k: seconds_to_ms(snap.percentile(q)) for k, q in QUANTILES.items()}
    mean, top = seconds_to_ms(snap.mean()), seconds_to_ms(snap.maximum) if snap.count else None
    return Percentiles(p50=p["p50"], p90=p["p90"], p99=p["p99"], p999=p["p999"], max=top, mean=mean, count=snap.count)


def hist_json(snap: HistSnapshot) -> dict[str, Any]:
    """A histogram as the state database and the JSON records store it: its non-empty buckets'
    indexes and counts, its sum and its max (``HistSnapshot.from_sparse`` reads it back)."""
    return {**snap.to_sparse(), "sum": snap.total, "max": snap.maximum}


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write then rename, so a reader never sees half a file (and a crash leaves the old one)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, allow_nan=False, default=str)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_private(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` atomically, readable by its owner only (a report holds the run's config)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json_object(record: msgspec.Struct) -> dict[str, Any]:
    """The one writer's form of a record: plain JSON values in the keys' contract order, absent
    (``UNSET``) keys left out. Python's json module writes it, so figures print as they always did;
    anything else JSON has no type for (a ``TorchVersion`` in the fingerprint) is its ``str``, as
    ``json.dump(default=str)`` always wrote it."""
    out = msgspec.to_builtins(record, enc_hook=str)
    assert isinstance(out, dict)
    return out


def dump_record(record: msgspec.Struct) -> str:
    """A record as the text soakd writes (indented, no NaN: a NaN here is a bug, not a figure)."""
    return json.dumps(to_json_object(record), indent=2, allow_nan=False, default=str) + "\n"


def write_record(path: str | os.PathLike[str], record: msgspec.Struct) -> None:
    """Write a record to ``path`` atomically (``--summary-json``, ``<run>/summary.json``)."""
    write_json_atomic(path, to_json_object(record))
