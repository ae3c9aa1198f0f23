"""Issue [resume] acceptance: a generation survives the SIGKILL of the node serving it.

Real node processes (an API node that is the master, SmolLM2 replicas on worker nodes), the real
model on llama.cpp, greedy decoding: the resumed answer must equal an uninterrupted run's text
exactly, through every API, streaming and not. Never resumed: a client cancel, a 400; with one
replica the stream still ends with an error, fast.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import CHAT_MODEL
from tests.resume.conftest import Fabric, open_tasks

pytestmark = pytest.mark.slow
STORY = "Write a long story about a fox who learns to sail across the ocean."
TOKENS = 200
KILL_AFTER = 50


def lines(url: str, body: dict[str, Any]) -> Iterator[tuple[float, str]]:
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            yield time.monotonic(), line


def chat_deltas(line: str) -> str | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    data = json.loads(line[6:])
    assert "error" not in data, data
    return "".join((c.get("delta") or {}).get("content") or "" for c in data.get("choices") or ()) or None


def messages_deltas(line: str) -> str | None:
    if not line.startswith("data: "):
        return None
    data = json.loads(line[6:])
    assert data.get("type") != "error", data
    return (data.get("delta") or {}).get("text") if data.get("type") == "content_block_delta" else None


def ollama_deltas(line: str) -> str | None:
    if not line.strip():
        return None
    data = json.loads(line)
    assert "error" not in data, data
    return (data.get("message") or {}).get("content") or None


def output_tokens(api: str, line: str) -> int | None:
    """The answer's output-token count, from the line of `api`'s stream that carries it."""
    if api == "ollama":
        data = json.loads(line) if line.strip() else {}
        return data.get("eval_count") if data.get("done") else None
    if not line.startswith("data: {"):
        return None
    data = json.loads(line[6:])
    if api == "chat":
        return (data.get("usage") or {}).get("completion_tokens")
    return (data.get("usage") or {}).get("output_tokens") if data.get("type") == "message_delta" else None


STREAMS: dict[str, tuple[str, Callable[[str], str | None], dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        chat_deltas,
        {"max_tokens": TOKENS, "temperature": 0, "stream_options": {"include_usage": True}},
    ),
    "messages": ("/v1/messages", messages_deltas, {"max_tokens": TOKENS, "temperature": 0}),
    "ollama": ("/api/chat", ollama_deltas, {"options": {"num_predict": TOKENS, "temperature": 0}}),
}


def streamed(fabric: Fabric, api: str, kill_after: int | None) -> tuple[str, list[float], float | None, int | None]:
    """(text, delta arrival times, kill time, output tokens) of one streamed greedy story through `api`."""
    path, parse, extra = STREAMS[api]
    body = {"model": CHAT_MODEL, "stream": True, "messages": [{"role": "user", "content": STORY}], **extra}
    text, times, killed, used = "", [], None, None
    for at, line in lines(fabric.api.url + path, body):
        used = output_tokens(api, line) or used
        delta = parse(line)
        if delta:
            text += delta
            times.append(at)
            if kill_after is not None and killed is None and len(times) >= kill_after:
                fabric.kill_serving()
                killed = time.monotonic()
    return text, times, killed, used


def diverged(text: str, baseline: str) -> str:
    """Where two answers part, for a failure message."""
    parts = (i for i, (a, b) in enumerate(zip(text, baseline, strict=False)) if a != b)
    at = next(parts, min(len(text), len(baseline)))
    return f"char {at}: {text[max(0, at - 30) : at + 30]!r} vs {baseline[max(0, at - 30) : at + 30]!r}"


def gap_after(times: list[float], killed: float) -> float:
    """The longest pause between two deltas around the kill (the client's view of the failover)."""
    i = next(i for i, t in enumerate(times) if t >= killed)
    return max(b - a for a, b in zip(times[i - 1 :], times[i:], strict=False))


@pytest.mark.parametrize("api", ["chat", "messages", "ollama"])
def test_a_killed_node_mid_stream_the_client_gets_the_uninterrupted_answer(fabric: Fabric, api: str) -> None:
    fabric.replicas(2)
    baseline, _, _, baseline_used = streamed(fabric, api, None)
    (text, times, killed, used), after = fabric.resumed_once(lambda: streamed(fabric, api, KILL_AFTER))
    assert killed is not None
    prefix, done = text[: after["lastPrefixChars"]], after["lastPrefixTokens"]
    # what the client had when the node died is the uninterrupted answer's start, to the character
    assert KILL_AFTER <= done < TOKENS and prefix == baseline[: len(prefix)]
    # the rest continues it: the whole budget, counted once (usage adds up over both instances)
    assert baseline_used == used == TOKENS, (baseline_used, used)
    # the survivor wrote the rest, without starting over; how much of it is the box's timing: the
    # node runs ahead of a client that reads behind (the project's CI: 180 of 200 tokens sent
    # when the client had read its 50th delta)
    assert len(text) > len(prefix) and not text[len(prefix) :].startswith(prefix[-40:])
    # greedy, same model and engine build: the resumed answer is the uninterrupted one (the engine
    # continues from the streamed token ids, evaluated as exactly as the dead run had them)
    assert text == baseline, f"{api}: the resumed answer left the uninterrupted one at {diverged(text, baseline)}"
    gap = gap_after(times, killed)
    print(f"{api}: resume gap {gap * 1000:.0f} ms after {KILL_AFTER} of {len(times)} deltas")
    # The pause is the survivor's cold prefill of prompt + prefix (under 2 s on a quiet box; seconds on
    # this shared one): bench/bench_resume.py measures it against that prefill. Here: no timeout waited.
    assert gap < 20, f"the stream paused {gap:.2f}s around the kill"


def test_a_non_streaming_response_survives_the_kill_with_usage_that_adds_up(fabric: Fabric) -> None:
    fabric.replicas(2)
    body = {"model": CHAT_MODEL, "input": STORY, "max_output_tokens": TOKENS, "temperature": 0}
    baseline = fabric.api.post("/v1/responses", json=body, timeout=120).json()

    def attempt() -> httpx.Response:
        outcome: dict[str, httpx.Response] = {}
        worker = threading.Thread(
            target=lambda: outcome.update(r=fabric.api.post("/v1/responses", json=body, timeout=120))
        )
        worker.start()
        try:
            serving = fabric.serving_node(ended=lambda: not worker.is_alive())
            time.sleep(0.6)  # tens of tokens into the answer
            if serving is not None and open_tasks(fabric.api.state()):
                fabric.live_workers()[serving].kill()
        finally:
            worker.join(120)
        return outcome["r"]

    response, after = fabric.resumed_once(attempt)
    assert response.status_code == 200, response.text
    got = response.json()

    def text(r: dict[str, Any]) -> str:
        return "".join(c["text"] for o in r["output"] if o["type"] == "message" for c in o["content"])

    prefix, done = text(got)[: after["lastPrefixChars"]], after["lastPrefixTokens"]
    # the kill lands at a time, not a token (the client sees nothing until the end): on a loaded box
    # the dead node may have written most of the answer, so the survivor's share is only "some"
    assert 0 < done < TOKENS and prefix == text(baseline)[: len(prefix)]
    assert len(text(got)) > len(prefix)
    assert text(got) == text(baseline), diverged(text(got), text(baseline))
    # usage adds up: the streamed ids the survivor was given count once, as output
    assert got["usage"]["output_tokens"] == baseline["usage"]["output_tokens"] == TOKENS
    assert got["usage"]["input_tokens"] == baseline["usage"]["input_tokens"]


def test_eight_concurrent_streams_split_over_two_replicas(fabric: Fabric) -> None:
    replicas = fabric.replicas(2)
    seen: dict[str, str] = {}
    done: list[bool] = []

    def one(i: int) -> None:
        body = {
            "model": CHAT_MODEL,
            "stream": True,
            "max_tokens": 48,
            "messages": [{"role": "user", "content": f"Tell me fact number {i} about foxes."}],
        }
        for _, _line in lines(fabric.api.url + "/v1/chat/completions", body):
            pass
        done.append(True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(done) < 8 and time.monotonic() < deadline:
            for task in open_tasks(fabric.api.state()):
                seen[task["commandId"]] = task["instanceId"]
            time.sleep(0.05)
    finally:
        for t in threads:
            t.join(120)
    counts = sorted(sum(1 for i in seen.values() if i == r) for r in replicas)
    assert sum(counts) == 8 and counts[0] >= 3, f"split {counts} of {len(seen)} seen"


def test_a_cancel_and_a_bad_request_are_never_resumed(fabric: Fabric) -> None:
    fabric.replicas(2)
    before = fabric.resumes()
    body = {"model": CHAT_MODEL, "stream": True, "max_tokens": TOKENS, "messages": [{"role": "user", "content": STORY}]}
    got = 0
    for _, line in lines(fabric.api.url + "/v1/chat/completions", body):
        got += bool(chat_deltas(line))
        if got >= 10:
            break  # the client leaves: a cancel
    deadline = time.monotonic() + 15
    while open_tasks(fabric.api.state()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not open_tasks(fabric.api.state()), "the cancelled request still runs"
    overflow = {"model": CHAT_MODEL, "max_tokens": 10**6, "messages": [{"role": "user", "content": "hi"}]}
    refused = fabric.api.post("/v1/chat/completions", json=overflow)
    assert refused.status_code == 400, refused.text
    after = fabric.resumes()
    assert after["failures"] == before["failures"] and after["resumed"] == before["resumed"], after


def test_with_one_replica_the_stream_ends_with_an_error_within_5s(fabric: Fabric) -> None:
    fabric.replicas(1)
    body = {"model": CHAT_MODEL, "stream": True, "max_tokens": TOKENS, "messages": [{"role": "user", "content": STORY}]}
    killed, error, ended = None, None, None
    for at, line in lines(fabric.api.url + "/v1/chat/completions", body):
        if line.startswith("data: {") and '"error"' in line:
            error = json.loads(line[6:])["error"]
        elif chat_deltas(line) and killed is None:
            fabric.kill_serving()
            killed = time.monotonic()
        ended = at
    assert killed is not None and error is not None, "the stream did not end with an error"
    assert ended is not None and ended - killed < 5, f"ended {ended - killed:.1f}s after the kill"
    assert fabric.resumes()["gaveUp"] >= 1
