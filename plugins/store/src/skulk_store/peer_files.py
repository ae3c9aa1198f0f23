"""The holder's file server for peer copies: byte ranges of a model's files, sent by `sendfile`.

It listens on a port of its own (the grant names it) rather than on the API's ASGI stack, which
copies every block through Python (Starlette's `FileResponse` reads the file in 64 KiB chunks and
hands each to uvicorn). Here a request thread answers `GET /files/{model_id}?file=NAME` with a
`Range` header by writing the headers and then `socket.sendfile`: the kernel moves the bytes from
the page cache to the socket with no user-space copy. Keep-alive connections carry one range after
another, so a requester's connection costs one handshake per file copy, not one per range.

Who may read what is decided by the `resolve` callable the owner gives (the peer grant's token,
bound to a member and a model; see peer.py); the server only speaks HTTP and counts bytes.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
#: a requester that stops reading for this long loses its connection (a frozen member holds no thread)
IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Served:
    """A request the owner allows: the file, and the member it is counted for."""

    path: Path
    requester: str


@dataclass(frozen=True)
class Refused:
    status: int
    message: str


#: (token, model id, file name) -> what to send, or why not
Resolver = Callable[[str, str, str], Served | Refused]


class FileServer:
    """A threaded HTTP/1.1 server with keep-alive that answers range requests with `sendfile`."""

    def __init__(self, resolve: Resolver, on_sent: Callable[[str, int], None] | None = None) -> None:
        self.resolve = resolve
        self.on_sent = on_sent or (lambda requester, n: None)
        self._http: ThreadingHTTPServer | None = None
        self.port: int | None = None

    def start(self, host: str, port: int = 0) -> int:
        server = self

        class Handler(_RangeHandler):
            owner = server

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # several connections per requester, several requesters
            daemon_threads = True

        self._http = Server((host, port), Handler)
        self.port = int(self._http.server_address[1])
        threading.Thread(target=self._http.serve_forever, name="store-peer-files", daemon=True).start()
        return self.port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _RangeHandler(BaseHTTPRequestHandler):
    owner: FileServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _refuse(self, status: int, message: str) -> None:
        data = message.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if not url.path.startswith("/files/"):
            return self._refuse(404, "GET /files/{model_id}?file=NAME")
        model_id = unquote(url.path.removeprefix("/files/"))
        name = (parse_qs(url.query).get("file") or [""])[0]
        token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        answer = self.owner.resolve(token, model_id, name)
        if isinstance(answer, Refused):
            return self._refuse(answer.status, answer.message)
        try:
            f = open(answer.path, "rb")
        except OSError as exc:
            return self._refuse(404, f"{name!r} cannot be read on this node: {exc.strerror}")
        with f:
            size = f.seek(0, 2)
            start, end = 0, size - 1
            m = RANGE.match(self.headers.get("Range", ""))
            if m:
                start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
                if start > end:
                    return self._refuse(416, f"range {m[0]} is outside the file ({size} bytes)")
            self.send_response(206 if m else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1))
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            sent = 0
            try:
                sent = _send_range(self.connection, f.fileno(), start, end - start + 1)
            except OSError:  # the requester went away or stalled: this connection is over
                self.close_connection = True
            finally:
                self.owner.on_sent(answer.requester, sent)


def _send_range(sock: socket.socket, fd: int, offset: int, count: int) -> int:
    """`count` bytes of `fd` from `offset` by `os.sendfile` on the blocking socket: one call usually
    sends the whole range with the GIL released (a Python-level timeout would make it a loop of
    non-blocking calls, one per socket buffer); the kernel's SO_SNDTIMEO ends a stalled send."""
    timeout = sock.gettimeout()
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(IDLE_TIMEOUT_S), 0))
    sent = 0
    try:
        while sent < count:
            n = os.sendfile(sock.fileno(), fd, offset + sent, count - sent)
            if not n:
                break  # the file is shorter than it was when the range was answered
            sent += n
    finally:
        sock.settimeout(timeout)
    return sent
