"""Issue [surface] text completions on engine-mlx, and [throughput] acceptance 4 on a node: the openai
SDK's `completions.create` on a real cpu-mlx node with the SmolLM2 and Qwen2.5-Coder MLX cards.

The prompt is read as is (text or token ids: the same greedy answer), `echo` with `logprobs` gives
every prompt token's logprob (one pass over the prompt), `suffix` fills the middle with Qwen's FIM
tokens and is a 400 on SmolLM2 (it has none); four completions sent together (they step in one
batch) each equal the answer it gets alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from skulk_testing.nodes import NodeProcess, start_node

from tests.serving.placing import place_until_listed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct-MLX"
QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct-MLX"
PROMPTS = ("The capital of France is", "Once upon a time", "The three primary colors are", "def fibonacci(n):")


@pytest.fixture(scope="module")
def node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    pytest.importorskip("mlx_lm")
    env = {
        "SKULK_MODELS_DIR": str(models_dir / "mlx-nodes"),  # the split test's converted MLX folders
        "SKULK_NETWORK_VERSION": f"cmlx-{uuid.uuid4().hex[:8]}",
        "HF_HUB_OFFLINE": "1",
    }
    started = start_node("cpu-mlx", "--no-default-models", home=tmp_path_factory.mktemp("mlx-completions"), env=env)
    try:
        started.wait_api(timeout=90)
        for model in (SMOLLM2, QWEN):
            place_until_listed(started, model)
            started.wait_ready(model, timeout=600)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=300)


def complete(oa: openai.OpenAI, prompt: str | list[int], **extra: object) -> openai.types.Completion:
    args: dict[str, object] = {"max_tokens": 12, "temperature": 0, **extra}
    return oa.completions.create(model=SMOLLM2, prompt=prompt, **args)  # type: ignore[call-overload,no-any-return]


def test_the_prompt_is_read_as_is_as_text_or_ids(oa: openai.OpenAI, node: NodeProcess) -> None:
    out = complete(oa, PROMPTS[0])
    assert out.choices[0].text and out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.prompt_tokens == 5  # no template around it
    ids = node.post("/tokenize", json={"model": SMOLLM2, "prompt": PROMPTS[0]}).json()["tokens"]
    assert complete(oa, ids).choices[0].text == out.choices[0].text


def test_four_completions_together_each_equal_their_answer_alone(oa: openai.OpenAI) -> None:
    alone = [complete(oa, p, max_tokens=24).choices[0].text for p in PROMPTS]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: complete(oa, p, max_tokens=24).choices[0].text, PROMPTS))
    assert together == alone


def test_n_stop_and_logprobs(oa: openai.OpenAI) -> None:
    out = complete(oa, PROMPTS[1], n=2, stop=["\n"], logprobs=2, temperature=0.8, seed=3)
    assert len(out.choices) == 2 and all("\n" not in c.text for c in out.choices)
    for choice in out.choices:
        lp = choice.logprobs
        assert lp is not None and lp.token_logprobs and all(v is not None and v <= 0 for v in lp.token_logprobs)
        # the legacy shape: the top 2, and the sampled token when it is not one of them
        assert lp.top_logprobs and all(2 <= len(top) <= 3 for top in lp.top_logprobs)


def test_echo_with_logprobs_scores_every_prompt_token(oa: openai.OpenAI) -> None:
    out = complete(oa, PROMPTS[2], echo=True, logprobs=1, max_tokens=1)
    choice = out.choices[0]
    assert choice.text.startswith(PROMPTS[2])
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs
    prompt_tokens = out.usage.prompt_tokens if out.usage else 0
    assert len(lp.tokens) == prompt_tokens + 1
    assert lp.token_logprobs[0] is None  # the first token has no context
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    # " colors" after "The three primary" is likely: far above a uniform guess over 49,152 tokens
    assert max(v for v in lp.token_logprobs[1:prompt_tokens] if v is not None) > -5


def test_suffix_fills_the_middle_with_qwens_fim_tokens(oa: openai.OpenAI) -> None:
    out = oa.completions.create(
        model=QWEN, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8, temperature=0
    )
    assert out.choices[0].text.replace(" ", "").startswith("a+b"), repr(out.choices[0].text)


def test_suffix_without_fim_tokens_is_a_400(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        complete(oa, "def add(a, b):\n    return ", suffix="\n")
