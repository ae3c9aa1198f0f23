"""The hello engine: answers "Hello, <the last user message>", one word per chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from skulk_kernel.api import Chunk, EngineProbe, RunnerSpec, TextGenerationParams, TokenChunk, Usage


def _words(params: TextGenerationParams) -> list[str]:
    return [w for m in params.messages for w in (m.content or "").split()]


class HelloSession:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    def count_tokens(self, params: TextGenerationParams) -> int:
        return len(_words(params)) + len(params.messages)

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        last = next((m.content or "" for m in reversed(params.messages) if m.role == "user"), "")
        words = [f"{self.greeting},", *last.split()]
        limit = params.sampling.max_tokens or len(words)
        seq, reason = 0, "stop"
        for i, word in enumerate(words):
            if i >= limit:
                reason = "length"
                break
            if cancelled():
                reason = "cancelled"
                break
            yield TokenChunk(command_id=command_id, seq=seq, text=word if i == 0 else " " + word)
            seq += 1
        yield TokenChunk(
            command_id=command_id,
            seq=seq,
            text="",
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=self.count_tokens(params), completion_tokens=seq),
        )

    def close(self) -> None:
        pass


class HelloEngine:
    name = "hello"
    tasks = frozenset({"TextGeneration"})
    dispatch_width = 1
    splits: frozenset[str] = frozenset()

    def probe(self) -> EngineProbe:
        return EngineProbe(available=True, version="0.1.0")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return ["hello-cpu"]

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> HelloSession:
        progress(1, 1)
        return HelloSession(str(spec.options.get("greeting", "Hello")))
