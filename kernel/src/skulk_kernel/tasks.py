"""The one internal request every API adapter normalizes into, and the chunks that answer it.

Adapters (OpenAI, Anthropic, Ollama, ...) convert their wire format into these parameters; runners
only ever see these. Chunks are the stream a runner emits: they travel on the data plane, never
through State or the event log, so they are kept small and cheap to build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

from pydantic import Field

from .ids import CommandId, InstanceId, ModelId, NodeId, TaskId
from .wire import Tagged, WireModel, tagged_union

Role = Literal["system", "user", "assistant", "tool", "developer"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error", "cancelled"]
TaskStatus = Literal["Pending", "Running", "Complete", "Failed", "Cancelled"]
TERMINAL_TASK_STATUSES: frozenset[str] = frozenset({"Complete", "Failed", "Cancelled"})


class ToolCall(WireModel):
    id: str
    name: str
    arguments: str = Field(description="JSON-encoded arguments, exactly as OpenAI clients expect")


class ChatMessage(WireModel):
    role: Role
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple[str, ...] = ()  # "sha256:<hex>:<bytes>" each; the bytes ride the data plane (api-control vision)

    def template_dict(self, *, with_reasoning: bool = False) -> dict[str, Any]:
        """This message as chat templates and OpenAI-shaped servers take it (every engine needs it)."""
        msg: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content or "",
        }
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            msg["tool_call_id"] = self.tool_call_id
        if self.name and self.role == "tool":
            msg["name"] = self.name
        if with_reasoning and self.reasoning_content and self.role == "assistant":
            msg["reasoning_content"] = self.reasoning_content
        return msg


class ToolSpec(WireModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class SamplingParams(WireModel):
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = Field(
        default=False,
        description="generate max_tokens tokens whatever the model's end-of-text token says (benchmarks); a session "
        "that cannot (`ignores_eos`) is refused with a 400 by the runner, never silently ignored",
    )
    max_tokens_is_ceiling: bool = Field(
        default=False, description="lower max_tokens to what the context leaves instead of refusing (Anthropic, Ollama)"
    )


class CompletionParams(WireModel):
    """A text completion (`/v1/completions`): the prompt read as is (`raw_prompt` or `prompt_ids`), no template.
    Only a session that says so serves it (`contracts.serves_completions`); the runner refuses it elsewhere."""

    prompt_ids: tuple[int, ...] = ()  # the prompt as token ids (else raw_prompt is its text)
    suffix: str | None = None  # fill in the middle: the text after the gap (with the model's FIM tokens)
    echo: bool = False  # a PromptChunk (the prompt's text and ids) comes before any token
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # with echo: each prompt token's, k alternatives
    generate: bool = True  # False: max_tokens 0, only the prompt is read (tokenize)


class TextGenerationParams(WireModel):
    model_id: ModelId
    messages: tuple[ChatMessage, ...] = Field(min_length=1)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    sampling: SamplingParams = SamplingParams()
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    enable_thinking: bool | None = None
    raw_prompt: str | None = Field(
        default=None, description="pre-rendered prompt (Ollama raw/generate); skips the template"
    )
    token_ids: bool = Field(default=False, description="stream each TokenChunk's token ids (what a resume continues)")
    continue_from: tuple[int, ...] = Field(
        default=(),
        description="set by a resume: the ids of the output already streamed, which the trailing assistant message "
        "spells as text; an engine of the same tokenizer continues from them instead of re-tokenizing that text",
    )
    completion: CompletionParams | None = None  # a text completion, not a chat turn


class EmbeddingParams(WireModel):
    model_id: ModelId
    inputs: tuple[str, ...] = Field(min_length=1)


class RerankParams(WireModel):
    """A query scored against each document by a cross-encoder (`/v1/rerank`); ScoreChunk keeps document order."""

    model_id: ModelId
    query: str = Field(min_length=1)
    documents: tuple[str, ...] = Field(min_length=1)


class SpeechParams(WireModel):
    """A speech request: `input` text to speak, or an upload (sent on the data plane, never in State)."""

    model_id: ModelId
    input: str = ""
    voice: str | None = None
    audio_sha256: str | None = None
    audio_bytes: int = Field(default=0, ge=0)
    options: dict[str, Any] = Field(default_factory=dict, description="speed, language, format...: the engine's")


class MediaParams(WireModel):
    """An image or video request; an input image is an upload on the data plane, never in State."""

    model_id: ModelId
    prompt: str = Field(min_length=1)
    size: str | None = Field(default=None, description="WIDTHxHEIGHT; the engine's default when None")
    seconds: float | None = Field(default=None, gt=0, description="video length")
    n: int = Field(default=1, ge=1, le=10, description="images to make")
    seed: int | None = None
    input_sha256: str | None = None
    input_bytes: int = Field(default=0, ge=0)
    options: dict[str, Any] = Field(default_factory=dict, description="steps, fps, negative prompt...: the engine's")


class TaskBase(Tagged):
    """Fields every task kind shares; the union of kinds is `Task`."""

    task_id: TaskId
    command_id: CommandId
    instance_id: InstanceId
    owner_node_id: NodeId
    status: TaskStatus = "Pending"


class TextGenerationTask(TaskBase):
    params: TextGenerationParams


class TextEmbeddingTask(TaskBase):
    params: EmbeddingParams


class TextRerankTask(TaskBase):
    params: RerankParams


class SpeechSynthesisTask(TaskBase):
    params: SpeechParams


class TranscriptionTask(TaskBase):
    params: SpeechParams


class ImageGenerationTask(TaskBase):
    params: MediaParams


class VideoGenerationTask(TaskBase):
    params: MediaParams


# fmt: off
Task: TypeAlias = (
    TextGenerationTask | TextEmbeddingTask | SpeechSynthesisTask | TranscriptionTask | ImageGenerationTask
    | VideoGenerationTask | TextRerankTask
)
# fmt: on
tasks_by_name: dict[str, Any] = {t.__name__: t for t in get_args(Task)}
if not TYPE_CHECKING:
    Task = tagged_union(Task)


def task_kind(task: TaskBase) -> str:
    """A task's kind, as `Engine.tasks` and `ModelCard.tasks` name it: `TextGenerationTask` -> `TextGeneration`."""
    return type(task).__name__.removesuffix("Task")


