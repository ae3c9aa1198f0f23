"""The requests this node's API ended lately, so a cancel that races a request's own end is answered
as done rather than 404.

A client that stops a stream sends `POST /v1/cancel/{id}` and drops the connection at once (the
dashboard's Stop does both, so the runner stops even behind a proxy that keeps the upstream
connection open). The two reach the node on different connections in either order; when the drop
wins, the request has ended and left State before the cancel is read. The client's intent holds
either way, so the cancel answers 200 with `"ended": true`. An id this node never served stays 404.
"""

from __future__ import annotations

from collections import OrderedDict

from skulk_kernel.api import NodeSurface, ServiceKey

#: how many ended command ids a node remembers (about 40 bytes each)
LIMIT = 4096


class EndedRequests:
    """A bounded, insertion-ordered set of command ids: the oldest is forgotten first."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, *command_ids: str) -> None:
        for command_id in command_ids:
            self._ids[command_id] = None
            self._ids.move_to_end(command_id)
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)

    def __contains__(self, command_id: object) -> bool:
        return command_id in self._ids


ENDED_REQUESTS: ServiceKey[EndedRequests] = ServiceKey("api-control.ended-requests")


def ended_requests(node: NodeSurface) -> EndedRequests:
    """This node's memory of ended requests (published on first use)."""
    found = node.services.get(ENDED_REQUESTS)
    return found if found is not None else node.services.publish(ENDED_REQUESTS, EndedRequests())
