"""API keys, scopes and quotas for the node's HTTP app: one ASGI middleware in front of every route,
WebSockets included (a socket's handshake is judged as a GET; refused, it is closed before it
completes, which the client sees as a 403), so no plugin's socket can forget to check keys.

* Who may call: a request from loopback needs no key (the README's commands keep working); one
  from another host needs a key, unless the operator opened the API on purpose
  (``[plugins.api-control] open = true``, logged loudly at start).
* Keys: ``skulk-<id>-<secret>``, shown once at creation; State holds only ``sha256(key)`` (keys are
  256-bit random, so a slow password hash would add nothing but latency). They live in the
  replicated State as ``PluginDataSet(plugin="api-keys")`` events, set by a ``SetPluginData``
  command the API node submits and the master indexes (the route answers with its outcome):
  created or revoked on one node, in force on every node as soon as the event is applied.
  Scopes: ``inference`` (the model APIs) and ``operator`` (everything, control routes included).
* Quotas: ``tokens_per_min`` per key, cluster-wide: see quota.py.
* Errors are the provider-native body of the API the path belongs to (errors.py).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.api import NodeSurface

from .errors import api_error
from .vision_wire import ImageLimits

log = logging.getLogger("skulk.api.auth")

PLUGIN_DATA = "api-keys"
Scope = Literal["inference", "operator"]
Scope_ = dict[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope_, Receive, Send], Awaitable[None]]

# the key id of the request being served (quota.py counts tokens against it)
current_key: ContextVar[str | None] = ContextVar("skulk_api_key", default=None)


class ApiControlConfig(ImageLimits):
    """`[plugins.api-control]` in a profile (the `images_*` keys: vision_wire.ImageLimits)."""

    model_config = ConfigDict(extra="forbid")
    open: bool = Field(
        default=False, description="serve every host without a key (logged loudly at start): for a trusted LAN only"
    )
    loopback_needs_key: bool = Field(default=False, description="require keys from 127.0.0.1 too")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="largest request body")
    max_json_depth: int = Field(default=64, ge=4, description="deepest nesting of a JSON body")
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, description="largest request head (all headers)")
    client_timeout_s: float = Field(
        default=30.0, gt=0, description="a client that sends nothing for this long is dropped"
    )
    max_resumes: int = Field(
        default=2, ge=0, description="times one generation may continue on another instance after its node died"
    )
    prefix_affinity: bool = Field(default=True, description="keep a conversation on the instance that cached it")
    affinity_slack: int = Field(
        default=1, ge=0, description="open tasks an affine instance may have over the least-loaded one"
    )


class KeyRecord(BaseModel):
    """What State keeps of a key: never the key, only its hash."""

    model_config = ConfigDict(extra="ignore")
    id: str
    name: str
    scope: Scope = "inference"
    tokens_per_min: int | None = None
    sha256: str
    created_at: float = 0.0


class NewKey(BaseModel):
    """POST /v1/keys."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    scope: Scope = "inference"
    tokens_per_min: int | None = Field(default=None, ge=1)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """(key id, the key). The id is public (lists, logs); the key is shown once."""
    key_id = secrets.token_hex(4)
    return key_id, f"skulk-{key_id}-{secrets.token_urlsafe(32)}"


