"""The data-plane upload protocol on its own: pieces, the receiver's verification and spooling, the
runner's wait, and the shared per-node receiver, with a kind defined here, a fake node and a real
`StreamRouter` (no model, no network; the real paths are tests/speech and tests/media)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_api_control import uploads
from skulk_kernel.api import AudioChunk, CommandId, ErrorChunk, MediaChunk, Services, StreamRouter
from skulk_kernel.events import InstanceDeleted, TaskDeleted

PIECE = uploads.PIECE_BYTES


class BlobError(uploads.UploadError):
    pass


def _piece(*, whole: bytes, tag: str = "", **fields: Any) -> MediaChunk:
    last = fields["finish_reason"] is not None
    return MediaChunk(
        mime=f"application/x-{tag or 'blob'}", sha256=hashlib.sha256(whole).hexdigest() if last else "", **fields
    )


BLOB = uploads.UploadKind(
    suffix="blob",
    noun="upload",
    waited_noun="test blob",
    spool_env="SKULK_TEST_BLOB_SPOOL",
    spool_folder="skulk-test-blob",
    file_suffix=".blob",
    error=BlobError,
    task_kinds=frozenset({"BlobTask"}),
    declared=lambda task: (task.sha256, task.size) if task.sha256 else None,
    make_piece=_piece,
    accepts=lambda chunk: isinstance(chunk, MediaChunk),
)


@dataclass
class BlobTask:
    sha256: str
    size: int
    task_id: str = "t1"
    command_id: str = "c1"
    instance_id: str = "i1"
    status: str = "Running"


@dataclass
class TaskCreated:  # the receiver dispatches on the event's class name
    task: Any


def _instance(*nodes: str) -> Any:
    return SimpleNamespace(shard_assignments=SimpleNamespace(node_to_runner={n: f"r-{n}" for n in nodes}))


class _Node:
    """Just enough of a NodeSurface: its id, State, stream router, spawned tasks, services."""

    def __init__(self, *runner_nodes: str, tasks: dict[str, Any] | None = None) -> None:
        self.node_id = "n1"
        self.state = SimpleNamespace(instances={"i1": _instance(*runner_nodes)}, tasks=tasks or {})
        self.streams = StreamRouter(idle_timeout=5)
        self.services = Services()
        self.spawned: list[asyncio.Task[Any]] = []
        self.sent: list[tuple[str, Any]] = []

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.spawned.append(task)
        return task

    async def wait_for(self, predicate: Any, timeout: float) -> Any:
        assert predicate(self.state)
        return self.state

    async def send_chunk(self, owner: str, chunk: Any) -> None:
        self.sent.append((owner, chunk))


@pytest.fixture(autouse=True)
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKULK_TEST_BLOB_SPOOL", str(tmp_path))
    return tmp_path


def _data(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(size))


def _wait(task: BlobTask, sha256: str | None = None, timeout_s: float = 2) -> bytes:
    return uploads.wait_for_file(BLOB, "i1", task.command_id, sha256 or task.sha256, timeout_s, lambda: False)


@pytest.mark.parametrize(("size", "count"), [(0, 1), (1, 1), (PIECE, 1), (PIECE + 1, 2)])
def test_pieces_round_trip(size: int, count: int) -> None:
    data = _data(size)
    got = uploads.pieces(BLOB, "c1", data, tag="png")
    assert len(got) == count and [p.seq for p in got] == list(range(count))
    assert all(p.command_id == "c1/blob" and p.mime == "application/x-png" for p in got)
    assert [p.finish_reason for p in got] == [None] * (count - 1) + ["stop"]
    assert [p.sha256 for p in got] == [""] * (count - 1) + [hashlib.sha256(data).hexdigest()]
    assert b"".join(base64.b64decode(p.data) for p in got) == data


def test_spool_paths_derive_from_ids_alone(spool: Path) -> None:
    done, error = BLOB.spool_paths("i1", "c1")
    name = hashlib.sha256(b"c1").hexdigest()[:32]
    assert (done, error) == (spool / "i1" / f"{name}.blob", spool / "i1" / f"{name}.error")
    assert BLOB.stream_id("c1") == CommandId("c1/blob")


async def _receive(task: BlobTask, chunks: list[Any], max_bytes: int = 10**7) -> _Node:
    node = _Node("n1")
    receiver = uploads.Receiver(BLOB, node, max_bytes, timeout_s=5)  # type: ignore[arg-type]
    receiver.on_task_created(task)
    receiver.on_task_created(task)  # a second plugin forwarding the same event opens nothing more
    assert len(node.spawned) == 1
    for chunk in reversed(chunks):  # out of order: the stream reorders by seq
        node.streams.deliver(chunk)
    await asyncio.wait_for(asyncio.gather(*node.spawned), 5)
    assert node.streams.open_ids() == [] and receiver.receiving == {} and receiver._streams == {}
    return node


async def test_the_receiver_spools_a_verified_upload_and_the_runner_reads_it_once(spool: Path) -> None:
    data = _data(PIECE * 2 + 5)
    task = BlobTask(hashlib.sha256(data).hexdigest(), len(data))
    await _receive(task, uploads.pieces(BLOB, "c1", data))
    assert await asyncio.to_thread(_wait, task) == data
    assert not any(spool.rglob("*.blob")) and not any(spool.rglob("*.part"))


def _short(chunks: list[Any]) -> list[Any]:
    return [chunks[0], chunks[2].model_copy(update={"seq": 1})]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("over the node's limit", "accepts at most 1000"),
        ("longer than declared", "longer than the"),
        ("wrong digest", "SHA-256 is"),
        ("short", "ended after"),
        ("error chunk", "did not arrive: the node left"),
        ("wrong chunk type", "unexpected AudioChunk in an upload stream"),
    ],
)
async def test_the_receiver_refuses_what_does_not_match_and_says_why(spool: Path, case: str, match: str) -> None:
    data = _data(PIECE * 2 + 5)
    task = BlobTask(hashlib.sha256(data).hexdigest(), len(data))
    chunks: list[Any] = uploads.pieces(BLOB, "c1", data)
    if case == "longer than declared":
        task.size -= 1
    elif case == "wrong digest":
        task.sha256 = hashlib.sha256(b"other").hexdigest()
    elif case == "short":
        chunks = _short(chunks)
    elif case == "error chunk":
        chunks = [ErrorChunk(command_id=CommandId("c1/blob"), seq=0, message="the node left")]
    elif case == "wrong chunk type":
        chunks = [AudioChunk(command_id=CommandId("c1/blob"), seq=0, data="", finish_reason="stop")]
    await _receive(task, chunks, max_bytes=1000 if case == "over the node's limit" else 10**7)
    assert not any(spool.rglob("*.blob"))
    with pytest.raises(BlobError, match=match):
        await asyncio.to_thread(_wait, task)
    assert not any(spool.rglob("*.error"))  # the note is read once


async def test_a_deleted_task_stops_receiving_and_a_deleted_instance_takes_its_spool(spool: Path) -> None:
    node = _Node("n1")
    receiver = uploads.Receiver(BLOB, node, 10**7, timeout_s=5)  # type: ignore[arg-type]
    receiver.on_task_created(BlobTask("ab", 10))
    receiver.on_task_created(BlobTask("", 10, task_id="t2", command_id="c2"))  # declares nothing
    receiver.on_task_created(BlobTask("ab", 10, task_id="t3", instance_id="gone"))  # no such instance
    receiver.on_task_created(SimpleNamespace(task_id="t4"))  # another kind of task
    assert list(receiver.receiving) == ["t1"] and node.streams.open_ids() == ["c1/blob"]
    receiver.on_task_deleted("t1")
    await asyncio.gather(*node.spawned, return_exceptions=True)
    assert node.spawned[0].cancelled() and node.streams.open_ids() == []
    (spool / "i1").mkdir()
    (spool / "i1" / "left.blob").write_bytes(b"x")
    receiver.on_instance_deleted("i1")
    assert not (spool / "i1").exists()


async def test_a_node_without_a_runner_of_the_instance_receives_nothing() -> None:
    node = _Node("n2")
    receiver = uploads.Receiver(BLOB, node, 10**7, timeout_s=5)  # type: ignore[arg-type]
    receiver.on_task_created(BlobTask("ab", 10))
    assert receiver.receiving == {} and node.streams.open_ids() == []


def test_waiting_ends_on_the_error_note_a_bad_file_cancel_and_timeout(spool: Path) -> None:
    done, error = BLOB.spool_paths("i1", "c1")
    done.parent.mkdir(parents=True)
    error.write_text("the node said no")
    with pytest.raises(BlobError, match=r"^the node said no$"):
        uploads.wait_for_file(BLOB, "i1", "c1", "x", 2, lambda: False)
    done.write_bytes(b"tampered")
    with pytest.raises(BlobError, match="does not match its SHA-256"):
        uploads.wait_for_file(BLOB, "i1", "c1", "x", 2, lambda: False)
    assert not done.exists()
    with pytest.raises(BlobError, match="cancelled while waiting for the test blob"):
        uploads.wait_for_file(BLOB, "i1", "c1", "x", 5, lambda: True)
    with pytest.raises(BlobError, match="the test blob did not arrive within 0s"):
        uploads.wait_for_file(BLOB, "i1", "c1", "x", 0.05, lambda: False)


async def test_send_when_running_sends_every_piece_to_every_runner_node_and_nothing_once_over() -> None:
    data = _data(PIECE + 1)
    running = BlobTask("ab", len(data), instance_id="i1")
    node = _Node("n1", "n2", tasks={"c1": running})
    await uploads.send_when_running(BLOB, node, "c1", data, 1.0, tag="png")  # type: ignore[arg-type]
    assert [(owner, chunk.seq) for owner, chunk in node.sent] == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert node.sent[0][1].mime == "application/x-png"
    over = _Node("n1", tasks={"c1": BlobTask("ab", len(data), status="Cancelled")})
    await uploads.send_when_running(BLOB, over, "c1", data, 1.0)  # type: ignore[arg-type]
    assert over.sent == []


async def test_one_shared_receiver_per_node_follows_forwarded_events_until_closed() -> None:
    node = _Node("n1")
    first = uploads.shared_receiver(BLOB, node, 10**7, 5)  # type: ignore[arg-type]
    assert uploads.shared_receiver(BLOB, node, 1, 1) is first  # type: ignore[arg-type]
    uploads.forward_event(BLOB, node, TaskCreated(BlobTask("ab", 10)))  # type: ignore[arg-type]
    uploads.forward_event(BLOB, node, TaskCreated(BlobTask("ab", 10)))  # type: ignore[arg-type]
    assert list(first.receiving) == ["t1"] and len(node.spawned) == 1
    uploads.forward_event(BLOB, node, TaskDeleted(task_id="t1"))  # type: ignore[arg-type]
    assert first.receiving == {}
    uploads.forward_event(BLOB, node, TaskCreated(BlobTask("ab", 10, task_id="t2", command_id="c2")))  # type: ignore[arg-type]
    uploads.forward_event(BLOB, node, InstanceDeleted(instance_id="i1"))  # type: ignore[arg-type]
    uploads.close_receiver(BLOB, node)  # type: ignore[arg-type]
    await asyncio.gather(*node.spawned, return_exceptions=True)
    assert all(t.cancelled() for t in node.spawned) and len(node.services) == 0 and node.streams.open_ids() == []
    uploads.forward_event(BLOB, node, TaskCreated(BlobTask("ab", 10, task_id="t3")))  # type: ignore[arg-type]
    assert len(node.spawned) == 2  # closed: nothing follows the events any more
