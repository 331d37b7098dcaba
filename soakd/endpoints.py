"""HTTP beside the work: ``/metrics`` (Prometheus), ``/healthz`` and ``/status``. Read-only.

Sized for a room of scrapers: a listen backlog of 128 (http.server's default of 5 left some of
200 concurrent scrapes waiting a minute), idle or slow connections closed after 10 s, and a
client that goes away mid-response is nobody's traceback.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from soakd.config import parse_host_port

log = logging.getLogger("soakd.http")

HealthFn = Callable[[], tuple[bool, str]]
StatusFn = Callable[[], dict[str, Any]]

LISTEN_BACKLOG = 128  # the kernel's somaxconn default; a scrape burst queues instead of timing out
IDLE_TIMEOUT = 10.0  # seconds a connection may sit idle or trickle a request before it is closed
# A client that hung up: the response has nowhere to go, which is not soakd's error.
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback for any handler exception; a client gone is not one."""
        exc = sys.exc_info()[1]
        if isinstance(exc, _GONE):
            log.debug("client %s went away: %s", client_address, exc)
            return
        log.exception("error serving %s", client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class EndpointServer:
    def __init__(
        self,
        addr: str,
        registry: CollectorRegistry,
        health: HealthFn | None = None,
        status: StatusFn | None = None,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        host, port = parse_host_port(addr)
        self.registry = registry
        self.health: HealthFn = health or (lambda: (True, "ok"))
        self.status: StatusFn = status or (lambda: {})
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = idle_timeout  # socketserver sets it on the connection: idle clients are closed

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
                except _GONE:
                    raise  # the server's handle_error drops it quietly
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

        # Bind what the name resolves to first (preflight checked it is this host's), so a name
        # with only an IPv6 address listens on IPv6.
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server_cls = _Server6 if family == socket.AF_INET6 else _Server
        self._httpd = server_cls((str(sockaddr[0]), port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="soakd-http", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"[{host!s}]:{port}" if ":" in str(host) else f"{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
