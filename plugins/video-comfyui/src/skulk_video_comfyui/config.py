"""`[plugins.video-comfyui]`: every field has a default; the runner reads the same table."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

PLUGIN = "video-comfyui"


class VideoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    test_engine: bool = Field(default=True, description="offer the deterministic test video engine and its card")
    step_seconds: float = Field(default=0.0, ge=0, le=60, description="test engine: sleep per sampling step")
    comfyui_root: str = Field(default="", description="a ComfyUI checkout (main.py); or $SKULK_COMFY_ROOT")
    comfyui_python: str = Field(default="", description="its environment's interpreter; or $SKULK_COMFY_BIN")
    server_command: list[str] = Field(default_factory=list, description="replaces the launch line entirely")
    extra_args: list[str] = Field(default_factory=list, description="more ComfyUI arguments (--cpu, --lowvram)")
    cards_dir: str = Field(default="", description="ComfyUI video cards (*.json) with their workflow files")
    start_timeout_s: float = Field(default=300.0, gt=0, description="how long ComfyUI may take to start")
    input_timeout_s: float = Field(default=60.0, gt=0, description="how long a runner waits for an input image")
    render_timeout_s: float = Field(default=3600.0, gt=0, description="how long one video may take to render")
    max_input_bytes: int = Field(default=20 * 1024 * 1024, ge=1, description="largest input_reference image")

    def root(self) -> str:
        return self.comfyui_root or os.environ.get("SKULK_COMFY_ROOT", "")

    def python(self) -> str:
        import sys

        return self.comfyui_python or os.environ.get("SKULK_COMFY_BIN", "") or sys.executable

    def comfyui_configured(self) -> bool:
        return bool(self.server_command) or bool(self.root())


def from_options(options: dict[str, object]) -> VideoConfig:
    """The runner's copy (RunnerSpec.options is the raw profile table)."""
    return VideoConfig.model_validate(dict(options))
