"""What the CUDA leak evidence does where torch cannot give it (issue #36): an allocator backend
that keeps no history (cudaMallocAsync) or refuses to record must not stop a run that asked for
``leak.cuda_history = "always"``, and a torch older than 2.11 (no ``include_traces``) must not
symbolise the history ring on every snapshot tick. No GPU here: torch's CUDA entry points are
replaced by stand-ins that answer as those builds do."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from soakd.analysis.evidence import CudaHistory, Evidence
from soakd.telemetry import torch_cuda
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.torch_cuda import TorchCuda, TorchCudaSnapshotSampler


def _said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def _never(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("history recording was started")


def test_cuda_malloc_async_with_history_always_runs_on_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """backend:cudaMallocAsync: the evidence starts (no exception), never asks torch to record,
    warns once, and a flip's evidence names why there is no snapshot."""
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", _never)
    with caplog.at_level(logging.WARNING, logger="soakd.leak"):
        ev = Evidence(tmp_path, cuda_history="always", cuda=CudaHistory(1000, 0), malloc_trim=False)
        ev.building("torch_cuda_allocated", True)
        got = ev.collect("torch_cuda_allocated", 1e9)
        ev.close()
    said = _said(caplog, "leak.cuda_history")
    assert len(said) == 1 and "backend:cudaMallocAsync" in said[0]
    assert got["snapshot"] is None and "cudaMallocAsync" in got["snapshot_error"]
    assert not list(tmp_path.iterdir())


def test_an_allocator_that_refuses_to_record_is_said_once_and_not_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs)
        raise RuntimeError("recordHistory is not supported by this allocator\nmore detail")

    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "native")
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    with caplog.at_level(logging.WARNING, logger="soakd.leak"):
        ev = Evidence(None, cuda_history="auto", cuda=CudaHistory(1000, 0), malloc_trim=False)
        for _ in range(3):
            ev.building("torch_cuda_allocated", True)
    assert len(calls) == 1
    said = _said(caplog, "leak.cuda_history")
    assert said == [
        "leak.cuda_history: recordHistory is not supported by this allocator: "
        "leak verdicts go on without allocation history or memory snapshots"
    ]


def test_a_torch_without_include_traces_skips_the_snapshot_while_history_records(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torch 2.10's memory_snapshot(mempool_id=None): not called while soakd records history (it
    would symbolise the whole ring), called again once recording stops; the sampler keeps its
    last figure and says why once."""
    calls = []

    def snapshot_2_10(mempool_id: Any = None) -> list[dict[str, Any]]:
        calls.append(mempool_id)
        return [{"device": 0, "blocks": [{"state": "inactive", "size": 4096}]}]

    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot_2_10)
    backend = TorchCuda()
    assert backend.skips_traces is False
    m = Metrics()
    sampler = TorchCudaSnapshotSampler(m, [0], backend)
    sampler.sample()
    assert m.cuda_largest_free_block.labels("cuda:0")._value.get() == 4096
    torch_cuda.HISTORY_RECORDING.set()
    try:
        with caplog.at_level(logging.INFO, logger="soakd.telemetry"):
            sampler.sample()
            sampler.sample()
    finally:
        torch_cuda.HISTORY_RECORDING.clear()
    assert len(calls) == 1
    assert len(_said(caplog, "include_traces")) == 1
    sampler.sample()
    assert len(calls) == 2


def test_this_torch_skips_traces_in_its_snapshot() -> None:
    """torch 2.11+ (2.13 here): the snapshot is read with include_traces=False whatever records."""
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    assert TorchCuda().skips_traces is ((major, minor) >= (2, 11))
