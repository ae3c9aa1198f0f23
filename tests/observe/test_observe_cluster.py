"""The observe plugin across three real node processes (Zenoh on loopback, bully election).

One cluster per test: API node A (not the master), master M, worker W (the only node allowed to
run the instance, pinned with `excluded_nodes`). W runs with SKULK_COMMIT=other, so it is the node
"running another version" that cluster diagnostics must flag.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Cluster, place, stream_chat, wait_instance_ready

WORDS = " ".join(f"w{i}" for i in range(40))  # 40 tokens: three decode batches of 16


def _three(cluster: Cluster) -> tuple[Any, Any, Any, dict[str, str]]:
    """(api node, master, worker, ids) once all three agree."""
    for env in ({}, {}, {"SKULK_COMMIT": "other"}):
        cluster.start(env=env)
    master_id = cluster.wait_agreed(120)
    master = cluster.by_id(master_id)
    others = [n for n in cluster.nodes if n is not master]
    # W is the SKULK_COMMIT=other node (the last started) unless that one won the election
    worker = cluster.nodes[2] if cluster.nodes[2] is not master else others[1]
    api = next(n for n in others if n is not worker)
    ids = {"api": cluster.node_id(api), "master": master_id, "worker": cluster.node_id(worker)}
    ids["other_build"] = cluster.node_id(cluster.nodes[2])
    return api, master, worker, ids


def _trace(node: Any, trace_id: str, want: set[str], timeout: float = 15) -> dict[str, Any]:
    """The merged trace once it holds every span name in `want` (the last spans land after [DONE])."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = node.get(f"/v1/traces/{trace_id}")
        if response.status_code == 200:
            body = response.json()
            if want <= {s["name"] for s in body["spans"]}:
                return body
        time.sleep(0.3)
    raise AssertionError(f"trace {trace_id} never held {want}: {[s['name'] for s in body.get('spans', [])]}")