class KeyRing:
    """The keys in this node's State, indexed by hash; rebuilt when State's plugin data changes."""

    def __init__(self, node: NodeSurface) -> None:
        self.node = node
        self._source: Any = None
        self._by_hash: dict[str, KeyRecord] = {}

    def records(self) -> dict[str, KeyRecord]:
        data = self.node.state.plugin_data.get(PLUGIN_DATA, {})
        if data is not self._source:
            records = {}
            for key_id, raw in data.items():
                try:
                    records[key_id] = KeyRecord.model_validate(raw)
                except ValueError:
                    log.warning("ignoring a malformed API key record %r in State", key_id)
            self._by_hash = {r.sha256: r for r in records.values()}
            self._source = data
        return {r.id: r for r in self._by_hash.values()}

    def find(self, presented: str) -> KeyRecord | None:
        self.records()
        digest = hash_key(presented)
        record = self._by_hash.get(digest)
        return record if record is not None and hmac.compare_digest(record.sha256, digest) else None


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """`Authorization: Bearer <key>` or `x-api-key: <key>` (what the OpenAI/Anthropic SDKs send)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
    return None


_INFERENCE_POST = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/tokenize",  # vLLM's tokenizer routes: clients of the inference API (lm-eval's remote tokenizer)
    "/detokenize",
    "/tokenizer_info",
    "/v1/responses",
    "/responses",
    "/v1/embeddings",
    "/embeddings",
    "/v1/rerank",  # reranking (Jina/Cohere/vLLM shapes) and vLLM's score API
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/v1/messages",
    "/v1/audio/",
    "/audio/",
    "/v1/realtime",  # the realtime WebSocket (speech): transcription and the voice loop
)
_OLLAMA_INFERENCE = ("/api/chat", "/api/generate", "/api/embed", "/api/tags", "/api/show", "/api/ps", "/api/version")
_DASHBOARD_READ = ("/v1/whoami", "/v1/events/stream")  # a signed-in chat user's dashboard (dashboard.py)
_PUBLIC = ("/", "/ui", "/ui/", "/favicon.ico", "/health", "/v1/health")  # /health: probes carry no key


def route_scope(method: str, path: str) -> Scope | None:
    """The scope a route needs: None for the dashboard's static files, which hold no data."""
    if method in ("GET", "HEAD") and (path in _PUBLIC or path.startswith("/ui/")):
        return None
    if path.startswith("/store/peer/"):
        # Node to node: the store checks membership itself (a grant goes to a member's data-plane
        # stream; files need that grant's token in Authorization, which is not an API key).
        return None
    if path.startswith(_OLLAMA_INFERENCE):
        return "inference"
    if path.startswith(_INFERENCE_POST):
        return "inference"
    if path.startswith(("/v1/files", "/v1/batches")):  # the Batch API (plugin batch): every method
        return "inference"
    if method in ("GET", "HEAD") and (path.startswith("/v1/models") or path == "/v1/audio/voices"):
        return "inference"
    if method == "GET" and path in _DASHBOARD_READ:
        return "inference"
    return "operator"


def is_loopback(client: tuple[str, int] | None) -> bool:
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


