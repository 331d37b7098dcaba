"""JSON Schemas of the run record, generated from its types and shipped under ``docs/schema/``
so CI scripts can validate what they read (``python -m soakd.record.schema`` writes them again;
``tests/test_run_record.py`` fails when the shipped ones differ from the types)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from soakd.record.types import FleetRecord, RunRecord

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# file name under docs/schema/ -> (type, title)
SCHEMAS: dict[str, tuple[type[msgspec.Struct], str]] = {
    "summary.schema.json": (
        RunRecord,
        "soakd run record: the summary (--summary-json, <state-dir>/<run-id>/summary.json) "
        "and the report (soakd report --format json)",
    ),
    "fleet.schema.json": (FleetRecord, "soakd fleet report (soakd report --fleet --format json)"),
}


def schema_of(kind: type[msgspec.Struct], title: str) -> dict[str, Any]:
    return {"$schema": DRAFT, "title": title, **msgspec.json.schema(kind)}


def schema_text(name: str) -> str:
    """The text of ``docs/schema/<name>`` as the types generate it."""
    kind, title = SCHEMAS[name]
    return json.dumps(schema_of(kind, title), indent=2, sort_keys=True) + "\n"


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SCHEMAS:
        path = folder / name
        path.write_text(schema_text(name), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":  # python -m soakd.record.schema [FOLDER]
    for written in write_schemas(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schema")):
        print(written)
