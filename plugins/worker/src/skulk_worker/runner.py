"""The runner subprocess: loads one shard on one engine and serves tasks from its worker.

Started with the `spawn` method (forking after llama.cpp or MLX initialised hangs the child). It
loads only the plugin that registered its engine, never the whole profile. Messages are tuples,
everything in them a picklable kernel type: the worker's come on a multiprocessing queue; the
runner's go back on a pipe in batches (`Outbox`: the messages put while a batch was being written
travel together in the next one, one pickled list and one write), so the chunks of several streams
that are ready together cost the worker one wake-up instead of one each.

    worker -> runner: ("task", Task, traced) | ("cancel", task_id) | ("stop",)
    runner -> worker: ("status", RunnerStatus) | ("ack", task_id) | ("chunk", task_id, Chunk)
                      | ("done", task_id, TaskStatus) | ("fatal", traceback) | ("broken", reason)
                      | ("phase", task_id, name, at_ns) | ("span", task_id, name, start_ns, end_ns, attrs)

A task is served by its kind (`task_kind`: TextGeneration, TextEmbedding, SpeechSynthesis, ...):
`_SERVE` says how; the engine must declare the kind (`Engine.tasks`) and its session implement the
kind's Protocol (`SESSION_PROTOCOLS`), else the task gets an ErrorChunk coded `unsupported_task`
("engine X does not serve <kind>").

A task's phases (task_started, prefill, first_token, task_done) always go to the worker, for its
flight recorder; spans (runner.prefill, one runner.decode_batch per DECODE_BATCH tokens) only when
the worker sent the task with `traced` true (tracing on). A few small messages per task either way.

A rank of a multi-rank instance runs every task too (collectives need every rank); its worker
forwards only the output rank's chunks. A task that raises in a multi-rank runner, or ends with an
ErrorChunk coded `rank_failed`, reports the group broken: a failed collective leaves the ranks out
of step, so the instance must be re-placed. A session with a `watch_group(report)` method is
handed a callback for breaks between requests (llama.cpp RPC: a peer's process gone).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from skulk_kernel.api import (
    SESSION_PROTOCOLS,
    Engine,
    ErrorChunk,
    Profile,
    RunnerConnecting,
    RunnerFailed,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerSpec,
    RunnerWarmingUp,
    ignores_eos,
    is_terminal,
    serves_completions,
    takes_images,
    task_kind,
)

log = logging.getLogger("skulk.runner")
RANK_FAILED = "rank_failed"  # an engine's ErrorChunk code: a collective failed, the group is unusable
DECODE_BATCH = 16  # chunks (tokens) per runner.decode_batch span of a traced task


class Outbox:
    """The runner's messages to its worker, from any thread, sent in order in batches on a pipe.

    No sender thread (a hand-off per token costs a wake-up): the thread that puts a message sends
    it, with whatever else gathered meanwhile, unless another thread is sending; that one then
    sends it too, before it lets go. A full pipe blocks the sender (the worker reads all the time).
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._items: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()  # guards _items
        self._sending = threading.Lock()  # held by the one thread writing to the pipe
        self.broken = False  # the worker is gone: nothing more is sent

    def put(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._items.append(message)
        while self._items and self._sending.acquire(blocking=False):
            try:
                while True:
                    with self._lock:
                        batch, self._items = self._items, []
                    if not batch or self.broken:
                        break
                    try:
                        self._conn.send(batch)
                    except (OSError, ValueError):
                        self.broken = True  # the worker closed its end: nobody to tell
                    except Exception:  # a message that does not pickle: the others still go
                        self._one_by_one(batch)
            finally:
                self._sending.release()
            # a message put while this thread was letting go is sent on the next turn of the loop

    def _one_by_one(self, batch: list[tuple[Any, ...]]) -> None:
        for message in batch:
            try:
                self._conn.send([message])
            except (OSError, ValueError):
                self.broken = True
                return
            except Exception:
                log.exception("runner message %r could not be sent to the worker; dropped", message[:2])

    def close(self) -> None:
        with self._sending:
            self._conn.close()
            self.broken = True


def _engine(profile: Profile, engine_name: str) -> Engine:
    from skulk_kernel.api import build_plugin_manager, collect

    pm = build_plugin_manager(profile)
    engines = collect(pm, "register_engines", "engine")
    if engine_name not in engines:
        raise RuntimeError(f"no engine named {engine_name!r} in plugins {list(profile.plugins)}")
    return engines[engine_name]


class _Serving:
    def __init__(
        self,
        session: Any,
        spec: RunnerSpec,
        context_limit: int,
        width: int,
        outq: Any,
        engine_name: str,
        tasks: frozenset[str],
    ) -> None:
        self.session = session
        self.engine_name = engine_name
        self.tasks = tasks  # Engine.tasks: the kinds the engine declares it serves
        self.spec = spec
        self.context_limit = context_limit
        self.outq = outq
        self.slots = threading.BoundedSemaphore(max(1, width))
        self.cancelled: dict[str, threading.Event] = {}
        self.active = 0
        self.lock = threading.Lock()

    def _busy(self, delta: int) -> None:
        with self.lock:
            before = self.active
            self.active += delta
            if before == 0 and self.active == 1:
                self.outq.put(("status", RunnerRunning()))
            elif before == 1 and self.active == 0:
                self.outq.put(("status", RunnerReady()))

    def _phase(self, task: Any, name: str) -> None:
        self.outq.put(("phase", task.task_id, name, time.time_ns()))

    def run_task(self, task: Any, traced: bool = False) -> None:
        flag = self.cancelled[task.task_id]
        with self.slots:
            self._busy(+1)
            try:
                status = self._serve(task, flag, traced)
            except Exception as exc:
                log.exception("task %s failed", task.task_id)
                if self.spec.group is not None:  # a failed collective leaves the group unusable
                    self.outq.put(("broken", f"rank {self.spec.shard.device_rank}: {type(exc).__name__}: {exc}"))
                self.outq.put(
                    (
                        "chunk",
                        task.task_id,
                        ErrorChunk(command_id=task.command_id, seq=0, message=f"{type(exc).__name__}: {exc}"),
                    )
                )
                status = "Failed"
            finally:
                self._busy(-1)
                self.cancelled.pop(task.task_id, None)
            self._phase(task, "task_done")
            self.outq.put(("done", task.task_id, status))

    def _serve(self, task: Any, flag: threading.Event, traced: bool = False) -> str:
        if flag.is_set():
            return "Cancelled"
        self.outq.put(("ack", task.task_id))
        self._phase(task, "task_started")
        kind = task_kind(task)
        serve = _SERVE.get(kind)
        if serve is None or kind not in self.tasks or not isinstance(self.session, SESSION_PROTOCOLS[kind]):
            self.outq.put(("chunk", task.task_id, self._unserved(task, kind)))
            return "Failed"
        return serve(self, task, flag, traced)

    def _unserved(self, task: Any, kind: str) -> ErrorChunk:
        """A task of a kind the engine does not declare, or its session has no Protocol for."""
        return ErrorChunk(
            command_id=task.command_id,
            seq=0,
            error_type="invalid_request_error",
            code="unsupported_task",
            message=f"engine {self.engine_name} does not serve {kind}",
        )

    def _embed(self, task: Any, flag: threading.Event, traced: bool) -> str:
        self.outq.put(("chunk", task.task_id, self.session.embed(task.command_id, task.params)))
        return "Complete"

    def _rerank(self, task: Any, flag: threading.Event, traced: bool) -> str:
        self.outq.put(("chunk", task.task_id, self.session.rerank(task.command_id, task.params)))
        return "Complete"

    def _generate(self, task: Any, flag: threading.Event, traced: bool) -> str:
        params = task.params
        if params.completion is not None and not serves_completions(self.session):
            message = f"model {self.spec.card.model_id} does not support text completions on engine {self.engine_name}"
            self.outq.put(("chunk", task.task_id, _invalid(task.command_id, message)))
            return "Failed"
        if any(m.images for m in params.messages) and not takes_images(self.session):
            message = f"model {self.spec.card.model_id} does not accept images on engine {self.engine_name}"
            self.outq.put(("chunk", task.task_id, _invalid(task.command_id, message)))
            return "Failed"
        if params.sampling.ignore_eos and not ignores_eos(self.session):
            message = (
                f"ignore_eos: engine {self.engine_name} cannot generate past the end-of-text token of "
                f"{self.spec.card.model_id}; leave ignore_eos out"
            )
            self.outq.put(("chunk", task.task_id, _invalid(task.command_id, message)))
            return "Failed"
        prompt = self.session.count_tokens(params)
        wanted = params.sampling.max_tokens or 0
        if params.sampling.max_tokens_is_ceiling and prompt < self.context_limit < prompt + wanted:
            # the client's max_tokens is an upper bound its SDK fills in (Anthropic's must be set):
            # answer within the context, ending with max_tokens / length, rather than refuse
            wanted = self.context_limit - prompt
            params = params.model_copy(update={"sampling": params.sampling.model_copy(update={"max_tokens": wanted})})
        if prompt + wanted > self.context_limit or prompt >= self.context_limit:
            self.outq.put(
                (
                    "chunk",
                    task.task_id,
                    ErrorChunk(
                        command_id=task.command_id,
                        seq=0,
                        error_type="invalid_request_error",
                        code="context_length_exceeded",
                        message=f"context_length_exceeded: the prompt has {prompt} tokens"
                        + (f" and max_tokens is {wanted}" if wanted else "")
                        + f", but this model's context limit is {self.context_limit} tokens; "
                        "shorten the conversation" + (" or lower max_tokens" if wanted else ""),
                    ),
                )
            )
            return "Failed"
        return self._relay(task, self.session.generate(task.command_id, params, flag.is_set), traced, prompt)

    def _relay(self, task: Any, chunks: Any, traced: bool = False, prompt: int = 0) -> str:
        """Send a session's chunks to the worker up to the terminal one; the task's final status."""
        status = "Complete"
        self._phase(task, "prefill")
        started = batch_start = time.time_ns()
        produced = batch = batches = 0
        for chunk in chunks:
            self.outq.put(("chunk", task.task_id, chunk))
            produced += 1
            if produced == 1:
                self._phase(task, "first_token")
                batch_start = time.time_ns()
                if traced:
                    attrs = {"prompt_tokens": prompt, "rank": self.spec.shard.device_rank}
                    self.outq.put(("span", task.task_id, "runner.prefill", started, batch_start, attrs))
            else:
                batch += 1
                if traced and (batch >= DECODE_BATCH or is_terminal(chunk)):
                    now = time.time_ns()
                    attrs = {"chunks": batch, "batch": batches, "rank": self.spec.shard.device_rank}
                    self.outq.put(("span", task.task_id, "runner.decode_batch", batch_start, now, attrs))
                    batch_start, batch, batches = now, 0, batches + 1
            if is_terminal(chunk):
                if isinstance(chunk, ErrorChunk):
                    status = "Failed"
                    if chunk.code == RANK_FAILED and self.spec.group is not None:
                        self.outq.put(("broken", f"rank {self.spec.shard.device_rank}: {chunk.message}"))
                elif chunk.finish_reason == "cancelled":
                    status = "Cancelled"
                break
        return status


def serving_width(session: object, engine_width: int) -> int:
    """How many tasks the runner serves at once: the loaded session's own `dispatch_width` when it
    has one (engine-mlx: a batching single-rank session 8, a split one 1), else the engine's."""
    own = getattr(session, "dispatch_width", None)
    return own if isinstance(own, int) and not isinstance(own, bool) and own >= 1 else engine_width


def _invalid(command_id: str, message: str) -> ErrorChunk:
    """A request this session cannot serve as asked: the API answers it with a 400."""
    return ErrorChunk(
        command_id=command_id, seq=0, error_type="invalid_request_error", code="invalid_request", message=message
    )


def _streamed(method: str) -> Callable[[_Serving, Any, threading.Event, bool], str]:
    """Serve a kind whose session method streams chunks: `method(command_id, params, cancelled)`."""

    def serve(serving: _Serving, task: Any, flag: threading.Event, traced: bool) -> str:
        return serving._relay(task, getattr(serving.session, method)(task.command_id, task.params, flag.is_set))

    return serve


# task kind -> how to serve it; which session Protocol a kind needs is `SESSION_PROTOCOLS[kind]`
_SERVE: dict[str, Callable[[_Serving, Any, threading.Event, bool], str]] = {
    "TextGeneration": _Serving._generate,  # count, check the context, then stream
    "TextEmbedding": _Serving._embed,  # one chunk
    "TextRerank": _Serving._rerank,  # one chunk: a score per document
    "SpeechSynthesis": _streamed("synthesize"),  # speech engines (plugins/speech)
    "Transcription": _streamed("transcribe"),
    "ImageGeneration": _streamed("generate_image"),  # media engines: progress, then the file
    "VideoGeneration": _streamed("generate_video"),
}
assert _SERVE.keys() == SESSION_PROTOCOLS.keys(), "a task kind the runner cannot serve"


def _exit_with_parent(parent_pid: int) -> None:
    """A runner never outlives its node: if the node is killed outright (kill -9), the runner
    (and the engine memory it holds) goes too, instead of lingering as an orphan."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def runner_main(
    profile: Profile,
    engine_name: str,
    spec: RunnerSpec,
    context_limit: int,
    inq: Any,
    conn: Any,
    parent_pid: int | None = None,
) -> None:
    """The subprocess entry point (must stay importable without side effects); `conn` is the write
    end of the pipe to the worker."""
    outq = Outbox(conn)
    try:
        _run_runner(profile, engine_name, spec, context_limit, inq, outq, parent_pid)
    finally:
        outq.close()


def _run_runner(
    profile: Profile,
    engine_name: str,
    spec: RunnerSpec,
    context_limit: int,
    inq: Any,
    outq: Outbox,
    parent_pid: int | None,
) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the node stops its runners itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)-7s runner[{os.getpid()}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "httpcore"):  # its calls to its engine's own server: not one line per request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        engine = _engine(profile, engine_name)
        if spec.group is not None:  # the engine forms the group first, within its deadline
            outq.put(("status", RunnerConnecting()))
        outq.put(("status", RunnerLoading(layers_loaded=0, total_layers=spec.card.n_layers)))

        def progress(done: int, total: int) -> None:
            outq.put(("status", RunnerLoading(layers_loaded=done, total_layers=total)))

        session = engine.load(spec, progress)
        watch = getattr(session, "watch_group", None)
        if spec.group is not None and callable(watch):
            # a session whose group can break between requests (a peer process gone) says so itself
            watch(lambda why: outq.put(("broken", why)))
        outq.put(("status", RunnerLoaded()))
        outq.put(("status", RunnerWarmingUp()))
        outq.put(("status", RunnerReady()))
    except BaseException as exc:
        log.error("runner failed to load %s: %s", spec.card.model_id, exc)
        outq.put(("status", RunnerFailed(error_message=f"load failed: {type(exc).__name__}: {exc}")))
        outq.put(("fatal", traceback.format_exc()))
        return
    width = serving_width(session, engine.dispatch_width)
    serving = _Serving(session, spec, context_limit, width, outq, engine.name, engine.tasks)
    while True:
        message = inq.get()
        kind = message[0]
        if kind == "task":
            serving.cancelled[message[1].task_id] = threading.Event()
            traced = bool(message[2]) if len(message) > 2 else False
            threading.Thread(
                target=serving.run_task, args=(message[1], traced), daemon=True, name=f"task-{message[1].task_id[:8]}"
            ).start()
        elif kind == "cancel":
            flag = serving.cancelled.get(message[1])
            if flag is not None:
                flag.set()
        elif kind == "stop":
            for pending in list(serving.cancelled.values()):
                pending.set()
            try:
                session.close()
            finally:
                outq.put(("stopped",))
            return
