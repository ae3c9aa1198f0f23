"""Unit tests of the observe plugin's parts (no node, no transport): spans and their merge and
exports, the trace store's expiry, the recorder's bounds, envelopes and the knee, config values
and secrets, the mismatch finder, and the API middleware against a stand-in node."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_kernel.api import (
    ChatMessage,
    ErrorChunk,
    PluginDataSet,
    ReadingStore,
    Services,
    State,
    TextGeneration,
    TextGenerationParams,
    TokenChunk,
    Usage,
)
from skulk_observe import OBSERVER, record_phase, record_span, tracing_on
from skulk_observe import config as cfg
from skulk_observe.cluster import mismatches
from skulk_observe.envelopes import Envelope, EnvelopeBook
from skulk_observe.middleware import ObserveMiddleware
from skulk_observe.recorder import FlightRecorder
from skulk_observe.service import ObserveConfig, Observer
from skulk_observe.spans import Span, TraceStore, merge, otlp_trace_id, span_id, to_chrome, to_otlp
from skulk_testing.conformance import PluginConformance


class TestObservePlugin(PluginConformance):
    plugin_name = "observe"
    hook_owners = ("api-control", "master")  # it implements register_api_routes and check_command


def _span(name: str, node: str, start: int, end: int | None = None, trace: str = "t1") -> Span:
    return Span(trace_id=trace, span_id=f"{name}-{node}", name=name, node_id=node, start_ns=start, end_ns=end or start)


def _node(tracing: bool = True) -> Any:
    node = SimpleNamespace(
        node_id="n1", state=State(tracing_enabled=tracing), services=Services(), readings=ReadingStore()
    )
    node.services.publish(OBSERVER, Observer(node, ObserveConfig()))  # type: ignore[arg-type]
    return node


# ------------------------------------------------------------------ spans


def test_merge_orders_by_corrected_start_then_causal_stage() -> None:
    api = [_span("api.request", "a", 100, 900), _span("api.stream_end", "a", 800)]
    # the worker's clock runs 1000 ns ahead: its spans sort after the API's start once corrected
    worker = [_span("worker.task", "w", 1_300, 1_600), _span("runner.prefill", "w", 1_300, 1_400)]
    master = [_span("master.task_created", "m", 150)]
    merged = merge([(api, 0), (worker, -1000), (master, 0)])
    assert [s.name for s in merged] == [
        "api.request",
        "master.task_created",
        "worker.task",  # same start as runner.prefill: the earlier stage first
        "runner.prefill",
        "api.stream_end",
    ]
    assert merged[2].start_ns == 300


def test_well_known_span_ids_are_shared_and_parents_resolve() -> None:
    node = _node()
    record_span(node, "c1", "worker.task", 1, 5, parent=None, span_id="worker.task")
    record_span(node, "c1", "runner.prefill", 2, 3, parent="worker.task")
    spans = {s.name: s for s in node.services.require(OBSERVER).traces.get("c1")}
    assert spans["worker.task"].span_id == span_id("c1", "worker.task")
    assert spans["worker.task"].parent_id == span_id("c1", "api.request")  # no parent given: the root
    assert spans["runner.prefill"].parent_id == spans["worker.task"].span_id


def test_nothing_is_recorded_with_tracing_off_or_without_the_plugin() -> None:
    node = _node(tracing=False)
    assert not tracing_on(node)
    record_span(node, "c1", "worker.task", 1, 2)
    assert node.services.require(OBSERVER).traces.trace_ids() == []
    bare = SimpleNamespace(state=State(tracing_enabled=True), services=Services())
    record_span(bare, "c1", "worker.task", 1, 2)  # type: ignore[arg-type]
    record_phase(bare, "r1", "prefill")  # type: ignore[arg-type]
    assert not tracing_on(bare)  # type: ignore[arg-type]


def test_trace_store_expires_and_stays_bounded() -> None:
    store = TraceStore(ttl_s=60, max_traces=3, max_spans_per_trace=2)
    for i in range(5):
        store.add(_span("api.request", "a", i, trace=f"t{i}"))
    assert store.trace_ids() == ["t2", "t3", "t4"]
    for _ in range(3):
        store.add(_span("runner.decode_batch", "a", 9, trace="t4"))
    assert len(store.get("t4")) == 2
    assert store.expire(now=time.time() + 30) == 0
    assert store.expire(now=time.time() + 61) == 3 and store.trace_ids() == []


def test_otlp_and_chrome_exports() -> None:
    spans = [_span("api.request", "a", 1_000, 9_000), _span("worker.task", "w", 2_000, 5_000)]
    spans[1].parent_id = spans[0].span_id
    spans[1].attributes = {"rank": 0, "ok": True, "tps": 1.5, "model": "m"}
    otlp = to_otlp("0b9e61b4-2a43-4f8b-9c8d-0f1e2d3c4b5a", spans, {"a": "alpha"})
    assert [r["resource"]["attributes"][1]["value"]["stringValue"] for r in otlp["resourceSpans"]] == ["a", "w"]
    worker = otlp["resourceSpans"][1]["scopeSpans"][0]["spans"][0]
    assert worker["traceId"] == "0b9e61b42a434f8b9c8d0f1e2d3c4b5a"
    assert worker["parentSpanId"] == spans[0].span_id and worker["startTimeUnixNano"] == "2000"
    values = {a["key"]: a["value"] for a in worker["attributes"]}
    assert values["rank"] == {"intValue": "0"} and values["ok"] == {"boolValue": True}
    assert values["tps"] == {"doubleValue": 1.5} and values["model"] == {"stringValue": "m"}
    assert len(otlp_trace_id("not-a-uuid")) == 32
    chrome = to_chrome(spans, {"a": "alpha"})
    events = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert [(e["ts"], e["dur"]) for e in events] == [(0.0, 8.0), (1.0, 3.0)]
    names = [e["args"]["name"] for e in chrome["traceEvents"] if e["ph"] == "M"]
    assert names[0].startswith("alpha")


# ------------------------------------------------------------------ recorder


def test_recorder_keeps_the_last_phases_per_runner_with_memory() -> None:
    import os

    rec = FlightRecorder(depth=4, max_runners=2)
    for i in range(6):
        rec.record("r1", f"p{i}", pid=os.getpid(), model_id="m")
    phases = rec.phases("r1")
    assert [p.phase for p in phases] == ["p2", "p3", "p4", "p5"]
    assert all(p.rss_bytes and p.rss_bytes > 0 for p in phases)
    assert rec.record("r1", "gone", pid=2**22 + 12345).rss_bytes is None  # no such process
    rec.record("r2", "a")
    rec.record("r3", "b")  # a third runner evicts the one heard from least recently
    assert {s["runnerId"] for s in rec.snapshot()} == {"r2", "r3"}


# ------------------------------------------------------------------ envelopes


def test_envelope_knee_and_rates() -> None:
    env = Envelope("hw", "m", "e", "q4")
    for c, per_stream in ((1, 100.0), (2, 95.0), (4, 60.0), (8, 30.0)):  # aggregate 100, 190, 240, 240
        env.add(c, per_stream, 500.0, 20.0)
    assert env.knee() == 4
    wire = env.wire()
    assert wire["singleStreamDecodeTokensPerSecond"] == 100.0 and wire["prefillTokensPerSecond"] == 500.0
    assert wire["byConcurrency"]["2"]["aggregateDecodeTokensPerSecond"] == 190.0
    lone = Envelope("hw", "m", "e", "q4")
    lone.add(1, 50.0, None, None)
    assert lone.knee() is None


def test_envelopes_from_several_nodes_merge_exactly() -> None:
    a, b = EnvelopeBook(), EnvelopeBook()
    a.observe(("hw", "m", "e", "q"), 1, 10.0, None, 5.0)
    b.observe(("hw", "m", "e", "q"), 1, 30.0, None, 15.0)
    merged = EnvelopeBook.merged([a.raw(), b.raw()])
    assert len(merged) == 1 and merged[0]["samples"] == 2 and merged[0]["decodeTokensPerSecond"] == 20.0


# ------------------------------------------------------------------ config


def test_config_validates_known_settings_and_names() -> None:
    assert cfg.stored_value("n", "log_level", "debug")["value"] == "DEBUG"
    with pytest.raises(cfg.ConfigError, match="log_level must be one of"):
        cfg.stored_value("n", "log_level", "loud")
    with pytest.raises(cfg.ConfigError, match="positive"):
        cfg.stored_value("n", "trace_ttl_s", -1)
    with pytest.raises(cfg.ConfigError, match="must match"):
        cfg.stored_value("n", "Bad Name", 1)
    with pytest.raises(cfg.ConfigError, match="larger than"):
        cfg.stored_value("n", "blob", "x" * 9000)
    assert cfg.stored_value("n", "anything", None) is None
    assert cfg.stored_value("n", "default_context_tokens", 2048)["value"] == 2048
    with pytest.raises(cfg.ConfigError, match="default_context_tokens must be a whole number"):
        cfg.stored_value("n", "default_context_tokens", "big")
    assert cfg.stored_value("n", "default_kv_cache_type", "q8_0")["value"] == "q8_0"
    with pytest.raises(cfg.ConfigError, match="default_kv_cache_type must be one of"):
        cfg.stored_value("n", "default_kv_cache_type", "q2")
    assert cfg.stored_value("n", "hub_endpoint", "http://127.0.0.1:9/")["value"] == "http://127.0.0.1:9"
    with pytest.raises(cfg.ConfigError, match="hub_endpoint must be an http"):
        cfg.stored_value("n", "hub_endpoint", "ftp://mirror")


def test_secrets_are_stored_as_digests_and_checkable() -> None:
    node = _node()
    entry = cfg.stored_value("n1", "hub_token", "s3cr3t")
    assert entry is not None and "s3cr3t" not in repr(entry) and entry["secret"]
    node.state = node.state.model_copy(update={"plugin_data": {"observe": {"config.hub_token": entry}}})
    assert cfg.public_view(node)["settings"] == {"hub_token": {"secret": True, "set": True}}
    assert cfg.secret_matches(node, "hub_token", "s3cr3t")
    assert not cfg.secret_matches(node, "hub_token", "guess")
    assert cfg.get(node, "hub_token") is None  # never handed out, even in process
    events = cfg.events_for(node, {"log_level": "INFO"})
    assert events == [PluginDataSet(plugin="observe", key="config.log_level", value=events[0].value)]
    with pytest.raises(cfg.ConfigError, match="at least one"):
        cfg.events_for(node, {})


# ------------------------------------------------------------------ mismatches


def test_mismatches_flag_the_odd_node_and_ignore_profile_differences() -> None:
    base = {"skulkVersion": "0.1.0", "skulkCommit": "", "masterNodeId": "a", "lastEventAppliedIdx": 7}
    summaries = {
        "a": {**base, "pluginVersions": {"skulk-worker": "0.1.0"}, "stateHash": "h"},
        "b": {**base, "pluginVersions": {"skulk-worker": "0.1.0", "skulk-engine-mlx": "0.1.0"}, "stateHash": "h"},
        "c": {**base, "skulkCommit": "other", "pluginVersions": {"skulk-worker": "0.2.0"}, "stateHash": "x"},
    }
    found = {m["field"]: m for m in mismatches(summaries, "a")}
    assert found["skulkCommit"]["nodes"] == ["c"]
    assert found["pluginVersions"]["nodes"] == ["c"] and found["pluginVersions"]["plugin"] == "skulk-worker"
    assert found["stateHash"]["nodes"] == ["c"]  # same index, different State: a divergence
    assert "masterNodeId" not in found and "lastEventAppliedIdx" not in found
    lagging = {**summaries, "c": {**summaries["b"], "lastEventAppliedIdx": 5, "stateHash": "old"}}
    lag = {m["field"]: m for m in mismatches(lagging, "a")}
    assert lag["lastEventAppliedIdx"]["transient"] and "stateHash" not in lag


# ------------------------------------------------------------------ middleware


def _command(cid: str) -> TextGeneration:
    params = TextGenerationParams(model_id="skulk/echo", messages=[ChatMessage(role="user", content="hi")])
    return TextGeneration(command_id=cid, owner_node_id="n1", params=params)  # type: ignore[arg-type]


def test_middleware_records_api_spans_only_when_traced() -> None:
    node = _node()
    mw = ObserveMiddleware(node)
    cmd = mw.transform(_command("c1"))
    mw.observe(cmd, TokenChunk(command_id="c1", seq=0, text="a"))
    mw.observe(cmd, TokenChunk(command_id="c1", seq=1, text="b"))
    done = TokenChunk(command_id="c1", seq=2, text="", finish_reason="stop", usage=Usage(completion_tokens=2))
    mw.observe(cmd, done)
    names = [s.name for s in node.services.require(OBSERVER).traces.get("c1")]
    assert names == ["api.dispatch", "data_plane.receive", "data_plane.receive", "api.stream_end", "api.request"]
    assert "c1" not in node.services.require(OBSERVER).requests

    node.state = State(tracing_enabled=False)
    cmd = mw.transform(_command("c2"))
    mw.observe(cmd, ErrorChunk(command_id="c2", seq=0, message="boom"))
    assert node.services.require(OBSERVER).traces.get("c2") == []
    assert "c2" not in node.services.require(OBSERVER).requests
