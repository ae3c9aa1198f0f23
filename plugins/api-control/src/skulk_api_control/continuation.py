"""Mid-stream continuation: a generation survives the death of the node (or runner) serving it.

The API node keeps the request and what it has already streamed. When the stream fails because
its node left, its runner crashed or its instance was torn down, it sends the same request to
another ready instance with the streamed text as a final assistant message, which the engine
continues under the same chat template without closing the turn (llama.cpp's server prefills a
trailing assistant message: the model picks up mid-sentence), with the remaining token budget and
the same sampling parameters. Where there is another instance to resume on, the request asks its
engine for token ids (``TextGenerationParams.token_ids``), and a resume passes the ids streamed so
far (``continue_from``): an engine that has them (llama.cpp's server) continues from the exact
token sequence the dead run had instead of re-tokenizing the text, which may split differently.
The client sees one stream: no text twice, none missing, usage that adds up. Greedy output is
identical to an uninterrupted run on the same model and engine build.

Never resumed: a client cancel (it never reaches here), a bad request, a context overflow, an
engine error (deterministic: the next instance would fail the same way) and a master change (a new
master's session cannot carry the old one's requests). Resumes are bounded per request
(`[plugins.api-control] max_resumes`) and counted in GET /v1/diagnostics/node.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from skulk_kernel.api import (
    CancelTask,
    ChatMessage,
    Chunk,
    CommandId,
    ErrorChunk,
    NodeSurface,
    ServiceKey,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
    is_terminal,
    new_id,
)

from .routing import InstanceRouter

log = logging.getLogger("skulk.resume")
#: stream errors that mean "this instance is gone", not "this request is wrong"
RESUMABLE_CODES = frozenset({"node_gone", "runner_crashed", "instance_gone"})


@dataclass
class ResumeStats:
    """Per API node, shown in diagnostics: what failed over and how long the client waited."""

    failures: int = 0  # resumable stream failures seen
    resumed: int = 0  # continued on another instance
    gave_up: int = 0  # ended with the error: no other instance, the limit, or the retry failed too
    gaps_ms: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    last_prefix_chars: int = 0  # text the last resume continued from (what the client had)
    last_prefix_tokens: int = 0

    def describe(self) -> dict[str, Any]:
        gaps = sorted(self.gaps_ms)
        return {
            "failures": self.failures,
            "resumed": self.resumed,
            "gaveUp": self.gave_up,
            "lastGapsMs": [round(g, 1) for g in list(self.gaps_ms)[-10:]],
            "gapP50Ms": round(gaps[len(gaps) // 2], 1) if gaps else None,
            "lastPrefixChars": self.last_prefix_chars,
            "lastPrefixTokens": self.last_prefix_tokens,
        }


RESUMES: ServiceKey[ResumeStats] = ServiceKey("api-control.resumes")


def stats_for(node: NodeSurface) -> ResumeStats:
    stats = node.services.get(RESUMES)
    if stats is None:
        stats = node.services.publish(RESUMES, ResumeStats())
    return stats


@dataclass
class Progress:
    """What the client has received so far (the prefix a resume continues).

    ``ids`` are the token ids of that text while every chunk carried its own (the request asked
    for ``token_ids``): a resume hands them to the engine, which continues from the interrupted
    run's exact token sequence. One chunk without ids (reasoning, an engine that has none) and
    they are dropped for good: the text alone is then the prefix.
    """

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tokens: int = 0
    ids: list[int] | None = field(default_factory=list)

    def add(self, chunk: TokenChunk) -> None:
        if self.ids is not None:
            if chunk.token_ids and not chunk.reasoning:
                self.ids.extend(chunk.token_ids)
            elif chunk.text:
                self.ids = None
        if chunk.text:
            (self.reasoning if chunk.reasoning else self.text).append(chunk.text)
        if chunk.text or chunk.token_ids:
            self.tokens += len(chunk.token_ids) or max(1, len(chunk.logprobs))


def continued_params(params: TextGenerationParams, progress: Progress) -> TextGenerationParams | None:
    """The request that continues `params` after `progress`, or None when nothing is left to do."""
    sampling = params.sampling
    if sampling.max_tokens is not None:
        left = sampling.max_tokens - progress.tokens
        if left < 1:
            return None
        sampling = sampling.model_copy(update={"max_tokens": left})
    text, reasoning = "".join(progress.text), "".join(progress.reasoning)
    update: dict[str, Any] = {"sampling": sampling}
    if params.completion is not None:
        return _continued_completion(params, progress, text, update)
    # `params` is the client's request and `progress` spans every attempt: the ids are all of them
    exact = bool(progress.ids) and params.raw_prompt is None and not reasoning
    update["continue_from"] = tuple(progress.ids or ()) if exact else ()
    if params.raw_prompt is not None:  # a raw prompt continues as raw text
        update["raw_prompt"] = params.raw_prompt + text
    elif text or reasoning:
        messages = list(params.messages)
        last = messages[-1]
        if last.role == "assistant" and not last.tool_calls:  # the client's own prefill: extend it
            messages[-1] = last.model_copy(
                update={
                    "content": (last.content or "") + text,
                    "reasoning_content": ((last.reasoning_content or "") + reasoning) or None,
                }
            )
        else:
            messages.append(ChatMessage(role="assistant", content=text, reasoning_content=reasoning or None))
        update["messages"] = tuple(messages)
    return params.model_copy(update=update)


def _continued_completion(
    params: TextGenerationParams, progress: Progress, text: str, update: dict[str, Any]
) -> TextGenerationParams | None:
    """A text completion goes on from its prompt plus what was streamed (the prompt's ids plus the
    streamed ids, or its text plus the streamed text); its echo was already sent. None: a prompt of
    ids whose continuation has no ids to append (it cannot be spelled exactly)."""
    completion = params.completion
    assert completion is not None
    changed: dict[str, Any] = {"echo": False, "prompt_logprobs": None}
    if completion.prompt_ids and text:
        if not progress.ids:
            return None
        changed["prompt_ids"] = completion.prompt_ids + tuple(progress.ids)
    elif params.raw_prompt is not None:
        update["raw_prompt"] = params.raw_prompt + text
    update["completion"] = completion.model_copy(update=changed)
    return params.model_copy(update=update)


#: starts one command and returns its started stream (dispatch.start with no early errors)
Opener = Callable[[TextGeneration], Awaitable[Any]]


class Resumer:
    """One request's continuation state on its API node."""

    def __init__(
        self,
        node: NodeSurface,
        router: InstanceRouter,
        params: TextGenerationParams,
        instance_id: str | None,
        opener: Opener,
        max_resumes: int,
    ) -> None:
        self.node = node
        self.router = router
        self.params = params
        self.live_instance = instance_id
        self.opener = opener
        self.max_resumes = max_resumes
        self.progress = Progress()
        self.attempts = 0
        self.base_tokens = 0  # tokens streamed before the current attempt started
        self.failed: set[str] = set()
        self.commands: list[str] = []
        self.last_at = time.monotonic()
        self.stats = stats_for(node)

    def track(self, chunk: Chunk) -> Chunk:
        """Count what the client gets; make the final usage add up over every attempt."""
        if isinstance(chunk, TokenChunk):
            if chunk.text or chunk.token_ids:
                self.progress.add(chunk)
                self.last_at = time.monotonic()
            if self.attempts and is_terminal(chunk) and (chunk.usage is not None or chunk.stats is not None):
                chunk = self._summed(chunk)
        return chunk

    def _summed(self, chunk: TokenChunk) -> TokenChunk:
        base = self.base_tokens
        update: dict[str, Any] = {}
        if chunk.usage is not None:
            u = chunk.usage
            summed = {"prompt_tokens": max(0, u.prompt_tokens - base), "completion_tokens": u.completion_tokens + base}
            update["usage"] = u.model_copy(update=summed)
        if chunk.stats is not None:
            s = chunk.stats
            update["stats"] = s.model_copy(
                update={
                    "prompt_tokens": max(0, s.prompt_tokens - base),
                    "generation_tokens": s.generation_tokens + base,
                }
            )
        return chunk.model_copy(update=update)

    async def resume(self, error: ErrorChunk) -> Any | None:
        """A started stream on another instance that continues this request, or None (end with `error`)."""
        if error.code not in RESUMABLE_CODES:
            return None
        self.stats.failures += 1
        while True:
            if self.live_instance is not None:
                self.failed.add(self.live_instance)
            params = continued_params(self.params, self.progress)
            target = None
            if params is not None and self.attempts < self.max_resumes:
                target = self.router.choose(self.node, params.model_id, exclude=self.failed)
            if params is None or target is None:
                self.stats.gave_up += 1
                why = "the limit of resumes" if self.attempts >= self.max_resumes else "no other ready instance"
                log.warning("stream failed (%s: %s); not resumed: %s", error.code, error.message, why)
                return None
            self.attempts += 1
            self.base_tokens = self.progress.tokens
            self.live_instance = target
            command = TextGeneration(
                command_id=CommandId(new_id()), owner_node_id=self.node.node_id, params=params, instance_id=target
            )
            self.commands.append(command.command_id)
            self.router.started(command.command_id, target)
            log.warning(
                "stream failed (%s: %s) after %d tokens; resuming on instance %s (attempt %d, from %s)",
                error.code,
                error.message,
                self.progress.tokens,
                target,
                self.attempts,
                f"{len(params.continue_from)} token ids" if params.continue_from else "the text",
            )
            try:
                opened = await self.opener(command)
            except Exception as exc:  # a 504 or a refusal: end with the original error
                log.warning("resume on %s failed: %s", target, exc)
                self.stats.gave_up += 1
                return None
            first = opened.first
            if isinstance(first, ErrorChunk) and first.code in RESUMABLE_CODES:
                error = first
                self.node.streams.close(command.command_id)
                continue
            if isinstance(first, ErrorChunk):
                self.stats.gave_up += 1
                return opened  # a different failure: the client sees that one
            self.stats.resumed += 1
            self.stats.last_prefix_chars = sum(len(t) for t in self.progress.text)
            self.stats.last_prefix_tokens = self.progress.tokens
            self.stats.gaps_ms.append((time.monotonic() - self.last_at) * 1000)
            return opened

    async def abandon(self, command_id: str) -> None:
        """The failed attempt's stream is done with: free it (the task is cancelled if it lingers)."""
        self.node.streams.close(command_id)
        self.router.finished(command_id)
        await self.node.post(CancelTask(command_id=CommandId(new_id()), task_command_id=CommandId(command_id)))

    def release(self) -> None:
        for command_id in self.commands:
            self.router.finished(command_id)
