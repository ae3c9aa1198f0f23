"""Commands: imperative requests on the control plane, validated and sequenced by the master.

A command never changes State itself; the master turns an accepted command into events. Every
command carries its own id so an API caller can correlate the acknowledgement with what follows.
"""

from __future__ import annotations

from pydantic import Field

from .ids import CommandId, InstanceId, ModelId, NodeId
from .instances import Instance, InstanceMeta, Sharding
from .models import ModelCard
from .tasks import EmbeddingParams, TextGenerationParams
from .wire import Tagged, WireModel, tagged_union


class _Command(Tagged):
    command_id: CommandId


class PlaceInstance(_Command):
    model_id: ModelId
    sharding: Sharding = "Pipeline"
    instance_meta: InstanceMeta = "MlxRing"
    min_nodes: int = Field(default=1, ge=1)
    excluded_nodes: tuple[NodeId, ...] = ()


class CreateInstance(_Command):
    instance: Instance


class DeleteInstance(_Command):
    instance_id: InstanceId


class RefuseInstancePlacement(_Command):
    instance_id: InstanceId
    node_id: NodeId
    reason: str


class FailInstance(_Command):
    """End an instance with a recorded failure.

    `replace_excluding` names the node at fault when the failure is local to it (its model files
    could not be staged): the master then places the model again without that node.
    """

    instance_id: InstanceId
    reason: str
    replace_excluding: NodeId | None = None


class TextGeneration(_Command):
    owner_node_id: NodeId
    params: TextGenerationParams
    instance_id: InstanceId | None = None


class TextEmbedding(_Command):
    owner_node_id: NodeId
    params: EmbeddingParams
    instance_id: InstanceId | None = None


class TaskCancelled(_Command):
    """Cancel the task created for `task_command_id` (client gone or POST /v1/cancel)."""

    task_command_id: CommandId


class TaskFinished(_Command):
    """The owning API saw the terminal chunk: the task can leave State."""

    task_command_id: CommandId


class AddCustomModelCard(_Command):
    card: ModelCard


class DeleteCustomModelCard(_Command):
    model_id: ModelId


class SetTracingEnabled(_Command):
    enabled: bool


class RequestEventLog(_Command):
    since_idx: int = -1


Command = tagged_union(
    PlaceInstance,
    CreateInstance,
    DeleteInstance,
    RefuseInstancePlacement,
    FailInstance,
    TextGeneration,
    TextEmbedding,
    TaskCancelled,
    TaskFinished,
    AddCustomModelCard,
    DeleteCustomModelCard,
    SetTracingEnabled,
    RequestEventLog,
)


class ForwardedCommand(WireModel):
    """A command on the COMMANDS topic, stamped with the node that sent it."""

    origin: NodeId
    command: Command
