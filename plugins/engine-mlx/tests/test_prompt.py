"""Chat templates, the ChatML tools fallback and BOS handling, with a stand-in tokenizer."""

from __future__ import annotations

from typing import Any

from skulk_engine_mlx.prompt import encode_prompt, render_prompt
from skulk_kernel.api import ChatMessage, TextGenerationParams, ToolCall, ToolSpec

SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
)


class FakeTokenizer:
    chat_template: str | None = SMOL_TEMPLATE
    bos_token: str | None = "<s>"

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
        return "TEMPLATE:" + "|".join(m["content"] for m in conversation)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [ord(c) for c in text]


def params(**kw: Any) -> TextGenerationParams:
    return TextGenerationParams(model_id="m", messages=(ChatMessage(role="user", content="hi"),), **kw)


def test_the_models_template_renders_when_no_tools() -> None:
    assert render_prompt(FakeTokenizer(), params()) == "TEMPLATE:hi"


def test_tools_on_a_toolless_chatml_template_use_the_fallback_with_the_default_system() -> None:
    prompt = render_prompt(FakeTokenizer(), params(tools=(ToolSpec(name="get_weather"),)))
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tool_history_renders_calls_and_results() -> None:
    messages = (
        ChatMessage(role="user", content="weather?"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="c1", name="f", arguments='{"x":1}'),)),
        ChatMessage(role="tool", content="sunny", tool_call_id="c1"),
    )
    prompt = render_prompt(FakeTokenizer(), TextGenerationParams(model_id="m", messages=messages))
    assert '<tool_call>\n{"name": "f", "arguments": {"x":1}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_raw_prompt_skips_the_template() -> None:
    assert render_prompt(FakeTokenizer(), params(raw_prompt="raw!")) == "raw!"


def test_bos_is_added_only_when_the_template_did_not_write_it() -> None:
    tok = FakeTokenizer()
    assert encode_prompt(tok, "<s>x")[0] == ord("<")
    assert encode_prompt(tok, "x")[0] == 0
