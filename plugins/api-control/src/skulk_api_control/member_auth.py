"""Node-to-node HTTP calls authenticate as cluster members, never with an end user's key.

When one node calls another's API (the cluster diagnostics fan-out, a worker asking a store host to
fetch a model), it sends `X-Skulk-Member: <node id>.<unix time>.<HMAC>`: an HMAC-SHA256 over the
node id, the time, the method and the path, keyed from the cluster secret (purpose
`http-member-v1`, the same derivation as the transport's keys). The receiving node's gate accepts
it as operator scope when the MAC is right, the time is within `MAX_AGE_S` of its own clock and the
node id is a member it knows. A host without the secret cannot mint one (401); a token seen on the
wire opens only the same method and path, for a minute. A member is trusted this far because the
secret it holds already lets it speak on the control plane.

Nodes without a cluster secret (the local control plane of a single-node profile) send no token
and accept none: their callers are on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

from skulk_kernel.api import NodeSurface

log = logging.getLogger("skulk.api.member")

HEADER = "x-skulk-member"
MAX_AGE_S = 60.0
PURPOSE = "http-member-v1"


@cache
def _key_for(home: str, join_token: str | None) -> bytes | None:
    try:
        from skulk_transport_zenoh.secret import SecretError, resolve_secret
    except ImportError:
        return None
    try:
        return resolve_secret(Path(home), join_token, create=False).key(PURPOSE)
    except (SecretError, OSError, ValueError) as exc:
        log.info("no cluster secret for member calls (%s): node-to-node calls carry no member token", exc)
        return None


def member_key(node: NodeSurface) -> bytes | None:
    """This node's key for member tokens, from its cluster secret (None: it has none)."""
    return _key_for(str(node.options.home), node.options.extra.get("join_token"))


def _mac(key: bytes, node_id: str, stamp: int, method: str, path: str) -> str:
    message = f"{node_id}\n{stamp}\n{method.upper()}\n{path}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def mint(key: bytes, node_id: str, method: str, path: str, now: float | None = None) -> str:
    """A token for one request: `path` without its query, percent-decoded as the server sees it."""
    stamp = int(time.time() if now is None else now)
    return f"{node_id}.{stamp}.{_mac(key, node_id, stamp, method, path)}"


def check(key: bytes, token: str, method: str, path: str, now: float | None = None) -> str | None:
    """The member node id a token proves for this method and path, or None."""
    node_id, _, rest = token.strip().partition(".")
    stamp_text, _, mac = rest.partition(".")
    if not node_id or not stamp_text.isdigit() or not mac:
        return None
    stamp = int(stamp_text)
    if abs((time.time() if now is None else now) - stamp) > MAX_AGE_S:
        return None
    return node_id if hmac.compare_digest(_mac(key, node_id, stamp, method, path), mac) else None


def member_headers(node: NodeSurface, method: str, url_or_path: str) -> dict[str, str]:
    """The header a node sends on a call to another member's API (empty when it has no secret)."""
    key = member_key(node)
    if key is None:
        return {}
    path = unquote(urlsplit(url_or_path).path)
    return {HEADER: mint(key, node.node_id, method, path)}


def presented_member(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == HEADER.encode():
            return value.decode("latin-1")
    return None


def known_member(node: NodeSurface, node_id: str) -> bool:
    """A node this one holds a session with or has in its topology (never itself)."""
    if node_id == node.node_id:
        return False
    return node_id in node.reachable_nodes() or node_id in node.state.topology.nodes
