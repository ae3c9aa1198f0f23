"""`/v1/files` and `/v1/batches` in OpenAI's shapes, and the node-to-node `/v1/batch-peer` copies.

Bad input is a 4xx in OpenAI's error shape that says what to fix: an upload over `max_file_bytes`
is a 413 (refused from its Content-Length before the body is read, or as soon as the count passes
the bound), a purpose other than "batch" or an endpoint a batch cannot call is a 400, an unknown
id is a 404.

Files and batches belong to the API key that made them: a caller sees (lists, reads, cancels,
deletes) its own, an operator key every one, and a caller without a key (loopback, an open node)
every one. Someone else's id answers 404, the same as an id that does not exist, so ids cannot be
probed.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from skulk_api_control.auth import PLUGIN_DATA as KEYS_PLUGIN
from skulk_api_control.auth import current_key
from skulk_api_control.openapi_body import body_schema
from skulk_kernel.api import NodeSurface

from . import records as rec
from .config import ENDPOINTS, BatchConfig
from .service import BatchService
from .storage import StorageError

MULTIPART_OVERHEAD = 64 * 1024
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"enum": ["batch"]}},
                    "required": ["file", "purpose"],
                }
            }
        },
    }
}


class CreateBatch(BaseModel):
    """POST /v1/batches, as declared in the OpenAPI document (the route reads and checks it itself,
    answering in OpenAI's error shape)."""

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None


class TooLarge(Exception):
    pass


def visible(node: NodeSurface, owner: str | None) -> bool:
    """Whether the caller may see a record owned by `owner` (see the module's docstring)."""
    caller = current_key.get()
    if caller is None or caller == owner:
        return True
    record = node.state.plugin_data.get(KEYS_PLUGIN, {}).get(caller)
    return isinstance(record, dict) and record.get("scope") == "operator"


def error(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    headers = {"x-should-retry": "false"} if status < 500 else {}
    return JSONResponse(body, status_code=status, headers=headers)


def unavailable(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "server_error", "param": None, "code": None}}, 503)


