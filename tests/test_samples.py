"""Replaying real sample files: images, JSON bodies, text lines and corrupt files, through
preprocess, the model and postprocess, as a user runs it."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from soakd.config import load_config
from soakd.load.engine import Engine
from soakd.targets.local import LocalModelTarget
from soakd.telemetry.catalogue import Metrics
from soakd.workload.preprocess import BadInput, Preprocessor, TextLine, decode_image
from soakd.workload.samples import BadSampleLog, SampleSource
from soakd.workload.sources import build_source
from tests.conftest import metric_value, soakd_cmd, wait_for

SIZES = [(64, 48), (300, 200), (640, 480), (97, 131), (1, 1), (1024, 768)]
CORRUPT = ("truncated.jpg", "empty.png", "garbage.png", "notjson.json", "badb64.json")


def _file_name(item: str | TextLine) -> str:
    """The file name of an image item; a text line here would be a wrong item."""
    assert isinstance(item, str), item
    return Path(item).name


def _image(w: int, h: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    if mode == "L":
        return Image.fromarray((rng.random((h, w)) * 255).astype("uint8"), "L")
    return Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8"), "RGB")


def make_samples(root: Path) -> Path:
    """A folder of real JPEG and PNG files of many sizes, JSON bodies, and corrupt files."""
    root.mkdir(parents=True, exist_ok=True)
    for i, (w, h) in enumerate(SIZES):
        _image(w, h, i).save(root / f"img{i}.jpg", quality=85)
        _image(w, h, i, "L" if i % 2 else "RGB").save(root / f"img{i}.png")
    nested = root / "more"
    nested.mkdir()
    _image(200, 100, 99).convert("RGBA").save(nested / "alpha.png")
    buf = io.BytesIO()
    _image(50, 70, 7).save(buf, "JPEG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    (root / "body_b64.json").write_text(json.dumps({"image": b64}))
    (root / "body_dataurl.json").write_text(json.dumps({"image": "data:image/jpeg;base64," + b64}))
    (root / "body_array.json").write_text(json.dumps({"array": np.zeros((3, 32, 32)).tolist()}))
    good = (root / "img2.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "empty.png").write_bytes(b"")
    (root / "garbage.png").write_bytes(os.urandom(512))
    (root / "notjson.json").write_text("{'image': ")
    (root / "badb64.json").write_text(json.dumps({"image": "!!!not base64!!!"}))
    (root / "README.md").write_text("not a sample: skipped")
    (root / ".hidden.jpg").write_bytes(b"skipped too")
    return root


class TestPreprocess:
    def test_images_of_any_size_become_the_models_input(self, tmp_path: Path) -> None:
        """Every JPEG and PNG, whatever its size and mode, decodes to a normalised 3x64x64 tensor."""
        make_samples(tmp_path)
        pre = Preprocessor((3, 64, 64))
        names = [f"img{i}.{ext}" for i in range(len(SIZES)) for ext in ("jpg", "png")]
        for name in [*names, "more/alpha.png"]:
            key, x = pre(str(tmp_path / name))
            assert key == (3, 64, 64) and x.shape == (3, 64, 64) and x.dtype == torch.float32
            assert float(x.min()) > -3.0 and float(x.max()) < 3.0  # ImageNet-normalised

    def test_pixels_are_normalised_with_imagenet_statistics(self) -> None:
        """Each channel is (pixel / 255 - mean) / std after a bilinear resize, laid out CHW."""
        img = _image(50, 70, 3)
        buf = io.BytesIO()
        img.save(buf, "PNG")
        x = decode_image(buf.getvalue(), (3, 32, 24))
        ref = np.asarray(img.resize((24, 32), Image.Resampling.BILINEAR), dtype=np.float64) / 255
        ref = ((ref - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).transpose(2, 0, 1)
        assert x.shape == (3, 32, 24) and x.is_contiguous()
        assert np.abs(x.numpy() - ref).max() < 1e-5

    def test_json_bodies_carry_base64_images_arrays_and_text(self, tmp_path: Path) -> None:
        """A base64 image is decoded and resized, an array keeps its shape, text is tokenized."""
        make_samples(tmp_path)
        pre = Preprocessor((3, 64, 64), torch.float16)
        assert pre(str(tmp_path / "body_b64.json"))[1].shape == (3, 64, 64)
        assert pre(str(tmp_path / "body_dataurl.json"))[1].dtype == torch.float16
        key, arr = pre(str(tmp_path / "body_array.json"))
        assert key == (3, 32, 32) and arr.shape == (3, 32, 32)
        (tmp_path / "t.json").write_text(json.dumps({"text": "a b c"}))
        key, ids = pre(str(tmp_path / "t.json"))
        assert key == (3,) and ids.dtype == torch.int64

    @pytest.mark.parametrize("name", CORRUPT)
    def test_corrupt_samples_are_bad_input(self, tmp_path: Path, name: str) -> None:
        """Truncated, empty, garbage or malformed samples raise BadInput, never anything else."""
        make_samples(tmp_path)
        with pytest.raises(BadInput):
            Preprocessor((3, 64, 64))(str(tmp_path / name))

    def test_text_lines_are_padded_to_one_key(self) -> None:
        """With pad, sequences of any length share one batch key; without, the length is the key."""
        assert Preprocessor(None, pad=True)(TextLine("f", "one two three"))[0] == "seq"
        assert Preprocessor(None)(TextLine("f", "one two three"))[0] == (3,)
        assert Preprocessor(None, max_tokens=2)(TextLine("f", "one two three"))[1].shape == (2,)


class TestSampleSource:
    def test_walks_the_folder_in_a_loop_skipping_other_files(self, tmp_path: Path) -> None:
        """Every sample file comes up once per pass, nested folders too; README and hidden files never."""
        make_samples(tmp_path)
        (tmp_path / "lines.txt").write_text("first line\n\n second line \n")
        src = SampleSource(str(tmp_path), Preprocessor((3, 8, 8)))
        files = sorted({p.name for p in tmp_path.rglob("*") if p.suffix in (".jpg", ".png", ".json")} - {".hidden.jpg"})
        per_pass = len(files) + 2  # each file once, and two non-empty lines of the text file
        items = [src.next()[1] for _ in range(2 * per_pass)]
        names = [Path(i.path if isinstance(i, TextLine) else i).name for i in items]
        assert sorted(set(names)) == sorted([*files, "lines.txt"])
        assert items[:per_pass] == items[per_pass:]
        assert [i.text for i in items if isinstance(i, TextLine)][:2] == ["first line", "second line"]
        assert "README.md" not in names and ".hidden.jpg" not in names

    def test_picks_up_files_added_between_passes(self, tmp_path: Path) -> None:
        """The listing is re-walked each pass: a file added mid-soak is replayed on the next pass."""
        _image(10, 10, 0).save(tmp_path / "a.png")
        src = SampleSource(str(tmp_path), Preprocessor((3, 8, 8)))
        assert _file_name(src.next()[1]) == "a.png"
        _image(10, 10, 1).save(tmp_path / "b.png")
        assert [_file_name(src.next()[1]) for _ in range(3)] == ["a.png", "b.png", "a.png"]

    def test_an_emptied_folder_yields_bad_input_not_a_hang(self, tmp_path: Path) -> None:
        """With nothing left to replay the source hands out the folder itself, which fails to read."""
        src = SampleSource(str(tmp_path), Preprocessor((3, 8, 8)))
        item = src.next()[1]
        with pytest.raises(BadInput):
            Preprocessor((3, 8, 8))(item)


def test_replay_counts_ok_and_bad_input_and_times_every_stage(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A soak over real files serves ok and bad_input, exports preprocess/postprocess histograms and
    the pool's busy ratio, names each corrupt file once in the log and keeps going."""
    samples = make_samples(tmp_path / "samples")
    out = tmp_path / "summary.json"
    d = daemon_factory(
        "--model",
        "builtin:convnet",
        "--input-shapes",
        "3x64x64",
        "--samples",
        str(samples),
        "--preprocess-workers",
        "2",
        "--warmup",
        "2",
        "--concurrency",
        "8",
        "--duration",
        "5s",
        "--summary-json",
        str(out),
    )
    d.wait_ready()

    def scraped_all() -> str | None:
        text = d.metrics()
        busy = metric_value(text, "soakd_preprocess_pool_busy_ratio")
        bad = metric_value(text, "soakd_requests_total", 'outcome="bad_input"') or 0
        return text if busy and bad > 0 else None

    text = wait_for(scraped_all, 30, what="bad_input counted and the busy ratio exported")
    for stage in ("preprocess", "postprocess", "e2e"):
        assert (metric_value(text, "soakd_request_duration_seconds_count", f'stage="{stage}"') or 0) > 0
    assert 0 < (metric_value(text, "soakd_preprocess_pool_busy_ratio") or 0) <= 1
    assert d.proc.wait(60) == 1, d.output()  # the corrupt files' share fails the default error gate
    summary = json.loads(out.read_text())
    assert summary["slo"]["failed"] == ["error ratio (default)"]
    assert summary["requests"]["ok"] > 0 and summary["requests"]["bad_input"] > 0
    assert summary["requests"]["error"] == 0
    for stage in ("preprocess", "postprocess", "queue", "inference", "e2e"):
        assert summary["latency_ms"][stage]["count"] > 0
    # e2e runs from send to the encoded response, so it covers the stages in between.
    lat = summary["latency_ms"]
    assert lat["e2e"]["mean"] >= lat["preprocess"]["mean"] + lat["inference"]["mean"]
    assert summary["input_shapes_seen"] == 2  # resized images, and the 3x32x32 array body
    log = d.output()
    for name in CORRUPT:
        assert log.count(f"bad sample {samples / name}:") == 1, log


