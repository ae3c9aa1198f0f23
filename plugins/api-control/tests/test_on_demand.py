"""Models on first use (on_demand.py), from a fake node: requests arriving together make one
placement; a placement the master refuses is a 409 with its reason, at once; with place_on_request
off the 404 stays; the placed instance is marked for keep_alive, and a request's own keep_alive
updates the mark."""

from __future__ import annotations

import asyncio
import contextvars
import time
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_api_control import on_demand
from skulk_api_control.dispatch import InferenceError
from skulk_kernel.api import Outcome, PlaceInstance, SetPluginData

MODEL = "rhasspy/piper-en_US-joe-medium"


class FakeNode:
    """Places one instance per PlaceInstance (loaded 0.3 s later); records what it was sent."""

    def __init__(self, status: str, reason: str = "", retryable: int = 0) -> None:
        self.node_id = f"n-{id(self)}"
        self.state = SimpleNamespace(instances={}, runners={}, plugin_data={}, instance_failures=())
        self.submitted: list[Any] = []
        self.status, self.reason, self.ready, self.retryable = status, reason, False, retryable

    async def submit(self, command: Any) -> Outcome:
        self.submitted.append(command)
        await asyncio.sleep(0.05)
        if isinstance(command, SetPluginData):
            data = self.state.plugin_data.setdefault(command.plugin, {})
            data.update(dict(command.entries))
            return Outcome(command_id=command.command_id, status="indexed")
        if self.retryable:
            self.retryable -= 1
            return Outcome(command_id=command.command_id, status="refused", reason="no telemetry yet", retryable=True)
        if self.status == "indexed":
            assignments = SimpleNamespace(model_id=command.model_id)
            self.state.instances[command.command_id] = SimpleNamespace(shard_assignments=assignments)
            asyncio.get_running_loop().call_later(0.3, setattr, self, "ready", True)  # loaded a bit later
        return Outcome(command_id=command.command_id, status=self.status, reason=self.reason)  # type: ignore[arg-type]

    def places(self) -> list[Any]:
        return [c for c in self.submitted if isinstance(c, PlaceInstance)]


@pytest.fixture(autouse=True)
def unplaced(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve(node: Any, ref: str, task: str = "") -> str:
        if not node.state.instances:
            raise InferenceError(404, "no running instance", code="model_not_placed")
        return MODEL

    monkeypatch.setattr(on_demand, "resolve_model_id", resolve)
    monkeypatch.setattr(on_demand, "resolve_card", lambda node, ref: SimpleNamespace(model_id=MODEL))
    monkeypatch.setattr(on_demand, "serving_instances", lambda node, model_id: [1] if node.ready else [])
    on_demand._PLACING.clear()


async def test_requests_arriving_together_make_one_placement_and_are_served() -> None:
    node = FakeNode("indexed")
    got = await asyncio.gather(*(on_demand.model_for(node, "tts-1", "SpeechSynthesis", True) for _ in range(10)))  # type: ignore[arg-type]
    assert got == [MODEL] * 10 and len(node.places()) == 1
    placed = node.places()[0]
    assert placed.model_id == MODEL and placed.if_absent  # several API nodes at once: still one instance
    assert node.state.plugin_data["master"] == {f"keep_alive/{placed.command_id}": {"seconds": None}}  # the default


async def test_a_refused_placement_is_a_409_with_the_reason_at_once() -> None:
    node = FakeNode("refused", "needs 60 GiB; the largest node has 23 GiB free")
    began = time.monotonic()
    with pytest.raises(InferenceError) as caught:
        await on_demand.model_for(node, "tts-1", "SpeechSynthesis", True)  # type: ignore[arg-type]
    assert caught.value.status == 409 and "23 GiB free" in caught.value.message
    assert time.monotonic() - began < 1


async def test_a_retryable_refusal_is_tried_again() -> None:
    node = FakeNode("indexed", retryable=2)
    assert await on_demand.model_for(node, "m", "TextGeneration", True) == MODEL  # type: ignore[arg-type]
    assert len(node.places()) == 3


async def test_off_keeps_the_404() -> None:
    node = FakeNode("indexed")
    with pytest.raises(InferenceError) as caught:
        await on_demand.model_for(node, "tts-1", "SpeechSynthesis", False)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_placed" and not node.submitted


async def test_the_request_keep_alive_marks_the_instance_and_a_later_one_updates_it() -> None:
    node = FakeNode("indexed")

    async def ask(keep: float | None) -> str:
        on_demand.note_keep_alive(keep)
        return await on_demand.model_for(node, "m", "TextGeneration", True)  # type: ignore[arg-type]

    await asyncio.create_task(ask(2.0), context=contextvars.Context())
    key = f"keep_alive/{node.places()[0].command_id}"
    assert node.state.plugin_data["master"] == {key: {"seconds": 2.0}}
    await asyncio.create_task(ask(-1.0), context=contextvars.Context())
    assert node.state.plugin_data["master"] == {key: {"seconds": -1.0}}
    sent = len(node.submitted)
    await asyncio.create_task(ask(-1.0), context=contextvars.Context())  # unchanged: nothing sent
    assert len(node.submitted) == sent and len(node.places()) == 1


@pytest.mark.parametrize(
    ("given", "seconds"), [("2s", 2.0), ("5m", 300.0), ("1h", 3600.0), (30, 30.0), (0, 0.0), (-1, -1.0), ("-1", -1.0)]
)
def test_ollama_keep_alive_values(given: Any, seconds: float) -> None:
    assert on_demand.parse_keep_alive(given) == seconds


@pytest.mark.parametrize("given", ["soon", "5 minutes", True, [1]])
def test_a_bad_keep_alive_says_what_to_write(given: Any) -> None:
    with pytest.raises(ValueError, match='"5m"'):
        on_demand.parse_keep_alive(given)
