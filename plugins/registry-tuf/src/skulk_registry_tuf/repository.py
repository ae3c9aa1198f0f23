"""The signing side: create a registry (keys and root) and sign a directory of card files into it.

A registry directory holds two folders:

    keys/   one ed25519 private key per top-level role (PEM, PKCS#8, mode 0600): never serve it
    repo/   what an HTTP server serves: metadata/ and targets/

`repo/` uses consistent snapshots: `metadata/N.root.json`, `N.targets.json`, `N.snapshot.json` and
`timestamp.json`, targets under `targets/cards/<sha256>.<name>.toml`, so a client that reads while
`sign` writes always sees one whole version. Every `sign` bumps targets, snapshot and timestamp
and leaves older versions in place. Everything is done through python-tuf's Metadata API.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .cards import card_from_toml_text

ROLES = ("root", "targets", "snapshot", "timestamp")
#: default lifetimes: a timestamp that lapses is refused, so re-sign (or run `sign` from cron) before
DEFAULT_EXPIRY_S = {"root": 365 * 86400, "targets": 90 * 86400, "snapshot": 30 * 86400, "timestamp": 7 * 86400}
CARDS_PREFIX = "cards/"


class RegistryError(RuntimeError):
    """A registry directory that cannot be created or signed; the message says what to fix."""


def _expiry(seconds: float) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)


def _write_private_key(path: Path, pem: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def init_registry(directory: Path, root_expires_in_s: float = DEFAULT_EXPIRY_S["root"]) -> Path:
    """Generate one ed25519 key per role and sign version 1 of root; returns the root.json path.

    That root.json is what every node is configured with (`[plugins.registry-tuf] root`): it is the
    trust anchor, and later roots are accepted only when the current one signs them.
    """
    from securesystemslib.signer import CryptoSigner
    from tuf.api.metadata import Metadata, Root

    keys_dir, metadata_dir = directory / "keys", directory / "repo" / "metadata"
    if (metadata_dir / "1.root.json").exists() or (keys_dir.exists() and any(keys_dir.iterdir())):
        raise RegistryError(f"{directory} already holds a registry; use another directory")
    keys_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(keys_dir, 0o700)
    metadata_dir.mkdir(parents=True, exist_ok=True)
    (directory / "repo" / "targets").mkdir(exist_ok=True)
    root = Root(expires=_expiry(root_expires_in_s), consistent_snapshot=True)
    signers = {}
    for role in ROLES:
        signer = CryptoSigner.generate_ed25519()
        _write_private_key(keys_dir / f"{role}.pem", signer.private_bytes)
        root.add_key(signer.public_key, role)
        signers[role] = signer
    metadata = Metadata(root)
    metadata.sign(signers["root"])
    data = metadata.to_bytes()
    _atomic_write(metadata_dir / "1.root.json", data)
    _atomic_write(metadata_dir / "root.json", data)
    return metadata_dir / "root.json"


def _signer(directory: Path, root: Any, role: str) -> Any:
    """The role's key from keys/, paired with the public key root names for it."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    path = directory / "keys" / f"{role}.pem"
    try:
        private = load_pem_private_key(path.read_bytes(), None)
    except FileNotFoundError:
        raise RegistryError(f"{path} is missing: sign on the machine that ran `registry init`") from None
    for keyid in root.roles[role].keyids:
        public = root.keys[keyid]
        signer = CryptoSigner(private, public)  # type: ignore[arg-type]
        probe = signer.sign(b"probe")
        try:
            public.verify_signature(probe, b"probe")
        except Exception:
            continue
        return signer
    raise RegistryError(f"{path} is not a {role} key of this registry's root")


