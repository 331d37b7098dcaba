"""Replay of real sample files from a directory, in a loop, streamed.

The directory is walked again on every pass (files added or removed during a soak are
picked up), in sorted order, skipping hidden names; a file is only read when a preprocess
worker gets to it, and a text file is read a line at a time, so memory stays flat whatever
the size of the sample set. Images and JSON bodies are one request per file; a text file is
one request per non-empty line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from soakd.workload.preprocess import (
    DEFAULT_MAX_SAMPLE_BYTES,
    IMAGE_EXTENSIONS,
    JSON_EXTENSIONS,
    TEXT_EXTENSIONS,
    BadInput,
    Preprocessor,
    TextLine,
)

log = logging.getLogger("soakd.samples")

if TYPE_CHECKING:
    import torch

SAMPLE_EXTENSIONS = IMAGE_EXTENSIONS | JSON_EXTENSIONS | TEXT_EXTENSIONS
WARMUP_SEARCH_SECONDS = 10.0  # looking for warm-up samples in a huge or slow tree stops after this


# A walk's bounds: deeper than this is a loop or a mistake, and a pass that has looked at this
# many entries (a million: minutes on a network mount) ends there and starts over.
MAX_DEPTH = 32
MAX_ENTRIES_PER_PASS = 1_000_000
MAX_PROBLEMS_NAMED = 1000  # distinct folders named in the log as skipped; past this, silence


class SampleWalker:
    """Walks a samples folder, depth first, sorted by name, skipping hidden names and other files.

    A directory reached twice (a symlink loop, or two links to one folder) is walked once; an
    unreadable one is skipped. Each is named in the log once for the walker's life, not once per
    pass (a small folder is walked many times a second). Bounded in depth and in entries per pass.
    """

    def __init__(self, root: str, extensions: frozenset[str] = SAMPLE_EXTENSIONS) -> None:
        self.root = root
        self.extensions = extensions
        self._named: set[str] = set()

    def _skip(self, path: str, why: str) -> None:
        if path in self._named or len(self._named) >= MAX_PROBLEMS_NAMED:
            return
        self._named.add(path)
        log.warning("samples: skipping %s: %s (named once)", path, why)

    def walk(self, deadline: float | None = None) -> Iterator[str]:
        """Sample file paths under the root; ``deadline`` (monotonic): stop looking then."""
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[str, int]] = [(self.root, 0)]
        entries_seen = 0
        while stack:
            folder, depth = stack.pop()
            try:
                st = os.stat(folder)
            except OSError as exc:
                self._skip(folder, exc.strerror or str(exc))
                continue
            if (st.st_dev, st.st_ino) in seen:
                self._skip(folder, "already walked (a symlink loop or a second link to one folder)")
                continue
            seen.add((st.st_dev, st.st_ino))
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                self._skip(folder, f"cannot list it: {exc.strerror}")
                continue
            subdirs = []
            for entry in entries:
                entries_seen += 1
                if entries_seen > MAX_ENTRIES_PER_PASS:
                    self._skip(self.root, f"more than {MAX_ENTRIES_PER_PASS} entries: each pass stops there")
                    return
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir()
                except OSError as exc:  # ELOOP and friends: a link that cannot be followed
                    self._skip(entry.path, exc.strerror or str(exc))
                    continue
                if is_dir:
                    if depth + 1 > MAX_DEPTH:
                        self._skip(entry.path, f"deeper than {MAX_DEPTH} folders")
                    else:
                        subdirs.append(entry.path)
                elif Path(entry.name).suffix.lower() in self.extensions:
                    yield entry.path
                if deadline is not None and time.monotonic() > deadline:
                    return
            stack.extend((d, depth + 1) for d in reversed(subdirs))


def walk_samples(root: str, extensions: frozenset[str] = SAMPLE_EXTENSIONS) -> Iterator[str]:
    """Sample file paths under ``root`` (one :class:`SampleWalker` pass)."""
    return SampleWalker(root, extensions).walk()


MAX_BAD_NAMED = 1000  # distinct bad samples named in the log; past this, one line says so


class BadSampleLog:
    """Names each bad sample once in the log. The source keeps it, so a sweep's steps (a new
    engine each) do not repeat the names; bounded, so a folder of a million broken files
    cannot grow the daemon."""

    def __init__(self, limit: int = MAX_BAD_NAMED) -> None:
        self.limit = limit
        self._named: set[str] = set()
        self._capped = False

    def __call__(self, item: Any, exc: Exception) -> None:
        name = item.path if isinstance(item, TextLine) else str(item)
        if name in self._named:
            return
        if len(self._named) < self.limit:
            self._named.add(name)
            log.warning("bad sample %s: %s (counted as bad_input; logged once per file)", name, exc)
        elif not self._capped:
            self._capped = True
            log.warning("more than %d bad samples: the others are counted as bad_input, not named", self.limit)


class SampleSource:
    """Hands out raw samples (paths, text lines) for the engine's preprocess pool."""

    def __init__(self, root: str, preprocess: Preprocessor) -> None:
        self.root = root
        self.preprocess = preprocess
        self.walker = SampleWalker(root)
        self.bad_log = BadSampleLog()
        self._oversized: set[tuple[str, int, int]] = set()  # text files with a line over the limit
        self._items = self._cycle()
        self.passes = 0

    def _cycle(self) -> Iterator[str | TextLine]:
        while True:
            found = False
            for path in self.walker.walk():
                found = True
                if Path(path).suffix.lower() in TEXT_EXTENSIONS:
                    yield from self._lines(path, self.preprocess.max_sample_bytes)
                else:
                    yield path
            self.passes += 1
            if not found:
                # Nothing to replay (the folder was emptied): hand out the folder itself, which
                # fails to read and is counted as bad input, rather than spinning here forever.
                yield self.root

    def _lines(self, path: str, limit: int = DEFAULT_MAX_SAMPLE_BYTES) -> Iterator[str | TextLine]:
        """The file's non-empty lines, read a bounded line at a time: a line longer than ``limit``
        bytes is one bad request (skipped to its end in 1 MiB pieces), never held whole. A file
        found to hold one is not read again while its size and mtime stay the same."""
        any_line = False
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                stamp = (path, st.st_size, st.st_mtime_ns)
                if stamp in self._oversized:
                    yield TextLine(path, "", f"a line longer than input.max_sample_bytes ({limit} bytes)")
                    return
                while True:
                    raw = fh.readline(limit + 1)
                    if not raw:
                        break
                    if len(raw) > limit and not raw.endswith(b"\n"):
                        while raw and not raw.endswith(b"\n"):  # drop the rest of this line
                            raw = fh.readline(1 << 20)
                        any_line = True
                        if len(self._oversized) < MAX_BAD_NAMED:
                            self._oversized.add(stamp)
                        yield TextLine(path, "", f"a line longer than input.max_sample_bytes ({limit} bytes)")
                        continue
                    text = raw.decode("utf-8", errors="replace").strip()
                    if text:
                        any_line = True
                        yield TextLine(path, text)
        except OSError:
            yield path  # the preprocess worker's read fails and names it
            return
        if not any_line:
            yield TextLine(path, "")  # an empty text file is bad input, not silently nothing

    def next(self) -> tuple[Any, str | TextLine]:
        return None, next(self._items)

    def pooled(self) -> list[Any]:
        return []  # each request: a sample decoded anew

    def warmup_inputs(self) -> list[tuple[Any, torch.Tensor]]:
        """The first few samples that decode (their real shapes), else a zero image."""
        import torch  # in-process only: a served target's soak never loads torch

        out: list[tuple[Any, torch.Tensor]] = []
        seen: set[Any] = set()
        deadline = time.monotonic() + WARMUP_SEARCH_SECONDS
        for n, path in enumerate(self.walker.walk(deadline)):
            if n >= 16 or len(out) >= 4:
                break
            item: str | TextLine = path
            if Path(path).suffix.lower() in TEXT_EXTENSIONS:
                item = next(iter(self._lines(path, self.preprocess.max_sample_bytes)))
            try:
                key, tensor = self.preprocess(item)
            except BadInput:
                continue
            if tuple(tensor.shape) not in seen:
                seen.add(tuple(tensor.shape))
                out.append((key, tensor))
        if not out and self.preprocess.image_shape is not None:
            shape = self.preprocess.image_shape
            out.append((shape, torch.zeros(shape, dtype=self.preprocess.dtype)))
        elif not out:
            out.append(((16,), torch.ones(16, dtype=torch.int64)))
        return out
