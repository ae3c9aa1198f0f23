"""OpenAI request bodies -> the kernel's TextGenerationParams / EmbeddingParams.

Bodies are parsed here, not by FastAPI, so every caller mistake becomes a 400 in OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`) that names the offending field. The models are
strict about types (a temperature sent as a string is an error, not silently coerced) and ignore
unknown fields, since clients send many extras (`user`, `metadata`, `store`, ...) that do not change
what the engine does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from skulk_api_control import requests_common
from skulk_api_control.requests_common import StrictBody as _In
from skulk_api_control.requests_common import invalid_field, validate
from skulk_kernel.api import ChatMessage, EmbeddingParams, SamplingParams, TextGenerationParams, ToolCall, ToolSpec


class RequestError(requests_common.RequestError):
    """A caller mistake: answered as `status` (4xx) in OpenAI's error shape, with `x-should-retry: false`."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_request",
        status: int = 400,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message, status=status)
        self.param = param
        self.code = code
        self.error_type = error_type

    @classmethod
    def not_json(cls, message: str) -> RequestError:
        return cls(message, code="invalid_json")

    @classmethod
    def too_large(cls, message: str) -> RequestError:
        return cls(message, status=413, code="request_too_large")


def validation_error(exc: ValidationError) -> RequestError:
    """Pydantic's first error; `param` is the field path as OpenAI spells it (`messages[0].content`)."""
    where, message = invalid_field(exc, brackets=True)
    return RequestError(message, param=where or None)


def _validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    return validate(model, data, validation_error)


# --- chat completions ----------------------------------------------------------------------------


class ContentPart(_In):
    type: str
    text: str | None = None
    image_url: str | dict[str, Any] | None = None  # {"url": data URL or http(s), "detail"} (a string in Responses)


class FunctionCallIn(_In):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCallIn(_In):
    id: str | None = None
    type: str | None = "function"
    index: int | None = None
    function: FunctionCallIn


class MessageIn(_In):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefIn(_In):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(_In):
    type: str = "function"
    function: FunctionDefIn


class NamedToolChoiceFunction(_In):
    name: str


class NamedToolChoice(_In):
    type: str = "function"
    function: NamedToolChoiceFunction


class StreamOptionsIn(_In):
    include_usage: bool | None = None


class ChatCompletionRequest(_In):
    model: str = Field(min_length=1)
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptionsIn | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None  # vLLM's and llama.cpp's: exactly max_tokens tokens (benchmarks)
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolIn] | None = None
    tool_choice: str | NamedToolChoice | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat request: the kernel params plus what only the wire encoding needs."""

    params: TextGenerationParams
    model: str
    stream: bool
    include_usage: bool
    logprobs: bool


def image_source(part: Any, where: str) -> str:
    """The image of an `image_url` / `input_image` part as it came (a data URL or an http(s) URL);
    api-control's vision module reads and checks it."""
    url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
    if not isinstance(url, str) or not url:
        raise RequestError(
            f"{where}.image_url: an image part needs a url (a data URL such as data:image/png;base64,... "
            "or an http(s) URL)",
            param=f"{where}.image_url",
        )
    return url


def _content(content: str | list[ContentPart] | None, index: int) -> tuple[str | None, tuple[str, ...]]:
    """A message's text (its text parts joined) and its images, in order."""
    if content is None or isinstance(content, str):
        return content, ()
    texts: list[str] = []
    images: list[str] = []
    for j, part in enumerate(content):
        if part.type in ("image_url", "input_image"):
            images.append(image_source(part, f"messages[{index}].content[{j}]"))
            continue
        if part.type not in ("text", "input_text", "output_text"):
            raise RequestError(
                f"messages[{index}].content[{j}]: content parts of type {part.type!r} are not supported "
                'by this server; send text parts ({"type": "text", "text": ...}) or image_url parts',
                param=f"messages[{index}].content[{j}].type",
                code="unsupported_content",
            )
        if part.text is None:
            raise RequestError(
                f"messages[{index}].content[{j}].text: a text part needs `text`",
                param=f"messages[{index}].content[{j}].text",
            )
        texts.append(part.text)
    return "\n".join(texts), tuple(images)


def _arguments(value: str | dict[str, Any] | None) -> str:
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return value


def _message(msg: MessageIn, index: int) -> ChatMessage:
    content, images = _content(msg.content, index)
    if images and msg.role != "user":
        raise RequestError(
            f"messages[{index}].content: only user messages carry images", param=f"messages[{index}].content"
        )
    if content is None and msg.role in ("user", "system", "developer"):
        raise RequestError(
            f"messages[{index}].content: a {msg.role} message needs content",
            param=f"messages[{index}].content",
        )
    calls: tuple[ToolCall, ...] = ()
    if msg.tool_calls:
        if msg.role != "assistant":
            raise RequestError(
                f"messages[{index}].tool_calls: only assistant messages carry tool calls",
                param=f"messages[{index}].tool_calls",
            )
        calls = tuple(
            ToolCall(
                id=tc.id or f"call_{index}_{k}",
                name=tc.function.name,
                arguments=_arguments(tc.function.arguments),
            )
            for k, tc in enumerate(msg.tool_calls)
        )
    return ChatMessage(
        role=msg.role,
        content=content,
        reasoning_content=msg.reasoning_content if msg.reasoning_content is not None else msg.reasoning,
        tool_calls=calls,
        tool_call_id=msg.tool_call_id,
        name=msg.name,
        images=images,
    )


