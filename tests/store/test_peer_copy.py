"""The peer copy's data path between real processes: bytes equal, a bad digest refused, a copy
resumed mid-file, a source killed mid-copy replaced by the other, and a stalled one overtaken.

Each holder is the store's own file server (`skulk_store.peer_files`) in a process of its own
(`peer_file_server.py`), killed with SIGKILL where a test needs a member to die; the requester is
`skulk_store.rangecopy.FileCopy` (in this process, or in a child: `copyproc.copy_in_child`), and
`peer.copy_file`, which retries one source at a time.
Speed is the bench's business (`bench/bench_peer_copy.py`); these only check what arrives.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_store.copyproc import copy_in_child
from skulk_store.peer import Source, copy_file
from skulk_store.rangecopy import FileCopy, RangeSource

HERE = Path(__file__).parent
TOKEN = "t0ken"
SIZE = 24 << 20
RANGE = 1 << 20


class Holder:
    """A file server process serving `dir` as model `m`."""

    def __init__(self, folder: Path, rate: float = 0.0) -> None:
        argv = [sys.executable, str(HERE / "peer_file_server.py"), str(folder), TOKEN]
        if rate:
            argv += ["--rate", str(rate)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def source(self, name: str, node_id: str) -> RangeSource:
        return RangeSource(node_id, "127.0.0.1", self.port, f"/files/m?file={name}", TOKEN)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.kill()


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, str]:
    folder = tmp_path / "holder"
    folder.mkdir()
    blob = os.urandom(SIZE)
    (folder / "w.bin").write_bytes(blob)
    return folder, hashlib.sha256(blob).hexdigest()


def _when(check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_two_sources_give_the_same_bytes(tmp_path: Path, holders: list[Holder], data: tuple[Path, str]) -> None:
    folder, digest = data
    holders += [Holder(folder), Holder(folder)]
    sources = [h.source("w.bin", f"node-{i}") for i, h in enumerate(holders)]
    part = tmp_path / "req" / "w.bin.part"
    result = FileCopy(part, SIZE, digest, sources, range_bytes=RANGE, in_flight=2).run()
    assert result.status == "ok" and result.digest == digest
    assert part.read_bytes() == (folder / "w.bin").read_bytes()
    assert sum(result.received.values()) == SIZE
    assert not part.with_name("w.bin.part.ranges").exists()


def test_the_copy_in_a_child_process_reports_back(
    tmp_path: Path, holders: list[Holder], data: tuple[Path, str]
) -> None:
    folder, digest = data
    holders += [Holder(folder), Holder(folder)]
    sources = [h.source("w.bin", f"node-{i}") for i, h in enumerate(holders)]
    sources.append(RangeSource("gone", "127.0.0.1", 9, "/files/m?file=w.bin", TOKEN))  # nothing listens
    seen: list[int] = []
    copy = FileCopy(tmp_path / "req" / "w.bin.part", SIZE, digest, sources, seen.append, range_bytes=RANGE)
    result = copy_in_child(copy)
    assert result.status == "ok" and result.digest == digest
    assert (tmp_path / "req" / "w.bin.part").read_bytes() == (folder / "w.bin").read_bytes()
    assert sources[2].broken and "ConnectionRefused" in sources[2].last_error
    assert sources[0].received + sources[1].received == SIZE and seen[-1] == SIZE


def test_the_copy_process_ends_with_the_node_that_started_it(tmp_path: Path, holders: list[Holder]) -> None:
    folder = tmp_path / "holder"
    folder.mkdir()
    (folder / "w.bin").write_bytes(os.urandom(8 << 20))
    slow = Holder(folder, rate=1e6)  # 8 s for the whole file: the parent dies long before
    holders.append(slow)
    job = (
        "import sys; from pathlib import Path; from skulk_store.copyproc import copy_in_child; "
        "from skulk_store.rangecopy import FileCopy, RangeSource; "
        f"src = RangeSource('a', '127.0.0.1', {slow.port}, '/files/m?file=w.bin', {TOKEN!r}); "
        f"copy_in_child(FileCopy(Path({str(tmp_path / 'w.part')!r}), 8 << 20, '0' * 64, [src]))"
    )
    parent = subprocess.Popen([sys.executable, "-c", job])
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    _when(lambda: children.read_text().strip() and (tmp_path / "w.part").exists(), 30)
    child = int(children.read_text().split()[0])
    parent.kill()
    parent.wait(10)
    _when(lambda: not Path(f"/proc/{child}").exists() or "Z" in _state(child), 5)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_wrong_digest_is_refused_and_the_damaged_holder_skipped(
    tmp_path: Path, holders: list[Holder], data: tuple[Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    folder, digest = data
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    blob = bytearray((folder / "w.bin").read_bytes())
    blob[SIZE // 2] ^= 0xFF
    (damaged / "w.bin").write_bytes(bytes(blob))
    bad, good = Holder(damaged), Holder(folder)
    holders += [bad, good]

    part = tmp_path / "req" / "w.bin.part"
    result = FileCopy(part, SIZE, digest, [bad.source("w.bin", "bad")], range_bytes=RANGE).run()
    assert result.status == "mismatch" and result.digest != digest
    assert not part.exists(), "a copy that fails its digest is not kept"

    # through the store's retry: all at once, then one at a time; the damaged one is dropped
    sources = [
        Source(name, f"http://127.0.0.1:{h.port}/files", TOKEN, {}) for name, h in (("bad", bad), ("good", good))
    ]
    reporter = _Reporter()
    staging = tmp_path / "staging"
    caplog.set_level(logging.WARNING, "skulk.store.peer")
    ok = copy_file("m", "w.bin", {"size": SIZE, "sha256": digest}, staging, sources, reporter, lambda *a: None)
    assert ok and (staging / "w.bin").read_bytes() == (folder / "w.bin").read_bytes()
    assert not sources[1].broken
    if "failed SHA-256 verification" in caplog.text:  # the damaged range came from it at first
        assert sources[0].broken, "the holder whose copy fails alone is dropped"


def test_a_copy_resumes_mid_file(tmp_path: Path, holders: list[Holder], data: tuple[Path, str]) -> None:
    folder, digest = data
    slow = Holder(folder, rate=8e6)
    holders.append(slow)
    part = tmp_path / "req" / "w.bin.part"
    src = slow.source("w.bin", "slow")
    killer = threading.Thread(target=lambda: (_when(lambda: src.received >= 8 << 20, 30), slow.kill()))
    killer.start()
    first = FileCopy(part, SIZE, digest, [src], range_bytes=RANGE, in_flight=2).run()
    killer.join()
    assert first.status == "incomplete" and src.broken
    kept = first.received["slow"]
    assert 8 << 20 <= kept < SIZE

    fresh = Holder(folder)
    holders.append(fresh)
    again = FileCopy(part, SIZE, digest, [fresh.source("w.bin", "fresh")], range_bytes=RANGE).run()
    assert again.status == "ok" and again.resumed_bytes >= 8 << 20
    assert again.received["fresh"] == SIZE - again.resumed_bytes, "only the missing ranges crossed"
    assert part.read_bytes() == (folder / "w.bin").read_bytes()


def test_a_source_killed_mid_copy_is_replaced_by_the_other(
    tmp_path: Path, holders: list[Holder], data: tuple[Path, str]
) -> None:
    folder, digest = data
    dying, staying = Holder(folder, rate=4e6), Holder(folder, rate=8e6)
    holders += [dying, staying]
    sources = [dying.source("w.bin", "dying"), staying.source("w.bin", "staying")]
    killer = threading.Thread(target=lambda: (_when(lambda: sources[0].received >= 2 << 20, 30), dying.kill()))
    killer.start()
    part = tmp_path / "req" / "w.bin.part"
    result = FileCopy(part, SIZE, digest, sources, range_bytes=RANGE, in_flight=2).run()
    killer.join()
    assert result.status == "ok", [s.last_error for s in sources]
    assert sources[0].broken and not sources[1].broken
    assert result.received["dying"] >= 2 << 20 and result.received["staying"] > SIZE // 2
    assert part.read_bytes() == (folder / "w.bin").read_bytes()


def test_a_stalled_source_does_not_hold_the_copys_end(
    tmp_path: Path, holders: list[Holder], data: tuple[Path, str]
) -> None:
    """End-game: the member that stalls on its first two ranges (a 1 KB/s link) loses them to the
    other, which fetches them again once it has nothing else to do and is cut off; without it the
    copy waited for the stall's read timeout (30 s), range by range."""
    folder, digest = data
    stalled, fast = Holder(folder, rate=1e3), Holder(folder)
    holders += [stalled, fast]
    sources = [stalled.source("w.bin", "stalled"), fast.source("w.bin", "fast")]
    part = tmp_path / "req" / "w.bin.part"
    started = time.monotonic()
    result = FileCopy(part, SIZE, digest, sources, range_bytes=RANGE, in_flight=2).run()
    took = time.monotonic() - started
    assert result.status == "ok", [s.last_error for s in sources]
    assert took < 15, f"the copy waited {took:.1f} s for the stalled member"
    assert result.raced >= 1 and result.received == {"stalled": 0, "fast": SIZE}, result
    assert not sources[0].broken and not sources[0].failures, "losing the race is not a failure"
    assert part.read_bytes() == (folder / "w.bin").read_bytes()


class _Reporter:
    def update(self, per_file: dict[str, int], progress: object, done: bool = False) -> None:
        pass
