"""The conformance suites run against real and toy implementations, and catch broken ones."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from skulk_kernel.tasks import ChatMessage, Chunk, TextGenerationParams, TokenChunk
from skulk_testing.conformance import (
    ApiAdapterConformance,
    ElectionConformance,
    InferenceMiddlewareConformance,
    PlannerConformance,
)


class TestMemoryPlanner(PlannerConformance):
    @pytest.fixture
    def planner(self) -> Any:
        planner = pytest.importorskip("skulk_master.planner")
        return planner.MemoryPlanner()


class LoneElection:
    """Elects the only node it knows about: the smallest election there is."""

    name = "lone"

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    async def start(self, node: Any, on_change: Any) -> None:
        async def run() -> None:
            await on_change(None)
            await asyncio.sleep(0.01)
            await on_change(node.node_id)

        self.task = asyncio.create_task(run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


class TestLoneElection(ElectionConformance):
    @pytest.fixture
    def election(self) -> LoneElection:
        return LoneElection()


class PlainTextAdapter:
    """A toy wire format: {"model": ..., "prompt": ...} in, newline-delimited JSON out."""

    name = "plain"

    def to_params(self, body: dict[str, Any]) -> TextGenerationParams:
        return TextGenerationParams(
            model_id=body["model"], messages=(ChatMessage(role="user", content=body["prompt"]),)
        )

    async def stream(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            text = chunk.text if isinstance(chunk, TokenChunk) else getattr(chunk, "message", "")
            yield json.dumps({"text": text, "done": chunk.finish_reason is not None}).encode() + b"\n"


class TestPlainTextAdapter(ApiAdapterConformance):
    @pytest.fixture
    def adapter(self) -> PlainTextAdapter:
        return PlainTextAdapter()

    @pytest.fixture
    def request_body(self) -> dict[str, Any]:
        return {"model": "skulk/echo", "prompt": "hello"}


class UpperCaser:
    """A toy middleware: shouts every user message, counts chunks."""

    def __init__(self) -> None:
        self.seen = 0

    def transform(self, command: Any) -> Any:
        messages = tuple(m.model_copy(update={"content": (m.content or "").upper()}) for m in command.params.messages)
        return command.model_copy(update={"params": command.params.model_copy(update={"messages": messages})})

    def observe(self, command: Any, chunk: Any) -> None:
        self.seen += 1


class TestUpperCaser(InferenceMiddlewareConformance):
    @pytest.fixture
    def middleware(self) -> UpperCaser:
        return UpperCaser()


# ============================== the suites catch broken implementations ==========================

BROKEN = '''
import pytest
from skulk_kernel.contracts import EngineProbe
from skulk_kernel.tasks import TokenChunk, Usage
from skulk_kernel.transport_local import LocalTransport
from skulk_engine_echo.engine import EchoEngine, EchoSession, ECHO_MODEL, echo_cards
from skulk_testing.conformance import EngineConformance, TransportConformance, make_runner_spec


class SloppySession(EchoSession):
    """Numbers chunks from 1, never stops early, ignores max_tokens, ends twice."""

    def generate(self, command_id, params, cancelled):
        words = (params.messages[-1].content or "").split()
        for i, word in enumerate(words):
            yield TokenChunk(command_id=command_id, seq=i + 1, text=word)
        yield TokenChunk(command_id=command_id, seq=len(words) + 1, text="", finish_reason="stop",
                         usage=Usage(prompt_tokens=1, completion_tokens=len(words)))
        yield TokenChunk(command_id=command_id, seq=len(words) + 2, text="", finish_reason="stop")


class SloppyEngine(EchoEngine):
    name = "sloppy"

    def backend_tags(self, facts):
        return ["cpu"]  # not <engine>-<compute>

    def load(self, spec, progress):
        progress(2, 1)
        return SloppySession(spec, 0.0)


class TestSloppyEngine(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls):
        return SloppyEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls):
        return make_runner_spec(echo_cards()[ECHO_MODEL])


class HalfSession(EchoSession):
    """Declares Transcription but only refuses speech."""

    def synthesize(self, command_id, params, cancelled):
        raise NotImplementedError("the half engine does not synthesize")


class HalfEngine(EchoEngine):
    name = "half"
    tasks = frozenset({"TextGeneration", "TextEmbedding", "Transcription"})

    def load(self, spec, progress):
        progress(1, 1)
        return HalfSession(spec, 0.0)


class TestHalfEngine(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls):
        return HalfEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls):
        return make_runner_spec(echo_cards()[ECHO_MODEL])


class DeafTransport(LocalTransport):
    """Never hears its own publications."""

    async def publish(self, topic, payload):
        pass


class TestDeafTransport(TransportConformance):
    delivery_timeout_s = 0.2

    @pytest.fixture
    def transport(self):
        return DeafTransport()
'''


def test_suites_fail_broken_implementations(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text(textwrap.dedent(BROKEN))
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            str(tmp_path / "test_broken.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    outcome = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcome[f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"] = (
            "failed" if failed else "skipped" if skipped else "passed"
        )
    must_fail = {
        "TestSloppyEngine::test_backend_tags",
        "TestSloppyEngine::test_load_reports_progress",
        "TestSloppyEngine::test_generate_stream_is_well_formed",
        "TestSloppyEngine::test_max_tokens_finishes_with_length",
        "TestSloppyEngine::test_cancellation_stops_early",
        "TestHalfEngine::test_session_serves_every_declared_kind",
        "TestHalfEngine::test_session_has_no_refusal_stubs",
        "TestHalfEngine::test_no_method_only_refuses",
        "TestDeafTransport::test_own_messages_are_delivered",
        "TestDeafTransport::test_order_is_kept_per_topic",
    }
    assert {k: outcome.get(k) for k in must_fail} == dict.fromkeys(must_fail, "failed")
    assert outcome["TestSloppyEngine::test_declares_the_engine_contract"] == "passed"
    assert outcome["TestSloppyEngine::test_count_tokens"] == "passed"
    assert outcome["TestSloppyEngine::test_session_serves_every_declared_kind"] == "passed"
    assert outcome["TestHalfEngine::test_declares_the_engine_contract"] == "passed"
    assert outcome["TestHalfEngine::test_generate_stream_is_well_formed"] == "passed"
    assert outcome["TestDeafTransport::test_declares_the_transport_contract"] == "passed"