def _thinking(req: ChatCompletionRequest) -> bool | None:
    if req.enable_thinking is not None:
        return req.enable_thinking
    kwargs = req.chat_template_kwargs or {}
    if isinstance(kwargs.get("enable_thinking"), bool):
        return bool(kwargs["enable_thinking"])
    if req.reasoning_effort is not None:
        return req.reasoning_effort.lower() not in ("none", "off", "disabled")
    return None


def _tool_choice(req: ChatCompletionRequest, tools: tuple[ToolSpec, ...]) -> str | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestError(
                f"tool_choice: {choice!r} is not one of 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        return choice
    if choice.function.name not in {t.name for t in tools}:
        raise RequestError(f"tool_choice: no tool named {choice.function.name!r} in `tools`", param="tool_choice")
    return choice.function.name


def sampling_params(req: Any, max_tokens: int | None) -> SamplingParams:
    """The sampling fields Chat and Responses bodies share (`top_k` <= 0 is off, empty stops dropped).

    Raises ValidationError (the kernel's own limits): callers turn it into a RequestError.
    """
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k if req.top_k is not None and req.top_k > 0 else None,
        min_p=req.min_p,
        seed=req.seed,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        max_tokens=max_tokens,
        stop=tuple(s for s in stops if s),
        ignore_eos=bool(getattr(req, "ignore_eos", None)),  # Responses has no such field
    )


def parse_chat_request(data: dict[str, Any]) -> ChatRequest:
    req: ChatCompletionRequest = _validate(ChatCompletionRequest, data)
    if req.n not in (None, 1):
        raise RequestError("n: only n=1 is supported", param="n", code="unsupported_parameter")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(req.tools or ()):
        if tool.type != "function":
            raise RequestError(
                f"tools[{i}].type: only function tools are supported, not {tool.type!r}",
                param=f"tools[{i}].type",
            )
        tools.append(
            ToolSpec(
                name=tool.function.name,
                description=tool.function.description or "",
                parameters=tool.function.parameters or {},
            )
        )
    messages = tuple(_message(m, i) for i, m in enumerate(req.messages))
    logprobs = bool(req.logprobs)
    try:
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        sampling = sampling_params(req, max_tokens)
        params = TextGenerationParams(
            model_id=req.model,
            messages=messages,
            tools=tuple(tools),
            tool_choice=_tool_choice(req, tuple(tools)),
            sampling=sampling,
            logprobs=logprobs,
            top_logprobs=(req.top_logprobs or 0) if logprobs else 0,
            enable_thinking=_thinking(req),
        )
    except ValidationError as exc:
        raise validation_error(exc) from None
    try:
        params = requests_common.constrain(params, req.response_format)
    except requests_common.ConstraintError as exc:
        raise RequestError(str(exc), param="response_format", code="unsupported_schema") from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return ChatRequest(
        params=params,
        model=req.model,
        stream=bool(req.stream),
        include_usage=include_usage,
        logprobs=logprobs,
    )


# --- embeddings ----------------------------------------------------------------------------------


class EmbeddingsRequestIn(_In):
    model: str = Field(min_length=1)
    input: Any = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class EmbeddingsRequest:
    params: EmbeddingParams
    model: str
    encoding_format: str
    dimensions: int | None


def _embedding_inputs(value: Any) -> tuple[str, ...]:
    token_ids = RequestError(
        "input: token-id arrays are not supported by this server; send the text as a string or a list of strings",
        param="input",
        code="unsupported_input",
    )
    if value is None:
        raise RequestError("input: required (a string or a list of strings)", param="input")
    if isinstance(value, str):
        inputs: list[Any] = [value]
    elif isinstance(value, list):
        inputs = value
    else:
        raise RequestError(f"input: must be a string or a list of strings, not {type(value).__name__}", param="input")
    if not inputs:
        raise RequestError("input: the list is empty; send at least one string", param="input")
    for i, item in enumerate(inputs):
        if isinstance(item, (int, list)) and not isinstance(item, bool):
            raise token_ids
        if not isinstance(item, str):
            raise RequestError(f"input[{i}]: must be a string, not {type(item).__name__}", param="input")
        if not item:
            raise RequestError(f"input[{i}]: empty strings cannot be embedded", param="input")
    return tuple(inputs)


def parse_embeddings_request(data: dict[str, Any]) -> EmbeddingsRequest:
    req: EmbeddingsRequestIn = _validate(EmbeddingsRequestIn, data)
    inputs = _embedding_inputs(req.input)
    return EmbeddingsRequest(
        params=EmbeddingParams(model_id=req.model, inputs=inputs),
        model=req.model,
        encoding_format=req.encoding_format or "float",
        dimensions=req.dimensions,
    )
