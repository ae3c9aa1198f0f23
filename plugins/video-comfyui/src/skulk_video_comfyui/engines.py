"""The video engines: `comfyui` (a managed ComfyUI server) and `test_video` (deterministic, no weights).

Both are registered on every node that loads the plugin (probing, backend tags) and loaded only in
a runner subprocess. A session serves VideoGeneration only (`skulk_kernel.api.VideoGenerationSession`):
it renders with `generate_video(command_id, params, cancelled)`, which the worker's runner relays
like any chunk stream:

    ProgressChunk(done, total, stage)*  then  MediaChunk* (the MP4 in 256 KiB pieces; the last one
    carries the file's SHA-256 and finish_reason "stop")   or an ErrorChunk, or a chunk with
    finish_reason "cancelled"

The request arrives resolved by the API against the card's `[video]` section (width, height,
frames, fps, steps in `params.options`); an input image comes on the data plane
(`skulk_api_media.inputs`). Cancellation is checked between steps (test) and on every event or
quarter second of silence (ComfyUI, which is then interrupted).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from skulk_kernel.api import (
    Chunk,
    CommandId,
    EngineProbe,
    ErrorChunk,
    GenerationStats,
    MediaChunk,
    MediaParams,
    ProgressChunk,
    RunnerSpec,
    TokenChunk,
    Usage,
)

from .cards import COMFY_BACKENDS, TEST_BACKEND
from .config import VideoConfig, from_options

log = logging.getLogger("skulk.video.engines")
PIECE_BYTES = 256 * 1024
MP4 = "video/mp4"
HEARTBEAT_S = 30.0  # a progress chunk at least this often while ComfyUI is quiet


class Cancelled(Exception):
    """Raised inside a render when the task's cancelled flag is set."""


