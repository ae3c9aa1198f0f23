"""Acceptance: a real node (profile cuda-vllm) runs SmolLM2 on a managed vLLM CPU server.

Chat and streaming through all four APIs; kill -9 of the vLLM process fails the instance with the
reason and the master places it again; stopping the node leaves no vLLM process behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from skulk_engine_vllm.managed import PidRecord
from skulk_engine_vllm.models import SMOLLM2_ID
from skulk_testing.nodes import NodeProcess
from vllm_fixtures import smollm2_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
PROMPT = "What is the capital of France? Answer in one word."


def vllm_records(node: NodeProcess) -> list[PidRecord]:
    return [PidRecord.model_validate_json(p.read_text()) for p in (node.home / "engine-vllm").glob("*.pid.json")]


def vllm_processes(models_dir: Path) -> list[int]:
    """Every vLLM server serving our folder, whoever started it (the process table, not our files)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if "vllm.entrypoints.openai.api_server" in cmd and str(models_dir) in cmd:
            found.append(proc.pid)
    return found


def four_apis(node: NodeProcess) -> list[str]:
    import anthropic
    import ollama
    import openai

    messages = [{"role": "user", "content": PROMPT}]
    chat = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    answers = [
        chat.chat.completions.create(model=SMOLLM2_ID, max_tokens=16, temperature=0, messages=messages)
        .choices[0]
        .message.content
        or ""
    ]
    streamed = chat.chat.completions.create(
        model=SMOLLM2_ID, max_tokens=16, temperature=0, messages=messages, stream=True
    )
    answers.append("".join(c.choices[0].delta.content or "" for c in streamed if c.choices))
    answers.append(
        chat.responses.create(model=SMOLLM2_ID, max_output_tokens=16, temperature=0, input=PROMPT).output_text
    )
    with chat.responses.stream(model=SMOLLM2_ID, max_output_tokens=16, temperature=0, input=PROMPT) as events:
        answers.append("".join(e.delta for e in events if e.type == "response.output_text.delta"))
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=300)
    reply = claude.messages.create(model=SMOLLM2_ID, max_tokens=16, extra_body={"temperature": 0}, messages=messages)
    answers.append("".join(b.text for b in reply.content if b.type == "text"))
    with claude.messages.stream(
        model=SMOLLM2_ID, max_tokens=16, extra_body={"temperature": 0}, messages=messages
    ) as stream:
        answers.append("".join(stream.text_stream))
    local = ollama.Client(host=node.url, timeout=300)
    options = {"temperature": 0, "num_predict": 16}
    answers.append(local.chat(model=SMOLLM2_ID, messages=messages, stream=False, options=options).message.content or "")
    answers.append(
        "".join(
            p.message.content or ""
            for p in local.chat(model=SMOLLM2_ID, messages=messages, stream=True, options=options)
        )
    )
    return answers


def test_vllm_node_serves_fails_over_and_cleans_up(models_dir: Path, node_factory) -> None:
    smollm2_folder(models_dir)  # the venv and the converted folder, cached
    node = node_factory("cuda-vllm", env={"SKULK_MODELS_DIR": str(models_dir), "SKULK_OFFLINE": "1"})
    try:
        node.wait_api(120).wait_ready(SMOLLM2_ID, timeout=1200)
        (first,) = node.ready_instances(SMOLLM2_ID)
        resources = node.state()["nodeResources"]
        assert any("vllm-cpu" in r["backends"] for r in resources.values())

        answers = four_apis(node)
        assert all("paris" in a.lower() for a in answers), answers
        assert len(set(a.strip() for a in answers)) == 1, answers  # greedy: the same words everywhere
        text = {"model": SMOLLM2_ID, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        done = node.post("/v1/completions", json=text)
        assert done.status_code == 200 and done.json()["choices"][0]["text"].strip(), done.text
        fim = node.post("/v1/completions", json={**text, "suffix": " and Berlin."})
        assert fim.status_code == 400 and "llamacpp" in fim.json()["error"]["message"], fim.text

        (record,) = vllm_records(node)
        os.kill(record.pid, signal.SIGKILL)

        def replaced() -> bool:
            ready = node.ready_instances(SMOLLM2_ID)
            return bool(ready) and first not in ready

        node.wait_until(replaced, 1200, "the instance to be placed again after kill -9")
        failures = node.state()["instanceFailures"]
        mine = [f for f in failures if f["instanceId"] == first]
        assert mine and "killed by SIGKILL" in mine[0]["reason"], failures
        assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
        assert "paris" in four_apis(node)[1].lower()
        assert len(vllm_processes(models_dir)) == 1
    finally:
        node.stop(timeout=60)  # SIGTERM: the node's own teardown, then SIGKILL of its group
    deadline = time.monotonic() + 30
    while vllm_processes(models_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_processes(models_dir) == [], "a vLLM server outlived its node"
    assert vllm_records(node) == []
