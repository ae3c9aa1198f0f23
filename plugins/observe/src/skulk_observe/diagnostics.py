"""What the diagnostics endpoints answer: this node's section, and the cluster-wide merges.

`cluster_view` is called by api-control's `GET /v1/diagnostics/cluster` with the answering node's
own view of the members (health, reachability, placements); it adds what each node says about
itself (versions, its view of the master, its state hash) and calls out every mismatch.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from skulk_kernel.api import NodeSurface
from skulk_worker import WORKER

from . import OBSERVER
from .cluster import FanOut, friendly_names, members, mismatches, remote_summary
from .envelopes import EnvelopeBook
from .spans import Span, merge


@lru_cache(maxsize=8)
def _installed() -> dict[str, tuple[str, str]]:
    from skulk_kernel.api import installed_plugins

    return {name: (p.distribution, p.version) for name, p in installed_plugins().items()}


def plugin_versions(plugins: tuple[str, ...] = ()) -> dict[str, str]:
    """`distribution -> version` of the kernel and the plugins this node loaded (all, if none named).

    Read from the installed metadata once per process: versions do not change under a running node.
    """
    from skulk_kernel.api import kernel_version

    found = {"skulk-kernel": kernel_version()}
    for name, (dist, version) in _installed().items():
        if not plugins or name in plugins:
            found[dist] = version
    return dict(sorted(found.items()))


def _observer(node: NodeSurface) -> Any:
    return node.services.get(OBSERVER)


def _timeout(node: NodeSurface) -> float:
    observer = _observer(node)
    return float(observer.config.fanout_timeout_s) if observer is not None else 3.0


def stalled_runners(node: NodeSurface, now: float | None = None) -> list[dict[str, Any]]:
    """Runners with a task in flight whose last phase change is older than `stalled_after_s`."""
    observer = _observer(node)
    worker = node.services.get(WORKER)
    if observer is None or worker is None:
        return []
    now = now if now is not None else time.time()
    busy = {r["runnerId"]: r["inFlight"] for r in worker.diagnostics() if r.get("inFlight")}
    out = []
    for entry in observer.recorder.snapshot(now):
        if entry["runnerId"] in busy and (entry["sinceLastChangeS"] or 0) > observer.config.stalled_after_s:
            out.append(
                {
                    "runnerId": entry["runnerId"],
                    "lastPhase": entry["lastPhase"],
                    "sinceLastChangeS": entry["sinceLastChangeS"],
                    "inFlight": busy[entry["runnerId"]],
                }
            )
    return out


def node_section(node: NodeSurface) -> dict[str, Any] | None:
    """This plugin's part of `GET /v1/diagnostics/node` (None when it is not loaded here)."""
    observer = _observer(node)
    if observer is None:
        return None
    return {
        "pluginVersions": plugin_versions(tuple(node.profile.plugins)),
        "flightRecorder": observer.recorder.snapshot(),
        "stalledRunners": stalled_runners(node),
        "traces": {"stored": len(observer.traces.trace_ids()), "spans": observer.traces.span_count()},
        "tracingEnabled": node.state.tracing_enabled,
        "logLevel": logging.getLevelName(logging.getLogger().getEffectiveLevel()),  # what /config's log_level set
    }


