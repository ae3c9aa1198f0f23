"""The OpenAI speech routes on the node's API host: /v1/audio/speech, /v1/audio/voices,
/v1/audio/transcriptions, /v1/audio/translations (the realtime socket is in `realtime.py`).

Each route validates the request fully before anything is sent (a bad body, an unknown model or
voice, an empty, non-audio or oversized upload is a 4xx in OpenAI's error shape with what to fix),
then follows api-control's route template (`adapter_routes.answer`): wait for the first chunk, answer
an early error as an HTTP status, stream or collect, and always close the call (a client that
leaves cancels its task). Uploads are read under a byte limit as they arrive, so a 1 GB body is
refused after the limit, never read whole.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from skulk_api_control.adapter_routes import ErrorAnswers, answer, stream_body
from skulk_api_control.dispatch import InferenceError, InferenceHandle
from skulk_api_control.requests_common import RequestError
from skulk_api_control.server import openai_error
from skulk_api_control.streaming import BodyTooLarge, Dispatch, read_body
from skulk_kernel.api import AudioChunk, ErrorChunk, ModelCard, NodeSurface, SpeechParams, TranscriptChunk, catalog
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from . import calls, formats
from .audio import FORMATS, PCM_RATE, STREAMABLE, AudioError, StreamEncoder, encode_all, probe
from .cards import audio_section
from .config import SpeechConfig

FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the small fields besides the file
SSE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _inference_error(exc: InferenceError) -> Response:
    return openai_error(exc.status, exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)


def _chunk_error(chunk: ErrorChunk) -> Response:
    status = calls.EARLY_ERRORS.get(chunk.code or "", 400 if chunk.error_type == "invalid_request_error" else 500)
    return openai_error(status, chunk.message, error_type=chunk.error_type, code=chunk.code)


def _request_error(exc: RequestError, param: str | None = None, code: str | None = None) -> Response:
    return openai_error(exc.status, exc.message, param=param, code=code)


ERRORS = ErrorAnswers(inference=_inference_error, chunk=_chunk_error)


def _sse(event: dict[str, Any]) -> str:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n"


def _sse_failed(exc: InferenceError) -> str:
    return _sse({"type": "error", "error": calls.describe(exc)})


def _card(node: NodeSurface, ref: str) -> ModelCard | None:
    from skulk_kernel.api import resolve_card

    try:
        return resolve_card(node, ref)
    except Exception:
        return None


class Bad(RequestError):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message, status=status)
        self.param = param
        self.code = code


def _bad(exc: Bad) -> Response:
    return openai_error(exc.status, exc.message, param=exc.param, code=exc.code)


# ================================================================== text to speech


def parse_speech(body: dict[str, Any], node: NodeSurface, config: SpeechConfig) -> tuple[SpeechParams, str, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Bad("'model' is required: the id of a speech model (GET /v1/audio/voices lists them)", param="model")
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise Bad("'input' is required: the text to speak, a non-empty string", param="input")
    if len(text) > config.max_input_chars:
        raise Bad(f"'input' is {len(text)} characters; the limit is {config.max_input_chars}", param="input")
    fmt = body.get("response_format", "mp3")
    if fmt not in FORMATS:
        raise Bad(f"'response_format' {fmt!r} is not one of {', '.join(FORMATS)}", param="response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
        raise Bad("'speed' must be a number from 0.25 to 4.0", param="speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise Bad("'stream_format' must be 'audio' or 'sse'", param="stream_format")
    sse = stream_format == "sse"
    if sse and fmt not in STREAMABLE:
        raise Bad(f"'stream_format': 'sse' streams {' or '.join(sorted(STREAMABLE))}, not {fmt}", param="stream_format")
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
    card = _card(node, model)
    if card is not None:
        audio = audio_section(card)
        voices = list(audio.get("voices", []))
        if voice is None:
            voice = audio.get("default_voice") or (voices[0] if voices else None)
        if voices and voice not in voices:
            raise Bad(
                f"unknown voice {voice!r} for {card.model_id}; its voices are {', '.join(voices)} "
                "(GET /v1/audio/voices)",
                param="voice",
                code="unknown_voice",
            )
    if voice is not None and not isinstance(voice, str):
        raise Bad("'voice' must be a string", param="voice")
    params = SpeechParams(model_id=model, input=text, voice=voice, options={"speed": float(speed)})
    return params, fmt, sse


def add_speech_routes(app: Any, node: NodeSurface, config: SpeechConfig) -> None:
    @app.post("/v1/audio/speech", tags=["openai"])
    @app.post("/audio/speech", include_in_schema=False)
    async def post_speech(request: Request) -> Response:
        """Text to speech: the whole file, or streamed as it is synthesised (pcm, mp3; SSE)."""
        try:
            body = await _read_json(request)
            params, fmt, sse = parse_speech(body, node, config)
        except Bad as exc:
            return _bad(exc)
        media_type = FORMATS[fmt][3]
        headers = {"x-audio-sample-rate": str(PCM_RATE), "x-audio-channels": "1"} if fmt == "pcm" else {}

        async def complete(handle: InferenceHandle) -> Response:
            pcm: list[bytes] = []
            rate = 0
            async for chunk in handle.chunks():
                if isinstance(chunk, ErrorChunk):
                    return _chunk_error(chunk)
                if isinstance(chunk, AudioChunk) and chunk.data:
                    rate = rate or chunk.sample_rate
                    pcm.append(base64.b64decode(chunk.data))
            data = await asyncio.to_thread(encode_all, b"".join(pcm), rate or PCM_RATE, fmt)
            return Response(data, media_type=media_type, headers=headers)

        def audio_stream(dispatch: Dispatch) -> AsyncIterator[Any]:
            return _audio_body(dispatch, fmt)

        def sse_stream(dispatch: Dispatch) -> AsyncIterator[str]:
            return stream_body(dispatch, lambda handle: _speech_events(handle, fmt), _sse_failed)

        call = calls.synthesize(node, params, config.place_on_request)
        if sse:
            return await answer(request, call, ERRORS, complete, stream=sse_stream, headers=SSE)
        if fmt in STREAMABLE:
            return await answer(
                request, call, ERRORS, complete, stream=audio_stream, media_type=media_type, headers=headers
            )
        return await answer(request, call, ERRORS, complete)

    @app.get("/v1/audio/voices", tags=["openai"])
    async def get_voices(model: str | None = None) -> Response:
        """The voices of the speech models in the catalog (a Skulk extension of the OpenAI API)."""
        cards = list(catalog(node).values())
        if model is not None:
            card = _card(node, model)
            if card is None or "SpeechSynthesis" not in card.tasks:
                return openai_error(404, f"{model!r} is not a text-to-speech model in this cluster", param="model")
            cards = [card]
        data = []
        for card in cards:
            if "SpeechSynthesis" not in card.tasks:
                continue
            audio = audio_section(card)
            listed = {v["id"]: v for v in audio.get("voice_catalog", []) if isinstance(v, dict) and "id" in v}
            for voice in audio.get("voices", []):
                entry = {"id": voice, "name": voice, "object": "voice", "model": card.model_id}
                entry |= listed.get(voice, {})
                entry["default"] = voice == audio.get("default_voice")
                data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    add_transcription_routes(app, node, config)


async def _read_json(request: Request) -> dict[str, Any]:
    try:
        raw = await read_body(request)
    except BodyTooLarge as exc:
        raise Bad(str(exc), status=413) from None
    if not raw.strip():
        raise Bad("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Bad("the request body must be a JSON object")
    return body


async def _audio_body(dispatch: Dispatch, fmt: str) -> AsyncIterator[bytes]:
    """Encoded audio as each sentence arrives; a late failure can only end the body early."""
    try:
        handle = dispatch.handle()
        encoder: StreamEncoder | None = None
        async for chunk in handle.chunks():
            if isinstance(chunk, ErrorChunk):
                break
            if not isinstance(chunk, AudioChunk):
                continue
            if chunk.data:
                encoder = encoder or StreamEncoder(fmt, chunk.sample_rate or PCM_RATE)
                out = encoder.write(base64.b64decode(chunk.data))
                if out:
                    yield out
            if chunk.finish_reason is not None and encoder is not None:
                tail = encoder.close()
                if tail:
                    yield tail
    finally:
        await dispatch.close()


async def _speech_events(handle: InferenceHandle, fmt: str) -> AsyncIterator[str]:
    encoder: StreamEncoder | None = None
    async for chunk in handle.chunks():
        if isinstance(chunk, ErrorChunk):
            yield _sse(
                {"type": "error", "error": {"message": chunk.message, "type": chunk.error_type, "code": chunk.code}}
            )
            return
        if not isinstance(chunk, AudioChunk):
            continue
        out = b""
        if chunk.data:
            encoder = encoder or StreamEncoder(fmt, chunk.sample_rate or PCM_RATE)
            out = encoder.write(base64.b64decode(chunk.data))
        if chunk.finish_reason is not None and encoder is not None:
            out += encoder.close()
        if out:
            yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(out).decode("ascii")})
        if chunk.finish_reason is not None:
            chars = chunk.usage.prompt_tokens if chunk.usage else 0
            yield _sse(
                {
                    "type": "speech.audio.done",
                    "usage": {"input_tokens": chars, "output_tokens": 0, "total_tokens": chars},
                }
            )
            return


# ================================================================== speech to text


async def _bounded(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BodyTooLarge(limit, size)
        yield part


async def read_form(request: Request, config: SpeechConfig) -> tuple[dict[str, list[str]], bytes, str]:
    """(fields, the file's bytes, its filename) of a multipart upload, read under the size limit."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    limit = config.max_upload_bytes + FORM_OVERHEAD
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise Bad("send the audio as multipart/form-data with a 'file' field (and 'model')", param="file")
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise Bad(
            f"the upload is {length} bytes; the limit is {config.max_upload_bytes} bytes of audio",
            status=413,
            param="file",
            code="file_too_large",
        )
    parser = MultiPartParser(request.headers, _bounded(request, limit), max_files=1, max_fields=32)
    try:
        form = await parser.parse()
    except BodyTooLarge:
        raise Bad(
            f"the upload is over the limit of {config.max_upload_bytes} bytes of audio; send a shorter file",
            status=413,
            param="file",
            code="file_too_large",
        ) from None
    except MultiPartException as exc:
        raise Bad(f"the multipart body could not be read: {exc.message}") from None
    fields: dict[str, list[str]] = {}
    upload: UploadFile | None = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key == "file":
                upload = value
        else:
            fields.setdefault(key.removesuffix("[]"), []).append(value)
    if upload is None:
        raise Bad("the 'file' field is missing: attach the audio file", param="file")
    data = await upload.read()
    await upload.close()
    if len(data) > config.max_upload_bytes:
        raise Bad(
            f"the file is {len(data)} bytes; the limit is {config.max_upload_bytes}",
            status=413,
            param="file",
            code="file_too_large",
        )
    return fields, data, upload.filename or ""


def _one(fields: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    values = fields.get(name)
    return values[-1] if values else default


def parse_transcription(
    fields: dict[str, list[str]], node: NodeSurface, *, translate: bool
) -> tuple[SpeechParams, str, bool, set[str]]:
    model = _one(fields, "model")
    if not model:
        raise Bad("'model' is required: the id of a speech-to-text model", param="model")
    fmt = _one(fields, "response_format", "json") or "json"
    if fmt not in formats.RESPONSE_FORMATS:
        raise Bad(
            f"'response_format' {fmt!r} is not one of {', '.join(formats.RESPONSE_FORMATS)}", param="response_format"
        )
    granularities = set(fields.get("timestamp_granularities", [])) or ({"segment"} if fmt == "verbose_json" else set())
    if not granularities <= {"word", "segment"}:
        raise Bad("'timestamp_granularities' takes 'word' and/or 'segment'", param="timestamp_granularities")
    if "word" in granularities and fmt != "verbose_json":
        raise Bad("word timestamps need response_format 'verbose_json'", param="timestamp_granularities")
    stream = (_one(fields, "stream", "false") or "false").lower() == "true"
    if stream and (translate or fmt not in ("json", "text")):
        raise Bad("'stream' works for transcriptions with response_format 'json' or 'text'", param="stream")
    try:
        temperature = float(_one(fields, "temperature", "0") or 0)
    except ValueError:
        raise Bad("'temperature' must be a number from 0 to 1", param="temperature") from None
    if not 0 <= temperature <= 1:
        raise Bad("'temperature' must be a number from 0 to 1", param="temperature")
    card = _card(node, model)
    if card is not None and translate and not audio_section(card).get("supports_translation"):
        raise Bad(f"{card.model_id} does not translate; use /v1/audio/transcriptions", param="model")
    language = None if translate else _one(fields, "language")
    options = {
        "language": language,
        "prompt": _one(fields, "prompt"),
        "temperature": temperature,
        "translate": translate,
        "word_timestamps": "word" in granularities,
    }
    return SpeechParams(model_id=model, options=options), fmt, stream, granularities


def add_transcription_routes(app: Any, node: NodeSurface, config: SpeechConfig) -> None:
    async def transcription(request: Request, translate: bool) -> Response:
        try:
            fields, data, _name = await read_form(request, config)
            params, fmt, stream, granularities = parse_transcription(fields, node, translate=translate)
            await asyncio.to_thread(probe, data)
        except Bad as exc:
            return _bad(exc)
        except AudioError as exc:
            return openai_error(400, str(exc), param="file", code="invalid_audio")
        task = "translate" if translate else "transcribe"
        temperature = float(params.options.get("temperature", 0.0))

        async def complete(handle: InferenceHandle) -> Response:
            got = await formats.collect(handle.chunks())
            if got.error is not None:
                return _chunk_error(got.error)
            if fmt == "text":
                return PlainTextResponse(got.text + "\n")
            if fmt == "srt":
                return PlainTextResponse(formats.srt(got))
            if fmt == "vtt":
                return PlainTextResponse(formats.vtt(got), media_type="text/vtt")
            if fmt == "verbose_json":
                return JSONResponse(
                    formats.verbose_json(
                        got,
                        task=task,
                        temperature=temperature,
                        words="word" in granularities,
                        segments="segment" in granularities,
                    )
                )
            return JSONResponse({"text": got.text, "usage": formats.usage(got)})

        def sse_stream(dispatch: Dispatch) -> AsyncIterator[str]:
            return stream_body(dispatch, _transcript_events, _sse_failed)

        call = calls.transcribe(node, params, data, config.place_on_request)
        return await answer(request, call, ERRORS, complete, stream=sse_stream if stream else None, headers=SSE)

    @app.post("/v1/audio/transcriptions", tags=["openai"])
    @app.post("/audio/transcriptions", include_in_schema=False)
    async def post_transcriptions(request: Request) -> Response:
        """Speech to text (multipart upload): json, text, srt, vtt, verbose_json; SSE with stream=true."""
        return await transcription(request, translate=False)

    @app.post("/v1/audio/translations", tags=["openai"])
    @app.post("/audio/translations", include_in_schema=False)
    async def post_translations(request: Request) -> Response:
        """Speech in any language to English text (models whose card declares supports_translation)."""
        return await transcription(request, translate=True)


async def _transcript_events(handle: InferenceHandle) -> AsyncIterator[str]:
    text: list[str] = []
    async for chunk in handle.chunks():
        if isinstance(chunk, ErrorChunk):
            yield _sse(
                {"type": "error", "error": {"message": chunk.message, "type": chunk.error_type, "code": chunk.code}}
            )
            return
        if not isinstance(chunk, TranscriptChunk):
            continue
        if chunk.finish_reason is not None:
            usage = {"type": "duration", "seconds": round(chunk.end, 3)}
            yield _sse({"type": "transcript.text.done", "text": "".join(text).strip(), "usage": usage})
            return
        delta = chunk.text if text else chunk.text.lstrip()
        text.append(chunk.text)
        yield _sse({"type": "transcript.text.delta", "delta": delta})
