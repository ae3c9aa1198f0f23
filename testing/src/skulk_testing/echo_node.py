"""A real node serving the echo engine, as the API adapters' test suites drive it.

The echo engine answers with the prompt itself; `/slow ...` streams it at 50 ms a token and
`/tool NAME {json}` makes it call a tool. `echo_node(folder, models, ...)` writes a profile, starts
`skulk-kernel run` with its home under `folder`, waits for the API and a ready instance of every
model, and stops the node on leaving.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .nodes import NodeProcess, start_node

ECHO = "skulk/echo"
EMBED = "skulk/echo-embed"
WEATHER = '/tool get_weather {"city":"Paris"}'  # the echo engine calls get_weather(city="Paris")
SLOW = "/slow " + " ".join(f"w{i}" for i in range(200))  # 50 ms a token: ~10 s if nobody stops it

# The get_weather tool in the OpenAI Chat Completions shape (Ollama takes the same).
WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CORE_PLUGINS = ["master", "worker", "engine-echo", "api-control"]
ALL_PLUGINS = [*CORE_PLUGINS, "store", "api-openai", "api-anthropic", "api-ollama"]


def write_profile(
    folder: Path,
    default_models: Sequence[str],
    plugins: Sequence[str] = ALL_PLUGINS,
    extra: str = "",
    name: str = "echo-test",
) -> Path:
    """Write `folder/profile.toml`: these plugins, master's default_models, then `extra` TOML as is."""
    path = folder / "profile.toml"
    path.write_text(
        "[profile]\n"
        f"name = {json.dumps(name)}\n"
        f"plugins = {json.dumps(list(plugins))}\n\n"
        "[plugins.master]\n"
        f"default_models = {json.dumps(list(default_models))}\n" + extra
    )
    return path


@contextlib.contextmanager
def echo_node(
    folder: Path,
    default_models: Sequence[str] = (ECHO,),
    plugins: Sequence[str] = ALL_PLUGINS,
    extra: str = "",
    name: str = "echo-test",
    timeout: float = 90,
) -> Iterator[NodeProcess]:
    """A node started from `write_profile(folder, ...)` (home `folder/home`), yielded once its API is
    up and every default model has a ready instance, and stopped on leaving (or if it never gets there)."""
    proc = start_node(str(write_profile(folder, default_models, plugins, extra, name)), home=folder / "home")
    try:
        proc.wait_api(timeout=timeout)
        for model in default_models:
            proc.wait_ready(model, timeout=timeout)
        yield proc
    finally:
        proc.stop()
