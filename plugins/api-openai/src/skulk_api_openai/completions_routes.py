"""The text-completion routes: `/v1/completions` (JSON or SSE) and vLLM's `/tokenize` and `/detokenize`.

They follow the route template every inference route does (`adapter_routes.answer`: the first
chunk awaited, early errors as HTTP statuses in OpenAI's shape, keep-alives while a stream waits,
499 for a departed client), with every choice of a request started together (`choices.py`). The
request bodies are declared to the OpenAPI document from their pydantic models, but read by hand
(`completions_requests.py`) so a mistake is a 400 in OpenAI's error shape, never FastAPI's 422.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from skulk_api_control.adapter_routes import ErrorAnswers, answer, canonical_model, read_json, stream_body
from skulk_api_control.dispatch import InferenceError, InferenceHandle
from skulk_api_control.streaming import Dispatch
from skulk_api_control.wire_common import is_keepalive
from skulk_kernel.api import NodeSurface, PrefillProgressChunk, TextGenerationParams, resolve_card

from . import completions
from .chat import KEEPALIVE
from .choices import ChoiceHandles, start_choices
from .completions_requests import (
    CompletionRequest,
    CompletionsRequest,
    DetokenizeRequest,
    TokenizeRequest,
    detokenize_params,
    parse_completion_request,
    tokenize_params,
)
from .requests import RequestError


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring `model` as the JSON request body (the route still reads it itself); nested
    models are inlined, since pydantic's `#/$defs/...` references mean nothing inside an OpenAPI document."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(part: Any) -> Any:
        if isinstance(part, dict):
            ref = part.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in part.items()}
        if isinstance(part, list):
            return [inline(v) for v in part]
        return part

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


def add_completion_routes(
    app: FastAPI,
    node: NodeSurface,
    *,
    keepalive_s: float,
    canonical: Callable[[str], str],
    fingerprint: str,
    errors: ErrorAnswers,
    request_error: Callable[[RequestError], JSONResponse],
) -> None:
    @app.post("/v1/completions", tags=["openai"], openapi_extra=_body(CompletionRequest))
    @app.post("/completions", include_in_schema=False)
    async def post_completions(request: Request) -> Response:
        """OpenAI text completions: `prompt` as text, token ids or a list (one choice each), `suffix`
        (fill in the middle), `echo`, `logprobs`, `n`, `stop`; JSON or SSE with `stream: true`."""
        try:
            req = parse_completion_request(await read_json(request, RequestError))
        except RequestError as exc:
            return request_error(exc)
        model = canonical(req.model)
        created = int(time.time())

        async def complete(handle: InferenceHandle) -> Response:
            got = await _collect(cast(ChoiceHandles, handle), req)
            failed = next((c.error for c in got if c.error is not None), None)
            if failed is not None:
                return errors.chunk(failed)
            return JSONResponse(
                completions.completion_body(
                    got,
                    completion_id=f"cmpl-{handle.command_id}",
                    created=created,
                    model=model,
                    fingerprint=fingerprint,
                    n=req.n,
                )
            )

        def stream(dispatch: Dispatch) -> AsyncIterator[str]:
            async def events(handle: InferenceHandle) -> AsyncIterator[str]:
                yield f": command_id {handle.command_id}\n\n"
                encoder = completions.CompletionStreamEncoder(
                    completion_id=f"cmpl-{handle.command_id}", created=created, model=model, fingerprint=fingerprint
                )
                async for line in _events(cast(ChoiceHandles, handle), req, encoder):
                    yield line

            def failed(exc: InferenceError) -> str:
                return completions.CompletionStreamEncoder.error(exc.message, exc.error_type, exc.code)

            return stream_body(dispatch, events, failed, keepalive=KEEPALIVE, keepalive_s=keepalive_s)

        call = start_choices(node, req.choices)
        return await answer(
            request, call, errors, complete, stream=stream if req.stream else None, keepalive_s=keepalive_s
        )

    async def read_prompt(request: Request, params: TextGenerationParams) -> completions.Choice | Response:
        """Run a read-only completion (tokenize/detokenize): its one choice, or the error answer."""
        got: list[completions.Choice] = []

        async def complete(handle: InferenceHandle) -> Response:
            got.extend(await _collect(cast(ChoiceHandles, handle), None))
            return Response()

        answered = await answer(request, start_choices(node, [params]), errors, complete)
        if not got:
            return answered
        if got[0].error is not None:
            return errors.chunk(got[0].error)
        return got[0]

    @app.post("/tokenize", tags=["openai"], openapi_extra=_body(TokenizeRequest))
    async def post_tokenize(request: Request) -> Response:
        """vLLM's tokenize: `prompt`'s token ids on a placed model, as its engine reads a completion prompt."""
        try:
            params = tokenize_params(await read_json(request, RequestError), lambda: default_model(node))
        except RequestError as exc:
            return request_error(exc)
        got = await read_prompt(request, params)
        if isinstance(got, Response):
            return got
        ids = list(got.prompt_ids)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": _context(node, params.model_id)})

    @app.post("/detokenize", tags=["openai"], openapi_extra=_body(DetokenizeRequest))
    async def post_detokenize(request: Request) -> Response:
        """vLLM's detokenize: the text of `tokens` on a placed model."""
        try:
            params = detokenize_params(await read_json(request, RequestError), lambda: default_model(node))
        except RequestError as exc:
            return request_error(exc)
        got = await read_prompt(request, params)
        if isinstance(got, Response):
            return got
        return JSONResponse({"prompt": "".join(got.text)})

    @app.get("/tokenizer_info", tags=["openai"])
    async def get_tokenizer_info(model: str | None = None) -> Response:
        """vLLM's tokenizer_info, as far as the cluster knows it without asking an engine: the model and its
        context; the special tokens are null (unknown). lm-eval's `local-completions` finds `/tokenize` and
        `/detokenize` through it (its `remote` tokenizer)."""
        try:
            model_id = canonical(model) if model else default_model(node)
        except RequestError as exc:
            return request_error(exc)
        return JSONResponse(
            {
                "model": model_id,
                "max_model_len": _context(node, model_id),
                "eos_token": None,
                "bos_token": None,
                "pad_token": None,
                "chat_template": None,
            }
        )


