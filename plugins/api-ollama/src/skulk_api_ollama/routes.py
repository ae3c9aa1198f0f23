"""The Ollama routes, under both `/api/*` and `/ollama/api/*`, and the `/` liveness answer.

Every inference goes through the API host's one dispatch path (`skulk_api_control.dispatch.generate` /
`embed`); this module only reads the request, picks the HTTP answer and hands chunks to `wire`.

Errors known before the first byte are HTTP statuses with `{"error": "text"}` (4xx with
`x-should-retry: false`); later ones are a `{"error": "text"}` NDJSON line.

Model names: Ollama clients send names with a tag (`echo:latest`, `skulk/echo:latest`). A name is
used as is when the catalog resolves it (or an instance runs it); otherwise a `:latest` tag is
dropped and the rest resolved (the kernel's resolver also matches an id's last path part, so
`echo:latest` -> `skulk/echo`). Lists show `<id>:latest` for ids without a tag, as Ollama does.
Responses echo the model name the client sent, as Ollama does.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from skulk_api_control.adapter_routes import ErrorAnswers, answer, cards, listed_models, read_json, stream_body
from skulk_api_control.dispatch import (
    InferenceError,
    InferenceHandle,
    embed,
    generate,
    resolve_model_id,
    serving_instances,
)
from skulk_api_control.on_demand import expires_at, model_for, note_keep_alive, parse_keep_alive
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.streaming import Dispatch
from skulk_api_control.wire_common import collect_embeddings, error_status
from skulk_kernel.api import EmbeddingParams, ModelCard, NodeSurface, resolve_card
from starlette.types import ASGIApp, Receive, Scope, Send

from . import wire
from .modelfile import ollama_section, show_fields, with_modelfile
from .requests import (
    GenerationRequest,
    RequestError,
    model_name,
    parse_chat,
    parse_embed,
    parse_embeddings,
    parse_generate,
)
from .schemas import OllamaChatIn, OllamaEmbeddingsIn, OllamaEmbedIn, OllamaGenerateIn, OllamaShowIn

NDJSON = "application/x-ndjson"
RUNNING = "Ollama is running"
NEVER_EXPIRES = "2999-12-31T23:59:59Z"  # default models and explicit placements stay until deleted
PREFIXES = ("/api", "/ollama/api")


def keep_alive(data: dict[str, Any]) -> float | None:
    """The request's `keep_alive` (seconds), noted for on-demand placement (`skulk_api_control.on_demand`)."""
    if data.get("keep_alive") is None:
        return None
    try:
        seconds = parse_keep_alive(data["keep_alive"])
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    note_keep_alive(seconds)
    return seconds


def ollama_error(status: int, message: str) -> JSONResponse:
    headers = {"x-should-retry": "false"} if 400 <= status < 500 else {}
    return JSONResponse({"error": message}, status_code=status, headers=headers)


ERRORS = ErrorAnswers(
    inference=lambda exc: ollama_error(exc.status, exc.message),
    chunk=lambda chunk: ollama_error(error_status(chunk), chunk.message),
)


