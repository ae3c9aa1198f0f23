"""The web dashboard: its built assets at `/` and `/ui/*`, and a push channel of State changes.

Pages live under `/ui/` (`/ui/topology`, `/ui/models`, `/ui/chat`, `/ui/instances`) so that no
page route can ever shadow an API route: `/models`, `/state` and `/instance/...` are API paths, and
new API routes will keep arriving. `/` itself serves the dashboard (browsers only: the Ollama
adapter answers its liveness text to clients that do not accept HTML).

The push channel is SSE at `GET /v1/events/stream`. Each message carries the whole `GET /state`
body plus liveness (how long since each node was heard, whether this node holds a session with it).
Pushing the state itself rather than a "changed" ping that makes the client refetch saves one round
trip per change and cannot race a second change between ping and fetch; the body of a small
cluster is a few KB (the e2e test prints the figure), and bursts of events are coalesced so a burst
costs one serialization per `MIN_GAP_S`, not one per event.

From another host the dashboard signs in with an API key ([hosts]): it asks `GET /v1/whoami` who
its key is (scope, name; loopback needs none) and sends the key in `Authorization` on every call,
the state stream included: the page reads the stream with `fetch` (EventSource cannot set headers),
so a key never travels in a URL, where access logs and browser history would keep it. The stream
takes an inference key too (what a chat user may see: nodes, instances, health), without the
key hashes of State's plugin data, and it ends once the key that opened it is revoked, so the page
reconnects, gets 401 and shows its sign-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from skulk_kernel.api import NodeSurface, State

from .auth import PLUGIN_DATA as KEYS_DATA
from .auth import KeyRing, current_key, is_loopback
from .state_view import state_view

TICK_S = 2.0  # telemetry (memory, heartbeats) changes without events: resend this often anyway
MIN_GAP_S = 0.1  # at most ten messages a second during a burst of events
PAGES = ("topology", "models", "chat", "instances", "observe", "integrations", "keys", "settings")
DIST_ENV = "SKULK_DASHBOARD_DIR"
REPO_DIST = Path(__file__).resolve().parents[4] / "dashboard" / "dist"

HOW_TO_BUILD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Skulk</title>
<style>body{{font:15px/1.5 system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#1d2330}}
code,pre{{background:#eef1f6;border-radius:6px;padding:.15rem .35rem}}pre{{padding:.75rem 1rem}}</style></head>
<body><h1>Skulk is running</h1>
<p>This node serves the API, but the web dashboard has not been built (no assets in
<code>{dist}</code>).</p>
<p>Build it once with Node.js 20+ and npm:</p>
<pre>cd dashboard &amp;&amp; npm ci &amp;&amp; npm run build</pre>
<p>or restart with <code>./skulk run</code>, which builds it when Node.js is present. Then reload this page.</p>
<p>The API works without it: <a href="/state">/state</a>, <a href="/docs">/docs</a>.</p>
</body></html>
"""


BUILDING = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Skulk</title><meta http-equiv="refresh" content="5">
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#1d2330}</style>
</head><body><h1>Skulk is running</h1>
<p>The web dashboard is being built beside the node (<code>npm ci</code>, <code>npm run build</code>: about a
minute the first time). This page reloads itself and shows the dashboard when the build is done.</p>
<p>The API works meanwhile: <a href="/state">/state</a>, <a href="/docs">/docs</a>.</p>
</body></html>
"""


def building(root: Path) -> bool:
    """`./skulk run` builds the dashboard beside the node and names its builder in this marker."""
    try:
        os.kill(int((root.parent / ".skulk-building").read_text().strip()), 0)
    except (OSError, ValueError):
        return False  # no marker, or its builder is gone (killed mid-build): not building
    return True


def dist_dir() -> Path:
    """Where the built assets are: `$SKULK_DASHBOARD_DIR`, else the checkout's `dashboard/dist`."""
    configured = os.environ.get(DIST_ENV)
    return Path(configured).expanduser() if configured else REPO_DIST


def liveness(node: NodeSurface, state: State) -> dict[str, dict[str, Any]]:
    """Per node: seconds since this node last heard it, and whether a transport session is live.

    Not in `/state`; the dashboard needs it to show a killed node as an error before the master's
    node timeout removes it.
    """
    reachable = node.reachable_nodes()
    members = set(state.topology.nodes) | node.readings.nodes()
    out: dict[str, dict[str, Any]] = {}
    for nid in sorted(members):
        heard = 0.0 if nid == node.node_id else node.readings.last_heard(nid)
        out[nid] = {"lastHeardS": None if heard is None else round(heard, 2), "reachable": nid in reachable}
    return out