# --- chunks --------------------------------------------------------------------------------------


class TopLogprob(WireModel):
    token: str
    logprob: float
    bytes: tuple[int, ...] = ()


class TokenLogprob(WireModel):
    token: str
    logprob: float
    bytes: tuple[int, ...] = ()
    top_logprobs: tuple[TopLogprob, ...] = ()


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class GenerationStats(WireModel):
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    ttft_ms: float = 0.0
    backend: str = ""
    draft_tokens: int = 0  # speculative decoding: tokens the draft model proposed
    draft_accepted: int = 0  # ... and how many of them the model kept


class ChunkBase(Tagged):
    """Fields every chunk kind shares; the union of kinds is `Chunk`."""

    command_id: CommandId
    seq: int = Field(ge=0, description="per-command order; gaps mean loss")
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    stats: GenerationStats | None = None


class TokenChunk(ChunkBase):
    text: str
    reasoning: bool = False
    logprobs: tuple[TokenLogprob, ...] = ()
    token_ids: tuple[int, ...] = ()  # with params.token_ids: the ids this text came from


class PromptChunk(ChunkBase):
    """A completion's echoed prompt, before any token; the first prompt token's logprob is 0.0 (no context)."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


class ToolCallChunk(ChunkBase):
    calls: tuple[ToolCall, ...]


class EmbeddingChunk(ChunkBase):
    embeddings: tuple[tuple[float, ...], ...]


class ScoreChunk(ChunkBase):
    scores: tuple[float, ...]  # a relevance score per document, in the request's order


class PrefillProgressChunk(ChunkBase):
    processed: int
    total: int


class AudioChunk(ChunkBase):
    data: str = Field(description="base64 audio bytes (speech out, or a piece of an upload)")
    format: str = "pcm"
    sample_rate: int = 0


class TranscriptChunk(ChunkBase):
    text: str
    start: float = 0.0
    end: float = 0.0
    words: tuple[tuple[str, float, float], ...] = ()
    language: str = ""


class ProgressChunk(ChunkBase):
    """How far a long job (an image's or a video's denoising steps) has come; not terminal."""

    done: int = Field(ge=0)
    total: int = Field(ge=0)
    stage: str = ""


class MediaChunk(ChunkBase):
    """A piece of a made file (an image or an MP4); `sha256` of the whole file rides on its last piece."""

    data: str = Field(description="base64 bytes of this piece")
    mime: str
    index: int = Field(default=0, ge=0, description="which of the n files")
    sha256: str = ""


class ErrorChunk(ChunkBase):
    message: str
    error_type: str = "server_error"
    code: str | None = None


# fmt: off
Chunk: TypeAlias = (
    TokenChunk | ToolCallChunk | EmbeddingChunk | PrefillProgressChunk | AudioChunk | TranscriptChunk
    | ProgressChunk | MediaChunk | ErrorChunk | PromptChunk | ScoreChunk
)
# fmt: on
if not TYPE_CHECKING:
    Chunk = tagged_union(Chunk)


def is_terminal(chunk: ChunkBase) -> bool:
    """A stream ends on its first chunk with a finish reason or an error."""
    return chunk.finish_reason is not None or isinstance(chunk, ErrorChunk)
