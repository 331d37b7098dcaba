"""soakd's ``--api http`` driver against aiohttp alone, per CPU second (issue #38's per-core goal).

``python -m bench.aiohttp_floor [--rounds 3] [--seconds 8] [--connections 32]`` pins
bench/minimal_server.py to the last core and each driver to core 0, and alternates, each in its
own process:

- aiohttp alone: ``--connections`` tasks POSTing a small JSON body back to back through one
  ``ClientSession`` (the client ``--api http`` was built on until #38, and openai and kserve-v2
  REST still are), and nothing else;
- ``soakd run --api http --concurrency N``, twice, for ``--seconds`` and for 3x that: the
  difference of the two runs' requests over the difference of their CPU seconds is the steady
  state, start-up (imports, warm-up, report) left out.

It prints requests per CPU second for both and their ratio. While soakd drove aiohttp the ratio
was 0.993 (aiohttp was the whole limit); with soakd's own client (soakd/targets/http1.py) it
says how much further the whole soak goes per core than the client it replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.replay_rss import free_port

BODY = b'{"x": 1}'


async def _bare(url: str, seconds: float, connections: int) -> tuple[int, float]:
    import aiohttp  # only this mode needs it

    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
        stop = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                done += 1

        cpu0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return done, time.process_time() - cpu0


def bare(url: str, seconds: float, connections: int) -> float:
    """aiohttp alone, in its own pinned process: requests per CPU second."""
    code = (
        "import asyncio, json, sys; from bench.aiohttp_floor import _bare; "
        f"print(json.dumps(asyncio.run(_bare({url!r}, {seconds}, {connections}))))"
    )
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    done, cpu = json.loads(out.stdout)
    return float(done) / float(cpu)


def soakd(url: str, seconds: float, connections: int, work: Path) -> tuple[int, float]:
    """One pinned ``soakd run``: requests completed and the process's CPU seconds."""
    summary = work / f"summary-{time.monotonic_ns()}.json"
    cmd = [
        "taskset", "-c", "0", sys.executable, "-m", "soakd", "run", "--target", url, "--api", "http",
        "--samples", str(work / "bodies"), "--concurrency", str(connections), "--duration", f"{seconds}s",
        "--warmup", "5", "--summary-json", str(summary), "--state-dir", str(work / "state"),
        "--metrics-addr", f"127.0.0.1:{free_port()}",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return int(json.loads(summary.read_text())["requests"]["ok"]), cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--connections", type=int, default=32)
    args = p.parse_args()
    last = str((os.cpu_count() or 2) - 1)
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", last, sys.executable, str(Path(__file__).with_name("minimal_server.py")), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    ratios, bares, soaks = [], [], []
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("ready")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "bodies").mkdir()
            (work / "bodies" / "a.json").write_bytes(BODY)
            for k in range(args.rounds):
                order = ("bare", "soakd") if k % 2 == 0 else ("soakd", "bare")
                got = {}
                for name in order:
                    if name == "bare":
                        got[name] = bare(url, args.seconds, args.connections)
                    else:
                        n1, c1 = soakd(url, args.seconds, args.connections, work)
                        n3, c3 = soakd(url, 3 * args.seconds, args.connections, work)
                        got[name] = (n3 - n1) / (c3 - c1)
                bares.append(got["bare"])
                soaks.append(got["soakd"])
                ratios.append(got["soakd"] / got["bare"])
                print(
                    f"round {k + 1} ({order[0]} first): aiohttp alone {got['bare']:8.0f} req per CPU s, "
                    f"soakd steady state {got['soakd']:8.0f}; soakd/aiohttp {ratios[-1]:.3f}",
                    flush=True,
                )
    finally:
        server.kill()
    print(
        f"medians: aiohttp alone {statistics.median(bares):.0f}, soakd {statistics.median(soaks):.0f} req per CPU "
        f"second; soakd/aiohttp median of rounds {statistics.median(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
