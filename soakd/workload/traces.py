"""Production traces read as a stream of rows: Mooncake JSONL, Azure LLM inference CSV (2023 and
2024), BurstGPT CSV and soakd's own request log (``--record-requests``). docs/replay.md has each
format's columns and units.

The file is never loaded whole: :meth:`Trace.rows` reads it line by line, so a week of traffic
costs the memory of one row (plus ``load.replay_sort_window`` rows when timestamps step back).
:func:`scan` reads it once before the soak (its fingerprint: sha256, rows, span; bad rows with
their line numbers; a step back in time is exit 2 naming the line) and the soak reads it again,
as many times as ``--replay-loop`` wraps it.
"""

from __future__ import annotations

import csv
import hashlib
import heapq
import json
import logging
import math
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any, BinaryIO, TextIO

import msgspec

from soakd.errors import ConfigError
from soakd.workload.trace_index import RowIndex

log = logging.getLogger("soakd")

FORMATS = ("mooncake", "azure", "burstgpt", "soakd")
LOG_HEADER_KEY = "soakd_request_log"  # the first line of soakd's own request log names its version
# Requests complete out of order, and soakd's log is written at completion: it is sorted on
# reading within this many rows (a request that took longer than that many later ones' to finish).
SOAKD_SORT_WINDOW = 16384
BAD_LINES_KEPT = 5  # bad rows logged (and kept for the summary) with their line numbers
# CSV columns each format needs: (time, input tokens, output tokens).
CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_DATETIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d(?:\.\d*)?)\s*(Z|[+-]\d\d:?\d\d)?$")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs about 1 µs more a row
class Row:
    """One request of a trace: ``t`` in seconds on the trace's own clock; sizes as recorded."""

    t: float
    input_tokens: int | None
    output_tokens: int | None
    line: int
    hash_ids: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None  # soakd's log: the tensor shape sent to a tensor model
    offset: int = -1  # the byte offset of its line (its record's first line) in the file


@dataclass
class RowCounts:
    """Rows left out while reading: failed requests (BurstGPT's 0-token answers) and bad rows."""

    skipped: int = 0
    bad: int = 0
    bad_lines: list[str] = field(default_factory=list)  # the first few, "line N: why"

    def add_bad(self, line: int, why: str) -> None:
        self.bad += 1
        if len(self.bad_lines) < BAD_LINES_KEPT:
            self.bad_lines.append(f"line {line}: {why}")


# Each row is decoded on the arrivals thread, dropped or sent, at the trace's own rate: msgspec's
# decoder takes 0.27 us a Mooncake row where json.loads takes 1.39 us, and at 120,000 rows/s that
# thread shares the GIL with the model's.
_ROW_JSON = msgspec.json.Decoder()
_Count = Annotated[int, msgspec.Meta(ge=0)]


class _MooncakeLine(msgspec.Struct):
    """A well-formed Mooncake row, checked by msgspec in C (0.5 us a row against 2 in Python);
    any other line takes the generic path, whose checks name what is wrong with it."""

    timestamp: float
    input_length: _Count
    output_length: _Count
    hash_ids: list[int] | None = None


_MOONCAKE_JSON = msgspec.json.Decoder(_MooncakeLine)


class _BadRow(ValueError):
    pass


def azure_time(text: str) -> float:
    """``2023-11-16 18:15:46.6805900`` (2023) or ``2024-05-10 00:00:00.009930+00:00`` (2024) ->
    unix seconds. Seven fraction digits pass ``datetime.fromisoformat`` on older Pythons."""
    m = _DATETIME.match(text.strip())
    if m is None:
        raise _BadRow(f"TIMESTAMP {text!r} is not a date-time (YYYY-MM-DD HH:MM:SS[.fff][+HH:MM])")
    y, mo, d, h, mi = (int(m.group(i)) for i in range(1, 6))
    try:
        day = date(y, mo, d).toordinal() - _EPOCH_DAY
    except ValueError:
        raise _BadRow(f"TIMESTAMP {text!r}: no such date") from None
    t = day * 86400.0 + h * 3600 + mi * 60 + float(m.group(6))
    tz = m.group(7)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        t -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return t


def _count(value: Any, name: str) -> int:
    """A token count: a non-negative integer (``12`` or ``12.0`` in a CSV)."""
    if type(value) is int and value >= 0:  # the common case, first: the arrivals thread parses each row
        return value
    try:
        n = float(value) if isinstance(value, str) else value
    except ValueError:
        raise _BadRow(f"{name} {value!r} is not a number") from None
    if isinstance(n, bool) or not isinstance(n, int | float) or n != n or n < 0 or int(n) != n:
        raise _BadRow(f"{name} must be a whole number >= 0, got {value!r}")
    return int(n)


