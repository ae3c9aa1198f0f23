"""Issue [surface] text completions on llama.cpp: the openai SDK's `completions.create` against the run's
shared llama.cpp node (SmolLM2-135M-Instruct), plus `/tokenize` and `/detokenize`.

Greedy decoding throughout, so a completion is repeatable and the ways of asking for the same text
(a string, its token ids, one prompt of a list, a stream) must agree exactly. The echoed prompt's
logprobs are checked against the model's own: the logprob the echo gives a prompt token equals the
one a plain completion reports when it generates that token. SmolLM2 has no fill-in-the-middle
tokens, so `suffix` is its 400 here; FIM itself is on Qwen2.5-Coder (test_completions_fim.py).
"""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from skulk_testing.nodes import NodeProcess

from tests.conftest import CHAT_MODEL

pytestmark = pytest.mark.timeout(600)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def oa(llama_node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=300)


def greedy(oa: openai.OpenAI, prompt: str | list[int], **kw: object) -> openai.types.Completion:
    return oa.completions.create(model=CHAT_MODEL, prompt=prompt, temperature=0, **kw)  # type: ignore[arg-type]


def test_text_completion_continues_the_prompt(oa: openai.OpenAI) -> None:
    out = greedy(oa, PROMPT, max_tokens=6)
    choice = out.choices[0]
    assert out.object == "text_completion" and choice.index == 0 and choice.finish_reason in ("stop", "length")
    assert "Paris" in choice.text, choice.text  # no chat template: the model continues the sentence
    assert out.usage is not None and out.usage.prompt_tokens == 5 and 0 < out.usage.completion_tokens <= 6


def test_lists_ids_and_streams_agree(oa: openai.OpenAI, llama_node: NodeProcess) -> None:
    alone = greedy(oa, PROMPT, max_tokens=8).choices[0].text
    other = "def fibonacci(n):"
    both = greedy(oa, [PROMPT, other], max_tokens=8)
    assert [c.index for c in both.choices] == [0, 1] and both.choices[0].text == alone
    assert both.choices[1].text == greedy(oa, other, max_tokens=8).choices[0].text
    ids = httpx.post(llama_node.url + "/tokenize", json={"model": CHAT_MODEL, "prompt": PROMPT}, timeout=60).json()
    assert ids["count"] == len(ids["tokens"]) == 5 and ids["max_model_len"] > 0
    assert greedy(oa, ids["tokens"], max_tokens=8).choices[0].text == alone
    streamed = [c for c in greedy(oa, PROMPT, max_tokens=8, stream=True)]  # type: ignore[attr-defined]
    assert "".join(c.choices[0].text for c in streamed) == alone
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")
    back = httpx.post(llama_node.url + "/detokenize", json={"model": CHAT_MODEL, "tokens": ids["tokens"]}, timeout=60)
    assert back.json() == {"prompt": PROMPT}


def test_ignore_eos_gives_exactly_max_tokens(oa: openai.OpenAI) -> None:
    out = greedy(oa, "Hi.", max_tokens=24, extra_body={"ignore_eos": True})  # what guidellm sends
    assert out.usage is not None and out.usage.completion_tokens == 24 and out.choices[0].finish_reason == "length"


def test_stream_ends_with_done(llama_node: NodeProcess) -> None:
    body = {"model": CHAT_MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", llama_node.url + "/v1/completions", json=body, timeout=300) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(e["object"] == "text_completion" for e in events)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_echo_logprobs_are_the_models_own(oa: openai.OpenAI) -> None:
    plain = greedy(oa, PROMPT, max_tokens=1, logprobs=2).choices[0]
    assert plain.logprobs is not None and plain.logprobs.token_logprobs and plain.logprobs.tokens
    generated, its_logprob = plain.logprobs.tokens[0], plain.logprobs.token_logprobs[0]
    echoed = greedy(oa, PROMPT + generated, max_tokens=0, echo=True, logprobs=1).choices[0]
    lp = echoed.logprobs
    assert echoed.text == PROMPT + generated and lp is not None and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens or ()) == PROMPT + generated
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has no context
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    # the same distribution, reached by a batched prefill there and cached one-token steps here: they
    # round apart in the third decimal (-0.2589 vs -0.2610 seen), nowhere near another token's logprob
    assert lp.token_logprobs[-1] == pytest.approx(its_logprob, abs=0.02)
    assert lp.top_logprobs[-1] is not None and max(lp.top_logprobs[-1].values()) == lp.token_logprobs[-1]  # greedy
    # lm-eval's loglikelihood request: echo, logprobs=1, max_tokens=1 -> the prompt's logprobs then one token
    lm = greedy(oa, [PROMPT + generated], max_tokens=1, echo=True, logprobs=1).choices[0]
    assert lm.logprobs is not None and lm.logprobs.token_logprobs is not None
    assert len(lm.logprobs.token_logprobs) == len(lp.token_logprobs) + 1
    assert math.isclose(sum(lm.logprobs.token_logprobs[1:-1]), sum(lp.token_logprobs[1:]), abs_tol=1e-3)


def test_refusals(oa: openai.OpenAI, llama_node: NodeProcess) -> None:
    with pytest.raises(openai.BadRequestError, match="best_of"):
        greedy(oa, PROMPT, best_of=3)
    with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens"):
        greedy(oa, "def add(a, b):\n    return ", suffix="\n", max_tokens=4)
    r = httpx.post(llama_node.url + "/v1/completions", json={"model": CHAT_MODEL, "prompt": [1, "x"]}, timeout=60)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
