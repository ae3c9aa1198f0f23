"""The Ollama API against a real node (echo engine), driven by the official `ollama` client and raw HTTP."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import ollama
import pytest
from skulk_testing.echo_node import ECHO, EMBED, SLOW, WEATHER
from skulk_testing.echo_node import WEATHER_TOOLS as TOOLS
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(shared_echo_node: NodeProcess) -> NodeProcess:
    """The run's shared echo node (skulk_testing): these tests only send requests."""
    return shared_echo_node


@pytest.fixture(scope="module")
def client(node: NodeProcess) -> ollama.Client:
    return ollama.Client(host=node.url, timeout=20)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def ndjson(node: NodeProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", node.url + path, json=body, timeout=20) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/x-ndjson")
        raw = r.read().decode()
    assert raw.endswith("\n") and "\n\n" not in raw
    return [json.loads(line) for line in raw.splitlines()]


# --- chat and generate ---------------------------------------------------------------------------


def test_chat(client: ollama.Client) -> None:
    out = client.chat(model=ECHO, messages=user("hello big world"))
    assert out.model == ECHO and out.done and out.done_reason == "stop"
    assert out.message.role == "assistant" and out.message.content == "hello big world"
    assert out.prompt_eval_count == 5 and out.eval_count == 3
    assert out.total_duration and out.load_duration and out.prompt_eval_duration and out.eval_duration
    assert out.created_at and out.created_at.endswith("Z")


def test_chat_stream(client: ollama.Client) -> None:
    parts = list(client.chat(model=ECHO, messages=user("hello big world"), stream=True))
    assert [p.message.content for p in parts] == ["hello", " big", " world", ""]
    assert [p.done for p in parts] == [False, False, False, True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 3


def test_stream_is_the_default(node: NodeProcess) -> None:
    records = ndjson(node, "/api/chat", {"model": ECHO, "messages": user("a b")})
    assert [r["done"] for r in records] == [False, False, True]
    assert all(r["message"]["content"] is not None for r in records)
    one = node.post("/api/chat", json={"model": ECHO, "messages": user("a b"), "stream": False}).json()
    assert one["message"]["content"] == "a b" and one["done"] is True


def test_model_names_with_tags(client: ollama.Client) -> None:
    for name in ("echo:latest", "skulk/echo:latest", "echo", "SKULK/ECHO"):
        out = client.chat(model=name, messages=user("ok"))
        assert out.message.content == "ok" and out.model == name  # the name as sent, as Ollama does


def test_max_tokens_and_options(client: ollama.Client) -> None:
    out = client.chat(model=ECHO, messages=user("one two three four"), options={"num_predict": 2, "temperature": 0})
    assert out.message.content == "one two" and out.done_reason == "length"
    out = client.chat(model=ECHO, messages=user("one two three four"), options={"stop": ["three"]})
    assert out.message.content == "one two "


def test_generate(client: ollama.Client, node: NodeProcess) -> None:
    out = client.generate(model=ECHO, prompt="one two", system="be brief")
    assert out.response == "one two" and out.done
    assert out.context and all(isinstance(t, int) for t in out.context)  # the conversation, to continue it
    assert out.prompt_eval_count == (2 + 2) + (2 + 2)
    raw = client.generate(model=ECHO, prompt="x y z", raw=True)
    assert raw.response == "x y z" and raw.prompt_eval_count == 3  # the raw prompt, untemplated
    parts = list(client.generate(model=ECHO, prompt="a b", stream=True))
    assert "".join(p.response for p in parts) == "a b" and parts[-1].done
    records = ndjson(node, "/api/generate", {"model": ECHO, "prompt": "a"})
    assert records[-1]["done"] is True and records[-1]["response"] == ""


def test_load_requests(client: ollama.Client, node: NodeProcess) -> None:
    assert client.generate(model=ECHO).done_reason == "load"
    assert node.post("/api/chat", json={"model": ECHO, "messages": [], "stream": False}).json()["done_reason"] == "load"
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model="no-such-model")
    assert info.value.status_code == 404


def test_tool_call_with_object_arguments(client: ollama.Client) -> None:
    out = client.chat(model=ECHO, messages=user(WEATHER), tools=TOOLS)
    (call,) = out.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert out.message.content == "" and out.done_reason == "stop"
    parts = list(client.chat(model=ECHO, messages=user(WEATHER), tools=TOOLS, stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}]
    follow = client.chat(
        model=ECHO,
        tools=TOOLS,
        messages=[
            *user(WEATHER),
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            *user("thanks"),
        ],
    )
    assert follow.message.content == "thanks"


