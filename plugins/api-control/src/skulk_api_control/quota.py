"""Tokens per minute per API key, enforced cluster-wide without a database.

Each API node counts the tokens it serves per key in one-second buckets (prompt and completion
tokens: completion tokens as they stream, the rest from the terminal chunk's usage). Every second,
while some key has a quota, it asks each reachable peer for its counts over the telemetry plane
(request/reply on the READINGS topic, which carries no other requests) and keeps the answers. A key's
use is its own node's sliding minute plus the peers' last answers, so the cluster-wide sum is at most
about a second stale; a request of a key at or over its quota gets 429 with `Retry-After` before it
is dispatched (a stream already running is not cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import defaultdict, deque
from typing import Any

from skulk_kernel.api import Chunk, Command, ErrorChunk, NodeSurface, ServiceKey, TokenChunk, Topic

from .auth import PLUGIN_DATA, KeyRecord, current_key

log = logging.getLogger("skulk.api.quota")
WINDOW_S = 60
GOSSIP_INTERVAL_S = 1.0
PEER_STALE_S = 5.0
QUOTA: ServiceKey[QuotaMeter] = ServiceKey("api-control.quota")


def meter_for(node: NodeSurface) -> QuotaMeter:
    """The node's one quota meter, made on first use (by the key routes or the middleware hook)."""
    meter = node.services.get(QUOTA)
    if meter is None:
        meter = node.services.publish(QUOTA, QuotaMeter(node))
    return meter


class QuotaMeter:
    """This node's served tokens per key, and the peers' (an InferenceMiddleware too)."""

    def __init__(self, node: NodeSurface) -> None:
        self.node = node
        self._local: defaultdict[str, deque[list[int]]] = defaultdict(deque)  # key -> [[second, tokens], ...]
        self._remote: dict[str, tuple[float, dict[str, list[list[int]]]]] = {}  # peer -> (when, key -> buckets)
        self._requests: dict[str, tuple[str, int]] = {}  # command id -> (key id, completion tokens counted)
        self._task: asyncio.Task[Any] | None = None
        self._served = False

    # ------------------------------------------------------------ counting (InferenceMiddleware)

    def transform(self, command: Command) -> Command:
        key_id = current_key.get()
        if key_id is not None and hasattr(command, "command_id"):
            self._requests[str(command.command_id)] = (key_id, 0)
        return command

    def observe(self, command: Command, chunk: Chunk) -> None:
        command_id = str(chunk.command_id)
        entry = self._requests.get(command_id)
        if entry is None:
            return
        key_id, counted = entry
        tokens = 1 if isinstance(chunk, TokenChunk) and chunk.text else 0
        counted += tokens
        if chunk.finish_reason is not None or isinstance(chunk, ErrorChunk):
            self._requests.pop(command_id, None)
            if chunk.usage is not None:  # the prompt, and completion tokens that came in fewer chunks
                tokens += chunk.usage.prompt_tokens + max(0, chunk.usage.completion_tokens - counted)
        else:
            self._requests[command_id] = (key_id, counted)
        if tokens:
            self.add(key_id, tokens)

    def add(self, key_id: str, tokens: int, now: float | None = None) -> None:
        second = int(now if now is not None else time.time())
        buckets = self._local[key_id]
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += tokens
        else:
            buckets.append([second, tokens])
        self._prune(buckets, second)

    @staticmethod
    def _prune(buckets: deque[list[int]], now: int) -> None:
        while buckets and buckets[0][0] <= now - WINDOW_S:
            buckets.popleft()

    # ------------------------------------------------------------ the cluster-wide sum

    def _buckets(self, key_id: str, now: float) -> list[list[int]]:
        second = int(now)
        local = self._local.get(key_id)
        if local is not None:
            self._prune(local, second)
        found = [list(b) for b in local or ()]
        for when, counts in self._remote.values():
            if now - when <= PEER_STALE_S:
                found += [b for b in counts.get(key_id, ()) if b[0] > second - WINDOW_S]
        return found

    def used(self, key_id: str, now: float | None = None) -> int:
        return sum(b[1] for b in self._buckets(key_id, now if now is not None else time.time()))

    def retry_after(self, record: KeyRecord, now: float | None = None) -> int | None:
        """None while the key is under its quota, else whole seconds until it is again."""
        self.ensure_running()
        if not record.tokens_per_min:
            return None
        now = now if now is not None else time.time()
        buckets = sorted(self._buckets(record.id, now))
        total = sum(b[1] for b in buckets)
        if total < record.tokens_per_min:
            return None
        for second, tokens in buckets:  # the oldest tokens leave the window first
            total -= tokens
            if total < record.tokens_per_min:
                return max(1, math.ceil(second + WINDOW_S - now))
        return WINDOW_S

    # ------------------------------------------------------------ gossip on the telemetry plane

    def snapshot(self) -> dict[str, list[list[int]]]:
        now = int(time.time())
        out = {}
        for key_id, buckets in self._local.items():
            self._prune(buckets, now)
            if buckets:
                out[key_id] = [list(b) for b in buckets]
        return out

    def _serve(self, sender: str, payload: bytes) -> bytes:
        return json.dumps(self.snapshot()).encode()

    def ensure_running(self) -> None:
        if not self._served:
            self._served = True
            with contextlib.suppress(Exception):
                self.node.transports["telemetry"].serve(Topic.READINGS, self._serve)
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):
                self._task = self.node.spawn(self._gossip(), "api-key-quota")

    async def _gossip(self) -> None:
        transport = self.node.transports["telemetry"]
        while not self.node.stopping:
            limited = any(
                isinstance(raw, dict) and raw.get("tokens_per_min")
                for raw in self.node.state.plugin_data.get(PLUGIN_DATA, {}).values()
            )
            if limited:
                peers = sorted(self.node.reachable_nodes() - {self.node.node_id})
                results = await asyncio.gather(
                    *(transport.request(peer, Topic.READINGS, b"quota", GOSSIP_INTERVAL_S) for peer in peers),
                    return_exceptions=True,
                )
                now = time.time()
                for peer, result in zip(peers, results, strict=True):
                    if isinstance(result, bytes | bytearray):
                        try:
                            counts = json.loads(result)
                        except ValueError:
                            continue
                        if isinstance(counts, dict):
                            self._remote[peer] = (now, counts)
                for peer in set(self._remote) - set(peers):
                    self._remote.pop(peer, None)
            await asyncio.sleep(GOSSIP_INTERVAL_S)
