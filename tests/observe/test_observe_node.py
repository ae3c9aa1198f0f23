"""The observe plugin on one real node: a wedged runner in the flight recorder and the capture
bundle, JSON logs on request, and /metrics."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from skulk_testing.nodes import start_node

from .conftest import LOCAL_PROFILE, stream_chat


def _recorder(node) -> dict:
    return node.get("/v1/diagnostics/node").json()["observe"]


def test_a_wedged_runner_shows_its_last_phases_in_the_recorder_and_the_bundle(local_node):
    node = local_node.wait_ready("skulk/echo", 60)
    command_id, text = stream_chat(node, "a healthy request first")
    assert text == "a healthy request first"

    # /hang: the engine stops answering mid-request (no chunk, no cancellation check)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            node.url + "/v1/chat/completions",
            json={"model": "skulk/echo", "messages": [{"role": "user", "content": "/hang"}]},
            timeout=httpx.Timeout(10, read=3),
        )
    node.wait_until(lambda: _recorder(node)["stalledRunners"], 30, "the runner to be listed as stalled")
    section = _recorder(node)
    stalled = section["stalledRunners"][0]
    assert stalled["lastPhase"] == "prefill" and stalled["inFlight"] == 1
    runner = next(r for r in section["flightRecorder"] if r["runnerId"] == stalled["runnerId"])
    assert runner["modelId"] == "skulk/echo" and runner["lastPhase"] == "prefill"
    phases = runner["phases"]
    assert [p["phase"] for p in phases[:2]] == ["spawned", "RunnerLoading"]
    healthy = [p["phase"] for p in phases if p["taskId"] == command_id]
    assert healthy == ["task_queued", "task_started", "prefill", "first_token", "task_done"]
    hung_id = phases[-1]["taskId"]
    assert hung_id not in (None, command_id)
    hung = [p for p in phases if p["taskId"] == hung_id]
    assert [p["phase"] for p in hung] == ["task_queued", "task_started", "prefill"]  # never first_token
    rss = [p["rssBytes"] for p in phases if p["phase"] != "spawned"]
    assert all(isinstance(r, int) and r > 10 * 2**20 for r in rss)  # a Python runner holds > 10 MiB
    assert len(phases) <= 128

    response = node.post("/v1/diagnostics/node/capture")
    assert response.status_code == 200 and response.headers["content-type"] == "application/gzip"
    assert "attachment" in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        files = {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert {"versions.json", "recorder.json", "processes.json", "logs.txt", "diagnostics.json"} <= set(files)
    bundled = json.loads(files["recorder.json"])
    assert bundled["stalledRunners"][0]["runnerId"] == stalled["runnerId"]
    wedged = next(r for r in bundled["flightRecorder"] if r["runnerId"] == stalled["runnerId"])
    assert wedged["phases"][-1]["phase"] == "prefill" and wedged["phases"][-1]["taskId"] == hung[0]["taskId"]
    processes = json.loads(files["processes.json"])
    runner_pid = phases[-1]["pid"]
    assert processes[0]["pid"] == node.pid() and runner_pid in {p["pid"] for p in processes}
    versions = json.loads(files["versions.json"])
    assert versions["runtime"]["nodeId"] == node.get("/node_id").json()
    assert versions["distributions"]["skulk-observe"]
    assert b"skulk.worker" in files["logs.txt"]  # the node's recent log lines

    families = {f.name: f for f in text_string_to_metric_families(node.get("/metrics").text)}
    in_flight = families["skulk_local_runner_in_flight"].samples
    assert [s.value for s in in_flight if s.labels["runner"] == stalled["runnerId"]] == [1.0]


def test_json_logs_on_request(tmp_path):
    profile = tmp_path / "local.toml"
    profile.write_text(LOCAL_PROFILE)
    node = start_node(
        str(profile),
        "--log-format",
        "json",
        home=tmp_path / "home",
        env={"SKULK_NETWORK_VERSION": f"obs{uuid.uuid4().hex[:10]}"},
    )
    try:
        node.wait_api()
        node.wait_until(lambda: "started with profile" in node.log(), 30, "the start-up line")
        lines = [line for line in node.log().splitlines() if line.startswith("{")]
        records = [json.loads(line) for line in lines]
        started = [r for r in records if "started with profile" in r["message"]]
        assert started and started[0]["logger"] == "skulk.node" and started[0]["level"] == "INFO"
    finally:
        node.stop()
