"""One steward turn: the model, its read-only tools, at most `max_tool_calls` calls, streamed.

The chat APIs hand a `skulk/steward` request to the dispatch path like any other; the steward's
middleware (plugin.py) takes it over there and runs `run_turn`, which writes the client's chunks
into the request's own stream. Each model step is an ordinary TextGeneration sent through the
node's own dispatch (`skulk_api_control.dispatch.start`), pinned to the steward instance.

Every turn starts with a fresh `get_cluster_state` exchange supplied by the harness (the model
cannot skip it), so even a small model answers from the live cluster rather than from its priors.
Every tool step is streamed as reasoning (`TokenChunk(reasoning=True)`), which each API renders in
its own reasoning shape, then the answer streams as content. A step's keep-alives (a long prompt's
progress, the empty chunks of a tool call being written) reach the client's stream too: on a busy
node a step may show nothing for minutes, and the API node abandons a stream silent for two.
"""

from __future__ import annotations

import logging
from typing import Any

from skulk_kernel.api import (
    ChatMessage,
    CommandId,
    ErrorChunk,
    NodeSurface,
    PrefillProgressChunk,
    SamplingParams,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
    ToolCall,
    ToolCallChunk,
    Usage,
    new_id,
)

from .config import StewardConfig
from .tools import TOOLS, run_tool

log = logging.getLogger("skulk.steward")

SYSTEM_PROMPT = """You are Skulk, a distributed AI inference cluster, speaking in the first person.
You answer the operator's questions about the cluster using the results of your tools, which are the
live truth. Never guess a number: read it from a tool result. If a tool result already answers the
question, answer at once in one or two short sentences, using the node names as they appear.
If you want a change made (place, delete or move an instance), use propose_action: an operator must approve it."""


class Outer:
    """The client's stream: numbered chunks into the request's own stream on this node."""

    def __init__(self, node: NodeSurface, command_id: str) -> None:
        self.node, self.command_id, self.seq, self.sent = node, CommandId(command_id), 0, False

    @property
    def open(self) -> bool:
        return self.command_id in self.node.streams.open_ids()

    async def send(self, chunk_type: type[Any], **fields: Any) -> None:
        chunk = chunk_type(command_id=self.command_id, seq=self.seq, **fields)
        self.seq += 1
        self.sent = True
        await self.node.send_chunk(self.node.node_id, chunk)

    async def reasoning(self, text: str) -> None:
        await self.send(TokenChunk, text=text, reasoning=True)


def _history(params: TextGenerationParams) -> list[ChatMessage]:
    """The client's conversation without its system prompts (the steward uses its own)."""
    return [m for m in params.messages if m.role not in ("system", "developer")]


async def run_turn(node: NodeSurface, command: TextGeneration, instance_id: str, config: StewardConfig) -> None:
    outer = Outer(node, command.command_id)
    usage = [0, 0]  # prompt and completion tokens over every step of the turn
    try:
        finish = await _loop(node, command, instance_id, config, outer, usage)
        if outer.open:
            total = Usage(prompt_tokens=usage[0], completion_tokens=usage[1])
            await outer.send(TokenChunk, text="", finish_reason=finish, usage=total)
    except _Failed as exc:
        if outer.open:
            await outer.send(ErrorChunk, message=exc.message, code=exc.code, error_type=exc.error_type)
    except Exception as exc:
        log.exception("steward turn %s failed", command.command_id)
        if outer.open:
            await outer.send(ErrorChunk, message=f"the steward failed: {type(exc).__name__}: {exc}")


#: codes dispatch would resume on another instance of the *client's* model (skulk/steward has
#: none); a failed step is a not-ready steward to the client instead (503 before the first byte)
_NOT_RESUMABLE = {
    "node_gone": "instance_not_ready",
    "runner_crashed": "instance_not_ready",
    "instance_gone": "instance_not_ready",
}


class _Failed(Exception):
    def __init__(self, message: str, code: str | None, error_type: str = "server_error") -> None:
        super().__init__(message)
        self.message, self.error_type = message, error_type
        self.code = _NOT_RESUMABLE.get(code or "", code)


