"""A request's images on the data plane: the bundle, its digest, and the runner's side of it.

A chat request's images travel once, from the API node to every node that holds a runner of the
task's instance, as one upload of the `uploads` protocol (kind `images`, stream `<command id>/images`)
sent after the task runs; never inside a command or State. The params carry only references:
`ChatMessage.images` holds `sha256:<hex>:<bytes>` for each image, in order.

The bundle is the images one after the other, each after its length (4 bytes, big-endian). Its
declared digest is the SHA-256 of the references joined by commas, and the receiver computes the
same from the bytes it got (`bundle_digest`): a bundle verifies only when every image in it has the
digest and size its reference names, in the same order.

Inside the runner a session that takes images calls `receive_images`, which waits (bounded, and
stopped by the task's cancel flag) for the verified bundle and answers the bytes of each reference.
Engine plugins that serve vision models keep the node's one receiver of this kind (`follow`,
`unfollow`), as speech and media engine plugins do for their uploads.

This module imports no imaging library: the runner side and the engines need none of it. Decoding
and normalising live in `vision.py`, on the API node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field
from skulk_kernel.api import MediaChunk, NodeSurface

from . import uploads

BUNDLE_MIME = "application/x-skulk-images"
LENGTH_BYTES = 4
RECEIVE_TIMEOUT_S = 120.0


class ImageLimits(BaseModel):
    """What a request may bring, and whether the API node fetches URLs: `[plugins.api-control]` inherits
    these keys (`images_*`), so an operator sets them beside the plugin's other options."""

    images_remote_fetch: bool = Field(
        default=False, description="fetch http(s) image URLs from the API node (off: only data URLs and base64)"
    )
    images_fetch_timeout_s: float = Field(default=10.0, gt=0, description="the longest a remote image may take")
    images_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1024, description="largest image (encoded)")
    images_max_pixels: int = Field(default=40_000_000, ge=64, description="largest image in pixels (width x height)")
    images_per_request: int = Field(default=16, ge=1, description="images in one request")
    images_max_request_bytes: int = Field(default=48 * 1024 * 1024, ge=1024, description="all images of one request")
    images_max_node_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1024, description="image bytes this API node holds for requests at once"
    )


class ImageUploadError(uploads.UploadError):
    """The images did not arrive whole (size, digest, timeout, cancelled)."""


def ref_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}:{len(data)}"


def parse_ref(ref: str) -> tuple[str, int]:
    """(hex digest, size) of a reference; ValueError when it is not one."""
    tag, digest, size = ref.split(":")
    if tag != "sha256" or len(digest) != 64 or int(size) < 0:
        raise ValueError(f"not an image reference: {ref[:80]!r}")
    return digest, int(size)


def refs_of(params: Any) -> list[str]:
    """Every image reference of a request, in message order."""
    return [ref for message in params.messages for ref in message.images]


def has_images(params: Any) -> bool:
    return any(message.images for message in params.messages)


def bundle(images: Iterable[bytes]) -> bytes:
    return b"".join(len(image).to_bytes(LENGTH_BYTES, "big") + image for image in images)


def unbundle(data: bytes) -> list[bytes]:
    """The images of a bundle; ValueError when its lengths do not add up."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        if at + LENGTH_BYTES > len(data):
            raise ValueError("a bundle ends inside a length")
        size = int.from_bytes(data[at : at + LENGTH_BYTES], "big")
        at += LENGTH_BYTES
        if at + size > len(data):
            raise ValueError("a bundle ends inside an image")
        out.append(data[at : at + size])
        at += size
    return out


def _digest_of_refs(refs: Iterable[str]) -> str:
    return hashlib.sha256(",".join(refs).encode()).hexdigest()


def bundle_digest(data: bytes) -> str:
    """The digest a bundle declares, recomputed from its bytes (per image); "" when malformed."""
    try:
        return _digest_of_refs(ref_of(image) for image in unbundle(data))
    except ValueError:
        return ""


def declared(task: Any) -> tuple[str, int] | None:
    """A chat task's (bundle digest, bundle size), or None when it brings no images."""
    refs = refs_of(task.params)
    if not refs:
        return None
    return _digest_of_refs(refs), sum(parse_ref(ref)[1] + LENGTH_BYTES for ref in refs)


def _piece(*, whole: bytes, **fields: Any) -> MediaChunk:
    return MediaChunk(mime=BUNDLE_MIME, **fields)


IMAGES = uploads.UploadKind(
    suffix="images",
    task_kinds=frozenset({"TextGenerationTask"}),
    declared=declared,
    make_piece=_piece,
    accepts=lambda chunk: isinstance(chunk, MediaChunk) and chunk.mime == BUNDLE_MIME,
    spool_env="SKULK_VISION_SPOOL",
    spool_folder="skulk-vision",
    file_suffix=".images",
    error=ImageUploadError,
    noun="images",
    digest=bundle_digest,
)


# ------------------------------------------------------------------ the runner node (engine plugins)


FOLLOWED = frozenset({"TaskCreated", "TaskDeleted", "InstanceDeleted"})  # what the receiver reacts to


def follow(node: NodeSurface, event: Any, max_bytes: int = 256 * 1024 * 1024, timeout_s: float = 120.0) -> None:
    """An engine plugin's `on_event_applied`: the node's one images receiver (made on first use) sees it.
    Every engine that takes images calls this; the receiver is shared, so a second call is a no-op."""
    if type(event).__name__ not in FOLLOWED:
        return
    uploads.shared_receiver(IMAGES, node, max_bytes, timeout_s)
    uploads.forward_event(IMAGES, node, event)


def unfollow(node: NodeSurface) -> None:
    """An engine plugin's `shutdown`."""
    uploads.close_receiver(IMAGES, node)


# ------------------------------------------------------------------ inside the runner


def receive_images(
    instance_id: str,
    command_id: str,
    params: Any,
    cancelled: Callable[[], bool],
    timeout_s: float = RECEIVE_TIMEOUT_S,
) -> list[bytes]:
    """The verified bytes of each image reference of a request, in order (blocking; for the engine thread).

    Raises ImageUploadError when they do not come whole; the session fails the request with it and
    never answers from the text alone."""
    refs = refs_of(params)
    if not refs:
        return []
    digest, _ = declared_refs(refs)
    data = uploads.wait_for_file(IMAGES, instance_id, command_id, digest, timeout_s, cancelled)
    images = unbundle(data)
    if [ref_of(image) for image in images] != refs:  # wait_for_file checked it; a cheap second look
        raise ImageUploadError("the images do not match their references")
    return images


def declared_refs(refs: list[str]) -> tuple[str, int]:
    return _digest_of_refs(refs), sum(parse_ref(ref)[1] + LENGTH_BYTES for ref in refs)
