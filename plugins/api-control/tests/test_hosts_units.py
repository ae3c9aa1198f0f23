"""[hosts] units: cluster-wide health reasons, the dashboard's routes' scopes, the signed-in link."""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_api_control.auth import route_scope
from skulk_api_control.state_view import plugin_reasons
from skulk_kernel.api import NodeHealthNotes, NodeIdentity
from skulk_kernel.readings import ReadingStore, SendFilter


def _node(notes: dict[str, dict[str, str]]) -> Any:
    return SimpleNamespace(node_id="a", health_notes=notes, readings=ReadingStore())


def test_another_nodes_notes_come_from_its_reading_and_name_it() -> None:
    node = _node({"hardware": {"conflict": "two engines claim the GPU"}})
    node.readings.put("c", NodeIdentity(node_id="c", friendly_name="gpu-box", skulk_version="0"))
    node.readings.put(
        "c", NodeHealthNotes(node_id="c", notes={"transport-zenoh": {"mismatched_peers": "x runs v2"}, "store": {}})
    )
    (theirs,) = plugin_reasons(node, "c")
    assert theirs["message"] == "transport-zenoh: mismatched_peers: x runs v2"
    assert (theirs["node"], theirs["nodeName"]) == ("c", "gpu-box") and theirs["remediation"].endswith("on gpu-box")
    (mine,) = plugin_reasons(node, "a")  # this node's own notes, not a reading
    assert mine["message"] == "hardware: conflict: two engines claim the GPU" and mine["node"] == "a"
    assert plugin_reasons(node, "b") == []  # never heard: nothing to say


def test_health_notes_are_sent_on_change() -> None:
    send = SendFilter()
    first = NodeHealthNotes(node_id="a", notes={"store": {"low_disk": "1 GiB"}})
    assert send.due(first)
    assert not send.due(NodeHealthNotes(node_id="a", notes={"store": {"low_disk": "1 GiB"}}))
    assert send.due(NodeHealthNotes(node_id="a", notes={}))  # cleared: sent at once


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/v1/whoami", "inference"),
        ("GET", "/v1/events/stream", "inference"),
        ("GET", "/state", "operator"),
        ("POST", "/place_instance", "operator"),
        ("POST", "/v1/whoami", "operator"),
    ],
)
def test_a_signed_in_chat_user_reads_the_stream_and_nothing_else(method: str, path: str, scope: str) -> None:
    assert route_scope(method, path) == scope


def test_the_printed_link_carries_the_key_in_the_fragment_on_the_lan_address(monkeypatch: Any) -> None:
    from skulk_api_control import keys_cli

    answers = {
        "/node_id": "n1",
        "/state": {"nodeResources": {"n1": {"addresses": ["192.168.1.7", "127.0.0.1"], "apiPort": 52415}}},
    }
    monkeypatch.setattr(keys_cli, "_call", lambda _args, _method, path, body=None: answers[path])
    link = keys_cli.dashboard_link(argparse.Namespace(url="http://127.0.0.1:52415", api_key=None), "skulk-ab-c/d")
    assert link == "http://192.168.1.7:52415/ui/#key=skulk-ab-c%2Fd"
    remote = keys_cli.dashboard_link(argparse.Namespace(url="http://10.0.0.2:52415/", api_key="k"), "skulk-x")
    assert remote == "http://10.0.0.2:52415/ui/#key=skulk-x"
