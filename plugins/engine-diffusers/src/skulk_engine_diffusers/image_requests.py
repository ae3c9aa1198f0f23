"""OpenAI image request bodies, checked whole before anything is sent.

Everything a caller can get wrong is found here, on the API node, and answered as a 400 that says
what to send instead: a missing prompt, `n` out of range, a size the model cannot make (the card's
`[image]` rules), an output format or response format that does not exist, an edit's file that is
not an image (its first bytes must be a PNG, JPEG or WebP signature; the runner decodes it fully
and answers `invalid_image` if the rest is broken). Unknown and unplaced models are api-control's
`resolve_model_id` errors (404), the same answers every other API gives.

Skulk extensions in the body (OpenAI's SDKs send them with `extra_body`): `seed`, `steps`,
`guidance_scale`, `negative_prompt`, and `strength` for edits.
"""

from __future__ import annotations

import struct
from typing import Any, Literal

from pydantic import BaseModel
from skulk_kernel.api import MediaParams, ModelCard, ModelId, NodeSurface, catalog, instance_ready

from .cards import CardError, image_section, parse_size
from .config import DiffusersConfig

ResponseFormat = Literal["b64_json", "url"]
OUTPUT_FORMATS = ("png", "jpeg", "webp")
MAX_PROMPT_CHARS = 32000


class BadRequest(Exception):
    """A caller mistake, answered in OpenAI's error shape with `param` and `code`."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


class ImageRequest(BaseModel):
    """A checked request: what goes into the command, and how to answer."""

    params: MediaParams
    response_format: ResponseFormat
    output_format: str
    size: str
    input_image: bytes | None = None


def sniff_image(data: bytes) -> str | None:
    """'png', 'jpeg' or 'webp' from the file's signature, with its dimensions readable; else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return "png" if width and height else None
    if data.startswith(b"\xff\xd8\xff") and len(data) > 4:
        return "jpeg"
    if len(data) >= 16 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # multipart fields are strings
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    return value


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"'{name}' must be a number", param=name) from None


def default_model(node: NodeSurface) -> str:
    """With no `model`, the one image model that has a ready instance (OpenAI has a default too)."""
    cards = catalog(node)
    placed = {
        str(inst.shard_assignments.model_id)
        for inst in node.state.instances.values()
        if instance_ready(inst, node.state.runners)
    }
    image_models = sorted(m for m in placed if m in cards and "ImageGeneration" in cards[m].tasks)
    if len(image_models) == 1:
        return image_models[0]
    listed = ", ".join(image_models) or "none is placed"
    raise BadRequest(f"'model' is required: the id of an image model ({listed})", param="model")


def check(
    body: dict[str, Any],
    node: NodeSurface,
    config: DiffusersConfig,
    card: ModelCard | None,
    model_id: str,
    input_image: bytes | None = None,
) -> ImageRequest:
    """The request, checked against the config and the model's card (None: the runner checks)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("'prompt' is required: a text description of the image, a non-empty string", param="prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadRequest(f"'prompt' is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}", param="prompt")
    n = _int(body, "n", 1) or 0
    if not 1 <= n <= config.max_n:
        raise BadRequest(f"'n' is {n}; this node makes from 1 to {config.max_n} images per request", param="n")
    if str(body.get("stream", "false")).lower() not in ("false", "none"):
        raise BadRequest("streamed image generation is not supported; omit 'stream'", param="stream")
    response_format = body.get("response_format") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise BadRequest(f"'response_format' {response_format!r} is not 'b64_json' or 'url'", param="response_format")
    output_format = body.get("output_format") or "png"
    if output_format not in OUTPUT_FORMATS:
        raise BadRequest(
            f"'output_format' {output_format!r} is not one of {', '.join(OUTPUT_FORMATS)}", param="output_format"
        )
    if body.get("background") == "transparent":
        raise BadRequest("this model makes opaque images; omit 'background' or send 'opaque'", param="background")
    size = body.get("size")
    if size is not None and not isinstance(size, str):
        raise BadRequest("'size' must be a string WIDTHxHEIGHT, e.g. '512x512', or 'auto'", param="size")
    if card is not None:
        try:
            width, height = parse_size(card, size, config.max_pixels)
        except CardError as exc:
            raise BadRequest(str(exc), param="size", code="invalid_size") from None
        if input_image is not None and not image_section(card).get("supports_edits"):
            raise BadRequest(f"{card.model_id} cannot edit images; use /v1/images/generations", param="model")
        resolved = f"{width}x{height}"
    else:
        resolved = size or "auto"
    seed = _int(body, "seed", None)
    options: dict[str, Any] = {"output_format": output_format}
    for name in ("steps",):
        if (value := _int(body, name, None)) is not None:
            options[name] = value
    for name in ("guidance_scale", "strength"):
        if (number := _number(body, name)) is not None:
            options[name] = number
    strength = options.get("strength")
    if strength is not None and not 0 < strength <= 1:
        raise BadRequest("'strength' must be a number above 0 and at most 1", param="strength")
    if isinstance(body.get("negative_prompt"), str):
        options["negative_prompt"] = body["negative_prompt"]
    params = MediaParams(model_id=ModelId(model_id), prompt=prompt, size=resolved, n=n, seed=seed, options=options)
    return ImageRequest(
        params=params,
        response_format=response_format,
        output_format=output_format,
        size=resolved,
        input_image=input_image,
    )
