"""Every name the API accepts is listed, an alias marked as one: `/v1/models` (the openai SDK),
the Anthropic model list (the anthropic SDK) and Ollama's `/api/tags` list the short names the
README sends (`SmolLM2-135M-Instruct`) with `alias_of` naming the model, and each listed name is
served. Speech cards' OpenAI names (`whisper-1`, `tts-1`) are listed as aliases too."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
from skulk_testing.nodes import NodeProcess, in_process_node

from tests.conftest import CHAT_MODEL, EMBED_MODEL

pytestmark = pytest.mark.slow


def test_openai_lists_every_accepted_name_and_marks_aliases(llama_node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=llama_node.url + "/v1", api_key="x", max_retries=0, timeout=300)
    listed = {m.id: (m.model_extra or {}).get("alias_of") for m in client.models.list()}
    assert listed[CHAT_MODEL] is None and listed[EMBED_MODEL] is None  # canonical ids carry no marker
    assert listed["SmolLM2-135M-Instruct"] == CHAT_MODEL
    assert listed["all-MiniLM-L6-v2"] == EMBED_MODEL
    assert (client.models.retrieve("SmolLM2-135M-Instruct").model_extra or {})["alias_of"] == CHAT_MODEL
    for name in ("SmolLM2-135M-Instruct", CHAT_MODEL):  # every listed name is accepted
        reply = client.chat.completions.create(model=name, max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message is not None
    assert len(client.embeddings.create(model="all-MiniLM-L6-v2", input="hi").data[0].embedding) == 384


def test_anthropic_and_ollama_lists_mark_aliases(llama_node: NodeProcess) -> None:
    client = anthropic.Anthropic(base_url=llama_node.url, api_key="x", max_retries=0)
    models = {m.id: (m.model_extra or {}).get("alias_of") for m in client.models.list()}
    assert models["SmolLM2-135M-Instruct"] == CHAT_MODEL and models[CHAT_MODEL] is None
    tags = {t["name"]: t.get("alias_of") for t in llama_node.get("/api/tags").json()["models"]}
    assert tags["SmolLM2-135M-Instruct:latest"] == f"{CHAT_MODEL}:latest"
    assert tags[f"{CHAT_MODEL}:latest"] is None
    ollama = pytest.importorskip("ollama")
    names = [m.model for m in ollama.Client(host=llama_node.url).list().models]  # the client's schema holds
    assert "SmolLM2-135M-Instruct:latest" in names


async def test_speech_cards_openai_names_are_listed_as_aliases(tmp_path: Path) -> None:
    from skulk_api_control.adapter_routes import listed_models
    from skulk_kernel.api import catalog
    from skulk_speech.cards import PIPER_JOE, WHISPER_TINY_EN

    async with in_process_node(["store", "speech"], home=tmp_path / "n") as node:
        names = listed_models(node, catalog(node))
    assert ("whisper-1", WHISPER_TINY_EN) in names and ("tts-1", PIPER_JOE) in names
    assert (WHISPER_TINY_EN, WHISPER_TINY_EN) in names
