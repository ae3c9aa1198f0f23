"""Plugins that record hook calls: for tests about *which* hooks run, in what order, with what.

    rec = RecordingPlugin()
    register_plugin(rec, "recorder")      # the skulk_testing fixture
    ...
    assert rec.names() == ["probe_node"]

`RecordingPlugin` implements every hookspec in `skulk_kernel.hookspecs` with the spec's exact
argument names and returns None from each, so it never changes a hook's result. Pass `raising=`
to make chosen hooks raise instead (for tests of the node's guards), and `hooks=` to implement
only some.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class HookBoom(RuntimeError):
    """What a RecordingPlugin raises from the hooks it was told to break."""


@dataclass(frozen=True)
class HookCall:
    name: str
    kwargs: dict[str, Any]


def hookspec_names() -> list[str]:
    """Every hookspec of the kernel, in source (banner) order."""
    from skulk_kernel import hookspecs

    specs = [
        (fn.__code__.co_firstlineno, name)
        for name, fn in vars(hookspecs).items()
        if inspect.isfunction(fn) and hasattr(fn, "skulk_spec")
    ]
    return [name for _, name in sorted(specs)]


def hookspec_argnames(name: str) -> list[str]:
    from skulk_kernel import hookspecs

    return list(inspect.signature(getattr(hookspecs, name)).parameters)


class RecordingPlugin:
    """Implements kernel hookspecs, records every call (thread-safe), returns None."""

    def __init__(self, hooks: Iterable[str] | None = None, raising: Iterable[str] = ()) -> None:
        from skulk_kernel.hookspecs import hookimpl

        self.calls: list[HookCall] = []
        self._lock = threading.Lock()
        self._raising = set(raising)
        for name in hooks if hooks is not None else hookspec_names():
            setattr(self, name, hookimpl(self._make(name)))

    def _make(self, name: str) -> Any:
        args = hookspec_argnames(name)
        # A real function with the spec's argument names: pluggy passes exactly those.
        source = (
            f"def {name}({', '.join(args)}):\n"
            f"    return _record({name!r}, {{{', '.join(f'{a!r}: {a}' for a in args)}}})\n"
        )
        namespace: dict[str, Any] = {"_record": self._record}
        exec(source, namespace)
        return namespace[name]

    def _record(self, name: str, kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append(HookCall(name, kwargs))
        if name in self._raising:
            raise HookBoom(f"{name} raised on purpose")

    def names(self) -> list[str]:
        with self._lock:
            return [c.name for c in self.calls]

    def calls_of(self, name: str) -> list[HookCall]:
        with self._lock:
            return [c for c in self.calls if c.name == name]

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()
