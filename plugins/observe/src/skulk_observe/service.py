"""The per-node observer (`node.services.get(OBSERVER)`): spans, the recorder, the timeline, metrics.

One object per node, created in `configure` so every other hook (and other plugins' helpers) can
find it from the first event on. It owns only memory-bounded structures; the janitor task started
in `startup` expires traces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import IndexedEvent, NodeSurface

from .envelopes import EnvelopeBook
from .logs import LogRing
from .recorder import FlightRecorder
from .spans import Span, TraceStore, random_span_id, span_id

log = logging.getLogger("skulk.observe")
RECENT_EVENTS = 2000


class ObserveConfig(BaseModel):
    """`[plugins.observe]` in a profile."""

    model_config = ConfigDict(extra="forbid")
    trace_ttl_s: float = Field(default=3 * 24 * 3600.0, gt=0, description="how long a trace is kept")
    janitor_interval_s: float = Field(default=3600.0, gt=0, description="how often expired traces are dropped")
    max_traces: int = Field(default=10_000, ge=1, description="traces kept per node at most")
    recorder_depth: int = Field(default=128, ge=1, description="phase changes kept per runner")
    log_lines: int = Field(default=5000, ge=0, description="recent log lines kept for capture bundles")
    fanout_timeout_s: float = Field(default=3.0, gt=0, description="per-node timeout of cluster fan-outs")
    stalled_after_s: float = Field(
        default=30.0, gt=0, description="a runner with work in flight and no phase change this long is stalled"
    )


class Observer:
    def __init__(self, node: NodeSurface, config: ObserveConfig) -> None:
        self.node = node
        self.config = config
        self.traces = TraceStore(config.trace_ttl_s, config.max_traces)
        self.recorder = FlightRecorder(config.recorder_depth)
        self.envelopes = EnvelopeBook()
        self.events: deque[IndexedEvent] = deque(maxlen=RECENT_EVENTS)
        self.timeline: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)  # this node's own moments
        self.logs = LogRing(config.log_lines)
        self.requests: OrderedDict[str, dict[str, Any]] = OrderedDict()  # command id -> API-side timings
        self.janitor: asyncio.Task[Any] | None = None
        self.metrics: Any = None  # metrics.NodeMetrics, built lazily with the first /metrics

    # ------------------------------------------------------------------ spans

    def span(
        self,
        trace_id: str,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        parent: str | None = None,
        span_id: str | None = None,
        attributes: dict[str, str | int | float | bool] | None = None,
    ) -> None:
        if parent is None and name != "api.request":
            parent = "api.request"
        parent_id = _resolve(trace_id, parent)
        self.traces.add(
            Span(
                trace_id=trace_id,
                span_id=_resolve(trace_id, span_id) or random_span_id(),
                parent_id=parent_id,
                name=name,
                node_id=self.node.node_id,
                start_ns=start_ns,
                end_ns=max(end_ns, start_ns),
                attributes=attributes or {},
            )
        )

    # ------------------------------------------------------------------ timeline

    def note(self, kind: str, detail: str, **extra: Any) -> None:
        """A moment only this node saw (a master change, a config change applied here)."""
        self.timeline.append({"at": time.time(), "kind": kind, "nodeId": self.node.node_id, "detail": detail, **extra})

    def local_timeline(self, since: float = 0.0) -> dict[str, Any]:
        events = [
            {
                "at": e.at.timestamp(),
                "kind": "event",
                "idx": e.idx,
                "type": type(e.event).__name__,
                "origin": e.origin,
                "detail": _event_detail(e),
            }
            for e in self.events
            if e.at.timestamp() >= since
        ]
        phases = [
            {"at": c.at, "kind": "phase", "nodeId": self.node.node_id, **c.wire()}
            for c in self.recorder.all_phases()
            if c.at >= since
        ]
        notes = [n for n in self.timeline if n["at"] >= since]
        return {"nodeId": self.node.node_id, "events": events, "phases": phases, "notes": notes}

    # ------------------------------------------------------------------ janitor

    async def run_janitor(self) -> None:
        while True:
            await asyncio.sleep(self.config.janitor_interval_s)
            dropped = self.traces.expire()
            if dropped:
                log.info("expired %d trace(s) older than %.0fs", dropped, self.traces.ttl_s)

    def remember_request(self, command_id: str, entry: dict[str, Any]) -> None:
        self.requests[command_id] = entry
        while len(self.requests) > 4096:  # requests refused before their first chunk never finish here
            self.requests.popitem(last=False)


def _resolve(trace_id: str, parent: str | None) -> str | None:
    if parent is None:
        return None
    if "." in parent:  # a well-known hop name
        return span_id(trace_id, parent)
    return parent


def _event_detail(e: IndexedEvent) -> str:
    ev = e.event
    if type(ev).__name__ == "PluginDataSet":
        return f"{getattr(ev, 'plugin', '')}/{getattr(ev, 'key', '')}"
    for field in ("task_id", "instance_id", "runner_id", "node_id", "model_id"):
        value = getattr(ev, field, None)
        if value:
            status = getattr(ev, "status", None)
            suffix = f" -> {status if isinstance(status, str) else type(status).__name__}" if status else ""
            return f"{field}={value}{suffix}"
    task = getattr(ev, "task", None)
    if task is not None:
        return f"task_id={task.task_id} instance_id={task.instance_id}"
    instance = getattr(ev, "instance", None)
    if instance is not None:
        return f"instance_id={instance.instance_id}"
    return ""
