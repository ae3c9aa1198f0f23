"""The batch service on every node: runs the batches assigned to it; on the master, assigns them.

Who runs a batch: the node that created it, recorded as `run/<id>`; when that node is no longer a
live member, the master's keeper (this module, on the master only) assigns the batch to another
live node that has this plugin and the API, with a higher generation. The runner continues from
`progress.committed`: the lines before it have their results in segments held by `copies` nodes,
the lines after it were never recorded, so they run (again) and no line is answered twice in the
output. Every progress write is checked against the assignment first: a runner that lost its
batch stops.

Priority: a batch keeps `per_replica` lines in flight per ready replica of a line's model while no
other task is open on those replicas, and `busy_in_flight` while interactive requests are: it
fills idle replicas and steps aside when users arrive (the engines' own slots still serve the
lines already started).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections import Counter
from typing import Any

from skulk_kernel.api import CommandId, NodeSurface, SetPluginData, new_id

from . import records as rec
from .config import PLUGIN, BatchConfig
from .jsonl import LineError, ParsedInput, parse_input
from .lines import error_line, is_ok, read_segment, run_line, segment_bytes
from .storage import Storage

log = logging.getLogger("skulk.batch")
OPEN_TASK = ("Pending", "Running")
RETRY_S = 10.0


BATCH_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("skulk_batch_line", default=False)


class BatchMarker:
    """Inference middleware (`wrap_inference`): records the command id of every batch line.

    A line runs through the node's own API in the context the runner set `BATCH_LINE` in, so
    `transform` (called by the API for each command it dispatches, resumes included) sees it.
    """

    def __init__(self, service: BatchService) -> None:
        self.service = service

    def transform(self, command: Any) -> Any:
        if BATCH_LINE.get():
            self.service.mine[str(command.command_id)] = time.monotonic()
        return command

    def observe(self, command: Any, chunk: Any) -> None:
        return None


class Superseded(Exception):
    """Another node runs this batch now (its assignment changed)."""


def derived_file_id(batch_id: str, kind: str) -> str:
    """Output and error file ids follow from the batch: a runner that finalizes again writes the same ones."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def lines_allowed(
    open_ids: set[str],
    mine: set[str],
    in_flight: int,
    replicas: int,
    config: BatchConfig,
    starving: bool,
    still_quiet: bool,
) -> tuple[int, bool]:
    """Pure: (lines of a model that may be in flight, whether interactive requests are open now).

    `open_ids`: open tasks on the model's ready replicas; `mine`: the batch lines' command ids
    (an unmarked line in flight is subtracted by count); `still_quiet`: interactive requests were
    seen less than `quiet_s` ago.
    """
    marked = len(open_ids & mine)
    interactive = len(open_ids) - marked - max(0, in_flight - marked) > 0
    if interactive or still_quiet:
        return (max(1, config.busy_in_flight) if starving else config.busy_in_flight), interactive
    return config.per_replica * max(1, replicas), False


