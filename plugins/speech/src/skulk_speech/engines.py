"""The speech engines: Piper (text to speech) and faster-whisper (speech to text) on CPU, and
mlx-audio on Apple Silicon where it is installed.

Each engine is registered on every node (probing, backend tags) and loaded only inside a runner
subprocess. A loaded session implements the session Protocol of each task kind its engine serves
(`skulk_kernel.api.SpeechSynthesisSession`, `TranscriptionSession`) and nothing else; the runner
answers any other kind with "engine X does not serve <kind>":

* `synthesize(command_id, params, cancelled)` yields `AudioChunk`s of mono s16le PCM, one per
  sentence as Piper finishes it (so the API can stream before the whole input is spoken), then a
  terminal chunk;
* `transcribe(command_id, params, cancelled)` waits for the upload (`uploads.wait_for_upload`),
  decodes it with PyAV and yields one `TranscriptChunk` per Whisper segment (with word timestamps
  when asked), then a terminal chunk with the language and the duration.

Cancellation is polled between sentences / segments. Errors that are the caller's (an unknown
voice, audio that does not decode) are `ErrorChunk`s with `error_type="invalid_request_error"`.
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from skulk_kernel.api import (
    AudioChunk,
    Chunk,
    CommandId,
    EngineProbe,
    ErrorChunk,
    GenerationStats,
    RunnerSpec,
    SpeechParams,
    TranscriptChunk,
    Usage,
)

from .cards import audio_section
from .config import from_options

log = logging.getLogger("skulk.speech.engines")


def _error(command_id: str, message: str, code: str, *, caller: bool = True, seq: int = 0) -> ErrorChunk:
    return ErrorChunk(
        command_id=CommandId(command_id),
        seq=seq,
        message=message,
        code=code,
        error_type="invalid_request_error" if caller else "server_error",
    )


def _quiet_onnxruntime() -> None:
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # else onnxruntime writes under ~/.cache


# ================================================================== Piper


class PiperSession:
    """A Piper voice: serves SpeechSynthesis."""

    def __init__(self, voice: Any, spec: RunnerSpec) -> None:
        self.voice = voice
        self.spec = spec
        self.sample_rate = int(voice.config.sample_rate)
        self.voices = tuple(audio_section(spec.card).get("voices", ())) or ("default",)
        self.deterministic = from_options(spec.options).deterministic

    def _config(self, speed: float) -> Any:
        from piper import SynthesisConfig

        base = float(getattr(self.voice.config, "length_scale", 1.0) or 1.0)
        if self.deterministic:
            return SynthesisConfig(length_scale=base / speed, noise_scale=0.0, noise_w_scale=0.0)
        return SynthesisConfig(length_scale=base / speed)

    def close(self) -> None:
        self.voice = None  # the onnxruntime session goes with it

    def synthesize(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        voice = params.voice or self.voices[0]
        if voice not in self.voices:
            yield _error(
                command_id, f"unknown voice {voice!r}; this model has {', '.join(self.voices)}", "unknown_voice"
            )
            return
        text = params.input.strip()
        if not text:
            yield _error(command_id, "input is empty; send the text to speak", "empty_input")
            return
        speed = float(params.options.get("speed", 1.0))
        started = time.perf_counter()
        first_ms = 0.0
        samples = 0
        seq = 0
        for piece in self.voice.synthesize(text, self._config(speed)):
            if cancelled():
                yield AudioChunk(command_id=CommandId(command_id), seq=seq, data="", finish_reason="cancelled")
                return
            pcm = piece.audio_int16_bytes
            samples += len(pcm) // 2
            first_ms = first_ms or (time.perf_counter() - started) * 1000
            yield AudioChunk(
                command_id=CommandId(command_id),
                seq=seq,
                data=base64.b64encode(pcm).decode("ascii"),
                format="pcm",
                sample_rate=self.sample_rate,
            )
            seq += 1
        elapsed = time.perf_counter() - started
        audio_s = samples / self.sample_rate
        yield AudioChunk(
            command_id=CommandId(command_id),
            seq=seq,
            data="",
            format="pcm",
            sample_rate=self.sample_rate,
            finish_reason="stop",
            usage=Usage(prompt_tokens=len(text), completion_tokens=samples),
            stats=GenerationStats(
                prompt_tokens=len(text),
                generation_tokens=samples,
                generation_tps=(audio_s / elapsed) if elapsed else 0.0,  # seconds of audio per second
                ttft_ms=first_ms,
                backend="piper-cpu",
            ),
        )


class PiperEngine:
    name = "piper"
    tasks = frozenset({"SpeechSynthesis"})
    dispatch_width = 1  # one synthesis at a time per runner: onnxruntime uses the cores it is given
    splits: frozenset[Any] = frozenset()

    def probe(self) -> EngineProbe:
        if importlib.util.find_spec("piper") is None:
            return EngineProbe(available=False, reason="piper-tts is not installed (pip install piper-tts)")
        from importlib.metadata import version

        return EngineProbe(available=True, version=version("piper-tts"))

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return ["piper-cpu"] if self.probe().available else []

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> PiperSession:
        _quiet_onnxruntime()
        import onnxruntime
        from piper import PiperVoice

        if spec.model_path is None:
            raise FileNotFoundError(f"no voice file for {spec.card.model_id} on this node")
        progress(0, 1)
        threads = from_options(spec.options).threads
        voice = PiperVoice.load(spec.model_path)
        options = onnxruntime.SessionOptions()  # the voice's session, re-made with our thread count
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        voice.session = onnxruntime.InferenceSession(
            str(spec.model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        progress(1, 1)
        return PiperSession(voice, spec)


# ================================================================== faster-whisper


class WhisperSession:
    """A faster-whisper model: serves Transcription."""

    def __init__(self, model: Any, spec: RunnerSpec) -> None:
        self.model = model
        self.spec = spec
        self.audio = audio_section(spec.card)
        config = from_options(spec.options)
        self.beam_size = config.beam_size
        self.upload_timeout_s = config.upload_timeout_s

    def close(self) -> None:
        self.model = None

    def transcribe(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        from .audio import AudioError, decode_16k_mono
        from .uploads import UploadError, wait_for_upload

        try:
            data = wait_for_upload(
                self.spec.instance_id, command_id, params.audio_sha256 or "", self.upload_timeout_s, cancelled
            )
        except UploadError as exc:
            if cancelled():
                yield TranscriptChunk(command_id=CommandId(command_id), seq=0, text="", finish_reason="cancelled")
            else:
                yield _error(command_id, f"upload failed: {exc}", "upload_failed", caller=False)
            return
        try:
            samples = decode_16k_mono(data)
        except AudioError as exc:
            yield _error(command_id, str(exc), "invalid_audio")
            return
        options = params.options
        language = options.get("language") or ("en" if self.audio.get("english_only") else None)
        translate = bool(options.get("translate")) and not self.audio.get("english_only")
        started = time.perf_counter()
        segments, info = self.model.transcribe(
            samples,
            language=language,
            task="translate" if translate else "transcribe",
            initial_prompt=options.get("prompt") or None,
            temperature=float(options.get("temperature", 0.0)),
            beam_size=self.beam_size,
            word_timestamps=bool(options.get("word_timestamps", False)),
            condition_on_previous_text=False,
        )
        seq = 0
        first_ms = 0.0
        for segment in segments:
            if cancelled():
                yield TranscriptChunk(command_id=CommandId(command_id), seq=seq, text="", finish_reason="cancelled")
                return
            first_ms = first_ms or (time.perf_counter() - started) * 1000
            words = tuple((w.word, round(w.start, 3), round(w.end, 3)) for w in (segment.words or ()))
            yield TranscriptChunk(
                command_id=CommandId(command_id),
                seq=seq,
                text=segment.text,
                start=round(segment.start, 3),
                end=round(segment.end, 3),
                words=words,
            )
            seq += 1
        elapsed = time.perf_counter() - started
        duration = float(info.duration)
        yield TranscriptChunk(
            command_id=CommandId(command_id),
            seq=seq,
            text="",
            start=0.0,
            end=round(duration, 3),
            language=str(info.language or language or ""),
            finish_reason="stop",
            usage=Usage(prompt_tokens=int(duration * 1000), completion_tokens=seq),
            stats=GenerationStats(
                generation_tps=(duration / elapsed) if elapsed else 0.0,  # seconds of audio per second
                ttft_ms=first_ms,
                backend="whisper-cpu",
            ),
        )


class WhisperEngine:
    name = "whisper"
    tasks = frozenset({"Transcription"})
    dispatch_width = 1
    splits: frozenset[Any] = frozenset()

    def probe(self) -> EngineProbe:
        if importlib.util.find_spec("faster_whisper") is None:
            return EngineProbe(available=False, reason="faster-whisper is not installed (pip install faster-whisper)")
        from importlib.metadata import version

        return EngineProbe(available=True, version=version("faster-whisper"))

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return ["whisper-cpu"] if self.probe().available else []

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> WhisperSession:
        from faster_whisper import WhisperModel

        if spec.model_path is None:
            raise FileNotFoundError(f"no model folder for {spec.card.model_id} on this node")
        progress(0, 1)
        model = WhisperModel(
            str(spec.model_path), device="cpu", compute_type="int8", cpu_threads=from_options(spec.options).threads
        )
        progress(1, 1)
        return WhisperSession(model, spec)


# ================================================================== mlx-audio (Apple Silicon)


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


class MlxAudioSession:
    """TTS and STT through mlx-audio's own loaders (`mlx_audio.tts.utils` / `mlx_audio.stt.utils`):
    serves SpeechSynthesis with a `tts` card's model and Transcription with an `stt` one's.

    Not exercised on Linux CI (no weights ship in any package); it exists so a Mac node serves
    mlx-audio speech cards through the same routes.
    """

    def __init__(self, model: Any, spec: RunnerSpec, kind: str) -> None:
        self.model = model
        self.spec = spec
        self.kind = kind

    def close(self) -> None:
        self.model = None

    def synthesize(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        import numpy as np

        rate = int(getattr(self.model, "sample_rate", 24000))
        seq = 0
        for result in self.model.generate(
            text=params.input, voice=params.voice, speed=float(params.options.get("speed", 1.0))
        ):
            if cancelled():
                yield AudioChunk(command_id=CommandId(command_id), seq=seq, data="", finish_reason="cancelled")
                return
            pcm = (np.clip(np.asarray(result.audio, dtype=np.float32), -1, 1) * 32767).astype("<i2").tobytes()
            yield AudioChunk(
                command_id=CommandId(command_id),
                seq=seq,
                data=base64.b64encode(pcm).decode("ascii"),
                sample_rate=rate,
            )
            seq += 1
        yield AudioChunk(command_id=CommandId(command_id), seq=seq, data="", sample_rate=rate, finish_reason="stop")

    def transcribe(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        from .audio import decode_16k_mono
        from .uploads import UploadError, wait_for_upload

        try:
            data = wait_for_upload(self.spec.instance_id, command_id, params.audio_sha256 or "", float(60), cancelled)
        except UploadError as exc:
            yield _error(command_id, f"upload failed: {exc}", "upload_failed", caller=False)
            return
        result = self.model.generate(decode_16k_mono(data))
        seq = 0
        for segment in getattr(result, "segments", None) or []:
            yield TranscriptChunk(
                command_id=CommandId(command_id),
                seq=seq,
                text=str(segment.get("text", "")),
                start=float(segment.get("start", 0.0)),
                end=float(segment.get("end", 0.0)),
            )
            seq += 1
        if seq == 0:
            yield TranscriptChunk(command_id=CommandId(command_id), seq=0, text=str(getattr(result, "text", "")))
            seq = 1
        yield TranscriptChunk(command_id=CommandId(command_id), seq=seq, text="", finish_reason="stop")


class MlxAudioEngine:
    name = "mlx_audio"
    tasks = frozenset({"SpeechSynthesis", "Transcription"})
    dispatch_width = 1
    splits: frozenset[Any] = frozenset()

    def probe(self) -> EngineProbe:
        if not apple_silicon():
            return EngineProbe(available=False, reason="mlx-audio serves speech on Apple Silicon only")
        if importlib.util.find_spec("mlx_audio") is None:
            return EngineProbe(available=False, reason="mlx-audio is not installed (pip install mlx-audio)")
        from importlib.metadata import version

        return EngineProbe(available=True, version=version("mlx-audio"))

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return ["mlx_audio-metal"] if self.probe().available else []

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> MlxAudioSession:
        kind = audio_section(spec.card).get("kind", "tts")
        if kind == "stt":
            from mlx_audio.stt.utils import load_model
        else:
            from mlx_audio.tts.utils import load_model
        progress(0, 1)
        model = load_model(str(spec.model_path or spec.card.model_id))
        progress(1, 1)
        return MlxAudioSession(model, spec, kind)


def engines() -> list[Any]:
    return [PiperEngine(), WhisperEngine(), MlxAudioEngine()]
