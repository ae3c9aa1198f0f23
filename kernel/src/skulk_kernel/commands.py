"""Commands: imperative requests on the control plane, validated and sequenced by the master.

A command never changes State itself; the master turns an accepted command into events. Every
command carries its own id so an API caller can correlate the acknowledgement with what follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias, get_args

from pydantic import Field

from .ids import CommandId, InstanceId, ModelId, NodeId
from .instances import Instance, KvCacheType, Sharding
from .models import ModelCard
from .tasks import EmbeddingParams, MediaParams, RerankParams, SpeechParams, TextGenerationParams
from .wire import Tagged, WireModel, tagged_union


class CommandBase(Tagged):
    """Fields every command shares; the union of commands is `Command`."""

    command_id: CommandId


class PlaceInstance(CommandBase):
    model_id: ModelId
    sharding: Sharding = "Pipeline"
    min_nodes: int = Field(default=1, ge=1)
    excluded_nodes: tuple[NodeId, ...] = ()
    system_role: str | None = None  # stamped on the instance (see RingInstance.system_role)
    context_tokens: int | None = Field(default=None, ge=1)  # None: the planner's default
    kv_cache_type: KvCacheType = "f16"
    if_absent: bool = False  # place only when no instance of the model exists (a request's on-demand load)


class CreateInstance(CommandBase):
    instance: Instance


class DeleteInstance(CommandBase):
    instance_id: InstanceId


class RefuseInstancePlacement(CommandBase):
    instance_id: InstanceId
    node_id: NodeId
    reason: str


class FailInstance(CommandBase):
    """End an instance with a recorded failure.

    `replace_excluding` names the node at fault when the failure is local to it (its model files
    could not be staged): the master then places the model again without that node. `replace`
    asks for a new placement without naming a culprit (a rank lost its group: a peer died).
    """

    instance_id: InstanceId
    reason: str
    replace_excluding: NodeId | None = None
    replace: bool = False


class TextGeneration(CommandBase):
    owner_node_id: NodeId
    params: TextGenerationParams
    instance_id: InstanceId | None = None


class TextEmbedding(CommandBase):
    owner_node_id: NodeId
    params: EmbeddingParams
    instance_id: InstanceId | None = None


class TextRerank(CommandBase):
    owner_node_id: NodeId
    params: RerankParams
    instance_id: InstanceId | None = None


class SpeechSynthesis(CommandBase):
    owner_node_id: NodeId
    params: SpeechParams
    instance_id: InstanceId | None = None


class Transcription(CommandBase):
    owner_node_id: NodeId
    params: SpeechParams
    instance_id: InstanceId | None = None


class ImageGeneration(CommandBase):
    owner_node_id: NodeId
    params: MediaParams
    instance_id: InstanceId | None = None


class VideoGeneration(CommandBase):
    owner_node_id: NodeId
    params: MediaParams
    instance_id: InstanceId | None = None


class CancelTask(CommandBase):
    """Cancel the task created for `task_command_id` (client gone or POST /v1/cancel)."""

    task_command_id: CommandId


class FinishTask(CommandBase):
    """The owning API saw the terminal chunk: the task can leave State."""

    task_command_id: CommandId


class AddCustomModelCard(CommandBase):
    card: ModelCard


class DeleteCustomModelCard(CommandBase):
    model_id: ModelId


class SetTracingEnabled(CommandBase):
    enabled: bool


class SetPluginData(CommandBase):
    """Set (or, with None, delete) keys of a plugin's replicated data: settings, API keys.

    A command rather than a LOCAL_EVENTS report so its sender learns the outcome (`node.submit`).
    """

    plugin: str
    entries: tuple[tuple[str, Any], ...]


# fmt: off
Command: TypeAlias = (
    PlaceInstance | CreateInstance | DeleteInstance | RefuseInstancePlacement | FailInstance | TextGeneration
    | TextEmbedding | CancelTask | FinishTask | AddCustomModelCard | DeleteCustomModelCard | SetTracingEnabled
    | SpeechSynthesis | Transcription | ImageGeneration | VideoGeneration | SetPluginData | TextRerank
)
Request: TypeAlias = (  # what an API node sends
    TextGeneration | TextEmbedding | SpeechSynthesis | Transcription | ImageGeneration | VideoGeneration | TextRerank
)
# fmt: on
COMMAND_TYPES: tuple[type[CommandBase], ...] = get_args(Command)
if not TYPE_CHECKING:
    Command = tagged_union(Command)


class ForwardedCommand(WireModel):
    """A command on the COMMANDS topic, stamped with the node that sent it."""

    origin: NodeId
    command: Command
