"""One model across several nodes, on MLX, through real node processes and the real SmolLM2.

Three node processes on this host form a cluster over Zenoh. The same five prompts (40 greedy
tokens each) are answered by a single-node instance, a 2-node and a 3-node pipeline, and (Qwen
2.5 0.5B, whose 2 KV heads divide two ways) a 2-way tensor instance; the tokens must be equal.
Each rank's runner must hold only its share (its RSS against the single-node runner's). A rank's
node killed with -9 mid-stream ends the stream with an error within 5 s, the instance is failed
with the reason and placed again on the nodes that are left.
"""

from __future__ import annotations

import importlib.util
import itertools
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
# find_spec, not importorskip: importing mlx-lm at collection imports transformers, which then caches
# "no torch" for every later test in the process (the diffusers engine's tests put torch on the path).
if importlib.util.find_spec("mlx_lm") is None:
    pytest.skip("mlx-lm is not installed", allow_module_level=True)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct-MLX"
QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct-MLX"
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
name = "split-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-mlx", "store",
           "api-control", "api-openai", "api-anthropic", "api-ollama"]
[planes]
control = "zenoh"
[plugins.master]
node_timeout_s = 20
[plugins.engine-mlx]
pin_ranks = true
"""


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[list[NodeProcess]]:
    tmp = tmp_path_factory.mktemp("split")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_MODELS_DIR": str(models_dir / "mlx-nodes"), "SKULK_NETWORK_VERSION": f"s{uuid.uuid4().hex[:10]}"}
    started: list[NodeProcess] = []
    try:
        for i in range(3):
            started.append(
                start_node(str(profile), "--no-default-models", "--node-name", f"m{i}", home=tmp / f"node{i}", env=env)
            )
        for node in started:
            node.wait_api(90)
        started[0].wait_until(lambda: len(started[0].state()["topology"]["nodes"]) == 3, 90, "three members")
        yield started
    finally:
        for node in started:
            node.stop()


def place(
    node: NodeProcess, model: str, *, min_nodes: int = 1, sharding: str = "Pipeline", timeout: float = 600
) -> dict[str, Any]:
    """Place and wait until ready; the model is provisioned (converted) on first use."""
    return splits.place(node, model, timeout=timeout, min_nodes=min_nodes, sharding=sharding)


def greedy_tokens(node: NodeProcess, model: str, prompts: tuple[str, ...], max_tokens: int = 40) -> list[list[str]]:
    out = []
    for prompt in prompts:
        r = node.post(
            "/v1/chat/completions",
            timeout=600,
            json={
                "model": model,
                "temperature": 0,
                "max_tokens": max_tokens,
                "logprobs": True,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        tokens = [entry["token"] for entry in (choice.get("logprobs") or {}).get("content") or []]
        out.append(tokens or [choice["message"]["content"]])
    return out


def runner_rss(nodes: list[NodeProcess]) -> dict[str, int]:
    """runner id -> resident bytes of its process, for every runner on these nodes."""
    found = {}
    for node in nodes:
        for runner in node.get("/v1/diagnostics/node").json()["supervisorRunners"]:
            if runner.get("pid"):
                found[runner["runnerId"]] = psutil.Process(runner["pid"]).memory_info().rss
    return found


@pytest.fixture(scope="module")
def reference(nodes: list[NodeProcess]) -> dict[str, Any]:
    """The single-node instance's greedy tokens and its runner's memory."""
    a = nodes[0]
    inst = place(a, SMOLLM2)
    tokens = greedy_tokens(a, SMOLLM2, PROMPTS)
    rss = runner_rss(nodes)[next(iter(inst["shardAssignments"]["runnerToShard"]))]
    delete_all(a)
    return {"tokens": tokens, "rss": rss}


@pytest.mark.timeout(900)  # the first run converts SmolLM2 (about a minute)
def test_a_single_node_mlx_instance_serves_all_four_apis(nodes: list[NodeProcess]) -> None:
    a, b = nodes[0], nodes[1]
    place(a, SMOLLM2)
    try:
        for via in (a, b):  # the node that runs it, and one that does not
            chat = via.post(
                "/v1/chat/completions",
                timeout=300,
                json={"model": SMOLLM2, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]},
            )
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
        responses = a.post(
            "/v1/responses", timeout=300, json={"model": SMOLLM2, "input": "Say hello.", "max_output_tokens": 16}
        )
        assert responses.status_code == 200 and responses.json()["output"], responses.text
        messages = a.post(
            "/v1/messages",
            timeout=300,
            json={"model": SMOLLM2, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]},
        )
        assert messages.status_code == 200 and messages.json()["content"][0]["text"], messages.text
        ollama = a.post(
            "/api/chat",
            timeout=300,
            json={
                "model": SMOLLM2,
                "stream": False,
                "options": {"num_predict": 16},
                "messages": [{"role": "user", "content": "Say hello."}],
            },
        )
        assert ollama.status_code == 200 and ollama.json()["message"]["content"], ollama.text
    finally:
        delete_all(a)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("width", [2, 3])
def test_a_pipeline_gives_the_single_node_tokens_with_each_rank_holding_its_share(
    nodes: list[NodeProcess], reference: dict[str, Any], width: int
) -> None:
    a = nodes[0]
    inst = place(a, SMOLLM2, min_nodes=width)
    try:
        shards = [next(iter(s.values())) for s in inst["shardAssignments"]["runnerToShard"].values()]
        assert len(shards) == width and sorted(s["deviceRank"] for s in shards) == list(range(width))
        layers = sorted((s["startLayer"], s["endLayer"]) for s in shards)
        assert layers[0][0] == 0 and layers[-1][1] == 30 and all(x[1] == y[0] for x, y in itertools.pairwise(layers))
        assert greedy_tokens(nodes[1], SMOLLM2, PROMPTS) == reference["tokens"]
        rss = runner_rss(nodes)
        mine = [rss[r] for r in inst["shardAssignments"]["runnerToShard"]]
        print(
            f"\n{width}-rank pipeline: rank RSS {[m // MiB for m in mine]} MiB vs single-node "
            f"{reference['rss'] // MiB} MiB"
        )
        assert max(mine) < reference["rss"], "a pipeline rank holds as much as the whole model"
    finally:
        delete_all(a)


@pytest.mark.timeout(1500)  # the first run downloads (490 MB of wheels) and converts Qwen 0.5B
def test_a_two_way_tensor_instance_gives_the_single_node_tokens(nodes: list[NodeProcess]) -> None:
    a = nodes[0]
    prompts = PROMPTS[:2]
    place(a, QWEN, timeout=900)
    single = greedy_tokens(a, QWEN, prompts, max_tokens=24)
    delete_all(a)
    inst = place(a, QWEN, min_nodes=2, sharding="Tensor", timeout=900)
    try:
        kinds = {next(iter(s)) for s in inst["shardAssignments"]["runnerToShard"].values()}
        assert kinds == {"TensorShardMetadata"}
        assert greedy_tokens(a, QWEN, prompts, max_tokens=24) == single
    finally:
        delete_all(a)


@pytest.mark.timeout(600)
def test_killing_a_ranks_node_ends_the_stream_fails_the_instance_and_it_is_placed_again(
    nodes: list[NodeProcess],
) -> None:
    a = nodes[0]
    inst = place(a, SMOLLM2, min_nodes=2)
    ranks = inst["shardAssignments"]["nodeToRunner"]
    ids = {n.get("/node_id").json(): n for n in nodes}
    master = a.get("/v1/diagnostics/node").json()["runtime"]["masterNodeId"]
    api = next(n for i, n in ids.items() if i not in ranks)
    victim = next(n for i, n in ids.items() if i in ranks and i != master)  # a rank, not the master
    error, gap = kill_mid_stream(api, victim, SMOLLM2)
    reason = wait_placed_again(nodes, victim, inst)
    print(f"\nstream ended {gap:.2f} s after the kill ({error.get('message')!r}); instance failed: {reason}")
