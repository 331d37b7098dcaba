"""The fakes answer from a device's recorded folder where one exists (tests/fixtures/recorded/<gpu>/,
written by bench/gpu_check.sh), and the recorder writes what the fakes read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.gpu import record as gpu_record
from soakd.telemetry.catalogue import Metrics
from soakd.telemetry.nvml import NvmlSampler
from soakd.telemetry.torch_cuda import TorchCudaSampler, largest_free_blocks
from tests.telemetry_fakes import RECORDED, FakeCuda, FakeNvml, fixture_json, load_json, recorded_dir

FILES = (*gpu_record.STATS_AT.values(), gpu_record.SNAPSHOT, gpu_record.NVML)


def write_recorded(root: Path, gpu: str, allocated: int) -> Path:
    """A recorded-layout folder made from the synthetic answers, with values of its own."""
    folder = root / gpu
    folder.mkdir(parents=True)
    stats = load_json("torch_memory_stats.json")
    for moment, name in gpu_record.STATS_AT.items():
        at = dict(stats, **{"allocated_bytes.all.current": allocated if moment == "load" else allocated // 2})
        (folder / name).write_text(json.dumps(at))
    shutil.copy(Path(__file__).parent / "fixtures" / gpu_record.SNAPSHOT, folder / gpu_record.SNAPSHOT)
    nvml = load_json("nvml_answers.json")
    h100 = dict(nvml["gpus"][0], name=f"recorded {gpu}")
    (folder / gpu_record.NVML).write_text(json.dumps({"driver_version": "580.159.03", "gpus": [h100]}))
    return folder


def test_a_recorded_folder_is_what_the_fakes_serve(tmp_path: Path) -> None:
    """FakeCuda and FakeNvml read the recorded folder; the samplers export its values."""
    root = tmp_path / "recorded"
    write_recorded(root, "nvidia-h200", allocated=123_456_789)
    cuda = FakeCuda(root=root)
    assert cuda.stats["allocated_bytes.all.current"] == 123_456_789
    m = Metrics()
    TorchCudaSampler(m, None, [0], cuda).sample()
    got = m.registry.get_sample_value("soakd_torch_cuda_allocated_bytes", {"device": "cuda:0", "pool": "all"})
    assert got == 123_456_789
    nv = FakeNvml(os.getpid(), root=root)
    assert nv.answers["driver_version"] == "580.159.03"
    assert [g["name"] for g in nv.answers["gpus"]] == ["recorded nvidia-h200"]
    # What a device cannot show (no driver at all) still comes from the synthetic answers.
    assert nv.answers["no_driver"] == load_json("nvml_answers.json")["no_driver"]
    sampler = NvmlSampler(Metrics(), None, nv)
    sampler.open()
    assert [g.name for g in sampler.gpus] == ["recorded nvidia-h200"]


def test_without_a_recorded_folder_the_fakes_serve_the_synthetic_answers(tmp_path: Path) -> None:
    """No device recorded (an empty or missing folder): the synthetic fixtures."""
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "empty", tmp_path / "missing"):
        assert recorded_dir(root) is None
        assert FakeCuda(root=root).stats == load_json("torch_memory_stats.json")
        assert FakeNvml(1, root=root).answers == load_json("nvml_answers.json")


def test_soakd_fixtures_chooses_the_device_or_synthetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several devices recorded: the first by name, or the one $SOAKD_FIXTURES names."""
    root = tmp_path / "recorded"
    write_recorded(root, "a-gpu", allocated=1)
    write_recorded(root, "b-gpu", allocated=2)
    assert fixture_json(gpu_record.STATS, root)["allocated_bytes.all.current"] == 1
    monkeypatch.setenv("SOAKD_FIXTURES", "b-gpu")
    assert fixture_json(gpu_record.STATS, root)["allocated_bytes.all.current"] == 2
    monkeypatch.setenv("SOAKD_FIXTURES", "synthetic")
    assert fixture_json(gpu_record.STATS, root) == load_json(gpu_record.STATS)
    monkeypatch.setenv("SOAKD_FIXTURES", "c-gpu")
    with pytest.raises(FileNotFoundError, match="SOAKD_FIXTURES=c-gpu"):
        fixture_json(gpu_record.STATS, root)


def test_the_nvml_recorder_writes_what_the_fake_reads() -> None:
    """Recording the synthetic answers through the fake gives them back: both GPUs, our pid as
    SELF, the T4's unsupported calls named as the fake names them."""
    synthetic = load_json("nvml_answers.json")
    pid = os.getpid()
    got = gpu_record.record_nvml(FakeNvml(pid, answers=synthetic), pid)
    assert got["driver_version"] == synthetic["driver_version"]
    assert got["gpus"] == synthetic["gpus"]


def test_the_recorder_keeps_a_snapshot_small_and_plain_json() -> None:
    """At most MAX_SEGMENTS segments, tuples as lists; the largest free block is still readable."""
    segments = load_json("torch_memory_snapshot.json")
    many = [dict(s, segment_pool_id=(0, 0)) for s in segments] * 40
    kept = gpu_record.snapshot_segments(many)
    assert len(kept) == gpu_record.MAX_SEGMENTS
    assert kept[0]["segment_pool_id"] == [0, 0]
    assert largest_free_blocks(kept) == largest_free_blocks(segments)


def test_gpu_names_become_folder_names() -> None:
    assert gpu_record.slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_record.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


@pytest.mark.parametrize("folder", sorted(p for p in RECORDED.glob("*") if p.is_dir()), ids=lambda p: p.name)
def test_each_recorded_device_folder_is_complete_and_consistent(folder: Path) -> None:
    """A committed device folder holds the five answers; reserved >= allocated at each moment."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    for name in gpu_record.STATS_AT.values():
        stats = json.loads((folder / name).read_text())
        assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"], name
    nvml = json.loads((folder / gpu_record.NVML).read_text())
    assert nvml["gpus"] and all("uuid" in g and "unsupported" in g for g in nvml["gpus"])
