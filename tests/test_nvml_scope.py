"""Which GPUs NvmlSampler reads (issue #36): only those CUDA_VISIBLE_DEVICES leaves this process
(NVML itself ignores the variable), the model's MIG instance rather than its whole board, and a
warning, once, when NVML never lists this process (a container's host pids). Fakes answer as
nvidia-ml-py 13 does (tests/fixtures/PROVENANCE.md)."""

from __future__ import annotations

import logging
import os
from typing import Any

import pynvml
import pytest

from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.nvml import NvmlSampler, visible_gpus
from soakd.telemetry.scheduler import SourceUnavailable
from soakd.telemetry.series import SeriesStore
from tests.telemetry_fakes import FakeNvml, load_json

H100, T4 = (g["uuid"] for g in load_json("nvml_answers.json")["gpus"])


def _open(env: dict[str, str], uuids: list[str] | None = None, answers: Any = None) -> tuple[NvmlSampler, SeriesStore]:
    series = SeriesStore(100)
    nv = FakeNvml(pid=os.getpid(), answers=answers if answers is not None else load_json("nvml_answers.json"))
    sampler = NvmlSampler(Metrics(), series, nv, uuids=uuids, env=env)
    sampler.open()
    return sampler, series


@pytest.mark.parametrize(
    ("spec", "indices"),
    [
        ("1", [1]),  # soakd@1 on a two-GPU host samples GPU 1 only
        ("0,1", [0, 1]),
        ("1,0,1", [1, 0]),
        (T4[:12], [1]),  # a UUID prefix, as CUDA accepts one
        ("0,-1,1", [0]),  # CUDA stops at the first entry that names no device
        ("0,7", [0]),
    ],
)
def test_nvml_samples_only_the_gpus_cuda_visible_devices_leaves(spec: str, indices: list[int]) -> None:
    sampler, _ = _open({"CUDA_VISIBLE_DEVICES": spec})
    assert [g.index for g in sampler.gpus] == indices


def test_unset_cuda_visible_devices_means_every_gpu() -> None:
    nv = FakeNvml(pid=os.getpid())
    assert [i for i, _ in visible_gpus(nv, [0, 1], {})] == [0, 1]


@pytest.mark.parametrize("spec", ["", "-1", "GPU-ffffffff"])
def test_cuda_visible_devices_that_hides_every_gpu_makes_nvml_unavailable_with_the_value(spec: str) -> None:
    nv = FakeNvml(pid=os.getpid())
    with pytest.raises(SourceUnavailable, match=f"CUDA_VISIBLE_DEVICES={spec!r} names none of its 2 GPU"):
        NvmlSampler(Metrics(), None, nv, env={"CUDA_VISIBLE_DEVICES": spec}).open()
    assert nv.shutdown_calls == 1


def _mig(uuid: str, used: int) -> dict[str, Any]:
    return {"uuid": uuid, "memory": {"total": 10 << 30, "free": (10 << 30) - used, "used": used}}


def _mig_board() -> dict[str, Any]:
    """The H100 of the synthetic answers split into MIG instances: slot 0 the model's, slot 1
    empty, slot 2 another tenant's; its process list refused, as a MIG parent's is."""
    answers: dict[str, Any] = load_json("nvml_answers.json")
    board = answers["gpus"][0]
    board["mig_devices"] = [
        _mig("MIG-11111111-2222-3333-4444-555555555555", 3 << 30),
        None,
        _mig("MIG-66666666-7777-8888-9999-000000000000", 9 << 30),
    ]
    board["unsupported"] = ["processes"]
    return answers


def test_the_model_mig_instance_is_its_memory_series_not_the_whole_board() -> None:
    """torch names the model's MIG instance by its bare UUID; soakd asks NVML for "MIG-" + it and
    the leak series reads that instance's 3 GiB, not the board's (nor the T4's) used memory."""
    bare = "11111111-2222-3333-4444-555555555555"
    sampler, series = _open({}, uuids=[f"GPU-{bare}", f"MIG-{bare}"], answers=_mig_board())
    sampler.sample()
    assert list(series.read("gpu_memory_used")[1]) == [3 << 30]


def test_a_mig_entry_of_cuda_visible_devices_picks_the_board_that_holds_it() -> None:
    sampler, _ = _open({"CUDA_VISIBLE_DEVICES": "MIG-6666"}, answers=_mig_board())
    assert [g.index for g in sampler.gpus] == [0]


def test_nvml_that_never_lists_this_process_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """The model's GPU lists another pid, never ours, sample after sample: one warning naming
    hostPID, and still no per-process sample (not a made-up 0)."""
    sampler, series = _open({}, uuids=[H100])
    sampler.pid = 1  # the fake lists os.getpid() and 4242 on the H100: 1 is a host pid we never see
    with caplog.at_level(logging.WARNING, logger="soakd.telemetry"):
        for _ in range(6):
            sampler.sample()
    said = [r.getMessage() for r in caplog.records if "never this one" in r.getMessage()]
    assert len(said) == 1 and "hostPID: true" in said[0] and "pid 1" in said[0]
    assert series.read("gpu_process_memory")[0].size == 0


def test_nvml_that_lists_this_process_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    sampler, series = _open({}, uuids=[H100])
    with caplog.at_level(logging.WARNING, logger="soakd.telemetry"):
        for _ in range(6):
            sampler.sample()
    assert not [r for r in caplog.records if "never this one" in r.getMessage()]
    assert series.read("gpu_process_memory")[0].size == 6


def test_pynvml_has_the_mig_calls_the_fake_imitates() -> None:
    for name in ("nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex"):
        assert callable(getattr(pynvml, name))
