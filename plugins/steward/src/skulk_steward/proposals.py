"""Proposals: actions the steward suggests, replicated in State, run only after an operator approves.

Why `PluginDataSet` and no new kernel command or event: the generic event already gives everything
a proposal needs. It is replicated and sequenced by the master like every event (so `/state` and
every node's `GET /v1/steward` see the same proposals), it survives a master failover because
State does, and the three facts of a proposal's life are separate keys written by separate parties,
so no write can undo another:

* ``proposal/<id>``: what and why, with its expiry (written by the API node whose steward proposed it);
* ``approval/<id>``: who approved it and when (written by the API node that took the approval);
* ``outcome/<id>``: what became of it (written only by the master: dispatched, done, failed,
  expired, rejected). An approval is consumed by the master writing the outcome *before* it issues
  the command; the command's id derives from the proposal's id, so a new master that finds an
  outcome ``dispatched`` whose effect is missing issues the same command once more, and a
  duplicate of an idempotent command changes nothing. That is how an approved proposal runs
  exactly once across a failover.

Everything here is pure (State and the time in, data out); `StewardService` carries it out.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from skulk_kernel.api import (
    Command,
    CommandId,
    DeleteInstance,
    InstanceId,
    ModelId,
    NodeId,
    PlaceInstance,
    State,
    derived_id,
)

from .config import PLUGIN

ActionKind = Literal["place_instance", "delete_instance", "move_instance", "evict_model"]
Terminal = Literal["done", "failed", "expired", "rejected"]


class Action(BaseModel):
    """What a proposal would do: one typed target."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ActionKind
    instance_id: str | None = None
    model_id: str | None = None
    node_id: str | None = None
    excluded_nodes: tuple[str, ...] = ()  # move_instance: the nodes it runs on now


class Proposal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    action: Action
    rationale: str = ""
    created_at: datetime
    expires_at: datetime


