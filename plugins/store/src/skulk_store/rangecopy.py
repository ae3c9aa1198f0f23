"""The requester's data path of a peer copy: one file, in byte ranges, from several members at once.

What makes it run at the wire's speed rather than Python's:

* **Straight into the file.** The file is preallocated (`posix_fallocate`) and every connection
  moves each response body into its place in the file: on Linux socket -> pipe -> file with
  `os.splice` (no copy through Python, one copy into the page cache), elsewhere `recv_into` one
  reused buffer and `os.pwrite` at the offset (nothing allocated per block). (An HTTP client
  library parses and copies each block, a few times; the responses here are plain
  `Content-Length` bodies from our own file server, so a small HTTP/1.1 reader is enough.)
* **Several ranges in flight per source**, each on its own keep-alive connection, so the round trip
  between two ranges never idles the link, and **every source at once**: the ranges are handed out
  in file order to whichever connection is free, so faster members take more.
* **The SHA-256 overlaps the transfer.** A hashing thread follows the contiguous prefix of finished
  ranges and hashes it from the page cache (through a read-only mapping: no copy) while later
  ranges are still arriving; when the last range lands only that range's tail is left to hash.
* **Resume.** The finished ranges are recorded next to the partial file (`<part>.ranges`, rewritten
  every half second); a copy interrupted by a kill, or by every source failing, continues from
  there with whatever sources are available next time. A record that names another size or digest
  is ignored.
* **A source that fails** (refused, closed, timed out) gives its range back to the others; after
  `MAX_FAILURES` it is dropped. An HTTP refusal (403: the token is no longer valid) drops it at once.
* **End-game.** Once no range is left to hand out, a connection with nothing to do fetches again a
  range that has been in flight on another member for several times a typical range's time: a slow
  or stalled member no longer holds the copy's end (a stall would hold it `READ_TIMEOUT_S`). The
  first to finish wins and the other is cut off. Both write into the same place in the file, so a
  write is let in only while the range is unfinished, and the hash of a range waits until no write
  into it is under way: nothing lands in a range after it was hashed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import mmap
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger("skulk.store.rangecopy")
RANGE_BYTES = 8 << 20
IN_FLIGHT_PER_SOURCE = 2
RECV_BYTES = 1 << 20  # small enough to stay in the CPU's cache between the read and the write
HASH_BYTES = 1 << 20
#: Linux moves socket bytes into the file with splice(2) through a pipe; elsewhere recv_into + pwrite
SPLICE = hasattr(os, "splice") and os.environ.get("SKULK_PEER_SPLICE", "1") != "0"
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
MAX_FAILURES = 3
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0
RECORD_EVERY_S = 0.5
STRAGGLER_FACTOR = 3.0  # in flight this many times the recent ranges' median: fetch it again
STRAGGLER_MIN_S = 0.25


class Refusal(Exception):
    """The source answered, but not with the range: a definitive no."""


class Overtaken(Exception):
    """Another member finished this range first (end-game): stop writing it; not a failure."""


@dataclass
class RangeSource:
    """One member's file server, for one file: where to connect, what to ask, with which token."""

    node_id: str
    host: str
    port: int
    target: str  # the request target: "/files/{model_id}?file=NAME"
    token: str
    received: int = 0
    failures: int = 0
    broken: bool = False
    last_error: str = ""


@dataclass
class CopyResult:
    status: Literal["ok", "mismatch", "incomplete"]
    digest: str = ""
    resumed_bytes: int = 0  # bytes a previous, interrupted copy had already written
    received: dict[str, int] = field(default_factory=dict)  # node id -> bytes of the file it gave
    raced: int = 0  # ranges fetched a second time from another member (end-game)


