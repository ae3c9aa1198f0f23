"""What the cluster knows of files and batches: records under `State.pluginData["batch"]`.

Why `PluginDataSet` (through `SetPluginData`, the command every node submits to the master): a
batch is cluster state, not one node's. The master indexes each change, every node applies it in
the same order, a node that joins later gets it with the State, and the submitter learns the
outcome (ARCHITECTURE.md 2.3, 2.9) -- the same mechanism the steward uses for its proposals and
api-control for its keys. No kernel type changes, and `apply()` stays ignorant of batches.

Only small things travel this way: metadata, who runs a batch, and how far it got. The bytes of
files and of results stay off the event log (the control plane carries small messages); they live
on the disks of at least `copies` nodes, named in the records so any node can fetch them.

Keys (one writer each, so no two nodes overwrite each other's field):

* ``file/<id>``      FileRecord   written by the node that stored the file (and its copies)
* ``batch/<id>``     BatchSpec    written once, by the node that created the batch
* ``run/<id>``       Assignment   which node runs it: the creator first, then the master's keeper
* ``progress/<id>``  Progress     written only by the assigned runner, generation-checked
* ``cancel/<id>``    CancelAsk    written by the node that got POST /v1/batches/{id}/cancel
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .config import PLUGIN

Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
# the status machine: what each recorded status may become (cancelling is shown, not recorded:
# it is any non-terminal batch with a cancel ask)
TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelled", "expired"}),
    "in_progress": frozenset({"in_progress", "finalizing", "cancelled", "expired"}),
    "finalizing": frozenset({"finalizing", "completed", "cancelled", "expired"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}
WINDOW_S = {"24h": 24 * 3600}


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FileRecord(Record):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    sha256: str
    holders: tuple[str, ...] = ()
    owner: str | None = None  # the API key id that uploaded it (a batch's outputs: the batch's); None: no key


class BatchSpec(Record):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    created_at: int
    created_by: str
    owner: str | None = None  # the API key id that created it; None: created without a key (loopback, open)


class Assignment(Record):
    node: str
    generation: int = 0
    since: float = 0.0


class Segment(Record):
    """Results of lines [start, end), in a file on each holder (`segments/<batch>/<start>-<end>.jsonl`)."""

    start: int
    end: int
    holders: tuple[str, ...]
    level: int = 0  # 0: as committed; l+1: FAN_IN segments of level l merged (see `to_merge`)


FAN_IN = 8


def to_merge(segments: tuple[Segment, ...]) -> int:
    """How many trailing segments to merge into one now (0: none), like carrying in a base-8 counter.

    Why: every commit re-records the whole segment list through the master, and a slow batch
    commits a few lines at a time; merging the last FAN_IN segments of one level keeps the list
    at most 7 per level (a few dozen for 50,000 lines) while each result is copied O(log n) times.
    """
    tail = segments[-FAN_IN:]
    if len(tail) == FAN_IN and len({seg.level for seg in tail}) == 1:
        return FAN_IN
    return 0


class Progress(Record):
    status: Status = "validating"
    generation: int = 0
    total: int = 0
    committed: int = 0  # lines [0, committed) have their result in a segment
    completed: int = 0
    failed: int = 0
    segments: tuple[Segment, ...] = ()
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelled_at: int | None = None


class CancelAsk(Record):
    at: int
    by: str


class InvalidTransition(ValueError):
    pass


def advance(progress: Progress, **update: Any) -> Progress:
    """The next Progress, refusing a status change the machine does not allow."""
    new = progress.model_copy(update=update)
    if new.status != progress.status and new.status not in TRANSITIONS[progress.status]:
        raise InvalidTransition(f"a batch cannot go from {progress.status} to {new.status}")
    if new.committed < progress.committed:
        raise InvalidTransition(f"committed lines cannot go back ({progress.committed} -> {new.committed})")
    return new


def data_of(state: Any) -> dict[str, Any]:
    data: dict[str, Any] = state.plugin_data.get(PLUGIN, {})
    return data


def file_record(state: Any, file_id: str) -> FileRecord | None:
    raw = data_of(state).get(f"file/{file_id}")
    return FileRecord.model_validate(raw) if raw is not None else None


def files(state: Any) -> list[FileRecord]:
    return [FileRecord.model_validate(v) for k, v in data_of(state).items() if k.startswith("file/")]


def spec(state: Any, batch_id: str) -> BatchSpec | None:
    raw = data_of(state).get(f"batch/{batch_id}")
    return BatchSpec.model_validate(raw) if raw is not None else None


def specs(state: Any) -> list[BatchSpec]:
    return [BatchSpec.model_validate(v) for k, v in data_of(state).items() if k.startswith("batch/")]


def assignment(state: Any, batch_id: str) -> Assignment | None:
    raw = data_of(state).get(f"run/{batch_id}")
    return Assignment.model_validate(raw) if raw is not None else None


def progress(state: Any, batch_id: str) -> Progress:
    raw = data_of(state).get(f"progress/{batch_id}")
    return Progress.model_validate(raw) if raw is not None else Progress()


def cancel_ask(state: Any, batch_id: str) -> CancelAsk | None:
    raw = data_of(state).get(f"cancel/{batch_id}")
    return CancelAsk.model_validate(raw) if raw is not None else None


def shown_status(prog: Progress, cancel: CancelAsk | None) -> str:
    """The status a client sees: a cancel asked of an unfinished batch shows as cancelling."""
    if prog.status not in TERMINAL and cancel is not None:
        return "cancelling"
    return prog.status


def batch_object(state: Any, batch: BatchSpec) -> dict[str, Any]:
    """OpenAI's Batch object for one batch, from its records."""
    prog = progress(state, batch.id)
    cancel = cancel_ask(state, batch.id)
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": prog.errors} if prog.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": shown_status(prog, cancel),
        "output_file_id": prog.output_file_id,
        "error_file_id": prog.error_file_id,
        "created_at": batch.created_at,
        "in_progress_at": prog.in_progress_at,
        "expires_at": batch.created_at + WINDOW_S.get(batch.completion_window, WINDOW_S["24h"]),
        "finalizing_at": prog.finalizing_at,
        "completed_at": prog.completed_at,
        "failed_at": prog.failed_at,
        "expired_at": prog.expired_at,
        "cancelling_at": cancel.at if cancel is not None else None,
        "cancelled_at": prog.cancelled_at,
        "request_counts": {"total": prog.total, "completed": prog.completed, "failed": prog.failed},
        "metadata": batch.metadata,
    }


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def choose_runner(state: Any, batch_id: str, alive: set[str], candidates: list[str], me: str) -> Assignment | None:
    """The master's keeper: a new Assignment when the batch's runner is gone, else None.

    Pure. `alive` are the nodes the master holds a session with (itself included); `candidates`
    the alive nodes that serve the API (they can run lines), in a stable order. The next runner
    is the candidate that holds the most of the batch's data (its input file), then the first.
    """
    prog = progress(state, batch_id)
    if prog.status in TERMINAL:
        return None
    current = assignment(state, batch_id)
    if current is not None and current.node in alive:
        return None
    if not candidates:
        return None
    batch = spec(state, batch_id)
    holders = set()
    if batch is not None and (record := file_record(state, batch.input_file_id)) is not None:
        holders = set(record.holders)
    ranked = sorted(candidates, key=lambda n: (n not in holders, n != me, n))
    generation = (current.generation + 1) if current is not None else 1
    return Assignment(node=ranked[0], generation=max(generation, prog.generation + 1))
