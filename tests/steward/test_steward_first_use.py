"""`[plugins.steward] place = "on_first_use"` (profile auto): a node starts with no steward placed (a
first run downloads no steward model); the first requests for `skulk/steward` (through the openai
SDK, no placement call) place one steward and wait for it, then the steward answers them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.steward.test_steward_cluster import _nodes, _profile, stewards

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
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "How many nodes?"}]

        def ask(_: int) -> str:  # the first requests wait for the steward to be placed and loaded
            reply = client.chat.completions.create(model="skulk/steward", messages=messages)  # type: ignore[arg-type]
            return reply.choices[0].message.role

        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(ask, range(3))) == ["assistant"] * 3
        assert len(stewards(node)) == 1 and node.get("/v1/steward").json()["ready"]
    finally:
        node.stop()
