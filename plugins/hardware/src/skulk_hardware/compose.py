"""The `auto` profile, composed for this machine: every installed plugin whose needs it meets.

Why here: which engines a node can serve follows from its hardware facts, which this plugin owns
(``probe_node``); the kernel only calls ``compose_profile`` for a profile that names a composer.
The profile's own ``plugins`` list is the candidates in load order; every other installed plugin is
considered after them. Each plugin says whether the machine meets its needs (the ``plugin_fits``
hook); a listed plugin that says nothing is in. The verdicts become the profile's ``notes``, which
`skulk-kernel profile show auto` prints, one line per installed plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import metadata
from typing import Any

import pluggy
from pydantic import BaseModel, ConfigDict
from skulk_kernel.api import (
    GuardedHooks,
    Profile,
    installed_plugins,
    kernel_version,
    new_plugin_manager,
    register_plugin,
)

log = logging.getLogger("skulk.hardware.compose")
LISTED = "listed by the profile; needs nothing of the machine"
Fits = Callable[..., "tuple[bool, str] | None"]


class Verdict(BaseModel):
    """One installed (or listed) plugin: in or out of the composed profile, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    plugin: str
    fits: bool
    reason: str

    def line(self) -> str:
        return f"{'in ' if self.fits else 'out'}  {self.plugin:<18} {self.reason}"


def decide(
    candidates: tuple[str, ...],
    installed: set[str],
    broken: dict[str, str],
    fits: dict[str, Fits],
    facts: dict[str, Any],
) -> list[Verdict]:
    """Pure: the verdict for each candidate (in order), then for each other installed plugin."""
    order = list(candidates) + sorted(installed - set(candidates))
    chosen: list[str] = []
    found: list[Verdict] = []
    for name in order:
        listed = name in candidates
        if name not in installed:
            verdict = Verdict(plugin=name, fits=False, reason=f"not installed (pip install skulk-{name})")
        elif name in broken:
            verdict = Verdict(plugin=name, fits=False, reason=broken[name])
        else:
            answer: tuple[bool, str] | None = None
            if name in fits:
                try:
                    answer = fits[name](facts=facts, chosen=list(chosen))
                except Exception as exc:  # a plugin's check must not stop the node from starting
                    answer = (False, f"its plugin_fits raised {exc!r}")
            if answer is None:
                why = "not listed by the profile and says nothing of its needs (plugin_fits)"
                answer = (True, LISTED) if listed else (False, why)
            verdict = Verdict(plugin=name, fits=answer[0], reason=answer[1])
        if verdict.fits:
            chosen.append(name)
        found.append(verdict)
    return found


def load_installed(installed: dict[str, Any]) -> tuple[pluggy.PluginManager, dict[str, str]]:
    """Every installed plugin the running kernel accepts, in one manager; {plugin: why it is out}."""
    pm = new_plugin_manager()
    broken: dict[str, str] = {}
    running = kernel_version()
    entry_points = {ep.name: ep for ep in metadata.entry_points(group="skulk.plugins")}  # one scan, not one each
    for name, info in sorted(installed.items()):
        if not info.kernel_compatible(running):
            broken[name] = f"needs skulk-kernel{info.kernel_range} (running {running})"
            continue
        try:
            register_plugin(pm, entry_points[name].load(), name)
        except Exception as exc:  # an import error leaves that plugin out, with the error as its reason
            broken[name] = f"does not load: {exc!r}"[:240]
    return pm, broken


def compose_profile(profile: Profile) -> Profile:
    """The profile with `plugins` picked for this machine, config of left-out plugins dropped."""
    installed = installed_plugins()
    pm, broken = load_installed(installed)
    facts: dict[str, Any] = {"node_id": "compose", "offline": True}
    GuardedHooks(pm).call("probe_node", facts=facts)
    caller = getattr(pm.hook, "plugin_fits", None)
    fits = {impl.plugin_name: impl.function for impl in (caller.get_hookimpls() if caller else [])}
    verdicts = decide(profile.plugins, set(installed), broken, fits, facts)
    chosen = tuple(v.plugin for v in verdicts if v.fits)
    log.debug("profile %s composed: %s", profile.name, ", ".join(chosen))
    config = {name: table for name, table in profile.plugin_config.items() if name in chosen}
    return profile.model_copy(
        update={"plugins": chosen, "plugin_config": config, "notes": tuple(v.line() for v in verdicts)}
    )
