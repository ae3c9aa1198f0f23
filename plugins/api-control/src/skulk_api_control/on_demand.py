"""Models on demand: a request for a catalog model with no instance places it and waits for it.

Why: Ollama's and LocalAI's users (`ollama run`, Open WebUI) expect the first request to load the
model. Every API (OpenAI chat, completions, responses and embeddings, Anthropic messages, Ollama
chat/generate/embed, speech) resolves its model here, through `dispatch.generate`/`embed` or the
speech plugin, so there is one mechanism, not one per API:

* a request for a catalog model with no instance places it (`PlaceInstance`) and waits, before
  its response starts, until an instance is ready; a streaming client sees the wait as its time to
  first token. One placement per model however many requests arrive together (they share one
  future; a client that leaves does not cancel it for the others);
* a model that fits nowhere is answered at once: 409 with the planner's reason;
* the instance is marked as placed on demand (the master's plugin data, see
  `skulk_master.keep_alive`), so the master removes it after `keep_alive` of idleness. A request
  may carry its own keep_alive (Ollama's field, `note_keep_alive`): it updates the mark;
* `[plugins.master] place_on_request = false` turns it off (the 404 saying to place it first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from datetime import UTC, datetime

from skulk_kernel.api import CommandId, ModelId, NodeSurface, PlaceInstance, SetPluginData, new_id, resolve_card
from skulk_master import MASTER
from skulk_master.keep_alive import PLUGIN as MARKS_PLUGIN
from skulk_master.keep_alive import mark_key, marks, parse_keep_alive

from .access_log import note_model
from .dispatch import InferenceError, resolve_model_id, serving_instances

__all__ = ["expires_at", "model_for", "note_keep_alive", "parse_keep_alive"]
log = logging.getLogger("skulk.on_demand")
READY_TIMEOUT_S = 600.0  # a model's download and load, at most
RETRY_REFUSED_S = 10.0  # a placement refused as retryable (telemetry not in yet) is tried again this long
_PLACING: dict[tuple[str, str], asyncio.Task[None]] = {}  # (node id, model id) -> the one placement
# this request's own keep_alive: None when it gave none, else (seconds or None for the master's default,)
KEEP_ALIVE: ContextVar[tuple[float | None] | None] = ContextVar("skulk_keep_alive", default=None)


def note_keep_alive(seconds: float | None) -> None:
    """This request's own keep_alive in seconds (Ollama's field; None: the master's default)."""
    KEEP_ALIVE.set((seconds,))


def enabled(node: NodeSurface) -> bool:
    """`[plugins.master] place_on_request` as this node's master plugin reads it (on by default)."""
    master = node.services.get(MASTER)
    return master is None or master.config.place_on_request


def replaced_meanwhile(node: NodeSurface, exc: InferenceError) -> bool:
    """The master found no instance although this node saw one: removed (keep_alive) in between."""
    return exc.code == "model_not_placed" and enabled(node)


async def model_for(node: NodeSurface, ref: str, task: str, place_on_request: bool | None = None) -> str:
    """The model id to run `ref` on, placed first (and waited for) when it has no instance."""
    note_model(ref)  # the request's log line
    place = enabled(node) if place_on_request is None else place_on_request
    try:
        model_id = resolve_model_id(node, ref, task=task)
    except InferenceError as exc:
        card = resolve_card(node, ref) if exc.code == "model_not_placed" and place else None
        if card is None:
            raise
        model_id = card.model_id
    key = (node.node_id, model_id)
    placing = _PLACING.get(key)
    if place and not serving_instances(node, model_id) and (placing is None or placing.done()):
        if not any(i.shard_assignments.model_id == model_id for i in node.state.instances.values()):
            placing = _PLACING[key] = asyncio.ensure_future(_place_and_wait(node, model_id))
    if placing is not None and not placing.done():
        await asyncio.shield(placing)  # a client that leaves does not cancel the others' placement
    await _renew(node, model_id)
    note_model(model_id)
    return model_id


async def _place_and_wait(node: NodeSurface, model_id: str) -> None:
    log.info("%s asked for with no instance: placing it", model_id)
    deadline = time.monotonic() + RETRY_REFUSED_S
    while True:  # if_absent: however many API nodes ask at once (or the master's default models), one instance
        command_id = CommandId(new_id())
        place = PlaceInstance(command_id=command_id, model_id=ModelId(model_id), if_absent=True)
        outcome = await node.submit(place)
        if outcome.status != "refused" or not outcome.retryable or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    if outcome.status == "refused":
        raise InferenceError(
            409, f"model {model_id!r} cannot be placed: {outcome.reason}", code="model_not_placeable", param="model"
        )
    if not outcome.ok:
        raise InferenceError(503, f"model {model_id!r} could not be placed: {outcome.status} (no master yet?); retry")
    if command_id in node.state.instances:  # ours (the planner names an instance after its command)
        given = KEEP_ALIVE.get()
        entries = ((mark_key(command_id), {"seconds": given[0] if given else None}),)
        await node.submit(SetPluginData(command_id=CommandId(new_id()), plugin=MARKS_PLUGIN, entries=entries))
    ready_by = time.monotonic() + READY_TIMEOUT_S
    while not serving_instances(node, model_id):
        if time.monotonic() > ready_by:
            raise InferenceError(504, f"model {model_id!r} was placed but not ready in time", error_type="timeout")
        if not any(i.shard_assignments.model_id == model_id for i in node.state.instances.values()):
            failure = next((f.reason for f in reversed(node.state.instance_failures) if f.model_id == model_id), "")
            raise InferenceError(503, f"model {model_id!r} was placed but its instance ended: {failure or 'deleted'}")
        await asyncio.sleep(0.2)


async def _renew(node: NodeSurface, model_id: str) -> None:
    """A request that carries its own keep_alive sets it on the model's on-demand instances."""
    given = KEEP_ALIVE.get()
    if given is None:
        return
    keep = given[0]
    value = {"seconds": keep}
    found = marks(node.state)
    entries = tuple(
        (mark_key(i), value)
        for i, inst in node.state.instances.items()
        if inst.shard_assignments.model_id == model_id and i in found and found[i].seconds != keep
    )
    if entries:
        await node.submit(SetPluginData(command_id=CommandId(new_id()), plugin=MARKS_PLUGIN, entries=entries))


def expires_at(node: NodeSurface, instance_id: str) -> str | None:
    """When an on-demand instance will be removed if it stays idle (RFC 3339), from this node's copy
    of the master's idle clock (every node keeps one); None for instances that stay until deleted."""
    master = node.services.get(MASTER)
    if master is None:
        return None
    at = master.idle.expires_at(node.state, instance_id, master.config.keep_alive_s, datetime.now(UTC))
    return at.isoformat().replace("+00:00", "Z") if at is not None else None