class AuthGate:
    """ASGI middleware: who may call what; quotas before the route runs; nothing after it."""

    def __init__(self, app: ASGIApp, node: NodeSurface, config: ApiControlConfig, meter: Any) -> None:
        self.app = app
        self.node = node
        self.config = config
        self.keys = KeyRing(node)
        self.meter = meter
        self.denied = 0

    async def __call__(self, scope: Scope_, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        socket = scope["type"] == "websocket"  # the same rules: a socket's handshake is a GET
        path, method = scope.get("path", "/"), scope.get("method", "GET")
        needed = route_scope(method, path)
        presented = presented_key(scope.get("headers", []))
        record = self.keys.find(presented) if presented else None
        local = is_loopback(scope.get("client")) and not self.config.loopback_needs_key
        refusal: tuple[int, str, str] | None = None
        member_token, member = self._member(scope, method, path)
        if needed is not None and not local and not self.config.open and member is None:
            if member_token:
                refusal = (
                    401,
                    "this member token is not valid (another cluster's secret, too old, or for another route)",
                    "invalid_member_token",
                )
            elif presented is None:
                refusal = (
                    401,
                    "an API key is required from this address: send `Authorization: Bearer <key>` "
                    "(create one on a cluster node with `skulk-kernel keys create --name NAME`)",
                    "missing_api_key",
                )
            elif record is None:
                refusal = (401, "this API key is not valid (unknown or revoked)", "invalid_api_key")
            elif needed == "operator" and record.scope != "operator":
                refusal = (
                    403,
                    f"key {record.id!r} has scope {record.scope!r}; {method} {path} needs an operator "
                    "key (skulk-kernel keys create --scope operator)",
                    "insufficient_scope",
                )
        if socket:
            if refusal is not None:  # closed before the handshake completes: the client sees a 403
                self.denied += 1
                await send({"type": "websocket.close", "code": 1008, "reason": refusal[1][:120]})
                return
        elif refusal is None and record is not None and record.tokens_per_min and needed == "inference":
            retry = self.meter.retry_after(record)
            if retry is not None:
                refusal = (
                    429,
                    f"key {record.id!r} used its {record.tokens_per_min} tokens per minute; retry in {retry} s",
                    "rate_limit_exceeded",
                )
                await api_error(path, 429, refusal[1], refusal[2], headers={"retry-after": str(retry)})(
                    scope, receive, send
                )
                return
        if refusal is not None:
            self.denied += 1
            status, message, code = refusal
            await api_error(path, status, message, code)(scope, receive, send)
            return
        token = current_key.set(record.id if record is not None else None)
        try:
            await self.app(scope, receive, send)
        finally:
            current_key.reset(token)

    def _member(self, scope: Scope_, method: str, path: str) -> tuple[bool, str | None]:
        """(a member token was sent, the member it proves): node-to-node calls (member_auth.py)."""
        from .member_auth import check, known_member, member_key, presented_member

        token = presented_member(scope.get("headers", []))
        if token is None:
            return False, None
        key = member_key(self.node)
        node_id = check(key, token, method, path) if key is not None else None
        return True, node_id if node_id is not None and known_member(self.node, node_id) else None


def add_key_routes(app: Any, node: NodeSurface, keys: KeyRing, meter: Any) -> None:
    """POST/GET /v1/keys, DELETE /v1/keys/{id}: operator routes (the gate checks the scope)."""
    from fastapi.responses import JSONResponse
    from pydantic import ValidationError
    from skulk_kernel.api import CommandId, SetPluginData, new_id

    from .openapi_body import body_schema
    from .outcomes import outcome_error
    from .routes import error, json_body

    def _set_key(key_id: str, value: dict[str, Any] | None) -> SetPluginData:
        return SetPluginData(command_id=CommandId(new_id()), plugin=PLUGIN_DATA, entries=((key_id, value),))

    def view(record: KeyRecord) -> dict[str, Any]:
        return {
            "id": record.id,
            "name": record.name,
            "scope": record.scope,
            "tokens_per_min": record.tokens_per_min,
            "created_at": record.created_at,
            "tokens_last_minute": meter.used(record.id),
        }

    @app.post("/v1/keys", tags=["keys"], openapi_extra=body_schema(NewKey))
    async def create_key(request: Request) -> Any:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            wanted = NewKey.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return error(400, f"{where}: {first['msg']}", "invalid_key_request", where)
        key_id, key = new_key()
        record = KeyRecord(
            id=key_id,
            name=wanted.name,
            scope=wanted.scope,
            tokens_per_min=wanted.tokens_per_min,
            sha256=hash_key(key),
            created_at=time.time(),
        )
        outcome = await node.submit(_set_key(key_id, record.model_dump()))
        if (failure := outcome_error(outcome)) is not None:
            return failure
        log.warning("API key %s (%s, scope %s) created", key_id, wanted.name, wanted.scope)
        return {**view(record), "key": key, "note": "shown once: store it now"}

    @app.get("/v1/keys", tags=["keys"])
    async def list_keys() -> Any:
        return {"keys": [view(r) for r in sorted(keys.records().values(), key=lambda r: r.created_at)]}

    @app.delete("/v1/keys/{key_id}", tags=["keys"])
    async def revoke_key(key_id: str) -> Any:
        record = keys.records().get(key_id) or next((r for r in keys.records().values() if r.name == key_id), None)
        if record is None:
            return error(404, f"no API key {key_id!r} (skulk-kernel keys list)", "key_not_found", "key_id")
        if (failure := outcome_error(await node.submit(_set_key(record.id, None)))) is not None:
            return failure
        log.warning("API key %s (%s) revoked", record.id, record.name)
        return {"revoked": record.id, "name": record.name}


def install_auth(app: Any, node: NodeSurface) -> None:
    """The one call build_app makes: hardening, key routes and the gate, outermost."""
    from .hardening import Hardening
    from .quota import meter_for

    config = node.plugin_config("api-control") or ApiControlConfig()
    meter = meter_for(node)
    gate_keys = KeyRing(node)
    add_key_routes(app, node, gate_keys, meter)
    app.add_middleware(Hardening, config=config)  # inner: runs after the gate let the request in
    app.add_middleware(AuthGate, node=node, config=config, meter=meter)
    if config.open:
        log.warning(
            "API IS OPEN ([plugins.api-control] open = true): every host that reaches %s:%d may use every "
            "route, control routes included, without a key",
            node.options.api_host,
            node.options.api_port,
        )
    else:
        log.info("API keys required from other hosts (loopback %s)", "too" if config.loopback_needs_key else "exempt")