class _Stream:
    """Numbers a session's chunks (seq 0, 1, 2, ... without gaps) for one command."""

    def __init__(self, command_id: str) -> None:
        self.command_id = CommandId(command_id)
        self.seq = 0

    def _next(self) -> int:
        seq, self.seq = self.seq, self.seq + 1
        return seq

    def progress(self, done: int, total: int, stage: str) -> ProgressChunk:
        return ProgressChunk(command_id=self.command_id, seq=self._next(), done=done, total=total, stage=stage)

    def error(self, message: str, code: str, *, caller: bool = False) -> ErrorChunk:
        kind = "invalid_request_error" if caller else "server_error"
        return ErrorChunk(command_id=self.command_id, seq=self._next(), message=message, code=code, error_type=kind)

    def cancelled(self) -> TokenChunk:
        return TokenChunk(command_id=self.command_id, seq=self._next(), text="", finish_reason="cancelled")

    def file(self, data: bytes, mime: str, started: float, backend: str) -> Iterator[MediaChunk]:
        digest = hashlib.sha256(data).hexdigest()
        count = max(1, -(-len(data) // PIECE_BYTES))
        for i in range(count):
            last = i == count - 1
            yield MediaChunk(
                command_id=self.command_id,
                seq=self._next(),
                data=base64.b64encode(data[i * PIECE_BYTES : (i + 1) * PIECE_BYTES]).decode("ascii"),
                mime=mime,
                sha256=digest if last else "",
                finish_reason="stop" if last else None,
                usage=Usage(prompt_tokens=0, completion_tokens=len(data)) if last else None,
                stats=GenerationStats(backend=backend, ttft_ms=(time.perf_counter() - started) * 1000)
                if last
                else None,
            )


def _canvas(params: MediaParams) -> tuple[int, int, int, int, int]:
    """(width, height, frames, fps, steps) as the API resolved them."""
    o = params.options
    return int(o["width"]), int(o["height"]), int(o["frames"]), int(o["fps"]), int(o.get("steps", 1))


def _seed(params: MediaParams) -> int:
    if params.seed is not None:
        return int(params.seed) & 0x7FFFFFFF
    return int(hashlib.sha256(params.prompt.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def _input_image(spec: RunnerSpec, command_id: str, params: MediaParams, config: VideoConfig, cancelled: Any) -> bytes:
    from skulk_api_media.inputs import wait_for_input

    return wait_for_input(spec.instance_id, command_id, params.input_sha256 or "", config.input_timeout_s, cancelled)


# ================================================================== the test video engine


class TestVideoSession:
    def __init__(self, spec: RunnerSpec, config: VideoConfig) -> None:
        self.spec = spec
        self.config = config

    def close(self) -> None:
        return None  # nothing held between renders

    def generate_video(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        from .testvideo import encode_mp4, fit_image

        out = _Stream(command_id)
        started = time.perf_counter()
        try:
            width, height, frames, fps, steps = _canvas(params)
        except (KeyError, TypeError, ValueError):
            yield out.error("the request was not resolved against the card (width/height/frames/fps)", "bad_request")
            return
        first = None
        if params.input_sha256:
            from skulk_api_media.inputs import InputError

            try:
                first = fit_image(_input_image(self.spec, command_id, params, self.config, cancelled), width, height)
            except InputError as exc:
                yield out.cancelled() if cancelled() else out.error(f"input image: {exc}", "input_failed")
                return
            except Exception as exc:
                yield out.error(f"the input image does not decode: {exc}", "invalid_image", caller=True)
                return
        total = 1 + steps + frames
        done = 1
        yield out.progress(done, total, "encoding prompt")
        for step in range(steps):
            if cancelled():
                yield out.cancelled()
                return
            if self.config.step_seconds:
                time.sleep(self.config.step_seconds)
            done += 1
            yield out.progress(done, total, f"sampling step {step + 1}/{steps}")
        decoded: list[int] = []

        def on_frame(index: int) -> None:
            if cancelled():
                raise Cancelled
            decoded.append(index)

        try:
            data = encode_mp4(
                width,
                height,
                frames,
                fps,
                _seed(params),
                audio=bool(params.options.get("audio", True)),
                audio_rate=int(params.options.get("audio_rate", 24000)),
                first_frame=first,
                on_frame=on_frame,
            )
        except Cancelled:
            yield out.cancelled()
            return
        yield out.progress(total, total, "muxing")
        yield from out.file(data, MP4, started, TEST_BACKEND)


class TestVideoEngine:
    name = "test_video"
    tasks = frozenset({"VideoGeneration"})
    dispatch_width = 1
    splits: frozenset[Any] = frozenset()

    def probe(self) -> EngineProbe:
        import importlib.util

        if importlib.util.find_spec("av") is None:
            return EngineProbe(available=False, reason="PyAV is not installed (pip install av)")
        from importlib.metadata import version

        return EngineProbe(available=True, version=f"pyav {version('av')}")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return [TEST_BACKEND] if self.probe().available else []

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> TestVideoSession:
        progress(1, 1)
        return TestVideoSession(spec, from_options(spec.options))


# ================================================================== ComfyUI


class ComfySession:
    """One managed ComfyUI server and the card's workflow; a render is one bound graph."""

    def __init__(self, spec: RunnerSpec, config: VideoConfig, server: Any, template: dict[str, Any]) -> None:
        self.spec = spec
        self.config = config
        self.server = server
        self.template = template

    def generate_video(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        from .comfy_client import ComfyClient, ComfyError, ComfyGone
        from .comfy_server import ServerError
        from .workflow import WorkflowError, bind

        out = _Stream(command_id)
        started = time.perf_counter()
        if not self.server.alive():  # it died under an earlier render: start it again
            try:
                log.warning("%s; starting it again", self.server.exit_reason())
                self.server.start(self.config.start_timeout_s)
            except ServerError as exc:
                yield out.error(str(exc), "engine_failed")
                return
        try:
            width, height, frames, fps, steps = _canvas(params)
        except (KeyError, TypeError, ValueError):
            yield out.error("the request was not resolved against the card (width/height/frames/fps)", "bad_request")
            return
        name = hashlib.sha256(command_id.encode()).hexdigest()[:16]
        seed = _seed(params)
        values: dict[str, Any] = {
            "prompt": params.prompt,
            "negative_prompt": str(params.options.get("negative_prompt", "")),
            "width": width,
            "height": height,
            "frames": frames,
            "fps": fps,
            "seconds": frames / fps,
            "steps": steps,
            "seed": seed,
            "color": seed & 0xFFFFFF,
            "prefix": f"skulk/{name}",
        }
        image_path: Path | None = None
        if params.input_sha256:
            from skulk_api_media.inputs import InputError

            try:
                data = _input_image(self.spec, command_id, params, self.config, cancelled)
            except InputError as exc:
                yield out.cancelled() if cancelled() else out.error(f"input image: {exc}", "input_failed")
                return
            image_path = self.server.input_dir / f"skulk-{name}.img"
            image_path.write_bytes(data)
            values["image"] = image_path.name
        try:
            graph = bind(self.template, values)
        except WorkflowError as exc:
            yield out.error(f"the card's workflow cannot be bound: {exc}", "bad_workflow")
            return
        client = ComfyClient(self.server.url)
        try:
            yield from self._render(client, graph, out, started, cancelled)
        except ComfyGone as exc:
            reason = self.server.exit_reason() if self.server.exited_within(2.0) else str(exc)
            yield out.error(reason, "engine_crashed")
        except ComfyError as exc:
            yield out.error(str(exc), "engine_failed")
        finally:
            client.close()
            if image_path is not None:
                image_path.unlink(missing_ok=True)

    def _render(
        self, client: Any, graph: dict[str, Any], out: _Stream, started: float, cancelled: Callable[[], bool]
    ) -> Iterator[Chunk]:
        from .comfy_client import ComfyGone

        client.connect()
        prompt_id = client.queue(graph)
        last = out.progress(0, 1, "queued")
        yield last
        quiet_since = time.monotonic()
        deadline = time.monotonic() + self.config.render_timeout_s
        interrupted_at: float | None = None
        for event in client.follow(prompt_id):
            if event is None and time.monotonic() - quiet_since > HEARTBEAT_S:
                # ComfyUI loads weights on the first prompt, silently, for minutes: say it still works
                # (the API node abandons a stream with no chunk for two minutes)
                last = out.progress(last.done, last.total, last.stage.removesuffix(" (working)") + " (working)")
                yield last
                quiet_since = time.monotonic()
            if not self.server.alive():
                raise ComfyGone("the server process is gone")
            if cancelled() and interrupted_at is None:
                client.interrupt(prompt_id)
                interrupted_at = time.monotonic()
            if interrupted_at is not None and time.monotonic() - interrupted_at > 10:
                yield out.cancelled()  # the server never confirmed; the render is abandoned
                return
            if time.monotonic() > deadline:
                client.interrupt(prompt_id)
                yield out.error(f"the render took over {self.config.render_timeout_s:.0f}s", "render_timeout")
                return
            if event is None:
                continue
            if event.kind == "progress":
                value, top = int(event.data.get("value", 0)), int(event.data.get("max", 0))
                last = out.progress(value, top, f"node {event.data.get('node', '?')}")
                yield last
                quiet_since = time.monotonic()
            elif event.kind == "execution_start":
                last = out.progress(0, 1, "started")
                yield last
                quiet_since = time.monotonic()
            elif event.kind == "execution_error":
                message = event.data.get("exception_message") or "execution failed"
                node = f"{event.data.get('node_type', '?')} (node {event.data.get('node_id', '?')})"
                yield out.error(f"ComfyUI failed in {node}: {str(message).strip()}", "engine_failed")
                return
            elif event.kind == "execution_interrupted":
                yield (
                    out.cancelled()
                    if interrupted_at is not None
                    else out.error("ComfyUI interrupted the render", "engine_failed")
                )
                return
            elif event.kind == "execution_success":
                if interrupted_at is not None:
                    yield out.cancelled()
                    return
                break
        outputs = client.outputs(prompt_id)
        videos = [o for o in outputs if o.filename.lower().endswith((".mp4", ".webm", ".mov"))]
        if not videos:
            names = ", ".join(o.filename for o in outputs) or "nothing"
            yield out.error(f"the workflow saved no video (it saved {names})", "no_output")
            return
        data = client.fetch(videos[0])
        yield from out.file(data, MP4, started, "comfyui")

    def close(self) -> None:
        self.server.stop()


class ComfyEngine:
    name = "comfyui"
    tasks = frozenset({"VideoGeneration"})
    dispatch_width = 1  # the server renders one prompt at a time
    splits: frozenset[Any] = frozenset()

    def __init__(self, config: VideoConfig | None = None) -> None:
        self.config = config or VideoConfig()

    def probe(self) -> EngineProbe:
        if self.config.server_command:
            return EngineProbe(available=True, version="custom server_command")
        root = self.config.root()
        if not root:
            return EngineProbe(
                available=False, reason="no ComfyUI checkout configured (comfyui_root or SKULK_COMFY_ROOT)"
            )
        if not (Path(root) / "main.py").is_file():
            return EngineProbe(available=False, reason=f"{root} is not a ComfyUI checkout (no main.py)")
        from .install import checkout_commit

        return EngineProbe(available=True, version=f"comfy@{checkout_commit(Path(root)) or 'unknown'}")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        if not self.probe().available:
            return []
        nvidia = any("nvidia" in str(g.get("vendor", "")).lower() for g in facts.get("gpus", []) if isinstance(g, dict))
        return [COMFY_BACKENDS[0]] if nvidia else [COMFY_BACKENDS[1]]

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> ComfySession:
        from .comfy_server import ComfyServer
        from .workflow import load_template

        config = from_options(spec.options)
        section = spec.card.sections.get("video") or {}
        template = load_template(section, spec.model_path)
        progress(0, 2)
        work = Path(tempfile.mkdtemp(prefix=f"skulk-comfy-{spec.runner_id[:8]}-"))
        root = config.root()
        server = ComfyServer(
            work_dir=work,
            python=config.python(),
            root=Path(root) if root else None,
            server_command=list(config.server_command),
            extra_args=list(config.extra_args),
        )
        server.start(config.start_timeout_s)
        progress(2, 2)
        return ComfySession(spec, config, server, template)


def engines(config: VideoConfig) -> list[Any]:
    found: list[Any] = [ComfyEngine(config)]
    if config.test_engine:
        found.append(TestVideoEngine())
    return found
