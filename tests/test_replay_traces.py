"""Trace files (soakd/workload/traces.py): each format's columns and units, bad rows counted by
line, files that are not traces refused naming file and line, timestamps that step back; and
the prompts made to a row's size (shared hash_id blocks share text); the request log's size
limit. docs/replay.md."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from soakd.config import ConfigError, load_config
from soakd.load.record import RequestRecorder
from soakd.request import Request
from soakd.workload import traces
from soakd.workload.prompts import Prompt
from soakd.workload.replay_prompts import PromptSizer
from soakd.workload.trace_index import BAD_LINE, RowReader
from soakd.workload.traces import Row, RowCounts, Trace, azure_time, scan

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def mooncake(tmp_path: Path, rows: Sequence[Mapping[str, object]], name: str = "trace.jsonl") -> str:
    return write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in rows))


def rows_of(path: str, **kw: object) -> tuple[list[Row], RowCounts]:
    counts = RowCounts()
    return list(Trace(path, **kw).rows(counts)), counts  # type: ignore[arg-type]


def test_mooncake_timestamps_are_milliseconds_and_hash_ids_are_kept(tmp_path: Path) -> None:
    path = mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 300, "output_length": 7, "hash_ids": [1]},
        ],
    )
    rows, _ = rows_of(path)
    assert [(r.t, r.input_tokens, r.output_tokens, r.hash_ids) for r in rows] == [
        (0.0, 600, 5, (1, 2)),
        (1.5, 300, 7, (1,)),
    ]
    info = scan(Trace(path))
    assert (info.format, info.rows, info.span_seconds) == ("mooncake", 2, 1.5)
    assert len(info.sha256) == 64


def test_azure_2023_and_2024_timestamps_are_date_times(tmp_path: Path) -> None:
    """2023: seven fraction digits, no zone; 2024: a +00:00 zone. Offsets are exact to the µs."""
    assert azure_time("2023-11-16 18:15:46.6805900") - azure_time("2023-11-16 18:15:46") == pytest.approx(0.68059)
    assert azure_time("2024-05-10 00:00:01.5+02:00") == azure_time("2024-05-09 22:00:01.5")
    path = write(
        tmp_path,
        "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.500,374,44\n2023-11-17 00:00:00.750,100,2\n",
    )
    rows, _ = rows_of(path)
    assert Trace(path).format == "azure"
    assert rows[1].t - rows[0].t == pytest.approx(1.25, abs=1e-6)  # across midnight
    assert [(r.input_tokens, r.output_tokens, r.line) for r in rows] == [(374, 44, 2), (100, 2, 3)]


def test_burstgpt_failed_requests_are_skipped_unless_kept(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "burst.csv",
        BURST_HEADER + "5,ChatGPT,472,18,490,Conv\n6.5,GPT-4,100,0,100,Conv\n7,GPT-4,10,1,11,API\n",
    )
    rows, counts = rows_of(path)
    assert [(r.t, r.input_tokens, r.output_tokens) for r in rows] == [(5.0, 472, 18), (7.0, 10, 1)]
    assert counts.skipped == 1
    kept, counts = rows_of(path, keep_failed=True)
    assert len(kept) == 3 and counts.skipped == 0


def test_bad_rows_are_counted_with_their_line_numbers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "trace.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'
        "not json\n"
        '{"timestamp": 10, "input_length": -3, "output_length": 1}\n'
        "\n"
        '{"timestamp": 20, "input_length": 10, "output_length": 1}\n',
    )
    info = scan(Trace(path))
    assert (info.rows, info.bad) == (2, 2)
    assert info.bad_lines[0].startswith("line 2: not JSON")
    assert info.bad_lines[1].startswith("line 3: input_length")


def test_the_typed_fast_path_reads_mooncake_rows_as_the_checks_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Well-formed Mooncake rows are decoded straight into their types; every other line goes
    through the checks that name what is wrong. Both paths give the same rows and the same bad
    lines: whole-number floats, integers past 64 bits, booleans, a missing output_length,
    strings among hash_ids, an extra key, a blank line."""
    lines = [
        {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1.5, "input_length": 12.0, "output_length": 3},
        {"timestamp": 2, "input_length": 5, "output_length": 3, "hash_ids": [2**70]},
        {"timestamp": 3, "input_length": True, "output_length": 3},
        {"timestamp": 4, "input_length": 5},
        {"timestamp": 5, "input_length": 5, "output_length": 3, "hash_ids": ["x"]},
        {"timestamp": 6, "input_length": 5, "output_length": 0, "hash_ids": [], "extra": {"a": [1]}},
        {"timestamp": 7, "input_length": -1, "output_length": 3},
    ]
    path = write(tmp_path, "trace.jsonl", "\n".join(json.dumps(r) for r in lines) + "\n\n" + '{"timestamp": 9}\n')

    def read() -> tuple[list[Row], list[str]]:
        counts = RowCounts()
        trace = Trace(path)
        scan(trace)
        return list(trace.rows(counts)), counts.bad_lines

    fast = read()
    monkeypatch.setattr(traces, "_MOONCAKE_JSON", None)
    assert read() == fast
    rows, bad = fast
    assert [(r.line, r.input_tokens, r.hash_ids) for r in rows] == [
        (1, 10, (1, 2)),
        (2, 12, None),
        (3, 5, (2**70,)),
        (7, 5, None),
    ]
    assert [b.split(":")[0] for b in bad] == ["line 4", "line 5", "line 6", "line 8", "line 10"]
    assert "got True" in bad[0] and "output_length" in bad[1] and "hash_ids" in bad[2]