def test_traced_request_has_spans_from_all_three_nodes_in_causal_order(cluster_factory):
    cluster = cluster_factory()
    api, master, worker, ids = _three(cluster)
    instance_id = place(api, "skulk/echo", excluded=[ids["api"], ids["master"]])
    wait_instance_ready(api, instance_id, 120)

    response = httpx.put(api.url + "/v1/tracing", json={"enabled": True}, timeout=15)
    assert response.status_code == 200 and response.json() == {"enabled": True}
    for node in (api, master, worker):  # the flag is replicated State: every node must see it
        node.wait_until(lambda n=node: n.get("/v1/tracing").json()["enabled"], 10, "tracing on")

    trace_id, text = stream_chat(api, WORDS)
    assert text == WORDS
    want = {
        "api.request",
        "api.dispatch",
        "master.placement_wait",
        "master.task_created",
        "worker.task",
        "worker.runner_queue",
        "runner.prefill",
        "runner.decode_batch",
        "data_plane.send",
        "data_plane.receive",
        "master.task_finished",
        "api.stream_end",
    }
    trace = _trace(api, trace_id, want)
    spans = trace["spans"]
    by_node = {nid: {s["name"] for s in spans if s["node_id"] == nid} for nid in trace["nodes"]}
    assert set(trace["nodes"]) == {ids["api"], ids["master"], ids["worker"]}, trace["nodes"]
    assert {"api.request", "api.dispatch", "data_plane.receive", "api.stream_end"} <= by_node[ids["api"]]
    assert {"master.placement_wait", "master.task_created", "master.task_finished"} <= by_node[ids["master"]]
    assert {"worker.task", "worker.runner_queue", "runner.prefill", "runner.decode_batch", "data_plane.send"} <= (
        by_node[ids["worker"]]
    )
    assert not by_node[ids["api"]] & {"worker.task", "runner.prefill"}  # each node records only itself

    # causal order: the list is sorted by start, and each hop starts after the one that caused it
    starts = [s["start_ns"] for s in spans]
    assert starts == sorted(starts)
    first = {}
    for i, s in enumerate(spans):
        first.setdefault(s["name"], i)
    chain = [
        "api.request",
        "master.placement_wait",
        "master.task_created",
        "worker.task",
        "runner.prefill",
        "runner.decode_batch",
        "data_plane.send",
        "data_plane.receive",
        "api.stream_end",
    ]
    assert [first[n] for n in chain] == sorted(first[n] for n in chain), [(n, first[n]) for n in chain]
    assert spans[0]["name"] == "api.request" and spans[0]["node_id"] == ids["api"]
    batches = [s for s in spans if s["name"] == "runner.decode_batch"]
    assert sum(int(s["attributes"]["chunks"]) for s in batches) == 40  # every chunk after the first (39 + terminal)
    root = next(s for s in spans if s["name"] == "api.request")
    assert all(s["parent_id"] for s in spans if s is not root)
    assert {s["parent_id"] for s in spans if s["name"].startswith("master.")} == {root["span_id"]}

    # the same trace from the worker node, and exported
    assert {s["span_id"] for s in _trace(worker, trace_id, want)["spans"]} == {s["span_id"] for s in spans}
    otlp = api.get(f"/v1/traces/{trace_id}?format=otlp").json()
    assert len(otlp["resourceSpans"]) == 3
    exported = [sp for r in otlp["resourceSpans"] for sc in r["scopeSpans"] for sp in sc["spans"]]
    assert len(exported) == len(spans) and len({sp["traceId"] for sp in exported}) == 1
    assert all(len(sp["traceId"]) == 32 and len(sp["spanId"]) == 16 for sp in exported)
    chrome = api.get(f"/v1/traces/{trace_id}?format=chrome").json()
    complete = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(spans) and len({e["pid"] for e in complete}) == 3
    assert api.get(f"/v1/traces/{trace_id}?format=xml").status_code == 400

    # tracing off: a request leaves no span on any node
    response = httpx.put(api.url + "/v1/tracing", json={"enabled": False}, timeout=15)
    assert response.status_code == 200
    for node in (api, master, worker):
        node.wait_until(lambda n=node: not n.get("/v1/tracing").json()["enabled"], 10, "tracing off")
    before = {cluster.node_id(n): n.get("/v1/diagnostics/node").json()["observe"]["traces"] for n in cluster.nodes}
    untraced, _ = stream_chat(api, WORDS)
    time.sleep(1.0)  # the late spans of a traced request would have landed by now
    missing = api.get(f"/v1/traces/{untraced}")
    assert missing.status_code == 404 and "tracing is off" in missing.json()["error"]["message"]
    for node in cluster.nodes:
        assert node.get(f"/v1/observe/local/spans/{untraced}").json()["spans"] == []
        assert node.get("/v1/diagnostics/node").json()["observe"]["traces"] == before[cluster.node_id(node)]

    # cluster diagnostics from every node: all three, answered, and W's other build flagged
    for node in (api, master, worker):
        view = node.get("/v1/diagnostics/cluster", timeout=20).json()
        assert {n["nodeId"] for n in view["nodes"]} == {ids["api"], ids["master"], ids["worker"]}
        assert view["answered"] == 3 and all(n["answered"] for n in view["nodes"]), view
        assert all(n["report"]["masterNodeId"] == ids["master"] for n in view["nodes"])
        flagged = {n["nodeId"] for n in view["nodes"] if n["versionMismatch"]}
        assert flagged == {ids["other_build"]}, view["mismatches"]
        commit = next(m for m in view["mismatches"] if m["field"] == "skulkCommit")
        assert commit["nodes"] == [ids["other_build"]] and commit["values"][ids["other_build"]] == "other"
        assert not [m for m in view["mismatches"] if m["field"] == "masterNodeId"]

    proxied = api.get(f"/v1/diagnostics/cluster/{ids['other_build']}").json()
    assert proxied["diagnostics"]["runtime"]["nodeId"] == ids["other_build"]
    assert proxied["diagnostics"]["runtime"]["skulkCommit"] == "other"
    assert api.get("/v1/diagnostics/cluster/no-such-node").status_code == 404

    # the timeline: the task's events once each, seen by all three, and W's runner phases
    timeline = master.get("/v1/diagnostics/cluster/timeline?limit=5000", timeout=20).json()
    entries = timeline["entries"]
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    created = [e for e in entries if e.get("type") == "TaskCreated" and untraced in e.get("detail", "")]
    assert len(created) == 1 and sorted(created[0]["seenBy"]) == sorted({ids["api"], ids["master"], ids["worker"]})
    phases = [e for e in entries if e["kind"] == "phase" and e.get("taskId") == untraced]
    assert [p["phase"] for p in phases][:4] == ["task_queued", "task_started", "prefill", "first_token"]
    assert {p["nodeId"] for p in phases} == {ids["worker"]}

    # performance envelopes learned from the two requests served through A
    envelopes = worker.get("/v1/diagnostics/performance-envelopes", timeout=20).json()["envelopes"]
    echo = next(e for e in envelopes if e["modelId"] == "skulk/echo")
    assert echo["engine"] == "echo-cpu" and echo["samples"] >= 2 and echo["decodeTokensPerSecond"] > 0

    # /metrics parses with the Prometheus parser, on every node
    for node in cluster.nodes:
        text = node.get("/metrics").text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert "skulk_is_master" in families and "skulk_runners" in families
        assert families["skulk_is_master"].samples[0].value == (1.0 if node is master else 0.0)
    api_families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
    done = [s for s in api_families["skulk_requests"].samples if s.name == "skulk_requests_total"]
    assert sum(s.value for s in done) == 2


