"""completion.py on the session's SmolLM2 server (no node): the native stream, the scored prompt, FIM's 400.

The scored prompt must be the model's own distribution: the logprob a forced step gives a prompt
token equals the logprob the server reports when it generates that token greedily itself, and the
alternatives are the raw distribution's (the forcing bias does not show in them).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from skulk_engine_llamacpp.completion import PromptEcho, ScoringProgress, complete, native_sampling, score_prompt
from skulk_engine_llamacpp.events import BackendError, Finish, TextDelta
from skulk_kernel.api import CompletionParams

PROMPT = "The capital of France is"


def never() -> bool:
    return False


def run(server: Any, completion: CompletionParams, raw: str | None, **kw: Any) -> list[Any]:
    sampling = {"temperature": 0, "max_tokens": kw.pop("max_tokens", 6)}
    args = {"logprobs": None, "token_ids": False, "cancel": never, "model_id": "smollm2", **kw}
    return list(complete(server, completion, raw, sampling, **args))


def test_native_sampling_names() -> None:
    assert native_sampling({"max_tokens": 3, "temperature": 0, "seed": None}) == {"n_predict": 3, "temperature": 0}


def test_text_and_ids_give_the_same_greedy_completion(chat_server: Any) -> None:
    by_text = run(chat_server, CompletionParams(), PROMPT, token_ids=True)
    assert isinstance(by_text[-1], Finish) and by_text[-1].prompt_tokens == 5 and by_text[-1].completion_tokens == 6
    text = "".join(e.text for e in by_text if isinstance(e, TextDelta))
    ids = tuple(chat_server.tokenize(PROMPT, add_special=True))
    by_ids = run(chat_server, CompletionParams(prompt_ids=ids), None)
    assert "".join(e.text for e in by_ids if isinstance(e, TextDelta)) == text and "Paris" in text
    assert sum(len(e.ids) for e in by_text if isinstance(e, TextDelta)) == 6  # a token's ids ride on its delta


def test_the_echoed_prompt_scores_as_the_model_generates(chat_server: Any) -> None:
    ids = chat_server.tokenize(PROMPT, add_special=True)
    generated = run(chat_server, CompletionParams(prompt_ids=tuple(ids)), None, max_tokens=1, logprobs=2)
    first = next(e for e in generated if isinstance(e, TextDelta)).logprobs[0]
    scored = list(score_prompt(chat_server, [*ids, first.id], 2, never))
    assert scored[0].logprob == 0.0 and scored[0].top == ()  # no context for the first token
    assert [s.id for s in scored] == [*ids, first.id] and "".join(s.token for s in scored) == PROMPT + first.token
    assert scored[-1].logprob == pytest.approx(first.logprob, abs=0.02)
    assert [t.token for t in scored[-1].top] == [t.token for t in first.top]  # raw distribution, not the bias's


def test_echo_without_generating(chat_server: Any) -> None:
    events = run(chat_server, CompletionParams(echo=True, prompt_logprobs=0, generate=False), PROMPT)
    echo, fin = [e for e in events if not isinstance(e, ScoringProgress)]  # progress only on a slow box
    assert isinstance(echo, PromptEcho) and echo.text == PROMPT and len(echo.ids) == len(echo.logprobs) == 5
    assert all(lp.top == () for lp in echo.logprobs) and isinstance(fin, Finish) and fin.reason == "length"


def test_a_suffix_on_a_model_without_fim_tokens_is_a_400(chat_server: Any) -> None:
    with pytest.raises(BackendError, match="no fill-in-the-middle tokens") as refused:
        run(chat_server, CompletionParams(suffix="\n"), "def f():\n    return ")
    assert refused.value.status == 400


def test_cancel_ends_the_stream_without_a_finish(chat_server: Any) -> None:
    stop = threading.Event()
    events = []
    for event in complete(
        chat_server, CompletionParams(), PROMPT, {"max_tokens": 200, "temperature": 0, "ignore_eos": True},
        logprobs=None, token_ids=False, cancel=stop.is_set, model_id="smollm2",
    ):  # fmt: skip
        events.append(event)
        stop.set()
    assert events and not any(isinstance(e, Finish) for e in events) and len(events) < 10
