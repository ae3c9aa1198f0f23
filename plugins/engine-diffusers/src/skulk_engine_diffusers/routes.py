"""OpenAI's image routes on the node's API host: /v1/images/generations, /v1/images/edits, and
/v1/images/files/{id} (what a `response_format=url` answer points at).

The routes live in this plugin (`register_api_routes`), not in api-openai: they are the only
consumer of the engine's card rules and of the media pieces, and a node without this plugin has no
image model to answer for. They follow api-control's route template (`adapter_routes.answer`) and
its one start path (`dispatch.start`), so waiting for the first chunk, early errors as HTTP
statuses, a departed client (its task cancelled) and FinishTask work as for every other request.
An edit's input image follows its command on the data plane (`skulk_api_media.inputs.send_when_running`,
the protocol video inputs use too).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator
from typing import Any

from skulk_api_control.adapter_routes import ErrorAnswers, answer
from skulk_api_control.dispatch import InferenceError, InferenceHandle, resolve_model_id, start
from skulk_api_control.server import openai_error
from skulk_api_control.streaming import BodyTooLarge, read_body
from skulk_api_media.inputs import send_when_running
from skulk_kernel.api import (
    CommandId,
    ErrorChunk,
    ImageGeneration,
    MediaChunk,
    NodeSurface,
    ProgressChunk,
    catalog,
    new_id,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .config import DiffusersConfig
from .files import ImageFiles
from .image_requests import BadRequest, ImageRequest, check, default_model, sniff_image
from .pieces import Assembler, PieceError

INPUT_MIME = "application/x-skulk-input"

FIRST_CHUNK_TIMEOUT_S = 600.0
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the small fields besides the file
EXTENSIONS = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp"}

# error codes that arrive as the first chunk but belong before the response: code -> HTTP status
EARLY_ERRORS = {
    "invalid_request": 400,
    "invalid_size": 400,
    "invalid_image": 400,
    "unsupported_task": 400,
    "model_not_placed": 404,
    "instance_not_ready": 503,
    "instance_gone": 503,
    "master_changed": 503,
    "node_gone": 503,
    "runner_crashed": 503,
    "upload_failed": 502,
}


def _inference_error(exc: InferenceError) -> Response:
    return openai_error(exc.status, exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)


def _chunk_error(chunk: ErrorChunk) -> Response:
    status = EARLY_ERRORS.get(chunk.code or "", 400 if chunk.error_type == "invalid_request_error" else 500)
    return openai_error(status, chunk.message, error_type=chunk.error_type, code=chunk.code)


def _bad(exc: BadRequest) -> Response:
    return openai_error(exc.status, exc.message, param=exc.param, code=exc.code)


ERRORS = ErrorAnswers(inference=_inference_error, chunk=_chunk_error)


async def _read_json(request: Request) -> dict[str, Any]:
    import json

    try:
        raw = await read_body(request)
    except BodyTooLarge as exc:
        raise BadRequest(str(exc), status=413) from None
    try:
        body = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with at least 'prompt'")
    return body


async def _bounded(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BodyTooLarge(limit, size)
        yield part


async def _read_form(request: Request, config: DiffusersConfig) -> tuple[dict[str, Any], bytes]:
    """(the fields, the one input image) of an edit's multipart body, read under the size limit."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    too_large = f"the upload is over the limit of {config.max_upload_bytes} bytes; send a smaller image"
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequest("send an edit as multipart/form-data with an 'image' file and a 'prompt'", param="image")
    limit = config.max_upload_bytes + FORM_OVERHEAD
    parser = MultiPartParser(request.headers, _bounded(request, limit), max_files=4, max_fields=64)
    try:
        form = await parser.parse()
    except BodyTooLarge:
        raise BadRequest(too_large, status=413, param="image", code="file_too_large") from None
    except MultiPartException as exc:
        raise BadRequest(f"the multipart body could not be read: {exc.message}") from None
    fields: dict[str, Any] = {}
    images: list[UploadFile] = []
    for key, value in form.multi_items():
        name = key.removesuffix("[]")
        if isinstance(value, UploadFile):
            if name == "mask":
                raise BadRequest("masks are not supported (this model has no inpainting); omit 'mask'", param="mask")
            if name == "image":
                images.append(value)
        else:
            fields[name] = value
    if len(images) != 1:
        raise BadRequest(f"send exactly one 'image' file to edit (got {len(images)})", param="image")
    data = await images[0].read()
    await images[0].close()
    if len(data) > config.max_upload_bytes:
        raise BadRequest(too_large, status=413, param="image", code="file_too_large")
    if sniff_image(data) is None:
        raise BadRequest(
            "the 'image' file is not a PNG, JPEG or WebP image; send one of those", param="image", code="invalid_image"
        )
    return fields, data


