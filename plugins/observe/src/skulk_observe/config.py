"""Cluster-wide settings (`GET/PUT /config`), replicated through State.

A PUT on any node submits one `SetPluginData` command to the master, which indexes one
`PluginDataSet{plugin="observe", key="config.<name>"}` per setting: every node applies it in order, a late joiner gets
it in its snapshot, and a new master already holds it (it is in every node's State), so settings
survive a failover with nothing extra to do.

Secrets (names ending in `_token`, `_secret`, `_password` or `_api_key`) are never stored in
State: State is readable through `GET /state` and `/events` on every node. Only a salted scrypt
digest is replicated, so any node can check a presented value (`secret_matches`) and nobody can
read it back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from typing import Any

from skulk_kernel.api import CommandId, NodeSurface, PluginDataSet, SetPluginData, new_id

from . import PLUGIN

log = logging.getLogger("skulk.observe.config")

PREFIX = "config."
NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
SECRET_SUFFIXES = ("_token", "_secret", "_password", "_api_key")
MAX_VALUE_BYTES = 8192
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")


class ConfigError(ValueError):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


def is_secret(name: str) -> bool:
    return name.endswith(SECRET_SUFFIXES)


#: secrets a node must send on, not only check (the store's hub token): sealed with a key derived from
#: the cluster secret (AES-GCM), so State holds ciphertext that only the cluster's nodes can open
NODE_SECRETS = ("hub_token",)
SEAL_PURPOSE = "config-sealed-v1"


def cluster_key(node: NodeSurface) -> bytes | None:
    """This node's sealing key, from its cluster secret (None: it has none)."""
    from pathlib import Path

    try:
        from skulk_transport_zenoh.secret import SecretError, resolve_secret
    except ImportError:
        return None
    try:
        join = node.options.extra.get("join_token") if isinstance(node.options.extra, dict) else None
        return resolve_secret(Path(node.options.home), join, create=False).key(SEAL_PURPOSE)
    except (SecretError, OSError, ValueError):
        return None


def seal(key: bytes, name: str, value: str) -> dict[str, Any]:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, value.encode(), name.encode())
    return {"secret": True, "scheme": "aesgcm-cluster-v1", "nonce": nonce.hex(), "sealed": sealed.hex()}


def unseal(node: NodeSurface, name: str) -> str | None:
    """A sealed secret's value on a node of the cluster; None when unset, not sealed or not openable."""
    entry = current(node).get(name)
    key = cluster_key(node) if entry is not None and entry.get("scheme") == "aesgcm-cluster-v1" else None
    if entry is None or key is None:
        return None
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        data = AESGCM(key).decrypt(bytes.fromhex(entry["nonce"]), bytes.fromhex(entry["sealed"]), name.encode())
    except (InvalidTag, KeyError, ValueError):
        log.warning("config %s is sealed with another cluster's secret: ignored", name)
        return None
    return data.decode()


def _validate_known(name: str, value: Any) -> Any:
    """Settings this plugin acts on are typed; others are stored as given (plugins read them)."""
    if name == "log_level":
        if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
            raise ConfigError(name, f"log_level must be one of {', '.join(LOG_LEVELS)}")
        return value.upper()
    if name == "trace_ttl_s":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(name, "trace_ttl_s must be a positive number of seconds")
        return float(value)
    if name == "default_context_tokens":  # placements that name no context (api-control placement_defaults)
        if isinstance(value, bool) or not isinstance(value, int) or not 256 <= value <= 10_000_000:
            raise ConfigError(name, "default_context_tokens must be a whole number of tokens from 256 to 10000000")
        return value
    if name == "hub_endpoint":  # the store's next hub call on every node (skulk_store.hub.endpoint)
        if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
            raise ConfigError(name, "hub_endpoint must be an http(s) URL, e.g. https://huggingface.co or a mirror")
        return value.rstrip("/")
    if name == "default_kv_cache_type":
        if value not in KV_CACHE_TYPES:
            raise ConfigError(name, f"default_kv_cache_type must be one of {', '.join(KV_CACHE_TYPES)}")
        return value
    return value


def _digest(value: str, salt: bytes) -> str:
    return hashlib.scrypt(value.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32).hex()


