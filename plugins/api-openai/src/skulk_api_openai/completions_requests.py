"""OpenAI text-completion bodies (`/v1/completions`) and vLLM's `/tokenize` `/detokenize` -> TextGenerationParams.

A completion is one `TextGeneration` per choice (`CompletionParams` on it says "read the prompt as
is"), so it takes the same admission, routing, resume and tracing as a chat turn. A body becomes a
list of params, one per choice, in OpenAI's order: prompt i's n choices are indices i*n .. i*n+n-1.
Tokenizing is a completion that generates nothing and echoes its prompt's ids (`generate=False`),
routed to a runner that holds the model like any request.

Mistakes are 400s in OpenAI's error shape naming the field (`requests.RequestError`), including what
this server refuses on purpose: `best_of` above 1 (it would run best_of generations to return one),
`echo` with `suffix`, and more than `MAX_CHOICES` choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationError
from skulk_api_control.requests_common import StrictBody as _In
from skulk_kernel.api import ChatMessage, CompletionParams, SamplingParams, TextGenerationParams

from .requests import RequestError, StreamOptionsIn, _validate, validation_error

#: OpenAI's default when `max_tokens` is left out
DEFAULT_MAX_TOKENS = 16
#: prompts x n in one request (lm-eval batches prompts; a bound keeps one request from flooding the cluster)
MAX_CHOICES = 256
#: alternatives per token (OpenAI allows 5, vLLM 20; llama.cpp reports any number)
MAX_LOGPROBS = 20

Prompt = str | list[int]
#: a token id as a request may spell it: non-negative and within 32 bits (a larger one cannot be sent on
#: as a command, whose wire form is msgpack: schemathesis found the 500 it raised)
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class CompletionRequest(_In):
    """The body of `POST /v1/completions` (OpenAI's legacy text completions)."""

    model: str = Field(min_length=1)
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(
        description="text, token ids, or a list of either (one choice per prompt)"
    )
    suffix: str | None = Field(default=None, description="fill in the middle: the text after the completion")
    max_tokens: int | None = Field(default=None, ge=0, description=f"default {DEFAULT_MAX_TOKENS}; 0 with echo")
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    best_of: int | None = Field(default=None, ge=1)
    stream: bool | None = None
    stream_options: StreamOptionsIn | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None  # vLLM's and llama.cpp's: exactly max_tokens tokens (guidellm's benchmarks)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    user: str | None = None


class TokenizeRequest(_In):
    """The body of `POST /tokenize` (vLLM's shape; `model` may be left out while one text model is placed).

    The ids are those of the text itself: a BOS token the engine adds in front of a text prompt is
    not among them, whatever `add_special_tokens` says (lm-eval's remote tokenizer sends False)."""

    model: str | None = Field(default=None, min_length=1)
    prompt: str
    add_special_tokens: bool | None = None


class DetokenizeRequest(_In):
    """The body of `POST /detokenize` (vLLM's shape; `model` as for `/tokenize`)."""

    model: str | None = Field(default=None, min_length=1)
    tokens: list[TokenId]


@dataclass(frozen=True)
class CompletionsRequest:
    """A parsed completion request: one params per choice, and what the answer needs to know."""

    choices: tuple[TextGenerationParams, ...]
    model: str
    stream: bool
    include_usage: bool
    logprobs: int | None
    echo: bool
    n: int


def _prompts(value: Any) -> list[Prompt]:
    if isinstance(value, str):
        return [value]
    if not value:
        raise RequestError("prompt: the list is empty; send a string, token ids, or a list of either", param="prompt")
    if all(isinstance(v, int) for v in value):
        return [list(value)]
    for i, item in enumerate(value):
        if isinstance(item, list) and not item:
            raise RequestError(f"prompt[{i}]: an empty list of token ids", param="prompt")
    return list(value)


def _refusals(req: CompletionRequest) -> None:
    if req.best_of is not None and req.best_of > 1:
        raise RequestError(
            "best_of: only best_of=1 is supported (this server returns every generation it runs); "
            "ask for n choices and pick among them instead",
            param="best_of",
            code="unsupported_parameter",
        )
    if req.echo and req.suffix is not None:
        raise RequestError("echo: cannot be combined with suffix", param="echo", code="unsupported_parameter")
    if req.max_tokens == 0 and req.suffix is not None:
        raise RequestError("max_tokens: 0 leaves nothing to fill in with suffix", param="max_tokens")


def parse_completion_request(data: dict[str, Any]) -> CompletionsRequest:
    req: CompletionRequest = _validate(CompletionRequest, data)
    _refusals(req)
    prompts = _prompts(req.prompt)
    n = req.n or 1
    if len(prompts) * n > MAX_CHOICES:
        raise RequestError(
            f"prompt: {len(prompts)} prompts x n={n} is over the limit of {MAX_CHOICES} choices per request",
            param="prompt",
        )
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    choices = []
    try:
        for prompt in prompts:
            for j in range(n):
                sampling = SamplingParams(
                    temperature=req.temperature,
                    top_p=req.top_p,
                    top_k=req.top_k if req.top_k is not None and req.top_k > 0 else None,
                    min_p=req.min_p,
                    seed=req.seed + j if req.seed is not None else None,  # n choices, n draws
                    repetition_penalty=req.repetition_penalty,
                    presence_penalty=req.presence_penalty,
                    frequency_penalty=req.frequency_penalty,
                    max_tokens=max_tokens or None,
                    stop=tuple(s for s in stops if s),
                    ignore_eos=bool(req.ignore_eos),
                )
                choices.append(_params(req, prompt, sampling, generate=max_tokens > 0))
    except ValidationError as exc:
        raise validation_error(exc) from None
    return CompletionsRequest(
        choices=tuple(choices),
        model=req.model,
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=req.logprobs,
        echo=bool(req.echo),
        n=n,
    )


def _params(
    req: CompletionRequest, prompt: Prompt, sampling: SamplingParams, *, generate: bool
) -> TextGenerationParams:
    text = prompt if isinstance(prompt, str) else None
    completion = CompletionParams(
        prompt_ids=() if isinstance(prompt, str) else tuple(prompt),
        suffix=req.suffix,
        echo=bool(req.echo),
        prompt_logprobs=req.logprobs if req.echo else None,
        generate=generate,
    )
    return TextGenerationParams(
        model_id=req.model,
        messages=(ChatMessage(role="user", content=text or ""),),  # what routing's prefix affinity reads
        raw_prompt=text,
        sampling=sampling,
        logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0,
        completion=completion,
    )


def tokenize_params(data: dict[str, Any], default_model: Callable[[], str]) -> TextGenerationParams:
    """`/tokenize`: a completion of `prompt` that generates nothing and echoes its ids."""
    req: TokenizeRequest = _validate(TokenizeRequest, data)
    return _read_only(req.model or default_model(), req.prompt, ())


def detokenize_params(data: dict[str, Any], default_model: Callable[[], str]) -> TextGenerationParams:
    """`/detokenize`: a completion of the ids `tokens` that generates nothing and echoes their text."""
    req: DetokenizeRequest = _validate(DetokenizeRequest, data)
    if not req.tokens:
        raise RequestError("tokens: the list is empty", param="tokens")
    return _read_only(req.model or default_model(), None, tuple(req.tokens))


def _read_only(model: str, text: str | None, ids: tuple[int, ...]) -> TextGenerationParams:
    return TextGenerationParams(
        model_id=model,
        messages=(ChatMessage(role="user", content=text or ""),),
        raw_prompt=text,
        completion=CompletionParams(prompt_ids=ids, echo=True, generate=False),
    )
