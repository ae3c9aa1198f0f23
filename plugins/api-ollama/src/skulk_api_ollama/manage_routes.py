"""Ollama's model management: `/api/pull`, `/api/create`, `/api/copy`, `/api/delete`, `/api/push`, `/api/blobs`.

`ollama pull` is how Ollama users add a model, and `ollama create` how they give one a system prompt,
a template or parameters. This module speaks Ollama's wire format (what the `ollama` Python client
sends and reads, checked against its `_client.py`: `pull` sends `{model, insecure, stream}`, `create`
sends `{model, from, files, adapters, template, license, system, parameters, messages, quantize,
stream}`, `create_blob` POSTs the file to `/api/blobs/sha256:<hex>`, `delete` is a DELETE with a
body, `copy` reads only the status code). The store does the work (`skulk_store.manage`): cards
through the master, downloads through its fetcher.

Pull streams `{status, digest, total, completed}` NDJSON lines, then `{"status": "success"}`
(`"stream": false` answers that last line once); a failure after the first line is an `{"error"}`
line, before it an HTTP status. A created model is a card over its base's files with an `[ollama]`
section (template, system, parameters, license, messages) that `/api/show` reports and chat uses.
Push is refused with a 400: Skulk serves models, it does not publish them. These routes need an
operator key when keys are required (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from skulk_api_control.adapter_routes import read_json
from skulk_api_control.openapi_body import body_schema
from skulk_kernel.api import ModelCard, NodeSurface
from skulk_store.manage import ManageError, ModelManager, Progress

from .modelfile import ModelfileError, ollama_section, parse_modelfile
from .requests import RequestError

NDJSON = "application/x-ndjson"
PREFIXES = ("/api", "/ollama/api")
BLOB_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class PullIn(_Body):
    """POST /api/pull (`name` from older clients)."""

    model: str | None = Field(default=None, description="a catalog name, or a hub repository (hf.co/owner/name:QUANT)")
    name: str | None = None
    insecure: bool | None = None
    stream: bool | None = Field(default=None, description="NDJSON progress unless false")


class CreateIn(_Body):
    """POST /api/create: a new model over `from` (a model or a GGUF path on the node) or uploaded `files`."""

    model: str | None = Field(default=None, description="the new model's name")
    name: str | None = None
    from_: str | None = Field(default=None, alias="from", description="an existing model, or a GGUF path on the node")
    files: dict[str, str] | None = Field(default=None, description="file name -> sha256 digest of an uploaded blob")
    adapters: dict[str, str] | None = Field(default=None, description="refused: LoRA adapters are not supported")
    template: str | None = None
    system: str | None = None
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    quantize: str | None = Field(default=None, description="refused: quantize the GGUF before creating")
    modelfile: str | None = Field(default=None, description="a Modelfile's text (FROM, PARAMETER, TEMPLATE, SYSTEM)")
    stream: bool | None = None


class CopyIn(_Body):
    """POST /api/copy."""

    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class DeleteIn(_Body):
    """DELETE /api/delete (`name` from older clients)."""

    model: str | None = None
    name: str | None = None


def _error(status: int, message: str) -> JSONResponse:
    headers = {"x-should-retry": "false"} if 400 <= status < 500 else {}
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _line(body: dict[str, Any]) -> bytes:
    return (json.dumps(body) + "\n").encode()


def _progress(p: Progress) -> dict[str, Any]:
    return {"status": p.status} | ({"digest": p.digest, "total": p.total, "completed": p.completed} if p.digest else {})


def _name(body: BaseModel, what: str) -> str:
    value = getattr(body, "model", None) or getattr(body, "name", None)
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"{what}: model is required (the model's name)")
    return value.strip()


def _parse(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise RequestError(f"{where}: {first['msg']}") from None


def _plain(name: str) -> str:
    """Ollama's default tag is implied: `mine:latest` is the model `mine`."""
    return name.removesuffix(":latest")


