"""An SSE request that another thread can abort at any moment, and the thread that does it.

Why not just httpx: llama.cpp sends the response headers only when the first token exists, so
a request that is queued for a slot, or whose prompt is being evaluated, blocks inside
``client.stream(...)`` for seconds with no response object to close, and closing an httpx
client from another thread does not wake a ``recv`` blocked on Linux (measured: it returned
only when data arrived 7 s later). ``shutdown(SHUT_RDWR)`` on the socket does wake it. So each
stream gets its own one-connection httpcore pool (httpx's own transport layer, ~microseconds to
create) over a network backend that remembers its sockets, and :class:`CancelWatcher` polls the
callers' ``cancel()`` and shuts those sockets down.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpcore  # light: httpx's own transport layer, already loaded with httpx


class _TrackingBackend(httpcore.NetworkBackend):
    """Delegates to a real httpcore backend and records the sockets it opens."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self.inner = inner
        self.sockets: list[socket.socket] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self.inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        sock = stream.get_extra_info("socket")
        if sock is not None:
            self.sockets.append(sock)
        return stream

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return self.inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class AbortableStream:
    """One streaming POST on its own connection; :meth:`abort` is safe from any thread."""

    def __init__(self, base_url: str, path: str, body: bytes, timeout_s: float, network_backend: Any = None) -> None:
        self._backend = _TrackingBackend(network_backend or httpcore.SyncBackend())
        self._pool = httpcore.ConnectionPool(network_backend=self._backend, max_connections=1)
        parts = urlsplit(base_url)
        self._url = f"{parts.scheme}://{parts.netloc}{path}"
        self._host = parts.netloc.encode()
        self._body = body
        self._timeout = {"connect": 10.0, "read": timeout_s, "write": 60.0, "pool": 10.0}
        self._cm: Any = None
        self._response: Any = None
        self.aborted = False
        self.status = 0

    def open(self) -> int:
        """Send the request and wait for the status line (blocks while llama.cpp queues it)."""
        # keep the context manager itself alive: if it is garbage-collected, its generator's
        # cleanup closes the connection under us
        self._cm = self._pool.stream(
            "POST",
            self._url,
            content=self._body,
            headers=[(b"Host", self._host), (b"Content-Type", b"application/json"), (b"Accept", b"text/event-stream")],
            extensions={"timeout": self._timeout},
        )
        self._response = self._cm.__enter__()
        self.status = self._response.status
        return self.status

    def read_all(self) -> str:
        return b"".join(self._response.iter_stream()).decode("utf-8", "replace")

    def lines(self) -> Iterator[str]:
        """Decoded lines of the body (SSE ``data: ...`` lines and blank separators)."""
        buf = b""
        for chunk in self._response.iter_stream():
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                yield line.rstrip(b"\r").decode("utf-8")
        if buf:
            yield buf.decode("utf-8")

    def abort(self) -> None:
        """Wake any blocked read and make the server see a closed connection."""
        self.aborted = True
        for sock in list(self._backend.sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        try:
            if self._cm is not None:
                self._cm.__exit__(None, None, None)
        except Exception:
            pass  # already broken by abort()
        finally:
            self._pool.close()


class CancelWatcher:
    """One lazy daemon thread per server that aborts streams whose ``cancel()`` turns True.

    Idle (blocked on a condition) when nothing is registered; polls every ``interval_s``
    otherwise. ``cancel`` callables must be cheap and thread-safe (e.g. reading an Event/flag).
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._active: dict[int, tuple[Callable[[], bool], AbortableStream]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, cancel: Callable[[], bool], stream: AbortableStream) -> int:
        with self._cond:
            self._next += 1
            self._active[self._next] = (cancel, stream)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="llama-cancel-watcher", daemon=True)
                self._thread.start()
            self._cond.notify()
            return self._next

    def remove(self, key: int) -> None:
        with self._cond:
            self._active.pop(key, None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._active and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                items = list(self._active.items())
            for key, (cancel, stream) in items:
                try:
                    hit = cancel()
                except Exception:
                    hit = True  # a broken cancel check must not leave a stream running forever
                if hit:
                    stream.abort()
                    self.remove(key)
            with self._cond:
                self._cond.wait(self.interval_s)
