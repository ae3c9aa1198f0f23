"""Two real node processes over Zenoh for the speech acceptance tests: an API node and a speech node.

The speech models (the Piper voice, Whisper tiny.en) are placed on the second node only, so every
request to the first node crosses the data plane: text and results as chunks, uploads as verified
upload pieces. Each test module gets a fresh SKULK_NETWORK_VERSION, so no other cluster joins; the
nodes (process groups, runners included) are killed at the end whatever happened.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from skulk_testing.nodes import NodeProcess, start_node

PIPER = "rhasspy/piper-en_US-joe-medium"
WHISPER = "Systran/faster-whisper-tiny.en"

PROFILE = """
[profile]
name = "speech-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "store", "speech", "api-control", "api-openai",
           "providers"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.speech]
deterministic = true
"""

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a hundred years. "
    "Every night the keeper climbed the stairs and lit the great lamp. "
    "Ships far out at sea could see the light and knew where the rocks were hidden. "
    "One winter a storm broke the windows, but the keeper repaired them before dark. "
    "Today the lamp runs by itself, and visitors climb the same stairs to watch the sunset."
)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference length."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)] / max(1, len(ref))


@dataclass
class SpeechCluster:
    api: NodeProcess
    speech: NodeProcess
    speech_id: str
    api_id: str


def _master_agreed(nodes: list[NodeProcess]) -> bool:
    views = [n.get("/v1/diagnostics/node").json() for n in nodes]
    masters = {v["runtime"]["masterNodeId"] for v in views}
    members = {len(n.state()["topology"]["nodes"]) for n in nodes}
    return len(masters) == 1 and None not in masters and members == {len(nodes)}


@pytest.fixture(scope="module")
def speech_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpeechCluster]:
    tmp = tmp_path_factory.mktemp("speech")
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_NETWORK_VERSION": f"sp{uuid.uuid4().hex[:10]}", "SKULK_SPEECH_SPOOL": str(tmp / "spool")}
    nodes: list[NodeProcess] = []
    try:
        for i in range(2):
            nodes.append(start_node(str(profile), "--node-name", f"s{i}", home=tmp / f"node{i}", env=env))
        for node in nodes:
            node.wait_api(90)
        api, speech = nodes
        api.wait_until(lambda: _master_agreed(nodes), 90, "one master and both nodes in the topology")
        api_id, speech_id = api.get("/node_id").json(), speech.get("/node_id").json()
        for model in (PIPER, WHISPER):
            # the speech node needs telemetry in before a placement can exclude the API node
            api.wait_until(
                lambda m=model: (
                    api.post("/place_instance", json={"model_id": m, "excluded_nodes": [api_id]}).status_code == 200
                ),
                60,
                f"placing {model}",
            )
        api.wait_ready(PIPER, 180)
        api.wait_ready(WHISPER, 180)
        yield SpeechCluster(api=api, speech=speech, speech_id=speech_id, api_id=api_id)
    finally:
        for node in nodes:
            node.stop()
        time.sleep(0.2)
