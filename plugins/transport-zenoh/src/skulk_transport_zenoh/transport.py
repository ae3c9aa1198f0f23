"""ZenohTransport: the kernel's Transport contract over one Zenoh peer session per node.

Key space (``V`` is the network version)::

    skulk/V/<plane>/<topic>             broadcasts (publish)
    skulk/V/<plane>/<topic>/<node_id>   node-addressed messages (send)
    skulk/V/rpc/<topic>/<node_id>       queryables answering request()
    skulk/V/alive/<node_id>             liveliness tokens: membership

Every payload travels in a frame that names its sender. With `secure` (the default) the frame is
sealed (sealed.py: sender, session, counter, HMAC keyed from the cluster secret) and links are
mutual TLS with a CA derived from the same secret (tls.py), so only members connect and the sender
a callback receives is authenticated. Control-plane and request/reply frames are also signed with
the sender's own key, bound to its node id by that CA (signing.py), so one member cannot pose as
another (the master included). Threads:

* one sender thread per plane drains a bounded queue into Zenoh puts, so a put that blocks (blocking
  congestion control towards a frozen peer stalls up to 5 s) never blocks the event loop;
  `publish`/`send` only await room in that queue;
* Zenoh's own threads run subscriber, liveliness and query callbacks; subscribe() callbacks are
  called there (the node bridges them into asyncio);
* own messages are delivered to own subscribers directly, in publish()/send() on the caller's
  thread: Zenoh publishers here are REMOTE-only and subscribers accept REMOTE samples only, so
  nothing arrives twice;
* request handlers run on a small thread pool (an async handler runs on the transport's loop).

`import zenoh` happens only inside methods, so constructing a transport (plugin registration) is
cheap on every node and in runner subprocesses.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import inspect
import json
import logging
import os
import secrets
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from skulk_kernel.api import NodeSurface, PeerEvent, Plane, Topic

from . import frames
from .config import ZenohConfig, effective_network_version
from .counts import MessageCounts
from .frames import Keys, MalformedFrame
from .hello import HelloService, tcp_address
from .sealed import Opener, Rejected, Sealer
from .secret import ClusterSecret, announce_new_secret, resolve_secret
from .signing import NodeSigner, Verifier
from .tls import secure_endpoint, zenoh_tls_config

log = logging.getLogger("skulk.transport.zenoh")

Callback = Callable[[str, bytes], None]
Handler = Callable[[str, bytes], "bytes | Awaitable[bytes]"]

# One fixed priority per plane (order holds per publisher within one priority only).
_PRIORITY = {Plane.CONTROL: "INTERACTIVE_HIGH", Plane.DATA: "DATA_HIGH", Plane.TELEMETRY: "DATA_LOW"}
# Blocking congestion control for what must arrive; telemetry is last-write-wins and may drop.
_BLOCKING = {Plane.CONTROL: True, Plane.DATA: True, Plane.TELEMETRY: False}
_AUTH_USER = "skulk"
_FLUSH_ON_STOP_S = 2.0

_log_init_lock = threading.Lock()
_log_initialised = False
_live: weakref.WeakSet[ZenohTransport] = weakref.WeakSet()


class RequestError(RuntimeError):
    """A request got an error reply (the handler raised, or the request was malformed)."""


class NoReply(TimeoutError):
    """No node answered a request: it timed out, or no node serves that topic at that id."""


@dataclass(frozen=True)
class MismatchedPeer:
    """A node seen on the network that runs another network version (never a member)."""

    node_id: str
    network_version: str
    address: str  # its listen locators (from its hello), or the key its liveliness token was seen on
    via: str  # "hello" or "liveliness"
    last_seen: float  # time.time()


@dataclass(frozen=True)
class RefusedPeer:
    """A node of this network version that does not hold this cluster's secret: never a member."""

    node_id: str
    address: str
    detail: str
    last_seen: float


MAX_REFUSED = 32  # hellos are unauthenticated: a flood of them must not grow without bound


def version_password(version: str) -> str:
    """Zenoh session password for a network version. Gating, not secrecy: anyone can derive it."""
    return hashlib.sha256(f"skulk-network-version:{version}".encode()).hexdigest()


def normalize_endpoint(peer: str) -> str:
    """``host:port`` -> ``tcp/host:port``; Zenoh locators (``proto/...``) pass unchanged."""
    peer = peer.strip()
    return peer if "/" in peer else f"tcp/{peer}"


