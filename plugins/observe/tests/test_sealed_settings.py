"""A secret nodes must send on (`hub_token`) is sealed with the cluster secret: State holds only
ciphertext, every node of the cluster opens it, another cluster's node cannot, and a node without a
cluster secret refuses to store it with a message that says what to do."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_kernel.api import State
from skulk_observe import config as cfg
from skulk_transport_zenoh.secret import encode_token


def _node(home: Path, token: str | None) -> Any:
    options = SimpleNamespace(home=home, extra={"join_token": token} if token else {})
    return SimpleNamespace(node_id="n1", state=State(), options=options)


def _apply(node: Any, events: list[Any]) -> None:
    data = {e.key: e.value for e in events}
    node.state = node.state.model_copy(update={"plugin_data": {"observe": data}})


def test_sealed_for_the_cluster_and_opened_only_by_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKULK_JOIN_TOKEN", raising=False)
    token = encode_token(os.urandom(32))
    a = _node(tmp_path / "a", token)
    events = cfg.events_for(a, {"hub_token": "hf_secret_value"})
    assert "hf_secret_value" not in repr(events)
    _apply(a, events)
    b = _node(tmp_path / "b", token)  # another node of the same cluster
    b.state = a.state
    assert cfg.unseal(b, "hub_token") == "hf_secret_value"
    assert cfg.public_view(b)["settings"]["hub_token"] == {"secret": True, "set": True}
    stranger = _node(tmp_path / "c", encode_token(os.urandom(32)))
    stranger.state = a.state
    assert cfg.unseal(stranger, "hub_token") is None
    assert not cfg.secret_matches(b, "hub_token", "hf_secret_value")  # sealed, not a digest


def test_no_cluster_secret_refuses_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKULK_JOIN_TOKEN", raising=False)
    monkeypatch.setattr("skulk_transport_zenoh.secret.user_default_dir", lambda: tmp_path / "no-user-secret")
    with pytest.raises(cfg.ConfigError, match="sealed with the cluster secret"):
        cfg.events_for(_node(tmp_path, None), {"hub_token": "hf_x"})
