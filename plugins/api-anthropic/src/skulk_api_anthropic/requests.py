"""Anthropic Messages bodies -> the kernel's TextGenerationParams.

Bodies are parsed here, not by FastAPI, so every caller mistake becomes a 400 in Anthropic's error
shape naming the offending field. Types are strict (a temperature sent as a string is an error) and
unknown fields are ignored (`metadata`, `service_tier`, `cache_control`, `anthropic-beta` extras...).

Mapping:

* `system` (a string or text blocks) -> one leading `system` message.
* `user` content: text blocks are joined into a `user` message; every `tool_result` block becomes a
  `tool` message (`tool_call_id` = `tool_use_id`, `name` = the name of the matching earlier
  `tool_use`), in block order.
* `assistant` content: text -> `content`, `thinking` -> `reasoning_content`, `tool_use` ->
  `tool_calls` (the `input` object JSON-encoded); `redacted_thinking` is dropped (opaque).
* `image` blocks in user content (`source`: `base64` with its `media_type`, or `url` where the
  operator allows remote fetch) become the user message's images, read and checked by api-control's
  vision module; document and other block types are a 400.
* `tools` (custom tools: name, description, input_schema), `tool_choice` (`auto` / `any` ->
  `required` / `none` / `tool` -> the tool's name), sampling (`temperature`, `top_p`, `top_k`,
  `stop_sequences`, matched by the route so the answer names the one that hit), `max_tokens`
  (required for /v1/messages), `thinking` (`enabled` / `adaptive` -> enable_thinking True,
  `disabled` -> False; the budget is not enforced), structured outputs (`output_format` /
  `output_config.format`: `{"type": "json_schema", "schema": ...}`) decoded under a grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from skulk_api_control import requests_common
from skulk_api_control.requests_common import StrictBody as _In
from skulk_api_control.requests_common import invalid_field, validate
from skulk_kernel.api import ChatMessage, SamplingParams, TextGenerationParams, ToolCall, ToolSpec


class RequestError(requests_common.RequestError):
    """A caller mistake: answered as `status` in Anthropic's error shape with `x-should-retry: false`."""

    def __init__(self, message: str, *, status: int = 400, error_type: str = "invalid_request_error") -> None:
        super().__init__(message, status=status)
        self.error_type = error_type

    @classmethod
    def too_large(cls, message: str) -> RequestError:
        return cls(message, status=413, error_type="request_too_large")


def _validation_error(exc: ValidationError) -> RequestError:
    """Pydantic's first error, its field path in Anthropic's own spelling (`messages.0.content`)."""
    return RequestError(invalid_field(exc, brackets=False)[1])


def _validate(model: type[BaseModel], data: Any) -> Any:
    return validate(model, data, _validation_error)


