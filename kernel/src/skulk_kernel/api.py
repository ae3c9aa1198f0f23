"""The kernel's public API: every name a plugin may import, and nothing else.

Plugins import from here (``from skulk_kernel.api import NodeSurface, TokenChunk``) and from
``skulk_kernel`` itself (`hookimpl`); the kernel's modules are private to it and may be split,
merged or renamed between minor versions. Names are grouped in the order a plugin author meets
them; `docs/writing-plugins.md` walks through each group.

The closed unions (`Event`, `Command`, `Instance`, `ShardMetadata`, `Task`, `Chunk`, `Reading`,
`RunnerStatus`, `DownloadStatus`) are real Unions to a type checker and tagged pydantic unions at
run time, so ``isinstance`` narrowing and exhaustive ``match`` both work.
"""

from __future__ import annotations

# fmt: off
from . import codec
from .apply import OutOfOrderEvent, apply, replay
from .commands import (
    COMMAND_TYPES, AddCustomModelCard, CancelTask, Command, CommandBase, CreateInstance, DeleteCustomModelCard,
    DeleteInstance, FailInstance, FinishTask, ForwardedCommand, PlaceInstance, RefuseInstancePlacement,
    Request, SetPluginData, SetTracingEnabled, SpeechSynthesis, TextEmbedding, TextGeneration, Transcription,
    ImageGeneration, VideoGeneration, TextRerank,
)
from .contracts import (
    SESSION_PROTOCOLS, ApiAdapter, Election, EmbeddingSession, Engine, EngineInstaller, EngineProbe, EngineSession,
    ImageGenerationSession, InferenceMiddleware, ModelStore, NodeCapacity, NodeSurface, PeerEvent, PlacementError,
    PlacementRequest, Planner, RunnerSpec, SpeechSynthesisSession, TextGenerationSession, TranscriptionSession,
    Transport, VideoGenerationSession, VisionInput, takes_images, CompletionInput, serves_completions,
    EosControl, ignores_eos, RerankSession,
)
from .decide import (
    Decision, DecisionView, Effect, ForgetNode, Park, Refusal, Reply, Retry, Unpark, decide, derived_id, dispatch,
    pick_instance, place, replace_lost, replacement, state_after, teardown,
)
from .events import (
    EVENT_TYPES, Connection, CustomModelCardAdded, CustomModelCardDeleted, DownloadCompleted, DownloadFailed,
    DownloadPending, Event, IndexedEvent, InstanceCreated, InstanceDeleted, InstanceFailureRecorded, LocalEvent,
    NodeJoined, NodeTimedOut, PluginDataSet, RunnerStatusUpdated, TaskAcknowledged, TaskCreated, TaskDeleted,
    TaskFailed, TaskStatusUpdated, TopologyEdgeCreated, TopologyEdgeDeleted, TracingStateChanged,
)
from .hooks import GuardedHooks, NodeError, Registry, collect
from .hookspecs import hookimpl, hookspec
from .ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId, new_id
from .instances import (
    GROUP_FORMATION_DEADLINE_S, SERVING_STATUSES, Instance, PipelineShardMetadata, RankGroup, RingInstance,
    RunnerConnected, RunnerConnecting, RunnerFailed, RunnerIdle, RunnerLoaded, RunnerLoading, RunnerReady,
    RunnerRunning, RunnerShutdown, RunnerShuttingDown, RunnerStatus, RunnerWarmingUp, ShardAssignments, ShardBase,
    ShardMetadata, Sharding, TensorShardMetadata, instance_ready, KvCacheType,
)
from .models import ModelCard, ModelTask
from .outcomes import HOLD_S, Outcome, OutcomeStatus
from .catalog import catalog, resolve_card
from .plugins import (
    PluginLoadError, build_plugin_manager, installed_plugins, kernel_version, new_plugin_manager, register_plugin,
)
from .profiles import Planes, Profile, ProfileError, load_profile, parse_profile
from .readings import ReadingStore, Received
from .services import ServiceKey, Services
from .state import (
    DownloadCompletedStatus, DownloadFailedStatus, DownloadPendingStatus, DownloadStatus, InstanceFailure, State,
    StateSnapshot, Topology,
)
from .streams import ChunkStream, StreamRouter
from .tasks import (
    TERMINAL_TASK_STATUSES, AudioChunk, ChatMessage, Chunk, ChunkBase, EmbeddingChunk, EmbeddingParams, ErrorChunk,
    FinishReason, GenerationStats, PrefillProgressChunk, SamplingParams, SpeechParams, SpeechSynthesisTask, Task,
    TaskBase, TaskStatus, TextEmbeddingTask, TextGenerationParams, TextGenerationTask, TokenChunk, TokenLogprob,
    ToolCall, ToolCallChunk, ToolSpec, TopLogprob, TranscriptChunk, TranscriptionTask, Usage, is_terminal,
    ImageGenerationTask, MediaChunk, MediaParams, ProgressChunk, VideoGenerationTask, task_kind, CompletionParams,
    PromptChunk, RerankParams, ScoreChunk, TextRerankTask,
)
from .telemetry import (
    DownloadProgress, Memory, NodeDisk, NodeHealthNotes, NodeHeartbeat, NodeIdentity, NodeMemory, NodeResources,
    NodeSystem, Reading, ReadingDigest,
)
from .topics import Plane, Topic
from .wire import Tagged, WireModel, tagged_union
# fmt: on

__all__ = [name for name in dir() if not name.startswith("_") and name != "annotations"]
