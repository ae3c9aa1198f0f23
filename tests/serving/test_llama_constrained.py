"""Issue [llama] acceptance on the README's default node (SmolLM2 on llama.cpp's server).

A forced tool choice returns a valid call of an offered tool through all four APIs, streaming and
not; a JSON schema answer validates through each API; the README's short model name is listed;
32 concurrent streams of 256 tokens: `test_llama_burst.py` (a tiny model) and bench/bench_llama.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"  # the README's name


@pytest.fixture(scope="module")
def llama_node(models_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The default profile's node, on a network version of its own (other nodes on this host stay out)."""
    pytest.importorskip("xllamacpp")
    from skulk_testing.nodes import start_node

    from tests.conftest import CHAT_MODEL

    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"llama-constrained-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", home=tmp_path_factory.mktemp("llama-constrained"), env=env)
    try:
        node.wait_api(timeout=60)
        node.wait_ready(CHAT_MODEL, timeout=300)
        yield node
    finally:
        node.stop()


PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
OA_TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "Tell me a joke about cats."}]  # nothing asks for the tool


def valid_args(args: str | dict) -> None:
    jsonschema.validate(json.loads(args) if isinstance(args, str) else args, PARAMS)


def test_the_readme_name_is_listed(llama_node: Any) -> None:
    ids = [m.id for m in openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x").models.list()]
    assert MODEL in ids
    assert f"{MODEL}:latest" in [m.model for m in ollama.Client(host=llama_node.url).list().models]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_chat_completions(llama_node: Any, choice: Any) -> None:
    oa = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=180)
    r = oa.chat.completions.create(model=MODEL, messages=ASK, tools=OA_TOOLS, tool_choice=choice, max_tokens=60)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    valid_args(call.function.arguments)
    args, reasons = "", []
    for chunk in oa.chat.completions.create(
        model=MODEL, messages=ASK, tools=OA_TOOLS, tool_choice=choice, max_tokens=60, stream=True
    ):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                args += tc.function.arguments or ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons == ["tool_calls"]
    valid_args(args)


def test_forced_call_responses(llama_node: Any) -> None:
    oa = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=180)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
    r = oa.responses.create(model=MODEL, input="Tell me a joke.", tools=tools, tool_choice="required")
    call = next(i for i in r.output if i.type == "function_call")
    assert call.name == "get_weather"
    valid_args(call.arguments)
    with oa.responses.stream(
        model=MODEL, input="Tell me a joke.", tools=tools, tool_choice={"type": "function", "name": "get_weather"}
    ) as s:
        final = s.get_final_response()
    valid_args(next(i for i in final.output if i.type == "function_call").arguments)


def test_forced_call_anthropic(llama_node: Any) -> None:
    an = anthropic.Anthropic(base_url=llama_node.url, api_key="x", max_retries=0, timeout=180)
    tools: Any = [{"name": "get_weather", "input_schema": PARAMS}]
    m = an.messages.create(model=MODEL, max_tokens=60, messages=ASK, tools=tools, tool_choice={"type": "any"})  # type: ignore[arg-type]
    block = next(b for b in m.content if b.type == "tool_use")
    assert m.stop_reason == "tool_use" and block.name == "get_weather"
    valid_args(block.input)
    with an.messages.stream(
        model=MODEL,
        max_tokens=60,
        messages=ASK,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},  # type: ignore[arg-type]
    ) as s:
        final = s.get_final_message()
    valid_args(next(b for b in final.content if b.type == "tool_use").input)


def test_forced_call_ollama(llama_node: Any) -> None:
    body = {"model": MODEL, "messages": ASK, "tools": OA_TOOLS, "tool_choice": "required", "stream": False}
    r = httpx.post(llama_node.url + "/api/chat", json=body, timeout=180)
    assert r.status_code == 200, r.text
    call = r.json()["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    valid_args(call["arguments"])
    with httpx.stream("POST", llama_node.url + "/api/chat", json={**body, "stream": True}, timeout=180) as s:
        records = [json.loads(line) for line in s.iter_lines() if line]
    calls = [c for rec in records for c in rec["message"].get("tool_calls") or ()]
    assert records[-1]["done"] and len(calls) == 1
    valid_args(calls[0]["function"]["arguments"])


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "legs": {"type": "integer"}},
    "required": ["name", "legs"],
}


def test_json_schema_through_each_api(llama_node: Any) -> None:
    oa = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=180)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "animal", "schema": SCHEMA, "strict": True}}
    r = oa.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, max_tokens=100, temperature=0)
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
    text: Any = {"format": {"type": "json_schema", "name": "animal", "schema": SCHEMA}}
    answer = oa.responses.create(model=MODEL, input="A cat.", text=text, temperature=0, max_output_tokens=200)
    jsonschema.validate(json.loads(answer.output_text), SCHEMA)
    an = anthropic.Anthropic(base_url=llama_node.url, api_key="x", max_retries=0, timeout=180)
    m = an.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ASK,
        extra_body={"output_format": {"type": "json_schema", "schema": SCHEMA}, "temperature": 0},
    )  # type: ignore[arg-type]
    jsonschema.validate(json.loads(m.content[0].text), SCHEMA)  # type: ignore[union-attr]
    # Greedy and bounded: Ollama samples at 0.8 by default, and "any JSON object" lets a small model
    # write one endless key string (seen: 4096 tokens, a client timeout on a loaded box)
    client = ollama.Client(host=llama_node.url, timeout=180)
    greedy = {"temperature": 0, "num_predict": 200}
    g = client.generate(model=MODEL, prompt="A cat.", format=SCHEMA, options=greedy)
    jsonschema.validate(json.loads(g.response), SCHEMA)
    j = client.generate(model=MODEL, prompt="A cat.", format="json", options=greedy)
    assert isinstance(json.loads(j.response), dict)
