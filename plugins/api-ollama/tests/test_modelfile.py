"""The Modelfile as `/api/create` reads it and `/api/show` writes it back, and a created model's defaults."""

from __future__ import annotations

import pytest
from skulk_api_ollama.modelfile import (
    ModelfileError,
    parse_modelfile,
    render_modelfile,
    render_parameters,
    with_modelfile,
)

MODELFILE = '''
# a comment
FROM ./tiny.gguf
PARAMETER temperature 0.2
PARAMETER num_ctx 4096
PARAMETER stop "<|im_end|>"
PARAMETER stop "User:"
TEMPLATE """{{ .System }}
{{ .Prompt }}"""
SYSTEM You are terse.
MESSAGE user Is the sky blue?
MESSAGE assistant yes
LICENSE """Apache-2.0"""
'''


def test_parse_reads_every_instruction_ollama_documents() -> None:
    got = parse_modelfile(MODELFILE)
    assert got["from"] == "./tiny.gguf"
    assert got["parameters"] == {"temperature": 0.2, "num_ctx": 4096, "stop": ["<|im_end|>", "User:"]}
    assert got["template"] == "{{ .System }}\n{{ .Prompt }}"
    assert got["system"] == "You are terse."
    assert got["messages"] == [{"role": "user", "content": "Is the sky blue?"}, {"role": "assistant", "content": "yes"}]
    assert got["license"] == "Apache-2.0"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("FROM x\nADAPTER ./lora.gguf", "ADAPTER is not supported"),
        ("FROM x\nRUN something", "unknown instruction 'RUN'"),
        ('FROM x\nSYSTEM """never closed', "never closed"),
        ("FROM x\nPARAMETER temperature", "needs a name and a value"),
    ],
)
def test_parse_names_the_line_it_cannot_read(text: str, says: str) -> None:
    with pytest.raises(ModelfileError, match=says):
        parse_modelfile(text)


def test_rendered_modelfile_parses_back_to_the_same_section() -> None:
    section = parse_modelfile(MODELFILE)
    again = parse_modelfile(render_modelfile("mine", {**section, "parent": section["from"]}))
    assert {k: again[k] for k in section} == section
    assert render_parameters({"stop": ["a", "b"], "top_k": 20}).splitlines()[0].split() == ["stop", '"a"']


def test_a_created_model_s_defaults_yield_to_the_request() -> None:
    section = {"system": "Be brief.", "parameters": {"temperature": 0.1, "num_predict": 8}, "messages": []}
    chat = with_modelfile(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0.9}}, section
    )
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["options"] == {"temperature": 0.9, "num_predict": 8}
    own_system = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    assert with_modelfile({"model": "m", "messages": own_system}, section)["messages"] == own_system
    assert with_modelfile({"model": "m", "prompt": "hi"}, section)["system"] == "Be brief."
    assert with_modelfile({"model": "m", "messages": []}, section)["messages"] == []  # a load request
    assert with_modelfile({"model": "m", "prompt": "hi"}, {}) == {"model": "m", "prompt": "hi"}