def test_detector_samples_run_through_nms(tmp_path: Path) -> None:
    """builtin:detector on image samples picks detection post-processing by its output shape."""
    samples = tmp_path / "s"
    samples.mkdir()
    for i in range(3):
        _image(160 + 40 * i, 120, i).save(samples / f"{i}.jpg")
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        soakd_cmd(
            "run",
            "--model",
            "builtin:detector",
            "--input-shapes",
            "3x128x128",
            "--samples",
            str(samples),
            "--warmup",
            "1",
            "--concurrency",
            "4",
            "--duration",
            "2s",
            "--metrics-addr",
            "127.0.0.1:0",
            "--summary-json",
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["requests"]["ok"] > 0 and summary["requests"]["error"] == 0
    assert summary["latency_ms"]["postprocess"]["count"] == summary["requests"]["ok"]


def test_text_lines_replay_as_padded_token_batches(tmp_path: Path) -> None:
    """Lines of text become token requests of their own lengths; padded, they share batches; an
    empty text file is bad input."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "again", "and", "again"]
    (tmp_path / "lines.txt").write_text("\n".join(" ".join(words[: 1 + i % 11]) for i in range(40)))
    (tmp_path / "empty.txt").write_text("")
    cfg = load_config(
        None,
        {
            "input.samples": str(tmp_path),
            "input.pad": True,
            "input.postprocess": "none",
            "load.concurrency": 16,
            "batcher.max_batch_size": 8,
        },
    )
    shapes: list[tuple[int, ...]] = []

    def record(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return x

    engine = Engine(
        LocalModelTarget(record, torch.device("cpu")), build_source(cfg, None, torch.float32), cfg, Metrics()
    )
    engine.start()
    deadline = time.monotonic() + 60
    while engine.stats().completed["ok"] < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.stop()
    stats = engine.stats()
    assert stats.completed["ok"] >= 500 and stats.completed["bad_input"] > 0
    assert stats.stages["preprocess"].count == stats.completed["ok"]
    assert engine.batch_size_summary()["mean"] > 1
    assert {s[1] for s in shapes} <= set(range(1, 12)) and engine.shapes_seen > 1


def test_bad_samples_are_named_once_and_the_names_kept_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """Each bad file is named once however often it comes round (and across a sweep's steps,
    which share the source's log); past the limit one line says the rest go unnamed."""
    bad = BadSampleLog(limit=3)
    with caplog.at_level(logging.WARNING, logger="soakd.samples"):
        for _ in range(5):  # five passes over a folder of ten broken files
            for i in range(10):
                bad(f"/samples/{i}.jpg", ValueError("truncated"))
    lines = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in lines[:3]] == [f"bad sample /samples/{i}.jpg" for i in range(3)]
    assert len(lines) == 4 and lines[3].startswith("more than 3 bad samples")
