"""The control API: node identity, State, events, placement, instances, cancel, diagnostics.

Shapes follow the reference (camelCase State, tagged unions, `{message, command_id, instance_id,
model_card}` from /place_instance) so tools written for it work here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError
from skulk_kernel.api import (
    CancelTask,
    CommandId,
    CreateInstance,
    DeleteInstance,
    Instance,
    InstanceId,
    ModelCard,
    NodeSurface,
    PlaceInstance,
    PlacementError,
    SetTracingEnabled,
    new_id,
    resolve_card,
)
from skulk_master.memory import memory_breakdown
from skulk_master.placement import plan_placement
from skulk_worker import WORKER

from .continuation import stats_for
from .control_bodies import CreateInstanceBody, PlaceInstanceBody, TracingBody
from .ended_requests import ended_requests
from .openapi_body import body_schema
from .outcomes import outcome_error
from .placement_defaults import with_defaults
from .plugin import EVENTS
from .reference_wire import from_reference, instance_meta_error, to_reference
from .routing import router_for
from .state_view import master_log_status, state_view

log = logging.getLogger("skulk.api")
RECENT_EVENTS = 2000
_INSTANCE = TypeAdapter(Instance)


def error(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    headers = {"x-should-retry": "false"} if status < 500 else {}
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": param,
                "code": code,
            }
        },
        status_code=status,
        headers=headers,
    )


MAX_REPLICAS = 16
PLACE_CONFIRM_S = 15.0  # how long /place_instance waits for each placement's outcome
DELETE_CONFIRM_S = 15.0


class RecentEvents:
    """The last applied events, for GET /events on any node (the master also has the full log)."""

    def __init__(self) -> None:
        self.events: deque[Any] = deque(maxlen=RECENT_EVENTS)


def _overhead(node: NodeSurface) -> float | None:
    """The weights multiplier the master's planner was configured with (None: per engine, measured)."""
    planner = next(iter((getattr(node, "planners", None) or {}).values()), None)
    overhead = getattr(planner, "overhead", None)
    return overhead if isinstance(overhead, float | int) else None


def _placement_body(body: dict[str, Any]) -> PlaceInstance:
    """The PlaceInstance a /place_instance body asks for; ValueError names a bad `instance_meta`."""
    if (why := instance_meta_error(body.get("instance_meta"))) is not None:
        raise ValueError(why)
    data = {
        "command_id": new_id(),
        "model_id": body.get("model_id"),
        "sharding": body.get("sharding", "Pipeline"),
        "min_nodes": body.get("min_nodes", 1),
        "excluded_nodes": body.get("excluded_nodes") or (),  # pydantic says what is wrong with a non-list
        "context_tokens": body.get("context_tokens"),
        "kv_cache_type": body.get("kv_cache_type") or "f16",
    }
    return PlaceInstance.model_validate(data)


def _context_error(command: PlaceInstance, card: ModelCard | None) -> JSONResponse | None:
    """A 400 for a context_tokens above the card's own context length."""
    if card is None or command.context_tokens is None or command.context_tokens <= card.context_length:
        return None
    message = (
        f"context_tokens={command.context_tokens} exceeds {card.model_id}'s context length ({card.context_length})"
    )
    return error(400, message, "context_too_long", "context_tokens")


