"""Vision on llama.cpp: a card's projector (`[vision] mmproj = "<file>"`) and image-bearing messages.

llama.cpp reads images through a multimodal projector GGUF (`mmproj`) beside the model; its native
server (xllamacpp) loads it with the model and takes OpenAI `image_url` parts whose URL is a data
URL, placing each image where the chat template's media marker stands. So the session only has to:

* find the projector: the card's `[vision] mmproj`, a file name relative to the model's folder (or
  an absolute path); the store sets it for a local GGUF that has exactly one `mmproj*.gguf` beside it,
  and a hub card lists the file among its source files, so it is fetched and staged with the model;
* turn a message's image references into `image_url` parts, with the bytes the runner received on
  the data plane (`skulk_api_control.vision_wire.receive_images`, digests checked), images first,
  then the text, as the common chat templates of vision models expect.

A request whose images do not arrive whole fails; it is never answered from its text alone.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard, TextGenerationParams


def mmproj_path(card: ModelCard, model_path: Path | None) -> Path | None:
    """The projector GGUF of a vision card on this node, or None (a text-only card)."""
    name = (card.sections.get("vision") or {}).get("mmproj")
    if not isinstance(name, str) or not name or model_path is None:
        return None
    candidate = Path(name)
    if not candidate.is_absolute():
        folder = model_path if model_path.is_dir() else model_path.parent
        candidate = folder / name
    if not candidate.is_file():
        raise FileNotFoundError(f"{card.model_id}: its projector {name} is not at {candidate}")
    return candidate


def _mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    return "application/octet-stream"  # the API node sends PNG or JPEG only


def with_images(
    messages: list[dict[str, Any]],
    params: TextGenerationParams,
    instance_id: str,
    command_id: str,
    cancelled: Callable[[], bool],
) -> list[dict[str, Any]]:
    """`messages` (the template dicts of `params.messages`) with each image as an image_url part."""
    from skulk_api_control.vision_wire import receive_images

    images = iter(receive_images(instance_id, command_id, params, cancelled))
    out = []
    for message, source in zip(messages, params.messages, strict=True):
        if source.images:
            parts: list[dict[str, Any]] = []
            for _ in source.images:
                data = next(images)
                url = f"data:{_mime(data)};base64," + base64.b64encode(data).decode("ascii")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            parts.append({"type": "text", "text": message.get("content") or ""})
            message = {**message, "content": parts}
        out.append(message)
    return out
