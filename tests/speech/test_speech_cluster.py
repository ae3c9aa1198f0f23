"""Issue [speech] acceptance: real node processes, real models (Piper joe-medium, Whisper tiny.en),
the official `openai` SDK, the speech models on a second node (every request crosses the data plane)."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
import wave

import httpx
import pytest
from openai import BadRequestError, OpenAI

from .conftest import PARAGRAPH, PIPER, WHISPER, SpeechCluster, wer

pytestmark = pytest.mark.slow


def client(node) -> OpenAI:
    return OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def synthesize_pcm(node, text: str) -> bytes:
    response = httpx.post(
        node.url + "/v1/audio/speech",
        json={"model": PIPER, "input": text, "voice": "joe", "response_format": "pcm"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-audio-sample-rate"] == "24000"
    return response.content


def test_round_trip_through_the_sdk_with_models_on_a_second_node(speech_cluster: SpeechCluster) -> None:
    api = speech_cluster.api
    state = api.state()
    runners = {
        inst["shardAssignments"]["modelId"]: list(inst["shardAssignments"]["nodeToRunner"])
        for inst in (next(iter(w.values())) for w in state["instances"].values())
    }
    assert runners[PIPER] == [speech_cluster.speech_id] and runners[WHISPER] == [speech_cluster.speech_id]
    sdk = client(api)
    wav = sdk.audio.speech.create(model=PIPER, voice="joe", input=PARAGRAPH, response_format="wav").read()
    with wave.open(io.BytesIO(wav)) as w:
        seconds = w.getnframes() / w.getframerate()
        assert w.getnchannels() == 1 and w.getsampwidth() == 2 and seconds > 15
    text = sdk.audio.transcriptions.create(model=WHISPER, file=("paragraph.wav", wav)).text
    assert wer(PARAGRAPH, text) < 0.10, text
    short = "One winter a storm broke the windows of the lighthouse."
    mp3 = sdk.audio.speech.create(model="tts-1", voice="joe", input=short, response_format="mp3")
    verbose = sdk.audio.transcriptions.create(
        model="whisper-1",
        file=("short.mp3", mp3.read()),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert wer(short, verbose.text) < 0.25 and verbose.language == "english"
    assert verbose.words and all(w.end >= w.start for w in verbose.words) and verbose.segments
    srt = sdk.audio.transcriptions.create(model=WHISPER, file=("short.wav", wav[:200_000]), response_format="srt")
    assert "-->" in srt and srt.lstrip().startswith("1")
    translated = sdk.audio.translations.create(model=WHISPER, file=("paragraph.wav", wav))
    assert wer(PARAGRAPH, translated.text) < 0.10


def test_streaming_tts_sends_audio_before_synthesis_ends(speech_cluster: SpeechCluster) -> None:
    api = speech_cluster.api
    arrivals: list[tuple[float, int]] = []
    parts: list[bytes] = []
    started = time.monotonic()
    body = {"model": PIPER, "input": PARAGRAPH, "voice": "joe", "response_format": "pcm"}
    with httpx.stream("POST", api.url + "/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        for part in response.iter_raw():
            arrivals.append((time.monotonic() - started, len(part)))
            parts.append(part)
    first, total = arrivals[0][0], arrivals[-1][0]
    size = sum(n for _, n in arrivals)
    assert size > 24000 * 2 * 15  # more than 15 s of 24 kHz PCM16
    early = sum(n for t, n in arrivals if t <= first + 0.05)
    assert early < size / 2, "the first bytes should be one sentence, not the whole paragraph"
    assert first < total * 0.7, f"first audio at {first:.2f}s, synthesis ended at {total:.2f}s"
    # deterministic Piper (noise scales 0): the same request gives the same bytes
    again = httpx.post(api.url + "/v1/audio/speech", json=body, timeout=120).content
    assert again == b"".join(parts)
    # SSE: several audio deltas, then done with usage
    events = []
    sse_body = {**body, "stream_format": "sse", "response_format": "mp3"}
    with httpx.stream("POST", api.url + "/v1/audio/speech", json=sse_body, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.delta") >= 3
    assert all(base64.b64decode(e["audio"]) for e in events[:-1])


def test_deterministic_voice_is_byte_identical(speech_cluster: SpeechCluster) -> None:
    one = synthesize_pcm(speech_cluster.api, "Every night the keeper lit the lamp.")
    two = synthesize_pcm(speech_cluster.speech, "Every night the keeper lit the lamp.")
    assert one == two and len(one) > 24000


def test_realtime_session_transcribes_20ms_frames(speech_cluster: SpeechCluster) -> None:
    api = speech_cluster.api
    sentence = "Every night the keeper climbed the stairs and lit the great lamp."
    pcm = synthesize_pcm(api, sentence)
    silence = b"\0" * (24000 * 2)  # a second of silence ends the turn
    sdk = OpenAI(base_url=api.url + "/v1", api_key="unused", websocket_base_url=api.url.replace("http", "ws") + "/v1")
    events: list[dict] = []
    with sdk.realtime.connect(model=WHISPER, extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        # a wrong sample rate is an error event, and the session carries on
        conn.send(
            {
                "type": "session.update",
                "session": {
                    "type": "transcription",
                    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
                },
            }
        )
        bad = json.loads(conn.recv_bytes())
        assert bad["type"] == "error" and bad["error"]["code"] == "invalid_value" and "24000" in bad["error"]["message"]
        conn.send(
            {
                "type": "session.update",
                "session": {
                    "type": "transcription",
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 24000},
                            "transcription": {"model": WHISPER},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                        }
                    },
                },
            }
        )
        assert json.loads(conn.recv_bytes())["type"] == "session.updated"
        audio = silence[:9600] + pcm + silence
        for i in range(0, len(audio), 960):  # 20 ms frames
            conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio[i : i + 960]).decode()})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            event = json.loads(conn.recv_bytes())
            events.append(event)
            if event["type"] in (
                "conversation.item.input_audio_transcription.completed",
                "conversation.item.input_audio_transcription.failed",
            ):
                break
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" in kinds and "input_audio_buffer.committed" in kinds, kinds
    assert "conversation.item.input_audio_transcription.delta" in kinds, kinds
    done = events[-1]
    assert done["type"] == "conversation.item.input_audio_transcription.completed", done
    assert wer(sentence, done["transcript"]) < 0.2, done["transcript"]
    deltas = "".join(e["delta"] for e in events if e["type"].endswith(".delta"))
    assert deltas.strip() == done["transcript"]


def _upload_gigabyte(url: str) -> tuple[int, bytes]:
    """Stream a chunked 1 GB multipart body; stop when the server answers. (bytes sent, answer)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    boundary = "skulkboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{WHISPER}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    sock.sendall(
        (
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
        ).encode()
    )
    answer = bytearray()
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                got = sock.recv(65536)
                if not got:
                    break
                answer.extend(got)
                if b"\r\n\r\n" in answer:
                    break
        except OSError:
            pass
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sent = 0
    block = b"\x01" * (1 << 20)
    try:
        for i in range(1024):
            if done.is_set():
                break
            piece = head + block if i == 0 else block
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
    except OSError:
        pass
    reader.join(30)
    done.set()
    sock.close()
    return sent, bytes(answer)


