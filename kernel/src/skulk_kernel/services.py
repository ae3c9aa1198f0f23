"""Typed per-node services: how one plugin hands another (or itself, later) a per-node object.

A plugin that keeps a per-node object (the worker's `Worker`, the master's `Master`) publishes it on
`node.services` under a `ServiceKey` declared once, as a module-level constant, in that plugin's
public module. A consumer imports the key from there, so the type checker knows what it gets back
and the import graph shows who depends on whom, which a dict keyed by strings hid from both.
Modelled on pytest's ``StashKey``/``Stash``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from .hooks import NodeError

T = TypeVar("T")


class ServiceKey(Generic[T]):
    """Names one service and the type of its value; keys compare by identity, never by name.

    Declare each key once, at module level, in the publishing plugin:
    ``WORKER: ServiceKey[Worker] = ServiceKey("worker")``. Two keys with the same name are two
    different services, so a consumer must import the publisher's constant. `name` and `plugin`
    serve only the error messages; `plugin` defaults to the part of `name` before the first dot
    (``ServiceKey("api-control.quota")`` belongs to api-control).
    """

    __slots__ = ("name", "plugin")

    def __init__(self, name: str, plugin: str | None = None) -> None:
        self.name = name
        self.plugin = plugin or name.split(".", 1)[0]

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


class Services:
    """The node's published services (`NodeSurface.services`), one value per key.

    Publishing a key twice is refused: two plugins claiming the same service is a composition bug
    that a silent overwrite would hide. A plugin that takes its object down withdraws it.
    """

    def __init__(self) -> None:
        self._values: dict[ServiceKey[Any], Any] = {}

    def publish(self, key: ServiceKey[T], value: T) -> T:
        """Make `value` the node's `key` service; returns it, for ``x = services.publish(K, X())``."""
        if key in self._values:
            raise NodeError(
                f"service {key.name!r} is already published on this node (by plugin {key.plugin!r}); "
                "withdraw it before publishing another"
            )
        self._values[key] = value
        return value

    def get(self, key: ServiceKey[T]) -> T | None:
        """The `key` service, or None when no plugin published it (its plugin may not be loaded)."""
        return cast("T | None", self._values.get(key))

    def require(self, key: ServiceKey[T]) -> T:
        """The `key` service, for callers that cannot work without it."""
        try:
            return cast("T", self._values[key])
        except KeyError:
            raise LookupError(
                f"no {key.name!r} service on this node: the {key.plugin!r} plugin publishes it, "
                "so it must be loaded (in the profile) and started"
            ) from None

    def withdraw(self, key: ServiceKey[T]) -> T | None:
        """Remove the `key` service and return it (None when it was not published)."""
        return cast("T | None", self._values.pop(key, None))

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)
