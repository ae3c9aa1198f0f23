"""[providers] the voice loop's first audio byte after the end of speech, through tts@1.0.0 and without it.

    .venv/bin/python bench/bench_voice_loop.py [--rounds 4] [--out bench/results/voice-loop.json]

One node (SmolLM2-135M on llama.cpp, the Piper voice, Whisper tiny.en, the speech and providers
plugins; the models folder of the test suite, $SKULK_TEST_MODELS_DIR). One realtime session through
the OpenAI SDK; the same spoken question (synthesised by the node) is asked `rounds` times with
`skulk.tts_via = "provider"` (each sentence spoken by tts@1.0.0: frames on the provider topic,
schema checks, the lifecycle) and `rounds` times with `"direct"` (the speech plugin's synthesis
called in process), alternated, after one warm-up turn of each. Two figures per turn:

* **after speech**: from `input_audio_buffer.speech_stopped` to the first `response.output_audio.delta`
  at the client (transcription, the chat model's first sentence, its synthesis);
* **after the response began**: the node's own `skulk_first_audio_ms` (from `response.created`),
  which leaves out the transcription.

Ratios are provider / direct medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skulk_testing.nodes import start_node  # noqa: E402

from tests.conftest import CHAT_MODEL, MODELS_DIR  # noqa: E402
from tests.speech.conftest import PIPER, WHISPER  # noqa: E402
from tests.speech.test_voice_loop import PROFILE, Session, configure, one_turn, synthesize  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "voice-loop.json"))
    args = parser.parse_args()
    from openai import OpenAI

    tmp = Path(tempfile.mkdtemp(prefix="bench-voice-"))
    (tmp / "profile.toml").write_text(PROFILE)
    env = {
        "SKULK_MODELS_DIR": str(os.environ.get("SKULK_TEST_MODELS_DIR") or MODELS_DIR),
        "SKULK_NETWORK_VERSION": f"bench-voice-{uuid.uuid4().hex[:8]}",
        "SKULK_SPEECH_SPOOL": str(tmp / "spool"),
    }
    node = start_node(str(tmp / "profile.toml"), "--node-name", "voice", home=tmp / "node", env=env)
    try:
        node.wait_api(90)
        for model in (PIPER, WHISPER):
            node.wait_until(lambda m=model: node.post("/place_instance", json={"model_id": m}).status_code == 200,
                            60, f"placing {model}")  # fmt: skip
        for model in (CHAT_MODEL, PIPER, WHISPER):
            node.wait_ready(model, 300)
        silence = bytes(48000)
        question = silence[:9600] + synthesize(node, "What is the capital of France?") + silence
        ws_url = node.url.replace("http", "ws") + "/v1"
        sdk = OpenAI(base_url=node.url + "/v1", api_key="unused", websocket_base_url=ws_url)
        after_speech: dict[str, list[float]] = {"provider": [], "direct": []}
        after_response: dict[str, list[float]] = {"provider": [], "direct": []}
        with sdk.realtime.connect(model=WHISPER) as conn:
            session = Session(conn)
            session.until(lambda e: e["type"] == "session.created", 30)
            order = ["provider", "direct"] * (args.rounds + 1)
            for i, via in enumerate(order):
                configure(session, via)
                done, lag, _ = one_turn(session, question)
                assert done["response"]["status"] == "completed", done
                if i >= 2:  # the first of each is the warm-up
                    after_speech[via].append(lag * 1000)
                    after_response[via].append(float(done["response"]["metadata"]["skulk_first_audio_ms"]))
        result: dict[str, Any] = {"rounds": args.rounds}
        for name, samples in (("after_speech_ms", after_speech), ("after_response_ms", after_response)):
            medians = {via: round(statistics.median(v), 1) for via, v in samples.items()}
            result[name] = {"samples": {v: [round(x, 1) for x in s] for v, s in samples.items()}, "median": medians,
                            "ratio_provider_vs_direct": round(medians["provider"] / medians["direct"], 3)}  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
