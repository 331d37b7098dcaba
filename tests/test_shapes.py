"""Shape mixes and sequence-length distributions: what each request's input looks like."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from soakd.config import ConfigError, load_config
from soakd.load.engine import Engine
from soakd.request import Request
from soakd.targets.local import LocalModelTarget
from soakd.targets.staging import StagingBuffers
from soakd.telemetry.catalogue import Metrics
from soakd.workload.seqlen import SeqLenSource, draw_lengths, parse_seq_spec
from soakd.workload.shapes import ShapeSource
from soakd.workload.sources import build_source
from tests.conftest import metric_value, wait_for


class TestShapeMix:
    def test_shapes_are_drawn_by_weight(self) -> None:
        """Over 20k requests each shape's share is within two points of its weight."""
        src = ShapeSource("3x24x24=0.6,3x32x32=0.3,3x8x8=0.1", pool=2)
        draws = [src.next() for _ in range(20_000)]
        for shape, weight in [((3, 24, 24), 0.6), ((3, 32, 32), 0.3), ((3, 8, 8), 0.1)]:
            share = sum(1 for key, _ in draws if key == shape) / len(draws)
            assert share == pytest.approx(weight, abs=0.02)
        assert all(tuple(t.shape) == key for key, t in draws[:100])

    def test_shape_mix_run_exports_three_distinct_shapes(self, daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        """A three-shape mix shows soakd_input_shapes_seen == 3 on /metrics and in the summary."""
        out = tmp_path / "summary.json"
        d = daemon_factory(
            "--model",
            "builtin:noop",
            "--input-shapes",
            "3x24x24=0.6,3x32x32=0.3,3x8x8=0.1",
            "--warmup",
            "3",
            "--concurrency",
            "8",
            "--duration",
            "3s",
            "--summary-json",
            str(out),
        )
        d.wait_ready()
        wait_for(lambda: metric_value(d.metrics(), "soakd_input_shapes_seen") == 3, 30, what="3 shapes seen")
        assert d.proc.wait(60) == 0, d.output()
        assert json.loads(out.read_text())["input_shapes_seen"] == 3


class TestSeqLen:
    def test_lognormal_lengths_have_the_mean_and_stay_in_bounds(self) -> None:
        spec = parse_seq_spec("seq:lognormal(mean=128,sigma=0.5,min=8,max=4096)")
        lengths = draw_lengths(spec, np.random.default_rng(0), 50_000)
        assert lengths.mean() == pytest.approx(128, rel=0.03)
        clipped = draw_lengths(
            parse_seq_spec("seq:lognormal(mean=128,sigma=1.5,min=8,max=512)"), np.random.default_rng(0), 50_000
        )
        assert clipped.min() == 8 and clipped.max() == 512

    def test_uniform_and_fixed(self) -> None:
        u = draw_lengths(parse_seq_spec("seq:uniform(min=4,max=6)"), np.random.default_rng(0), 1000)
        assert set(u.tolist()) == {4, 5, 6}
        assert set(draw_lengths(parse_seq_spec("seq:fixed(n=7)"), np.random.default_rng(0), 10)) == {7}

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            ("seq:lognormal(mean=128)", "missing \\['sigma'\\]"),
            ("seq:uniform(min=9,max=4)", "min <= max"),
            ("seq:zipf(a=2)", "cannot parse"),
            ("seq:uniform(min=1,max=x)", "not a number"),
        ],
    )
    def test_bad_specs_are_config_errors_naming_the_key(self, spec: str, message: str) -> None:
        with pytest.raises(ConfigError, match=f"input.shapes: .*{message}"):
            load_config(None, {"input.shapes": spec})

    def test_token_requests_are_int64_with_their_length_as_key(self) -> None:
        src = SeqLenSource("seq:uniform(min=3,max=9)")
        for _ in range(50):
            key, ids = src.next()
            assert key == tuple(ids.shape) and ids.dtype == torch.int64 and 3 <= len(ids) <= 9
        assert SeqLenSource("seq:uniform(min=3,max=9)", pad=True).next()[0] == "seq"


class TestPadding:
    def test_padded_batches_right_pad_with_zeros(self) -> None:
        batch = [Request(0, 0, "seq", torch.tensor([5, 6, 7])), Request(0, 0, "seq", torch.tensor([9]))]
        assert StagingBuffers().collate([r.tensor for r in batch]).tolist() == [[5, 6, 7], [9, 0, 0]]

    def test_padded_sequences_share_batches(self) -> None:
        """With input.pad, 61 different lengths still fill batches; each batch is one padded shape."""
        cfg = load_config(
            None,
            {
                "input.shapes": "seq:uniform(min=4,max=64)",
                "input.pad": True,
                "load.concurrency": 32,
                "batcher.max_batch_size": 8,
                "model.warmup": 0,
            },
        )
        seen: list[tuple[int, ...]] = []

        def record(x: torch.Tensor) -> torch.Tensor:
            seen.append(tuple(x.shape))
            return x

        engine = Engine(
            LocalModelTarget(record, torch.device("cpu")), build_source(cfg, None, torch.float32), cfg, Metrics()
        )
        engine.start()
        deadline = time.monotonic() + 60
        while engine.stats().completed["ok"] < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        engine.stop()
        assert engine.stats().completed["ok"] >= 2000
        assert engine.batch_size_summary()["mean"] > 4
        assert all(len(s) == 2 and s[1] <= 64 for s in seen)
        assert engine.shapes_seen == len({s[1:] for s in seen}) > 1
