"""The contracts behind the hooks: typing.Protocols that plugins implement and register.

Hooks stay thin; behaviour lives here. Each Protocol is runtime-checkable so the loader can reject
a registration that is missing a method, and skulk-testing ships a conformance suite per contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .commands import Command
from .events import Event
from .ids import NodeId
from .instances import Instance, RankGroup, Sharding, ShardMetadata
from .models import ModelCard
from .outcomes import Outcome
from .state import State
from .tasks import Chunk, EmbeddingParams, MediaParams, RerankParams, SpeechParams, TextGenerationParams
from .topics import Topic

if TYPE_CHECKING:
    from .hooks import GuardedHooks
    from .node import NodeOptions
    from .profiles import Profile
    from .readings import ReadingStore
    from .services import Services
    from .streams import StreamRouter

# ============================== the node, as plugins see it ======================================


@runtime_checkable
class NodeSurface(Protocol):
    """Everything a plugin may use of the node it runs in; `skulk_kernel.node.Node` implements it.

    Hooks receive the node typed as this Protocol, never as `Node` or `Any`: what is not named
    here is private to the kernel and may change without notice. Treat every attribute as
    read-only: State changes only through commands and events.
    """

    # identity, configuration, replicated State and telemetry (plain attributes of the node)
    node_id: NodeId
    profile: Profile
    options: NodeOptions
    started_at: float
    state: State
    master_id: str | None
    readings: ReadingStore
    facts: dict[str, Any]
    health_notes: dict[str, dict[str, str]]  # plugin -> {code: message}; shown in /state nodeHealth
    streams: StreamRouter
    hooks: GuardedHooks
    services: Services  # per-node objects plugins publish under typed keys (skulk_kernel.services)

    def plugin_config(self, plugin: str) -> Any: ...
    def runtime_info(self) -> dict[str, Any]: ...
    @property
    def is_master(self) -> bool: ...
    async def wait_for(self, predicate: Callable[[State], bool], timeout: float) -> State: ...

    # the planes
    @property
    def transports(self) -> Mapping[str, Transport]: ...
    def subscribe(self, topic: Topic, handler: Callable[[str, bytes], Awaitable[None] | None]) -> None: ...
    async def publish(self, topic: Topic, payload: bytes) -> None: ...
    async def submit(self, command: Command, timeout: float = ...) -> Outcome:
        """Send a command to the master and await its outcome (indexed, refused, no master, unconfirmed)."""

    async def post(self, command: Command) -> None:
        """Send a command whose answer comes another way (a request's stream, a cancel)."""

    async def send_outcome(self, origin: str, outcome: Outcome) -> None: ...
    async def emit(self, event: Event) -> None: ...
    async def send_chunk(self, owner: str, chunk: Chunk) -> None: ...
    def reachable_nodes(self) -> set[str]: ...

    # registered capabilities
    @property
    def engines(self) -> Mapping[str, Engine]: ...
    @property
    def planners(self) -> Mapping[str, Planner]: ...
    @property
    def model_stores(self) -> Mapping[str, ModelStore]: ...
    def engine_owner(self, engine_name: str) -> str:
        """The plugin that registered `engine_name` (a runner loads only that plugin)."""

    # lifecycle
    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]: ...
    @property
    def stopping(self) -> bool: ...
    def fail(self, reason: str) -> None: ...


# ============================== transports =======================================================


@dataclass(frozen=True)
class PeerEvent:
    """Membership change seen by a transport."""

    node_id: str
    joined: bool


@runtime_checkable
class Transport(Protocol):
    """Carries one or more planes between nodes.

    Messages are bytes; the runtime does the encoding. Ordering is per publisher per topic.
    `subscribe` callbacks may run on any thread: the runtime bridges them into asyncio.
    """

    name: str

    async def start(self, node_id: str, options: dict[str, Any]) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, topic: Topic, payload: bytes) -> None: ...

    def subscribe(self, topic: Topic, callback: Callable[[str, bytes], None]) -> None:
        """callback(sender_node_id, payload) for every message on `topic`, own ones included."""

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        """Node-addressed delivery (data plane); same-node delivery short-circuits."""

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None: ...

    def serve(self, topic: Topic, handler: Callable[[str, bytes], bytes]) -> None:
        """Answer requests on `topic` addressed to this node: handler(sender, payload) -> reply.

        The handler runs on a transport thread and must not block for long.
        """

    async def request(self, node_id: str, topic: Topic, payload: bytes, timeout: float) -> bytes:
        """Ask `node_id` (which serves `topic`) and await its reply; raises TimeoutError."""


