"""The voice loop of a realtime session: each final transcript -> a chat model -> speech, as events.

Opt-in per session (`session.update` with `"type": "realtime"` and a chat `model`): every completed
transcription becomes a user turn; the chat model answers (bounded by `max_output_tokens`, reasoning
off unless asked), its text is cut into sentences as it streams, and each sentence is spoken by
`tts@1.0.0` (the providers plugin's capability, on this node or another that offers it) or, without
the providers plugin, by the speech plugin's synthesis directly. The client gets OpenAI's GA
response events: `response.created`, `response.output_audio_transcript.delta`,
`response.output_audio.delta` (PCM16 mono at 24 kHz), the `.done` events and `response.done`.

Speaking over the answer (server VAD says speech started), a `response.cancel` event, or closing the
socket cancels the response: the chat task and the synthesis are cancelled at once and the client
gets `response.done` with `status: "cancelled"`. Nothing waits for the cancellations to land first.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import NodeSurface, new_id

from .audio import PCM_RATE

log = logging.getLogger("skulk.speech.voice")
SENTENCE_END = re.compile(r"[.!?;:\n]")
MIN_SEGMENT_CHARS = 12
MAX_SEGMENT_CHARS = 90
HISTORY_TURNS = 8  # the turns a response sees (a voice chat's context stays small and fast)
Send = Callable[[dict[str, Any]], Awaitable[None]]


class VoiceConfig(BaseModel):
    """The response part of a realtime session (read from `session.update`)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, description="the chat model that answers each turn")
    instructions: str | None = None
    max_output_tokens: int = Field(default=200, ge=1, le=4096)
    voice: str | None = None
    tts_model: str | None = None
    enable_thinking: bool = False
    tts_via: Literal["provider", "direct"] = "provider"  # direct: the same synthesis without the provider layer

    @classmethod
    def from_session(cls, session: dict[str, Any], old: VoiceConfig | None) -> VoiceConfig:
        output = (session.get("audio") or {}).get("output") or {}
        skulk = session.get("skulk") or {}
        limit = session.get("max_output_tokens", old.max_output_tokens if old else 200)
        base = old.model_dump() if old else {}
        fields = {
            **base,
            "model": session.get("model") or base.get("model"),
            "instructions": session.get("instructions", base.get("instructions")),
            "max_output_tokens": min(4096, limit) if isinstance(limit, int) else 4096,  # "inf": the ceiling
            "voice": output.get("voice", base.get("voice")),
            "tts_model": output.get("model", base.get("tts_model")),
            "enable_thinking": bool(skulk.get("enable_thinking", base.get("enable_thinking", False))),
            "tts_via": skulk.get("tts_via", base.get("tts_via", "provider")),
        }
        return cls.model_validate(fields)


def cut_sentences(pending: str, final: bool) -> tuple[list[str], str]:
    """Complete sentences (at least MIN_SEGMENT_CHARS long) out of `pending`, and what is left.

    A run-on text is cut at a comma or a space once it passes MAX_SEGMENT_CHARS, so the first audio
    never waits for a sentence that does not end.
    """
    out: list[str] = []
    start = 0
    for match in SENTENCE_END.finditer(pending):
        end = match.end()
        if len(pending[start:end].strip()) >= MIN_SEGMENT_CHARS and (end == len(pending) or pending[end].isspace()):
            out.append(pending[start:end].strip())
            start = end
    rest = pending[start:]
    while len(rest) > MAX_SEGMENT_CHARS:
        cut = max(rest.rfind(", ", 0, MAX_SEGMENT_CHARS), rest.rfind(" ", 0, MAX_SEGMENT_CHARS))
        if cut < MIN_SEGMENT_CHARS:
            break
        out.append(rest[: cut + 1].strip())
        rest = rest[cut + 1 :]
    if final and rest.strip():
        out.append(rest.strip())
        rest = ""
    return out, rest


