"""Finding and loading extensions with stevedore: named or all, version-checked, failures isolated.

pluggy composes a node from the plugins its profile names; extensions are the other kind: code a
user `pip install`s that offers capabilities, found in its own entry-point namespace
(`skulk.extensions`). stevedore's managers load them and call back for each one that fails
instead of failing the whole load; each loaded one is then checked against the running
skulk-kernel version (its declared `skulk_requires`) before anything of it runs. Every outcome is a
record, so `skulk-kernel extensions list` and the node's log say what was found, loaded and
refused, and why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from importlib import metadata
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import BaseModel, ConfigDict
from skulk_kernel.api import kernel_version

from .api import Capability
from .config import DISABLE_ENV, NAMESPACE

log = logging.getLogger("skulk.providers.extensions")
Status = Literal["loaded", "refused", "failed", "missing", "not_named", "disabled"]


class ExtensionRecord(BaseModel):
    """One extension's fate on this node."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    distribution: str = ""
    version: str = ""
    status: Status
    reason: str = ""
    capabilities: tuple[str, ...] = ()  # id@version of what it offers (loaded ones)

    def line(self) -> str:
        dist = f"{self.distribution} {self.version}".strip() or "-"
        caps = f" [{', '.join(self.capabilities)}]" if self.capabilities else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.name:<22} {self.status:<9} {dist}{caps}{why}"


class Loaded(BaseModel):
    """What a load produced: the records, and the capabilities of the loaded extensions."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    records: list[ExtensionRecord]
    capabilities: dict[str, Capability]  # ref (id@version) -> capability


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def found() -> dict[str, metadata.EntryPoint]:
    """Every installed extension by entry-point name, from metadata alone (nothing imported)."""
    return {ep.name: ep for ep in metadata.entry_points(group=NAMESPACE)}


def _dist(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    return (dist.metadata["Name"], dist.version) if dist is not None else ("", "")


def check_version(requires: object, running: str) -> str | None:
    """None when `requires` (a PEP 440 specifier) admits the running version; else the reason."""
    if not isinstance(requires, str) or not requires.strip():
        return "declares no skulk_requires (the skulk-kernel versions it was built for, e.g. '>=0.1,<0.2')"
    try:
        spec = SpecifierSet(requires)
    except InvalidSpecifier:
        return f"its skulk_requires {requires!r} is not a version specifier"
    if not spec.contains(Version(running), prereleases=True):
        return f"built for skulk-kernel{requires}, running {running}: install a release of it built for {running}"
    return None


def _capabilities_of(plugin: Any) -> list[Capability]:
    obj = plugin() if isinstance(plugin, type) else plugin
    caps = list(obj.capabilities())
    for cap in caps:
        if not isinstance(cap, Capability) or not hasattr(cap, "descriptor"):
            raise TypeError(f"capabilities() returned {cap!r}, not a skulk_providers.api.Capability with a descriptor")
    return caps


def load(names: Sequence[str] | Literal["all"] = "all") -> Loaded:
    """Load the named (or all installed) extensions; never raises for an extension's fault."""
    installed = found()
    if disabled():
        skipped = [
            ExtensionRecord(
                name=n,
                distribution=_dist(ep)[0],
                version=_dist(ep)[1],
                status="disabled",
                reason=f"{DISABLE_ENV}=1: discovery skipped",
            )
            for n, ep in sorted(installed.items())
        ]
        return Loaded(records=skipped, capabilities={})
    from stevedore import ExtensionManager, NamedExtensionManager

    failures: dict[str, str] = {}

    def on_failure(_manager: Any, entrypoint: Any, exc: BaseException) -> None:
        failures[entrypoint.name] = f"failed to load: {type(exc).__name__}: {exc}"[:500]
        log.error("extension %s failed to load and is skipped: %r", entrypoint.name, exc)

    missing: list[str] = []
    manager: Any
    if names == "all":
        manager = ExtensionManager(NAMESPACE, on_load_failure_callback=on_failure, propagate_map_exceptions=False)
    else:
        manager = NamedExtensionManager(
            NAMESPACE,
            names=list(names),
            name_order=True,
            on_load_failure_callback=on_failure,
            propagate_map_exceptions=False,
            on_missing_entrypoints_callback=lambda gone: missing.extend(gone),
        )
    running = kernel_version()
    records: list[ExtensionRecord] = []
    capabilities: dict[str, Capability] = {}
    for ext in manager.extensions:
        dist, version = _dist(installed.get(ext.name))  # stevedore's cached entry points carry no dist
        base = {"name": ext.name, "distribution": dist, "version": version}
        refused = check_version(getattr(ext.plugin, "skulk_requires", None), running)
        if refused:
            log.warning("extension %s refused: %s", ext.name, refused)
            records.append(ExtensionRecord(**base, status="refused", reason=refused))
            continue
        try:
            caps = _capabilities_of(ext.plugin)
            clash = [c.descriptor.ref for c in caps if c.descriptor.ref in capabilities]
            if clash:
                raise ValueError(f"capability {clash[0]} is already offered by another extension")
        except Exception as exc:  # its own code raised: skipped, the node goes on
            log.error("extension %s failed and is skipped: %r", ext.name, exc)
            records.append(ExtensionRecord(**base, status="failed", reason=f"{type(exc).__name__}: {exc}"[:500]))
            continue
        for cap in caps:
            capabilities[cap.descriptor.ref] = cap
        records.append(ExtensionRecord(**base, status="loaded", capabilities=tuple(c.descriptor.ref for c in caps)))
        log.info("extension %s loaded: %s", ext.name, ", ".join(c.descriptor.ref for c in caps) or "no capabilities")
    for name, reason in failures.items():
        dist, version = _dist(installed[name]) if name in installed else ("", "")
        records.append(ExtensionRecord(name=name, distribution=dist, version=version, status="failed", reason=reason))
    for name in missing:
        records.append(ExtensionRecord(name=name, status="missing", reason="named by the profile, not installed"))
    if names != "all":
        for name in sorted(set(installed) - set(names)):
            dist, version = _dist(installed[name])
            records.append(
                ExtensionRecord(
                    name=name,
                    distribution=dist,
                    version=version,
                    status="not_named",
                    reason="installed; not named by the profile's [plugins.providers] extensions",
                )
            )
    records.sort(key=lambda r: r.name)
    return Loaded(records=records, capabilities=capabilities)