def test_bad_input_is_a_clear_4xx_and_the_node_keeps_serving(speech_cluster: SpeechCluster) -> None:
    api = speech_cluster.api
    sdk = client(api)
    with pytest.raises(BadRequestError, match="empty"):
        sdk.audio.transcriptions.create(model=WHISPER, file=("empty.wav", b""))
    with pytest.raises(BadRequestError, match="not audio") as not_audio:
        sdk.audio.transcriptions.create(model=WHISPER, file=("notes.txt", b"these are my notes, not audio " * 50))
    assert not_audio.value.code == "invalid_audio"
    with pytest.raises(BadRequestError, match="unknown voice") as voice:
        sdk.audio.speech.create(model=PIPER, voice="alloy", input="Hello.")
    assert voice.value.code == "unknown_voice"
    with pytest.raises(BadRequestError, match="input"):
        sdk.audio.speech.create(model=PIPER, voice="joe", input="   ")
    missing = httpx.post(api.url + "/v1/audio/speech", json={"model": "nope", "input": "hi"}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    sent, answer = _upload_gigabyte(api.url)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 128 * 2**20, f"the server read {sent} bytes before refusing"
    # the node keeps serving
    ok = sdk.audio.speech.create(model=PIPER, voice="joe", input="Still here.", response_format="wav").read()
    assert sdk.audio.transcriptions.create(model=WHISPER, file=("ok.wav", ok)).text.strip()
