"""A deterministic engine: answers by echoing the last user message, word by word.

It implements the whole Engine contract (streaming, stop strings, max_tokens, logprobs, tool calls,
embeddings, cancellation, token counting) with no model files, so the worker, the runner lifecycle
and every API adapter can be tested fast and exactly. Special prompts exercise failure paths:

* ``/tool NAME {json}``   -> one tool call to NAME with those arguments
* ``/crash``              -> the runner process exits at once (supervisor tests)
* ``/slow``               -> 50 ms between tokens (cancellation tests)
* ``/working N TEXT``     -> N empty keep-alive chunks 20 ms apart (work that shows nothing yet,
  like a tool call being written), then TEXT echoed (the adapters' keep-alive tests)
* ``/hang``               -> never answers and ignores cancellation: a wedged engine (flight
  recorder tests); the runner stays stuck until its worker stops it

With ``hang_model = true`` in ``[plugins.engine-echo]`` the store also offers ``skulk/echo-hang``,
whose ``load`` never returns (the worker's load deadline tests); without it no card has that id.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from skulk_kernel.api import (
    Chunk,
    EmbeddingChunk,
    EmbeddingParams,
    EngineProbe,
    ErrorChunk,
    GenerationStats,
    ModelCard,
    RunnerSpec,
    Sharding,
    TextGenerationParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)

from . import completion
from .group import EchoGroup
from .plugin import EchoConfig

ECHO_MODEL = "skulk/echo"
ECHO_EMBED_MODEL = "skulk/echo-embed"
ECHO_HANG_MODEL = "skulk/echo-hang"
ECHO_VISION_MODEL = "skulk/echo-vision"
EMBED_DIMS = 16


def echo_cards(
    context_length: int = 4096, hang_model: bool = False, vision_model: bool = False
) -> dict[str, ModelCard]:
    cards = {
        ECHO_MODEL: ModelCard(
            model_id=ECHO_MODEL,
            n_layers=2,
            hidden_size=64,
            family="echo",
            quantization="none",
            context_length=context_length,
            storage_size=1,
            compatible_backends=("echo-cpu",),
            capabilities=("text", "tools", "logprobs"),
        ),
        ECHO_EMBED_MODEL: ModelCard(
            model_id=ECHO_EMBED_MODEL,
            n_layers=1,
            hidden_size=EMBED_DIMS,
            family="echo",
            tasks=("TextEmbedding",),
            context_length=context_length,
            storage_size=1,
            embedding_dimensions=EMBED_DIMS,
            compatible_backends=("echo-cpu",),
        ),
    }
    if vision_model:  # takes images: answers with each image's digest, computed from the bytes it received
        cards[ECHO_VISION_MODEL] = cards[ECHO_MODEL].model_copy(
            update={"model_id": ECHO_VISION_MODEL, "capabilities": ("text", "vision")}
        )
    if hang_model:
        cards[ECHO_HANG_MODEL] = cards[ECHO_MODEL].model_copy(
            update={"model_id": ECHO_HANG_MODEL, "storage_size": 2**20}  # 1 MiB: the deadline's floor applies
        )
    return cards


def tokenize(text: str) -> list[str]:
    """Words with their leading space, so the tokens join back to the text exactly."""
    tokens: list[str] = []
    for i, word in enumerate(text.split(" ")):
        piece = word if i == 0 else " " + word
        if piece:
            tokens.append(piece)
    return tokens


def prompt_tokens(params: TextGenerationParams) -> int:
    if params.completion is not None:
        return len(tokenize(completion.prompt_text(params)))
    if params.raw_prompt is not None:
        return len(tokenize(params.raw_prompt))
    return sum(len(tokenize(m.content or "")) + 2 for m in params.messages)


class EchoSession:
    serves_completions = True  # see completion.py
    ignores_eos = True  # with ignore_eos the prompt's words repeat up to max_tokens

    def __init__(self, spec: RunnerSpec, token_delay_s: float) -> None:
        self.spec = spec
        self.token_delay_s = token_delay_s
        self.group: EchoGroup | None = None
        if spec.group is not None:
            self.group = EchoGroup(spec.group, spec.shard.device_rank)
            self.group.form()

    @property
    def takes_images(self) -> bool:
        """VisionInput: the vision card reads images (the others are text-only, and the runner says so)."""
        return "vision" in self.spec.card.capabilities

    def count_tokens(self, params: TextGenerationParams) -> int:
        return prompt_tokens(params)

    def _seen(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> str:
        """What the images were, as the runner received them: `image <sha256> <bytes>` each (the
        digest computed here, from the bytes), so tests check the bytes that arrived end to end."""
        from skulk_api_control.vision_wire import receive_images

        images = receive_images(self.spec.instance_id, command_id, params, cancelled)
        return " ".join(f"image {hashlib.sha256(b).hexdigest()} {len(b)}" for b in images)

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        started = time.perf_counter()
        if params.completion is not None:
            refused = completion.check(command_id, params, self.spec.card.model_id)
            if refused is not None:
                yield refused
                return
            last = completion.prompt_text(params)
        elif params.raw_prompt is not None:
            last = params.raw_prompt
        else:
            last = next((m.content or "" for m in reversed(params.messages) if m.role == "user"), "")
        n_prompt = prompt_tokens(params)
        if any(m.images for m in params.messages):
            try:
                last = f"{self._seen(command_id, params, cancelled)} {last}".strip()
            except Exception as exc:  # the bytes did not come whole: fail, never answer from the text alone
                yield ErrorChunk(command_id=command_id, seq=0, message=f"images: {exc}", code="invalid_image")
                return
        if last.strip() == "/crash":
            os._exit(17)
        if last.strip() == "/hang":
            while True:  # wedged on purpose: no chunk, no cancellation check
                time.sleep(3600)
        delay = 0.05 if last.startswith("/slow") else self.token_delay_s
        if last.startswith("/tool ") and params.tools:
            name, _, args = last.removeprefix("/tool ").partition(" ")
            call = ToolCall(
                id="call_" + hashlib.sha1(command_id.encode()).hexdigest()[:12],
                name=name,
                arguments=args.strip() or "{}",
            )
            yield ToolCallChunk(
                command_id=command_id,
                seq=0,
                calls=(call,),
                finish_reason="tool_calls",
                usage=Usage(prompt_tokens=n_prompt, completion_tokens=1),
            )
            return
        seq = 0
        for chunk in completion.prompt_chunk(command_id, params, tokenize(last)):
            yield chunk
            seq += 1
        if params.completion is not None and not params.completion.generate:
            yield self._final(command_id, seq, "length", n_prompt, 0, started)
            return
        if last.startswith("/working "):
            count, _, last = last.removeprefix("/working ").partition(" ")
            for _ in range(min(int(count), 100) if count.isdigit() else 0):
                time.sleep(0.02)
                yield TokenChunk(command_id=command_id, seq=seq, text="")
                seq += 1
        if last.startswith("/think "):
            thought, _, last = last.removeprefix("/think ").partition(" | ")
            if params.enable_thinking is not False:
                for token in tokenize(thought):
                    if delay:
                        time.sleep(delay)
                    yield TokenChunk(command_id=command_id, seq=seq, text=token, reasoning=True)
                    seq += 1
        tokens = tokenize(last) or ["(empty)"]
        cycled = params.sampling.ignore_eos and params.sampling.max_tokens is not None
        if cycled:  # no end of text: the words again and again, to exactly max_tokens (finish "length")
            tokens = [tokens[i % len(tokens)] for i in range(params.sampling.max_tokens or 0)]
        limit = params.sampling.max_tokens or len(tokens)
        text_so_far = ""
        for i, token in enumerate(tokens[:limit]):
            if cancelled():
                yield self._final(command_id, seq, "cancelled", n_prompt, i, started)
                return
            if delay:
                time.sleep(delay)
            if self.group is not None:
                self.group.check()
            text_so_far += token
            stop_hit = next((s for s in params.sampling.stop if s in text_so_far), None)
            if stop_hit is not None:
                head = text_so_far[: text_so_far.index(stop_hit)]
                emitted = text_so_far[: len(text_so_far) - len(token)]
                rest = head[len(emitted) :]
                if rest:
                    yield TokenChunk(command_id=command_id, seq=seq, text=rest)
                    seq += 1
                yield self._final(command_id, seq, "stop", n_prompt, i + 1, started)
                return
            yield TokenChunk(command_id=command_id, seq=seq, text=token, logprobs=self._logprobs(token, params))
            seq += 1
        reason = "length" if limit < len(tokens) or cycled else "stop"
        yield self._final(command_id, seq, reason, n_prompt, min(limit, len(tokens)), started)

    @staticmethod
    def _logprobs(token: str, params: TextGenerationParams) -> tuple[TokenLogprob, ...]:
        if not params.logprobs:
            return ()
        raw = tuple(token.encode())
        top = tuple(
            TopLogprob(token=token if k == 0 else f"<alt{k}>", logprob=-float(k), bytes=raw if k == 0 else ())
            for k in range(max(1, params.top_logprobs))
        )
        return (TokenLogprob(token=token, logprob=0.0, bytes=raw, top_logprobs=top),)

    def _final(self, command_id: str, seq: int, reason: str, n_prompt: int, n_gen: int, started: float) -> TokenChunk:
        elapsed = max(time.perf_counter() - started, 1e-9)
        return TokenChunk(
            command_id=command_id,
            seq=seq,
            text="",
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_gen),
            stats=GenerationStats(
                prompt_tokens=n_prompt, generation_tokens=n_gen, generation_tps=n_gen / elapsed, backend="echo-cpu"
            ),
        )

    def embed(self, command_id: str, params: EmbeddingParams) -> Chunk:
        vectors = tuple(_embed_one(text) for text in params.inputs)
        n = sum(len(tokenize(t)) for t in params.inputs)
        return EmbeddingChunk(
            command_id=command_id, seq=0, embeddings=vectors, finish_reason="stop", usage=Usage(prompt_tokens=n)
        )

    def close(self) -> None:
        if self.group is not None:
            self.group.close()


def _embed_one(text: str) -> tuple[float, ...]:
    """A bag-of-words hash embedding: same words, same direction; unit norm."""
    vec = [0.0] * EMBED_DIMS
    for word in text.lower().split():
        digest = hashlib.sha256(word.encode()).digest()
        for i in range(EMBED_DIMS):
            vec[i] += (digest[i] - 127.5) / 127.5
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return tuple(v / norm for v in vec)


class EchoEngine:
    name = "echo"
    tasks = frozenset({"TextGeneration", "TextEmbedding"})
    dispatch_width = 4
    splits: frozenset[Sharding] = frozenset({"Pipeline", "Tensor"})  # every rank answers; see group.py

    def probe(self) -> EngineProbe:
        return EngineProbe(available=True, version="builtin")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return ["echo-cpu"]

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> EchoSession:
        total = spec.card.n_layers
        if spec.card.model_id == ECHO_HANG_MODEL and EchoConfig.model_validate(dict(spec.options)).hang_model:
            progress(0, total)
            while True:  # a load that never finishes: only the worker's deadline (a kill) ends it
                time.sleep(3600)
        for layer in range(total):
            progress(layer + 1, total)
        return EchoSession(spec, EchoConfig.model_validate(dict(spec.options)).token_delay_s)


class EchoModelStore:
    """Offers the echo cards; they need no files."""

    name = "echo"

    def __init__(self, context_length: int = 4096, hang_model: bool = False, vision_model: bool = False) -> None:
        self.context_length = context_length
        self.hang_model = hang_model
        self.vision_model = vision_model

    def catalog(self) -> dict[str, ModelCard]:
        return echo_cards(self.context_length, self.hang_model, self.vision_model)

    def local_path(self, model_id: str) -> Path | None:
        return None