def test_prefixed_paths(client: ollama.Client, node: NodeProcess) -> None:
    prefixed = ollama.Client(host=node.url + "/ollama", timeout=20)
    assert prefixed.chat(model=ECHO, messages=user("via prefix")).message.content == "via prefix"
    assert [m.model for m in prefixed.list().models] == [m.model for m in client.list().models]
    assert node.get("/ollama/api/version").json() == node.get("/api/version").json()


# --- models, version, liveness -------------------------------------------------------------------


def test_list_show_ps_version(client: ollama.Client, node: NodeProcess) -> None:
    names = [m.model for m in client.list().models]
    assert {f"{ECHO}:latest", f"{EMBED}:latest"} <= set(names[:2])  # models with an instance first
    tags = node.get("/api/tags").json()["models"][0]
    assert {"name", "model", "modified_at", "size", "digest", "details"} <= set(tags)
    shown = client.show("echo:latest")
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "echo"
    assert shown.capabilities == ["completion", "tools"]
    assert client.show(EMBED).capabilities == ["embedding"]
    assert node.post("/api/show", json={"name": ECHO}).status_code == 200  # older clients send `name`
    running = client.ps().models
    assert {m.model for m in running} == {f"{ECHO}:latest", f"{EMBED}:latest"}
    assert all(m.context_length == 4096 and m.expires_at is not None for m in running)
    assert isinstance(node.get("/api/version").json()["version"], str)


def test_liveness(node: NodeProcess) -> None:
    r = node.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert httpx.head(node.url + "/", timeout=5).status_code == 200


def test_embed(client: ollama.Client) -> None:
    out = client.embed(model=EMBED, input=["red apple", "apple red", "blue sky"])
    assert len(out.embeddings) == 3 and all(len(v) == 16 for v in out.embeddings)
    assert out.embeddings[0] == pytest.approx(out.embeddings[1])  # bag of words
    assert out.model == EMBED and out.prompt_eval_count == 6
    single = client.embed(model="echo-embed:latest", input="red apple")
    assert single.embeddings[0] == pytest.approx(out.embeddings[0])
    legacy = client.embeddings(model=EMBED, prompt="red apple")
    assert list(legacy.embedding) == pytest.approx(out.embeddings[0])


# --- errors --------------------------------------------------------------------------------------


def test_malformed_requests_raise_response_error(client: ollama.Client, node: NodeProcess) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="no/such-model", messages=user("x"))
    assert info.value.status_code == 404 and "no/such-model" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=ECHO, messages=user("x"), options={"temperature": "hot"})  # type: ignore[dict-item]
    assert info.value.status_code == 400 and "temperature" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        next(iter(client.chat(model="no/such-model", messages=user("x"), stream=True)))
    assert info.value.status_code == 404  # before the stream starts: an HTTP status, not a line
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model=ECHO, input="x")  # a chat model cannot embed
    assert info.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as info:
        client.show("no/such-model")
    assert info.value.status_code == 404
    for content in ("{", "", "[1]", json.dumps({"messages": user("x")})):
        r = node.post("/api/chat", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and isinstance(r.json()["error"], str)
        assert r.headers["x-should-retry"] == "false"
    r = node.post(
        "/api/chat", json={"model": ECHO, "messages": user("x"), "options": {"num_predict": 5000}, "stream": False}
    )
    assert r.status_code == 200 and r.json()["done"], r.text  # like Ollama: it stops at the context's end
    r = node.post("/api/chat", json={"model": ECHO, "messages": user("x " * 5000), "stream": False})
    assert r.status_code == 400 and "context_length_exceeded" in r.json()["error"]


# --- disconnects ---------------------------------------------------------------------------------


def _wait_no_tasks(node: NodeProcess) -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if not node.state()["tasks"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"tasks still open after the client left: {node.state().get('tasks')}")


def _assert_runner_free(client: ollama.Client) -> None:
    started = time.monotonic()
    assert client.chat(model=ECHO, messages=user("still serving")).message.content == "still serving"
    assert time.monotonic() - started < 2.0


def test_stream_disconnect_cancels(node: NodeProcess, client: ollama.Client) -> None:
    for path in ("/api/chat", "/api/generate", "/ollama/api/chat", "/api/chat"):  # 4 = the runner's slots
        body = {"model": ECHO, "messages": user(SLOW), "prompt": SLOW}
        with httpx.stream("POST", node.url + path, json=body, timeout=10) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i == 2:
                    assert node.state()["tasks"]  # it is running...
                    break  # ...and leaving the block closes the connection mid-stream
    _wait_no_tasks(node)
    _assert_runner_free(client)


def test_non_stream_disconnect_cancels(node: NodeProcess, client: ollama.Client) -> None:
    for _ in range(4):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                node.url + "/api/chat",
                json={"model": ECHO, "messages": user(SLOW), "stream": False},
                timeout=0.4,
            )
    _wait_no_tasks(node)
    _assert_runner_free(client)
