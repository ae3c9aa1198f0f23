"""Tests for skulk_master.eventlog: format, rotation, snapshots, torn tails, degradation."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
from collections import namedtuple
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from skulk_master.eventlog import ACTIVE_NAME, EventLog, EventLogStatus, iter_records


def make_log(path: Path, **kw: Any) -> EventLog:
    """Tests default to no free-space floor so they do not depend on the host's disk."""
    kw.setdefault("min_free_bytes", 0)
    return EventLog(path, **kw)


def event(i: int) -> dict[str, Any]:
    return {"TaskCreated": {"taskId": f"t{i}", "n": i, "tags": ["a", i], "blob": b"\x00" * (i % 7)}}


def fill(log: EventLog, start: int, stop: int) -> None:
    for i in range(start, stop):
        log.append(i, event(i))


class FlakyFile:
    """Wraps a real file; writes raise ENOSPC, as on a full disk, when told to."""

    def __init__(self, inner: Any, opener: FaultOpener, broken: bool) -> None:
        self._inner, self._opener, self._broken = inner, opener, broken

    def write(self, data: bytes) -> int:
        if self._broken or self._opener.fail_writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        written: int = self._inner.write(data)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultOpener:
    """open()-compatible opener injected into EventLog to simulate a filling disk.

    ``fail_writes``: every write on every file it opened fails (disk full now).
    ``fail_new``: only files opened from now on fail (e.g. the rotation archive).
    """

    def __init__(self) -> None:
        self.fail_writes = False
        self.fail_new = False

    def __call__(self, path: str, mode: str) -> Any:
        return FlakyFile(open(path, mode), self, broken=self.fail_new)


# -- basic format -------------------------------------------------------------------


def test_round_trip_and_file_format(tmp_path: Path) -> None:
    with make_log(tmp_path) as log:
        assert log.last_idx == -1
        fill(log, 0, 50)
        assert log.last_idx == 49
        assert list(log.replay()) == [(i, event(i)) for i in range(50)]
    raw = (tmp_path / ACTIVE_NAME).read_bytes()
    (n,) = struct.unpack(">I", raw[:4])
    assert msgpack.unpackb(raw[4 : 4 + n]) == [0, event(0)]
    assert list(iter_records(tmp_path / ACTIVE_NAME)) == [(i, event(i)) for i in range(50)]


def test_reopen_keeps_last_idx_and_continues(tmp_path: Path) -> None:
    with make_log(tmp_path) as log:
        fill(log, 0, 10)
    with make_log(tmp_path) as log:
        assert log.last_idx == 9
        fill(log, 10, 20)
    with make_log(tmp_path) as log:
        assert log.last_idx == 19
        assert [i for i, _ in log.replay()] == list(range(20))


def test_wrong_idx_raises(tmp_path: Path) -> None:
    with make_log(tmp_path) as log:
        with pytest.raises(ValueError):
            log.append(1, {})
        log.append(0, {})
        for bad in (0, 2, -1):
            with pytest.raises(ValueError):
                log.append(bad, {})
        assert log.last_idx == 0
        log.append(1, {})
    log.close()
    with pytest.raises(ValueError):
        log.append(2, {})


def test_fsync_every_and_context_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    with make_log(tmp_path, fsync_every=10) as log:
        calls.clear()  # ignore the directory fsync done by open
        fill(log, 0, 25)
        assert len(calls) == 2
    assert len(calls) == 3  # close() syncs the remainder


# -- rotation / replay --------------------------------------------------------------


def test_rotation_creates_archives_and_replay_spans_them(tmp_path: Path) -> None:
    with make_log(tmp_path, rotate_bytes=2_000) as log:
        fill(log, 0, 300)
        assert log.status().archives >= 2
        assert list(log.replay()) == [(i, event(i)) for i in range(300)]
    archives = sorted(tmp_path.glob("archive-*.log.zst"))
    assert archives and not list(tmp_path.glob(".tmp-*"))
    first = archives[0].name
    assert first.startswith("archive-0-")
    records = list(iter_records(archives[0]))
    assert records[0][0] == 0 and f"archive-0-{records[-1][0]}.log.zst" == first
    with make_log(tmp_path, rotate_bytes=2_000) as log:  # reopen discovers archives
        assert log.last_idx == 299
        fill(log, 300, 310)
        assert [i for i, _ in log.replay()] == list(range(310))


