"""The version hello: how a node learns that a peer it cannot join runs another network version.

Session credentials derived from the network version make Zenoh refuse a peer of another version
during the handshake, and the refusal says nothing about why. So each node also answers a tiny UDP
hello on the same port numbers as its TCP listen locators, and asks every address it would connect
to (its connect endpoints and the peers it scouted but is not connected to) which version is there.
A hello of another version, sent or answered, is a mismatch: the transport logs it loudly and lists
it in `mismatched_peers`. Same-version hellos carry no news and are ignored.

The hello also carries the cluster's public fingerprint (``"c"``, derived from the cluster secret,
empty when the node runs without one): a node of the same version but another cluster (or none) is
one the TLS handshake refuses, and it is reported as a refused peer (`on_refused`).

Datagrams: ``SKULK-HELLO1 {"v": version, "node": node_id, "ask": bool, "at": [listen locators],
"c": cluster id}``; only an ask is answered,
never an answer (no loops), and nothing larger than 512 bytes is read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("skulk.transport.zenoh.hello")

PREFIX = b"SKULK-HELLO1 "
MAX_DATAGRAM = 512
SCOUTED_TTL_S = 30.0

Address = tuple[str, int]


def encode_hello(
    version: str, node_id: str, ask: bool, locators: list[str] | tuple[str, ...] = (), cluster: str = ""
) -> bytes:
    at = [loc for loc in locators if len(loc) <= 64][:4]
    body = {"v": version, "node": node_id, "ask": ask, "at": at, "c": cluster}
    return PREFIX + json.dumps(body, separators=(",", ":")).encode()


def decode_hello(data: bytes) -> tuple[str, str, bool, list[str]] | None:
    """(version, node_id, ask, listen locators) of a hello; None for anything else."""
    decoded = decode_hello_cluster(data)
    return None if decoded is None else decoded[:4]


def decode_hello_cluster(data: bytes) -> tuple[str, str, bool, list[str], str] | None:
    """(version, node_id, ask, listen locators, cluster id) of a hello; None for anything else."""
    if not data.startswith(PREFIX) or len(data) > MAX_DATAGRAM:
        return None
    try:
        body = json.loads(data[len(PREFIX) :])
        version, node, ask, at = body["v"], body["node"], body.get("ask", False), body.get("at", [])
        cluster = body.get("c", "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (
        isinstance(version, str)
        and isinstance(node, str)
        and isinstance(ask, bool)
        and isinstance(at, list)
        and all(isinstance(a, str) for a in at)
        and isinstance(cluster, str)
    ):
        return None
    return version[:64], node[:128], ask, at[:4], cluster[:32]


def tcp_address(locator: str) -> Address | None:
    """(host, port) of a ``tcp/HOST:PORT`` locator (IPv4 or a name); None for anything else."""
    proto, _, rest = locator.partition("/")
    if proto not in ("tcp", "tls", "udp") or not rest:
        return None
    rest = rest.split("#", 1)[0].split("?", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or host.startswith("["):
        return None  # IPv6 hellos are not implemented
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    return host, int(port)


class HelloService:
    """Answers hellos on the listen ports; asks static and scouted addresses every `interval_s`."""

    def __init__(
        self,
        node_id: str,
        version: str,
        interval_s: float,
        on_mismatch: Callable[[str, str, str], None],
        connected_zids: Callable[[], set[str]],
        locators: list[str] | None = None,
        cluster: str = "",
        on_refused: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self._on_refused = on_refused
        self.node_id = node_id
        self.locators = list(locators or [])
        self.version = version
        self.interval_s = interval_s
        self._on_mismatch = on_mismatch
        self._connected_zids = connected_zids
        self._sockets: list[socket.socket] = []
        self._static: list[Address] = []
        self._scouted: dict[Address, tuple[str, float]] = {}  # address -> (zid, last hello)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._waker_r, self._waker_w = socket.socketpair()  # wakes select(): a stop, an address to ask
        self._thread: threading.Thread | None = None
        self.bound_ports: list[int] = []

    def bind(self, ports: Iterable[int]) -> None:
        for port in sorted(set(ports)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as exc:
                sock.close()
                log.info("no version hello on udp port %d (%s): peers cannot ask this node its version", port, exc)
                continue
            sock.setblocking(False)
            self._sockets.append(sock)
            self.bound_ports.append(port)
        asker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # an ephemeral port for asking
        asker.bind(("0.0.0.0", 0))
        asker.setblocking(False)
        self._sockets.append(asker)

    def add_static(self, addresses: Iterable[Address]) -> None:
        with self._lock:
            for address in addresses:
                if address not in self._static:
                    self._static.append(address)
        self._wake.set()
        with contextlib.suppress(OSError):
            self._waker_w.send(b"w")

    def scouted(self, zid: str, locators: Iterable[str]) -> None:
        """A Zenoh hello from scouting: remember where that peer listens."""
        now = time.monotonic()
        with self._lock:
            for locator in locators:
                address = tcp_address(locator)
                if address is not None:
                    self._scouted[address] = (zid, now)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="skulk-zenoh-hello", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with contextlib.suppress(OSError):
            self._waker_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=2)
        for sock in [*self._sockets, self._waker_r, self._waker_w]:
            sock.close()
        self._sockets.clear()

    # ---------------------------------------------------------------- thread

    def _targets(self) -> list[Address]:
        now = time.monotonic()
        try:
            connected = self._connected_zids()
        except Exception:
            connected = set()
        with self._lock:
            for address, (_, seen) in list(self._scouted.items()):
                if now - seen > SCOUTED_TTL_S:
                    del self._scouted[address]
            scouted = [a for a, (zid, _) in self._scouted.items() if zid not in connected]
            return list(dict.fromkeys([*self._static, *scouted]))

    def _run(self) -> None:
        ask = encode_hello(self.version, self.node_id, True, self.locators, self.cluster)
        answer = encode_hello(self.version, self.node_id, False, self.locators, self.cluster)
        next_probe = time.monotonic() + 0.2  # let scouting report first
        probes = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_probe or self._wake.is_set():
                self._wake.clear()
                if self._sockets:
                    asker = self._sockets[-1]
                    for address in self._targets():
                        with contextlib.suppress(OSError):
                            asker.sendto(ask, address)
                probes += 1
                # ask quickly at first (peers start together), then every interval
                next_probe = now + (min(self.interval_s, 1.0) if probes < 5 else self.interval_s)
            try:
                # asleep until the next probe, an answer, or a wake (no polling: an idle node rests)
                wait = max(0.0, next_probe - time.monotonic())
                readable, _, _ = select.select([*self._sockets, self._waker_r], [], [], wait)
            except (OSError, ValueError):
                return  # sockets closed under us: stopping
            for sock in readable:
                if sock is self._waker_r:
                    with contextlib.suppress(OSError):
                        self._waker_r.recv(64)
                    if self._stop.is_set():
                        return
                    continue
                try:
                    data, address = sock.recvfrom(MAX_DATAGRAM + 1)
                except OSError:
                    continue
                hello = decode_hello_cluster(data)
                if hello is None:
                    continue
                version, node, wants_answer, at, cluster = hello
                if node == self.node_id:
                    continue
                if version != self.version:
                    where = ", ".join(at) if at else f"udp/{address[0]}:{address[1]}"
                    self._on_mismatch(node, version, where)
                elif cluster != self.cluster and self._on_refused is not None:
                    where = ", ".join(at) if at else f"udp/{address[0]}:{address[1]}"
                    self._on_refused(node, where, f"{address[0]} (cluster {cluster or 'none: no secret'})")
                if wants_answer:
                    with contextlib.suppress(OSError):
                        sock.sendto(answer, address)
