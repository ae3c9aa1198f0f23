"""Skulk observability, and the three calls other plugins make into it.

Other plugins never depend on this one: they import it inside ``try/except ImportError`` and call
these helpers, which do nothing when the plugin is not installed, not in the node's profile, or
(for spans) when tracing is off (``PUT /v1/tracing``). Each costs a dict lookup when unused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skulk_kernel.api import ServiceKey

if TYPE_CHECKING:
    from skulk_kernel.api import NodeSurface

    from .service import Observer

PLUGIN = "observe"
# The per-node `Observer` (its class is imported lazily: this module stays light for its callers).
OBSERVER: ServiceKey[Observer] = ServiceKey(PLUGIN)


def tracing_on(node: NodeSurface) -> bool:
    """Whether spans are being recorded on this node (the plugin is loaded and tracing is on)."""
    return OBSERVER in node.services and node.state.tracing_enabled


def record_span(
    node: NodeSurface,
    trace_id: str,
    name: str,
    start_ns: int,
    end_ns: int,
    *,
    parent: str | None = None,
    span_id: str | None = None,
    attributes: dict[str, str | int | float | bool] | None = None,
) -> None:
    """Record one span of the request `trace_id` (its command id) on this node.

    `parent` is a well-known hop name ("api.request", "worker.task") or a span id; None hangs the
    span on the request's root; `span_id` may be a well-known hop name too, so other nodes can
    hang children on this span without being told its id. Times are this node's wall clock (``time.time_ns()``).
    """
    observer = node.services.get(OBSERVER)
    if observer is not None and node.state.tracing_enabled:
        observer.span(trace_id, name, start_ns, end_ns, parent=parent, span_id=span_id, attributes=attributes)


def record_phase(
    node: NodeSurface,
    runner_id: str,
    phase: str,
    *,
    pid: int | None = None,
    task_id: str | None = None,
    detail: str = "",
    model_id: str | None = None,
) -> None:
    """Note a runner's phase change in the flight recorder (always on; takes the pid's RSS)."""
    observer = node.services.get(OBSERVER)
    if observer is not None:
        observer.recorder.record(runner_id, phase, pid=pid, task_id=task_id, detail=detail, model_id=model_id)
