"""Checks a run makes before it loads anything, on the machine it runs on: do its buffers and
model threads fit this host (:mod:`soakd.host_limits`), can it listen on ``metrics.addr``, open
``output.log_file`` and write ``output.summary_json``?

``soakd check-config`` validates a file that may be meant for another host, so these live here,
not in :mod:`soakd.config`: they resolve names, bind a socket and create files. Each failure is
a :class:`ConfigError` naming the key, found in the first second rather than after a day's soak.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import tempfile
from pathlib import Path

from soakd.config import Config, ConfigError, parse_host_port
from soakd.host_limits import check_host

log = logging.getLogger("soakd.preflight")


def preflight(cfg: Config) -> list[str]:
    """Run every check; raise ConfigError on the first failure. Returns warnings (logged too)."""
    check_host(cfg)  # this host's cores and RAM, before anything is allocated
    warnings = check_listen_addr(cfg.metrics.addr)
    if cfg.output.log_file is not None:
        check_appendable(cfg.output.log_file, "output.log_file")
    if cfg.output.summary_json is not None:
        check_creatable(cfg.output.summary_json, "output.summary_json")
    for w in warnings:
        log.warning("%s", w)
    return warnings


def check_listen_addr(addr: str, key: str = "metrics.addr") -> list[str]:
    """The host resolves to an address of this machine (bound on an ephemeral port and released).

    A wildcard or another interface's address is allowed, with a warning: Prometheus on another
    host (the compose file, a fleet) must reach the endpoint, and what it serves is read-only
    and free of secrets; an address this host does not have cannot be listened on at all."""
    host, port = parse_host_port(addr, key)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{key}: {addr!r}: cannot resolve host {host!r}: {exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    ip_text = str(sockaddr[0])
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((ip_text, 0, *sockaddr[2:]))
    except OSError as exc:
        why = "not an address of this host" if exc.errno == errno.EADDRNOTAVAIL else exc.strerror
        raise ConfigError(f"{key}: {addr!r}: cannot listen on {ip_text}: {why}") from None
    finally:
        probe.close()
    ip = ipaddress.ip_address(ip_text.split("%", 1)[0])
    if ip.is_loopback:
        return []
    return [
        f"{key} {addr}: /metrics, /healthz and /status are reachable from other hosts "
        "(read-only; use 127.0.0.1 to keep them local)"
    ]


def check_appendable(path: str, key: str) -> None:
    """Open the file for appending (creating it, as the log handler will) and close it."""
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: cannot open for writing: {exc.strerror}") from None


def check_creatable(path: str, key: str) -> None:
    """A file can be created beside ``path`` (the summary is written to a temporary file there,
    then renamed), in its directory or, where that is still to be made, the nearest one above."""
    target = Path(path)
    if target.exists() and not os.access(target, os.W_OK):
        raise ConfigError(f"{key}: {path}: not writable by this user")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{key}: {path}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: cannot create files in {folder}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)
