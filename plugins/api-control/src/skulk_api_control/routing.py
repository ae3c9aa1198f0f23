"""Which instance serves a request: the least-loaded ready one, kept on its conversation's instance.

Every API node routes its own requests and pins the chosen instance on the command; the master
honours the pin while that instance is ready and reachable (`decide.pick_instance`), so routing
never waits for a master round trip and a resume can name the instance it continues on.

Load is the number of open tasks on an instance: every queued and every running request of every
API node is a task in the replicated State, so it is the cluster-wide queue depth plus active
streams. A request this node has just sent is counted too until its task shows up in State, or a
burst of concurrent requests would all see the same idle instance.

Prefix affinity keeps a conversation where its prompt is cached: the next turn of a chat repeats
the earlier messages, and the engine that served them (llama.cpp's slot and RAM prompt caches)
skips their prefill. A request goes to the instance that last served its longest known message
prefix unless that instance is busier than the least-loaded one by more than `affinity_slack`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from skulk_kernel.api import TERMINAL_TASK_STATUSES, ChatMessage, NodeSurface, ServiceKey, instance_ready

MAX_PREFIXES = 4096


def prefix_keys(messages: Sequence[ChatMessage]) -> list[str]:
    """One key per message prefix that holds a non-system message, shortest first.

    A prefix of only system messages is shared by every conversation of an application: keying
    on it would send all of them to one instance.
    """
    keys: list[str] = []
    digest = hashlib.sha256()
    conversational = False
    for message in messages:
        digest.update(f"{message.role}\x00{message.content or ''}\x00{len(message.tool_calls)}\x01".encode())
        conversational = conversational or message.role not in ("system", "developer")
        if conversational:
            keys.append(digest.copy().hexdigest()[:32])
    return keys


class InstanceRouter:
    """Per API node: in-flight requests by instance and an LRU of message prefixes by instance."""

    def __init__(self, *, affinity: bool = True, affinity_slack: int = 1, max_prefixes: int = MAX_PREFIXES) -> None:
        self.affinity = affinity
        self.affinity_slack = affinity_slack
        self.max_prefixes = max_prefixes
        self._in_flight: dict[str, str] = {}  # command id -> instance id (sent by this node, not closed)
        self._prefixes: OrderedDict[str, str] = OrderedDict()  # prefix key -> instance id
        self.routed = 0
        self.prefix_known = 0  # routed requests whose message prefix an instance served before
        self.affinity_hits = 0  # ... and that went to that instance (its prompt cache)

    def load(self, node: NodeSurface, instance_ids: Iterable[str]) -> dict[str, int]:
        """Open tasks per instance: State's (every API node's) plus this node's not yet indexed."""
        wanted = set(instance_ids)
        counted: dict[str, set[str]] = {i: set() for i in wanted}
        for task in node.state.tasks.values():
            if task.instance_id in wanted and task.status not in TERMINAL_TASK_STATUSES:
                counted[task.instance_id].add(task.command_id)
        for command_id, instance_id in self._in_flight.items():
            if instance_id in wanted:
                counted[instance_id].add(command_id)
        return {i: len(c) for i, c in counted.items()}

    def candidates(self, node: NodeSurface, model_id: str, exclude: Iterable[str] = ()) -> list[str]:
        """Ready instances of `model_id` whose every node this node still sees, minus `exclude`."""
        skip = set(exclude)
        reachable = node.reachable_nodes()
        return sorted(
            inst.instance_id
            for inst in node.state.instances.values()
            if inst.shard_assignments.model_id == model_id
            and inst.instance_id not in skip
            and inst.system_role is None  # a cluster service's instance (the steward) is not for users
            and instance_ready(inst, node.state.runners)
            and set(inst.shard_assignments.node_to_runner) <= reachable
        )

    def choose(
        self, node: NodeSurface, model_id: str, messages: Sequence[ChatMessage] = (), exclude: Iterable[str] = ()
    ) -> str | None:
        """The instance for a request, or None when this node knows no ready one (the master decides)."""
        ready = self.candidates(node, model_id, exclude)
        if not ready:
            return None
        load = self.load(node, ready)
        least = min(ready, key=lambda i: (load[i], i))
        self.routed += 1
        owner = next(
            (o for k in reversed(prefix_keys(messages)) if (o := self._prefixes.get(k)) is not None and o in load), None
        )
        chosen = least
        if self.affinity and owner is not None and load[owner] <= load[least] + self.affinity_slack:
            chosen = owner  # else its instance is too busy: balance instead
        if owner is not None:  # a request whose prefix one instance has cached
            self.prefix_known += 1
            self.affinity_hits += chosen == owner
        return chosen

    def started(self, command_id: str, instance_id: str | None, messages: Sequence[ChatMessage] = ()) -> None:
        if instance_id is None:
            return
        self._in_flight[command_id] = instance_id
        for key in prefix_keys(messages):
            self._prefixes[key] = instance_id
            self._prefixes.move_to_end(key)
        while len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)

    def finished(self, command_id: str) -> None:
        self._in_flight.pop(command_id, None)

    def describe(self) -> dict[str, object]:
        return {
            "prefixAffinity": self.affinity,
            "affinitySlack": self.affinity_slack,
            "routed": self.routed,
            "prefixKnown": self.prefix_known,
            "affinityHits": self.affinity_hits,
            "inFlight": len(self._in_flight),
            "knownPrefixes": len(self._prefixes),
        }


ROUTER: ServiceKey[InstanceRouter] = ServiceKey("api-control.router")


def router_for(node: NodeSurface) -> InstanceRouter:
    """This node's router, made on first use from `[plugins.api-control]`."""
    router = node.services.get(ROUTER)
    if router is None:
        config = node.plugin_config("api-control")
        router = InstanceRouter(
            affinity=getattr(config, "prefix_affinity", True), affinity_slack=getattr(config, "affinity_slack", 1)
        )
        node.services.publish(ROUTER, router)
    return router
