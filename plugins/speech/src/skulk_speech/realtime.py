"""WS /v1/realtime: OpenAI-compatible realtime transcription sessions.

A client (the OpenAI SDK's `client.realtime.connect(...)`, a browser) streams base64 PCM16 mono at
24 kHz in `input_audio_buffer.append` events. With server VAD (the default) the socket runs Silero
on the audio as it arrives (`vad.TurnDetector`), says `input_audio_buffer.speech_started` /
`speech_stopped`, commits each utterance (`input_audio_buffer.committed`) and transcribes it as
one `Transcription` request to whichever node runs the model (the utterance travels as a WAV
upload on the data plane, like any other): `conversation.item.input_audio_transcription.delta`
per segment, then `.completed` with the whole transcript. Without VAD the client commits itself.
Both session dialects are understood: the GA `session.update` (`session.audio.input.format`) and
the beta `transcription_session.update` (`input_audio_format: "pcm16"`).

Mistakes are `error` events that say what to fix (a sample rate other than 24000, bad base64, an
unknown event type, committing an empty buffer) and the session stays open; a failed transcription
is `conversation.item.input_audio_transcription.failed` for that item only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from typing import Any

from skulk_api_control.dispatch import InferenceError
from skulk_kernel.api import ErrorChunk, NodeSurface, SpeechParams, TranscriptChunk, catalog, new_id
from starlette.websockets import WebSocket, WebSocketDisconnect

from . import calls
from .audio import PCM_RATE, wav_bytes
from .config import SpeechConfig
from .voice import VoiceConfig, VoiceLoop

log = logging.getLogger("skulk.speech.realtime")
BYTES_PER_MS = PCM_RATE * 2 // 1000
MAX_APPEND_BYTES = 15 * 1024 * 1024
PREFIX_PADDING_MS = 300
MIN_COMMIT_MS = 100


def _event_id() -> str:
    return f"event_{new_id()[:20]}"


def _item_id() -> str:
    return f"item_{new_id()[:20]}"


class RealtimeSession:
    def __init__(self, ws: WebSocket, node: NodeSurface, config: SpeechConfig, model: str | None) -> None:
        self.ws = ws
        self.node = node
        self.config = config
        self.model = model or self._default_model()
        self.language: str | None = None
        self.prompt: str | None = None
        self.server_vad = True
        self.silence_ms = config.vad_silence_ms
        self.threshold = config.vad_threshold
        self.padding_ms = PREFIX_PADDING_MS
        self.beta = False
        self.session_id = f"sess_{new_id()[:20]}"
        self.buffer = bytearray()  # PCM since the last commit
        self.buffer_start_ms = 0  # stream position of buffer[0]
        self.received_ms = 0
        self.detector: Any = None
        self.detector_origin_ms = 0  # stream position where the detector started (its positions count from it)
        self.speech_start_ms: int | None = None
        self.item_id: str | None = None
        self.previous_item: str | None = None
        self.turns: asyncio.Queue[tuple[str, bytes, float] | None] = asyncio.Queue()
        self.send_lock = asyncio.Lock()
        self.closed = False
        self.voice = VoiceLoop(node, self.send)  # answers turns once a session.update configures it

    def _default_model(self) -> str | None:
        for card in catalog(self.node).values():
            if "Transcription" in card.tasks and any(
                i.shard_assignments.model_id == card.model_id for i in self.node.state.instances.values()
            ):
                return card.model_id
        return None

    # ------------------------------------------------------------------ sending

    async def send(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        event = {"event_id": _event_id(), **event}
        async with self.send_lock:
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await self.ws.send_text(json.dumps(event, separators=(",", ":")))

    async def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> None:
        await self.send(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": code,
                    "message": message,
                    "param": param,
                    "event_id": event_id,
                },
            }
        )

    def describe(self) -> dict[str, Any]:
        vad = (
            {
                "type": "server_vad",
                "threshold": self.threshold,
                "prefix_padding_ms": self.padding_ms,
                "silence_duration_ms": self.silence_ms,
            }
            if self.server_vad
            else None
        )
        if self.beta:
            return {
                "id": self.session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": self.model, "language": self.language, "prompt": self.prompt},
                "turn_detection": vad,
            }
        if self.voice.config is not None:
            answer = self.voice.config
            return {
                "type": "realtime",
                "id": self.session_id,
                "object": "realtime.session",
                "model": answer.model,
                "instructions": answer.instructions,
                "max_output_tokens": answer.max_output_tokens,
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": PCM_RATE},
                        "transcription": {"model": self.model, "language": self.language, "prompt": self.prompt},
                        "turn_detection": vad,
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": PCM_RATE}, "voice": answer.voice},
                },
            }
        return {
            "type": "transcription",
            "id": self.session_id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": PCM_RATE},
                    "transcription": {"model": self.model, "language": self.language, "prompt": self.prompt},
                    "turn_detection": vad,
                }
            },
        }

    # ------------------------------------------------------------------ the session

    async def run(self) -> None:
        await self.send({"type": "session.created", "session": self.describe()})
        worker = asyncio.ensure_future(self._transcribe_turns())
        try:
            while True:
                try:
                    raw = await self.ws.receive_text()
                except WebSocketDisconnect:
                    return
                except (RuntimeError, KeyError):
                    await self.error("send realtime events as JSON text frames", "invalid_event")
                    continue
                await self.handle(raw)
        finally:
            await self.voice.close()  # closing the socket cancels the response in progress
            self.closed = True
            await self.turns.put(None)
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker

    async def handle(self, raw: str) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            await self.error("the event is not valid JSON", "invalid_json")
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.error("an event is a JSON object with a 'type'", "invalid_event")
            return
        kind = event["type"]
        eid = event.get("event_id")
        if kind in ("session.update", "transcription_session.update"):
            await self.update(event.get("session") or {}, beta=kind.startswith("transcription_"), event_id=eid)
        elif kind == "input_audio_buffer.append":
            await self.append(event.get("audio"), eid)
        elif kind == "input_audio_buffer.commit":
            if self.received_ms - self.buffer_start_ms < MIN_COMMIT_MS:
                await self.error(
                    f"the input audio buffer holds under {MIN_COMMIT_MS} ms of audio; append more before committing",
                    "input_audio_buffer_commit_empty",
                    event_id=eid,
                )
                return
            start = self.speech_start_ms if self.speech_start_ms is not None else self.buffer_start_ms
            await self.commit(start, self.received_ms)
        elif kind == "response.cancel":
            if not await self.voice.cancel("client_cancelled"):
                await self.error("there is no response in progress to cancel", "response_cancel_not_active",
                                 event_id=eid)  # fmt: skip
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            self.buffer_start_ms = self.received_ms
            self.speech_start_ms = None
            if self.detector is not None:
                self.detector.reset()
            await self.send({"type": "input_audio_buffer.cleared"})
        else:
            await self.error(
                f"unknown or unsupported event type {kind!r} in a transcription session",
                "invalid_event",
                param="type",
                event_id=eid,
            )

    async def update(self, session: dict[str, Any], *, beta: bool, event_id: str | None) -> None:
        self.beta = beta
        if beta:
            fmt = session.get("input_audio_format", "pcm16")
            if fmt != "pcm16":
                await self.error(
                    f"input_audio_format {fmt!r} is not supported; send 'pcm16' (mono, 24000 Hz)",
                    "invalid_value",
                    param="session.input_audio_format",
                    event_id=event_id,
                )
                return
            transcription = session.get("input_audio_transcription") or {}
            vad = session.get("turn_detection", "keep")
        else:
            audio_in = (session.get("audio") or {}).get("input") or {}
            fmt_obj = audio_in.get("format") or {}
            kind = fmt_obj.get("type", "audio/pcm")
            rate = fmt_obj.get("rate", PCM_RATE)
            if kind != "audio/pcm" or rate != PCM_RATE:
                await self.error(
                    f"input audio format {kind} at {rate} Hz is not supported; send audio/pcm (PCM16 mono) "
                    f"at {PCM_RATE} Hz",
                    "invalid_value",
                    param="session.audio.input.format.rate" if kind == "audio/pcm" else "session.audio.input.format",
                    event_id=event_id,
                )
                return
            transcription = audio_in.get("transcription") or {}
            vad = audio_in.get("turn_detection", "keep")
        if not beta and session.get("type") == "realtime":
            try:
                self.voice.configure(VoiceConfig.from_session(session, self.voice.config))
            except ValueError as exc:
                await self.error(
                    f"a realtime (voice) session needs 'model', the chat model that answers each turn: {exc}"[:600],
                    "invalid_value",
                    param="session.model",
                    event_id=event_id,
                )
                return
        if transcription.get("model"):
            self.model = str(transcription["model"])
        self.language = transcription.get("language", self.language)
        self.prompt = transcription.get("prompt", self.prompt)
        if vad != "keep":
            self.server_vad = vad is not None and vad.get("type", "server_vad") == "server_vad"
            if isinstance(vad, dict):
                self.silence_ms = int(vad.get("silence_duration_ms", self.silence_ms))
                self.threshold = float(vad.get("threshold", self.threshold))
                self.padding_ms = int(vad.get("prefix_padding_ms", self.padding_ms))
            self.detector = None
        name = "transcription_session.updated" if beta else "session.updated"
        await self.send({"type": name, "session": self.describe()})

    async def append(self, audio: Any, event_id: str | None) -> None:
        if not isinstance(audio, str):
            await self.error("'audio' must be base64 PCM16", "invalid_value", param="audio", event_id=event_id)
            return
        if len(audio) > MAX_APPEND_BYTES:
            await self.error("an append carries at most 15 MiB of audio", "invalid_value", param="audio")
            return
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            await self.error("'audio' is not valid base64", "invalid_value", param="audio", event_id=event_id)
            return
        if len(pcm) % 2:
            await self.error("PCM16 audio has an even number of bytes", "invalid_value", param="audio")
            return
        self.buffer += pcm
        self.received_ms += len(pcm) // BYTES_PER_MS
        if not self.server_vad:
            return
        if self.detector is None:
            from .vad import TurnDetector

            self.detector = await asyncio.to_thread(
                TurnDetector, PCM_RATE, threshold=self.threshold, silence_ms=self.silence_ms
            )
            self.detector_origin_ms = self.received_ms - len(pcm) // BYTES_PER_MS  # a session.update mid-stream
        for found in await asyncio.to_thread(self.detector.feed, pcm):
            boundary = type(found)(found.kind, found.at_ms + self.detector_origin_ms)
            if boundary.kind == "started":
                barge_in = self.voice.active
                self.speech_start_ms = boundary.at_ms
                self.item_id = _item_id()
                await self.send(
                    {
                        "type": "input_audio_buffer.speech_started",
                        "audio_start_ms": boundary.at_ms,
                        "item_id": self.item_id,
                    }
                )
                if barge_in:  # speaking over the answer stops the model and the synthesis
                    await self.voice.cancel("turn_detected")
            elif self.speech_start_ms is not None:
                await self.send(
                    {
                        "type": "input_audio_buffer.speech_stopped",
                        "audio_end_ms": boundary.at_ms,
                        "item_id": self.item_id,
                    }
                )
                await self.commit(self.speech_start_ms, min(self.received_ms, boundary.at_ms + 200))
        if (
            self.speech_start_ms is not None
            and self.received_ms - self.speech_start_ms > self.config.realtime_max_turn_s * 1000
        ):
            await self.commit(self.speech_start_ms, self.received_ms)  # a turn that never pauses

    async def commit(self, start_ms: int, end_ms: int) -> None:
        """Cut [start - padding, end) out of the buffer and queue it for transcription."""
        item_id = self.item_id or _item_id()
        first = max(self.buffer_start_ms, start_ms - self.padding_ms)
        lo = (first - self.buffer_start_ms) * BYTES_PER_MS
        hi = (end_ms - self.buffer_start_ms) * BYTES_PER_MS
        pcm = bytes(self.buffer[lo:hi])
        del self.buffer[:hi]
        self.buffer_start_ms = end_ms
        self.speech_start_ms = None
        self.item_id = None
        await self.send(
            {"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": self.previous_item}
        )
        item = {
            "id": item_id,
            "type": "message",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        await self.send({"type": "conversation.item.added", "previous_item_id": self.previous_item, "item": item})
        self.previous_item = item_id
        await self.turns.put((item_id, pcm, time.monotonic()))

    async def _transcribe_turns(self) -> None:
        while True:
            turn = await self.turns.get()
            if turn is None:
                return
            await self.transcribe(*turn)

    async def transcribe(self, item_id: str, pcm: bytes, committed_at: float) -> None:
        def failed(message: str, code: str | None) -> dict[str, Any]:
            return {
                "type": "conversation.item.input_audio_transcription.failed",
                "item_id": item_id,
                "content_index": 0,
                "error": {"type": "transcription_error", "code": code, "message": message, "param": None},
            }

        if self.model is None:
            await self.send(
                failed("no speech-to-text model is placed; place one with POST /place_instance", "model_not_placed")
            )
            return
        options = {"language": self.language, "prompt": self.prompt, "temperature": 0.0}
        try:
            handle = await calls.transcribe(
                self.node, SpeechParams(model_id=self.model, options=options), wav_bytes(pcm, PCM_RATE)
            )
        except InferenceError as exc:
            await self.send(failed(exc.message, exc.code))
            return
        text: list[str] = []
        try:
            async for chunk in handle.chunks():
                if isinstance(chunk, ErrorChunk):
                    await self.send(failed(chunk.message, chunk.code))
                    return
                if not isinstance(chunk, TranscriptChunk):
                    continue
                if chunk.finish_reason is not None:
                    await self.send(
                        {
                            "type": "conversation.item.input_audio_transcription.completed",
                            "item_id": item_id,
                            "content_index": 0,
                            "transcript": "".join(text).strip(),
                            "usage": {"type": "duration", "seconds": round(len(pcm) / (PCM_RATE * 2), 3)},
                            "lag_ms": round((time.monotonic() - committed_at) * 1000, 1),
                        }
                    )
                    await self.voice.respond("".join(text))  # a voice session answers the turn
                    return
                delta = chunk.text if text else chunk.text.lstrip()
                text.append(chunk.text)
                await self.send(
                    {
                        "type": "conversation.item.input_audio_transcription.delta",
                        "item_id": item_id,
                        "content_index": 0,
                        "delta": delta,
                    }
                )
        finally:
            await handle.close()


def add_realtime_route(app: Any, node: NodeSurface, config: SpeechConfig) -> None:
    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        """Realtime transcription sessions (OpenAI's realtime dialect, intent=transcription)."""
        await ws.accept()
        session = RealtimeSession(ws, node, config, ws.query_params.get("model"))
        try:
            await session.run()
        except Exception:
            log.exception("realtime session %s failed", session.session_id)
        finally:
            with contextlib.suppress(Exception):
                await ws.close()
