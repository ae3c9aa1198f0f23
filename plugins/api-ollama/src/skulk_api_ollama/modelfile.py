"""Ollama's Modelfile: read (`/api/create`'s legacy `modelfile` text) and written back (`/api/show`).

The instructions Skulk honours are FROM, PARAMETER, TEMPLATE, SYSTEM, LICENSE and MESSAGE; ADAPTER is
refused (no LoRA support), anything else is an error that names the line. Values are a bare rest of
line, a `"quoted string"` or a `\"\"\"triple-quoted\"\"\"` block over several lines, as Ollama's parser
takes them. PARAMETER values become numbers where they read as numbers; `stop` may repeat and
collects a list, as in Ollama.
"""

from __future__ import annotations

import json
from typing import Any

from skulk_kernel.api import ModelCard

INSTRUCTIONS = ("from", "parameter", "template", "system", "license", "message", "adapter", "requires")


class ModelfileError(ValueError):
    pass


def _value(text: str, lines: list[str], i: int) -> tuple[str, int]:
    """The value starting at `text` on line `i`; returns it and the index of the line after it."""
    text = text.strip()
    if text.startswith('"""'):
        rest = text[3:]
        if '"""' in rest:
            return rest[: rest.index('"""')], i + 1
        parts = [rest]
        for j in range(i + 1, len(lines)):
            if '"""' in lines[j]:
                parts.append(lines[j][: lines[j].index('"""')])
                return "\n".join(parts), j + 1
            parts.append(lines[j])
        raise ModelfileError(f'line {i + 1}: a """ block is never closed')
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1], i + 1
    return text, i + 1


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def parse_modelfile(text: str) -> dict[str, Any]:
    """`{from, template, system, license, parameters, messages}` of the instructions present."""
    out: dict[str, Any] = {}
    params: dict[str, Any] = {}
    messages: list[dict[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        word, _, rest = line.partition(" ")
        kind = word.lower()
        if kind not in INSTRUCTIONS:
            raise ModelfileError(f"line {i + 1}: unknown instruction {word!r} (FROM, PARAMETER, TEMPLATE, SYSTEM, ...)")
        if kind == "adapter":
            raise ModelfileError(f"line {i + 1}: ADAPTER is not supported (merge the LoRA adapter into the GGUF)")
        if kind in ("parameter", "message"):
            key, _, rest = rest.strip().partition(" ")
            value, i = _value(rest, lines, i)
            if not key or not value:
                raise ModelfileError(f"line {i}: {word.upper()} needs a name and a value")
            if kind == "message":
                messages.append({"role": key, "content": value})
            elif key == "stop":
                params.setdefault("stop", []).append(value)
            else:
                params[key] = _number(value)
            continue
        value, i = _value(rest, lines, i)
        if kind != "requires":
            out[kind] = value
    if params:
        out["parameters"] = params
    if messages:
        out["messages"] = messages
    return out


def render_parameters(params: dict[str, Any]) -> str:
    """Ollama's `/api/show` `parameters`: one `name value` line each (a list, one line per item)."""
    rows = []
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            rows.append(f"{key:<30} {json.dumps(item) if isinstance(item, str) else item}")
    return "\n".join(rows)


def render_modelfile(model_id: str, section: dict[str, Any]) -> str:
    """A Modelfile that would create this model again (as `ollama show --modelfile` prints)."""
    rows = ["# Served by Skulk", f"FROM {section.get('parent') or model_id}"]
    if section.get("template"):
        rows.append(f'TEMPLATE """{section["template"]}"""')
    if section.get("system"):
        rows.append(f'SYSTEM """{section["system"]}"""')
    for line in render_parameters(section.get("parameters") or {}).splitlines():
        rows.append(f"PARAMETER {line}")
    for message in section.get("messages") or []:
        rows.append(f'MESSAGE {message.get("role", "user")} """{message.get("content", "")}"""')
    if section.get("license"):
        text = section["license"]
        rows.append(f'LICENSE """{chr(10).join(text) if isinstance(text, list) else text}"""')
    return "\n".join(rows) + "\n"


def with_modelfile(data: dict[str, Any], section: dict[str, Any]) -> dict[str, Any]:
    """A chat or generate body with a created model's defaults: its PARAMETERs under the request's
    own `options`, its SYSTEM when the request has none, its MESSAGEs before the conversation.

    TEMPLATE is reported by `/api/show` but not applied: engines render the GGUF's own chat template.
    """
    if not section:
        return data
    out = dict(data)
    options = data.get("options")
    if section.get("parameters") and (options is None or isinstance(options, dict)):
        out["options"] = {**section["parameters"], **(options or {})}
    system = section.get("system")
    messages = data.get("messages")
    if isinstance(messages, list) and messages:  # chat (an empty list is a load request: left as is)
        has_system = any(isinstance(m, dict) and m.get("role") == "system" for m in messages)
        preset = list(section.get("messages") or [])
        lead = [{"role": "system", "content": system}] if system and not has_system else []
        out["messages"] = [*lead, *preset, *messages]
    elif system and data.get("prompt") and not data.get("system"):
        out["system"] = system
    return out


def ollama_section(card: ModelCard | None) -> dict[str, Any]:
    """A created model's `[ollama]` section (template, system, parameters, license, messages), else {}."""
    return dict(card.sections.get("ollama", {})) if card is not None else {}


def show_fields(card: ModelCard | None, model_id: str) -> dict[str, Any]:
    """What `/api/show` reports from a card's `[ollama]` section (empty strings for other models)."""
    section = ollama_section(card)
    license_text = section.get("license") or ""
    return {
        "modelfile": render_modelfile(model_id, section),
        "parameters": render_parameters(section.get("parameters") or {}),
        "template": section.get("template") or "",
        "system": section.get("system") or "",
        "license": "\n".join(license_text) if isinstance(license_text, list) else license_text,
    } | ({"messages": section["messages"]} if section.get("messages") else {})
