"""The hooks api-control declares and calls: the node's HTTP app is api-control's, so are its hooks.

api-control adds this module through its `add_hookspecs` implementation (plugin.py), so the hooks
exist on every node that loads api-control, whichever order the profile lists the plugins in.
Implement them with the kernel's marker (``from skulk_kernel import hookimpl``); documented in
docs/hooks.md under "Plugin api-control". On a node without api-control nobody declares or calls
them: the loader logs a warning and the node runs on.
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
