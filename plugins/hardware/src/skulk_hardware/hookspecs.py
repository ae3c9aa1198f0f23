"""The hook the hardware plugin declares: does this machine meet a plugin's needs?

The hardware plugin adds this module through its `add_hookspecs` (plugin.py) and calls the hook
when it composes a profile for this machine (compose.py, the `auto` profile). Implement it with the
kernel's marker (``from skulk_kernel import hookimpl``); documented in docs/hooks.md under
"Plugin hardware". Elsewhere an implementation is a hook nobody declares: logged (DEBUG), never called.
"""

from __future__ import annotations

from typing import Any

from skulk_kernel import hookspec

# ============================== composition ======================================================


@hookspec
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """Does this machine meet this plugin's needs? ``(fits, why)`` in a few words, or None.

    Called by the hardware plugin's composer in the CLI process, before a node starts on a profile
    that names a composer (`auto`, the default of `skulk-kernel run`) and for `skulk-kernel profile
    show auto`: once per installed plugin, in the profile's order. ``facts`` is what every installed
    plugin's ``probe_node`` wrote (``engine_builds``, ``hardware``, ``derived_backends``); ``chosen``
    the plugins already in, in order. Results are collected per plugin: each implementation answers
    for its own plugin only. None, or no implementation, means "in when the profile lists it".
    """
