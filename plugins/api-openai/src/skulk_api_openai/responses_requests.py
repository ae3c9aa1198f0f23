"""OpenAI Responses request bodies (`POST /v1/responses`) -> the kernel's TextGenerationParams.

Same rules as the Chat parser in `requests.py` (whose helpers this reuses): strict types, unknown
fields ignored, every caller mistake a 400 in OpenAI's error shape naming the field.

`input` is a string (one user message) or a list of items, converted in order:

* messages (`type: "message"` or no type, with a `role`): `user`, `system`, `developer`, `assistant`;
  content a string or a list of `input_text` / `output_text` / `text` parts (joined with newlines;
  a `refusal` part counts as its text); `input_image` parts (`image_url`: a data URL, or an http(s)
  URL where the operator allows it) become the message's images; other part types (files, audio) are a 400;
* `function_call` {call_id, name, arguments}: a tool call of an assistant turn (it joins the
  assistant message right before it, so a replayed `response.output` stays one turn);
* `function_call_output` {call_id, output}: a `tool` message (its `name` looked up from the call);
* `reasoning` items (replayed output): their text becomes the next assistant turn's reasoning;
* anything else (`item_reference`, built-in tool calls, ...) is a 400.

`temperature` and `top_p` default to 1.0 (OpenAI's defaults), sent to the engine and reported as used.
`instructions` becomes the first, system message; `max_output_tokens` is the token limit;
`reasoning.effort` turns thinking off (`none`) or on (any other value); `include:
["message.output_text.logprobs"]` (with `top_logprobs`) asks for logprobs. `previous_response_id` and
`conversation` are a 400: this server keeps no responses, so the whole conversation has to be sent in `input`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from skulk_api_control import requests_common
from skulk_kernel.api import ChatMessage, TextGenerationParams, ToolCall, ToolSpec

from .requests import (
    RequestError,
    _arguments,
    _In,
    _validate,
    image_source,
    sampling_params,
    validation_error,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
DEFAULT_TEMPERATURE = 1.0  # OpenAI's defaults for a Responses request that sets neither
DEFAULT_TOP_P = 1.0
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class ReasoningIn(_In):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequestIn(_In):
    model: str = Field(min_length=1)
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning: ReasoningIn | None = None
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    # the same extras the Chat adapter accepts
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = None
    enable_thinking: bool | None = None
    text: dict[str, Any] | None = None


class _Part(_In):
    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: str | dict[str, Any] | None = None  # input_image: a data URL or an http(s) URL
    file_id: str | None = None


class _MessageItem(_In):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[_Part]


class _FunctionCallItem(_In):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] | None = None


class _FunctionCallOutputItem(_In):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[_Part]


class _ReasoningText(_In):
    type: str | None = None
    text: str | None = None


class _ReasoningItem(_In):
    type: Literal["reasoning"]
    summary: list[_ReasoningText] | None = None
    content: list[_ReasoningText] | None = None


class _FunctionToolIn(_In):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request: the kernel params plus what the response object echoes back."""

    params: TextGenerationParams
    model: str
    stream: bool
    instructions: str | None
    tools: tuple[dict[str, Any], ...]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    max_output_tokens: int | None
    max_tool_calls: int | None
    temperature: float | None
    top_p: float | None
    logprobs: bool
    top_logprobs: int
    reasoning: dict[str, Any]
    metadata: dict[str, str]
    presence_penalty: float
    frequency_penalty: float
    text_format: dict[str, Any] | None = None  # echoed as `text.format` (None: `{"type": "text"}`)


