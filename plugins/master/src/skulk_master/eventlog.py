"""Append-only, crash-tolerant log of indexed cluster events.

The kernel persists every indexed event here so a restarted node rebuilds its
state from the latest snapshot plus a tail replay instead of refetching the
whole history.  Payloads are opaque msgpack-able dicts (the kernel owns the
typed <-> dict conversion), so this module imports nothing from the kernel.

Directory layout: ``events.log`` (active; records are
``[u32 big-endian length][msgpack [idx, payload]]``), ``archive-<first>-<last>.log.zst``
(rotated files, zstd level 3; the name carries the index range so replay can
skip them unread) and ``snapshot-<idx>.msgpack.zst`` (zstd msgpack
``{"idx", "state"}``).

Persistence trouble must never take the node down: any OSError, or free space
under a floor, switches the log to *counting-only* mode (appends are accepted
and counted but not written) and the reason is exposed for health checks.
Only programming errors raise.  Not thread-safe: one owner appends and replays.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgpack
import zstandard

log = logging.getLogger(__name__)

Mode = Literal["persisting", "counting_only"]
Opener = Callable[[str, str], BinaryIO]
"""``open(path, mode)``-compatible callable used for every write: the seam for disk-fault tests."""

ACTIVE_NAME = "events.log"
_ARCHIVE_RE = re.compile(r"^archive-(\d+)-(\d+)\.log\.zst$")
_SNAPSHOT_RE = re.compile(r"^snapshot-(\d+)\.msgpack\.zst$")
_TMP_PREFIX = ".tmp-"  # in-progress atomic writes; leftovers are garbage from a crash
_HDR = struct.Struct(">I")
_CHUNK = 1 << 20
_MAX_READ = 64 << 20  # per-read cap, so a garbage length header cannot make us allocate 4 GiB
_ZSTD_LEVEL = 3
Record = tuple[int, dict[str, Any]]
_Scanned = Iterator[tuple[int, dict[str, Any], int]]  # (idx, payload, end offset)


@dataclass(frozen=True, slots=True)
class EventLogStatus:
    """Point-in-time view for health endpoints and diagnostics."""

    mode: Mode
    reason: str | None
    last_idx: int
    bytes_written: int  # record bytes written by this instance since open
    archives: int
    directory: str


def _scan(read: Callable[[int], bytes], limit: int | None = None) -> _Scanned:
    """Yield ``(idx, payload, end_offset)`` per intact record, stopping at ``limit`` bytes.

    Stops quietly at the first record that is incomplete, undecodable, not an
    ``[int, dict]`` pair or not consecutive: after a crash mid-append that is
    exactly the torn tail, and the caller decides whether to truncate it.
    Reads big chunks because per-record ``read()`` calls would dominate replay.
    """
    buf, view, pos, base = b"", memoryview(b""), 0, 0
    expected: int | None = None
    unpackb = msgpack.unpackb
    while limit is None or base + pos < limit:
        avail = len(buf) - pos
        need = 4 - avail
        if avail >= 4:
            end = pos + 4 + _HDR.unpack_from(buf, pos)[0]
            need = end - len(buf)
            if need <= 0:
                try:
                    rec = unpackb(view[pos + 4 : end], strict_map_key=False)
                except Exception:  # corrupt bytes surface as assorted msgpack/Type/Value errors
                    return
                ok = type(rec) is list and len(rec) == 2 and type(rec[0]) is int and isinstance(rec[1], dict)
                if not ok or (expected is not None and rec[0] != expected):
                    return
                expected, pos = rec[0] + 1, end
                yield rec[0], rec[1], base + pos
                continue
        chunk = read(min(max(_CHUNK, need), _MAX_READ))
        if not chunk:
            return
        buf = buf[pos:] + chunk
        view, base, pos = memoryview(buf), base + pos, 0


def _scan_path(path: Path, limit: int | None = None) -> _Scanned:
    """Scan one file, decompressing ``.zst`` archives transparently."""
    with open(path, "rb") as f:
        if path.name.endswith(".zst"):
            yield from _scan(zstandard.ZstdDecompressor().stream_reader(f).read, limit)
        else:
            yield from _scan(f.read, limit)


def iter_records(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Yield ``(idx, payload)`` from one active or archive file; stops at a torn tail."""
    for idx, payload, _ in _scan_path(Path(path)):
        yield idx, payload


