"""Batch assembly into reused staging buffers, instead of a fresh tensor per batch.

``torch.stack`` allocates a new batch every call. At 8 x 3x224x224 float32 that is 4.8 MB, above
glibc's mmap threshold, so every batch comes back from the kernel as freshly zeroed pages: on a
2-core CPU that alone halved a small model's throughput (issue #13, bench/thread_affinity.py).
Here each (batch size, shape, dtype) gets one buffer, kept and refilled with ``torch.stack(...,
out=buf)``; on CUDA the buffer is pinned host memory and the copy to the device is
``non_blocking``.

One ``StagingBuffers`` per model thread. A buffer is refilled by the next batch of the same key,
so it must not be refilled while a model call still reads it. On one model thread that holds by
construction: the next batch is assembled after the previous call returned (and, on CUDA, a
recorded event says the host-to-device copy that read the pinned buffer is done). Shared between
model threads, two batches could land in one buffer at once, so a ``StagingBuffers`` refuses to be
used from a second thread. One caveat stays: a model whose output *is* its input (``builtin:noop``)
hands the staging buffer itself to the postprocess thread, which may then see the next batch's
values; the sizes and timings soakd measures are unaffected.

A row that already holds the very tensor it is given, unchanged since it was copied (the same
object, its version counter and the buffer's where they were), is not copied again (rows of at
least ``CHECK_ROW_BYTES``; smaller ones cost more to check than to copy). soakd's
synthetic inputs are a pool cycled in order (``input.pool``, 8 by default), so at a batch size
the pool divides (8, 16 ... 1024) every row gets the same tensor each batch and, after the first,
full batches copy nothing, as a model's offline loop reusing one input copies nothing. Inputs read
from sample files are new tensors each time and are copied every batch. A model that writes into
its input bumps the buffer's version, so the next batch is copied whole.

A batch of one on the CPU is a view of the request's own tensor, never a copy. Each new view is
a small ``malloc`` (about 0.5 KB) on the model thread, and with glibc one small allocation per call
there moves where the model's own heap is trimmed: a CPU model with large activations then faults
them in again on every call (the builtin convnet at batch 1 in its own offline loop: from ~185 to
~80 req/s, docs/model-threads.md). So the views of the request source's pooled tensors are made
once, at start (``hold_pool``); other tensors still get a view per batch.

Bounded: at most ``capacity`` buffers (least recently used evicted), so a long run with many
shapes cannot grow it; ``evictions`` counts the churn when a shape mix outgrows the cap. The rows'
record holds weak references: it keeps no request's tensor alive.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

Key = tuple[int, tuple[int, ...], torch.dtype]
# Rows smaller than this are copied without looking: checking a row costs about 0.2 us, as much
# as copying 64 bytes (1024 rows of 16 floats: stack 127 us, the check 185 us); a 3x224x224
# float row takes about 19 us to copy.
CHECK_ROW_BYTES = 16 << 10
Row = tuple["weakref.ReferenceType[torch.Tensor]", int]  # the tensor a row was copied from, its version then


class _Held:
    """What a buffer holds: each row's source, and the buffer's version after the fill."""

    __slots__ = ("rows", "version")

    def __init__(self, rows: list[Row], version: int) -> None:
        self.rows = rows
        self.version = version


class StagingBuffers:
    def __init__(self, device: torch.device | str = "cpu", capacity: int = 8, *, pin: bool | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.device = torch.device(device)
        self.capacity = capacity
        self._cuda = self.device.type == "cuda"
        self._pin = (self._cuda and torch.cuda.is_available()) if pin is None else pin
        self._buffers: OrderedDict[Key, torch.Tensor] = OrderedDict()
        self._copied: dict[Key, Any] = {}  # CUDA: event after the last copy out of each buffer
        self._held: dict[Key, _Held] = {}
        self._ones: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (held tensor, its batch of one)
        self.rows_copied = 0  # rows filled by a copy; the rest were already in place
        self._owner: int | None = None
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._buffers)

    def hold_pool(self, tensors: Sequence[Any]) -> None:
        """``tensors`` come back again and again (the request source's pool): on the CPU a batch
        of one of each is made now, once, instead of a new view per batch. Replaces
        what was held before (a sweep's next step brings its own pool)."""
        self._ones = {}
        if not self._cuda:
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    self._ones[id(t)] = (t, t.unsqueeze(0))

    def stack(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """``torch.stack(tensors)`` on the device, assembled in a reused buffer. A batch of one
        on the CPU is a view of the request's own tensor: nothing to copy, and for a held tensor
        not even a new view (see the module docstring)."""
        first = tensors[0]
        if len(tensors) == 1 and not self._cuda:
            held = self._ones.get(id(first))
            return held[1] if held is not None and held[0] is first else first.unsqueeze(0)
        if first.device.type != "cpu":  # already on the device: its caching allocator recycles blocks
            return torch.stack(list(tensors)).to(self.device)
        key = (len(tensors), tuple(first.shape), first.dtype)
        buf = self._buffer(key)
        self._fill(key, buf, tensors)
        return self._to_device(key, buf)

    def _fill(self, key: Key, buf: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        """Copy into ``buf`` the rows that do not already hold their tensor (see the module docstring)."""
        n, shape, dtype = key
        if math.prod(shape) * dtype.itemsize < CHECK_ROW_BYTES:
            torch.stack(list(tensors), out=buf)
            self.rows_copied += n
            return
        held = self._held.get(key)
        if held is None or held.version != buf._version:
            torch.stack(list(tensors), out=buf)
            held = self._held[key] = _Held([(weakref.ref(t), t._version) for t in tensors], 0)
            copied = n
        else:
            rows = held.rows
            stale = [i for i, t in enumerate(tensors) if rows[i][0]() is not t or t._version != rows[i][1]]
            for i in stale:
                buf[i].copy_(tensors[i])
                rows[i] = (weakref.ref(tensors[i]), tensors[i]._version)
            copied = len(stale)
        held.version = buf._version
        self.rows_copied += copied

    def collate(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """``pad_collate``'s semantics: the same shapes stack; 1-D (or N-D) sequences of
        different lengths are right-padded with 0 along their first dimension to the longest."""
        first = tensors[0].shape
        if all(t.shape == first for t in tensors):
            return self.stack(tensors)
        trailing = tuple(first[1:])
        if any(tuple(t.shape[1:]) != trailing for t in tensors):
            shapes = sorted({tuple(t.shape) for t in tensors})
            raise RuntimeError(f"cannot pad sequences whose trailing dimensions differ: {shapes}")
        longest = max(t.shape[0] for t in tensors)
        key = (len(tensors), (longest, *trailing), tensors[0].dtype)
        buf = self._buffer(key)
        for row, t in zip(buf, tensors, strict=True):
            n = t.shape[0]
            row[:n].copy_(t)
            row[n:].zero_()  # the buffer holds the last batch's values: pad explicitly
        return self._to_device(key, buf)

    def _buffer(self, key: Key) -> torch.Tensor:
        me = threading.get_ident()
        if self._owner != me:
            if self._owner is not None:
                raise RuntimeError("StagingBuffers is per model thread: used from a second thread")
            self._owner = me
        buf = self._buffers.get(key)
        if buf is not None:
            self._buffers.move_to_end(key)
            event = self._copied.get(key)
            if event is not None:
                event.synchronize()  # the previous copy out of this pinned buffer has finished
            return buf
        batch, shape, dtype = key
        # A normal tensor, never an inference tensor, even when first made inside inference_mode
        # (warm-up): refilling an inference tensor outside inference_mode is an error.
        with torch.inference_mode(False):
            buf = torch.empty((batch, *shape), dtype=dtype, pin_memory=self._pin)
        self._buffers[key] = buf
        if len(self._buffers) > self.capacity:
            old, _ = self._buffers.popitem(last=False)
            self._copied.pop(old, None)
            self._held.pop(old, None)
            self.evictions += 1
        return buf

    def _to_device(self, key: Key, buf: torch.Tensor) -> torch.Tensor:
        if not self._cuda:
            return buf
        out = buf.to(self.device, non_blocking=self._pin)
        if self._pin:
            event = self._copied.get(key)
            if event is None:
                event = self._copied[key] = torch.cuda.Event()  # type: ignore[no-untyped-call]
            # On the model's device's stream, where .to() queued the copy: a bare record() uses
            # the worker thread's current device, GPU 0 (another tenant's), and orders nothing.
            event.record(torch.cuda.current_stream(self.device))
        return out