def default_model(node: NodeSurface) -> str:
    """The model a tokenizer route means when the body names none: the one placed text model."""
    placed = sorted(
        {
            str(inst.shard_assignments.model_id)
            for inst in list(node.state.instances.values())
            if inst.system_role is None and _generates(node, str(inst.shard_assignments.model_id))
        }
    )
    if len(placed) != 1:
        which = f"{len(placed)} text models are placed ({', '.join(placed)})" if placed else "no text model is placed"
        raise RequestError(f"model: required, since {which}", param="model")
    return placed[0]


def _generates(node: NodeSurface, model_id: str) -> bool:
    try:
        card = resolve_card(node, model_id)
    except Exception:
        return False
    return card is None or "TextGeneration" in card.tasks


def _context(node: NodeSurface, ref: str) -> int | None:
    """The context limit of the model's first placed instance (what prompt + max_tokens must fit)."""
    model_id = canonical_model(node, ref)
    for inst in list(node.state.instances.values()):
        if inst.shard_assignments.model_id == model_id:
            return int(inst.context_limit)
    return None


async def _collect(handle: ChoiceHandles, req: CompletionsRequest | None) -> list[completions.Choice]:
    want = req is not None and req.logprobs is not None
    choices = [completions.Choice(i, want) for i in range(len(handle.handles))]
    async for index, chunk in handle.merged():
        choices[index].add(chunk)
    return choices


async def _events(
    handle: ChoiceHandles, req: CompletionsRequest, encoder: completions.CompletionStreamEncoder
) -> AsyncIterator[str]:
    """One event per piece of text, a finish event per choice; an error ends the stream (no [DONE])."""
    choices = [completions.Choice(i, req.logprobs is not None) for i in range(len(handle.handles))]
    async for index, chunk in handle.merged():
        if isinstance(chunk, PrefillProgressChunk):  # a long prompt being read or scored: keep the client's wait alive
            yield f": prefill_progress {chunk.processed}/{chunk.total}\n\n"
            continue
        if is_keepalive(chunk):  # work going on that shows nothing yet
            yield KEEPALIVE
            continue
        choice = choices[index]
        added = choice.add(chunk)
        if choice.error is not None:
            err = choice.error
            failed = chunk.finish_reason == "error"
            yield encoder.failed() if failed else encoder.error(err.message, err.error_type, err.code)
            return
        if added is not None and added[0]:
            yield encoder.event(index, added[0], added[1])
        if chunk.finish_reason is not None:
            yield encoder.event(index, "", None, completions.wire_finish(chunk.finish_reason))
    if req.include_usage:
        yield encoder.usage(completions.usage_body(choices, req.n))
    yield encoder.done