class Speaker:
    """Speaks one text: through tts@1.0.0 on the provider data plane, or the speech synthesis directly."""

    def __init__(self, node: NodeSurface, config: VoiceConfig) -> None:
        self.node = node
        self.config = config

    async def speak(self, text: str) -> AsyncIterator[tuple[bytes, int]]:
        """(PCM16 bytes, sample rate) pieces as they are synthesised."""
        service = self._providers() if self.config.tts_via == "provider" else None
        if service is not None:
            async for piece in self._via_provider(service, text):
                yield piece
            return
        async for piece in self._direct(text):
            yield piece

    def _providers(self) -> Any:
        try:
            from skulk_providers.config import PROVIDERS
        except ImportError:
            return None
        return self.node.services.get(PROVIDERS)

    async def _via_provider(self, service: Any, text: str) -> AsyncIterator[tuple[bytes, int]]:
        from skulk_providers.api import IoMode
        from skulk_providers.frames import End, Output

        ref = "tts@1.0.0"
        offering = service.advertised()
        target = self.node.node_id if ref in offering.get(self.node.node_id, ()) else None
        target = target or next((n for n, caps in sorted(offering.items()) if ref in caps), None)
        if target is None:
            raise RuntimeError("no node offers tts@1.0.0 (load the speech and providers plugins)")
        descriptor = next(d for d in await service.describe(target) if d.ref == ref)
        request: dict[str, Any] = {"text": text}
        if self.config.voice:
            request["voice"] = self.config.voice
        if self.config.tts_model:
            request["model"] = self.config.tts_model
        handle = await service.caller.open(
            target, ref, descriptor.revision, IoMode.SERVER_STREAMING, 120.0, data=request, has_input=True
        )
        try:
            async for frame in handle.frames():
                if isinstance(frame, Output):
                    yield base64.b64decode(frame.data["audio"]), int(frame.data["sample_rate"])
                elif isinstance(frame, End) and not frame.ok:
                    raise RuntimeError(f"tts@1.0.0 failed: {frame.code}: {frame.message}")
        finally:
            await handle.cancel("the voice response was cancelled")  # nothing once it ended

    async def _direct(self, text: str) -> AsyncIterator[tuple[bytes, int]]:
        from skulk_kernel.api import AudioChunk, ErrorChunk, SpeechParams, catalog

        from . import calls
        from .cards import audio_section

        model = self.config.tts_model or next(
            (
                c.model_id
                for c in catalog(self.node).values()
                if "SpeechSynthesis" in c.tasks
                and any(i.shard_assignments.model_id == c.model_id for i in self.node.state.instances.values())
            ),
            None,
        )
        if model is None:
            raise RuntimeError("no text-to-speech model is placed")
        voice = self.config.voice
        card = catalog(self.node).get(model)
        if voice is None and card is not None:
            voices = list(audio_section(card).get("voices", []))
            voice = audio_section(card).get("default_voice") or (voices[0] if voices else None)
        handle = await calls.synthesize(self.node, SpeechParams(model_id=model, input=text, voice=voice))
        try:
            async for chunk in handle.chunks():
                if isinstance(chunk, ErrorChunk):
                    raise RuntimeError(f"synthesis failed: {chunk.message}")
                if isinstance(chunk, AudioChunk) and chunk.data:
                    yield base64.b64decode(chunk.data), chunk.sample_rate or PCM_RATE
        finally:
            await handle.close()


