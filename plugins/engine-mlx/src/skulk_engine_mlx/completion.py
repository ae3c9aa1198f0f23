"""Text completions on MLX: the prompt as is, fill-in-the-middle, and the echoed prompt's logprobs.

Why these pieces are cheap here: the prompt is read exactly as sent (its text, or its token ids),
no template; fill-in-the-middle is the tokenizer's own FIM tokens around the prefix and suffix
(Qwen2.5-Coder has ``<|fim_prefix|>``, ``<|fim_suffix|>`` and ``<|fim_middle|>``; SmolLM2 has none:
a 400); and the prompt's own logprobs (``echo`` with ``logprobs``, what lm-eval's loglikelihood
reads) come from forward passes over the prompt, which give every position's distribution at once,
chunk by chunk so the logits of a long prompt never sit in memory together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from skulk_kernel.api import CompletionParams, TextGenerationParams, TokenLogprob, TopLogprob

from .prompt import encode_prompt

#: each prompt position's logprob of its token and its top alternatives (token id, logprob)
Scored: TypeAlias = list[tuple[float, list[tuple[int, float]]]]

#: the FIM tokens, in prompt order (prefix, suffix, then where the middle is generated)
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


class CompletionRefused(ValueError):
    """A completion this model or placement cannot serve as asked: the API answers 400 with the message."""


@dataclass(frozen=True, slots=True)
class CompletionPrompt:
    ids: list[int]  # what the model reads
    lead: int  # how many leading ids (a BOS the tokenizer added) the text does not spell
    text: str  # the prompt's text, as echoed


def fim_tokens(tokenizer: Any) -> tuple[str, str, str] | None:
    """The model's FIM tokens when its vocabulary has all three, else None."""
    vocab = tokenizer.get_vocab()
    return FIM_TOKENS if all(t in vocab for t in FIM_TOKENS) else None


def completion_prompt(tokenizer: Any, params: TextGenerationParams, model_id: str) -> CompletionPrompt:
    """The ids a completion reads: its ids as sent, its text encoded, or the FIM prompt around a suffix."""
    c = params.completion or CompletionParams()
    text = str(tokenizer.decode(list(c.prompt_ids))) if c.prompt_ids else (params.raw_prompt or "")
    if c.suffix is not None:
        fim = fim_tokens(tokenizer)
        if fim is None:
            raise CompletionRefused(
                f"model {model_id} has no fill-in-the-middle tokens ({', '.join(FIM_TOKENS)}); "
                "send the prompt without `suffix`, or use a model that has them (Qwen2.5-Coder)"
            )
        prompt = f"{fim[0]}{text}{fim[1]}{c.suffix}{fim[2]}"
        return CompletionPrompt(list(tokenizer.encode(prompt, add_special_tokens=False)), 0, text)
    if c.prompt_ids:
        return CompletionPrompt(list(c.prompt_ids), 0, text)
    ids = encode_prompt(tokenizer, text)
    bare = list(tokenizer.encode(text, add_special_tokens=False))
    return CompletionPrompt(ids, max(0, len(ids) - len(bare)), text)


def score_prompt(model: Any, cache: list[Any], ids: list[int], top: int, step: int) -> Scored:
    """Each prompt position's (logprob of its token, top alternatives), from one pass over the prompt.

    Runs on the compute thread. Position 0 has no context: (0.0, []). ``cache`` is a fresh KV cache
    the chunks extend, so chunk i attends to every token before it.
    """
    import mlx.core as mx

    out: Scored = [(0.0, [])]
    for start in range(0, len(ids) - 1, step):
        chunk = ids[start : start + step]
        logits = model(mx.array(chunk)[None], cache=cache)[0].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        targets = mx.array(ids[start + 1 : start + 1 + len(chunk)])
        rows = logprobs[: len(targets)]
        chosen = mx.take_along_axis(rows, targets[:, None], axis=-1)[:, 0]
        k = max(1, top)
        top_ids = mx.argpartition(-rows, k - 1, axis=-1)[:, :k]
        top_values = mx.take_along_axis(rows, top_ids, axis=-1)
        mx.eval(chosen, top_ids, top_values)
        lists: Any = (chosen.tolist(), top_ids.tolist(), top_values.tolist())
        for value, alt_ids, alt_values in zip(*lists, strict=True):
            alts = sorted(zip(alt_ids, alt_values, strict=True), key=lambda t: -t[1])[:top]
            out.append((float(value), [(int(i), float(v)) for i, v in alts]))
    mx.clear_cache()
    return out


def to_logprobs(
    tokenizer: Any, ids: list[int], scored: list[tuple[float, list[tuple[int, float]]]]
) -> tuple[TokenLogprob, ...]:
    def piece(token: int) -> tuple[str, tuple[int, ...]]:
        text = str(tokenizer.decode([token]))
        return text, tuple(text.encode("utf-8"))

    result: list[TokenLogprob] = []
    for token, (logprob, alts) in zip(ids, scored, strict=True):
        text, raw = piece(token)
        top = tuple(TopLogprob(token=p, logprob=v, bytes=b) for i, v in alts for p, b in [piece(i)])
        result.append(TokenLogprob(token=text, logprob=logprob, bytes=raw, top_logprobs=top))
    return tuple(result)