def test_replay_after_idx_skips_archives_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with make_log(tmp_path, rotate_bytes=2_000) as log:
        fill(log, 0, 300)
        assert [i for i, _ in log.replay(after_idx=150)] == list(range(151, 300))
        assert list(log.replay(after_idx=299)) == []
        # Corrupt every archive wholly below 250: replay must not open them.
        for a in tmp_path.glob("archive-*.log.zst"):
            if int(a.name.split("-")[2].split(".")[0]) <= 250:
                a.write_bytes(b"garbage")
        assert [i for i, _ in log.replay(after_idx=250)] == list(range(251, 300))


def test_replay_stops_at_gap_from_corrupt_archive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with make_log(tmp_path, rotate_bytes=2_000) as log:
        fill(log, 0, 300)
    archives = sorted(tmp_path.glob("archive-*.log.zst"), key=lambda p: int(p.name.split("-")[1]))
    archives[1].write_bytes(b"not zstd")
    with make_log(tmp_path, rotate_bytes=2_000) as log:
        got = [i for i, _ in log.replay()]
    first_bad = int(archives[1].name.split("-")[1])
    assert got == list(range(first_bad))
    assert "replay stopped" in caplog.text


def test_interrupted_rotation_leftover_is_discarded(tmp_path: Path) -> None:
    """Crash after the archive rename but before the active file reset: no duplicates."""
    with make_log(tmp_path) as log:
        fill(log, 0, 20)
    active = tmp_path / ACTIVE_NAME
    import zstandard

    (tmp_path / "archive-0-19.log.zst").write_bytes(zstandard.compress(active.read_bytes(), 3))
    with make_log(tmp_path) as log:
        assert log.last_idx == 19
        assert not active.exists() or active.stat().st_size == 0
        fill(log, 20, 25)
        assert [i for i, _ in log.replay()] == list(range(25))


# -- snapshots ----------------------------------------------------------------------