def _init_zenoh_log(level: str | None) -> None:
    global _log_initialised
    import zenoh

    with _log_init_lock:
        if _log_initialised:
            return
        _log_initialised = True
        # Without this Zenoh logs nothing; with RUST_LOG (or zenoh_log) it logs to stdout.
        if level:
            zenoh.init_log_from_env_or(level)
        else:
            zenoh.try_init_log_from_env()


class _RateLimitedLog:
    """The first `burst` occurrences, then one in `every`: a flood must not flood the log."""

    def __init__(self, burst: int = 10, every: int = 1000) -> None:
        self.count = 0
        self.burst = burst
        self.every = every

    def should_log(self) -> bool:
        self.count += 1
        return self.count <= self.burst or self.count % self.every == 0


class _Lane:
    """One plane's sender: a bounded FIFO drained into Zenoh puts by a dedicated thread.

    A deque plus an event that is only set when the thread is idle: the hot path costs an append,
    not a lock and a notify per message (which halved throughput with queue.Queue). No wake is
    lost, so the idle thread sleeps without a timeout: it says `idle` before it looks at the queue
    and a producer appends before it looks at `idle`, so either the thread sees the item or the
    producer sees `idle` and sets the event (`stop` sets it too, always before `abandon`).
    """

    def __init__(self, transport: ZenohTransport, plane: Plane, maxsize: int) -> None:
        self.transport = transport
        self.plane = plane
        self.blocking = _BLOCKING[plane]
        self.items: deque[tuple[str, bytes]] = deque()
        self.maxsize = maxsize
        self.wakeup = threading.Event()
        self.idle = False  # the thread is about to wait: the producer must set `wakeup`
        self.stopping = False  # drain what is queued, then exit
        self.abandon = threading.Event()  # exit now, dropping what is queued
        self.lock = asyncio.Lock()  # FIFO among coroutines waiting for room
        self.dropped = 0
        self.put_errors = _RateLimitedLog()
        self.thread = threading.Thread(target=self._run, name=f"skulk-zenoh-send-{plane.value}", daemon=True)

    def offer(self, item: tuple[str, bytes]) -> bool:
        """Enqueue without waiting; False when full."""
        if len(self.items) >= self.maxsize:
            return False
        self.items.append(item)
        if self.idle:
            self.wakeup.set()
        return True

    async def put(self, item: tuple[str, bytes]) -> None:
        """Enqueue, waiting (on the loop, never blocking it) for room; telemetry drops instead."""
        if not self.lock.locked() and self.offer(item):
            return
        if not self.blocking:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("zenoh %s send queue full: dropped %d message(s) so far", self.plane.value, self.dropped)
            return
        async with self.lock:
            delay = 0.0005
            while not self.offer(item):
                if self.stopping:
                    return  # the transport is closing: the network no longer takes messages
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.02)

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()

    def _run(self) -> None:
        import zenoh

        session = self.transport._session
        publishers: dict[str, Any] = {}
        congestion = zenoh.CongestionControl.BLOCK if self.blocking else zenoh.CongestionControl.DROP
        priority = getattr(zenoh.Priority, _PRIORITY[self.plane])
        items = self.items
        try:
            while not self.abandon.is_set():
                try:
                    key, frame = items.popleft()
                except IndexError:
                    if self.stopping:
                        return
                    self.idle = True
                    self.wakeup.clear()
                    if not items and not self.stopping:
                        self.wakeup.wait()
                    self.idle = False
                    continue
                try:
                    publisher = publishers.get(key)
                    if publisher is None:
                        publisher = session.declare_publisher(
                            key,
                            congestion_control=congestion,
                            priority=priority,
                            allowed_destination=zenoh.Locality.REMOTE,
                        )
                        publishers[key] = publisher
                    publisher.put(frame)
                except Exception as exc:
                    if self.abandon.is_set():
                        return
                    if self.put_errors.should_log():
                        log.warning("zenoh put on %s failed (%d so far): %s", key, self.put_errors.count, exc)
        finally:
            for publisher in publishers.values():
                with contextlib.suppress(Exception):
                    publisher.undeclare()


