"""A trace's rows in time order as (time, byte offset, line), kept on disk, so a replay that falls
behind can drop rows without reading them.

:func:`soakd.workload.traces.scan` reads the whole trace once before the soak; it writes each row's
time and where it starts into an anonymous temporary file (28 bytes a row: 28 MB for a million
rows, gone when soakd exits, even on a crash). The replay then walks that file in chunks of
:data:`CHUNK` rows, so its memory does not grow with the trace, and reads a row's text
only when the row is sent (:class:`RowReader`). Reading and parsing every row as it came due cost
about 2.5 us a row on the arrivals thread; past ``max_inflight`` that was most of a core spent on
rows that were only counted as dropped, and the soak completed a third of what the same schedule
given as ``--rate`` completed (bench/replay_rss.py ``--ceiling-rate``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from soakd.errors import ConfigError

if TYPE_CHECKING:
    from soakd.workload.traces import Row, Trace

# A row's time (trace clock, s), where its record starts, its line, its token counts (-1: none).
RECORD = np.dtype([("t", "<f8"), ("offset", "<i8"), ("line", "<i4"), ("input", "<i4"), ("output", "<i4")])
CHUNK = 8192  # rows read from the index at a time: with their lists of floats, about 1 MB
BAD_LINE = -1  # a row the scan found bad: counted as bad_input where it stood, never sent

Records = npt.NDArray[np.void]
_WHERE = (
    f"it takes {RECORD.itemsize} bytes a row in the temporary folder (TMPDIR, else /tmp): point TMPDIR at one with room"
)


def _why(exc: OSError) -> str:
    return f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)


class RowIndex:
    """The index file: written once by the scan (:meth:`add`, :meth:`finish`), then read from the
    start for each pass (:meth:`chunks`) by one reader at a time."""

    def __init__(self) -> None:
        try:
            self._fh = tempfile.TemporaryFile(prefix="soakd-trace-index-")  # noqa: SIM115 (held until close())
        except OSError as exc:
            raise ConfigError(f"load.replay: cannot make the trace's index ({_why(exc)}); {_WHERE}") from None
        self._pending: list[tuple[float, int, int, int, int]] = []
        self.records = 0  # written to the file

    def add(self, row: Row) -> None:
        n_in, n_out = row.input_tokens, row.output_tokens
        self._add((row.t, row.offset, row.line, -1 if n_in is None else n_in, -1 if n_out is None else n_out))

    def add_bad(self, t: float) -> None:
        """A bad row met after rows up to time ``t``: it stays in the stream, at that time."""
        self._add((t, -1, BAD_LINE, -1, -1))

    def _add(self, record: tuple[float, int, int, int, int]) -> None:
        self._pending.append(record)
        if len(self._pending) >= CHUNK:
            self._flush()

    def finish(self) -> None:
        self._flush()
        self._fh.flush()

    def _flush(self) -> None:
        if self._pending:
            try:
                self._fh.write(np.array(self._pending, dtype=RECORD).tobytes())
            except OSError as exc:  # a full disk
                raise ConfigError(
                    f"load.replay: cannot write the trace's index after {self.records} rows ({_why(exc)}); {_WHERE}"
                ) from None
            self.records += len(self._pending)
            self._pending = []

    def chunks(self, shard: tuple[int, int] | None = None) -> Iterator[Records]:
        """The records from the first, :data:`CHUNK` at a time; with ``shard`` (I, N), of the rows
        only those whose place in time order (from 0, bad rows not counted) is I mod N, as
        :meth:`Trace.rows` splits them, and every bad row (each driver counts each one met)."""
        self._fh.seek(0)
        size = CHUNK * RECORD.itemsize
        seen = 0  # rows (not bad ones) before this chunk
        while data := self._fh.read(size):
            records = np.frombuffer(data, dtype=RECORD)
            if shard is not None:
                good = records["line"] != BAD_LINE
                place = seen + np.cumsum(good) - 1
                seen += int(np.count_nonzero(good))
                records = records[~good | (place % shard[1] == shard[0])]
            yield records

    def close(self) -> None:
        self._fh.close()


class RowReader:
    """The trace file open for reading rows at their offsets, one at a time (the rows sent). The
    rows of a replay that keeps up come in file order, so its reads stay in the file's buffer."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._fh = trace.open_binary()

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._fh.close()

    def row(self, offset: int, line: int) -> Row:
        """The row the scan found at ``offset`` (line ``line``). A row that no longer parses is a
        ValueError saying why; a file cut short, ConfigError (the trace changed under the soak)."""
        fh, trace = self._fh, self.trace
        fh.seek(offset)
        if trace.format in ("mooncake", "soakd"):
            raw = fh.readline()  # bytes: msgspec checks the UTF-8 itself
            row = trace.json_row(raw, line, offset) if raw else None
        else:
            fields = trace.csv_record(fh)
            row = trace.csv_row(fields, line, offset) if fields else None
        if row is None:
            raise ConfigError(f"load.replay: {trace.path}: line {line} is no longer the row it was (the file changed)")
        return row
