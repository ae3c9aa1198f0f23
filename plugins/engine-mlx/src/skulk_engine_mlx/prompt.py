"""Rendering the conversation into a prompt with the tokenizer's chat template, and counting it.

Why a fallback: SmolLM2's template knows nothing of tools (and breaks on assistant messages
that carry tool calls), so with tools, or tool traffic in the history, a ChatML template that
does not mention tools is replaced by :func:`chatml_with_tools`, which renders Hermes-style
``<tool_call>`` instructions and otherwise the same ChatML turns (same default system prompt).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from skulk_kernel.api import TextGenerationParams

_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", re.DOTALL)


class ChatTokenizer(Protocol):
    """The part of mlx-lm's TokenizerWrapper (a transformers tokenizer) this module uses."""

    chat_template: str | None
    bos_token: str | None

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


def template_messages(params: TextGenerationParams) -> list[dict[str, Any]]:
    return [m.template_dict(with_reasoning=True) for m in params.messages]


def template_tools(params: TextGenerationParams) -> list[dict[str, Any]] | None:
    if not params.tools or params.tool_choice == "none":
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters or {"type": "object", "properties": {}},
            },
        }
        for t in params.tools
    ]


def chatml_with_tools(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, default_system: str | None
) -> str:
    """ChatML with Hermes-style tools, written for this project (see the module docstring)."""
    parts: list[str] = []
    system = default_system
    rest = messages
    if messages and messages[0]["role"] == "system":
        system, rest = messages[0]["content"], messages[1:]
    if system is not None or tools:
        text = system or ""
        if tools:
            schemas = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
            text += (
                "\n\nYou may call one or more functions to help with the request. The functions are described "
                f"by these JSON schemas:\n<tools>\n{schemas}\n</tools>\nTo call a function, answer with a JSON "
                'object inside <tool_call></tool_call> tags, like this:\n<tool_call>\n{"name": "function_name", '
                '"arguments": {"arg": "value"}}\n</tool_call>'
            )
        parts.append(f"<|im_start|>system\n{text}<|im_end|>\n")
    for m in rest:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                '<tool_call>\n{"name": "'
                + c["function"]["name"]
                + '", "arguments": '
                + (c["function"]["arguments"] or "{}")
                + "}\n</tool_call>"
                for c in m["tool_calls"]
            )
            content = (m["content"] + "\n") if m["content"] else ""
            parts.append(f"<|im_start|>assistant\n{content}{calls}<|im_end|>\n")
        elif m["role"] == "tool":
            parts.append(f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n")
        else:
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _needs_fallback(template: str | None, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    if not template or "<|im_start|>" not in template or "tools" in template:
        return False
    return bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def render_prompt(tokenizer: ChatTokenizer, params: TextGenerationParams) -> str:
    """The prompt text for params: the raw prompt, the model's template, or the tools fallback."""
    if params.raw_prompt is not None:
        return params.raw_prompt
    messages = template_messages(params)
    tools = template_tools(params)
    template = tokenizer.chat_template
    if _needs_fallback(template, messages, tools):
        found = _DEFAULT_SYSTEM.search(template or "")
        default = found.group(1).replace("\\n", "\n") if found else None
        return chatml_with_tools(messages, tools, default)
    if not template:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    extra: dict[str, Any] = {}
    if params.enable_thinking is not None:
        extra["enable_thinking"] = params.enable_thinking
    rendered = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **extra)
    return str(rendered)


def encode_prompt(tokenizer: ChatTokenizer, prompt: str) -> list[int]:
    """Token ids of a rendered prompt; BOS is added only when the template did not write it."""
    bos = tokenizer.bos_token
    add_special = not (bos and prompt.startswith(bos))
    return list(tokenizer.encode(prompt, add_special_tokens=add_special))