class _Connection:
    """A keep-alive HTTP/1.1 connection to one source that reads range bodies into a file."""

    def __init__(self, src: RangeSource) -> None:
        self.src = src
        self.sock: socket.socket | None = None
        self.since = 0.0  # when its current range was handed to it
        self.cut_off = False  # its current range was finished by another connection
        self.pipe: tuple[int, int] | None = None
        if SPLICE:
            self.pipe = os.pipe()
            with contextlib.suppress(OSError):  # a larger pipe: fewer calls (the default is 64 KiB)
                fcntl.fcntl(self.pipe[1], F_SETPIPE_SZ, PIPE_BYTES)

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        if self.pipe is not None:  # bytes left in the pipe belong to a range that failed
            for end in self.pipe:
                os.close(end)
            self.pipe = os.pipe()
            with contextlib.suppress(OSError):
                fcntl.fcntl(self.pipe[1], F_SETPIPE_SZ, PIPE_BYTES)

    def cut(self) -> None:
        """From another thread: end a fetch blocked on this connection's socket (its range is done).
        A fetch not yet connected sees `cut_off` once it is (flag first, socket second: one of the two
        threads sees the other's write)."""
        self.cut_off = True
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        self.close()
        if self.pipe is not None:
            for end in self.pipe:
                os.close(end)
            self.pipe = None

    def fetch(
        self, start: int, end: int, fd: int, buf: memoryview, writing: Callable[[], bool], wrote: Callable[[], None]
    ) -> int:
        """Range `start`-`end` into `fd`; each write into the file between `writing()` (False: the
        range was finished by another member, raise `Overtaken`) and `wrote()`."""
        src = self.src
        if self.sock is None:
            self.sock = socket.create_connection((src.host, src.port), timeout=CONNECT_TIMEOUT_S)
            # blocking, with the kernel's own timeouts: a Python-level timeout makes every read a
            # poll and a non-blocking read, with the GIL taken between the two
            self.sock.settimeout(None)
            stall = struct.pack("ll", int(READ_TIMEOUT_S), 0)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, stall)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.sock
        if self.cut_off:
            raise Overtaken
        sock.sendall(
            f"GET {src.target} HTTP/1.1\r\nHost: {src.host}:{src.port}\r\n"
            f"Authorization: Bearer {src.token}\r\nRange: bytes={start}-{end}\r\n\r\n".encode()
        )
        status, headers, extra = self._head(sock)
        length = int(headers.get("content-length", "-1"))
        if status != 206:
            body = extra + (sock.recv(min(max(length - len(extra), 0), 4096)) if length > len(extra) else b"")
            self.close()
            raise Refusal(f"{status} {body[:300].decode(errors='replace')}")
        if length != end - start + 1 or not headers.get("content-range", "").startswith(f"bytes {start}-{end}/"):
            self.close()
            raise ConnectionError(f"asked bytes {start}-{end}, got {length} bytes ({headers.get('content-range')})")
        offset = start
        if extra:
            if not writing():
                raise Overtaken
            try:
                _pwrite_all(fd, memoryview(extra), offset)
            finally:
                wrote()
            offset += len(extra)
        stop = end + 1
        while offset < stop:
            if self.pipe is not None:  # socket -> pipe -> file in the kernel: no copy through Python
                n = os.splice(sock.fileno(), self.pipe[1], min(PIPE_BYTES, stop - offset))
            else:
                n = sock.recv_into(buf, min(len(buf), stop - offset))
            if not n:
                self.close()
                raise ConnectionError(f"the source closed the connection {stop - offset} bytes before the range's end")
            if not writing():
                raise Overtaken
            try:
                if self.pipe is not None:
                    self._drain(fd, n, offset)
                else:
                    _pwrite_all(fd, buf[:n], offset)  # while the block is still in the CPU's cache
            finally:
                wrote()
            offset += n
        if headers.get("connection", "").lower() == "close":
            self.close()
        return length

    def _drain(self, fd: int, n: int, offset: int) -> None:
        """The `n` bytes in the pipe into the file at `offset`; through a buffer where the file's
        filesystem refuses splice (then no more splicing on this connection)."""
        assert self.pipe is not None
        left = n
        try:
            while left:
                left -= os.splice(self.pipe[0], fd, left, offset_dst=offset + n - left)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            while left:
                block = os.read(self.pipe[0], left)
                _pwrite_all(fd, memoryview(block), offset + n - left)
                left -= len(block)
            for end in self.pipe:
                os.close(end)
            self.pipe = None

    @staticmethod
    def _head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            block = sock.recv(65536)
            if not block:
                raise ConnectionError("the source closed the connection before answering")
            data += block
            if len(data) > 65536:
                raise ConnectionError("the source's answer has no end of headers")
        head, _, extra = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return int(parts[1]), headers, extra


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


