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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from soakd.workload.preprocess import (
    IMAGE_EXTENSIONS,
    JSON_EXTENSIONS,
    TEXT_EXTENSIONS,
    BadInput,
    Preprocessor,
    TextLine,
)

log = logging.getLogger("soakd.samples")

SAMPLE_EXTENSIONS = IMAGE_EXTENSIONS | JSON_EXTENSIONS | TEXT_EXTENSIONS


def walk_samples(root: str) -> Iterator[str]:
    """Sample file paths under ``root``, depth first, sorted by name; other files are skipped."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            log.warning("samples: cannot list %s: %s", folder, exc.strerror)
            continue
        subdirs = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                subdirs.append(entry.path)
            elif Path(entry.name).suffix.lower() in SAMPLE_EXTENSIONS:
                yield entry.path
        stack.extend(reversed(subdirs))


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
        self.bad_log = BadSampleLog()
        self._items = self._cycle()
        self.passes = 0

    def _cycle(self) -> Iterator[str | TextLine]:
        while True:
            found = False
            for path in walk_samples(self.root):
                found = True
                if Path(path).suffix.lower() in TEXT_EXTENSIONS:
                    yield from self._lines(path)
                else:
                    yield path
            self.passes += 1
            if not found:
                # Nothing to replay (the folder was emptied): hand out the folder itself, which
                # fails to read and is counted as bad input, rather than spinning here forever.
                yield self.root

    @staticmethod
    def _lines(path: str) -> Iterator[str | TextLine]:
        any_line = False
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    text = line.strip()
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

    def warmup_inputs(self) -> list[tuple[Any, torch.Tensor]]:
        """The first few samples that decode (their real shapes), else a zero image."""
        out: list[tuple[Any, torch.Tensor]] = []
        seen: set[Any] = set()
        for n, path in enumerate(walk_samples(self.root)):
            if n >= 16 or len(out) >= 4:
                break
            item: str | TextLine = path
            if Path(path).suffix.lower() in TEXT_EXTENSIONS:
                item = next(iter(self._lines(path)))
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