def node_timeout_s(node: NodeSurface) -> float | None:
    """The master's prune timeout, when this node runs the master plugin (same config cluster-wide)."""
    value = getattr(node.plugin_config("master"), "node_timeout_s", None)
    return float(value) if isinstance(value, (int, float)) else None


def snapshot(node: NodeSurface, reason: str, seq: int) -> str:
    """One SSE message: the `/state` body plus liveness, as `event: state`."""
    body = {
        "seq": seq,
        "reason": reason,
        "sentAt": time.time(),
        "observerNodeId": node.node_id,
        "nodeTimeoutS": node_timeout_s(node),
        "liveness": liveness(node, node.state),
        "state": _without_key_hashes(state_view(node)),
    }
    return f"event: state\ndata: {json.dumps(body, separators=(',', ':'), default=str)}\n\n"


def _without_key_hashes(body: dict[str, Any]) -> dict[str, Any]:
    """The stream is open to inference keys: no API key records (hashes, names) in it."""
    data = body.get("pluginData")
    if isinstance(data, dict) and KEYS_DATA in data:
        body["pluginData"] = {k: v for k, v in data.items() if k != KEYS_DATA}
    return body


async def state_stream(
    node: NodeSurface, request: Request, keys: KeyRing | None = None, key_id: str | None = None
) -> AsyncIterator[str]:
    """A message now, then on every State change (coalesced) and every `TICK_S` for telemetry.

    Opened with a key (`key_id`), it ends as soon as that key is no longer in State (revoked)."""
    yield "retry: 1000\n\n"  # EventSource reconnects after a second when the node restarts
    seq, reason = 0, "initial"
    while not node.stopping:
        if keys is not None and key_id is not None and key_id not in keys.records():
            return  # revoked: the client's reconnect gets 401 and its sign-in page
        seen = node.state

        def changed(state: State, seen: State = seen) -> bool:
            return state is not seen  # apply() returns a new State object: identity says "changed"

        yield snapshot(node, reason, seq)
        seq, sent_at = seq + 1, time.monotonic()
        try:
            await node.wait_for(changed, TICK_S)
            reason = "change"
        except TimeoutError:
            reason = "tick"
        if await request.is_disconnected():
            return
        gap = MIN_GAP_S - (time.monotonic() - sent_at)
        if reason == "change" and gap > 0:
            await asyncio.sleep(gap)  # let the rest of a burst land in this one message


def _asset(root: Path, rel: str) -> Path | None:
    """A file under `root` (never outside it: `..` and absolute paths are refused)."""
    candidate = (root / rel).resolve()
    if root.resolve() not in candidate.parents or not candidate.is_file():
        return None
    return candidate


def add_dashboard_routes(app: FastAPI, node: NodeSurface) -> None:
    """`/` and `/ui/*` serve the dashboard (or how to build it); `/v1/events/stream` pushes State."""

    def index() -> Response:
        root = dist_dir()
        page = root / "index.html"
        if building(root):
            return HTMLResponse(BUILDING, status_code=200, headers={"cache-control": "no-cache"})
        if not page.is_file():
            return HTMLResponse(HOW_TO_BUILD.format(dist=root), status_code=200)
        return FileResponse(page, headers={"cache-control": "no-cache"})

    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return index()

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return index()

    @app.get("/ui/{rel:path}", include_in_schema=False)
    async def ui(rel: str) -> Response:
        first = rel.split("/", 1)[0]
        if first in PAGES or not rel:
            return index()  # SPA fallback: the client-side router draws the page
        found = _asset(dist_dir(), rel)
        if found is None:
            return JSONResponse(
                {
                    "error": {
                        "message": f"no dashboard asset {rel!r}",
                        "type": "not_found_error",
                        "param": None,
                        "code": "not_found",
                    }
                },
                status_code=404,
            )
        immutable = rel.startswith("assets/")  # Vite puts a content hash in these names
        return FileResponse(
            found, headers={"cache-control": "public, max-age=31536000, immutable" if immutable else "no-cache"}
        )

    keys = KeyRing(node)

    @app.get("/v1/whoami", tags=["keys"])
    async def whoami(request: Request) -> dict[str, Any]:
        """Who this caller is to the gate: the key's id, name and scope, or no key (loopback, an open
        API). The dashboard's sign-in asks it; an unknown or revoked key never gets here (401)."""
        key_id = current_key.get()
        record = keys.records().get(key_id) if key_id else None
        if record is not None:
            return {"scope": record.scope, "via": "key", "keyId": record.id, "name": record.name}
        client = request.client
        local = is_loopback((client.host, client.port) if client else None)
        return {"scope": "operator", "via": "loopback" if local else "open", "keyId": None, "name": None}

    @app.get("/v1/events/stream", include_in_schema=False)
    async def events_stream(request: Request) -> StreamingResponse:
        return StreamingResponse(
            state_stream(node, request, keys, current_key.get()),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