async def cluster_view(node: NodeSurface, local: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """`local` (the answering node's view) with every node's own report and the mismatches."""
    if _observer(node) is None:
        return local
    answers = await FanOut(node, _timeout(node), headers).all("/v1/diagnostics/node", local=lambda: local_diag(node))
    summaries = {a.node_id: remote_summary(a.body) for a in answers if a.ok}
    found = mismatches(summaries, node.node_id)
    flagged: dict[str, list[str]] = {}
    for m in found:
        for nid in m["nodes"]:
            flagged.setdefault(nid, []).append(m["field"])
    by_id = {a.node_id: a for a in answers}
    known = {n["nodeId"] for n in local.get("nodes", [])}
    nodes = list(local.get("nodes", []))
    for nid in members(node):
        if nid not in known:
            nodes.append({"nodeId": nid})
    for entry in nodes:
        answer = by_id.get(entry["nodeId"])
        entry["answered"] = bool(answer and answer.ok)
        entry["report"] = summaries.get(entry["nodeId"])
        entry["reportError"] = None if answer is None or answer.ok else answer.error
        entry["mismatches"] = flagged.get(entry["nodeId"], [])
        entry["versionMismatch"] = any(
            f in ("skulkVersion", "skulkCommit", "pluginVersions") for f in entry["mismatches"]
        )
    unanswered = [a.node_id for a in answers if not a.ok]
    if unanswered:
        found.append(
            {
                "field": "unanswered",
                "nodes": unanswered,
                "message": f"{', '.join(unanswered)} did not answer: "
                + "; ".join(a.error for a in answers if not a.ok),
            }
        )
    return {**local, "nodes": nodes, "mismatches": found, "answered": len(summaries), "asked": len(answers)}


def local_diag(node: NodeSurface) -> dict[str, Any]:
    """The parts of this node's `/v1/diagnostics/node` the cluster view compares."""
    worker = node.services.get(WORKER)
    return {
        "runtime": node.runtime_info(),
        "stateHash": node.state.state_hash(),
        "lastEventAppliedIdx": node.state.last_event_applied_idx,
        "openStreams": len(node.streams.open_ids()),
        "hookFailures": node.hooks.failures[-20:],
        "healthNotes": node.health_notes,
        "supervisorRunners": worker.diagnostics() if worker is not None else [],
        "observe": node_section(node),
    }


async def proxy_node(node: NodeSurface, node_id: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    if node_id not in members(node):
        return 404, {"message": f"no node {node_id!r} in this cluster (GET /v1/diagnostics/cluster lists them)"}
    answer = await FanOut(node, _timeout(node), headers).one(node_id, "/v1/diagnostics/node")
    if not answer.ok:
        return 502, {"message": f"node {node_id} did not answer: {answer.error}"}
    return 200, {"proxiedBy": node.node_id, "address": answer.address, "diagnostics": answer.body}


def local_timeline(node: NodeSurface, since: float) -> dict[str, Any]:
    observer = _observer(node)
    body = observer.local_timeline(since) if observer else {"nodeId": node.node_id, "events": [], "phases": []}
    return {**body, "nowNs": time.time_ns()}


async def cluster_timeline(node: NodeSurface, since: float, limit: int, headers: dict[str, str]) -> dict[str, Any]:
    """Every node's recent events (once each, with who saw them) and phase changes, by time."""
    answers = await FanOut(node, _timeout(node), headers).all(
        f"/v1/observe/local/timeline?since={since}", local=lambda: local_timeline(node, since)
    )
    events: dict[int, dict[str, Any]] = {}
    entries: list[dict[str, Any]] = []
    for a in answers:
        if not a.ok:
            continue
        shift = a.offset_ns / 1e9
        for e in a.body.get("events", []):
            merged = events.setdefault(e["idx"], {**e, "seenBy": []})
            merged["seenBy"].append(a.node_id)
        for item in [*a.body.get("phases", []), *a.body.get("notes", [])]:
            entries.append({**item, "at": item["at"] + shift})
    ordered = sorted([*events.values(), *entries], key=lambda e: (e["at"], e.get("idx", -1)))
    names = friendly_names(node)
    for e in ordered:
        if "nodeId" in e:
            e["nodeName"] = names.get(e["nodeId"])
    return {
        "observerNodeId": node.node_id,
        "entries": ordered[-max(1, limit) :],
        "unanswered": {a.node_id: a.error for a in answers if not a.ok},
    }


def local_spans(node: NodeSurface, trace_id: str) -> dict[str, Any]:
    observer = _observer(node)
    spans = observer.traces.get(trace_id) if observer else []
    return {"nodeId": node.node_id, "nowNs": time.time_ns(), "spans": [s.model_dump() for s in spans]}


async def cluster_trace(node: NodeSurface, trace_id: str, headers: dict[str, str]) -> dict[str, Any]:
    answers = await FanOut(node, _timeout(node), headers).all(
        f"/v1/observe/local/spans/{quote(trace_id, safe='')}", local=lambda: local_spans(node, trace_id)
    )
    parts = [([Span.model_validate(s) for s in a.body.get("spans", [])], a.offset_ns) for a in answers if a.ok]
    spans = merge(parts)
    return {
        "traceId": trace_id,
        "spans": spans,
        "nodes": sorted({s.node_id for s in spans}),
        "nodeNames": friendly_names(node),
        "unanswered": {a.node_id: a.error for a in answers if not a.ok},
    }


def local_envelopes(node: NodeSurface) -> dict[str, Any]:
    observer = _observer(node)
    return {"nodeId": node.node_id, "raw": observer.envelopes.raw() if observer else []}


async def cluster_envelopes(node: NodeSurface, headers: dict[str, str]) -> dict[str, Any]:
    answers = await FanOut(node, _timeout(node), headers).all(
        "/v1/observe/local/envelopes", local=lambda: local_envelopes(node)
    )
    raws = [a.body.get("raw", []) for a in answers if a.ok]
    return {
        "envelopes": EnvelopeBook.merged(raws),
        "learnedFrom": "GenerationStats of served requests, on every API node that answered",
        "answered": sum(1 for a in answers if a.ok),
        "asked": len(answers),
    }
