"""The hooks api-control declares and calls: the HTTP app and the API's inference middleware.

api-control adds this module through its `add_hookspecs` implementation (plugin.py), so the hooks
exist on every node that loads api-control, whichever order the profile lists the plugins in.
Implement them with the kernel's marker (``from skulk_kernel import hookimpl``); documented in
docs/hooks.md under "Plugin api-control". On a node without api-control nobody declares or calls
them: the loader logs that (DEBUG) and the node runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skulk_kernel import hookspec

if TYPE_CHECKING:
    from skulk_kernel.api import NodeSurface

# ============================== http app =========================================================


@hookspec
def register_api_routes(app: Any, node: NodeSurface) -> None:
    """Add routes to the node's HTTP app (a FastAPI instance) on port 52415.

    Called once at start-up on nodes that serve the API (api-control builds the app). Every
    implementation runs; results are ignored. Heavy imports belong inside the route functions.
    """


# ============================== middleware =======================================================


@hookspec
def wrap_inference(node: NodeSurface) -> Any:
    """Return an InferenceMiddleware (skulk_kernel.api.InferenceMiddleware) or None.

    Called once at start-up (api-control's `startup`) on nodes that load api-control. All non-None
    results are collected; for every inference request the API calls each middleware's
    ``transform(command)`` in order before dispatch (each sees the previous one's output) and
    ``observe(command, chunk)`` for every chunk after. Middleware never owns the stream: a raising
    middleware is logged and skipped for that request.
    """
