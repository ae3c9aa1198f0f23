"""Libp2pTransport: the kernel's Transport contract over py-libp2p, for the control (and telemetry) plane.

py-libp2p is trio-only and the node is asyncio, so the libp2p side (fabric.py) runs with `trio.run`
on a thread of its own, and the two meet only here:

* asyncio -> trio: publish()/send() append to `outbox` (a deque: an append, no lock) and poke the
  fabric through `TrioToken.run_sync_soon` only when it sleeps; request() schedules a coroutine
  into the fabric's nursery the same way and awaits an asyncio future it resolves;
* trio -> asyncio: subscribe() callbacks and on_peer callbacks are called on the trio thread (the
  node bridges them with `loop.call_soon_threadsafe`, as it does for every transport); async
  request handlers run on the node's loop through `run_coroutine_threadsafe`.

Containment: the thread runs fabrics one after another. An exception out of py-libp2p ends that
fabric only; the thread logs it, notes it in the node's health, waits (backing off) and starts a
new one with the same key pair, so peers see the same peer id redial them. The node never stops.

Own messages are delivered to own subscribers directly in publish()/send(), never through libp2p.
libp2p and trio are imported only inside methods: building the transport (plugin registration,
runner subprocesses) stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from skulk_kernel.api import NodeSurface, PeerEvent, Topic
from skulk_transport_zenoh.counts import MessageCounts  # one counter for both transports

from . import frames
from .config import Libp2pConfig, bootstrap_multiaddrs, effective_network_version

if TYPE_CHECKING:
    from .fabric import Fabric

log = logging.getLogger("skulk.transport.libp2p")

PLUGIN = "transport-libp2p"
Callback = Callable[[str, bytes], None]
Handler = Callable[[str, bytes], "bytes | Awaitable[bytes]"]
T = TypeVar("T")
_START_TIMEOUT_S = 30.0
_MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class MismatchedPeer:
    """A node seen on the network that runs another network version (never a member)."""

    node_id: str
    network_version: str
    address: str
    last_seen: float  # time.time()


class Libp2pTransport:
    """The Transport contract over libp2p: gossipsub broadcasts, direct streams for send and request."""

    name = "libp2p"

    def __init__(self, config: Libp2pConfig | None = None, node: NodeSurface | None = None) -> None:
        self.config = config or Libp2pConfig()
        self.network_version = effective_network_version(self.config)
        self._node = weakref.ref(node) if node is not None else None
        self.node_id = ""
        self._sender = b""
        self.sender_header = b""
        self.key_pair: Any = None
        self.noise_key: Any = None
        self.pnet_secret = b""  # from the cluster secret, at start
        self.outbox: deque[tuple[str, str, bytes]] = deque()
        self._seq: dict[Topic, int] = {}
        self.counts = MessageCounts()  # per plane, for /v1/diagnostics/node and bench/bench_scale.py
        self._callbacks: dict[Topic, tuple[Callback, ...]] = {}
        self._handlers: dict[Topic, Handler] = {}
        self._peer_callbacks: tuple[Callable[[PeerEvent], None], ...] = ()
        self._members: set[str] = set()
        self._mismatched: dict[str, MismatchedPeer] = {}
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._fabric: Fabric | None = None
        self._bootstrap: list[str] = []
        self._bind: list[str] = []
        self._targets: dict[tuple[str, int], Any] = {}
        self._started = threading.Event()
        self._stopping = False
        self._running = False
        self.restarts = 0
        self.last_crash = ""
        self.listen: list[str] = []
        self.peer_id = ""
        self._names = {topic: f"skulk/{self.network_version}/{topic.plane.value}/{topic.value}" for topic in Topic}

    # ================================================================ lifecycle

    async def start(self, node_id: str, options: dict[str, Any]) -> None:
        if self._running:
            return
        from libp2p.crypto.ed25519 import create_new_key_pair
        from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair

        self.node_id = node_id
        self._sender = frames.sender_header(node_id)
        self.sender_header = self._sender
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self.key_pair = create_new_key_pair()
        self.noise_key = create_x25519_key_pair()  # Noise needs an X25519 static key
        _quiet_library_logs()
        node_options = options.get("options")
        # The cluster secret (shared with Zenoh's TLS and frame seals) keys the private network, so
        # only members can even negotiate a protocol, not every node of the same version.
        from skulk_transport_zenoh.secret import resolve_secret

        extra = getattr(node_options, "extra", None) or {}
        cluster = await asyncio.to_thread(resolve_secret, getattr(node_options, "home", None), extra.get("join_token"))
        self.pnet_secret = cluster.key(f"libp2p-pnet:{self.network_version}")
        self._bootstrap = bootstrap_multiaddrs(self.config, tuple(getattr(node_options, "bootstrap_peers", ()) or ()))
        self._bind = list(self.config.listen)
        self._targets = {}
        self._started.clear()
        self._thread = threading.Thread(target=self._supervise, name="skulk-libp2p", daemon=True)
        self._thread.start()
        ok = await asyncio.to_thread(self._started.wait, _START_TIMEOUT_S)
        if not ok:
            await self.stop()
            raise RuntimeError(f"the libp2p transport did not start in {_START_TIMEOUT_S}s: {self.last_crash}")
        self._running = True
        log.info(
            "libp2p transport up: node %s, peer id %s, network version %s, listening on %s, bootstrap %s, mDNS %s",
            node_id,
            self.peer_id,
            self.network_version,
            ", ".join(self.listen) or "?",
            ", ".join(self._bootstrap) or "nothing",
            "on" if self.config.mdns else "off",
        )
        node = self._node() if self._node is not None else None
        if node is not None:
            with contextlib.suppress(Exception):
                node.facts["network_version"] = self.network_version
                node.facts["libp2p_listen"] = list(self.listen)

    def _supervise(self) -> None:
        """The transport thread: one fabric after another until stop(); a crash restarts, never escapes."""
        import trio

        from .fabric import Fabric

        backoff = self.config.restart_backoff_s
        while not self._stopping:
            fabric = Fabric(self, list(self._bootstrap), list(self._bind), self._targets)
            began = time.monotonic()
            try:
                trio.run(fabric.run, self._on_ready)
            except BaseException as exc:  # a library bug, a garbage frame the library choked on...
                if self._stopping:
                    break
                self.restarts += 1
                self.last_crash = f"{type(exc).__name__}: {exc}"
                log.error(
                    "libp2p transport crashed (%s); restart %d in %.1fs",
                    self.last_crash,
                    self.restarts,
                    backoff,
                    exc_info=exc,
                )
                self._note_health("restarted", f"restarted {self.restarts} time(s); last: {self.last_crash}")
            finally:
                self._fabric = None
                self._drop_all_members()
            if self._stopping:
                break
            if not fabric.listen:
                self._bind = list(self.config.listen)  # it never came up: the old ports may be taken
            if time.monotonic() - began > 30:
                backoff = self.config.restart_backoff_s  # it ran well for a while: start over
            time.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def _on_ready(self, fabric: Fabric) -> None:
        self._fabric = fabric
        self.listen = list(fabric.listen)
        if self._bind == list(self.config.listen):  # a restart rebinds the ports peers know
            self._bind = [a.split("/p2p/")[0] for a in fabric.transport_addrs] or self._bind
        self.peer_id = fabric.peer_id.to_base58()
        self._started.set()
        if self.outbox:
            fabric.poke()

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping = True
        self._call_in_trio(lambda fabric: fabric.stop())
        thread = self._thread
        await asyncio.to_thread(thread.join, 5.0)
        if thread.is_alive():
            log.warning("the libp2p thread did not stop within 5s; leaving it (a daemon thread)")
        self._thread = None
        self._running = False
        log.info("libp2p transport of node %s stopped", self.node_id)

    def _call_in_trio(self, fn: Callable[[Fabric], None]) -> bool:
        """Run fn(fabric) on the trio thread soon; False when no fabric is running."""
        import trio

        fabric = self._fabric
        if fabric is None or fabric.token is None:
            return False
        try:
            fabric.token.run_sync_soon(fn, fabric)
        except trio.RunFinishedError:
            return False
        return True

    def inject_fault(self, message: str = "injected fault") -> None:
        """Raise inside the running fabric, as a library bug would (for containment tests)."""
        self._call_in_trio(lambda fabric: fabric.inject_fault(message))

    # ================================================================ publish / subscribe

    async def publish(self, topic: Topic, payload: bytes) -> None:
        """Broadcast to `topic`'s subscribers everywhere (own ones directly); waits while the queue is full."""
        if len(payload) > _max_payload():
            raise ValueError(f"{len(payload)} bytes is too large for a libp2p broadcast; use request/reply")
        self._deliver_local(topic, self.node_id, payload)
        self.counts.sent(topic)
        seq = self._seq.get(topic, 0)
        self._seq[topic] = seq + 1
        await self._enqueue(("pub", self._names[topic], frames.encode_record(seq, payload)))

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        """Deliver to `topic`'s subscribers on `node_id` only, over that peer's link; to self directly."""
        if node_id == self.node_id:
            self._deliver_local(topic, node_id, payload)
            return
        self.counts.sent(topic)
        frame = frames.encode_frame(frames.MESSAGE, frames.pack_fields(topic.value.encode()) + payload)
        await self._enqueue(("send", node_id, frame))

    async def _enqueue(self, item: tuple[str, str, bytes]) -> None:
        if not self._running or self._stopping:
            if self._stopping:
                return  # shutting down: own subscribers heard it, the network no longer does
            raise RuntimeError("the libp2p transport is not started")
        delay = 0.0005
        while len(self.outbox) >= self.config.send_queue:
            if self._stopping:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        self.outbox.append(item)
        fabric = self._fabric
        if fabric is not None and fabric.idle:
            fabric.idle = False
            self._call_in_trio(lambda f: f.poke())

    def subscribe(self, topic: Topic, callback: Callback) -> None:
        """callback(sender_node_id, payload) on the trio thread (own messages: on the publisher's)."""
        with self._lock:
            self._callbacks[topic] = (*self._callbacks.get(topic, ()), callback)

    def _deliver_local(self, topic: Topic, sender: str, payload: bytes) -> None:
        self.deliver(topic, sender, payload)

    def deliver(self, topic: Topic, sender: str, payload: bytes) -> None:
        if sender != self.node_id:
            self.counts.received(topic)
        for callback in self._callbacks.get(topic, ()):
            try:
                callback(sender, payload)
            except Exception:
                log.exception("subscriber of %s failed on a message from %s", topic.value, sender)

    # ================================================================ membership

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None:
        """callback(PeerEvent) on the trio thread; current members are replayed as joins at once."""
        with self._lock:
            self._peer_callbacks = (*self._peer_callbacks, callback)
            current = sorted(self._members)
        for node_id in current:
            _call_peer(callback, PeerEvent(node_id, True))

    @property
    def peers(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._members)

    def peer_changed(self, node_id: str, joined: bool) -> None:
        with self._lock:
            if joined == (node_id in self._members):
                return
            if joined:
                self._members.add(node_id)
            else:
                self._members.discard(node_id)
            callbacks = self._peer_callbacks
        event = PeerEvent(node_id, joined)
        for callback in callbacks:
            _call_peer(callback, event)

    def _drop_all_members(self) -> None:
        for node_id in sorted(self.peers):
            self.peer_changed(node_id, False)

    @property
    def mismatched_peers(self) -> dict[str, MismatchedPeer]:
        with self._lock:
            return dict(self._mismatched)

    def note_mismatch(self, node_id: str, version: str, address: str) -> None:
        with self._lock:
            first = node_id not in self._mismatched
            self._mismatched[node_id] = MismatchedPeer(node_id, version, address, time.time())
            summary = "; ".join(
                f"{p.node_id} runs {p.network_version} ({p.address})" for p in self._mismatched.values()
            )
        if first:
            log.error(
                "NETWORK VERSION MISMATCH: node %s at %s runs network version %r, this node runs %r; its "
                "private-network key differs, so libp2p refuses every connection with it (upgrade one of "
                "them, or set SKULK_NETWORK_VERSION)",
                node_id,
                address,
                version,
                self.network_version,
            )
        self._note_health("mismatched_peers", summary)

    def _note_health(self, code: str, message: str) -> None:
        node = self._node() if self._node is not None else None
        if node is not None:
            with contextlib.suppress(Exception):
                node.health_notes.setdefault(PLUGIN, {})[code] = message

    # ================================================================ request / reply

    def serve(self, topic: Topic, handler: Handler) -> None:
        """Answer request(this node, topic, ...) with handler(sender, payload) -> bytes (or awaitable).

        A sync handler runs on a worker thread, an async one on the loop the transport started on.
        """
        with self._lock:
            self._handlers[topic] = handler

    def handler_for(self, topic: Topic) -> Handler | None:
        return self._handlers.get(topic)

    def run_on_loop(self, awaitable: Awaitable[bytes]) -> Future[bytes]:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._loop)

    async def request(self, node_id: str, topic: Topic, payload: bytes, timeout: float = 5.0) -> bytes:
        """Ask `node_id`'s handler for `topic` over a direct stream; raises NoReply (a TimeoutError)."""
        from .fabric import NoReply

        if node_id == self.node_id:
            handler = self._handlers.get(topic)
            if handler is None:
                raise NoReply(f"this node serves no requests on {topic.value}")
            result = handler(node_id, payload)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(_awaited(result), timeout)
            if not isinstance(result, (bytes, bytearray, memoryview)):
                raise TypeError(f"a request handler must return bytes, not {type(result).__name__}")
            return bytes(result)
        if not self._running:
            raise RuntimeError("the libp2p transport is not started")
        if node_id not in self.peers:
            raise NoReply(f"no member {node_id} serves requests on {topic.value}")
        future = self._in_trio(lambda fabric: fabric.request(node_id, topic, payload, timeout))
        try:
            return await asyncio.wait_for(future, timeout + 1.0)
        except TimeoutError:
            raise NoReply(f"no reply from {node_id} on {topic.value} within {timeout}s") from None

    def _in_trio(self, make: Callable[[Fabric], Awaitable[T]]) -> asyncio.Future[T]:
        """Run the coroutine make(fabric) in the fabric's nursery; its outcome resolves the future."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def begin(fabric: Fabric) -> None:
            async def run() -> None:
                try:
                    result = await make(fabric)
                except Exception as exc:
                    loop.call_soon_threadsafe(settle, None, exc)
                except BaseException:
                    loop.call_soon_threadsafe(settle, None, ConnectionError("the libp2p transport restarted"))
                    raise
                else:
                    loop.call_soon_threadsafe(settle, result, None)

            if fabric.nursery is None:
                loop.call_soon_threadsafe(settle, None, ConnectionError("the libp2p transport is restarting"))
            else:
                fabric.nursery.start_soon(run)

        if not self._call_in_trio(begin):
            future.set_exception(ConnectionError("the libp2p transport is restarting"))
        return future

    # ================================================================ diagnostics

    def describe(self) -> dict[str, Any]:
        fabric = self._fabric
        return {
            "name": self.name,
            "node_id": self.node_id,
            "peer_id": self.peer_id,
            "network_version": self.network_version,
            "listen": list(self.listen),
            "bootstrap": list(self._bootstrap),
            "peers": sorted(self.peers),
            "mismatched_peers": {k: v.__dict__ for k, v in self.mismatched_peers.items()},
            "malformed_frames": fabric.malformed if fabric is not None else 0,
            "skipped_messages": fabric.reorder.skipped if fabric is not None else 0,
            "restarts": self.restarts,
            "last_crash": self.last_crash,
            "messages": self.counts.snapshot(),
        }


def _quiet_library_logs() -> None:
    """py-libp2p logs routine events (its auto-connector's dial rounds) at INFO: keep them out of node logs."""
    library = logging.getLogger("libp2p")
    if library.level == logging.NOTSET:
        library.setLevel(logging.WARNING)


def _max_payload() -> int:
    from .tuning import MAX_MESSAGE_BYTES, MESSAGE_HEADROOM

    return MAX_MESSAGE_BYTES - MESSAGE_HEADROOM


def _call_peer(callback: Callable[[PeerEvent], None], event: PeerEvent) -> None:
    try:
        callback(event)
    except Exception:
        log.exception("on_peer callback failed on %s", event)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
