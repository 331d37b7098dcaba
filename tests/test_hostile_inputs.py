"""What a user has on disk cannot crash or wedge a soak: sample folders with symlink loops,
unreadable folders, text beside images and files of hundreds of megabytes; model files that do
not import. Each is skipped or counted as bad_input and named once, or is exit 2 with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from soakd.workload.preprocess import BadInput, Preprocessor, TextLine
from soakd.workload.samples import MAX_DEPTH, SampleSource, SampleWalker
from tests.conftest import soakd_cmd


def no_dac_override() -> tuple[str, ...]:
    """A prefix under which file permissions apply even to root (its override capabilities dropped)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: permissions do not apply")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


def soak(*args: str, prefix: tuple[str, ...] = (), timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, *soakd_cmd("run", "--metrics-addr", "127.0.0.1:0", "--warmup", "2", *args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --------------------------------------------------------------------------- sample folders


def test_loops_unreadable_folders_and_text_beside_images_are_skipped_and_named_once(tmp_path: Path) -> None:
    """A symlink loop, a link to itself, an unreadable folder and a labels.txt in an image model's
    samples: the soak serves the images, counts the text as bad_input, names each problem once."""
    samples = tmp_path / "samples"
    (samples / "a" / "b").mkdir(parents=True)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(samples / "a" / "b" / "x.jpg")
    Image.new("RGB", (64, 48), (10, 200, 10)).save(samples / "y.png")
    (samples / "a" / "b" / "up").symlink_to("../..")  # a loop back to the root
    (samples / "self").symlink_to("self")  # a link that cannot be followed (ELOOP)
    (samples / "labels.txt").write_text("cat\ndog\n")
    locked = samples / "locked"
    locked.mkdir()
    Image.new("RGB", (8, 8)).save(locked / "hidden.png")
    locked.chmod(0)
    out = tmp_path / "summary.json"
    try:
        proc = soak(
            "--model",
            "builtin:convnet",
            "--input-shapes",
            "3x32x32",
            "--samples",
            str(samples),
            "--concurrency",
            "4",
            "--duration",
            "3s",
            "--summary-json",
            str(out),
            prefix=no_dac_override(),
        )
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 1, proc.stderr  # the bad samples' share fails the default error gate
    summary = json.loads(out.read_text())
    assert summary["slo"]["failed"] == ["error ratio (default)"]
    assert summary["requests"]["ok"] > 0 and summary["requests"]["bad_input"] > 0
    assert summary["requests"].get("error", 0) == 0
    log = proc.stderr
    assert log.count(f"skipping {samples / 'a' / 'b' / 'up'}") == 1, log
    assert log.count(f"skipping {samples / 'self'}") == 1, log
    assert log.count(f"skipping {locked}: cannot list it") == 1, log
    assert log.count(f"bad sample {samples / 'labels.txt'}: a line of text, but the model takes images") == 1, log
    assert "Traceback" not in log


def test_a_walk_is_bounded_in_depth(tmp_path: Path) -> None:
    """A folder chain deeper than MAX_DEPTH: samples above the bound are found, the rest is named once."""
    folder = tmp_path
    for depth in range(MAX_DEPTH + 5):
        folder = folder / f"d{depth}"
        folder.mkdir()
        (folder / "s.json").write_text("{}")
    walker = SampleWalker(str(tmp_path))
    found = list(walker.walk())
    assert len(found) == MAX_DEPTH
    assert list(walker.walk()) == found  # and every pass finds the same


def test_large_files_are_bad_input_and_memory_stays_bounded(tmp_path: Path) -> None:
    """A 150 MB one-line .txt and a 120 MB .json (past the 64 MiB input.max_sample_bytes): both are
    bad_input, the small sample beside them is served, and the daemon's peak RSS stays under 1 GiB
    (reading them whole took 7.8 GiB and never got ready)."""
    samples = tmp_path / "samples"
    samples.mkdir()
    with (samples / "one-line.txt").open("w") as fh:
        for _ in range(150):
            fh.write("word " * 200_000)  # 1 MB at a time, no newline
    with (samples / "body.json").open("w") as fh:
        fh.write('{"array": [')
        for _ in range(120):
            fh.write("0.5, " * 200_000)
        fh.write("0.5]}")
    (samples / "ok.txt").write_text("a small line of text\n")
    out = tmp_path / "summary.json"
    wrapper = (
        "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
        "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(rc)"
    )
    cmd = [
        sys.executable,
        "-c",
        wrapper,
        *soakd_cmd(
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--warmup",
            "2",
            "--model",
            "builtin:noop",
            "--samples",
            str(samples),
            "--concurrency",
            "4",
            "--duration",
            "3s",
            "--summary-json",
            str(out),
        ),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # the oversized samples are bad input: the default error gate
    summary = json.loads(out.read_text())
    assert summary["slo"]["failed"] == ["error ratio (default)"]
    assert summary["requests"]["ok"] > 0 and summary["requests"]["bad_input"] > 0
    assert "larger than input.max_sample_bytes" in proc.stderr
    assert "a line longer than input.max_sample_bytes" in proc.stderr
    maxrss = int(proc.stderr.rsplit("maxrss_kib", 1)[1].split()[0]) * 1024
    assert maxrss < 1 << 30, f"peak RSS {maxrss / 2**20:.0f} MiB"


def test_a_sample_over_the_limit_is_read_no_further(tmp_path: Path) -> None:
    """input.max_sample_bytes applies to files and text lines; the line after a long one is still served."""
    body = tmp_path / "b.json"
    body.write_text(json.dumps({"array": [0.0] * 1000}))
    with pytest.raises(BadInput, match=r"larger than input.max_sample_bytes \(100 bytes\)"):
        Preprocessor(None, max_sample_bytes=100)(str(body))
    assert Preprocessor(None, max_sample_bytes=10_000)(str(body))[1].shape == (1000,)
    text = tmp_path / "t.txt"
    text.write_text("short one\n" + "x" * 5000 + "\nshort two\n")
    src = SampleSource(str(tmp_path), Preprocessor(None, max_sample_bytes=1000))
    lines = [item for item in (src.next()[1] for _ in range(4)) if isinstance(item, TextLine)]
    assert [(line.text, line.error is not None) for line in lines] == [
        ("short one", False),
        ("", True),
        ("short two", False),
    ]


# --------------------------------------------------------------------------- model files


@pytest.mark.parametrize(
    ("source", "needles"),
    [
        (
            "import soakd_no_such_module\n\ndef make():\n    return None\n",
            ("ModuleNotFoundError", "soakd_no_such_module"),
        ),
        ("def make(:\n    return None\n", ("SyntaxError", ":1")),
        ("raise RuntimeError('weights not found at /models/x')\n", ("RuntimeError", "weights not found")),
        ("import sys\nsys.exit(0)\n", ("SystemExit",)),
    ],
    ids=["import-error", "syntax-error", "raises", "sys-exit"],
)
def test_a_model_file_that_does_not_import_is_exit_2_naming_it(
    tmp_path: Path, source: str, needles: tuple[str, ...]
) -> None:
    """`python:FILE.py:make` whose module fails to import: exit 2, one line with the file and the cause."""
    model = tmp_path / "model.py"
    model.write_text(source)
    proc = soak("--model", f"python:{model}:make", "--duration", "2s", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert str(model) in line
    for needle in needles:
        assert needle in line, line