@pytest.mark.parametrize(
    ("text", "fmt", "said"),
    [
        ("just some words\nmore\n", "auto", "line 1: not a trace"),
        ("Timestamp,Request tokens\n1,2\n", "burstgpt", r"lacks column\(s\) Response tokens"),
        ('{"foo": 1}\n', "auto", "without timestamp and input_length"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "mooncake", "not a mooncake trace"),
        ("", "auto", "line 1: empty"),
    ],
)
def test_a_file_that_is_not_a_trace_is_refused_naming_file_and_line(
    tmp_path: Path, text: str, fmt: str, said: str
) -> None:
    path = write(tmp_path, "x.txt", text)
    with pytest.raises(ConfigError, match=said) as err:
        Trace(path, fmt)
    assert path in str(err.value)


def test_a_trace_without_good_rows_is_refused_with_the_first_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", BURST_HEADER + "x,m,1,2,3,l\n")
    with pytest.raises(ConfigError, match=r"no rows to replay .*line 2: Timestamp 'x'"):
        scan(Trace(path))


def test_a_timestamp_stepping_back_is_refused_naming_its_line_unless_a_window_sorts_it(tmp_path: Path) -> None:
    rows = [{"timestamp": t, "input_length": 1, "output_length": 1} for t in (0, 20, 10, 30)]
    path = mooncake(tmp_path, rows)
    with pytest.raises(ConfigError, match=r"line 3: the timestamp steps back"):
        scan(Trace(path))
    sorted_rows, _ = rows_of(path, sort_window=2)
    assert [r.t for r in sorted_rows] == [0.0, 0.01, 0.02, 0.03]
    far = mooncake(
        tmp_path, [{"timestamp": t, "input_length": 1, "output_length": 1} for t in (10, 20, 30, 0)], "f.jsonl"
    )
    with pytest.raises(ConfigError, match=r"line 4: the timestamp steps back further than the 2-row sort window"):
        scan(Trace(far, sort_window=2))


