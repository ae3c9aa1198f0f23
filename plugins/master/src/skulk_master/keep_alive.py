"""Instances placed on demand, and their removal after `keep_alive` of idleness.

Why here: idleness must be judged once for the whole cluster, however many API nodes serve the
model. Every request becomes a task the master indexes, so the indexed task events (stamped with
the master's time) say when each instance was last used; every node applies the same events, so
every node's `IdleClock` agrees, and a new master after a failover knows what the old one knew.
Only the master deletes (`expired`, run from its reconciliation pass).

Which instances expire is recorded in State: an API node that placed a model because a request
asked for it writes a mark `keep_alive/<instance id>` into the master's plugin data
(`SetPluginData`), with the request's own keep_alive (Ollama's per-request `keep_alive`) or None
for the master's default (`[plugins.master] keep_alive_s`). A request that carries another value
updates the mark. Instances without a mark (default models, explicit placements, cluster
services) are never expired.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from skulk_kernel.api import (
    TERMINAL_TASK_STATUSES,
    IndexedEvent,
    InstanceCreated,
    InstanceId,
    PluginDataSet,
    State,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    instance_ready,
)

PLUGIN = "master"
PREFIX = "keep_alive/"
LOAD_GRACE_S = 10.0  # a freshly ready instance waits this long for the request that placed it


class KeepAliveMark(BaseModel):
    """An on-demand instance's keep_alive: None is the master's default; a negative one never expires."""

    seconds: float | None = None


def mark_key(instance_id: str) -> str:
    return PREFIX + instance_id


def marks(state: State) -> dict[str, KeepAliveMark]:
    """The on-demand instances' marks, by instance id (a malformed mark reads as the default)."""
    found: dict[str, KeepAliveMark] = {}
    for key, value in state.plugin_data.get(PLUGIN, {}).items():
        if key.startswith(PREFIX):
            seconds = value.get("seconds") if isinstance(value, dict) else None
            found[key[len(PREFIX) :]] = KeepAliveMark(seconds=seconds if isinstance(seconds, int | float) else None)
    return found


_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's `keep_alive` in seconds: a number of seconds or a duration ("2s", "5m", "1h"); a
    negative one keeps the model loaded, 0 unloads it after the request. ValueError says what to fix."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f'keep_alive: a duration ("2s", "5m", "1h") or seconds (0 unloads, -1 keeps), not {value!r}')
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f'keep_alive: a duration ("2s", "5m", "1h") or seconds (0 unloads, -1 keeps), not {value!r}')
    return float(match.group(1)) * _UNIT_S[match.group(2)]


class IdleClock:
    """When each instance was last used, from the task events every node applies (master time)."""

    def __init__(self) -> None:
        self.last_used: dict[str, datetime] = {}
        self.served: set[str] = set()  # instances that have had a task
        self.ready_seen: dict[str, datetime] = {}  # the master's first sight of each instance ready

    def note(self, event: IndexedEvent, before: State) -> None:
        inner = event.event
        if isinstance(inner, InstanceCreated):
            self.last_used[inner.instance.instance_id] = event.at
            return
        if isinstance(inner, TaskCreated):
            instance_id: str | None = inner.task.instance_id
        elif isinstance(inner, TaskDeleted | TaskStatusUpdated):
            task = before.tasks.get(inner.task_id)
            instance_id = task.instance_id if task is not None else None
        else:
            return
        if instance_id is not None:
            self.last_used[instance_id] = event.at
            self.served.add(instance_id)

    def busy(self, state: State, instance_id: str) -> bool:
        tasks = state.tasks.values()
        return any(t.instance_id == instance_id and t.status not in TERMINAL_TASK_STATUSES for t in tasks)

    def expires_at(self, state: State, instance_id: str, default_s: float, now: datetime) -> datetime | None:
        """When an idle on-demand instance will be removed (None: never, or not on demand)."""
        mark = marks(state).get(instance_id)
        if mark is None:
            return None
        seconds = default_s if mark.seconds is None else mark.seconds
        if seconds < 0:
            return None
        since = now if self.busy(state, instance_id) else self.last_used.get(instance_id, now)
        return since + timedelta(seconds=seconds)

    def expired(self, state: State, default_s: float, now: datetime, kept: frozenset[str] = frozenset()) -> list[str]:
        """The on-demand instances to remove now (the master's pass): ready, idle past keep_alive.

        `kept`: the master's default models; a request may have placed one first (before the
        master's own pass), and a default model stays until deleted whoever placed it."""
        gone: list[str] = []
        for instance_id in marks(state):
            inst = state.instances.get(InstanceId(instance_id))
            if inst is None or not instance_ready(inst, state.runners) or self.busy(state, instance_id):
                continue
            if inst.shard_assignments.model_id in kept:
                continue
            seen = self.ready_seen.setdefault(instance_id, now)
            if instance_id not in self.served and (now - seen).total_seconds() < LOAD_GRACE_S:
                continue  # the request that placed it has not reached it yet
            at = self.expires_at(state, instance_id, default_s, now)
            if at is not None and now >= at:
                gone.append(instance_id)
        return gone

    def orphans(self, state: State) -> list[PluginDataSet]:
        """Marks of instances that no longer exist (deleted or failed some other way): removed."""
        return [
            PluginDataSet(plugin=PLUGIN, key=mark_key(i), value=None)
            for i in marks(state)
            if InstanceId(i) not in state.instances
        ]

    def forget(self, instance_id: str) -> None:
        self.last_used.pop(instance_id, None)
        self.ready_seen.pop(instance_id, None)
        self.served.discard(instance_id)
