"""The video routes in OpenAI's shape (`client.videos` of the openai SDK), on the node's API host.

    POST   /v1/videos                 create a job (JSON, or multipart with an `input_reference` image)
    GET    /v1/videos                 list jobs (after, limit, order), a cursor page
    GET    /v1/videos/{id}            one job: status, progress, error
    GET    /v1/videos/{id}/content    the MP4 once completed
    DELETE /v1/videos/{id}            cancel if running, delete the job and its file
    POST   /v1/videos/{id}/cancel     cancel a queued or running job (a Skulk extension)

A create request is validated completely before a job exists: the model must be a video card that
is placed, the size and length must be ones its `[video]` section allows, an input image must be an
image. Each failure is a 4xx in OpenAI's error shape that names the field and what is allowed.
Extensions beyond OpenAI's fields: `seed`, `steps`, `negative_prompt`.
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from skulk_api_control.dispatch import InferenceError, resolve_model_id
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.server import openai_error
from skulk_api_control.streaming import BodyTooLarge, read_body
from skulk_kernel.api import CommandId, MediaParams, ModelCard, NodeSurface, VideoGeneration, catalog, new_id
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from .config import MediaConfig
from .jobs import Job, JobStore, StoreFull
from .video_section import VideoRequestError, resolve, video_section

FORM_OVERHEAD = 64 * 1024
IMAGE_FORMATS = {"png_pipe": "image/png", "jpeg_pipe": "image/jpeg", "webp_pipe": "image/webp", "bmp_pipe": "image/bmp"}


class Bad(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> Response:
        return openai_error(self.status, self.message, param=self.param, code=self.code)


def image_mime(data: bytes) -> tuple[str, int, int]:
    """(mime, width, height) of an image PyAV decodes, or Bad: what it is not."""
    import av

    if not data:
        raise Bad(400, "input_reference is empty; attach a PNG, JPEG or WebP image", "input_reference", "invalid_image")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            kind = container.format.name
            if kind not in IMAGE_FORMATS or not container.streams.video:
                raise Bad(
                    400,
                    f"input_reference is not an image (it reads as {kind!r}); attach a PNG, JPEG or WebP image",
                    "input_reference",
                    "invalid_image",
                )
            frame = next(container.decode(video=0))
            return IMAGE_FORMATS[kind], int(frame.width), int(frame.height)
    except Bad:
        raise
    except (av.error.FFmpegError, StopIteration, ValueError, OSError):
        raise Bad(
            400, "input_reference is not an image; attach a PNG, JPEG or WebP image", "input_reference", "invalid_image"
        ) from None


def video_cards(node: NodeSurface) -> dict[str, ModelCard]:
    return {k: c for k, c in catalog(node).items() if "VideoGeneration" in c.tasks and video_section(c) is not None}


def _number(fields: dict[str, Any], name: str, kind: type = float) -> Any:
    value = fields.get(name)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise Bad(400, f"{name!r} must be a number, got {value!r}", name) from None
    if isinstance(number, float) and not math.isfinite(number):
        raise Bad(400, f"{name!r} must be a finite number", name)
    return number


def _pick_card(node: NodeSurface, ref: str | None) -> ModelCard:
    from skulk_kernel.api import resolve_card

    cards = video_cards(node)
    if not ref:
        placed = {i.shard_assignments.model_id for i in node.state.instances.values()}
        candidates = [c for k, c in cards.items() if k in placed] or list(cards.values())
        if len(candidates) != 1:
            known = ", ".join(sorted(cards)) or "none"
            raise Bad(400, f"'model' is required: the id of a video model (video models here: {known})", "model")
        return candidates[0]
    card = resolve_card(node, ref)
    if card is None:
        known = ", ".join(sorted(cards)) or "none"
        message = f"model {ref!r} is not known to this cluster (video models: {known})"
        raise Bad(404, message, "model", "model_not_found")
    if card.model_id not in cards:
        raise Bad(400, f"model {card.model_id!r} is not a video model (it does {', '.join(card.tasks)})", "model")
    return card


async def read_request(request: Request, config: MediaConfig) -> tuple[dict[str, Any], bytes | None]:
    """(the fields, the input image's bytes or None), JSON or multipart, read under the size limits."""
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        from starlette.datastructures import UploadFile
        from starlette.formparsers import MultiPartException, MultiPartParser

        limit = config.max_input_bytes + FORM_OVERHEAD
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise Bad(413, f"the request is {length} bytes; input_reference may be {config.max_input_bytes} bytes")

        async def bounded() -> Any:
            size = 0
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise BodyTooLarge(limit, size)
                yield part

        try:
            form = await MultiPartParser(request.headers, bounded(), max_files=1, max_fields=32).parse()
        except BodyTooLarge:
            message = f"input_reference may be at most {config.max_input_bytes} bytes"
            raise Bad(413, message, "input_reference") from None
        except MultiPartException as exc:
            raise Bad(400, f"the multipart body could not be read: {exc.message}") from None
        fields: dict[str, Any] = {}
        image: bytes | None = None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key == "input_reference":
                    image = await value.read()
                await value.close()
            else:
                fields[key] = value
        return fields, image
    try:
        raw = await read_body(request)
    except BodyTooLarge as exc:
        raise Bad(413, str(exc)) from None
    import json

    try:
        body = json.loads(raw or b"null")
    except ValueError as exc:
        raise Bad(400, f"the body is not JSON ({exc}); send a JSON object or multipart/form-data") from None
    if not isinstance(body, dict):
        raise Bad(400, "the body must be a JSON object with 'prompt' (and 'model', 'size', 'seconds')")
    if body.get("input_reference") is not None:
        raise Bad(
            400,
            "input_reference must be uploaded as a file in a multipart/form-data request",
            "input_reference",
        )
    return body, None


class VideoCreateBody(BaseModel):
    """POST /v1/videos as JSON (multipart/form-data takes the same fields and an `input_reference` file)."""

    model_config = ConfigDict(extra="allow")
    prompt: str = Field(min_length=1)
    model: str | None = None
    size: str | None = Field(default=None, description="WIDTHxHEIGHT")
    seconds: float | str | None = None
    seed: int | None = None
    steps: int | None = None
    negative_prompt: str | None = None


def add_video_routes(app: Any, node: NodeSurface, store: JobStore, config: MediaConfig) -> None:
    def missing(video_id: str) -> Response:
        return openai_error(
            404,
            f"no video job {video_id!r} on this node (it never existed, expired or was deleted); "
            "GET /v1/videos lists the jobs",
            param="video_id",
            code="video_not_found",
        )

    @app.post("/v1/videos", tags=["openai"], openapi_extra=body_schema(VideoCreateBody))
    async def create_video(request: Request) -> Response:
        try:
            fields, image = await read_request(request, config)
            job, command, upload = _prepare(node, store, config, fields, image)
        except Bad as exc:
            return exc.response()
        except InferenceError as exc:
            return openai_error(exc.status, exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)
        try:
            store.add(job)
        except StoreFull as exc:
            return openai_error(429, str(exc), code="too_many_jobs")
        from .runner import run_job

        job.task = node.spawn(run_job(node, store, job, command, config.max_video_bytes, upload), f"video-{job.id}")
        return JSONResponse(job.wire())

    @app.get("/v1/videos", tags=["openai"])
    async def list_videos(after: str | None = None, limit: int = 20, order: str = "desc") -> Response:
        if order not in ("asc", "desc"):
            return openai_error(400, "'order' must be 'asc' or 'desc'", param="order")
        if not 1 <= limit <= 100:
            return openai_error(400, "'limit' must be from 1 to 100", param="limit")
        jobs, more = store.listing(order=order, after=after, limit=limit)
        data = [j.wire() for j in jobs]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    @app.get("/v1/videos/{video_id}", tags=["openai"])
    async def get_video(video_id: str) -> Response:
        job = store.get(video_id)
        return JSONResponse(job.wire()) if job else missing(video_id)

    @app.get("/v1/videos/{video_id}/content", tags=["openai"])
    async def get_content(video_id: str, variant: str = "video") -> Response:
        job = store.get(video_id)
        if job is None:
            return missing(video_id)
        if variant != "video":
            return openai_error(400, f"variant {variant!r} is not available here; only 'video'", param="variant")
        if job.status != "completed" or job.file is None or not job.file.is_file():
            return openai_error(
                409,
                f"video {video_id} is {job.status}, not completed: poll GET /v1/videos/{video_id} until it is",
                code="video_not_ready",
            )
        return FileResponse(job.file, media_type="video/mp4", headers={"x-content-sha256": job.sha256})

    @app.delete("/v1/videos/{video_id}", tags=["openai"])
    async def delete_video(video_id: str) -> Response:
        job = store.get(video_id)
        if job is None:
            return missing(video_id)
        await _stop(job)
        store.remove(video_id)
        return JSONResponse({"id": video_id, "object": "video.deleted", "deleted": True})

    @app.post("/v1/videos/{video_id}/cancel", tags=["openai"])
    async def cancel_video(video_id: str) -> Response:
        job = store.get(video_id)
        if job is None:
            return missing(video_id)
        if job.ended:
            return openai_error(409, f"video {video_id} is already {job.status}", code="video_ended")
        await _stop(job)
        store.finish(job, "cancelled")
        return JSONResponse(job.wire())


async def _stop(job: Job) -> None:
    """Cancel the job's task and wait (briefly) for it to send CancelTask and clean up."""
    task = job.task
    if task is not None and not task.done():
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10.0)
        except (asyncio.CancelledError, TimeoutError):
            pass