def stored_value(node_id: str, name: str, value: Any) -> dict[str, Any] | None:
    """What goes into State for `name` = `value` (None deletes); ConfigError names a bad one."""
    if not NAME.match(name):
        raise ConfigError(name, f"setting name {name!r} must match {NAME.pattern}")
    if value is None:
        return None
    meta = {"setBy": node_id, "at": time.time()}
    if is_secret(name):
        if not isinstance(value, str) or not value:
            raise ConfigError(name, f"{name} is a secret and must be a non-empty string")
        salt = os.urandom(16)
        return {
            "secret": True,
            "scheme": "scrypt-n14-r8-p1",
            "salt": salt.hex(),
            "digest": _digest(value, salt),
            **meta,
        }
    value = _validate_known(name, value)
    if len(json.dumps(value)) > MAX_VALUE_BYTES:
        raise ConfigError(name, f"{name} is larger than {MAX_VALUE_BYTES} bytes of JSON")
    return {"value": value, **meta}


def current(node: NodeSurface) -> dict[str, dict[str, Any]]:
    """name -> the stored entry, as this node's State holds it."""
    data = node.state.plugin_data.get(PLUGIN, {})
    return {k[len(PREFIX) :]: v for k, v in data.items() if k.startswith(PREFIX) and isinstance(v, dict)}


def public_view(node: NodeSurface) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    updated = {}
    for name, entry in sorted(current(node).items()):
        settings[name] = {"secret": True, "set": True} if entry.get("secret") else entry.get("value")
        updated[name] = {"setBy": entry.get("setBy"), "at": entry.get("at")}
    return {"settings": settings, "updated": updated, "nodeId": node.node_id}


def get(node: NodeSurface, name: str, default: Any = None) -> Any:
    """A non-secret setting's value on this node (other plugins: import-guarded)."""
    entry = current(node).get(name)
    if entry is None or entry.get("secret"):
        return default
    return entry.get("value", default)


_VERIFIED: dict[tuple[str, str], bool] = {}  # (stored digest, sha256 of the presented value) -> match


def secret_matches(node: NodeSurface, name: str, presented: str) -> bool:
    """Whether `presented` is the secret `name` (constant-time compare of the digests).

    scrypt is slow on purpose; a value checked once is remembered (by its sha256, never in clear)
    so a caller may check on every request.
    """
    import hmac

    entry = current(node).get(name)
    if entry is None or not entry.get("secret") or "digest" not in entry:
        return False
    key = (entry["digest"], hashlib.sha256(presented.encode()).hexdigest())
    known = _VERIFIED.get(key)
    if known is None:
        known = hmac.compare_digest(_digest(presented, bytes.fromhex(entry["salt"])), entry["digest"])
        if len(_VERIFIED) > 1024:
            _VERIFIED.clear()
        _VERIFIED[key] = known
    return known


def events_for(node: NodeSurface, body: dict[str, Any]) -> list[PluginDataSet]:
    """Validate a whole PUT body first (all or nothing), then the events that carry it."""
    if not body:
        raise ConfigError("", 'the body must name at least one setting: {"log_level": "DEBUG"}')
    return [
        PluginDataSet(plugin=PLUGIN, key=PREFIX + name, value=_stored(node, name, value))
        for name, value in body.items()
    ]


def _stored(node: NodeSurface, name: str, value: Any) -> dict[str, Any] | None:
    if name not in NODE_SECRETS or value is None:
        return stored_value(node.node_id, name, value)
    if not isinstance(value, str) or not value:
        raise ConfigError(name, f"{name} is a secret and must be a non-empty string")
    key = cluster_key(node)
    if key is None:
        raise ConfigError(
            name,
            f"{name} is sealed with the cluster secret so that only nodes can read it, and this node has none "
            "(start the cluster with a join token), or set HF_TOKEN in each node's environment",
        )
    return {**seal(key, name, value), "setBy": node.node_id, "at": time.time()}


def command_for(events: list[PluginDataSet]) -> SetPluginData:
    """The one command that sets them all (the master answers it with an outcome)."""
    return SetPluginData(command_id=CommandId(new_id()), plugin=PLUGIN, entries=tuple((e.key, e.value) for e in events))


def apply_effects(node: NodeSurface, observer: Any) -> None:
    """Make the settings this plugin owns take effect on this node (idempotent)."""
    level = get(node, "log_level")
    if level in LOG_LEVELS:
        logging.getLogger().setLevel(level)
    ttl = get(node, "trace_ttl_s")
    observer.traces.ttl_s = float(ttl) if isinstance(ttl, int | float) else observer.config.trace_ttl_s
