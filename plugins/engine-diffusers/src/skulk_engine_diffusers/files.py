"""The images a `response_format=url` answer points at, kept on the API node for a while.

OpenAI's image URLs expire (after an hour); these do too (`url_ttl_s`). They are kept in memory,
bounded in bytes (the oldest go first when a new one would not fit), because they are short-lived
copies of bytes the client already asked for: a restart loses them, as an expiry would. The id is
random (128 bits), so a URL is a capability: knowing it is what lets you fetch the image.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredImage:
    data: bytes
    mime: str
    expires_at: float


class ImageFiles:
    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float] | None = None) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock: Callable[[], float] = clock or time.monotonic
        self._files: OrderedDict[str, StoredImage] = OrderedDict()
        self._bytes = 0

    def _expire(self) -> None:
        now = self._clock()
        for file_id in [k for k, v in self._files.items() if v.expires_at <= now]:
            self._drop(file_id)

    def _drop(self, file_id: str) -> None:
        stored = self._files.pop(file_id, None)
        if stored is not None:
            self._bytes -= len(stored.data)

    def put(self, data: bytes, mime: str, extension: str) -> str:
        """Keep `data`; its id (with the extension, so the URL says what it is)."""
        self._expire()
        while self._files and self._bytes + len(data) > self.max_bytes:
            self._drop(next(iter(self._files)))
        file_id = f"img_{secrets.token_hex(16)}.{extension}"
        self._files[file_id] = StoredImage(data, mime, self._clock() + self.ttl_s)
        self._bytes += len(data)
        return file_id

    def get(self, file_id: str) -> StoredImage | None:
        self._expire()
        return self._files.get(file_id)

    def __len__(self) -> int:
        return len(self._files)
