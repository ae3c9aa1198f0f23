"""The master's memory of the outcomes it gave this session, so a command sent again gets the same one.

Senders re-send a command under its id until they hear its outcome (`skulk_kernel.outcomes`); the
master answers a repeat from here instead of deciding it again. A new session starts empty: what
the previous master indexed is in State, and every rule of `decide()` is idempotent by command id.
"""

from __future__ import annotations

from collections import OrderedDict

from skulk_kernel.api import Outcome


class AnsweredCommands:
    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._outcomes: OrderedDict[str, Outcome] = OrderedDict()

    def get(self, command_id: str) -> Outcome | None:
        return self._outcomes.get(command_id)

    def remember(self, outcome: Outcome) -> None:
        self._outcomes[outcome.command_id] = outcome
        self._outcomes.move_to_end(outcome.command_id)
        while len(self._outcomes) > self._limit:
            self._outcomes.popitem(last=False)

    def clear(self) -> None:
        self._outcomes.clear()
