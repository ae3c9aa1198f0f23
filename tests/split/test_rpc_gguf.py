"""One GGUF across several nodes over llama.cpp's RPC backend (issue [rpc]), with real node processes.

Three nodes on this host form one cluster; each runs engine-llamacpp with the RPC build of
llama.cpp (``engines install llamacpp-rpc``, built once and cached, as the vLLM venv is). SmolLM2
and the Qwen2.5-Coder-0.5B card are placed over 2 and 3 nodes (``llama_rpc-cpu``): rank 0 drives
llama.cpp's server with the other ranks as RPC devices, each ``ggml-rpc-server`` on loopback behind
a member TLS tunnel. Greedy tokens must equal the single-node instance's on five prompts, and each
rank's processes must hold less than the single-node runner. A rank's node killed with -9 mid-stream
ends the stream with an error within 5 s, and the instance is failed with the reason and placed
again on the nodes left.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.split import splits
from tests.split.splits import delete_all, kill_mid_stream, wait_placed_again

pytestmark = pytest.mark.slow
pytest.importorskip("xllamacpp")

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a computer is to a child.",
    "List three fruits and their colors.",
    "Tell me a story about a brave little fox.",
)
MiB = 2**20
PROFILE = """
[profile]
name = "rpc-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-llamacpp", "store",
           "api-control", "api-openai"]
