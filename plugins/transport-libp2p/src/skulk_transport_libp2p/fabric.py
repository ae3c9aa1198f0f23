"""One run of the libp2p side of the transport: a host, gossipsub, peer links and dials, in trio.

The transport (asyncio side) starts a Fabric on its own thread with `trio.run`; when anything in
here or in py-libp2p raises out of the run, the transport logs it and starts a new Fabric (same
key pair, so the same peer id), never taking the node down. Everything here runs on the trio
thread; what crosses to the node goes through the `FabricOwner` methods, which are thread-safe.

Peers and membership. libp2p connections say nothing about liveness (a frozen peer keeps its TCP
connection open forever), so each node opens one *link* stream to every connected peer: a hello
naming its node id, then a beat every `beat_s`. A peer is a member while its link to us is open and
its last frame is younger than `lease_s`. A closed link (kill -9: the kernel closes the socket)
drops it at once; a silent one (SIGSTOP) after the lease, and then the connection is hung up so
that both sides start clean when it comes back. Every address ever learnt (bootstrap multiaddrs,
mDNS, the ports a peer's hello names) is redialled every `redial_s` while not connected.

Node-addressed `send` rides the link; `request` opens a stream of its own per call. Neither goes
through gossipsub, so large payloads (State snapshots) never do.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import multiaddr
import trio
from skulk_kernel.api import Topic

from . import frames, tuning
from .config import Libp2pConfig, network_psk
from .frames import MalformedFrame
from .hello import MAX_DATAGRAM, Hello, decode_hello, encode_hello
from .reorder import Reorder

log = logging.getLogger("skulk.transport.libp2p")

Handler = Callable[[str, bytes], "bytes | Awaitable[bytes]"]
MAX_REPLY_BYTES = 1 << 30
TARGET_TTL_S = 60.0
RPC_SERVE_TIMEOUT_S = 60.0
LINGER_UNDER_LOAD_S = 0.002
BATCH_BYTES = 512 << 10  # records gathered into one gossipsub message (its limit is 1 MiB)


class NoReply(TimeoutError):
    """No reply in time, or no member with that node id."""


class RequestError(RuntimeError):
    """The peer's handler failed, or the request was refused."""


class FabricOwner(Protocol):
    """What a Fabric needs of its transport; every method may be called from the trio thread."""

    node_id: str
    network_version: str
    config: Libp2pConfig
    key_pair: Any
    noise_key: Any
    pnet_secret: bytes
    outbox: deque[tuple[str, str, bytes]]
    sender_header: bytes

    def deliver(self, topic: Topic, sender: str, payload: bytes) -> None: ...
    def peer_changed(self, node_id: str, joined: bool) -> None: ...
    def note_mismatch(self, node_id: str, version: str, address: str) -> None: ...
    def handler_for(self, topic: Topic) -> Handler | None: ...
    def run_on_loop(self, awaitable: Awaitable[bytes]) -> Any: ...


@dataclass
class _InLink:
    node_id: str
    peer_id: Any
    last: float
    scope: trio.CancelScope


@dataclass
class _OutLink:
    send: trio.MemorySendChannel[bytes]
    dropped: int = 0


@dataclass
class _Target:
    """An address to keep connected to; `peer_id` None until a hello names it."""

    host: str
    port: int
    peer_id: Any = None
    static: bool = False
    learnt: float = field(default_factory=time.monotonic)
    dialing: bool = False


def _tcp_of(addr: Any) -> tuple[str, int] | None:
    try:
        host = addr.value_for_protocol("ip4")
        port = addr.value_for_protocol("tcp")
    except Exception:
        return None
    if not host or not port:
        return None
    return ("127.0.0.1" if host == "0.0.0.0" else str(host)), int(port)