class Outcome(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    status: Literal["dispatched", "done", "failed", "expired", "rejected"]
    at: datetime
    detail: str = ""
    command_ids: tuple[str, ...] = ()
    reissued: bool = False
    master: str = ""
    dispatched_at: datetime | None = None


class ProposalRefused(Exception):
    """A proposal, approval or rejection the caller cannot have; `status` is the HTTP status."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def data(state: State) -> dict[str, Any]:
    return state.plugin_data.get(PLUGIN, {})


def proposals(state: State) -> dict[str, Proposal]:
    out = {}
    for key, value in data(state).items():
        if key.startswith("proposal/") and value is not None:
            out[key.removeprefix("proposal/")] = Proposal.model_validate(value)
    return out


def outcome(state: State, pid: str) -> Outcome | None:
    raw = data(state).get(f"outcome/{pid}")
    return Outcome.model_validate(raw) if raw else None


def approval(state: State, pid: str) -> dict[str, Any] | None:
    raw = data(state).get(f"approval/{pid}")
    return raw if isinstance(raw, dict) else None


def status_of(state: State, pid: str) -> str:
    done = outcome(state, pid)
    if done is not None:
        return done.status
    return "approved" if approval(state, pid) else "pending"


def pending(state: State) -> list[Proposal]:
    return [p for pid, p in proposals(state).items() if status_of(state, pid) == "pending"]


def validate_action(state: State, action: Action, known_models: set[str]) -> str | None:
    """Why `action` cannot be proposed against this State, or None."""
    if action.kind in ("delete_instance", "move_instance"):
        inst = state.instances.get(InstanceId(action.instance_id or ""))
        if inst is None:
            return f"there is no instance {action.instance_id!r}"
        if inst.system_role is not None:
            return "cluster services (the steward itself) are not part of the action surface"
        if action.kind == "move_instance" and action.node_id not in state.topology.nodes:
            return f"there is no node {action.node_id!r} to move it to"
    if action.kind in ("place_instance", "evict_model") and action.model_id not in known_models:
        return f"model {action.model_id!r} is not in the catalog"
    if action.kind == "evict_model" and not any(action.model_id in per for per in state.downloads.values()):
        return f"model {action.model_id!r} is not staged on any node"
    return None


def new_proposal(
    state: State, pid: str, action: Action, rationale: str, now: datetime, ttl_s: float, max_pending: int
) -> Proposal:
    if len(pending(state)) >= max_pending:
        raise ProposalRefused(
            429, f"{max_pending} proposals are already pending; approve, reject or let them expire", "too_many_pending"
        )
    return Proposal(
        id=pid, action=action, rationale=rationale[:500], created_at=now, expires_at=now + timedelta(seconds=ttl_s)
    )


def check_decidable(state: State, pid: str, now: datetime) -> Proposal:
    """The proposal an operator may approve or reject now; else ProposalRefused (404, 409, 410)."""
    proposal = proposals(state).get(pid)
    if proposal is None:
        raise ProposalRefused(404, f"there is no proposal {pid!r}", "not_found")
    status = status_of(state, pid)
    if status != "pending":
        raise ProposalRefused(409, f"proposal {pid} is already {status}; an approval is used once", "already_decided")
    if now >= proposal.expires_at:
        raise ProposalRefused(410, f"proposal {pid} expired at {proposal.expires_at.isoformat()}", "expired")
    return proposal


def commands_for(proposal: Proposal) -> tuple[Command, ...]:
    """The typed commands an approved proposal becomes; their ids derive from the proposal's.

    Evicting a staged model has no kernel command yet (the store evicts by budget): such a proposal
    is recorded as failed with that reason rather than pretending.
    """
    action = proposal.action

    def cid(purpose: str) -> CommandId:
        return CommandId(derived_id(f"steward/{proposal.id}", purpose))

    delete = DeleteInstance(command_id=cid("delete"), instance_id=InstanceId(action.instance_id or ""))
    if action.kind == "delete_instance":
        return (delete,)
    if action.kind == "place_instance":
        return (PlaceInstance(command_id=cid("place"), model_id=ModelId(action.model_id or "")),)
    if action.kind == "move_instance":
        excluded = tuple(NodeId(n) for n in action.excluded_nodes)
        place = PlaceInstance(command_id=cid("place"), model_id=ModelId(action.model_id or ""), excluded_nodes=excluded)
        return (place, delete)
    return ()


def effect_seen(state: State, proposal: Proposal, command: Command) -> bool:
    """Whether `command`'s effect is in State (a deleted instance is gone, a placed one exists)."""
    if isinstance(command, DeleteInstance):
        return command.instance_id not in state.instances
    if isinstance(command, PlaceInstance):
        return InstanceId(command.command_id) in state.instances
    return True


Work = tuple[str, Any]  # (plugin-data key, value) to emit, or ("submit", Command)


def master_work(
    state: State, now: datetime, master_id: str, mine: set[str], reconcile_after_s: float, keep_outcomes: int
) -> list[Work]:
    """What the master must do about the proposals in `state` at `now`.

    `mine` holds the proposals this master session dispatched itself (an outcome dispatched by an
    earlier master is reconciled at once: its commands may never have left).
    """
    work: list[Work] = []
    for pid, proposal in sorted(proposals(state).items(), key=lambda kv: kv[1].created_at):
        done = outcome(state, pid)
        if done is None:
            approved = approval(state, pid)
            if approved is not None and _parse(approved["approved_at"]) < proposal.expires_at:
                commands = commands_for(proposal)
                if not commands:
                    work.append(
                        _outcome(pid, "failed", now, master_id, "this action has no command on this cluster yet")
                    )
                    continue
                work.append(_outcome(pid, "dispatched", now, master_id, "", commands, dispatched_at=now))
                work += [("submit", c) for c in commands]
            elif now >= proposal.expires_at:
                work.append(_outcome(pid, "expired", now, master_id, "no operator approved it in time"))
        elif done.status == "dispatched":
            commands = commands_for(proposal)
            if all(effect_seen(state, proposal, c) for c in commands):
                work.append(_outcome(pid, "done", now, master_id, "its effect is in State", commands))
                continue
            since = done.dispatched_at or done.at
            stale = pid not in mine or (now - since).total_seconds() > reconcile_after_s
            if stale and not done.reissued:
                missing = [c for c in commands if not effect_seen(state, proposal, c)]
                work.append(_outcome(pid, "dispatched", now, master_id, "reissued once", commands, True, since))
                work += [("submit", c) for c in missing]
            elif done.reissued and (now - since).total_seconds() > 10 * reconcile_after_s:
                work.append(_outcome(pid, "failed", now, master_id, "its effect never appeared", commands))
    terminal = [
        (o.at, pid) for pid in proposals(state) if (o := outcome(state, pid)) is not None and o.status != "dispatched"
    ]
    for _, pid in sorted(terminal)[: max(0, len(terminal) - keep_outcomes)]:
        work += [(f"{prefix}/{pid}", None) for prefix in ("proposal", "approval", "outcome")]
    return work


def _outcome(
    pid: str,
    status: str,
    now: datetime,
    master_id: str,
    detail: str,
    commands: tuple[Command, ...] = (),
    reissued: bool = False,
    dispatched_at: datetime | None = None,
) -> Work:
    value = Outcome(
        status=status,  # type: ignore[arg-type]
        at=now,
        detail=detail,
        command_ids=tuple(c.command_id for c in commands),
        reissued=reissued,
        master=master_id,
        dispatched_at=dispatched_at,
    )
    return (f"outcome/{pid}", value.model_dump(mode="json"))


def _parse(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def view(state: State) -> list[dict[str, Any]]:
    """Every proposal as the API shows it, newest first."""
    out = []
    for pid, proposal in proposals(state).items():
        done = outcome(state, pid)
        out.append(
            {
                **proposal.model_dump(mode="json"),
                "status": status_of(state, pid),
                "approval": approval(state, pid),
                "outcome": done.model_dump(mode="json") if done else None,
            }
        )
    return sorted(out, key=lambda p: p["created_at"], reverse=True)
