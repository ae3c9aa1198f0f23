"""Ollama request bodies -> the kernel's TextGenerationParams / EmbeddingParams.

Bodies are parsed here, not by FastAPI, so every caller mistake is a 400 `{"error": "text"}` (what
the `ollama` clients turn into `ResponseError`). Unknown fields and unknown `options` are ignored, as
Ollama does; known ones are type-checked.

Mapping:

* `/api/chat` messages: `system` / `user` / `assistant` / `tool`; assistant `thinking` ->
  reasoning_content; assistant `tool_calls[].function.arguments` (an object, or a JSON string) ->
  ToolCall with JSON-string arguments and an id (`call_<message>_<k>` when the client sent none);
  `tool` messages get `name` from `tool_name` and `tool_call_id` from `tool_call_id`, or else from the
  earliest unanswered call of the previous assistant message (with that name, when given). `images`
  (base64, on user messages and on /api/generate) become the message's images, decoded and checked
  by api-control's vision module (a model without vision is a 400 naming it).
* `/api/generate`: `raw: true` -> `raw_prompt` (the prompt as is; `system` and the template are not
  applied, as in Ollama); otherwise an optional `system` message and the `prompt` as a user message.
* `options`: temperature, top_p, top_k (<= 0: off), min_p, seed, num_predict (<= 0: no limit ->
  engine default), stop (string or list), repeat_penalty -> repetition_penalty, presence_penalty,
  frequency_penalty. Others (num_ctx, num_gpu, mirostat, ...) are accepted and ignored.
* `think`: true or a level (`low` / `medium` / `high`) -> enable_thinking True, false -> False.
* `format`: `"json"` -> a JSON-object constraint, a JSON schema object -> that schema (the engine
  decodes under a grammar, see `skulk_api_control.requests_common.constrain`); `keep_alive`
  ("2s", "5m", seconds; 0 unloads, -1 keeps) sets how long an instance placed on demand stays idle
  (routes.keep_alive, `skulk_api_control.on_demand`).
* `/api/generate` `context` (what an earlier answer returned, see `context.py`) puts the earlier turns
  before the new prompt.
* `"tools": []` (what the Python client always sends) means no tools; `tool_choice` (an extension,
  OpenAI's spelling: `required` or a tool's name) forces a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from skulk_api_control import requests_common
from skulk_kernel.api import ChatMessage, EmbeddingParams, SamplingParams, TextGenerationParams, ToolCall, ToolSpec

from . import context


class RequestError(requests_common.RequestError):
    """A caller mistake: `{"error": message}` with `status`."""

    empty_body = "missing request body"
    invalid_json = "invalid JSON in the request body: {}"


def parse_json_object(body: bytes) -> dict[str, Any]:
    return requests_common.parse_json_object(body, RequestError)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _str(data: dict[str, Any], key: str, where: str = "") -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise RequestError(f"{where}{key}: must be a string, not {_type_name(value)}")


def _bool(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise RequestError(f"{key}: must be true or false, not {_type_name(value)}")


def _number(options: dict[str, Any], key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"options.{key}: must be a number, not {_type_name(value)}")
    return float(value)


def _int(options: dict[str, Any], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"options.{key}: must be an integer, not {_type_name(value)}")
    return value


def model_name(data: dict[str, Any], *keys: str) -> str:
    for key in keys or ("model",):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
        if value is not None and not isinstance(value, str):
            raise RequestError(f"{key}: must be a string, not {_type_name(value)}")
    raise RequestError("model is required")


def sampling(data: dict[str, Any]) -> SamplingParams:
    options = data.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise RequestError(f"options: must be an object, not {_type_name(options)}")
    stop = options.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise RequestError("options.stop: must be a string or a list of strings")
    top_k = _int(options, "top_k")
    num_predict = _int(options, "num_predict")
    try:
        return SamplingParams(
            temperature=_number(options, "temperature"),
            top_p=_number(options, "top_p"),
            top_k=top_k if top_k is not None and top_k > 0 else None,
            min_p=_number(options, "min_p"),
            seed=_int(options, "seed"),
            repetition_penalty=_number(options, "repeat_penalty"),
            presence_penalty=_number(options, "presence_penalty"),
            frequency_penalty=_number(options, "frequency_penalty"),
            max_tokens=num_predict if num_predict is not None and num_predict > 0 else None,
            stop=tuple(s for s in stops if s),
            max_tokens_is_ceiling=True,  # Ollama stops at the context's end rather than refuse
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = {"repetition_penalty": "repeat_penalty"}.get(str(first["loc"][0]), str(first["loc"][0]))
        raise RequestError(f"options.{key}: {first['msg']}") from None


def thinking(data: dict[str, Any]) -> bool | None:
    think = data.get("think")
    if think is None or isinstance(think, bool):
        return think
    if isinstance(think, str) and think.lower() in ("low", "medium", "high"):
        return True
    raise RequestError(f"think: must be true, false, 'low', 'medium' or 'high', not {think!r}")


def _tools(data: dict[str, Any]) -> tuple[ToolSpec, ...]:
    tools = data.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise RequestError(f"tools: must be a list, not {_type_name(tools)}")
    specs = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{i}]: must be an object")
        if tool.get("type", "function") != "function":
            raise RequestError(f"tools[{i}].type: only function tools are supported, not {tool.get('type')!r}")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{i}].function.name: required")
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise RequestError(f"tools[{i}].function.parameters: must be an object")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise RequestError(f"tools[{i}].function.description: must be a string")
        specs.append(ToolSpec(name=function["name"], description=description, parameters=parameters))
    return tuple(specs)


def _content(msg: dict[str, Any], where: str) -> str | None:
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return content
    raise RequestError(f"{where}.content: must be a string, not {_type_name(content)}")


def _tool_calls(msg: dict[str, Any], where: str, index: int) -> tuple[ToolCall, ...]:
    raw = msg.get("tool_calls")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError(f"{where}.tool_calls: must be a list")
    calls = []
    for k, entry in enumerate(raw):
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}.tool_calls[{k}].function.name: required")
        args = function.get("arguments")
        if args is None:
            arguments = "{}"
        elif isinstance(args, dict):
            arguments = json.dumps(args)
        elif isinstance(args, str):
            arguments = args
        else:
            raise RequestError(f"{where}.tool_calls[{k}].function.arguments: must be an object")
        call_id = entry.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{index}_{k}"
        calls.append(ToolCall(id=call_id, name=function["name"], arguments=arguments))
    return tuple(calls)


def chat_messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list):
        raise RequestError(f"messages: must be a list, not {_type_name(raw)}")
    out: list[ChatMessage] = []
    unanswered: list[ToolCall] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where}: must be an object")
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role: must be 'system', 'user', 'assistant' or 'tool', not {role!r}")
        images = _images(msg, f"{where}.")
        if images and role != "user":
            raise RequestError(f"{where}.images: only user messages carry images")
        content = _content(msg, where)
        if role == "assistant":
            calls = _tool_calls(msg, where, i)
            unanswered = list(calls)
            out.append(
                ChatMessage(
                    role="assistant",
                    content=content if (content or not calls) else None,
                    reasoning_content=_str(msg, "thinking", f"{where}.") or None,
                    tool_calls=calls,
                )
            )
        elif role == "tool":
            name = _str(msg, "tool_name", f"{where}.") or _str(msg, "name", f"{where}.")
            call_id = _str(msg, "tool_call_id", f"{where}.")
            match = next((c for c in unanswered if c.id == call_id), None) if call_id else None
            if match is None and call_id is None:
                match = next((c for c in unanswered if name is None or c.name == name), None)
            if match is not None:
                unanswered.remove(match)
                call_id = call_id or match.id
                name = name or match.name
            out.append(ChatMessage(role="tool", content=content or "", tool_call_id=call_id, name=name))
        else:
            out.append(ChatMessage(role=role, content=content or "", images=images))
    return tuple(out)


def _images(data: dict[str, Any], where: str = "") -> tuple[str, ...]:
    """`images`: base64 strings as Ollama's clients send them; api-control's vision module decodes
    and checks them once the model is known (a data URL is taken too)."""
    raw = data.get("images")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        raise RequestError(f"{where}images: must be a list of base64-encoded images")
    return tuple(raw)


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    params: TextGenerationParams | None  # None: a load request (no messages / empty prompt)
    stream: bool
    #: /api/generate: the conversation up to the answer, which the answer's `context` encodes
    turns: tuple[tuple[str, str], ...] = ()


def tool_choice(data: dict[str, Any], tools: tuple[ToolSpec, ...]) -> str | None:
    """An extension (Ollama itself has none): `tool_choice` as OpenAI spells it, to force a call."""
    value = data.get("tool_choice")
    if value is None or not tools:
        return None
    if isinstance(value, dict):
        value = (value.get("function") or {}).get("name") or value.get("name")
    if not isinstance(value, str) or not value:
        raise RequestError('tool_choice: must be "none", "auto", "required" or a tool\'s name')
    if value not in ("none", "auto", "required") and value not in {t.name for t in tools}:
        raise RequestError(f"tool_choice: no tool named {value!r} in `tools`")
    return value


def response_format(data: dict[str, Any]) -> dict[str, Any] | None:
    """Ollama's `format` as an OpenAI-style response_format (None: free text)."""
    value = data.get("format")
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value, "strict": True}}
    raise RequestError(f'format: must be "json" or a JSON schema object, not {json.dumps(value)[:80]}')


