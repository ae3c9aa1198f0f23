"""First-party capabilities over what the speech plugin already serves: tts, stt, stt.realtime, vad @1.0.0.

They are facades, not engines: `tts` and `stt` send the same SpeechSynthesis and Transcription
commands the OpenAI audio routes send (so placement, routing, uploads on the data plane and the
runners are the speech plugin's), and `vad` runs the speech plugin's Silero turn detector in this
node's process. They are offered on a node whose profile loads the speech plugin; `vad` needs no
model placed (always available there), `tts` and `stt` answer `model_not_placed` until a model of
their kind is placed (or place one on first use when `[plugins.speech] place_on_request` is on).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import AsyncIterator
from typing import Any

from skulk_kernel.api import NodeSurface

from .api import Capability, Descriptor, IoMode, ProviderError

log = logging.getLogger("skulk.providers.speech")
B64 = {"type": "string", "contentEncoding": "base64", "description": "base64 bytes"}
MODEL = {"type": "string", "minLength": 1, "description": "a speech model id (default: the one placed)"}
MAX_AUDIO_BYTES = 25 * 1024 * 1024


def _decode(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProviderError(f"{what} is not valid base64", "invalid_input") from None


def _placed_model(node: NodeSurface, task: str) -> str | None:
    from skulk_kernel.api import catalog

    placed = {i.shard_assignments.model_id for i in node.state.instances.values()}
    return next((c.model_id for c in catalog(node).values() if task in c.tasks and c.model_id in placed), None)


def _model(node: NodeSurface, task: str, asked: str | None) -> str:
    model = asked or _placed_model(node, task)
    if model is None:
        kind = "text-to-speech" if task == "SpeechSynthesis" else "speech-to-text"
        raise ProviderError(f"no {kind} model is placed; name one in 'model' or place one (POST /place_instance)",
                            "model_not_placed")  # fmt: skip
    return model


def _voice(node: NodeSurface, model: str) -> str | None:
    """The card's default voice (what /v1/audio/speech uses when none is named)."""
    from skulk_kernel.api import catalog
    from skulk_speech.cards import audio_section

    card = catalog(node).get(model)
    if card is None:
        return None
    audio = audio_section(card)
    voices = list(audio.get("voices", []))
    return audio.get("default_voice") or (voices[0] if voices else None)


def _servable(node: NodeSurface, task: str) -> bool:
    """Ready: a model of the kind is placed somewhere, or the speech plugin places one on request."""
    return bool(getattr(_config(node), "place_on_request", False)) or _placed_model(node, task) is not None


def _config(node: NodeSurface) -> Any:
    from skulk_speech.config import SpeechConfig

    return node.plugin_config("speech") or SpeechConfig()


async def _chunks(handle: Any) -> AsyncIterator[Any]:
    """A speech handle's chunks; an error chunk becomes a typed ProviderError; always closed."""
    from skulk_kernel.api import ErrorChunk

    try:
        async for chunk in handle.chunks():
            if isinstance(chunk, ErrorChunk):
                raise ProviderError(
                    chunk.message, "invalid_input" if chunk.code == "invalid_audio" else "provider_error"
                )
            yield chunk
    finally:
        await handle.close()


async def _start(call: Any) -> Any:
    from skulk_api_control.dispatch import InferenceError

    try:
        return await call
    except InferenceError as exc:
        code = {404: "model_not_placed", 400: "invalid_input", 409: "model_not_placed"}.get(
            exc.status, "provider_error"
        )
        raise ProviderError(exc.message, code) from None


class Tts(Capability):
    descriptor = Descriptor(
        id="tts", version="1.0.0",
        description="Text to speech: one text in, its audio out as it is synthesised (PCM16 mono, base64 chunks).",
        input_schema={"type": "object", "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 4096}, "voice": {"type": "string"},
            "model": MODEL, "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0}},
            "required": ["text"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "audio": B64, "sample_rate": {"type": "integer", "minimum": 1}, "format": {"const": "pcm16"}},
            "required": ["audio", "sample_rate", "format"], "additionalProperties": False},
        mode=IoMode.SERVER_STREAMING,
    )  # fmt: skip

    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    def ready(self) -> bool:
        return _servable(self.node, "SpeechSynthesis")

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from skulk_kernel.api import AudioChunk, SpeechParams
        from skulk_speech import calls

        request = await anext(inputs)
        config = _config(self.node)
        model = _model(self.node, "SpeechSynthesis", request.get("model"))
        voice = request.get("voice") or _voice(self.node, model)
        speed = float(request.get("speed", 1.0))
        params = SpeechParams(model_id=model, input=request["text"], voice=voice, options={"speed": speed})
        handle = await _start(calls.synthesize(self.node, params, config.place_on_request))
        async for chunk in _chunks(handle):
            if isinstance(chunk, AudioChunk) and chunk.data:
                yield {"audio": chunk.data, "sample_rate": chunk.sample_rate or 24000, "format": "pcm16"}