def _current_versions(metadata_dir: Path) -> dict[str, int]:
    """Versions signed so far (0 before the first `sign`), read through the timestamp chain."""
    from tuf.api.metadata import Metadata, Snapshot, Timestamp

    timestamp_path = metadata_dir / "timestamp.json"
    if not timestamp_path.exists():
        return {"targets": 0, "snapshot": 0, "timestamp": 0}
    timestamp = Metadata[Timestamp].from_bytes(timestamp_path.read_bytes()).signed
    snap_version = timestamp.snapshot_meta.version
    snapshot = Metadata[Snapshot].from_bytes((metadata_dir / f"{snap_version}.snapshot.json").read_bytes()).signed
    return {
        "targets": snapshot.meta["targets.json"].version,
        "snapshot": snapshot.version,
        "timestamp": timestamp.version,
    }


def card_files(cards_dir: Path) -> dict[str, Path]:
    """`cards/<name>.toml` -> file, for every card file directly in cards_dir (each must parse)."""
    if not cards_dir.is_dir():
        raise RegistryError(f"{cards_dir} is not a directory of card files")
    found = {}
    for path in sorted(cards_dir.glob("*.toml")):
        card_from_toml_text(path.read_text(), str(path))  # refuse to sign a card no node could read
        found[CARDS_PREFIX + path.name] = path
    if not found:
        raise RegistryError(f"{cards_dir} holds no *.toml card files")
    return found


def sign_cards(
    cards_dir: Path,
    directory: Path,
    *,
    expires_in_s: dict[str, float] | None = None,
) -> dict[str, int]:
    """Publish the card files as the next version: targets, snapshot and timestamp, each signed.

    Returns the new versions. `expires_in_s` overrides a role's lifetime in seconds (a negative
    timestamp lifetime signs an already expired timestamp: a drill for the client's refusal).
    """
    from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

    lifetimes = {**DEFAULT_EXPIRY_S, **(expires_in_s or {})}
    repo = directory / "repo"
    metadata_dir, targets_dir = repo / "metadata", repo / "targets"
    try:
        root = Metadata[Root].from_bytes((metadata_dir / "root.json").read_bytes()).signed
    except FileNotFoundError:
        missing = metadata_dir / "root.json"
        raise RegistryError(f"{missing} is missing: run `skulk-kernel registry init` first") from None
    files = card_files(cards_dir)
    versions = _current_versions(metadata_dir)

    targets = Targets(version=versions["targets"] + 1, expires=_expiry(lifetimes["targets"]))
    for target_path, source in files.items():
        info = TargetFile.from_file(target_path, str(source))
        targets.targets[target_path] = info
        digest = next(iter(info.hashes.values()))
        stored = targets_dir / CARDS_PREFIX / f"{digest}.{source.name}"
        stored.parent.mkdir(parents=True, exist_ok=True)
        if not stored.exists() or stored.read_bytes() != source.read_bytes():  # repairs a damaged copy
            tmp = stored.with_name(f".{stored.name}.tmp")
            shutil.copyfile(source, tmp)
            os.replace(tmp, stored)
    targets_md = Metadata(targets)
    targets_md.sign(_signer(directory, root, "targets"))
    _atomic_write(metadata_dir / f"{targets.version}.targets.json", targets_md.to_bytes())

    snapshot = Snapshot(
        version=versions["snapshot"] + 1,
        expires=_expiry(lifetimes["snapshot"]),
        meta={"targets.json": MetaFile(version=targets.version)},
    )
    snapshot_md = Metadata(snapshot)
    snapshot_md.sign(_signer(directory, root, "snapshot"))
    _atomic_write(metadata_dir / f"{snapshot.version}.snapshot.json", snapshot_md.to_bytes())

    timestamp = Timestamp(
        version=versions["timestamp"] + 1,
        expires=_expiry(lifetimes["timestamp"]),
        snapshot_meta=MetaFile(version=snapshot.version),
    )
    timestamp_md = Metadata(timestamp)
    timestamp_md.sign(_signer(directory, root, "timestamp"))
    _atomic_write(metadata_dir / "timestamp.json", timestamp_md.to_bytes())  # last: it publishes the rest
    return {"targets": targets.version, "snapshot": snapshot.version, "timestamp": timestamp.version}