def _number(value: Any, name: str) -> float:
    if type(value) is int:  # the common case, first
        return float(value)
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise _BadRow(f"{name} {value!r} is not a number") from None
    if isinstance(value, bool) or t != t or t in (float("inf"), float("-inf")):
        raise _BadRow(f"{name} must be a finite number, got {value!r}")
    return t


def _mooncake(obj: dict[str, Any], line: int) -> Row:
    hashes = obj.get("hash_ids")
    if hashes is not None and not (isinstance(hashes, list) and all(type(h) is int for h in hashes)):
        raise _BadRow("hash_ids must be a list of integers")
    return Row(
        _number(obj.get("timestamp"), "timestamp") / 1000.0,  # milliseconds
        _count(obj.get("input_length"), "input_length"),
        _count(obj.get("output_length"), "output_length"),
        line,
        tuple(hashes) if hashes else None,
    )


def _soakd(obj: dict[str, Any], line: int) -> Row:
    shape = obj.get("shape")
    if shape is not None and not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _BadRow("shape must be a list of whole numbers")
    size_in, size_out = obj.get("in"), obj.get("out")
    return Row(
        _number(obj.get("t"), "t"),
        None if size_in is None else _count(size_in, "in"),
        None if size_out is None else _count(size_out, "out"),
        line,
        None,
        tuple(shape) if shape is not None else None,
    )