def add_image_routes(app: Any, node: NodeSurface, config: DiffusersConfig, files: ImageFiles) -> None:
    def checked(body: dict[str, Any], input_image: bytes | None) -> ImageRequest:
        model = body.get("model")
        if model is not None and (not isinstance(model, str) or not model):
            raise BadRequest("'model' must be the id of an image model", param="model")
        model_id = resolve_model_id(node, model or default_model(node), task="ImageGeneration")
        card = catalog(node).get(model_id)
        return check(body, node, config, card, model_id, input_image)

    async def run(request: Request, image: ImageRequest) -> Response:
        params = image.params
        if image.input_image is not None:
            data = image.input_image
            import hashlib

            params = params.model_copy(
                update={"input_sha256": hashlib.sha256(data).hexdigest(), "input_bytes": len(data)}
            )
        command = ImageGeneration(command_id=CommandId(new_id()), owner_node_id=node.node_id, params=params)
        started = time.perf_counter()

        async def send_input() -> None:
            assert image.input_image is not None
            await send_when_running(node, command.command_id, image.input_image, INPUT_MIME, FIRST_CHUNK_TIMEOUT_S)

        call = start(
            node,
            command,
            early_errors=EARLY_ERRORS,
            while_waiting=send_input if image.input_image is not None else None,
            observe=False,
        )

        async def complete(handle: InferenceHandle) -> Response:
            assembler = Assembler(max_bytes=config.max_image_bytes)
            first_progress_ms = 0.0
            steps = 0
            try:
                async for chunk in handle.chunks():
                    if isinstance(chunk, ErrorChunk):
                        return _chunk_error(chunk)
                    if isinstance(chunk, ProgressChunk):
                        first_progress_ms = first_progress_ms or (time.perf_counter() - started) * 1000
                        steps = max(steps, chunk.done)
                        if chunk.finish_reason == "cancelled":
                            return openai_error(499, "the image request was cancelled", code="cancelled")
                    elif isinstance(chunk, MediaChunk):
                        assembler.add(chunk)
                made = assembler.complete(params.n)
            except PieceError as exc:
                return openai_error(502, f"the image did not arrive whole: {exc}", error_type="server_error")
            return JSONResponse(
                _response(request, image, made, files),
                headers={"x-skulk-first-progress-ms": f"{first_progress_ms:.1f}", "x-skulk-steps": str(steps)},
            )

        return await answer(request, call, ERRORS, complete)

    @app.post("/v1/images/generations", tags=["openai"])
    @app.post("/images/generations", include_in_schema=False)
    async def post_generations(request: Request) -> Response:
        """Text to image (OpenAI's shape): b64_json or url answers, png/jpeg/webp, n images."""
        try:
            image = checked(await _read_json(request), None)
        except BadRequest as exc:
            return _bad(exc)
        except InferenceError as exc:
            return _inference_error(exc)
        return await run(request, image)

    @app.post("/v1/images/edits", tags=["openai"])
    @app.post("/images/edits", include_in_schema=False)
    async def post_edits(request: Request) -> Response:
        """Image to image (multipart: 'image' and 'prompt'); the input follows on the data plane."""
        try:
            fields, data = await _read_form(request, config)
            image = checked(fields, data)
        except BadRequest as exc:
            return _bad(exc)
        except InferenceError as exc:
            return _inference_error(exc)
        return await run(request, image)

    @app.get("/v1/images/files/{file_id}", tags=["openai"])
    async def get_file(file_id: str) -> Response:
        """An image a url answer named, until it expires (`url_ttl_s`)."""
        stored = files.get(file_id)
        if stored is None:
            return openai_error(
                404, f"image {file_id!r} does not exist or has expired; generate it again", code="file_not_found"
            )
        return Response(stored.data, media_type=stored.mime, headers={"Cache-Control": "private, max-age=60"})


def _response(
    request: Request, image: ImageRequest, made: list[tuple[bytes, str]], files: ImageFiles
) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for content, mime in made:
        if image.response_format == "url":
            file_id = files.put(content, mime, EXTENSIONS.get(mime, "bin"))
            data.append({"url": str(request.url_for("get_file", file_id=file_id))})
        else:
            data.append({"b64_json": base64.b64encode(content).decode("ascii")})
    return {
        "created": int(time.time()),
        "data": data,
        "output_format": image.output_format,
        "size": image.size,
        "background": "opaque",
    }
