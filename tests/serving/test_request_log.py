"""At INFO a node logs one line per inference request (route, model, tokens, time, outcome) and
none of the HTTP calls its runner makes to its engine's server (llama.cpp's apply-template,
completion, ...), which used to add four or five `httpx` lines to every chat request."""

from __future__ import annotations

import re
import time

import openai
import pytest
from skulk_testing.nodes import NodeProcess

from tests.conftest import CHAT_MODEL

pytestmark = pytest.mark.slow


def _new_lines(node: NodeProcess, before: int) -> list[str]:
    time.sleep(0.5)  # the runner's stderr reaches the node's log through a pipe
    return node.log()[before:].splitlines()


def test_one_line_per_request_and_no_engine_http_calls(llama_node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Say hi."}]
    before = len(llama_node.log())
    reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=8, messages=messages)  # type: ignore[arg-type]
    lines = _new_lines(llama_node, before)
    assert not [line for line in lines if re.search(r"\bhttpx\b|\bhttpcore\b", line)], "\n".join(lines)
    requests = [line for line in lines if "skulk.request:" in line]
    assert len(requests) == 1, "\n".join(lines)
    usage = reply.usage
    assert usage is not None
    assert (
        f"POST /v1/chat/completions model={CHAT_MODEL} tokens={usage.prompt_tokens}+{usage.completion_tokens}"
        in (requests[0])
    )
    assert re.search(r" \d+\.\d\ds 200$", requests[0]), requests[0]

    before = len(llama_node.log())
    stream = client.chat.completions.create(
        model=CHAT_MODEL, max_tokens=8, messages=messages, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[call-overload]
    assert "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no/such-model", messages=messages)  # type: ignore[arg-type]
    lines = [line for line in _new_lines(llama_node, before) if "skulk.request:" in line]
    assert len(lines) == 2, "\n".join(lines)
    assert lines[0].endswith(" 200") and f"model={CHAT_MODEL}" in lines[0]
    assert lines[1].endswith(" 404") and "model=no/such-model tokens=-" in lines[1]
