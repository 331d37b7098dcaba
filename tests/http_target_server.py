"""A plain HTTP server for ``--api http`` tests, run in its own process:
``python tests/http_target_server.py PORT [--pause-every S --pause-ms MS]``.

POST /ok answers 200; POST /mixed answers 200, 200, 404, 503 in turn; POST /stall answers 200,
but every S seconds the whole server pauses MS milliseconds (a GC pause, a reload) and a request
that arrives then waits it out. GET /stats: {"requests": n, "held": requests that waited on a
pause}. HEAD answers 200. It prints "ready PORT" once it listens; keep-alive (HTTP/1.1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIXED = (200, 200, 404, 503)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.held = 0
        self.mixed = itertools.cycle(MIXED)
        self.paused = threading.Event()
        self.resumed = threading.Condition()


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: object) -> None:  # quiet: the test reads stdout
        pass

    def _answer(self, status: int, body: bytes = b'{"ok": true}') -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path == "/stats":
            with STATE.lock:
                body = json.dumps({"requests": STATE.requests, "held": STATE.held}).encode()
            self._answer(200, body)
        else:
            self._answer(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with STATE.lock:
            STATE.requests += 1
            status = next(STATE.mixed) if self.path == "/mixed" else 200
        if self.path == "/stall" and STATE.paused.is_set():
            with STATE.lock:
                STATE.held += 1
            with STATE.resumed:
                STATE.resumed.wait_for(lambda: not STATE.paused.is_set())
        self._answer(status if self.path in ("/ok", "/mixed", "/stall") else 404)


def pauser(every: float, pause: float) -> None:
    while True:
        time.sleep(every - pause)
        STATE.paused.set()
        time.sleep(pause)
        with STATE.resumed:
            STATE.paused.clear()
            STATE.resumed.notify_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--pause-every", type=float, default=0.0)
    ap.add_argument("--pause-ms", type=float, default=0.0)
    args = ap.parse_args()
    ThreadingHTTPServer.request_queue_size = 256  # listen backlog (default 5): no SYN dropped, no 1 s retry
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    if args.pause_every > 0:
        threading.Thread(target=pauser, args=(args.pause_every, args.pause_ms / 1e3), daemon=True).start()
    print(f"ready {args.port}", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
