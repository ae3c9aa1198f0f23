"""The registry as a model store: the cards of the last verified registry version, kept current.

`RegistryStore` is registered with the node as the model store `registry-tuf`, so its cards join
the catalog exactly as the store's bundled cards do (the kernel's `catalog()` merges every store;
custom cards in State still override). It refreshes at most once per `refresh_interval_s`. A
refresh that fails (unreachable, tampered, expired, rolled back) changes nothing in the catalog:
the last good version keeps being served, for `max_age_days` after it was verified, and the reason
goes to the node's health notes (shown in `/state` nodeHealth) and the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard

from . import last_good
from .cards import CardError, card_from_toml_text
from .client import Refused, fetch_cards
from .last_good import LastGood

log = logging.getLogger("skulk.registry")
HealthSink = Callable[[dict[str, str]], None]


class RegistryStore:
    """A ModelStore whose catalog is the registry's verified cards; it holds no model files."""

    name = "registry-tuf"

    def __init__(
        self,
        url: str,
        root: bytes,
        cache_dir: Path,
        *,
        refresh_interval_s: float = 60.0,
        max_age_s: float = 30 * 86400.0,
        offline: bool = False,
        health: HealthSink = lambda _notes: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.root = root
        self.cache_dir = cache_dir
        self.refresh_interval_s = refresh_interval_s
        self.max_age_s = max_age_s
        self.offline = offline
        self._health = health
        self._clock = clock
        self._lock = threading.Lock()
        self._good: LastGood | None = None
        self._cards: dict[str, ModelCard] = {}
        self._card_errors: dict[str, str] = {}
        self._refusal: Refused | None = None
        self._last_attempt: float | None = None
        self._last_success: float | None = None

    # ------------------------------------------------------------------ the ModelStore contract

    def catalog(self) -> dict[str, ModelCard]:
        if self._good is None or self._expired():
            return {}
        return dict(self._cards)

    def local_path(self, model_id: str) -> Path | None:
        return None  # cards only: the local store provisions the files a card's [source] names

    # ------------------------------------------------------------------ refreshing

    def load_saved(self) -> None:
        """Serve the catalog saved by an earlier run (verified again now) until a refresh succeeds."""
        try:
            saved = last_good.load(self.cache_dir, self._trusted_root())
        except Refused as exc:
            log.warning("registry %s: the saved catalog is not usable: %s", self.url, exc.message)
            self._set_refusal(exc)
            return
        if saved is None:
            return
        if saved.url.rstrip("/") != self.url:
            log.info("registry: the saved catalog is from %s, not %s: ignored", saved.url, self.url)
            return
        self._adopt(saved)
        log.info(
            "registry %s: serving the saved catalog (version %d, %d cards, verified %s ago)",
            self.url,
            saved.fetched.version,
            len(self._cards),
            _age(self._clock() - saved.verified_at),
        )
        self._report()

    def refresh(self, force: bool = False) -> bool:
        """Fetch and verify the registry unless the last attempt is under the interval old.

        Returns whether a refresh was attempted. Never raises: a failure is a refusal in health.
        """
        with self._lock:
            now = self._clock()
            if self.offline:
                self._report()
                return False
            if not force and self._last_attempt is not None and now - self._last_attempt < self.refresh_interval_s:
                self._report()  # the age of the last good catalog moves on even between refreshes
                return False
            self._last_attempt = now
            try:
                fetched = fetch_cards(self.url, self.root, self.cache_dir)
            except Refused as exc:
                self._set_refusal(exc)
                return True
            good = LastGood(fetched=fetched, verified_at=now, url=self.url)
            changed = self._good is None or self._good.fetched.cards != fetched.cards
            self._adopt(good)
            self._refusal = None
            self._last_success = now
            try:
                last_good.save(self.cache_dir, good)
            except OSError as exc:
                log.warning("registry %s: cannot save the catalog for later (%s)", self.url, exc)
            if changed:
                log.info("registry %s: version %d verified, %d cards", self.url, fetched.version, len(self._cards))
            self._report()
            return True

    def status(self) -> dict[str, Any]:
        good = self._good
        now = self._clock()
        return {
            "url": self.url,
            "offline": self.offline,
            "version": good.fetched.version if good else None,
            "cards": sorted(self.catalog()),
            "verifiedAt": good.verified_at if good else None,
            "verifiedAgeS": round(now - good.verified_at, 1) if good else None,
            "expired": bool(good) and self._expired(),
            "lastAttempt": self._last_attempt,
            "lastSuccess": self._last_success,
            "refusal": {"code": self._refusal.code, "message": self._refusal.message} if self._refusal else None,
            "cardErrors": dict(self._card_errors),
        }

    # ------------------------------------------------------------------ internals

    def _trusted_root(self) -> bytes:
        """The newest root ngclient accepted (it follows rotations), else the configured one."""
        cached = self.cache_dir / "metadata" / "root.json"
        try:
            return cached.read_bytes()
        except OSError:
            return self.root

    def _adopt(self, good: LastGood) -> None:
        cards: dict[str, ModelCard] = {}
        errors: dict[str, str] = {}
        for path, data in sorted(good.fetched.cards.items()):
            try:
                card = card_from_toml_text(data.decode("utf-8", errors="replace"), path)
            except CardError as exc:  # signed but unreadable: skip that card, keep the rest
                errors[path] = str(exc)
                continue
            cards[card.model_id] = card
        for path, why in errors.items():
            if self._card_errors.get(path) != why:
                log.warning("registry %s: skipping card %s", self.url, why)
        self._good, self._cards, self._card_errors = good, cards, errors

    def _expired(self) -> bool:
        return self._good is not None and self._clock() - self._good.verified_at > self.max_age_s

    def _set_refusal(self, exc: Refused) -> None:
        if self._refusal is None or (self._refusal.code, self._refusal.message) != (exc.code, exc.message):
            log.warning("registry %s refused: %s; %s", self.url, exc.message, self._fallback())
        self._refusal = exc
        self._report()

    def _fallback(self) -> str:
        good = self._good
        if good is None:
            return "no earlier catalog to fall back on"
        age = _age(self._clock() - good.verified_at)
        if self._expired():
            return f"the last good catalog (version {good.fetched.version}, verified {age} ago) is too old to use"
        cards = len(self._cards)
        return f"still using the last good catalog (version {good.fetched.version}, {cards} cards, verified {age} ago)"

    def _report(self) -> None:
        notes: dict[str, str] = {}
        if self._refusal is not None:
            notes[self._refusal.code] = f"{self.url}: {self._refusal.message}; {self._fallback()}"
        elif self._expired():
            notes["registry_stale"] = f"{self.url}: {self._fallback()}"
        if self.offline:
            notes["registry_offline"] = f"{self.url}: offline node, not refreshing; {self._fallback()}"
        for path, why in self._card_errors.items():
            notes[f"registry_card:{path}"] = why
        self._health(notes)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
