"""The cluster secret: who is a member. Every key the transport uses is derived from it.

Where a node finds its secret, first match wins:

1. ``NodeOptions.extra["join_token"]`` (what a future ``--join TOKEN`` flag sets);
2. ``$SKULK_JOIN_TOKEN``;
3. ``<data dir>/join-token``: a file holding a token (how another machine joins for good);
4. ``<data dir>/cluster.secret``;
5. the per-user default ``~/.skulk/cluster.secret``, created (0600) on first start and its join
   token printed once. Nodes of one user on one host share it, so the README's commands (several
   nodes with ``--home`` each) form one cluster with no typing.

A join token is the secret itself, base64url, with a 4-byte checksum so a typo is caught at start:
``skulk1-<43 chars>-<8 hex>``. Whoever holds it is a member: treat it like a password.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("skulk.transport.zenoh.secret")

ENV_JOIN_TOKEN = "SKULK_JOIN_TOKEN"
SECRET_FILE = "cluster.secret"
TOKEN_FILE = "join-token"
TOKEN_PREFIX = "skulk1-"
SECRET_BYTES = 32


class SecretError(ValueError):
    """A token or secret file that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class ClusterSecret:
    """The secret and where it came from (`source` is shown in logs, never the secret)."""

    secret: bytes
    source: str
    created: bool = False

    @property
    def token(self) -> str:
        return encode_token(self.secret)

    @property
    def cluster_id(self) -> str:
        """A public fingerprint: tells clusters apart in hellos and logs, reveals nothing."""
        return derive(self.secret, "cluster-id").hex()[:16]

    def key(self, purpose: str) -> bytes:
        return derive(self.secret, purpose)


def derive(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for one purpose (HKDF-expand, one block, with SHA-256)."""
    prk = hmac.new(b"skulk-cluster-secret-v1", secret, hashlib.sha256).digest()
    return hmac.new(prk, purpose.encode() + b"\x01", hashlib.sha256).digest()


def encode_token(secret: bytes) -> str:
    body = base64.urlsafe_b64encode(secret).rstrip(b"=").decode()
    return f"{TOKEN_PREFIX}{body}-{hashlib.sha256(secret).hexdigest()[:8]}"


def decode_token(token: str) -> bytes:
    token = token.strip()
    if not token.startswith(TOKEN_PREFIX):
        raise SecretError(f"a join token starts with {TOKEN_PREFIX!r} (print one with `skulk-kernel cluster token`)")
    body, sep, check = token[len(TOKEN_PREFIX) :].rpartition("-")
    try:
        secret = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)) if sep else b""
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES or not hmac.compare_digest(hashlib.sha256(secret).hexdigest()[:8], check):
        raise SecretError("the join token is damaged (copy it again from `skulk-kernel cluster token`)")
    return secret


def user_default_dir() -> Path:
    return Path.home() / ".skulk"


def _read_secret_file(path: Path) -> bytes:
    raw = path.read_bytes().strip()
    if raw.startswith(TOKEN_PREFIX.encode()):
        return decode_token(raw.decode())
    try:
        secret = bytes.fromhex(raw.decode())
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise SecretError(f"{path} does not hold a cluster secret (64 hex digits); delete it or put a join token in it")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("%s is readable by others (mode %o): chmod 600 it", path, mode)
    return secret


def _create_secret_file(path: Path) -> bool:
    """Write a fresh secret atomically (0600); False when another process created it first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_bytes(SECRET_BYTES).hex() + "\n")
        try:
            os.link(tmp, path)  # atomic and refuses to replace: concurrent first starts agree
            return True
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def resolve_secret(home: Path | None = None, join_token: str | None = None, create: bool = True) -> ClusterSecret:
    """This node's cluster secret (see the module docstring for the order)."""
    if join_token:
        return ClusterSecret(decode_token(join_token), "--join")
    if env := os.environ.get(ENV_JOIN_TOKEN, "").strip():
        return ClusterSecret(decode_token(env), f"${ENV_JOIN_TOKEN}")
    dirs = [home] if home is not None else []
    for directory in dirs:
        token_file = directory / TOKEN_FILE
        if token_file.is_file():
            return ClusterSecret(decode_token(token_file.read_text()), str(token_file))
        secret_file = directory / SECRET_FILE
        if secret_file.is_file():
            return ClusterSecret(_read_secret_file(secret_file), str(secret_file))
    default = user_default_dir() / SECRET_FILE
    created = False
    if not default.is_file():
        if not create:
            raise SecretError(f"no cluster secret yet ({default} is created by the first `skulk-kernel run`)")
        created = _create_secret_file(default)
    for _ in range(50):  # another process may be between link() and its write becoming visible
        try:
            return ClusterSecret(_read_secret_file(default), str(default), created)
        except SecretError:
            if created:
                raise
            time.sleep(0.02)
    return ClusterSecret(_read_secret_file(default), str(default), created)


def announce_new_secret(cluster: ClusterSecret) -> None:
    """Print the join token once, when this node created the cluster's secret."""
    if not cluster.created:
        return
    banner = (
        f"created a new cluster secret in {cluster.source} (mode 600).\n"
        f"    Join token (shown once; `skulk-kernel cluster token` shows it again):\n\n"
        f"        {cluster.token}\n\n"
        f"    On another machine: SKULK_JOIN_TOKEN=<token> skulk-kernel run ..., or put the token in\n"
        f"    <its data dir>/{TOKEN_FILE}. Nodes of this user on this host need nothing."
    )
    log.warning("%s", banner)