async def _loop(
    node: NodeSurface, command: TextGeneration, instance_id: str, config: StewardConfig, outer: Outer, usage: list[int]
) -> str:
    from skulk_api_control.dispatch import InferenceError, start

    tools = tuple(spec for _, spec in TOOLS.values())
    messages = [ChatMessage(role="system", content=SYSTEM_PROMPT), *_history(command.params)]
    calls = 0

    async def use_tool(call: ToolCall) -> None:
        nonlocal calls
        calls += 1
        await outer.reasoning(f"Tool step {calls}: {call.name}({call.arguments or '{}'})\n")
        result = run_tool(node, call.name, call.arguments)
        await outer.reasoning(result + "\n\n")
        messages.append(ChatMessage(role="tool", content=result, tool_call_id=call.id, name=call.name))

    baseline = ToolCall(id=f"call_{new_id()[:12]}", name="get_cluster_state", arguments="{}")
    messages.append(ChatMessage(role="assistant", content=None, tool_calls=(baseline,)))
    await use_tool(baseline)
    sampling = SamplingParams(temperature=0.0, max_tokens=command.params.sampling.max_tokens or config.max_tokens)
    while True:
        if not outer.open:
            return "cancelled"
        offer = tools if calls < config.max_tool_calls else ()
        step = TextGeneration(
            command_id=CommandId(new_id()),
            owner_node_id=node.node_id,
            instance_id=instance_id,  # type: ignore[arg-type]
            params=TextGenerationParams(
                model_id=_model_of(node, instance_id), messages=tuple(messages), tools=offer, sampling=sampling
            ),
        )
        try:
            handle = await start(node, step, observe=False)
        except InferenceError as exc:
            code = exc.code or ("instance_not_ready" if exc.status == 503 else None)
            raise _Failed(exc.message, code, exc.error_type) from None
        text: list[str] = []
        wanted: list[ToolCall] = []
        finish = "stop"
        try:
            async for chunk in handle.chunks():
                if not outer.open:
                    await handle.cancel()
                    return "cancelled"
                if isinstance(chunk, ErrorChunk):
                    raise _Failed(chunk.message, chunk.code, chunk.error_type)
                if isinstance(chunk, ToolCallChunk):
                    wanted += chunk.calls
                elif isinstance(chunk, TokenChunk) and chunk.text:
                    if chunk.reasoning:
                        await outer.reasoning(chunk.text)
                    else:
                        text.append(chunk.text)
                        await outer.send(TokenChunk, text=chunk.text)
                elif isinstance(chunk, PrefillProgressChunk):  # a long prompt read: the client's wait goes on
                    await outer.send(PrefillProgressChunk, processed=chunk.processed, total=chunk.total)
                elif isinstance(chunk, TokenChunk) and chunk.finish_reason is None:  # a tool call being written
                    await outer.send(TokenChunk, text="")
                if chunk.usage is not None:
                    usage[0] += chunk.usage.prompt_tokens
                    usage[1] += chunk.usage.completion_tokens
                if chunk.finish_reason is not None:
                    finish = "length" if chunk.finish_reason == "length" else "stop"
        finally:
            await handle.close()
        if not wanted or not offer:
            return finish
        messages.append(ChatMessage(role="assistant", content="".join(text) or None, tool_calls=tuple(wanted)))
        for call in wanted[: max(0, config.max_tool_calls - calls)]:
            await use_tool(call)
        for call in wanted[max(0, config.max_tool_calls - calls) :]:
            messages.append(
                ChatMessage(
                    role="tool", content="Not run: the tool-call limit of this turn is reached.", tool_call_id=call.id
                )
            )


def _model_of(node: NodeSurface, instance_id: str) -> Any:
    inst = node.state.instances.get(instance_id)  # type: ignore[call-overload]
    if inst is None:
        raise _Failed("the steward instance went away; it is being re-placed, retry shortly", "instance_gone")
    return inst.shard_assignments.model_id