class Trace:
    """A trace file and its format (detected from the first line, or as given); ConfigError
    (exit 2) naming the file and line when it is not a trace of that format."""

    def __init__(self, path: str, fmt: str = "auto", *, keep_failed: bool = False, sort_window: int = 0) -> None:
        self.path = path
        self.keep_failed = keep_failed
        self.shard: tuple[int, int] | None = None  # (I, N) of --shard I/N: rows() yields its share
        self.index: RowIndex | None = None  # the rows' times and offsets, written by scan()
        with self._open() as fh:
            first = self._first_line(fh)
        self.format, self._columns = self._detect(first, fmt)
        window = SOAKD_SORT_WINDOW if self.format == "soakd" else 0
        self.sort_window = max(sort_window, window)

    def _open(self) -> TextIO:
        try:
            return open(self.path, encoding="utf-8", newline="")
        except OSError as exc:
            raise ConfigError(f"load.replay: {self.path}: cannot read ({exc.strerror})") from None

    def open_binary(self) -> BinaryIO:
        """The file as bytes: rows are read with their byte offsets (the index's, and a sent
        row read again from its offset)."""
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise ConfigError(f"load.replay: {self.path}: cannot read ({exc.strerror})") from None

    def _first_line(self, fh: TextIO) -> str:
        try:
            first = fh.readline(1 << 20)
        except UnicodeDecodeError:
            raise ConfigError(f"load.replay: {self.path}: line 1: not UTF-8 text, not a trace") from None
        if not first.strip():
            raise ConfigError(
                f"load.replay: {self.path}: line 1: empty, not a trace (docs/replay.md lists the formats)"
            )
        return first

    def _detect(self, first: str, fmt: str) -> tuple[str, tuple[int, int, int] | None]:
        where = f"load.replay: {self.path}: line 1"
        if first.lstrip().startswith("{"):
            try:
                obj = json.loads(first)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON ({exc.msg}), not a trace") from None
            found = "soakd" if isinstance(obj, dict) and LOG_HEADER_KEY in obj else "mooncake"
            if fmt not in ("auto", found):
                raise ConfigError(f"{where}: a JSON line, not a {fmt} trace (it reads as {found})")
            if found == "mooncake" and not (isinstance(obj, dict) and {"timestamp", "input_length"} <= obj.keys()):
                raise ConfigError(
                    f"{where}: a JSON line without timestamp and input_length: neither a Mooncake trace "
                    f'nor a soakd request log (its first line holds "{LOG_HEADER_KEY}")'
                )
            return found, None
        header = [c.strip() for c in next(csv.reader([first]), [])]
        for name, cols in CSV_COLUMNS.items():
            if fmt in ("auto", name) and all(c in header for c in cols):
                return name, (header.index(cols[0]), header.index(cols[1]), header.index(cols[2]))
        if fmt == "auto":  # the format whose columns the header holds most of, if any
            fmt = max(CSV_COLUMNS, key=lambda name: sum(c in header for c in CSV_COLUMNS[name]))
            fmt = fmt if any(c in header for c in CSV_COLUMNS[fmt]) else "auto"
        if fmt in CSV_COLUMNS:
            missing = [c for c in CSV_COLUMNS[fmt] if c not in header]
            raise ConfigError(f"{where}: the {fmt} header lacks column(s) {', '.join(missing)}")
        if fmt != "auto":
            raise ConfigError(f"{where}: not a {fmt} trace (a {fmt} trace is JSON lines)")
        raise ConfigError(
            f"{where}: not a trace: expected a JSON line (Mooncake, soakd's request log) or a CSV header "
            "with TIMESTAMP,ContextTokens,GeneratedTokens (Azure) or Timestamp,Request tokens,Response tokens "
            f"(BurstGPT); got {first.strip()[:80]!r}"
        )

    # ------------------------------------------------------------------ reading

    def rows(self, counts: RowCounts) -> Generator[Row]:
        """The rows in time order, streamed; with ``shard`` (I, N) set, only row i (in time order,
        from 0, each pass alike) for which i mod N is I: the N drivers of a ``--shard I/N`` or
        ``--workers N`` soak send the trace between them, each row once."""
        if self.shard is None:
            yield from self._ordered(counts)
            return
        index, count = self.shard
        for i, row in enumerate(self._ordered(counts)):
            if i % count == index:
                yield row

    def _ordered(self, counts: RowCounts) -> Generator[Row]:
        """Every row in time order, streamed; bad and skipped rows go to ``counts``. A timestamp
        that steps back past the sort window raises ConfigError naming its line."""
        raw = self._raw(counts)
        if self.sort_window == 0:
            last: Row | None = None
            for row in raw:
                if last is not None and row.t < last.t:
                    raise self._backwards(row, last)
                last = row
                yield row
            return
        heap: list[tuple[float, int, Row]] = []
        out: Row | None = None
        for row in raw:
            heapq.heappush(heap, (row.t, row.line, row))
            if len(heap) > self.sort_window:
                out = self._next_sorted(heap, out)
                yield out
        while heap:
            out = self._next_sorted(heap, out)
            yield out

    def _next_sorted(self, heap: list[tuple[float, int, Row]], last: Row | None) -> Row:
        row = heapq.heappop(heap)[2]
        if last is not None and row.t < last.t:
            raise self._backwards(row, last)
        return row

    def _backwards(self, row: Row, last: Row) -> ConfigError:
        held = f" further than the {self.sort_window}-row sort window" if self.sort_window else ""
        return ConfigError(
            f"load.replay: {self.path}: line {row.line}: the timestamp steps back{held} "
            f"({row.t - last.t:+.6f}s against line {last.line}); sort the file, or hold more rows with "
            "--replay-sort-window"
        )

    def _raw(self, counts: RowCounts) -> Iterator[Row]:
        with self.open_binary() as fh:
            try:
                if self._columns is not None:
                    yield from self._csv_rows(fh, counts)
                else:
                    yield from self._json_rows(fh, counts)
            except UnicodeDecodeError:
                raise ConfigError(f"load.replay: {self.path}: not UTF-8 text past line 1") from None

    def _json_rows(self, fh: BinaryIO, counts: RowCounts) -> Iterator[Row]:
        offset = 0
        for line, raw in enumerate(fh, 1):
            try:
                row = self.json_row(raw.decode("utf-8"), line, offset)
            except _BadRow as exc:
                counts.add_bad(line, str(exc))
            else:
                if row is not None:
                    yield row
            offset += len(raw)

    def json_row(self, text: str | bytes, line: int, offset: int) -> Row | None:
        """One JSON line as a row (None: a blank line, or the log's header); _BadRow says why not."""
        fast = _MOONCAKE_JSON if self.format == "mooncake" else None
        if fast is not None:
            try:
                m = fast.decode(text)
            except msgspec.DecodeError:  # the generic path below names what is wrong
                pass
            else:
                if math.isfinite(m.timestamp):
                    hashes = tuple(m.hash_ids) if m.hash_ids else None
                    return Row(m.timestamp / 1000.0, m.input_length, m.output_length, line, hashes, None, offset)
        if not text.strip() or (line == 1 and self.format == "soakd"):
            return None
        try:
            obj = _ROW_JSON.decode(text)
        except msgspec.DecodeError as exc:
            raise _BadRow(f"not JSON ({str(exc).removeprefix('JSON is malformed: ')})") from None
        if not isinstance(obj, dict):
            raise _BadRow("not a JSON object")
        row = _soakd(obj, line) if self.format == "soakd" else _mooncake(obj, line)
        row.offset = offset
        return row

    def _csv_rows(self, fh: BinaryIO, counts: RowCounts) -> Iterator[Row]:
        lines = _OffsetLines(fh)
        reader = csv.reader(lines)
        next(reader, None)  # the header
        while True:
            offset = lines.offset  # where the next record starts: the reader reads no further ahead
            fields = next(reader, None)
            if fields is None:
                return
            if not fields:
                continue
            try:
                row = self.csv_row(fields, reader.line_num, offset)
            except _BadRow as exc:
                counts.add_bad(reader.line_num, str(exc))
                continue
            if row is None:
                counts.skipped += 1  # BurstGPT: a failed request (docs/replay.md)
                continue
            yield row

    def csv_row(self, fields: list[str], line: int, offset: int) -> Row | None:
        """One CSV record as a row (None: a failed request left out); _BadRow says why not."""
        assert self._columns is not None
        i_t, i_in, i_out = self._columns
        width = max(self._columns) + 1
        if len(fields) < width:
            raise _BadRow(f"{len(fields)} columns, the header has at least {width}")
        azure = self.format == "azure"
        t = azure_time(fields[i_t]) if azure else _number(fields[i_t], "Timestamp")
        n_in = _count(fields[i_in], CSV_COLUMNS[self.format][1])
        n_out = _count(fields[i_out], CSV_COLUMNS[self.format][2])
        if n_out == 0 and not azure and not self.keep_failed:
            return None
        return Row(t, n_in, n_out, line, None, None, offset)

    def csv_record(self, fh: BinaryIO) -> list[str] | None:
        """The CSV record that starts at ``fh``'s position (None at the end of the file)."""
        if self._columns is None:
            raise ValueError("not a CSV trace")
        return next(csv.reader(_OffsetLines(fh)), None)