class OllamaRoot:
    """`GET /` and `HEAD /` answer "Ollama is running" (Ollama's liveness check).

    A middleware rather than a route, so a dashboard that owns `/` still gets browsers: when another
    plugin registered `/` and the client accepts text/html, the request passes through.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope.get("method") in ("GET", "HEAD")
            and scope.get("path") in ("/", "/ollama", "/ollama/")
        ):
            accept = dict(scope.get("headers", ())).get(b"accept", b"").decode("latin-1")
            owned = scope.get("path") == "/" and _root_route_exists(scope)
            if not (owned and "text/html" in accept):
                await PlainTextResponse(RUNNING)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _root_route_exists(scope: Scope) -> bool:
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", ())
    return any(getattr(r, "path", None) in ("/", "") for r in routes)  # a route at / or a mount at /


def display_name(model_id: str) -> str:
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + ":latest"


def digest(model_id: str) -> str:
    return hashlib.sha256(model_id.encode()).hexdigest()


def details(card: ModelCard | None) -> dict[str, Any]:
    family = card.family if card else ""
    return {
        "parent_model": "",
        "format": "gguf" if card and card.gguf_file else "",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": "",
        "quantization_level": card.quantization if card else "",
    }


def capabilities(card: ModelCard | None) -> list[str]:
    if card is None:
        return ["completion"]
    caps = []
    if "TextGeneration" in card.tasks:
        caps.append("completion")
    if "TextEmbedding" in card.tasks:
        caps.append("embedding")
    have = set(card.capabilities)
    if "tools" in have:
        caps.append("tools")
    if have & {"thinking", "reasoning"}:
        caps.append("thinking")
    if have & {"vision", "image"}:
        caps.append("vision")
    return caps


def add_ollama_routes(app: FastAPI, node: NodeSurface, *, version: str) -> None:
    app.add_middleware(OllamaRoot)
    modified_at = wire.rfc3339(node.started_at)

    def route(method: str, path: str, **kwargs: Any) -> Any:
        """Registers the handler under every prefix (`/api/...` and `/ollama/api/...`)."""

        def register(fn: Any) -> Any:
            for i, prefix in enumerate(PREFIXES):
                app.add_api_route(
                    prefix + path, fn, methods=[method], tags=["ollama"], include_in_schema=i == 0, **kwargs
                )
            return fn

        return register

    def resolve(name: str) -> str:
        """The model id for an Ollama model name (see the module docstring)."""
        candidates = [name]
        base, sep, tag = name.rpartition(":")
        if sep and base and tag == "latest":
            candidates.append(base)
        placed = {i.shard_assignments.model_id for i in list(node.state.instances.values())}
        for ref in candidates:
            if ref in placed:
                return ref
            try:
                card = resolve_card(node, ref)
            except Exception:
                card = None
            if card is not None:
                return card.model_id
        return candidates[-1]

    # --- chat and generate -----------------------------------------------------------------------

    async def run_generation(request: Request, kind: str) -> Response:
        timing = wire.Timing()
        try:
            data = await read_json(request, RequestError)
            if isinstance(data.get("model"), str):  # a created model's SYSTEM and PARAMETERs (modelfile.py)
                data = with_modelfile(data, ollama_section(cards(node).get(resolve(data["model"]))))
            req: GenerationRequest = parse_chat(data) if kind == "chat" else parse_generate(data)
            keep = keep_alive(data)
        except RequestError as exc:
            return ollama_error(exc.status, exc.message)
        model_id = resolve(req.model)
        if req.params is None:  # a load request: answer once the model is served (placed first on demand)
            try:
                await model_for(node, model_id, "TextGeneration", place_on_request=None if keep != 0 else False)
            except InferenceError as exc:
                return ollama_error(exc.status, exc.message)
            body = wire.load_body(req.model, kind)
            if req.stream:
                return Response(wire.line(body), media_type=NDJSON)
            return JSONResponse(body)
        params = req.params.model_copy(update={"model_id": model_id})

        async def complete(handle: InferenceHandle) -> Response:
            got = await wire.collect(handle.chunks(), timing)
            if got.error is not None:
                return ERRORS.chunk(got.error)
            if kind == "chat":
                return JSONResponse(wire.chat_body(got, model=req.model, timing=timing))
            return JSONResponse(wire.generate_body(got, model=req.model, timing=timing, turns=req.turns))

        def stream(dispatch: Dispatch) -> AsyncIterator[str]:
            encoder = wire.StreamEncoder(model=req.model, kind=kind, timing=timing, turns=req.turns)
            return stream_body(
                dispatch, lambda handle: encoder.lines(handle.chunks()), lambda exc: wire.line({"error": exc.message})
            )

        call = generate(node, params)
        return await answer(
            request, call, ERRORS, complete, stream=stream if req.stream else None, media_type=NDJSON, headers=None
        )

    @route("POST", "/chat", openapi_extra=body_schema(OllamaChatIn))
    async def post_chat(request: Request) -> Response:
        """Ollama chat: NDJSON stream unless `"stream": false`."""
        return await run_generation(request, "chat")

    @route("POST", "/generate", openapi_extra=body_schema(OllamaGenerateIn))
    async def post_generate(request: Request) -> Response:
        """Ollama generate (`raw: true` sends the prompt untemplated): NDJSON unless `"stream": false`."""
        return await run_generation(request, "generate")

    # --- embeddings ------------------------------------------------------------------------------

    async def run_embedding(
        request: Request, params: EmbeddingParams, respond: Callable[[list[list[float]], int], Response]
    ) -> Response:
        """`respond(vectors, prompt_tokens)`, or an error response."""

        async def complete(handle: InferenceHandle) -> Response:
            got = await collect_embeddings(handle.chunks())
            if got.error is not None:
                return ERRORS.chunk(got.error)
            if len(got.vectors) != len(params.inputs):
                return ollama_error(
                    500, f"the engine returned {len(got.vectors)} embeddings for {len(params.inputs)} inputs"
                )
            return respond([list(v) for v in got.vectors], got.prompt_tokens)

        return await answer(request, embed(node, params), ERRORS, complete)

    @route("POST", "/embed", openapi_extra=body_schema(OllamaEmbedIn))
    async def post_embed(request: Request) -> Response:
        """`input`: a string or a list of strings -> `embeddings: [[...]]`."""
        started = wire.Timing()
        try:
            data = await read_json(request, RequestError)
            model, params = parse_embed(data)
            keep_alive(data)
        except RequestError as exc:
            return ollama_error(exc.status, exc.message)

        def respond(vectors: list[list[float]], prompt_tokens: int) -> Response:
            started.end()
            total = max(started.end_ns - started.start_ns, 1)
            return JSONResponse(
                {
                    "model": model,
                    "embeddings": vectors,
                    "total_duration": total,
                    "load_duration": 1,
                    "prompt_eval_count": prompt_tokens,
                }
            )

        return await run_embedding(request, params.model_copy(update={"model_id": resolve(model)}), respond)

    @route("POST", "/embeddings", openapi_extra=body_schema(OllamaEmbeddingsIn))
    async def post_embeddings(request: Request) -> Response:
        """Legacy: one `prompt` -> `embedding: [...]` (an empty prompt gives an empty embedding)."""
        try:
            model, prompt = parse_embeddings(await read_json(request, RequestError))
        except RequestError as exc:
            return ollama_error(exc.status, exc.message)
        model_id = resolve(model)
        if not prompt:
            try:
                resolve_model_id(node, model_id, task="TextEmbedding")
            except InferenceError as exc:
                return ollama_error(exc.status, exc.message)
            return JSONResponse({"embedding": []})
        params = EmbeddingParams(model_id=model_id, inputs=(prompt,))
        return await run_embedding(request, params, lambda vectors, _: JSONResponse({"embedding": vectors[0]}))

    # --- models ----------------------------------------------------------------------------------

    def tag_entry(model_id: str, card: ModelCard | None, canonical_id: str | None = None) -> dict[str, Any]:
        name = display_name(model_id)
        model_id = canonical_id or model_id  # a short name has the digest of the model it names
        return {
            "name": name,
            "model": name,
            "modified_at": modified_at,
            "size": card.storage_size if card else 0,
            "digest": digest(model_id),
            "details": details(card),
        } | ({"alias_of": display_name(model_id)} if name != display_name(model_id) else {})  # a short name

    @route("GET", "/tags")
    async def get_tags() -> dict[str, Any]:
        """Every model this cluster knows: those with an instance first, then the catalog."""
        known = cards(node)
        return {"models": [tag_entry(name, known.get(m), m) for name, m in listed_models(node, known)]}

    @route("GET", "/ps")
    async def get_ps() -> dict[str, Any]:
        """Models with a ready instance (one entry per model)."""
        known = cards(node)
        models = []
        seen: set[str] = set()
        for inst in list(node.state.instances.values()):
            model_id = inst.shard_assignments.model_id
            if model_id in seen or inst.system_role is not None or not serving_instances(node, model_id):
                continue
            seen.add(model_id)
            card = known.get(model_id)
            size = card.storage_size if card else 0
            backends = {s.backend for s in inst.shard_assignments.runner_to_shard.values()}
            on_gpu = any(tag in b for b in backends for tag in ("cuda", "metal", "mlx", "rocm", "vulkan"))
            models.append(
                {
                    **tag_entry(model_id, card),
                    "expires_at": expires_at(node, inst.instance_id) or NEVER_EXPIRES,
                    "size_vram": size if on_gpu else 0,
                    "context_length": inst.context_limit,
                }
            )
        return {"models": models}

    @route("POST", "/show", openapi_extra=body_schema(OllamaShowIn))
    async def post_show(request: Request) -> Response:
        """Details of one model (`model`, or `name` from older clients); `model_info` always present."""
        try:
            data = await read_json(request, RequestError)
            name = model_name(data, "model", "name")
        except RequestError as exc:
            return ollama_error(exc.status, exc.message)
        model_id = resolve(name)
        card = cards(node).get(model_id)
        placed = [i for i in list(node.state.instances.values()) if i.shard_assignments.model_id == model_id]
        if card is None and not placed:
            return ollama_error(404, f"model '{name}' not found")
        arch = (card.family if card else "") or "unknown"
        info: dict[str, Any] = {"general.architecture": arch, "general.basename": model_id}
        if card is not None:
            info.update(
                {
                    f"{arch}.context_length": card.context_length,
                    f"{arch}.embedding_length": card.embedding_dimensions or card.hidden_size,
                    f"{arch}.block_count": card.n_layers,
                    f"{arch}.attention.head_count_kv": card.num_key_value_heads,
                }
            )
        return JSONResponse(
            {
                **show_fields(card, model_id),  # modelfile, parameters, template, system, license
                "details": details(card),
                "model_info": info,
                "capabilities": capabilities(card),
                "modified_at": modified_at,
            }
        )

    @route("GET", "/version")
    async def get_version() -> dict[str, str]:
        """The Ollama API version this adapter follows (`[plugins.api-ollama] version`)."""
        return {"version": version}
