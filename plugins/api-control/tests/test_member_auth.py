"""Member tokens ([hosts] 3): minted from the cluster secret, bound to method, path and time."""

from __future__ import annotations

import time
from types import SimpleNamespace

from skulk_api_control.member_auth import HEADER, MAX_AGE_S, check, member_headers, mint

KEY, OTHER = b"k" * 32, b"o" * 32


def test_a_token_proves_the_member_for_its_method_and_path_only() -> None:
    token = mint(KEY, "node-a", "GET", "/v1/diagnostics/node")
    assert check(KEY, token, "GET", "/v1/diagnostics/node") == "node-a"
    assert check(KEY, token, "GET", "/state") is None  # another route
    assert check(KEY, token, "POST", "/v1/diagnostics/node") is None  # another method
    assert check(OTHER, token, "GET", "/v1/diagnostics/node") is None  # another cluster's secret
    _, stamp, mac = token.split(".")
    assert check(KEY, f"node-b.{stamp}.{mac}", "GET", "/v1/diagnostics/node") is None  # another node's name
    assert check(KEY, "garbage", "GET", "/") is None and check(KEY, "a.b.c", "GET", "/") is None


def test_a_token_expires() -> None:
    old = mint(KEY, "node-a", "GET", "/x", now=time.time() - MAX_AGE_S - 5)
    assert check(KEY, old, "GET", "/x") is None
    assert check(KEY, mint(KEY, "node-a", "GET", "/x", now=time.time() - 5), "GET", "/x") == "node-a"


def test_headers_sign_the_path_the_server_sees(monkeypatch) -> None:
    monkeypatch.setattr("skulk_api_control.member_auth.member_key", lambda node: KEY)
    node = SimpleNamespace(node_id="node-a")
    sent = member_headers(node, "POST", "http://10.0.0.2:52415/store/models/org%2Fm/download?x=1")
    assert check(KEY, sent[HEADER], "POST", "/store/models/org/m/download") == "node-a"
    monkeypatch.setattr("skulk_api_control.member_auth.member_key", lambda node: None)
    assert member_headers(node, "GET", "/x") == {}  # no cluster secret: no token
