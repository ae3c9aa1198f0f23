"""Issue [dashboard] acceptance 6: with the speech models placed (Piper, Whisper tiny.en), a spoken
answer plays in the page and the microphone's audio (a WAV file fed to Chromium's fake capture
device, spoken by the node's own TTS) becomes the prompt. Browser side: `dashboard/e2e/voice.mjs`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from skulk_testing.nodes import start_node

from .conftest import DASHBOARD, Dashboard

pytestmark = pytest.mark.slow

PIPER = "rhasspy/piper-en_US-joe-medium"
WHISPER = "Systran/faster-whisper-tiny.en"
SENTENCE = "Please name one colour of the rainbow."
PROFILE = """
[profile]
name = "dashboard-voice"
plugins = ["master", "worker", "engine-echo", "store", "speech", "api-control", "api-openai"]

[planes]
control = "local"

[plugins.master]
default_models = []
"""


def test_microphone_becomes_the_prompt_and_the_answer_is_spoken(dashboard: Dashboard, tmp_path: Path) -> None:
    pytest.importorskip("piper")
    pytest.importorskip("faster_whisper")
    profile = tmp_path / "voice.toml"
    profile.write_text(PROFILE)
    node = start_node(str(profile), "--node-name", "voice", home=tmp_path / "home", env=dashboard.node_env())
    try:
        node.wait_api()
        for model in (PIPER, WHISPER, "skulk/echo"):
            placed = node.post("/place_instance", json={"model_id": model})
            assert placed.status_code == 200, placed.text
        for model in (PIPER, WHISPER, "skulk/echo"):
            node.wait_ready(model, 240)
        wav = httpx.post(
            node.url + "/v1/audio/speech",
            json={"model": PIPER, "input": SENTENCE, "response_format": "wav"},
            timeout=120,
        )
        assert wav.status_code == 200, wav.text
        audio = tmp_path / "microphone.wav"
        audio.write_bytes(wav.content)
        cmd = [shutil.which("node") or "node", "e2e/voice.mjs", "--url", node.url, "--out", str(dashboard.artifacts)]
        done = subprocess.run(
            [*cmd, "--audio", str(audio), "--model", "skulk/echo"],
            cwd=DASHBOARD,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "CHROMIUM": str(dashboard.chromium)},
        )
        print(done.stdout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, f"voice.mjs failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        result = json.loads(lines[-1][7:])
    finally:
        node.stop()
    heard = set(re.findall(r"[a-z]+", result["prompt"].lower()))
    assert {"colour", "color"} & heard and "rainbow" in heard, result["prompt"]
    assert result["answer"].strip()
    assert result["spokenMs"] > result["speechStartMs"] > 0, result
    assert not result["consoleErrors"], result["consoleErrors"]
    assert not any(result["axe"].values()), json.dumps(result["axe"], indent=1)  # acceptance 7
    print(f"\nmicrophone -> prompt {result['prompt']!r}; speech started {result['speechStartMs']} ms after Speak")
