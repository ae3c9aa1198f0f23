"""HTTP routes: traces, cluster diagnostics beyond the summary, capture bundles, envelopes,
`/config` and `/metrics`. `GET /v1/diagnostics/cluster` itself stays in api-control (which calls
`diagnostics.cluster_view`); the `/v1/observe/local/*` routes are what the fan-outs ask peers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from skulk_api_control.openapi_body import body_schema
from skulk_api_control.outcomes import outcome_error
from skulk_kernel.api import NodeSurface

from . import OBSERVER
from . import config as cluster_config
from . import diagnostics as diag


class ConfigBody(BaseModel):
    """PUT /config: settings by name (GET /config lists them), e.g. `{"log_level": "DEBUG"}`."""

    model_config = ConfigDict(extra="allow")


def error(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": param,
                "code": code,
            }
        },
        status_code=status,
        headers={"x-should-retry": "false"} if status < 500 else {},
    )


def _headers(request: Request) -> dict[str, str]:
    return dict(request.headers)


def add_observe_routes(app: Any, node: NodeSurface) -> None:
    def observer() -> Any:
        return node.services.get(OBSERVER)

    # ------------------------------------------------------------------ traces

    @app.get("/v1/traces")
    async def list_traces(limit: int = 100) -> dict[str, Any]:
        """Trace ids recorded on this node, newest last."""
        obs = observer()
        ids = obs.traces.trace_ids()[-max(1, min(limit, 1000)) :] if obs else []
        return {"nodeId": node.node_id, "tracingEnabled": node.state.tracing_enabled, "traceIds": ids}

    @app.get("/v1/traces/{trace_id}")
    async def get_trace(trace_id: str, request: Request, format: str = "json") -> Any:
        if format not in ("json", "otlp", "chrome"):
            return error(400, "format must be json, otlp (OpenTelemetry JSON) or chrome (Perfetto)", param="format")
        trace = await diag.cluster_trace(node, trace_id, _headers(request))
        spans = trace["spans"]
        if not spans:
            hint = (
                "tracing is on: the id may be wrong or the trace expired"
                if node.state.tracing_enabled
                else 'tracing is off: turn it on with PUT /v1/tracing {"enabled": true} and repeat the request'
            )
            return error(404, f"no spans for trace {trace_id!r} on any node ({hint})", "trace_not_found")
        from .spans import to_chrome, to_otlp

        if format == "otlp":
            return to_otlp(trace_id, spans, trace["nodeNames"])
        if format == "chrome":
            return to_chrome(spans, trace["nodeNames"])
        return {**trace, "spans": [s.model_dump() for s in spans]}

    @app.get("/v1/observe/local/spans/{trace_id}")
    async def local_spans(trace_id: str) -> dict[str, Any]:
        return diag.local_spans(node, trace_id)

    @app.get("/v1/observe/local/timeline")
    async def local_timeline(since: float = 0.0) -> dict[str, Any]:
        return diag.local_timeline(node, since)

    @app.get("/v1/observe/local/envelopes")
    async def local_envelopes() -> dict[str, Any]:
        return diag.local_envelopes(node)

    # ------------------------------------------------------------------ diagnostics

    @app.get("/v1/diagnostics/cluster/timeline")
    async def cluster_timeline(request: Request, since: float = 0.0, limit: int = 1000) -> dict[str, Any]:
        """Every node's recent events and runner phase changes, merged into one ordered list."""
        return await diag.cluster_timeline(node, since, min(max(limit, 1), 10_000), _headers(request))

    @app.get("/v1/diagnostics/cluster/{node_id}")
    async def cluster_node(node_id: str, request: Request) -> Any:
        """One node's own `/v1/diagnostics/node`, fetched through this node."""
        status, body = await diag.proxy_node(node, node_id, _headers(request))
        if status != 200:
            return error(status, body["message"], "node_not_found" if status == 404 else "node_unreachable")
        return body

    @app.post("/v1/diagnostics/node/capture")
    async def capture() -> Response:
        """This node's capture bundle (tar.gz): logs, recorder, process tree, versions, State."""
        from .capture import build_bundle

        name, data = await asyncio.to_thread(build_bundle, node)
        return Response(
            data, media_type="application/gzip", headers={"content-disposition": f'attachment; filename="{name}"'}
        )

    @app.get("/v1/diagnostics/performance-envelopes")
    async def envelopes(request: Request) -> dict[str, Any]:
        return await diag.cluster_envelopes(node, _headers(request))

    # ------------------------------------------------------------------ config

    @app.get("/config")
    async def get_config() -> dict[str, Any]:
        return cluster_config.public_view(node)

    @app.put("/config", openapi_extra=body_schema(ConfigBody))
    async def put_config(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error(400, 'the body must be a JSON object of settings: {"log_level": "DEBUG"}', "invalid_json")
        try:  # in a thread: secrets are hashed with scrypt, which takes a while on purpose
            events = await asyncio.to_thread(cluster_config.events_for, node, body)
        except cluster_config.ConfigError as exc:
            return error(400, exc.message, "invalid_setting", exc.name or None)
        outcome = await node.submit(cluster_config.command_for(events))
        if (failure := outcome_error(outcome)) is not None:
            return failure
        return cluster_config.public_view(node)

    # ------------------------------------------------------------------ metrics

    @app.get("/metrics")
    async def metrics() -> Response:
        obs = observer()
        if obs is None:
            return error(503, "the observe plugin is not running on this node")
        if obs.metrics is None:
            from .metrics import NodeMetrics

            obs.metrics = NodeMetrics(node, obs)
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(obs.metrics.render(), media_type=CONTENT_TYPE_LATEST)
