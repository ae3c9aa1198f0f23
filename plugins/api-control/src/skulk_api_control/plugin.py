"""Entry point: hosts the node's HTTP app and registers the control routes.

The app is built at start-up from every plugin's `register_api_routes`; uvicorn serves it inside
the node's event loop so routes can use the node's services directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface, ServiceKey

from .security_hooks import register_cli_commands, register_config, wrap_inference  # noqa: F401

if TYPE_CHECKING:  # both pull in fastapi/uvicorn, which this module leaves to start-up
    from .routes import RecentEvents
    from .server import ApiServer

# api-control's own per-node objects (private: no other plugin reads them)
SERVER: ServiceKey[ApiServer] = ServiceKey("api-control.server")
EVENTS: ServiceKey[RecentEvents] = ServiceKey("api-control.events")


@hookimpl
def add_hookspecs(pm: Any) -> None:
    from . import hookspecs  # register_api_routes: api-control builds the app, so it owns the hook

    pm.add_hookspecs(hookspecs)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .dashboard import add_dashboard_routes
    from .health import add_health_routes
    from .routes import add_control_routes

    add_control_routes(app, node)
    add_health_routes(app, node)
    add_dashboard_routes(app, node)


@hookimpl
def on_event_applied(node: NodeSurface, event: Any) -> None:
    recent = node.services.get(EVENTS)
    if recent is not None:
        recent.events.append(event)


@hookimpl
async def startup(node: NodeSurface) -> None:
    from .middleware import collect_middleware

    collect_middleware(node)  # wrap_inference, api-control's hook: before any request
    if node.options.no_api:
        return
    from .server import serve

    try:
        node.services.publish(SERVER, await serve(node))
    except RuntimeError as exc:
        # A node that was asked to serve HTTP and cannot is not what the operator wanted.
        node.fail(str(exc))


@hookimpl
async def shutdown(node: NodeSurface) -> None:
    server = node.services.withdraw(SERVER)
    if server is not None:
        await server.stop()
