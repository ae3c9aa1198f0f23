"""Chat templates: reading the GGUF's own, and a tool-capable ChatML stand-in.

Why: a GGUF's template decides whether a model can see tools at all. SmolLM2's template has no
``tools`` handling (llama.cpp then silently drops them) and breaks on assistant messages that
carry ``tool_calls`` (``content`` is None). For ChatML models like that we substitute
:func:`chatml_tools_template`, which renders tools Hermes-style (``<tool_call>{json}</tool_call>``,
the form :mod:`.toolcalls` parses and llama.cpp's autoparser recognises), assistant tool calls
and ``tool`` results, and otherwise produces exactly the original prompt (same default system
prompt), so prompt caches and behaviour without tools are unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# The literal may hold a real newline or a Jinja "\n" escape, depending on the converter.
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.*?)<\|im_end\|>", re.DOTALL)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | Path, keys: tuple[str, ...]) -> dict[str, object]:
    """Read scalar/string metadata values from a GGUF header without loading the model.

    A small hand-rolled reader on purpose: ``gguf.GGUFReader`` materialises every field,
    including the 49k-entry token and merge arrays, and takes ~5 s on SmolLM2; this skips
    arrays and takes milliseconds. Arrays are not returned.
    """
    import struct

    wanted = set(keys)
    out: dict[str, object] = {}
    with open(path, "rb") as f:

        def unpack(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(size))[0]

        def read_str() -> bytes:
            return f.read(int(unpack("<Q")))

        def skip(vtype: int) -> None:
            if vtype in _SCALARS:
                f.seek(struct.calcsize(_SCALARS[vtype]), 1)
            elif vtype == _STRING:
                f.seek(int(unpack("<Q")), 1)
            elif vtype == _ARRAY:
                etype, count = int(unpack("<I")), int(unpack("<Q"))
                if etype in _SCALARS:
                    f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)
                else:
                    for _ in range(count):
                        skip(etype)
            else:
                raise ValueError(f"bad GGUF value type {vtype}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        unpack("<Q")  # tensor count
        n_kv = int(unpack("<Q"))
        for _ in range(n_kv):
            key = read_str().decode("utf-8")
            vtype = int(unpack("<I"))
            if key in wanted and vtype in _SCALARS:
                out[key] = unpack(_SCALARS[vtype])
            elif key in wanted and vtype == _STRING:
                out[key] = read_str().decode("utf-8")
            else:
                skip(vtype)
            if len(out) == len(wanted):
                break
    return out


def read_gguf_chat_template(path: str | Path) -> str | None:
    value = read_gguf_metadata(path, ("tokenizer.chat_template",)).get("tokenizer.chat_template")
    return value if isinstance(value, str) and value else None


def template_supports_tools(template: str | None) -> bool:
    """Heuristic used by llama.cpp too: a template that never mentions tools cannot show them."""
    return bool(template) and "tools" in template  # type: ignore[operator]


def is_chatml(template: str | None) -> bool:
    return bool(template) and "<|im_start|>" in template  # type: ignore[operator]


def default_system_prompt(template: str | None) -> str | None:
    """The system prompt a ChatML template injects when the conversation has none."""
    if not template:
        return None
    m = _DEFAULT_SYSTEM.search(template)
    return m.group(1).replace("\\n", "\n") if m else None


def chatml_tools_template(default_system: str | None = None) -> str:
    """A Jinja ChatML template with Hermes-style tools, written for this project.

    With no tools and no system message it reproduces SmolLM2's prompt exactly when
    ``default_system`` is SmolLM2's default system prompt.
    """
    default_lit = json.dumps(default_system) if default_system is not None else "none"
    return (
        "{%- set default_system = " + default_lit + " -%}\n"
        "{%- if messages and messages[0]['role'] == 'system' -%}\n"
        "{%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}\n"
        "{%- else -%}\n"
        "{%- set system_text = default_system -%}{%- set rest = messages -%}\n"
        "{%- endif -%}\n"
        "{%- if system_text is not none or tools -%}\n"
        "{{- '<|im_start|>system\\n' + (system_text if system_text is not none else '') -}}\n"
        "{%- if tools -%}\n"
        "{{- '\\n\\nYou may call one or more functions to help with the request. The functions"
        " are described by these JSON schemas:\\n<tools>\\n' -}}\n"
        "{%- for tool in tools -%}{{- (tool['function'] if tool['function'] is defined else tool)"
        " | tojson -}}{{- '\\n' -}}{%- endfor -%}\n"
        "{{- '</tools>\\nTo call a function, answer with a JSON object inside"
        ' <tool_call></tool_call> tags, like this:\\n<tool_call>\\n{"name": "function_name",'
        ' "arguments": {"arg": "value"}}\\n</tool_call>\' -}}\n'
        "{%- endif -%}\n"
        "{{- '<|im_end|>\\n' -}}\n"
        "{%- endif -%}\n"
        "{%- for message in rest -%}\n"
        "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined"
        " and message['tool_calls'] -%}\n"
        "{{- '<|im_start|>assistant\\n' -}}\n"
        "{%- if message['content'] -%}{{- message['content'] + '\\n' -}}{%- endif -%}\n"
        "{%- for call in message['tool_calls'] -%}\n"
        "{%- set fn = call['function'] if call['function'] is defined else call -%}\n"
        "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}\n"
        "{%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}"
        "{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}\n"
        "{{- '}\\n</tool_call>' -}}{%- if not loop.last -%}{{- '\\n' -}}{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{{- '<|im_end|>\\n' -}}\n"
        "{%- elif message['role'] == 'tool' -%}\n"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content']"
        " + '\\n</tool_response><|im_end|>\\n' -}}\n"
        "{%- else -%}\n"
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content']"
        " is string else '') + '<|im_end|>\\n' -}}\n"
        "{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
    )


def render(
    template: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    **extra: object,
) -> str:
    """Render a chat template with jinja2 (for the in-process backend; the server renders its own)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined)
    # jinja2's own tojson HTML-escapes <, >, & and sorts keys; llama.cpp's does neither.
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra
    )
