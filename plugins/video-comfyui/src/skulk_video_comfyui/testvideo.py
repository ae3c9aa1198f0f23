"""The deterministic test clip: seeded frames and a tone, encoded as a real MP4 with PyAV.

Nothing here is random at run time: the frames are drawn from a NumPy generator seeded with the
request's seed (a square that moves across a seeded gradient, plus seeded grain), the audio is a
sine tone whose pitch comes from the seed, and the encoders run single-threaded with fixed
settings, so the same request gives the same bytes on the same PyAV build. It exists so that
anyone can try the whole video path (API, placement, progress, the file on the data plane, the
job store) with no weights.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

DEFAULT_AUDIO_RATE = 24000


def frame_array(width: int, height: int, index: int, frames: int, seed: int) -> Any:
    """Frame `index` of the clip as an HxWx3 uint8 array."""
    import numpy as np

    rng = np.random.default_rng([seed, index])
    base = np.random.default_rng(seed).integers(0, 256, size=3)
    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    image = np.empty((height, width, 3), dtype=np.float32)
    image[..., 0] = base[0] * (1 - xs) + 255 * xs * 0.5
    image[..., 1] = base[1] * (1 - ys) + 255 * ys * 0.5
    image[..., 2] = base[2]
    side = max(4, min(width, height) // 4)
    x = int((width - side) * (index / max(1, frames - 1)))
    y = (height - side) // 2
    image[y : y + side, x : x + side] = 255 - base
    image += rng.normal(0, 6, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def tone(seconds: float, rate: int, seed: int) -> Any:
    """A stereo sine tone (float32, 2xN) whose pitch comes from the seed."""
    import numpy as np

    pitch = 220.0 + (seed % 24) * 20.0
    t = np.arange(round(seconds * rate), dtype=np.float64) / rate
    wave = (0.2 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)
    return np.stack([wave, wave])


def encode_mp4(
    width: int,
    height: int,
    frames: int,
    fps: int,
    seed: int,
    *,
    audio: bool = True,
    audio_rate: int = DEFAULT_AUDIO_RATE,
    first_frame: Any = None,
    on_frame: Callable[[int], None] | None = None,
) -> bytes:
    """The whole clip as MP4 bytes (H.264 yuv420p, AAC stereo when `audio`)."""
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4", options={"fflags": "+bitexact"}) as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.options = {"preset": "ultrafast", "crf": "28", "threads": "1"}
        video.codec_context.thread_count = 1
        sound = None
        if audio:
            sound = container.add_stream("aac", rate=audio_rate)
            sound.codec_context.layout = "stereo"
            sound.codec_context.thread_count = 1
        for index in range(frames):
            array = frame_array(width, height, index, frames, seed)
            if index == 0 and first_frame is not None:
                array = first_frame
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = index
            for packet in video.encode(frame):
                container.mux(packet)
            if on_frame is not None:
                on_frame(index)
        for packet in video.encode():
            container.mux(packet)
        if sound is not None:
            samples = tone(frames / fps, audio_rate, seed)
            block = 1024
            for start in range(0, samples.shape[1], block):
                piece = np.ascontiguousarray(samples[:, start : start + block])
                aframe = av.AudioFrame.from_ndarray(piece, format="fltp", layout="stereo")
                aframe.sample_rate = audio_rate
                aframe.pts = start
                for packet in sound.encode(aframe):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    return out.getvalue()


def fit_image(data: bytes, width: int, height: int) -> Any:
    """An input image decoded and scaled to the canvas (HxWx3 uint8), for the first frame."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        frame = next(container.decode(video=0))
        return frame.reformat(width=width, height=height, format="rgb24").to_ndarray()