# ============================== election =========================================================


@runtime_checkable
class Election(Protocol):
    """Decides which node is master. Reports changes through `on_change(master_id | None)`."""

    name: str

    async def start(self, node: NodeSurface, on_change: Callable[[str | None], Awaitable[None]]) -> None: ...

    async def stop(self) -> None: ...


# ============================== placement ========================================================


@dataclass(frozen=True)
class PlacementRequest:
    model: ModelCard
    sharding: str = "Pipeline"
    min_nodes: int = 1
    excluded_nodes: tuple[str, ...] = ()
    context_tokens: int | None = None  # None: the planner chooses
    kv_cache_type: str = "f16"


@dataclass(frozen=True)
class NodeCapacity:
    """What a planner may know about one node: live telemetry, never State."""

    node_id: str
    ram_available: int
    ram_total: int
    backends: tuple[str, ...]
    models_present: frozenset[str] = frozenset()
    splits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # backend -> Engine.splits
    addresses: tuple[str, ...] = ()  # IPv4 addresses a rank on this node can listen on
    vram_available: int | None = None  # GPU memory free over this node's GPUs; None without a GPU
    os: str = ""  # NodeSystem.os ("Darwin": Metal's unified memory)
    builds: Mapping[str, str] = field(default_factory=dict)  # engine -> build; the ranks of one group share it


class PlacementError(Exception):
    """A typed refusal. `retryable` means the cluster is still learning about itself (503)."""

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable


@runtime_checkable
class Planner(Protocol):
    name: str

    def place(
        self, request: PlacementRequest, state: State, nodes: dict[str, NodeCapacity], instance_id: str
    ) -> Instance:
        """Return an Instance for `request`, or raise PlacementError. Pure: used for dry runs."""


# ============================== engines ==========================================================


