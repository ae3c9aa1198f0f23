"""The exactly-one invariant: the master keeps one steward instance while a node can hold one.

Pure: State, the reachable nodes and a placement dry-run in, commands out. The steward's node
dying is noticed as soon as the transport sees it leave (not only at the prune): the lost steward is
deleted and the best card that fits is placed on a survivor, so the steward is back within the
model's load time. Two stewards (possible across a failover window) are reduced to one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from skulk_kernel.api import (
    Command,
    CommandId,
    DeleteInstance,
    Instance,
    ModelCard,
    ModelId,
    NodeId,
    PlaceInstance,
    State,
    derived_id,
    instance_ready,
)

from .config import ROLE


@dataclass(frozen=True)
class KeeperPlan:
    commands: tuple[Command, ...]
    why_none: str = ""  # when no steward can be placed: the reason per card


def stewards(state: State) -> list[Instance]:
    return sorted(
        (i for i in state.instances.values() if i.system_role == ROLE),
        key=lambda i: (not instance_ready(i, state.runners), i.instance_id),
    )


def plan(
    state: State,
    reachable: set[str],
    preference: Iterable[str],
    cards: dict[str, ModelCard],
    refusal: Callable[[PlaceInstance], str | None],
    seed: str,
) -> KeeperPlan:
    """What keeps exactly one live steward. `refusal(command)` dry-runs a placement (None: it fits)."""
    found = stewards(state)
    live = [i for i in found if set(i.shard_assignments.node_to_runner) <= reachable]
    lost = [i for i in found if i not in live]
    commands: list[Command] = [
        DeleteInstance(command_id=CommandId(derived_id(i.instance_id, "steward-lost")), instance_id=i.instance_id)
        for i in lost
    ]
    commands += [
        DeleteInstance(command_id=CommandId(derived_id(i.instance_id, "steward-extra")), instance_id=i.instance_id)
        for i in live[1:]
    ]
    if live:
        return KeeperPlan(tuple(commands))
    gone = tuple(sorted({NodeId(n) for i in lost for n in i.shard_assignments.node_to_runner}))
    reasons = []
    for model_id in preference:
        card = cards.get(model_id)
        if card is None:
            reasons.append(f"{model_id}: not in the catalog")
            continue
        if "TextGeneration" not in card.tasks:
            reasons.append(f"{model_id}: not a text-generation model")
            continue
        command = PlaceInstance(
            command_id=CommandId(derived_id(seed, f"steward/{model_id}")),
            model_id=ModelId(model_id),
            excluded_nodes=gone,
            system_role=ROLE,
        )
        why = refusal(command)
        if why is None:
            return KeeperPlan((*commands, command))
        reasons.append(f"{model_id}: {why}")
    why_none = "no node can hold a steward model (" + "; ".join(reasons or ["the preference list is empty"]) + ")"
    return KeeperPlan(tuple(commands), why_none)