class Fabric:
    def __init__(
        self, owner: FabricOwner, bootstrap: list[str], listen: list[str], targets: dict[tuple[str, int], Any]
    ) -> None:
        """`listen`: the addresses to bind (a restart rebinds the ports the first run got); `targets`:
        the dial targets, kept by the transport across restarts."""
        self.owner = owner
        self.cfg = owner.config
        version = owner.network_version
        self.link_protocol = f"/skulk/{version}/link/1"
        self.rpc_protocol = f"/skulk/{version}/rpc/1"
        self.topic_names = {topic: f"skulk/{version}/{topic.plane.value}/{topic.value}" for topic in Topic}
        self.topics = {name: topic for topic, name in self.topic_names.items()}
        self.bootstrap = bootstrap
        self.host: Any = None
        self.pubsub: Any = None
        self.peer_id: Any = None
        self.listen: list[str] = []
        self.transport_addrs: list[str] = []
        self.ports: list[int] = []
        self.inlinks: dict[Any, _InLink] = {}
        self.outlinks: dict[Any, _OutLink] = {}
        self.opening: set[Any] = set()
        self.members: dict[str, Any] = {}  # node id -> peer id
        self.targets: dict[tuple[str, int], _Target] = targets
        for target in targets.values():
            target.dialing = False
        self.bind = listen
        self.reorder = Reorder(self._deliver_ordered, self.cfg.reorder_gap_s)
        self.nursery: trio.Nursery | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.idle = False
        self._wake = trio.Event()
        self._udp: Any = None
        self._stop = trio.Event()
        self.malformed = 0
        self._mdns_handler: Callable[[Any], None] | None = None
        self._last_publish = -1.0

    # ================================================================ the run

    async def run(self, ready: Callable[[Fabric], None]) -> None:
        """Build the host, serve until stop() or a crash. `ready` is called once listening."""
        from libp2p import new_host
        from libp2p.custom_types import TProtocol
        from libp2p.discovery.events.peerDiscovery import peerDiscovery
        from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
        from libp2p.security.noise.transport import Transport as NoiseTransport
        from libp2p.tools.anyio_service import background_trio_service

        self.token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        owner = self.owner
        listen = [multiaddr.Multiaddr(a) for a in self.bind]
        # Noise only: the library's default also offers TLS, SECIO and plaintext
        secure = {NOISE_PROTOCOL_ID: NoiseTransport(owner.key_pair, noise_privkey=owner.noise_key.private_key)}
        host = new_host(
            key_pair=owner.key_pair,
            sec_opt=secure,
            psk=network_psk(owner.network_version, owner.pnet_secret),
            listen_addrs=listen,
            muxer_preference="YAMUX",
        )
        self.host = host
        self.peer_id = host.get_id()
        async with host.run(listen):
            host.set_stream_handler(TProtocol(self.link_protocol), self._on_link)
            host.set_stream_handler(TProtocol(self.rpc_protocol), self._on_rpc)
            pubsub, router = tuning.lan_pubsub(
                host,
                heartbeat_s=self.cfg.gossip_heartbeat_s,
                queue_depth=self.cfg.queue_depth,
                on_message=self._on_gossip,
            )
            self.pubsub = pubsub
            async with background_trio_service(pubsub), background_trio_service(router):
                await pubsub.wait_until_ready()
                for name in self.topic_names.values():
                    await pubsub.subscribe(name)
                self.ports = sorted({t[1] for t in map(_tcp_of, host.get_transport_addrs()) if t})
                self.listen = [str(a) for a in host.get_addrs()]
                self.transport_addrs = [str(a) for a in host.get_transport_addrs()]
                mdns = self._start_mdns(host, peerDiscovery) if self.cfg.mdns else None
                try:
                    async with trio.open_nursery() as nursery:
                        self.nursery = nursery
                        await self._bind_hello(nursery)
                        for addr in self.bootstrap:
                            self._add_bootstrap(addr)
                        nursery.start_soon(self._drain_outbox)
                        nursery.start_soon(self._maintain)
                        nursery.start_soon(self._redial)
                        ready(self)
                        await self._stop.wait()
                        nursery.cancel_scope.cancel()
                finally:
                    if mdns is not None:
                        self._stop_mdns(mdns, peerDiscovery)
                    if self._udp is not None:
                        self._udp.close()

    def stop(self) -> None:
        """On the trio thread (through the token): end the run cleanly."""
        self._stop.set()

    def poke(self) -> None:
        """On the trio thread: the outbox has work."""
        self._wake.set()

    def inject_fault(self, message: str) -> None:
        """On the trio thread: raise inside the run, as a library bug would (containment tests)."""

        async def fault() -> None:
            raise RuntimeError(message)

        if self.nursery is not None:
            self.nursery.start_soon(fault)

    # ================================================================ gossipsub

    def _on_gossip(self, msg: Any) -> None:
        if msg.from_id == self.peer_id.to_bytes():
            return  # own publishes were delivered locally already
        topic = self.topics.get(msg.topicIDs[0]) if msg.topicIDs else None
        if topic is None:
            return
        try:
            sender, records = frames.decode_broadcast(msg.data)
        except MalformedFrame as exc:
            self._note_malformed(f"gossipsub {topic.value}", exc)
            return
        if sender == self.owner.node_id:
            return
        for seq, payload in records:
            self.reorder.push(topic.value, sender, seq, payload)

    def _deliver_ordered(self, topic: str, sender: str, payload: bytes) -> None:
        self.owner.deliver(Topic(topic), sender, payload)

    def _note_malformed(self, where: str, exc: Exception) -> None:
        self.malformed += 1
        if self.malformed <= 10 or self.malformed % 1000 == 0:
            log.warning("dropped a malformed frame on %s (%d so far): %s", where, self.malformed, exc)

    async def _drain_outbox(self) -> None:
        """Move what the node queued into libp2p, in order, pacing publishes against queue depth."""
        outbox = self.owner.outbox
        while True:
            if not outbox:
                self._wake = trio.Event()
                self.idle = True
                if not outbox:
                    await self._wake.wait()
                self.idle = False
                continue
            # under load (the last publish was moments ago) linger a little so a batch can form:
            # a gossipsub message costs milliseconds of CPU however few records it carries
            if trio.current_time() - self._last_publish < LINGER_UNDER_LOAD_S * 4:
                await trio.sleep(LINGER_UNDER_LOAD_S)
            self._last_publish = trio.current_time()
            # everything queued goes at once: one gossipsub message per topic carries all its records
            batches: dict[str, list[bytes]] = {}
            size = 0
            while outbox and not (size and size + len(outbox[0][2]) > BATCH_BYTES):
                kind, target, frame = outbox.popleft()
                if kind == "pub":
                    batches.setdefault(target, []).append(frame)
                    size += len(frame)
                else:
                    self._send_direct(target, frame)
            for name, records in batches.items():
                await self._pace()
                await self.pubsub.publish(name, frames.encode_broadcast(self.owner.sender_header, records))

    async def _pace(self) -> None:
        delay = 0.0005
        while tuning.queue_fill(self.pubsub, self.cfg.queue_depth) > self.cfg.pace_at:
            await trio.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _send_direct(self, node_id: str, frame: bytes) -> None:
        peer = self.members.get(node_id)
        link = self.outlinks.get(peer) if peer is not None else None
        if link is None:
            log.debug("no link to %s: a message addressed to it is dropped", node_id)
            return
        try:
            link.send.send_nowait(frame)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            link.dropped += 1
            if link.dropped == 1 or link.dropped % 1000 == 0:
                log.warning("link to %s is full: dropped %d message(s) addressed to it", node_id, link.dropped)

    # ================================================================ links and membership

    async def _on_link(self, stream: Any) -> None:
        """A peer's link to us: hello, then beats and addressed messages until it closes or goes quiet."""
        peer = stream.muxed_conn.peer_id
        link: _InLink | None = None
        try:
            with trio.CancelScope() as scope:
                with trio.fail_after(self.cfg.lease_s):
                    kind, body = await _read_frame(stream, self.cfg.max_request_bytes)
                if kind != frames.HELLO:
                    raise MalformedFrame(f"a link must open with a hello, not {kind!r}")
                hello = json.loads(body)
                node_id, version, ports = str(hello["node"]), str(hello["v"]), list(hello.get("ports", []))
                if version != self.owner.network_version:
                    raise MalformedFrame(f"link hello of version {version!r}")
                if node_id == self.owner.node_id:
                    return
                link = _InLink(node_id, peer, trio.current_time(), scope)
                old = self.inlinks.get(peer)
                self.inlinks[peer] = link
                if old is not None:
                    old.scope.cancel()
                self._learn_ports(stream, peer, ports)
                self._set_member(node_id, peer, True)
                while True:
                    kind, body = await _read_frame(stream, self.cfg.max_request_bytes)
                    link.last = trio.current_time()
                    if kind == frames.BEAT:
                        continue
                    if kind != frames.MESSAGE:
                        raise MalformedFrame(f"unknown link frame kind {kind!r}")
                    (topic_name,), payload = frames.unpack_fields(body, 1)
                    self.owner.deliver(Topic(topic_name), node_id, payload)
        except (MalformedFrame, ValueError, KeyError, TypeError) as exc:
            self._note_malformed(f"the link from {peer}", exc)
            await _reset(stream)
        except trio.TooSlowError:
            await _reset(stream)
        except Exception as exc:
            log.debug("link from %s ended: %r", peer, exc)
        finally:
            if link is not None and self.inlinks.get(peer) is link:
                del self.inlinks[peer]
                if not any(other.node_id == link.node_id for other in self.inlinks.values()):
                    self._set_member(link.node_id, peer, False)

    def _set_member(self, node_id: str, peer: Any, joined: bool) -> None:
        if joined == (node_id in self.members):
            if joined:
                self.members[node_id] = peer
            return
        if joined:
            self.members[node_id] = peer
        else:
            del self.members[node_id]
            self.reorder.forget(node_id)
        log.info("peer %s %s (libp2p %s)", node_id, "joined" if joined else "left", peer)
        self.owner.peer_changed(node_id, joined)

    async def _open_link(self, peer: Any) -> None:
        """Our link to a connected peer: hello, then beats and what send() addresses to it."""
        from libp2p.custom_types import TProtocol

        send, receive = trio.open_memory_channel[bytes](self.owner.config.send_queue)
        stream = None
        try:
            with trio.fail_after(self.cfg.dial_timeout_s):
                stream = await self.host.new_stream(peer, [TProtocol(self.link_protocol)])
                hello = {"node": self.owner.node_id, "v": self.owner.network_version, "ports": self.ports}
                await stream.write(frames.encode_frame(frames.HELLO, json.dumps(hello).encode()))
            self.outlinks[peer] = _OutLink(send)
            lock = trio.Lock()

            async def beat() -> None:
                frame = frames.encode_frame(frames.BEAT)
                while True:
                    await trio.sleep(self.cfg.beat_s)
                    async with lock:
                        await stream.write(frame)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)
                async for frame in receive:
                    async with lock:
                        await stream.write(frame)
        except Exception as exc:
            log.debug("link to %s ended: %r", peer, exc)
        finally:
            self.outlinks.pop(peer, None)
            self.opening.discard(peer)
            send.close()
            if stream is not None:
                await _reset(stream)

    async def _maintain(self) -> None:
        """Open links to newly connected peers; drop peers whose lease ran out; reopen pubsub streams
        left on closed connections; skip reorder gaps."""
        period = min(0.1, self.cfg.beat_s / 2)
        while True:
            await trio.sleep(period)
            assert self.nursery is not None
            for peer in self.host.get_connected_peers():
                if peer not in self.outlinks and peer not in self.opening:
                    self.opening.add(peer)
                    self.nursery.start_soon(self._open_link, peer)
            now = trio.current_time()
            for peer, link in list(self.inlinks.items()):
                if now - link.last > self.cfg.lease_s:
                    log.warning(
                        "peer %s sent nothing for %.1fs (lease %.1fs): dropped, connection closed",
                        link.node_id,
                        now - link.last,
                        self.cfg.lease_s,
                    )
                    link.scope.cancel()
                    self.nursery.start_soon(self._hang_up, peer)
            for peer in tuning.reopen_stale_streams(self.pubsub):
                log.info("the pubsub stream to %s was on a closed connection: reopened", peer)
            self.reorder.tick()

    async def _hang_up(self, peer: Any) -> None:
        try:
            with trio.move_on_after(2):
                await self.host.disconnect(peer)
        except Exception as exc:
            log.debug("closing the connection to %s: %r", peer, exc)

    # ================================================================ discovery and dialing

    def _add_target(self, host: str, port: int, peer: Any, static: bool) -> None:
        key = (host, port)
        target = self.targets.get(key)
        if target is None:
            self.targets[key] = _Target(host, port, peer, static)
            return
        target.learnt = time.monotonic()
        target.static = target.static or static
        if peer is not None:
            target.peer_id = peer

    def _add_bootstrap(self, addr: str) -> None:
        from libp2p.peer.id import ID

        try:
            ma = multiaddr.Multiaddr(addr)
            tcp = _tcp_of(ma)
            peer = None
            try:
                peer_text = ma.value_for_protocol("p2p")
                peer = ID.from_base58(peer_text) if peer_text else None
            except Exception:
                peer = None
        except Exception as exc:
            log.warning("ignoring bootstrap address %r: %s", addr, exc)
            return
        if tcp is None:
            log.warning("ignoring bootstrap address %r: only /ip4/H/tcp/P[/p2p/ID] is dialed", addr)
            return
        self._add_target(tcp[0], tcp[1], peer, True)

    def _learn_ports(self, stream: Any, peer: Any, ports: list[Any]) -> None:
        remote = None
        try:
            remote = stream.muxed_conn.get_remote_address() or stream.get_remote_address()
        except Exception:
            pass
        if not remote:
            return
        for port in ports:
            if isinstance(port, int) and 0 < port < 65536:
                self._add_target(str(remote[0]), port, peer, False)

    def _start_mdns(self, host: Any, discovery: Any) -> Any:
        from libp2p.discovery.mdns.mdns import MDNSDiscovery

        token = self.token
        own = self.peer_id

        def on_peer(info: Any) -> None:  # on a zeroconf thread
            if info.peer_id == own or token is None:
                return
            try:
                token.run_sync_soon(self._add_discovered, info)
            except trio.RunFinishedError:
                pass

        try:
            mdns = MDNSDiscovery(
                host.get_network(),
                port=self.ports[0] if self.ports else 0,
                service_type="_skulk._udp.local.",
                host=host,
            )
            mdns.start()
        except Exception as exc:
            log.warning("mDNS discovery unavailable (%r): only bootstrap addresses are dialed", exc)
            return None
        discovery.register_peer_discovered_handler(on_peer)
        self._mdns_handler = on_peer
        return mdns

    def _stop_mdns(self, mdns: Any, discovery: Any) -> None:
        try:
            discovery.unregister_peer_discovered_handler(self._mdns_handler)
            mdns.stop()
        except Exception as exc:
            log.debug("stopping mDNS: %r", exc)

    def _add_discovered(self, info: Any) -> None:
        if info.peer_id == self.peer_id:
            return
        for addr in info.addrs:
            tcp = _tcp_of(addr)
            if tcp is not None:
                self._add_target(tcp[0], tcp[1], info.peer_id, False)

    async def _redial(self) -> None:
        while True:
            connected = set(self.host.get_connected_peers())
            now = time.monotonic()
            assert self.nursery is not None
            for key, target in list(self.targets.items()):
                if target.peer_id is not None and target.peer_id in connected:
                    target.learnt = now
                    continue
                if not target.static and now - target.learnt > TARGET_TTL_S:
                    del self.targets[key]
                    continue
                if target.peer_id == self.peer_id or (
                    target.port in self.ports and target.host == "127.0.0.1" and target.peer_id is None
                ):
                    continue
                if target.peer_id is None:
                    self._ask(target.host, target.port)
                elif not target.dialing:
                    target.dialing = True
                    self.nursery.start_soon(self._dial, target)
            await trio.sleep(self.cfg.redial_s)

    async def _dial(self, target: _Target) -> None:
        from libp2p.peer.peerinfo import PeerInfo

        try:
            addr = multiaddr.Multiaddr(f"/ip4/{target.host}/tcp/{target.port}")
            with trio.fail_after(self.cfg.dial_timeout_s):
                await self.host.connect(PeerInfo(target.peer_id, [addr]))
        except Exception as exc:
            log.debug("dial %s:%d (%s) failed: %r", target.host, target.port, target.peer_id, exc)
            self._ask(target.host, target.port)  # another version? another peer id (a restart)?
        finally:
            target.dialing = False

    # ================================================================ the version hello (UDP)

    async def _bind_hello(self, nursery: trio.Nursery) -> None:
        if not self.ports:
            return
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        try:
            await sock.bind(("0.0.0.0", self.ports[0]))
        except OSError as exc:
            sock.close()
            log.info("no version hello on udp port %d (%s)", self.ports[0], exc)
            return
        self._udp = sock
        nursery.start_soon(self._serve_hello, sock)

    def _hello(self, ask: bool) -> bytes:
        return encode_hello(Hello(self.owner.network_version, self.owner.node_id, self.peer_id.to_base58(), ask))

    def _ask(self, host: str, port: int) -> None:
        if self._udp is not None and self.nursery is not None:
            self.nursery.start_soon(self._send_udp, self._hello(True), (host, port))

    async def _send_udp(self, data: bytes, address: tuple[str, int]) -> None:
        try:
            with trio.move_on_after(1):
                await self._udp.sendto(data, address)
        except OSError:
            pass

    async def _serve_hello(self, sock: Any) -> None:
        from libp2p.peer.id import ID

        while True:
            try:
                data, address = await sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError:
                await trio.sleep(0.1)
                continue
            hello = decode_hello(data)
            if hello is None or hello.node_id == self.owner.node_id:
                continue
            if hello.version != self.owner.network_version:
                self.owner.note_mismatch(hello.node_id, hello.version, f"{address[0]}:{address[1]}")
            elif not hello.ask:
                target = self.targets.get((address[0], address[1]))
                if target is not None:
                    try:
                        peer = ID.from_base58(hello.peer_id)
                    except Exception:
                        continue
                    if peer != target.peer_id:
                        target.peer_id = peer
                        if not target.dialing:
                            target.dialing = True
                            assert self.nursery is not None
                            self.nursery.start_soon(self._dial, target)
            if hello.ask:
                await self._send_udp(self._hello(False), address)

    # ================================================================ request / reply

    async def request(self, node_id: str, topic: Topic, payload: bytes, timeout: float) -> bytes:
        from libp2p.custom_types import TProtocol

        peer = self.members.get(node_id)
        if peer is None:
            raise NoReply(f"no member {node_id} serves requests on {topic.value}")
        body = frames.pack_fields(topic.value.encode(), frames.sender_header(self.owner.node_id)) + payload
        stream = None
        try:
            with trio.fail_after(timeout):
                stream = await self.host.new_stream(peer, [TProtocol(self.rpc_protocol)])
                await stream.write(frames.encode_frame(frames.REQUEST, body))
                kind, reply = await _read_frame(stream, MAX_REPLY_BYTES)
        except trio.TooSlowError:
            raise NoReply(f"no reply from {node_id} on {topic.value} within {timeout}s") from None
        finally:
            if stream is not None:
                await _close(stream)
        if kind == frames.REPLY:
            return reply
        raise RequestError(f"request to {node_id} on {topic.value} failed: {reply.decode(errors='replace')}")

    async def _on_rpc(self, stream: Any) -> None:
        try:
            with trio.fail_after(RPC_SERVE_TIMEOUT_S):
                try:
                    kind, body = await _read_frame(stream, self.cfg.max_request_bytes)
                    if kind != frames.REQUEST:
                        raise MalformedFrame(f"a request stream must carry a request, not {kind!r}")
                    (topic_name, sender), payload = frames.unpack_fields(body, 2)
                    topic = Topic(topic_name)
                except (MalformedFrame, ValueError) as exc:
                    self._note_malformed("a request stream", exc)
                    await stream.write(frames.encode_frame(frames.ERROR, b"malformed request"))
                    return
                handler = self.owner.handler_for(topic)
                if handler is None:
                    await stream.write(frames.encode_frame(frames.ERROR, f"nothing serves {topic.value}".encode()))
                    return
                try:
                    result = await self._call_handler(handler, sender, payload)
                except Exception as exc:
                    log.warning("request handler for %s failed on a request from %s: %r", topic.value, sender, exc)
                    await stream.write(frames.encode_frame(frames.ERROR, f"{type(exc).__name__}: {exc}".encode()))
                    return
                await stream.write(frames.encode_frame(frames.REPLY, result))
        except Exception as exc:
            log.debug("request stream ended: %r", exc)
        finally:
            await _close(stream)

    async def _call_handler(self, handler: Handler, sender: str, payload: bytes) -> bytes:
        """A sync handler on a worker thread (a snapshot encode must not stall beats); async on the node's loop."""

        def call() -> bytes:
            result = handler(sender, payload)
            if inspect.isawaitable(result):
                result = self.owner.run_on_loop(result).result(RPC_SERVE_TIMEOUT_S)
            if not isinstance(result, (bytes, bytearray, memoryview)):
                raise TypeError(f"a request handler must return bytes, not {type(result).__name__}")
            return bytes(result)

        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)  # type: ignore[call-arg]  # stale stubs


async def _read_exact(stream: Any, n: int) -> bytes:
    parts = bytearray()
    while len(parts) < n:
        chunk = await stream.read(n - len(parts))
        if not chunk:
            raise EOFError(f"stream ended after {len(parts)} of {n} bytes")
        parts += chunk
    return bytes(parts)


async def _read_frame(stream: Any, limit: int) -> tuple[bytes, bytes]:
    length = frames.parse_frame_length(await _read_exact(stream, 4), limit)
    data = await _read_exact(stream, length)
    return data[:1], data[1:]


async def _reset(stream: Any) -> None:
    try:
        with trio.move_on_after(1):
            await stream.reset()
    except Exception:
        pass


async def _close(stream: Any) -> None:
    try:
        with trio.move_on_after(1):
            await stream.close()
    except Exception:
        pass
