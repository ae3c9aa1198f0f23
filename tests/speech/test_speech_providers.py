"""[providers] acceptance 2: the first-party speech capabilities, called from the API node on the speech node.

`stt.realtime@1.0.0` (bidirectional) turns the same audio, sent as it is captured, into turns and
their transcripts.

`stt@1.0.0` (client-streaming: the audio in base64 pieces, a half-close, the transcript) transcribes
the speech plugin's own synthesis of a paragraph with a word error rate under 10%; `vad@1.0.0`
(bidirectional) marks where that speech starts and stops inside silence; `tts@1.0.0`
(server-streaming) returns the audio as it is synthesised. Every call goes through the providers
WebSocket of the API node, addressed to the speech node (the provider data plane over Zenoh).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from skulk_testing.nodes import NodeProcess

from .conftest import PARAGRAPH, PIPER, WHISPER, SpeechCluster, wer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PIECE = 48_000  # bytes of audio per input message
log = logging.getLogger(__name__)


def _capabilities(cluster: SpeechCluster) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}

    def listed() -> bool:
        got = cluster.api.get("/v1/capabilities", params={"node_id": cluster.speech_id}).json().get("data", [])
        found.update({c["id"]: c for c in got})
        return {"tts", "stt", "stt.realtime", "vad"} <= set(found)

    cluster.api.wait_until(listed, 60, "the speech node's capabilities")
    return found


def _stream(node: NodeProcess, opening: dict[str, Any], inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open a call on the socket, send every input, half-close, return every message after `started`."""
    from websockets.sync.client import connect

    url = node.url.replace("http://", "ws://") + "/v1/capabilities/stream"
    out: list[dict[str, Any]] = []
    with connect(url, open_timeout=10, max_size=None) as ws:
        ws.send(json.dumps(opening))
        started = json.loads(ws.recv(timeout=30))
        assert started["type"] == "started", started
        for message in inputs:
            ws.send(json.dumps({"type": "input", "data": message}))
        if inputs:
            ws.send(json.dumps({"type": "end"}))
        while True:
            msg = json.loads(ws.recv(timeout=120))
            out.append(msg)
            if msg["type"] in ("end", "error"):
                return out


def _opening(cluster: SpeechCluster, cap: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node_id": cluster.speech_id, "capability": cap["ref"], "revision": cap["revision"], "timeout_s": 120,
            **extra}  # fmt: skip


def _pieces(data: bytes, **first: Any) -> list[dict[str, Any]]:
    parts = [data[i : i + PIECE] for i in range(0, len(data), PIECE)]
    return [{"audio": base64.b64encode(p).decode(), **(first if i == 0 else {})} for i, p in enumerate(parts)]


def test_stt_vad_and_tts_capabilities_on_the_speech_plugins_own_synthesis(speech_cluster: SpeechCluster) -> None:
    caps = _capabilities(speech_cluster)
    assert caps["stt"]["mode"] == "client_streaming" and caps["vad"]["mode"] == "bidirectional"
    assert caps["tts"]["mode"] == "server_streaming"
    api = speech_cluster.api
    body = {"model": PIPER, "input": PARAGRAPH, "voice": "joe", "response_format": "wav"}
    wav = api.post("/v1/audio/speech", json=body, timeout=180).content
    assert wav[:4] == b"RIFF"

    # stt: the file in pieces, a half-close, one transcript
    got = _stream(api, _opening(speech_cluster, caps["stt"]), _pieces(wav, model=WHISPER, language="en"))
    assert [m["type"] for m in got] == ["output", "end"], got
    text = got[0]["data"]["text"]
    log.warning("stt@1.0.0 WER %.3f on %d bytes of WAV: %s", wer(PARAGRAPH, text), len(wav), text)
    assert wer(PARAGRAPH, text) < 0.10, text

    # vad: 24 kHz PCM16 of the same synthesis inside a second of silence each side
    pcm = api.post("/v1/audio/speech", json={**body, "response_format": "pcm"}, timeout=180).content
    rate = int(api.post("/v1/audio/speech", json={**body, "input": "Hi.", "response_format": "pcm"}).headers.get(
        "x-audio-sample-rate", "24000"))  # fmt: skip
    silence = bytes(2 * rate)  # one second
    audio = silence + pcm + silence
    got = _stream(api, _opening(speech_cluster, caps["vad"]), _pieces(audio, sample_rate=rate))
    assert got[-1] == {"type": "end", "ok": True}, got[-1]
    events = [m["data"] for m in got if m["type"] == "output"]
    kinds = [e["event"] for e in events]
    assert kinds and kinds[0] == "speech_started" and kinds[-1] == "speech_stopped", events
    speech_ms = len(pcm) * 1000 // (2 * rate)
    log.warning("vad@1.0.0 on 1000 ms silence + %d ms speech + 1000 ms silence: %s", speech_ms, events)
    assert 700 <= events[0]["audio_ms"] <= 1400, events  # the speech begins after the first second
    assert 1000 + speech_ms - 1500 <= events[-1]["audio_ms"] <= 1000 + speech_ms + 200, (events, speech_ms)

    # stt.realtime: the same audio as it is captured; turns, and each turn's transcript as it ends
    got = _stream(api, _opening(speech_cluster, caps["stt.realtime"]), _pieces(audio, sample_rate=rate, model=WHISPER))
    assert got[-1] == {"type": "end", "ok": True}, got[-1]
    events = [m["data"] for m in got if m["type"] == "output"]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "speech_started" and kinds[-1] == "transcript" and "speech_stopped" in kinds, kinds
    heard = " ".join(e["text"] for e in events if e["event"] == "transcript")
    log.warning("stt.realtime@1.0.0: %d turns, WER %.3f", kinds.count("transcript"), wer(PARAGRAPH, heard))
    assert wer(PARAGRAPH, heard) < 0.15, heard

    # tts: one text in, audio out as it is synthesised
    got = _stream(api, _opening(speech_cluster, caps["tts"], input={"text": "Hello from the provider.",
                                                                      "model": PIPER}), [])  # fmt: skip
    assert got[-1] == {"type": "end", "ok": True}, got[-1]
    audio_out = b"".join(base64.b64decode(m["data"]["audio"]) for m in got if m["type"] == "output")
    assert len(audio_out) > rate  # more than half a second of PCM16
