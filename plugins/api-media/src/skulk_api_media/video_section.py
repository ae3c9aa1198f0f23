"""The `[video]` section of a model card, and a request resolved against it.

The section states what the model truthfully does and names no engine: its modes (`t2v`, text
only; `i2v`, the input image is the first frame), the canvases it renders, the frame rate, the
frame grid (a frame count is valid when `count % frame_grid_multiple == frame_grid_offset`; a
request is snapped up to the grid), the length limits, whether the clip carries an audio track,
and the default number of sampling steps. An engine may keep its own data beside it (the ComfyUI
engine's workflow graph: `workflow` or `workflow_file`), which this model passes through.

The API resolves every request here once, before anything is sent, so a bad size or length is a
400 that names what the card allows; the engine receives the resolved numbers in the request's
options (`width`, `height`, `frames`, `fps`, `steps`) and never re-derives them.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from skulk_kernel.api import ModelCard

VideoMode = Literal["t2v", "i2v"]


class VideoSection(BaseModel):
    model_config = ConfigDict(extra="allow")

    modes: tuple[VideoMode, ...] = ("t2v",)
    sizes: tuple[str, ...] = Field(min_length=1, description="WIDTHxHEIGHT canvases the model renders")
    default_size: str | None = None
    fps: int = Field(default=24, ge=1, le=120)
    frame_grid_multiple: int = Field(default=1, ge=1)
    frame_grid_offset: int = Field(default=0, ge=0)
    min_seconds: float = Field(default=1.0, gt=0)
    max_seconds: float = Field(default=10.0, gt=0)
    default_seconds: float = Field(default=4.0, gt=0)
    audio: bool = False
    audio_rate: int = Field(default=24000, ge=8000, le=192000)
    default_steps: int = Field(default=8, ge=1, le=1000)

    @model_validator(mode="after")
    def _consistent(self) -> VideoSection:
        for size in self.sizes:
            parse_size(size)
        if self.default_size is not None and self.default_size not in self.sizes:
            raise ValueError(f"default_size {self.default_size!r} is not one of sizes")
        if self.frame_grid_offset >= self.frame_grid_multiple:
            raise ValueError("frame_grid_offset must be below frame_grid_multiple")
        if not self.min_seconds <= self.default_seconds <= self.max_seconds:
            raise ValueError("default_seconds must lie within min_seconds..max_seconds")
        return self


class VideoRequestError(ValueError):
    """A request the card cannot serve; `param` is the field to fix."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ResolvedVideo(BaseModel):
    """What the engine renders: every number decided, nothing left to the engine's defaults."""

    model_config = ConfigDict(frozen=True)

    mode: VideoMode
    width: int
    height: int
    fps: int
    frames: int
    steps: int
    audio: bool
    audio_rate: int

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def seconds(self) -> float:
        return self.frames / self.fps

    def options(self) -> dict[str, Any]:
        return self.model_dump()


def parse_size(size: str) -> tuple[int, int]:
    width, sep, height = size.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"size {size!r} is not WIDTHxHEIGHT")
    w, h = int(width), int(height)
    if not (16 <= w <= 8192 and 16 <= h <= 8192) or w % 2 or h % 2:
        raise ValueError(f"size {size!r}: both sides must be even and within 16..8192")
    return w, h


def video_section(card: ModelCard) -> VideoSection | None:
    """The card's `[video]` section, or None when it has none (or an invalid one)."""
    raw = card.sections.get("video")
    if not isinstance(raw, dict):
        return None
    try:
        return VideoSection.model_validate(raw)
    except ValidationError:
        return None


def snap_frames(raw: int, multiple: int, offset: int) -> int:
    """The smallest count >= raw on the grid (count % multiple == offset), at least one frame."""
    count = max(raw, offset, 1)
    count += (offset - count) % multiple
    return count


def resolve(
    section: VideoSection, *, size: str | None, seconds: float | None, steps: int | None, has_image: bool
) -> ResolvedVideo:
    """Resolve a request against the card, or raise VideoRequestError naming what is allowed."""
    mode: VideoMode = "i2v" if has_image else "t2v"
    if mode not in section.modes:
        wanted = "an input_reference image" if mode == "i2v" else "text only"
        raise VideoRequestError(
            f"this model does not render from {wanted}; its modes are {', '.join(section.modes)}",
            param="input_reference",
            code="unsupported_mode",
        )
    chosen = size or section.default_size or section.sizes[0]
    if chosen not in section.sizes:
        raise VideoRequestError(
            f"size {chosen!r} is not one this model renders; use one of {', '.join(section.sizes)}",
            param="size",
            code="unsupported_size",
        )
    width, height = parse_size(chosen)
    length = section.default_seconds if seconds is None else seconds
    if not math.isfinite(length) or length < section.min_seconds or length > section.max_seconds:
        raise VideoRequestError(
            f"seconds={length:g} is outside this model's range of {section.min_seconds:g} to "
            f"{section.max_seconds:g} seconds",
            param="seconds",
            code="unsupported_duration",
        )
    raw = math.ceil(length * section.fps - 1e-9)
    frames = snap_frames(raw, section.frame_grid_multiple, section.frame_grid_offset)
    use_steps = section.default_steps if steps is None else steps
    if not 1 <= use_steps <= 1000:
        raise VideoRequestError("steps must be from 1 to 1000", param="steps")
    return ResolvedVideo(
        mode=mode,
        width=width,
        height=height,
        fps=section.fps,
        frames=frames,
        steps=use_steps,
        audio=section.audio,
        audio_rate=section.audio_rate,
    )
