"""Audio through PyAV (FFmpeg's libraries): probing uploads, decoding them to 16 kHz mono for Whisper,
and encoding synthesised PCM into the formats the OpenAI speech API offers.

Nothing here is a hand-written codec: every container and codec is FFmpeg's. `StreamEncoder` encodes
as PCM arrives and hands back whatever bytes the muxer has written so far, so MP3 (and raw PCM) can
be streamed to a client while synthesis is still running; formats whose container needs the whole
file (WAV's sizes, FLAC's header) are encoded into a seekable buffer and returned once at the end.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

WHISPER_RATE = 16_000
PCM_RATE = 24_000  # OpenAI's `pcm`: raw s16le mono at 24 kHz, whatever the voice's own rate

# response_format -> (container, codec, sample rate the codec needs or None, media type)
FORMATS: dict[str, tuple[str, str, int | None, str]] = {
    "mp3": ("mp3", "libmp3lame", None, "audio/mpeg"),
    "opus": ("ogg", "libopus", 48_000, "audio/ogg"),
    "aac": ("adts", "aac", None, "audio/aac"),
    "flac": ("flac", "flac", None, "audio/flac"),
    "wav": ("wav", "pcm_s16le", None, "audio/wav"),
    "pcm": ("", "", None, "audio/pcm"),
}
STREAMABLE = frozenset({"pcm", "mp3"})


class AudioError(ValueError):
    """Bytes that are not audio FFmpeg can read; the message says what was wrong."""


@dataclass(frozen=True)
class Probe:
    duration_s: float
    sample_rate: int
    codec: str


def probe(data: bytes) -> Probe:
    """Open `data` as a media file and decode its first audio frame, or raise AudioError."""
    import av

    if not data:
        raise AudioError("the uploaded file is empty")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            streams = container.streams.audio
            if not streams:
                raise AudioError("the uploaded file has no audio stream")
            stream = streams[0]
            frame = next(container.decode(stream), None)
            if frame is None:
                raise AudioError("the uploaded file's audio stream holds no samples")
            duration = float(container.duration / av.time_base) if container.duration else 0.0
            return Probe(duration_s=duration, sample_rate=int(stream.rate or 0), codec=stream.codec_context.name)
    except AudioError:
        raise
    except (av.error.FFmpegError, StopIteration, ValueError, OSError) as exc:
        raise AudioError(f"the uploaded file is not audio FFmpeg can decode ({type(exc).__name__}: {exc})") from None


def decode_16k_mono(data: bytes) -> Any:
    """The whole file as float32 samples at 16 kHz mono (what Whisper takes); raises AudioError."""
    import av
    import numpy as np

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout="mono", rate=WHISPER_RATE)
            parts = []
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except (av.error.FFmpegError, IndexError, ValueError, OSError) as exc:
        raise AudioError(f"the audio could not be decoded ({type(exc).__name__}: {exc})") from None
    if not parts:
        raise AudioError("the audio holds no samples")
    return np.concatenate(parts).astype(np.float32) / 32768.0


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """Mono 16-bit PCM in a WAV container (the realtime socket's utterances travel as WAV)."""
    return encode_all(pcm, sample_rate, "wav")


def encode_all(pcm: bytes, sample_rate: int, fmt: str) -> bytes:
    """Mono s16le PCM encoded as `fmt` in one go."""
    encoder = StreamEncoder(fmt, sample_rate, seekable=True)
    return encoder.write(pcm) + encoder.close()


class _Sink(io.RawIOBase):
    """A write-only file for the muxer that hands out what was written since the last drain."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def drain(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class StreamEncoder:
    """Encode mono s16le PCM chunks into `fmt`, returning encoded bytes as they become available."""

    def __init__(self, fmt: str, sample_rate: int, *, seekable: bool = False) -> None:
        if fmt not in FORMATS:
            raise AudioError(f"unknown audio format {fmt!r}; use one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        import av

        self._pts = 0
        if fmt == "pcm":
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)
            return

        container_name, codec, rate, _ = FORMATS[fmt]
        self._seekable = seekable or fmt not in STREAMABLE
        self._buffer: io.BytesIO | _Sink = io.BytesIO() if self._seekable else _Sink()
        self._container: Any = av.open(self._buffer, mode="w", format=container_name)
        self._rate = rate or sample_rate
        stream: Any = self._container.add_stream(codec, rate=self._rate, layout="mono")
        self._stream = stream
        self._resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=self._rate)

    def _mux(self, frames: Any) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)

    def _drain(self) -> bytes:
        return b"" if self._seekable else self._buffer.drain()  # type: ignore[union-attr]

    def _frames(self, pcm: bytes | None) -> Any:
        import av
        import numpy as np

        if pcm is None:
            return self._resampler.resample(None)
        samples = np.frombuffer(pcm, dtype=np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += samples.shape[1]
        return self._resampler.resample(frame)

    def write(self, pcm: bytes) -> bytes:
        if not pcm:
            return b""
        if self.fmt == "pcm":
            return b"".join(f.to_ndarray().tobytes() for f in self._frames(pcm))
        self._mux(self._frames(pcm))
        return self._drain()

    def close(self) -> bytes:
        """Flush the codec and the muxer; the last bytes (all of them for a seekable format)."""
        if self.fmt == "pcm":
            return b"".join(f.to_ndarray().tobytes() for f in self._frames(None))
        self._mux(self._frames(None))
        self._mux([None])
        self._container.close()
        if self._seekable:
            return self._buffer.getvalue()  # type: ignore[union-attr]
        return self._drain()