class BatchService:
    def __init__(self, node: NodeSurface, config: BatchConfig, storage: Storage) -> None:
        self.node = node
        self.config = config
        self.storage = storage
        self.app: Any = None  # the node's API app (register_api_routes); None on a node without API
        self.running: dict[str, asyncio.Task[None]] = {}
        self.announced = False
        self.stats: Counter[str] = Counter()
        self.mine: dict[str, float] = {}  # command ids of this node's batch lines -> when sent (BatchMarker)
        self.busy_until: dict[str, float] = {}  # model -> until when interactive requests were seen
        self.retry_at: dict[str, float] = {}  # batch -> when to try again after it stopped with an error

    # ------------------------------------------------------------------ records through the master

    async def submit(self, entries: list[tuple[str, Any]], *, until_ok: bool = False) -> bool:
        """One SetPluginData; with `until_ok`, retried while no master answers (a failover)."""
        while True:
            command = SetPluginData(command_id=CommandId(new_id()), plugin=PLUGIN, entries=tuple(entries))
            outcome = await self.node.submit(command)
            if outcome.ok:
                return True
            if not until_ok or outcome.status == "refused" or self.node.stopping:
                log.warning("batch record not indexed: %s %s", outcome.status, outcome.reason)
                return False
            await asyncio.sleep(0.5)

    def runner_nodes(self) -> list[str]:
        """Live members (and this node) that announced they run batch lines."""
        data = rec.data_of(self.node.state)
        alive = self.node.reachable_nodes() | {self.node.node_id}
        return sorted(k.removeprefix("runner/") for k in data if k.startswith("runner/") and k[7:] in alive)

    # ------------------------------------------------------------------ the loop every node runs

    async def run(self) -> None:
        while not self.node.stopping:
            await asyncio.sleep(self.config.keeper_interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("batch keeper tick failed")

    async def tick(self) -> None:
        state = self.node.state
        me = self.node.node_id
        if self.app is not None and not self.announced and self.node.master_id is not None:
            self.announced = await self.submit([(f"runner/{me}", {"since": int(time.time())})])
        if self.node.is_master:
            await self.assign(state)
        for batch in rec.specs(state):
            prog = rec.progress(state, batch.id)
            assigned = rec.assignment(state, batch.id)
            if prog.status in rec.TERMINAL or assigned is None or assigned.node != me:
                continue
            task = self.running.get(batch.id)
            if task is None or task.done():
                if self.app is None or time.monotonic() < self.retry_at.get(batch.id, 0.0):
                    continue
                self.running[batch.id] = self.node.spawn(
                    self.execute(batch.id, assigned.generation), f"batch-{batch.id}"
                )

    async def assign(self, state: Any) -> None:
        """Master only: a batch whose runner left gets a live one; a node gone from the topology
        (pruned after the node timeout) is no longer a runner."""
        alive = self.node.reachable_nodes() | {self.node.node_id}
        gone = [
            key
            for key in rec.data_of(state)
            if key.startswith("runner/") and key[7:] not in alive and key[7:] not in state.topology.nodes
        ]
        if gone:
            await self.submit([(key, None) for key in gone])
        candidates = self.runner_nodes()
        for batch in rec.specs(state):
            chosen = rec.choose_runner(state, batch.id, alive, candidates, self.node.node_id)
            if chosen is None:
                continue
            chosen = chosen.model_copy(update={"since": time.time()})
            was = rec.assignment(state, batch.id)
            log.warning(
                "batch %s: its runner %s is gone; %s continues it from line %d (generation %d)",
                batch.id,
                was.node if was else None,
                chosen.node,
                rec.progress(state, batch.id).committed,
                chosen.generation,
            )
            self.stats["reassigned"] += 1
            await self.submit([(f"run/{batch.id}", chosen.model_dump(mode="json"))])

    # ------------------------------------------------------------------ running one batch

    def _check(self, batch_id: str, generation: int) -> rec.Progress:
        assigned = rec.assignment(self.node.state, batch_id)
        if assigned is None or assigned.node != self.node.node_id or assigned.generation != generation:
            raise Superseded(batch_id)
        return rec.progress(self.node.state, batch_id)

    async def _record(self, batch_id: str, generation: int, new: rec.Progress, extra: list[tuple[str, Any]]) -> None:
        self._check(batch_id, generation)
        value = new.model_copy(update={"generation": generation}).model_dump(mode="json")
        await self.submit([*extra, (f"progress/{batch_id}", value)], until_ok=True)

    async def execute(self, batch_id: str, generation: int) -> None:
        try:
            await self._execute(batch_id, generation)
        except Superseded:
            log.warning("batch %s: another node runs it now; this node stops", batch_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("batch %s stopped on this node (tried again in %.0f s): %r", batch_id, RETRY_S, exc)
            self.retry_at[batch_id] = time.monotonic() + RETRY_S

    async def _execute(self, batch_id: str, generation: int) -> None:
        batch = rec.spec(self.node.state, batch_id)
        if batch is None:
            return
        prog = self._check(batch_id, generation)
        if prog.generation != generation:
            log.info("batch %s: running it from line %d (generation %d)", batch_id, prog.committed, generation)
        parsed = await self._parse(batch)
        now = int(time.time())
        if prog.status == "validating":
            if parsed.fatal:
                errors = [e.model_dump(mode="json") for e in parsed.fatal]
                await self._record(
                    batch_id, generation, rec.advance(prog, status="failed", failed_at=now, errors=errors), []
                )
                return
            prog = rec.advance(prog, status="in_progress", in_progress_at=now, total=parsed.total)
            await self._record(batch_id, generation, prog, [])
        if prog.status == "in_progress":
            end_status = await self._lines(batch, generation, parsed)
            prog = self._check(batch_id, generation)
            stamp = int(time.time())
            if end_status == "cancelled":
                await self._finalize(batch, generation, prog, "cancelled", {"cancelled_at": stamp})
                return
            if end_status == "expired":
                await self._finalize(batch, generation, prog, "expired", {"expired_at": stamp})
                return
            prog = rec.advance(prog, status="finalizing", finalizing_at=stamp)
            await self._record(batch_id, generation, prog, [])
        if prog.status == "finalizing":
            await self._finalize(batch, generation, prog, "completed", {"completed_at": int(time.time())})

    async def _parse(self, batch: rec.BatchSpec) -> ParsedInput:
        record = rec.file_record(self.node.state, batch.input_file_id)
        if record is None:
            from .jsonl import FileError

            return ParsedInput(
                lines=[], fatal=[FileError(code="missing_file", message=f"input file {batch.input_file_id} is gone")]
            )
        data = await self.storage.read("files", record.id, record.holders)
        if not self.storage.has("files", record.id):
            self.storage.write("files", record.id, data)  # kept here: a runner holds its input
        return parse_input(data, max_lines=self.config.max_lines, max_line_bytes=self.config.max_line_bytes)

    def window(self, model: str, in_flight: int, starving: bool = False) -> int:
        """How many lines of `model` may be in flight now (the priority rule, module docstring).

        Interactive load is every open task on the model's ready replicas that is not one of this
        node's batch lines (their command ids, recorded by `BatchMarker` as they are sent; a line
        not yet recorded is subtracted by count). Once seen, the batch stays stepped down for
        `quiet_s`, so a user sending one request after another is not met by a refilled window.
        """
        from skulk_api_control.dispatch import InferenceError, resolve_model_id, serving_instances

        try:
            model_id = resolve_model_id(self.node, model)
        except InferenceError:
            return 1  # the line answers its 4xx: one at a time
        ready = {inst.instance_id for inst in serving_instances(self.node, model_id)}
        now = time.monotonic()
        open_ids = {
            str(t.command_id)
            for t in self.node.state.tasks.values()
            if t.instance_id in ready and t.status in OPEN_TASK
        }
        width, busy = lines_allowed(
            open_ids,
            set(self.mine),
            in_flight,
            len(ready),
            self.config,
            starving,
            now < self.busy_until.get(model, 0.0),
        )
        if busy:
            self.busy_until[model] = now + self.config.quiet_s
        if width < self.config.per_replica * max(1, len(ready)):
            self.stats["yielded"] += 1
        return width

    def forget_old_lines(self) -> None:
        """Drop marked command ids whose task is over (bounded: at most a window's worth stays)."""
        cutoff = time.monotonic() - 30.0
        tasks = {t.command_id for t in self.node.state.tasks.values() if t.status in OPEN_TASK}
        for command_id, sent in list(self.mine.items()):
            if sent < cutoff and command_id not in tasks:
                del self.mine[command_id]

    async def _lines(self, batch: rec.BatchSpec, generation: int, parsed: ParsedInput) -> str:
        """Run the lines from `committed` on; record results in segments. Ends "done", "cancelled" or "expired"."""
        import httpx

        prog = self._check(batch.id, generation)
        lines = parsed.lines
        total = len(lines)
        seg_lines = max(self.config.segment_lines, total // 200)
        expires = batch.created_at + rec.WINDOW_S.get(batch.completion_window, rec.WINDOW_S["24h"])
        next_i = prog.committed
        done: dict[int, dict[str, Any]] = {}
        in_flight: dict[asyncio.Task[dict[str, Any]], tuple[int, str]] = {}
        per_model: Counter[str] = Counter()
        last_commit = last_answer = time.monotonic()
        stop: str | None = None
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False, client=("127.0.0.1", 0))
        async with httpx.AsyncClient(transport=transport, base_url="http://batch.local") as client:
            try:
                while True:
                    if stop is None and rec.cancel_ask(self.node.state, batch.id) is not None:
                        stop = "cancelled"
                    if stop is None and time.time() >= expires:
                        stop = "expired"
                    while stop is None and next_i < total:
                        line = lines[next_i]
                        if isinstance(line, LineError):
                            done[next_i] = error_line(line)
                            next_i += 1
                            continue
                        model = str(line.body.get("model"))
                        starving = time.monotonic() - last_answer > self.config.max_wait_s
                        if per_model[model] >= self.window(model, per_model[model], starving):
                            break
                        token = BATCH_LINE.set(True)
                        try:  # the task copies the context: the line's commands are marked as batch work
                            task = asyncio.ensure_future(run_line(client, line, self.config.line_attempts))
                        finally:
                            BATCH_LINE.reset(token)
                        in_flight[task] = (next_i, model)
                        per_model[model] += 1
                        next_i += 1
                    if in_flight:
                        finished, _ = await asyncio.wait(in_flight, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
                        for task in finished:
                            index, model = in_flight.pop(task)
                            per_model[model] -= 1
                            done[index] = task.result()
                            last_answer = time.monotonic()
                    elif stop is None and next_i < total:
                        await asyncio.sleep(0.25)  # waiting for a replica to be idle
                    self.forget_old_lines()
                    prog = self._check(batch.id, generation)
                    ready = 0
                    while prog.committed + ready in done:
                        ready += 1
                    finished_all = (stop is not None or next_i >= total) and not in_flight
                    due = time.monotonic() - last_commit >= self.config.segment_s
                    if ready and (ready >= seg_lines or due or finished_all):
                        await self._commit(batch.id, generation, prog, done, min(ready, seg_lines * 4))
                        last_commit = time.monotonic()
                        continue
                    if finished_all:
                        return stop or "done"
            finally:
                for task in in_flight:
                    task.cancel()

    async def _commit(
        self, batch_id: str, generation: int, prog: rec.Progress, done: dict[int, dict[str, Any]], count: int
    ) -> None:
        start, end = prog.committed, prog.committed + count
        results = [(i, done[i]) for i in range(start, end)]
        name = f"{batch_id}/{start}-{end}"
        data = segment_bytes(results)
        self.storage.write("segments", name, data)
        holders = await self.storage.replicate("segments", name, data)
        ok = sum(1 for _, out in results if is_ok(out))
        new = rec.advance(
            prog,
            committed=end,
            completed=prog.completed + ok,
            failed=prog.failed + (count - ok),
            segments=(*prog.segments, rec.Segment(start=start, end=end, holders=holders)),
        )
        await self._record(batch_id, generation, new, [])
        for i in range(start, end):
            done.pop(i, None)
        self.stats["lines"] += count
        await self._compact(batch_id, generation)

    async def _compact(self, batch_id: str, generation: int) -> None:
        """Merge trailing segments while `rec.to_merge` says so (the merged one is recorded first,
        then the parts' local files go; other holders drop theirs when the batch finishes)."""
        while (count := rec.to_merge((prog := self._check(batch_id, generation)).segments)) > 0:
            parts = prog.segments[-count:]
            data = b"".join(
                [await self.storage.read("segments", f"{batch_id}/{p.start}-{p.end}", p.holders) for p in parts]
            )
            start, end = parts[0].start, parts[-1].end
            name = f"{batch_id}/{start}-{end}"
            self.storage.write("segments", name, data)
            holders = await self.storage.replicate("segments", name, data)
            merged = rec.Segment(start=start, end=end, holders=holders, level=parts[0].level + 1)
            new = rec.advance(prog, segments=(*prog.segments[:-count], merged))
            await self._record(batch_id, generation, new, [])
            for part in parts:
                self.storage.delete("segments", f"{batch_id}/{part.start}-{part.end}")
            self.stats["merged"] += count

    async def _finalize(
        self, batch: rec.BatchSpec, generation: int, prog: rec.Progress, status: str, stamps: dict[str, int]
    ) -> None:
        """The output and error files from every segment (each line index once, in order)."""
        import json

        seen: dict[int, dict[str, Any]] = {}
        for seg in prog.segments:
            data = await self.storage.read("segments", f"{batch.id}/{seg.start}-{seg.end}", seg.holders)
            for index, out in read_segment(data):
                if index in seen:
                    raise RuntimeError(f"batch {batch.id}: line {index} is in two segments")
                seen[index] = out
        outputs = [seen[i] for i in sorted(seen) if is_ok(seen[i])]
        errors = [seen[i] for i in sorted(seen) if not is_ok(seen[i])]
        extra: list[tuple[str, Any]] = []
        ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        for kind, items in (("output", outputs), ("error", errors)):
            if not items:
                continue
            file_id = derived_file_id(batch.id, kind)
            data = "".join(json.dumps(item, separators=(",", ":")) + "\n" for item in items).encode()
            self.storage.write("files", file_id, data)
            holders = await self.storage.replicate("files", file_id, data)
            record = rec.FileRecord(
                id=file_id,
                bytes=len(data),
                created_at=int(time.time()),
                filename=f"{batch.id}_{kind}.jsonl",
                purpose="batch_output",
                sha256=hashlib.sha256(data).hexdigest(),
                holders=holders,
                owner=batch.owner,
            )
            extra.append((f"file/{file_id}", record.model_dump(mode="json")))
            ids[f"{kind}_file_id"] = file_id
        new = rec.advance(prog, status=status, **ids, **stamps)
        await self._record(batch.id, generation, new, extra)
        log.info("batch %s %s: %d answered, %d failed (of %d)", batch.id, status, new.completed, new.failed, new.total)

    # ------------------------------------------------------------------ housekeeping

    def sweep(self, older_than_s: float = 120.0) -> int:
        """Delete local bytes no record names any more (deleted files, finished batches' segments)."""
        state = self.node.state
        known = {f.id for f in rec.files(state)}
        removed = 0
        cutoff = time.time() - older_than_s
        files_dir = self.storage.root / "files"
        for item in files_dir.glob("file-*") if files_dir.is_dir() else []:
            if item.name not in known and item.stat().st_mtime < cutoff:
                item.unlink(missing_ok=True)
                removed += 1
        seg_dir = self.storage.root / "segments"
        for folder in seg_dir.glob("batch_*") if seg_dir.is_dir() else []:
            spec = rec.spec(state, folder.name)
            finished = spec is None or rec.progress(state, folder.name).status in rec.TERMINAL
            if finished and folder.stat().st_mtime < cutoff:
                with contextlib.suppress(OSError):
                    self.storage.delete_segments(folder.name)
                    removed += 1
        return removed
