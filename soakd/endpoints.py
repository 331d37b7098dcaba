"""HTTP beside the work: ``/metrics`` (Prometheus), ``/healthz`` and ``/status``. Read-only."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger("soakd.http")

HealthFn = Callable[[], tuple[bool, str]]
StatusFn = Callable[[], dict[str, Any]]


class EndpointServer:
    def __init__(self, addr: str, registry: CollectorRegistry, health: HealthFn | None = None,
                 status: StatusFn | None = None) -> None:
        host, _, port = addr.rpartition(":")
        self.registry = registry
        self.health: HealthFn = health or (lambda: (True, "ok"))
        self.status: StatusFn = status or (lambda: {})
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        encoder, ctype = choose_encoder(self.headers.get("Accept") or "")
                        self._send(200, ctype, encoder(server.registry))
                    elif path == "/healthz":
                        ok, reason = server.health()
                        self._send(200 if ok else 503, "text/plain; charset=utf-8", (reason + "\n").encode())
                    elif path == "/status":
                        body = json.dumps(server.status(), default=str, allow_nan=False).encode()
                        self._send(200, "application/json", body)
                    elif path == "/":
                        self._send(200, "text/plain; charset=utf-8", b"soakd: /metrics /healthz /status\n")
                    else:
                        self._send(404, "text/plain; charset=utf-8", b"not found\n")
                except Exception as exc:  # an endpoint bug must not take the soak down
                    log.exception("error serving %s", path)
                    self._send(500, "text/plain; charset=utf-8", (type(exc).__name__ + ": " + str(exc) + "\n").encode())

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes every 15 s are not news
                pass

        self._httpd = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="soakd-http", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