def _stream(data: dict[str, Any]) -> bool:
    value = _bool(data, "stream")
    return True if value is None else value  # Ollama streams unless told otherwise


def _params(
    model: str,
    messages: tuple[ChatMessage, ...],
    data: dict[str, Any],
    tools: tuple[ToolSpec, ...] = (),
    raw_prompt: str | None = None,
) -> TextGenerationParams:
    try:
        params = TextGenerationParams(
            model_id=model,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice(data, tools),
            sampling=sampling(data),
            enable_thinking=thinking(data),
            raw_prompt=raw_prompt,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise RequestError(f"{'.'.join(str(p) for p in first['loc']) or 'body'}: {first['msg']}") from None
    try:
        return requests_common.constrain(params, response_format(data))
    except requests_common.ConstraintError as exc:
        raise RequestError(f"format: {exc}") from None


def parse_chat(data: dict[str, Any]) -> GenerationRequest:
    model = model_name(data)
    stream = _stream(data)
    raw = data.get("messages")
    if raw is None or raw == []:
        sampling(data)
        return GenerationRequest(model=model, params=None, stream=stream)
    messages = chat_messages(raw)
    return GenerationRequest(model=model, params=_params(model, messages, data, _tools(data)), stream=stream)


def parse_generate(data: dict[str, Any]) -> GenerationRequest:
    model = model_name(data)
    stream = _stream(data)
    prompt = _str(data, "prompt")
    system = _str(data, "system")
    raw = _bool(data, "raw")
    images = _images(data)
    if images and raw:
        raise RequestError("images: a raw prompt cannot carry images (the model's template places them); drop raw")
    if not prompt:
        sampling(data)
        return GenerationRequest(model=model, params=None, stream=stream)
    try:
        earlier = context.decode(data["context"]) if data.get("context") is not None else []
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if raw:
        full = "".join(t for _, t in earlier) + prompt
        messages: tuple[ChatMessage, ...] = (ChatMessage(role="user", content=full),)
        params = _params(model, messages, data, raw_prompt=full)
        return GenerationRequest(model=model, params=params, stream=stream, turns=(("raw", full),))
    history = tuple(ChatMessage(role="user" if r == "raw" else r, content=t) for r, t in earlier if r != "system")
    head = (ChatMessage(role="system", content=system),) if system else ()
    messages = head + history + (ChatMessage(role="user", content=prompt, images=images),)
    params = _params(model, messages, data)
    return GenerationRequest(
        model=model, params=params, stream=stream, turns=tuple(context.turns_of(messages[len(head) :], None))
    )


def parse_embed(data: dict[str, Any]) -> tuple[str, EmbeddingParams]:
    model = model_name(data)
    value = data.get("input")
    if isinstance(value, str):
        inputs = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        inputs = value
    elif value is None:
        raise RequestError("input: required (a string or a list of strings)")
    else:
        raise RequestError("input: must be a string or a list of strings")
    if not inputs or any(not v for v in inputs):
        raise RequestError("input: cannot embed empty input")
    return model, EmbeddingParams(model_id=model, inputs=tuple(inputs))


def parse_embeddings(data: dict[str, Any]) -> tuple[str, str]:
    """The legacy `/api/embeddings`: one `prompt` (empty gives an empty embedding, as Ollama does)."""
    model = model_name(data)
    return model, _str(data, "prompt") or ""
