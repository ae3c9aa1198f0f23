"""Guarded hook calls: the one path by which the node calls plugins.

pluggy stops a hook call at the first exception; the node calls each implementation on its own
so one broken plugin cannot silence the rest (hence wrappers are refused at load). `collect` runs
the ``register_*`` hooks the same way, naming each registration's plugin. SKULK_TRACE_HOOKS=1 logs.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .contracts import NodeSurface

log = logging.getLogger("skulk.hooks")


class NodeError(Exception):
    """A configuration or composition problem that stops the node before it starts."""


class GuardedHooks:
    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.trace = os.environ.get("SKULK_TRACE_HOOKS", "") not in ("", "0")
        self.failures: list[tuple[str, str, str]] = []  # (hook, plugin, error), for diagnostics

    def _impls(self, hook_name: str) -> list[pluggy.HookImpl]:
        caller = getattr(self.pm.hook, hook_name)
        return list(reversed(caller.get_hookimpls()))  # pluggy's call order

    def _call_one(self, hook_name: str, impl: pluggy.HookImpl, kwargs: dict[str, Any]) -> Any:
        args = {name: kwargs[name] for name in impl.argnames if name in kwargs}
        started = time.perf_counter()
        result = impl.function(**args)
        if self.trace:
            took = (time.perf_counter() - started) * 1000
            log.info("hook %s -> %s (%.2f ms)", hook_name, impl.plugin_name, took)
        return result

    def _record(self, hook_name: str, impl: pluggy.HookImpl, exc: BaseException) -> None:
        self.failures.append((hook_name, impl.plugin_name, repr(exc)))
        del self.failures[:-100]
        log.error(
            "plugin %r raised in hook %s: %r (skipped; the node keeps running)",
            impl.plugin_name,
            hook_name,
            exc,
            exc_info=exc,
        )

    def _each(
        self, hook_name: str, kwargs_for: Callable[[str], dict[str, Any]], reverse: bool = False
    ) -> Iterator[tuple[pluggy.HookImpl, Any]]:
        """(impl, result) for every implementation that did not raise; `NodeError` propagates."""
        impls = self._impls(hook_name)
        for impl in reversed(impls) if reverse else impls:
            try:
                yield impl, self._call_one(hook_name, impl, kwargs_for(impl.plugin_name))
            except NodeError:
                raise  # a composition error (duplicate name) must stop the node with its message
            except Exception as exc:
                self._record(hook_name, impl, exc)

    def call(self, hook_name: str, *, firstresult: bool = False, **kwargs: Any) -> list[Any]:
        """Call every implementation; collect non-None results (stop at the first if asked)."""
        results = []
        for _impl, result in self._each(hook_name, lambda _plugin: kwargs):
            if result is not None:
                results.append(result)
                if firstresult:
                    break
        return results

    async def acall(self, hook_name: str, *, reverse: bool = False, **kwargs: Any) -> list[Any]:
        """Like call(), awaiting awaitable results one implementation at a time."""
        results = []
        for impl, result in self._each(hook_name, lambda _plugin: kwargs, reverse=reverse):
            try:
                value = await result if inspect.isawaitable(result) else result
            except Exception as exc:
                self._record(hook_name, impl, exc)
                continue
            if value is not None:
                results.append(value)
        return results


class Registry(dict[str, Any]):
    """Named capabilities registered by plugins; a duplicate name names both plugins."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.owner: dict[str, str] = {}

    def add(self, obj: Any, plugin: str) -> None:
        name = getattr(obj, "name", None)
        if not name:
            raise NodeError(f"plugin {plugin!r} registered a {self.kind} without a name")
        if name in self:
            raise NodeError(f"{self.kind} {name!r} is registered by both {self.owner[name]!r} and {plugin!r}")
        self[name] = obj
        self.owner[name] = plugin


def collect(
    hooks: GuardedHooks | pluggy.PluginManager, hook_name: str, kind: str, node: NodeSurface | None = None
) -> Registry:
    """Run a ``register_*`` hook plugin by plugin, so duplicates can name their owners.

    A raising plugin's registrations are skipped (logged); the node keeps its other capabilities.
    """
    guarded = hooks if isinstance(hooks, GuardedHooks) else GuardedHooks(hooks)
    registry = Registry(kind)

    def kwargs_for(plugin: str) -> dict[str, Any]:
        return {"register": lambda obj: registry.add(obj, plugin), "node": node}

    for _impl, _result in guarded._each(hook_name, kwargs_for):
        pass
    return registry
