"""Text completions on the echo engine: the prompt read as is, echoed, scored and continued.

The echo engine has no vocabulary, so its token ids are Unicode code points (one per character:
`/tokenize` and a prompt sent as ids round-trip exactly), while its logprobs and generated tokens
are words, as everywhere else in this engine. Every prompt word after the first scores -1.0 with
itself as the only (greedy) alternative, so a client's loglikelihood arithmetic is checkable. It
has no fill-in-the-middle tokens: a `suffix` is refused, which is the 400 path the API tests use.
"""

from __future__ import annotations

from collections.abc import Iterator

from skulk_kernel.api import Chunk, ErrorChunk, PromptChunk, TextGenerationParams, TokenLogprob, TopLogprob

#: what each prompt word after the first scores with `prompt_logprobs`
PROMPT_LOGPROB = -1.0


def prompt_text(params: TextGenerationParams) -> str:
    """The completion's prompt: its text, or its ids read as code points (an id that is no Unicode
    scalar value reads as U+FFFD: the runner counts the prompt before `check` refuses it, and a lone
    surrogate could not be sent as UTF-8)."""
    completion = params.completion
    if completion is not None and completion.prompt_ids:
        return "".join(_char(i) for i in completion.prompt_ids)
    return params.raw_prompt or ""


def _char(code: int) -> str:
    return chr(code) if 0 <= code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"


def check(command_id: str, params: TextGenerationParams, model_id: str) -> ErrorChunk | None:
    """A completion this engine cannot serve: a suffix (no FIM tokens) or ids that are no characters."""
    completion = params.completion
    if completion is None:
        return None
    message = None
    if completion.suffix is not None:
        message = f"model {model_id} has no fill-in-the-middle tokens; send the prompt without `suffix`"
    elif any(not 0 <= i <= 0x10FFFF for i in completion.prompt_ids):
        message = f"prompt: token ids of {model_id} are Unicode code points (0 to 1114111)"
    if message is None:
        return None
    return ErrorChunk(
        command_id=command_id, seq=0, message=message, error_type="invalid_request_error", code="invalid_request"
    )


def prompt_chunk(command_id: str, params: TextGenerationParams, words: list[str]) -> Iterator[Chunk]:
    """The echoed prompt (with `echo`): its text, its ids and, when asked, each word's logprob."""
    completion = params.completion
    if completion is None or not completion.echo:
        return
    text = prompt_text(params)
    logprobs: tuple[TokenLogprob, ...] = ()
    if completion.prompt_logprobs is not None:
        logprobs = tuple(_scored(word, i, completion.prompt_logprobs) for i, word in enumerate(words))
    yield PromptChunk(command_id=command_id, seq=0, text=text, token_ids=tuple(ord(c) for c in text), logprobs=logprobs)


def _scored(word: str, position: int, top: int) -> TokenLogprob:
    raw = tuple(word.encode())
    if position == 0:
        return TokenLogprob(token=word, logprob=0.0, bytes=raw)
    alts = (TopLogprob(token=word, logprob=PROMPT_LOGPROB, bytes=raw),) if top else ()
    return TokenLogprob(token=word, logprob=PROMPT_LOGPROB, bytes=raw, top_logprobs=alts)
