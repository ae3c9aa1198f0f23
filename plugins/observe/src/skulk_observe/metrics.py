"""`GET /metrics`: this node in the Prometheus text format.

Counters and the TTFT histogram are fed by the API middleware as requests finish; gauges are read
from the node when Prometheus scrapes (State, streams, runners, the recorder), so nothing is kept
in step by hand. Each node has its own registry: several nodes may share a process in tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from skulk_kernel.api import NodeSurface, kernel_version
from skulk_worker import WORKER


class NodeMetrics:
    def __init__(self, node: NodeSurface, observer: Any) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.node = node
        self.observer = observer
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "skulk_requests",
            "Inference requests finished on this API node",
            ["model", "kind", "outcome"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "skulk_generated_tokens", "Completion tokens streamed by this API node", ["model"], registry=self.registry
        )
        self.ttft = Histogram(
            "skulk_time_to_first_chunk_seconds",
            "From dispatch to the first chunk, on the API node",
            ["model"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.registry.register(_LiveCollector(self))

    def request_done(self, model: str, kind: str, outcome: str, ttft_s: float, tokens: int) -> None:
        self.requests.labels(model, kind, outcome).inc()
        if tokens:
            self.tokens.labels(model).inc(tokens)
        self.ttft.labels(model).observe(max(ttft_s, 0.0))

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


class _LiveCollector:
    """Gauges computed at scrape time."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        node = self.metrics.node
        state = node.state
        runtime = node.runtime_info()
        yield InfoMetricFamily(
            "skulk_node",
            "This node's identity",
            value={
                "node_id": node.node_id,
                "name": str(runtime.get("friendlyName", "")),
                "version": kernel_version(),
                "commit": str(runtime.get("skulkCommit", "")),
                "profile": node.profile.name,
            },
        )
        yield GaugeMetricFamily("skulk_is_master", "1 when this node is the master", value=1 if node.is_master else 0)
        yield GaugeMetricFamily(
            "skulk_last_event_applied_index", "Index of the last event applied", value=state.last_event_applied_idx
        )
        yield GaugeMetricFamily("skulk_cluster_nodes", "Nodes in the topology", value=len(state.topology.nodes))
        yield GaugeMetricFamily("skulk_instances", "Instances placed in the cluster", value=len(state.instances))
        yield GaugeMetricFamily("skulk_tasks", "Tasks in State (running or queued)", value=len(state.tasks))
        yield GaugeMetricFamily(
            "skulk_open_streams", "Open chunk streams on this node", value=len(node.streams.open_ids())
        )
        yield GaugeMetricFamily(
            "skulk_tracing_enabled", "1 when task tracing is on", value=1 if state.tracing_enabled else 0
        )
        runners = GaugeMetricFamily("skulk_runners", "Runners in the cluster by status", labels=["status"])
        counts: dict[str, int] = {}
        for status in state.runners.values():
            counts[type(status).__name__] = counts.get(type(status).__name__, 0) + 1
        for kind, n in sorted(counts.items()):
            runners.add_metric([kind], n)
        yield runners
        worker = node.services.get(WORKER)
        local = GaugeMetricFamily(
            "skulk_local_runner_in_flight", "Tasks in flight per local runner", labels=["runner", "model"]
        )
        rss = GaugeMetricFamily("skulk_local_runner_rss_bytes", "Last recorded RSS per local runner", labels=["runner"])
        for r in worker.diagnostics() if worker is not None else []:
            local.add_metric([r["runnerId"], r["modelId"]], r["inFlight"])
            phases = self.metrics.observer.recorder.phases(r["runnerId"])
            last_rss = next((p.rss_bytes for p in reversed(phases) if p.rss_bytes is not None), None)
            if last_rss is not None:
                rss.add_metric([r["runnerId"]], last_rss)
        yield local
        yield rss
        yield CounterMetricFamily(
            "skulk_hook_failures", "Plugin hook calls that raised (last 100)", value=len(node.hooks.failures)
        )
        traces = self.metrics.observer.traces
        yield GaugeMetricFamily(
            "skulk_trace_spans_stored", "Spans held in this node's trace store", value=traces.span_count()
        )
