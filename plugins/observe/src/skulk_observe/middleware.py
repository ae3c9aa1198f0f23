"""The API node's view of a request (a `wrap_inference` middleware).

`transform` stamps the request's start; `observe` sees every chunk but acts only on the first and
the terminal one, so the per-token cost is a dict lookup. From those two moments come the API-side
spans (with tracing on), the Prometheus counters and the performance envelope sample.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from skulk_kernel.api import (
    Chunk,
    Command,
    ErrorChunk,
    InstanceId,
    NodeSurface,
    NodeSystem,
    TaskId,
    TextEmbedding,
    TextGeneration,
    is_terminal,
    resolve_card,
)

from . import OBSERVER
from .spans import span_id

log = logging.getLogger("skulk.observe")


def hardware_class(node: NodeSurface, node_ids: list[str]) -> str:
    """What ran it, as placement would group machines: OS/arch, CPU model, cores (per node, joined)."""
    parts = []
    for nid in sorted(node_ids):
        got = node.readings.get(NodeSystem, nid)
        if got is None:
            parts.append("unknown")
            continue
        r = got.reading
        parts.append(f"{r.os.lower()}-{r.arch} {r.cpu_model or 'cpu'} x{r.cpu_count}")
    return " + ".join(dict.fromkeys(parts)) or "unknown"


class ObserveMiddleware:
    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    def transform(self, command: Command) -> Command:
        observer = self.node.services.get(OBSERVER)
        if observer is not None and isinstance(command, TextGeneration | TextEmbedding):
            observer.remember_request(
                command.command_id,
                {
                    "start_ns": time.time_ns(),
                    "traced": self.node.state.tracing_enabled,
                    "model": command.params.model_id,
                    "kind": type(command).__name__,
                },
            )
        return command

    def observe(self, command: Command, chunk: Chunk) -> None:
        observer = self.node.services.get(OBSERVER)
        if observer is None:
            return
        entry = observer.requests.get(chunk.command_id)
        if entry is None:
            return
        if "first_ns" not in entry:
            self._first(observer, entry, chunk)
        if is_terminal(chunk):
            observer.requests.pop(chunk.command_id, None)
            self._last(observer, entry, chunk)

    def _first(self, observer: Any, entry: dict[str, Any], chunk: Chunk) -> None:
        now = time.time_ns()
        entry["first_ns"] = now
        task = self.node.state.tasks.get(TaskId(chunk.command_id))
        if task is not None and "instance" not in entry:
            entry["instance"] = task.instance_id
            entry["concurrency"] = sum(1 for t in self.node.state.tasks.values() if t.instance_id == task.instance_id)
        if entry["traced"]:
            cid = chunk.command_id
            observer.span(cid, "api.dispatch", entry["start_ns"], now, attributes={"model": entry["model"]})
            observer.span(cid, "data_plane.receive", now, now, attributes={"seq": chunk.seq, "which": "first"})

    def _last(self, observer: Any, entry: dict[str, Any], chunk: Chunk) -> None:
        now = time.time_ns()
        cid = chunk.command_id
        failed = isinstance(chunk, ErrorChunk)
        outcome = "error" if failed else (chunk.finish_reason or "stop")
        usage = chunk.usage
        if entry["traced"]:
            observer.span(cid, "data_plane.receive", now, now, attributes={"seq": chunk.seq, "which": "last"})
            observer.span(cid, "api.stream_end", now, now, attributes={"outcome": outcome})
            attrs: dict[str, str | int | float | bool] = {"model": entry["model"], "outcome": outcome}
            if usage is not None:
                attrs["completion_tokens"] = usage.completion_tokens
                attrs["prompt_tokens"] = usage.prompt_tokens
            observer.span(
                cid, "api.request", entry["start_ns"], now, span_id=span_id(cid, "api.request"), attributes=attrs
            )
        ttft_ms = (entry["first_ns"] - entry["start_ns"]) / 1e6
        if observer.metrics is not None:
            observer.metrics.request_done(
                entry["model"], entry["kind"], outcome, ttft_ms / 1e3, usage.completion_tokens if usage else 0
            )
        if failed or entry["kind"] != "TextGeneration":
            return
        try:
            self._envelope(observer, entry, chunk, now, ttft_ms)
        except Exception:  # learning must never disturb serving
            log.exception("could not learn a performance envelope sample")

    def _envelope(self, observer: Any, entry: dict[str, Any], chunk: Chunk, now: int, ttft_ms: float) -> None:
        stats = getattr(chunk, "stats", None)
        inst = self.node.state.instances.get(InstanceId(entry.get("instance", "")))
        if inst is None:  # TaskCreated not applied here yet: the model's only instance, if one
            same = [i for i in self.node.state.instances.values() if i.shard_assignments.model_id == entry["model"]]
            if len(same) != 1:
                return
            inst = same[0]
        model_id = inst.shard_assignments.model_id
        shards = list(inst.shard_assignments.runner_to_shard.values())
        engine = (stats.backend if stats and stats.backend else "") or (shards[0].backend if shards else "unknown")
        card = resolve_card(self.node, model_id)
        quant = (card.quantization if card else "") or "unknown"
        hw = hardware_class(self.node, list(inst.shard_assignments.node_to_runner))
        decode = stats.generation_tps if stats and stats.generation_tps > 0 else None
        if decode is None and chunk.usage and chunk.usage.completion_tokens > 1 and now > entry["first_ns"]:
            decode = (chunk.usage.completion_tokens - 1) / ((now - entry["first_ns"]) / 1e9)
        prefill = stats.prompt_tps if stats and stats.prompt_tps > 0 else None
        if prefill is None and stats and stats.ttft_ms > 0 and stats.prompt_tokens:
            prefill = stats.prompt_tokens / (stats.ttft_ms / 1e3)
        observer.envelopes.observe(
            (hw, model_id, engine, quant), int(entry.get("concurrency", 1)), decode, prefill, ttft_ms
        )