class ZenohTransport:
    """The Transport contract over Zenoh for all three planes, plus membership and request/reply."""

    name = "zenoh"

    def __init__(self, config: ZenohConfig | None = None, node: NodeSurface | None = None) -> None:
        self.config = config or ZenohConfig()
        self.network_version = effective_network_version(self.config)
        self.keys = Keys(self.network_version)
        self._broadcast_keys = {topic: self.keys.broadcast(topic.plane.value, topic.value) for topic in Topic}
        self._node = weakref.ref(node) if node is not None else None
        self.node_id = ""
        self._sender = b""
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._callbacks: dict[Topic, tuple[Callback, ...]] = {}
        self._peer_callbacks: tuple[Callable[[PeerEvent], None], ...] = ()
        self._handlers: dict[Topic, Handler] = {}
        self._declared_topics: set[Topic] = set()
        self._subscribers: list[Any] = []
        self._queryables: dict[Topic, Any] = {}
        self._lanes: dict[Plane, _Lane] = {}
        self._members: set[str] = set()
        self._mismatched: dict[str, MismatchedPeer] = {}
        self._lock = threading.RLock()
        self._token: Any = None
        self._alive_sub: Any = None
        self._scout: Any = None
        self._hello: HelloService | None = None
        self._rpc_pool: ThreadPoolExecutor | None = None
        self._auth_file: str | None = None
        self._malformed = _RateLimitedLog()
        self.counts = MessageCounts()  # per plane, for /v1/diagnostics/node and bench/bench_scale.py
        self.cluster: ClusterSecret | None = None
        self._sealer: Sealer | None = None
        self._opener: Opener | None = None
        self._verifier: Verifier | None = None
        self._signed_prefixes: tuple[str, ...] = ()
        self._refused: dict[str, RefusedPeer] = {}
        self._rejected: dict[str, int] = {}  # kind -> frames dropped (forged, replayed, stale)
        self._rejected_log = _RateLimitedLog()
        self.connect_endpoints: list[str] = []
        self.listen_locators: list[str] = []
        self.zid = ""

    # ================================================================ lifecycle

    async def start(self, node_id: str, options: dict[str, Any]) -> None:
        if self._session is not None:
            return
        frames.check_chunk(node_id, "node id")
        self.node_id = node_id
        self._sender = frames.sender_header(node_id)
        self._loop = asyncio.get_running_loop()
        self._closing = False
        node_options = options.get("options")
        # libp2p multiaddrs (/ip4/...) in --bootstrap-peers are the other transport's, not ours
        bootstrap = [p for p in getattr(node_options, "bootstrap_peers", ()) or () if not p.startswith("/")]
        self.connect_endpoints = list(dict.fromkeys(normalize_endpoint(p) for p in [*self.config.connect, *bootstrap]))
        if self.config.secure:
            home = getattr(node_options, "home", None)
            extra = getattr(node_options, "extra", None) or {}
            self.cluster = await asyncio.to_thread(resolve_secret, home, extra.get("join_token"))
            announce_new_secret(self.cluster)
            mac_key = self.cluster.key(f"frame-mac:{self.network_version}")
            session = secrets.token_bytes(8)
            signer = None
            if self.config.sign_control:
                self._signed_prefixes = (f"{self.keys.root}/{Plane.CONTROL.value}/", f"{self.keys.root}/rpc/")
                signer = NodeSigner(self.cluster, self.network_version, node_id, session)
                self._verifier = Verifier(self.cluster, self.network_version)
            self._sealer = Sealer(mac_key, node_id, session, signer)
            self._opener = Opener(mac_key, self.config.replay_max_age_s, self._verifier, self._needs_signature)
            self.connect_endpoints = [secure_endpoint(e) for e in self.connect_endpoints]
        else:
            log.warning(
                "ZENOH TRANSPORT IS NOT SECURED ([plugins.transport-zenoh] secure = false): any host on the "
                "network can join this cluster, read its traffic and send it commands"
            )
        await asyncio.to_thread(self._open)
        _live.add(self)
        log.info(
            "zenoh transport up: node %s, zid %s, network version %s, listening on %s, connecting to %s, "
            "multicast scouting %s, %s",
            node_id,
            self.zid,
            self.network_version,
            ", ".join(self.listen_locators) or "?",
            ", ".join(self.connect_endpoints) or "nothing",
            "on" if self.config.multicast_scouting else "off",
            f"members only (mutual TLS, sealed frames; cluster {self.cluster.cluster_id}, secret from "
            f"{self.cluster.source})"
            if self.cluster
            else "NOT SECURED",
        )
        node = self._node() if self._node is not None else None
        if node is not None:
            with contextlib.suppress(Exception):
                node.facts["network_version"] = self.network_version
                node.facts["zenoh_listen"] = list(self.listen_locators)

    def _zenoh_config(self) -> Any:
        import zenoh

        cfg = self.config
        zc = zenoh.Config()

        def put(key: str, value: Any) -> None:
            zc.insert_json5(key, json.dumps(value))

        put("mode", "peer")
        listen = [secure_endpoint(e) for e in cfg.listen] if self.cluster else list(cfg.listen)
        put("listen/endpoints", listen)
        if self.cluster is not None:
            put("transport/link/tls", zenoh_tls_config(self.cluster, self.node_id))
        put("connect/endpoints", self.connect_endpoints)
        put("scouting/multicast/enabled", cfg.multicast_scouting)
        if cfg.multicast_address:
            put("scouting/multicast/address", cfg.multicast_address)
        if cfg.multicast_interface:
            put("scouting/multicast/interface", cfg.multicast_interface)
        put("scouting/gossip/enabled", cfg.gossip_scouting)
        lease_ms = max(int(cfg.lease_s * 1000), 200)
        put("transport/link/tx/lease", lease_ms)
        put("transport/link/tx/keep_alive", 4)
        # A put blocked by a peer that takes nothing (frozen) closes that link after the lease
        # rather than Zenoh's 5 s: under load, the blocked queue also holds up lease expiry.
        put("transport/link/tx/queue/congestion_control/block/wait_before_close", lease_ms * 1000)
        put("adminspace/enabled", True)  # read-only: how this session learns its own listen locators
        put("adminspace/permissions", {"read": True, "write": False})
        if cfg.session_auth:
            fd, path = tempfile.mkstemp(prefix="skulk-zenoh-auth-", suffix=".txt")
            password = version_password(self.network_version)
            with os.fdopen(fd, "w") as f:
                f.write(f"{_AUTH_USER}:{password}\n")
            self._auth_file = path
            put("transport/auth/usrpwd", {"user": _AUTH_USER, "password": password, "dictionary_file": path})
        return zc

    def _open(self) -> None:
        import zenoh

        _init_zenoh_log(self.config.zenoh_log)
        try:
            self._session = zenoh.open(self._zenoh_config())
        finally:
            self._remove_auth_file()  # Zenoh reads it while opening
        try:
            self._declare_all()
        except BaseException:
            self._close()  # never leave a half-built session (and its threads) behind
            raise

    def _declare_all(self) -> None:
        session = self._session
        self.zid = str(session.zid())
        self.listen_locators = self._own_locators()
        self._lanes = {plane: _Lane(self, plane, self.config.send_queue) for plane in Plane}
        for lane in self._lanes.values():
            lane.thread.start()
        self._rpc_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="skulk-zenoh-rpc")
        with self._lock:
            for topic in list(self._callbacks):
                self._declare_topic(topic)
            for topic in list(self._handlers):
                self._declare_queryable(topic)
        self._alive_sub = session.liveliness().declare_subscriber(
            Keys.ALIVE_ANY_VERSION,
            self._on_alive,
            history=True,
        )
        # the token last: whoever sees this node join can already reach its subscribers and queryables
        self._token = session.liveliness().declare_token(self.keys.alive(self.node_id))
        self._start_hello()

    def _own_locators(self) -> list[str]:
        try:
            # the admin space of this session answers locally (SESSION_LOCAL finds nothing there)
            for reply in self._session.get(f"@/{self.zid}/peer", timeout=2.0):
                if reply.ok is not None:
                    return list(json.loads(reply.ok.payload.to_bytes()).get("locators", []))
        except Exception as exc:
            log.debug("could not read own locators from the admin space: %s", exc)
        return list(self.config.listen)

    def _start_hello(self) -> None:
        import zenoh

        hello = HelloService(
            self.node_id,
            self.network_version,
            self.config.hello_interval_s,
            self._note_hello_mismatch,
            self._connected_zids,
            self.listen_locators,
            cluster=self.cluster.cluster_id if self.cluster else "",
            on_refused=self._note_refused,
        )
        ports = [a[1] for a in map(tcp_address, self.listen_locators) if a is not None and a[1]]
        hello.bind(ports)
        hello.add_static(a for a in map(tcp_address, self.connect_endpoints) if a is not None)
        hello.start()
        self._hello = hello
        if self.config.multicast_scouting:
            scout_cfg = zenoh.Config()
            if self.config.multicast_address:
                scout_cfg.insert_json5("scouting/multicast/address", json.dumps(self.config.multicast_address))
            if self.config.multicast_interface:
                scout_cfg.insert_json5("scouting/multicast/interface", json.dumps(self.config.multicast_interface))
            own = self.zid

            def on_hello(h: Any) -> None:
                zid = str(h.zid)
                if zid != own:
                    hello.scouted(zid, list(h.locators))

            try:
                self._scout = zenoh.scout(on_hello, what="peer|router", config=scout_cfg)  # type: ignore[arg-type]
            except Exception as exc:
                log.info("zenoh scout for version hellos unavailable: %s", exc)

    def _connected_zids(self) -> set[str]:
        session = self._session
        if session is None:
            return set()
        return {str(z) for z in session.info.peers_zid()}

    async def stop(self) -> None:
        if self._session is None or self._closing:
            return
        self._closing = True
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        """Flush what is queued (briefly), undeclare everything, close the session."""
        session = self._session
        if session is None:
            return
        for lane in self._lanes.values():
            lane.stop()
        deadline = time.monotonic() + _FLUSH_ON_STOP_S
        for lane in self._lanes.values():
            if lane.thread.ident is not None:
                lane.thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if lane.thread.is_alive():
                lane.abandon.set()  # stuck in a blocking put: closing the session releases it
        if self._scout is not None:
            with contextlib.suppress(Exception):
                self._scout.stop()
            self._scout = None
        if self._hello is not None:
            self._hello.stop()
            self._hello = None
        for entity in [self._token, self._alive_sub, *self._subscribers, *self._queryables.values()]:
            if entity is not None:
                with contextlib.suppress(Exception):
                    entity.undeclare()
        self._token = self._alive_sub = None
        self._subscribers.clear()
        self._queryables.clear()
        with self._lock:
            self._declared_topics.clear()
            self._members.clear()
        if self._rpc_pool is not None:
            self._rpc_pool.shutdown(wait=False, cancel_futures=True)
            self._rpc_pool = None
        try:
            session.close()
        except Exception as exc:
            log.warning("closing the zenoh session failed: %s", exc)
        for lane in self._lanes.values():
            if lane.thread.ident is not None:
                lane.thread.join(timeout=1.0)
        self._lanes = {}
        self._session = None
        self._remove_auth_file()
        _live.discard(self)
        log.info("zenoh transport of node %s stopped", self.node_id)

    def _remove_auth_file(self) -> None:
        if self._auth_file:
            with contextlib.suppress(OSError):
                os.unlink(self._auth_file)
            self._auth_file = None

    # ================================================================ publish / subscribe

    async def publish(self, topic: Topic, payload: bytes) -> None:
        """Broadcast to every subscriber of `topic` on every node, this one included."""
        lane = self._lane(topic)
        self._deliver(topic, self.node_id, payload)
        self.counts.sent(topic)
        if lane is not None:
            key = self._broadcast_keys[topic]
            item = (key, self._frame(key, payload))
            if lane.lock.locked() or not lane.offer(item):  # offer(): the hot path, no coroutine
                await lane.put(item)

    async def send(self, node_id: str, topic: Topic, payload: bytes) -> None:
        """Deliver to `topic`'s subscribers on node `node_id` only; to self without the network."""
        if node_id == self.node_id:
            self._deliver(topic, node_id, payload)
            return
        lane = self._lane(topic)
        self.counts.sent(topic)
        if lane is not None:
            frames.check_chunk(node_id, "node id")
            key = self.keys.addressed(topic.plane.value, topic.value, node_id)
            item = (key, self._frame(key, payload))
            if lane.lock.locked() or not lane.offer(item):
                await lane.put(item)

    def _lane(self, topic: Topic) -> _Lane | None:
        if self._session is None and not self._closing:
            raise RuntimeError("the zenoh transport is not started")
        if self._closing:
            return None  # shutting down: own subscribers still hear it, the network does not
        return self._lanes[topic.plane]

    def subscribe(self, topic: Topic, callback: Callback) -> None:
        """callback(sender_node_id, payload), on a Zenoh thread (or the publisher's for own messages)."""
        with self._lock:
            self._callbacks[topic] = (*self._callbacks.get(topic, ()), callback)
            if self._session is not None and not self._closing:
                self._declare_topic(topic)

    def _declare_topic(self, topic: Topic) -> None:
        import zenoh

        if topic in self._declared_topics:
            return
        self._declared_topics.add(topic)
        plane = topic.plane.value

        def on_sample(sample: Any, _topic: Topic = topic) -> None:
            self._on_sample(_topic, sample)

        for key in (self.keys.broadcast(plane, topic.value), self.keys.addressed(plane, topic.value, self.node_id)):
            self._subscribers.append(
                self._session.declare_subscriber(key, on_sample, allowed_origin=zenoh.Locality.REMOTE)
            )

    def _frame(self, key: str, payload: bytes) -> bytes:
        """The frame for `payload` put on `key`: sealed when secure."""
        if self._sealer is not None:
            return self._sealer.seal(key, payload, self._needs_signature(key))
        return frames.encode(self._sender, payload)

    def _needs_signature(self, key: str) -> bool:
        """Control-plane and request/reply frames are signed by their sender (when sign_control)."""
        return key.startswith(self._signed_prefixes) if self._signed_prefixes else False

    def _unframe(self, key: str, frame: bytes) -> tuple[str, bytes]:
        """(authenticated sender, payload); raises Rejected or MalformedFrame."""
        if self._opener is not None:
            try:
                sender, payload = self._opener.open(key, frame)
                if sender == self.node_id:  # own frames never come back over the network
                    raise Rejected("impersonation", f"a frame on {key} from another session claims this node's id")
                return sender, payload
            except Rejected as exc:
                if exc.kind == "malformed":
                    raise MalformedFrame(str(exc)) from None
                self._note_rejected(exc)
                raise
        return frames.decode(frame)

    def _note_rejected(self, exc: Rejected) -> None:
        with self._lock:
            self._rejected[exc.kind] = self._rejected.get(exc.kind, 0) + 1
        if self._rejected_log.should_log():
            log.warning("REJECTED a %s frame (%d rejected so far): %s", exc.kind, self._rejected_log.count, exc)
        self._publish_health()

    def _on_sample(self, topic: Topic, sample: Any) -> None:
        try:
            sender, payload = self._unframe(str(sample.key_expr), sample.payload.to_bytes())
        except Rejected:
            return
        except MalformedFrame as exc:
            if self._malformed.should_log():
                log.warning(
                    "dropped a malformed frame on %s (%d so far): %s", sample.key_expr, self._malformed.count, exc
                )
            return
        except Exception:
            log.exception("dropped an unreadable sample on %s", topic.value)
            return
        self.counts.received(topic)
        self._deliver(topic, sender, payload)

    def _deliver(self, topic: Topic, sender: str, payload: bytes) -> None:
        for callback in self._callbacks.get(topic, ()):
            try:
                callback(sender, payload)
            except Exception:
                log.exception("subscriber of %s failed on a message from %s", topic.value, sender)

    @property
    def malformed_frames(self) -> int:
        return self._malformed.count

    @property
    def dropped_messages(self) -> int:
        """Telemetry messages dropped because the send queue was full."""
        return sum(lane.dropped for lane in self._lanes.values())

    # ================================================================ membership

    def on_peer(self, callback: Callable[[PeerEvent], None]) -> None:
        """callback(PeerEvent) on a Zenoh thread; current members are replayed as joins right away."""
        with self._lock:
            self._peer_callbacks = (*self._peer_callbacks, callback)
            current = sorted(self._members)
        for node_id in current:
            self._call_peer(callback, PeerEvent(node_id, True))

    @property
    def peers(self) -> frozenset[str]:
        """Node ids of the live members (same network version), this node excluded."""
        with self._lock:
            return frozenset(self._members)

    @property
    def mismatched_peers(self) -> dict[str, MismatchedPeer]:
        """Nodes seen running another network version, by node id (diagnostics)."""
        with self._lock:
            return dict(self._mismatched)

    def _on_alive(self, sample: Any) -> None:
        import zenoh

        parsed = Keys.parse_alive(str(sample.key_expr))
        if parsed is None:
            return
        version, node_id = parsed
        joined = sample.kind == zenoh.SampleKind.PUT
        if version != self.network_version:
            if joined:
                self._note_mismatch(node_id, version, str(sample.key_expr), "liveliness")
            return
        if node_id == self.node_id:
            return
        with self._lock:
            if joined == (node_id in self._members):
                return
            if joined:
                self._members.add(node_id)
            else:
                self._members.discard(node_id)
                if self._verifier is not None:
                    self._verifier.release(node_id)  # its next start brings a new key
            callbacks = self._peer_callbacks
        log.info("peer %s %s", node_id, "joined" if joined else "left")
        event = PeerEvent(node_id, joined)
        for callback in callbacks:
            self._call_peer(callback, event)

    @staticmethod
    def _call_peer(callback: Callable[[PeerEvent], None], event: PeerEvent) -> None:
        try:
            callback(event)
        except Exception:
            log.exception("on_peer callback failed on %s", event)

    def _note_hello_mismatch(self, node_id: str, version: str, address: str) -> None:
        self._note_mismatch(node_id, version, address, "hello")

    def _note_mismatch(self, node_id: str, version: str, address: str, via: str) -> None:
        with self._lock:
            first = node_id not in self._mismatched
            self._mismatched[node_id] = MismatchedPeer(node_id, version, address, via, time.time())
        if first:
            log.error(
                "NETWORK VERSION MISMATCH: node %s at %s runs network version %r, this node runs %r; "
                "it cannot join this cluster (upgrade one of them, or set SKULK_NETWORK_VERSION)",
                node_id,
                address,
                version,
                self.network_version,
            )
        self._publish_health()

    def _note_refused(self, node_id: str, address: str, detail: str) -> None:
        """A hello from a node of this version without this cluster's secret: TLS refuses it."""
        with self._lock:
            first = node_id not in self._refused
            if first and len(self._refused) >= MAX_REFUSED:
                self._refused.pop(min(self._refused, key=lambda k: self._refused[k].last_seen))
            self._refused[node_id] = RefusedPeer(node_id, address, detail, time.time())
        if first:
            log.error(
                "REFUSED PEER: node %s at %s tried to join without this cluster's secret (%s); its TLS "
                "handshake is refused. To let it in, give it the join token (`skulk-kernel cluster token`)",
                node_id,
                address,
                detail,
            )
        self._publish_health()

    @property
    def refused_peers(self) -> dict[str, RefusedPeer]:
        """Nodes of this version seen trying to join without the cluster secret (diagnostics)."""
        with self._lock:
            return dict(self._refused)

    @property
    def rejected_frames(self) -> dict[str, int]:
        """Frames dropped by kind: forged (bad MAC), replayed, stale, unsigned, impersonation."""
        with self._lock:
            return dict(self._rejected)

    def _publish_health(self) -> None:
        with self._lock:
            notes: dict[str, str] = {}
            if self._mismatched:
                notes["mismatched_peers"] = "; ".join(
                    f"{p.node_id} runs {p.network_version} ({p.address})" for p in self._mismatched.values()
                )
            if self._refused:
                notes["refused_peers"] = "; ".join(
                    f"{p.node_id} at {p.address} has no secret of this cluster, refused ({p.detail})"
                    for p in self._refused.values()
                )
            if self._rejected:
                notes["rejected_frames"] = ", ".join(f"{n} {kind}" for kind, n in sorted(self._rejected.items()))
        node = self._node() if self._node is not None else None
        if node is not None:
            with contextlib.suppress(Exception):
                if notes:
                    node.health_notes["transport-zenoh"] = notes
                else:
                    node.health_notes.pop("transport-zenoh", None)

    # ================================================================ request / reply

    def serve(self, topic: Topic, handler: Handler) -> None:
        """Answer request(this node, topic, ...) with handler(sender, payload) -> bytes (or awaitable).

        A sync handler runs on a transport thread, an async one on the loop the transport started on.
        One handler per topic; a second replaces the first.
        """
        with self._lock:
            self._handlers[topic] = handler
            if self._session is not None and not self._closing:
                self._declare_queryable(topic)

    def _declare_queryable(self, topic: Topic) -> None:
        if topic in self._queryables:
            return

        def on_query(query: Any, _topic: Topic = topic) -> None:
            pool = self._rpc_pool
            if pool is None:
                return
            try:
                pool.submit(self._answer, _topic, query)
            except RuntimeError:
                pass  # shutting down

        self._queryables[topic] = self._session.declare_queryable(self.keys.rpc(topic.value, self.node_id), on_query)

    def _answer(self, topic: Topic, query: Any) -> None:
        with query:
            try:
                raw = query.payload.to_bytes() if query.payload is not None else b""
                sender, payload = self._unframe(str(query.key_expr), raw)
            except Rejected:
                with contextlib.suppress(Exception):
                    query.reply_err(b"request refused: not authenticated")
                return
            except MalformedFrame as exc:
                if self._malformed.should_log():
                    log.warning("dropped a malformed request on %s: %s", query.key_expr, exc)
                with contextlib.suppress(Exception):
                    query.reply_err(b"malformed request frame")
                return
            try:
                handler = self._handlers[topic]
                result = handler(sender, payload)
                if inspect.isawaitable(result):
                    loop = self._loop
                    assert loop is not None
                    result = asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
                if not isinstance(result, (bytes, bytearray, memoryview)):
                    raise TypeError(f"a request handler must return bytes, not {type(result).__name__}")
                # reply on this node's own key: replies to a wildcard request stay apart
                reply_key = self.keys.rpc(topic.value, self.node_id)
                query.reply(reply_key, self._frame(reply_key, bytes(result)))
            except Exception as exc:
                log.warning("request handler for %s failed on a request from %s: %r", topic.value, sender, exc)
                with contextlib.suppress(Exception):
                    query.reply_err(f"{type(exc).__name__}: {exc}".encode())

    async def request(self, node_id: str, topic: Topic, payload: bytes, timeout: float = 5.0) -> bytes:
        """Ask node `node_id`'s handler for `topic`; its reply bytes. Same node: no network.

        Raises NoReply (a TimeoutError) when no reply came in time or no node serves `topic` at
        `node_id` (that one is raised at once), RequestError on an error reply.
        """
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
        if self._session is None or self._closing:
            raise RuntimeError("the zenoh transport is not started")
        frames.check_chunk(node_id, "node id")
        replies = await asyncio.to_thread(self._query, self.keys.rpc(topic.value, node_id), payload, timeout, True)
        if not replies:
            raise NoReply(f"no node {node_id} answers requests on {topic.value}")
        return replies[node_id] if node_id in replies else next(iter(replies.values()))

    async def request_all(self, topic: Topic, payload: bytes, timeout: float = 5.0) -> dict[str, bytes]:
        """Ask every other node serving `topic`; {node_id: reply} of those that answered in time."""
        if self._session is None or self._closing:
            raise RuntimeError("the zenoh transport is not started")
        return await asyncio.to_thread(self._query, self.keys.rpc(topic.value, "*"), payload, timeout, False)

    def _query(self, key: str, payload: bytes, timeout: float, first: bool) -> dict[str, bytes]:
        import zenoh

        started = time.monotonic()
        replies: dict[str, bytes] = {}
        errors: list[str] = []
        handler = self._session.get(
            key,
            payload=self._frame(key, payload),
            timeout=timeout,
            target=zenoh.QueryTarget.ALL,
            consolidation=zenoh.QueryConsolidation(zenoh.ConsolidationMode.NONE),
            congestion_control=zenoh.CongestionControl.BLOCK,
            priority=getattr(zenoh.Priority, _PRIORITY[Plane.CONTROL]),
            allowed_destination=zenoh.Locality.REMOTE,
        )
        for reply in handler:
            if reply.ok is not None:
                try:
                    sender, body = self._unframe(str(reply.ok.key_expr), reply.ok.payload.to_bytes())
                except Rejected as exc:
                    errors.append(f"rejected reply: {exc}")
                    continue
                except MalformedFrame as exc:
                    errors.append(f"malformed reply: {exc}")
                    continue
                replies[sender] = body
                if first:
                    break
            else:
                error = reply.err.payload.to_bytes().decode(errors="replace")
                if error != "Timeout":  # Zenoh's own error when the query times out
                    errors.append(error)
                    if first:
                        break
        if first and not replies:
            if errors:
                raise RequestError(f"request on {key} failed: {'; '.join(errors)}")
            if time.monotonic() - started >= timeout * 0.9:
                raise NoReply(f"no reply on {key} within {timeout}s")
        return replies

    # ================================================================ diagnostics

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node_id": self.node_id,
            "zid": self.zid,
            "network_version": self.network_version,
            "listen": list(self.listen_locators),
            "connect": list(self.connect_endpoints),
            "peers": sorted(self.peers),
            "mismatched_peers": {k: v.__dict__ for k, v in self.mismatched_peers.items()},
            "secure": self.cluster is not None,
            "cluster_id": self.cluster.cluster_id if self.cluster else None,
            "refused_peers": {k: v.__dict__ for k, v in self.refused_peers.items()},
            "rejected_frames": self.rejected_frames,
            "malformed_frames": self.malformed_frames,
            "dropped_messages": self.dropped_messages,
            "messages": self.counts.snapshot(),
        }


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _close_leftovers() -> None:
    """A transport never stopped must not keep the interpreter from exiting."""
    for transport in list(_live):
        with contextlib.suppress(Exception):
            transport._closing = True
            transport._close()


# Zenoh runs callbacks on Python threads of its own that are not daemons: at exit the interpreter
# joins those *before* atexit hooks run, so an open session hangs the process there. threading's
# own pre-join hook (what concurrent.futures uses) runs early enough; atexit is the fallback.
_register_early = getattr(threading, "_register_atexit", None)
if _register_early is not None:
    _register_early(_close_leftovers)
else:  # pragma: no cover
    atexit.register(_close_leftovers)
