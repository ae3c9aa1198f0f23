"""Guarded hook calls: a raising plugin is logged loudly and skipped, never fatal.

pluggy stops a hook call at the first exception; the node instead calls each implementation on
its own so one broken plugin cannot silence the rest. ``SKULK_TRACE_HOOKS=1`` logs every call.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from typing import Any

import pluggy

log = logging.getLogger("skulk.hooks")


class GuardedHooks:
    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.trace = os.environ.get("SKULK_TRACE_HOOKS", "") not in ("", "0")
        self.failures: list[tuple[str, str, str]] = []  # (hook, plugin, error), for diagnostics

    def _impls(self, hook_name: str) -> list[pluggy.HookImpl]:
        caller = getattr(self.pm.hook, hook_name)
        return list(reversed(caller.get_hookimpls()))  # pluggy's call order

    def _call_one(self, hook_name: str, impl: pluggy.HookImpl, kwargs: dict[str, Any]) -> Any:
        args = {name: kwargs[name] for name in impl.argnames}
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
            impl.plugin_name, hook_name, exc, exc_info=exc,
        )

    def call(self, hook_name: str, *, firstresult: bool = False, **kwargs: Any) -> list[Any]:
        """Call every implementation; collect non-None results (stop at the first if asked)."""
        results = []
        for impl in self._impls(hook_name):
            try:
                result = self._call_one(hook_name, impl, kwargs)
            except Exception as exc:
                self._record(hook_name, impl, exc)
                continue
            if result is not None:
                results.append(result)
                if firstresult:
                    break
        return results

    async def acall(self, hook_name: str, *, reverse: bool = False, **kwargs: Any) -> list[Any]:
        """Like call(), awaiting awaitable results one implementation at a time."""
        impls = self._impls(hook_name)
        results = []
        for impl in reversed(impls) if reverse else impls:
            try:
                result = self._call_one(hook_name, impl, kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                self._record(hook_name, impl, exc)
                continue
            if result is not None:
                results.append(result)
        return results