class VoiceLoop:
    """One realtime session's responses: at most one in progress; a new turn or a barge-in cancels it."""

    def __init__(self, node: NodeSurface, send: Send) -> None:
        self.node = node
        self.send = send
        self.config: VoiceConfig | None = None
        self.history: list[tuple[str, str]] = []  # (role, text) turns
        self.current: asyncio.Task[None] | None = None
        self.response_id: str | None = None
        self.cancel_reason: str | None = None

    @property
    def active(self) -> bool:
        return self.current is not None and not self.current.done()

    def configure(self, config: VoiceConfig) -> None:
        self.config = config

    async def respond(self, transcript: str) -> None:
        if self.config is None or not transcript.strip():
            return
        await self.cancel("turn_detected")
        self.history.append(("user", transcript.strip()))
        self.response_id = f"resp_{new_id()[:20]}"
        self.cancel_reason = None
        self.current = asyncio.ensure_future(self._respond(self.response_id, self.config))

    async def cancel(self, reason: str) -> bool:
        """Stop the response in progress (chat and synthesis); `response.done` says cancelled at once."""
        task = self.current
        if task is None or task.done():
            return False
        self.cancel_reason = reason
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(task), 2.0)
        return True

    async def close(self) -> None:
        await self.cancel("client_cancelled")

    def _messages(self, config: VoiceConfig) -> Any:
        from skulk_kernel.api import ChatMessage

        system = config.instructions or "You are a helpful voice assistant. Answer briefly, in plain sentences."
        return (ChatMessage(role="system", content=system),
                *(ChatMessage(role=role, content=text) for role, text in self.history[-HISTORY_TURNS:]))  # fmt: skip

    async def _respond(self, response_id: str, config: VoiceConfig) -> None:
        from skulk_api_control.dispatch import InferenceError, generate
        from skulk_kernel.api import ErrorChunk, SamplingParams, TextGenerationParams, TokenChunk

        item_id = f"item_{new_id()[:20]}"
        ids = {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
        spoken: list[str] = []
        status, error = "completed", None
        started = time.monotonic()
        first_audio_ms: float | None = None
        segments: asyncio.Queue[str | None] = asyncio.Queue()
        await self.send({"type": "response.created",
                         "response": {"id": response_id, "object": "realtime.response", "status": "in_progress",
                                      "output": []}})  # fmt: skip
        item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        await self.send({"type": "response.output_item.added", "response_id": response_id, "output_index": 0,
                         "item": item})  # fmt: skip
        await self.send({"type": "response.content_part.added", **ids, "part": {"type": "audio", "transcript": ""}})

        async def speak_all() -> None:
            nonlocal first_audio_ms
            from .audio import StreamEncoder

            speaker = Speaker(self.node, config)
            while (segment := await segments.get()) is not None:
                encoder: StreamEncoder | None = None
                async for pcm, rate in speaker.speak(segment):
                    encoder = encoder or StreamEncoder("pcm", rate)
                    out = encoder.write(pcm)
                    if out:
                        first_audio_ms = first_audio_ms or (time.monotonic() - started) * 1000
                        await self.send({"type": "response.output_audio.delta", **ids,
                                         "delta": base64.b64encode(out).decode("ascii")})  # fmt: skip
                if encoder is not None and (tail := encoder.close()):
                    await self.send({"type": "response.output_audio.delta", **ids,
                                     "delta": base64.b64encode(tail).decode("ascii")})  # fmt: skip

        speaker_task = asyncio.ensure_future(speak_all())
        handle: Any = None
        try:
            params = TextGenerationParams(
                model_id=config.model, messages=self._messages(config), enable_thinking=config.enable_thinking,
                sampling=SamplingParams(max_tokens=config.max_output_tokens, temperature=0.0),
            )  # fmt: skip
            handle = await generate(self.node, params)
            pending = ""
            async for chunk in handle.chunks():
                if isinstance(chunk, TokenChunk) and chunk.text and not chunk.reasoning:
                    spoken.append(chunk.text)
                    await self.send({"type": "response.output_audio_transcript.delta", **ids, "delta": chunk.text})
                    ready, pending = cut_sentences(pending + chunk.text, final=False)
                    for segment in ready:
                        segments.put_nowait(segment)
                elif isinstance(chunk, ErrorChunk):
                    raise RuntimeError(f"the chat model failed: {chunk.message}")
            ready, _ = cut_sentences(pending, final=True)
            for segment in ready:
                segments.put_nowait(segment)
            segments.put_nowait(None)
            await speaker_task
        except asyncio.CancelledError:
            status = "cancelled"
        except (InferenceError, RuntimeError) as exc:
            status, error = "failed", {"type": "server_error", "message": getattr(exc, "message", str(exc))}
            log.warning("voice response %s failed: %s", response_id, error["message"])
        finally:
            speaker_task.cancel()
            if handle is not None:
                self.node.spawn(handle.close(), "voice-chat-close")  # the cancellation goes out; nobody waits
            text = "".join(spoken).strip()
            if text:
                self.history.append(("assistant", text))
            done_item = {**item, "status": "completed" if status == "completed" else "incomplete",
                         "content": [{"type": "output_audio", "transcript": text}]}  # fmt: skip
            if status == "completed":
                await self.send({"type": "response.output_audio.done", **ids})
                await self.send({"type": "response.output_audio_transcript.done", **ids, "transcript": text})
                await self.send({"type": "response.content_part.done", **ids,
                                 "part": {"type": "audio", "transcript": text}})  # fmt: skip
                await self.send({"type": "response.output_item.done", "response_id": response_id, "output_index": 0,
                                 "item": done_item})  # fmt: skip
            details: dict[str, Any] | None = None
            if status == "cancelled":
                details = {"type": "cancelled", "reason": self.cancel_reason or "client_cancelled"}
            elif error is not None:
                details = {"type": "failed", "error": error}
            await self.send({"type": "response.done", "response": {
                "id": response_id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [done_item], "metadata": {"skulk_first_audio_ms": first_audio_ms,
                                                    "skulk_tts_via": config.tts_via}}})  # fmt: skip