def _validation_message(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"] if not str(p)[0].isupper())
    return f"{where}: {first['msg']}", where


async def json_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's JSON object whatever its content type (curl -d sends a form type)."""
    try:
        body = await request.json()
    except ValueError:
        return error(400, "the request body must be a JSON object", "invalid_json")
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object", "invalid_json")
    return body


def add_control_routes(app: Any, node: NodeSurface) -> None:
    recent = node.services.get(EVENTS)
    if recent is None:
        recent = node.services.publish(EVENTS, RecentEvents())

    @app.get("/node_id")
    async def node_id() -> str:
        return node.node_id

    @app.get("/state")
    async def get_state() -> dict[str, Any]:
        return state_view(node)

    @app.get("/events")
    async def get_events(since: int = -1, limit: int = 500) -> dict[str, Any]:
        events = [to_reference(e.wire()) for e in recent.events if e.idx > since][: max(1, min(limit, RECENT_EVENTS))]
        return {"events": events, "lastEventAppliedIdx": node.state.last_event_applied_idx}

    async def _preview(command: PlaceInstance) -> tuple[Any, JSONResponse | None]:
        try:
            return plan_placement(node, command), None
        except PlacementError as exc:
            return None, error(503 if exc.retryable else 400, exc.message, code=exc.kind)

    @app.post("/place_instance", openapi_extra=body_schema(PlaceInstanceBody))
    async def place_instance(request: Request) -> Any:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        if not isinstance(body.get("model_id"), str):
            return error(400, "model_id is required (GET /models lists them)", "missing_model_id", "model_id")
        replicas = body.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
            return error(400, f"replicas must be an integer from 1 to {MAX_REPLICAS}", "invalid_replicas", "replicas")
        card = resolve_card(node, body["model_id"])
        try:  # the cluster's placement defaults (PUT /config) fill what the body leaves out
            command = _placement_body(with_defaults(node, body, card))
        except ValidationError as exc:  # (a ValueError too: caught first)
            message, where = _validation_message(exc)
            return error(400, message, "invalid_placement", where)
        except ValueError as exc:
            return error(400, str(exc), "invalid_instance_meta", "instance_meta")
        if (too_long := _context_error(command, card)) is not None:
            return too_long
        if card is not None:  # the master resolves it too, and refuses what its catalog lacks
            command = command.model_copy(update={"model_id": card.model_id})
        # each replica is its own placement; the master sequences them and the planner puts each
        # on a node that does not serve the model yet where one fits (planner.replicas_by_node)
        commands = [command, *(command.model_copy(update={"command_id": new_id()}) for _ in range(replicas - 1))]
        for placed, each in enumerate(commands):
            failure = outcome_error(await node.submit(each, PLACE_CONFIRM_S))
            if failure is not None:
                if placed:
                    log.warning("placed %d of %d replicas of %s before a refusal", placed, replicas, command.model_id)
                return failure
        return {
            "message": f"placing {command.model_id}" + (f" ({replicas} replicas)" if replicas > 1 else ""),
            "command_id": command.command_id,
            "instance_id": command.command_id,
            "instance_ids": [c.command_id for c in commands],
            "model_card": card.wire() if card is not None else None,
        }

    @app.post("/instance", openapi_extra=body_schema(CreateInstanceBody))
    async def create_instance(request: Request) -> Any:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            instance = _INSTANCE.validate_python(from_reference(body.get("instance", body)))
        except ValidationError as exc:
            message, where = _validation_message(exc)
            return error(400, f"instance: {message}", "invalid_instance", where)
        command = CreateInstance(command_id=CommandId(new_id()), instance=instance)
        if (failure := outcome_error(await node.submit(command))) is not None:
            return failure
        return {"message": "instance created", "command_id": command.command_id, "instance_id": instance.instance_id}

    def _previews_for(model_id: str, excluded: tuple[str, ...], options: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        width = max(1, len(node.state.topology.nodes))
        for sharding in ("Pipeline", "Tensor"):
            for min_nodes in range(1, width + 1):
                command = PlaceInstance(
                    command_id=CommandId(new_id()),
                    model_id=model_id,
                    sharding=sharding,
                    min_nodes=min_nodes,
                    excluded_nodes=excluded,
                    **options,
                )
                entry: dict[str, Any] = {
                    "model_id": model_id,
                    "sharding": sharding,
                    "instance_meta": "MlxRing",
                    "min_nodes": min_nodes,
                    "instance": None,
                    "memory_delta_by_node": {},
                    "memory_by_node": {},
                    "error": None,
                }
                try:
                    instance = plan_placement(node, command)
                except PlacementError as exc:
                    entry["error"] = exc.message
                else:
                    entry["instance"] = to_reference(instance.wire())
                    entry["engine"] = instance.engine
                    card = resolve_card(node, model_id)
                    ranks = []
                    for nid, rid in instance.shard_assignments.node_to_runner.items():
                        shard = instance.shard_assignments.runner_to_shard[rid]
                        share = (shard.end_layer - shard.start_layer) / shard.n_layers
                        entry["memory_delta_by_node"][nid] = int(card.storage_size * share) if card else 0
                        # each rank's device: its backend tag's compute (llama_rpc-cuda beside llama_rpc-metal)
                        ranks.append({"node_id": nid, "rank": shard.device_rank, "backend": shard.backend,
                                      "layers": [shard.start_layer, shard.end_layer]})  # fmt: skip
                    entry["ranks"] = sorted(ranks, key=lambda r: r["rank"])
                    entry["memory_by_node"] = memory_breakdown(card, instance, _overhead(node)) if card else {}
                out.append(entry)
        return out

    @app.get("/instance/previews")
    async def previews(
        model_id: str, excluded_node_ids: str = "", context_tokens: int | None = None, kv_cache_type: str | None = None
    ) -> Any:
        card = resolve_card(node, model_id)
        if card is None:
            return error(404, f"model {model_id!r} is not in the catalog", "model_not_found", "model_id")
        excluded = tuple(n for n in excluded_node_ids.split(",") if n)
        body = {"model_id": card.model_id, "context_tokens": context_tokens, "kv_cache_type": kv_cache_type}
        body = with_defaults(node, body, card)
        try:
            checked = _placement_body(body)
        except ValidationError as exc:
            message, where = _validation_message(exc)
            return error(400, message, "invalid_placement", where)
        if (too_long := _context_error(checked, card)) is not None:
            return too_long
        options = {"context_tokens": checked.context_tokens, "kv_cache_type": checked.kv_cache_type}
        return {"previews": _previews_for(card.model_id, excluded, options)}

    @app.get("/instance/placement")
    async def placement(
        model_id: str,
        sharding: str = "Pipeline",
        instance_meta: str = "MlxRing",
        min_nodes: int = 1,
        context_tokens: int | None = None,
        kv_cache_type: str = "f16",
    ) -> Any:
        body = {"model_id": model_id, "sharding": sharding, "instance_meta": instance_meta, "min_nodes": min_nodes}
        try:
            command = _placement_body({**body, "context_tokens": context_tokens, "kv_cache_type": kv_cache_type})
        except ValidationError as exc:  # (a ValueError too: caught first)
            message, where = _validation_message(exc)
            return error(400, message, "invalid_placement", where)
        except ValueError as exc:
            return error(400, str(exc), "invalid_instance_meta", "instance_meta")
        card = resolve_card(node, model_id)
        if (too_long := _context_error(command, card)) is not None:
            return too_long
        instance, failure = await _preview(command)
        if failure is not None:
            return failure
        breakdown = memory_breakdown(card, instance, _overhead(node)) if card is not None else {}
        return {"instance": to_reference(instance.wire()), "memory_by_node": breakdown}

    @app.get("/instance/{instance_id}")
    async def get_instance(instance_id: str) -> Any:
        inst = node.state.instances.get(InstanceId(instance_id))
        if inst is None:
            return error(404, f"no instance {instance_id!r} (GET /state lists them)", "instance_not_found")
        runners = {rid: node.state.runners.get(rid) for rid in inst.shard_assignments.runner_to_shard}
        return {
            "instance": to_reference(inst.wire()),
            "runners": {rid: (s.wire() if s is not None else None) for rid, s in runners.items()},
        }

    @app.delete("/instance/{instance_id}")
    async def delete_instance(instance_id: str) -> Any:
        if instance_id not in node.state.instances:
            return error(404, f"no instance {instance_id!r} (GET /state lists them)", "instance_not_found")
        command = DeleteInstance(command_id=CommandId(new_id()), instance_id=instance_id)
        if (failure := outcome_error(await node.submit(command, DELETE_CONFIRM_S))) is not None:
            return failure
        return {
            "message": f"deleted instance {instance_id}",
            "command_id": command.command_id,
            "instance_id": instance_id,
        }

    @app.post("/v1/cancel/{command_id}")
    async def cancel(command_id: str) -> Any:
        known = command_id in node.state.tasks or command_id in node.streams.open_ids()
        if not known and command_id in ended_requests(node):  # the request ended as the cancel came
            return {"message": "the request had already ended", "command_id": command_id, "ended": True}
        if not known:
            return error(404, f"no running request with command id {command_id!r}", "command_not_found")
        outcome = await node.submit(CancelTask(command_id=CommandId(new_id()), task_command_id=command_id))
        if (failure := outcome_error(outcome)) is not None:
            return failure
        return {"message": "cancel requested", "command_id": command_id}

    @app.get("/v1/tracing")
    async def get_tracing() -> dict[str, Any]:
        return {"enabled": node.state.tracing_enabled}

    @app.put("/v1/tracing", openapi_extra=body_schema(TracingBody))
    async def put_tracing(request: Request) -> Any:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        if not isinstance(body.get("enabled"), bool):
            return error(400, 'body must be {"enabled": true|false}', param="enabled")
        outcome = await node.submit(SetTracingEnabled(command_id=CommandId(new_id()), enabled=body["enabled"]))
        if (failure := outcome_error(outcome)) is not None:
            return failure
        return {"enabled": node.state.tracing_enabled}

    @app.get("/v1/diagnostics/cluster")
    async def cluster_diagnostics(request: Request) -> dict[str, Any]:
        """The cluster as this node sees it, plus (with the observe plugin) every node's own report
        (versions, view of the master, state hash) with the mismatches called out."""
        local = _local_cluster_view()
        try:
            from skulk_observe.diagnostics import cluster_view
        except ImportError:  # observability is optional
            return local
        return await cluster_view(node, local, dict(request.headers))

    def _local_cluster_view() -> dict[str, Any]:
        view = state_view(node)
        members = sorted(set(node.state.topology.nodes) | node.readings.nodes())
        nodes = []
        for nid in members:
            heard = node.readings.last_heard(nid)
            identity = view["nodeIdentities"].get(nid, {})
            hosted = [iid for iid, inst in node.state.instances.items() if nid in inst.shard_assignments.node_to_runner]
            nodes.append(
                {
                    "nodeId": nid,
                    "friendlyName": identity.get("friendlyName"),
                    "skulkVersion": identity.get("skulkVersion"),
                    "isMaster": nid == node.master_id,
                    "inTopology": nid in node.state.topology.nodes,
                    "reachable": nid in node.reachable_nodes(),
                    "lastHeardS": None if heard is None else round(heard, 2),
                    "health": view["nodeHealth"].get(nid),
                    "instances": hosted,
                    "backends": view["nodeResources"].get(nid, {}).get("backends", []),
                    "ramAvailable": view["nodeMemory"].get(nid, {}).get("ramAvailable", {}).get("inBytes"),
                }
            )
        return {
            "observerNodeId": node.node_id,
            "masterNodeId": node.master_id,
            "lastEventAppliedIdx": node.state.last_event_applied_idx,
            "stateHash": node.state.state_hash(),
            "nodes": nodes,
            "missing": [c.wire() for c in node.state.topology.missing],
            "instanceFailures": [f.wire() for f in node.state.instance_failures[-20:]],
        }

    @app.get("/v1/diagnostics/node")
    async def diagnostics() -> dict[str, Any]:
        worker = node.services.get(WORKER)
        log_status = master_log_status(node)
        return {
            "runtime": node.runtime_info(),
            "supervisorRunners": worker.diagnostics() if worker is not None else [],
            "eventLog": dataclasses.asdict(log_status) if log_status is not None else None,
            "hookFailures": [{"hook": h, "plugin": p, "error": e} for h, p, e in node.hooks.failures[-20:]],
            "openStreams": len(node.streams.open_ids()),
            "resumes": stats_for(node).describe(),
            "routing": router_for(node).describe(),
            "stateHash": node.state.state_hash(),
            "transports": {
                plane: (t.describe() if hasattr(t, "describe") else {"name": t.name})
                for plane, t in node.transports.items()
            },
            "healthNotes": node.health_notes,
            "lastEventAppliedIdx": node.state.last_event_applied_idx,
            "observe": _observe_section(node),
        }


def _observe_section(node: NodeSurface) -> dict[str, Any] | None:
    """The observe plugin's part of node diagnostics (flight recorder, versions), if it is here."""
    try:
        from skulk_observe.diagnostics import node_section
    except ImportError:
        return None
    return node_section(node)