def _prepare(
    node: NodeSurface, store: JobStore, config: MediaConfig, fields: dict[str, Any], image: bytes | None
) -> tuple[Job, VideoGeneration, tuple[bytes, str] | None]:
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise Bad(400, "'prompt' is required: a non-empty description of the video", "prompt")
    card = _pick_card(node, fields.get("model") or None)
    section = video_section(card)
    assert section is not None
    size = fields.get("size")
    if size is not None and not isinstance(size, str):
        raise Bad(400, "'size' must be a string WIDTHxHEIGHT", "size")
    seconds = _number(fields, "seconds")
    steps = _number(fields, "steps", int)
    seed = _number(fields, "seed", int)
    upload: tuple[bytes, str] | None = None
    if image is not None:
        if len(image) > config.max_input_bytes:
            raise Bad(413, f"input_reference may be at most {config.max_input_bytes} bytes", "input_reference")
        mime, _w, _h = image_mime(image)
        upload = (image, mime)
    try:
        resolved = resolve(section, size=size or None, seconds=seconds, steps=steps, has_image=image is not None)
    except VideoRequestError as exc:
        raise Bad(400, exc.message, exc.param, exc.code) from None
    model_id = resolve_model_id(node, card.model_id, task="VideoGeneration")
    import hashlib

    options = resolved.options()
    negative = fields.get("negative_prompt")
    if isinstance(negative, str) and negative:
        options["negative_prompt"] = negative
    params = MediaParams(
        model_id=model_id,
        prompt=prompt,
        size=resolved.size,
        seconds=resolved.seconds,
        seed=seed,
        input_sha256=hashlib.sha256(image).hexdigest() if image is not None else None,
        input_bytes=len(image) if image is not None else 0,
        options=options,
    )
    command = VideoGeneration(command_id=CommandId(new_id()), owner_node_id=node.node_id, params=params)
    now = time.time()
    job = Job(
        id=f"video_{command.command_id}",
        model=model_id,
        prompt=prompt,
        size=resolved.size,
        seconds=seconds if seconds is not None else section.default_seconds,
        frames=resolved.frames,
        fps=resolved.fps,
        created_at=now,
        expires_at=now + store.ttl_s,
    )
    return job, command, upload
