"""Speech models on first use (on_demand.py), from a fake node: requests arriving together make
one placement; a placement the master refuses is a 409 with its reason, at once; with
place_on_request off the 404 stays."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_api_control.dispatch import InferenceError
from skulk_kernel.api import Outcome
from skulk_speech import on_demand

MODEL = "rhasspy/piper-en_US-joe-medium"


class FakeNode:
    def __init__(self, status: str, reason: str = "") -> None:
        self.node_id = f"n-{id(self)}"
        self.state = SimpleNamespace(instances={}, runners={})
        self.submitted: list[Any] = []
        self.status, self.reason, self.ready = status, reason, False

    async def submit(self, command: Any) -> Outcome:
        self.submitted.append(command)
        await asyncio.sleep(0.05)
        if self.status == "indexed":
            asyncio.get_running_loop().call_later(0.3, setattr, self, "ready", True)  # loaded a bit later
        return Outcome(command_id=command.command_id, status=self.status, reason=self.reason)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def unplaced(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve(node: Any, ref: str, task: str = "") -> str:
        raise InferenceError(404, "no running instance", code="model_not_placed")

    monkeypatch.setattr(on_demand, "resolve_model_id", resolve)
    monkeypatch.setattr(on_demand, "resolve_card", lambda node, ref: SimpleNamespace(model_id=MODEL))
    monkeypatch.setattr(on_demand, "serving_instances", lambda node, model_id: [1] if node.ready else [])


async def test_requests_arriving_together_make_one_placement_and_are_served() -> None:
    node = FakeNode("indexed")
    got = await asyncio.gather(*(on_demand.model_for(node, "tts-1", "SpeechSynthesis", True) for _ in range(10)))  # type: ignore[arg-type]
    assert got == [MODEL] * 10 and len(node.submitted) == 1
    assert node.submitted[0].model_id == MODEL


async def test_a_refused_placement_is_a_409_with_the_reason_at_once() -> None:
    node = FakeNode("refused", "needs 60 GiB; the largest node has 23 GiB free")
    began = time.monotonic()
    with pytest.raises(InferenceError) as caught:
        await on_demand.model_for(node, "tts-1", "SpeechSynthesis", True)  # type: ignore[arg-type]
    assert caught.value.status == 409 and "23 GiB free" in caught.value.message
    assert time.monotonic() - began < 1


async def test_off_keeps_the_404() -> None:
    node = FakeNode("indexed")
    with pytest.raises(InferenceError) as caught:
        await on_demand.model_for(node, "tts-1", "SpeechSynthesis", False)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_placed" and not node.submitted
