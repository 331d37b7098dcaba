"""Record soakd's own host memory as CSV fixtures for tests/fixtures/traces/.

Runs ``soakd run`` for a few minutes with accelerated settings (memory sampled every second)
on a model, then writes each host series from the state store's samples table as
``timestamp_seconds,bytes`` (what ``soakd analyze`` reads), timestamps from the run's start.

    .venv/bin/python bench/leak/record_traces.py --model builtin:leak_host --mib-per-s 0.05 --name leak_host_0.05
    .venv/bin/python bench/leak/record_traces.py --model builtin:noop --name noop
    .venv/bin/python bench/leak/record_traces.py --from-db STATE/soakd.db --name real-convnet-60m
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "traces"
# soakd's own host series, and the watched server's (a --watch-pid soak records those too).
SERIES = ("host_rss", "host_uss", "malloc_in_use", "target_rss", "target_uss")


def export(db: Path, name: str, out: Path = OUT) -> list[Path]:
    """Write ``{name}-{series}.csv`` for each memory series of ``SERIES`` in the state database."""
    written = []
    with sqlite3.connect(db) as con:
        for series in SERIES:
            rows = con.execute("SELECT t, value FROM samples WHERE series = ? ORDER BY t", (series,)).fetchall()
            if not rows:
                continue
            t0 = rows[0][0]
            path = out / f"{name}-{series}.csv"
            path.write_text("timestamp_seconds,bytes\n" + "".join(f"{t - t0:.2f},{v:.0f}\n" for t, v in rows))
            written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the model to soak (required unless --from-db)")
    ap.add_argument("--name", required=True)
    ap.add_argument("--mib-per-s", type=float, default=None, help="leak_host's leak rate")
    ap.add_argument("--duration", default="240s")
    ap.add_argument("--rate", default="20", help="requests per second (light: the machine is shared)")
    ap.add_argument("--from-db", type=Path, default=None, help="export an existing state database instead")
    ns = ap.parse_args()
    if ns.from_db is not None:
        print("\n".join(map(str, export(ns.from_db, ns.name))))
        return 0
    if ns.model is None:
        ap.error("--model is required (or --from-db to export a recorded run)")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "soakd.toml"
        opts = f"[model.options]\nmib_per_s = {ns.mib_per_s}\n" if ns.mib_per_s is not None else ""
        cfg.write_text(f'[model]\nspec = "{ns.model}"\nwarmup = 2\n{opts}')
        state = Path(tmp) / "state"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "soakd",
                "run",
                "--config",
                str(cfg),
                "--rate",
                ns.rate,
                "--duration",
                ns.duration,
                "--memory-interval",
                "1s",
                "--metrics-addr",
                "127.0.0.1:0",
                "--state-dir",
                str(state),
            ],
            check=True,
        )
        print("\n".join(map(str, export(state / "soakd.db", ns.name))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
