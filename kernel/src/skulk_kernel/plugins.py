"""Plugin discovery and loading.

Plugins are distributions with an entry point in group ``skulk.plugins`` named ``<kind>-<name>``.
Listing reads package metadata only (no plugin module is imported), so `skulk-kernel plugins` and
profile validation work on any OS without the heavy libraries some plugins need.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from . import defaults, hookspecs
from .profiles import Profile

ENTRY_POINT_GROUP = "skulk.plugins"
KERNEL_DIST = "skulk-kernel"
log = logging.getLogger("skulk.plugins")


class PluginLoadError(Exception):
    """A plugin cannot be loaded; the message says which one, why, and how to fix it."""


@dataclass(frozen=True)
class PluginInfo:
    """What metadata says about an installed plugin, without importing it."""

    name: str
    distribution: str
    version: str
    kernel_range: str  # the plugin's declared skulk-kernel requirement, "" if none
    module: str

    def kernel_compatible(self, kernel_version: str) -> bool:
        spec = Requirement(f"{KERNEL_DIST}{self.kernel_range}").specifier if self.kernel_range else None
        return spec is None or spec.contains(Version(kernel_version), prereleases=True)


@cache  # the running code's version, read once (every heartbeat asks; a lookup scans the path)
def kernel_version() -> str:
    try:
        return metadata.version(KERNEL_DIST)
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return importlib.import_module(".", __package__).__version__


def _kernel_range(dist: metadata.Distribution) -> str:
    for raw in dist.requires or ():
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.name == KERNEL_DIST and not req.marker:
            return str(req.specifier)
    return ""


def installed_plugins() -> dict[str, PluginInfo]:
    """Every installed plugin by entry-point name, from metadata alone."""
    found: dict[str, PluginInfo] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        info = PluginInfo(
            name=ep.name,
            distribution=dist.name if dist else "?",
            version=dist.version if dist else "?",
            kernel_range=_kernel_range(dist) if dist else "",
            module=ep.value,
        )
        if ep.name in found and found[ep.name].distribution != info.distribution:
            raise PluginLoadError(
                f"plugin name {ep.name!r} is claimed by both {found[ep.name].distribution} "
                f"and {info.distribution}; uninstall one"
            )
        found[ep.name] = info
    return found


def install_hint(plugin: str) -> str:
    """The command that installs a missing plugin: the workspace folder if there is one."""
    root = _workspace_root()
    folder = root / "plugins" / plugin if root else None
    if folder is not None and folder.is_dir():
        return f"pip install -e {folder}"
    return f"pip install skulk-{plugin}"


def _workspace_root() -> Path | None:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "plugins").is_dir() and (parent / "kernel").is_dir():
            return parent
    return None


def new_plugin_manager() -> pluggy.PluginManager:
    """A fresh manager with the kernel's hookspecs and trylast defaults (no module globals). The one
    historic `add_hookspecs` call is replayed by pluggy into each plugin inside its `pm.register`."""
    pm = pluggy.PluginManager("skulk")
    pm.add_hookspecs(hookspecs)
    pm.register(defaults, name="kernel-defaults")
    pm.hook.add_hookspecs.call_historic(kwargs={"pm": pm})
    return pm


def register_plugin(pm: pluggy.PluginManager, plugin: ModuleType | Any, name: str) -> None:
    """Register one plugin, refusing a wrapper hookimpl (naming the plugin and the hook): the node
    calls each implementation on its own, so a wrapper would silently run as a plain one."""
    try:
        pm.register(plugin, name=name)
    except ValueError as exc:  # its add_hookspecs: "Hook 'x' is already registered within namespace"
        raise PluginLoadError(f"plugin {name!r}: its add_hookspecs declares a hook already declared: {exc}") from exc
    for caller in pm.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                pm.unregister(plugin)
                raise PluginLoadError(
                    f"plugin {name!r} implements hook {caller.name} as a wrapper (wrapper=True or "
                    "hookwrapper=True); Skulk calls each implementation on its own, so write a plain "
                    "hookimpl (use wrap_inference for request middleware)"
                )


def check_unknown_hooks(pm: pluggy.PluginManager) -> None:
    """pluggy's check_pending, relaxed: a near miss of a declared hook (``probe_nodes``) is a misspelling
    and an error; another undeclared hook (``register_api_routes`` without api-control) is a hook of a
    plugin the profile does not load (a runner, `engines status`): logged at DEBUG, never called."""
    callers = {name: c for name, c in vars(pm.hook).items() if not name.startswith("_")}
    declared = [name for name, caller in callers.items() if caller.has_spec()]
    for name, caller in callers.items():
        for impl in () if caller.has_spec() else caller.get_hookimpls():
            if impl.optionalhook:
                continue
            if close := difflib.get_close_matches(name, declared, n=1, cutoff=0.9):
                raise PluginLoadError(
                    f"plugin {impl.plugin_name!r}: unknown hook {name!r} (did you mean {close[0]!r}?); "
                    "the hooks are listed in docs/hooks.md"
                )
            log.debug(
                "plugin %r implements hook %r, which no loaded plugin declares: it is never called on this "
                "node (a hook of a plugin the profile does not load, or a misspelling; see docs/hooks.md)",
                impl.plugin_name,
                name,
            )


def build_plugin_manager(profile: Profile) -> pluggy.PluginManager:
    """Load exactly the plugins the profile names, in its order, refusing incompatible ones."""
    pm = new_plugin_manager()
    installed = installed_plugins()
    running = kernel_version()
    for name in profile.plugins:
        info = installed.get(name)
        if info is None:
            raise PluginLoadError(
                f"profile {profile.name!r} needs plugin {name!r}, which is not installed; "
                f"install it with: {install_hint(name)}"
            )
        if not info.kernel_compatible(running):
            raise PluginLoadError(
                f"plugin {name!r} ({info.distribution} {info.version}) requires "
                f"skulk-kernel{info.kernel_range}, but the running kernel is {running}; "
                f"upgrade one of them so the versions match"
            )
        (ep,) = [e for e in metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == name][:1]
        try:
            module = ep.load()
        except Exception as exc:  # an import error in a plugin must say which plugin
            raise PluginLoadError(f"plugin {name!r} failed to import: {exc!r}") from exc
        try:
            register_plugin(pm, module, name)
        except pluggy.PluginValidationError as exc:  # a hookimpl whose arguments match no spec
            # The culprit may be an earlier plugin whose impl this plugin's new spec just verified.
            culprit = next((n for n, p in pm.list_name_plugin() if p is exc.plugin and n != name), None)
            who = f"plugin {culprit!r} (checked against a hook plugin {name!r} declares)" if culprit else None
            raise PluginLoadError(f"{who or f'plugin {name!r} ({info.distribution})'}: {exc}") from exc
    check_unknown_hooks(pm)
    return pm
