"""The video model cards this plugin serves, and the store that finds them.

* `skulk/test-video`, the deterministic test engine's card: it names no files, so it places with
  nothing to download. Its `[video]` section is real model truth for that engine (canvases, 12 fps,
  a 4k+1 frame grid like real video models, 0.5-8 s, a stereo tone).
* `skulk/comfyui-weightless`: ComfyUI's weight-free nodes (EmptyImage -> ImageInvert ->
  CreateVideo -> SaveVideo, `workflows/weightless_t2v.json`), so a real ComfyUI install can be
  checked end to end without a checkpoint. Offered only where ComfyUI is configured.
* Every `*.json` card in `cards_dir`: an operator's ComfyUI video cards (a ModelCard in JSON whose
  `sections.video.workflow_file` names a graph beside it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard, ModelId

from .config import VideoConfig

log = logging.getLogger("skulk.video")
TEST_VIDEO = "skulk/test-video"
COMFY_WEIGHTLESS = "skulk/comfyui-weightless"
TEST_BACKEND = "test_video-cpu"
COMFY_BACKENDS = ("comfyui-cuda", "comfyui-cpu")


def test_video_card() -> ModelCard:
    return ModelCard(
        model_id=ModelId(TEST_VIDEO),
        n_layers=1,
        hidden_size=1,
        tasks=("VideoGeneration",),
        family="test-video",
        capabilities=("video",),
        compatible_backends=(TEST_BACKEND,),
        backend_preference=(TEST_BACKEND,),
        sections={
            "video": {
                "modes": ["t2v", "i2v"],
                "sizes": ["160x96", "256x144", "320x180", "480x272"],
                "default_size": "256x144",
                "fps": 12,
                "frame_grid_multiple": 4,
                "frame_grid_offset": 1,
                "min_seconds": 0.5,
                "max_seconds": 8.0,
                "default_seconds": 2.0,
                "audio": True,
                "audio_rate": 24000,
                "default_steps": 4,
            }
        },
    )


def comfy_weightless_card() -> ModelCard:
    return ModelCard(
        model_id=ModelId(COMFY_WEIGHTLESS),
        n_layers=1,
        hidden_size=1,
        tasks=("VideoGeneration",),
        family="comfyui",
        capabilities=("video",),
        compatible_backends=COMFY_BACKENDS,
        backend_preference=COMFY_BACKENDS,
        sections={
            "video": {
                "modes": ["t2v"],
                "sizes": ["160x96", "256x144", "512x288"],
                "fps": 8,
                "min_seconds": 0.5,
                "max_seconds": 4.0,
                "default_seconds": 1.0,
                "default_steps": 1,
                "workflow_file": "weightless_t2v.json",
            }
        },
    )


def folder_cards(folder: Path) -> dict[str, ModelCard]:
    cards: dict[str, ModelCard] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            card = ModelCard.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("video card %s is unreadable: %s", path, exc)
            continue
        cards[card.model_id] = card
    return cards


class VideoModelStore:
    name = "video-comfyui"

    def __init__(self, config: VideoConfig) -> None:
        self.config = config
        self.folder = Path(config.cards_dir) if config.cards_dir else None

    def catalog(self) -> dict[str, ModelCard]:
        cards: dict[str, ModelCard] = {}
        if self.config.test_engine:
            cards[TEST_VIDEO] = test_video_card()
        if self.config.comfyui_configured():
            cards[COMFY_WEIGHTLESS] = comfy_weightless_card()
            if self.folder is not None and self.folder.is_dir():
                cards.update(folder_cards(self.folder))
        return cards

    def local_path(self, model_id: str) -> Path | None:
        """The cards folder for an operator's card (its workflow lies there); None for the bundled ones."""
        if model_id in (TEST_VIDEO, COMFY_WEIGHTLESS):
            return None
        return self.folder

    def ensure_local(self, model_id: str, progress: Callable[..., Any] | None = None) -> Path | None:
        return self.local_path(model_id)