class FileCopy:
    """Copy one file of `size` bytes with SHA-256 `sha256` into `part` from `sources`; `run()` once."""

    def __init__(
        self,
        part: Path,
        size: int,
        sha256: str,
        sources: list[RangeSource],
        on_progress: Callable[[int], None] | None = None,
        range_bytes: int = RANGE_BYTES,
        in_flight: int = IN_FLIGHT_PER_SOURCE,
        endgame: bool = True,
    ) -> None:
        self.part, self.size, self.sha256 = part, size, sha256
        self.endgame = endgame  # off only to measure what it is worth (bench_peer_copy.py)
        self.record = part.with_name(part.name + ".ranges")
        self.sources = sources
        self.on_progress = on_progress or (lambda done: None)
        self.range_bytes, self.in_flight = range_bytes, in_flight
        self.n = -(-size // range_bytes)
        self.done = bytearray(self.n)
        self.pending: deque[int] = deque()
        self.fetching: dict[int, list[_Connection]] = {}  # range in flight -> the connections fetching it
        self.took: deque[float] = deque(maxlen=16)  # the last finished ranges' times
        self.writers = [0] * self.n  # writes into each range under way
        self.raced = 0
        self.done_bytes = 0
        self.cond = threading.Condition()
        self.stopped = False

    def _bounds(self, i: int) -> tuple[int, int]:
        return i * self.range_bytes, min((i + 1) * self.range_bytes, self.size) - 1

    # ------------------------------------------------------------------ resume record

    def _load(self) -> int:
        """Mark the ranges a previous copy finished (its record must match); the bytes they hold."""
        try:
            rec = json.loads(self.record.read_text())
            matches = (rec["size"], rec["sha256"], rec["range_bytes"]) == (self.size, self.sha256, self.range_bytes)
            if matches and self.part.stat().st_size == self.size:
                for i in rec["done"]:
                    if 0 <= int(i) < self.n:
                        self.done[int(i)] = 1
        except (OSError, ValueError, KeyError, TypeError):
            pass
        resumed = sum(self._bounds(i)[1] - self._bounds(i)[0] + 1 for i in range(self.n) if self.done[i])
        if not resumed:
            self.part.unlink(missing_ok=True)
        return resumed

    def _save(self) -> None:
        with self.cond:
            done = [i for i in range(self.n) if self.done[i]]
        rec = {"size": self.size, "sha256": self.sha256, "range_bytes": self.range_bytes, "done": done}
        tmp = self.record.with_name(self.record.name + ".tmp")
        tmp.write_text(json.dumps(rec, separators=(",", ":")))
        os.replace(tmp, self.record)

    def discard(self) -> None:
        self.part.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)

    # ------------------------------------------------------------------ work

    def _take(self, conn: _Connection) -> int | None:
        with self.cond:
            while True:
                if conn.src.broken or self.stopped:
                    return None
                raced = None if self.pending or not self.endgame else self._straggler(conn.src)
                if self.pending:
                    i = self.pending.popleft()
                elif raced is not None:
                    i = raced
                    self.raced += 1
                elif not self.fetching:
                    return None
                else:  # a range in flight may fail (back to pending) or turn into a straggler
                    self.cond.wait(0.1)
                    continue
                self.fetching.setdefault(i, []).append(conn)
                conn.since, conn.cut_off = time.monotonic(), False
                return i

    def _straggler(self, src: RangeSource) -> int | None:
        """The oldest range in flight on another member alone, for longer than several times the
        recent ranges' median: the end-game's second fetch. None while there is none (call locked)."""
        typical = sorted(self.took)[len(self.took) // 2] if self.took else STRAGGLER_MIN_S
        late = time.monotonic() - max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * typical)
        for i in sorted(self.fetching):
            conns = self.fetching[i]
            if len(conns) == 1 and conns[0].src is not src and conns[0].since <= late:
                return i
        return None

    def _writing(self, i: int) -> bool:
        with self.cond:
            if self.done[i]:
                return False
            self.writers[i] += 1
            return True

    def _wrote(self, i: int) -> None:
        with self.cond:
            self.writers[i] -= 1
            if not self.writers[i]:
                self.cond.notify_all()

    def _finish(self, i: int, conn: _Connection, got: int) -> None:
        """`conn` is done with range `i`: `got` bytes (0: it failed or was overtaken)."""
        with self.cond:
            others = self.fetching.pop(i, [])
            others.remove(conn)
            if others:
                self.fetching[i] = others
            if got and not self.done[i]:
                self.done[i] = 1
                self.done_bytes += got
                conn.src.received += got
                self.took.append(time.monotonic() - conn.since)
                for other in others:  # the end-game's loser, mid-range: cut off
                    other.cut()
            elif not got and not self.done[i] and not others:
                self.pending.appendleft(i)  # next to be taken: the hash waits for it
            self.cond.notify_all()

    def _worker(self, src: RangeSource, fd: int) -> None:
        conn = _Connection(src)
        buf = memoryview(bytearray(RECV_BYTES))
        try:
            while (i := self._take(conn)) is not None:
                start, end = self._bounds(i)
                try:
                    got = conn.fetch(start, end, fd, buf, lambda: self._writing(i), lambda: self._wrote(i))
                except Exception as exc:
                    conn.close()  # the rest of the body is still coming: this connection is spent
                    with self.cond:
                        if not self.done[i]:  # overtaken (or cut off) by the end-game is no failure
                            src.failures += 1
                            src.last_error = f"{type(exc).__name__}: {exc}"
                            if isinstance(exc, Refusal) or src.failures >= MAX_FAILURES:
                                if not src.broken:
                                    log.warning("dropping source %s: %s", src.node_id[:8], src.last_error)
                                src.broken = True
                    self._finish(i, conn, 0)
                    continue
                self._finish(i, conn, got)
        finally:
            conn.release()

    def _hasher(self, digest: hashlib._Hash) -> None:
        """Hash the file in order, each range as soon as it and every range before it have landed.

        It reads through a read-only mapping of the file: the hash takes the bytes from the page
        cache where the copy put them, with no copy into a buffer first (about a tenth of the
        copy's CPU time on a 1 GB file)."""
        if not self.size:
            return
        with open(self.part, "rb") as f, mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for i in range(self.n):
                    with self.cond:
                        while not self.done[i] or self.writers[i]:  # a loser's last write included
                            if self.stopped:
                                return
                            self.cond.wait(0.5)
                    start, end = self._bounds(i)
                    for at in range(start, end + 1, HASH_BYTES):
                        digest.update(view[at : min(at + HASH_BYTES, end + 1)])
            finally:
                view.release()

    def run(self) -> CopyResult:
        self.part.parent.mkdir(parents=True, exist_ok=True)
        resumed = self._load()
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != self.size:
                os.ftruncate(fd, 0)
                if self.size:  # the blocks reserved up front: no growth, no fragments, ENOSPC now
                    with contextlib.suppress(OSError):  # a filesystem without it: a sparse file
                        os.posix_fallocate(fd, 0, self.size)
                os.ftruncate(fd, self.size)
            self.pending.extend(i for i in range(self.n) if not self.done[i])
            self.done_bytes = resumed
            digest = hashlib.sha256()
            hash_error: list[BaseException] = []

            def hash_all() -> None:
                try:
                    self._hasher(digest)
                except BaseException as exc:  # reported as a failed copy below
                    hash_error.append(exc)

            hasher = threading.Thread(target=hash_all, name="peer-copy-hash", daemon=True)
            hasher.start()
            workers = [
                threading.Thread(target=self._worker, args=(src, fd), name=f"peer-copy-{src.node_id[:8]}", daemon=True)
                for src in self.sources
                if not src.broken
                for _ in range(self.in_flight)
            ]
            for t in workers:
                t.start()
            saved = time.monotonic()
            while alive := [t for t in workers if t.is_alive()]:
                alive[0].join(0.1)
                if time.monotonic() - saved >= RECORD_EVERY_S:
                    saved = time.monotonic()
                    self._save()
                    self.on_progress(self.done_bytes)
            complete = all(self.done)
            if not complete:
                with self.cond:
                    self.stopped = True
                    self.cond.notify_all()
            hasher.join()
            self._save()
            self.on_progress(self.done_bytes)
        finally:
            os.close(fd)
        received = {s.node_id: s.received for s in self.sources}
        if not complete or hash_error:
            return CopyResult("incomplete", resumed_bytes=resumed, received=received, raced=self.raced)
        if digest.hexdigest() != self.sha256:
            self.discard()
            return CopyResult("mismatch", digest.hexdigest(), resumed, received, self.raced)
        self.record.unlink(missing_ok=True)
        return CopyResult("ok", digest.hexdigest(), resumed, received, self.raced)