def fold(state: dict[str, Any], idx: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Toy state machine: count events per task and remember the last index."""
    tid = payload["TaskCreated"]["taskId"]
    tasks = dict(state.get("tasks", {}))
    tasks[tid] = tasks.get(tid, 0) + payload["TaskCreated"]["n"]
    return {"tasks": tasks, "last": idx}


def test_snapshot_plus_tail_equals_full_replay(tmp_path: Path) -> None:
    with make_log(tmp_path, rotate_bytes=3_000) as log:
        state: dict[str, Any] = {}
        for i in range(400):
            payload = {"TaskCreated": {"taskId": f"t{i % 13}", "n": i}}
            log.append(i, payload)
            state = fold(state, i, payload)
            if i == 250:
                assert log.write_snapshot(i, state)
    with make_log(tmp_path) as log:
        full: dict[str, Any] = {}
        for i, p in log.replay():
            full = fold(full, i, p)
        snap = log.latest_snapshot()
        assert snap is not None and snap[0] == 250
        idx, resumed = snap
        for i, p in log.replay(after_idx=idx):
            resumed = fold(resumed, i, p)
    assert resumed == full == state


def test_snapshot_retention_and_corrupt_fallback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with make_log(tmp_path, keep_snapshots=2) as log:
        assert log.latest_snapshot() is None
        for idx in (10, 20, 30):
            assert log.write_snapshot(idx, {"at": idx})
        names = sorted(p.name for p in tmp_path.glob("snapshot-*"))
        assert names == ["snapshot-20.msgpack.zst", "snapshot-30.msgpack.zst"]
        assert log.latest_snapshot() == (30, {"at": 30})
        (tmp_path / "snapshot-30.msgpack.zst").write_bytes(b"\x28\xb5\x2f\xfd truncated")
        with caplog.at_level(logging.WARNING):
            assert log.latest_snapshot() == (20, {"at": 20})
        assert "snapshot-30" in caplog.text
        (tmp_path / "snapshot-20.msgpack.zst").write_bytes(b"")
        assert log.latest_snapshot() is None
    assert not list(tmp_path.glob(".tmp-*"))


# -- torn tails ---------------------------------------------------------------------


def _tear(path: Path, how: str) -> None:
    raw = path.read_bytes()
    last_len = 4 + len(msgpack.packb([9, event(9)]))
    if how == "header":
        path.write_bytes(raw[: -last_len + 2])  # 2 of the 4 header bytes survive
    elif how == "payload":
        path.write_bytes(raw[:-3])
    elif how == "undecodable":  # complete-looking record whose payload is not msgpack
        path.write_bytes(raw[:-last_len] + struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    elif how == "garbage":
        path.write_bytes(raw + b"\xde\xad\xbe\xef\x00\x01garbage")


@pytest.mark.parametrize("how", ["header", "payload", "undecodable", "garbage"])
def test_torn_tail_is_truncated(tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    with make_log(tmp_path) as log:
        fill(log, 0, 10)
    active = tmp_path / ACTIVE_NAME
    _tear(active, how)
    expected_last = 9 if how == "garbage" else 8
    with caplog.at_level(logging.WARNING):
        log = make_log(tmp_path)
    assert "torn tail" in caplog.text
    assert log.mode == "persisting"
    assert log.last_idx == expected_last
    fill(log, expected_last + 1, expected_last + 6)
    log.close()
    with make_log(tmp_path) as log:
        assert [i for i, _ in log.replay()] == list(range(expected_last + 6))
        assert log.last_idx == expected_last + 5


def test_fully_torn_first_record(tmp_path: Path) -> None:
    (tmp_path / ACTIVE_NAME).write_bytes(b"\x00\x00")
    with make_log(tmp_path) as log:
        assert log.last_idx == -1
        log.append(0, {"x": 1})
        assert list(log.replay()) == [(0, {"x": 1})]


# -- degradation --------------------------------------------------------------------


def test_enospc_on_append_degrades_to_counting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    opener = FaultOpener()
    log = make_log(tmp_path, opener=opener, fsync_every=0)
    fill(log, 0, 5)
    log.flush()
    opener.fail_writes = True  # the disk fills up now
    with caplog.at_level(logging.ERROR):
        fill(log, 5, 20)  # must not raise
    assert log.mode == "counting_only"
    assert log.last_idx == 19
    assert log.degraded_reason and "No space left" in log.degraded_reason
    st_ = log.status()
    assert isinstance(st_, EventLogStatus)
    assert (st_.mode, st_.last_idx, st_.directory) == ("counting_only", 19, str(tmp_path))
    assert st_.reason == log.degraded_reason
    assert sum("counting-only" in r.message for r in caplog.records if r.levelno == logging.ERROR) == 1
    assert log.write_snapshot(19, {}) is False
    with pytest.raises(ValueError):
        log.append(99, {})  # programming errors still raise
    log.close()
    with make_log(tmp_path) as log:  # what made it to disk survives; the log recovers on reopen
        assert log.mode == "persisting"
        assert [i for i, _ in log.replay()] == list(range(5))


def test_enospc_during_rotation_and_snapshot(tmp_path: Path) -> None:
    opener = FaultOpener()
    log = make_log(tmp_path, opener=opener, rotate_bytes=1_000)
    fill(log, 0, 5)
    opener.fail_new = True  # new files (archive temp) fail; the live handle still works
    fill(log, 5, 100)
    assert log.mode == "counting_only" and "rotation" in (log.degraded_reason or "")
    assert log.last_idx == 99
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob("archive-*"))
    persisted = [i for i, _ in log.replay()]  # everything written before the failed rotation
    assert persisted == list(range(len(persisted))) and len(persisted) >= 5
    log.close()
    with make_log(tmp_path, rotate_bytes=1_000) as log:  # reopen retries and rotates fine
        assert log.mode == "persisting" and log.last_idx == len(persisted) - 1
        fill(log, len(persisted), len(persisted) + 50)
        assert [i for i, _ in log.replay()] == list(range(len(persisted) + 50))

    other = tmp_path / "snap"
    opener2 = FaultOpener()
    log = make_log(other, opener=opener2)
    fill(log, 0, 3)
    opener2.fail_new = True
    assert log.write_snapshot(2, {"s": 1}) is False
    assert log.mode == "counting_only" and "snapshot" in (log.degraded_reason or "")
    log.append(3, {})
    assert log.last_idx == 3
    log.close()


def test_enospc_at_open(tmp_path: Path) -> None:
    with make_log(tmp_path) as log:
        fill(log, 0, 7)

    def opener(path: str, mode: str) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    log = make_log(tmp_path, opener=opener)
    assert log.mode == "counting_only"
    assert "open failed" in (log.degraded_reason or "")
    assert log.last_idx == 6  # still learned from the existing files
    fill(log, 7, 12)
    assert log.last_idx == 11
    assert [i for i, _ in log.replay()] == list(range(7))
    log.close()


def test_unreadable_directory_at_open(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    log = make_log(blocker / "log")
    assert log.mode == "counting_only"
    log.append(500, {})  # index unknown: the first append sets the baseline
    log.append(501, {})
    assert log.last_idx == 501
    assert list(log.replay()) == []
    log.close()


Usage = namedtuple("Usage", "total used free")


def test_free_space_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    free = {"v": 10 << 30}
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100 << 30, 0, free["v"]))
    log = EventLog(tmp_path, min_free_bytes=1 << 20, free_check_interval=10)
    assert log.mode == "persisting"
    fill(log, 0, 5)
    free["v"] = 1000
    fill(log, 5, 9)
    assert log.mode == "persisting"  # not checked yet: at most every 10 appends
    fill(log, 9, 30)
    assert log.mode == "counting_only"
    assert "free disk space" in (log.degraded_reason or "")
    assert log.last_idx == 29
    log.close()
    assert EventLog(tmp_path, min_free_bytes=1 << 20).mode == "counting_only"  # checked at open
    disabled = EventLog(tmp_path, min_free_bytes=0)
    assert disabled.mode == "persisting"
    disabled.close()


# -- property -----------------------------------------------------------------------

_ints = st.integers(-(2**63), 2**64 - 1)  # msgpack's integer range
_scalars = (
    st.none() | st.booleans() | _ints | st.text(max_size=20) | st.binary(max_size=40) | st.floats(allow_nan=False)
)
_values = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8) | _ints, kids, max_size=4),
    max_leaves=12,
)
_payloads = st.dictionaries(st.text(max_size=10), _values, max_size=4)


@settings(
    max_examples=30,  # ~1.3 s each on the CI machine (small rotation sizes: a synced file per few records)
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],  # slow only on a loaded box
)
@given(payloads=st.lists(_payloads, max_size=120), rotate=st.integers(1, 4_000), reopen_at=st.integers(0, 120))
def test_property_replay_returns_what_was_appended(
    tmp_path_factory: pytest.TempPathFactory, payloads: list[dict[str, Any]], rotate: int, reopen_at: int
) -> None:
    d = tmp_path_factory.mktemp("prop")
    log = make_log(d, rotate_bytes=rotate)
    for i, p in enumerate(payloads):
        if i == reopen_at:
            log.close()
            log = make_log(d, rotate_bytes=rotate)
        log.append(i, p)
    assert list(log.replay()) == list(enumerate(payloads))
    log.close()
    with make_log(d, rotate_bytes=rotate) as log:
        assert log.last_idx == len(payloads) - 1
        assert list(log.replay()) == list(enumerate(payloads))
        k = len(payloads) // 2
        assert list(log.replay(after_idx=k - 1)) == list(enumerate(payloads))[k:]


def test_rebase_continues_a_replicated_state(tmp_path):
    """A follower that becomes master starts its log at its replicated index, not at 0."""
    log = EventLog(tmp_path / "log")
    log.append(0, {"n": 0})
    log.rebase(41, {"state": "replicated at 41"})
    log.append(42, {"n": 42})
    with pytest.raises(ValueError):
        log.append(44, {"n": 44})
    snap = log.latest_snapshot()
    assert snap == (41, {"state": "replicated at 41"})
    assert [idx for idx, _ in log.replay(after_idx=41)] == [42]
    log.close()
    reopened = EventLog(tmp_path / "log")
    assert reopened.last_idx == 42
    reopened.close()