class _OffsetLines:
    """A binary file's lines as text for ``csv.reader``, counting the bytes handed out, so the
    offset of the record the reader asks for next is known."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.offset = fh.tell()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        raw = self._fh.readline()
        if not raw:
            raise StopIteration
        self.offset += len(raw)
        return raw.decode("utf-8")


@dataclass(frozen=True)
class TraceInfo:
    """The trace's fingerprint and what one pass of it holds (the summary's ``replay`` block)."""

    path: str
    sha256: str
    format: str
    rows: int
    span_seconds: float
    first_t: float
    skipped: int
    bad: int
    bad_lines: list[str]

    @property
    def mean_gap(self) -> float:
        """One mean gap between arrivals: a looped pass starts this long after the last ended."""
        return self.span_seconds / (self.rows - 1) if self.rows > 1 else 1.0

    def fingerprint(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "format": self.format,
            "rows": self.rows,
            "span_seconds": round(self.span_seconds, 6),
        }


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def scan(trace: Trace) -> TraceInfo:
    """One streamed pass before the soak: rows, span, bad rows (the first few logged with their
    line numbers); ConfigError (exit 2) for a step back in time or a file with no rows."""
    counts = RowCounts()
    n, marked, first, last = 0, 0, 0.0, -math.inf
    index = RowIndex()
    try:
        for row in trace.rows(counts):
            for _ in range(counts.bad - marked):  # bad rows met before this one stand before it
                index.add_bad(last)
            marked = counts.bad
            if n == 0:
                first = row.t
            last = row.t
            n += 1
            index.add(row)
        for _ in range(counts.bad - marked):
            index.add_bad(last)
        index.finish()
    except BaseException:
        index.close()
        raise
    if trace.index is not None:
        trace.index.close()
    trace.index = index
    for bad in counts.bad_lines:
        log.warning("load.replay: %s: %s (bad row, left out)", trace.path, bad)
    if counts.bad > len(counts.bad_lines):
        log.warning("load.replay: %s: %d bad rows in all, left out", trace.path, counts.bad)
    if n == 0:
        why = f"; {counts.bad_lines[0]}" if counts.bad_lines else ""
        raise ConfigError(
            f"load.replay: {trace.path}: no rows to replay ({counts.bad} bad, {counts.skipped} skipped){why}"
        )
    return TraceInfo(
        trace.path,
        file_sha256(trace.path),
        trace.format,
        n,
        last - first,
        first,
        counts.skipped,
        counts.bad,
        counts.bad_lines,
    )
