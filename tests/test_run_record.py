"""The typed run record (``soakd/record/``): one reader for every summary, report and fleet JSON
soakd has written, one writer that keeps the keys, and the JSON Schemas shipped in docs/schema/.

The old files in ``tests/fixtures/records/`` were written by earlier soakd commits (see
``tests/fixtures/PROVENANCE.md``)."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from soakd.record.read import read_fleet, read_record
from soakd.record.schema import SCHEMAS, schema_text
from soakd.record.types import FleetRecord, RunRecord
from soakd.record.validate import Malformed
from soakd.record.write import to_json_object
from soakd.report.command import compare_command
from tests.conftest import REPO
from tests.report_runs import runs, soakd

FIXTURES = REPO / "tests" / "fixtures" / "records"
SCHEMA_DIR = REPO / "docs" / "schema"
SUMMARIES = sorted(FIXTURES.glob("summary-*.json"))
REPORTS = sorted(FIXTURES.glob("report-*.json"))
FLEETS = sorted(FIXTURES.glob("fleet-*.json"))


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / name).read_text()))


def _compare(a: Path, b: Path) -> tuple[int, str]:
    out = io.StringIO()
    rc = compare_command(argparse.Namespace(a=str(a), b=str(b), config=None), out)
    return rc, out.getvalue()


def test_the_fixtures_span_the_versions() -> None:
    """The oldest summary (the first commit's) has no windows, memory or SLO block; the reader
    must cope with that, so the fixtures must keep holding one."""
    oldest = _load(FIXTURES / "summary-9caa83b-open-loop.json")
    assert not {"windows", "memory", "slo", "run_duration_seconds"} & set(oldest)
    assert len(SUMMARIES) >= 5 and len(REPORTS) >= 3 and FLEETS


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: p.name)
def test_every_old_summary_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    """A summary read and written again is the same JSON: keys, values and their order."""
    doc = _load(path)
    record = read_record(doc)
    assert record.throughput_rps == doc["throughput_rps"] and record.requests == doc["requests"]
    assert json.dumps(to_json_object(record), indent=2) == json.dumps(doc, indent=2)


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_every_old_report_reads_and_writes_back_its_keys_and_values(path: Path) -> None:
    doc = _load(path)
    record = read_record(doc)
    assert record.run_id == doc["run_id"] and isinstance(record.segments, list)
    assert to_json_object(record) == doc


@pytest.mark.parametrize("path", FLEETS, ids=lambda p: p.name)
def test_an_old_fleet_reads_and_writes_back(path: Path) -> None:
    doc = _load(path)
    fleet = read_fleet(doc)
    assert [g.name for g in fleet.gpus] == [g["name"] for g in doc["gpus"]]
    assert to_json_object(fleet) == doc


def test_absent_keys_stay_absent_and_null_stays_null() -> None:
    """A block an older soakd did not write is not invented on the way back (the reader says
    UNSET, the accessors say empty); a null is kept as null."""
    doc = {**_load(FIXTURES / "summary-9caa83b-open-loop.json"), "llm": None, "target": None}
    record = read_record(doc)
    assert record.rows == [] and record.series == {} and record.slo_block is None and record.llm_block is None
    assert record.judged_duration == doc["duration_seconds"]
    assert to_json_object(record) == doc


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("segments", [{"id": "one"}], "segments[0].id: expected `int`"),
        ("slo", {"passed": "yes"}, "slo.passed: expected `bool`"),
        ("batch_size", {"buckets": [{"le": 1}]}, "batch_size.buckets[0]: object missing required field `count`"),
    ],
)
def test_a_key_past_the_first_check_is_still_named(key: str, value: Any, message: str) -> None:
    """Keys the first check does not cover are refused by the types, naming the key as it does."""
    doc = {**_load(SUMMARIES[-1]), key: value}
    with pytest.raises(Malformed, match="^" + re.escape(message)):
        read_record(doc)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_shipped_schema_is_the_one_the_types_generate(name: str) -> None:
    """docs/schema/ is generated: `python -m soakd.record.schema` after changing a record type."""
    assert (SCHEMA_DIR / name).read_text() == schema_text(name), (
        f"docs/schema/{name} is stale: run `python -m soakd.record.schema`"
    )


def test_every_old_file_validates_against_the_shipped_schema() -> None:
    summary, fleet = _validator("summary.schema.json"), _validator("fleet.schema.json")
    for path in [*SUMMARIES, *REPORTS]:
        assert not list(summary.iter_errors(_load(path))), path.name
    for path in FLEETS:
        assert not list(fleet.iter_errors(_load(path))), path.name


def test_the_schema_refuses_what_a_run_never_writes() -> None:
    summary = _validator("summary.schema.json")
    doc = _load(SUMMARIES[-1])
    errors = list(summary.iter_errors({**doc, "requests": {"ok": "many"}}))
    assert [list(e.absolute_path) for e in errors] == [["requests", "ok"]]
    assert list(summary.iter_errors({**doc, "slo": {"passed": True, "failed": [], "checks": [{"limit": 1}]}}))


def test_compare_reads_an_old_summary_against_a_newer_one() -> None:
    """The first summary soakd wrote against one with windows and memory verdicts: a table, no
    traceback, and throughput compared from both sides."""
    rc, out = _compare(FIXTURES / "summary-9caa83b-open-loop.json", FIXTURES / "summary-e8ce954.json")
    assert rc in (0, 1), out
    assert "throughput" in out and "p99 e2e" in out


def test_compare_reads_an_old_fleet() -> None:
    rc, out = _compare(FLEETS[0], FLEETS[0])
    assert rc == 0 and "fleet: no regression" in out


def test_a_fresh_run_and_its_report_validate_and_compare_with_an_old_summary(tmp_path: Path) -> None:
    """What this soakd writes (summary, report JSON plain and judged) validates against the
    shipped schema, reads back to the same JSON, and compares with a summary from an old soakd."""
    fast = runs("fast")["fast"]
    assert fast.rc == 0, fast.describe()
    schema = _validator("summary.schema.json")
    summary = fast.summary
    assert not list(schema.iter_errors(summary))
    assert json.dumps(to_json_object(read_record(summary))) == json.dumps(summary)
    for extra in ((), ("--config", str(fast.config_path))):
        res = soakd("report", "--state-dir", str(fast.state_dir), "--format", "json", *extra)
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        assert not list(schema.iter_errors(report))
        assert isinstance(read_record(report), RunRecord)
    rc, out = _compare(FIXTURES / "summary-582a624.json", fast.summary_path)
    assert rc in (0, 1) and "p99 e2e" in out, out
    fleet = soakd("report", "--fleet", str(fast.state_dir), str(FIXTURES / "summary-e8ce954.json"), "--format", "json")
    assert fleet.returncode == 0, fleet.stderr
    assert not list(_validator("fleet.schema.json").iter_errors(json.loads(fleet.stdout)))
    assert isinstance(read_fleet(json.loads(fleet.stdout)), FleetRecord)
