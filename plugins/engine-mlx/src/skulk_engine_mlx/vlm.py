"""Vision-language models on MLX through mlx-vlm's own model classes (single node).

A card with the `vision` capability (the store sets it for a folder whose config.json has a
`vision_config`) loads with `mlx_vlm.load`: mlx-vlm's model class for the family and its processor
(image preprocessing, the chat template's image placeholders). The session then serves text
generation with or without images:

* the images of a request are the bytes the runner received on the data plane
  (`skulk_api_control.vision_wire.receive_images`, digests checked), opened with Pillow;
* a text-only request to a vision instance is an ordinary generation (no image inputs);
* a request whose images fail (they did not arrive whole, or the processor cannot preprocess them)
  fails with an ErrorChunk: it is never answered from its text alone.

Every MLX call runs on the session's one compute thread (MLX keeps per-thread streams), stepping
mlx-vlm's generator one token per call. Pipeline or tensor splits are the text engine's
(`session.py`); a vision card placed on several ranks is refused at load.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from skulk_kernel.api import Chunk, ErrorChunk, GenerationStats, RunnerSpec, TextGenerationParams, TokenChunk, Usage

from .compute import ComputeThread

DEFAULT_MAX_TOKENS = 256


def load_vlm(spec: RunnerSpec, folder: Path, compute: ComputeThread) -> VlmSession:
    """The card's model and processor from mlx-vlm, on `compute`."""
    if spec.shard.world_size > 1:
        raise ValueError(f"{spec.card.model_id} is a vision model: mlx-vlm loads it on one node, not split")

    def load() -> tuple[Any, Any]:
        import mlx.core as mx
        from mlx_vlm import load as vlm_load

        model, processor = vlm_load(str(folder))
        mx.eval(model.parameters())
        return model, processor

    model, processor = compute.call(load, None, "loading the vision model")
    return VlmSession(spec, model, processor, compute)


class VlmSession:
    """TextGenerationSession and VisionInput over one mlx-vlm model."""

    takes_images = True
    dispatch_width = 1  # one request at a time (the runner reads this before the engine's width)

    def __init__(self, spec: RunnerSpec, model: Any, processor: Any, compute: ComputeThread) -> None:
        self.spec = spec
        self.model = model
        self.processor = processor
        self.compute = compute

    def _messages(self, params: TextGenerationParams) -> list[dict[str, Any]]:
        return [m.template_dict() for m in params.messages]

    def _prompt(self, params: TextGenerationParams, images: int) -> str:
        from mlx_vlm.prompt_utils import apply_chat_template

        if params.raw_prompt is not None:
            return params.raw_prompt
        return str(apply_chat_template(self.processor, self.model.config, self._messages(params), num_images=images))

    def count_tokens(self, params: TextGenerationParams) -> int:
        """The prompt's text tokens (each image adds the processor's own, counted once it is read)."""
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        return len(tokenizer.encode(self._prompt(params, 0)))

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        started = time.perf_counter()
        try:
            images = self._images(command_id, params, cancelled)
        except Exception as exc:  # never answered from the text alone
            yield ErrorChunk(command_id=command_id, seq=0, message=f"images: {exc}", code="invalid_image")
            return
        sampling = params.sampling
        limit = sampling.max_tokens or DEFAULT_MAX_TOKENS
        prompt = self._prompt(params, len(images))
        kwargs: dict[str, Any] = {"max_tokens": limit, "temperature": sampling.temperature or 0.0}
        if sampling.top_p is not None:
            kwargs["top_p"] = sampling.top_p

        def start() -> Iterator[Any]:
            from mlx_vlm import stream_generate

            return iter(stream_generate(self.model, self.processor, prompt, image=images or None, **kwargs))

        seq = produced = prompt_tokens = 0
        text = ""
        try:
            steps = self.compute.call(start, None, "starting the generation")
            while True:
                if cancelled():
                    yield self._final(command_id, seq, "cancelled", prompt_tokens, produced, started)
                    return
                result = self.compute.call(lambda: next(steps, None), None, "a generation step")
                if result is None:
                    break
                prompt_tokens = result.prompt_tokens or prompt_tokens
                produced = result.generation_tokens or produced + 1
                piece = result.text or ""
                stop = next((s for s in sampling.stop if s in text + piece), None)
                if stop is not None:
                    head = (text + piece)[: (text + piece).index(stop)]
                    if head[len(text) :]:
                        yield TokenChunk(command_id=command_id, seq=seq, text=head[len(text) :])
                        seq += 1
                    yield self._final(command_id, seq, "stop", prompt_tokens, produced, started)
                    return
                text += piece
                if piece:
                    yield TokenChunk(command_id=command_id, seq=seq, text=piece)
                    seq += 1
        except Exception as exc:  # the processor or the model failed: the request fails, loudly
            yield ErrorChunk(command_id=command_id, seq=seq, message=f"mlx-vlm: {type(exc).__name__}: {exc}")
            return
        reason = "length" if produced >= limit else "stop"
        yield self._final(command_id, seq, reason, prompt_tokens, produced, started)

    def _images(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> list[Any]:
        if not any(m.images for m in params.messages):
            return []
        from PIL import Image
        from skulk_api_control.vision_wire import receive_images

        opened = []
        for data in receive_images(self.spec.instance_id, command_id, params, cancelled):
            image = Image.open(io.BytesIO(data))
            image.load()
            opened.append(image.convert("RGB"))
        return opened

    def _final(self, command_id: str, seq: int, reason: str, prompt: int, produced: int, started: float) -> TokenChunk:
        elapsed = max(time.perf_counter() - started, 1e-9)
        return TokenChunk(
            command_id=command_id,
            seq=seq,
            text="",
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=prompt, completion_tokens=produced),
            stats=GenerationStats(
                prompt_tokens=prompt, generation_tokens=produced, generation_tps=produced / elapsed, backend="mlx-vlm"
            ),
        )

    def close(self) -> None:
        self.compute.close()