class Stt(Capability):
    descriptor = Descriptor(
        id="stt", version="1.0.0",
        description="Speech to text: send an audio file (WAV, MP3, FLAC, OGG...) in base64 pieces, half-close, "
        "get its transcript. 'model' and 'language' are read from the first piece.",
        input_schema={"type": "object", "properties": {
            "audio": B64, "model": MODEL, "language": {"type": "string", "minLength": 2, "maxLength": 8}},
            "required": ["audio"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {"text": {"type": "string"}, "model": {"type": "string"}},
                       "required": ["text", "model"], "additionalProperties": False},
        mode=IoMode.CLIENT_STREAMING,
    )  # fmt: skip

    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    def ready(self) -> bool:
        return _servable(self.node, "Transcription")

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from skulk_kernel.api import SpeechParams, TranscriptChunk
        from skulk_speech import calls

        pieces: list[bytes] = []
        first: dict[str, Any] | None = None
        size = 0
        async for message in inputs:
            first = first or message
            piece = _decode(message["audio"], "audio")
            size += len(piece)
            if size > MAX_AUDIO_BYTES:
                raise ProviderError(f"the audio is over {MAX_AUDIO_BYTES} bytes", "payload_too_large")
            pieces.append(piece)
        if first is None or not size:
            raise ProviderError("no audio was sent before the half-close", "invalid_input")
        config = _config(self.node)
        model = _model(self.node, "Transcription", first.get("model"))
        options = {"language": first.get("language"), "temperature": 0.0}
        params = SpeechParams(model_id=model, options=options)
        handle = await _start(calls.transcribe(self.node, params, b"".join(pieces), config.place_on_request))
        text = [c.text async for c in _chunks(handle) if isinstance(c, TranscriptChunk)]
        yield {"text": "".join(text).strip(), "model": model}


class Vad(Capability):
    descriptor = Descriptor(
        id="vad", version="1.0.0",
        description="Voice activity: send PCM16 mono audio in base64 pieces as it is captured; get speech_started "
        "and speech_stopped events with their position (ms). 'sample_rate' (default 24000) is read from the first.",
        input_schema={"type": "object", "properties": {
            "audio": B64, "sample_rate": {"type": "integer", "minimum": 8000, "maximum": 48000}},
            "required": ["audio"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "event": {"enum": ["speech_started", "speech_stopped"]}, "audio_ms": {"type": "integer", "minimum": 0}},
            "required": ["event", "audio_ms"], "additionalProperties": False},
        mode=IoMode.BIDIRECTIONAL,
    )  # fmt: skip

    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from skulk_speech.vad import TurnDetector

        config = _config(self.node)
        detector: Any = None
        async for message in inputs:
            if detector is None:
                rate = int(message.get("sample_rate", 24000))
                detector = await asyncio.to_thread(TurnDetector, rate, config.vad_threshold, config.vad_silence_ms)
            for boundary in await asyncio.to_thread(detector.feed, _decode(message["audio"], "audio")):
                yield {"event": f"speech_{boundary.kind}", "audio_ms": int(boundary.at_ms)}


class SttRealtime(Capability):
    descriptor = Descriptor(
        id="stt.realtime", version="1.0.0",
        description="Realtime speech to text: send PCM16 mono audio in base64 pieces as it is captured; get "
        "speech_started, speech_stopped and each turn's transcript as it ends. 'sample_rate' (default 24000), "
        "'model' and 'language' are read from the first piece; a half-close transcribes what is left.",
        input_schema={"type": "object", "properties": {
            "audio": B64, "sample_rate": {"type": "integer", "minimum": 8000, "maximum": 48000}, "model": MODEL,
            "language": {"type": "string", "minLength": 2, "maxLength": 8}},
            "required": ["audio"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "event": {"enum": ["speech_started", "speech_stopped", "transcript"]},
            "audio_ms": {"type": "integer", "minimum": 0}, "text": {"type": "string"}},
            "required": ["event", "audio_ms"], "additionalProperties": False},
        mode=IoMode.BIDIRECTIONAL,
    )  # fmt: skip

    PADDING_MS = 300

    def __init__(self, node: NodeSurface) -> None:
        self.node = node

    def ready(self) -> bool:
        return _servable(self.node, "Transcription")

    async def stream(self, inputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from skulk_speech.vad import TurnDetector

        config = _config(self.node)
        first: dict[str, Any] | None = None
        detector: Any = None
        rate, buffer, buffer_ms, received_ms, start_ms = 24000, bytearray(), 0, 0, None
        async for message in inputs:
            if first is None:
                first = message
                rate = int(message.get("sample_rate", 24000))
                detector = await asyncio.to_thread(TurnDetector, rate, config.vad_threshold, config.vad_silence_ms)
            pcm = _decode(message["audio"], "audio")
            buffer += pcm
            received_ms += len(pcm) * 1000 // (2 * rate)
            for boundary in await asyncio.to_thread(detector.feed, pcm):
                if boundary.kind == "started":
                    start_ms = boundary.at_ms
                    yield {"event": "speech_started", "audio_ms": int(boundary.at_ms)}
                elif start_ms is not None:
                    yield {"event": "speech_stopped", "audio_ms": int(boundary.at_ms)}
                    end_ms = min(received_ms, boundary.at_ms + 200)
                    turn, buffer, buffer_ms = self._cut(buffer, buffer_ms, start_ms, end_ms, rate)
                    yield await self._transcript(turn, rate, first, end_ms)
                    start_ms = None
            if start_ms is None and len(buffer) > 2 * rate * 2:  # keep a second of lead-in, no more
                drop = len(buffer) - 2 * rate
                drop -= drop % 2
                del buffer[:drop]
                buffer_ms += drop * 1000 // (2 * rate)
        if first is not None and start_ms is not None:  # the half-close ends a turn still open
            turn, buffer, buffer_ms = self._cut(buffer, buffer_ms, start_ms, received_ms, rate)
            yield {"event": "speech_stopped", "audio_ms": received_ms}
            yield await self._transcript(turn, rate, first, received_ms)

    def _cut(
        self, buffer: bytearray, buffer_ms: int, start_ms: int, end_ms: int, rate: int
    ) -> tuple[bytes, bytearray, int]:
        def at(ms: int) -> int:
            offset = max(0, ms - buffer_ms) * 2 * rate // 1000
            return offset - offset % 2

        turn = bytes(buffer[at(start_ms - self.PADDING_MS) : at(end_ms)])
        return turn, bytearray(buffer[at(end_ms) :]), max(buffer_ms, end_ms)

    async def _transcript(self, pcm: bytes, rate: int, first: dict[str, Any], end_ms: int) -> dict[str, Any]:
        from skulk_kernel.api import SpeechParams, TranscriptChunk
        from skulk_speech import calls
        from skulk_speech.audio import wav_bytes

        config = _config(self.node)
        model = _model(self.node, "Transcription", first.get("model"))
        params = SpeechParams(model_id=model, options={"language": first.get("language"), "temperature": 0.0})
        wav = await asyncio.to_thread(wav_bytes, pcm, rate)
        handle = await _start(calls.transcribe(self.node, params, wav, config.place_on_request))
        text = [c.text async for c in _chunks(handle) if isinstance(c, TranscriptChunk)]
        return {"event": "transcript", "audio_ms": int(end_ms), "text": "".join(text).strip()}


def speech_capabilities(node: NodeSurface) -> list[Capability]:
    """The facades, where this node loads the speech plugin (none elsewhere)."""
    if "speech" not in node.profile.plugins:
        return []
    try:
        import skulk_speech.calls
        import skulk_speech.vad  # noqa: F401
    except ImportError as exc:
        log.info("speech capabilities not offered: %s", exc)
        return []
    return [Tts(node), Stt(node), SttRealtime(node), Vad(node)]
