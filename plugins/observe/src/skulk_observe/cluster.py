"""Asking every node: the fan-out behind cluster diagnostics, the timeline, traces and envelopes.

Each node's API address comes from its telemetry (`NodeResources.api_port` and `.addresses`); a
peer that shares a non-loopback address with this node is on the same host and is tried on
loopback first (nodes that share a host often listen on 127.0.0.1 only). The answering node's own
part is computed in process, never over HTTP. Every peer gets `fanout_timeout_s`; one that does not
answer is reported as such, it never fails the whole answer. Each call carries a member token
(`X-Skulk-Member`, skulk_api_control.member_auth), so a cluster with API keys works; the caller's
own credentials are never passed on to other nodes.

Clocks: the per-node observe endpoints return their `nowNs`; where a peer's clock differs from
ours by more than the round trip, its times are shifted onto ours (NTP-style midpoint estimate).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import NodeIdentity, NodeResources, NodeSurface


@dataclass
class Answer:
    node_id: str
    ok: bool
    body: Any = None
    error: str = ""
    offset_ns: int = 0  # add to the peer's times to put them on our clock
    address: str = ""


def api_candidates(node: NodeSurface, node_id: str) -> list[str]:
    """Base URLs to reach `node_id`'s API, best first (empty: it serves no API we know of)."""
    got = node.readings.get(NodeResources, node_id)
    if got is None or not got.reading.api_available or not got.reading.api_port:
        return []
    port = got.reading.api_port
    addrs = list(got.reading.addresses)
    mine = node.readings.get(NodeResources, node.node_id)
    my_addrs = set(mine.reading.addresses) if mine else set()
    same_host = bool({a for a in addrs if not a.startswith("127.")} & {a for a in my_addrs if not a.startswith("127.")})
    if same_host or not addrs:
        addrs = ["127.0.0.1", *[a for a in addrs if a != "127.0.0.1"]]
    return [f"http://{a}:{port}" for a in addrs]


def members(node: NodeSurface) -> list[str]:
    return sorted(set(node.state.topology.nodes) | node.readings.nodes())


def friendly_names(node: NodeSurface) -> dict[str, str]:
    return {nid: r.reading.friendly_name for nid, r in node.readings.latest(NodeIdentity).items()}


class FanOut:
    def __init__(self, node: NodeSurface, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        """`headers`: the caller's, accepted and never forwarded (other nodes see a member token)."""
        self.node = node
        self.timeout_s = timeout_s
        self._working: dict[str, str] = {}

    def _member_headers(self, path: str) -> dict[str, str]:
        try:
            from skulk_api_control.member_auth import member_headers
        except ImportError:
            return {}
        return member_headers(self.node, "GET", path)

    async def one(self, node_id: str, path: str, local: Callable[[], Any] | None = None) -> Answer:
        if node_id == self.node.node_id and local is not None:
            return Answer(node_id, True, local(), address="(this node)")
        urls = api_candidates(self.node, node_id)
        if not urls:
            return Answer(node_id, False, error="the node serves no API (no api_port in its telemetry)")
        import httpx

        errors = []
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._member_headers(path)) as client:
            for base in urls:
                t0 = time.time_ns()
                try:
                    response = await client.get(base + path)
                except httpx.HTTPError as exc:
                    errors.append(f"{base}: {type(exc).__name__}")
                    continue
                t1 = time.time_ns()
                if response.status_code >= 400:
                    return Answer(
                        node_id, False, error=f"{base}{path} answered {response.status_code}: {response.text[:200]}"
                    )
                try:
                    body = response.json()
                except ValueError:
                    return Answer(node_id, False, error=f"{base}{path} did not answer JSON")
                return Answer(node_id, True, body, offset_ns=_offset(body, t0, t1), address=base)
        return Answer(node_id, False, error="unreachable: " + "; ".join(errors))

    async def all(self, path: str, local: Callable[[], Any] | None = None) -> list[Answer]:
        return list(await asyncio.gather(*(self.one(nid, path, local) for nid in members(self.node))))


def _offset(body: Any, t0: int, t1: int) -> int:
    if not isinstance(body, dict) or not isinstance(body.get("nowNs"), int):
        return 0
    offset = (t0 + t1) // 2 - body["nowNs"]
    return offset if abs(offset) > (t1 - t0) else 0


# ------------------------------------------------------------------ cluster diagnostics


