"""`[plugins.speech]` in a profile: every field has a default, so the plugin works without a table."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PLUGIN = "speech"


class SpeechConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threads: int = Field(default=1, ge=1, description="CPU threads per speech runner (onnxruntime, CTranslate2)")
    deterministic: bool = Field(
        default=False, description="Piper with noise scales 0: byte-identical audio run to run (tests)"
    )
    beam_size: int = Field(default=1, ge=1, le=10, description="Whisper beam width (1: greedy, fastest on CPU)")
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024, description="largest audio upload accepted")
    max_input_chars: int = Field(default=4096, ge=1, description="longest text /v1/audio/speech accepts")
    upload_timeout_s: float = Field(default=60.0, gt=0, description="how long a runner waits for its upload")
    realtime_max_turn_s: float = Field(default=30.0, gt=0, description="a realtime turn is committed at this length")
    vad_threshold: float = Field(default=0.5, gt=0, lt=1, description="Silero speech probability for 'speaking'")
    vad_silence_ms: int = Field(default=500, ge=100, description="silence that ends a realtime turn")
    place_on_request: bool = Field(
        default=True,
        description="a request for a speech model with no instance places it and waits for it "
        "(skulk_api_control.on_demand); false: a 404 saying to place it first",
    )


def from_options(options: dict[str, object]) -> SpeechConfig:
    """The runner's typed copy of the table (RunnerSpec.options is the node's validated table)."""
    return SpeechConfig.model_validate(dict(options))
