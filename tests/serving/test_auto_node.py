"""The default node (`skulk-kernel run` with no profile: `auto`) as the README starts it: chat and
embeddings on llama.cpp, the speech, media and steward routes served, and nothing placed at start
but the two default models (speech and steward models are not downloaded by a first run); the
first speech requests place their model (one instance) and are answered, with no placement call."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openai import OpenAI
from skulk_testing.nodes import start_node

from tests.conftest import CHAT_MODEL, EMBED_MODEL

PIPER = "rhasspy/piper-en_US-joe-medium"
WHISPER = "Systran/faster-whisper-tiny.en"

pytestmark = pytest.mark.slow


def test_the_default_node_serves_the_readme_models_and_places_nothing_else(models_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"auto-{uuid.uuid4().hex[:10]}"}
    node = start_node("auto", home=tmp_path / "home", env=env)
    try:
        node.wait_api(timeout=90)
        node.wait_ready(CHAT_MODEL, timeout=300)
        node.wait_ready(EMBED_MODEL, timeout=300)
        client = OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", max_tokens=8, messages=[{"role": "user", "content": "Hi!"}]
        )
        assert reply.choices[0].message.content
        assert len(client.embeddings.create(model=EMBED_MODEL, input="hello").data[0].embedding) == 384
        paths = node.get("/openapi.json").json()["paths"]
        for route in ("/v1/audio/speech", "/v1/audio/transcriptions", "/v1/steward"):
            assert route in paths, f"{route} not served by the default node"
        assert node.get("/v1/steward").json()["status"] == "on_first_use"
        models = sorted(
            next(iter(i.values()))["shardAssignments"]["modelId"] for i in node.state()["instances"].values()
        )
        assert models == sorted([CHAT_MODEL, EMBED_MODEL])  # no speech, steward or media model placed

        # speech on first use: no placement call; concurrent first requests make one instance
        def speak(text: str) -> bytes:
            return client.audio.speech.create(model="tts-1", voice="joe", input=text, response_format="wav").read()

        with ThreadPoolExecutor(3) as pool:
            audio = list(pool.map(speak, ["Hello world.", "Good morning.", "The lamp is lit."]))
        assert all(a[:4] == b"RIFF" and len(a) > 10_000 for a in audio)
        heard = client.audio.transcriptions.create(model="whisper-1", file=("hello.wav", audio[0]))
        assert "hello" in heard.text.lower()
        placed = [next(iter(i.values()))["shardAssignments"]["modelId"] for i in node.state()["instances"].values()]
        assert sorted(placed) == sorted([CHAT_MODEL, EMBED_MODEL, PIPER, WHISPER])  # one instance each
    finally:
        node.stop()
