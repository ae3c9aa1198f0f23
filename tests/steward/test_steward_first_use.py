"""`[plugins.steward] place = "on_first_use"` (profile auto): a node starts with no steward placed (a
first run downloads no steward model); the first request for `skulk/steward` places it, and once it
is ready the steward answers."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.steward.test_steward_cluster import _nodes, _profile, stewards, wait

pytestmark = pytest.mark.slow


def test_the_steward_is_placed_on_first_use_not_at_start(tmp_path: Path) -> None:
    profile = _profile(tmp_path, ["skulk/echo"], ["skulk/echo"])
    profile.write_text(profile.read_text() + 'place = "on_first_use"\n')
    (node,) = _nodes(tmp_path, profile, 1)
    try:
        node.wait_api(60)
        node.wait_ready("skulk/echo", timeout=60)
        time.sleep(3)  # three keeper ticks: with at_start the steward would be placed by now
        assert stewards(node) == []
        assert node.get("/v1/steward").json()["status"] == "on_first_use"
        body = {"model": "skulk/steward", "messages": [{"role": "user", "content": "How many nodes?"}]}
        first = node.post("/v1/chat/completions", json=body)
        assert first.status_code == 503 and "retry" in first.text  # the first use places it
        wait(lambda: node.get("/v1/steward").json()["ready"], 60, "the steward placed on first use")
        assert len(stewards(node)) == 1

        def answered() -> httpx.Response | None:
            got = node.post("/v1/chat/completions", json=body, timeout=60)
            return got if got.status_code == 200 else None

        assert wait(answered, 60, "an answer").json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        node.stop()
