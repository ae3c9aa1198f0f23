"""The steward's read-only tools: each answers with plain sentences that state the facts.

The resident model is small (a 0.5B model must be able to use these), so results are not JSON
dumps to be interpreted: they say "The cluster has 3 nodes." and "The master is node 'alpha'."
The one tool that is not read-only, `propose_action`, only records a proposal; nothing runs until
an operator approves it (see proposals.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from skulk_kernel.api import (
    CommandId,
    ModelId,
    NodeIdentity,
    NodeMemory,
    NodeResources,
    NodeSurface,
    PlaceInstance,
    PlacementError,
    ToolSpec,
    catalog,
    instance_ready,
    new_id,
)
from skulk_master.placement import plan_placement

from . import proposals
from .config import PLUGIN, ROLE, STEWARD, StewardConfig

GiB = 1024**3


def node_name(node: NodeSurface, node_id: str) -> str:
    ident = node.readings.get(NodeIdentity, node_id)
    return ident.reading.friendly_name if ident is not None else node_id[:8]


def cluster_nodes(node: NodeSurface) -> list[str]:
    return sorted(set(node.state.topology.nodes) | ({node.node_id} if not node.state.topology.nodes else set()))


def _instance_line(node: NodeSurface, inst: Any) -> str:
    where = ", ".join(f"'{node_name(node, n)}'" for n in inst.shard_assignments.node_to_runner)
    ready = "ready" if instance_ready(inst, node.state.runners) else "starting"
    return f"{inst.shard_assignments.model_id} (instance {inst.instance_id[:8]}) on node {where}, {ready}"


def get_cluster_state(node: NodeSurface, **_: Any) -> str:
    nodes = cluster_nodes(node)
    master = node.master_id
    lines = [f"The cluster has {len(nodes)} node{'s' if len(nodes) != 1 else ''}."]
    if master:
        lines.append(f"The master is node '{node_name(node, master)}' (id {master[:8]}).")
    for nid in nodes:
        role = "master" if nid == master else "worker"
        mem = node.readings.get(NodeMemory, nid)
        free = f", {mem.reading.ram_available.in_bytes / GiB:.1f} GiB RAM free" if mem is not None else ""
        lines.append(f"- node '{node_name(node, nid)}' (id {nid[:8]}): {role}{free}")
    user = [i for i in node.state.instances.values() if i.system_role is None]
    services = [i for i in node.state.instances.values() if i.system_role is not None]
    if user:
        lines.append(f"There are {len(user)} model instance{'s' if len(user) != 1 else ''}:")
        lines += [f"- {_instance_line(node, i)}" for i in user]
    else:
        lines.append("No user model instances are placed.")
    for inst in services:
        lines.append(f"Cluster service {inst.system_role}: {_instance_line(node, inst)}.")
    open_tasks = sum(1 for t in node.state.tasks.values() if t.status in ("Pending", "Running"))
    lines.append(f"Requests in flight: {open_tasks}.")
    return "\n".join(lines)


def get_node_health(node: NodeSurface, node_name_or_id: str = "", **_: Any) -> str:
    from skulk_api_control.state_view import node_health

    wanted = [n for n in cluster_nodes(node) if not node_name_or_id or _matches(node, n, node_name_or_id)]
    if not wanted:
        return f"There is no node called {node_name_or_id!r}. Nodes: " + ", ".join(
            f"'{node_name(node, n)}'" for n in cluster_nodes(node)
        )
    lines = []
    for nid in wanted:
        health = node_health(node, nid, node.state)
        res = node.readings.get(NodeResources, nid)
        mem = node.readings.get(NodeMemory, nid)
        parts = [f"Node '{node_name(node, nid)}' health is {health['level']}."]
        if mem is not None:
            m = mem.reading
            parts.append(f"RAM: {m.ram_available.in_bytes / GiB:.1f} GiB free of {m.ram_total.in_bytes / GiB:.1f} GiB.")
        if res is not None:
            parts.append(f"Backends: {', '.join(res.reading.backends) or 'none'}.")
        parts += [f"Problem: {r['message']} ({r['remediation']})." for r in health["reasons"]]
        lines.append(" ".join(parts))
    return "\n".join(lines)


def get_diagnostics(node: NodeSurface, **_: Any) -> str:
    state = node.state
    lines = []
    for inst in state.instances.values():
        statuses = [
            type(state.runners.get(r)).__name__.removeprefix("Runner") for r in inst.shard_assignments.runner_to_shard
        ]
        load = sum(
            1 for t in state.tasks.values() if t.instance_id == inst.instance_id and t.status in ("Pending", "Running")
        )
        lines.append(
            f"Instance {inst.instance_id[:8]} of {inst.shard_assignments.model_id}: "
            f"runners {', '.join(statuses)}; {load} request(s) in flight."
        )
    for failure in state.instance_failures[-5:]:
        lines.append(f"Past failure of {failure.model_id}: {failure.reason}.")
    for nid, per in state.downloads.items():
        for model_id, status in per.items():
            kind = type(status).__name__.removeprefix("Download").removesuffix("Status").lower()
            lines.append(f"On node '{node_name(node, nid)}', {model_id} is {kind}.")
    return "\n".join(lines) or "Nothing to report: no instances, failures or downloads."


def preview_placement(node: NodeSurface, model_id: str = "", **_: Any) -> str:
    cards = catalog(node)
    if model_id not in cards:
        close = [m for m in cards if model_id and model_id.lower() in m.lower()]
        if len(close) == 1:
            model_id = close[0]
        else:
            return f"Model {model_id!r} is not in the catalog. Known models: {', '.join(sorted(cards))}."
    try:
        inst = plan_placement(node, PlaceInstance(command_id=CommandId(new_id()), model_id=ModelId(model_id)))
    except PlacementError as exc:
        return f"Model {model_id} cannot be placed now: {exc.message}"
    where = ", ".join(f"'{node_name(node, n)}'" for n in inst.shard_assignments.node_to_runner)
    return f"Model {model_id} would be placed on node {where}."


def search_docs(node: NodeSurface, query: str = "", **_: Any) -> str:
    config: StewardConfig = node.plugin_config(PLUGIN) or StewardConfig()
    folder = Path(config.docs_dir) if config.docs_dir else _default_docs()
    if folder is None or not folder.is_dir():
        return "No documentation is installed on this node."
    words = {w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2}
    scored = []
    for path in sorted(folder.glob("*.md")):
        for section in re.split(r"\n(?=#+ )", path.read_text(errors="replace")):
            text = section.lower()
            score = sum(text.count(w) for w in words)
            if score:
                scored.append((score, path.name, section.strip()))
    if not scored:
        return f"The docs say nothing about {query!r}."
    best = sorted(scored, key=lambda s: -s[0])[:2]
    return "\n\n".join(f"From {name}:\n{section[:900]}" for _, name, section in best)


def _default_docs() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "docs" / "index.md").is_file():
            return parent / "docs"
    return None


def _matches(node: NodeSurface, nid: str, ref: str) -> bool:
    ref = ref.strip().strip("'\"").lower()
    return nid.lower().startswith(ref) or node_name(node, nid).lower() == ref


def propose_action(
    node: NodeSurface, kind: str = "", instance_id: str = "", model_id: str = "", rationale: str = "", **_: Any
) -> str:
    """Record a proposal (it does nothing until an operator approves it)."""
    service = node.services.get(STEWARD)
    if service is None:
        return "Proposals are not available on this node."
    try:
        proposal = service.propose_from_tool(kind, instance_id, model_id, rationale)
    except proposals.ProposalRefused as exc:
        return f"The proposal was refused: {exc.message}"
    return (
        f"Proposal {proposal.id} recorded: {kind} (expires {proposal.expires_at.astimezone(UTC):%H:%M:%S} UTC). "
        "It runs only when an operator approves it with POST /v1/steward/proposals/{id}/approve."
    )


Tool = Callable[..., str]
TOOLS: dict[str, tuple[Tool, ToolSpec]] = {
    "get_cluster_state": (
        get_cluster_state,
        ToolSpec(
            name="get_cluster_state",
            description="The nodes of the cluster (how many, which is the master), the model instances "
            "and requests in flight.",
            parameters={"type": "object", "properties": {}},
        ),
    ),
    "get_node_health": (
        get_node_health,
        ToolSpec(
            name="get_node_health",
            description="Health, memory and backends of one node (by name) or of every node (no name).",
            parameters={"type": "object", "properties": {"node_name_or_id": {"type": "string"}}},
        ),
    ),
    "get_diagnostics": (
        get_diagnostics,
        ToolSpec(
            name="get_diagnostics",
            description="Runner statuses, load per instance, past failures and downloads: "
            "why something is slow or broken.",
            parameters={"type": "object", "properties": {}},
        ),
    ),
    "preview_placement": (
        preview_placement,
        ToolSpec(
            name="preview_placement",
            description="Which node a model would be placed on now, or why it cannot be placed.",
            parameters={"type": "object", "properties": {"model_id": {"type": "string"}}, "required": ["model_id"]},
        ),
    ),
    "search_docs": (
        search_docs,
        ToolSpec(
            name="search_docs",
            description="Search Skulk's own documentation (how to do something, what a feature is).",
            parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        ),
    ),
    "propose_action": (
        propose_action,
        ToolSpec(
            name="propose_action",
            description="Propose a change for an operator to approve: kind is place_instance (model_id), "
            "delete_instance or move_instance (instance_id). Nothing runs until approved.",
            parameters={
                "type": "object",
                "properties": {
                    "kind": {
                        "type": "string",
                        "enum": ["place_instance", "delete_instance", "move_instance", "evict_model"],
                    },
                    "instance_id": {"type": "string"},
                    "model_id": {"type": "string"},
                    "rationale": {"type": "string"},
                },
                "required": ["kind", "rationale"],
            },
        ),
    ),
}


def run_tool(node: NodeSurface, name: str, arguments: str) -> str:
    """One tool call's result as text; a bad call is a result too (the model can correct itself)."""
    entry = TOOLS.get(name)
    if entry is None:
        return f"There is no tool {name!r}. Tools: {', '.join(TOOLS)}."
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return f"The arguments of {name} were not valid JSON: {arguments!r}"
    if not isinstance(args, dict):
        args = {}
    try:
        return entry[0](node, **{str(k): v for k, v in args.items()})
    except Exception as exc:  # a tool never breaks the turn
        return f"The tool {name} failed: {type(exc).__name__}: {exc}"


def now() -> datetime:
    return datetime.now(UTC)


__all__ = ["ROLE", "TOOLS", "get_cluster_state", "run_tool"]
