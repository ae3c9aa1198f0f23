"""The chat contract, proven on SmolLM2-135M with both backends (server and in-process)."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from skulk_engine_llamacpp.events import (
    ContextLengthExceeded,
    Finish,
    TextDelta,
    ToolCallDelta,
)

pytestmark = pytest.mark.slow

BACKENDS = ["chat_server", "inproc"]
HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
LONG = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MARKUP = re.compile(r"<\|im_(start|end)\|>|</?tool_call>|</?tool_response>")


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.getfixturevalue(request.param)


def run(backend, messages, **kw):
    events = list(backend.chat(messages, **kw))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert isinstance(events[-1], Finish), events[-1:]
    assert sum(isinstance(e, Finish) for e in events) == 1
    return events, text, calls, events[-1]


def test_stream_produces_text_and_stop(backend):
    events, text, calls, fin = run(backend, HELLO, sampling={"max_tokens": 200, "temperature": 0})
    assert text.strip() and not calls
    assert fin.reason == "stop"
    assert sum(isinstance(e, TextDelta) for e in events) > 1  # streamed, not one blob
    assert fin.prompt_tokens == backend.count_tokens(HELLO)
    assert fin.completion_tokens >= len(events) - 2


def test_max_tokens_gives_length(backend):
    _, text, _, fin = run(backend, LONG, sampling={"max_tokens": 7, "temperature": 0})
    assert fin.reason == "length"
    assert fin.completion_tokens == 7
    assert text


def test_logprobs_tokens_join_to_content(backend):
    events, text, _, _ = run(
        backend, HELLO, sampling={"max_tokens": 24, "temperature": 0}, logprobs=True, top_logprobs=3
    )
    deltas = [e for e in events if isinstance(e, TextDelta)]
    lps = [lp for d in deltas for lp in d.logprobs]
    assert len(lps) == 24 or events[-1].reason == "stop"
    assert "".join(lp.token for lp in lps) == text
    for d in deltas:  # each delta carries exactly its own tokens
        assert "".join(lp.token for lp in d.logprobs) == d.text
    for lp in lps:
        assert lp.logprob <= 0.0
        assert 1 <= len(lp.top) <= 3
    if all(lp.bytes is not None for lp in lps):  # the server also gives exact bytes
        assert b"".join(bytes(lp.bytes) for lp in lps).decode("utf-8") == text


def test_seeded_sampling_is_reproducible(backend):
    s = {
        "max_tokens": 16,
        "temperature": 0.9,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 1234,
        "repeat_penalty": 1.1,
    }
    assert run(backend, LONG, sampling=s)[1] == run(backend, LONG, sampling=s)[1]


def test_stop_sequence(backend):
    _, text, _, fin = run(
        backend,
        [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        sampling={"max_tokens": 60, "temperature": 0, "stop": ["5"]},
    )
    assert "5" not in text and fin.reason == "stop"


def test_cancel_stops_within_a_couple_of_tokens(backend):
    got: list[object] = []
    start = time.monotonic()
    for ev in backend.chat(LONG, sampling={"max_tokens": 2000, "temperature": 0.7}, cancel=lambda: len(got) >= 3):
        assert not isinstance(ev, Finish)
        got.append(ev)
    assert len(got) == 3
    assert time.monotonic() - start < 30


def test_tools_prose_stays_clean(backend):
    _, text, calls, fin = run(
        backend,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
        sampling={"max_tokens": 60, "temperature": 0},
    )
    assert not MARKUP.search(text)
    assert fin.reason == ("tool_calls" if calls else fin.reason)
    for c in calls:
        assert c.name and c.arguments_json.startswith("{")


def test_tool_result_conversation_renders_and_stays_clean(backend):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "sunny"}'},
    ]
    _, text, _, _ = run(backend, messages, tools=TOOLS, sampling={"max_tokens": 40, "temperature": 0})
    assert not MARKUP.search(text)


# -- server-only properties ----------------------------------------------------------------


def _predicted_total(server) -> int:
    metrics = server._client().get("/metrics").text
    return int(float(re.search(r"^llamacpp:tokens_predicted_total (\S+)", metrics, re.M).group(1)))


def test_server_cancel_releases_the_slot(chat_server):
    before = _predicted_total(chat_server)
    got: list[object] = []
    for ev in chat_server.chat(LONG, sampling={"max_tokens": 2000, "temperature": 0.7}, cancel=lambda: len(got) >= 3):
        got.append(ev)
    # every slot frees once its hog is cancelled; a hog left running would hold its slot for all of its
    # 400 tokens (tens of seconds here): 15 s leaves room for a box loaded by the parallel suite
    deadline = time.monotonic() + 15
    while any(s["is_processing"] for s in chat_server.slots()):
        assert time.monotonic() < deadline, "slot still generating after cancel"
        time.sleep(0.02)
    assert _predicted_total(chat_server) - before <= len(got) + 3


def test_server_twenty_concurrent_streams(chat_server):
    def one(i: int):
        return run(
            chat_server,
            [{"role": "user", "content": f"Tell me fact number {i} about cats."}],
            sampling={"max_tokens": 16, "temperature": 0.8, "seed": i},
        )

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    assert len(results) == 20
    for _, text, _, fin in results:
        assert text and fin.reason in ("stop", "length") and fin.completion_tokens > 0


def test_server_context_length_exceeded(chat_server):
    assert chat_server.context_length == 8192
    with pytest.raises(ContextLengthExceeded):
        list(chat_server.chat([{"role": "user", "content": "word " * 9000}], sampling={"max_tokens": 4}))


def test_server_tool_template_keeps_the_original_prompt(chat_server):
    """Our tool-capable stand-in renders tool-less chats exactly like SmolLM2's own template."""
    from skulk_engine_llamacpp.templates import read_gguf_chat_template, render

    original = read_gguf_chat_template(chat_server.model_path)
    for messages in (HELLO, [{"role": "system", "content": "Be terse."}, *HELLO]):
        assert chat_server.apply_template(messages) == render(original, messages)
    assert chat_server.tool_mode == "prompt"
    assert "<tools>" in chat_server.apply_template(HELLO, TOOLS)


