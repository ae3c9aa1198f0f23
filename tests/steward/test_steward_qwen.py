"""The steward on the real tool-capable card (Qwen2.5-Coder-0.5B-Instruct, llama.cpp): a question
about the cluster answered correctly through the OpenAI and Anthropic APIs, tool steps as reasoning."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

pytestmark = pytest.mark.slow
QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
QUESTION = "How many nodes are in the cluster and which is the master?"

PROFILE = """
[profile]
name = "steward-qwen"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-llamacpp", "store",
           "api-control", "api-openai", "api-anthropic", "steward"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-llamacpp]
n_threads = 1

[plugins.steward]
models = ["{qwen}"]
"""


def qwen_file(models_dir: Path) -> Path:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import provision_qwen05

    return provision_qwen05(models_dir)


def wait(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def start_qwen_cluster(tmp: Path, models_dir: Path, count: int) -> list[NodeProcess]:
    gguf = qwen_file(models_dir)
    profile = tmp / "steward-qwen.toml"
    profile.write_text(PROFILE.format(qwen=QWEN))
    version = f"steward-q-{uuid.uuid4().hex[:8]}"
    names = ["alpha", "beta", "gamma"]
    nodes = []
    for i in range(count):
        env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": version, "HF_HUB_OFFLINE": "1"}
        nodes.append(start_node(str(profile), "--node-name", names[i], home=tmp / names[i], env=env))
    for n in nodes:
        n.wait_api(90)
    wait(lambda: all(len(n.state()["topology"]["nodes"]) == count for n in nodes), 90, f"{count} nodes")
    added = nodes[0].post("/models/add", json={"path": str(gguf), "model_id": QWEN})
    assert added.status_code == 200, added.text
    wait(lambda: nodes[-1].get("/v1/steward").json()["ready"], 240, "the Qwen steward")
    return nodes


def master_name(node: NodeProcess) -> str:
    state = node.state()
    return state["nodeIdentities"][state["masterNodeId"]]["friendlyName"]


def test_cluster_question_through_openai_and_anthropic(tmp_path: Path, models_dir: Path) -> None:
    nodes = start_qwen_cluster(tmp_path, models_dir, 2)
    try:
        master = master_name(nodes[0])
        from anthropic import Anthropic
        from openai import OpenAI

        api = nodes[1]  # the API node need not hold the steward
        client = OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=0, timeout=300)
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(
            model="skulk/steward", stream=True, messages=[{"role": "user", "content": QUESTION}]
        ):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning_content", None) or ""
                content += delta.content or ""
        print("OpenAI:", content)
        assert "get_cluster_state" in reasoning and "The cluster has 2 nodes" in reasoning
        assert re.search(r"\b(2|two)\b", content.lower()) and master in content

        anthropic = Anthropic(base_url=api.url, api_key="unused", max_retries=0, timeout=300)
        message = anthropic.messages.create(
            model="skulk/steward", max_tokens=256, messages=[{"role": "user", "content": QUESTION}]
        )
        thinking = "".join(b.thinking for b in message.content if b.type == "thinking")
        text = "".join(b.text for b in message.content if b.type == "text")
        print("Anthropic:", text)
        assert "get_cluster_state" in thinking
        assert re.search(r"\b(2|two)\b", text.lower()) and master in text
    except Exception:
        print("API node log:", nodes[1].log()[-4000:])
        raise
    finally:
        for n in nodes:
            n.stop()
