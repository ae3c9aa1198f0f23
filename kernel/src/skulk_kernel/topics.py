"""Typed topics, each assigned to exactly one plane in code.

control: ordered per publisher, reliable, small. telemetry: last-write-wins readings.
data: node-addressed streams (chunks to the owning API node), never through the master.
"""

from __future__ import annotations

from enum import StrEnum


class Plane(StrEnum):
    CONTROL = "control"
    TELEMETRY = "telemetry"
    DATA = "data"


class Topic(StrEnum):
    COMMANDS = "commands"
    OUTCOMES = "outcomes"  # the master's answer to a command, addressed to its sender
    LOCAL_EVENTS = "local_events"
    GLOBAL_EVENTS = "global_events"
    ELECTION = "election"
    STATE_SYNC = "state_sync"
    READINGS = "readings"
    CHUNKS = "chunks"
    PROVIDER = "provider"  # capability call frames between nodes (skulk_providers); never in State

    @property
    def plane(self) -> Plane:
        return _PLANE_OF[self]


_PLANE_OF = {
    Topic.COMMANDS: Plane.CONTROL,
    Topic.OUTCOMES: Plane.CONTROL,
    Topic.LOCAL_EVENTS: Plane.CONTROL,
    Topic.GLOBAL_EVENTS: Plane.CONTROL,
    Topic.ELECTION: Plane.CONTROL,
    Topic.STATE_SYNC: Plane.CONTROL,
    Topic.READINGS: Plane.TELEMETRY,
    Topic.CHUNKS: Plane.DATA,
    Topic.PROVIDER: Plane.DATA,
}
