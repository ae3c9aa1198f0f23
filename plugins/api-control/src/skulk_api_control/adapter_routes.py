"""The route template every inference route of every API adapter follows, around `streaming.Dispatch`.

One request, one call of `generate()` / `embed()`: wait for the first chunk (for a stream, only up to
`keepalive_s`), answer an early failure as an HTTP status, then either hand the call over to a
streaming body or run it to completion, always closing the handle exactly once and answering a
departed client with 499. Before this module each adapter route spelled that out itself, and a fix
to one (a missed close, a missed disconnect) had to be made in five places.

What differs per wire format is passed in, never decided here:

* `ErrorAnswers`: how the format answers an `InferenceError` and an early error chunk;
* `complete(handle)`: the non-streaming answer (collect the chunks, build the body);
* `stream(dispatch)`: the streaming body, normally `stream_body(...)` with the format's keep-alive,
  event encoder and late-error event.

`read_json` reads a body as a JSON object under the host's limit, raising the adapter's own
`RequestError` (see `requests_common`); `canonical_model` and `listed_model_ids` are the model-name
rules the adapters' answers and model lists share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import ErrorChunk, ModelCard, NodeSurface, catalog, resolve_card
from starlette.requests import Request
from starlette.responses import Response

from .dispatch import InferenceError, InferenceHandle
from .requests_common import RequestError, parse_json_object
from .streaming import BodyTooLarge, ClientGone, Dispatch, InferenceStreamResponse, read_body

__all__ = [
    "CLIENT_CLOSED",
    "SSE_HEADERS",
    "ErrorAnswers",
    "answer",
    "canonical_model",
    "cards",
    "listed_model_ids",
    "listed_models",
    "read_json",
    "stream_body",
]

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs and tests do
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class ErrorAnswers:
    """How one wire format answers, before its first byte, a call that could not start
    (`inference`) and a call whose first chunk, or collected answer, is an error (`chunk`)."""

    inference: Callable[[InferenceError], Response]
    chunk: Callable[[ErrorChunk], Response]


async def read_json(request: Request, error: type[RequestError] = RequestError) -> dict[str, Any]:
    """The body as a JSON object under the host's size limit; mistakes raise `error` (the adapter's)."""
    try:
        body = await read_body(request)
    except BodyTooLarge as exc:
        raise error.too_large(str(exc)) from None
    return parse_json_object(body, error)


async def answer(
    request: Request,
    call: Coroutine[Any, Any, InferenceHandle],
    errors: ErrorAnswers,
    complete: Callable[[InferenceHandle], Awaitable[Response]],
    *,
    stream: Callable[[Dispatch], AsyncIterator[str]] | None = None,
    keepalive_s: float | None = None,
    media_type: str = "text/event-stream",
    headers: Mapping[str, str] | None = SSE_HEADERS,
) -> Response:
    """The HTTP answer to one inference call.

    With `stream`, the wait for the first chunk stops after `keepalive_s` (None: no limit) and the
    streaming body takes the call over (it closes it); an early error is still an HTTP status if it
    came in time. Without, `complete(handle)` runs to the end unless the client leaves (499).
    """
    dispatch = Dispatch(call)
    handing_over = False
    try:
        ready = await dispatch.wait(request, keepalive_s if stream is not None else None)
        if ready:
            handle = dispatch.handle()  # raises InferenceError: an HTTP status
            if isinstance(handle.first, ErrorChunk):
                handle.finished = True  # terminal: close() reports it finished, nothing to cancel
                return errors.chunk(handle.first)
        if stream is not None:
            handing_over = True
            return InferenceStreamResponse(stream(dispatch), dispatch.close, media_type=media_type, headers=headers)
        return await dispatch.run(request, complete(handle))
    except InferenceError as exc:
        return errors.inference(exc)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if not handing_over:
            await dispatch.close()


async def stream_body(
    dispatch: Dispatch,
    events: Callable[[InferenceHandle], AsyncIterator[str]],
    failed: Callable[[InferenceError], str],
    *,
    keepalive: str = "",
    keepalive_s: float | None = None,
    head: str | None = None,
) -> AsyncIterator[str]:
    """A streaming body: keep-alives while the first chunk is awaited, then `events(handle)`.

    `head`, when given, is sent at once (a format whose stream opens with an event); otherwise a
    call still starting gets one `keepalive` at once (the client has already waited `keepalive_s`),
    then one per `keepalive_s`. A call that fails that late is `failed(exc)` (an unexpected exception
    as a 500 server_error), since the 200 is already sent. The call is closed however this ends.
    """
    try:
        if head is not None:
            yield head
        elif keepalive and not dispatch.task.done():
            yield keepalive
        while not dispatch.task.done():
            done, _ = await asyncio.wait({dispatch.task}, timeout=keepalive_s)
            if not done and keepalive:
                yield keepalive
        try:
            handle = dispatch.handle()
        except InferenceError as exc:
            yield failed(exc)
            return
        except Exception as exc:
            log.exception("starting a stream failed")
            yield failed(InferenceError(500, f"internal error: {type(exc).__name__}", error_type="server_error"))
            return
        async for text in events(handle):
            yield text
    finally:
        await dispatch.close()


def cards(node: NodeSurface) -> dict[str, ModelCard]:
    """The node's catalog, or none when it cannot be read (a model list must still answer)."""
    try:
        return catalog(node)
    except Exception:
        return {}


def canonical_model(node: NodeSurface, ref: str) -> str:
    """The model id `ref` resolves to, or `ref` itself when it resolves to none."""
    try:
        card = resolve_card(node, ref)
    except Exception:
        return ref
    return card.model_id if card is not None else ref


def listed_models(node: NodeSurface, known: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every name the API accepts for a model, as `(name, model id)`: models with a running instance
    first (in placement order), then the rest of `known`, sorted; then the short names (the id after
    its last `/`, e.g. `SmolLM2-135M-Instruct`, which the README tells users to send) that resolve to
    exactly that model, so a client that checks the list before calling finds the name it will use;
    then the aliases a card names (`sections.aliases.names`: `whisper-1`) that resolve to it. A pair
    whose name differs from its model id is an alias: each API marks it so (`alias_of`)."""
    ids: list[str] = []
    for inst in list(node.state.instances.values()):
        placed = str(inst.shard_assignments.model_id)
        if placed not in ids and inst.system_role is None:  # a cluster service (the steward) is no user model
            ids.append(placed)
    ids += sorted(m for m in known if m not in ids)
    names = [(m, m) for m in ids]
    lowered = {m.lower() for m in ids}
    for model_id in ids:
        short = model_id.rsplit("/", 1)[-1]
        if short == model_id or short.lower() in lowered:
            continue
        if canonical_model(node, short) == model_id:
            names.append((short, model_id))
            lowered.add(short.lower())
    for model_id in ids:
        card = known.get(model_id)
        section = card.sections.get("aliases", {}) if isinstance(card, ModelCard) else {}
        for alias in section.get("names", []) if isinstance(section, dict) else []:
            if isinstance(alias, str) and alias.lower() not in lowered and canonical_model(node, alias) == model_id:
                names.append((alias, model_id))
                lowered.add(alias.lower())
    return names


def listed_model_ids(node: NodeSurface, known: Mapping[str, Any]) -> list[str]:
    """The names of `listed_models`."""
    return [name for name, _ in listed_models(node, known)]
