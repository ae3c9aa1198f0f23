"""HTTP answers from command outcomes: every control route answers what the master said, never a guess.

A route submits its command with `node.submit(command)` and passes the outcome here: an indexed
command goes on to the route's success body; a refused one becomes a 4xx carrying the master's
reason unchanged (404 for an id that does not exist, 503 when the cluster is still learning about
itself, 400 otherwise); no master, or no confirmation within the bound, is a 503 that says which.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from skulk_kernel.api import Outcome

# a placement of an unknown model stays 400 `unknown_model`, as the reference answers it
NOT_FOUND_KINDS = frozenset({"model_not_found", "instance_not_found", "not_found"})


def outcome_status(outcome: Outcome) -> int:
    """The HTTP status for an outcome (200 when it was indexed)."""
    if outcome.ok:
        return 200
    if outcome.status == "refused":
        if outcome.retryable:
            return 503
        if outcome.kind in NOT_FOUND_KINDS:
            return 404
        if outcome.kind == "vetoed":
            return 403
        if outcome.kind == "internal":
            return 503
        return 400
    return 503  # no_master, unconfirmed


def outcome_error(outcome: Outcome) -> JSONResponse | None:
    """None when the command was indexed; otherwise the error response that says why."""
    if outcome.ok:
        return None
    from .routes import error  # routes imports this module

    code = outcome.kind if outcome.status == "refused" and outcome.kind else outcome.status
    response = error(outcome_status(outcome), outcome.reason or f"the command was {outcome.status}", code)
    response.headers["x-skulk-command-id"] = outcome.command_id
    return response
