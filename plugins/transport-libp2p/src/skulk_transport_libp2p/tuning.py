"""Gossipsub and pubsub configured for a LAN fabric, with py-libp2p's lossy defaults taken out.

What the defaults do, and what is set instead (FACTS.md, "Transports"):

* a 120 s heartbeat (the mesh forms and heals that slowly): `gossip_heartbeat_s`, 1 s;
* spam protection, a 10 msg/s per-topic rate limit (it drops this node's own publishes too) and
  eclipse protection against hostile peers: off, the private network admits only own nodes;
* 32-deep per-peer send queues that reject what does not fit: `queue_depth` deep, and the
  transport paces publishes against the fullest one;
* 32-deep subscription channels that drop when nobody reads at once: not used; every message
  goes straight to the transport's callback on arrival;
* an uncaught protobuf DecodeError (or any error) in a peer's read loop used to end the whole
  pubsub service, and with it the process: contained here to that one peer's stream;
* message signing: off. Noise already authenticates every link of the private network, and
  signing and checking each message cost more CPU than the rest of the path.

Only this module knows py-libp2p's internals; libp2p is imported inside functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("skulk.transport.libp2p")

MAX_MESSAGE_BYTES = 1 << 20  # py-libp2p's RPC size limit; larger payloads use request/reply
MESSAGE_HEADROOM = 4096


def lan_pubsub(host: Any, *, heartbeat_s: int, queue_depth: int, on_message: Callable[[Any], None]) -> tuple[Any, Any]:
    """(pubsub, router) for `host`; `on_message(rpc_pb2.Message)` runs on the trio thread."""
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub

    class DeepQueues(dict[Any, Any]):
        """Per-peer send queues, made `queue_depth` deep as pubsub creates them."""

        def __setitem__(self, peer: Any, queue: Any) -> None:
            inner = getattr(queue, "_queue", None)
            if inner is not None and hasattr(inner, "max_size"):
                inner.max_size = queue_depth
            super().__setitem__(peer, queue)

    class LanPubsub(Pubsub):  # type: ignore[misc]
        def notify_subscriptions(self, publish_message: Any) -> None:
            try:
                on_message(publish_message)
            except Exception:
                log.exception("a gossipsub message could not be delivered")

        async def continuously_read_stream(self, stream: Any) -> None:
            try:
                await super().continuously_read_stream(stream)
            except Exception as exc:  # DecodeError from a malformed RPC, among others
                peer = getattr(getattr(stream, "muxed_conn", None), "peer_id", "?")
                log.warning("dropped the pubsub stream of peer %s after a bad frame: %r", peer, exc)
                try:
                    await stream.reset()
                except Exception:
                    pass

    router = GossipSub(
        [PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=8,
        degree_low=4,
        degree_high=16,
        heartbeat_initial_delay=0.1,
        heartbeat_interval=heartbeat_s,
        spam_protection_enabled=False,
        max_messages_per_topic_per_second=1e9,
        eclipse_protection_enabled=False,
        max_pending_messages_per_peer=queue_depth,
    )
    pubsub = LanPubsub(host, router, strict_signing=False)
    pubsub.peer_queues = DeepQueues()
    # the library starts its sequence at the current second: a restart within a second of heavy
    # publishing would reuse message ids that peers still remember, and they would drop them
    pubsub.counter = time.time_ns()
    return pubsub, router


def queue_fill(pubsub: Any, queue_depth: int) -> float:
    """How full the fullest per-peer send queue is, 0..1."""
    queues = getattr(pubsub, "peer_queues", {})
    deepest = max((len(q) for q in list(queues.values())), default=0)
    return deepest / queue_depth


def reopen_stale_streams(pubsub: Any) -> list[Any]:
    """Forget pubsub streams that ride a closed connection; returns the peers whose were.

    py-libp2p keeps one pubsub stream per peer and opens a new one only for a peer it holds none
    for. When a connection closes while another to the same peer is already up (a frozen peer
    thaws to its old connection hung up and a redial already through), the library sees the live
    connection, keeps the dead stream, and skips the new connection's registration: that peer
    never learns this node's subscriptions again and every publish to it goes nowhere, for good.
    Forgetting the dead stream makes the library open a fresh one on the live connection (with the
    subscription hello), or clean up when none is left. Forgetting also drops the peer's
    subscriptions, which may have just come in on the live connection and will not be sent again:
    a peer still connected keeps them (they are the peer's, not the stream's).
    """
    stale = [
        peer
        for peer, stream in list(getattr(pubsub, "peers", {}).items())
        if getattr(getattr(stream, "muxed_conn", None), "is_closed", False)
    ]
    if not stale:
        return stale  # the fabric asks ten times a second: nothing more to do on the usual path
    from libp2p.pubsub.pb import rpc_pb2

    for peer in stale:
        topics = [topic for topic, peers in pubsub.peer_topics.items() if peer in peers]
        pubsub._handle_dead_peer(peer)
        if pubsub._peer_is_connected(peer):
            for topic in topics:
                pubsub.handle_subscription(peer, rpc_pb2.RPC.SubOpts(subscribe=True, topicid=topic))
    return stale
