"""A plain HTTP server for ``--api http`` tests, run in its own process:
``python tests/http_target_server.py PORT [--pause-every S --pause-ms MS] [--creep PER_S]``.

POST /ok answers 200; POST /mixed answers 200, 200, 404, 503 in turn; POST /stall answers 200,
but every S seconds the whole server pauses MS milliseconds (a GC pause, a reload) and a request
that arrives then waits it out. GET /stats: {"requests": n, "held": requests that waited on a
pause}. GET /arrivals: the server's wall-clock time of each POST's arrival (the last 200,000),
for tests of how drivers space their requests. GET /metrics: a Prometheus page
(prometheus_client's own text format), as a vLLM or Triton server has:
``vllm:kv_cache_usage_perc`` rising by ``--creep PER_S`` from 0.2 (a server whose cache fills
up), ``vllm:num_requests_waiting`` flat at 3, and the counter ``nv_inference_queue_duration_us``
growing 1000 per POST. HEAD answers 200.
It prints "ready PORT" once it listens; keep-alive (HTTP/1.1).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

MIXED = (200, 200, 404, 503)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.held = 0
        self.arrivals: collections.deque[float] = collections.deque(maxlen=200_000)
        self.mixed = itertools.cycle(MIXED)
        self.paused = threading.Event()
        self.resumed = threading.Condition()


STATE = State()
REGISTRY = CollectorRegistry()
KV_CACHE = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage", ["model_name"], registry=REGISTRY)
WAITING = Gauge("vllm:num_requests_waiting", "Requests waiting", ["model_name"], registry=REGISTRY)
QUEUE_US = Counter("nv_inference_queue_duration_us", "Queue time", ["model"], registry=REGISTRY)
QUEUE_US.labels("detector")  # exported from the start, at 0, as Triton does
STARTED = time.monotonic()
CREEP = [0.0]  # --creep: KV-cache usage gained per second


def metrics_page() -> bytes:
    KV_CACHE.labels("m").set(0.2 + CREEP[0] * (time.monotonic() - STARTED))
    WAITING.labels("m").set(3)
    return generate_latest(REGISTRY)


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
        if self.path == "/metrics":
            body = metrics_page()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/arrivals":
            with STATE.lock:
                body = json.dumps(list(STATE.arrivals)).encode()
            self._answer(200, body)
        elif self.path == "/stats":
            with STATE.lock:
                body = json.dumps({"requests": STATE.requests, "held": STATE.held}).encode()
            self._answer(200, body)
        else:
            self._answer(404)

    def do_POST(self) -> None:
        arrived = time.time()
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with STATE.lock:
            STATE.arrivals.append(arrived)
            STATE.requests += 1
            QUEUE_US.labels("detector").inc(1000)
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
    ap.add_argument("--creep", type=float, default=0.0)
    args = ap.parse_args()
    CREEP[0] = args.creep
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
