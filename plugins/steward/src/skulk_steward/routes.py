"""GET /v1/steward, POST /v1/steward/proposals (operator), approve and reject (operator).

The auth gate of api-control gives every route outside the inference list the operator scope, so
these routes need no check of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from skulk_kernel.api import NodeSurface

from . import proposals
from .config import STEWARD

if TYPE_CHECKING:
    from .service import StewardService


def _refused(exc: proposals.ProposalRefused) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": exc.message, "type": "invalid_request_error", "param": None, "code": exc.code}},
        status_code=exc.status,
        headers={"x-should-retry": "false"} if exc.status < 500 else None,
    )


def add_steward_routes(app: FastAPI, node: NodeSurface) -> None:
    def service() -> StewardService:
        return node.services.require(STEWARD)

    @app.get("/v1/steward", tags=["steward"])
    async def steward_status() -> Any:
        """The steward's status, model, last canary and proposals."""
        return service().status()

    @app.post("/v1/steward/proposals", tags=["steward"])
    async def steward_propose(request: Request) -> Any:
        """Record a proposal by hand (the steward's propose_action tool does the same)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("action"), dict):
            return _refused(
                proposals.ProposalRefused(400, 'body must be {"action": {"kind": ...}, "rationale"?}', "invalid_body")
            )
        try:
            action = proposals.Action.model_validate(body["action"])
        except ValidationError as exc:
            return _refused(
                proposals.ProposalRefused(400, f"invalid action: {exc.errors()[0]['msg']}", "invalid_action")
            )
        try:
            proposal = service().propose(action, str(body.get("rationale", "")))
        except proposals.ProposalRefused as exc:
            return _refused(exc)
        return JSONResponse(proposal.model_dump(mode="json"), status_code=201)

    async def decide(pid: str, approve: bool, request: Request) -> Any:
        by = request.headers.get("x-skulk-operator") or (request.client.host if request.client else "operator")
        try:
            return await service().decide(pid, approve, by)
        except proposals.ProposalRefused as exc:
            return _refused(exc)

    @app.post("/v1/steward/proposals/{pid}/approve", tags=["steward"])
    async def steward_approve(pid: str, request: Request) -> Any:
        """Approve a pending proposal (operator scope); the master runs it once."""
        return await decide(pid, True, request)

    @app.post("/v1/steward/proposals/{pid}/reject", tags=["steward"])
    async def steward_reject(pid: str, request: Request) -> Any:
        return await decide(pid, False, request)