def _list_archives(directory: Path) -> list[tuple[int, int]]:
    found = (_ARCHIVE_RE.match(name) for name in os.listdir(directory))
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def _fsync_dir(directory: Path) -> None:
    """Make creates/renames durable; best-effort since some filesystems refuse directory fsync."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class EventLog:
    """Append-only event log with rotation, snapshots, torn-tail repair and graceful degradation."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rotate_bytes: int = 64 << 20,
        fsync_every: int = 1000,
        keep_snapshots: int = 2,
        min_free_bytes: int = 256 << 20,
        free_check_interval: int = 1000,
        opener: Opener | None = None,
    ) -> None:
        if keep_snapshots < 1:
            raise ValueError("keep_snapshots must be >= 1")
        self.directory = Path(directory)
        self._active = self.directory / ACTIVE_NAME
        self._rotate_bytes = rotate_bytes
        self._fsync_every = fsync_every  # 0: no periodic fsync (flush()/close()/rotation still sync)
        self._keep_snapshots = keep_snapshots
        self._min_free = min_free_bytes  # 0 disables the free-space floor
        self._free_check_interval = max(1, free_check_interval)
        self._opener: Opener = opener if opener is not None else open  # type: ignore[assignment]
        self._packer = msgpack.Packer()
        self._fh: BinaryIO | None = None
        self._archives: list[tuple[int, int]] = []
        self._last_idx = -1
        # False only if reading the existing log failed at open: the first append then
        # sets the baseline instead of raising, since we cannot know what was there.
        self._idx_known = False
        self._active_first: int | None = None
        self._active_size = self._bytes_written = self._unsynced = self._since_free_check = 0
        self._mode: Mode = "persisting"
        self._reason: str | None = None
        self._closed = False
        try:
            self._open()
        except OSError as e:
            self._degrade(f"open failed: {e}")
        self._check_free()

    @property
    def last_idx(self) -> int:
        """Highest index appended (persisted, or only counted when degraded); -1 when empty."""
        return self._last_idx

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def degraded_reason(self) -> str | None:
        return self._reason

    def status(self) -> EventLogStatus:
        return EventLogStatus(
            self._mode, self._reason, self._last_idx, self._bytes_written, len(self._archives), str(self.directory)
        )

    def append(self, idx: int, payload: dict[str, Any]) -> None:
        """Append record ``idx``, which must be ``last_idx + 1``.

        Raises ValueError for an out-of-order index or a closed log, and msgpack's
        TypeError/OverflowError for an unencodable payload -- in both modes, so
        bugs do not hide behind a full disk.  Disk trouble only degrades the log.
        """
        if self._closed:
            raise ValueError("append on a closed EventLog")
        if self._idx_known and idx != self._last_idx + 1:
            raise ValueError(f"event index {idx} out of order: expected {self._last_idx + 1}")
        data = self._packer.pack([idx, payload])
        self._last_idx, self._idx_known = idx, True
        if self._mode != "persisting":
            return
        assert self._fh is not None  # invariant: persisting <=> active file open
        try:
            self._fh.write(_HDR.pack(len(data)) + data)
        except OSError as e:
            return self._degrade(f"append of idx {idx} failed: {e}")
        self._active_size += 4 + len(data)
        self._bytes_written += 4 + len(data)
        if self._active_first is None:
            self._active_first = idx
        self._unsynced += 1
        if self._fsync_every and self._unsynced >= self._fsync_every:
            self.flush()
        self._since_free_check += 1
        if self._since_free_check >= self._free_check_interval:
            self._check_free()
        if self._mode == "persisting" and self._active_size > self._rotate_bytes:
            self._rotate()

    def rebase(self, idx: int, state_payload: dict[str, Any]) -> None:
        """Continue at ``idx + 1`` from a State this log did not build (a new master's session).

        A node that becomes master mid-cluster holds State up to ``idx`` from replication, not
        from its own log: the snapshot records that starting point so replay (snapshot + tail)
        still rebuilds it, and what the log held before is archived, never spliced in.
        """
        if self._idx_known and idx == self._last_idx:
            return
        if self._mode == "persisting" and self._active_size:
            self._rotate()
        self.write_snapshot(idx, state_payload)
        self._last_idx, self._idx_known = idx, True

    def flush(self) -> None:
        """Flush and fsync the active file (no-op in counting-only mode)."""
        if self._mode != "persisting" or self._fh is None:
            return
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            self._degrade(f"fsync failed: {e}")
        self._unsynced = 0

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._close_fh()
            self._closed = True

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def replay(self, after_idx: int = -1) -> Iterator[Record]:
        """Yield every persisted record with ``idx > after_idx``: archives, then the active file.

        Files and the active length are fixed when called, so records appended
        while iterating are not seen.  Replay stops (logging an error) at the
        first gap or unreadable file so a caller folding state never silently
        skips a hole.
        """
        self.flush()  # buffered appends must be visible to our own reader
        limit = self._active_size if self._mode == "persisting" else None
        try:
            archives = _list_archives(self.directory)
        except OSError as e:
            log.error("event log replay: cannot list %s: %s", self.directory, e)
            archives = []
        files: list[tuple[Path, int | None]] = [
            (self.directory / f"archive-{a}-{b}.log.zst", None) for a, b in archives if b > after_idx
        ]
        if self._active.exists():  # a missing active file just means "nothing since the last rotation"
            files.append((self._active, limit))
        return self._replay_files(files, after_idx + 1)

    def write_snapshot(self, idx: int, state_payload: dict[str, Any]) -> bool:
        """Atomically write the state as of ``idx`` and keep the newest N; False if not written."""
        if self._mode != "persisting":
            return False
        packed = msgpack.packb({"idx": idx, "state": state_payload})
        blob = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(packed)
        try:
            self._write_atomic(self.directory / f"snapshot-{idx}.msgpack.zst", lambda dst: dst.write(blob))
        except OSError as e:
            self._degrade(f"snapshot {idx} failed: {e}")
            return False
        for _, old in self._snapshots()[self._keep_snapshots :]:
            try:
                old.unlink()
            except OSError as e:
                log.warning("could not prune old snapshot %s: %s", old, e)
        return True

    def latest_snapshot(self) -> tuple[int, dict[str, Any]] | None:
        """Newest readable snapshot as ``(idx, state)``; corrupt ones are skipped with a warning."""
        for idx, path in self._snapshots():
            try:
                raw = zstandard.ZstdDecompressor().decompress(path.read_bytes())
                doc = msgpack.unpackb(raw, strict_map_key=False)
                if not (isinstance(doc, dict) and doc.get("idx") == idx and isinstance(doc.get("state"), dict)):
                    raise ValueError("unexpected snapshot structure")
                return idx, doc["state"]
            except Exception as e:  # any corruption: fall back to an older snapshot
                log.warning("skipping unreadable snapshot %s: %s", path, e)
        return None

    # -- internals ----------------------------------------------------------------

    def _open(self) -> None:
        """Discover archives and last_idx, repair a torn tail, open the active file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.startswith(_TMP_PREFIX):
                (self.directory / name).unlink(missing_ok=True)
        self._archives = _list_archives(self.directory)
        arch_last = self._archives[-1][1] if self._archives else -1
        first: int | None = None
        last: int | None = None
        good_end = size = 0
        if self._active.exists():
            for idx, _, end in _scan_path(self._active):
                first, last, good_end = idx if first is None else first, idx, end
            size = self._active.stat().st_size
            if last is not None and last <= arch_last:  # crash between archiving and resetting
                log.warning("removing %s: records %s..%s are already archived", self._active, first, last)
                self._active.unlink()
                first, last, good_end, size = None, None, 0, 0
        # Known from here on, even if the repair below fails and we degrade.
        self._last_idx, self._idx_known = arch_last if last is None else last, True
        self._active_first, self._active_size = first, good_end
        if good_end < size:
            cut = size - good_end
            log.warning("torn tail in %s: truncating %d bytes at offset %d", self._active, cut, good_end)
            fh = self._opener(str(self._active), "r+b")
            try:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fh.close()
        if first is not None and self._archives and first != arch_last + 1:
            log.warning("index gap: archives end at %d but %s starts at %d", arch_last, self._active, first)
        self._fh = self._opener(str(self._active), "ab")
        _fsync_dir(self.directory)

    def _rotate(self) -> None:
        """Compress the full active file into a named archive, then start a fresh one."""
        assert self._fh is not None and self._active_first is not None
        first, last = self._active_first, self._last_idx
        final = self.directory / f"archive-{first}-{last}.log.zst"
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._close_fh()
            with open(self._active, "rb") as src:
                cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
                self._write_atomic(final, lambda dst: cctx.copy_stream(src, dst))
            # A crash before this truncation leaves duplicates that _open() discards.
            self._fh = self._opener(str(self._active), "wb")
            _fsync_dir(self.directory)
        except OSError as e:
            return self._degrade(f"rotation to {final.name} failed: {e}")
        self._archives.append((first, last))
        self._active_first, self._active_size, self._unsynced = None, 0, 0
        self._check_free()

    def _write_atomic(self, final: Path, fill: Callable[[BinaryIO], object]) -> None:
        """temp + fsync + rename, so readers only ever see complete files."""
        tmp = final.with_name(_TMP_PREFIX + final.name)
        try:
            dst = self._opener(str(tmp), "wb")
            try:
                fill(dst)
                dst.flush()
                os.fsync(dst.fileno())
            finally:
                dst.close()
            os.replace(tmp, final)
        except BaseException:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)

    def _snapshots(self) -> list[tuple[int, Path]]:
        """Snapshot files, newest first."""
        try:
            names = os.listdir(self.directory)
        except OSError as e:
            log.warning("cannot list snapshots in %s: %s", self.directory, e)
            return []
        found = [(int(m[1]), self.directory / name) for name in names if (m := _SNAPSHOT_RE.match(name))]
        return sorted(found, reverse=True)

    def _replay_files(self, files: list[tuple[Path, int | None]], nxt: int) -> Iterator[Record]:
        for path, limit in files:
            try:
                for idx, payload, _ in _scan_path(path, limit):
                    if idx < nxt:  # at or before after_idx, or a leftover duplicate
                        continue
                    if idx > nxt:
                        log.error("event log replay stopped: expected idx %d, %s has %d", nxt, path, idx)
                        return
                    yield idx, payload
                    nxt = idx + 1
            except (OSError, zstandard.ZstdError) as e:
                log.error("event log replay stopped: cannot read %s: %s", path, e)
                return

    def _check_free(self) -> None:
        self._since_free_check = 0
        if self._mode != "persisting" or self._min_free <= 0:
            return
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError as e:
            log.warning("cannot check free space in %s: %s", self.directory, e)
            return
        if free < self._min_free:
            self._degrade(f"free disk space {free} B below floor of {self._min_free} B")

    def _degrade(self, reason: str) -> None:
        """Switch to counting-only mode for this instance's lifetime, loudly, once.

        Not resumed in-process: the file would get an index gap.  A reopen
        (e.g. node restart) retries persisting, and the kernel refetches the gap.
        """
        if self._mode == "counting_only":
            return
        self._mode, self._reason = "counting_only", reason
        log.error("event log %s now counting-only, events are NOT persisted: %s", self.directory, reason)
        self._close_fh()

    def _close_fh(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with suppress(OSError):  # unwritable buffered bytes leave a torn tail the next open repairs
                fh.close()