def add_manage_routes(app: FastAPI, node: NodeSurface) -> None:
    def route(method: str, path: str, **kwargs: Any) -> Callable[[Any], Any]:
        def register(fn: Any) -> Any:
            for i, prefix in enumerate(PREFIXES):
                app.add_api_route(
                    prefix + path, fn, methods=[method], tags=["ollama"], include_in_schema=i == 0, **kwargs
                )
            return fn

        return register

    async def body_of(request: Request, model: type[BaseModel]) -> Any:
        return _parse(model, await read_json(request, RequestError))

    # --- pull ------------------------------------------------------------------------------------

    @route("POST", "/pull", openapi_extra=body_schema(PullIn))
    async def post_pull(request: Request) -> Response:
        """Fetch a model onto this node: NDJSON progress `{status, digest, total, completed}`, then success."""
        try:
            req: PullIn = await body_of(request, PullIn)
            name = _name(req, "pull")
            manager = ModelManager(node)
            card = await manager.pull_card(name)
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except ManageError as exc:
            return _error(exc.status, exc.message)

        async def lines() -> AsyncIterator[bytes]:
            yield _line({"status": "pulling manifest"})
            last: Progress | None = None
            try:
                async for step in manager.fetch(card):
                    if step != last:
                        yield _line(_progress(step))
                        last = step
            except ManageError as exc:
                yield _line({"error": exc.message})
                return
            yield _line({"status": "verifying sha256 digest"})
            yield _line({"status": "writing manifest"})
            yield _line({"status": "success"})

        if req.stream is False:
            try:
                async for _ in manager.fetch(card):
                    pass
            except ManageError as exc:
                return _error(exc.status, exc.message)
            return JSONResponse({"status": "success"})
        return StreamingResponse(lines(), media_type=NDJSON)

    @route("POST", "/push", openapi_extra=body_schema(PullIn))
    async def post_push(request: Request) -> Response:
        """Refused: Skulk serves models and does not publish them to a registry."""
        return _error(
            400,
            "push is not supported: Skulk serves models, it does not publish them to a registry. Members of "
            "the cluster copy a model from the node that has it; to share a GGUF elsewhere, upload the file to "
            "a hub repository with its own tools",
        )

    # --- create, copy, delete --------------------------------------------------------------------

    @route("POST", "/create", openapi_extra=body_schema(CreateIn))
    async def post_create(request: Request) -> Response:
        """A new model over a base (`from`, `files` or a `modelfile`) with its template, system and parameters."""
        try:
            req: CreateIn = await body_of(request, CreateIn)
            name = _plain(_name(req, "create"))
            manager = ModelManager(node)
            await _created(manager, req, name)
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except ManageError as exc:
            return _error(exc.status, exc.message)
        steps = ("reading model metadata", "creating parameters layer", "writing manifest", "success")
        if req.stream is False:
            return JSONResponse({"status": "success"})
        return StreamingResponse(iter([_line({"status": s}) for s in steps]), media_type=NDJSON)

    @route("POST", "/copy", openapi_extra=body_schema(CopyIn))
    async def post_copy(request: Request) -> Response:
        """`destination` becomes another name for `source` (its own card, over the same files)."""
        try:
            req: CopyIn = await body_of(request, CopyIn)
            manager = ModelManager(node)
            source = manager.card(req.source) or manager.card(_plain(req.source))
            if source is None:
                raise ManageError(404, f"model '{req.source}' not found")
            destination = _plain(req.destination)
            existing = manager.card(destination)
            if existing is not None and existing.model_id not in node.state.custom_model_cards:
                raise ManageError(
                    400,
                    f"destination: {destination!r} names the catalog model {existing.model_id}; choose another name",
                )
            await manager.add_card(manager.derived(source, destination, {}))
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except ManageError as exc:
            return _error(exc.status, exc.message)
        return Response(status_code=200)

    @route("DELETE", "/delete", openapi_extra=body_schema(DeleteIn))
    async def delete_model(request: Request) -> Response:
        """Remove a model: its card (created, copied or pulled) and this node's copy of its files."""
        try:
            req: DeleteIn = await body_of(request, DeleteIn)
            await ModelManager(node).delete(_name(req, "delete"))
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except ManageError as exc:
            return _error(exc.status, exc.message)
        return Response(status_code=200)

    # --- blobs -----------------------------------------------------------------------------------

    @route("HEAD", "/blobs/{digest}")
    async def head_blob(digest: str) -> Response:
        """200 when the blob is on this node (`ollama create` skips the upload), else 404."""
        try:
            present = ModelManager(node).blob_path(digest).is_file()
        except ManageError as exc:
            return Response(status_code=exc.status)
        return Response(status_code=200 if present else 404)

    @route("POST", "/blobs/{digest}", openapi_extra=BLOB_BODY)
    async def post_blob(digest: str, request: Request) -> Response:
        """Upload a file (a GGUF for `create`'s `files`), checked against its digest: 201, or 200 if present."""
        length = request.headers.get("content-length")
        try:
            manager = ModelManager(node)
            manager.blob_path(digest)
            created = await manager.save_blob(digest, request.stream(), int(length) if length else None)
        except ManageError as exc:
            return _error(exc.status, exc.message)
        except ValueError:
            return _error(400, "content-length: not a number")
        return Response(status_code=201 if created else 200)


async def _created(manager: ModelManager, req: CreateIn, name: str) -> ModelCard:
    """The new card: the base (blob, model or local GGUF) with the request's `[ollama]` section."""
    if req.quantize:
        raise RequestError(
            "quantize: not supported; quantize the GGUF with llama.cpp's llama-quantize, then create from it"
        )
    if req.adapters:
        raise RequestError("adapters: LoRA adapters are not supported; merge the adapter into the GGUF first")
    fields: dict[str, Any] = {}
    if req.modelfile:
        try:
            fields = parse_modelfile(req.modelfile)
        except ModelfileError as exc:
            raise RequestError(f"modelfile: {exc}") from None
    base_name = req.from_ or fields.get("from")
    if req.files:
        ggufs = [f for f in req.files if f.endswith(".gguf")]
        if len(ggufs) != 1:
            raise RequestError(
                f"files: exactly one .gguf file is needed (got {sorted(req.files)}); safetensors folders are "
                "added with POST /models/add"
            )
        path = manager.blob_path(req.files[ggufs[0]])
        if not path.is_file():
            raise ManageError(400, f"files: blob {req.files[ggufs[0]]} is not uploaded: POST it to /api/blobs first")
        base = manager.card_for_file(path, name)
    elif base_name:
        found = manager.card(base_name) or manager.card(_plain(base_name))
        if found is not None:
            base = found
        elif base_name.endswith(".gguf") or base_name.startswith(("/", "./", "~")):  # a file on this node
            base = manager.local_file(base_name, name)
        else:
            raise ManageError(404, f"from: no model or GGUF file named {base_name!r} (GET /api/tags lists models)")
    else:
        raise RequestError("create: `from` (a model or a GGUF path), `files` or a `modelfile` with FROM is required")
    section = {**ollama_section(base), **{k: v for k, v in fields.items() if k != "from"}}
    for key in ("template", "system", "license", "messages"):
        value = getattr(req, key)
        if value is not None:
            section[key] = value
    if req.parameters is not None:
        section["parameters"] = {**section.get("parameters", {}), **req.parameters}
    section["parent"] = base.model_id
    return await manager.add_card(manager.derived(base, name, {"ollama": section}))
