"""Server voice activity detection for the realtime socket: Silero VAD (v6, ONNX) through onnxruntime.

The model file ships inside faster-whisper (`faster_whisper/assets/silero_vad_v6.onnx`), so it is
on every node that has this plugin, offline. faster-whisper itself runs the model over a whole file;
here it runs incrementally: 24 kHz PCM16 from the socket is resampled to 16 kHz by PyAV, cut into the
model's 512-sample windows (with the 64-sample context of the previous window), and the recurrent
state is carried from window to window, so each 32 ms of audio costs one small inference as it
arrives. `TurnDetector` turns the per-window speech probabilities into speech-started /
speech-stopped boundaries with a threshold, a silence hangover and a prefix padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

WINDOW = 512  # samples at 16 kHz: 32 ms
CONTEXT = 64


def silero_path() -> Path:
    import faster_whisper

    return Path(faster_whisper.__file__).parent / "assets" / "silero_vad_v6.onnx"


class SileroStream:
    """Speech probabilities of a stream of 16 kHz float32 samples, one per 32 ms window."""

    def __init__(self) -> None:
        import os

        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        import numpy as np
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 4
        self._np = np
        self._session = onnxruntime.InferenceSession(
            str(silero_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def feed(self, samples: Any) -> list[float]:
        np = self._np
        self._pending = np.concatenate([self._pending, samples.astype(np.float32)])
        probs = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            batch = np.concatenate([self._context, window]).reshape(1, -1)
            out, self._h, self._c = self._session.run(None, {"input": batch, "h": self._h, "c": self._c})
            self._context = window[-CONTEXT:]
            probs.append(float(np.asarray(out).reshape(-1)[0]))
        return probs


class Resampler16k:
    """Mono PCM16 at `rate` in, float32 at 16 kHz out, through PyAV's (FFmpeg's) resampler."""

    def __init__(self, rate: int) -> None:
        import av
        import numpy as np

        self._av = av
        self._np = np
        self.rate = rate
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=16_000)
        self._pts = 0

    def feed(self, pcm: bytes) -> Any:
        np = self._np
        samples = np.frombuffer(pcm, dtype=np.int16).reshape(1, -1)
        if samples.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += samples.shape[1]
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        if not out:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(out).astype(np.float32) / 32768.0


@dataclass
class Boundary:
    kind: str  # "started" | "stopped"
    at_ms: int  # position in the input stream


class TurnDetector:
    """Speech-started / speech-stopped from Silero probabilities (hysteresis plus silence hangover)."""

    def __init__(self, rate: int, threshold: float = 0.5, silence_ms: int = 500, min_speech_ms: int = 96) -> None:
        self.resampler = Resampler16k(rate)
        self.vad = SileroStream()
        self.threshold = threshold
        self.off_threshold = max(0.05, threshold - 0.15)
        self.silence_ms = silence_ms
        self.min_speech_ms = min_speech_ms
        self.speaking = False
        self._windows = 0
        self._run_start = -1  # first window of a candidate speech run
        self._silent_since = -1

    def _ms(self, windows: int) -> int:
        return windows * WINDOW * 1000 // 16_000

    def feed(self, pcm: bytes) -> list[Boundary]:
        out: list[Boundary] = []
        for prob in self.vad.feed(self.resampler.feed(pcm)):
            i = self._windows
            self._windows += 1
            if not self.speaking:
                if prob >= self.threshold:
                    self._run_start = i if self._run_start < 0 else self._run_start
                    if self._ms(i + 1 - self._run_start) >= self.min_speech_ms:
                        self.speaking = True
                        self._silent_since = -1
                        out.append(Boundary("started", self._ms(self._run_start)))
                else:
                    self._run_start = -1
            elif prob < self.off_threshold:
                self._silent_since = i if self._silent_since < 0 else self._silent_since
                if self._ms(i + 1 - self._silent_since) >= self.silence_ms:
                    self.speaking = False
                    self._run_start = -1
                    out.append(Boundary("stopped", self._ms(self._silent_since)))
            else:
                self._silent_since = -1
        return out

    def reset(self) -> None:
        self.speaking = False
        self._run_start = -1
        self._silent_since = -1
