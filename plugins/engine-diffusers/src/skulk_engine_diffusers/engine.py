"""The diffusers engine: a UNet diffusion pipeline loaded in a runner subprocess, on CPU or a GPU.

The engine object lives on every node (probing, backend tags) and imports nothing heavy; `load()`
runs only in the runner, where it makes torch and diffusers importable (`environment.activate`)
and loads the card's folder with `DiffusionPipeline.from_pretrained` (local files only).

One image request is one call of the pipeline, run on a thread of the runner so the session can
yield while it denoises: a `ProgressChunk` per denoising step (from `callback_on_step_end`, which
also interrupts the pipeline once the task is cancelled), then each of the n images encoded
(PNG, JPEG or WebP) and sent as `MediaChunk` pieces, the last piece of the last image terminal.
An edit (`input_sha256` set) first waits for its input image (`skulk_api_media.inputs.wait_for_input`) and runs the
image-to-image pipeline made from the same components. The same seed makes the same images: the
generator is a CPU `torch.Generator` seeded per request.

Errors that are the caller's (an input that is not an image, a size the model cannot make) are
`ErrorChunk`s with `error_type="invalid_request_error"` and a code the API maps to a 4xx.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
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
    Usage,
)

from . import environment
from .cards import EDITABLE, CardError, image_section, parse_size
from .config import from_options
from .pieces import split

log = logging.getLogger("skulk.diffusers")
MIMES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MAX_STEPS = 150


def _error(command_id: str, message: str, code: str, *, caller: bool = True, seq: int = 0) -> ErrorChunk:
    return ErrorChunk(
        command_id=CommandId(command_id),
        seq=seq,
        message=message,
        code=code,
        error_type="invalid_request_error" if caller else "server_error",
    )


def _cuda_driver() -> bool:
    return Path("/proc/driver/nvidia/version").exists()


class DiffusersEngine:
    name = "diffusers"
    tasks = frozenset({"ImageGeneration"})
    dispatch_width = 1  # one pipeline call at a time: it uses every core (or the GPU) it is given
    splits: frozenset[Any] = frozenset()

    def probe(self) -> EngineProbe:
        if not environment.available():
            return EngineProbe(
                available=False,
                reason="torch and diffusers are not installed; run `skulk-kernel engines install diffusers` "
                "(a cached CPU overlay) or pip install skulk-engine-diffusers[torch]",
            )
        return EngineProbe(available=True, version=f"diffusers/torch@{environment.torch_version()}")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        if not environment.available():
            return []
        torch = environment.torch_version()
        gpu = _cuda_driver() and bool(torch) and "+cpu" not in torch
        return ["diffusers-cuda", "diffusers-cpu"] if gpu else ["diffusers-cpu"]

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> DiffusersSession:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a runner never reaches for the hub
        os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
        environment.activate()
        import torch
        from diffusers import DiffusionPipeline

        if spec.model_path is None:
            raise FileNotFoundError(f"no diffusers folder for {spec.card.model_id} on this node")
        progress(0, 1)
        device = "cuda" if spec.shard.backend.endswith("-cuda") and torch.cuda.is_available() else "cpu"
        threads = from_options(spec.options).threads
        if threads > 0:
            torch.set_num_threads(threads)
        dtype = torch.float16 if device == "cuda" else torch.float32
        pipe = DiffusionPipeline.from_pretrained(str(spec.model_path), dtype=dtype, local_files_only=True)
        pipe = pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        progress(1, 1)
        return DiffusersSession(pipe, spec, device)


class DiffusersSession:
    """A loaded pipeline: serves ImageGeneration (`skulk_kernel.api.ImageGenerationSession`) and nothing else."""

    def __init__(self, pipe: Any, spec: RunnerSpec, device: str) -> None:
        self.pipe = pipe
        self.spec = spec
        self.device = device
        self.image = image_section(spec.card)
        config = from_options(spec.options)
        self.max_pixels = config.max_pixels
        self.upload_timeout_s = config.upload_timeout_s
        self._edit_pipe: Any = None

    def close(self) -> None:
        self.pipe = None
        self._edit_pipe = None

    # ------------------------------------------------------------------ images

    def _edit_pipeline(self) -> Any:
        if self._edit_pipe is None:
            import diffusers

            cls = getattr(diffusers, EDITABLE[self.image.get("pipeline", "")])
            self._edit_pipe = cls(**self.pipe.components)
            self._edit_pipe.set_progress_bar_config(disable=True)
        return self._edit_pipe

    def _input_image(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Any:
        """The edit's input as an RGB PIL image; InputError / ValueError say what went wrong."""
        from PIL import Image, UnidentifiedImageError
        from skulk_api_media.inputs import wait_for_input

        data = wait_for_input(
            self.spec.instance_id, command_id, params.input_sha256 or "", self.upload_timeout_s, cancelled
        )
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ValueError(f"the input image could not be decoded ({exc}); send a PNG, JPEG or WebP file") from None
        return image.convert("RGB")

    def generate_image(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        from skulk_api_media.inputs import InputError

        options = params.options
        try:
            width, height = parse_size(self.spec.card, params.size, self.max_pixels)
        except CardError as exc:
            yield _error(command_id, str(exc), "invalid_size")
            return
        fmt = str(options.get("output_format") or "png")
        if fmt not in MIMES:
            yield _error(command_id, f"output_format {fmt!r} is not one of {', '.join(MIMES)}", "invalid_request")
            return
        steps = int(options.get("steps") or self.image.get("default_steps", 25))
        if not 1 <= steps <= MAX_STEPS:
            yield _error(command_id, f"steps must be from 1 to {MAX_STEPS}", "invalid_request")
            return
        seed = params.seed if params.seed is not None else random.randrange(2**31)
        call: dict[str, Any] = {
            "prompt": params.prompt,
            "num_images_per_prompt": params.n,
            "num_inference_steps": steps,
            "guidance_scale": float(options.get("guidance_scale", 7.5)),
            "output_type": "pil",
        }
        if options.get("negative_prompt"):
            call["negative_prompt"] = str(options["negative_prompt"])
        pipe = self.pipe
        total = steps
        if params.input_sha256:
            if not self.image.get("supports_edits"):
                yield _error(command_id, f"{self.spec.card.model_id} cannot edit images", "unsupported_task")
                return
            try:
                image = self._input_image(command_id, params, cancelled)
            except InputError as exc:
                if cancelled():
                    yield ProgressChunk(
                        command_id=CommandId(command_id), seq=0, done=0, total=0, finish_reason="cancelled"
                    )
                else:
                    yield _error(command_id, f"input image: {exc}", "upload_failed", caller=False)
                return
            except ValueError as exc:
                yield _error(command_id, str(exc), "invalid_image")
                return
            strength = float(options.get("strength", 0.75))
            call["image"] = image.resize((width, height))
            call["strength"] = strength
            pipe = self._edit_pipeline()
            total = max(1, min(steps, int(steps * strength)))
        else:
            call["width"], call["height"] = width, height
        yield from self._run(command_id, pipe, call, seed, total, fmt, params, cancelled)

    def _run(
        self,
        command_id: str,
        pipe: Any,
        call: dict[str, Any],
        seed: int,
        total: int,
        fmt: str,
        params: MediaParams,
        cancelled: Callable[[], bool],
    ) -> Iterator[Chunk]:
        """Call the pipeline on a thread; yield its steps as they happen, then the images."""
        import torch

        steps: queue.Queue[int] = queue.Queue()
        outcome: dict[str, Any] = {}

        def on_step(p: Any, step: int, _timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            steps.put(step + 1)
            if cancelled():
                p._interrupt = True  # diffusers' own interrupt: the loop skips the remaining steps
            return kwargs

        def work() -> None:
            try:
                generator = torch.Generator("cpu").manual_seed(seed)
                outcome["images"] = pipe(**call, generator=generator, callback_on_step_end=on_step).images
            except BaseException as exc:  # reported as the task's error, never lost with the thread
                outcome["error"] = exc

        started = time.perf_counter()
        thread = threading.Thread(target=work, name=f"diffusers-{command_id[:8]}", daemon=True)
        thread.start()
        seq = 0
        first_ms = 0.0
        while thread.is_alive() or not steps.empty():
            try:
                done = steps.get(timeout=0.05)
            except queue.Empty:
                continue
            first_ms = first_ms or (time.perf_counter() - started) * 1000
            yield ProgressChunk(
                command_id=CommandId(command_id), seq=seq, done=min(done, total), total=total, stage="denoising"
            )
            seq += 1
        thread.join()
        if cancelled():
            yield ProgressChunk(
                command_id=CommandId(command_id), seq=seq, done=0, total=total, finish_reason="cancelled"
            )
            return
        if "error" in outcome:
            exc = outcome["error"]
            log.error("pipeline call failed: %s: %s", type(exc).__name__, exc)
            yield _error(
                command_id, f"the pipeline failed: {type(exc).__name__}: {exc}", "engine_error", caller=False, seq=seq
            )
            return
        images = outcome["images"]
        elapsed = time.perf_counter() - started
        last: MediaChunk | None = None
        for index, image in enumerate(images):
            buffer = io.BytesIO()
            image.save(buffer, format=PIL_FORMATS[fmt])
            for piece in split(command_id, buffer.getvalue(), MIMES[fmt], index, seq):
                if last is not None:
                    yield last
                last = piece
                seq += 1
        assert last is not None
        yield last.model_copy(
            update={
                "finish_reason": "stop",
                "usage": Usage(prompt_tokens=len(params.prompt.split()), completion_tokens=len(images)),
                "stats": GenerationStats(
                    prompt_tokens=len(params.prompt.split()),
                    generation_tokens=total * len(images),
                    generation_tps=total / elapsed if elapsed else 0.0,  # denoising steps per second
                    ttft_ms=first_ms,
                    backend=f"diffusers-{self.device}",
                ),
            }
        )


def diffusers_version() -> str:
    try:
        return metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        return ""
