"""A request's images on the API node: read once, checked, normalised, then sent to the runners.

Every API adapter puts each image of a message into `ChatMessage.images` as it came on the wire (a
data URL, bare base64, or an http(s) URL) and nothing else; `prepare` (called by `dispatch.generate`
before any command exists) turns them into references and the bytes to send:

* the model must take images: a card without the `vision` capability is a 400 "model X does not
  accept images" (in each API's own error shape, as every `InferenceError`);
* a data URL or base64 is decoded; an http(s) URL is fetched only when the operator turned
  `images_remote_fetch` on, with the size, type and time limits of `ImageLimits`;
* Pillow decodes the whole image (a truncated file or something that is no image is a 400 that says
  so), its size in pixels is checked before decoding, and what an engine may not read (WebP, GIF,
  BMP, TIFF; a CMYK JPEG, a 16-bit PNG) is re-encoded as 8-bit PNG; other PNG and JPEG files travel
  as they came, byte for byte;
* limits hold per image, per request (count and bytes) and per node (bytes held for requests at
  once: a 503 asks to retry when they are spent).

The bytes then go as one upload to the task's runners once the task runs (`send`, beside the wait
for the first chunk), traced as their own span (`api.images_upload`).
"""

from __future__ import annotations

import asyncio
import binascii
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from skulk_kernel.api import NodeSurface, ServiceKey, TextGenerationParams, resolve_card

from . import uploads
from .dispatch import InferenceError
from .vision_wire import IMAGES, ImageLimits, bundle, ref_of

KEEP = {"PNG", "JPEG"}  # formats that travel as they came, in PLAIN_MODES
PLAIN_MODES = {"RGB", "RGBA", "L", "LA", "P"}  # 8-bit modes every engine's decoder reads (not CMYK, 16-bit)
READ = KEEP | {"WEBP", "GIF", "BMP", "TIFF"}  # formats read and re-encoded as PNG
SEND_TIMEOUT_S = 600.0


def limits_of(node: NodeSurface) -> ImageLimits:
    config = node.plugin_config("api-control")
    return config if isinstance(config, ImageLimits) else ImageLimits()


class _Held:
    """Image bytes this node holds for requests now (the per-node bound)."""

    def __init__(self) -> None:
        self.bytes = 0


HELD: ServiceKey[_Held] = ServiceKey("api-control.vision-held")


@dataclass
class Prepared:
    """A request's images, ready to send: the bundle and the release of the node's bound."""

    node: NodeSurface
    data: bytes
    count: int
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            held = self.node.services.get(HELD)
            if held is not None:
                held.bytes -= len(self.data)

    def sender(self, command_id: str) -> Callable[[], Awaitable[None]]:
        """What `dispatch.start` runs beside its wait for the first chunk: the upload, traced."""

        async def send() -> None:
            started = time.time_ns()
            await uploads.send_when_running(IMAGES, self.node, command_id, self.data, SEND_TIMEOUT_S)
            _span(self.node, command_id, started, {"images": self.count, "bytes": len(self.data)})

        return send


def _span(node: NodeSurface, command_id: str, started: int, attributes: dict[str, str | int | float | bool]) -> None:
    try:
        from skulk_observe import record_span
    except ImportError:  # observe is optional
        return
    record_span(node, command_id, "api.images_upload", started, time.time_ns(), attributes=attributes)


def _bad(message: str, status: int = 400, code: str = "invalid_image") -> InferenceError:
    return InferenceError(status, message, code=code, param="messages")


async def prepare(node: NodeSurface, params: TextGenerationParams) -> tuple[TextGenerationParams, Prepared | None]:
    """The params with references instead of images, and the bytes to send (None: no images)."""
    sources = [image for message in params.messages for image in message.images]
    if not sources:
        return params, None
    card = resolve_card(node, params.model_id)
    if card is None or "vision" not in card.capabilities:
        raise InferenceError(
            400,
            f"model {params.model_id} does not accept images; send text only, or choose a model with "
            "the vision capability (GET /v1/models lists them)",
            code="model_not_vision",
            param="model",
        )
    limits = limits_of(node)
    if len(sources) > limits.images_per_request:
        raise _bad(f"the request has {len(sources)} images; this server takes at most {limits.images_per_request}")
    images: list[bytes] = []
    total = 0
    for i, source in enumerate(sources):
        raw = await _read(source, limits, i)
        image = await asyncio.to_thread(normalize, raw, limits, i)
        total += len(image)
        if total > limits.images_max_request_bytes:
            raise _bad(
                f"the request's images pass {limits.images_max_request_bytes} bytes; send fewer or smaller images",
                413,
                "payload_too_large",
            )
        images.append(image)
    refs = iter([ref_of(image) for image in images])
    messages = tuple(
        m.model_copy(update={"images": tuple(next(refs) for _ in m.images)}) if m.images else m for m in params.messages
    )
    data = bundle(images)
    held = node.services.get(HELD) or node.services.publish(HELD, _Held())
    if held.bytes + len(data) > limits.images_max_node_bytes:
        raise InferenceError(
            503,
            "this server holds as many image bytes as it may for other requests; retry shortly",
            error_type="server_error",
            code="images_busy",
        )
    held.bytes += len(data)
    return params.model_copy(update={"messages": messages}), Prepared(node, data, len(images))


