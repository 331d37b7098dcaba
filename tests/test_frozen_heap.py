"""soakd's own full garbage collections skip what existed before the soak (soakd/run/heap.py): a
collection walking the ~200,000 objects of a process with torch loaded stalled a 20,000 req/s
replay for 146 ms and dropped 2,595 requests (docs/replay.md). A ``python:`` model counts, from
inside its forward, the objects a full collection would walk, in warm-up and in the soak."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path

import pytest

from soakd.config import load_config
from soakd.run.session import run
from soakd.run.stop import StopFlag
from tests.conftest import free_port

pytestmark = pytest.mark.integration

CENSUS = '''
import gc, json
import torch

class Census(torch.nn.Module):
    """Notes, at its first call and at its first call after warm-up, the objects a full
    collection walks (every tracked one outside the frozen generation) and the frozen count."""

    def __init__(self, out, warmup):
        super().__init__()
        self.out, self.warmup, self.calls, self.seen = out, warmup, 0, {}

    def forward(self, x):
        if self.calls in (0, self.warmup):
            phase = "warmup" if self.calls == 0 else "soak"
            self.seen[phase] = {"walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
            with open(self.out, "w") as fh:
                json.dump(self.seen, fh)
        self.calls += 1
        return x.float().sum(dim=1)

def make(out, warmup):
    return Census(out, warmup)
'''


def test_a_full_collection_during_the_soak_walks_only_what_the_soak_made(tmp_path: Path) -> None:
    model, seen = tmp_path / "census.py", tmp_path / "seen.json"
    model.write_text(CENSUS)
    warmup = 3
    cfg = load_config(
        None,
        {
            "model.spec": f"python:{model}:make",
            "model.device": "cpu",
            "model.warmup": warmup,
            "model.offline_probe": 0,
            "model.options": {"out": str(seen), "warmup": warmup},
            "input.shapes": "8",
            "batcher.max_batch_size": 1,
            "load.concurrency": 1,
            "load.duration": "1s",
            "metrics.addr": f"127.0.0.1:{free_port()}",
            "state.dir": str(tmp_path / "state"),
        },
    )
    assert run(cfg, out=io.StringIO(), stop=StopFlag()) == 0
    got = json.loads(seen.read_text())
    before, during = got["warmup"], got["soak"]
    assert before["frozen"] == 0 and before["walked"] > 50_000  # the premise: torch's objects, all walked
    assert during["frozen"] > 0.8 * before["walked"]  # what existed before the soak is frozen ...
    assert during["walked"] < before["walked"] / 10  # ... so a full collection walks a tenth or less
    assert gc.get_freeze_count() == 0  # and the process's heap is as before once the run ends
