"""Issue [serving] acceptance: the README's default node serves real models to the openai SDK.

Every test talks to one real `skulk-kernel run --profile cpu-llamacpp` process that serves
SmolLM2-135M-Instruct and all-MiniLM-L6-v2 through llama.cpp's server in runner subprocesses.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.conftest import CHAT_MODEL, EMBED_MODEL

CONTROL_MARKUP = ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>", "<|endoftext|>")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def client(llama_node) -> openai.OpenAI:
    return openai.OpenAI(base_url=llama_node.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_streaming_helper_and_usage(client):
    text, reasons = "", []
    with client.chat.completions.stream(
        model="SmolLM2-135M-Instruct", max_tokens=40, messages=[{"role": "user", "content": "Describe the sea."}]
    ) as stream:
        for event in stream:  # (get_final_completion() raises by design when the answer hit max_tokens)
            if event.type == "content.delta":
                text += event.delta
            elif event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].finish_reason:
                reasons.append(event.chunk.choices[0].finish_reason)
    assert text.strip()
    assert reasons in (["stop"], ["length"])
    answer = client.chat.completions.create(
        model=CHAT_MODEL, max_tokens=16, messages=[{"role": "user", "content": "Say hello."}]
    )
    usage = answer.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert answer.choices[0].message.content


def test_tool_schema_gives_tool_calls_or_clean_prose(client):
    for prompt in ("What's the weather in Paris right now?", "Call get_weather for Tokyo."):
        answer = client.chat.completions.create(
            model=CHAT_MODEL, max_tokens=60, tools=[WEATHER_TOOL], messages=[{"role": "user", "content": prompt}]
        )
        choice = answer.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                assert call.function.name == "get_weather"
                assert isinstance(json.loads(call.function.arguments), dict)
        else:
            assert choice.message.content
        assert not any(m in (choice.message.content or "") for m in CONTROL_MARKUP)


def test_logprobs_are_consistent_with_content(client):
    answer = client.chat.completions.create(
        model=CHAT_MODEL,
        max_tokens=20,
        logprobs=True,
        top_logprobs=2,
        temperature=0,
        messages=[{"role": "user", "content": "Count to five."}],
    )
    content = answer.choices[0].message.content
    tokens = answer.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == content
    assert all(t.logprob <= 0 and t.bytes is not None and len(t.top_logprobs) > 0 for t in tokens)


def test_embeddings_base64_default(client):
    sentences = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "The stock market fell sharply today."]
    result = client.embeddings.create(model=EMBED_MODEL, input=sentences)  # the SDK asks for base64
    vectors = [d.embedding for d in result.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    for v in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, abs_tol=1e-3)
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2]) + 0.2


def test_place_second_copy_then_delete(llama_node):
    before = set(llama_node.ready_instances(CHAT_MODEL))
    placed = llama_node.post("/place_instance", json={"model_id": CHAT_MODEL})
    assert placed.status_code == 200, placed.text
    body = placed.json()
    assert body["instance_id"] == body["command_id"] and body["model_card"]["modelId"] == CHAT_MODEL
    llama_node.wait_until(lambda: body["instance_id"] in llama_node.ready_instances(CHAT_MODEL), 120, "the second copy")
    assert len(llama_node.ready_instances(CHAT_MODEL)) == len(before) + 1
    listed = llama_node.get(f"/instance/{body['instance_id']}")
    assert listed.status_code == 200
    deleted = httpx.delete(llama_node.url + f"/instance/{body['instance_id']}", timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert body["instance_id"] not in llama_node.state()["instances"]
    assert set(llama_node.ready_instances(CHAT_MODEL)) == before


def test_placement_that_cannot_fit_names_node_and_arithmetic(llama_node, models_dir):
    import gguf
    import numpy as np

    (models_dir / "local").mkdir(exist_ok=True)  # /models/add takes paths under the model directories only
    path = models_dir / "local" / "giant.gguf"  # a real GGUF header for an 80-layer model...
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(80)
    writer.add_embedding_length(8192)
    writer.add_head_count(64)
    writer.add_head_count_kv(8)
    writer.add_context_length(8192)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(path, "r+b") as f:  # ...and 4 TB of weights on paper (sparse: nothing on disk)
        f.truncate(4 * 1024**4)
    added = llama_node.post("/models/add", json={"path": str(path), "model_id": "test/giant"})
    assert added.status_code == 200, added.text
    refused = llama_node.post("/place_instance", json={"model_id": "test/giant"})
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    node_id = llama_node.get("/node_id").json()
    assert node_id in message and "GiB" in message and "available" in message and "overhead" in message
    assert httpx.delete(llama_node.url + "/models/custom/test/giant", timeout=10).status_code == 200
    path.unlink()  # 4 TB on paper: never leave it in the shared models directory


def test_context_overflow_is_400_before_any_stream(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=CHAT_MODEL, max_tokens=9000, stream=True, messages=[{"role": "user", "content": "hi"}]
        )
    assert "context_length_exceeded" in str(err.value)


def test_malformed_requests_are_4xx_openai_errors(llama_node):
    url = llama_node.url + "/v1/chat/completions"
    cases = [
        dict(content=b"{not json", headers={"content-type": "application/json"}),
        dict(json={"model": CHAT_MODEL, "messages": "hello"}),
        dict(json={"model": CHAT_MODEL, "messages": []}),
        dict(json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
        dict(json={"model": "no/such-model", "messages": [{"role": "user", "content": "x"}]}),
    ]
    for case in cases:
        response = httpx.post(url, timeout=30, **case)
        assert 400 <= response.status_code < 500, (case, response.text)
        assert response.headers.get("x-should-retry") == "false"
        error = response.json()["error"]
        assert error["message"] and "Traceback" not in error["message"]


def _stream_lines(node, content: str, max_tokens: int = 400):
    body = {
        "model": CHAT_MODEL,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "messages": [{"role": "user", "content": content}],
    }
    return httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=60)


def _tasks(node) -> dict:
    return node.state()["tasks"]


def test_cancel_endpoint_stops_generation(llama_node, client):
    with _stream_lines(llama_node, "Write a very long story about a lighthouse keeper.") as response:
        lines = response.iter_lines()
        command_id = next(lines).removeprefix(": command_id ").strip()
        tokens_after_cancel = 0
        cancelled_at = None
        for line in lines:
            if line.startswith("data: {") and '"content"' in line and cancelled_at is None:
                cancelled_at = time.monotonic()
                assert llama_node.post(f"/v1/cancel/{command_id}").status_code == 200
            elif cancelled_at is not None and line.startswith("data: {") and '"content":"' in line:
                tokens_after_cancel += 1
    assert cancelled_at is not None and tokens_after_cancel <= 5
    llama_node.wait_until(lambda: not _tasks(llama_node), 10, "the cancelled task to leave State")
    assert (
        client.chat.completions.create(model=CHAT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        .choices[0]
        .message.content
    )


def test_client_disconnect_cancels(llama_node, client):
    with _stream_lines(llama_node, "Write a very long essay about rivers.") as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                break
    llama_node.wait_until(lambda: not _tasks(llama_node), 10, "the abandoned task to be cancelled")
    assert (
        client.chat.completions.create(model=CHAT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        .choices[0]
        .message.content
    )


def _runner_pid(node, model_id: str) -> int:
    runners = node.get("/v1/diagnostics/node").json()["supervisorRunners"]
    return next(r["pid"] for r in runners if r["modelId"] == model_id and r["pid"])


def test_runner_kill_9_mid_stream_errors_then_recovers(llama_node, client):
    pid = _runner_pid(llama_node, CHAT_MODEL)
    saw_error = False
    started = time.monotonic()
    with _stream_lines(llama_node, "Write a long poem about mountains.") as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line and pid:
                os.kill(pid, signal.SIGKILL)
                pid = 0
            if line.startswith("data: {") and '"error"' in line:
                saw_error = True
    assert saw_error and time.monotonic() - started < 20
    llama_node.wait_until(
        lambda: _runner_pid(llama_node, CHAT_MODEL) != 0 and llama_node.ready_instances(CHAT_MODEL),
        120,
        "the runner to come back",
    )
    answer = client.chat.completions.create(
        model=CHAT_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    )
    assert answer.choices[0].message.content


def test_twenty_concurrent_streams_complete(client):
    results: dict[int, tuple[str, str | None]] = {}

    def one(i: int) -> None:
        text, reason = "", None
        for chunk in client.chat.completions.create(
            model=CHAT_MODEL,
            stream=True,
            max_tokens=24,
            messages=[{"role": "user", "content": f"Give me fact number {i} about owls."}],
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
        results[i] = (text, reason)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == list(range(20))
    assert all(text.strip() and reason in ("stop", "length") for text, reason in results.values())


def test_readme_first_command_is_the_default_profile():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    assert "./skulk run" in readme and "./skulk test" in readme
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "profile", "show", "cpu-llamacpp"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_one_instance_answers_through_all_four_formats(llama_node):
    """One placed model, one greedy prompt, four wire formats: the same words come back."""
    import anthropic
    import ollama

    prompt = "Name three primary colours."
    instances = llama_node.ready_instances(CHAT_MODEL)
    assert len(instances) == 1
    chat = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=120)
    via_chat = chat.chat.completions.create(
        model=CHAT_MODEL, max_tokens=24, temperature=0, messages=[{"role": "user", "content": prompt}]
    )
    via_responses = chat.responses.create(model=CHAT_MODEL, max_output_tokens=24, temperature=0, input=prompt)
    claude = anthropic.Anthropic(base_url=llama_node.url, api_key="x", max_retries=0, timeout=120)
    via_messages = claude.messages.create(
        model=CHAT_MODEL, max_tokens=24, extra_body={"temperature": 0}, messages=[{"role": "user", "content": prompt}]
    )
    via_ollama = ollama.Client(host=llama_node.url).chat(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": prompt}],
        stream=False,
        options={"temperature": 0, "num_predict": 24},
    )
    answers = [
        via_chat.choices[0].message.content,
        via_responses.output_text,
        "".join(block.text for block in via_messages.content if block.type == "text"),
        via_ollama.message.content,
    ]
    assert all(a and a.strip() for a in answers), answers
    assert len(set(answers)) == 1, answers  # greedy decoding on one instance: identical text
    assert llama_node.ready_instances(CHAT_MODEL) == instances
