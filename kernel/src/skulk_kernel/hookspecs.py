"""Every hook a plugin can implement, grouped in the order the node calls them.

Each docstring says when the hook is called, on which nodes, and how the results combine.
Hook names read like a menu: ``register_*`` hooks add capabilities (llm style), ``on_*`` hooks are
notifications, and the decision hooks are first-result with kernel defaults registered trylast.

The node guards every call it makes: a raising implementation is logged loudly and skipped, it never
takes the node down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # the hook signatures only; nothing here is imported at run time
    from .contracts import EngineInstaller, NodeSurface
    from .events import IndexedEvent
    from .models import ModelCard
    from .state import State

hookspec = pluggy.HookspecMarker("skulk")
hookimpl = pluggy.HookimplMarker("skulk")

# ============================== bootstrap ========================================================


@hookspec(historic=True)
def add_hookspecs(pm: pluggy.PluginManager) -> None:
    """Add a plugin's own hookspecs so other plugins can implement them: ``pm.add_hookspecs(mod)``.

    Called once per plugin, on every node, inside its registration and before its other hooks are
    added (historic: pluggy replays the one call into each plugin as it registers). Results are
    ignored. A spec redeclaring a declared hook stops loading.
    """


@hookspec
def register_config(register: Callable[[str, type[Any]], None]) -> None:
    """Declare a plugin's configuration model: ``register("engine-echo", EchoConfig)``.

    Called once on every node before `configure`. The node validates the profile's
    ``[plugins.<name>]`` table against that pydantic model and refuses to start on an error.
    Results are ignored.
    """


@hookspec
def configure(node: NodeSurface) -> None:
    """Read validated configuration (``node.plugin_config(name)``) and prepare, without I/O.

    Called once on every node after plugin loading and before any ``register_*`` hook.
    Results are ignored.
    """


# ============================== capabilities =====================================================


@hookspec
def register_transports(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """Register Transport implementations (see contracts.Transport) by their `name`.

    Every ``register_*`` capability hook also receives the `node` being built (None inside a
    runner subprocess), so a plugin can register per-node objects.

    Called once on every node at start-up. All registrations are collected; a duplicate name is an
    error naming both plugins. The profile's ``[planes]`` table picks one per plane.
    """


@hookspec
def register_elections(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """Register Election implementations (contracts.Election) by their `name`.

    Called once on every node at start-up. All registrations are collected; a duplicate name is an
    error naming both plugins. With none registered, a lone node leads itself.
    """


@hookspec
def register_planners(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """Register placement Planners (contracts.Planner) by their `name`.

    Called once on every node at start-up (any node may become master). All registrations are
    collected; a duplicate name is an error; the master uses the first.
    """


@hookspec
def register_engines(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """Register Engines (contracts.Engine) by name.

    Called once on every node at start-up, and again inside each runner subprocess to find the
    engine it runs. All registrations are collected; a duplicate name is an error.
    """


@hookspec
def register_model_stores(register: Callable[[Any], None], node: NodeSurface | None) -> None:
    """Register ModelStores (contracts.ModelStore) by their `name`.

    Called once on every node at start-up. All registrations are collected; a duplicate name is an
    error; the node consults them in order.
    """


@hookspec
def register_cli_commands(cli: Any) -> None:
    """Add subcommands to ``skulk-kernel`` (an argparse subparsers object).

    Called when the CLI starts, for the plugins of the active profile. Results are ignored.
    """


@hookspec
def register_engine_installers(register: Callable[[EngineInstaller], None]) -> None:
    """Offer ``skulk-kernel engines install NAME`` for an engine that lives in its own environment.

    Called in the CLI process by the ``engines`` command (the worker plugin's), for every installed
    plugin (an engine is installed before a profile uses it). All registrations are collected; the
    first of one name wins.
    """


# ============================== node facts =======================================================


@hookspec
def probe_node(facts: dict[str, Any]) -> None:
    """Add facts about this machine to ``facts`` (hardware, importable engines, binaries).

    Called on every node at start-up and when resources are re-probed; every implementation adds
    its keys in place (later plugins may read earlier keys). The node turns the facts into its
    NodeResources reading (backend tags). Results are ignored.
    """


# ============================== decisions (first result wins) ====================================


@hookspec(firstresult=True)
def resolve_model(ref: str, catalog: dict[str, ModelCard]) -> ModelCard | None:
    """Map a user's model reference (id, alias, path) to a card.

    Called by the API and the master. First non-None result wins; the kernel default (trylast)
    matches exact ids and then a case-insensitive id suffix.
    """


# ============================== notifications ====================================================


@hookspec
def on_event_applied(node: NodeSurface, event: IndexedEvent, before: State, after: State) -> None:
    """React to an event every node has just applied (never called from inside apply()).

    Called on every node, once per event, in index order. May return an awaitable, which the node
    awaits. Results are ignored; a raising implementation is logged and skipped.
    """


@hookspec
def on_state_synced(node: NodeSurface, before: State, after: State) -> None:
    """The node adopted a State snapshot from the master instead of applying events one by one.

    Called on a node that joined late, fell behind, or followed a failover. Plugins that track
    State (a worker's runners) reconcile against `after`. May return an awaitable. Results are
    ignored.
    """


@hookspec
def on_master_changed(node: NodeSurface, master_node_id: str | None, is_master: bool) -> None:
    """The elected master changed (None while an election is in progress).

    Called on every node. May return an awaitable. Results are ignored.
    """


# ============================== lifecycle ========================================================


@hookspec
def startup(node: NodeSurface) -> Any:
    """Start the plugin's long-running work (tasks, subprocesses, sockets).

    Called once on every node after registration, in plugin load order. May return an awaitable;
    the node awaits each in turn. Results are ignored; a raising startup is logged and skipped.
    """


@hookspec
def shutdown(node: NodeSurface) -> Any:
    """Stop everything `startup` started and release it (runners, sessions, sockets).

    Called once on every node on SIGINT/SIGTERM, in reverse load order. May return an awaitable.
    Results are ignored.
    """
