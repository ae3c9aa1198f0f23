"""Cards for diffusers folders, and the model store that lists the configured ones.

A diffusers pipeline folder (what `save_pretrained` writes, or a Hugging Face snapshot) has a
`model_index.json` naming the pipeline class and one sub-folder per component. The card is read
from those JSON files alone (no torch): the `[image]` section says what the API may ask of the
model (its native size, the multiple every side must be, the largest side, whether it can edit),
so a bad size is refused on the API node before anything is sent. `[source] kind = "local"` names
the folder, which the worker loads from as it does any operator-added model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard, ModelId

BACKENDS = ("diffusers-cuda", "diffusers-cpu")  # preference order: a GPU node first
# pipelines whose components also make an image-to-image pipeline (images/edits)
EDITABLE = {"StableDiffusionPipeline": "StableDiffusionImg2ImgPipeline"}
SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
DEFAULT_STEPS = 25


class CardError(ValueError):
    """The folder is not a diffusers pipeline this engine can describe (the message says why)."""


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CardError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CardError(f"{path} is not a JSON object")
    return data


def is_diffusers_folder(path: Path) -> bool:
    return (path / "model_index.json").is_file()


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def card_for_folder(path: Path, model_id: str | None = None) -> ModelCard:
    """The card of one diffusers folder; `model_id` defaults to the folder's name."""
    path = path.expanduser().resolve()
    index = _json(path / "model_index.json")
    pipeline = str(index.get("_class_name", ""))
    if "unet" not in index or "vae" not in index:
        raise CardError(f"{path}: {pipeline or 'this pipeline'} has no unet and vae; only UNet pipelines are served")
    unet = _json(path / "unet" / "config.json")
    vae = _json(path / "vae" / "config.json")
    vae_scale = 2 ** (len(vae.get("block_out_channels", [0])) - 1)
    latent = int(unet.get("sample_size", 64))
    multiple = vae_scale * 2 ** (len(unet.get("block_out_channels", [0])) - 1)
    native = latent * vae_scale
    image = {
        "pipeline": pipeline,
        "native_size": f"{native}x{native}",
        "size_multiple": multiple,
        "max_side": max(native * 2, multiple),
        "default_steps": DEFAULT_STEPS,
        "supports_edits": pipeline in EDITABLE,
        "formats": ["png", "jpeg", "webp"],
    }
    return ModelCard(
        model_id=ModelId(model_id or path.name),
        n_layers=1,
        hidden_size=int(unet.get("cross_attention_dim", 1) or 1),
        tasks=("ImageGeneration",),
        family="diffusers",
        quantization="fp32",
        capabilities=("image",),
        storage_size=_folder_bytes(path),
        compatible_backends=BACKENDS,
        backend_preference=BACKENDS,
        sections={"image": image, "source": {"kind": "local", "path": str(path)}},
    )


def image_section(card: ModelCard) -> dict[str, Any]:
    section = card.sections.get("image")
    return section if isinstance(section, dict) else {}


def parse_size(card: ModelCard, size: str | None, max_pixels: int) -> tuple[int, int]:
    """(width, height) for a request's `size` ("auto"/None: the native size), or CardError saying
    which sizes this model takes."""
    image = image_section(card)
    native = str(image.get("native_size", "512x512"))
    multiple = int(image.get("size_multiple", 8))
    max_side = int(image.get("max_side", 1024))
    rule = (
        f"{card.model_id} takes sizes WIDTHxHEIGHT with each side a multiple of {multiple} from {multiple} to "
        f"{max_side} and at most {max_pixels} pixels (its native size, and 'auto', is {native})"
    )
    text = native if size in (None, "", "auto") else size
    match = SIZE.match(str(text))
    if match is None:
        raise CardError(f"size {size!r} is not WIDTHxHEIGHT; {rule}")
    width, height = int(match.group(1)), int(match.group(2))
    if (
        width % multiple
        or height % multiple
        or not multiple <= width <= max_side
        or not multiple <= height <= max_side
        or width * height > max_pixels
    ):
        raise CardError(f"size {size!r} is not available; {rule}")
    return width, height


class DiffusersModelStore:
    """The diffusers folders under the configured `model_dirs` (the folder's name is the model id)."""

    name = "diffusers"

    def __init__(self, model_dirs: list[str]) -> None:
        self.model_dirs = [Path(d).expanduser() for d in model_dirs]

    def _folders(self) -> list[Path]:
        found = []
        for root in self.model_dirs:
            if is_diffusers_folder(root):
                found.append(root)
            elif root.is_dir():
                found += sorted(p for p in root.iterdir() if p.is_dir() and is_diffusers_folder(p))
        return found

    def catalog(self) -> dict[str, ModelCard]:
        cards: dict[str, ModelCard] = {}
        for folder in self._folders():
            try:
                card = card_for_folder(folder)
            except CardError:
                continue  # not ours to serve; the folder stays unlisted
            cards[card.model_id] = card
        return cards

    def local_path(self, model_id: str) -> Path | None:
        card = self.catalog().get(model_id)
        return Path(card.sections["source"]["path"]) if card is not None else None