@dataclass(frozen=True)
class EngineProbe:
    available: bool
    version: str = ""
    reason: str = ""


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner subprocess needs to load one shard; picklable by design."""

    instance_id: str
    runner_id: str
    shard: ShardMetadata
    card: ModelCard
    model_path: Path | None
    options: dict[str, Any] = field(default_factory=dict)
    group: RankGroup | None = None  # how this rank reaches the others (None: a single rank)
    context_limit: int | None = None  # the instance's context (tokens): the engine's KV size
    kv_cache_type: str = "f16"


@runtime_checkable
class EngineSession(Protocol):
    """A loaded shard inside a runner subprocess: what every session does, whatever it serves.

    What it serves is one Protocol per task kind below (`SESSION_PROTOCOLS`); a session implements
    the ones for the kinds in its engine's `Engine.tasks`, and only those: the runner answers a task
    of any other kind with an ErrorChunk ("engine X does not serve <kind>"), so a session never
    carries methods that only refuse. Methods are synchronous and may block.
    """

    def close(self) -> None: ...


@runtime_checkable
class TextGenerationSession(Protocol):
    """Kind `TextGeneration`: chat/completion text."""

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        """Yield chunks; the last has a finish_reason. Stop soon after `cancelled()` is true."""

    def count_tokens(self, params: TextGenerationParams) -> int:
        """The prompt's tokens for the runner's context check (an upper bound where it settles it)."""


@runtime_checkable
class EmbeddingSession(Protocol):
    """Kind `TextEmbedding`: one terminal EmbeddingChunk, a vector per input."""

    def embed(self, command_id: str, params: EmbeddingParams) -> Chunk: ...


@runtime_checkable
class RerankSession(Protocol):
    """Kind `TextRerank`: one terminal ScoreChunk, a relevance score per document."""

    def rerank(self, command_id: str, params: RerankParams) -> Chunk: ...


@runtime_checkable
class SpeechSynthesisSession(Protocol):
    """Kind `SpeechSynthesis`: AudioChunks of the spoken `params.input`, then a terminal chunk."""

    def synthesize(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]: ...


@runtime_checkable
class TranscriptionSession(Protocol):
    """Kind `Transcription`: TranscriptChunks of the uploaded audio, then a terminal chunk."""

    def transcribe(self, command_id: str, params: SpeechParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]: ...


@runtime_checkable
class ImageGenerationSession(Protocol):
    """Kind `ImageGeneration`: ProgressChunks, then the images as MediaChunk pieces."""

    def generate_image(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        """Stop soon after `cancelled()` is true; the last MediaChunk piece is terminal."""


@runtime_checkable
class VideoGenerationSession(Protocol):
    """Kind `VideoGeneration`: ProgressChunks, then the video as MediaChunk pieces."""

    def generate_video(self, command_id: str, params: MediaParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        """Stop soon after `cancelled()` is true; the last MediaChunk piece is terminal."""


SESSION_PROTOCOLS: Mapping[str, type] = {
    "TextGeneration": TextGenerationSession,
    "TextEmbedding": EmbeddingSession,
    "SpeechSynthesis": SpeechSynthesisSession,
    "Transcription": TranscriptionSession,
    "ImageGeneration": ImageGenerationSession,
    "VideoGeneration": VideoGenerationSession,
    "TextRerank": RerankSession,
}
"""Task kind (`Engine.tasks`, `ModelCard.tasks`, `task_kind(task)`) -> the session Protocol that serves it."""


@runtime_checkable
class VisionInput(Protocol):
    """A capability of a TextGenerationSession: its model takes images as well as text.

    Images arrive as `ChatMessage.images` references (digest and size); the session reads their bytes
    from the data plane (api-control's `vision_wire.receive_images`) and sets `takes_images` True once
    its vision tower is loaded. The runner refuses an image-bearing request (400) to a session that
    does not (`takes_images(session)`); one without the attribute is text-only. A failing image
    preprocessor fails the request: it never answers from the text alone.
    """

    takes_images: bool


def takes_images(session: object) -> bool:
    """Whether a loaded session reads images (implements VisionInput and says so)."""
    return isinstance(session, VisionInput) and bool(session.takes_images)


@runtime_checkable
class CompletionInput(Protocol):
    """A TextGenerationSession's capability: it serves text completions (`params.completion`)."""

    serves_completions: bool


def serves_completions(session: object) -> bool:
    return isinstance(session, CompletionInput) and bool(session.serves_completions)


@runtime_checkable
class EosControl(Protocol):
    """A capability of a TextGenerationSession: it can decode past the model's end-of-text token.

    `SamplingParams.ignore_eos` (vLLM's and llama.cpp's extension, which benchmarks such as guidellm
    send to get exactly max_tokens tokens) needs the engine to mask EOS while sampling; one that
    cannot leaves the attribute out (or False) and the runner answers such a request with a 400
    rather than return fewer tokens than asked.
    """

    ignores_eos: bool


def ignores_eos(session: object) -> bool:
    """Whether a loaded session honours `ignore_eos` (implements EosControl and says so)."""
    return isinstance(session, EosControl) and bool(session.ignores_eos)


@runtime_checkable
class Engine(Protocol):
    """An inference engine. Registered in every process; `load` runs only inside a runner."""

    name: str
    tasks: frozenset[str]
    dispatch_width: int  # how many tasks one runner admits at once
    splits: frozenset[Sharding]  # multi-rank placements it can run; empty: whole models only

    def probe(self) -> EngineProbe: ...

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        """`<engine>-<compute>` tags this node can advertise, from observed facts."""

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> EngineSession: ...


# ============================== model stores =====================================================


@runtime_checkable
class EngineInstaller(Protocol):
    """An engine with its own environment (a venv, a checkout): `skulk-kernel engines install NAME`."""

    name: str
    help: str

    def install(self, argv: list[str]) -> int:
        """Create or repair the environment; `argv` are the options after NAME (the installer's own)."""
        ...

    def status(self) -> str:
        """One line: installed (with versions and where) or not."""
        ...


@runtime_checkable
class ModelStore(Protocol):
    """Finds model files and cards on this node."""

    name: str

    def catalog(self) -> dict[str, ModelCard]: ...

    def local_path(self, model_id: str) -> Path | None: ...


# ============================== API ==============================================================


@runtime_checkable
class ApiAdapter(Protocol):
    """A wire format (OpenAI, Anthropic, Ollama): request -> params, chunks -> response bytes."""

    name: str

    def to_params(self, body: dict[str, Any]) -> TextGenerationParams: ...

    def stream(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[bytes]: ...


@runtime_checkable
class InferenceMiddleware(Protocol):
    def transform(self, command: Command) -> Command: ...

    def observe(self, command: Command, chunk: Chunk) -> None: ...
