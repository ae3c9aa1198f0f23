"""Text completions on llama.cpp's server: the prompt as is, fill-in-the-middle, the echoed prompt's logprobs.

Why the native endpoints: ``/v1/completions`` refuses ``echo`` ("Only no echo is supported") and
reports no prompt logprobs, and fill-in-the-middle is ``/infill``, which builds the prompt from the
GGUF's own FIM tokens (prefix, suffix, middle; Qwen2.5-Coder has them, SmolLM2 does not: llama.cpp
answers 501 "Infill is not supported by this model", a 400 here). ``/completion`` and ``/infill``
stream the same native chunks (``content``, ``tokens``, ``completion_probabilities``, and a last one
with ``stop_type``, the token counts and the timings), read by :func:`native_stream`.

The prompt's own logprobs (``echo`` with ``logprobs``, what lm-eval's loglikelihood needs) come from
forced one-token steps: for each prompt position, ``/completion`` on the tokens before it with a
logit bias that makes that token the one sampled. With ``post_sampling_probs`` off the server
reports the sampled token's probability, and the alternatives, from the model's raw distribution,
before any sampler (the bias included) ran, so each is the exact logprob of the prompt's token in
its context. Steps run one after another on the prompt cache: each evaluates one new token (about
20 ms a position for SmolLM2 on one core), so scoring costs what a prefill of the prompt one token
at a time would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import CompletionParams

from .abortable import AbortableStream
from .events import BackendError, CancelCheck, Event, Finish, TextDelta, TokenLogprob, TopLogprob
from .server_backend import LlamaServer, _error_from

#: a bias no logit overcomes: the forced token is the one sampled
FORCE_BIAS = 1000.0
#: how often a prompt being scored reports its progress
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class ScoringProgress:
    """Prompt positions scored so far: sent now and then while a long prompt is scored, so the request's
    stream is not taken for idle (the API gives up on a stream silent for two minutes)."""

    done: int
    total: int


@dataclass(frozen=True, slots=True)
class PromptEcho:
    """The prompt as the server read it (``CompletionParams.echo``), before any TextDelta."""

    text: str
    ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


def native_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """The engine's sampling dict (OpenAI names) in the native endpoints' names."""
    body = {k: v for k, v in sampling.items() if v is not None and k != "max_tokens"}
    if sampling.get("max_tokens") is not None:
        body["n_predict"] = sampling["max_tokens"]
    return body


def complete(
    server: LlamaServer,
    completion: CompletionParams,
    raw_prompt: str | None,
    sampling: dict[str, Any],
    *,
    logprobs: int | None,
    token_ids: bool,
    cancel: CancelCheck,
    model_id: str,
) -> Iterator[Event | PromptEcho | ScoringProgress]:
    """One text completion as events: the echoed prompt (if asked), then text deltas and a Finish.

    ``logprobs`` is the number of alternatives per generated token (None: no logprobs).
    """
    text = raw_prompt or ""
    if completion.prompt_ids and completion.suffix is not None:
        text = detokenize(server, completion.prompt_ids)
    ids: list[int] | None = list(completion.prompt_ids) or None
    if completion.echo:
        ids, lead, text = _prompt(server, completion, text)
        scored: list[TokenLogprob] = []
        if completion.prompt_logprobs is not None:
            reported = time.monotonic()
            for lp in score_prompt(server, ids, completion.prompt_logprobs, cancel, lead):
                scored.append(lp)
                if time.monotonic() - reported >= PROGRESS_EVERY_S:
                    reported = time.monotonic()
                    yield ScoringProgress(len(scored), len(ids) - lead)
        if cancel():
            return
        yield PromptEcho(text, tuple(ids[lead:]), tuple(scored))
    if not completion.generate:
        yield Finish("length", len(ids or ()), 0)
        return
    body = native_sampling(sampling)
    body.update({"stream": True, "cache_prompt": True, "return_tokens": True})
    if logprobs is not None:
        body["n_probs"] = max(1, logprobs)
        body["post_sampling_probs"] = False
    if completion.suffix is not None:
        body.update({"input_prefix": text, "input_suffix": completion.suffix, "prompt": ""})
        path = "/infill"
    else:
        body["prompt"] = ids if ids is not None else text
        path = "/completion"
    try:
        yield from native_stream(server, path, body, cancel, logprobs, token_ids)
    except BackendError as exc:
        if exc.status == 501 and path == "/infill":
            raise BackendError(
                f"model {model_id} has no fill-in-the-middle tokens (llama.cpp: {exc}); "
                "send the prompt without `suffix`",
                400,
            ) from exc
        raise


def _prompt(server: LlamaServer, completion: CompletionParams, text: str) -> tuple[list[int], int, str]:
    """The prompt's ids as generation reads them, how many lead tokens (a BOS) its text does not spell,
    and its text."""
    if completion.prompt_ids:
        ids = list(completion.prompt_ids)
        return ids, 0, detokenize(server, ids)
    ids = server.tokenize(text, add_special=True)
    return ids, max(0, len(ids) - len(server.tokenize(text, add_special=False))), text


def score_prompt(
    server: LlamaServer, ids: Sequence[int], top: int, cancel: Callable[[], bool], start: int = 0
) -> Iterator[TokenLogprob]:
    """Each prompt token's logprob from ``start`` on (see the module doc); the very first token of the
    sequence has no context: logprob 0.0, no alternatives."""
    for i in range(start, len(ids)):
        if cancel():
            return
        if i == 0:
            piece = detokenize(server, ids[:1])
            yield TokenLogprob(piece, 0.0, tuple(piece.encode()), (), ids[0])
            continue
        body = {
            "prompt": list(ids[:i]),
            "n_predict": 1,
            "n_probs": max(1, top),
            "post_sampling_probs": False,
            "temperature": 0,
            "logit_bias": [[ids[i], FORCE_BIAS]],
            "cache_prompt": True,
        }
        probs = server._post("/completion", body).get("completion_probabilities") or []
        if not probs:
            raise BackendError(f"llama.cpp reported no probabilities for prompt position {i}")
        entry = _logprob(probs[0], top > 0)
        yield TokenLogprob(entry.token, entry.logprob, entry.bytes, entry.top[:top], ids[i])


def detokenize(server: LlamaServer, ids: Sequence[int]) -> str:
    content = server._post("/detokenize", {"tokens": list(ids)}).get("content")
    return content if isinstance(content, str) else ""


def _logprob(entry: dict[str, Any], keep_top: bool) -> TokenLogprob:
    def raw(e: dict[str, Any]) -> tuple[int, ...] | None:
        return tuple(e["bytes"]) if e.get("bytes") is not None else None

    top = tuple(TopLogprob(t.get("token", ""), float(t["logprob"]), raw(t)) for t in (entry.get("top_logprobs") or ()))
    token_id = entry.get("id")
    return TokenLogprob(
        entry.get("token", ""),
        float(entry["logprob"]),
        raw(entry),
        top if keep_top else (),
        token_id if isinstance(token_id, int) else None,
    )


def native_stream(
    server: LlamaServer,
    path: str,
    body: dict[str, Any],
    cancel: CancelCheck,
    logprobs: int | None,
    token_ids: bool,
) -> Iterator[Event]:
    """Stream ``/completion`` or ``/infill`` as TextDelta events and a Finish (none when cancelled)."""
    server._client()  # raises if the server is not running
    factory = server.network_backend_factory
    stream = AbortableStream(
        server.base_url, path, json.dumps(body).encode(), server.request_timeout_s, factory() if factory else None
    )
    key = server._watcher.add(cancel, stream)
    final: dict[str, Any] = {}
    try:
        try:
            status = stream.open()
            if status != 200:
                raise _error_from(status, stream.read_all())
            lines = stream.lines()
        except BackendError:
            raise
        except Exception as exc:
            if stream.aborted:
                return
            raise BackendError(f"llama.cpp server stream failed: {exc!r}") from exc
        while True:
            if cancel():
                return
            try:
                line = next(lines)
            except StopIteration:
                break
            except Exception as exc:
                if stream.aborted:
                    return
                raise BackendError(f"llama.cpp server stream broke: {exc!r}") from exc
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                err = chunk["error"]
                raise _error_from(int(err.get("code") or 500), json.dumps(err))
            lps = None
            if logprobs is not None:
                lps = tuple(_logprob(e, logprobs > 0) for e in chunk.get("completion_probabilities") or ())
            ids = tuple(int(t) for t in chunk.get("tokens") or ()) if token_ids else ()
            text = chunk.get("content") or ""
            if text or ids or lps:
                yield TextDelta(text, lps, ids)
            if chunk.get("stop"):
                final = chunk
                break
    finally:
        server._watcher.remove(key)
        stream.close()
    if not final:
        if cancel():
            return
        raise BackendError("llama.cpp ended the stream without its last chunk")
    timings = final.get("timings") or {}
    yield Finish(
        "length" if final.get("stop_type") == "limit" else "stop",
        int(final.get("tokens_evaluated") or timings.get("prompt_n") or 0),
        int(final.get("tokens_predicted") or timings.get("predicted_n") or 0),
        timings,
    )
