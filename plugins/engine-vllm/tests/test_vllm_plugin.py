"""The plugin contract, and the pure parts of the engine (command line, memory fraction, tags)."""

from __future__ import annotations

from pathlib import Path

import pytest
from skulk_engine_vllm.engine import (
    MAX_CONTEXT,
    VllmEngine,
    capped_context,
    gpu_memory_fraction,
    reservation_bytes,
    server_command,
    tool_parser,
)
from skulk_engine_vllm.models import SMOLLM2_CARD
from skulk_testing.conformance import PluginConformance

GiB = 1024**3


class TestVllmPlugin(PluginConformance):
    plugin_name = "engine-vllm"
    hook_owners = ("api-control", "hardware")  # plugin_fits is hardware's hook (hardware needs api-control)


BIG = SMOLLM2_CARD.model_copy(
    update={"model_id": "org/big", "context_length": 131072, "storage_size": 16 * GiB, "family": "qwen2",
            "num_key_value_heads": 8, "n_layers": 28, "sections": {"runtime": {"head_dim": 128}}}
)  # fmt: skip


def test_context_is_capped_at_32768() -> None:
    assert capped_context(BIG) == MAX_CONTEXT == 32768
    assert capped_context(SMOLLM2_CARD) == 8192
    argv, _ = server_command(Path("/py"), Path("/m"), BIG, "cuda", 8000, {"vram_total_bytes": 80 * GiB})
    assert argv[argv.index("--max-model-len") + 1] == "32768"


def test_the_placements_context_is_the_max_model_len() -> None:
    argv, _ = server_command(Path("/py"), Path("/m"), BIG, "cuda", 8000, {"vram_total_bytes": 80 * GiB}, 8192)
    assert argv[argv.index("--max-model-len") + 1] == "8192"


def test_gpu_fraction_comes_from_the_reservation() -> None:
    reserved = reservation_bytes(BIG)
    # 16 GiB x 1.25 + KV(32k x 28 layers x 8 heads x 128 x 2 x 2 B = 3.5 GiB) + 256 MiB
    assert abs(reserved / GiB - (20 + 3.5 + 0.25)) < 0.01
    assert gpu_memory_fraction(reserved, 80 * GiB) == round(reserved / (80 * GiB), 3)
    assert gpu_memory_fraction(reserved, 16 * GiB) == 0.95  # clamped: vLLM will refuse, loudly
    argv, env = server_command(Path("/py"), Path("/m"), BIG, "cuda", 8000, {"vram_total_bytes": 80 * GiB})
    assert float(argv[argv.index("--gpu-memory-utilization") + 1]) == gpu_memory_fraction(reserved, 80 * GiB)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "--dtype" not in argv


def test_cpu_command_carries_the_facts_workarounds() -> None:
    argv, env = server_command(Path("/venv/bin/python"), Path("/m"), SMOLLM2_CARD, "cpu", 8123, {})
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "--gpu-memory-utilization" not in argv


def test_tool_parser_per_family_and_card() -> None:
    assert tool_parser(BIG) == "hermes"
    assert tool_parser(SMOLLM2_CARD) == "hermes"  # the card's [tooling] overrides the llama family
    assert tool_parser(BIG.model_copy(update={"family": "llama"})) == "llama3_json"
    argv, _ = server_command(Path("/py"), Path("/m"), SMOLLM2_CARD, "cpu", 1, {})
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv


def test_no_cuda_tag_without_an_nvidia_gpu() -> None:
    tags = VllmEngine().backend_tags({"gpus": []})
    assert "vllm-cuda" not in tags


def test_a_count_on_a_connection_the_server_just_closed_is_asked_again() -> None:
    """uvicorn closes an idle keep-alive connection after 5 s; a pooled one taken at that moment
    fails with RemoteProtocolError before any answer. Counting is idempotent: the session asks once
    more instead of failing the request with a 500 (seen in a CI run, right after a failover)."""
    import httpx
    import pytest
    from skulk_engine_vllm.proxy import OpenAIServerSession, VllmCounter
    from skulk_kernel.api import ChatMessage, TextGenerationParams

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) in (1, 3, 4):
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(200, json={"count": 7})

    session = OpenAIServerSession("http://127.0.0.1:9", "m", tag="vllm-cpu", engine_label="vllm", counter=VllmCounter())
    session.http = httpx.Client(base_url=session.base_url, transport=httpx.MockTransport(answer))
    params = TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),))
    assert session.count_tokens(params) == 7 and calls == ["/tokenize", "/tokenize"]
    with pytest.raises(httpx.RemoteProtocolError):  # twice in a row is not that race: the error stands
        session.count_tokens(params)


def test_a_long_tool_call_keeps_the_stream_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool-call fragments are joined silently until the end: the session sends an empty chunk at
    most every KEEPALIVE_S of them, or a call written for two minutes reads as a dead runner."""
    import io
    import json

    from skulk_engine_vllm import proxy
    from skulk_kernel.api import TokenChunk, ToolCallChunk

    clock = iter(range(0, 1000, 2))  # every read of the clock is two seconds on
    monkeypatch.setattr(proxy.time, "perf_counter", lambda: float(next(clock)))

    def line(delta: dict, finish: str | None = None) -> str:
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

    fragment = {"tool_calls": [{"index": 0, "function": {"arguments": "x"}}]}
    body = line({"content": "Checking."}) + line({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]})
    body += line(fragment) * 10 + line({}, "tool_calls") + "data: [DONE]\n\n"
    session = proxy.OpenAIServerSession(
        "http://127.0.0.1:9", "m", tag="t", engine_label="vllm", counter=proxy.VllmCounter()
    )
    chunks = list(session._relay("c1", io.BytesIO(body.encode()), lambda: False, 0.0))  # type: ignore[arg-type]
    alive = [c for c in chunks if isinstance(c, TokenChunk) and not c.text]
    assert len(alive) == 3 and all(c.finish_reason is None for c in alive)  # 11 fragments 2 s apart: 3 x 6 s
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert isinstance(chunks[-1], ToolCallChunk) and chunks[-1].calls[0].arguments == "x" * 10