def _item(model: type[BaseModel], data: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        err = validation_error(exc)
        param = f"{where}.{err.param}" if err.param else where
        message = err.message if not err.param else err.message.removeprefix(f"{err.param}: ")
        raise RequestError(f"{param}: {message}", param=param) from None


def _parts_images(parts: str | list[_Part], where: str) -> tuple[str, ...]:
    """The `input_image` parts' images, as they came (api-control's vision module reads them)."""
    if isinstance(parts, str):
        return ()
    images = []
    for j, part in enumerate(parts):
        if part.type == "input_image":
            if part.file_id is not None and part.image_url is None:
                raise RequestError(
                    f"{where}[{j}].file_id: this server keeps no files; send the image as image_url (a data URL)",
                    param=f"{where}[{j}].file_id",
                )
            images.append(image_source(part, f"{where}[{j}]"))
    return tuple(images)


def _parts_text(parts: str | list[_Part], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts: list[str] = []
    for j, part in enumerate(parts):
        if part.type in TEXT_PARTS and part.text is not None:
            texts.append(part.text)
        elif part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        elif part.type == "input_image":
            continue  # read by _parts_images
        elif part.type in TEXT_PARTS or part.type == "refusal":
            field = "refusal" if part.type == "refusal" else "text"
            raise RequestError(
                f"{where}[{j}].{field}: a {part.type} part needs `{field}`", param=f"{where}[{j}].{field}"
            )
        else:
            raise RequestError(
                f"{where}[{j}]: content parts of type {part.type!r} are not supported by this server; "
                'send text parts ({"type": "input_text", "text": ...})',
                param=f"{where}[{j}].type",
                code="unsupported_content",
            )
    return "\n".join(texts)


def _input_messages(value: str | list[Any] | None) -> list[ChatMessage]:
    if value is None:
        raise RequestError("input: required (a string or a list of input items)", param="input")
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    if not value:
        raise RequestError("input: the list is empty; send at least one item", param="input")
    messages: list[ChatMessage] = []
    call_names: dict[str, str] = {}
    reasoning: list[str] = []
    joinable = False  # the last message is an assistant turn that later function_call items join
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        if isinstance(raw, str):  # lenient: a bare string item is a user message
            messages.append(ChatMessage(role="user", content=raw))
            joinable = False
            continue
        if not isinstance(raw, dict):
            raise RequestError(f"{where}: must be an object, not {type(raw).__name__}", param=where)
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind == "message":
            msg: _MessageItem = _item(_MessageItem, raw, where)
            text = _parts_text(msg.content, f"{where}.content")
            if msg.role == "assistant":
                messages.append(
                    ChatMessage(role="assistant", content=text, reasoning_content="".join(reasoning) or None)
                )
                reasoning = []
                joinable = True
            else:
                images = _parts_images(msg.content, f"{where}.content")
                if images and msg.role != "user":
                    raise RequestError(f"{where}.content: only user messages carry images", param=f"{where}.content")
                messages.append(ChatMessage(role=msg.role, content=text, images=images))
                joinable = False
        elif kind == "function_call":
            fc: _FunctionCallItem = _item(_FunctionCallItem, raw, where)
            call = ToolCall(id=fc.call_id, name=fc.name, arguments=_arguments(fc.arguments))
            call_names[fc.call_id] = fc.name
            if joinable and messages:
                last = messages[-1]
                messages[-1] = last.model_copy(update={"tool_calls": (*last.tool_calls, call)})
            else:
                messages.append(
                    ChatMessage(
                        role="assistant",
                        content=None,
                        reasoning_content="".join(reasoning) or None,
                        tool_calls=(call,),
                    )
                )
                reasoning = []
                joinable = True
        elif kind == "function_call_output":
            out: _FunctionCallOutputItem = _item(_FunctionCallOutputItem, raw, where)
            messages.append(
                ChatMessage(
                    role="tool",
                    content=_parts_text(out.output, f"{where}.output"),
                    tool_call_id=out.call_id,
                    name=call_names.get(out.call_id),
                )
            )
            joinable = False
        elif kind == "reasoning":
            item: _ReasoningItem = _item(_ReasoningItem, raw, where)
            parts = item.content or item.summary or []
            reasoning.extend(p.text for p in parts if p.text)
        elif kind is None:
            raise RequestError(f"{where}: an item needs a `type` (or a `role` for a message)", param=where)
        else:
            raise RequestError(
                f"{where}.type: input items of type {kind!r} are not supported by this server; send "
                "messages, function_call and function_call_output items",
                param=f"{where}.type",
                code="unsupported_input",
            )
    if not messages:
        raise RequestError("input: no message in the input", param="input")
    return messages


def _tools(raw: list[dict[str, Any]] | None) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    specs: list[ToolSpec] = []
    echoed: list[dict[str, Any]] = []
    for i, tool in enumerate(raw or ()):
        kind = tool.get("type")
        if kind != "function":
            raise RequestError(
                f"tools[{i}].type: only function tools are supported, not {kind!r}",
                param=f"tools[{i}].type",
                code="unsupported_tool",
            )
        fn: _FunctionToolIn = _item(_FunctionToolIn, tool, f"tools[{i}]")
        specs.append(ToolSpec(name=fn.name, description=fn.description or "", parameters=fn.parameters or {}))
        echoed.append(
            {
                "type": "function",
                "name": fn.name,
                "description": fn.description,
                "parameters": fn.parameters,
                "strict": fn.strict if fn.strict is not None else False,
            }
        )
    return specs, echoed


def _tool_choice(choice: str | dict[str, Any] | None, tools: list[ToolSpec]) -> tuple[str | None, Any]:
    """(what the kernel gets, what the response echoes)."""
    if choice is None:
        return None, "auto"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestError(
                f"tool_choice: {choice!r} is not one of 'none', 'auto', 'required' or "
                '{"type": "function", "name": ...}',
                param="tool_choice",
            )
        return choice, choice
    name = choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError(
            'tool_choice: only "none", "auto", "required" or {"type": "function", "name": ...} are supported',
            param="tool_choice",
        )
    if name not in {t.name for t in tools}:
        raise RequestError(f"tool_choice: no tool named {name!r} in `tools`", param="tool_choice")
    return name, {"type": "function", "name": name}


def _thinking(req: ResponsesRequestIn) -> bool | None:
    if req.enable_thinking is not None:
        return req.enable_thinking
    if req.reasoning is not None and req.reasoning.effort is not None:
        return req.reasoning.effort.lower() not in ("none", "off", "disabled")
    return None


def parse_responses_request(data: dict[str, Any]) -> ResponsesRequest:
    req: ResponsesRequestIn = _validate(ResponsesRequestIn, data)
    if req.previous_response_id is not None:
        raise RequestError(
            "previous_response_id: this server does not store responses; send the whole conversation "
            "in `input` (earlier output items may be passed back as they are)",
            param="previous_response_id",
            code="unsupported_parameter",
        )
    if req.conversation is not None:
        raise RequestError(
            "conversation: this server does not store conversations; send the whole conversation in `input`",
            param="conversation",
            code="unsupported_parameter",
        )
    if req.background:
        raise RequestError(
            "background: background responses are not supported by this server",
            param="background",
            code="unsupported_parameter",
        )
    messages = _input_messages(req.input)
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    specs, echoed = _tools(req.tools)
    kernel_choice, echoed_choice = _tool_choice(req.tool_choice, specs)
    logprobs = LOGPROBS_INCLUDE in (req.include or ())
    # The response reports the values used, so the API's documented defaults are sent, not left to
    # the engine's own (llama.cpp's would be 0.8 / 0.95).
    temperature = req.temperature if req.temperature is not None else DEFAULT_TEMPERATURE
    top_p = req.top_p if req.top_p is not None else DEFAULT_TOP_P
    try:
        params = TextGenerationParams(
            model_id=req.model,
            messages=tuple(messages),
            tools=tuple(specs),
            tool_choice=kernel_choice,
            sampling=sampling_params(req, req.max_output_tokens).model_copy(
                update={"temperature": temperature, "top_p": top_p}
            ),
            logprobs=logprobs,
            top_logprobs=(req.top_logprobs or 0) if logprobs else 0,
            enable_thinking=_thinking(req),
        )
    except ValidationError as exc:
        raise validation_error(exc) from None
    text_format = (req.text or {}).get("format")
    try:
        params = requests_common.constrain(params, text_format, "text.format")
    except requests_common.ConstraintError as exc:
        raise RequestError(str(exc), param="text.format", code="unsupported_schema") from None
    reasoning: dict[str, Any] = {"effort": None, "summary": None}
    if req.reasoning is not None:
        reasoning = {"effort": req.reasoning.effort, "summary": req.reasoning.summary}
    return ResponsesRequest(
        params=params,
        model=req.model,
        stream=bool(req.stream),
        instructions=req.instructions,
        tools=tuple(echoed),
        tool_choice=echoed_choice,
        parallel_tool_calls=req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        max_output_tokens=req.max_output_tokens,
        max_tool_calls=req.max_tool_calls,
        temperature=temperature,
        top_p=top_p,
        logprobs=logprobs,
        top_logprobs=req.top_logprobs or 0,
        reasoning=reasoning,
        metadata=dict(req.metadata or {}),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        text_format=text_format if isinstance(text_format, dict) else None,
    )
