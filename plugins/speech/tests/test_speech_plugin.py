"""Fast tests of the speech plugin: the plugin contract, the model store, the deterministic Piper
engine in process, Silero VAD turns, transcript formats, and the upload path's verification."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import wave
from pathlib import Path
from typing import Any

import pytest
from skulk_kernel.api import AudioChunk, ErrorChunk, SpeechParams, StreamRouter, TranscriptChunk, TranscriptionTask
from skulk_speech import audio, formats, uploads
from skulk_speech.cards import PIPER_JOE, WHISPER_TINY_EN, SpeechModelStore, speech_cards
from skulk_speech.engines import PiperEngine, WhisperEngine
from skulk_testing.conformance import ModelStoreConformance, PluginConformance, make_runner_spec


class TestSpeechPlugin(PluginConformance):
    plugin_name = "speech"
    hook_owners = ("api-control", "hardware")  # it implements register_api_routes and plugin_fits


class TestSpeechModelStore(ModelStoreConformance):
    @pytest.fixture
    def store(self) -> SpeechModelStore:
        return SpeechModelStore()


def test_cards_declare_audio_and_their_files_come_from_the_packages() -> None:
    cards = speech_cards()
    assert cards[PIPER_JOE].sections["audio"]["voices"] == ["joe"]
    assert cards[WHISPER_TINY_EN].tasks == ("Transcription",)
    store = SpeechModelStore()
    voice = store.local_path(PIPER_JOE)
    assert voice is not None and voice.suffix == ".onnx" and voice.with_name(voice.name + ".json").is_file()
    whisper = store.local_path(WHISPER_TINY_EN)
    assert whisper is not None and (whisper / "model.bin").is_file()


@pytest.fixture(scope="module")
def piper() -> Any:
    card = speech_cards()[PIPER_JOE]
    spec = make_runner_spec(card, SpeechModelStore().local_path(PIPER_JOE), options={"deterministic": True})
    return PiperEngine().load(spec, lambda done, total: None)


def speak(session: Any, text: str, voice: str | None = "joe", cancel_after: int | None = None) -> list[Any]:
    seen = []

    def cancelled() -> bool:
        return cancel_after is not None and len(seen) >= cancel_after

    for chunk in session.synthesize("c1", SpeechParams(model_id=PIPER_JOE, input=text, voice=voice), cancelled):
        seen.append(chunk)
    return seen


def test_deterministic_piper_is_byte_identical_and_streams_by_sentence(piper: Any) -> None:
    text = "The lamp was lit. The ships were safe. The keeper slept."
    one, two = speak(piper, text), speak(piper, text)
    assert [c.data for c in one] == [c.data for c in two]
    assert len(one) == 4 and one[-1].finish_reason == "stop" and [c.seq for c in one] == [0, 1, 2, 3]
    assert all(isinstance(c, AudioChunk) and c.sample_rate == 22050 for c in one)


def test_piper_refuses_an_unknown_voice_and_stops_when_cancelled(piper: Any) -> None:
    refused = speak(piper, "Hello.", voice="alloy")
    assert isinstance(refused[0], ErrorChunk) and refused[0].code == "unknown_voice"
    cut = speak(piper, "One. Two. Three. Four.", cancel_after=1)
    assert cut[-1].finish_reason == "cancelled" and len(cut) == 2


def test_stream_encoder_mp3_yields_bytes_as_pcm_arrives(piper: Any) -> None:
    pcm = b"".join(base64.b64decode(c.data) for c in speak(piper, "A sentence long enough to encode."))
    encoder = audio.StreamEncoder("mp3", 22050)
    parts = [encoder.write(pcm[i : i + 8820]) for i in range(0, len(pcm), 8820)] + [encoder.close()]
    assert sum(1 for p in parts if p) > 3
    assert audio.probe(b"".join(parts)).codec.startswith("mp3")
    resampled = audio.StreamEncoder("pcm", 22050)
    out = resampled.write(pcm) + resampled.close()
    assert abs(len(out) / 48000 - len(pcm) / 44100) < 0.01  # 24 kHz out


def test_probe_refuses_empty_and_non_audio() -> None:
    with pytest.raises(audio.AudioError, match="empty"):
        audio.probe(b"")
    with pytest.raises(audio.AudioError, match="not audio"):
        audio.probe(b"plain text, not a sound file " * 40)


def test_silero_turns_on_synthesised_speech(piper: Any) -> None:
    from skulk_speech.vad import TurnDetector

    pcm22 = b"".join(base64.b64decode(c.data) for c in speak(piper, "The keeper climbed the stairs."))
    encoder = audio.StreamEncoder("pcm", 22050)
    pcm = b"\0" * 48000 + encoder.write(pcm22) + encoder.close() + b"\0" * 48000
    detector = TurnDetector(24000)
    boundaries = [b for i in range(0, len(pcm), 960) for b in detector.feed(pcm[i : i + 960])]
    assert [b.kind for b in boundaries] == ["started", "stopped"]
    assert 800 <= boundaries[0].at_ms <= 1300 and boundaries[1].at_ms > boundaries[0].at_ms + 1000


def test_transcript_formats() -> None:
    t = formats.Transcript(
        segments=[
            TranscriptChunk(
                command_id="c", seq=0, text=" Hello there.", start=0.0, end=1.25, words=(("Hello", 0, 0.5),)
            ),
            TranscriptChunk(command_id="c", seq=1, text=" Bye.", start=61.5, end=62.0),
        ],
        language="en",
        duration=62.0,
    )
    assert t.text == "Hello there. Bye."
    assert formats.srt(t).startswith("1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n2\n00:01:01,500")
    assert formats.vtt(t).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHello there.")
    body = formats.verbose_json(t, task="transcribe", temperature=0.0, words=True, segments=True)
    assert body["language"] == "english" and body["words"] == [{"word": "Hello", "start": 0, "end": 0.5}]


# ------------------------------------------------------------------ uploads


class _Node:
    """Just enough of a node for UploadReceiver (unit test only: the real path is tests/speech)."""

    def __init__(self, state: Any) -> None:
        self.node_id = "n1"
        self.state = state
        self.streams = StreamRouter(idle_timeout=5)
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task


def _state_with(task: TranscriptionTask) -> Any:
    from skulk_kernel.api import PipelineShardMetadata, RingInstance, ShardAssignments, State

    shard = PipelineShardMetadata(
        model_id=WHISPER_TINY_EN,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=1,
        n_layers=1,
        backend="whisper-cpu",
    )
    inst = RingInstance(
        instance_id="i1",
        engine="whisper",
        context_limit=448,
        shard_assignments=ShardAssignments(
            model_id=WHISPER_TINY_EN, runner_to_shard={"r1": shard}, node_to_runner={"n1": "r1"}
        ),
    )
    return State(instances={"i1": inst}, tasks={task.task_id: task})


@pytest.mark.parametrize("tamper", ["none", "digest", "short"])
async def test_upload_is_verified_before_the_runner_sees_it(tmp_path: Path, monkeypatch: Any, tamper: str) -> None:
    monkeypatch.setenv("SKULK_SPEECH_SPOOL", str(tmp_path))
    data = bytes(range(256)) * 3000  # three pieces
    declared = hashlib.sha256(b"other" if tamper == "digest" else data).hexdigest()
    params = SpeechParams(model_id=WHISPER_TINY_EN, audio_sha256=declared, audio_bytes=len(data))
    task = TranscriptionTask(task_id="t1", command_id="t1", instance_id="i1", owner_node_id="api", params=params)
    node = _Node(_state_with(task))
    receiver = uploads.UploadReceiver(node, max_bytes=10**7, timeout_s=5)  # type: ignore[arg-type]
    receiver.on_task_created(task)
    pieces = uploads.pieces("t1", data)
    assert len(pieces) == 3 and pieces[-1].finish_reason == "stop"
    if tamper == "short":
        pieces = [pieces[0], pieces[2]]
        pieces[1] = pieces[1].model_copy(update={"seq": 1})
    for piece in reversed(pieces):  # out of order: the stream reorders by seq
        node.streams.deliver(piece)
    await asyncio.gather(*node.tasks)
    if tamper == "none":
        got = await asyncio.to_thread(uploads.wait_for_upload, "i1", "t1", declared, 2, lambda: False)
        assert got == data
        assert not any(tmp_path.rglob("*.audio"))  # read once, then gone
    else:
        with pytest.raises(uploads.UploadError, match="SHA-256" if tamper == "digest" else "ended after"):
            await asyncio.to_thread(uploads.wait_for_upload, "i1", "t1", declared, 2, lambda: False)


def test_waiting_for_an_upload_ends_on_timeout_and_cancel(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("SKULK_SPEECH_SPOOL", str(tmp_path))
    with pytest.raises(uploads.UploadError, match="within"):
        uploads.wait_for_upload("i1", "nope", "x", 0.1, lambda: False)
    with pytest.raises(uploads.UploadError, match="cancelled"):
        uploads.wait_for_upload("i1", "nope", "x", 5, lambda: True)


def test_whisper_engine_probes_and_declares_its_tasks() -> None:
    engine = WhisperEngine()
    assert engine.probe().available and engine.backend_tags({}) == ["whisper-cpu"]
    assert engine.tasks == frozenset({"Transcription"}) and PiperEngine().tasks == frozenset({"SpeechSynthesis"})


def test_wav_bytes_round_trip() -> None:
    pcm = (b"\x10\x00\xf0\xff") * 12000
    with wave.open(io.BytesIO(audio.wav_bytes(pcm, 24000))) as w:
        assert w.getframerate() == 24000 and w.readframes(w.getnframes()) == pcm
