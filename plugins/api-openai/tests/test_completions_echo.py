"""`/v1/completions`, `/tokenize`, `/detokenize` through the openai SDK against the run's shared echo node.

The echo engine answers a completion with its prompt, word by word; its token ids are Unicode code
points and every prompt word after the first scores -1.0 (skulk_engine_echo/completion.py), so
each assert is exact. The same routes on llama.cpp are in tests/serving/test_completions.py.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai_error_asserts import assert_openai_error
from skulk_testing.echo_node import ECHO
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(shared_echo_node: NodeProcess) -> NodeProcess:
    """The run's shared echo node: these tests only send requests."""
    return shared_echo_node


@pytest.fixture(scope="module")
def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_text_prompt(oa: openai.OpenAI) -> None:
    out = oa.completions.create(model=ECHO, prompt="hello big world", max_tokens=5)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [(0, "hello big world", "stop")]
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (3, 3)


def test_max_tokens_default_stop_and_length(oa: openai.OpenAI) -> None:
    words = " ".join(f"w{i}" for i in range(20))
    assert oa.completions.create(model=ECHO, prompt=words).choices[0].finish_reason == "length"  # OpenAI's 16
    out = oa.completions.create(model=ECHO, prompt="one two three four", max_tokens=10, stop=[" three"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("one two", "stop")


def test_ignore_eos_gives_max_tokens_tokens(oa: openai.OpenAI) -> None:
    out = oa.completions.create(model=ECHO, prompt="a b", max_tokens=7, extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == 7 and out.choices[0].finish_reason == "length"


def test_a_list_of_prompts_and_n(oa: openai.OpenAI) -> None:
    out = oa.completions.create(model=ECHO, prompt=["one two", "three four five"], max_tokens=5, n=2)
    assert [(c.index, c.text) for c in out.choices] == [
        (0, "one two"),
        (1, "one two"),
        (2, "three four five"),
        (3, "three four five"),
    ]
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (5, 10)


def test_token_id_prompts(oa: openai.OpenAI, node: NodeProcess) -> None:
    out = oa.completions.create(model=ECHO, prompt=[[104, 105], [121, 111]], max_tokens=3)  # code points
    assert [c.text for c in out.choices] == ["hi", "yo"]
    raw = httpx.post(node.url + "/v1/completions", json={"model": ECHO, "prompt": [104, 105]}, timeout=30).json()
    assert raw["choices"][0]["text"] == "hi"


def test_echo_with_logprobs_scores_the_prompt(oa: openai.OpenAI) -> None:
    out = oa.completions.create(model=ECHO, prompt="a b c", max_tokens=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text == "a b c" and choice.finish_reason == "length" and choice.logprobs is not None
    assert choice.logprobs.tokens == ["a", " b", " c"]
    assert choice.logprobs.token_logprobs == [None, -1.0, -1.0]
    assert choice.logprobs.top_logprobs == [None, {" b": -1.0}, {" c": -1.0}]
    assert choice.logprobs.text_offset == [0, 1, 3]
    both = oa.completions.create(model=ECHO, prompt="a b", max_tokens=2, echo=True, logprobs=2)
    lp = both.choices[0].logprobs
    assert both.choices[0].text == "a ba b" and lp is not None  # the prompt, then its echo
    assert lp.tokens == ["a", " b", "a", " b"] and lp.token_logprobs is not None
    assert lp.token_logprobs[0] is None and lp.text_offset == [0, 1, 3, 4]


def test_stream(oa: openai.OpenAI, node: NodeProcess) -> None:
    chunks = list(
        oa.completions.create(
            model=ECHO, prompt="x y z", max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "x y z"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    body = {"model": ECHO, "prompt": ["p q", "r"], "max_tokens": 5, "stream": True, "echo": True}
    with httpx.stream("POST", node.url + "/v1/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events: list[dict[str, Any]] = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(e["object"] == "text_completion" for e in events)
    texts = {0: "", 1: ""}
    for e in events:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == {0: "p qp q", 1: "rr"}


def test_refusals_are_openai_400s(oa: openai.OpenAI, node: NodeProcess) -> None:
    best_of = httpx.post(node.url + "/v1/completions", json={"model": ECHO, "prompt": "x", "best_of": 2}, timeout=30)
    assert_openai_error(best_of, 400, param="best_of", code="unsupported_parameter")
    with pytest.raises(openai.BadRequestError):
        oa.completions.create(model=ECHO, prompt="x", best_of=2)
    with pytest.raises(openai.BadRequestError) as fim:
        oa.completions.create(model=ECHO, prompt="def f():", suffix="\n")
    assert "no fill-in-the-middle tokens" in str(fim.value)
    for body in ({"model": ECHO, "prompt": 5}, {"model": ECHO, "prompt": []}, {"model": ECHO}):
        r = httpx.post(node.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = httpx.post(node.url + "/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_tokenize_and_detokenize(node: NodeProcess) -> None:
    got = httpx.post(node.url + "/tokenize", json={"model": ECHO, "prompt": "hi there"}, timeout=30).json()
    assert got == {"tokens": [ord(c) for c in "hi there"], "count": 8, "max_model_len": 4096}
    back = httpx.post(node.url + "/detokenize", json={"model": ECHO, "tokens": got["tokens"]}, timeout=30).json()
    assert back == {"prompt": "hi there"}
    r = httpx.post(node.url + "/detokenize", json={"model": ECHO, "tokens": []}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_the_openapi_document_declares_the_bodies(node: NodeProcess) -> None:
    doc = httpx.get(node.url + "/openapi.json", timeout=30).json()
    for path, field in (("/v1/completions", "prompt"), ("/tokenize", "prompt"), ("/detokenize", "tokens")):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert field in schema["properties"] and "$ref" not in json.dumps(schema), path


def test_a_client_that_leaves_mid_stream_cancels_every_choice(node: NodeProcess) -> None:
    words = " ".join(f"w{i}" for i in range(300))  # 15 s each at 50 ms a word: only a cancel ends them in 5
    body = {"model": ECHO, "prompt": f"/slow {words}", "max_tokens": 300, "n": 3, "stream": True}
    with httpx.stream("POST", node.url + "/v1/completions", json=body, timeout=30) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    node.wait_until(lambda: not node.state()["tasks"], 5, "the three choices' tasks to end")