def remote_summary(diag: dict[str, Any]) -> dict[str, Any]:
    runtime = diag.get("runtime", {})
    observe = diag.get("observe") or {}
    return {
        "skulkVersion": runtime.get("skulkVersion"),
        "skulkCommit": runtime.get("skulkCommit"),
        "profile": runtime.get("profile"),
        "plugins": runtime.get("plugins"),
        "pluginVersions": observe.get("pluginVersions", {}),
        "masterNodeId": runtime.get("masterNodeId"),
        "isMaster": runtime.get("isMaster"),
        "uptimeS": runtime.get("uptimeS"),
        "stateHash": diag.get("stateHash"),
        "lastEventAppliedIdx": diag.get("lastEventAppliedIdx"),
        "openStreams": diag.get("openStreams"),
        "hookFailures": len(diag.get("hookFailures") or []),
        "healthNotes": diag.get("healthNotes") or {},
        "runners": [
            {k: r.get(k) for k in ("runnerId", "modelId", "statusKind", "inFlight")}
            for r in diag.get("supervisorRunners") or []
        ],
        "stalledRunners": observe.get("stalledRunners", []),
    }


def _odd_ones(values: dict[str, Any], observer: str) -> tuple[Any, list[str]]:
    """(the reference value, nodes that differ): the majority, or this node's value on a tie."""
    counts = Counter(repr(v) for v in values.values())
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1] and observer in values:
        reference = repr(values[observer])
    else:
        reference = ranked[0][0]
    ref_value = next(v for v in values.values() if repr(v) == reference)
    return ref_value, sorted(n for n, v in values.items() if repr(v) != reference)


def mismatches(summaries: dict[str, dict[str, Any]], observer: str) -> list[dict[str, Any]]:
    out = []
    for fld, what in (
        ("skulkVersion", "kernel version"),
        ("skulkCommit", "build commit (SKULK_COMMIT)"),
        ("masterNodeId", "view of the master"),
    ):
        values = {nid: s.get(fld) for nid, s in summaries.items()}
        if len({repr(v) for v in values.values()}) <= 1:
            continue
        ref, odd = _odd_ones(values, observer)
        out.append(
            {
                "field": fld,
                "nodes": odd,
                "expected": ref,
                "values": values,
                "message": f"{', '.join(odd)} differ{'s' if len(odd) == 1 else ''} in {what}: {ref!r} expected",
            }
        )
    # a plugin only some nodes load is a profile choice; the same plugin at two versions is not
    dists = sorted({d for s in summaries.values() for d in (s.get("pluginVersions") or {})})
    for dist in dists:
        values = {
            nid: s["pluginVersions"][dist] for nid, s in summaries.items() if dist in (s.get("pluginVersions") or {})
        }
        if len(set(values.values())) > 1:
            ref, odd = _odd_ones(values, observer)
            out.append(
                {
                    "field": "pluginVersions",
                    "plugin": dist,
                    "nodes": odd,
                    "expected": ref,
                    "values": values,
                    "message": f"{', '.join(odd)} run{'s' if len(odd) == 1 else ''} {dist} "
                    f"{', '.join(sorted({str(values[n]) for n in odd}))}, the others {ref}",
                }
            )
    # the same event index with a different hash is a real divergence; a different index is lag
    by_idx: dict[Any, dict[str, Any]] = {}
    for nid, s in summaries.items():
        by_idx.setdefault(s.get("lastEventAppliedIdx"), {})[nid] = s.get("stateHash")
    for idx, hashes in by_idx.items():
        if len(set(hashes.values())) > 1:
            ref, odd = _odd_ones(hashes, observer)
            out.append(
                {
                    "field": "stateHash",
                    "nodes": odd,
                    "expected": ref,
                    "values": hashes,
                    "message": f"State diverged at event {idx}: {', '.join(odd)} hold a different State",
                }
            )
    idxs = {nid: s.get("lastEventAppliedIdx") for nid, s in summaries.items()}
    known = [i for i in idxs.values() if isinstance(i, int)]
    if known and max(known) != min(known):
        top = max(known)
        behind = sorted(n for n, i in idxs.items() if isinstance(i, int) and i < top)
        out.append(
            {
                "field": "lastEventAppliedIdx",
                "nodes": behind,
                "expected": top,
                "values": idxs,
                "message": f"{', '.join(behind)} behind event {top} (transient while events are in flight)",
                "transient": True,
            }
        )
    return out
