"""Units of the voice loop: sentence cutting for early speech, and the session's response configuration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from skulk_speech.voice import MAX_SEGMENT_CHARS, VoiceConfig, cut_sentences


def test_sentences_are_cut_as_they_complete() -> None:
    assert cut_sentences("Paris is the capital. It is", final=False) == (["Paris is the capital."], " It is")
    assert cut_sentences("Hi. Ok", final=True) == (["Hi. Ok"], "")  # too short to speak alone
    assert cut_sentences("It costs 3.5 euros", final=False) == ([], "It costs 3.5 euros")  # not a sentence end
    run_on = "word " * 60
    ready, rest = cut_sentences(run_on, final=False)
    assert ready and all(len(s) <= MAX_SEGMENT_CHARS for s in ready) and len(rest) <= MAX_SEGMENT_CHARS


def test_response_configuration_from_session_update() -> None:
    session = {"type": "realtime", "model": "m", "max_output_tokens": "inf",
               "audio": {"output": {"voice": "joe", "model": "tts"}}, "skulk": {"tts_via": "direct"}}  # fmt: skip
    config = VoiceConfig.from_session(session, None)
    assert (config.model, config.voice, config.tts_model, config.tts_via) == ("m", "joe", "tts", "direct")
    assert config.max_output_tokens == 4096 and config.enable_thinking is False
    again = VoiceConfig.from_session({"type": "realtime", "instructions": "be brief"}, config)
    assert again.model == "m" and again.instructions == "be brief" and again.voice == "joe"
    with pytest.raises(ValidationError):
        VoiceConfig.from_session({"type": "realtime"}, None)  # no chat model
