"""Per-node signatures: which member sent a frame, not only that a member did.

The frame MAC (sealed.py) is keyed from the cluster secret, which every member holds, so on its own
it lets any member write frames that name another node (the master included). Control-plane frames
therefore also carry an Ed25519 signature by a key of the sender's own:

* each start makes a fresh signing key; the cluster CA (tls.py, derived from the secret) signs a
  *binding* ``node id, network version, session id -> public key``, which travels in every signed
  frame (96 bytes), so a receiver that joined late needs nothing fetched;
* a receiver checks the binding (once per session: verified bindings are cached), that the frame's
  signature verifies with the bound key, and that it is the key *pinned* for that node id: the first
  key seen for a node stays its key until that node leaves the membership (liveliness), so a second
  key for a live node id is refused even when its binding verifies.

Why pinning too: the CA key derives from the shared secret, so a member that runs modified code can
mint a binding for any id. A member running Skulk's code cannot claim another id at all (its binding
names its own), and a modified one cannot take over a live node's id (the master's included). What
remains open is a node id nobody has heard from yet (see the README).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .sealed import Rejected
from .secret import ClusterSecret

PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
BINDING_BYTES = PUBLIC_BYTES + SIGNATURE_BYTES
MAX_BINDINGS = 4096  # verified bindings cached (one per node session), least recently used dropped


def binding_message(version: str, node_id: str, session: bytes, public: bytes) -> bytes:
    return b"\x00".join((b"skulk-node-key-v1", version.encode(), node_id.encode(), session, public))


class NodeSigner:
    """This start's signing key and its CA-signed binding to (node id, version, session)."""

    def __init__(self, cluster: ClusterSecret, version: str, node_id: str, session: bytes) -> None:
        from cryptography.hazmat.primitives.asymmetric import ed25519

        from .tls import cluster_ca

        self._key = ed25519.Ed25519PrivateKey.generate()
        public = self._key.public_key().public_bytes_raw()
        ca_key, _ = cluster_ca(cluster)
        self.binding = public + ca_key.sign(binding_message(version, node_id, session, public))

    def sign(self, data: bytes) -> bytes:
        return bytes(self._key.sign(data))


class Verifier:
    """Checks bindings and signatures of every sender; pins one key per live node id. Thread-safe."""

    def __init__(self, cluster: ClusterSecret, version: str) -> None:
        from .tls import cluster_ca

        _, ca_cert = cluster_ca(cluster)
        self._ca: Any = ca_cert.public_key()
        self.version = version
        self._bound: OrderedDict[bytes, Any] = OrderedDict()  # sender+session+binding -> public key
        self._pins: dict[str, bytes] = {}  # node id -> its public key while it is a member
        self._lock = threading.Lock()

    def check(
        self, key_expr: str, sender: str, session: bytes, binding: bytes, signed: bytes, signature: bytes
    ) -> None:
        """Raises Rejected("impersonation") unless `sender`'s own live key signed `signed`."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ed25519

        public = binding[:PUBLIC_BYTES]
        cache_key = b"\x00".join((sender.encode(), session, binding))
        with self._lock:
            key = self._bound.get(cache_key)
            if key is not None:
                self._bound.move_to_end(cache_key)
        if key is None:
            try:
                self._ca.verify(binding[PUBLIC_BYTES:], binding_message(self.version, sender, session, public))
            except InvalidSignature:
                raise Rejected(
                    "impersonation",
                    f"frame on {key_expr} claims node {sender} but carries a key the cluster CA bound to "
                    "another node (a member claiming another node's id)",
                ) from None
            key = ed25519.Ed25519PublicKey.from_public_bytes(public)
            with self._lock:
                self._bound[cache_key] = key
                if len(self._bound) > MAX_BINDINGS:
                    self._bound.popitem(last=False)
        try:
            key.verify(signature, signed)
        except InvalidSignature:
            raise Rejected(
                "impersonation", f"frame on {key_expr} claims node {sender} but {sender}'s key did not sign it"
            ) from None
        with self._lock:
            pinned = self._pins.setdefault(sender, public)
        if pinned != public:
            raise Rejected(
                "impersonation",
                f"frame on {key_expr} claims node {sender}, which is live with another key (a member "
                "claiming a live node's id)",
            )

    def release(self, node_id: str) -> None:
        """`node_id` left the membership: its next start may bring a new key."""
        with self._lock:
            self._pins.pop(node_id, None)

    @property
    def pinned(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._pins)