def test_config_converges_on_every_node_and_survives_master_failover(cluster_factory):
    cluster = cluster_factory()
    for _ in range(3):
        cluster.start()
    master_id = cluster.wait_agreed(120)
    master = cluster.by_id(master_id)
    writer = next(n for n in cluster.nodes if n is not master)

    response = httpx.put(writer.url + "/config", json={"log_level": "debug", "hub_token": "s3cr3t"}, timeout=15)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 2.0  # the acceptance: visible everywhere within 2 s of the PUT
    pending = list(cluster.nodes)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if n.get("/config").json()["settings"].get("log_level") != "DEBUG"]
        time.sleep(0.05)
    assert not pending, "the setting did not reach every node within 2 s"
    for node in cluster.nodes:
        settings = node.get("/config").json()["settings"]
        assert settings["hub_token"] == {"secret": True, "set": True}
        assert "s3cr3t" not in node.get("/state").text and "s3cr3t" not in node.get("/events").text

    bad = httpx.put(writer.url + "/config", json={"log_level": "loud"}, timeout=15)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "log_level"
    assert httpx.put(writer.url + "/config", content=b"[1]", timeout=15).status_code == 400

    master.kill(signal.SIGKILL)
    survivors = [n for n in cluster.nodes if n is not master]
    new_master = cluster.wait_agreed(120)
    assert new_master != master_id
    for node in survivors:
        assert node.get("/config").json()["settings"]["log_level"] == "DEBUG"
    # the new master takes changes too, and they still converge
    other = next(n for n in survivors if cluster.node_id(n) != new_master)
    response = httpx.put(other.url + "/config", json={"trace_ttl_s": 60, "log_level": None}, timeout=15)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 2.0
    pending = list(survivors)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if n.get("/config").json()["settings"].get("trace_ttl_s") != 60.0]
        time.sleep(0.05)
    assert not pending
    for node in survivors:
        settings = node.get("/config").json()["settings"]
        assert "log_level" not in settings and settings["hub_token"] == {"secret": True, "set": True}