def test_server_cancel_while_queued_for_a_slot(chat_server):
    """No headers arrive while a request waits for a slot; cancel must still end it at once."""
    import threading

    stop_hogs = threading.Event()

    def hog(i: int) -> None:
        # A hog that ended early (an end-of-text token) would free its slot to the queued request (seen
        # once in the parallel suite): it ignores EOS, and asks again until told to stop.
        while not stop_hogs.is_set():
            for _ in chat_server.chat(
                [{"role": "user", "content": f"{i}: a very long story please"}],
                sampling={"max_tokens": 400, "ignore_eos": True},
                cancel=stop_hogs.is_set,
            ):
                pass

    hogs = [threading.Thread(target=hog, args=(i,)) for i in range(chat_server.n_parallel)]
    for t in hogs:
        t.start()
    # Wait until every slot is generating (a fixed sleep was not enough on a loaded CI box).
    busy_by = time.monotonic() + 30
    while not all(s["is_processing"] for s in chat_server.slots()):
        assert time.monotonic() < busy_by, "the hogs never filled every slot"
        time.sleep(0.05)
    cancel_queued = threading.Event()
    threading.Timer(0.3, cancel_queued.set).start()
    start = time.monotonic()
    events = list(chat_server.chat(LONG, sampling={"max_tokens": 50}, cancel=cancel_queued.is_set))
    waited = time.monotonic() - start
    stop_hogs.set()
    for t in hogs:
        t.join(timeout=30)
    assert events == []
    assert waited < 1.5, f"cancel of a queued request took {waited:.2f}s"
    # every slot frees once its hog is cancelled; a hog left running would hold its slot for all of its
    # 400 tokens (tens of seconds here): 15 s leaves room for a box loaded by the parallel suite
    deadline = time.monotonic() + 15
    while any(s["is_processing"] for s in chat_server.slots()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
