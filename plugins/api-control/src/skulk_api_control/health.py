"""`GET /health` (and `/v1/health`): may a load balancer or a benchmark send this node requests?

Tools written for vLLM's server (guidellm, load balancers, Kubernetes probes) check `/health` before
anything else and stop at a 404. The answer is 200 only when a request sent here can be served:

* the node is not stopping;
* it knows a master (requests are dispatched through the master's State; without one every
  inference request would wait and then fail);
* it is a member of that master's topology (it has joined: State lists it);
* no plugin reported a health note that blocks serving. Notes are informational by default (a
  mismatched peer, low disk, a hardware conflict: the node still serves); a plugin marks one that
  does block with a code starting ``blocks_serving`` (``node.health_notes[plugin][code]``).

Otherwise 503 with every reason, each `{code, message}`, so whoever reads it knows what to fix.
Models are not part of the verdict: a node with nothing placed still serves (it answers the
model's 404 with how to place it) and a probe must not flap while a model loads. Public, like
vLLM's: the auth gate lets it through without a key (it says nothing a caller could use).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from skulk_kernel.api import NodeSurface, instance_ready

BLOCKING_NOTE = "blocks_serving"  # prefix of a health-note code that makes /health answer 503
HEALTH_PATHS = ("/health", "/v1/health")


def unserving_reasons(node: NodeSurface) -> list[dict[str, str]]:
    """Why this node cannot serve now (empty: it can)."""
    reasons = []
    if node.stopping:
        reasons.append({"code": "stopping", "message": "the node is shutting down"})
    if node.master_id is None:
        reasons.append(
            {
                "code": "no_master",
                "message": "no master is known: the node has not joined a cluster or an election is under way",
            }
        )
    elif node.node_id not in node.state.topology.nodes:
        reasons.append(
            {
                "code": "not_joined",
                "message": f"the master ({node.master_id}) has not added this node to the cluster's topology yet",
            }
        )
    for plugin, notes in node.health_notes.items():
        for code, message in notes.items():
            if code.startswith(BLOCKING_NOTE):
                reasons.append({"code": code, "message": f"{plugin}: {message}"})
    return reasons


def health_body(node: NodeSurface) -> tuple[int, dict[str, Any]]:
    """(status, body) of a /health answer."""
    reasons = unserving_reasons(node)
    ready = sum(1 for inst in node.state.instances.values() if instance_ready(inst, node.state.runners))
    body: dict[str, Any] = {
        "status": "unavailable" if reasons else "ok",
        "nodeId": node.node_id,
        "masterNodeId": node.master_id,
        "readyInstances": ready,
        "notes": node.health_notes,  # informational ones too: a probe that logs the body sees them
    }
    if reasons:
        body["reasons"] = reasons
    return (503 if reasons else 200), body


def add_health_routes(app: Any, node: NodeSurface) -> None:
    async def health() -> JSONResponse:
        status, body = health_body(node)
        return JSONResponse(body, status_code=status)

    for path in HEALTH_PATHS:
        app.add_api_route(
            path,
            health,
            methods=["GET"],
            tags=["control"],
            summary="Whether this node serves requests (200) or not (503, with the reasons)",
        )
        app.add_api_route(path, health, methods=["HEAD"], include_in_schema=False)  # load balancers' probes
