"""The hook the master plugin declares: may the master sequence this command?

The master plugin adds this module through its `add_hookspecs` (plugin.py) and calls the hook for
every command before it becomes events (sequencer.py). Implement it with the kernel's marker
(``from skulk_kernel import hookimpl``); documented in docs/hooks.md under "Plugin master".
Elsewhere (a profile without the master plugin) an implementation is a hook nobody declares:
logged (DEBUG), never called.
"""

from __future__ import annotations

from skulk_kernel import hookspec
from skulk_kernel.api import Command, State

# ============================== decisions (first result wins) ====================================


@hookspec(firstresult=True)
def check_command(command: Command, state: State) -> str | None:
    """Veto a command before the master sequences it: return a reason string to refuse it.

    Called on the master for every command. The first non-None result refuses the command; with
    no implementation (or only None results) the master accepts it.
    """
