"""Speech models placed on first use: a request for a speech card with no instance places it.

Why: the default profile (`auto`) loads the speech plugin but places no speech model at start, so
a first run downloads nothing it does not serve. The first `/v1/audio/speech` or transcription
request for such a model places it and waits (the connection stays open) until it is ready, then
is served like any other. One placement per model however many requests arrive together; a model
that fits nowhere is answered at once with the planner's reason. `[plugins.speech]
place_on_request = false` turns it off (the request is then a 404 saying to place it first).
"""

from __future__ import annotations

import asyncio
import logging
import time

from skulk_api_control.access_log import note_model
from skulk_api_control.dispatch import InferenceError, resolve_model_id, serving_instances
from skulk_kernel.api import CommandId, ModelId, NodeSurface, PlaceInstance, new_id, resolve_card

log = logging.getLogger("skulk.speech")
READY_TIMEOUT_S = 600.0
_PLACING: dict[tuple[str, str], asyncio.Task[None]] = {}  # (node id, model id) -> the one placement


async def model_for(node: NodeSurface, ref: str, task: str, place_on_request: bool) -> str:
    """The model id to run `ref` on, placed first (and waited for) when it has no instance."""
    note_model(ref)  # the request's log line
    try:
        model_id = resolve_model_id(node, ref, task=task)
        note_model(model_id)
        return model_id
    except InferenceError as exc:
        card = resolve_card(node, ref) if exc.code == "model_not_placed" and place_on_request else None
        if card is None:
            raise
    key = (node.node_id, card.model_id)
    placing = _PLACING.get(key)
    if placing is None or placing.done():
        placing = _PLACING[key] = asyncio.ensure_future(_place_and_wait(node, card.model_id))
    await asyncio.shield(placing)  # a client that leaves does not cancel the others' placement
    note_model(card.model_id)
    return card.model_id


async def _place_and_wait(node: NodeSurface, model_id: str) -> None:
    if not any(i.shard_assignments.model_id == model_id for i in node.state.instances.values()):
        log.info("speech: %s asked for with no instance: placing it", model_id)
        outcome = await node.submit(PlaceInstance(command_id=CommandId(new_id()), model_id=ModelId(model_id)))
        if outcome.status == "refused":
            raise InferenceError(
                409, f"model {model_id!r} cannot be placed: {outcome.reason}", code="model_not_placeable"
            )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not serving_instances(node, model_id):
        if time.monotonic() > deadline:
            raise InferenceError(504, f"model {model_id!r} was placed but not ready in time", error_type="timeout")
        await asyncio.sleep(0.2)
