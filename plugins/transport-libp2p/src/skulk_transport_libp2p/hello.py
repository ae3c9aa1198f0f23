"""The version hello: how a node learns why a peer refused it, and the peer id behind an address.

A private-network key of another version makes every dial fail inside the handshake, with no
reason given. So each node also answers a tiny UDP datagram on the port number of its TCP listen
address. After a failed dial, a node asks that address; an answer (or an ask) of another version
is a mismatch, logged loudly and shown in the node's health. An answer of the same version names
the peer id there, which is how a bootstrap multiaddr without ``/p2p/ID`` is dialed.

Datagram: ``SKULK-P2P-HELLO1 {"v": version, "node": node id, "peer": peer id, "ask": bool}``; only
asks are answered, and nothing larger than 512 bytes is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PREFIX = b"SKULK-P2P-HELLO1 "
MAX_DATAGRAM = 512


@dataclass(frozen=True)
class Hello:
    version: str
    node_id: str
    peer_id: str
    ask: bool


def encode_hello(hello: Hello) -> bytes:
    body = {"v": hello.version, "node": hello.node_id, "peer": hello.peer_id, "ask": hello.ask}
    return PREFIX + json.dumps(body, separators=(",", ":")).encode()


def decode_hello(data: bytes) -> Hello | None:
    if not data.startswith(PREFIX) or len(data) > MAX_DATAGRAM:
        return None
    try:
        body = json.loads(data[len(PREFIX) :])
        version, node, peer, ask = body["v"], body["node"], body["peer"], body["ask"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(version, str) and isinstance(node, str) and isinstance(peer, str) and isinstance(ask, bool)):
        return None
    return Hello(version[:64], node[:128], peer[:128], ask)
