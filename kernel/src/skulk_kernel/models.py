"""Model cards: what the cluster knows about a model before it loads it.

The card is replicated (custom cards live in State) because placement, previews and the API all
reason about the same numbers on every node. Fields follow the reference's TOML cards; sections the
kernel does not interpret ([reasoning], [tooling], [runtime], ...) ride in `sections`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .ids import ModelId
from .wire import WireModel

# fmt: off
ModelTask = Literal[
    "TextGeneration", "TextEmbedding", "SpeechSynthesis", "Transcription", "ImageGeneration", "VideoGeneration",
    "TextRerank",
]
# fmt: on


class ModelCard(WireModel):
    model_id: ModelId
    n_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_key_value_heads: int = Field(default=1, ge=1)
    supports_tensor: bool = False
    tasks: tuple[ModelTask, ...] = ("TextGeneration",)
    family: str = ""
    quantization: str = ""
    capabilities: tuple[str, ...] = ()
    context_length: int = Field(default=2048, ge=1)
    storage_size: int = Field(default=0, ge=0, description="bytes of model files on disk")
    gguf_file: str | None = None
    embedding_dimensions: int | None = None
    compatible_backends: tuple[str, ...] = ()
    backend_preference: tuple[str, ...] = ()
    sections: dict[str, dict[str, Any]] = Field(default_factory=dict)