class ToolIn(_In):
    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoiceIn(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingIn(_In):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class MessageIn(_In):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesIn(_In):
    model: str = Field(min_length=1)
    messages: list[MessageIn]
    max_tokens: int | None = Field(default=None, ge=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    thinking: ThinkingIn | None = None
    output_format: dict[str, Any] | None = None  # structured outputs (beta spelling)
    output_config: dict[str, Any] | None = None  # structured outputs: {"format": {...}}


class MessagesCreateIn(MessagesIn):
    """POST /v1/messages as the OpenAPI document shows it: `max_tokens` is required there (count_tokens
    takes MessagesIn without it)."""

    max_tokens: int = Field(ge=1)  # type: ignore[assignment]


@dataclass(frozen=True)
class MessagesRequest:
    """`params` carry no stop strings: `stop_sequences` are matched by the route (`StopWatch`), so the
    answer can report which one ended it."""

    params: TextGenerationParams
    model: str
    stream: bool
    stop_sequences: tuple[str, ...] = ()


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{where}.text: a string is required")
    return text


def _unsupported(kind: Any, where: str) -> RequestError:
    return RequestError(
        f"{where}.type: {kind!r} blocks are not supported by this server (text, image, tool_use, "
        "tool_result and thinking blocks are)"
    )


def _system(system: str | list[dict[str, Any]] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system or None
    texts = []
    for i, block in enumerate(system):
        if block.get("type") != "text":
            raise _unsupported(block.get("type"), f"system.{i}")
        texts.append(_text_of(block, f"system.{i}"))
    return "\n".join(texts) or None


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: a string or a list of text blocks is required")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _unsupported(kind, f"{where}.content.{k}")
        texts.append(_text_of(part, f"{where}.content.{k}"))
    return "\n".join(texts)


def _flush_user(out: list[ChatMessage], pending: list[str], images: list[str] | None = None) -> None:
    if pending or images:
        out.append(ChatMessage(role="user", content="\n".join(pending), images=tuple(images or ())))
        pending.clear()
        if images:
            images.clear()


def _image_source(block: dict[str, Any], where: str) -> str:
    """An image block's image as a data URL or an http(s) URL (api-control's vision module reads it)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise RequestError(f"{where}.source: an object is required (base64 or url)")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise RequestError(f"{where}.source.media_type: an image type is required (image/png, image/jpeg, ...)")
        if not isinstance(data, str) or not data:
            raise RequestError(f"{where}.source.data: the image's base64 is required")
        return f"data:{media};base64,{data}"
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise RequestError(f"{where}.source.url: a string is required")
        return url
    raise RequestError(f"{where}.source.type: {kind!r} is not supported (base64 or url)")


def _messages(messages: list[MessageIn]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    tool_names: dict[str, str] = {}
    for i, msg in enumerate(messages):
        where = f"messages.{i}.content"
        blocks: list[dict[str, Any]] = (
            [{"type": "text", "text": msg.content}] if isinstance(msg.content, str) else msg.content
        )
        if msg.role == "assistant":
            texts: list[str] = []
            thinking: list[str] = []
            calls: list[ToolCall] = []
            for k, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "text":
                    texts.append(_text_of(block, f"{where}.{k}"))
                elif kind == "thinking":
                    value = block.get("thinking")
                    if not isinstance(value, str):
                        raise RequestError(f"{where}.{k}.thinking: a string is required")
                    thinking.append(value)
                elif kind == "redacted_thinking":
                    continue
                elif kind == "tool_use":
                    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
                    if not isinstance(call_id, str) or not call_id:
                        raise RequestError(f"{where}.{k}.id: a string is required")
                    if not isinstance(name, str) or not name:
                        raise RequestError(f"{where}.{k}.name: a string is required")
                    if not isinstance(args, dict):
                        raise RequestError(f"{where}.{k}.input: an object is required")
                    tool_names[call_id] = name
                    calls.append(ToolCall(id=call_id, name=name, arguments=json.dumps(args)))
                else:
                    raise _unsupported(kind, f"{where}.{k}")
            text = "".join(texts)
            out.append(
                ChatMessage(
                    role="assistant",
                    content=text if (text or not calls) else None,
                    reasoning_content="".join(thinking) or None,
                    tool_calls=tuple(calls),
                )
            )
            continue
        pending: list[str] = []  # consecutive text and image blocks: one user message
        images: list[str] = []
        for k, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "text":
                pending.append(_text_of(block, f"{where}.{k}"))
            elif kind == "image":
                images.append(_image_source(block, f"{where}.{k}"))
            elif kind == "tool_result":
                _flush_user(out, pending, images)
                call_id = block.get("tool_use_id")
                if not isinstance(call_id, str) or not call_id:
                    raise RequestError(f"{where}.{k}.tool_use_id: a string is required")
                out.append(
                    ChatMessage(
                        role="tool",
                        content=_tool_result_text(block.get("content"), f"{where}.{k}"),
                        tool_call_id=call_id,
                        name=tool_names.get(call_id),
                    )
                )
            else:
                raise _unsupported(kind, f"{where}.{k}")
        _flush_user(out, pending, images)
        if not blocks:
            out.append(ChatMessage(role="user", content=""))
    return out


def _tools(tools: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    specs = []
    for i, tool in enumerate(tools or ()):
        if tool.type not in (None, "custom"):
            raise RequestError(
                f"tools.{i}.type: server tools ({tool.type!r}) are not supported by this server; "
                "send custom tools with name, description and input_schema"
            )
        if tool.input_schema is None:
            raise RequestError(f"tools.{i}.input_schema: Field required")
        specs.append(ToolSpec(name=tool.name, description=tool.description or "", parameters=tool.input_schema))
    return tuple(specs)


def _tool_choice(choice: ToolChoiceIn | None, tools: tuple[ToolSpec, ...]) -> str | None:
    if choice is None:
        return None
    if choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise RequestError("tool_choice.name: required when tool_choice.type is 'tool'")
    if choice.name not in {t.name for t in tools}:
        raise RequestError(f"tool_choice.name: no tool named {choice.name!r} in `tools`")
    return choice.name


def _thinking(thinking: ThinkingIn | None) -> bool | None:
    if thinking is None:
        return None
    return thinking.type != "disabled"


def parse_messages_request(data: dict[str, Any], *, require_max_tokens: bool = True) -> MessagesRequest:
    """A /v1/messages (or, with require_max_tokens=False, a count_tokens) body."""
    if require_max_tokens and "max_tokens" not in data:
        raise RequestError("max_tokens: Field required")
    req: MessagesIn = _validate(MessagesIn, data)
    if not req.messages:
        raise RequestError("messages: at least one message is required")
    messages = _messages(req.messages)
    system = _system(req.system)
    if system is not None:
        messages.insert(0, ChatMessage(role="system", content=system))
    tools = _tools(req.tools)
    try:
        params = TextGenerationParams(
            model_id=req.model,
            messages=tuple(messages),
            tools=tools,
            tool_choice=_tool_choice(req.tool_choice, tools),
            sampling=SamplingParams(
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k if req.top_k else None,
                max_tokens=req.max_tokens,
                max_tokens_is_ceiling=True,  # SDKs fill in a fixed value (the AI SDK: 4096)
            ),
            enable_thinking=_thinking(req.thinking),
        )
    except ValidationError as exc:
        raise _validation_error(exc) from None
    fmt, where = req.output_format, "output_format"
    if fmt is None and req.output_config is not None:
        fmt, where = req.output_config.get("format"), "output_config.format"
    try:
        params = requests_common.constrain(params, fmt, where)
    except requests_common.ConstraintError as exc:
        raise RequestError(str(exc)) from None
    stops = tuple(s for s in req.stop_sequences or () if s)
    return MessagesRequest(params=params, model=req.model, stream=bool(req.stream), stop_sequences=stops)


def estimate_tokens(params: TextGenerationParams) -> int:
    """A rough count (about 4 characters a token, plus a few per message and tool) for when the engine
    cannot be asked. Only used where noted; never presented as exact."""
    chars = 0
    for m in params.messages:
        chars += len(m.content or "") + len(m.reasoning_content or "") + 16
        chars += sum(len(c.name) + len(c.arguments) + 16 for c in m.tool_calls)
    for t in params.tools:
        chars += len(t.name) + len(t.description) + len(json.dumps(t.parameters)) + 16
    return max(1, (chars + 3) // 4)