async def _read(source: str, limits: ImageLimits, i: int) -> bytes:
    """The encoded bytes of one image as it came (a data URL, base64 or an http(s) URL)."""
    where = f"image {i + 1}"
    if source.startswith(("http://", "https://")):
        if not limits.images_remote_fetch:
            raise _bad(
                f"{where}: this server does not fetch image URLs; send the image inline as a data URL "
                "(data:image/png;base64,...) or base64 (the operator can allow URLs with "
                "[plugins.api-control] images_remote_fetch = true)",
                code="remote_images_off",
            )
        return await fetch(source, limits, where)
    text = source
    if source.startswith("data:"):
        head, comma, text = source.partition(",")
        if not comma or not head.endswith(";base64"):
            raise _bad(f"{where}: a data URL must be data:<image type>;base64,<data>")
        if not head[5:].startswith("image/"):
            raise _bad(f"{where}: the data URL's type is {head[5:-7] or 'missing'}; send an image (image/png, ...)")
    if len(text) * 3 // 4 > limits.images_max_bytes + 3:
        raise _too_large(where, len(text) * 3 // 4, limits)
    try:
        return binascii.a2b_base64(text, strict_mode=True)  # strict like b64decode(validate=True), 15x faster
    except (binascii.Error, ValueError):
        raise _bad(f"{where} is neither a data URL, an http(s) URL nor valid base64") from None


def _too_large(where: str, size: int, limits: ImageLimits) -> InferenceError:
    return _bad(
        f"{where} is {size} bytes; this server takes images of at most {limits.images_max_bytes} bytes: scale it down",
        413,
        "payload_too_large",
    )


async def fetch(url: str, limits: ImageLimits, where: str) -> bytes:
    """An image URL's bytes, bounded in size, type and time (only with `remote_fetch`)."""
    import httpx

    try:
        async with asyncio.timeout(limits.images_fetch_timeout_s), httpx.AsyncClient(follow_redirects=True) as client:
            async with client.stream("GET", url, timeout=limits.images_fetch_timeout_s) as response:
                if response.status_code != 200:
                    raise _bad(f"{where}: fetching {url} answered HTTP {response.status_code}", code="image_fetch")
                kind = response.headers.get("content-type", "")
                if not kind.startswith("image/"):
                    raise _bad(f"{where}: {url} is {kind or 'of no stated type'}, not an image", code="image_fetch")
                got = bytearray()
                async for piece in response.aiter_bytes():
                    got += piece
                    if len(got) > limits.images_max_bytes:
                        raise _too_large(where, len(got), limits)
                return bytes(got)
    except TimeoutError:
        late = f"{where}: {url} did not arrive within {limits.images_fetch_timeout_s:g}s"
        raise _bad(late, 408, "image_fetch") from None
    except httpx.HTTPError as exc:
        raise _bad(f"{where}: fetching {url} failed: {exc}", code="image_fetch") from None


def normalize(data: bytes, limits: ImageLimits, i: int = 0) -> bytes:
    """The image as the engines get it: decoded whole by Pillow, bounded, PNG or JPEG."""
    from PIL import Image, UnidentifiedImageError

    where = f"image {i + 1}"
    if len(data) > limits.images_max_bytes:
        raise _too_large(where, len(data), limits)
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format or ""
            width, height = img.size
            if width * height > limits.images_max_pixels:
                raise _bad(
                    f"{where} is {width}x{height} pixels; this server takes at most {limits.images_max_pixels} pixels",
                    413,
                    "payload_too_large",
                )
            if fmt not in READ:
                raise _bad(f"{where} is a {fmt or 'unknown'} image; send PNG, JPEG, WebP, GIF, BMP or TIFF")
            img.load()  # decodes every pixel: a truncated or corrupt file fails here
            if fmt in KEEP and img.mode in PLAIN_MODES:
                return data
            out = io.BytesIO()
            img.convert("RGBA" if img.mode in ("RGBA", "LA", "P") else "RGB").save(out, "PNG")
            return out.getvalue()
    except UnidentifiedImageError:
        raise _bad(f"{where} is not an image Pillow can read (PNG, JPEG, WebP, GIF, BMP, TIFF)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise _bad(f"{where} could not be decoded ({exc}); it may be truncated or corrupt") from None
