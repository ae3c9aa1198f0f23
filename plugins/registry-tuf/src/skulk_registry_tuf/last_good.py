"""The last-known-good catalog on disk: what a node uses while its registry is down or refused.

After every fully verified refresh the node saves the signed targets.json it verified and the card
files, with the time they were verified. A node that starts while the registry is unreachable (or
with `--offline`) loads them, re-checks the signatures against the trusted root and every card
against its signed hash, and serves them for up to `max_age` after the verification time.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .client import Fetched, verify_cached

FILE = "last-good.json"


@dataclass(frozen=True)
class LastGood:
    fetched: Fetched
    verified_at: float  # unix time of the refresh that verified it
    url: str


def save(cache_dir: Path, good: LastGood) -> None:
    body = {
        "url": good.url,
        "verified_at": good.verified_at,
        "version": good.fetched.version,
        "targets_metadata": base64.b64encode(good.fetched.targets_metadata).decode(),
        "cards": {path: base64.b64encode(data).decode() for path, data in good.fetched.cards.items()},
    }
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{FILE}.tmp"
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, cache_dir / FILE)


def load(cache_dir: Path, root_json: bytes) -> LastGood | None:
    """The saved catalog if there is one and it still verifies; raises `Refused` when it does not."""
    path = cache_dir / FILE
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text())
        targets_metadata = base64.b64decode(body["targets_metadata"])
        cards = {p: base64.b64decode(d) for p, d in body["cards"].items()}
        verified_at, url = float(body["verified_at"]), str(body["url"])
    except (ValueError, KeyError, TypeError) as exc:
        from .client import Refused

        raise Refused("registry_cache", f"{path} is unreadable ({exc})") from None
    version = verify_cached(root_json, targets_metadata, cards)
    return LastGood(Fetched(cards=cards, targets_metadata=targets_metadata, version=version), verified_at, url)