async def read_upload(request: Request, limit: int) -> tuple[bytes, str, str]:
    """(file bytes, file name, purpose) of a multipart upload, never holding more than the bound."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartParser

    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + MULTIPART_OVERHEAD:
        raise TooLarge
    seen = 0

    async def counted() -> Any:
        nonlocal seen
        async for piece in request.stream():
            seen += len(piece)
            if seen > limit + MULTIPART_OVERHEAD:
                raise TooLarge
            yield piece

    form = await MultiPartParser(request.headers, counted(), max_files=1, max_fields=8).parse()
    upload = form.get("file")
    purpose = form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise ValueError("the form needs a `file` part (multipart/form-data)")
    data = await upload.read()
    await upload.close()
    if len(data) > limit:
        raise TooLarge
    return data, upload.filename or "upload.jsonl", purpose if isinstance(purpose, str) else ""


def add_batch_routes(app: FastAPI, node: NodeSurface, service: BatchService, config: BatchConfig) -> None:
    storage = service.storage

    # ------------------------------------------------------------------ files

    @app.post("/v1/files", tags=["batch"], openapi_extra=UPLOAD_BODY)
    async def create_file(request: Request) -> Any:
        """Upload a JSONL file for a batch (multipart: `file`, `purpose=batch`)."""
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            return error(400, "upload the file as multipart/form-data with parts `file` and `purpose`", "invalid_body")
        try:
            data, filename, purpose = await read_upload(request, config.max_file_bytes)
        except TooLarge:
            return error(
                413,
                f"the file is larger than {config.max_file_bytes} bytes (plugins.batch max_file_bytes)",
                "file_too_large",
            )
        except ValueError as exc:
            return error(400, str(exc), "invalid_body", "file")
        except Exception as exc:  # a malformed multipart body
            return error(400, f"the multipart body could not be read: {exc}", "invalid_body")
        if purpose != "batch":
            return error(
                400, f"purpose {purpose!r} is not served here: only purpose=batch", "invalid_purpose", "purpose"
            )
        if len(rec.files(node.state)) >= config.max_files:
            return error(400, f"the cluster holds {config.max_files} files: delete some first", "too_many_files")
        file_id = "file-" + secrets.token_hex(12)
        storage.write("files", file_id, data)
        holders = await storage.replicate("files", file_id, data)
        record = rec.FileRecord(
            id=file_id,
            bytes=len(data),
            created_at=int(time.time()),
            filename=filename[:256],
            purpose="batch",
            sha256=hashlib.sha256(data).hexdigest(),
            holders=holders,
            owner=current_key.get(),
        )
        if not await service.submit([(f"file/{file_id}", record.model_dump(mode="json"))]):
            storage.delete("files", file_id)
            return unavailable("the file could not be recorded through the master (no master yet?): retry")
        return JSONResponse(rec.file_object(record))

    @app.get("/v1/files", tags=["batch"])
    async def list_files(purpose: str | None = None, limit: int = 10000, order: str = "desc") -> Any:
        found = [
            f for f in rec.files(node.state) if (purpose is None or f.purpose == purpose) and visible(node, f.owner)
        ]
        found.sort(key=lambda f: (f.created_at, f.id), reverse=order != "asc")
        data = [rec.file_object(f) for f in found[: max(1, min(limit, 10000))]]
        return {
            "object": "list",
            "data": data,
            "has_more": len(found) > len(data),
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }

    @app.get("/v1/files/{file_id}", tags=["batch"])
    async def get_file(file_id: str) -> Any:
        record = rec.file_record(node.state, file_id)
        if record is None or not visible(node, record.owner):
            return error(404, f"no file {file_id!r}", "file_not_found", "file_id")
        return rec.file_object(record)

    @app.get("/v1/files/{file_id}/content", tags=["batch"])
    async def file_content(file_id: str) -> Any:
        record = rec.file_record(node.state, file_id)
        if record is None or not visible(node, record.owner):
            return error(404, f"no file {file_id!r}", "file_not_found", "file_id")
        try:
            data = await storage.read("files", record.id, record.holders)
        except StorageError as exc:
            return unavailable(str(exc))
        return Response(data, media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}", tags=["batch"])
    async def delete_file(file_id: str) -> Any:
        record = rec.file_record(node.state, file_id)
        if record is None or not visible(node, record.owner):
            return error(404, f"no file {file_id!r}", "file_not_found", "file_id")
        users = [
            b.id
            for b in rec.specs(node.state)
            if b.input_file_id == file_id and rec.progress(node.state, b.id).status not in rec.TERMINAL
        ]
        if users:
            return error(
                400, f"file {file_id} is the input of unfinished batch {users[0]}: cancel it first", "file_in_use"
            )
        if not await service.submit([(f"file/{file_id}", None)]):
            return unavailable("the deletion could not be recorded through the master: retry")
        storage.delete("files", file_id)  # other holders delete theirs on their sweep
        return {"id": file_id, "object": "file", "deleted": True}

    # ------------------------------------------------------------------ batches

    @app.post("/v1/batches", tags=["batch"], openapi_extra=body_schema(CreateBatch))
    async def create_batch(request: Request) -> Any:
        """Start a batch over an uploaded JSONL file."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error(400, 'body must be {"input_file_id", "endpoint", "completion_window": "24h"}', "invalid_body")
        endpoint, window, file_id = body.get("endpoint"), body.get("completion_window"), body.get("input_file_id")
        if endpoint not in ENDPOINTS:
            return error(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", "invalid_endpoint", "endpoint")
        if window != "24h":
            return error(400, 'completion_window must be "24h"', "invalid_completion_window", "completion_window")
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            return error(
                400,
                "metadata: at most 16 string keys (64 chars) and string values (512 chars)",
                "invalid_metadata",
                "metadata",
            )
        record = rec.file_record(node.state, str(file_id)) if isinstance(file_id, str) else None
        if record is None or not visible(node, record.owner):
            return error(400, f"no file {file_id!r}: upload one with POST /v1/files", "file_not_found", "input_file_id")
        if record.purpose != "batch":
            return error(
                400, f"file {file_id} has purpose {record.purpose!r}, not batch", "invalid_file", "input_file_id"
            )
        if service.app is None:
            return unavailable("this node does not run batch lines (it has no API app)")
        batch_id = "batch_" + secrets.token_hex(12)
        batch = rec.BatchSpec(
            id=batch_id,
            endpoint=str(endpoint),
            input_file_id=record.id,
            completion_window="24h",
            metadata=metadata,
            created_at=int(time.time()),
            created_by=node.node_id,
            owner=current_key.get(),
        )
        run = rec.Assignment(node=node.node_id, generation=1, since=time.time())
        entries = [
            (f"batch/{batch_id}", batch.model_dump(mode="json")),
            (f"run/{batch_id}", run.model_dump(mode="json")),
            (f"progress/{batch_id}", rec.Progress(generation=1).model_dump(mode="json")),
        ]
        if not await service.submit(entries):
            return unavailable("the batch could not be recorded through the master (no master yet?): retry")
        return JSONResponse(rec.batch_object(node.state, batch))

    @app.get("/v1/batches", tags=["batch"])
    async def list_batches(limit: int = 20, after: str | None = None) -> Any:
        mine = (b for b in rec.specs(node.state) if visible(node, b.owner))
        found = sorted(mine, key=lambda b: (b.created_at, b.id), reverse=True)
        if after is not None:
            ids = [b.id for b in found]
            found = found[ids.index(after) + 1 :] if after in ids else []
        page = found[: max(1, min(limit, 100))]
        data = [rec.batch_object(node.state, b) for b in page]
        return {
            "object": "list",
            "data": data,
            "has_more": len(found) > len(page),
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }

    @app.get("/v1/batches/{batch_id}", tags=["batch"])
    async def get_batch(batch_id: str) -> Any:
        batch = rec.spec(node.state, batch_id)
        if batch is None or not visible(node, batch.owner):
            return error(404, f"no batch {batch_id!r}", "batch_not_found", "batch_id")
        return rec.batch_object(node.state, batch)

    @app.post("/v1/batches/{batch_id}/cancel", tags=["batch"])
    async def cancel_batch(batch_id: str) -> Any:
        batch = rec.spec(node.state, batch_id)
        if batch is None or not visible(node, batch.owner):
            return error(404, f"no batch {batch_id!r}", "batch_not_found", "batch_id")
        status = rec.progress(node.state, batch_id).status
        if status in rec.TERMINAL:
            return error(409, f"batch {batch_id} is already {status}", "batch_finished")
        if rec.cancel_ask(node.state, batch_id) is None:
            ask = rec.CancelAsk(at=int(time.time()), by=node.node_id)
            if not await service.submit([(f"cancel/{batch_id}", ask.model_dump(mode="json"))]):
                return unavailable("the cancel could not be recorded through the master: retry")
        return rec.batch_object(node.state, batch)

    # ------------------------------------------------------------------ node to node (member calls)

    @app.put("/v1/batch-peer/{kind}/{name:path}", include_in_schema=False)
    async def peer_put(kind: str, name: str, request: Request) -> Any:
        """A member's copy of a file or segment (an output file may outgrow its input: 4x the bound)."""
        try:
            storage.path(kind, name)
        except StorageError as exc:
            return error(400, str(exc))
        limit, parts, seen = 4 * config.max_file_bytes, [], 0
        async for piece in request.stream():
            seen += len(piece)
            if seen > limit:
                return error(413, f"a copy larger than {limit} bytes is refused", "file_too_large")
            parts.append(piece)
        body = b"".join(parts)
        storage.write(kind, name, body)
        return {"stored": len(body)}

    @app.get("/v1/batch-peer/{kind}/{name:path}", include_in_schema=False)
    async def peer_get(kind: str, name: str) -> Any:
        try:
            data = storage.read_local(kind, name)
        except StorageError as exc:
            return error(400, str(exc))
        if data is None:
            return error(404, f"this node holds no {kind} {name}")
        return Response(data, media_type="application/octet-stream")
