"""Transcript chunks -> the OpenAI transcription answers (json, text, srt, vtt, verbose_json).

`collect` gathers the segments a runner streamed; the renderers only format. Timestamps are the
model's own (faster-whisper's segment and word times); nothing is invented: fields the engine does
not measure (avg_logprob, compression_ratio, no_speech_prob) are left out of verbose_json.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from skulk_kernel.api import Chunk, ErrorChunk, TranscriptChunk

LANGUAGE_NAMES = {"en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian"}
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


@dataclass
class Transcript:
    segments: list[TranscriptChunk] = field(default_factory=list)
    language: str = ""
    duration: float = 0.0
    error: ErrorChunk | None = None

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()


async def collect(chunks: AsyncIterator[Chunk]) -> Transcript:
    got = Transcript()
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            got.error = chunk
            break
        if not isinstance(chunk, TranscriptChunk):
            continue
        if chunk.finish_reason is not None:
            got.language = chunk.language
            got.duration = chunk.end
            break
        got.segments.append(chunk)
    return got


def _clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(t: Transcript) -> str:
    blocks = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(t.segments, start=1)
    ]
    return "\n".join(blocks)


def vtt(t: Transcript) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in t.segments]
    return "WEBVTT\n\n" + "\n".join(cues)


def usage(t: Transcript) -> dict[str, Any]:
    return {"type": "duration", "seconds": round(t.duration, 3)}


def verbose_json(t: Transcript, *, task: str, temperature: float, words: bool, segments: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": LANGUAGE_NAMES.get(t.language, t.language),
        "duration": round(t.duration, 3),
        "text": t.text,
    }
    if segments:
        body["segments"] = [
            {
                "id": i,
                "seek": int(s.start * 100),
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": [],
                "temperature": temperature,
            }
            for i, s in enumerate(t.segments)
        ]
    if words:
        body["words"] = [{"word": w.strip(), "start": a, "end": b} for s in t.segments for (w, a, b) in s.words]
    body["usage"] = usage(t)
    return body