[planes]
control = "zenoh"
[plugins.master]
node_timeout_s = 20
[plugins.engine-llamacpp]
n_parallel = 2
"""


@pytest.fixture(scope="module")
def rpc_build() -> Any:
    from skulk_engine_llamacpp.rpc_build import RpcBuildError, ensure_rpc_build

    try:
        return ensure_rpc_build("cpu")  # cached after the first build (about ten minutes on two cores)
    except (RpcBuildError, OSError) as exc:
        pytest.skip(f"no RPC build of llama.cpp here: {exc}")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, models_dir: Path, rpc_build: Any) -> Iterator[list[NodeProcess]]:
    from skulk_engine_llamacpp.models import ProvisionError, provision_qwen05

    try:
        provision_qwen05(models_dir)
    except ProvisionError as exc:
        pytest.skip(f"Qwen2.5-Coder-0.5B not provisionable here: {exc}")
    tmp = tmp_path_factory.mktemp("rpc")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"r{uuid.uuid4().hex[:10]}"}
    started: list[NodeProcess] = []
    try:
        for i in range(3):
            started.append(
                start_node(str(profile), "--no-default-models", "--node-name", f"r{i}", home=tmp / f"node{i}", env=env)
            )
        for node in started:
            node.wait_api(90)
        started[0].wait_until(lambda: len(started[0].state()["topology"]["nodes"]) == 3, 90, "three members")
        yield started
    finally:
        for node in started:
            node.stop()


def place(node: NodeProcess, model: str, *, min_nodes: int = 1, timeout: float = 300) -> dict[str, Any]:
    return splits.place(node, model, timeout=timeout, min_nodes=min_nodes, context_tokens=2048)


def greedy(node: NodeProcess, model: str, prompts: tuple[str, ...] = PROMPTS, max_tokens: int = 48) -> list[str]:
    out = []
    for prompt in prompts:
        r = node.post(
            "/v1/chat/completions",
            timeout=300,
            json={
                "model": model,
                "temperature": 0,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def rank_rss(nodes: list[NodeProcess], instance: dict[str, Any]) -> list[int]:
    """Resident bytes of each rank's llama.cpp process (the driver's llama-server, a rank's
    ggml-rpc-server: where the weights and KV cache live), in rank order."""
    by_runner: dict[str, int] = {}
    for node in nodes:
        for runner in node.get("/v1/diagnostics/node").json()["supervisorRunners"]:
            if runner.get("pid") and psutil.pid_exists(runner["pid"]):
                children = psutil.Process(runner["pid"]).children(recursive=True)
                by_runner[runner["runnerId"]] = sum(c.memory_info().rss for c in children)
    shards = instance["shardAssignments"]["runnerToShard"]
    order = sorted(shards, key=lambda r: next(iter(shards[r].values()))["deviceRank"])
    return [by_runner[r] for r in order]


def model_file(models_dir: Path, model: str) -> Path:
    folder = models_dir / model.replace("/", "--")
    return folder / json.loads((folder / ".skulk" / "installed-card.json").read_text())["main_file"]


def single_process_text(build: Any, path: Path, prompts: tuple[str, ...] = PROMPTS) -> tuple[list[str], int]:
    """The same build's llama-server alone (no RPC device), with the driver's own settings: the
    single-node output a split must reproduce, and its resident memory."""
    from skulk_engine_llamacpp.events import TextDelta
    from skulk_engine_llamacpp.rpc_engine import RpcLlamaServer

    server = RpcLlamaServer(build, [], 0, [], model_path=path, n_parallel=2, n_ctx=2048).start()
    try:
        texts = []
        for prompt in prompts:
            events = server.chat([{"role": "user", "content": prompt}], sampling={"temperature": 0, "max_tokens": 48})
            texts.append("".join(e.text for e in events if isinstance(e, TextDelta)))
        assert server.process is not None
        return texts, psutil.Process(server.process.pid).memory_info().rss
    finally:
        server.close()


@pytest.fixture(scope="module")
def reference(nodes: list[NodeProcess], models_dir: Path, rpc_build: Any) -> dict[str, Any]:
    """Per model: the single-process text and memory of the RPC build, and the text of the cluster's
    usual single-node instance (llama_server on xllamacpp, another llama.cpp revision: reported only)."""
    out: dict[str, Any] = {}
    for model in (SMOLLM2, QWEN):
        text, rss = single_process_text(rpc_build, model_file(models_dir, model))
        out[model] = {"text": text, "rss": rss}
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("model", "width"), [(SMOLLM2, 2), (SMOLLM2, 3), (QWEN, 2), (QWEN, 3)])
def test_a_gguf_over_several_nodes_gives_the_single_node_text_each_rank_holding_its_share(
    nodes: list[NodeProcess], reference: dict[str, Any], model: str, width: int
) -> None:
    a = nodes[0]
    previews = a.get("/instance/previews", params={"model_id": model, "context_tokens": 2048}).json()["previews"]
    preview = next(p for p in previews if p["sharding"] == "Pipeline" and p["min_nodes"] == width)
    assert preview["engine"] == "llama_rpc" and [r["backend"] for r in preview["ranks"]] == ["llama_rpc-cpu"] * width
    inst = place(a, model, min_nodes=width)
    try:
        shards = [next(iter(s.values())) for s in inst["shardAssignments"]["runnerToShard"].values()]
        assert {s["backend"] for s in shards} == {"llama_rpc-cpu"} and len(shards) == width
        assert greedy(nodes[-1], model) == reference[model]["text"]
        rss = rank_rss(nodes, inst)
        print(f"\n{model} over {width}: ranks {[r // MiB for r in rss]} MiB, single {reference[model]['rss'] // MiB}")
        assert max(rss) < reference[model]["rss"], "a rank holds as much as the whole model"
    finally:
        delete_all(a)


@pytest.mark.timeout(600)
def test_killing_a_ranks_node_ends_the_stream_and_the_instance_is_placed_again(nodes: list[NodeProcess]) -> None:
    a = nodes[0]
    inst = place(a, SMOLLM2, min_nodes=2)
    ranks = inst["shardAssignments"]["nodeToRunner"]
    ids = {n.get("/node_id").json(): n for n in nodes}
    shards = inst["shardAssignments"]["runnerToShard"]
    driver = next(n for n, r in ranks.items() if next(iter(shards[r].values()))["deviceRank"] == 0)
    # the rank that only lends memory (the master too, when it is one: the stream must end all the same)
    victim = next(n for i, n in ids.items() if i in ranks and i != driver)
    api = next(n for n in nodes if n is not victim)
    error, gap = kill_mid_stream(api, victim, SMOLLM2)
    reason = wait_placed_again(nodes, victim, inst)
    assert "rpc" in reason.lower() or "rank" in reason.lower(), reason
    print(f"\nstream ended {gap:.2f} s after the kill ({error.get('message')!r}); instance failed: {reason}")
