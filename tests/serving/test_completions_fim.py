"""Issue [surface] acceptance 1, fill-in-the-middle: the openai SDK's `completions.create` with `suffix` on
Qwen2.5-Coder-0.5B-Instruct, whose GGUF has FIM tokens (`<|fim_prefix|>`, `<|fim_suffix|>`,
`<|fim_middle|>`; llama.cpp's `/infill` builds the prompt from them), on the run's shared Qwen node.

Greedy: the model fills `return ` in front of a call that prints the sum with `a + b`. The instruct
model does not always stop at the gap's end, so the test checks how the middle starts; the whole
answer must not be a chat reply (no template was applied).
"""

from __future__ import annotations

import openai
import pytest
from skulk_testing.nodes import NodeProcess

from tests.conftest import QWEN_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def oa(qwen_node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen_node.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_suffix_fills_the_middle(oa: openai.OpenAI) -> None:
    out = oa.completions.create(model=QWEN_MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0)
    middle = out.choices[0].text
    assert middle.replace(" ", "").startswith("a+b"), repr(middle)
    assert out.usage is not None and out.usage.prompt_tokens > len(PREFIX) // 8  # prefix, suffix and FIM tokens


def test_suffix_streams(oa: openai.OpenAI) -> None:
    chunks = list(
        oa.completions.create(model=QWEN_MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=4, temperature=0, stream=True)
    )
    middle = "".join(c.choices[0].text for c in chunks if c.choices)
    assert middle.replace(" ", "").startswith("a+b"), repr(middle)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_echo_with_suffix_is_refused(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="suffix"):
        oa.completions.create(model=QWEN_MODEL, prompt=PREFIX, suffix=SUFFIX, echo=True, max_tokens=4)