def test_soakd_request_log_is_read_in_intended_order(tmp_path: Path) -> None:
    """Written at completion (out of order), read back sorted by intended time."""
    lines = [{"soakd_request_log": 1, "api": "model"}]
    lines += [{"t": t, "in": n, "out": None, "shape": [n], "outcome": "ok"} for t, n in ((0.2, 5), (0.1, 4), (0.3, 6))]
    path = write(tmp_path, "log.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    rows, _ = rows_of(path)
    assert Trace(path).format == "soakd"
    assert [(r.t, r.input_tokens, r.shape) for r in rows] == [(0.1, 4, (4,)), (0.2, 5, (5,)), (0.3, 6, (6,))]


def test_rows_sharing_hash_ids_share_their_prompt_prefix() -> None:
    cfg = load_config(None, {"load.replay_block_tokens": 16, "target.api": "openai", "load.rate": 1})
    size = PromptSizer(cfg)
    _, a = size(Row(0.0, 40, 5, 1, (7, 8, 9)))
    _, b = size(Row(0.0, 40, 3, 2, (7, 8, 10)))
    _, c = size(Row(0.0, 40, 3, 3, None))
    assert a.text is not None and b.text is not None and c.text is not None
    block_words = 12  # 16 tokens at 0.75 words each
    assert a.text.split()[: 2 * block_words] == b.text.split()[: 2 * block_words]
    assert a.text.split()[2 * block_words :] != b.text.split()[2 * block_words :]  # blocks 9 and 10 differ
    assert c.text.split()[:block_words] != a.text.split()[:block_words]
    assert len(a.text.split()) == 30  # 40 tokens at 0.75 words each
    assert (a.input_tokens, a.max_tokens, b.max_tokens) == (40, 5, 3)


def test_the_request_log_stops_at_its_size_limit_and_reads_back_as_a_trace(tmp_path: Path) -> None:
    """--record-requests: the file never passes output.record_max_bytes; what it holds is a
    soakd trace whose rows keep each request's intended time and size."""
    path = tmp_path / "requests.jsonl"
    rec = RequestRecorder(str(path), 4096, api="openai")
    rec.origin = 100.0
    rec.add([Request(100.0 + i / 1000, 0.0, None, Prompt("x", None, 10 + i, 3)) for i in range(500)], "ok", 100.6)
    out = rec.close()
    assert path.stat().st_size <= 4096 and out["stopped_at_limit"]
    assert out["requests"] + out["lost"] == 500 and out["requests"] > 10
    rows, _ = rows_of(str(path))
    assert [(r.t, r.input_tokens, r.output_tokens) for r in rows[:2]] == [(0.0, 10, 3), (0.001, 11, 3)]
    assert len(rows) == out["requests"]


def test_the_request_log_keeps_the_latency_of_answered_requests_only(tmp_path: Path) -> None:
    """Each answered request's e2e latency from its intended time (what the e2e histogram counts);
    an error, which fails fast and is kept out of the histograms, has none."""
    path = tmp_path / "requests.jsonl"
    rec = RequestRecorder(str(path), 1 << 20, api="openai")
    rec.origin = 100.0
    sent = [Request(100.0 + i / 10, 0.0, None, Prompt("x", None, 10, 3)) for i in range(3)]
    rec.add(sent[:2], "ok", 100.25)
    rec.add(sent[2:], "error", 100.3)
    rec.close()
    logged = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert [(r["outcome"], r.get("e2e_ms")) for r in logged] == [("ok", 250.0), ("ok", 150.0), ("error", None)]


@pytest.mark.parametrize("fmt", ["mooncake", "azure", "burstgpt", "soakd"])
def test_the_scans_index_gives_back_every_row_by_offset_and_by_its_counts(tmp_path: Path, fmt: str) -> None:
    """The replay reads a sent row at the offset the scan indexed (or, for a payload that needs
    only token counts, builds it from the index): for each format, with a bad row, a CRLF line and
    a non-ASCII field among them, both give back exactly the rows the stream reads, in time order."""
    texts = {
        "mooncake": '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\r\n'
        "not json\n"
        '{"timestamp": 1500, "input_length": 30, "output_length": 2, "note": "café"}\n',
        "azure": "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.5,374,44\r\nbad,1,1\n"
        "2023-11-16 18:15:48,100,0\n",
        "burstgpt": BURST_HEADER + '5,"Chat, GPT",472,18,490,Conv\n6.5,GPT-4,100,0,100,Conv\n7,GPT-4,10,x,11,API\n'
        "8,GPT-4,9,3,12,API\n",
        "soakd": '{"soakd_request_log": 1}\n{"t": 0.5, "in": 8, "out": 2, "shape": [8]}\n{"t": 0.25, "in": 4}\n'
        '{"t": "x"}\n{"t": 1.0, "shape": [3, 4]}\n',
    }
    path = write(tmp_path, f"trace.{'jsonl' if fmt in ('mooncake', 'soakd') else 'csv'}", texts[fmt])
    trace = Trace(path)
    info = scan(trace)
    streamed = list(trace.rows(RowCounts()))
    assert trace.format == fmt and info.bad == 1 and len(streamed) == info.rows >= 2
    assert trace.index is not None
    records = [r for chunk in trace.index.chunks() for r in chunk.tolist()]
    assert sum(1 for r in records if r[2] == BAD_LINE) == 1
    good = [r for r in records if r[2] != BAD_LINE]
    with RowReader(trace) as reader:
        assert [reader.row(offset, line) for _, offset, line, _, _ in good] == streamed
    counts_only = [
        (t, line, n_in if n_in >= 0 else None, n_out if n_out >= 0 else None) for t, _, line, n_in, n_out in good
    ]
    assert counts_only == [(r.t, r.line, r.input_tokens, r.output_tokens) for r in streamed]


def test_a_row_whose_text_changed_under_the_soak_is_named(tmp_path: Path) -> None:
    """The trace rewritten after the scan: a row that no longer parses is a bad row saying why;
    one past the file's new end ends the trace with an error naming the file and line."""
    path = mooncake(tmp_path, [{"timestamp": i, "input_length": 55, "output_length": 1} for i in range(3)])
    trace = Trace(path)
    scan(trace)
    assert trace.index is not None
    _, offset, line, _, _ = next(trace.index.chunks()).tolist()[2]
    with open(path, "r+") as fh:
        fh.seek(offset + len('{"timestamp": 2, "input_length": '))
        fh.write("-5")  # 55 -> -5, in place
    with RowReader(trace) as reader, pytest.raises(ValueError, match="input_length"):
        reader.row(offset, line)
    with open(path, "r+") as fh:
        fh.truncate(offset)
    with RowReader(trace) as reader, pytest.raises(ConfigError, match=f"line {line} is no longer the row it was"):
        reader.row(offset, line)


def test_a_temporary_folder_that_cannot_hold_the_index_is_exit_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan writes the trace's index to the temporary folder: one that does not exist is a
    ConfigError (exit 2) naming it and TMPDIR, not a traceback."""
    path = mooncake(tmp_path, [{"timestamp": 0, "input_length": 5, "output_length": 1}])
    missing = tmp_path / "no-such-folder"
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    with pytest.raises(ConfigError, match=f"cannot make the trace's index .*{missing}.*TMPDIR"):
        scan(Trace(path))
