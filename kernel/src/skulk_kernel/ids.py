"""Typed identifiers: plain strings on the wire; the NewTypes make a signature say *which* id it
wants, so mypy catches a RunnerId passed where an InstanceId belongs."""

from __future__ import annotations

import uuid
from typing import NewType

NodeId = NewType("NodeId", str)
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
CommandId = NewType("CommandId", str)
TaskId = NewType("TaskId", str)
ModelId = NewType("ModelId", str)


def new_id() -> str:
    """A fresh random id. Only ever called outside apply(): ids travel inside events."""
    return str(uuid.uuid4())
