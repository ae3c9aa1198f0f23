"""The verifying side: one refresh of a registry through python-tuf's ngclient, and what it refused.

`fetch_cards` runs the whole TUF client workflow (root -> timestamp -> snapshot -> targets, each
signature, version and expiry checked by `tuf.ngclient.Updater`), then downloads every card target
and checks its length and hashes. Either everything verifies and the caller gets all the cards, or
it raises `Refused` with a code that says which way the repository failed; there is no partial
catalog. Metadata is cached under `cache_dir/metadata` (the Updater's own cache: it is what makes
a rollback detectable across restarts) and card files under `cache_dir/targets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .repository import CARDS_PREFIX

SOCKET_TIMEOUT_S = 10
MAX_DETAIL = 300  # characters of a library's message kept in a health note


class Refused(Exception):
    """The registry was not used this time; `code` is the health code, the message the reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Fetched:
    """A fully verified registry version."""

    cards: dict[str, bytes]  # target path -> card file bytes
    targets_metadata: bytes  # the signed targets.json the cards were verified against
    version: int  # the targets version


def classify(exc: BaseException) -> Refused:
    """Map python-tuf's (and urllib3's) exceptions to the refusal an operator can act on."""
    import urllib3
    from tuf.api import exceptions as tuf_errors

    if isinstance(exc, Refused):
        return exc
    detail = str(exc) or type(exc).__name__
    if exc.__cause__ is not None:  # e.g. SlowRetrievalError from urllib3's "Connection refused"
        detail = f"{detail}: {exc.__cause__}"
    detail = detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "..."
    if isinstance(exc, tuf_errors.ExpiredMetadataError):
        return Refused("registry_expired", f"expired metadata ({detail}): re-sign the registry")
    if isinstance(exc, tuf_errors.BadVersionNumberError):
        return Refused("registry_rolled_back", f"rolled-back metadata ({detail}): an older version was served")
    if isinstance(exc, tuf_errors.LengthOrHashMismatchError):
        return Refused("registry_tampered", f"tampered file ({detail}): it does not match its signed hash")
    if isinstance(exc, tuf_errors.UnsignedMetadataError):
        return Refused("registry_unsigned", f"metadata not signed by the trusted keys ({detail})")
    if isinstance(exc, tuf_errors.RepositoryError):
        return Refused("registry_refused", f"invalid metadata ({detail})")
    if isinstance(exc, (tuf_errors.DownloadError, urllib3.exceptions.HTTPError, ConnectionError)):
        return Refused("registry_unreachable", f"unreachable ({detail})")
    if isinstance(exc, OSError):
        return Refused("registry_cache", f"cannot use the metadata cache ({detail})")
    return Refused("registry_refused", f"{type(exc).__name__}: {detail}")


def fetch_cards(url: str, root: bytes, cache_dir: Path) -> Fetched:
    """One verified refresh; raises `Refused`."""
    try:
        return _fetch(url.rstrip("/"), root, cache_dir)
    except Exception as exc:
        raise classify(exc) from exc


def _fetch(url: str, root: bytes, cache_dir: Path) -> Fetched:
    from tuf.api.metadata import Metadata, Targets
    from tuf.ngclient import Updater
    from tuf.ngclient.urllib3_fetcher import Urllib3Fetcher

    metadata_dir, targets_dir = cache_dir / "metadata", cache_dir / "targets"
    metadata_dir.mkdir(parents=True, exist_ok=True)
    targets_dir.mkdir(parents=True, exist_ok=True)
    # A new Updater per refresh (ngclient refreshes once per instance). The configured root is the
    # bootstrap; newer roots it has already accepted come from metadata/root_history.
    updater = Updater(
        str(metadata_dir),
        f"{url}/metadata/",
        str(targets_dir),
        f"{url}/targets/",
        fetcher=Urllib3Fetcher(socket_timeout=SOCKET_TIMEOUT_S, app_user_agent="skulk-registry-tuf"),
        bootstrap=root,
    )
    updater.refresh()
    # refresh() persisted targets.json only after verifying it: the listing comes from that file.
    signed_targets = (metadata_dir / "targets.json").read_bytes()
    listing = Metadata[Targets].from_bytes(signed_targets).signed
    cards: dict[str, bytes] = {}
    for path in sorted(listing.targets):
        if not (path.startswith(CARDS_PREFIX) and path.endswith(".toml")):
            continue
        info = updater.get_targetinfo(path)
        if info is None:  # listed in targets.json but not found by the walk: cannot happen top-level
            raise Refused("registry_refused", f"target {path} vanished from the verified metadata")
        local = updater.find_cached_target(info) or updater.download_target(info)
        cards[path] = Path(local).read_bytes()
    return Fetched(cards=cards, targets_metadata=signed_targets, version=listing.version)


def verify_cached(root_json: bytes, targets_metadata: bytes, cards: dict[str, bytes]) -> int:
    """Check a saved catalog against its signed targets.json and the trusted root, offline.

    Expiry is deliberately not checked: the caller bounds the age of a last-known-good catalog
    itself (30 days by default). Returns the targets version; raises `Refused`.
    """
    from tuf.api import exceptions as tuf_errors
    from tuf.api.metadata import Metadata, Root, Targets

    try:
        root = Metadata[Root].from_bytes(root_json).signed
        targets_md = Metadata[Targets].from_bytes(targets_metadata)
        root.verify_delegate("targets", targets_md.signed_bytes, targets_md.signatures)
        for path, data in cards.items():
            info = targets_md.signed.targets.get(path)
            if info is None:
                raise Refused("registry_cache", f"saved card {path} is not in the saved targets.json")
            info.verify_length_and_hashes(data)
    except (tuf_errors.RepositoryError, ValueError) as exc:
        raise classify(exc) from exc
    return targets_md.signed.version
