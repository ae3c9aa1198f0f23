"""Speech through the node against the same engines called in process, measured in one run.

    .venv/bin/python bench/bench_speech.py [--reps 3]

Two real nodes over Zenoh (an API node and a speech node holding the Piper voice and Whisper tiny.en,
1 thread each, as tests/speech does), so every request crosses the data plane. Reported:

* TTS real-time factor (synthesis wall time / seconds of audio) through POST /v1/audio/speech (PCM,
  streamed to the end) and with PiperSession.synthesize in this process; their ratio;
* time to the first audio byte through the API (and the engine's own first sentence in process);
* STT real-time factor through POST /v1/audio/transcriptions (the upload crosses to the speech node)
  and with WhisperSession in this process (same decode + transcribe); their ratio;
* realtime lag: a WebSocket session fed the synthesised paragraph's first sentence in 20 ms frames at
  real-time pace; the time from the frame that completes the VAD silence to the `completed` event.

Runs alternate API and in-process so load on the shared box hits both alike; medians of --reps.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from skulk_testing.nodes import NodeProcess, start_node  # noqa: E402

from tests.speech.conftest import PARAGRAPH, PIPER, PROFILE, WHISPER, _master_agreed, wer  # noqa: E402

SENTENCE = "Every night the keeper climbed the stairs and lit the great lamp."


def cluster(tmp: Path) -> list[NodeProcess]:
    profile = tmp / "profile.toml"
    profile.write_text(PROFILE)
    env = {"SKULK_NETWORK_VERSION": f"bs{uuid.uuid4().hex[:10]}", "SKULK_SPEECH_SPOOL": str(tmp / "spool")}
    nodes = [start_node(str(profile), "--node-name", f"b{i}", home=tmp / f"n{i}", env=env) for i in range(2)]
    for n in nodes:
        n.wait_api(90)
    api = nodes[0]
    api.wait_until(lambda: _master_agreed(nodes), 90, "master")
    api_id = api.get("/node_id").json()
    for model in (PIPER, WHISPER):
        api.wait_until(
            lambda m=model: (
                api.post("/place_instance", json={"model_id": m, "excluded_nodes": [api_id]}).status_code == 200
            ),
            60,
            model,
        )
    api.wait_ready(PIPER, 180)
    api.wait_ready(WHISPER, 180)
    return nodes


def in_process() -> tuple[Any, Any]:
    from skulk_speech.cards import SpeechModelStore, speech_cards
    from skulk_speech.engines import PiperEngine, WhisperEngine
    from skulk_testing.conformance import make_runner_spec

    store, cards = SpeechModelStore(), speech_cards()
    options = {"deterministic": True, "threads": 1, "beam_size": 1}
    piper = PiperEngine().load(make_runner_spec(cards[PIPER], store.local_path(PIPER), options=options), print)
    whisper = WhisperEngine().load(make_runner_spec(cards[WHISPER], store.local_path(WHISPER), options=options), print)
    return piper, whisper


def tts_in_process(piper: Any, text: str) -> dict[str, float]:
    from skulk_kernel.api import SpeechParams

    started = time.perf_counter()
    first = 0.0
    samples = 0
    for chunk in piper.synthesize("b", SpeechParams(model_id=PIPER, input=text, voice="joe"), lambda: False):
        if chunk.data:
            first = first or time.perf_counter() - started
            samples += len(base64.b64decode(chunk.data)) // 2
    wall = time.perf_counter() - started
    audio_s = samples / 22050
    return {"rtf": wall / audio_s, "first_s": first, "audio_s": audio_s}


def tts_api(api: NodeProcess, text: str) -> dict[str, float]:
    started = time.perf_counter()
    first = 0.0
    size = 0
    body = {"model": PIPER, "input": text, "voice": "joe", "response_format": "pcm"}
    with httpx.stream("POST", api.url + "/v1/audio/speech", json=body, timeout=300) as response:
        for part in response.iter_raw():
            first = first or time.perf_counter() - started
            size += len(part)
    wall = time.perf_counter() - started
    audio_s = size / 2 / 24000
    return {"rtf": wall / audio_s, "first_s": first, "audio_s": audio_s}


def stt_in_process(whisper: Any, wav: bytes, audio_s: float) -> dict[str, float]:
    from skulk_speech.audio import decode_16k_mono

    started = time.perf_counter()
    samples = decode_16k_mono(wav)
    segments, _ = whisper.model.transcribe(
        samples, language="en", beam_size=1, condition_on_previous_text=False, temperature=0.0
    )
    text = "".join(s.text for s in segments)
    wall = time.perf_counter() - started
    return {"rtf": wall / audio_s, "wer": wer(PARAGRAPH, text)}


def stt_api(api: NodeProcess, wav: bytes, audio_s: float) -> dict[str, float]:
    started = time.perf_counter()
    response = httpx.post(
        api.url + "/v1/audio/transcriptions",
        data={"model": WHISPER},
        files={"file": ("p.wav", wav, "audio/wav")},
        timeout=300,
    )
    wall = time.perf_counter() - started
    response.raise_for_status()
    return {"rtf": wall / audio_s, "wer": wer(PARAGRAPH, response.json()["text"])}


def realtime_lag(api: NodeProcess, pcm24: bytes, silence_ms: int = 500) -> dict[str, float]:
    from websockets.sync.client import connect

    frames = [pcm24[i : i + 960] for i in range(0, len(pcm24), 960)]
    frames += [b"\0" * 960] * (silence_ms // 20 + 40)
    speech_frames = len(pcm24) // 960
    with connect(api.url.replace("http", "ws") + "/v1/realtime?intent=transcription", max_size=None) as ws:
        json.loads(ws.recv())
        ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "transcription",
                        "audio": {
                            "input": {
                                "transcription": {"model": WHISPER},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms},
                            }
                        },
                    },
                }
            )
        )
        json.loads(ws.recv())
        start = time.perf_counter()
        sent_at = []
        for i, frame in enumerate(frames):
            target = start + i * 0.02
            time.sleep(max(0.0, target - time.perf_counter()))
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(frame).decode()}))
            sent_at.append(time.perf_counter())
        turn_end = sent_at[min(len(sent_at) - 1, speech_frames + silence_ms // 20)]
        while True:
            event = json.loads(ws.recv(timeout=120))
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                done = time.perf_counter()
                return {
                    "lag_s": done - turn_end,
                    "server_commit_to_completed_s": event["lag_ms"] / 1000,
                    "wer": wer(SENTENCE, event["transcript"]),
                }
            if event["type"] in ("error", "conversation.item.input_audio_transcription.failed"):
                raise RuntimeError(event)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="skulk-bench-speech-"))
    nodes = cluster(tmp)
    try:
        api = nodes[0]
        piper, whisper = in_process()
        wav = httpx.post(
            api.url + "/v1/audio/speech",
            json={"model": PIPER, "input": PARAGRAPH, "voice": "joe", "response_format": "wav"},
            timeout=300,
        ).content
        pcm_sentence = httpx.post(
            api.url + "/v1/audio/speech",
            json={"model": PIPER, "input": SENTENCE, "voice": "joe", "response_format": "pcm"},
            timeout=300,
        ).content
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in ("tts_api", "tts_in", "stt_api", "stt_in", "rt")}
        for _ in range(args.reps):
            runs["tts_api"].append(tts_api(api, PARAGRAPH))
            runs["tts_in"].append(tts_in_process(piper, PARAGRAPH))
            audio_s = runs["tts_in"][-1]["audio_s"]
            runs["stt_api"].append(stt_api(api, wav, audio_s))
            runs["stt_in"].append(stt_in_process(whisper, wav, audio_s))
            runs["rt"].append(realtime_lag(api, pcm_sentence))

        def med(kind: str, key: str) -> float:
            return round(statistics.median(r[key] for r in runs[kind]), 4)

        report = {
            "paragraph_audio_s": round(runs["tts_in"][0]["audio_s"], 2),
            "reps": args.reps,
            "tts_rtf_api": med("tts_api", "rtf"),
            "tts_rtf_in_process": med("tts_in", "rtf"),
            "tts_rtf_ratio_api_over_in_process": round(med("tts_api", "rtf") / med("tts_in", "rtf"), 3),
            "tts_first_audio_byte_api_s": med("tts_api", "first_s"),
            "tts_first_sentence_in_process_s": med("tts_in", "first_s"),
            "stt_rtf_api": med("stt_api", "rtf"),
            "stt_rtf_in_process": med("stt_in", "rtf"),
            "stt_rtf_ratio_api_over_in_process": round(med("stt_api", "rtf") / med("stt_in", "rtf"), 3),
            "stt_wer_api": med("stt_api", "wer"),
            "realtime_lag_s": med("rt", "lag_s"),
            "realtime_server_commit_to_completed_s": med("rt", "server_commit_to_completed_s"),
            "realtime_wer": med("rt", "wer"),
            "runs": runs,
        }
        print(json.dumps(report, indent=1))
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    main()
