"""The API's inference middleware: every plugin's `wrap_inference` (an api-control hook), collected once."""

from __future__ import annotations

from collections.abc import Sequence

from skulk_kernel.api import InferenceMiddleware, NodeSurface, ServiceKey

MIDDLEWARE: ServiceKey[tuple[InferenceMiddleware, ...]] = ServiceKey("api-control.middleware")


def collect_middleware(node: NodeSurface) -> None:
    """Call `wrap_inference` (guarded) and publish the non-None results, in call order."""
    node.services.withdraw(MIDDLEWARE)
    node.services.publish(MIDDLEWARE, tuple(node.hooks.call("wrap_inference", node=node)))


def middleware_of(node: NodeSurface) -> Sequence[InferenceMiddleware]:
    """The node's middleware, in order (none before api-control's startup)."""
    return node.services.get(MIDDLEWARE) or ()
