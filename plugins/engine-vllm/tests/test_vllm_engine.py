"""engine-vllm against a real vLLM CPU server (slow: the venv installs once, ~3 min; a load ~30-90 s)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_engine_vllm.engine import VllmEngine
from skulk_engine_vllm.managed import PidRecord
from skulk_engine_vllm.models import SMOLLM2_CARD
from skulk_kernel.api import ChatMessage, ErrorChunk, SamplingParams, TextGenerationParams, TokenChunk, is_terminal
from skulk_testing.conformance import make_runner_spec
from vllm_fixtures import smollm2_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def params(text: str, max_tokens: int = 24) -> TextGenerationParams:
    return TextGenerationParams(
        model_id=SMOLLM2_CARD.model_id,
        messages=(ChatMessage(role="user", content=text),),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


@pytest.fixture(scope="module")
def session(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    folder = smollm2_folder(models_dir)
    os.environ["SKULK_VLLM_RUN_DIR"] = str(tmp_path_factory.mktemp("vllm-run"))
    spec = make_runner_spec(SMOLLM2_CARD, folder, backend="vllm-cpu")
    loaded = VllmEngine().load(spec, lambda done, total: None)
    try:
        yield loaded
    finally:
        loaded.close()


def test_chat_streams_real_text(session) -> None:
    chunks = list(session.generate("c1", params("What is the capital of France? Answer in one word."), lambda: False))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert sum(is_terminal(c) for c in chunks) == 1
    text = "".join(c.text for c in chunks if isinstance(c, TokenChunk))
    assert "paris" in text.lower(), text
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-1].stats.backend == "vllm-cpu"


def test_length_count_and_cancel(session) -> None:
    chunks = list(session.generate("c2", params("Tell me a long story.", 4), lambda: False))
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 4
    assert session.count_tokens(params("Tell me a long story.")) == chunks[-1].usage.prompt_tokens
    flag = {"on": False}
    got = []
    for chunk in session.generate("c3", params("Count from one to five hundred.", 500), lambda: flag["on"]):
        got.append(chunk)
        if len(got) == 3:
            flag["on"] = True
    assert got[-1].finish_reason == "cancelled" and len(got) < 12


def test_context_overflow_is_a_400_shaped_error(session) -> None:
    chunks = list(session.generate("c4", params("word " * 9000, 16), lambda: False))
    assert isinstance(chunks[-1], ErrorChunk) and chunks[-1].code == "context_length_exceeded", chunks[-1]


def test_kill_9_is_reported_with_the_reason(session) -> None:
    record = next(Path(os.environ["SKULK_VLLM_RUN_DIR"]).glob("*.pid.json"))
    server_pid = PidRecord.model_validate_json(record.read_text()).pid
    os.kill(server_pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while session.alive() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "killed by SIGKILL" in (session.alive() or "")
    (chunk,) = list(session.generate("c5", params("hi"), lambda: False))
    assert isinstance(chunk, ErrorChunk) and "SIGKILL" in chunk.message
