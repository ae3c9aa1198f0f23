"""Task-scoped spans: the per-node store, the cross-node merge and the two export formats.

A trace's id is the request's command id (the `: command_id` SSE comment, the task id). Every node
keeps only the spans it recorded itself; `GET /v1/traces/{id}` asks every node for its part and
merges them here. Span ids of the hops other nodes hang children on (the API node's request, the
worker's task) are derived from the trace id, so nodes link parents without talking to each other.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The causal stage of each span name: the tie-break when two spans start at the same instant, and
# the documented order a request crosses the cluster in.
STAGES = {
    "api.request": 0,
    "api.dispatch": 1,
    "master.placement_wait": 2,
    "master.task_created": 3,
    "worker.task": 4,
    "worker.runner_queue": 5,
    "runner.prefill": 6,
    "runner.decode_batch": 7,
    "data_plane.send": 8,
    "data_plane.receive": 9,
    "master.task_acknowledged": 10,
    "api.first_chunk": 11,
    "master.task_finished": 12,
    "api.stream_end": 13,
}


def span_id(trace_id: str, name: str) -> str:
    """A stable 16-hex span id for a (trace, well-known hop) pair: any node can name the parent."""
    return hashlib.sha256(f"{trace_id}/{name}".encode()).hexdigest()[:16]


def random_span_id() -> str:
    import os

    return os.urandom(8).hex()


def otlp_trace_id(trace_id: str) -> str:
    """OpenTelemetry wants 32 hex digits: a uuid's own, else a digest of the id."""
    compact = trace_id.replace("-", "").lower()
    if len(compact) == 32 and all(c in "0123456789abcdef" for c in compact):
        return compact
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


class Span(BaseModel):
    """One timed step of one request on one node (times are this node's wall clock, ns)."""

    model_config = ConfigDict(extra="forbid")
    trace_id: str
    span_id: str
    parent_id: str | None = None
    name: str
    node_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @property
    def stage(self) -> int:
        return STAGES.get(self.name, 99)


class TraceStore:
    """This node's spans by trace id, bounded in count and expired after `ttl_s`.

    In memory: a node's traces go with it (a trace is for looking at a request now, not an
    archive). The janitor calls `expire`; `max_traces` bounds memory between janitor runs.
    """

    def __init__(self, ttl_s: float, max_traces: int = 10_000, max_spans_per_trace: int = 2_000) -> None:
        self.ttl_s = ttl_s
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._traces: OrderedDict[str, tuple[float, list[Span]]] = OrderedDict()

    def add(self, span: Span) -> None:
        entry = self._traces.get(span.trace_id)
        if entry is None:
            entry = (time.time(), [])
            self._traces[span.trace_id] = entry
            while len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)
        if len(entry[1]) < self.max_spans_per_trace:
            entry[1].append(span)

    def get(self, trace_id: str) -> list[Span]:
        entry = self._traces.get(trace_id)
        return list(entry[1]) if entry else []

    def trace_ids(self) -> list[str]:
        return list(self._traces)

    def span_count(self) -> int:
        return sum(len(spans) for _, spans in self._traces.values())

    def expire(self, now: float | None = None) -> int:
        """Drop traces older than the ttl; returns how many went."""
        cutoff = (now if now is not None else time.time()) - self.ttl_s
        old = [tid for tid, (created, _) in self._traces.items() if created < cutoff]
        for tid in old:
            del self._traces[tid]
        return len(old)


def merge(parts: list[tuple[list[Span], int]]) -> list[Span]:
    """Spans of every node in causal order.

    `parts` holds each node's spans with the offset (ns) to add to its clock so all nodes share the
    reader's clock (0 where no skew was measurable). Order: corrected start, then causal stage.
    """
    spans: list[Span] = []
    for node_spans, offset in parts:
        for span in node_spans:
            spans.append(
                span
                if offset == 0
                else span.model_copy(update={"start_ns": span.start_ns + offset, "end_ns": span.end_ns + offset})
            )
    return sorted(spans, key=lambda s: (s.start_ns, s.stage, s.end_ns))


def _otlp_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def to_otlp(trace_id: str, spans: list[Span], node_names: dict[str, str]) -> dict[str, Any]:
    """OTLP/JSON (the `ExportTraceServiceRequest` shape): one resource per node."""
    by_node: dict[str, list[Span]] = {}
    for span in spans:
        by_node.setdefault(span.node_id, []).append(span)
    tid = otlp_trace_id(trace_id)
    resources = []
    for node_id, node_spans in by_node.items():
        attrs = {"service.name": "skulk", "skulk.node_id": node_id, "host.name": node_names.get(node_id, node_id)}
        resources.append(
            {
                "resource": {"attributes": [{"key": k, "value": _otlp_value(v)} for k, v in attrs.items()]},
                "scopeSpans": [
                    {
                        "scope": {"name": "skulk-observe", "version": "0.1.0"},
                        "spans": [
                            {
                                "traceId": tid,
                                "spanId": s.span_id,
                                **({"parentSpanId": s.parent_id} if s.parent_id else {}),
                                "name": s.name,
                                "kind": 2 if s.name == "api.request" else 1,  # SERVER / INTERNAL
                                "startTimeUnixNano": str(s.start_ns),
                                "endTimeUnixNano": str(s.end_ns),
                                "attributes": [
                                    {"key": k, "value": _otlp_value(v)}
                                    for k, v in {"skulk.trace_id": trace_id, **s.attributes}.items()
                                ],
                            }
                            for s in node_spans
                        ],
                    }
                ],
            }
        )
    return {"resourceSpans": resources}


def to_chrome(spans: list[Span], node_names: dict[str, str]) -> dict[str, Any]:
    """Chrome trace-event JSON (Perfetto, chrome://tracing): one process row per node."""
    pids = {nid: i + 1 for i, nid in enumerate(dict.fromkeys(s.node_id for s in spans))}
    origin = min((s.start_ns for s in spans), default=0)
    events: list[dict[str, Any]] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"{node_names.get(nid, nid)} ({nid[:8]})"},
        }
        for nid, pid in pids.items()
    ]
    for s in spans:
        events.append(
            {
                "name": s.name,
                "cat": s.name.split(".", 1)[0],
                "ph": "X",
                "ts": (s.start_ns - origin) / 1000,
                "dur": max(s.end_ns - s.start_ns, 0) / 1000,
                "pid": pids[s.node_id],
                "tid": s.stage,
                "args": {"spanId": s.span_id, "parentId": s.parent_id, **s.attributes},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"originUnixNs": origin}}
